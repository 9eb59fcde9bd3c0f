// Python access to the CUDA lookup launchers on raw device pointers.
//
// Pointers and streams are Python ints: CuPy's `a.data.ptr` and
// `cupy.cuda.Stream.ptr`, PyTorch's `t.data_ptr()` and `s.cuda_stream`. Stream
// 0 is the legacy default stream, which CuPy's and PyTorch's default streams
// are ordered with. Device work runs with the GIL released.
#include "cc/python/gpu_bindings.h"

#include <pybind11/pybind11.h>

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "cc/core/float_types.h"
#include "cc/core/hash_table_cpu.h"
#include "cc/core/lookup.h"
#include "cc/core/segments.h"
#include "cc/python/specs.h"
#include "cc/python/gpu_common.h"
#include "cuda/hash_table_launchers.h"
#include "cuda/lookup_launchers.h"

namespace py = pybind11;

namespace {

using tf_ctr_py::Check;
using tf_ctr_py::DevicePtr;
using tf_ctr_py::GradWorkspace;
using tf_ctr_py::GradWorkspaceFor;
using tf_ctr_py::RequirePointer;
using tf_ctr_py::StreamPtr;
using tf_ctr_py::TypeTag;
using tf_ctr_py::WithIndexType;
using tf_ctr_py::WithValueType;

// d_status as read back: {index, value}, index -1 when all was well.
using HostStatus = std::array<int64_t, 2>;

// Resets d_status, runs `launch` (which records the first bad entry there)
// and reads it back. Call without the GIL.
template <typename Launch>
HostStatus LaunchWithStatus(int64_t* d_status, uintptr_t stream, Launch&& launch) {
  HostStatus status{-1, 0};
  Check(ctr::gpu::InitStatus(d_status, StreamPtr(stream)));
  Check(launch());
  Check(ctr::gpu::ReadInt64(d_status, 2, status.data(), StreamPtr(stream)));
  return status;
}

void GpuEmbeddingLookup(uintptr_t params_ptr, const std::string& params_dtype, int64_t vocab,
                        int64_t dim, uintptr_t keys_ptr, const std::string& keys_dtype,
                        int64_t nnz, uintptr_t weights_ptr, uintptr_t offsets_ptr,
                        int64_t num_rows, uintptr_t out_ptr, uintptr_t status_ptr,
                        const std::string& combiner, const std::string& id_mode,
                        const std::string& invalid_ids, bool prune_weights, int64_t default_id,
                        float max_norm, uintptr_t stream) {
  const ctr::LookupSpec spec =
      tf_ctr_py::MakeLookupSpec(vocab, dim, combiner, id_mode, invalid_ids, prune_weights, default_id, max_norm);
  if (num_rows < 0 || nnz < 0) throw py::value_error("num_rows and nnz must be >= 0");
  RequirePointer(params_ptr, vocab > 0 && dim > 0, "params_ptr");
  RequirePointer(keys_ptr, nnz > 0, "keys_ptr");
  RequirePointer(offsets_ptr, true, "offsets_ptr");
  RequirePointer(out_ptr, num_rows > 0 && dim > 0, "out_ptr");
  RequirePointer(status_ptr, true, "status_ptr");
  int64_t* d_status = DevicePtr<int64_t>(status_ptr);
  HostStatus status{-1, 0};
  WithValueType(params_dtype, [&](auto value_tag) {
    using T = typename decltype(value_tag)::type;
    WithIndexType(keys_dtype, "keys", [&](auto key_tag) {
      using TKey = typename decltype(key_tag)::type;
      py::gil_scoped_release nogil;
      status = LaunchWithStatus(d_status, stream, [&] {
        return ctr::gpu::EmbeddingLookup<T, TKey>(
            spec, DevicePtr<const T>(params_ptr), DevicePtr<const TKey>(keys_ptr),
            DevicePtr<const float>(weights_ptr), DevicePtr<const int64_t>(offsets_ptr), num_rows, nnz,
            DevicePtr<T>(out_ptr), d_status, StreamPtr(stream));
      });
    });
  });
  if (status[0] >= 0) {
    ctr::KeyError err;
    err.row = status[0];
    err.key = status[1];
    throw py::value_error(ctr::DescribeKeyError(err, vocab));
  }
}

void GpuRowIdsToOffsets(uintptr_t row_ids_ptr, const std::string& row_ids_dtype, int64_t nnz,
                        int64_t num_rows, uintptr_t offsets_ptr, uintptr_t status_ptr,
                        uintptr_t stream) {
  if (num_rows < 0 || nnz < 0) throw py::value_error("num_rows and nnz must be >= 0");
  RequirePointer(row_ids_ptr, nnz > 0, "row_ids_ptr");
  RequirePointer(offsets_ptr, true, "offsets_ptr");
  RequirePointer(status_ptr, true, "status_ptr");
  int64_t* d_status = DevicePtr<int64_t>(status_ptr);
  HostStatus status{-1, 0};
  WithIndexType(row_ids_dtype, "row_ids", [&](auto tag) {
    using TSeg = typename decltype(tag)::type;
    py::gil_scoped_release nogil;
    status = LaunchWithStatus(d_status, stream, [&] {
      return ctr::gpu::RowIdsToOffsets(DevicePtr<const TSeg>(row_ids_ptr), nnz, num_rows,
                                       DevicePtr<int64_t>(offsets_ptr), d_status, StreamPtr(stream));
    });
  });
  if (status[0] >= 0) throw py::value_error(ctr::DescribeRowIdError(status[0], status[1], num_rows));
}

void GpuRowSplitsToOffsets(uintptr_t splits_ptr, const std::string& splits_dtype,
                           int64_t num_splits, int64_t nnz, uintptr_t offsets_ptr,
                           uintptr_t status_ptr, uintptr_t stream) {
  if (num_splits < 1) throw py::value_error("row_splits must have at least one element");
  RequirePointer(splits_ptr, true, "splits_ptr");
  RequirePointer(offsets_ptr, true, "offsets_ptr");
  RequirePointer(status_ptr, true, "status_ptr");
  int64_t* d_status = DevicePtr<int64_t>(status_ptr);
  HostStatus status{-1, 0};
  WithIndexType(splits_dtype, "splits", [&](auto tag) {
    using TSeg = typename decltype(tag)::type;
    py::gil_scoped_release nogil;
    status = LaunchWithStatus(d_status, stream, [&] {
      return ctr::gpu::SplitsToOffsets(DevicePtr<const TSeg>(splits_ptr), num_splits, nnz,
                                       DevicePtr<int64_t>(offsets_ptr), d_status, StreamPtr(stream));
    });
  });
  if (status[0] >= 0)
    throw py::value_error(ctr::DescribeSplitError(status[0], status[1], num_splits, nnz));
}

int64_t GpuEmbeddingLookupGrad(
    uintptr_t params_ptr, const std::string& params_dtype, int64_t vocab, int64_t dim,
    uintptr_t keys_ptr, const std::string& keys_dtype, int64_t nnz, uintptr_t weights_ptr,
    uintptr_t offsets_ptr, int64_t num_rows, uintptr_t grad_out_ptr, uintptr_t grad_values_ptr,
    uintptr_t grad_indices_ptr, uintptr_t grad_weights_ptr, int64_t max_grad_rows,
    uintptr_t workspace_ptr, int64_t workspace_bytes, const std::string& combiner,
    const std::string& id_mode, const std::string& invalid_ids, bool prune_weights,
    int64_t default_id, float max_norm, uintptr_t stream) {
  const ctr::LookupSpec spec =
      tf_ctr_py::MakeLookupSpec(vocab, dim, combiner, id_mode, invalid_ids, prune_weights, default_id, max_norm);
  if (num_rows < 0 || nnz < 0) throw py::value_error("num_rows and nnz must be >= 0");
  const GradWorkspace ws = GradWorkspaceFor(num_rows);
  if (workspace_bytes < 0 || static_cast<size_t>(workspace_bytes) < ws.total)
    throw py::value_error("workspace_bytes must be at least " + std::to_string(ws.total) +
                          " (gpu_embedding_lookup_grad_workspace_bytes)");
  RequirePointer(params_ptr, vocab > 0 && dim > 0, "params_ptr");
  RequirePointer(keys_ptr, nnz > 0, "keys_ptr");
  RequirePointer(offsets_ptr, true, "offsets_ptr");
  RequirePointer(grad_out_ptr, num_rows > 0 && dim > 0, "grad_out_ptr");
  RequirePointer(workspace_ptr, true, "workspace_ptr");
  char* workspace = DevicePtr<char>(workspace_ptr);
  int64_t* counts = reinterpret_cast<int64_t*>(workspace + ws.counts);
  int64_t* grad_offsets = reinterpret_cast<int64_t*>(workspace + ws.grad_offsets);
  int64_t* status = reinterpret_cast<int64_t*>(workspace + ws.status);
  int64_t total = 0, bad[2] = {-1, 0};
  WithValueType(params_dtype, [&](auto value_tag) {
    using T = typename decltype(value_tag)::type;
    WithIndexType(keys_dtype, "keys", [&](auto key_tag) {
      using TKey = typename decltype(key_tag)::type;
      py::gil_scoped_release nogil;
      Check(ctr::gpu::InitStatus(status, StreamPtr(stream)));
      Check(ctr::gpu::GradRowCounts<TKey>(spec, DevicePtr<const TKey>(keys_ptr),
                                          DevicePtr<const float>(weights_ptr),
                                          DevicePtr<const int64_t>(offsets_ptr), num_rows, counts, status,
                                          StreamPtr(stream)));
      Check(ctr::gpu::ExclusiveScan(counts, num_rows, grad_offsets, workspace + ws.scan,
                                    ws.scan_bytes, StreamPtr(stream)));
      Check(ctr::gpu::ReadInt64(grad_offsets + num_rows, 1, &total, StreamPtr(stream)));
      Check(ctr::gpu::ReadInt64(status, 2, bad, StreamPtr(stream)));
      // Checked before the rows are written: the buffers are sized by the caller.
      if (total > max_grad_rows || bad[0] >= 0) return;
      if (total > 0) {
        if (grad_values_ptr == 0 && dim > 0) throw std::runtime_error("grad_values_ptr is 0");
        if (grad_indices_ptr == 0) throw std::runtime_error("grad_indices_ptr is 0");
      }
      Check(ctr::gpu::LookupGrad<T, TKey>(
          spec, DevicePtr<const T>(params_ptr), DevicePtr<const TKey>(keys_ptr),
          DevicePtr<const float>(weights_ptr), DevicePtr<const int64_t>(offsets_ptr),
          DevicePtr<const T>(grad_out_ptr), grad_offsets, num_rows, DevicePtr<T>(grad_values_ptr),
          DevicePtr<int64_t>(grad_indices_ptr), DevicePtr<float>(grad_weights_ptr),
          StreamPtr(stream)));
    });
  });
  if (bad[0] >= 0) {
    ctr::KeyError err;
    err.row = bad[0];
    err.key = bad[1];
    throw py::value_error(ctr::DescribeKeyError(err, vocab));
  }
  if (total > max_grad_rows)
    throw py::value_error("the gradient has " + std::to_string(total) +
                          " rows but the output buffers hold max_grad_rows = " +
                          std::to_string(max_grad_rows) + " (nnz + num_rows always suffices)");
  return total;
}

}  // namespace

// The slot count of a table of table_rows rows for `capacity` (laid out as
// cc/core/hash_table.h says), after checking the arguments both bindings share.
int64_t TableSlots(int64_t table_rows, int64_t capacity, uintptr_t table_ptr, uintptr_t keys_ptr, int64_t n,
                   uintptr_t rows_ptr) {
  int64_t num_slots = 0;
  const std::string shape_error = ctr::TableSlots(table_rows, ctr::kColumns, capacity, &num_slots);
  if (!shape_error.empty()) throw py::value_error(shape_error);
  if (n < 0) throw py::value_error("n must be >= 0");
  RequirePointer(table_ptr, true, "table_ptr");
  RequirePointer(keys_ptr, n > 0, "keys_ptr");
  RequirePointer(rows_ptr, n > 0, "rows_ptr");
  return num_slots;
}

// The hash-table find on device pointers.
void GpuHashTableFind(uintptr_t table_ptr, int64_t table_rows, int64_t capacity, uintptr_t keys_ptr, int64_t n,
                      bool dense_padding, uintptr_t rows_ptr, uintptr_t stream) {
  const int64_t num_slots = TableSlots(table_rows, capacity, table_ptr, keys_ptr, n, rows_ptr);
  const int64_t* slot_rows = DevicePtr<const int64_t>(table_ptr) + ctr::kColumns * ctr::kHeaderRows;
  py::gil_scoped_release nogil;
  Check(ctr::gpu::HashTableFind(slot_rows, num_slots, DevicePtr<const int64_t>(keys_ptr), n, dense_padding,
                                DevicePtr<int64_t>(rows_ptr), StreamPtr(stream)));
}

// The inserting find on device pointers: synchronizes, and returns how many
// rows were taken off the free stack (written to reused).
int64_t GpuHashTableFindOrInsert(uintptr_t table_ptr, int64_t table_rows, int64_t capacity, uintptr_t keys_ptr,
                                 int64_t n, uintptr_t rows_ptr, uintptr_t reused_ptr, uintptr_t status_ptr,
                                 uintptr_t scratch_ptr, int64_t admit_after, bool dense_padding, bool new_step,
                                 const std::string& eviction, uintptr_t stream) {
  const int64_t num_slots = TableSlots(table_rows, capacity, table_ptr, keys_ptr, n, rows_ptr);
  const ctr::InsertRules rules = tf_ctr_py::MakeInsertRules(capacity, admit_after, dense_padding, eviction);
  RequirePointer(reused_ptr, n > 0, "reused_ptr");
  RequirePointer(status_ptr, true, "status_ptr");
  RequirePointer(scratch_ptr, n > 0, "scratch_ptr");
  ctr::gpu::InsertOutcome outcome;
  {
    py::gil_scoped_release nogil;
    auto* table = DevicePtr<int64_t>(table_ptr);
    const auto* keys = DevicePtr<const int64_t>(keys_ptr);
    auto* rows = DevicePtr<int64_t>(rows_ptr);
    auto* reused = DevicePtr<int64_t>(reused_ptr);
    auto* status = DevicePtr<int64_t>(status_ptr);
    Check(ctr::gpu::HashTableFindOrInsert(table, num_slots, rules, new_step, keys, n, rows, reused, status,
                                          DevicePtr<void>(scratch_ptr), ctr::gpu::HashTableInsertScratchBytes(n),
                                          StreamPtr(stream)));
    Check(ctr::gpu::FinishFindOrInsert(table, num_slots, rules, keys, n, rows, reused, status, &outcome,
                                       StreamPtr(stream)));
  }
  if (outcome.bad_header) throw py::value_error("corrupt hash table header, free stack or slots: nothing was inserted");
  if (!outcome.corrupt.empty()) throw py::value_error(outcome.corrupt);
  return outcome.reused_count;
}

void RegisterGpuBindings(py::module_& m) {
  m.def("gpu_hash_table_find_or_insert", &GpuHashTableFindOrInsert, py::arg("table_ptr"), py::arg("table_rows"),
        py::arg("capacity"), py::arg("keys_ptr"), py::arg("n"), py::arg("rows_ptr"), py::arg("reused_ptr"),
        py::arg("status_ptr"), py::arg("scratch_ptr"), py::arg("admit_after") = 1, py::arg("dense_padding") = false,
        py::arg("new_step") = true, py::arg("eviction") = "none", py::arg("stream") = 0,
        "hash_table_find(insert=True) on the device: the int64 table [table_rows, 4] is "
        "updated in place and rows int64 [n] written; reused int64 [n] receives the rows taken off the free "
        "stack, status is int64[gpu_hash_table_status_cells] scratch and scratch "
        "gpu_hash_table_insert_scratch_bytes(n) bytes. A call that evicts runs its inserts on the host, on a "
        "copy of the table. Synchronizes the stream and returns how many rows were "
        "reused; raises ValueError for a header that does not fit the table.");
  m.def("gpu_hash_table_insert_scratch_bytes", &ctr::gpu::HashTableInsertScratchBytes, py::arg("n"),
        "Device scratch bytes gpu_hash_table_find_or_insert needs for n keys.");
  m.attr("gpu_hash_table_status_cells") = static_cast<int>(ctr::gpu::kHashTableStatusCells);
  m.attr("gpu_hash_table_parallel_cell") = static_cast<int>(ctr::gpu::kParallel);
  m.attr("gpu_hash_table_on_host_cell") = static_cast<int>(ctr::gpu::kOnHost);
  m.def("gpu_hash_table_find", &GpuHashTableFind, py::arg("table_ptr"), py::arg("table_rows"),
        py::arg("capacity"), py::arg("keys_ptr"), py::arg("n"), py::arg("dense_padding") = false,
        py::arg("rows_ptr") = 0, py::arg("stream") = 0,
        "Rows of int64 keys [n] in an int64 hash table [table_rows, 4] (hash_table_find's layout) on the "
        "device: rows int64 [n], -1 for a key without a row. Asynchronous on the stream.");
  m.def("gpu_embedding_lookup", &GpuEmbeddingLookup, py::arg("params_ptr"),
        py::arg("params_dtype"), py::arg("vocab"), py::arg("dim"), py::arg("keys_ptr"),
        py::arg("keys_dtype"), py::arg("nnz"), py::arg("weights_ptr"), py::arg("offsets_ptr"),
        py::arg("num_rows"), py::arg("out_ptr"), py::arg("status_ptr"),
        py::arg("combiner") = "mean", py::arg("id_mode") = "index",
        py::arg("invalid_ids") = "error", py::arg("prune_weights") = false,
        py::arg("default_id") = -1, py::arg("max_norm") = -1.0f, py::arg("stream") = 0,
        "Pooled lookup on device pointers: params [vocab, dim] of params_dtype "
        "('float32' | 'float16' | 'bfloat16'), keys [nnz] of keys_dtype ('int32' | 'int64'), "
        "weights float32 [nnz] or 0, offsets int64 [num_rows + 1] (CSR), out [num_rows, dim], "
        "status int64[2] scratch. Synchronizes the stream; raises ValueError on a bad id.");
  m.def("gpu_row_ids_to_offsets", &GpuRowIdsToOffsets, py::arg("row_ids_ptr"),
        py::arg("row_ids_dtype"), py::arg("nnz"), py::arg("num_rows"), py::arg("offsets_ptr"),
        py::arg("status_ptr"), py::arg("stream") = 0,
        "Sorted row ids [nnz] to int64 CSR offsets [num_rows + 1]. Synchronizes the stream; "
        "raises ValueError on an out-of-range or unsorted id.");
  m.def("gpu_row_splits_to_offsets", &GpuRowSplitsToOffsets, py::arg("splits_ptr"),
        py::arg("splits_dtype"), py::arg("num_splits"), py::arg("nnz"), py::arg("offsets_ptr"),
        py::arg("status_ptr"), py::arg("stream") = 0,
        "int32/int64 row_splits [num_splits] to int64 offsets, validated as on the CPU. "
        "Synchronizes the stream; raises ValueError on invalid splits.");
  m.def(
      "gpu_embedding_lookup_grad_workspace_bytes",
      [](int64_t num_rows) { return GradWorkspaceFor(num_rows).total; }, py::arg("num_rows"),
      "Device scratch bytes gpu_embedding_lookup_grad needs for num_rows bags.");
  m.def("gpu_embedding_lookup_grad", &GpuEmbeddingLookupGrad, py::arg("params_ptr"),
        py::arg("params_dtype"), py::arg("vocab"), py::arg("dim"), py::arg("keys_ptr"),
        py::arg("keys_dtype"), py::arg("nnz"), py::arg("weights_ptr"), py::arg("offsets_ptr"),
        py::arg("num_rows"), py::arg("grad_out_ptr"), py::arg("grad_values_ptr"),
        py::arg("grad_indices_ptr"), py::arg("grad_weights_ptr"), py::arg("max_grad_rows"),
        py::arg("workspace_ptr"), py::arg("workspace_bytes"), py::arg("combiner") = "mean",
        py::arg("id_mode") = "index", py::arg("invalid_ids") = "error",
        py::arg("prune_weights") = false, py::arg("default_id") = -1,
        py::arg("max_norm") = -1.0f, py::arg("stream") = 0,
        "Gradient of gpu_embedding_lookup for grad_out [num_rows, dim]: one row of "
        "d(loss)/d(params) per kept entry (bag order; the default row for a bag left empty) "
        "into grad_values [max_grad_rows, dim] and its table row into grad_indices int64 "
        "[max_grad_rows], plus d(loss)/d(weights) float32 [nnz] into grad_weights (0 = skip; "
        "every entry is written, dropped ones with 0). Needs a workspace of "
        "gpu_embedding_lookup_grad_workspace_bytes(num_rows). max_grad_rows = nnz + num_rows "
        "is always enough; a smaller buffer that turns out too small raises ValueError before "
        "anything is written. Returns the number of gradient rows; they are complete once "
        "`stream` reaches this point.");
}

// Python access to the CUDA string-embedding launchers on raw device pointers.
//
// Same conventions as gpu_bindings.cc: pointers and streams are Python ints
// (CuPy's `a.data.ptr`, PyTorch's `t.data_ptr()`), stream 0 is the legacy
// default stream, device work runs with the GIL released, bad tokens raise
// ValueError with the CPU's message and CUDA failures raise RuntimeError.
//
// The packed strings are trusted as the launchers trust them: string_splits
// must be non-decreasing byte offsets inside the bytes buffer and bag_splits
// valid row splits over the strings (the ops validate them; a test passes
// what the CPU core accepted).
#include "cc/python/gpu_string_bindings.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "cc/core/float_types.h"
#include "cc/core/strings.h"
#include "cc/python/specs.h"
#include "cc/python/gpu_common.h"
#include "cuda/device_util.h"
#include "cuda/lookup_launchers.h"
#include "cuda/string_launchers.h"

namespace py = pybind11;

namespace {

using tf_ctr_py::Check;
using tf_ctr_py::DevicePtr;
using tf_ctr_py::GradWorkspace;
using tf_ctr_py::GradWorkspaceFor;
using tf_ctr_py::MakeStringSpec;
using tf_ctr_py::RequirePointer;
using tf_ctr_py::StreamPtr;
using tf_ctr_py::TypeTag;
using tf_ctr_py::WithIndexType;
using tf_ctr_py::WithValueType;

// A rejected token as read back, with its first bytes for the message.
struct HostTokenError {
  ctr::TokenError error;
  std::vector<uint8_t> token;
};

// Reads d_status (synchronizing the stream) with the first bytes of the
// token it rejected, captured on the device as the op kernels capture them:
// 64 are shown, and a 65th tells DescribeTokenError that more follow. Call
// without the GIL.
HostTokenError ReadTokenError(const int64_t* d_status, const uint8_t* d_bytes, void* stream) {
  constexpr int64_t kShown = 65;
  std::array<int64_t, ctr::gpu::kTokenStatusSize> h{};
  HostTokenError out;
  out.token.resize(kShown);
  Check(ctr::gpu::ReadTokenStatus(d_status, d_bytes, kShown, h.data(), out.token.data(), stream));
  out.error = ctr::TokenError{h[0], h[1], h[2], h[3], h[4]};
  if (!out.error.found()) return out;
  out.token.resize(static_cast<size_t>(std::min(out.error.len, kShown)));
  out.error.begin = 0;
  out.error.len = static_cast<int64_t>(out.token.size());
  return out;
}

// Resets the token status, runs launch(TypeTag<T>{}) for the table dtype
// without the GIL, and reads back what it rejected.
template <typename Launch>
HostTokenError LaunchWithTokenStatus(const std::string& params_dtype, int64_t* d_status, const uint8_t* d_bytes,
                                     uintptr_t stream, Launch&& launch) {
  HostTokenError bad;
  WithValueType(params_dtype, [&](auto tag) {
    py::gil_scoped_release nogil;
    Check(ctr::gpu::InitTokenStatus(d_status, StreamPtr(stream)));
    Check(launch(tag));
    bad = ReadTokenError(d_status, d_bytes, StreamPtr(stream));
  });
  return bad;
}

std::string Describe(const HostTokenError& e, int64_t vocab) {
  return ctr::DescribeTokenError(e.error, e.token.data(), vocab);
}

// The op kernels' check of string splits: the first bad one as (index,
// value), (-1, 0) when all are valid, and out = the splits, or zeros when
// one is bad (what the kernels queued behind the check read).
py::tuple GpuGateStringSplits(uintptr_t splits_ptr, int64_t num_splits, int64_t num_bytes, uintptr_t out_ptr,
                              uintptr_t status_ptr, uintptr_t stream) {
  if (num_splits < 0) throw py::value_error("num_splits must be >= 0");
  RequirePointer(splits_ptr, num_splits > 0, "splits_ptr");
  RequirePointer(out_ptr, num_splits > 0, "out_ptr");
  RequirePointer(status_ptr, true, "status_ptr");
  int64_t* d_status = DevicePtr<int64_t>(status_ptr);
  std::array<int64_t, 2> h{};
  {
    py::gil_scoped_release nogil;
    const int64_t* splits = DevicePtr<const int64_t>(splits_ptr);
    Check(ctr::gpu::ValidateStringSplits(splits, num_splits, num_bytes, d_status, StreamPtr(stream)));
    Check(ctr::gpu::GateStringSplits(splits, num_splits, d_status, DevicePtr<int64_t>(out_ptr), StreamPtr(stream)));
    Check(ctr::gpu::ReadInt64(d_status, 2, h.data(), StreamPtr(stream)));
  }
  return py::make_tuple(h[0], h[1]);
}

void GpuStringEmbedding(uintptr_t params_ptr, const std::string& params_dtype, int64_t vocab,
                        int64_t dim, uintptr_t bytes_ptr, uintptr_t string_splits_ptr,
                        uintptr_t bag_splits_ptr, int64_t num_bags, uintptr_t out_ptr,
                        uintptr_t status_ptr, const std::string& combiner,
                        const std::string& id_mode, const py::bytes& delimiter, bool skip_empty,
                        float max_norm, uintptr_t stream, int64_t default_id, int64_t num_buckets,
                        const std::string& invalid_ids, const std::vector<int64_t>& hash_key) {
  const ctr::StringSpec spec = MakeStringSpec(vocab, dim, combiner, id_mode, delimiter,
                                              skip_empty, max_norm, default_id, num_buckets, invalid_ids,
                                              hash_key);
  if (num_bags < 0) throw py::value_error("num_bags must be >= 0");
  RequirePointer(params_ptr, vocab > 0 && dim > 0, "params_ptr");
  RequirePointer(string_splits_ptr, num_bags > 0, "string_splits_ptr");
  RequirePointer(out_ptr, num_bags > 0 && dim > 0, "out_ptr");
  RequirePointer(status_ptr, true, "status_ptr");
  int64_t* d_status = DevicePtr<int64_t>(status_ptr);
  const uint8_t* d_bytes = DevicePtr<const uint8_t>(bytes_ptr);
  const HostTokenError bad = LaunchWithTokenStatus(params_dtype, d_status, d_bytes, stream, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return ctr::gpu::StringEmbedding<T>(spec, DevicePtr<const T>(params_ptr), d_bytes,
                                        DevicePtr<const int64_t>(string_splits_ptr),
                                        DevicePtr<const int64_t>(bag_splits_ptr), num_bags, DevicePtr<T>(out_ptr),
                                        d_status, StreamPtr(stream));
  });
  if (bad.error.found()) throw py::value_error(Describe(bad, vocab));
}

// One feature of gpu_multi_string_embedding, from a dict with the keys
// params_ptr, vocab, dim, out_ptr and optionally combiner, id_mode,
// delimiter, skip_empty, max_norm, hash_key (the single-feature defaults), and its
// layout: first_string (index * batch), num_strings (batch), out_rows
// (num_strings) and out_stride (dim), as cuda/string_launchers.h describes
// them (a concatenated output: out_ptr at the feature's first column, the
// output's width as out_stride).
ctr::gpu::FeatureDesc FeatureFromDict(const py::handle& item, int64_t index, int64_t batch) {
  static const char* kKeys[] = {"params_ptr", "vocab",      "dim",        "out_ptr",     "combiner",
                                "id_mode",    "delimiter",  "skip_empty", "max_norm",    "first_string",
                                "num_strings", "out_rows",  "out_stride",  "hash_key"};
  const std::string where = "features[" + std::to_string(index) + "]";
  if (!py::isinstance<py::dict>(item)) throw py::type_error(where + " must be a dict");
  const py::dict d = py::reinterpret_borrow<py::dict>(item);
  for (const auto& kv : d) {
    const std::string key = py::str(kv.first);
    if (std::find(std::begin(kKeys), std::end(kKeys), key) == std::end(kKeys))
      throw py::value_error(where + ": unknown key '" + key + "'");
  }
  for (const char* key : {"params_ptr", "vocab", "dim", "out_ptr"})
    if (!d.contains(key)) throw py::value_error(where + " needs '" + key + "'");
  auto get = [&](const char* key, auto fallback) {
    return d.contains(key) ? d[key].cast<decltype(fallback)>() : fallback;
  };
  const int64_t vocab = d["vocab"].cast<int64_t>();
  const int64_t dim = d["dim"].cast<int64_t>();
  ctr::gpu::FeatureDesc f;
  try {
    f.spec = MakeStringSpec(vocab, dim, get("combiner", std::string("mean")),
                            get("id_mode", std::string("hash")),
                            d.contains("delimiter") ? std::string(d["delimiter"].cast<py::bytes>())
                                                    : std::string(","),
                            get("skip_empty", true), get("max_norm", -1.0f), -1, 0, "error",
                            get("hash_key", std::vector<int64_t>{}));
  } catch (const py::value_error& e) {
    throw py::value_error(where + ": " + e.what());
  }
  const uintptr_t params_ptr = d["params_ptr"].cast<uintptr_t>();
  const uintptr_t out_ptr = d["out_ptr"].cast<uintptr_t>();
  RequirePointer(params_ptr, vocab > 0 && dim > 0, (where + ".params_ptr").c_str());
  RequirePointer(out_ptr, batch > 0 && dim > 0, (where + ".out_ptr").c_str());
  f.params = DevicePtr<const void>(params_ptr);
  f.out = DevicePtr<void>(out_ptr);
  f.first_string = get("first_string", index * batch);
  f.num_strings = get("num_strings", batch);
  f.out_rows = get("out_rows", f.num_strings);
  f.out_stride = get("out_stride", dim);
  if (f.first_string < 0 || f.num_strings < 0 || f.num_strings > batch || f.out_rows < 0 ||
      f.out_rows > f.num_strings || f.out_stride < dim)
    throw py::value_error(where + ": needs 0 <= first_string, 0 <= num_strings <= batch (" + std::to_string(batch) +
                          "), 0 <= out_rows <= num_strings and out_stride >= dim, got " +
                          std::to_string(f.first_string) + ", " + std::to_string(f.num_strings) + ", " +
                          std::to_string(f.out_rows) + " and " + std::to_string(f.out_stride));
  return f;
}

size_t FeatureScratchBytes(int64_t num_features) {
  return static_cast<size_t>(std::max<int64_t>(num_features, 0)) * sizeof(ctr::gpu::FeatureDesc);
}

void GpuMultiStringEmbedding(const py::list& features, const std::string& params_dtype,
                             int64_t batch, uintptr_t bytes_ptr, uintptr_t string_splits_ptr,
                             uintptr_t scratch_ptr, int64_t scratch_bytes, uintptr_t status_ptr,
                             uintptr_t stream) {
  const int64_t n = static_cast<int64_t>(features.size());
  if (batch < 0) throw py::value_error("batch must be >= 0");
  std::vector<ctr::gpu::FeatureDesc> h_features;
  for (int64_t i = 0; i < n; ++i) h_features.push_back(FeatureFromDict(features[i], i, batch));
  if (scratch_bytes < 0 || static_cast<size_t>(scratch_bytes) < FeatureScratchBytes(n))
    throw py::value_error("scratch_bytes must be at least " +
                          std::to_string(FeatureScratchBytes(n)) +
                          " (gpu_multi_string_scratch_bytes)");
  RequirePointer(string_splits_ptr, n * batch > 0, "string_splits_ptr");
  RequirePointer(scratch_ptr, n > 0, "scratch_ptr");
  RequirePointer(status_ptr, true, "status_ptr");
  int64_t* d_status = DevicePtr<int64_t>(status_ptr);
  const uint8_t* d_bytes = DevicePtr<const uint8_t>(bytes_ptr);
  HostTokenError bad = LaunchWithTokenStatus(params_dtype, d_status, d_bytes, stream, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return ctr::gpu::MultiStringEmbedding<T>(h_features.data(), DevicePtr<ctr::gpu::FeatureDesc>(scratch_ptr), n,
                                             batch, d_bytes, DevicePtr<const int64_t>(string_splits_ptr), d_status,
                                             StreamPtr(stream));
  });
  if (!bad.error.found()) return;
  // The launcher records the string's index: its feature is the one holding it.
  for (int64_t f = 0; f < n; ++f) {
    const ctr::gpu::FeatureDesc& d = h_features[f];
    if (bad.error.row < d.first_string || bad.error.row >= d.first_string + d.num_strings) continue;
    bad.error.row -= d.first_string;
    throw py::value_error("feature " + std::to_string(f) + ": " + Describe(bad, d.spec.lookup.vocab));
  }
  throw py::value_error(Describe(bad, h_features[0].spec.lookup.vocab));
}

int64_t GpuStringEmbeddingGrad(uintptr_t params_ptr, const std::string& params_dtype,
                               int64_t vocab, int64_t dim, uintptr_t bytes_ptr,
                               uintptr_t string_splits_ptr, uintptr_t bag_splits_ptr,
                               int64_t num_bags, uintptr_t grad_out_ptr,
                               uintptr_t grad_values_ptr, uintptr_t grad_indices_ptr,
                               int64_t max_grad_rows, uintptr_t workspace_ptr,
                               int64_t workspace_bytes, const std::string& combiner,
                               const std::string& id_mode, const py::bytes& delimiter,
                               bool skip_empty, float max_norm, uintptr_t stream,
                               int64_t default_id, int64_t num_buckets, const std::string& invalid_ids) {
  const ctr::StringSpec spec = MakeStringSpec(vocab, dim, combiner, id_mode, delimiter,
                                              skip_empty, max_norm, default_id, num_buckets, invalid_ids);
  if (num_bags < 0) throw py::value_error("num_bags must be >= 0");
  const GradWorkspace ws = GradWorkspaceFor(num_bags);
  if (workspace_bytes < 0 || static_cast<size_t>(workspace_bytes) < ws.total)
    throw py::value_error("workspace_bytes must be at least " + std::to_string(ws.total) +
                          " (gpu_string_embedding_grad_workspace_bytes)");
  RequirePointer(params_ptr, vocab > 0 && dim > 0, "params_ptr");
  RequirePointer(string_splits_ptr, num_bags > 0, "string_splits_ptr");
  RequirePointer(grad_out_ptr, num_bags > 0 && dim > 0, "grad_out_ptr");
  RequirePointer(workspace_ptr, true, "workspace_ptr");
  char* workspace = DevicePtr<char>(workspace_ptr);
  int64_t* counts = reinterpret_cast<int64_t*>(workspace + ws.counts);
  int64_t* grad_offsets = reinterpret_cast<int64_t*>(workspace + ws.grad_offsets);
  const uint8_t* d_bytes = DevicePtr<const uint8_t>(bytes_ptr);
  const int64_t* d_splits = DevicePtr<const int64_t>(string_splits_ptr);
  const int64_t* d_bag_splits = DevicePtr<const int64_t>(bag_splits_ptr);
  int64_t* status = reinterpret_cast<int64_t*>(workspace + ws.status);
  int64_t total = 0;
  HostTokenError bad;
  WithValueType(params_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    py::gil_scoped_release nogil;
    Check(ctr::gpu::InitTokenStatus(status, StreamPtr(stream)));
    Check(ctr::gpu::StringGradRowCounts(spec, d_bytes, d_splits, d_bag_splits, num_bags, counts, status,
                                        StreamPtr(stream)));
    Check(ctr::gpu::ExclusiveScan(counts, num_bags, grad_offsets, workspace + ws.scan,
                                  ws.scan_bytes, StreamPtr(stream)));
    Check(ctr::gpu::ReadInt64(grad_offsets + num_bags, 1, &total, StreamPtr(stream)));
    bad = ReadTokenError(status, d_bytes, StreamPtr(stream));
    // Checked before the rows are written: the buffers are sized by the caller.
    if (total > max_grad_rows || total == 0 || bad.error.found()) return;
    if (grad_values_ptr == 0 && dim > 0) throw std::runtime_error("grad_values_ptr is 0");
    if (grad_indices_ptr == 0) throw std::runtime_error("grad_indices_ptr is 0");
    Check(ctr::gpu::StringGrad<T>(spec, DevicePtr<const T>(params_ptr), d_bytes, d_splits,
                                  d_bag_splits, num_bags, DevicePtr<const T>(grad_out_ptr),
                                  grad_offsets, DevicePtr<T>(grad_values_ptr),
                                  DevicePtr<int64_t>(grad_indices_ptr), StreamPtr(stream)));
  });
  if (bad.error.found()) throw py::value_error(Describe(bad, vocab));
  if (total > max_grad_rows)
    throw py::value_error("the gradient has " + std::to_string(total) +
                          " rows but the output buffers hold max_grad_rows = " +
                          std::to_string(max_grad_rows));
  return total;
}

}  // namespace

void RegisterGpuStringBindings(py::module_& m) {
  m.def("gpu_string_embedding", &GpuStringEmbedding, py::arg("params_ptr"),
        py::arg("params_dtype"), py::arg("vocab"), py::arg("dim"), py::arg("bytes_ptr"),
        py::arg("string_splits_ptr"), py::arg("bag_splits_ptr"), py::arg("num_bags"),
        py::arg("out_ptr"), py::arg("status_ptr"), py::arg("combiner") = "mean",
        py::arg("id_mode") = "hash", py::arg("delimiter") = py::bytes(","),
        py::arg("skip_empty") = true, py::arg("max_norm") = -1.0f, py::arg("stream") = 0,
        py::arg("default_id") = -1, py::arg("num_buckets") = 0, py::arg("invalid_ids") = "error",
        py::arg("hash_key") = std::vector<int64_t>{},
        "Pooled tokens of packed strings on device pointers: params [vocab, dim] of "
        "params_dtype ('float32' | 'float16' | 'bfloat16'), bytes uint8, string_splits int64 "
        "byte offsets [S + 1], bag_splits int64 [num_bags + 1] or 0 (each string a bag), out "
        "[num_bags, dim], status int64[5] scratch. id_mode 'hash' | 'index' | 'mod'. "
        "Synchronizes the stream; raises ValueError, with the CPU's message, on a bad token.");
  m.def("gpu_gate_string_splits", &GpuGateStringSplits, py::arg("splits_ptr"), py::arg("num_splits"),
        py::arg("num_bytes"), py::arg("out_ptr"), py::arg("status_ptr"), py::arg("stream") = 0,
        "The string ops' check of int64 string_splits [num_splits] over num_bytes packed bytes: "
        "(index, value) of the first negative, decreasing or out-of-buffer split, (-1, 0) when "
        "all are valid; out int64 [num_splits] = the splits, or zeros when one is bad. status is "
        "int64[3] scratch. Synchronizes the stream.");
  m.def(
      "gpu_multi_string_scratch_bytes",
      [](int64_t num_features) { return FeatureScratchBytes(num_features); },
      py::arg("num_features"),
      "Device scratch bytes gpu_multi_string_embedding needs for num_features features.");
  m.def("gpu_multi_string_embedding", &GpuMultiStringEmbedding, py::arg("features"),
        py::arg("params_dtype"), py::arg("batch"), py::arg("bytes_ptr"),
        py::arg("string_splits_ptr"), py::arg("scratch_ptr"), py::arg("scratch_bytes"),
        py::arg("status_ptr"), py::arg("stream") = 0,
        "The grouped launch: features is a list of dicts {params_ptr, vocab, dim, out_ptr, and "
        "optionally combiner, id_mode, delimiter, skip_empty, max_norm, hash_key}; feature f pools strings "
        "[f * batch, (f + 1) * batch) of string_splits int64 [N * batch + 1] into out "
        "[batch, dim]. Needs gpu_multi_string_scratch_bytes(N) of device scratch and status "
        "int64[5]. Synchronizes the stream; raises ValueError ('feature f: ...') on a bad "
        "token.");
  m.def(
      "gpu_string_embedding_grad_workspace_bytes",
      [](int64_t num_bags) { return GradWorkspaceFor(num_bags).total; }, py::arg("num_bags"),
      "Device scratch bytes gpu_string_embedding_grad needs for num_bags bags.");
  m.def("gpu_string_embedding_grad", &GpuStringEmbeddingGrad, py::arg("params_ptr"),
        py::arg("params_dtype"), py::arg("vocab"), py::arg("dim"), py::arg("bytes_ptr"),
        py::arg("string_splits_ptr"), py::arg("bag_splits_ptr"), py::arg("num_bags"),
        py::arg("grad_out_ptr"), py::arg("grad_values_ptr"), py::arg("grad_indices_ptr"),
        py::arg("max_grad_rows"), py::arg("workspace_ptr"), py::arg("workspace_bytes"),
        py::arg("combiner") = "mean", py::arg("id_mode") = "hash",
        py::arg("delimiter") = py::bytes(","), py::arg("skip_empty") = true,
        py::arg("max_norm") = -1.0f, py::arg("stream") = 0, py::arg("default_id") = -1,
        py::arg("num_buckets") = 0, py::arg("invalid_ids") = "error",
        "Gradient of gpu_string_embedding for grad_out [num_bags, dim]: one row of "
        "d(loss)/d(params) per valid token in bag order (the default row for a bag without "
        "one, when default_id >= 0) into grad_values [max_grad_rows, dim], its table row into "
        "grad_indices int64 [max_grad_rows]. Needs gpu_string_embedding_grad_workspace_bytes"
        "(num_bags) of device scratch. A buffer that turns out too small raises ValueError "
        "before anything is written. Returns the number of rows; they are complete once "
        "`stream` reaches this point.");
}

// tf_ctr_ops._core: the framework-free kernels on NumPy arrays (and, when
// built with CUDA, the launchers on raw device pointers). Benchmarks use it to
// show TF's dispatch overhead; GPU tests use it where TF cannot run.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cc/core/fingerprint.h"
#include "cc/core/string_hash.h"
#include "cc/core/hash_table_cpu.h"
#include "cc/core/lookup.h"
#include "cc/core/lookup_cpu.h"
#include "cc/core/lowest_row_error.h"
#include "cc/core/parse.h"
#include "cc/core/segments.h"
#include "cc/core/strings.h"
#include "cc/core/strings_cpu.h"
#include "cc/python/specs.h"
#ifdef CTR_WITH_CUDA
#include "cc/python/gpu_bindings.h"
#include "cc/python/gpu_string_bindings.h"
#endif

namespace py = pybind11;

namespace {

// Splits [0, n) into one contiguous range per hardware thread.
template <typename Fn>
void ParallelRanges(int64_t n, int num_threads, Fn fn) {
  // No bags, no work: fn would still size its scratch by D (an empty batch of
  // a [0, 2^40] table asked for 4 TiB), as TF's ParallelFor skips n = 0.
  if (n <= 0) return;
  num_threads = std::max(1, std::min<int>(num_threads, static_cast<int>(n / 64 + 1)));
  if (num_threads == 1) {
    fn(0, n);
    return;
  }
  std::vector<std::thread> threads;
  const int64_t chunk = (n + num_threads - 1) / num_threads;
  for (int t = 0; t < num_threads; ++t) {
    const int64_t b = std::min(n, t * chunk), e = std::min(n, b + chunk);
    threads.emplace_back([=] { fn(b, e); });
  }
  for (auto& th : threads) th.join();
}

template <typename T, typename TKey>
py::array RunLookup(const ctr::LookupSpec& spec, const py::array& params, const py::array& keys,
                    const std::vector<int64_t>& offsets, const float* weights, int threads) {
  const int64_t rows = static_cast<int64_t>(offsets.size()) - 1;
  py::array out(params.dtype(), std::vector<py::ssize_t>{rows, spec.dim});
  T* dst = static_cast<T*>(out.mutable_data());
  const T* p = static_cast<const T*>(params.data());
  const TKey* k = static_cast<const TKey*>(keys.data());
  ctr::LowestRowError<ctr::KeyError> first;
  ctr::TableFault fault;
  {
    py::gil_scoped_release release;
    ParallelRanges(rows, threads, [&](int64_t b, int64_t e) {
      std::vector<float> acc(spec.dim);
      ctr::KeyError err;
      ctr::PoolBagsCpu(spec, p, k, weights, offsets.data(), b, e, acc.data(), dst, &err);
      first.Offer(err);
    });
  }
  if (first.found()) throw py::value_error(ctr::DescribeKeyError(first.error(), spec.vocab));
  return out;
}

template <typename TKey>
py::array LookupForKeys(const ctr::LookupSpec& spec, const py::array& params, const py::array& keys,
                        const std::vector<int64_t>& offsets, const float* weights, int threads) {
  const std::string kind = py::str(params.dtype());
  if (kind == "float32") return RunLookup<float, TKey>(spec, params, keys, offsets, weights, threads);
  if (kind == "float16") return RunLookup<ctr::Half, TKey>(spec, params, keys, offsets, weights, threads);
  throw py::type_error("params must be float32 or float16, got " + kind);
}

// CSR offsets over nnz keys, checked, and the keys' weights (null when none).
struct CheckedBags {
  std::vector<int64_t> offsets;
  py::array_t<float, py::array::c_style | py::array::forcecast> weights;
  const float* weight_data = nullptr;
};

CheckedBags CheckBags(const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& offsets,
                      const py::object& weights, int64_t nnz) {
  CheckedBags bags;
  bags.offsets.assign(offsets.data(), offsets.data() + offsets.size());
  const std::string err = ctr::ValidateRowSplits(bags.offsets.data(), static_cast<int64_t>(bags.offsets.size()), nnz);
  if (!err.empty()) throw py::value_error(err);
  if (!weights.is_none()) {
    bags.weights = weights.cast<py::array_t<float, py::array::c_style | py::array::forcecast>>();
    if (bags.weights.ndim() != 1 || bags.weights.shape(0) != nnz)
      throw py::value_error("weights must have one value per key");
    bags.weight_data = bags.weights.data();
  }
  return bags;
}

py::array EmbeddingLookup(py::array params, py::array keys, py::array_t<int64_t, py::array::c_style | py::array::forcecast> offsets,
                          py::object weights, const std::string& combiner,
                          const std::string& id_mode, const std::string& invalid_ids,
                          bool prune_weights, int64_t default_id, float max_norm, int threads,
                          const std::vector<int64_t>& hash_key) {
  params = py::array::ensure(params, py::array::c_style);
  keys = py::array::ensure(keys, py::array::c_style);
  if (params.ndim() != 2) throw py::value_error("params must be [V, D]");
  if (keys.ndim() != 1) throw py::value_error("keys must be a vector");
  const ctr::LookupSpec spec = tf_ctr_py::MakeLookupSpec(params.shape(0), params.shape(1), combiner, id_mode,
                                                         invalid_ids, prune_weights, default_id, max_norm, hash_key);
  const CheckedBags bags = CheckBags(offsets, weights, keys.shape(0));
  const std::vector<int64_t>& off = bags.offsets;
  const float* wptr = bags.weight_data;
  if (threads <= 0) threads = static_cast<int>(std::thread::hardware_concurrency());
  const std::string kt = py::str(keys.dtype());
  if (kt == "int32") return LookupForKeys<int32_t>(spec, params, keys, off, wptr, threads);
  if (kt == "int64") return LookupForKeys<int64_t>(spec, params, keys, off, wptr, threads);
  throw py::type_error("keys must be int32 or int64, got " + kt);
}

// A binding's hash_key argument as the core's choice of hash.
ctr::StringHash HashOfKey(const std::vector<int64_t>& key) {
  ctr::StringHash h;
  tf_ctr_py::Require(ctr::SetHashKey(key, &h));
  return h;
}

py::array_t<int64_t> HashBuckets(const std::vector<std::string>& strings, int64_t buckets,
                                 const std::vector<int64_t>& key) {
  if (buckets <= 0) throw py::value_error("num_buckets must be positive");
  const ctr::StringHash hash = HashOfKey(key);
  py::array_t<int64_t> out(static_cast<py::ssize_t>(strings.size()));
  auto o = out.mutable_unchecked<1>();
  for (size_t i = 0; i < strings.size(); ++i)
    o(i) = ctr::HashBucket(hash, reinterpret_cast<const uint8_t*>(strings[i].data()), strings[i].size(), buckets);
  return out;
}

template <typename T>
py::array RunStringEmbedding(const ctr::StringSpec& spec, const py::array& params, const uint8_t* bytes,
                             int64_t num_bytes,
                             const std::vector<int64_t>& splits, const int64_t* bag_splits, int64_t bags,
                             int threads) {
  py::array out(params.dtype(), std::vector<py::ssize_t>{bags, spec.lookup.dim});
  T* dst = static_cast<T*>(out.mutable_data());
  const T* p = static_cast<const T*>(params.data());
  ctr::LowestRowError<ctr::TokenError> first;
  {
    py::gil_scoped_release release;
    ParallelRanges(bags, threads, [&](int64_t b, int64_t e) {
      std::vector<float> acc(spec.lookup.dim);
      ctr::TokenError err;
      ctr::PoolStringBagsCpu(spec, p, bytes, num_bytes, splits.data(), bag_splits, b, e, acc.data(), dst, &err);
      first.Offer(err);
    });
  }
  if (first.found()) throw py::value_error(ctr::DescribeTokenError(first.error(), bytes, spec.lookup.vocab));
  return out;
}

py::array StringEmbedding(py::array params, py::array_t<uint8_t, py::array::c_style | py::array::forcecast> bytes,
                          py::array_t<int64_t, py::array::c_style | py::array::forcecast> string_splits,
                          py::object bag_splits, const std::string& combiner, const std::string& id_mode,
                          const py::bytes& delimiter, bool skip_empty, float max_norm, int threads,
                          int64_t num_buckets, const std::string& invalid_ids, int64_t default_id,
                          const std::vector<int64_t>& hash_key) {
  params = py::array::ensure(params, py::array::c_style);
  if (params.ndim() != 2) throw py::value_error("params must be [V, D]");
  const ctr::StringSpec spec = tf_ctr_py::MakeStringSpec(params.shape(0), params.shape(1), combiner, id_mode,
                                                         delimiter, skip_empty, max_norm, default_id, num_buckets,
                                                         invalid_ids, hash_key);
  std::vector<int64_t> splits(string_splits.data(), string_splits.data() + string_splits.size());
  std::string err = ctr::ValidateStringSplits(splits.data(), static_cast<int64_t>(splits.size()), bytes.size());
  if (!err.empty()) throw py::value_error(err);
  const int64_t num_strings = static_cast<int64_t>(splits.size()) - 1;
  std::vector<int64_t> bags_vec;
  const int64_t* bag_ptr = nullptr;
  int64_t bags = num_strings;
  if (!bag_splits.is_none()) {
    auto b = bag_splits.cast<py::array_t<int64_t, py::array::c_style | py::array::forcecast>>();
    bags_vec.assign(b.data(), b.data() + b.size());
    err = ctr::ValidateRowSplits(bags_vec.data(), static_cast<int64_t>(bags_vec.size()), num_strings, "bag_splits",
                                 "strings");
    if (!err.empty()) throw py::value_error(err);
    bag_ptr = bags_vec.data();
    bags = static_cast<int64_t>(bags_vec.size()) - 1;
  }
  if (threads <= 0) threads = static_cast<int>(std::thread::hardware_concurrency());
  const std::string kind = py::str(params.dtype());
  if (kind == "float32")
    return RunStringEmbedding<float>(spec, params, bytes.data(), bytes.size(), splits, bag_ptr, bags, threads);
  if (kind == "float16")
    return RunStringEmbedding<ctr::Half>(spec, params, bytes.data(), bytes.size(), splits, bag_ptr, bags, threads);
  throw py::type_error("params must be float32 or float16, got " + kind);
}

// CtrHashTableFind on a NumPy table, updated in place with insert: (rows, reused_rows).
py::tuple HashTableFind(py::array table, py::array_t<int64_t, py::array::c_style | py::array::forcecast> keys,
                        int64_t capacity, bool insert, int64_t admit_after, bool dense_padding,
                        const std::string& eviction, int threads, bool in_parallel) {
  if (!table.dtype().is(py::dtype::of<int64_t>()) || table.ndim() != 2 ||
      !(table.flags() & py::array::c_style) || !table.writeable()) {
    throw py::type_error("table must be a writable C-contiguous int64 array [2 + S + ceil(capacity / 4), 4]");
  }
  const ctr::InsertRules rules = tf_ctr_py::MakeInsertRules(capacity, admit_after, dense_padding, eviction);
  ctr::TableView view;
  const std::string error = ctr::ViewTable(static_cast<int64_t*>(table.mutable_data()), table.shape(0),
                                           table.shape(1), capacity, &view);
  if (!error.empty()) throw py::value_error(error);
  const int64_t n = keys.size();
  py::array_t<int64_t> rows(n);
  std::vector<int64_t> reused;
  std::string table_error;
  {
    py::gil_scoped_release nogil;
    const int num_threads = threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency());
    auto parallel_for = [num_threads](int64_t count, auto&& fn) { ParallelRanges(count, num_threads, fn); };
    const int64_t clock = insert ? ctr::InsertingClock(view.header, /*new_step=*/true) : 0;
    ctr::TableFault fault;
    ctr::FindRows(view, capacity, keys.data(), n, dense_padding, clock, rows.mutable_data(), &fault, parallel_for);
    table_error = fault.Describe(capacity, view.slots.num_slots);
    if (insert && table_error.empty())
      reused = ctr::InsertMissing(view, rules, keys.data(), n, rows.mutable_data(), in_parallel, parallel_for,
                                  &table_error);
  }
  if (!table_error.empty()) throw py::value_error(table_error);
  py::array_t<int64_t> reused_rows(static_cast<py::ssize_t>(reused.size()));
  std::copy(reused.begin(), reused.end(), reused_rows.mutable_data());
  return py::make_tuple(rows, reused_rows);
}

// CtrHashTableEmbedding on a NumPy table (read only) and float32 values:
// (pooled [B, D], rows of the keys).
py::tuple HashTableEmbedding(py::array table, py::array_t<float, py::array::c_style | py::array::forcecast> values,
                             py::array_t<int64_t, py::array::c_style | py::array::forcecast> keys,
                             py::array_t<int64_t, py::array::c_style | py::array::forcecast> offsets,
                             py::object weights, const std::string& combiner, int64_t capacity, bool dense_padding,
                             bool prune_weights, float max_norm, int threads) {
  if (!table.dtype().is(py::dtype::of<int64_t>()) || table.ndim() != 2 || !(table.flags() & py::array::c_style))
    throw py::type_error("table must be a C-contiguous int64 array [2 + S + ceil(capacity / 4), 4]");
  if (values.ndim() != 2) throw py::value_error("values must be [V, D]");
  if (keys.ndim() != 1) throw py::value_error("keys must be a vector");
  ctr::TableView view;
  // Read only: the view's pointer is not const, but nothing here writes through it.
  std::string error = ctr::ViewTable(static_cast<int64_t*>(const_cast<void*>(table.data())), table.shape(0),
                                     table.shape(1), capacity, &view);
  if (!error.empty()) throw py::value_error(error);
  const ctr::LookupSpec spec = tf_ctr_py::MakeLookupSpec(values.shape(0), values.shape(1), combiner, "index",
                                                         "skip_negative", prune_weights, -1, max_norm);
  const CheckedBags checked = CheckBags(offsets, weights, keys.shape(0));
  const std::vector<int64_t>& off = checked.offsets;
  const float* wptr = checked.weight_data;
  const int64_t bags = static_cast<int64_t>(off.size()) - 1;
  py::array_t<float> out(std::vector<py::ssize_t>{bags, spec.dim});
  py::array_t<int64_t> rows(keys.shape(0));
  ctr::LowestRowError<ctr::KeyError> first;
  ctr::TableFault fault;
  {
    py::gil_scoped_release release;
    const int num_threads = threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency());
    ParallelRanges(bags, num_threads, [&](int64_t b, int64_t e) {
      std::vector<float> acc(spec.dim);
      ctr::KeyError err;
      ctr::PoolTableBagsCpu(view.slots, capacity, spec, values.data(), keys.data(), wptr, off.data(), b, e, dense_padding,
                            acc.data(), out.mutable_data(), rows.mutable_data(), &err, &fault);
      first.Offer(err);
    });
  }
  tf_ctr_py::Require(fault.Describe(capacity, view.slots.num_slots));
  if (first.found())
    throw py::value_error(ctr::DescribeTableRowError(first.error(), rows.data()[first.error().entry],
                                                     std::min(spec.vocab, capacity)));
  return py::make_tuple(out, rows);
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "Framework-free tf-ctr-ops kernels (CPU on NumPy; CUDA on device pointers when built with it).";
#ifdef CTR_WITH_CUDA
  m.attr("has_cuda") = true;
  RegisterGpuBindings(m);
  RegisterGpuStringBindings(m);
#else
  m.attr("has_cuda") = false;
#endif
  m.def("embedding_lookup", &EmbeddingLookup, py::arg("params"), py::arg("keys"), py::arg("offsets"),
        py::arg("weights") = py::none(), py::arg("combiner") = "mean", py::arg("id_mode") = "index",
        py::arg("invalid_ids") = "error", py::arg("prune_weights") = false, py::arg("default_id") = -1,
        py::arg("max_norm") = -1.0f, py::arg("threads") = 0, py::arg("hash_key") = std::vector<int64_t>{},
        "Pooled lookup over CSR bags: params [V, D] float32/float16, keys int32/int64, offsets [B+1].");
  m.def("string_embedding", &StringEmbedding, py::arg("params"), py::arg("bytes"), py::arg("string_splits"),
        py::arg("bag_splits") = py::none(), py::arg("combiner") = "mean", py::arg("id_mode") = "hash",
        py::arg("delimiter") = py::bytes(","), py::arg("skip_empty") = true, py::arg("max_norm") = -1.0f,
        py::arg("threads") = 0, py::arg("num_buckets") = 0, py::arg("invalid_ids") = "error",
        py::arg("default_id") = -1, py::arg("hash_key") = std::vector<int64_t>{},
        "Pooled tokens of packed strings: bytes uint8, string_splits int64 byte offsets [S+1].");
  m.def("hash_table_find", &HashTableFind, py::arg("table"), py::arg("keys"), py::arg("capacity"),
        py::arg("insert") = false, py::arg("admit_after") = 1, py::arg("dense_padding") = false,
        py::arg("eviction") = "none", py::arg("threads") = 0, py::arg("in_parallel") = true,
        "CtrHashTableFind on a NumPy table (cc/core/hash_table.h layout), updated in place with insert: "
        "(rows, reused_rows). in_parallel=True inserts in parallel wherever the table's rules allow, "
        "whatever the thread count (the op needs 4 threads); False, one key at a time.");
  m.def("hash_table_embedding", &HashTableEmbedding, py::arg("table"), py::arg("values"), py::arg("keys"),
        py::arg("offsets"), py::arg("weights") = py::none(), py::arg("combiner") = "mean", py::arg("capacity") = 0,
        py::arg("dense_padding") = false, py::arg("prune_weights") = false, py::arg("max_norm") = -1.0f,
        py::arg("threads") = 0,
        "CtrHashTableEmbedding on a NumPy table (read only) and float32 values [V, D] over CSR bags: "
        "(pooled [B, D], rows of the keys, -1 for none).");
  m.def("fingerprint64", [](const py::bytes& b) {
    const std::string s = b;
    return ctr::fp::Fingerprint64(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  });
  m.def("hash_buckets", &HashBuckets, py::arg("strings"), py::arg("num_buckets"),
        py::arg("key") = std::vector<int64_t>{},
        "tf.strings.to_hash_bucket_fast on a list of byte strings; with a key of two integers, "
        "tf.strings.to_hash_bucket_strong.");
  m.def("hash_int_keys", [](py::array_t<int64_t, py::array::c_style | py::array::forcecast> keys, int64_t buckets,
                            const std::vector<int64_t>& key) {
    if (buckets <= 0) throw py::value_error("num_buckets must be positive");
    const ctr::StringHash hash = HashOfKey(key);
    py::array_t<int64_t> out(keys.size());
    for (py::ssize_t i = 0; i < keys.size(); ++i)
      out.mutable_data()[i] = ctr::HashIntKeyBucket(hash, keys.data()[i], buckets);
    return out;
  }, py::arg("keys"), py::arg("num_buckets"), py::arg("key") = std::vector<int64_t>{},
     "to_hash_bucket_fast(as_string(keys)) (or _strong with a key) without strings.");
  m.def("unit_bag_weights", [](int64_t n) {
    if (n < 0) throw py::value_error("n must be >= 0");
    const ctr::BagWeights w = ctr::BagWeights::Units(n);
    return py::make_tuple(w.sum, w.sum_sq);
  }, py::arg("n"), "The (sum, sum of squares) float32 sums of n unit weights, as the pooling loops take them.");
  m.def("parse_int64", [](const py::bytes& b) -> py::object {
    const std::string s = b;
    int64_t v = 0;
    if (!ctr::ParseInt64(reinterpret_cast<const uint8_t*>(s.data()), static_cast<int64_t>(s.size()), &v)) return py::none();
    return py::int_(v);
  }, "tf.strings.to_number(s, tf.int64) semantics: the value, or None where TF rejects the token.");
}

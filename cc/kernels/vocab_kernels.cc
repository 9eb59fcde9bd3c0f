// CPU kernel of CtrVocabEmbedding: the find (through a memo for tables that
// can never change, else the table's own Find, whatever table type the graph
// built), one pass of checks in key order, so the error names the first bad
// key, then the row copies on TF's intra-op pool.
#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "cc/core/string_hash.h"
#include "cc/core/lookup_cpu.h"
#include "cc/core/multi_hot_cpu.h"
#include "cc/core/vocab.h"
#include "cc/core/vocab_memo.h"
#include "cc/kernels/block_layout.h"
#include "cc/kernels/huge_pages.h"
#include "cc/kernels/pool_cpu.h"
#include "cc/kernels/tf_types.h"
#include "tensorflow/core/framework/lookup_interface.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/kernels/initializable_lookup_table.h"
#include "tensorflow/core/kernels/lookup_util.h"

namespace tf_ctr {

using tensorflow::OpKernelContext;
using tensorflow::Tensor;

namespace {

constexpr size_t kMaxQuotedKey = 64;
constexpr uint64_t kInlineCopyBytes = 256 << 10;
// A memoized find and its checks, in the intra-op pool's cost units (about
// a cycle each).
constexpr int64_t kFindCostPerKey = 60;

std::string QuoteKey(const Tensor& keys, int64_t i) {
  if (keys.dtype() == tensorflow::DT_STRING) {
    const tensorflow::tstring& s = keys.flat<tensorflow::tstring>()(i);
    std::string shown(s.data(), std::min(s.size(), kMaxQuotedKey));
    return absl::StrCat("'", absl::CEscape(shown), s.size() > kMaxQuotedKey ? "'..." : "'");
  }
  if (keys.dtype() == tensorflow::DT_INT32) return std::to_string(keys.flat<int32_t>()(i));
  return std::to_string(keys.flat<int64_t>()(i));
}

// Row of flat key i: its index along axis 0 (keys of rank 0 are row 0).
int64_t RowOf(const Tensor& keys, int64_t i) {
  if (keys.dims() == 0 || keys.dim_size(0) == 0) return 0;
  return i / (keys.NumElements() / keys.dim_size(0));
}

// How many keys ahead a key's memo slot is prefetched: enough to overlap the
// misses of a memo larger than the cache. A rolling distance, not rounds of
// this many keys, which left no load in flight at each round's start.
constexpr int64_t kMemoAhead = 16;
static_assert((kMemoAhead & (kMemoAhead - 1)) == 0, "the ring of hashes is indexed with a mask");
// Keys the table lacks that a memo keeps, besides the table's own: serving
// traffic repeats its out-of-vocabulary keys too, but they are unbounded.
constexpr int64_t kMemoMissingKeys = 1 << 16;

std::string_view KeyAt(const tensorflow::tstring* keys, int64_t i) { return {keys[i].data(), keys[i].size()}; }
int64_t KeyAt(const int64_t* keys, int64_t i) { return keys[i]; }

// The ids of a table's keys, remembered across calls (ctr::VocabMemo) when
// the table is an initialized InitializableLookupTable (StaticHashTable,
// the vocabulary feature columns' and Keras lookups' tables): TF lets such a
// table be initialized once, after which it takes no insert, remove or
// import with other contents, so what it said of a key it always says. Any
// other table is asked every time. The memo holds a reference to its table,
// so a later table at the same address cannot be mistaken for it. Compute
// may run on several threads at once: lookups share a lock, inserts take it.
class VocabFinder {
 public:
  ~VocabFinder() {
    if (table_ != nullptr) table_->Unref();
  }

  absl::Status Find(OpKernelContext* ctx, tensorflow::lookup::LookupInterface* table, const Tensor& keys,
                    const Tensor& default_value, Tensor* ids) {
    tensorflow::lookup::InitializableLookupTable* fixed = table->GetInitializableLookupTable();
    if (fixed == nullptr || !fixed->is_initialized()) return table->Find(ctx, keys, ids, default_value);
    const int64_t fallback = default_value.scalar<int64_t>()();
    if (keys.dtype() == tensorflow::DT_STRING) {
      auto memo = Bind(table, &strings_);
      return FindMemoized(ctx, table, keys.flat<tensorflow::tstring>().data(), keys, fallback, memo.get(), ids);
    }
    auto memo = Bind(table, &ints_);
    return FindMemoized(ctx, table, keys.flat<int64_t>().data(), keys, fallback, memo.get(), ids);
  }

 private:
  // The memo of `table`: one table is memoized at a time; another (a handle
  // fed at run time) starts afresh. A caller keeps the memo it got alive
  // while a newer one replaces it.
  template <typename Key>
  std::shared_ptr<ctr::VocabMemo<Key>> Bind(tensorflow::lookup::LookupInterface* table,
                                            std::shared_ptr<ctr::VocabMemo<Key>>* memo) {
    {
      std::shared_lock<std::shared_mutex> read(mu_);
      if (table_ == table && *memo) return *memo;
    }
    std::unique_lock<std::shared_mutex> write(mu_);
    if (table_ != table || !*memo) {
      if (table_ != nullptr) table_->Unref();
      table->Ref();
      table_ = table;
      strings_.reset();
      ints_.reset();
      *memo = std::make_shared<ctr::VocabMemo<Key>>(static_cast<int64_t>(table->size()) + kMemoMissingKeys);
    }
    return *memo;
  }

  template <typename Key, typename Stored>
  absl::Status FindMemoized(OpKernelContext* ctx, tensorflow::lookup::LookupInterface* table, const Stored* keys,
                            const Tensor& keys_tensor, int64_t fallback, ctr::VocabMemo<Key>* memo, Tensor* ids) {
    const int64_t n = keys_tensor.NumElements();
    int64_t* out = ids->flat<int64_t>().data();
    std::vector<int64_t> unknown;
    {
      std::shared_lock<std::shared_mutex> read(mu_);
      uint64_t hashes[kMemoAhead];  // key i's hash at i % kMemoAhead
      auto start = [&](int64_t i) {
        hashes[i & (kMemoAhead - 1)] = ctr::MemoHash(KeyAt(keys, i));
        memo->Prefetch(hashes[i & (kMemoAhead - 1)]);
      };
      for (int64_t i = 0; i < std::min(n, kMemoAhead); ++i) start(i);
      for (int64_t i = 0; i < n; ++i) {
        const uint64_t hash = hashes[i & (kMemoAhead - 1)];
        if (i + kMemoAhead < n) start(i + kMemoAhead);
        const ctr::Memo known = memo->Find(KeyAt(keys, i), hash, &out[i]);
        if (known == ctr::Memo::kMissing) out[i] = fallback;
        if (known == ctr::Memo::kUnknown) unknown.push_back(i);
      }
    }
    if (unknown.empty()) return absl::OkStatus();
    return AskTable(ctx, table, keys, keys_tensor.dtype(), fallback, unknown, memo, out);
  }

  // Finds the keys the memo lacks in the table and remembers them. The
  // table's answer for a key it lacks is the default it is given, so the
  // keys that get the first sentinel are asked again with a second: a key
  // the table lacks gets both, a key it has cannot.
  template <typename Key, typename Stored>
  absl::Status AskTable(OpKernelContext* ctx, tensorflow::lookup::LookupInterface* table, const Stored* keys,
                        tensorflow::DataType key_type, int64_t fallback, const std::vector<int64_t>& unknown,
                        ctr::VocabMemo<Key>* memo, int64_t* out) {
    constexpr int64_t kFirst = std::numeric_limits<int64_t>::min(), kSecond = kFirst + 1;
    std::vector<int64_t> found;
    TF_RETURN_IF_ERROR(FindSome(ctx, table, keys, key_type, unknown, kFirst, &found));
    std::vector<int64_t> doubtful;
    for (size_t j = 0; j < unknown.size(); ++j)
      if (found[j] == kFirst) doubtful.push_back(unknown[j]);
    std::vector<int64_t> again;
    if (!doubtful.empty()) TF_RETURN_IF_ERROR(FindSome(ctx, table, keys, key_type, doubtful, kSecond, &again));
    std::unique_lock<std::shared_mutex> write(mu_);
    for (size_t j = 0, d = 0; j < unknown.size(); ++j) {
      const int64_t i = unknown[j];
      const bool in_table = found[j] != kFirst || again[d++] != kSecond;
      out[i] = in_table ? found[j] : fallback;
      memo->Insert(KeyAt(keys, i), ctr::MemoHash(KeyAt(keys, i)), in_table, found[j]);
    }
    return absl::OkStatus();
  }

  template <typename Stored>
  static absl::Status FindSome(OpKernelContext* ctx, tensorflow::lookup::LookupInterface* table, const Stored* keys,
                               tensorflow::DataType key_type, const std::vector<int64_t>& which, int64_t sentinel,
                               std::vector<int64_t>* ids) {
    const int64_t m = static_cast<int64_t>(which.size());
    Tensor some(key_type, tensorflow::TensorShape({m}));
    Tensor found(tensorflow::DT_INT64, tensorflow::TensorShape({m}));
    Tensor fallback(tensorflow::DT_INT64, tensorflow::TensorShape({}));
    fallback.scalar<int64_t>()() = sentinel;
    Stored* dst = some.flat<Stored>().data();
    for (int64_t j = 0; j < m; ++j) dst[j] = keys[which[j]];
    TF_RETURN_IF_ERROR(table->Find(ctx, some, &found, fallback));
    const int64_t* f = found.flat<int64_t>().data();
    ids->assign(f, f + m);
    return absl::OkStatus();
  }

  std::shared_mutex mu_;
  tensorflow::lookup::LookupInterface* table_ = nullptr;  // referenced while bound
  std::shared_ptr<ctr::VocabMemo<std::string_view>> strings_;
  std::shared_ptr<ctr::VocabMemo<int64_t>> ints_;
};

}  // namespace

// How a feature turns the ids its table found into rows (the op's attrs).
struct VocabRules {
  bool missing_is_error = false;
  int64_t missing_id = -1;
  bool wrap_negative = false;
};

// The missing_key and missing_id attrs of the single ops.
absl::Status ReadMissingKeyRule(tensorflow::OpKernelConstruction* c, VocabRules* rules) {
  std::string missing;
  TF_RETURN_IF_ERROR(c->GetAttr("missing_key", &missing));
  rules->missing_is_error = missing == "error";
  return c->GetAttr("missing_id", &rules->missing_id);
}

// Keras' rules between the find and the ids (CtrVocabEmbedding's attrs and
// mask inputs): the mask keys get their ids, then the keys whose id is
// oov_id (the table's default, as Keras compares it with a constant) get one
// of oov_slots slots from oov_start.
struct KeyRules {
  int num_masks = 0;
  int64_t oov_slots = 0;
  int64_t oov_id = -1;
  int64_t oov_start = 0;
};

// A key's OOV id is oov_start + its slot: the last slot's must be an int64.
absl::Status CheckOovIds(const KeyRules& rules) {
  int64_t last = 0;
  if (rules.oov_slots > 0 && __builtin_add_overflow(rules.oov_start, rules.oov_slots - 1, &last))
    return tensorflow::errors::InvalidArgument("oov_start ", rules.oov_start, " + oov_slots ", rules.oov_slots,
                                               " - 1 overflows int64");
  return absl::OkStatus();
}

absl::Status ReadKeyRules(tensorflow::OpKernelConstruction* c, KeyRules* rules) {
  TF_RETURN_IF_ERROR(c->GetAttr("num_masks", &rules->num_masks));
  TF_RETURN_IF_ERROR(c->GetAttr("oov_slots", &rules->oov_slots));
  TF_RETURN_IF_ERROR(c->GetAttr("oov_id", &rules->oov_id));
  TF_RETURN_IF_ERROR(c->GetAttr("oov_start", &rules->oov_start));
  return CheckOovIds(*rules);
}

// Where a feature's mask inputs are: num_masks keys from input `keys`, their
// ids from input `ids`.
struct MaskInputs {
  int keys = 0;
  int ids = 0;
};

absl::Status CheckMaskInputs(OpKernelContext* ctx, const MaskInputs& at, int num_masks) {
  for (int m = 0; m < num_masks; ++m)
    for (int i : {at.keys + m, at.ids + m})
      if (!tensorflow::TensorShapeUtils::IsScalar(ctx->input(i).shape()))
        return tensorflow::errors::InvalidArgument("mask keys and ids must be scalars, got input ", i, " of shape ",
                                                   ctx->input(i).shape().DebugString());
  return absl::OkStatus();
}

template <typename Key, typename Stored, typename Slot>
void ApplyRulesTo(const KeyRules& rules, const std::vector<Key>& mask_keys, const std::vector<int64_t>& mask_ids,
                  const Stored* keys, int64_t n, Slot slot, int64_t* ids) {
  for (int64_t i = 0; i < n; ++i) {
    const Key key = KeyAt(keys, i);
    for (size_t m = 0; m < mask_keys.size(); ++m)
      if (key == mask_keys[m]) ids[i] = mask_ids[m];
    if (rules.oov_slots > 0 && ids[i] == rules.oov_id) ids[i] = rules.oov_start + slot(key);
  }
}

absl::Status ApplyKeyRules(OpKernelContext* ctx, const KeyRules& rules, const MaskInputs& at, const Tensor& keys,
                           int64_t* ids) {
  if (rules.num_masks == 0 && rules.oov_slots == 0) return absl::OkStatus();
  TF_RETURN_IF_ERROR(CheckMaskInputs(ctx, at, rules.num_masks));
  std::vector<int64_t> mask_ids;
  for (int m = 0; m < rules.num_masks; ++m) mask_ids.push_back(ctx->input(at.ids + m).scalar<int64_t>()());
  const int64_t n = keys.NumElements();
  if (keys.dtype() == tensorflow::DT_STRING) {
    std::vector<std::string_view> masks;
    for (int m = 0; m < rules.num_masks; ++m) {
      const tensorflow::tstring& mask = ctx->input(at.keys + m).scalar<tensorflow::tstring>()();
      masks.emplace_back(mask.data(), mask.size());
    }
    ApplyRulesTo(rules, masks, mask_ids, keys.flat<tensorflow::tstring>().data(), n,
                 [&](std::string_view key) {
                   return ctr::HashBucket(ctr::StringHash{}, reinterpret_cast<const uint8_t*>(key.data()),
                                          key.size(), rules.oov_slots);
                 },
                 ids);
    return absl::OkStatus();
  }
  std::vector<int64_t> masks;
  for (int m = 0; m < rules.num_masks; ++m) masks.push_back(ctx->input(at.keys + m).scalar<int64_t>()());
  ApplyRulesTo(rules, masks, mask_ids, keys.flat<int64_t>().data(), n,
               [&](int64_t key) { return ctr::FloorModSlot(key, rules.oov_slots); }, ids);
  return absl::OkStatus();
}

// Keras' check of a key the table lacks (num_oov_indices=0).
absl::Status NotInVocabulary(const Tensor& keys, int64_t i, int64_t row) {
  return tensorflow::errors::InvalidArgument("key ", QuoteKey(keys, i), " in row ", row,
                                             " is not in the vocabulary (no out-of-vocabulary id)");
}
absl::Status NotInVocabulary(const Tensor& keys, int64_t i) { return NotInVocabulary(keys, i, RowOf(keys, i)); }

// Keras' num_oov_indices=0 check: the first key whose id says it is missing,
// or -1.
int64_t FirstMissingKey(const VocabRules& rules, const Tensor& ids) {
  if (!rules.missing_is_error) return -1;
  auto r = ids.flat<int64_t>();
  for (int64_t i = 0; i < r.size(); ++i)
    if (r(i) == rules.missing_id) return i;
  return -1;
}

// Turns each found id into the row it reads, in key order so the error names
// the first bad key.
absl::Status ResolveRows(const VocabRules& rules, const Tensor& keys, int64_t vocab, Tensor* rows) {
  if (const int64_t missing = FirstMissingKey(rules, *rows); missing >= 0) return NotInVocabulary(keys, missing);
  auto r = rows->flat<int64_t>();
  for (int64_t i = 0; i < r.size(); ++i) {
    const int64_t id = r(i);
    const int64_t row = ctr::VocabRow(id, vocab, rules.wrap_negative);
    if (row < 0)
      return tensorflow::errors::InvalidArgument("id ", id, " of key ", QuoteKey(keys, i), " in row ",
                                                 RowOf(keys, i), " is out of range [0, ", vocab, ")");
    r(i) = row;
  }
  return absl::OkStatus();
}

absl::Status CheckFind(tensorflow::lookup::LookupInterface* table, const Tensor& keys, const Tensor& default_value) {
  if (table->value_dtype() != tensorflow::DT_INT64 || table->value_shape().dims() != 0)
    return tensorflow::errors::InvalidArgument("the table's values must be int64 scalar row ids, got ",
                                               tensorflow::DataTypeString(table->value_dtype()), " of shape ",
                                               table->value_shape().DebugString());
  // A table of vector keys (a DenseHashTable's empty_key of rank 1) finds
  // one id per key vector: the fused ops give one per key.
  if (table->key_shape().dims() != 0)
    return tensorflow::errors::InvalidArgument(
        "the table's keys must be scalars, got keys of shape ", table->key_shape().DebugString(),
        " (a rewrite that fused this lookup online could not see the table's key shape: rewrite with "
        "disabled_patterns=['vocab_lookup'] to keep it native)");
  // TF's check also accepts one default per key; the fused ops take the one
  // default the table was built with.
  if (default_value.dims() != 0)
    return tensorflow::errors::InvalidArgument("default_value must be a scalar, got shape ",
                                               default_value.shape().DebugString());
  return table->CheckFindArguments(keys, default_value);
}

absl::Status CheckTableRank(const Tensor& params) {
  if (params.dims() >= 1) return absl::OkStatus();
  return tensorflow::errors::InvalidArgument("params must have rank >= 1, got shape ", params.shape().DebugString());
}

// IdTableWithHashBuckets' ids: a key whose found id is the table's default
// (not in the vocabulary, as its NotEqual + SelectV2 decide) gets
// size + to_hash_bucket_fast(key, buckets); integer keys hash as their
// decimal string, as its AsString makes them.
void AssignOovBuckets(const Tensor& keys, int64_t fallback, int64_t size, int64_t buckets, int64_t* ids) {
  const int64_t n = keys.NumElements();
  if (keys.dtype() == tensorflow::DT_STRING) {
    const tensorflow::tstring* k = keys.flat<tensorflow::tstring>().data();
    for (int64_t i = 0; i < n; ++i)
      if (ids[i] == fallback)
        ids[i] = size + ctr::HashBucket(ctr::StringHash{}, reinterpret_cast<const uint8_t*>(k[i].data()),
                                        k[i].size(), buckets);
    return;
  }
  const int64_t* k = keys.flat<int64_t>().data();
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] == fallback) ids[i] = size + ctr::HashIntKeyBucket(ctr::StringHash{}, k[i], buckets);
}

// The id of each of `keys` in the table of input 0 (`oov_buckets` > 0: with
// IdTableWithHashBuckets' buckets for the keys it lacks) into `ids`, shaped
// as the keys.
absl::Status FindKeys(OpKernelContext* ctx, VocabFinder* finder, const Tensor& keys, const Tensor& default_value,
                      int64_t oov_buckets, Tensor* ids) {
  tensorflow::lookup::LookupInterface* table = nullptr;
  TF_RETURN_IF_ERROR(tensorflow::lookup::GetLookupTable("table_handle", ctx, &table));
  tensorflow::core::ScopedUnref unref(table);
  TF_RETURN_IF_ERROR(CheckFind(table, keys, default_value));
  TF_RETURN_IF_ERROR(finder->Find(ctx, table, keys, default_value, ids));
  if (oov_buckets > 0)
    AssignOovBuckets(keys, default_value.scalar<int64_t>()(), static_cast<int64_t>(table->size()), oov_buckets,
                     ids->flat<int64_t>().data());
  return absl::OkStatus();
}

// The single ops' find: inputs `keys` and `default_value` found in the table
// of input 0 for the table of input `params`, into output 1.
absl::Status FindIntoOutput(OpKernelContext* ctx, VocabFinder* finder, int keys_input, int default_input,
                            int params_input, int64_t oov_buckets, Tensor** ids) {
  TF_RETURN_IF_ERROR(CheckTableRank(ctx->input(params_input)));
  const Tensor& keys = ctx->input(keys_input);
  TF_RETURN_IF_ERROR(ctx->allocate_output(1, keys.shape(), ids));
  return FindKeys(ctx, finder, keys, ctx->input(default_input), oov_buckets, *ids);
}

// Runs fn(begin, end) over [0, n) rows of `bytes` each: inline for a serving
// batch of a few dozen KB, where the thread pool costs more than the copy.
template <typename Fn>
void ForRows(OpKernelContext* ctx, int64_t n, uint64_t bytes, Fn fn) {
  if (static_cast<uint64_t>(n) * bytes <= kInlineCopyBytes) {
    fn(0, n);
  } else {
    ParallelFor(ctx, n, static_cast<int64_t>(bytes) * 2, fn);
  }
}

template <typename T>
class VocabEmbeddingOp : public tensorflow::OpKernel {
 public:
  explicit VocabEmbeddingOp(tensorflow::OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, ReadMissingKeyRule(c, &rules_));
    OP_REQUIRES_OK(c, c->GetAttr("wrap_negative_ids", &rules_.wrap_negative));
    OP_REQUIRES_OK(c, ReadKeyRules(c, &key_rules_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(1);
    const Tensor& params = ctx->input(3);
    AdviseHugePages(ctx, params);
    Tensor* rows = nullptr;
    OP_REQUIRES_OK(ctx, FindIntoOutput(ctx, &finder_, 1, 2, 3, 0, &rows));
    const MaskInputs masks{4, 4 + key_rules_.num_masks};
    OP_REQUIRES_OK(ctx, ApplyKeyRules(ctx, key_rules_, masks, keys, rows->flat<int64_t>().data()));
    OP_REQUIRES_OK(ctx, ResolveRows(rules_, keys, params.dim_size(0), rows));

    tensorflow::TensorShape out_shape = keys.shape();  // AddDim would abort on too many dims or elements
    for (int d = 1; d < params.dims(); ++d) OP_REQUIRES_OK(ctx, out_shape.AddDimWithStatus(params.dim_size(d)));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, out_shape, &out));
    CopyRows(ctx, params, *rows, out);
  }

 private:
  static void CopyRows(OpKernelContext* ctx, const Tensor& params, const Tensor& rows, Tensor* out) {
    const int64_t n = rows.NumElements();
    if (n == 0 || params.dim_size(0) == 0) return;
    const int64_t width = params.NumElements() / params.dim_size(0);
    const size_t bytes = width * sizeof(T);
    const T* src = params.flat<T>().data();
    T* dst = out->flat<T>().data();
    const int64_t* r = rows.flat<int64_t>().data();
    ForRows(ctx, n, bytes, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) ctr::CopyRowBytes(dst + i * width, src + r[i] * width, bytes);
    });
  }

  VocabFinder finder_;
  VocabRules rules_;
  KeyRules key_rules_;
};

// A float converted to an integer type as TF's CPU Cast converts it:
// truncated toward zero, and a value out of the type's range (the x86
// conversion's "integer indefinite") the type's lowest value.
template <typename Int>
int64_t TruncateToInt(double v) {
  constexpr double kLimit = -static_cast<double>(std::numeric_limits<Int>::min());  // 2^31 or 2^63
  return v > -kLimit - 1 && v < kLimit ? static_cast<Int>(v) : std::numeric_limits<Int>::min();
}

// An int64 id after TF's Casts to each of `casts` in turn: int32 wraps,
// float32 and float64 round to nearest, floats go back to integers as
// TruncateToInt does. A float value is held in `real` (every float32 is a
// double exactly), so no conversion rounds twice.
int64_t CastId(int64_t id, const tensorflow::DataTypeVector& casts) {
  bool is_real = false;
  double real = 0;
  for (tensorflow::DataType to : casts) {
    switch (to) {
      case tensorflow::DT_INT32:
        id = is_real ? TruncateToInt<int32_t>(real) : static_cast<int32_t>(id);
        is_real = false;
        break;
      case tensorflow::DT_INT64:
        id = is_real ? TruncateToInt<int64_t>(real) : id;
        is_real = false;
        break;
      case tensorflow::DT_FLOAT:
        real = is_real ? static_cast<float>(real) : static_cast<float>(id);
        is_real = true;
        break;
      default:  // DT_DOUBLE, the op's only other cast type
        real = is_real ? real : static_cast<double>(id);
        is_real = true;
    }
  }
  return is_real ? TruncateToInt<int64_t>(real) : id;
}

// CtrVocabMultiHot: the find and the missing-key check as CtrVocabEmbedding
// does them, DenseBincount's rule for the ids (negative: an error; >= depth:
// dropped), then each output row summed from the kernel rows of its row's
// distinct ids, in increasing id order: MatMul's dot product over the
// encoding's columns adds them in that order (and the zero columns add
// nothing), so the sums agree with it.
template <typename T>
class VocabMultiHotOp : public tensorflow::OpKernel {
 public:
  explicit VocabMultiHotOp(tensorflow::OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, ReadMissingKeyRule(c, &rules_));
    OP_REQUIRES_OK(c, c->GetAttr("binary_output", &binary_));
    OP_REQUIRES_OK(c, c->GetAttr("id_casts", &casts_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(1);
    const Tensor& kernel = ctx->input(3);
    OP_REQUIRES(ctx, keys.dims() == 2 && kernel.dims() == 2,
                tensorflow::errors::InvalidArgument("keys must be a [B, L] matrix and kernel a [depth, units] one; got ",
                                                    keys.shape().DebugString(), " and ",
                                                    kernel.shape().DebugString()));
    Tensor* ids = nullptr;
    OP_REQUIRES_OK(ctx, FindIntoOutput(ctx, &finder_, 1, 2, 3, 0, &ids));
    OP_REQUIRES_OK(ctx, CheckIds(keys, ids));

    const int64_t batch = keys.dim_size(0), width = keys.dim_size(1);
    const int64_t depth = kernel.dim_size(0), units = kernel.dim_size(1);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, AllocateOutput(ctx, 0, {batch, units}, &out));
    if (out->NumElements() == 0) return;  // no rows to walk (there may be 2^40 of no width)
    const int64_t* id = ids->flat<int64_t>().data();
    const T* rows = kernel.flat<T>().data();
    T* dst = out->flat<T>().data();
    ParallelFor(ctx, batch, (width + 1) * (units + 8), [&](int64_t begin, int64_t end) {
      std::vector<int64_t> sorted;
      for (int64_t b = begin; b < end; ++b) {
        T* at = dst + b * units;
        std::fill(at, at + units, T(0));
        ctr::AddMultiHotRow(id + b * width, width, depth, binary_, rows, units, at, &sorted);
      }
    });
  }

 private:
  // In key order, so the error names the first bad key: a missing key (when
  // that is an error) in a first pass, as Keras' check runs before the
  // bincount, then a negative id.
  absl::Status CheckIds(const Tensor& keys, Tensor* ids) const {
    auto id = ids->flat<int64_t>();
    if (rules_.missing_is_error)
      for (int64_t i = 0; i < id.size(); ++i)
        if (id(i) == rules_.missing_id) return NotInVocabulary(keys, i);
    for (int64_t i = 0; i < id.size(); ++i) {
      if (!casts_.empty()) id(i) = CastId(id(i), casts_);
      if (id(i) < 0)
        return tensorflow::errors::InvalidArgument("id ", id(i), " of key ", QuoteKey(keys, i), " in row ",
                                                   RowOf(keys, i), " is negative: a multi-hot encoding counts ids >= 0");
    }
    return absl::OkStatus();
  }

  VocabFinder finder_;
  VocabRules rules_;  // the missing-key rule; ids are never wrapped
  bool binary_ = true;
  tensorflow::DataTypeVector casts_;
};

// CtrConcatVocabEmbedding: each feature found and checked as
// CtrVocabEmbedding does it, in feature order, then every output row written
// once, block by block in the layout's order.
template <typename T>
class ConcatVocabEmbeddingOp : public tensorflow::OpKernel {
 public:
  explicit ConcatVocabEmbeddingOp(tensorflow::OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("N", &n_));
    OP_REQUIRES_OK(c, c->GetAttr("M", &m_));
    std::vector<std::string> missing;
    std::vector<int64_t> missing_ids;
    std::vector<bool> wrap;
    OP_REQUIRES_OK(c, c->GetAttr("missing_keys", &missing));
    OP_REQUIRES_OK(c, c->GetAttr("missing_ids", &missing_ids));
    OP_REQUIRES_OK(c, c->GetAttr("wrap_negative_ids", &wrap));
    OP_REQUIRES(c, static_cast<int>(missing.size()) == n_ && static_cast<int>(missing_ids.size()) == n_ &&
                       static_cast<int>(wrap.size()) == n_,
                tensorflow::errors::InvalidArgument("missing_keys, missing_ids and wrap_negative_ids must have N = ",
                                                    n_, " entries each"));
    for (int i = 0; i < n_; ++i) {
      OP_REQUIRES(c, missing[i] == "default" || missing[i] == "error",
                  tensorflow::errors::InvalidArgument("missing_keys[", i, "] must be 'default' or 'error', got '",
                                                      missing[i], "'"));
      rules_.push_back({missing[i] == "error", missing_ids[i], static_cast<bool>(wrap[i])});
      finders_.push_back(std::make_unique<VocabFinder>());
    }
    OP_REQUIRES_OK(c, ReadBlockLayout(c, n_ + m_, &layout_));
    OP_REQUIRES_OK(c, ReadFeatureKeyRules(c));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& first_keys = ctx->input(n_);
    OP_REQUIRES(ctx, first_keys.dims() == 1,  // the batch every feature's keys must have
                tensorflow::errors::InvalidArgument("feature 0 must have a [B] key vector, got keys ",
                                                    first_keys.shape().DebugString()));
    const int64_t batch = first_keys.dim_size(0);
    std::vector<Block> blocks(n_ + m_);
    std::vector<Tensor> rows(n_);
    std::vector<tensorflow::core::RefCountPtr<tensorflow::lookup::LookupInterface>> tables(n_);
    int64_t width = 0;
    for (int i = 0; i < n_; ++i) {
      OP_REQUIRES_OK(ctx, Prepare(ctx, i, batch, &tables[i], &rows[i], &blocks[i]));
      OP_REQUIRES_OK(ctx, AddBlockWidth(blocks[i].width, &width));
    }
    // The features' finds are independent, and with the separate ops TF ran
    // them on its inter-op threads at once: here they share the intra-op pool.
    // The first failing feature in order gives the error.
    std::vector<absl::Status> found(n_);
    ParallelFor(ctx, n_, batch * kFindCostPerKey, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) found[i] = Find(ctx, i, tables[i].get(), &rows[i]);
    });
    for (const absl::Status& status : found) OP_REQUIRES_OK(ctx, status);
    for (int j = 0; j < m_; ++j) {
      const Tensor& dense = ctx->input(4 * n_ + j);
      OP_REQUIRES(ctx, dense.dims() == 2 && dense.dim_size(0) == batch,
                  tensorflow::errors::InvalidArgument("dense input ", j, " must be a [", batch,
                                                      ", w] matrix, as the keys have ", batch,
                                                      " rows; got shape ", dense.shape().DebugString()));
      blocks[n_ + j] = {dense.flat<T>().data(), nullptr, dense.dim_size(1)};
      OP_REQUIRES_OK(ctx, AddBlockWidth(dense.dim_size(1), &width));
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, AllocateOutput(ctx, 0, {batch, width}, &out));
    if (out->NumElements() == 0) return;
    T* dst = out->flat<T>().data();
    ForRows(ctx, batch, width * sizeof(T), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        if (r + kRowsAhead < end) PrefetchRows(blocks, r + kRowsAhead);
        T* at = dst + r * width;
        for (int64_t b : layout_) {
          const Block& block = blocks[b];
          const int64_t from = block.rows != nullptr ? block.rows[r] : r;
          ctr::CopyRowBytes(at, block.src + from * block.width, block.width * sizeof(T));
          at += block.width;
        }
      }
    });
  }

 private:
  // A column block: rows[r] of src (a feature), or row r (a dense input).
  struct Block {
    const T* src = nullptr;
    const int64_t* rows = nullptr;
    int64_t width = 0;
  };

  // A row's blocks come from as many tables, read at random: without asking
  // for them ahead, each output row waits on a cache miss per feature.
  static constexpr int64_t kRowsAhead = 4;
  static void PrefetchRows(const std::vector<Block>& blocks, int64_t r) {
    for (const Block& block : blocks)
      if (block.rows != nullptr) __builtin_prefetch(block.src + block.rows[r] * block.width);
  }

  // Feature i's table and checks, and its rows' buffer: what cannot run on
  // several threads at once.
  absl::Status Prepare(OpKernelContext* ctx, int i, int64_t batch,
                       tensorflow::core::RefCountPtr<tensorflow::lookup::LookupInterface>* table, Tensor* rows,
                       Block* block) {
    TF_RETURN_IF_ERROR(tensorflow::LookupResource(ctx, tensorflow::HandleFromInput(ctx, i), table));
    const Tensor& keys = ctx->input(n_ + i);
    const Tensor& params = ctx->input(3 * n_ + i);
    TF_RETURN_IF_ERROR(CheckFind(table->get(), keys, ctx->input(2 * n_ + i)));
    AdviseHugePages(ctx, params);
    TF_RETURN_IF_ERROR(CheckTableRank(params));
    if (keys.dims() != 1 || keys.dim_size(0) != batch || params.dims() != 2)
      return tensorflow::errors::InvalidArgument("feature ", i, " must have a [", batch,
                                                 "] key vector, as feature 0 has, and a [V, D] table; got keys ",
                                                 keys.shape().DebugString(), " and params ",
                                                 params.shape().DebugString());
    TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DT_INT64, keys.shape(), rows));
    *block = {params.flat<T>().data(), rows->flat<int64_t>().data(), params.dim_size(1)};
    return absl::OkStatus();
  }

  absl::Status Find(OpKernelContext* ctx, int i, tensorflow::lookup::LookupInterface* table, Tensor* rows) {
    const Tensor& keys = ctx->input(n_ + i);
    TF_RETURN_IF_ERROR(finders_[i]->Find(ctx, table, keys, ctx->input(2 * n_ + i), rows));
    TF_RETURN_IF_ERROR(ApplyKeyRules(ctx, key_rules_[i], mask_inputs_[i], keys, rows->flat<int64_t>().data()));
    return ResolveRows(rules_[i], keys, ctx->input(3 * n_ + i).dim_size(0), rows);
  }

  // Each feature's Keras rules: its mask (masked_features lists the features
  // that have one, in order, each taking the next mask key and id input) and
  // its OOV slots (oov_slots, oov_ids and oov_starts: one entry per feature,
  // or none).
  absl::Status ReadFeatureKeyRules(tensorflow::OpKernelConstruction* c) {
    int num_masked = 0;
    std::vector<int64_t> masked, slots, oov_ids, starts;
    tensorflow::DataTypeVector mask_types, key_types;
    TF_RETURN_IF_ERROR(c->GetAttr("num_masked", &num_masked));
    TF_RETURN_IF_ERROR(c->GetAttr("masked_features", &masked));
    TF_RETURN_IF_ERROR(c->GetAttr("Tmasks", &mask_types));
    TF_RETURN_IF_ERROR(c->GetAttr("Tkeys", &key_types));
    TF_RETURN_IF_ERROR(c->GetAttr("oov_slots", &slots));
    TF_RETURN_IF_ERROR(c->GetAttr("oov_ids", &oov_ids));
    TF_RETURN_IF_ERROR(c->GetAttr("oov_starts", &starts));
    if (static_cast<int>(key_types.size()) != n_)  // inputs are read at offsets of N
      return tensorflow::errors::InvalidArgument("Tkeys must have N = ", n_, " entries (one key tensor per "
                                                 "feature), got ", key_types.size());
    if (static_cast<int>(masked.size()) != num_masked || static_cast<int>(mask_types.size()) != num_masked)
      return tensorflow::errors::InvalidArgument("masked_features and Tmasks must have num_masked = ", num_masked,
                                                 " entries each");
    // All three or none: the rules of feature i read entry i of each.
    const bool none = slots.empty() && oov_ids.empty() && starts.empty();
    const auto has_n = [&](const std::vector<int64_t>& list) { return static_cast<int>(list.size()) == n_; };
    if (!none && !(has_n(slots) && has_n(oov_ids) && has_n(starts)))
      return tensorflow::errors::InvalidArgument("oov_slots, oov_ids and oov_starts must have N = ", n_,
                                                 " entries each, or none; got ", slots.size(), ", ",
                                                 oov_ids.size(), " and ", starts.size());
    key_rules_.assign(n_, KeyRules{});
    mask_inputs_.assign(n_, MaskInputs{});
    const int first_key = 4 * n_ + m_;
    for (int j = 0; j < num_masked; ++j) {
      const int64_t f = masked[j];
      if (f < 0 || f >= n_ || (j > 0 && f <= masked[j - 1]) || mask_types[j] != key_types[f])
        return tensorflow::errors::InvalidArgument("masked_features must be increasing features in [0, ", n_,
                                                   "), each mask key of its feature's key type; got ", f,
                                                   " at ", j);
      key_rules_[f].num_masks = 1;
      mask_inputs_[f] = {first_key + j, first_key + num_masked + j};
    }
    for (size_t i = 0; i < slots.size(); ++i) {
      if (slots[i] < 0) return tensorflow::errors::InvalidArgument("oov_slots[", i, "] must be >= 0");
      key_rules_[i].oov_slots = slots[i];
      key_rules_[i].oov_id = oov_ids[i];
      key_rules_[i].oov_start = starts[i];
      TF_RETURN_IF_ERROR(CheckOovIds(key_rules_[i]));
    }
    return absl::OkStatus();
  }

  int n_ = 0, m_ = 0;
  std::vector<int64_t> layout_;
  std::vector<VocabRules> rules_;
  std::vector<KeyRules> key_rules_;
  std::vector<MaskInputs> mask_inputs_;
  std::vector<std::unique_ptr<VocabFinder>> finders_;
};

// CtrVocabEmbeddingLookup: the find (memoized as CtrVocabEmbedding's), the
// out-of-vocabulary buckets or Keras' rules and check, then
// CtrEmbeddingLookup's pooling of the found ids (wrapped, and with the 0s of
// a Keras mask dropped, where asked), with its checks, on TF's intra-op pool.
template <typename T, typename TSeg>
class VocabEmbeddingLookupOp : public LookupKernel {
 public:
  explicit VocabEmbeddingLookupOp(tensorflow::OpKernelConstruction* c) : LookupKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("num_oov_buckets", &oov_buckets_));
    OP_REQUIRES_OK(c, ReadMissingKeyRule(c, &rules_));
    OP_REQUIRES_OK(c, c->GetAttr("wrap_negative_ids", &rules_.wrap_negative));
    OP_REQUIRES_OK(c, ReadKeyRules(c, &key_rules_));
    OP_REQUIRES_OK(c, c->GetAttr("drop_zero_ids", &drop_zero_));
    bool has_weights = false;
    OP_REQUIRES_OK(c, c->GetAttr("has_weights", &has_weights));
    OP_REQUIRES(c, !(drop_zero_ && has_weights),
                tensorflow::errors::InvalidArgument("drop_zero_ids needs has_weights false: the dropped ids "
                                                    "are the ones given weight 0"));
  }

  void Compute(OpKernelContext* ctx) override {
    constexpr int kDefault = 1, kParams = 2, kKeys = 3, kMasks = 7;
    const Tensor& params = ctx->input(kParams);
    const Tensor& keys = ctx->input(kKeys);
    LookupAttrs a;
    LookupInputs in;
    OP_REQUIRES_OK(ctx, BindInputs(ctx, kParams, params, &a, &in));
    AdviseHugePages(ctx, params);
    Tensor* ids = nullptr;
    OP_REQUIRES_OK(ctx, FindIntoOutput(ctx, &finder_, kKeys, kDefault, kParams, oov_buckets_, &ids));
    const MaskInputs masks{kMasks, kMasks + key_rules_.num_masks};
    OP_REQUIRES_OK(ctx, ApplyKeyRules(ctx, key_rules_, masks, keys, ids->flat<int64_t>().data()));
    if (const int64_t missing = FirstMissingKey(rules_, *ids); missing >= 0) {
      Tensor offsets;  // the row named below is read off the segments: bad ones are the error
      OP_REQUIRES_OK(ctx, BuildOffsets<TSeg>(ctx, a, in, &offsets));
      ctx->CtxFailure(NotInVocabulary(keys, missing, BagOf(ctx->input(4), a.segments_are_splits, missing)));
      return;
    }
    // The found ids are an output whatever happens; they are pooled unless
    // TF's safe lookup would prune them all (LookupInputs::all_pruned: then
    // the empty ids stand in for the keys, as int64 ids).
    in.ids = in.all_pruned ? &EmptyVector(tensorflow::DT_INT64) : ids;
    Tensor wrapped, kept;
    if (rules_.wrap_negative && !in.all_pruned) {
      OP_REQUIRES_OK(ctx, WrapNegative(ctx, *ids, a.spec.vocab, &wrapped));
      in.ids = &wrapped;
    }
    if (drop_zero_) {
      OP_REQUIRES_OK(ctx, NonZeroWeights(ctx, *ids, &kept));
      in.weights = &kept;
      a.has_weights = true;
      a.spec.prune_weights = true;
    }
    ctr::KeyError e;
    OP_REQUIRES_OK(ctx, (PoolLookupCpu<T, int64_t, TSeg>(ctx, a, in, &e)));
    OP_REQUIRES(ctx, !e.found(),
                tensorflow::errors::InvalidArgument("id ", e.key, " of key ", QuoteKey(keys, e.entry), " in row ",
                                                    e.row, " is out of range [0, ", a.spec.vocab, ")"));
  }

 private:
  // The bag (output row) of entry i: its row id, or the row whose splits
  // hold it (scanned, as the splits are not validated yet).
  static int64_t BagOf(const Tensor& segments, bool splits, int64_t i) {
    auto at = [&](int64_t j) -> int64_t {
      return segments.dtype() == tensorflow::DT_INT32 ? segments.flat<int32_t>()(j) : segments.flat<int64_t>()(j);
    };
    if (!splits) return i < segments.NumElements() ? at(i) : 0;
    for (int64_t b = 0; b + 1 < segments.NumElements(); ++b)
      if (at(b + 1) > i) return b;
    return 0;
  }

  // The rows Keras 3's Embedding reads: a negative id counts from the end.
  static absl::Status WrapNegative(OpKernelContext* ctx, const Tensor& ids, int64_t vocab, Tensor* out) {
    TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DT_INT64, ids.shape(), out));
    auto from = ids.flat<int64_t>();
    auto to = out->flat<int64_t>();
    for (int64_t i = 0; i < from.size(); ++i) to(i) = from(i) < 0 ? from(i) + vocab : from(i);
    return absl::OkStatus();
  }

  // Embedding(mask_zero=True)'s mask as weights the pooling prunes: a
  // masked id is dropped, never added as 0 * row (a row of inf stays out).
  static absl::Status NonZeroWeights(OpKernelContext* ctx, const Tensor& ids, Tensor* out) {
    TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DT_FLOAT, ids.shape(), out));
    auto from = ids.flat<int64_t>();
    auto to = out->flat<float>();
    for (int64_t i = 0; i < from.size(); ++i) to(i) = from(i) != 0 ? 1.f : 0.f;
    return absl::OkStatus();
  }

  int64_t oov_buckets_ = 0;
  VocabRules rules_;
  KeyRules key_rules_;
  bool drop_zero_ = false;
  VocabFinder finder_;
};

// SparseToDense's checks of [nnz, 2] indices into a [rows, cols] matrix
// (validate_indices): each in bounds, and each after the one before it in
// row-major order.
absl::Status CheckSparseIndices(const Tensor& indices, int64_t rows, int64_t cols) {
  const auto idx = indices.matrix<int64_t>();
  auto bad = [&](int64_t i, const std::string& what) {
    return tensorflow::errors::InvalidArgument("indices[", i, "] = [", idx(i, 0), ",", idx(i, 1), "] is ", what);
  };
  for (int64_t i = 0; i < idx.dimension(0); ++i) {
    const int64_t r = idx(i, 0), c = idx(i, 1);
    if (r < 0 || r >= rows || c < 0 || c >= cols)
      return bad(i, absl::StrCat("out of bounds: need 0 <= index < [", rows, ",", cols, "]"));
    if (i == 0) continue;
    const int64_t pr = idx(i - 1, 0), pc = idx(i - 1, 1);
    if (r == pr && c == pc) return bad(i, "repeated");
    if (r < pr || (r == pr && c < pc)) return bad(i, "out of order: indices must be sorted in row-major order");
  }
  return absl::OkStatus();
}

// CtrVocabIndicator: the find (memoized, with the buckets), the checks
// SparseToDense makes of the indices, then each row's count of every id in
// [0, depth), which is what OneHot + Sum over the densified ids add up
// (a cell left empty holds a negative default, an id out of range a row of
// zeros): no [rows, cols] ids and no [rows, cols, depth] one-hot tensor.
template <typename T>
class VocabIndicatorOp : public tensorflow::OpKernel {
 public:
  explicit VocabIndicatorOp(tensorflow::OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("depth", &depth_));
    OP_REQUIRES_OK(c, c->GetAttr("num_oov_buckets", &oov_buckets_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(2);
    const Tensor& indices = ctx->input(3);
    const Tensor& shape = ctx->input(4);
    OP_REQUIRES(ctx, keys.dims() == 1,
                tensorflow::errors::InvalidArgument("keys must be a vector, got shape ", keys.shape().DebugString()));
    OP_REQUIRES(ctx, indices.dims() == 2 && indices.dim_size(0) == keys.dim_size(0) && indices.dim_size(1) == 2,
                tensorflow::errors::InvalidArgument("indices must be [", keys.dim_size(0),
                                                    ", 2], one [row, column] per key; got shape ",
                                                    indices.shape().DebugString()));
    OP_REQUIRES(ctx, shape.dims() == 1 && shape.dim_size(0) == 2,
                tensorflow::errors::InvalidArgument("dense_shape must be [rows, columns], got shape ",
                                                    shape.shape().DebugString()));
    const int64_t rows = shape.vec<int64_t>()(0), cols = shape.vec<int64_t>()(1);
    OP_REQUIRES(ctx, rows >= 0 && cols >= 0,
                tensorflow::errors::InvalidArgument("dense_shape must not be negative, got [", rows, ",", cols, "]"));
    Tensor ids;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_INT64, keys.shape(), &ids));
    OP_REQUIRES_OK(ctx, FindKeys(ctx, &finder_, keys, ctx->input(1), oov_buckets_, &ids));
    OP_REQUIRES_OK(ctx, CheckSparseIndices(indices, rows, cols));

    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, AllocateOutput(ctx, 0, {rows, depth_}, &out));
    auto counts = out->matrix<T>();
    counts.setZero();
    const auto idx = indices.matrix<int64_t>();
    const auto found = ids.vec<int64_t>();
    for (int64_t i = 0; i < found.size(); ++i)
      if (found(i) >= 0 && found(i) < depth_) counts(idx(i, 0), found(i)) += T(1);
  }

 private:
  int64_t depth_ = 0;
  int64_t oov_buckets_ = 0;
  VocabFinder finder_;
};

#define REGISTER_CPU(T)                                                                                     \
  REGISTER_KERNEL_BUILDER(Name("CtrVocabEmbedding").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),       \
                          VocabEmbeddingOp<T>);                                                                   \
  REGISTER_KERNEL_BUILDER(Name("CtrConcatVocabEmbedding").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
                          ConcatVocabEmbeddingOp<T>);
#define REGISTER_LOOKUP_CPU(T, TSeg)                                                                    \
  REGISTER_KERNEL_BUILDER(                                                                               \
      Name("CtrVocabEmbeddingLookup").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T").TypeConstraint<TSeg>( \
          "Tseg"),                                                                                       \
      VocabEmbeddingLookupOp<T, TSeg>);
#define REGISTER_ALL(T) REGISTER_CPU(T) REGISTER_LOOKUP_CPU(T, int32_t) REGISTER_LOOKUP_CPU(T, int64_t)
REGISTER_ALL(float);
REGISTER_ALL(double);
REGISTER_ALL(Eigen::half);
REGISTER_ALL(Eigen::bfloat16);
#undef REGISTER_ALL
#undef REGISTER_LOOKUP_CPU
#undef REGISTER_CPU
REGISTER_KERNEL_BUILDER(Name("CtrVocabMultiHot").Device(tensorflow::DEVICE_CPU).TypeConstraint<float>("T"),
                        VocabMultiHotOp<float>);
REGISTER_KERNEL_BUILDER(Name("CtrVocabMultiHot").Device(tensorflow::DEVICE_CPU).TypeConstraint<double>("T"),
                        VocabMultiHotOp<double>);
REGISTER_KERNEL_BUILDER(Name("CtrVocabIndicator").Device(tensorflow::DEVICE_CPU).TypeConstraint<float>("T"),
                        VocabIndicatorOp<float>);
REGISTER_KERNEL_BUILDER(Name("CtrVocabIndicator").Device(tensorflow::DEVICE_CPU).TypeConstraint<double>("T"),
                        VocabIndicatorOp<double>);

}  // namespace tf_ctr

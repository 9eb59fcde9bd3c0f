// Framework-free fused embedding lookup: resolve each key to a table row
// (validate, or hash), weight it, optionally clip it, and pool it into its bag,
// in one pass with no [nnz, D] intermediate. The per-key and per-bag rules are
// host/device functions; the CPU loops (lookup_cpu.h) and cuda/ both use them.
#pragma once

#include <cstdint>
#include <string>

#include "cc/core/combiner.h"
#include "cc/core/float_types.h"
#include "cc/core/hd.h"
#include "cc/core/string_hash.h"

namespace ctr {

enum class IdMode : int32_t { kIndex = 0, kHash = 1 };
inline constexpr EnumName<IdMode> kIdModeNames[] = {{"index", IdMode::kIndex}, {"hash", IdMode::kHash}};
inline std::string ParseIdMode(const std::string& s, IdMode* out) { return ParseEnum("id_mode", kIdModeNames, s, out); }

// What happens to ids that are not table rows, by API:
//   kError        every id outside [0, V) is an error (tf.nn.embedding_lookup_sparse)
//   kSkipNegative negative ids are dropped, ids >= V are errors (safe_embedding_lookup_sparse)
//   kSkipPadding  -1 is padding and dropped (in hash mode too), anything else
//                 outside [0, V) is an error
enum class InvalidIds : int32_t { kError = 0, kSkipNegative = 1, kSkipPadding = 2 };
inline constexpr EnumName<InvalidIds> kInvalidIdsNames[] = {
    {"error", InvalidIds::kError}, {"skip_negative", InvalidIds::kSkipNegative},
    {"skip_padding", InvalidIds::kSkipPadding}};
inline std::string ParseInvalidIds(const std::string& s, InvalidIds* out) {
  return ParseEnum("invalid_ids", kInvalidIdsNames, s, out);
}

struct LookupSpec {
  int64_t vocab = 0;  // table rows
  int64_t buckets = 0;  // hash mode: hash % buckets (0: the table rows); a
                        // bucket >= vocab is then a bad key, as a Gather says
  StringHash hash;      // hash mode (and string tokens): fast, or keyed
  int64_t dim = 0;
  Combiner combiner = Combiner::kMean;
  IdMode id_mode = IdMode::kIndex;
  InvalidIds invalid_ids = InvalidIds::kError;
  bool prune_weights = false;  // drop entries whose weight is not > 0
  int64_t default_id = -1;     // row used for bags left empty; -1: zeros
  float max_norm = -1.f;       // <= 0: no clipping
  // Without a default_id: a row a bag left empty lists in the params
  // gradient with a zero row, or -1. TF's safe lookup fills such a bag with
  // id 0 and zeroes its output, so its gradient names row 0 (and an
  // optimizer's sparse update, momentum's say, touches it).
  int64_t empty_grad_row = -1;
};

// The row a bag left empty lists in the params gradient (-1: none), and
// whether that row's gradient is zeros rather than the bag's.
struct EmptyBagGrad {
  int64_t row;
  bool zeros;
};
CTR_HD EmptyBagGrad EmptyBagGradRow(const LookupSpec& s) {
  if (s.default_id >= 0) return {s.default_id, false};
  return {s.empty_grad_row, s.empty_grad_row >= 0};
}

constexpr int64_t kSkipKey = -1;
constexpr int64_t kBadKey = -2;

// Maps one key to its table row, kSkipKey, or kBadKey.
template <typename TKey>
CTR_HD int64_t ResolveKey(TKey key, const LookupSpec& s) {
  const int64_t k = static_cast<int64_t>(key);
  // Padding is dropped before hashing too: a padded dense batch of hashed
  // keys must not pool the bucket of "-1".
  if (k == -1 && s.invalid_ids == InvalidIds::kSkipPadding) return kSkipKey;
  if (s.id_mode == IdMode::kHash) {
    const int64_t b = HashIntKeyBucket(s.hash, k, s.buckets > 0 ? s.buckets : s.vocab);
    return b < s.vocab ? b : kBadKey;
  }
  if (k >= 0 && k < s.vocab) return k;
  if (k < 0 && s.invalid_ids == InvalidIds::kSkipNegative) return kSkipKey;
  return kBadKey;
}

// Whether a key can resolve to kBadKey: in index mode, and in hash mode
// when the buckets outnumber the table rows. The GPU launches its kernel
// that names the bad key only then.
CTR_HD bool CanHaveBadKeys(const LookupSpec& s) {
  return s.id_mode != IdMode::kHash || s.buckets > s.vocab;
}

CTR_HD bool KeepWeight(float w, const LookupSpec& s) {
  return !s.prune_weights || w > 0.f;  // NaN is pruned, as tf.greater(w, 0) says
}

// The first bad key found, reported as (bag row, key value).
struct KeyError {
  int64_t row = -1;
  int64_t key = 0;     // the integer key, or a string key's bucket
  int64_t entry = -1;  // its index among the keys (a string key's message names it)
  bool found() const { return row >= 0; }
};

// Human-readable message shared by every path that rejects a key.
inline std::string DescribeKeyError(const KeyError& e, int64_t vocab) {
  return "id " + std::to_string(e.key) + " in row " + std::to_string(e.row) +
         " is out of range [0, " + std::to_string(vocab) + ")";
}

}  // namespace ctr

// The CPU loops of StringEmbedding: visiting and pooling the tokens of
// bags of packed strings, the whole-string fast path, and the split checks,
// on the rules of strings.h. Host only: cuda/ has its own loops.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cc/core/lookup_cpu.h"
#include "cc/core/strings.h"

namespace ctr {

// Visits the tokens of bag r as (table row, weight 1, entry = token byte
// offset); stops at the first bad token and reports it in *err when given.
struct TokenBagVisitor {
  const StringSpec& s;
  const uint8_t* bytes;
  int64_t num_bytes;
  const int64_t* string_splits;
  const int64_t* bag_splits;  // nullable
  TokenError* err;            // nullable: the gradient pass skips bad tokens

  template <typename Fn>
  bool operator()(int64_t r, Fn fn) const {
    int64_t first, last;
    BagStrings(bag_splits, r, &first, &last);
    bool ok = true;
    for (int64_t j = first; j < last && ok; ++j) {
      const uint8_t* str = bytes + string_splits[j];
      ForEachResolvedToken(str, string_splits[j + 1] - string_splits[j], num_bytes - string_splits[j], s,
                           [&](int64_t b, int64_t n, int64_t row, int64_t value) {
                             if (row >= 0) {
                               fn(row, 1.f, string_splits[j] + b);
                               return true;
                             }
                             if (row == kSkipKey) return true;
                             if (err) *err = TokenError{r, string_splits[j] + b, n, value, row};
                             ok = err == nullptr;
                             return ok;
                           });
    }
    return ok;
  }
};

// trim_empty_tail's row count: bags through the last one with a table row,
// as the GPU's per-bag counts find it (a rejected token is no row: visit
// has no err). Scans back from the end, as a trimmed input rarely ends in
// many empty bags.
template <typename Visitor>  // TokenBagVisitor; a template, so device code never instantiates it
int64_t RowsThroughLastToken(const Visitor& visit, int64_t num_bags) {
  for (int64_t r = num_bags - 1; r >= 0; --r) {
    bool any = false;
    visit(r, [&](int64_t, float, int64_t) { any = true; });
    if (any) return r + 1;
  }
  return 0;
}

// Splits bags [begin, end) for their errors only (visit.err set): the bags
// of a trimmed feature past the output, which no row holds.
template <typename Visitor>
void CheckBagTokens(const Visitor& visit, int64_t begin, int64_t end) {
  for (int64_t r = begin; r < end; ++r)
    if (!visit(r, [](int64_t, float, int64_t) {})) return;
}

// Whether every bag is one whole string looked up unclipped: its output row
// is then the table row itself (any combiner of one token of weight 1), as
// the Gather of a single-valued feature returns it.
inline bool IsWholeStringLookup(const StringSpec& s, const int64_t* bag_splits) {
  return s.delim_len == 0 && s.lookup.max_norm <= 0.f && s.lookup.default_id < 0 && bag_splits == nullptr;
}

// String r of packed bytes: bytes[splits[r], splits[r + 1]). Where a
// string lives is the one thing the whole-string copy asks of its input, so
// a CPU kernel can hand it strings where they already are instead.
struct PackedStringsAt {
  const uint8_t* bytes;
  const int64_t* splits;
  const uint8_t* data(int64_t r) const { return bytes + splits[r]; }
  int64_t size(int64_t r) const { return splits[r + 1] - splits[r]; }
  int64_t offset(int64_t r) const { return splits[r]; }  // TokenError::begin of the whole string
};

// PoolStringBagsCpu for IsWholeStringLookup: each row a copy of its table row
// (bit for bit), or zeros for a skipped empty string; the pooling path would
// spend more on its accumulator than on the single row. Reads only the
// strings' own bytes (the hash reads none past a token), so `strings` may be
// any accessor with data(r), size(r) and offset(r).
//
// Each row is resolved and prefetched kCopyDistance rows before it is copied,
// so that many row loads are always in flight. Resolving a block of rows and
// then copying it drained the loads at every block boundary: in a harness
// (20 tables of 50k x 16, Criteo-like hashed categories) it cost about 1.5x
// as much per row. The distance is a power of two because the ring is
// indexed twice per row: r % 24 cost about 20 of the 105 instructions a row
// took (callgrind, same harness).
template <typename T, typename Strings>
void CopyWholeStringRowsCpu(const StringSpec& s, const T* params, const Strings& strings, int64_t begin,
                            int64_t end, T* out, TokenError* err, uint8_t* nonempty, int64_t out_stride) {
  constexpr int64_t kCopyDistance = 32;
  static_assert((kCopyDistance & (kCopyDistance - 1)) == 0, "the ring is indexed with a mask");
  const int64_t dim = s.lookup.dim;
  int64_t ahead[kCopyDistance];  // row r's table row (-1: zeros) in ahead[r % kCopyDistance]
  auto slot = [](int64_t r) { return r & (kCopyDistance - 1); };
  auto copy = [&](int64_t r) {
    const int64_t row = ahead[slot(r)];
    T* dst = out + r * out_stride;
    if (nonempty) nonempty[r] = row >= 0;
    if (row < 0) {
      memset(dst, 0, dim * sizeof(T));
    } else {
      CopyRowBytes(dst, params + row * dim, dim * sizeof(T));
    }
  };
  for (int64_t r = begin; r < end; ++r) {
    if (r - begin >= kCopyDistance) copy(r - kCopyDistance);  // frees the slot row r takes
    const int64_t len = strings.size(r);
    int64_t value = 0;
    const int64_t row = len == 0 && s.skip_empty ? kSkipKey : ResolveToken(strings.data(r), len, s, &value);
    if (row < 0 && row != kSkipKey) {
      if (err) *err = TokenError{r, strings.offset(r), len, value, row};
      return;
    }
    ahead[slot(r)] = row < 0 ? -1 : row;
    if (row >= 0) PrefetchRow(params + row * dim, dim);
  }
  for (int64_t r = end - kCopyDistance > begin ? end - kCopyDistance : begin; r < end; ++r) copy(r);
}

// The table rows of one bag's tokens, each prefetched as it is resolved.
// params and dim are captured by value: through references the compiler
// reloaded both after every push_back (a const T* store may alias them).
template <typename T>
bool ResolveBagRows(const TokenBagVisitor& visit, const T* params, int64_t dim, int64_t r,
                    std::vector<const T*>* rows) {
  rows->clear();
  return visit(r, [params, dim, rows](int64_t row, float, int64_t) {
    const T* p = params + row * dim;
    PrefetchRow(p, dim);
    rows->push_back(p);
  });
}

// Pools bags [row_begin, row_end) of tokens; acc is dim floats of scratch.
// nonempty (nullable) receives whether each bag had a token. Bag r's row is
// written at out + r * out_stride (0: dim), so a feature can be pooled
// straight into its columns of a concatenated output. Tokens have unit
// weight, so bags pool as PoolUnitBagsCpu pools ids: a per-bag loop with the
// rows in hand cost a third less per token than a stream of entries with bag
// boundaries checked at each one.
template <typename T>
void PoolStringBagsCpu(const StringSpec& s, const T* params, const uint8_t* bytes, int64_t num_bytes,
                       const int64_t* string_splits, const int64_t* bag_splits, int64_t row_begin,
                       int64_t row_end, float* acc, T* out, TokenError* err, uint8_t* nonempty = nullptr,
                       int64_t out_stride = 0) {
  if (out_stride == 0) out_stride = s.lookup.dim;
  if (IsWholeStringLookup(s, bag_splits)) {
    CopyWholeStringRowsCpu(s, params, PackedStringsAt{bytes, string_splits}, row_begin, row_end, out, err, nonempty,
                           out_stride);
    return;
  }
  const TokenBagVisitor visit{s, bytes, num_bytes, string_splits, bag_splits, err};
  const int64_t dim = s.lookup.dim;
  auto resolve = [&visit, params, dim](int64_t r, std::vector<const T*>* rows) {
    return ResolveBagRows(visit, params, dim, r, rows);
  };
  PoolUnitBagsCpu(s.lookup, params, resolve, row_begin, row_end, acc, out, out_stride, nonempty);
}

// Byte offsets of strings must be non-decreasing and inside the buffer; they
// need not start at 0 (a feature's slice of a grouped buffer).
inline std::string ValidateStringSplits(const int64_t* splits, int64_t n, int64_t num_bytes) {
  if (n < 1) return "string row_splits must have at least one element";
  if (splits[0] < 0 || splits[n - 1] > num_bytes)
    return "string row_splits [" + std::to_string(splits[0]) + ", " + std::to_string(splits[n - 1]) +
           "] fall outside the packed buffer of " + std::to_string(num_bytes) + " bytes";
  for (int64_t i = 1; i < n; ++i)
    if (splits[i] < splits[i - 1])
      return "string row_splits must be non-decreasing: row_splits[" + std::to_string(i) + "] = " +
             std::to_string(splits[i]) + " < " + std::to_string(splits[i - 1]);
  return "";
}

}  // namespace ctr

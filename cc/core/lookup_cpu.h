// The CPU loops of the fused lookup: pooling bags of keys (with prefetching
// and the row clip) and their gradient, on the rules of lookup.h. Host only:
// cuda/ has its own loops on the same rules.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__SSE2__) && !defined(__CUDA_ARCH__)
#include <emmintrin.h>
#endif

#include "cc/core/lookup.h"

namespace ctr {

// The common CTR row sizes copied with a constant size, which compiles to a
// few vector moves; a libc call per row cost more than the copy.
inline void CopyRowBytes(void* dst, const void* src, size_t n) {
  switch (n) {
    case 16: std::memcpy(dst, src, 16); return;
    case 32: std::memcpy(dst, src, 32); return;
    case 64: std::memcpy(dst, src, 64); return;
    case 128: std::memcpy(dst, src, 128); return;
    default: std::memcpy(dst, src, n);
  }
}

// ---------------------------------------------------------------------------
// Keys of the CPU loops: integers (ResolveKey's rules, shared with cuda/), or
// strings (any type with data() and size(), such as tensorflow::tstring),
// which only the CPU reads: hash mode hashes a string key as itself, as
// tf.strings.to_hash_bucket_fast does. A string is never a table row, so
// index mode rejects every one (the kernels refuse that mode up front).

template <typename TKey>
inline int64_t ResolveCpuKey(const TKey& key, const LookupSpec& s) {
  if constexpr (std::is_arithmetic_v<TKey>) {
    return ResolveKey(key, s);
  } else {
    if (s.id_mode != IdMode::kHash) return kBadKey;
    const int64_t b = HashBucket(s.hash, reinterpret_cast<const uint8_t*>(key.data()), key.size(),
                                 s.buckets > 0 ? s.buckets : s.vocab);
    return b < s.vocab ? b : kBadKey;
  }
}

// What a KeyError records of a rejected key: the key, or a string's bucket.
template <typename TKey>
inline int64_t ErrorKeyValue(const TKey& key, const LookupSpec& s) {
  if constexpr (std::is_arithmetic_v<TKey>) {
    return static_cast<int64_t>(key);
  } else {
    return HashBucket(s.hash, reinterpret_cast<const uint8_t*>(key.data()), key.size(), s.buckets > 0 ? s.buckets : s.vocab);
  }
}

// ---------------------------------------------------------------------------
// CPU pooling. Rows [row_begin, row_end) of the output; bags are CSR offsets.

template <typename T>
AccT<T> SquaredNorm(const T* row, int64_t dim) {
  AccT<T> s = 0.f;
  for (int64_t d = 0; d < dim; ++d) {
    AccT<T> v = ToFloat(row[d]);
    s += v * v;
  }
  return s;
}

template <typename T>
void AccumulateRow(const T* __restrict row, int64_t dim, float scale, AccT<T>* __restrict acc) {
  for (int64_t d = 0; d < dim; ++d) acc[d] += scale * ToFloat(row[d]);
}

// A bag's rows are summed in groups, each group's sum then added to the
// bag's: the rounding error of a float sum grows with the terms added to one
// accumulator. Summed in order instead, a bag of 2,500 ids was about 3x
// further from the exact sum than TF's. Unweighted bags are grouped as TF's
// SparseSegmentSum/Mean/SqrtN group them (what embedding_lookup_sparse
// pools unweighted ids with), so that they give its bits: a first group of
// FirstSumGroup(n) rows, then groups of kSumBlock. Weighted bags are summed
// in the order of TF's weighted composition (BagStream).
constexpr int64_t kSumBlock = 8;

// The rows of a bag of n that TF's SparseSegmentReduction sums before its
// first group of 8: n mod 8, or 8 or 9 where that is 0 or 1 (the whole bag
// up to 9 rows).
constexpr int64_t FirstSumGroup(int64_t n) {
  if (n <= 9) return n;
  const int64_t r = n % kSumBlock;
  return r == 0 ? kSumBlock : r == 1 ? kSumBlock + 1 : r;
}

// `total[d] += block[d]; block[d] = 0` for a whole row.
template <typename A>
inline void AddBlock(A* __restrict total, A* __restrict block, int64_t dim) {
  for (int64_t d = 0; d < dim; ++d) {
    total[d] += block[d];
    block[d] = 0;
  }
}

template <typename T>
float RowClipScale(const T* row, const LookupSpec& s) {
  return s.max_norm > 0.f ? MaxNormScale(SquaredNorm(row, s.dim), s.max_norm) : 1.f;
}

// out[d] = CombineElement(acc[d], scale, divisor) for a whole row. Its cases
// depend on the bag, not the element, so they are chosen once: the loop
// within each then vectorizes, where the per-element branches kept it scalar.
template <typename T>
inline void WriteCombinedRow(const AccT<T>* acc, int64_t dim, float scale, float divisor, T* out) {
  if (divisor == 0.f) {
    for (int64_t d = 0; d < dim; ++d) out[d] = FromAcc<T>(0.f);
  } else if (CombineByScale(scale)) {
    for (int64_t d = 0; d < dim; ++d) out[d] = FromAcc<T>(acc[d] * scale);
  } else {
    for (int64_t d = 0; d < dim; ++d) out[d] = FromAcc<T>(acc[d] / divisor);
  }
}

// Starts loading a table row into cache. Rows are random accesses into a
// table far larger than cache; issuing several before using any overlaps
// their memory latency, which dominates pooling. Into L1 (locality 3): a
// row is read a few entries later. In a harness of this loop alone (EPYC,
// one thread, Zipf ids into 1M x 32 floats) the L2-only hint took about 2x
// as long; through the TF op on 2 threads the difference was within the
// VM's run-to-run noise. Every line the row's first 512 bytes touch: a row
// that does not start on a line (D = 10 or 12 floats, say) ends in the one
// after.
template <typename T>
inline void PrefetchRow(const T* row, int64_t dim) {
  const int64_t bytes = std::min<int64_t>(dim * static_cast<int64_t>(sizeof(T)), 512);
  if (bytes <= 0) return;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(row);
  for (uintptr_t line = begin & ~uintptr_t{63}; line < begin + bytes; line += 64)
    __builtin_prefetch(reinterpret_cast<const char*>(line), 0, 3);
}

// Pools the weighted bags [first_bag, ...) of one range in float32 from a
// stream of entries in bag order: Add(bag, row, weight) for each looked-up
// row, then FinishBefore(row_end).
//
// Rows are random accesses into a table far larger than cache, so memory
// latency dominates. Each row is prefetched when its entry arrives and summed
// kPrefetchDistance entries later, across bag boundaries: resolving the next
// keys (hashing, parsing) overlaps the loads in flight, and bags of a single
// id, the commonest CTR feature, overlap as well as long ones.
template <typename T>
class BagStream {
 public:
  // acc: dim floats of scratch; nonempty (nullable): whether each bag had
  // entries of its own (before default_id).
  BagStream(const LookupSpec& s, const T* params, AccT<T>* acc, T* out, uint8_t* nonempty, int64_t first_bag)
      : s_(s),
        params_(params),
        packed_cols_(s.dim / kTfPacket * kTfPacket),
        acc_(acc),
        lanes_(kLanes * packed_cols_),
        out_(out),
        nonempty_(nonempty),
        bag_(first_bag) {
    ResetBag();
  }

  void Add(int64_t bag, int64_t row, float w) {
    const T* p = params_ + row * s_.dim;
    PrefetchRow(p, s_.dim);
    ring_[head_ % kRing] = Entry{bag, p, w};
    if (++head_ - tail_ > kPrefetchDistance) Consume();
  }

  // Writes every bag before end: the last entries, then bags left empty.
  void FinishBefore(int64_t end) {
    while (tail_ < head_) Consume();
    FinishBagsBefore(end);
  }

 private:
  // In the same harness, 24 entries in flight pooled in about 0.8x the time
  // of 8; 32 and 48 gained nothing more.
  static constexpr int kPrefetchDistance = 24;
  static constexpr int kRing = 32;  // a power of two > kPrefetchDistance
  // The order of TF's weighted pooling (segment_sum of the weighted rows, an
  // Eigen reduction), so that a weighted bag gets its bits: a bag of fewer
  // than kLanedFrom rows is summed in order; from there, the columns of
  // whole kTfPacket-float packets are summed in kLanes interleaved sums (row
  // j into sum j mod kLanes) over the first multiple of kLanes rows, the
  // sums then added in order and the last rows after them; other columns in
  // order. Measured on TF 2.21's CPU wheel (8-float AVX packets), column by
  // column, for D = 5 to 40 and bags of 10 to 1,000 rows
  // (tests/test_pool_paths.py checks it against TF).
  static constexpr int64_t kTfPacket = 8, kLanes = 4, kLanedFrom = 16;
  struct Entry {
    int64_t bag;
    const T* row;
    float weight;
  };
  struct Scaled {
    const T* row;
    float scale;
  };

  void Consume() {
    const Entry e = ring_[tail_++ % kRing];
    FinishBagsBefore(e.bag);
    Accumulate(e.row, e.weight);
    any_ = true;
  }
  void Accumulate(const T* row, float w) {
    const float scale = w * RowClipScale(row, s_);
    AccumulateRow(row, s_.dim, scale, acc_);
    bw_.Add(w);
    pending_[count_ % kLanes] = Scaled{row, scale};
    if (++count_ % kLanes == 0)
      for (int64_t lane = 0; lane < kLanes; ++lane)
        AccumulateRow(pending_[lane].row, packed_cols_, pending_[lane].scale, lanes_.data() + lane * packed_cols_);
  }
  // The packed columns of acc_ summed in TF's laned order.
  void UseLanedSums() {
    for (int64_t d = 0; d < packed_cols_; ++d) {
      AccT<T> total = lanes_[d];
      for (int64_t lane = 1; lane < kLanes; ++lane) total += lanes_[lane * packed_cols_ + d];
      acc_[d] = total;
    }
    for (int64_t i = 0; i < count_ % kLanes; ++i) AccumulateRow(pending_[i].row, packed_cols_, pending_[i].scale, acc_);
  }
  void FinishBagsBefore(int64_t bag) {
    for (; bag_ < bag; ++bag_) {
      if (nonempty_) nonempty_[bag_] = any_;
      if (!any_ && s_.default_id >= 0) Accumulate(params_ + s_.default_id * s_.dim, 1.f);
      if (count_ >= kLanedFrom) UseLanedSums();
      WriteCombinedRow(acc_, s_.dim, OutputScale(s_.combiner, bw_, /*weighted=*/true),
                       CombinerDivisor(s_.combiner, bw_), out_ + bag_ * s_.dim);
      ResetBag();
    }
  }
  void ResetBag() {
    for (int64_t d = 0; d < s_.dim; ++d) acc_[d] = 0.f;
    for (AccT<T>& v : lanes_) v = 0.f;
    bw_ = BagWeights();
    any_ = false;
    count_ = 0;
  }

  const LookupSpec& s_;
  const T* params_;
  const int64_t packed_cols_;
  AccT<T>* acc_;                 // the bag's sum in order
  std::vector<AccT<T>> lanes_;   // the laned sums of the packed columns
  T* out_;
  uint8_t* nonempty_;
  int64_t bag_;  // the bag being accumulated
  BagWeights bw_;
  bool any_ = false;
  int64_t count_ = 0;          // rows of the bag
  Scaled pending_[kLanes];     // the rows of the bag's last, partial, group of kLanes
  uint64_t head_ = 0, tail_ = 0;
  Entry ring_[kRing];
};

// Bags of one unweighted id without a clip, the commonest CTR feature, pool
// to their row itself: sum, mean and sqrtn all give x for one entry of weight
// 1, bit for bit. A bag left empty (a missing category, 5% of a Criteo
// field's rows) pools to the default row the same way, or to zeros. Such a
// range is a row copy per bag (a chunk of rows prefetched ahead), where the
// pooling loop spends most of its time on per-bag bookkeeping. Returns false
// when the range holds any other bag, or a key that is skipped or bad: the
// caller then pools (and rewrites) it all.
template <typename T, typename TKey>
bool CopySingleIdBags(const LookupSpec& s, const T* params, const TKey* keys, const float* weights,
                      const int64_t* offsets, int64_t row_begin, int64_t row_end, T* out) {
  if (weights != nullptr || s.max_norm > 0.f) return false;
  for (int64_t r = row_begin; r < row_end; ++r)
    if (offsets[r + 1] - offsets[r] > 1) return false;
  constexpr int64_t kChunk = 32;
  const int64_t dim = s.dim;
  const T* empty = s.default_id >= 0 ? params + s.default_id * dim : nullptr;  // null: zeros
  const T* rows[kChunk];
  for (int64_t first = row_begin; first < row_end; first += kChunk) {
    const int64_t n = std::min(kChunk, row_end - first);
    for (int64_t i = 0; i < n; ++i) {
      if (offsets[first + i] == offsets[first + i + 1]) {
        rows[i] = empty;
        continue;
      }
      const int64_t row = ResolveCpuKey(keys[offsets[first + i]], s);
      if (row < 0) return false;
      rows[i] = params + row * dim;
      PrefetchRow(rows[i], dim);
    }
    for (int64_t i = 0; i < n; ++i) {
      T* dst = out + (first + i) * dim;
      if (rows[i] != nullptr) {
        CopyRowBytes(dst, rows[i], dim * sizeof(T));
      } else {
        for (int64_t d = 0; d < dim; ++d) dst[d] = FromAcc<T>(0.f);
      }
    }
  }
  return true;
}

// ---------------------------------------------------------------------------
// Bags of unit weight (no weights input): each bag's rows are resolved into
// a list first, then summed a chunk of columns at a time with the chunk's
// sums in registers. Bags ahead of the one being summed are resolved (their
// rows prefetched) first: the next one always, and more while fewer than
// kRowsInFlight rows are pending, so the row loads of short bags overlap as
// well as long ones'. Against BagStream, which checks bag boundaries and
// re-reads its sums from memory at every entry, this took a third of the
// time per id on cached rows (Zipf ids, D = 32, one thread).

// Sums columns [c, c + kCols) of the n rows (weight 1 each) into acc, in
// the groups of FirstSumGroup.
template <typename T, int64_t kCols>
inline void SumColumnChunk(const T* const* rows, int64_t n, int64_t c, AccT<T>* __restrict acc) {
  AccT<T> total[kCols] = {}, group[kCols] = {};
  for (int64_t i = 0, group_end = FirstSumGroup(n); i < n; ++i) {
    const T* p = rows[i];
    for (int64_t d = 0; d < kCols; ++d) group[d] += ToFloat(p[c + d]);  // AccumulateRow at scale 1: x * 1.f is x
    if (i + 1 == group_end) {
      for (int64_t d = 0; d < kCols; ++d) {
        total[d] += group[d];
        group[d] = 0.f;
      }
      group_end += kSumBlock;
    }
  }
  for (int64_t d = 0; d < kCols; ++d) acc[c + d] = total[d];
}

#if defined(__SSE2__) && !defined(__CUDA_ARCH__)
// float rows in 4-lane adds: lane d of an addps is the scalar add of column
// d, so the sums are bit for bit SumColumnChunk's. GCC vectorized that loop
// into a mix of 2-lane, 4-lane and scalar adds, 17 instructions a row for 16
// columns; this takes 4 loads and 4 adds.
template <>
inline void SumColumnChunk<float, 16>(const float* const* rows, int64_t n, int64_t c, float* __restrict acc) {
  const __m128 zero = _mm_setzero_ps();
  __m128 a0 = zero, a1 = zero, a2 = zero, a3 = zero;  // the group
  __m128 t0 = zero, t1 = zero, t2 = zero, t3 = zero;  // whole groups
  for (int64_t i = 0, group_end = FirstSumGroup(n); i < n; ++i) {
    const float* p = rows[i] + c;
    a0 = _mm_add_ps(a0, _mm_loadu_ps(p));
    a1 = _mm_add_ps(a1, _mm_loadu_ps(p + 4));
    a2 = _mm_add_ps(a2, _mm_loadu_ps(p + 8));
    a3 = _mm_add_ps(a3, _mm_loadu_ps(p + 12));
    if (i + 1 == group_end) {
      t0 = _mm_add_ps(t0, a0);
      t1 = _mm_add_ps(t1, a1);
      t2 = _mm_add_ps(t2, a2);
      t3 = _mm_add_ps(t3, a3);
      a0 = a1 = a2 = a3 = zero;
      group_end += kSumBlock;
    }
  }
  _mm_storeu_ps(acc + c, t0);
  _mm_storeu_ps(acc + c + 4, t1);
  _mm_storeu_ps(acc + c + 8, t2);
  _mm_storeu_ps(acc + c + 12, t3);
}
#endif

// Chunks of 16 columns, then 8 and 4, so that small rows (D = 8, 12) are
// summed a few columns at a time too, not one column per pass.
template <typename T>
inline void SumRows(const T* const* rows, int64_t n, int64_t dim, AccT<T>* __restrict acc) {
  int64_t c = 0;
  for (; c + 16 <= dim; c += 16) SumColumnChunk<T, 16>(rows, n, c, acc);
  if (c + 8 <= dim) SumColumnChunk<T, 8>(rows, n, c, acc), c += 8;
  if (c + 4 <= dim) SumColumnChunk<T, 4>(rows, n, c, acc), c += 4;
  for (; c < dim; ++c) SumColumnChunk<T, 1>(rows, n, c, acc);
}

// Writes one bag's pooled row from its n resolved rows (weight 1 each),
// summed in the groups of FirstSumGroup. acc and block are dim accumulators
// of scratch each.
template <typename T>
void PoolBagRows(const LookupSpec& s, const T* params, const T* const* rows, int64_t n, AccT<T>* acc,
                 AccT<T>* block, T* out) {
  const int64_t dim = s.dim;
  BagWeights bw;
  if (s.max_norm > 0.f) {
    for (int64_t d = 0; d < dim; ++d) acc[d] = block[d] = 0.f;
    const bool use_default = n == 0 && s.default_id >= 0;
    const int64_t count = use_default ? 1 : n;
    for (int64_t i = 0, group_end = FirstSumGroup(count); i < count; ++i) {
      const T* p = use_default ? params + s.default_id * dim : rows[i];
      AccumulateRow(p, dim, RowClipScale(p, s), block);
      bw.Add(1.f);
      if (i + 1 == group_end) {
        AddBlock(acc, block, dim);
        group_end += kSumBlock;
      }
    }
  } else if (n == 0 && s.default_id >= 0) {
    for (int64_t d = 0; d < dim; ++d) acc[d] = 0.f + ToFloat(params[s.default_id * dim + d]);
    bw.Add(1.f);
  } else {
    SumRows(rows, n, dim, acc);
    bw = BagWeights::Units(n);
  }
  WriteCombinedRow(acc, dim, OutputScale(s.combiner, bw, /*weighted=*/false), CombinerDivisor(s.combiner, bw), out);
}

// Pools bags [row_begin, row_end) of unit weight. resolve(r, rows) clears
// `rows`, appends the rows of bag r's kept entries (prefetching each) and
// returns false on a bad key, which stops the range (the resolver records
// it). Bag r's row is written at out + r * out_stride; nonempty (nullable)
// receives whether each bag had an entry of its own. acc: dim accumulators.
template <typename T, typename ResolveBag>
bool PoolUnitBagsCpu(const LookupSpec& s, const T* params, const ResolveBag& resolve, int64_t row_begin,
                     int64_t row_end, AccT<T>* acc, T* out, int64_t out_stride, uint8_t* nonempty) {
  constexpr int64_t kMaxAhead = 8, kRowsInFlight = 16;
  std::vector<const T*> ring[kMaxAhead];  // bag b's rows in ring[b % kMaxAhead]
  // Reserved up front, so that each range (ParallelFor's) does not grow its
  // lists from empty.
  for (std::vector<const T*>& rows : ring) rows.reserve(64);
  std::vector<AccT<T>> block(s.dim);
  int64_t next = row_begin, pending = 0;  // the next bag to resolve; rows resolved, not yet summed
  for (int64_t r = row_begin; r < row_end; ++r) {
    while (next < row_end && next - r < kMaxAhead && (next <= r + 1 || pending < kRowsInFlight)) {
      std::vector<const T*>& rows = ring[next % kMaxAhead];
      if (!resolve(next, &rows)) return false;
      pending += static_cast<int64_t>(rows.size());
      ++next;
    }
    const std::vector<const T*>& rows = ring[r % kMaxAhead];
    if (nonempty) nonempty[r] = !rows.empty();
    PoolBagRows(s, params, rows.data(), static_cast<int64_t>(rows.size()), acc, block.data(), out + r * out_stride);
    pending -= static_cast<int64_t>(rows.size());
  }
  return true;
}

// Pools bags [row_begin, row_end). acc is caller scratch of spec.dim floats.
// On a bad key, records it in *err (first one in this range) and stops.
template <typename T, typename TKey>
void PoolBagsCpu(const LookupSpec& s, const T* params, const TKey* keys,
                 const float* weights, const int64_t* offsets,
                 int64_t row_begin, int64_t row_end, AccT<T>* acc, T* out,
                 KeyError* err) {
  if (CopySingleIdBags(s, params, keys, weights, offsets, row_begin, row_end, out)) return;
  if (weights == nullptr) {
    const int64_t dim = s.dim;
    auto resolve = [&s, params, dim, keys, offsets, err](int64_t r, std::vector<const T*>* rows) {
      rows->clear();
      rows->reserve(offsets[r + 1] - offsets[r]);
      for (int64_t i = offsets[r], end = offsets[r + 1]; i < end; ++i) {
        const int64_t row = ResolveCpuKey(keys[i], s);
        if (row == kSkipKey) continue;
        if (row == kBadKey) {
          err->row = r;
          err->key = ErrorKeyValue(keys[i], s);
          err->entry = i;
          return false;
        }
        const T* p = params + row * dim;
        PrefetchRow(p, dim);
        rows->push_back(p);
      }
      return true;
    };
    PoolUnitBagsCpu(s, params, resolve, row_begin, row_end, acc, out, dim, nullptr);
    return;
  }
  BagStream<T> pool(s, params, acc, out, nullptr, row_begin);
  for (int64_t r = row_begin; r < row_end; ++r) {
    for (int64_t i = offsets[r]; i < offsets[r + 1]; ++i) {
      const int64_t row = ResolveCpuKey(keys[i], s);
      if (row == kSkipKey) continue;
      // Pruned entries are dropped before their ids are checked, as
      // safe_embedding_lookup_sparse drops them before its lookup.
      const float w = weights ? weights[i] : 1.f;
      if (!KeepWeight(w, s)) continue;
      if (row == kBadKey) {
        err->row = r;
        err->key = ErrorKeyValue(keys[i], s);
        err->entry = i;
        return;
      }
      pool.Add(r, row, w);
    }
  }
  pool.FinishBefore(row_end);
}

// The first bad key of bags [row_begin, row_end) that the pooling would
// reject (pruned entries are dropped first), recorded in *err; the gradient
// ops check their ids with it, so that a gradient fed ids its forward op
// would reject fails as that op does instead of leaving them out.
template <typename TKey>
void FindBadKey(const LookupSpec& s, const TKey* keys, const float* weights, const int64_t* offsets,
                int64_t row_begin, int64_t row_end, KeyError* err) {
  for (int64_t r = row_begin; r < row_end; ++r) {
    for (int64_t i = offsets[r]; i < offsets[r + 1]; ++i) {
      if (ResolveCpuKey(keys[i], s) != kBadKey || !KeepWeight(weights ? weights[i] : 1.f, s)) continue;
      *err = {r, ErrorKeyValue(keys[i], s), i};
      return;
    }
  }
}

// The first of bags [0, rows) that keeps no entry (every key skipped, or its
// weight pruned), or -1: the first bag a default row would fill. Bad keys
// count as kept: the pooling reports them.
template <typename TKey>
int64_t FirstBagWithoutEntries(const LookupSpec& s, const TKey* keys, const float* weights,
                               const int64_t* offsets, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r) {
    bool kept = false;
    for (int64_t i = offsets[r]; i < offsets[r + 1] && !kept; ++i)
      kept = ResolveCpuKey(keys[i], s) != kSkipKey && KeepWeight(weights ? weights[i] : 1.f, s);
    if (!kept) return r;
  }
  return -1;
}

// ---------------------------------------------------------------------------
// Gradient. For every kept entry of every bag (plus the default row of bags
// left empty) one row of d(loss)/d(params) and its table index; and the dense
// gradient of each weight. Written once over a bag visitor so the id and the
// string ops share it: visit(r, fn) calls fn(table_row, weight, entry) for
// every kept entry of bag r, entry being the index of its weight.

template <typename VisitBag>
int64_t CountBagGradRows(const LookupSpec& s, const VisitBag& visit, int64_t r) {
  int64_t n = 0;
  visit(r, [&](int64_t, float, int64_t) { ++n; });
  return (n == 0 && EmptyBagGradRow(s).row >= 0) ? 1 : n;
}

// J^T g for the clip x -> x * c / max(|x|, c): identity when |x| <= c, else
// (c/|x|) (g - x (x.g)/|x|^2). Written into dst scaled by `scale`.
template <typename T>
void ClipBackward(const T* x, const AccT<T>* g, const LookupSpec& s, float scale,
                  AccT<T>* dst) {
  const int64_t D = s.dim;
  const float sq = s.max_norm > 0.f ? SquaredNorm(x, D) : 0.f;
  if (ClipIsActive(sq, s.max_norm)) {
    AccT<T> xg = 0.f;
    for (int64_t d = 0; d < D; ++d) xg += ToFloat(x[d]) * g[d];
    const float c = MaxNormScale(sq, s.max_norm);
    for (int64_t d = 0; d < D; ++d) dst[d] = ClipBackwardElement(ToFloat(x[d]), g[d], xg, sq, c, scale);
    return;
  }
  for (int64_t d = 0; d < D; ++d) dst[d] = scale * g[d];
}

// BagGradCpu without a clip or weight gradients: an entry's row is its bag's
// gradient times its coefficient (weight times the combiner's scale), as
// ClipBackward gives it when no clip is active; a coefficient of 1 (any bag
// of one unweighted id, sums of unweighted ids) is a plain copy, bit for bit.
template <typename T, typename VisitBag>
void ScaledBagGradRows(const LookupSpec& s, const VisitBag& visit, const T* grad_out,
                       const int64_t* grad_offsets, int64_t row_begin, int64_t row_end, T* grad_values,
                       int64_t* grad_indices) {
  const int64_t D = s.dim;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const T* g = grad_out + r * D;
    int64_t k = grad_offsets[r];
    auto write = [&](int64_t row, float c) {
      T* dst = grad_values + k * D;
      if (c == 1.f) {
        std::memcpy(dst, g, D * sizeof(T));
      } else {
        for (int64_t d = 0; d < D; ++d) dst[d] = FromAcc<T>(c * ToFloat(g[d]));
      }
      grad_indices[k++] = row;
    };
    BagWeights bw;
    bool any = false;
    visit(r, [&](int64_t, float w, int64_t) {
      bw.Add(w);
      any = true;
    });
    if (!any) {
      const EmptyBagGrad empty = EmptyBagGradRow(s);
      if (empty.zeros) {
        std::fill(grad_values + k * D, grad_values + (k + 1) * D, FromAcc<T>(0.f));
        grad_indices[k] = empty.row;
      } else if (empty.row >= 0) {
        write(empty.row, 1.f);
      }
      continue;
    }
    const float scale = CombinerScale(s.combiner, bw);
    visit(r, [&](int64_t row, float w, int64_t) { write(row, w * scale); });
  }
}

// Whether each bag's gradient is one row with coefficient 1 (one unweighted
// entry, or the default row of an empty bag) and no clip, given the bags'
// gradient-row offsets: then the values are the pooled gradient [B, ...]
// itself, in bag order, and a kernel can pass it on uncopied.
inline bool GradIsPooledGrad(const LookupSpec& s, bool weighted, const int64_t* grad_offsets, int64_t rows) {
  if (weighted || s.max_norm > 0.f || EmptyBagGradRow(s).zeros || grad_offsets[rows] != rows) return false;
  for (int64_t r = 0; r < rows; ++r)
    if (grad_offsets[r + 1] - grad_offsets[r] != 1) return false;
  return true;
}

// The table row of each bag's one gradient row (GradIsPooledGrad).
template <typename VisitBag>
void OneRowBagIndices(const LookupSpec& s, const VisitBag& visit, int64_t rows, int64_t* out) {
  for (int64_t r = 0; r < rows; ++r) {
    out[r] = s.default_id;
    visit(r, [&](int64_t row, float, int64_t) { out[r] = row; });
  }
}

// Fills the gradient rows of bags [row_begin, row_end). grad_offsets[r] is the
// first output row of bag r. scratch holds 3 * dim floats. grad_weights
// (nullable) must be zeroed by the caller: pruned entries keep a zero.
template <typename T, typename VisitBag>
void BagGradCpu(const LookupSpec& s, const T* params, const VisitBag& visit,
                const T* grad_out, const int64_t* grad_offsets, int64_t row_begin,
                int64_t row_end, AccT<T>* scratch, T* grad_values, int64_t* grad_indices,
                float* grad_weights) {
  if (grad_weights == nullptr && s.max_norm <= 0.f) {
    ScaledBagGradRows(s, visit, grad_out, grad_offsets, row_begin, row_end, grad_values, grad_indices);
    return;
  }
  const int64_t D = s.dim;
  AccT<T>* g = scratch;
  AccT<T>* pooled = scratch + D;  // the bag's weighted sum, for weight grads
  AccT<T>* tmp = scratch + 2 * D;
  for (int64_t r = row_begin; r < row_end; ++r) {
    for (int64_t d = 0; d < D; ++d) g[d] = ToFloat(grad_out[r * D + d]);
    for (int64_t d = 0; d < D; ++d) pooled[d] = 0.f;
    BagWeights bw;
    bool any = false;
    visit(r, [&](int64_t row, float w, int64_t) {
      const T* p = params + row * D;
      if (grad_weights) AccumulateRow(p, D, w * RowClipScale(p, s), pooled);
      bw.Add(w);
      any = true;
    });
    int64_t k = grad_offsets[r];
    if (!any) {
      const EmptyBagGrad empty = EmptyBagGradRow(s);
      if (empty.row >= 0) {
        if (empty.zeros) std::fill(tmp, tmp + D, AccT<T>(0.f));
        else ClipBackward(params + empty.row * D, g, s, 1.f, tmp);
        for (int64_t d = 0; d < D; ++d) grad_values[k * D + d] = FromAcc<T>(tmp[d]);
        grad_indices[k] = empty.row;
      }
      continue;
    }
    const float scale = CombinerScale(s.combiner, bw);
    AccT<T> g_dot_out = 0.f;
    if (grad_weights)
      for (int64_t d = 0; d < D; ++d) g_dot_out += g[d] * pooled[d] * scale;
    visit(r, [&](int64_t row, float w, int64_t entry) {
      const T* p = params + row * D;
      ClipBackward(p, g, s, w * scale, tmp);
      for (int64_t d = 0; d < D; ++d) grad_values[k * D + d] = FromAcc<T>(tmp[d]);
      grad_indices[k++] = row;
      if (grad_weights) {
        const float clip = RowClipScale(p, s);
        AccT<T> g_dot_e = 0.f;
        for (int64_t d = 0; d < D; ++d) g_dot_e += g[d] * clip * ToFloat(p[d]);
        grad_weights[entry] = WeightGrad(s.combiner, bw, w, scale, g_dot_e, g_dot_out);
      }
    });
  }
}

// The bag visitor of the id lookup: kept, valid keys with their weights.
// Bad keys were rejected by the forward pass, so they are simply skipped.
template <typename TKey>
struct KeyBagVisitor {
  const LookupSpec& s;
  const TKey* keys;
  const float* weights;
  const int64_t* offsets;
  template <typename Fn>
  void operator()(int64_t r, Fn fn) const {
    for (int64_t i = offsets[r]; i < offsets[r + 1]; ++i) {
      const int64_t row = ResolveCpuKey(keys[i], s);
      const float w = weights ? weights[i] : 1.f;
      if (row >= 0 && KeepWeight(w, s)) fn(row, w, i);
    }
  }
};

}  // namespace ctr

// CUDA side of the fused embedding lookup (interface: cuda/lookup_launchers.h).
//
// Every per-key and per-bag rule (ResolveKey, KeepWeight, CombinerScale,
// MaxNormScale, WeightGrad, the clip backward, ToFloat/FromFloat, the hash)
// comes from cc/core, so the GPU cannot drift from the CPU path the tests
// check; this file only decides how that work is spread over threads.
//
// Layout of the pooling kernels: a group of 4, 8, 16 or 32 lanes (chosen from
// dim) owns one bag at a time. Lanes resolve the next `lanes` keys of the bag
// together, one key each, because hashing a key is far more work than reading
// its row; the resolved rows are then broadcast one by one with shuffles and
// every lane accumulates its own slice of dim in float32 registers.
//
// Error reporting: d_status (device int64[2]) starts as {-1, 0}. Seen as
// unsigned, -1 is the largest value, so a lock-free atomicMin on its bit
// pattern both claims an untouched status and keeps the lowest bad row (or
// entry). The matching key (or value) is filled in afterwards by a one-warp
// kernel that does nothing unless an error was recorded, which keeps the row
// and its key consistent without a 128-bit atomic.

#include "cuda/lookup_launchers.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cub/cub.cuh>
#include <string>
#include <type_traits>

#include "cc/core/combiner.h"
#include "cc/core/float_types.h"
#include "cc/core/lookup.h"
#include "cuda/pooling_tiles.cuh"

namespace ctr {
namespace gpu {
namespace {

// ---------------------------------------------------------------------------
// Host helpers.

unsigned int BlocksFor(int64_t items, int64_t items_per_block) {
  const int64_t blocks = (items + items_per_block - 1) / items_per_block;
  return static_cast<unsigned int>(std::min(std::max<int64_t>(blocks, 1), kMaxBlocks));
}

// Smallest power-of-two group (4..32 lanes) that gives every lane at most
// max_fragments fragments per tile; small dims get small groups so no bag
// wastes a warp.
int LanesForDim(int64_t dim, int vec, int max_fragments = 1) {
  const int64_t fragments = (dim + vec - 1) / vec;
  int lanes = 4;
  while (lanes < kWarpSize && int64_t{lanes} * max_fragments < fragments) lanes *= 2;
  return lanes;
}

// Lanes per bag of the group layout (short bags). Two fragments a lane, not
// one: half the lanes resolve a bag's keys (bags this short rarely fill more)
// and a warp pools twice the bags at once. On an H200 (bags of 1 to 4 ids,
// 2026-11-30) float32 lookups ran 1.30x faster at D = 32 and 1.31x at D = 128,
// hashed int keys 1.59x and 1.40x, 16-bit tables 1.17-1.20x at D = 128; at
// D = 32 16-bit rows already fill only the 4-lane minimum. Four fragments a
// lane lost again (fp32 D = 128: 2.47 against 2.27 ms).
int BagGroupLanes(int64_t dim, int vec) { return LanesForDim(dim, vec, 2); }

// Lanes per row of the warp layout (long bags): one fragment a lane, except
// float32 rows of index-mode keys, which take two. Half the lanes per row
// halve the shuffles and address arithmetic per row; on an H200 (bags of 1 to
// 99 ids, 2026-11-30) that made float32 lookups of Zipf ids 1.11x faster at
// D = 32 and 1.36x at D = 128, uniform ids 1.02x at D = 128 and the same at
// D = 32, while 16-bit rows (0.83x at D = 32) and keys hashed in the kernel
// (0.90x) lost it to register pressure. Four fragments lost everywhere. Rows
// too wide for one fragment a lane of a warp keep their lanes: halved, they
// would take more dim tiles, each resolving the bag's keys again.
template <IdMode kMode, typename T>
int WarpRowLanes(int64_t dim, int vec) {
  const int lanes = RowGroupLanes(dim, vec);
  const bool halve = kMode == IdMode::kIndex && sizeof(T) == 4 && dim <= int64_t{kWarpSize} * vec;
  return halve ? std::max(1, lanes / 2) : lanes;
}

// Fragments per lane (1, 2 or kMaxFragments) that cover dim in one tile if
// possible. Sized to the dim because every accumulator register is paid for in
// occupancy, and the common CTR dims (<= 128) need a single fragment.
int FragmentsForDim(int64_t dim, int vec, int lanes) {
  const int64_t per_lane = (dim + int64_t{vec} * lanes - 1) / (int64_t{vec} * lanes);
  return per_lane <= 1 ? 1 : per_lane <= 2 ? 2 : kMaxFragments;
}

// Conditions under which a kernel would read outside the table although every
// key is valid; the CPU path assumes them, here they are checked because a
// device fault would take down the whole process.
std::string ValidateSpec(const LookupSpec& s) {
  if (s.dim < 0) return "dim must be >= 0, got " + std::to_string(s.dim);
  if (s.vocab < 0) return "vocab must be >= 0, got " + std::to_string(s.vocab);
  if (s.id_mode == IdMode::kHash && s.vocab <= 0)
    return "hash mode needs at least one bucket, got " + std::to_string(s.vocab);
  if (s.default_id >= s.vocab)
    return "default_id " + std::to_string(s.default_id) + " is out of range [0, " +
           std::to_string(s.vocab) + ")";
  return "";
}

// Calls launch(mode) with the spec's id mode as a compile-time constant, for
// kernels that specialise on it (see WithIdMode).
template <typename Launch>
void ForIdMode(IdMode mode, Launch&& launch) {
  if (mode == IdMode::kHash) {
    launch(std::integral_constant<IdMode, IdMode::kHash>{});
  } else {
    launch(std::integral_constant<IdMode, IdMode::kIndex>{});
  }
}

// ---------------------------------------------------------------------------
// Device helpers.

__device__ __forceinline__ void RecordLowest(int64_t* d_status, int64_t index) {
  atomicMin(reinterpret_cast<unsigned long long*>(d_status),
            static_cast<unsigned long long>(index));
}

__device__ __forceinline__ bool StatusHasError(const int64_t* d_status) {
  return d_status[0] >= 0;
}

__device__ __forceinline__ int64_t GlobalThread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ int64_t GridThreads() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// The lanes of a warp that own one bag together. Groups are aligned, so a
// shuffle of `lanes` width never crosses into a neighbouring bag.
struct LaneGroup {
  int lanes;      // 4, 8, 16 or 32
  int rank;       // this lane's index inside the group
  int first;      // warp lane of rank 0
  unsigned mask;  // the group's warp lanes; groups of one warp diverge freely

  __device__ static LaneGroup Make(int lanes) {
    LaneGroup g;
    const int warp_lane = threadIdx.x % kWarpSize;
    g.lanes = lanes;
    g.rank = warp_lane & (lanes - 1);
    g.first = warp_lane - g.rank;
    const unsigned low = lanes == kWarpSize ? kFullMask : (1u << lanes) - 1u;
    g.mask = low << g.first;
    return g;
  }

  // Global index of this group, and how many groups the grid holds.
  __device__ int64_t Index() const { return GlobalThread() / lanes; }
  __device__ int64_t Count() const { return GridThreads() / lanes; }

  // Bit k set when rank k's predicate holds. Identical in every lane of the
  // group, so loops over it stay convergent.
  __device__ unsigned Ballot(bool pred) const {
    return (__ballot_sync(mask, pred) & mask) >> first;
  }

  template <typename V>
  __device__ V Broadcast(V v, int src_rank) const {
    return __shfl_sync(mask, v, src_rank, lanes);
  }

  __device__ float Sum(float v) const {
    for (int offset = lanes / 2; offset > 0; offset /= 2)
      v += __shfl_xor_sync(mask, v, offset, lanes);
    return v;
  }
};

__device__ __forceinline__ int LowestBit(unsigned bits) {
  return __ffs(static_cast<int>(bits)) - 1;
}

// A copy of the spec whose id mode the compiler can see. ResolveKey then
// folds to one branch, which keeps the register-hungry hash out of the
// index-mode kernels (it otherwise sets their register count and occupancy).
template <IdMode kMode>
__device__ __forceinline__ LookupSpec WithIdMode(LookupSpec s) {
  s.id_mode = kMode;
  return s;
}

// One lane's view of one entry of a bag. row is a table row, kSkipKey (also
// for entries past the bag or pruned by weight) or kBadKey.
struct Entry {
  int64_t row;
  float weight;
};

template <typename TKey>
__device__ Entry ResolveEntry(const LookupSpec& s, const TKey* keys,
                              const float* weights, int64_t i, int64_t end) {
  Entry e{kSkipKey, 0.f};
  if (i >= end) return e;
  e.row = ResolveKey(keys[i], s);
  e.weight = weights ? weights[i] : 1.f;
  // Pruned entries are dropped before their ids are checked, as in
  // PoolBagsCpu (safe_embedding_lookup_sparse drops them before its lookup).
  if (!KeepWeight(e.weight, s)) e.row = kSkipKey;
  return e;
}

// Pools bag r into out. Returns early, writing nothing, on a bad key: the op
// fails then, and the CPU path also stops at the first bad key.
template <typename Tile, typename T, typename TKey>
__device__ void PoolBag(const LookupSpec& s, const T* params, const TKey* keys,
                        const float* weights, const int64_t* offsets, int64_t r,
                        const LaneGroup& g, T* out, int64_t* d_status) {
  const int64_t begin = offsets[r];
  const int64_t end = offsets[r + 1];
  const int64_t dim = s.dim;
  constexpr int kRows = RowsInFlight<Tile::kFragmentCount>();
  // do/while: a bag is resolved at least once even when dim == 0, so bad keys
  // are still reported for an empty embedding, as on the CPU.
  int64_t tile = 0;
  do {
    Tile acc;
    acc.Zero();
    BagWeights bw;
    bool any = false;
    for (int64_t base = begin; base < end; base += g.lanes) {
      const Entry mine = ResolveEntry(s, keys, weights, base + g.rank, end);
      if (g.Ballot(mine.row == kBadKey) != 0) {
        if (g.rank == 0) RecordLowest(d_status, r);
        return;
      }
      for (unsigned kept = g.Ballot(mine.row >= 0); kept != 0;) {
        const T* rows[kRows];
        float f[kRows];
#pragma unroll
        for (int u = 0; u < kRows; ++u) {
          rows[u] = nullptr;
          f[u] = 0.f;
          if (kept == 0) continue;
          const int src = LowestBit(kept);
          kept &= kept - 1;
          rows[u] = params + g.Broadcast(mine.row, src) * dim;
          f[u] = g.Broadcast(mine.weight, src);
          bw.Add(f[u]);
          any = true;
        }
        AddRows(rows, f, dim, s.max_norm, tile, g, &acc);
      }
    }
    if (!any && s.default_id >= 0) {
      AddRow(params + s.default_id * dim, 1.f, dim, s.max_norm, tile, g, &acc);
      bw.Add(1.f);
    }
    acc.Store(out + r * dim, dim, tile, g, OutputScale(s.combiner, bw, weights != nullptr), CombinerDivisor(s.combiner, bw));
    tile += Tile::Width(g);
  } while (tile < dim);
}

// Pools bag r with the whole warp: 32 entries are resolved at once, one per
// lane, and the kept ones are dealt round-robin to the warp's row groups,
// kRows each per round; the groups' partial sums are added at the end. For
// long bags this beats a group per bag: groups of one warp owning bags of
// different lengths diverge, and each then issues its instructions alone.
// Same early return on a bad key as PoolBag. Warp-collective.
template <typename Tile, typename T, typename TKey>
__device__ void PoolBagWarp(const LookupSpec& s, const T* params, const TKey* keys,
                            const float* weights, const int64_t* offsets, int64_t r,
                            const RowGroup& g, T* out, int64_t* d_status) {
  const int64_t begin = offsets[r];
  const int64_t end = offsets[r + 1];
  const int64_t dim = s.dim;
  const int lane = Lane();
  constexpr int kRows = RowsInFlight<Tile::kFragmentCount>();
  int64_t tile = 0;
  do {
    Tile acc;
    acc.Zero();
    // Weighted bags sum their weights across the warp, 32 at a time: the
    // order differs from the CPU's by rounding only. Unit weights count.
    BagWeights bw;
    int64_t units = 0;
    bool any = false;
    for (int64_t base = begin; base < end; base += kWarpSize) {
      const Entry mine = ResolveEntry(s, keys, weights, base + lane, end);
      if (__ballot_sync(kFullMask, mine.row == kBadKey) != 0) {
        if (lane == 0) RecordLowest(d_status, r);
        return;
      }
      const unsigned kept = __ballot_sync(kFullMask, mine.row >= 0);
      const int n = __popc(kept);
      if (n == 0) continue;
      any = true;
      if (weights == nullptr) {
        units += n;
      } else {
        const float w = mine.row >= 0 ? mine.weight : 0.f;
        bw.sum += WarpSum(w);
        bw.sum_sq += WarpSum(w * w);
      }
      for (int first = 0; first < n; first += kRows * g.count) {
        const T* rows[kRows];
        float f[kRows];
#pragma unroll
        for (int u = 0; u < kRows; ++u) {
          const int k = first + u * g.count + g.index;
          const int src = k < n ? KthSetLane(kept, k) : 0;
          const int64_t row = ShuffleInt64(mine.row, src);
          const float w = __shfl_sync(kFullMask, mine.weight, src);
          rows[u] = k < n ? params + row * dim : nullptr;
          f[u] = w;
        }
        AddRows(rows, f, dim, s.max_norm, tile, g, &acc);
      }
    }
    if (weights == nullptr) bw = BagWeights::Units(units);
    SumAcrossGroups(g, &acc);
    if (!any && s.default_id >= 0) {
      // Every group holds the whole sum now, so each may add the default row.
      AddRow(params + s.default_id * dim, 1.f, dim, s.max_norm, tile, g, &acc);
      bw.Add(1.f);
    }
    if (g.index == 0)
      acc.Store(out + r * dim, dim, tile, g, OutputScale(s.combiner, bw, weights != nullptr), CombinerDivisor(s.combiner, bw));
    tile += Tile::Width(g);
  } while (tile < dim);
}

// ---------------------------------------------------------------------------
// Kernels.

template <IdMode kMode, int kVec, int kFragments, typename T, typename TKey>
__global__ void __launch_bounds__(kBlockThreads, CTR_LOOKUP_MIN_BLOCKS)
    PoolBagsKernel(const LookupSpec spec, const T* __restrict__ params,
                   const TKey* __restrict__ keys, const float* __restrict__ weights,
                   const int64_t* __restrict__ offsets, int64_t num_rows, int lanes,
                   T* __restrict__ out, int64_t* d_status) {
  const LookupSpec s = WithIdMode<kMode>(spec);
  const LaneGroup g = LaneGroup::Make(lanes);
  for (int64_t r = g.Index(); r < num_rows; r += g.Count())
    PoolBag<LaneTile<kVec, kFragments>>(s, params, keys, weights, offsets, r, g, out, d_status);
}

template <IdMode kMode, int kVec, int kFragments, typename T, typename TKey>
__global__ void __launch_bounds__(kBlockThreads, CTR_LOOKUP_MIN_BLOCKS)
    PoolBagsWarpKernel(const LookupSpec spec, const T* __restrict__ params,
                       const TKey* __restrict__ keys, const float* __restrict__ weights,
                       const int64_t* __restrict__ offsets, int64_t num_rows, int lanes,
                       T* __restrict__ out, int64_t* d_status) {
  const LookupSpec s = WithIdMode<kMode>(spec);
  const RowGroup g = RowGroup::Make(lanes);
  const int64_t warps = GridThreads() / kWarpSize;
  for (int64_t r = GlobalThread() / kWarpSize; r < num_rows; r += warps)
    PoolBagWarp<LaneTile<kVec, kFragments>>(s, params, keys, weights, offsets, r, g, out, d_status);
}

// Fills d_status[1] with the first bad key of the lowest bad bag, once all
// bags are done. One warp; the key order within the bag is the CPU's, and
// pruned entries are passed over, as the CPU passes them.
template <IdMode Mode, typename TKey>
__global__ void FindFirstBadKeyKernel(const LookupSpec spec, const TKey* keys, const float* weights,
                                      const int64_t* offsets, int64_t num_rows,
                                      int64_t* d_status) {
  const LookupSpec s = WithIdMode<Mode>(spec);
  if (!StatusHasError(d_status)) return;
  const int64_t r = d_status[0];
  if (r >= num_rows) return;  // recorded by someone else; nothing of ours to read
  const int lane = threadIdx.x;
  const int64_t end = offsets[r + 1];
  for (int64_t base = offsets[r]; base < end; base += kWarpSize) {
    const int64_t i = base + lane;
    const bool bad = ResolveEntry(s, keys, weights, i, end).row == kBadKey;
    const unsigned bad_lanes = __ballot_sync(kFullMask, bad);
    if (bad_lanes != 0) {
      if (lane == LowestBit(bad_lanes)) d_status[1] = static_cast<int64_t>(keys[i]);
      return;
    }
  }
}

// The value half of an {entry index, value} status.
template <typename TSeg>
__global__ void RecordStatusValueKernel(const TSeg* values, int64_t count,
                                        int64_t* d_status) {
  if (StatusHasError(d_status) && d_status[0] < count)
    d_status[1] = static_cast<int64_t>(values[d_status[0]]);
}

__global__ void InitStatusKernel(int64_t* d_status) {
  d_status[0] = -1;
  d_status[1] = 0;
}

// First index i in [0, n) with v[i] >= target, else n. Always stays in
// bounds, even on unsorted input (which is reported separately).
template <typename TSeg>
__device__ int64_t LowerBound(const TSeg* v, int64_t n, int64_t target) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (static_cast<int64_t>(v[mid]) < target) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Same rule as the CPU RowIdsToOffsets: in range, and not below the previous
// id. The first failing entry is the one the CPU reports.
template <typename TSeg>
__device__ bool RowIdIsValid(const TSeg* row_ids, int64_t i, int64_t num_rows) {
  const int64_t r = static_cast<int64_t>(row_ids[i]);
  if (r < 0 || r >= num_rows) return false;
  return i == 0 || r >= static_cast<int64_t>(row_ids[i - 1]);
}

// One thread per output offset (a binary search, so every offset is written
// exactly once whatever the input) and per entry (validation).
template <typename TSeg>
__global__ void RowIdsToOffsetsKernel(const TSeg* __restrict__ row_ids, int64_t nnz,
                                      int64_t num_rows, int64_t* __restrict__ offsets,
                                      int64_t* d_status) {
  const int64_t items = nnz > num_rows + 1 ? nnz : num_rows + 1;
  for (int64_t t = GlobalThread(); t < items; t += GridThreads()) {
    if (t <= num_rows) offsets[t] = LowerBound(row_ids, nnz, t);
    if (t < nnz && !RowIdIsValid(row_ids, t, num_rows)) RecordLowest(d_status, t);
  }
}

// Same conditions as ValidateRowSplits; the lowest failing entry is also the
// one its sequential checks hit first.
template <typename TSeg>
__device__ bool SplitIsValid(const TSeg* splits, int64_t i, int64_t num_splits,
                             int64_t nnz) {
  const int64_t v = static_cast<int64_t>(splits[i]);
  if (i == 0 && v != 0) return false;
  if (i > 0 && v < static_cast<int64_t>(splits[i - 1])) return false;
  return i != num_splits - 1 || v == nnz;
}

// Offsets are clamped to [0, nnz] even when the splits are invalid, as the
// binary search of RowIdsToOffsets keeps them: a pooling kernel queued behind
// this one, before anyone has read the status, then reads inside the ids
// (a decreasing pair is an empty bag), and the op fails afterwards.
template <typename TSeg>
__global__ void SplitsToOffsetsKernel(const TSeg* __restrict__ splits, int64_t num_splits,
                                      int64_t nnz, int64_t* __restrict__ offsets,
                                      int64_t* d_status) {
  for (int64_t i = GlobalThread(); i < num_splits; i += GridThreads()) {
    const int64_t v = static_cast<int64_t>(splits[i]);
    offsets[i] = v < 0 ? 0 : v > nnz ? nnz : v;
    if (!SplitIsValid(splits, i, num_splits, nnz)) RecordLowest(d_status, i);
  }
}

// Keys only, so a full warp per bag regardless of dim.
template <IdMode kMode, typename TKey>
__global__ void __launch_bounds__(kBlockThreads)
    GradRowCountsKernel(const LookupSpec spec, const TKey* __restrict__ keys,
                        const float* __restrict__ weights,
                        const int64_t* __restrict__ offsets, int64_t num_rows,
                        int64_t* __restrict__ counts, int64_t* d_status) {
  const LookupSpec s = WithIdMode<kMode>(spec);
  const LaneGroup g = LaneGroup::Make(kWarpSize);
  for (int64_t r = g.Index(); r < num_rows; r += g.Count()) {
    const int64_t end = offsets[r + 1];
    int64_t n = 0;
    for (int64_t base = offsets[r]; base < end; base += g.lanes) {
      const Entry mine = ResolveEntry(s, keys, weights, base + g.rank, end);
      // Ids the forward op rejects fail the gradient too (the op is callable
      // on its own), rather than being left out.
      if (g.Ballot(mine.row == kBadKey) != 0 && g.rank == 0) RecordLowest(d_status, r);
      n += __popc(g.Ballot(mine.row >= 0));
    }
    if (n == 0 && EmptyBagGradRow(s).row >= 0) n = 1;
    if (g.rank == 0) counts[r] = n;
  }
}

// Gradient of bag r, in two passes over its keys: the first gathers the bag's
// weight sums (and, for weight gradients, g.out = scale * sum_i f_i (g.e_i),
// which avoids keeping the pooled row), the second writes one gradient row per
// kept entry at grad_offsets[r] + its rank among the kept entries.
template <typename T, typename TKey>
__device__ void GradBag(const LookupSpec& s, const T* params, const TKey* keys,
                        const float* weights, const int64_t* offsets, const T* grad_out,
                        const int64_t* grad_offsets, int64_t r, const LaneGroup& g,
                        T* grad_values, int64_t* grad_indices, float* grad_weights) {
  const int64_t begin = offsets[r];
  const int64_t end = offsets[r + 1];
  const int64_t dim = s.dim;
  const T* grad_row = grad_out + r * dim;
  const bool need_dots = s.max_norm > 0.f || grad_weights != nullptr;

  BagWeights bw;
  bool any = false;
  float weighted_dot = 0.f;  // sum over kept entries of w * clip * (g.e)
  for (int64_t base = begin; base < end; base += g.lanes) {
    const Entry mine = ResolveEntry(s, keys, weights, base + g.rank, end);
    for (unsigned kept = g.Ballot(mine.row >= 0); kept != 0; kept &= kept - 1) {
      const int src = LowestBit(kept);
      const int64_t row = g.Broadcast(mine.row, src);
      const float w = g.Broadcast(mine.weight, src);
      bw.Add(w);
      any = true;
      if (grad_weights != nullptr) {
        const RowDots dots = ComputeRowDots(params + row * dim, grad_row, dim, g);
        weighted_dot += w * MaxNormScale(dots.squared_norm, s.max_norm) * dots.dot_grad;
      }
    }
  }

  int64_t k = grad_offsets[r];
  if (!any) {
    const EmptyBagGrad empty = EmptyBagGradRow(s);
    if (empty.zeros) {
      for (int64_t d = g.rank; d < dim; d += g.lanes) grad_values[k * dim + d] = FromAcc<T>(0.f);
    } else if (empty.row >= 0) {
      const T* row = params + empty.row * dim;
      const RowDots dots = s.max_norm > 0.f ? ComputeRowDots(row, grad_row, dim, g) : RowDots{};
      WriteClipBackward(s, row, grad_row, dots, 1.f, grad_values + k * dim, g);
    }
    if (empty.row >= 0 && g.rank == 0) grad_indices[k] = empty.row;
    if (grad_weights != nullptr)
      for (int64_t i = begin + g.rank; i < end; i += g.lanes) grad_weights[i] = 0.f;
    return;
  }

  const float scale = CombinerScale(s.combiner, bw);
  const float g_dot_out = weighted_dot * scale;
  for (int64_t base = begin; base < end; base += g.lanes) {
    const Entry mine = ResolveEntry(s, keys, weights, base + g.rank, end);
    if (grad_weights != nullptr && base + g.rank < end && mine.row < 0)
      grad_weights[base + g.rank] = 0.f;
    for (unsigned kept = g.Ballot(mine.row >= 0); kept != 0; kept &= kept - 1, ++k) {
      const int src = LowestBit(kept);
      const int64_t row = g.Broadcast(mine.row, src);
      const float w = g.Broadcast(mine.weight, src);
      const T* x = params + row * dim;
      const RowDots dots = need_dots ? ComputeRowDots(x, grad_row, dim, g) : RowDots{};
      WriteClipBackward(s, x, grad_row, dots, w * scale, grad_values + k * dim, g);
      if (g.rank != 0) continue;
      grad_indices[k] = row;
      if (grad_weights != nullptr) {
        const float g_dot_e = MaxNormScale(dots.squared_norm, s.max_norm) * dots.dot_grad;
        grad_weights[base + src] = WeightGrad(s.combiner, bw, w, scale, g_dot_e, g_dot_out);
      }
    }
  }
}

template <IdMode kMode, typename T, typename TKey>
__global__ void __launch_bounds__(kBlockThreads)
    LookupGradKernel(const LookupSpec spec, const T* __restrict__ params,
                     const TKey* __restrict__ keys, const float* __restrict__ weights,
                     const int64_t* __restrict__ offsets, const T* __restrict__ grad_out,
                     const int64_t* __restrict__ grad_offsets, int64_t num_rows, int lanes,
                     T* __restrict__ grad_values, int64_t* __restrict__ grad_indices,
                     float* __restrict__ grad_weights) {
  const LookupSpec s = WithIdMode<kMode>(spec);
  const LaneGroup g = LaneGroup::Make(lanes);
  for (int64_t r = g.Index(); r < num_rows; r += g.Count())
    GradBag(s, params, keys, weights, offsets, grad_out, grad_offsets, r, g, grad_values,
            grad_indices, grad_weights);
}

// ---------------------------------------------------------------------------
// Launch helpers.

// Bags at least this long on average (nnz / rows) are pooled a warp per bag
// (PoolBagWarp); shorter ones a lane group per bag (PoolBag), where a warp
// pools several bags at once and a short bag leaves few lanes idle.
constexpr int64_t kWarpPerBagMinLength = 8;

template <IdMode kMode, int kVec, int kFragments, typename T, typename TKey>
void LaunchPoolBagsKernel(const LookupSpec& s, const T* params, const TKey* keys,
                          const float* weights, const int64_t* offsets, int64_t num_rows,
                          bool warp_per_bag, int lanes, T* out, int64_t* d_status,
                          cudaStream_t stream) {
  if (warp_per_bag) {
    auto* kernel = PoolBagsWarpKernel<kMode, kVec, kFragments, T, TKey>;
    kernel<<<OneWaveBlocks(kernel, num_rows, kBlockThreads / kWarpSize), kBlockThreads, 0, stream>>>(
            s, params, keys, weights, offsets, num_rows, lanes, out, d_status);
    return;
  }
  auto* kernel = PoolBagsKernel<kMode, kVec, kFragments, T, TKey>;
  kernel<<<OneWaveBlocks(kernel, num_rows, kBlockThreads / lanes), kBlockThreads, 0, stream>>>(
          s, params, keys, weights, offsets, num_rows, lanes, out, d_status);
}

template <IdMode kMode, int kVec, typename T, typename TKey>
void LaunchPoolBagsForMode(const LookupSpec& s, const T* params, const TKey* keys,
                           const float* weights, const int64_t* offsets, int64_t num_rows,
                           bool warp_per_bag, T* out, int64_t* d_status, cudaStream_t stream) {
  const int lanes = warp_per_bag ? WarpRowLanes<kMode, T>(s.dim, kVec) : BagGroupLanes(s.dim, kVec);
  switch (FragmentsForDim(s.dim, kVec, lanes)) {
    case 1:
      LaunchPoolBagsKernel<kMode, kVec, 1>(s, params, keys, weights, offsets, num_rows, warp_per_bag,
                                           lanes, out, d_status, stream);
      break;
    case 2:
      LaunchPoolBagsKernel<kMode, kVec, 2>(s, params, keys, weights, offsets, num_rows, warp_per_bag,
                                           lanes, out, d_status, stream);
      break;
    default:
      LaunchPoolBagsKernel<kMode, kVec, kMaxFragments>(s, params, keys, weights, offsets, num_rows,
                                                       warp_per_bag, lanes, out, d_status, stream);
  }
}

// Picks the pooling kernel specialisation at run time: id mode, bag layout,
// then fragments per lane; the caller picked the vector width.
template <int kVec, typename T, typename TKey>
std::string LaunchPoolBags(const LookupSpec& s, const T* params, const TKey* keys,
                           const float* weights, const int64_t* offsets, int64_t num_rows,
                           int64_t nnz, T* out, int64_t* d_status, cudaStream_t stream) {
  const bool warp_per_bag = nnz >= kWarpPerBagMinLength * num_rows;
  ForIdMode(s.id_mode, [&](auto mode) {
    LaunchPoolBagsForMode<decltype(mode)::value, kVec>(s, params, keys, weights, offsets, num_rows,
                                                       warp_per_bag, out, d_status, stream);
  });
  return CheckLaunch("PoolBagsKernel");
}

}  // namespace

// ---------------------------------------------------------------------------
// Launchers.

template <typename TSeg>
std::string RowIdsToOffsets(const TSeg* row_ids, int64_t nnz, int64_t num_rows,
                            int64_t* offsets, int64_t* d_status, void* stream) {
  if (num_rows < 0)
    return "RowIdsToOffsets: num_rows must be known (>= 0), got " + std::to_string(num_rows);
  if (nnz < 0) return "RowIdsToOffsets: nnz must be >= 0, got " + std::to_string(nnz);
  const cudaStream_t st = AsStream(stream);
  const int64_t items = std::max(nnz, num_rows + 1);
  RowIdsToOffsetsKernel<<<BlocksFor(items, kBlockThreads), kBlockThreads, 0, st>>>(
      row_ids, nnz, num_rows, offsets, d_status);
  std::string err = CheckLaunch("RowIdsToOffsetsKernel");
  if (!err.empty() || nnz == 0) return err;
  RecordStatusValueKernel<<<1, 1, 0, st>>>(row_ids, nnz, d_status);
  return CheckLaunch("RecordStatusValueKernel");
}

template <typename TSeg>
std::string SplitsToOffsets(const TSeg* splits, int64_t num_splits, int64_t nnz,
                            int64_t* offsets, int64_t* d_status, void* stream) {
  // No entry to blame, so this one is not a status: same text as the CPU.
  if (num_splits < 1) return "row_splits must have at least one element";
  const cudaStream_t st = AsStream(stream);
  SplitsToOffsetsKernel<<<BlocksFor(num_splits, kBlockThreads), kBlockThreads, 0, st>>>(
      splits, num_splits, nnz, offsets, d_status);
  std::string err = CheckLaunch("SplitsToOffsetsKernel");
  if (!err.empty()) return err;
  RecordStatusValueKernel<<<1, 1, 0, st>>>(splits, num_splits, d_status);
  return CheckLaunch("RecordStatusValueKernel");
}

// Names the first bad key of the lowest bad bag, where keys can be bad at all.
template <typename TKey>
std::string LaunchFindFirstBadKey(const LookupSpec& spec, const TKey* keys, const float* weights,
                                  const int64_t* offsets, int64_t num_rows, int64_t* d_status, cudaStream_t st) {
  if (!CanHaveBadKeys(spec)) return "";
  ForIdMode(spec.id_mode, [&](auto mode) {
    FindFirstBadKeyKernel<decltype(mode)::value><<<1, kWarpSize, 0, st>>>(spec, keys, weights, offsets, num_rows,
                                                                          d_status);
  });
  return CheckLaunch("FindFirstBadKeyKernel");
}

template <typename T, typename TKey>
std::string EmbeddingLookup(const LookupSpec& spec, const T* params, const TKey* keys,
                            const float* weights, const int64_t* offsets, int64_t num_rows,
                            int64_t nnz, T* out, int64_t* d_status, void* stream) {
  std::string err = ValidateSpec(spec);
  if (!err.empty() || num_rows <= 0) return err;
  const cudaStream_t st = AsStream(stream);
  constexpr int kVec = VecWidth<T>();
  const bool vectorize = spec.dim % kVec == 0 && IsVectorAligned(params) && IsVectorAligned(out);
  err = vectorize ? LaunchPoolBags<kVec>(spec, params, keys, weights, offsets, num_rows, nnz, out,
                                         d_status, st)
                  : LaunchPoolBags<1>(spec, params, keys, weights, offsets, num_rows, nnz, out,
                                      d_status, st);
  if (!err.empty()) return err;
  return LaunchFindFirstBadKey(spec, keys, weights, offsets, num_rows, d_status, st);
}

template <typename TKey>
std::string GradRowCounts(const LookupSpec& spec, const TKey* keys, const float* weights,
                          const int64_t* offsets, int64_t num_rows, int64_t* counts,
                          int64_t* d_status, void* stream) {
  std::string err = ValidateSpec(spec);
  if (!err.empty() || num_rows <= 0) return err;
  const cudaStream_t st = AsStream(stream);
  const unsigned int blocks = BlocksFor(num_rows, kBlockThreads / kWarpSize);
  ForIdMode(spec.id_mode, [&](auto mode) {
    GradRowCountsKernel<decltype(mode)::value><<<blocks, kBlockThreads, 0, st>>>(
        spec, keys, weights, offsets, num_rows, counts, d_status);
  });
  err = CheckLaunch("GradRowCountsKernel");
  if (!err.empty()) return err;
  return LaunchFindFirstBadKey(spec, keys, weights, offsets, num_rows, d_status, st);
}

size_t ExclusiveScanTempBytes(int64_t n) {
  size_t bytes = 0;
  const cudaError_t e = cub::DeviceScan::InclusiveSum(
      nullptr, bytes, static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr),
      std::max<int64_t>(n, 0));
  return e == cudaSuccess ? bytes : 0;
}

// An inclusive sum written one slot to the right is the exclusive sum with the
// total at out[n], without reading past in[n - 1].
std::string ExclusiveScan(const int64_t* in, int64_t n, int64_t* out, void* temp,
                          size_t temp_bytes, void* stream) {
  const cudaStream_t st = AsStream(stream);
  std::string err = CudaError("ExclusiveScan", cudaMemsetAsync(out, 0, sizeof(int64_t), st));
  if (!err.empty() || n <= 0) return err;
  // CUB treats a null scratch pointer as a size query and would do nothing.
  if (temp == nullptr) return "ExclusiveScan: temp storage is null";
  size_t bytes = temp_bytes;
  return CudaError("ExclusiveScan",
                   cub::DeviceScan::InclusiveSum(temp, bytes, in, out + 1, n, st));
}

template <typename T, typename TKey>
std::string LookupGrad(const LookupSpec& spec, const T* params, const TKey* keys,
                       const float* weights, const int64_t* offsets, const T* grad_out,
                       const int64_t* grad_offsets, int64_t num_rows, T* grad_values,
                       int64_t* grad_indices, float* grad_weights, void* stream) {
  std::string err = ValidateSpec(spec);
  if (!err.empty() || num_rows <= 0) return err;
  const int lanes = LanesForDim(spec.dim, 1);
  const unsigned int blocks = BlocksFor(num_rows, kBlockThreads / lanes);
  ForIdMode(spec.id_mode, [&](auto mode) {
    LookupGradKernel<decltype(mode)::value><<<blocks, kBlockThreads, 0, AsStream(stream)>>>(
        spec, params, keys, weights, offsets, grad_out, grad_offsets, num_rows, lanes,
        grad_values, grad_indices, grad_weights);
  });
  return CheckLaunch("LookupGradKernel");
}

std::string InitStatus(int64_t* d_status, void* stream) {
  InitStatusKernel<<<1, 1, 0, AsStream(stream)>>>(d_status);
  return CheckLaunch("InitStatusKernel");
}

std::string ReadInt64(const int64_t* d_src, int64_t n, int64_t* h_dst, void* stream) {
  const cudaStream_t st = AsStream(stream);
  if (n > 0) {
    std::string err = CudaError(
        "ReadInt64", cudaMemcpyAsync(h_dst, d_src, static_cast<size_t>(n) * sizeof(int64_t),
                                     cudaMemcpyDeviceToHost, st));
    if (!err.empty()) return err;
  }
  return CudaError("ReadInt64", cudaStreamSynchronize(st));
}

// ---------------------------------------------------------------------------
// Explicit instantiations.

#define CTR_INSTANTIATE_VALUE_KEY(T, TKey)                                                    \
  template std::string EmbeddingLookup<T, TKey>(const LookupSpec&, const T*, const TKey*,    \
                                                const float*, const int64_t*, int64_t,       \
                                                int64_t, T*, int64_t*, void*);               \
  template std::string LookupGrad<T, TKey>(const LookupSpec&, const T*, const TKey*,         \
                                           const float*, const int64_t*, const T*,           \
                                           const int64_t*, int64_t, T*, int64_t*, float*,    \
                                           void*);
#define CTR_INSTANTIATE_VALUE(T)            \
  CTR_INSTANTIATE_VALUE_KEY(T, int32_t)     \
  CTR_INSTANTIATE_VALUE_KEY(T, int64_t)
CTR_INSTANTIATE_VALUE(float)
CTR_INSTANTIATE_VALUE(Half)
CTR_INSTANTIATE_VALUE(BFloat16)
#undef CTR_INSTANTIATE_VALUE
#undef CTR_INSTANTIATE_VALUE_KEY

#define CTR_INSTANTIATE_INDEX(TIndex)                                                         \
  template std::string RowIdsToOffsets<TIndex>(const TIndex*, int64_t, int64_t, int64_t*,    \
                                               int64_t*, void*);                             \
  template std::string SplitsToOffsets<TIndex>(const TIndex*, int64_t, int64_t, int64_t*,    \
                                               int64_t*, void*);                             \
  template std::string GradRowCounts<TIndex>(const LookupSpec&, const TIndex*, const float*, \
                                             const int64_t*, int64_t, int64_t*, int64_t*, void*);
CTR_INSTANTIATE_INDEX(int32_t)
CTR_INSTANTIATE_INDEX(int64_t)
#undef CTR_INSTANTIATE_INDEX

}  // namespace gpu
}  // namespace ctr

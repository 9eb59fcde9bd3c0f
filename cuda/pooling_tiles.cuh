// Device code the id and string pooling kernels share: launch constants,
// host helpers, the register tile a lane pools its slice of a row in
// (vector loads and stores of 32-bit and 16-bit rows), and the clipped
// gradient row. Every function here works for any lane group. Included by the
// .cu files only; no TF headers.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>

#include "cc/core/combiner.h"
#include "cc/core/float_types.h"
#include "cc/core/lookup.h"
#include "cc/core/strings.h"
#include "cuda/cuda_status.cuh"

namespace ctr {
namespace gpu {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kBlockThreads = 256;
// Blocks of kBlockThreads per multiprocessor the pooling kernels are compiled
// to fit (the second __launch_bounds__ argument): 4 caps them at 64 registers,
// 32 warps per multiprocessor. They are bound by memory latency, so warps in
// flight beat registers: on an H200, with no cap the lookup took 77-128
// registers and the string kernel 168, and ran 1.2-2.6x and 2.3x slower
// (tools/bench_core_gpu.py, D = 32; a few spilled registers cost less). The
// other way, 6 and 8 blocks (40 and 32 registers) spilled so much that the
// lookup ran 2.3x and 3.4x slower.
#ifndef CTR_LOOKUP_MIN_BLOCKS
#define CTR_LOOKUP_MIN_BLOCKS 4
#endif
#ifndef CTR_STRING_MIN_BLOCKS
#define CTR_STRING_MIN_BLOCKS 4
#endif
// Grid-stride loops handle the rest, so any 64-bit count gets a valid grid.
constexpr int64_t kMaxBlocks = int64_t{1} << 20;
// Most fragments (kVec elements each) one lane accumulates in registers. Wider
// rows are pooled in several dim tiles, each resolving the bag's keys or
// tokens again: rare in CTR models, and it bounds register use.
constexpr int kMaxFragments = 4;
// A vector load is 16 bytes, the widest one instruction moves: 4 floats or 8
// 16-bit values. Narrower loads of 16-bit rows moved half the bytes per
// instruction, so fp16 tables were no faster than fp32 ones.
constexpr int kVecBytes = 16;
template <typename T>
constexpr int VecWidth() {
  return kVecBytes / static_cast<int>(sizeof(T));
}
// Rows one lane group loads before it adds the first of them. The loop over a
// bag's rows is bound by memory latency, not bandwidth, unless several loads
// are in flight; wide tiles get fewer, since every loaded fragment holds
// registers until it is added.
template <int kFragments>
constexpr int RowsInFlight() {
  return kFragments >= kMaxFragments ? 1 : 4 / kFragments;
}

inline bool IsVectorAligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kVecBytes == 0; }

// ---------------------------------------------------------------------------
// Host helpers.


// Blocks for a grid-stride pooling kernel over `items` (bags, each taken by a
// warp or a lane group; items_per_block of them per block at once): no more
// than fit on the device at once. A block lives as long as its longest bag,
// so with a block per 8 bags of lengths 1..99 the warps of finished bags sat
// idle (an H200's ncu: 34% achieved occupancy of 50% possible). In one wave
// each warp strides over many bags and their lengths average out.
//
// The occupancy is cached per kernel address (and architecture: a process's
// GPUs are one in practice). A static in this template would be per
// signature, which index, hash and fragment variants share: every variant
// would get the first one launched's figure.
inline int BlocksPerSm(const void* kernel) {
  static std::mutex mu;
  static auto* cache = new std::unordered_map<const void*, int>();  // never destroyed: used at exit too
  std::lock_guard<std::mutex> lock(mu);
  const auto found = cache->find(kernel);
  if (found != cache->end()) return found->second;
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kBlockThreads, 0) != cudaSuccess) n = 0;
  cache->emplace(kernel, n);
  return n;
}

template <typename Kernel>
unsigned int OneWaveBlocks(Kernel* kernel, int64_t items, int64_t items_per_block) {
  const int64_t needed =
      std::min(std::max<int64_t>((items + items_per_block - 1) / items_per_block, 1), kMaxBlocks);
  const int blocks_per_sm = BlocksPerSm(reinterpret_cast<const void*>(kernel));
  int device = 0, sms = 0;
  if (blocks_per_sm <= 0 || cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms <= 0) {
    cudaGetLastError();  // a failed query must not read as a failed launch
    return static_cast<unsigned int>(needed);
  }
  return static_cast<unsigned int>(std::min<int64_t>(needed, int64_t{sms} * blocks_per_sm));
}

// ---------------------------------------------------------------------------
// A warp that owns one bag, split into row groups.

__device__ __forceinline__ int Lane() { return static_cast<int>(threadIdx.x) & (kWarpSize - 1); }

__device__ __forceinline__ int64_t ShuffleInt64(int64_t v, int src) {
  return __shfl_sync(kFullMask, v, src);
}

// The lane holding the k-th set bit of a warp ballot. Usually every entry of
// a batch is kept, so the bits are contiguous from 0 and the answer is k; the
// popcount search is for batches with skipped entries.
__device__ __forceinline__ int KthSetLane(unsigned kept, int k) {
  return (kept & (kept + 1u)) == 0u ? k : NthSetBit(kept, k);
}

// Lanes per row group: the smallest power of two that gives every lane at
// most one fragment of the row, so narrow rows pool several entries at once.
__host__ __device__ inline int RowGroupLanes(int64_t dim, int vec) {
  const int64_t fragments = (dim + vec - 1) / vec;
  int lanes = 1;
  while (lanes < kWarpSize && lanes < fragments) lanes *= 2;
  return lanes;
}

// Fragments per lane (1, 2 or kMaxFragments) covering dim in one tile if
// possible; every accumulator register costs occupancy.
inline int RowGroupFragments(int64_t dim, int vec) {
  const int lanes = RowGroupLanes(dim, vec);
  const int64_t per_lane = (dim + int64_t{vec} * lanes - 1) / (int64_t{vec} * lanes);
  return per_lane <= 1 ? 1 : per_lane <= 2 ? 2 : kMaxFragments;
}

// The lanes of a warp that add one row together. Groups are aligned, so a
// shuffle of `lanes` width never crosses into another group.
struct RowGroup {
  int lanes;      // 1, 2, 4, ..., 32
  int rank;       // this lane's index inside the group
  int index;      // this group's index inside the warp
  int count;      // groups per warp
  unsigned mask;  // the group's warp lanes

  __device__ static RowGroup Make(int lanes) {
    RowGroup g;
    const int lane = Lane();
    g.lanes = lanes;
    g.rank = lane & (lanes - 1);
    g.index = lane / lanes;
    g.count = kWarpSize / lanes;
    const unsigned low = lanes == kWarpSize ? kFullMask : (1u << lanes) - 1u;
    g.mask = low << (lane - g.rank);
    return g;
  }

  __device__ float Sum(float v) const {
    for (int offset = lanes / 2; offset > 0; offset /= 2)
      v += __shfl_xor_sync(mask, v, offset, lanes);
    return v;
  }
};

// Lanes of equal rank in every group add up their partial bags. The whole
// warp must call it.
template <typename Tile>
__device__ void SumAcrossGroups(const RowGroup& g, Tile* t) {
  for (int offset = g.lanes; offset < kWarpSize; offset *= 2)
#pragma unroll
    for (int j = 0; j < Tile::kFragmentCount; ++j)
#pragma unroll
      for (int e = 0; e < Tile::kVec; ++e) t->v[j][e] += __shfl_xor_sync(kFullMask, t->v[j][e], offset);
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

// ---------------------------------------------------------------------------
// Fragment loads and stores: kVec consecutive elements of a row as floats.
// The vector forms need 16-byte alignment, which the launchers check. Table
// rows are read-only for the whole launch, so they go through the read-only
// data path.

__device__ __forceinline__ void LoadFragment(const float* p, float (&v)[4]) {
  const float4 q = __ldg(reinterpret_cast<const float4*>(p));
  v[0] = q.x;
  v[1] = q.y;
  v[2] = q.z;
  v[3] = q.w;
}

template <typename T16>
__device__ __forceinline__ void UnpackPair(uint32_t bits, float* v) {
  v[0] = ToFloat(T16{static_cast<uint16_t>(bits & 0xffffu)});
  v[1] = ToFloat(T16{static_cast<uint16_t>(bits >> 16)});
}

template <typename T16>
__device__ __forceinline__ void LoadFragment(const T16* p, float (&v)[8]) {
  const uint4 q = __ldg(reinterpret_cast<const uint4*>(p));
  UnpackPair<T16>(q.x, v);
  UnpackPair<T16>(q.y, v + 2);
  UnpackPair<T16>(q.z, v + 4);
  UnpackPair<T16>(q.w, v + 6);
}

template <typename T>
__device__ __forceinline__ void LoadFragment(const T* p, float (&v)[1]) {
  v[0] = ToFloat(*p);
}

__device__ __forceinline__ void StoreFragment(float* p, const float (&v)[4]) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}

template <typename T16>
__device__ __forceinline__ uint32_t PackPair(float lo, float hi) {
  return static_cast<uint32_t>(FromFloat<T16>(lo).bits) |
         (static_cast<uint32_t>(FromFloat<T16>(hi).bits) << 16);
}

template <typename T16>
__device__ __forceinline__ void StoreFragment(T16* p, const float (&v)[8]) {
  *reinterpret_cast<uint4*>(p) = make_uint4(PackPair<T16>(v[0], v[1]), PackPair<T16>(v[2], v[3]),
                                            PackPair<T16>(v[4], v[5]), PackPair<T16>(v[6], v[7]));
}

template <typename T>
__device__ __forceinline__ void StoreFragment(T* p, const float (&v)[1]) {
  *p = FromFloat<T>(v[0]);
}

// The slice of one dim tile a lane owns: fragment j starts at element
// tile_begin + (j * lanes + rank) * kVec, so a group's loads coalesce. Group
// is any lane group with `lanes` (a power of two) and this lane's `rank`: the
// lookup's bag groups and the string kernels' token groups.
template <int kVecArg, int kFragments>
struct LaneTile {
  static constexpr int kVec = kVecArg;
  static constexpr int kFragmentCount = kFragments;
  float v[kFragments][kVec];

  template <typename Group>
  __device__ static int64_t Offset(int64_t tile_begin, int j, const Group& g) {
    return tile_begin + (static_cast<int64_t>(j) * g.lanes + g.rank) * kVec;
  }
  template <typename Group>
  __device__ static int64_t Width(const Group& g) {
    return static_cast<int64_t>(g.lanes) * kVec * kFragments;
  }

  __device__ void Zero() {
#pragma unroll
    for (int j = 0; j < kFragments; ++j)
#pragma unroll
      for (int e = 0; e < kVec; ++e) v[j][e] = 0.f;
  }

  template <typename T, typename Group>
  __device__ void Store(T* row, int64_t dim, int64_t tile_begin, const Group& g,
                        float scale, float divisor) const {
#pragma unroll
    for (int j = 0; j < kFragments; ++j) {
      const int64_t d = Offset(tile_begin, j, g);
      if (d >= dim) continue;
      float scaled[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) scaled[e] = CombineElement(v[j][e], scale, divisor);
      StoreFragment(row + d, scaled);
    }
  }

  template <typename Row>
  __device__ void AddScaled(float f, const Row& x) {
#pragma unroll
    for (int j = 0; j < kFragments; ++j) {
      float e_values[kVec];
      x.Unpack(j, e_values);
#pragma unroll
      for (int e = 0; e < kVec; ++e) v[j][e] += f * e_values[e];
    }
  }
};

// A lane's slice of one loaded table row (the same fragments as LaneTile),
// kept as the raw 16-byte words the loads returned and converted to float
// only when added: a row waiting in registers then holds 4 of them per
// fragment whatever its type. As floats a 16-bit row held 8, and the rows in
// flight spilled at the 64-register cap.
template <typename T, int kVec, int kFragments>
struct LoadedRow {
  static constexpr bool kWide = kVec > 1;  // 16-byte words, else one element
  using Word = std::conditional_t<kWide, uint4, T>;
  Word w[kFragments];

  // dim is a multiple of kVec on the vector path, so a fragment that starts
  // inside the row ends inside it.
  template <typename Group>
  __device__ void Load(const T* row, int64_t dim, int64_t tile_begin, const Group& g) {
#pragma unroll
    for (int j = 0; j < kFragments; ++j) {
      const int64_t d = LaneTile<kVec, kFragments>::Offset(tile_begin, j, g);
      if constexpr (kWide) {
        w[j] = d < dim ? __ldg(reinterpret_cast<const uint4*>(row + d)) : make_uint4(0u, 0u, 0u, 0u);
      } else {
        w[j] = d < dim ? row[d] : FromFloat<T>(0.f);
      }
    }
  }

  __device__ void Unpack(int j, float (&v)[kVec]) const {
    if constexpr (!kWide) {
      v[0] = ToFloat(w[j]);
    } else if constexpr (sizeof(T) == 4) {
      v[0] = __uint_as_float(w[j].x);
      v[1] = __uint_as_float(w[j].y);
      v[2] = __uint_as_float(w[j].z);
      v[3] = __uint_as_float(w[j].w);
    } else {
      UnpackPair<T>(w[j].x, v);
      UnpackPair<T>(w[j].y, v + 2);
      UnpackPair<T>(w[j].z, v + 4);
      UnpackPair<T>(w[j].w, v + 6);
    }
  }

  __device__ float SumSquares() const {
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < kFragments; ++j) {
      float v[kVec];
      Unpack(j, v);
#pragma unroll
      for (int e = 0; e < kVec; ++e) s += v[e] * v[e];
    }
    return s;
  }
};

// |row|^2 over the whole row, for rows wider than one tile. One fragment at a
// time: the tile being pooled is live meanwhile, and registers are scarce.
template <int kVec, typename T, typename Group>
__device__ float RowSquaredNorm(const T* row, int64_t dim, const Group& g) {
  float partial = 0.f;
  for (int64_t d = static_cast<int64_t>(g.rank) * kVec; d < dim;
       d += static_cast<int64_t>(g.lanes) * kVec) {
    float v[kVec];
    LoadFragment(row + d, v);
#pragma unroll
    for (int e = 0; e < kVec; ++e) partial += v[e] * v[e];
  }
  return g.Sum(partial);
}

// acc += f[u] * clip(rows[u]) on this tile for each row given (a null row is
// none), the clip being MaxNormScale of the whole row, as AccumulateRow and
// RowClipScale do on the CPU. Every row is loaded before the first is added,
// so kRows loads are in flight; rows are added in order, so the sum is the
// one a row-at-a-time loop gives. Group-collective: which rows are null must
// be the same in every lane of the group.
template <int kRows, typename Tile, typename T, typename Group>
__device__ void AddRows(const T* const (&rows)[kRows], const float (&f)[kRows], int64_t dim,
                        float max_norm, int64_t tile_begin, const Group& g, Tile* acc) {
  LoadedRow<T, Tile::kVec, Tile::kFragmentCount> x[kRows];
#pragma unroll
  for (int u = 0; u < kRows; ++u)
    if (rows[u] != nullptr) x[u].Load(rows[u], dim, tile_begin, g);
#pragma unroll
  for (int u = 0; u < kRows; ++u) {
    if (rows[u] == nullptr) continue;
    float scale = f[u];
    if (max_norm > 0.f) {
      const bool whole_row_loaded = dim <= Tile::Width(g);
      const float squared_norm = whole_row_loaded ? g.Sum(x[u].SumSquares())
                                                  : RowSquaredNorm<Tile::kVec>(rows[u], dim, g);
      scale *= MaxNormScale(squared_norm, max_norm);
    }
    acc->AddScaled(scale, x[u]);
  }
}

// One row: the default row of an empty bag.
template <typename Tile, typename T, typename Group>
__device__ void AddRow(const T* row, float f, int64_t dim, float max_norm, int64_t tile_begin,
                       const Group& g, Tile* acc) {
  const T* const rows[1] = {row};
  const float fs[1] = {f};
  AddRows(rows, fs, dim, max_norm, tile_begin, g, acc);
}

// |e|^2 and g.e for one table row e and the bag's output gradient g.
struct RowDots {
  float squared_norm = 0.f;
  float dot_grad = 0.f;
};

template <typename T, typename Group>
__device__ RowDots ComputeRowDots(const T* row, const T* grad_row, int64_t dim, const Group& g) {
  RowDots dots;
  for (int64_t d = g.rank; d < dim; d += g.lanes) {
    const float x = ToFloat(row[d]);
    dots.squared_norm += x * x;
    dots.dot_grad += x * ToFloat(grad_row[d]);
  }
  dots.squared_norm = g.Sum(dots.squared_norm);
  dots.dot_grad = g.Sum(dots.dot_grad);
  return dots;
}

// dst = ClipBackward(row, grad_row, scale), one gradient row; dots are the
// row's (ComputeRowDots), needed only when s clips. Group-collective.
template <typename T, typename Group>
__device__ void WriteClipBackward(const LookupSpec& s, const T* row, const T* grad_row,
                                  const RowDots& dots, float scale, T* dst, const Group& g) {
  if (ClipIsActive(dots.squared_norm, s.max_norm)) {
    const float c = MaxNormScale(dots.squared_norm, s.max_norm);
    for (int64_t d = g.rank; d < s.dim; d += g.lanes)
      dst[d] = FromFloat<T>(ClipBackwardElement(ToFloat(row[d]), ToFloat(grad_row[d]),
                                                dots.dot_grad, dots.squared_norm, c, scale));
  } else {
    for (int64_t d = g.rank; d < s.dim; d += g.lanes)
      dst[d] = FromFloat<T>(scale * ToFloat(grad_row[d]));
  }
}

}  // namespace gpu
}  // namespace ctr

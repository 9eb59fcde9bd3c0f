// Device code the id and string pooling kernels share: launch constants,
// host error helpers, the register tile a lane pools its slice of a row in
// (vector loads and stores of 32-bit and 16-bit rows), and the clipped
// gradient row. Every function here works for any lane group. Included by the
// .cu files only; no TF headers.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cc/core/combiner.h"
#include "cc/core/float_types.h"
#include "cc/core/lookup.h"

namespace ctr {
namespace gpu {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kBlockThreads = 256;
// Grid-stride loops handle the rest, so any 64-bit count gets a valid grid.
constexpr int64_t kMaxBlocks = int64_t{1} << 20;
// Most fragments (kVec elements each) one lane accumulates in registers. Wider
// rows are pooled in several dim tiles, each resolving the bag's keys or
// tokens again: rare in CTR models, and it bounds register use.
constexpr int kMaxFragments = 4;
// Elements per vector load: one float4, or 8 bytes of four 16-bit values.
constexpr int kVecWidth = 4;

// ---------------------------------------------------------------------------
// Host helpers.

inline cudaStream_t AsStream(void* stream) { return static_cast<cudaStream_t>(stream); }

inline std::string CudaError(const char* what, cudaError_t e) {
  if (e == cudaSuccess) return "";
  return std::string(what) + ": " + cudaGetErrorString(e);
}

inline std::string CheckLaunch(const char* kernel) { return CudaError(kernel, cudaGetLastError()); }

// ---------------------------------------------------------------------------
// Fragment loads and stores: kVec consecutive elements of a row as floats.
// The vector forms need 4 * sizeof(T) alignment, which the launchers check.

__device__ __forceinline__ void LoadFragment(const float* p, float (&v)[4]) {
  const float4 q = *reinterpret_cast<const float4*>(p);
  v[0] = q.x;
  v[1] = q.y;
  v[2] = q.z;
  v[3] = q.w;
}

template <typename T16>
__device__ __forceinline__ void LoadFragment(const T16* p, float (&v)[4]) {
  const uint2 q = *reinterpret_cast<const uint2*>(p);
  v[0] = ToFloat(T16{static_cast<uint16_t>(q.x & 0xffffu)});
  v[1] = ToFloat(T16{static_cast<uint16_t>(q.x >> 16)});
  v[2] = ToFloat(T16{static_cast<uint16_t>(q.y & 0xffffu)});
  v[3] = ToFloat(T16{static_cast<uint16_t>(q.y >> 16)});
}

template <typename T>
__device__ __forceinline__ void LoadFragment(const T* p, float (&v)[1]) {
  v[0] = ToFloat(*p);
}

__device__ __forceinline__ void StoreFragment(float* p, const float (&v)[4]) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}

template <typename T16>
__device__ __forceinline__ void StoreFragment(T16* p, const float (&v)[4]) {
  const uint32_t b0 = FromFloat<T16>(v[0]).bits, b1 = FromFloat<T16>(v[1]).bits;
  const uint32_t b2 = FromFloat<T16>(v[2]).bits, b3 = FromFloat<T16>(v[3]).bits;
  *reinterpret_cast<uint2*>(p) = make_uint2(b0 | (b1 << 16), b2 | (b3 << 16));
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

  // dim is a multiple of kVec on the vector path, so a fragment that starts
  // inside the row ends inside it.
  template <typename T, typename Group>
  __device__ void Load(const T* row, int64_t dim, int64_t tile_begin, const Group& g) {
#pragma unroll
    for (int j = 0; j < kFragments; ++j) {
      const int64_t d = Offset(tile_begin, j, g);
      if (d < dim) {
        LoadFragment(row + d, v[j]);
      } else {
#pragma unroll
        for (int e = 0; e < kVec; ++e) v[j][e] = 0.f;
      }
    }
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

  __device__ float SumSquares() const {
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < kFragments; ++j)
#pragma unroll
      for (int e = 0; e < kVec; ++e) s += v[j][e] * v[j][e];
    return s;
  }

  __device__ void AddScaled(float f, const LaneTile& x) {
#pragma unroll
    for (int j = 0; j < kFragments; ++j)
#pragma unroll
      for (int e = 0; e < kVec; ++e) v[j][e] += f * x.v[j][e];
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

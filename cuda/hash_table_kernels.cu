// CUDA find of the key-to-row hash table: a thread per key, probing with the
// host/device rules of cc/core/hash_table.h that the CPU kernel uses.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "cc/core/hash_table.h"
#include "cuda/hash_table_launchers.h"

namespace ctr {
namespace gpu {
namespace {

constexpr int kFindThreads = 256;
constexpr int64_t kMaxFindBlocks = 1 << 16;  // the grid strides beyond

__global__ void HashTableFindKernel(const int64_t* __restrict__ pairs, int64_t num_slots,
                                    const int64_t* __restrict__ keys, int64_t n, bool dense_padding,
                                    int64_t* __restrict__ rows) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t key = keys[i];
    const int64_t s = ProbeSlot(pairs, num_slots, key);
    const int64_t entry = s >= 0 ? PairAt(pairs, s)[kEntry] : kEmptyEntry;
    rows[i] = entry >= 0 && !IsPaddingKey(key, dense_padding) ? entry : kNoRow;
  }
}

}  // namespace

std::string HashTableFind(const int64_t* slot_rows, int64_t num_slots, const int64_t* keys, int64_t n,
                          bool dense_padding, int64_t* rows, void* stream) {
  if (n <= 0) return "";
  const int64_t blocks = std::min<int64_t>((n + kFindThreads - 1) / kFindThreads, kMaxFindBlocks);
  HashTableFindKernel<<<static_cast<unsigned int>(blocks), kFindThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      slot_rows, num_slots, keys, n, dense_padding, rows);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : std::string("HashTableFindKernel: ") + cudaGetErrorString(e);
}

}  // namespace gpu
}  // namespace ctr

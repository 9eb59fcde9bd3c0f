// CUDA find and find-or-insert of the key-to-row hash table, on the
// host/device rules of cc/core/hash_table.h that the CPU kernel uses.
//
// The find is a thread per key. The insert gives rows one key at a time, in
// key order, as the CPU inserter does, so that a table trained on either
// device holds the same rows: a block scans the keys a chunk at a time and
// one thread places the chunk's missing keys. In a training step most keys
// are found, so the serial part is the few new keys, not the batch.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "cc/core/hash_table.h"
#include "cuda/hash_table_launchers.h"

namespace ctr {
namespace gpu {
namespace {

constexpr int kFindThreads = 256;
constexpr int kInsertThreads = 256;
constexpr int64_t kMaxFindBlocks = 1 << 16;  // the grid strides beyond

__global__ void HashTableFindKernel(const int64_t* __restrict__ pairs, int64_t num_slots,
                                    const int64_t* __restrict__ keys, int64_t n, bool dense_padding,
                                    int64_t* __restrict__ rows) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    rows[i] = RowInSlot(pairs, ProbeSlot(pairs, num_slots, keys[i]), keys[i], dense_padding);
  }
}

// The header check and the clock of an inserting call (one thread). A
// header that does not fit the table (status[1]) leaves the table as it was,
// as the CPU kernel refuses such a table before touching it.
__global__ void StartInsertKernel(int64_t* header, int64_t capacity, int64_t num_slots, bool new_step,
                                  int64_t* status) {
  status[0] = 0;
  status[1] = HeaderFits(header, capacity, num_slots) ? 0 : 1;
  if (status[1] == 0) InsertingClock(header, new_step);
}

// The find of an inserting call: found keys are stamped with the call's
// clock, atomically since one key may come many times.
__global__ void FindStampKernel(const int64_t* __restrict__ header, Slots slots, const int64_t* __restrict__ keys,
                                int64_t n, bool dense_padding, int64_t* __restrict__ rows,
                                const int64_t* __restrict__ status) {
  const bool stamp = status[1] == 0;
  const unsigned long long clock = static_cast<unsigned long long>(header[kClock]);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t s = ProbeSlot(slots.pairs, slots.num_slots, keys[i]);
    rows[i] = RowInSlot(slots.pairs, s, keys[i], dense_padding);
    if (rows[i] == kNoRow || !stamp) continue;
    auto* stats = reinterpret_cast<unsigned long long*>(StatsAt(slots, s));
    atomicExch(stats + kLastSeen, clock);
    atomicAdd(stats + kCount, 1ULL);
  }
}

// Rows for the keys the find left without one, placed by thread 0 in key
// order (PlaceKey). One block: the table's header is the whole call's state.
// A header that does not fit the table (status[1], from StartInsertKernel)
// inserts nothing, since it indexes the free stack.
__global__ void InsertMissingKernel(TableView t, int64_t capacity, int64_t admit_after,
                                    const int64_t* __restrict__ keys, int64_t n, bool dense_padding,
                                    int64_t* __restrict__ rows, int64_t* __restrict__ reused,
                                    int64_t* __restrict__ status) {
  __shared__ bool missing[kInsertThreads];
  if (status[1] != 0) return;
  int64_t num_reused = 0;  // thread 0's
  for (int64_t base = 0; base < n; base += kInsertThreads) {
    const int64_t i = base + threadIdx.x;
    missing[threadIdx.x] = i < n && rows[i] == kNoRow && !IsPaddingKey(keys[i], dense_padding);
    if (__syncthreads_or(missing[threadIdx.x]) && threadIdx.x == 0) {
      for (int j = 0; j < kInsertThreads; ++j) {
        if (!missing[j]) continue;
        const int64_t key = keys[base + j];
        bool was_free = false;
        rows[base + j] = PlaceKey(t, ProbeSlot(t.slots.pairs, t.slots.num_slots, key), key, capacity, admit_after,
                                  &was_free);
        if (was_free) reused[num_reused++] = rows[base + j];
      }
    }
    __syncthreads();  // missing[] is rewritten by the next chunk
  }
  if (threadIdx.x == 0) status[0] = num_reused;
}

unsigned int GridFor(int64_t n, int threads) {
  return static_cast<unsigned int>(std::min<int64_t>((n + threads - 1) / threads, kMaxFindBlocks));
}

std::string LaunchError(const char* what) {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? "" : std::string(what) + ": " + cudaGetErrorString(e);
}

}  // namespace

std::string HashTableFind(const int64_t* slot_rows, int64_t num_slots, const int64_t* keys, int64_t n,
                          bool dense_padding, int64_t* rows, void* stream) {
  if (n <= 0) return "";
  HashTableFindKernel<<<GridFor(n, kFindThreads), kFindThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      slot_rows, num_slots, keys, n, dense_padding, rows);
  return LaunchError("HashTableFindKernel");
}

std::string HashTableFindOrInsert(int64_t* table, int64_t num_slots, int64_t capacity, int64_t admit_after,
                                  bool new_step, const int64_t* keys, int64_t n, bool dense_padding, int64_t* rows,
                                  int64_t* reused, int64_t* status, void* stream) {
  const auto st = static_cast<cudaStream_t>(stream);
  const TableView t{table, SlotsOf(table + kColumns * kHeaderRows, num_slots),
                    table + kColumns * (kHeaderRows + num_slots)};
  StartInsertKernel<<<1, 1, 0, st>>>(t.header, capacity, num_slots, new_step, status);
  std::string error = LaunchError("StartInsertKernel");
  if (!error.empty() || n <= 0) return error;
  FindStampKernel<<<GridFor(n, kFindThreads), kFindThreads, 0, st>>>(t.header, t.slots, keys, n, dense_padding,
                                                                      rows, status);
  error = LaunchError("FindStampKernel");
  if (!error.empty()) return error;
  InsertMissingKernel<<<1, kInsertThreads, 0, st>>>(t, capacity, admit_after, keys, n, dense_padding, rows, reused,
                                                     status);
  return LaunchError("InsertMissingKernel");
}

}  // namespace gpu
}  // namespace ctr

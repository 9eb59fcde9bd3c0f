// CUDA find and find-or-insert of the key-to-row hash table, on the
// host/device rules of cc/core/hash_table.h that the CPU kernel uses.
//
// The find is a thread per key. An inserting call finds and stamps every key,
// counts those without a row, and then inserts them one of two ways, chosen
// on the device (DecideInsertKernel), so that the host never waits:
//  - in parallel, a thread per key, in the phases of hash_table_parallel.h,
//    whenever no key can wait for admission, be dropped or need a row the
//    table lacks: a training step's new keys in a table with room;
//  - else serially: a block scans the keys a chunk at a time and one thread
//    places the chunk's missing keys in key order (PlaceKey), as the CPU's
//    Inserter does. Only a table near full or an admission filter takes it;
//  - else, where the table evicts and RoomForAll fails (a full table), on the
//    host, by the CPU's inserter (FinishFindOrInsert): an eviction scans and
//    sorts every slot, a pass a GPU would spend in one sort of keys it then
//    deletes serially from linear-probing runs, and it happens once per
//    capacity/16 new keys, not per call.
// Both give every key the row the CPU gives it (rows in order of first
// appearance), so a table trained on either device maps keys to the same
// rows; the parallel path may put keys of one probe run in other slots.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cc/core/hash_table.h"
#include "cc/core/hash_table_cpu.h"  // InsertMissing, for the inserts that evict
#include "cc/core/hash_table_parallel.h"
#include "cuda/cuda_status.cuh"
#include "cuda/hash_table_launchers.h"
#include "cuda/lookup_launchers.h"  // ExclusiveScan

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
// header that does not fit the table leaves the table as it was, as the CPU
// kernel refuses such a table before touching it.
__global__ void StartInsertKernel(int64_t* header, int64_t capacity, int64_t num_slots, bool new_step,
                                  int64_t* status) {
  status[kReusedCount] = 0;
  status[kBadHeader] = HeaderFits(header, capacity, num_slots) ? 0 : 1;
  status[kMissing] = 0;
  status[kParallel] = 0;
  status[kOnHost] = 0;
  if (status[kBadHeader] == 0) InsertingClock(header, new_step);
}

// The find of an inserting call: found keys, and keys waiting for admission
// (WaitsInSlot), are stamped with the call's clock, atomically since one key
// may come many times; the missing ones are counted, a warp's at once. A
// probe that meets no empty slot, or a row past the capacity (the CPU's
// TableFault), marks the table bad: no insert path runs.
__global__ void FindStampKernel(const int64_t* __restrict__ header, Slots slots, int64_t capacity,
                                const int64_t* __restrict__ keys, int64_t n, bool dense_padding,
                                int64_t* __restrict__ rows, int64_t* status) {
  const bool stamp = status[kBadHeader] == 0;
  const unsigned long long clock = static_cast<unsigned long long>(header[kClock]);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t s = ProbeSlot(slots.pairs, slots.num_slots, keys[i]);
    const int64_t row = RowInSlot(slots.pairs, s, keys[i], dense_padding);
    rows[i] = row;
    if (s < 0 || row >= capacity) status[kBadHeader] = 1;
    const auto warp = cooperative_groups::coalesced_threads();
    const unsigned missing = warp.ballot(row == kNoRow && !IsPaddingKey(keys[i], dense_padding));
    if (missing != 0 && warp.thread_rank() == 0) {
      atomicAdd(reinterpret_cast<unsigned long long*>(status + kMissing),
                static_cast<unsigned long long>(__popc(missing)));
    }
    if (!stamp) continue;
    auto* stats = reinterpret_cast<unsigned long long*>(StatsAt(slots, s));
    if (row != kNoRow) {
      atomicExch(stats + kLastSeen, clock);
      atomicAdd(stats + kCount, 1ULL);
    } else if (WaitsInSlot(slots.pairs, s, keys[i], dense_padding)) {
      atomicExch(stats + kLastSeen, clock);
    }
  }
}

// Whether this call inserts in parallel (InsertsInParallel), on the host (it
// may evict) or serially on the device; one thread.
__global__ void DecideInsertKernel(TableView t, InsertRules rules, int64_t* status) {
  const int64_t capacity = rules.capacity, num_slots = t.slots.num_slots, missing = status[kMissing];
  if (status[kBadHeader] == 0) {
    const int64_t pops = missing < t.header[kFreeCount] ? missing : t.header[kFreeCount];
    if (FirstBadFreeRow(t, capacity, pops) >= 0) status[kBadHeader] = 1;  // no insert path runs
  }
  if (status[kBadHeader] != 0) return;
  status[kParallel] = InsertsInParallel(t.header, capacity, num_slots, rules.admit_after, missing);
  status[kOnHost] = !status[kParallel] && rules.eviction != Eviction::kNone &&
                    !RoomForAll(t.header, capacity, num_slots, missing);
}

// Phase 1 (hash_table_parallel.h): each missing key's slot, claimed or
// found; -1 for keys with a row, padding, and every key of a serial call.
__global__ void ClaimSlotsKernel(Slots slots, const int64_t* __restrict__ keys, int64_t n, bool dense_padding,
                                 const int64_t* __restrict__ rows, const int64_t* __restrict__ status,
                                 int64_t* __restrict__ slot) {
  const bool parallel = status[kParallel] != 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const bool missing = parallel && rows[i] == kNoRow && !IsPaddingKey(keys[i], dense_padding);
    slot[i] = missing ? ClaimSlot(slots.pairs, slots.num_slots, keys, n, i) : -1;
  }
}

// Phase 2: flags[i] = 1 for each new key's first sighting.
__global__ void FirstSightingsKernel(const int64_t* __restrict__ header, Slots slots,
                                     const int64_t* __restrict__ keys, int64_t n, const int64_t* __restrict__ slot,
                                     int64_t* __restrict__ flags) {
  const int64_t clock = header[kClock];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    flags[i] = TakeFirstSighting(slots, slot[i], keys, i, clock) ? 1 : 0;
  }
}

// Phase 4: rows for the first sightings (ranks: the flags' exclusive sum),
// use counts for all.
__global__ void GiveRowsKernel(TableView t, int64_t n, const int64_t* __restrict__ slot,
                               const int64_t* __restrict__ flags, const int64_t* __restrict__ ranks,
                               int64_t* __restrict__ reused) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    if (flags[i] != 0) GiveRow(t, slot[i], ranks[i], reused);
    CountSighting(t.slots, slot[i]);
  }
}

// Phase 5: each sighting's row, and the header once (ranks[n]: keys added).
__global__ void ReadRowsKernel(TableView t, int64_t n, const int64_t* __restrict__ slot,
                               const int64_t* __restrict__ ranks, int64_t* __restrict__ rows, int64_t* status) {
  if (blockIdx.x == 0 && threadIdx.x == 0 && status[kParallel] != 0) {
    status[kReusedCount] = FinishParallelInsert(t.header, ranks[n]);
  }
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    if (slot[i] >= 0) rows[i] = RowOfClaimedSlot(t.slots, slot[i]);
  }
}

// Rows for the keys the find left without one, placed by thread 0 in key
// order (PlaceKey), where the call does not insert in parallel. One block:
// the table's header is the whole call's state. A header that does not fit
// the table inserts nothing, since it indexes the free stack.
__global__ void InsertMissingKernel(TableView t, int64_t capacity, int64_t admit_after,
                                    const int64_t* __restrict__ keys, int64_t n, bool dense_padding,
                                    int64_t* __restrict__ rows, int64_t* __restrict__ reused,
                                    int64_t* __restrict__ status) {
  __shared__ bool missing[kInsertThreads];
  if (status[kBadHeader] != 0 || status[kParallel] != 0 || status[kOnHost] != 0) return;
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
  if (threadIdx.x == 0) status[kReusedCount] = num_reused;
}

unsigned int GridFor(int64_t n, int threads) {
  return static_cast<unsigned int>(std::min<int64_t>((n + threads - 1) / threads, kMaxFindBlocks));
}


}  // namespace

std::string HashTableFind(const int64_t* slot_rows, int64_t num_slots, const int64_t* keys, int64_t n,
                          bool dense_padding, int64_t* rows, void* stream) {
  if (n <= 0) return "";
  HashTableFindKernel<<<GridFor(n, kFindThreads), kFindThreads, 0, AsStream(stream)>>>(
      slot_rows, num_slots, keys, n, dense_padding, rows);
  return CheckLaunch("HashTableFindKernel");
}

namespace {

// Where an inserting call's scratch lives: slot, flags and ranks per key,
// then CUB's scan scratch, each 256-byte aligned as CUB expects its own.
struct InsertScratch {
  int64_t* slot = nullptr;   // [n]
  int64_t* flags = nullptr;  // [n]
  int64_t* ranks = nullptr;  // [n + 1]
  void* scan = nullptr;
  size_t scan_bytes = 0;
  size_t total = 0;
};

size_t Aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

InsertScratch CarveInsertScratch(int64_t n, void* base) {
  const size_t keys = static_cast<size_t>(std::max<int64_t>(n, 0));
  InsertScratch w;
  auto* bytes = static_cast<char*>(base);
  const size_t per_key = Aligned(keys * sizeof(int64_t));
  const size_t ranks_at = 2 * per_key, scan_at = ranks_at + Aligned((keys + 1) * sizeof(int64_t));
  w.scan_bytes = ExclusiveScanTempBytes(static_cast<int64_t>(keys));
  w.total = scan_at + Aligned(std::max<size_t>(w.scan_bytes, 1));
  if (bytes != nullptr) {
    w.slot = reinterpret_cast<int64_t*>(bytes);
    w.flags = reinterpret_cast<int64_t*>(bytes + per_key);
    w.ranks = reinterpret_cast<int64_t*>(bytes + ranks_at);
    w.scan = bytes + scan_at;
  }
  return w;
}

TableView TableAt(int64_t* table, int64_t num_slots) {
  return {table, SlotsOf(table + kColumns * kHeaderRows, num_slots), table + kColumns * (kHeaderRows + num_slots)};
}

}  // namespace

size_t HashTableInsertScratchBytes(int64_t n) { return CarveInsertScratch(n, nullptr).total; }

std::string HashTableFindOrInsert(int64_t* table, int64_t num_slots, const InsertRules& rules, bool new_step,
                                  const int64_t* keys, int64_t n, int64_t* rows, int64_t* reused, int64_t* status,
                                  void* scratch, size_t scratch_bytes, void* stream) {
  const auto st = AsStream(stream);
  const TableView t = TableAt(table, num_slots);
  const int64_t capacity = rules.capacity, admit_after = rules.admit_after;
  const bool dense_padding = rules.dense_padding;
  StartInsertKernel<<<1, 1, 0, st>>>(t.header, capacity, num_slots, new_step, status);
  std::string error = CheckLaunch("StartInsertKernel");
  if (!error.empty() || n <= 0) return error;
  const InsertScratch w = CarveInsertScratch(n, scratch);
  if (scratch == nullptr || scratch_bytes < w.total) {
    return "HashTableFindOrInsert: scratch of " + std::to_string(scratch_bytes) + " bytes, needs " +
           std::to_string(w.total) + " (HashTableInsertScratchBytes)";
  }
  const unsigned int grid = GridFor(n, kFindThreads);
  FindStampKernel<<<grid, kFindThreads, 0, st>>>(t.header, t.slots, capacity, keys, n, dense_padding, rows, status);
  DecideInsertKernel<<<1, 1, 0, st>>>(t, rules, status);
  ClaimSlotsKernel<<<grid, kFindThreads, 0, st>>>(t.slots, keys, n, dense_padding, rows, status, w.slot);
  FirstSightingsKernel<<<grid, kFindThreads, 0, st>>>(t.header, t.slots, keys, n, w.slot, w.flags);
  error = CheckLaunch("the parallel insert's claims");
  if (!error.empty()) return error;
  error = ExclusiveScan(w.flags, n, w.ranks, w.scan, w.scan_bytes, stream);
  if (!error.empty()) return error;
  GiveRowsKernel<<<grid, kFindThreads, 0, st>>>(t, n, w.slot, w.flags, w.ranks, reused);
  ReadRowsKernel<<<grid, kFindThreads, 0, st>>>(t, n, w.slot, w.ranks, rows, status);
  InsertMissingKernel<<<1, kInsertThreads, 0, st>>>(t, capacity, admit_after, keys, n, dense_padding, rows, reused,
                                                     status);
  return CheckLaunch("the hash table's insert");
}

std::string FinishFindOrInsert(int64_t* table, int64_t num_slots, const InsertRules& rules, const int64_t* keys,
                               int64_t n, int64_t* rows, int64_t* reused, const int64_t* status,
                               InsertOutcome* outcome, void* stream) {
  int64_t cells[kHashTableStatusCells];
  std::string error = ReadInt64(status, kHashTableStatusCells, cells, stream);
  if (!error.empty()) return error;
  *outcome = InsertOutcome{};
  outcome->bad_header = cells[kBadHeader] != 0;
  outcome->reused_count = cells[kReusedCount];
  outcome->on_host = cells[kOnHost] != 0;
  if (!outcome->on_host || outcome->bad_header || n <= 0) return "";

  const auto st = AsStream(stream);
  const size_t table_bytes =
      static_cast<size_t>(kColumns * (kHeaderRows + num_slots + FreeListRows(rules.capacity))) * sizeof(int64_t);
  const size_t key_bytes = static_cast<size_t>(n) * sizeof(int64_t);
  std::vector<int64_t> host_table(table_bytes / sizeof(int64_t)), host_keys(n), host_rows(n);
  error = CudaError("copying the table to the host", cudaMemcpyAsync(host_table.data(), table, table_bytes,
                                                                     cudaMemcpyDeviceToHost, st));
  if (error.empty())
    error = CudaError("copying keys to the host",
                      cudaMemcpyAsync(host_keys.data(), keys, key_bytes, cudaMemcpyDeviceToHost, st));
  if (error.empty())
    error = CudaError("copying rows to the host",
                      cudaMemcpyAsync(host_rows.data(), rows, key_bytes, cudaMemcpyDeviceToHost, st));
  if (error.empty()) error = CudaError("FinishFindOrInsert", cudaStreamSynchronize(st));
  if (!error.empty()) return error;

  const auto serial_for = [](int64_t count, const auto& fn) {
    if (count > 0) fn(int64_t{0}, count);
  };
  const std::vector<int64_t> taken = InsertMissing(TableAt(host_table.data(), num_slots), rules, host_keys.data(),
                                                   n, host_rows.data(), /*parallel=*/false, serial_for,
                                                   &outcome->corrupt);
  outcome->reused_count = static_cast<int64_t>(taken.size());
  error = CudaError("copying the table back", cudaMemcpyAsync(table, host_table.data(), table_bytes,
                                                              cudaMemcpyHostToDevice, st));
  if (error.empty())
    error = CudaError("copying rows back",
                      cudaMemcpyAsync(rows, host_rows.data(), key_bytes, cudaMemcpyHostToDevice, st));
  if (error.empty() && !taken.empty())
    error = CudaError("copying reused rows back",
                      cudaMemcpyAsync(reused, taken.data(), taken.size() * sizeof(int64_t),
                                      cudaMemcpyHostToDevice, st));
  // The host buffers die on return: the copies must be done by then.
  const std::string sync = CudaError("FinishFindOrInsert", cudaStreamSynchronize(st));
  return error.empty() ? sync : error;
}

}  // namespace gpu
}  // namespace ctr

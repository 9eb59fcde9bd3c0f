// Parallel find-or-insert of the key-to-row hash table: the host/device rules
// that let CPU threads, or a GPU thread per key, place every key a call's
// find missed at once and still give each key the row the serial insert
// (PlaceKey, in key order) gives it.
//
// The serial order decides who waits for admission, who is dropped and who
// is evicted. A call in which none of that can happen (InsertsInParallel)
// gives each new key the row of its first sighting's rank among the new
// keys' first sightings, which a prefix sum yields. Only the slot a key lands
// in may differ from the serial insert's, since linear probing places keys of
// one probe run in the order they arrive: the table maps every key to the
// same row with the same stats, header and free stack, in a possibly
// different slot.
//
// The phases, each finished by every thread before the next starts, over the
// sightings j of the missing keys (keys[j], n of them):
//   1 ClaimSlot: finds the key's slot or claims an empty one by a
//     compare-and-swap of its entry to ClaimCode(j). The entry then holds the
//     key's lowest sighting (an atomic min), and a probe reads a claimed
//     slot's key as keys[ClaimedBy(entry)]: no slot ever holds a half-written key.
//   2 TakeFirstSighting: the sighting the entry names is the key's first; it
//     writes the key and starts the stats, and is flagged.
//   3 an exclusive prefix sum of the flags: each first sighting's rank.
//   4 GiveRow for the first sightings (RowOfRank); CountSighting for all.
//   5 each sighting reads its row (RowOfClaimedSlot); FinishParallelInsert
//     updates the header once.
#pragma once

#include <cstdint>

#include "cc/core/hash_table.h"
#include "cc/core/hd.h"

namespace ctr {

// Relaxed atomics on int64 cells, host and device: a claim code carries all
// a reader needs (the index of a key the call holds), and the phases are
// ordered by the barriers between them, not by these operations.
CTR_HD int64_t LoadCell(const int64_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const volatile long long*>(p);
#else
  return __atomic_load_n(p, __ATOMIC_RELAXED);
#endif
}

CTR_HD bool CompareAndSwapCell(int64_t* p, int64_t expected, int64_t desired) {
#if defined(__CUDA_ARCH__)
  const auto want = static_cast<unsigned long long>(expected);
  return atomicCAS(reinterpret_cast<unsigned long long*>(p), want, static_cast<unsigned long long>(desired)) == want;
#else
  return __atomic_compare_exchange_n(p, &expected, desired, /*weak=*/false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
#endif
}

// The read first spares the atomic to most sightings of a hot key, which
// would otherwise all queue on one address.
CTR_HD void MinCell(int64_t* p, int64_t value) {
#if defined(__CUDA_ARCH__)
  if (value < LoadCell(p)) atomicMin(reinterpret_cast<long long*>(p), static_cast<long long>(value));
#else
  int64_t current = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (value < current &&
         !__atomic_compare_exchange_n(p, &current, value, /*weak=*/true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
#endif
}

CTR_HD void AddToCell(int64_t* p, int64_t value) {
#if defined(__CUDA_ARCH__)
  atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(value));
#else
  __atomic_fetch_add(p, value, __ATOMIC_RELAXED);
#endif
}

// Whether a call whose find left `missing` sightings (padding aside) without
// a row may insert them in parallel: when no key can wait for admission, be
// dropped or need an eviction, however many distinct keys they hold. That is
// admit_after 1, no key waiting from earlier calls (every occupied slot holds
// a row), and a slot (CanClaimSlot) and a row for every sighting. The header
// must fit the table (HeaderFits).
CTR_HD bool InsertsInParallel(const int64_t* h, int64_t capacity, int64_t num_slots, int64_t admit_after,
                              int64_t missing) {
  return admit_after == 1 && h[kOccupied] == h[kNextRow] - h[kFreeCount] &&
         RoomForAll(h, capacity, num_slots, missing);
}

// An entry claimed by sighting j during phases 1-4: below every entry the
// serial rules write (a key seen 2^63 - 1 times is not a case).
constexpr int64_t kFirstClaim = -9223372036854775807LL - 1;
CTR_HD int64_t ClaimCode(int64_t j) { return kFirstClaim + j; }

// The sighting among n that claimed an entry, else -1. A value of a
// corrupt table that looks like a claim names a sighting in range, so a probe
// never reads outside the keys.
CTR_HD int64_t ClaimedBy(int64_t entry, int64_t n) {
  const uint64_t j = static_cast<uint64_t>(entry) - static_cast<uint64_t>(kFirstClaim);
  return j < static_cast<uint64_t>(n) ? static_cast<int64_t>(j) : -1;
}

// Phase 1 for sighting j: the slot keys[j] claimed or found claimed, else -1
// (a key already in the table, which only a table whose header does not match
// its slots has here, or a table with no empty slot).
CTR_HD int64_t ClaimSlot(int64_t* pairs, int64_t num_slots, const int64_t* keys, int64_t n, int64_t j) {
  const int64_t key = keys[j];
  const int64_t mask = num_slots - 1;
  int64_t s = HomeSlot(key, num_slots);
  for (int64_t step = 0; step < num_slots;) {
    int64_t* entry = PairAt(pairs, s) + kEntry;
    const int64_t e = LoadCell(entry);
    if (e == kEmptyEntry) {
      if (CompareAndSwapCell(entry, kEmptyEntry, ClaimCode(j))) return s;
      continue;  // claimed meanwhile (entries never go back to empty here): read whose it is
    }
    const int64_t by = ClaimedBy(e, n);
    if (by < 0 && PairAt(pairs, s)[kKey] == key) return -1;
    if (by >= 0 && keys[by] == key) {
      MinCell(entry, ClaimCode(j));
      return s;
    }
    s = (s + 1) & mask;
    ++step;
  }
  return -1;
}

// Phase 2: whether sighting j, whose key's slot is s, is the key's first;
// the first writes the key and starts its stats as PlaceKey does.
CTR_HD bool TakeFirstSighting(const Slots& t, int64_t s, const int64_t* keys, int64_t j, int64_t clock) {
  if (s < 0 || PairAt(t.pairs, s)[kEntry] != ClaimCode(j)) return false;
  PairAt(t.pairs, s)[kKey] = keys[j];
  StatsAt(t, s)[kLastSeen] = clock;
  StatsAt(t, s)[kCount] = 0;
  return true;
}

// The row the serial insert gives the rank-th new key of a call: the free
// stack's top first, then the next never-used rows. h is the header as the
// call found it.
CTR_HD int64_t RowOfRank(const TableView& t, int64_t rank) {
  const int64_t* h = t.header;
  return rank < h[kFreeCount] ? t.free_rows[h[kFreeCount] - 1 - rank] : h[kNextRow] + rank - h[kFreeCount];
}

// Phase 4 for a first sighting of rank `rank`: its key's row, recorded in
// reused[rank] when it comes off the free stack (in the order the serial
// insert pops them).
CTR_HD void GiveRow(const TableView& t, int64_t s, int64_t rank, int64_t* reused) {
  const int64_t row = RowOfRank(t, rank);
  PairAt(t.slots.pairs, s)[kEntry] = row;
  if (rank < t.header[kFreeCount]) reused[rank] = row;
}

// Phase 4 for every sighting: the use count PlaceKey's StampSlot keeps.
CTR_HD void CountSighting(const Slots& t, int64_t s) {
  if (s >= 0) AddToCell(StatsAt(t, s) + kCount, 1);
}

// Phase 5: the row of a sighting whose key's slot is s (kNoRow for none; a
// claim no first sighting took, on a corrupt table, reads as none too).
CTR_HD int64_t RowOfClaimedSlot(const Slots& t, int64_t s) {
  return s >= 0 ? RowOfEntry(PairAt(t.pairs, s)[kEntry]) : kNoRow;
}

// Phase 5, once: the header after `added` new keys got a slot and a row;
// returns how many rows came off the free stack.
CTR_HD int64_t FinishParallelInsert(int64_t* h, int64_t added) {
  const int64_t reused = added < h[kFreeCount] ? added : h[kFreeCount];
  h[kFreeCount] -= reused;
  h[kNextRow] += added - reused;
  h[kOccupied] += added;
  return reused;
}

}  // namespace ctr

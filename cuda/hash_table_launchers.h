// Host-side entry points of the CUDA hash-table find and insert. Plain C++
// (no CUDA or TF headers), on raw device pointers and a cudaStream_t passed
// as void*; asynchronous on `stream` unless said otherwise; each returns an empty string on
// success, else a CUDA error message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "cc/core/hash_table.h"

namespace ctr {
namespace gpu {

// rows[i] = the row of keys[i] in a table laid out as cc/core/hash_table.h
// says, or -1: `slot_rows` points at the table's first slot row (the pairs),
// num_slots its slot count (a power of two). Read only: a table being
// inserted into must not be found in at the same time.
std::string HashTableFind(const int64_t* slot_rows, int64_t num_slots, const int64_t* keys, int64_t n,
                          bool dense_padding, int64_t* rows, void* stream);

// An inserting find on a whole table at `table` (its header first) of
// num_slots slots: the clock advances as InsertingClock says, found keys are
// stamped, and the missing ones get rows in order of first appearance, in
// parallel where hash_table_parallel.h allows it, else one at a time in key
// order, so rows, reused rows, header, free stack and each key's stats come
// out as the CPU's CtrHashTableFind leaves them (the slots a key sits in may
// differ). A call that may have to evict (rules.eviction set and no
// RoomForAll) inserts nothing on the device: it sets kOnHost and leaves the
// inserts to FinishFindOrInsert. reused [n] receives the rows taken off the
// free stack (their values are evicted keys'), status
// int64[kHashTableStatusCells] the cells of HashTableInsertStatus. `scratch`
// holds HashTableInsertScratchBytes(n) bytes of device memory. Keys must not
// be found or inserted by another call at the same time. Asynchronous.
enum HashTableInsertStatus : int {
  kReusedCount = 0,  // rows taken off the free stack, written to reused[]
  kBadHeader = 1,    // 1: the header, a free row the call could take, or a slot the find met does not fit the
                     // table (TableFault); nothing was inserted
  kMissing = 2,      // sightings the find left without a row (padding aside)
  kParallel = 3,     // 1: the missing keys were inserted in parallel
  kOnHost = 4,       // 1: the call may evict; its inserts are FinishFindOrInsert's, on the host
  kHashTableStatusCells = 5,
};
size_t HashTableInsertScratchBytes(int64_t n);
std::string HashTableFindOrInsert(int64_t* table, int64_t num_slots, const InsertRules& rules, bool new_step,
                                  const int64_t* keys, int64_t n, int64_t* rows, int64_t* reused, int64_t* status,
                                  void* scratch, size_t scratch_bytes, void* stream);

// What an inserting find did, once FinishFindOrInsert has read it back.
struct InsertOutcome {
  bool bad_header = false;   // nothing was inserted (kBadHeader)
  int64_t reused_count = 0;  // rows taken off the free stack, in reused[0, reused_count)
  bool on_host = false;      // the inserts ran on the host, evicting
  std::string corrupt;       // where an eviction found the table corrupt (as the CPU kernel reports it)
};

// Waits for the HashTableFindOrInsert queued on `stream` with the same
// arguments and reads its status back. Where it set kOnHost, runs the CPU
// kernel's inserter (cc/core/hash_table_cpu.h: eviction scans and sorts the
// whole table, which a GPU does no faster for the few calls that evict) on
// host copies of the table, keys and rows, and copies the table, rows and
// reused rows back: the result is the CPU kernel's, at the cost of the
// table's bytes crossing to the host and back. Synchronous.
std::string FinishFindOrInsert(int64_t* table, int64_t num_slots, const InsertRules& rules, const int64_t* keys,
                               int64_t n, int64_t* rows, int64_t* reused, const int64_t* status,
                               InsertOutcome* outcome, void* stream);

}  // namespace gpu
}  // namespace ctr

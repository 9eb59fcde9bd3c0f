// Host-side entry points of the CUDA hash-table find and insert. Plain C++
// (no CUDA or TF headers), on raw device pointers and a cudaStream_t passed
// as void*; asynchronous on `stream`; each returns an empty string on
// success, else a CUDA error message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ctr {
namespace gpu {

// rows[i] = the row of keys[i] in a table laid out as cc/core/hash_table.h
// says, or -1: `slot_rows` points at the table's first slot row (the pairs),
// num_slots its slot count (a power of two). Read only: a table being
// inserted into must not be found in at the same time.
std::string HashTableFind(const int64_t* slot_rows, int64_t num_slots, const int64_t* keys, int64_t n,
                          bool dense_padding, int64_t* rows, void* stream);

// An inserting find with no eviction (admission allowed) on a whole table
// at `table` (its header first) of num_slots slots and `capacity` rows: the
// clock advances as InsertingClock says, found keys are stamped, and the
// missing ones get rows in order of first appearance, in parallel where
// hash_table_parallel.h allows it, else one at a time in key order, so rows,
// reused rows, header, free stack and each key's stats come out as the
// CPU's CtrHashTableFind leaves them (the slots a key sits in may differ).
// reused [n] receives the rows taken off the free stack (their values are
// evicted keys'), status int64[kHashTableStatusCells] the cells of
// HashTableInsertStatus. `scratch` holds HashTableInsertScratchBytes(n)
// bytes of device memory. Keys must not be found or inserted by another call
// at the same time.
enum HashTableInsertStatus : int {
  kReusedCount = 0,  // rows taken off the free stack, written to reused[]
  kBadHeader = 1,    // 1: the header, or a free row the call could take, does not fit the table; nothing was inserted
  kMissing = 2,      // sightings the find left without a row (padding aside)
  kParallel = 3,     // 1: the missing keys were inserted in parallel
  kHashTableStatusCells = 4,
};
size_t HashTableInsertScratchBytes(int64_t n);
std::string HashTableFindOrInsert(int64_t* table, int64_t num_slots, int64_t capacity, int64_t admit_after,
                                  bool new_step, const int64_t* keys, int64_t n, bool dense_padding, int64_t* rows,
                                  int64_t* reused, int64_t* status, void* scratch, size_t scratch_bytes,
                                  void* stream);

}  // namespace gpu
}  // namespace ctr

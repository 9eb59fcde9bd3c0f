// Host-side entry point of the CUDA hash-table find. Plain C++ (no CUDA or TF
// headers), on raw device pointers and a cudaStream_t passed as void*;
// asynchronous on `stream`; returns an empty string on success, else a CUDA
// error message.
#pragma once

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

}  // namespace gpu
}  // namespace ctr

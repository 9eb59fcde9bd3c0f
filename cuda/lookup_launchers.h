// Host-side entry points of the CUDA lookup kernels. Plain C++ (no CUDA or TF
// headers): the TF GPU OpKernels and the pybind core both call these with raw
// device pointers and a cudaStream_t passed as void*.
//
// Every launcher is asynchronous on `stream` unless its comment says it
// synchronizes. Launchers return an empty string on success, else a CUDA
// error message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "cc/core/lookup.h"

namespace ctr {
namespace gpu {

// Converts sorted row ids [nnz] to CSR offsets [num_rows + 1] on the device.
// Rows that are out of range or unsorted set *d_status (device int64[2]) to
// {entry index, row id}; the caller reads it with ReadStatus.
template <typename TSeg>
std::string RowIdsToOffsets(const TSeg* row_ids, int64_t nnz, int64_t num_rows,
                            int64_t* offsets, int64_t* d_status, void* stream);

// Copies int32/int64 row_splits into int64 offsets, flagging invalid splits
// (non-monotone, wrong first or last value) in *d_status as above.
template <typename TSeg>
std::string SplitsToOffsets(const TSeg* splits, int64_t num_splits, int64_t nnz,
                            int64_t* offsets, int64_t* d_status, void* stream);

// Forward pooled lookup: out[num_rows, spec.dim] from nnz keys. A bad key
// sets *d_status (device int64[2], must be initialised by InitStatus) to
// {bag row, key} of the lowest bad row. nnz only chooses the kernel layout
// (the offsets bound every read).
template <typename T, typename TKey>
std::string EmbeddingLookup(const LookupSpec& spec, const T* params,
                            const TKey* keys, const float* weights,
                            const int64_t* offsets, int64_t num_rows, int64_t nnz, T* out,
                            int64_t* d_status, void* stream);

// Gradient, in three steps because the number of gradient rows depends on the
// data: GradRowCounts writes counts[num_rows] ; ExclusiveScan turns them into
// grad_offsets[num_rows + 1] (total at the end) ; LookupGrad fills the rows.
// GradRowCounts records the first key the forward pass would reject in
// d_status as EmbeddingLookup does ({row, key}; InitStatus first); LookupGrad
// leaves such keys out.
template <typename TKey>
std::string GradRowCounts(const LookupSpec& spec, const TKey* keys,
                          const float* weights, const int64_t* offsets,
                          int64_t num_rows, int64_t* counts, int64_t* d_status, void* stream);

// Scratch bytes ExclusiveScan needs for n elements.
size_t ExclusiveScanTempBytes(int64_t n);
// out[0] = 0, out[i] = sum(in[0:i]) for i in 1..n (out has n + 1 elements).
std::string ExclusiveScan(const int64_t* in, int64_t n, int64_t* out,
                          void* temp, size_t temp_bytes, void* stream);

template <typename T, typename TKey>
std::string LookupGrad(const LookupSpec& spec, const T* params,
                       const TKey* keys, const float* weights,
                       const int64_t* offsets, const T* grad_out,
                       const int64_t* grad_offsets, int64_t num_rows,
                       T* grad_values, int64_t* grad_indices,
                       float* grad_weights /* nullable */, void* stream);

// Sets d_status to {-1, 0}.
std::string InitStatus(int64_t* d_status, void* stream);
// Copies n int64 values device->host and synchronizes the stream.
std::string ReadInt64(const int64_t* d_src, int64_t n, int64_t* h_dst, void* stream);

}  // namespace gpu
}  // namespace ctr

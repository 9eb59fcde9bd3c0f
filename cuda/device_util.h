// Small device utilities the GPU OpKernels need beside the kernels proper.
// Plain C++ declarations; cudaStream_t passed as void*.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ctr {
namespace gpu {

// Reads the last of n row ids as int64 (synchronizes): the inferred bag count
// of a SparseTensor lookup is last row id + 1. d_scratch: one int64 of device
// memory the caller allocated (a TF op through its allocator, not
// cudaMallocAsync, which a device without memory pools refuses).
template <typename TSeg>
std::string ReadLastAsInt64(const TSeg* d_values, int64_t n, int64_t* d_scratch, int64_t* h_out, void* stream);

// Copies bytes device->host and synchronizes (error messages, small reads).
std::string CopyToHost(const void* d_src, void* h_dst, size_t bytes, void* stream);

// Queues a device->host copy and returns at once: h_dst must be pinned host
// memory that outlives the copy (an op reads it once the stream is past it).
std::string CopyToHostAsync(const void* d_src, void* h_dst, size_t bytes, void* stream);

std::string ZeroFill(void* d_ptr, size_t bytes, void* stream);

std::string CopyDeviceToDevice(const void* d_src, void* d_dst, size_t bytes, void* stream);

// Copies `rows` rows of row_bytes each, src_pitch and dst_pitch bytes apart
// (device to device): a matrix into its columns of a wider one.
std::string CopyRows2D(const void* d_src, size_t src_pitch, void* d_dst, size_t dst_pitch, size_t row_bytes,
                       size_t rows, void* stream);

// 1 + the index of the last non-zero of n counts (0 when all are zero);
// synchronizes to return it. d_scratch: one int64 of device memory, as above.
std::string CountThroughLastNonZero(const int64_t* d_counts, int64_t n, int64_t* d_scratch, int64_t* h_out,
                                    void* stream);

// Flags in d_status[0..1] = {index, value} the first string split that is
// negative, decreasing or past num_bytes ({-1, 0} when all are valid).
// d_status needs 3 int64: the third is scratch.
std::string ValidateStringSplits(const int64_t* d_splits, int64_t n, int64_t num_bytes,
                                 int64_t* d_status, void* stream);

// d_out[i] = d_splits[i] (i < n) where ValidateStringSplits left d_status[0]
// at -1, else 0 (every string empty): the kernels queued behind it, before
// anyone has read the status back, never read outside the packed bytes.
std::string GateStringSplits(const int64_t* d_splits, int64_t n, const int64_t* d_status, int64_t* d_out,
                             void* stream);

}  // namespace gpu
}  // namespace ctr

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/device_util.h"

namespace ctr {
namespace gpu {
namespace {

std::string Check(cudaError_t e) { return e == cudaSuccess ? "" : cudaGetErrorString(e); }

__global__ void LastAsInt64Kernel(const int32_t* v, int64_t n, int64_t* out) { *out = v[n - 1]; }

// Each thread checks one boundary; atomicMin keeps the lowest bad index so
// the reported error does not depend on scheduling.
__global__ void ValidateSplitsKernel(const int64_t* s, int64_t n, int64_t num_bytes,
                                     unsigned long long* first_bad) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const bool bad = s[i] < 0 || s[i] > num_bytes || (i > 0 && s[i] < s[i - 1]);
  if (bad) atomicMin(first_bad, static_cast<unsigned long long>(i));
}

__global__ void FinishValidateKernel(const int64_t* s, const unsigned long long* first_bad,
                                     int64_t* status) {
  if (*first_bad == ~0ull) {
    status[0] = -1;
    status[1] = 0;
  } else {
    status[0] = static_cast<int64_t>(*first_bad);
    status[1] = s[*first_bad];
  }
}

__global__ void GateSplitsKernel(const int64_t* s, int64_t n, const int64_t* status, int64_t* out) {
  const bool valid = status[0] < 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = valid ? s[i] : 0;
}

__global__ void LastNonZeroKernel(const int64_t* counts, int64_t n, unsigned long long* through) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n && counts[i] != 0) atomicMax(through, static_cast<unsigned long long>(i + 1));
}

}  // namespace

template <>
std::string ReadLastAsInt64<int64_t>(const int64_t* d, int64_t n, int64_t*, int64_t* h_out, void* stream) {
  auto st = static_cast<cudaStream_t>(stream);
  std::string err = Check(cudaMemcpyAsync(h_out, d + n - 1, sizeof(int64_t), cudaMemcpyDeviceToHost, st));
  return err.empty() ? Check(cudaStreamSynchronize(st)) : err;
}

template <>
std::string ReadLastAsInt64<int32_t>(const int32_t* d, int64_t n, int64_t* d_scratch, int64_t* h_out,
                                    void* stream) {
  auto st = static_cast<cudaStream_t>(stream);
  LastAsInt64Kernel<<<1, 1, 0, st>>>(d, n, d_scratch);
  std::string err = Check(cudaGetLastError());
  if (err.empty()) err = Check(cudaMemcpyAsync(h_out, d_scratch, sizeof(int64_t), cudaMemcpyDeviceToHost, st));
  return err.empty() ? Check(cudaStreamSynchronize(st)) : err;
}

std::string CopyToHost(const void* d_src, void* h_dst, size_t bytes, void* stream) {
  if (bytes == 0) return "";
  auto st = static_cast<cudaStream_t>(stream);
  std::string err = Check(cudaMemcpyAsync(h_dst, d_src, bytes, cudaMemcpyDeviceToHost, st));
  return err.empty() ? Check(cudaStreamSynchronize(st)) : err;
}

std::string CopyToHostAsync(const void* d_src, void* h_dst, size_t bytes, void* stream) {
  if (bytes == 0) return "";
  return Check(cudaMemcpyAsync(h_dst, d_src, bytes, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(stream)));
}

std::string CopyDeviceToDevice(const void* d_src, void* d_dst, size_t bytes, void* stream) {
  if (bytes == 0) return "";
  return Check(cudaMemcpyAsync(d_dst, d_src, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream)));
}

std::string CopyRows2D(const void* d_src, size_t src_pitch, void* d_dst, size_t dst_pitch, size_t row_bytes,
                       size_t rows, void* stream) {
  if (rows == 0 || row_bytes == 0) return "";
  return Check(cudaMemcpy2DAsync(d_dst, dst_pitch, d_src, src_pitch, row_bytes, rows, cudaMemcpyDeviceToDevice,
                                 static_cast<cudaStream_t>(stream)));
}

std::string CountThroughLastNonZero(const int64_t* d_counts, int64_t n, int64_t* d_scratch, int64_t* h_out,
                                    void* stream) {
  static_assert(sizeof(unsigned long long) == sizeof(int64_t), "atomicMax's type must fit the scratch");
  auto st = static_cast<cudaStream_t>(stream);
  auto* through = reinterpret_cast<unsigned long long*>(d_scratch);
  std::string err = Check(cudaMemsetAsync(through, 0, sizeof(*through), st));
  if (err.empty() && n > 0) {
    const int threads = 256;
    LastNonZeroKernel<<<static_cast<unsigned>((n + threads - 1) / threads), threads, 0, st>>>(d_counts, n, through);
    err = Check(cudaGetLastError());
  }
  unsigned long long h = 0;
  if (err.empty()) err = Check(cudaMemcpyAsync(&h, through, sizeof(h), cudaMemcpyDeviceToHost, st));
  if (err.empty()) err = Check(cudaStreamSynchronize(st));
  *h_out = static_cast<int64_t>(h);
  return err;
}

std::string ZeroFill(void* d_ptr, size_t bytes, void* stream) {
  if (bytes == 0) return "";
  return Check(cudaMemsetAsync(d_ptr, 0, bytes, static_cast<cudaStream_t>(stream)));
}

std::string ValidateStringSplits(const int64_t* d_splits, int64_t n, int64_t num_bytes,
                                 int64_t* d_status, void* stream) {
  auto st = static_cast<cudaStream_t>(stream);
  // d_status[2] doubles as the atomicMin cell, so no extra allocation is needed.
  auto* first_bad = reinterpret_cast<unsigned long long*>(d_status + 2);
  std::string err = Check(cudaMemsetAsync(first_bad, 0xff, sizeof(unsigned long long), st));
  if (!err.empty()) return err;
  if (n > 0) {
    const int threads = 256;
    const int64_t blocks = (n + threads - 1) / threads;
    ValidateSplitsKernel<<<static_cast<unsigned>(blocks), threads, 0, st>>>(d_splits, n, num_bytes, first_bad);
    err = Check(cudaGetLastError());
    if (!err.empty()) return err;
  }
  FinishValidateKernel<<<1, 1, 0, st>>>(d_splits, first_bad, d_status);
  return Check(cudaGetLastError());
}

std::string GateStringSplits(const int64_t* d_splits, int64_t n, const int64_t* d_status, int64_t* d_out,
                             void* stream) {
  if (n == 0) return "";
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 4096);
  GateSplitsKernel<<<static_cast<unsigned>(blocks), threads, 0, static_cast<cudaStream_t>(stream)>>>(
      d_splits, n, d_status, d_out);
  return Check(cudaGetLastError());
}

}  // namespace gpu
}  // namespace ctr

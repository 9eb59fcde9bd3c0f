// The host side of a launch: the stream as CUDA's type and a CUDA error as
// the launchers' message (empty for success). Included by the .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <string>

namespace ctr {
namespace gpu {

inline cudaStream_t AsStream(void* stream) { return static_cast<cudaStream_t>(stream); }

inline std::string CudaError(const char* what, cudaError_t e) {
  if (e == cudaSuccess) return "";
  return std::string(what) + ": " + cudaGetErrorString(e);
}

inline std::string CheckLaunch(const char* kernel) { return CudaError(kernel, cudaGetLastError()); }

}  // namespace gpu
}  // namespace ctr

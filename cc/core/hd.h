// Host/device portability. Every per-element function in cc/core is compiled
// both by g++ (CPU kernels, the pybind core) and by nvcc (cuda/), so the CPU
// tests exercise exactly the logic the GPU runs.
#pragma once

#if defined(__CUDACC__)
#define CTR_HD __host__ __device__ __forceinline__
#else
#define CTR_HD inline
#endif

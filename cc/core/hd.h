// Host/device portability. Every per-element function in cc/core is compiled
// both by g++ (CPU kernels, the pybind core) and by nvcc (cuda/), so the CPU
// tests exercise exactly the logic the GPU runs. The *_cpu.h headers hold
// the host-only loops built on those rules; cuda/ never includes them.
#pragma once

#if defined(__CUDACC__)
#define CTR_HD __host__ __device__ __forceinline__
#else
#define CTR_HD inline
#endif

// A per-token function on the CPU's hot path: g++ otherwise keeps some out
// of line (called through the PLT of the op library), which cost more than
// their bodies for the short tokens of CTR features. nvcc inlines CTR_HD anyway.
#if defined(__CUDACC__)
#define CTR_HD_HOT CTR_HD
#else
#define CTR_HD_HOT inline __attribute__((always_inline))
#endif
// The rare, long path of a per-token function, kept out of line on the host
// so the short path stays small enough to inline.
#if defined(__CUDACC__)
#define CTR_HD_COLD CTR_HD
#else
#define CTR_HD_COLD inline __attribute__((noinline))
#endif

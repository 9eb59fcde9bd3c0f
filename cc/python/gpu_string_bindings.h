// Python access to the CUDA string-embedding launchers
// (cuda/string_launchers.h) on raw device pointers, for GPU tests and
// framework-free benchmarks. Only built when the package is built with CUDA
// (CTR_WITH_CUDA).
#pragma once

#include <pybind11/pybind11.h>

// Adds gpu_string_embedding, gpu_multi_string_embedding (and its scratch
// size), gpu_string_embedding_grad (and its workspace size) to m.
void RegisterGpuStringBindings(pybind11::module_& m);

// Python access to the CUDA lookup launchers (cuda/lookup_launchers.h) on raw
// device pointers, for GPU tests and framework-free benchmarks. Only built
// when the package is built with CUDA (CTR_WITH_CUDA).
#pragma once

#include <pybind11/pybind11.h>

// Adds gpu_embedding_lookup, gpu_embedding_lookup_grad (and its workspace
// size), gpu_row_ids_to_offsets and gpu_row_splits_to_offsets to m.
void RegisterGpuBindings(pybind11::module_& m);

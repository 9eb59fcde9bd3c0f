// Helpers shared by the GPU bindings of the core module: dtype dispatch,
// pointer checks and launcher errors.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "cc/core/float_types.h"
#include "cuda/lookup_launchers.h"

namespace tf_ctr_py {

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls fn(TypeTag<T>{}) for the table element type named by dtype.
template <typename Fn>
void WithValueType(const std::string& dtype, Fn&& fn) {
  if (dtype == "float32") return fn(TypeTag<float>{});
  if (dtype == "float16") return fn(TypeTag<ctr::Half>{});
  if (dtype == "bfloat16") return fn(TypeTag<ctr::BFloat16>{});
  throw pybind11::value_error("params_dtype must be 'float32', 'float16' or 'bfloat16', got '" + dtype + "'");
}

// Calls fn(TypeTag<T>{}) for the integer type named by dtype (keys, row ids,
// row splits).
template <typename Fn>
void WithIndexType(const std::string& dtype, const char* what, Fn&& fn) {
  if (dtype == "int32") return fn(TypeTag<int32_t>{});
  if (dtype == "int64") return fn(TypeTag<int64_t>{});
  throw pybind11::value_error(std::string(what) + "_dtype must be 'int32' or 'int64', got '" + dtype + "'");
}

// A null pointer where the call has data to touch is a caller bug that would
// otherwise surface as an illegal-address error poisoning the CUDA context.
inline void RequirePointer(uintptr_t ptr, bool needed, const char* name) {
  if (needed && ptr == 0) throw pybind11::value_error(std::string(name) + " must not be 0 here");
}

template <typename T>
T* DevicePtr(uintptr_t ptr) {
  return reinterpret_cast<T*>(ptr);
}

inline void* StreamPtr(uintptr_t stream) { return reinterpret_cast<void*>(stream); }

// Launcher errors are CUDA failures, hence RuntimeError, not ValueError.
inline void Check(const std::string& err) {
  if (!err.empty()) throw std::runtime_error(err);
}

// Where a gradient launch's scratch lives inside the caller's workspace
// buffer (the id and string gradients lay it out alike, per bag).
struct GradWorkspace {
  size_t counts = 0;        // int64[bags]
  size_t status = 0;        // int64[8]: the first rejected key's {row, key}, or token's status
  size_t grad_offsets = 0;  // int64[bags + 1]
  size_t scan = 0;          // CUB scratch
  size_t scan_bytes = 0;
  size_t total = 0;
};

inline GradWorkspace GradWorkspaceFor(int64_t num_bags) {
  // 256-byte alignment: what cudaMalloc gives and CUB expects of its scratch.
  auto align = [](size_t n) { return (n + 255) / 256 * 256; };
  const size_t bags = static_cast<size_t>(num_bags < 0 ? 0 : num_bags);
  GradWorkspace w;
  w.grad_offsets = align(bags * sizeof(int64_t));
  w.status = w.grad_offsets + align((bags + 1) * sizeof(int64_t));
  w.scan = w.status + align(8 * sizeof(int64_t));
  w.scan_bytes = ctr::gpu::ExclusiveScanTempBytes(static_cast<int64_t>(bags));
  w.total = w.scan + align(w.scan_bytes > 0 ? w.scan_bytes : 1);
  return w;
}

}  // namespace tf_ctr_py

// Bridges TF tensors to the framework-free core: element types, errors and
// the CPU thread pool.
#pragma once

#include <functional>
#include <initializer_list>
#include <string>

#include "cc/core/float_types.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_ctr {

// The core type with the same 16/32-bit layout as a TF element type.
template <typename T>
struct CoreType {
  using type = T;
};
template <>
struct CoreType<Eigen::half> {
  using type = ctr::Half;
};
template <>
struct CoreType<Eigen::bfloat16> {
  using type = ctr::BFloat16;
};

template <typename T>
const typename CoreType<T>::type* CorePtr(const tensorflow::Tensor& t) {
  static_assert(sizeof(T) == sizeof(typename CoreType<T>::type), "layout");
  return reinterpret_cast<const typename CoreType<T>::type*>(t.flat<T>().data());
}
template <typename T>
typename CoreType<T>::type* CorePtr(tensorflow::Tensor* t) {
  return reinterpret_cast<typename CoreType<T>::type*>(t->flat<T>().data());
}

// Core functions report problems as a message; empty means success.
inline absl::Status CoreStatus(const std::string& message) {
  return message.empty() ? absl::OkStatus() : tensorflow::errors::InvalidArgument(message);
}

// Allocation with shapes computed from input values (row counts, dims). The
// TensorShape({...}) constructor CHECK-fails, aborting the whole process, on
// a negative size or on more than 2^63 - 1 elements; these build the shape
// with TensorShape::BuildTensorShape first, so such inputs are an
// InvalidArgument, and a shape too large for memory is TF's ResourceExhausted.
inline absl::Status AllocateOutput(tensorflow::OpKernelContext* ctx, int index,
                                   std::initializer_list<int64_t> dims, tensorflow::Tensor** out) {
  tensorflow::TensorShape shape;
  TF_RETURN_IF_ERROR(tensorflow::TensorShape::BuildTensorShape(dims, &shape));
  return ctx->allocate_output(index, shape, out);
}
inline absl::Status AllocateTemp(tensorflow::OpKernelContext* ctx, tensorflow::DataType dtype,
                                 std::initializer_list<int64_t> dims, tensorflow::Tensor* out) {
  tensorflow::TensorShape shape;
  TF_RETURN_IF_ERROR(tensorflow::TensorShape::BuildTensorShape(dims, &shape));
  return ctx->allocate_temp(dtype, shape, out);
}

// A gradient op's incoming grad must have the forward op's output shape.
inline absl::Status CheckGradShape(const tensorflow::Tensor& grad, int64_t rows, int64_t dim) {
  if (grad.dims() == 2 && grad.dim_size(0) == rows && grad.dim_size(1) == dim) return absl::OkStatus();
  return tensorflow::errors::InvalidArgument("grad must have shape [", rows, ", ", dim, "], got ",
                                             grad.shape().DebugString());
}

// ParallelFor's cost per unit from sizes that may be huge with no work
// behind them (a [0, 2^62] table has rows of 2^62 elements): computed in
// double and capped, so the sharding hint never overflows int64.
inline int64_t ShardCost(double cost) {
  constexpr double kMaxCost = 1e12;
  return cost >= kMaxCost ? static_cast<int64_t>(kMaxCost) : cost < 1 ? 1 : static_cast<int64_t>(cost);
}

// Runs fn(begin, end) over [0, n) on TF's intra-op pool.
inline void ParallelFor(tensorflow::OpKernelContext* ctx, int64_t n, int64_t cost_per_unit,
                        const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  ctx->device()->tensorflow_cpu_worker_threads()->workers->ParallelFor(n, cost_per_unit, fn);
}

}  // namespace tf_ctr

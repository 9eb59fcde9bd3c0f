// What every GPU OpKernel needs: TF's CUDA stream as a raw handle for the
// launchers in cuda/, scratch tensors, and launcher messages as Status.
#pragma once

#ifdef CTR_WITH_CUDA

#include <string>

#include "cc/kernels/tf_types.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "xla/stream_executor/stream.h"

namespace tf_ctr {

inline void* GpuStream(tensorflow::OpKernelContext* ctx) {
  return ctx->op_device_context()->stream()->platform_specific_handle().stream;
}

// Launchers return "" or a CUDA error; a CUDA error is Internal, not the
// caller's fault.
inline absl::Status LaunchStatus(const std::string& cuda_error) {
  return cuda_error.empty() ? absl::OkStatus() : tensorflow::errors::Internal("CUDA: ", cuda_error);
}

// int64 device scratch of n elements.
inline absl::Status DeviceScratch(tensorflow::OpKernelContext* ctx, int64_t n, tensorflow::Tensor* t) {
  return AllocateTemp(ctx, tensorflow::DT_INT64, {n}, t);
}

}  // namespace tf_ctr

#endif  // CTR_WITH_CUDA

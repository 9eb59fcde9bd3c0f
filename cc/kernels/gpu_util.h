// What every GPU OpKernel needs: TF's CUDA stream as a raw handle for the
// launchers in cuda/, scratch tensors, and launcher messages as Status.
#pragma once

#ifdef CTR_WITH_CUDA

#include <functional>
#include <string>
#include <utility>

#include "cc/kernels/tf_types.h"
#include "tensorflow/core/common_runtime/device/device_event_mgr.h"
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

// int64 pinned host memory, the target of a device->host copy that a
// ThenExecute callback reads.
inline absl::Status HostScratch(tensorflow::OpKernelContext* ctx, int64_t n, tensorflow::Tensor* t) {
  tensorflow::AllocatorAttributes attr;
  attr.set_on_host(true);
  attr.set_gpu_compatible(true);
  return ctx->allocate_temp(tensorflow::DT_INT64, tensorflow::TensorShape({n}), t, attr);
}

// Runs fn once the op's stream has completed everything queued so far, on
// TF's event-manager thread pool (as TF's own asynchronous GPU kernels do): the
// compute thread never waits, and fn, which calls `done`, never runs inside a
// CUDA host callback, where the ops it wakes could not launch anything.
inline void ThenExecute(tensorflow::OpKernelContext* ctx, std::function<void()> fn) {
  tensorflow::EventMgr* events = ctx->device()->tensorflow_accelerator_device_info()->event_mgr;
  events->ThenExecute(ctx->op_device_context()->stream(), std::move(fn));
}

}  // namespace tf_ctr

#endif  // CTR_WITH_CUDA

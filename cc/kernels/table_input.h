// A fused lookup's table input: a tensor, or a resource variable read in place.
//
// A variable read by ReadVariableOp hands its buffer out by reference. The
// next sparse update (ResourceScatter*, the sparse optimizers) then finds the
// buffer shared and copies the whole table first, and once a variable is in
// copy-on-read mode every such read copies it: training would copy every
// table every step. Like ResourceGather, the kernels here read the variable
// under its shared lock instead, and hold no reference past their Compute,
// so a sparse update that follows copies nothing.
#pragma once

#include <cstring>
#include <optional>

#include "cc/kernels/huge_pages.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/types.h"

namespace tf_ctr {

// Gives `tensor` a buffer of its own when anyone else still references its
// current one (an earlier read of the variable): writes in place, or reads
// that must not see such a reader's later writes, need it. Plain-data tensors.
inline absl::Status UnshareBuffer(tensorflow::OpKernelContext* ctx, tensorflow::Tensor* tensor) {
  if (tensor->RefCountIsOne()) return absl::OkStatus();
  tensorflow::Tensor copy;
  TF_RETURN_IF_ERROR(ctx->allocate_temp(tensor->dtype(), tensor->shape(), &copy));
  if (tensor->TotalBytes() > 0) std::memcpy(copy.data(), tensor->data(), tensor->TotalBytes());
  *tensor = copy;
  return absl::OkStatus();
}

// TF's EnsureSparseVariableAccess for plain-data variables: copy-on-read mode
// lets sparse readers and writers share the buffer under the variable's lock
// (a dense reader gets a copy instead). ResourceGather and the sparse
// optimizers enter it too; entering it copies only a buffer still shared.
inline absl::Status EnterCopyOnReadMode(tensorflow::OpKernelContext* ctx, tensorflow::Var* var) {
  if (var->copy_on_read_mode.load()) return absl::OkStatus();
  tensorflow::mutex_lock lock(*var->mu());
  if (var->copy_on_read_mode.load()) return absl::OkStatus();
  TF_RETURN_IF_ERROR(UnshareBuffer(ctx, var->tensor()));
  var->copy_on_read_mode.store(true);
  return absl::OkStatus();
}

class TableInput {
 public:
  // Binds input `index`: a T tensor, or a handle to a variable of T on the host.
  // `what` names the variable in errors (the hash-table op has two).
  template <typename T>
  absl::Status Bind(tensorflow::OpKernelContext* ctx, int index, const char* what = "the table variable") {
    if (ctx->input_dtype(index) != tensorflow::DT_RESOURCE) {
      tensor_ = &ctx->input(index);
      AdviseHugePages(ctx, *tensor_);
      return absl::OkStatus();
    }
    const tensorflow::ResourceHandle& handle = tensorflow::HandleFromInput(ctx, index);
    const absl::Status found = tensorflow::LookupResource(ctx, handle, &var_);
    if (!found.ok())  // as ReadVariableOp says it
      return tensorflow::errors::FailedPrecondition("could not find ", what, " ", handle.name(),
                                                    ": it was deleted, or (in TF1) is not initialized. ",
                                                    found.message());
    TF_RETURN_IF_ERROR(EnterCopyOnReadMode(ctx, var_.get()));
    lock_.emplace(*var_->mu());
    if (!var_->is_initialized)
      return tensorflow::errors::FailedPrecondition(what, " is not initialized");
    const tensorflow::DataType want = tensorflow::DataTypeToEnum<T>::value;
    if (var_->tensor()->dtype() != want)
      return tensorflow::errors::InvalidArgument(what, " holds ",
                                                 tensorflow::DataTypeString(var_->tensor()->dtype()),
                                                 ", the op was built for ", tensorflow::DataTypeString(want));
    tensor_ = var_->tensor();
    AdviseHugePages(ctx, *tensor_);
    return absl::OkStatus();
  }

  const tensorflow::Tensor& tensor() const { return *tensor_; }

 private:
  const tensorflow::Tensor* tensor_ = nullptr;
  tensorflow::core::RefCountPtr<tensorflow::Var> var_;
  std::optional<tensorflow::tf_shared_lock> lock_;  // declared after var_: released before it
};

}  // namespace tf_ctr

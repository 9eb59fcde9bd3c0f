// GPU kernel of CtrHashTableFind, for a table variable in device memory: the
// launchers of cuda/hash_table_kernels.cu, which probe and insert by the same
// host/device rules (cc/core/hash_table.h) as the CPU kernel, so a table
// trained on either device holds the same rows.
//
// A read-only find is queued and returns: no read-back. An inserting find
// must size its reused_rows output, so it reads its status back
// synchronously, once per call (as the lookup's gradient reads its row
// count). New keys get rows in parallel while the table has room for them,
// else one at a time (cuda/hash_table_kernels.cu says how each is chosen on
// the device). A call that may have to evict runs its inserts on the host,
// by the CPU kernel's inserter, on a copy of the table (FinishFindOrInsert):
// eviction scans and sorts the whole table, once per capacity/16 new keys.
// int32 keys are cast to int64 by the Python wrapper; only int64 keys have a
// GPU kernel.
#ifdef CTR_WITH_CUDA

#include <algorithm>
#include <string>

#include "cc/core/hash_table.h"
#include "cc/kernels/gpu_util.h"
#include "cc/kernels/hash_table_tensor.h"
#include "cc/kernels/table_input.h"
#include "cc/kernels/tf_types.h"
#include "cuda/device_util.h"
#include "cuda/hash_table_launchers.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"

namespace tf_ctr {

using tensorflow::OpKernelContext;
using tensorflow::Tensor;

namespace {

// UnshareBuffer's device copy: an insert writes the table in place, which
// must not change what an earlier read of the variable still holds.
absl::Status UnshareDeviceBuffer(OpKernelContext* ctx, Tensor* tensor, void* stream) {
  if (tensor->RefCountIsOne()) return absl::OkStatus();
  Tensor copy;
  TF_RETURN_IF_ERROR(ctx->allocate_temp(tensor->dtype(), tensor->shape(), &copy));
  if (tensor->TotalBytes() > 0)
    TF_RETURN_IF_ERROR(LaunchStatus(ctr::gpu::CopyDeviceToDevice(tensor->data(), copy.data(), tensor->TotalBytes(),
                                                                 stream)));
  *tensor = copy;
  return absl::OkStatus();
}

}  // namespace

class HashTableFindGpuOp : public tensorflow::OpKernel {
 public:
  explicit HashTableFindGpuOp(tensorflow::OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, ReadFindAttrs(c, &attrs_));
  }

  void Compute(OpKernelContext* ctx) override {
    tensorflow::core::RefCountPtr<tensorflow::Var> var;
    OP_REQUIRES_OK(ctx, tensorflow::LookupResource(ctx, tensorflow::HandleFromInput(ctx, 0), &var));
    const Tensor& keys = ctx->input(1);
    const int64_t n = keys.NumElements();
    Tensor* rows = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, keys.shape(), &rows));
    void* stream = GpuStream(ctx);
    const ctr::InsertRules& rules = attrs_.rules;
    if (!attrs_.insert) {
      tensorflow::tf_shared_lock lock(*var->mu());
      int64_t num_slots = 0;
      OP_REQUIRES_OK(ctx, HashTableSlots(*var->tensor(), rules.capacity, &num_slots));
      const int64_t* slot_rows = var->tensor()->flat<int64_t>().data() + ctr::kColumns * ctr::kHeaderRows;
      OP_REQUIRES_OK(ctx, LaunchStatus(ctr::gpu::HashTableFind(slot_rows, num_slots, keys.flat<int64_t>().data(), n,
                                                               rules.dense_padding, rows->flat<int64_t>().data(),
                                                               stream)));
      Tensor* reused = nullptr;
      OP_REQUIRES_OK(ctx, AllocateOutput(ctx, 1, {0}, &reused));
      return;
    }
    tensorflow::mutex_lock lock(*var->mu());
    OP_REQUIRES_OK(ctx, UnshareDeviceBuffer(ctx, var->tensor(), stream));
    int64_t num_slots = 0;
    OP_REQUIRES_OK(ctx, HashTableSlots(*var->tensor(), rules.capacity, &num_slots));
    Tensor reused_all, status, scratch;
    OP_REQUIRES_OK(ctx, DeviceScratch(ctx, std::max<int64_t>(n, 1), &reused_all));
    OP_REQUIRES_OK(ctx, DeviceScratch(ctx, ctr::gpu::kHashTableStatusCells, &status));
    const size_t scratch_bytes = ctr::gpu::HashTableInsertScratchBytes(n);
    OP_REQUIRES_OK(ctx, AllocateTemp(ctx, tensorflow::DT_INT8, {static_cast<int64_t>(scratch_bytes)}, &scratch));
    int64_t* st = status.flat<int64_t>().data();
    int64_t* table = var->tensor()->flat<int64_t>().data();
    const int64_t* key_data = keys.flat<int64_t>().data();
    int64_t* row_data = rows->flat<int64_t>().data();
    int64_t* reused_data = reused_all.flat<int64_t>().data();
    OP_REQUIRES_OK(ctx, LaunchStatus(ctr::gpu::HashTableFindOrInsert(
                            table, num_slots, rules, attrs_.new_step, key_data, n, row_data, reused_data, st,
                            scratch.flat<int8_t>().data(), scratch_bytes, stream)));
    ctr::gpu::InsertOutcome outcome;
    OP_REQUIRES_OK(ctx, LaunchStatus(ctr::gpu::FinishFindOrInsert(table, num_slots, rules, key_data, n, row_data,
                                                                  reused_data, st, &outcome, stream)));
    OP_REQUIRES(ctx, !outcome.bad_header,
                tensorflow::errors::InvalidArgument("corrupt hash table header, free stack or slots (capacity ",
                                                    rules.capacity, ", ", num_slots, " slots): the table variable "
                                                    "was assigned something else; nothing was inserted"));
    OP_REQUIRES_OK(ctx, CoreStatus(outcome.corrupt));
    const int64_t reused_count = outcome.reused_count;
    Tensor* reused = nullptr;
    OP_REQUIRES_OK(ctx, AllocateOutput(ctx, 1, {reused_count}, &reused));
    if (reused_count > 0)
      OP_REQUIRES_OK(ctx, LaunchStatus(ctr::gpu::CopyDeviceToDevice(reused_all.flat<int64_t>().data(),
                                                                    reused->flat<int64_t>().data(),
                                                                    reused_count * sizeof(int64_t), stream)));
  }

 private:
  FindAttrs attrs_;
};

REGISTER_KERNEL_BUILDER(Name("CtrHashTableFind").Device(tensorflow::DEVICE_GPU).TypeConstraint<int64_t>("Tkey"),
                        HashTableFindGpuOp);

}  // namespace tf_ctr

#endif  // CTR_WITH_CUDA

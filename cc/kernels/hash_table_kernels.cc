// CPU kernel of CtrHashTableFind: the loops of cc/core/hash_table_cpu.h on
// the table variable. Reads take its lock shared and probe in parallel;
// inserts take it exclusively (copying the buffer first if an earlier read
// still holds it), find every key in parallel, then give rows to the missing
// ones in key order, so that rows are assigned in order of first appearance
// whatever the thread count.
#include <algorithm>
#include <string>
#include <vector>

#include "cc/core/hash_table_cpu.h"
#include "cc/kernels/table_input.h"
#include "cc/kernels/tf_types.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"

namespace tf_ctr {

using tensorflow::OpKernelContext;
using tensorflow::Tensor;

namespace {

constexpr int64_t kProbeCost = 40;

absl::Status ViewTable(Tensor* table, int64_t capacity, ctr::TableView* view) {
  if (table->dtype() != tensorflow::DT_INT64 || table->dims() != 2) {
    return tensorflow::errors::InvalidArgument("table must be a 2-D int64 variable (tf_ctr_ops.HashTable builds "
                                               "it), got ", tensorflow::DataTypeString(table->dtype()), " ",
                                               table->shape().DebugString());
  }
  return CoreStatus(ctr::ViewTable(table->flat<int64_t>().data(), table->dim_size(0), table->dim_size(1), capacity,
                                   view));
}

}  // namespace

template <typename Key>
class HashTableFindOp : public tensorflow::OpKernel {
 public:
  explicit HashTableFindOp(tensorflow::OpKernelConstruction* c) : OpKernel(c) {
    std::string eviction;
    OP_REQUIRES_OK(c, c->GetAttr("capacity", &rules_.capacity));
    OP_REQUIRES_OK(c, c->GetAttr("admit_after", &rules_.admit_after));
    OP_REQUIRES_OK(c, c->GetAttr("dense_padding", &rules_.dense_padding));
    OP_REQUIRES_OK(c, c->GetAttr("eviction", &eviction));
    OP_REQUIRES_OK(c, c->GetAttr("insert", &insert_));
    rules_.eviction = ctr::ParseEviction(eviction);
  }

  void Compute(OpKernelContext* ctx) override {
    tensorflow::core::RefCountPtr<tensorflow::Var> var;
    OP_REQUIRES_OK(ctx, tensorflow::LookupResource(ctx, tensorflow::HandleFromInput(ctx, 0), &var));
    const Tensor& keys = ctx->input(1);
    Tensor* rows = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, keys.shape(), &rows));
    const int64_t n = keys.NumElements();
    const Key* key_data = keys.flat<Key>().data();
    int64_t* row_data = rows->flat<int64_t>().data();
    auto parallel_for = [ctx](int64_t count, const std::function<void(int64_t, int64_t)>& fn) {
      ParallelFor(ctx, count, kProbeCost, fn);
    };
    ctr::TableView table;
    if (!insert_) {
      tensorflow::tf_shared_lock lock(*var->mu());
      OP_REQUIRES_OK(ctx, ViewTable(var->tensor(), rules_.capacity, &table));
      ctr::FindRows(table, key_data, n, rules_.dense_padding, /*clock=*/0, row_data, parallel_for);
      OP_REQUIRES_OK(ctx, OutputReused(ctx, {}));
      return;
    }
    tensorflow::mutex_lock lock(*var->mu());
    // Writes in place would change the tensors earlier reads still hold.
    OP_REQUIRES_OK(ctx, UnshareBuffer(ctx, var->tensor()));
    OP_REQUIRES_OK(ctx, ViewTable(var->tensor(), rules_.capacity, &table));
    const int64_t clock = ++table.header[ctr::kClock];
    ctr::FindRows(table, key_data, n, rules_.dense_padding, clock, row_data, parallel_for);
    ctr::Inserter inserter(table, rules_);
    inserter.InsertMissing(key_data, n, row_data);
    OP_REQUIRES_OK(ctx, OutputReused(ctx, inserter.reused_rows()));
  }

 private:
  static absl::Status OutputReused(OpKernelContext* ctx, const std::vector<int64_t>& reused) {
    Tensor* out = nullptr;
    TF_RETURN_IF_ERROR(AllocateOutput(ctx, 1, {static_cast<int64_t>(reused.size())}, &out));
    std::copy(reused.begin(), reused.end(), out->flat<int64_t>().data());
    return absl::OkStatus();
  }

  ctr::InsertRules rules_{};
  bool insert_ = false;
};

#define CTR_REGISTER_HASH_TABLE_FIND(Key)                                                         \
  REGISTER_KERNEL_BUILDER(                                                                        \
      Name("CtrHashTableFind").Device(tensorflow::DEVICE_CPU).TypeConstraint<Key>("Tkey"), \
      HashTableFindOp<Key>)
CTR_REGISTER_HASH_TABLE_FIND(int32_t);
CTR_REGISTER_HASH_TABLE_FIND(int64_t);
#undef CTR_REGISTER_HASH_TABLE_FIND

}  // namespace tf_ctr

// CPU kernel of CtrHashTableFind: the loops of cc/core/hash_table_cpu.h on
// the table variable. Reads take its lock shared and probe in parallel;
// inserts take it exclusively (copying the buffer first if an earlier read
// still holds it), find every key in parallel, then give rows to the missing
// ones: in parallel while the table has room for all of them, else one at a
// time in key order (hash_table_parallel.h). Either way rows are assigned in
// order of first appearance whatever the thread count.
//
// CtrHashTableEmbedding reads both the table and the values under their
// shared locks (the table's first: an inserting find, which takes it
// exclusively, never waits on the values' lock while holding it) and pools
// bags in parallel, each range probing its keys and loading their rows in
// one pipelined pass.
#include <algorithm>
#include <string>
#include <vector>

#include "cc/core/hash_table_cpu.h"
#include "cc/core/lowest_row_error.h"
#include "cc/kernels/hash_table_tensor.h"
#include "cc/kernels/huge_pages.h"
#include "cc/kernels/lookup_common.h"
#include "cc/kernels/pool_cpu.h"
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

absl::Status ViewTable(OpKernelContext* ctx, Tensor* table, int64_t capacity, ctr::TableView* view) {
  int64_t num_slots = 0;
  TF_RETURN_IF_ERROR(HashTableSlots(*table, capacity, &num_slots));
  AdviseHugePages(ctx, *table);
  return CoreStatus(ctr::ViewTable(table->flat<int64_t>().data(), table->dim_size(0), table->dim_size(1), capacity,
                                   view));
}

// Finds the table variable of input 0, as CtrHashTableFind's kernel does.
absl::Status LookupTable(OpKernelContext* ctx, tensorflow::core::RefCountPtr<tensorflow::Var>* var) {
  return tensorflow::LookupResource(ctx, tensorflow::HandleFromInput(ctx, 0), var);
}

// The values must be another variable than the table: binding them takes
// their lock exclusively (copy-on-read mode) while the table's is held shared,
// which on one variable would wait forever.
absl::Status CheckTwoVariables(OpKernelContext* ctx, const tensorflow::Var* table) {
  tensorflow::core::RefCountPtr<tensorflow::Var> values;
  TF_RETURN_IF_ERROR(tensorflow::LookupResource(ctx, tensorflow::HandleFromInput(ctx, 1), &values));
  if (values.get() != table) return absl::OkStatus();
  return tensorflow::errors::InvalidArgument("table and values are one variable (", tensorflow::HandleFromInput(ctx, 0).name(),
                                             "): the values must be the table's own value matrix");
}

}  // namespace

template <typename Key>
class HashTableFindOp : public tensorflow::OpKernel {
 public:
  explicit HashTableFindOp(tensorflow::OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, ReadFindAttrs(c, &attrs_));
  }

  void Compute(OpKernelContext* ctx) override {
    tensorflow::core::RefCountPtr<tensorflow::Var> var;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, &var));
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
    if (!attrs_.insert) {
      tensorflow::tf_shared_lock lock(*var->mu());
      OP_REQUIRES_OK(ctx, ViewTable(ctx, var->tensor(), attrs_.rules.capacity, &table));
      ctr::TableFault fault;
      ctr::FindRows(table, attrs_.rules.capacity, key_data, n, attrs_.rules.dense_padding, /*clock=*/0, row_data,
                    &fault, parallel_for);
      OP_REQUIRES_OK(ctx, CoreStatus(fault.Describe(attrs_.rules.capacity, table.slots.num_slots)));
      OP_REQUIRES_OK(ctx, OutputReused(ctx, {}));
      return;
    }
    tensorflow::mutex_lock lock(*var->mu());
    // Writes in place would change the tensors earlier reads still hold.
    OP_REQUIRES_OK(ctx, UnshareBuffer(ctx, var->tensor()));
    OP_REQUIRES_OK(ctx, ViewTable(ctx, var->tensor(), attrs_.rules.capacity, &table));
    const int64_t clock = ctr::InsertingClock(table.header, attrs_.new_step);
    ctr::TableFault fault;
    ctr::FindRows(table, attrs_.rules.capacity, key_data, n, attrs_.rules.dense_padding, clock, row_data, &fault,
                  parallel_for);
    OP_REQUIRES_OK(ctx, CoreStatus(fault.Describe(attrs_.rules.capacity, table.slots.num_slots)));
    const bool parallel =
        ctx->device()->tensorflow_cpu_worker_threads()->num_threads >= ctr::kMinThreadsForParallelInsert;
    std::string corrupt;
    const std::vector<int64_t> reused =
        ctr::InsertMissing(table, attrs_.rules, key_data, n, row_data, parallel, parallel_for, &corrupt);
    OP_REQUIRES_OK(ctx, CoreStatus(corrupt));
    OP_REQUIRES_OK(ctx, OutputReused(ctx, reused));
  }

 private:
  static absl::Status OutputReused(OpKernelContext* ctx, const std::vector<int64_t>& reused) {
    Tensor* out = nullptr;
    TF_RETURN_IF_ERROR(AllocateOutput(ctx, 1, {static_cast<int64_t>(reused.size())}, &out));
    std::copy(reused.begin(), reused.end(), out->flat<int64_t>().data());
    return absl::OkStatus();
  }

  FindAttrs attrs_;
};

#define CTR_REGISTER_HASH_TABLE_FIND(Key)                                                         \
  REGISTER_KERNEL_BUILDER(                                                                        \
      Name("CtrHashTableFind").Device(tensorflow::DEVICE_CPU).TypeConstraint<Key>("Tkey"), \
      HashTableFindOp<Key>)
CTR_REGISTER_HASH_TABLE_FIND(int32_t);
CTR_REGISTER_HASH_TABLE_FIND(int64_t);
#undef CTR_REGISTER_HASH_TABLE_FIND

template <typename T, typename Key, typename TSeg>
class HashTableEmbeddingOp : public tensorflow::OpKernel {
 public:
  explicit HashTableEmbeddingOp(tensorflow::OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("capacity", &capacity_));
    OP_REQUIRES_OK(c, c->GetAttr("dense_padding", &dense_padding_));
    OP_REQUIRES_OK(c, ReadPoolingAttrs(c, &attrs_.spec));
    OP_REQUIRES_OK(c, ReadBagAttrs(c, &attrs_));
    OP_REQUIRES_OK(c, c->GetAttr("prune_weights", &attrs_.spec.prune_weights));
  }

  void Compute(OpKernelContext* ctx) override {
    tensorflow::core::RefCountPtr<tensorflow::Var> var;
    OP_REQUIRES_OK(ctx, LookupTable(ctx, &var));
    OP_REQUIRES_OK(ctx, CheckTwoVariables(ctx, var.get()));
    tensorflow::tf_shared_lock table_lock(*var->mu());
    ctr::TableView table;
    OP_REQUIRES_OK(ctx, ViewTable(ctx, var->tensor(), capacity_, &table));
    TableInput values;
    OP_REQUIRES_OK(ctx, values.Bind<T>(ctx, 1, "the values variable"));
    LookupAttrs a = attrs_;
    LookupInputs in;
    OP_REQUIRES_OK(ctx, ValidateBagInputs(ctx, 2, a, &in));
    OP_REQUIRES_OK(ctx, BindTable(values.tensor(), &a));
    in.params = &values.tensor();
    Tensor offsets_t;
    OP_REQUIRES_OK(ctx, BuildOffsets<TSeg>(ctx, a, in, &offsets_t));
    const int64_t* offsets = offsets_t.flat<int64_t>().data();
    const int64_t bags = offsets_t.NumElements() - 1;
    Tensor *out = nullptr, *rows = nullptr;
    OP_REQUIRES_OK(ctx, AllocatePooled(ctx, 0, values.tensor(), bags, &out));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, in.ids->shape(), &rows));

    using CT = typename CoreType<T>::type;
    const Key* keys = in.ids->flat<Key>().data();
    const float* weights = in.weights ? in.weights->flat<float>().data() : nullptr;
    int64_t* row_data = rows->flat<int64_t>().data();
    ctr::LowestRowError<ctr::KeyError> first_error;
    ctr::TableFault fault;
    const int64_t cost = BagCost(in, a.spec, bags) + (in.nnz() / std::max<int64_t>(bags, 1) + 1) * kProbeCost;
    ParallelFor(ctx, bags, cost, [&](int64_t begin, int64_t end) {
      std::vector<ctr::AccT<CT>> acc(a.spec.dim);
      ctr::KeyError err;
      ctr::PoolTableBagsCpu(table.slots, capacity_, a.spec, CorePtr<T>(values.tensor()), keys, weights, offsets, begin, end,
                            dense_padding_, acc.data(), CorePtr<T>(out), row_data, &err, &fault);
      first_error.Offer(err);
    });
    OP_REQUIRES_OK(ctx, CoreStatus(fault.Describe(capacity_, table.slots.num_slots)));
    if (!first_error.found()) return;
    const ctr::KeyError& e = first_error.error();
    ctx->CtxFailure(tensorflow::errors::InvalidArgument(
        ctr::DescribeTableRowError(e, row_data[e.entry], std::min(a.spec.vocab, capacity_))));
  }

 private:
  int64_t capacity_ = 0;
  bool dense_padding_ = false;
  LookupAttrs attrs_;
};

#define CTR_REGISTER_HASH_TABLE_EMBEDDING(T, Key, TSeg)                                              \
  REGISTER_KERNEL_BUILDER(Name("CtrHashTableEmbedding")                                             \
                              .Device(tensorflow::DEVICE_CPU)                                       \
                              .TypeConstraint<T>("T")                                               \
                              .TypeConstraint<Key>("Tkey")                                          \
                              .TypeConstraint<TSeg>("Tseg"),                                        \
                          HashTableEmbeddingOp<T, Key, TSeg>)
#define CTR_REGISTER_HASH_TABLE_EMBEDDING_KEYS(T)         \
  CTR_REGISTER_HASH_TABLE_EMBEDDING(T, int32_t, int32_t) \
  CTR_REGISTER_HASH_TABLE_EMBEDDING(T, int32_t, int64_t) \
  CTR_REGISTER_HASH_TABLE_EMBEDDING(T, int64_t, int32_t) \
  CTR_REGISTER_HASH_TABLE_EMBEDDING(T, int64_t, int64_t)
CTR_REGISTER_HASH_TABLE_EMBEDDING_KEYS(float)
CTR_REGISTER_HASH_TABLE_EMBEDDING_KEYS(double)
CTR_REGISTER_HASH_TABLE_EMBEDDING_KEYS(Eigen::half)
CTR_REGISTER_HASH_TABLE_EMBEDDING_KEYS(Eigen::bfloat16)
#undef CTR_REGISTER_HASH_TABLE_EMBEDDING_KEYS
#undef CTR_REGISTER_HASH_TABLE_EMBEDDING

}  // namespace tf_ctr

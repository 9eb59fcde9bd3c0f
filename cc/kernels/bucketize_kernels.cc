// CPU kernel of CtrBucketizeEmbeddingLookup: Bucketize's check of the
// boundaries, each value's id (cc/core/bucketize.h), then the shared pooling
// of the ids, S to a row. CPU only for now: the rewrite fuses it where a
// graph is served on a CPU (a GPU server keeps Bucketize and the lookup).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "cc/core/bucketize.h"
#include "cc/kernels/lookup_common.h"
#include "cc/kernels/pool_cpu.h"
#include "cc/kernels/tf_types.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"

namespace tf_ctr {
namespace {

using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::errors::InvalidArgument;

template <typename T, typename TIn>
class BucketizeEmbeddingLookupOp : public tensorflow::OpKernel {
 public:
  explicit BucketizeEmbeddingLookupOp(tensorflow::OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, ReadPoolingAttrs(c, &attrs_.spec));
    OP_REQUIRES_OK(c, c->GetAttr("boundaries", &boundaries_));
    OP_REQUIRES_OK(c, c->GetAttr("column_stride", &stride_));
    OP_REQUIRES(c, std::is_sorted(boundaries_.begin(), boundaries_.end()),
                InvalidArgument("Expected sorted boundaries"));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& params = ctx->input(0);
    const Tensor& input = ctx->input(1);
    LookupAttrs a = attrs_;
    OP_REQUIRES_OK(ctx, BindTable(params, &a));
    OP_REQUIRES(ctx, input.dims() == 2,
                InvalidArgument("input must be a matrix [B, S] of values to bucket, got shape ",
                                input.shape().DebugString()));
    const int64_t rows = input.dim_size(0), cols = input.dim_size(1);
    int64_t last_id = 0;  // the last column's last bucket: ids are bucket + column * column_stride
    OP_REQUIRES(ctx, cols == 0 || (!__builtin_mul_overflow(cols - 1, stride_, &last_id) &&
                                   !__builtin_add_overflow(last_id, static_cast<int64_t>(boundaries_.size()),
                                                           &last_id)),
                InvalidArgument("column_stride ", stride_, " times ", cols - 1,
                                " columns overflows int64 ids"));

    Tensor* ids = nullptr;
    OP_REQUIRES_OK(ctx, AllocateOutput(ctx, 1, {rows * cols}, &ids));
    const TIn* x = input.flat<TIn>().data();
    int64_t* out = ids->flat<int64_t>().data();
    const float* bounds = boundaries_.data();
    const int64_t n = static_cast<int64_t>(boundaries_.size());
    ParallelFor(ctx, rows, ShardCost(20.0 * cols + 1), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin * cols; i < end * cols; ++i)
        out[i] = ctr::BucketizedId(x[i], bounds, n, i % cols, stride_);
    });

    Tensor* splits = nullptr;
    OP_REQUIRES_OK(ctx, AllocateOutput(ctx, 2, {rows + 1}, &splits));
    int64_t* offsets = splits->flat<int64_t>().data();
    for (int64_t b = 0; b <= rows; ++b) offsets[b] = b * cols;
    Tensor* shape = nullptr;
    OP_REQUIRES_OK(ctx, AllocateOutput(ctx, 3, {2}, &shape));
    shape->vec<int64_t>()(0) = rows;
    shape->vec<int64_t>()(1) = cols;

    OP_REQUIRES_OK(ctx, PoolComputedIds<T>(ctx, a, params, *ids, *splits, "bucketized"));
  }

 private:
  LookupAttrs attrs_;
  std::vector<float> boundaries_;
  int64_t stride_ = 0;
};

#define REGISTER_CPU(T, TIn)                                                                      \
  REGISTER_KERNEL_BUILDER(Name("CtrBucketizeEmbeddingLookup")                                     \
                              .Device(tensorflow::DEVICE_CPU)                                     \
                              .TypeConstraint<T>("T")                                             \
                              .TypeConstraint<TIn>("Tin"),                                        \
                          BucketizeEmbeddingLookupOp<T, TIn>);
#define REGISTER_ALL_INPUTS(T) \
  REGISTER_CPU(T, int32_t) REGISTER_CPU(T, int64_t) REGISTER_CPU(T, float) REGISTER_CPU(T, double)
REGISTER_ALL_INPUTS(float);
REGISTER_ALL_INPUTS(double);
REGISTER_ALL_INPUTS(Eigen::half);
REGISTER_ALL_INPUTS(Eigen::bfloat16);
#undef REGISTER_ALL_INPUTS
#undef REGISTER_CPU

}  // namespace
}  // namespace tf_ctr

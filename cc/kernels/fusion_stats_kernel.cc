#include "cc/grappler/fusion_stats.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_ctr {

class FusionStatsOp : public tensorflow::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tensorflow::OpKernelContext* ctx) override {
    tensorflow::Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tensorflow::TensorShape({3}), &out));
    const auto& s = grappler::GlobalFusionStats();
    auto v = out->flat<int64_t>();
    v(0) = s.graphs.load();
    v(1) = s.rewrites.load();
    v(2) = s.skips.load();
  }
};

REGISTER_KERNEL_BUILDER(Name("CtrFusionStats").Device(tensorflow::DEVICE_CPU), FusionStatsOp);

}  // namespace tf_ctr

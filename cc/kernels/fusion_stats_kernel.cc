// Introspection of CtrFusionOptimizer for Python: its counters and the
// names of its patterns.
#include "cc/grappler/fusion_stats.h"
#include "cc/grappler/pattern.h"
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

class FusionPatternsOp : public tensorflow::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tensorflow::OpKernelContext* ctx) override {
    const auto& patterns = grappler::RegisteredPatterns();
    tensorflow::Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tensorflow::TensorShape({static_cast<int64_t>(patterns.size())}),
                                             &out));
    auto names = out->flat<tensorflow::tstring>();
    for (size_t i = 0; i < patterns.size(); ++i) names(i) = patterns[i]->name();
  }
};

REGISTER_KERNEL_BUILDER(Name("CtrFusionPatterns").Device(tensorflow::DEVICE_CPU), FusionPatternsOp);

}  // namespace tf_ctr

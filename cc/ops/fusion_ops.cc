// Introspection of the CtrFusionOptimizer Grappler pass.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {

REGISTER_OP("CtrFusionStats")
    .Output("stats: int64")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->Vector(3));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Counters of the CtrFusionOptimizer pass in this process: [graphs optimized,
subgraphs rewritten into fused ops, candidate subgraphs left untouched].
)doc");

REGISTER_OP("CtrFusionPatterns")
    .Output("names: string")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc(R"doc(
The names of the CtrFusionOptimizer pass's patterns, in the order they run
within a stage: what its `disabled_patterns` parameter takes.
)doc");

}  // namespace tensorflow

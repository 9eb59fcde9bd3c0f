// Pattern (report only): a lookup into a partitioned table,
//
//   ParallelDynamicStitch(DynamicPartition(positions), {ResourceGather | GatherV2}(part_p, ...))
//
// as tf.compat.v1.nn.embedding_lookup(list_of_partitions, ids) builds it. Its
// exact replacement is one gather from the partitions merged into a single
// variable, which a graph pass cannot create: offline rewriting
// (tf_ctr_ops.rewrite.optimize_saved_model, tf_ctr_ops/_partitioned.py) merges
// the partitions before this optimizer runs. What reaches this pattern is left
// alone, with the reason recorded.
#include <string>

#include "cc/grappler/pattern.h"
#include "tensorflow/core/framework/attr_value.pb.h"

namespace tf_ctr {
namespace grappler {
namespace {

using tensorflow::NodeDef;

constexpr char kName[] = "partitioned_table";

class PartitionedLookupPattern : public NamedPattern<kName> {
 public:
  bool Rewrite(const NodeDef& anchor, RewriteContext* ctx) const override {
    if (!IsOp(&anchor, "ParallelDynamicStitch")) return false;
    const int64_t n = IntAttr(anchor, "N", 0);
    if (n < 2) return false;
    for (int64_t p = 0; p < n; ++p) {
      const NodeDef* rows = ctx->index().Producer(anchor, static_cast<int>(n + p));
      if (!IsOp(rows, "ResourceGather") && !IsOp(rows, "GatherV2")) return false;
    }
    ctx->Skipped(kName, anchor.name(),
                 "lookup into " + std::to_string(n) +
                     " partitions: only the offline rewrite of a TF2 SavedModel (optimize_saved_model) merges "
                     "them into one variable, and only for variables laid out by the 'mod' or 'div' rule");
    return false;
  }
};

REGISTER_CTR_FUSION_PATTERN(PartitionedLookupPattern);

}  // namespace
}  // namespace grappler
}  // namespace tf_ctr

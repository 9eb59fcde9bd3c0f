// Pattern: a bucketized numeric feature, one table row per value --
// keras.layers.Discretization + keras.layers.Embedding, and
// tf.gather(table, tf.raw_ops.Bucketize(input=x, boundaries=b)):
//
//   ids = Bucketize(x)                              x [B], [B, 1] or [B, N]; int32 ids
//   [Cast to int64: Discretization's output dtype]
//   [Keras 3: ids = SelectV2(Less(ids, 0), AddV2(ids, rows), ids)]
//   {ResourceGather | GatherV2}(table, ids)         [-> Keras' Flatten]
//
// becomes CtrBucketizeEmbeddingLookup(table, Reshape(x, [-1, 1])) with the
// same boundaries, combiner sum: each value is a bag of its one bucket id,
// and a sum of one row is the row the gather gives. The rows take the
// gather's shape again as the hashed gather's do ([B, 1] values through an
// ExpandDims unless a Flatten follows, [B, N] through a Reshape to
// x.shape + [D]). Bucket ids are never negative, so the wrap changes
// nothing. Only where the graph is served on a CPU, where the fused op runs.
#include <set>
#include <string>
#include <vector>

#include "cc/grappler/keras_gather.h"
#include "cc/grappler/pattern.h"
#include "cc/grappler/vocab_find.h"
#include "tensorflow/core/framework/attr_value.pb.h"

namespace tf_ctr {
namespace grappler {
namespace {

using tensorflow::DataType;
using tensorflow::NodeDef;

constexpr char kName[] = "bucketize_gather";
constexpr char kFusedOp[] = "CtrBucketizeEmbeddingLookup";

// The gather's ids traced back to the Bucketize.
struct BucketIds {
  const NodeDef* bucketize = nullptr;
  const NodeDef* cast = nullptr;  // int32 -> int64, or an index cast of int64 ids
  std::vector<const NodeDef*> wrap;

  std::vector<const NodeDef*> All() const {
    std::vector<const NodeDef*> all = wrap;
    for (const NodeDef* n : {cast, bucketize})
      if (n != nullptr) all.push_back(n);
    return all;
  }
};

bool IsWideningCast(const NodeDef* n) {
  return IsOp(n, "Cast") && TypeAttr(*n, "SrcT") == tensorflow::DT_INT32 && TypeAttr(*n, "DstT") == tensorflow::DT_INT64;
}

class BucketizeGatherPattern : public NamedPattern<kName> {
 public:
  bool Rewrite(const NodeDef& anchor, RewriteContext* ctx) const override {
    const bool resource = IsOp(&anchor, "ResourceGather");
    if (!resource && !IsOp(&anchor, "GatherV2")) return false;
    const GraphIndex& g = ctx->index();
    BucketIds ids;
    const NodeDef* h = UnwrapNegativeIndexFix(g, g.Producer(anchor, 1), &ids.wrap);
    if (IsWideningCast(h) || IsIndexCast(h)) {
      ids.cast = h;
      h = g.Producer(*h, 0);
    }
    if (!IsOp(h, "Bucketize")) return false;
    ids.bucketize = h;

    // The subgraph has the right shape; now every condition for exactness.
    const DataType T = GatheredType(anchor, resource);
    if (!IsEmbeddingDtype(T))
      return Skip(ctx, anchor, "table dtype " + tensorflow::DataType_Name(T) + " is not float, half or bfloat16");
    std::string why;
    if (!GathersWholeRows(g, anchor, &why)) return Skip(ctx, anchor, why);
    if (!ids.wrap.empty() && !WrapShiftIsScalar(ctx, ids.wrap))
      return Skip(ctx, anchor, "the negative-index wrap may broadcast (its shift is not known to be a scalar)");
    std::set<const NodeDef*> shared;
    if (!SharedWithOtherGathers(g, ids.All(), anchor, ids.wrap.empty() ? nullptr : g.Producer(*ids.wrap[0], 2),
                                &shared, &why))
      return Skip(ctx, anchor, why);
    if (!shared.empty()) return Skip(ctx, anchor, "other gathers read the same bucket ids");
    const int rank = ctx->Rank(*h, 0);
    if (rank != 1 && rank != 2)
      return Skip(ctx, anchor, rank < 0 ? "values of unknown rank" : "values of rank " + std::to_string(rank));
    const int table_rank = GatherTableRank(ctx, anchor, resource, rank);
    if (table_rank != 2)
      return Skip(ctx, anchor,
                  table_rank < 0 ? "cannot prove the table is a matrix (rank unknown)" : "the table is not a matrix");
    if (!ServedOnCpu(ctx, anchor))
      return Skip(ctx, anchor, "CtrBucketizeEmbeddingLookup runs on the CPU: rewrite with serving_device='cpu' "
                               "for a CPU server");
    const bool one_per_row = rank == 1 || ctx->Dim(*h, 0, 1) == 1;
    FlattenOfRows flatten;
    if (rank == 2 && one_per_row) MatchFlatten(ctx, anchor, &flatten);
    Replace(anchor, ids, resource, T, one_per_row ? rank : 0, flatten, ctx);
    return true;
  }

 private:
  // rank 0: values [B, N], whose rows take their shape.
  void Replace(const NodeDef& anchor_in, const BucketIds& ids, bool resource, DataType T, int rank,
               const FlattenOfRows& flatten, RewriteContext* ctx) const {
    const NodeDef anchor = anchor_in;  // the graph changes under the references
    const NodeDef bucketize = *ids.bucketize;
    const std::string name = anchor.name(), device = anchor.device();
    std::vector<NodeDef> absorbed;
    for (const NodeDef* n : ids.All()) absorbed.push_back(*n);
    MatchRecord record{kName, name, kFusedOp, {}};
    for (const NodeDef* n : ids.All()) {
      record.replaced.push_back(Describe(*n));
      ctx->RedirectControlEdges(n->name(), name);
      ctx->Remove(n->name(), name);
    }
    // The wrap's other operands (the table's row count, the constant 0) lose their reader.
    for (const NodeDef* n : ids.wrap)
      for (int i = 0; i < n->input_size(); ++i) RemoveIfDeadShapeMath(ctx, ctx->index().Producer(*n, i), name, 4);
    record.replaced.push_back(Describe(anchor));

    const std::string values = bucketize.input(0);
    const DataType value_type = TypeAttr(bucketize, "T");
    const std::string table = GatheredTable(ctx, anchor, resource, T);
    const std::string column_shape = AddInt32Vector(ctx, name + "/ctr_values_shape", {-1, 1}, device);
    NodeDef* column = ctx->AddNode(name + "/ctr_values", "Reshape", device);
    column->add_input(values);
    column->add_input(column_shape);
    (*column->mutable_attr())["T"].set_type(value_type);
    (*column->mutable_attr())["Tshape"].set_type(tensorflow::DT_INT32);
    const std::string column_name = column->name();

    NodeDef* fused = rank == 0 ? BecomeGatherOutputOfKeys(ctx, anchor, kFusedOp, T, values, value_type)
                               : BecomeGatherOutput(ctx, anchor, kFusedOp, T, rank, flatten, &record);
    fused->add_input(table);
    fused->add_input(column_name);
    for (const NodeDef& n : absorbed) CopyControlInputs(n, fused);
    auto& attr = *fused->mutable_attr();
    attr["T"].set_type(T);
    attr["Tin"].set_type(value_type);
    attr["boundaries"] = bucketize.attr().at("boundaries");
    attr["column_stride"].set_i(0);
    attr["combiner"].set_s("sum");
    attr["default_id"].set_i(-1);
    attr["max_norm"].set_f(-1.f);
    ctx->Matched(record);
  }
};

REGISTER_CTR_FUSION_PATTERN(BucketizeGatherPattern);

}  // namespace
}  // namespace grappler
}  // namespace tf_ctr

// Pattern: a hashed cross of single-valued features, one table row per
// example -- keras.layers.HashedCrossing + keras.layers.Embedding, and
// tf.nn.embedding_lookup(table, tf.sparse.to_dense(tf.sparse.cross_hashed(
// [a, b], n))) on [B, 1] features:
//
//   cross = SparseCross(dense = [x_1 ... x_k])        each x_i [B, 1]; hashed_output, int64 ids
//   ids   = SparseToDense(cross.indices, cross.shape, cross.values, d)
//   [ids  = Squeeze(ids, axis 1)]                     HashedCrossing on [B] features
//   [Keras 3: ids = SelectV2(Less(ids, 0), AddV2(ids, rows), ids)] [Cast to int32]
//   {ResourceGather | GatherV2}(table, ids) [-> Keras' Flatten]
//
// becomes, under the gather's name,
//
//   CtrCrossEmbeddingLookup(table, dense = [x_1 ... x_k])   combiner sum
//
// Exact: every input holds one value per row, so every row has exactly one
// cross (the default d is never used) and its bag is that one id; a sum of
// one row is the row, which the gather gives. Cross ids are never negative,
// so the wrap changes nothing. The [B, 1] ids without a Squeeze fuse only
// under a Flatten of the gathered rows: on a batch of 0 SparseCross's shape
// is [0, 0], and the gather's [0, 0, D] would differ from [0, 1, D]. Only
// where the graph is served on a CPU, as SparseCross runs.
#include <algorithm>
#include <climits>
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

constexpr char kName[] = "cross_gather";
constexpr char kFusedOp[] = "CtrCrossEmbeddingLookup";

// The gather's ids traced back to the cross, innermost first in `Absorbed`.
struct CrossedIds {
  const NodeDef* cross = nullptr;
  const NodeDef* to_dense = nullptr;
  const NodeDef* squeeze = nullptr;
  const NodeDef* cast = nullptr;
  std::vector<const NodeDef*> wrap;

  std::vector<const NodeDef*> Absorbed() const {
    std::vector<const NodeDef*> all = wrap;
    for (const NodeDef* n : {cast, squeeze, to_dense, cross})
      if (n != nullptr) all.push_back(n);
    return all;
  }
  int Rank() const { return squeeze != nullptr ? 1 : 2; }
};

// ids = SparseToDense(cross:0, cross:2, cross:1, d): the cross's whole SparseTensor.
const NodeDef* CrossOfDenseIds(const GraphIndex& g, const NodeDef& to_dense) {
  int port = -1;
  const NodeDef* cross = g.Producer(to_dense, 2, &port);
  if (!IsOp(cross, "SparseCross") || port != 1) return nullptr;
  if (!SameTensor(to_dense.input(0), cross->name()) || !SameTensor(to_dense.input(1), cross->name() + ":2"))
    return nullptr;
  return cross;
}

class CrossGatherPattern : public NamedPattern<kName> {
 public:
  bool Rewrite(const NodeDef& anchor, RewriteContext* ctx) const override {
    const bool resource = IsOp(&anchor, "ResourceGather");
    if (!resource && !IsOp(&anchor, "GatherV2")) return false;
    const GraphIndex& g = ctx->index();
    CrossedIds ids;
    const NodeDef* h = UnwrapNegativeIndexFix(g, g.Producer(anchor, 1), &ids.wrap);
    if (IsIndexCast(h)) {
      ids.cast = h;
      h = g.Producer(*h, 0);
    }
    if (IsOp(h, "Squeeze")) {
      ids.squeeze = h;
      h = g.Producer(*h, 0);
    }
    if (!IsOp(h, "SparseToDense")) return false;
    ids.to_dense = h;
    ids.cross = CrossOfDenseIds(g, *h);
    if (ids.cross == nullptr) return false;

    // The subgraph has the right shape; now every condition for exactness.
    const NodeDef& cross = *ids.cross;
    std::string why;
    if (!IsRunnableHashedCross(cross, &why)) return Skip(ctx, anchor, why);
    int64_t batch = -1;
    if (!EachRowHasOneCross(ctx, cross, &batch, &why)) return Skip(ctx, anchor, why);
    if (ids.squeeze != nullptr && !IsSqueezeOfAxis(ids.squeeze, 1, 2))
      return Skip(ctx, anchor, Describe(*ids.squeeze) + " does not squeeze axis 1 alone");
    const DataType T = GatheredType(anchor, resource);
    if (!IsEmbeddingDtype(T))
      return Skip(ctx, anchor, "table dtype " + tensorflow::DataType_Name(T) + " is not float, half or bfloat16");
    if (!GathersWholeRows(g, anchor, &why)) return Skip(ctx, anchor, why);
    const int64_t buckets = IntAttr(cross, "num_buckets", 0);
    if (ids.cast != nullptr && TypeAttr(*ids.cast, "DstT") == tensorflow::DT_INT32 &&
        (buckets == 0 || buckets > INT32_MAX))
      return Skip(ctx, anchor, "crossed ids do not fit the int32 cast");
    if (!ids.wrap.empty() && !WrapShiftIsScalar(ctx, ids.wrap))
      return Skip(ctx, anchor, "the negative-index wrap may broadcast (its shift is not known to be a scalar)");
    if (!OnlyFeedsTheGather(ctx, ids, &why)) return Skip(ctx, anchor, why);
    const int table_rank = GatherTableRank(ctx, anchor, resource, ids.Rank());
    if (table_rank != 2)
      return Skip(ctx, anchor,
                  table_rank < 0 ? "cannot prove the table is a matrix (rank unknown)" : "the table is not a matrix");
    if (!ServedOnCpu(ctx, anchor))
      return Skip(ctx, anchor, "CtrCrossEmbeddingLookup runs on the CPU (as SparseCross does): rewrite with "
                               "serving_device='cpu' for a CPU server");
    FlattenOfRows flatten;
    if (ids.Rank() == 2 && !MatchFlatten(ctx, anchor, &flatten, ProvenIds{/*one_per_row=*/true, batch}))
      return Skip(ctx, anchor, "[B, 1] crossed ids whose gathered rows are not flattened (or whose Flatten is "
                               "a node the graph must keep, such as its output): on a batch of 0 the gather "
                               "gives [0, 0, D]");
    Replace(anchor, ids, resource, T, flatten, ctx);
    return true;
  }

 private:
  // A row has one cross when every input is dense with one value per row;
  // *batch is their known batch (-1 for none).
  static bool EachRowHasOneCross(RewriteContext* ctx, const NodeDef& cross, int64_t* batch, std::string* why) {
    if (IntAttr(cross, "N", 0) != 0) {
      *why = Describe(cross) + " has sparse inputs: a row may have several crosses or none";
      return false;
    }
    const GraphIndex& g = ctx->index();
    for (int i = 0; i < cross.input_size() && cross.input(i)[0] != '^'; ++i) {
      int port = 0;
      const NodeDef* x = g.Producer(cross, i, &port);
      if (x == nullptr || ctx->Rank(*x, port) != 2 || ctx->Dim(*x, port, 1) != 1) {
        *why = "input " + std::to_string(i) + " of " + Describe(cross) + " is not known to be [B, 1]";
        return false;
      }
      *batch = std::max(*batch, ctx->Dim(*x, port, 0));  // SparseCross refuses inputs of other batches
    }
    return true;
  }

  // Each intermediate feeds only the next one (the gradient of a gather
  // reads its indices, so training graphs keep them).
  static bool OnlyFeedsTheGather(RewriteContext* ctx, const CrossedIds& ids, std::string* why) {
    const GraphIndex& g = ctx->index();
    auto only = [&](const NodeDef* n, int readers) {
      if (n == nullptr || (g.DataConsumers(n->name()) == readers && !ctx->MustKeep(n->name()))) return true;
      *why = "intermediate " + Describe(*n) + " has another consumer";
      return false;
    };
    for (const NodeDef* n : ids.wrap)
      if (!only(n, 1)) return false;
    // The wrap reads the ids three times; SparseToDense reads three outputs of the cross.
    const int index_readers = ids.wrap.empty() ? 1 : 3;
    const NodeDef* last = ids.cast != nullptr ? ids.cast : ids.squeeze != nullptr ? ids.squeeze : ids.to_dense;
    for (const NodeDef* n : {ids.cast, ids.squeeze, ids.to_dense})
      if (n != nullptr && !only(n, n == last ? index_readers : 1)) return false;
    return only(ids.cross, 3);
  }

  void Replace(const NodeDef& anchor_in, const CrossedIds& ids, bool resource, DataType T,
               const FlattenOfRows& flatten, RewriteContext* ctx) const {
    const NodeDef anchor = anchor_in;  // the graph changes under the references
    const NodeDef cross = *ids.cross;
    std::vector<NodeDef> absorbed;
    for (const NodeDef* n : ids.Absorbed()) absorbed.push_back(*n);
    MatchRecord record{kName, anchor.name(), kFusedOp, {}};
    for (const NodeDef* n : ids.Absorbed()) {
      record.replaced.push_back(Describe(*n));
      ctx->RedirectControlEdges(n->name(), anchor.name());
      ctx->Remove(n->name(), anchor.name());
    }
    // SparseToDense's default and the wrap's other operands (the table's row
    // count, the constant 0) lose their reader.
    RemoveIfDeadShapeMath(ctx, ctx->index().Producer(*ids.to_dense, 3), anchor.name(), 1);
    for (const NodeDef* n : ids.wrap)
      for (int i = 0; i < n->input_size(); ++i)
        RemoveIfDeadShapeMath(ctx, ctx->index().Producer(*n, i), anchor.name(), 4);
    record.replaced.push_back(Describe(anchor));

    const std::string table = GatheredTable(ctx, anchor, resource, T);
    NodeDef* fused = BecomeGatherOutput(ctx, anchor, kFusedOp, T, ids.Rank(), flatten, &record);
    fused->add_input(table);
    for (const std::string& in : cross.input())
      if (in.empty() || in[0] != '^') fused->add_input(in);
    for (const NodeDef& n : absorbed) CopyControlInputs(n, fused);
    CopyAttrsIfSet(cross, {"N", "sparse_types", "dense_types", "num_buckets", "hash_key"}, fused);
    auto& attr = *fused->mutable_attr();
    attr["T"].set_type(T);
    attr["combiner"].set_s("sum");
    attr["default_id"].set_i(-1);
    attr["max_norm"].set_f(-1.f);
    ctx->Matched(record);
  }
};

REGISTER_CTR_FUSION_PATTERN(CrossGatherPattern);

}  // namespace
}  // namespace grappler
}  // namespace tf_ctr

// Pattern: a hashed feature cross feeding a fused sparse lookup -- a
// crossed_column under a linear model or an embedding column, and
// safe_embedding_lookup_sparse(params, tf.sparse.cross_hashed(inputs, n)),
// once safe_lookup fused the lookup:
//
//   cross = SparseCross(indices, values, shapes, dense)        (hashed_output, int64 ids)
//   sp    = [SparseReshape(cross, [S[0], -1])] [SparseReshape(.., [prod(S[:1]), S[1]])]
//   ids   = [SparseReorder(sp) ->] sp.values [-> Identity ...]
//   CtrEmbeddingLookup(params, ids, ids.indices[:, 0], sp.shape[0])   (no weights)
//
// becomes, under the lookup's name,
//
//   CtrCrossEmbeddingLookup(params, indices, values, shapes, dense)
//
// Exact: SparseCross emits each row's crosses together and the rows in
// order, and those reshapes keep every entry of a 2-D tensor in its row, so
// the reorder moves nothing and the lookup's bags are the cross's rows; the
// op crosses as SparseCross does (cc/core/cross.h) and pools with the
// lookup's combiner, default and max_norm. What else reads a dense shape of
// the chain (the safe lookup's final reshape) reads the op's, which is the
// cross's. Only where the graph is served on a CPU, as SparseCross runs.
#include <set>
#include <string>
#include <vector>

#include "cc/grappler/pattern.h"
#include "cc/grappler/sparse_chain.h"
#include "cc/grappler/vocab_find.h"
#include "tensorflow/core/framework/attr_value.pb.h"

namespace tf_ctr {
namespace grappler {
namespace {

using tensorflow::NodeDef;

constexpr char kName[] = "cross_lookup";
constexpr char kFusedOp[] = "CtrCrossEmbeddingLookup";
constexpr int kShapeOutput = 3;  // the fused op's dense_shape

class CrossLookupPattern : public NamedPattern<kName> {
 public:
  // After safe_lookup made the CtrEmbeddingLookup this absorbs the cross into.
  int Stage() const override { return 3; }

  bool Rewrite(const NodeDef& anchor, RewriteContext* ctx) const override {
    if (!IsOp(&anchor, "CtrEmbeddingLookup") || StringAttr(anchor, "id_mode") != "index" ||
        TypeAttr(anchor, "Tid") != tensorflow::DT_INT64)
      return false;
    const GraphIndex& g = ctx->index();
    SparseChain c;
    std::string why;
    const bool traced = TraceLookupBags(g, anchor, &c, &why);
    const TensorId values = ParseTensorName(c.values);
    const NodeDef* cross = g.Node(values.node);
    if (!IsOp(cross, "SparseCross") || values.port != 1) return false;

    // The subgraph has the right shape; now every condition for exactness.
    if (!traced) return Skip(ctx, anchor, why);
    if (!SameTensor(c.indices, TensorName(cross->name(), 0)) || !SameTensor(c.shape, TensorName(cross->name(), 2)))
      return Skip(ctx, anchor, "the crossed ids and their indices come from different SparseTensors");
    if (!IsRunnableHashedCross(*cross, &why)) return Skip(ctx, anchor, why);
    if (BoolAttr(anchor, "has_weights", false))
      return Skip(ctx, anchor, "the lookup of the crossed ids is weighted");
    if (!ServedOnCpu(ctx, anchor))
      return Skip(ctx, anchor, "CtrCrossEmbeddingLookup runs on the CPU (as SparseCross does): rewrite with "
                               "serving_device='cpu' for a CPU server");
    const auto is_cross_shape = [cross](const NodeDef& n, int port) { return &n == cross && port == 2; };
    if (!OnlyChainReads(ctx, anchor, c, {cross}, is_cross_shape, &why)) return Skip(ctx, anchor, why);
    Replace(anchor, *cross, c, ctx);
    return true;
  }

 private:
  static void Replace(const NodeDef& anchor_in, const NodeDef& cross_in, const SparseChain& c, RewriteContext* ctx) {
    const NodeDef anchor = anchor_in;  // the graph changes under the references
    const NodeDef cross = cross_in;
    const std::string name = anchor.name();
    std::set<const NodeDef*> inside = {&cross_in};
    for (const NodeDef* n : c.Nodes()) inside.insert(n);
    std::vector<const NodeDef*> base = {&cross_in};
    for (const NodeDef* r : c.reshapes) CollectShapeMathOnlyFor(ctx, ctx->index().Producer(*r, 2), &inside, &base);

    NodeDef* fused = ctx->Mutable(name);
    fused->set_op(kFusedOp);
    fused->clear_input();
    fused->add_input(anchor.input(0));
    for (const std::string& in : cross.input())
      if (in.empty() || in[0] != '^') fused->add_input(in);
    CopyControlInputs(anchor, fused);
    fused->mutable_attr()->clear();
    CopyAttrsIfSet(anchor, {"T", "combiner", "default_id", "max_norm", "grad_indices", "empty_grad_row"}, fused);
    CopyAttrsIfSet(cross, {"N", "sparse_types", "dense_types", "num_buckets", "hash_key"}, fused);

    MatchRecord record{kName, name, kFusedOp, {Describe(anchor)}};
    AbsorbChain(ctx, c, base, {TensorName(cross.name(), 2)}, TensorName(name, kShapeOutput), &record);
    ctx->Matched(record);
  }
};

REGISTER_CTR_FUSION_PATTERN(CrossLookupPattern);

}  // namespace
}  // namespace grappler
}  // namespace tf_ctr

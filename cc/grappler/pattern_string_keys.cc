// Pattern: a fused lookup of hashed string keys that will be served on a CPU --
//
//   CtrEmbeddingLookup(table, [Identity ->] [SparseReorder ->] StringToHashBucket{Fast,Strong}(strings, num_buckets), ...)   (index mode)
//
// (categorical_column_with_hash_bucket's embedding column once safe_lookup
// fused it: the strings are ParseExample's values) becomes
//
//   CtrEmbeddingLookup(table, strings, ...)   with id_mode "hash", num_buckets (and the strong hash's key)
//
// under the same name: the kernel hashes each key inside its pooling loop, so
// the hash is no pass of its own over the keys and no [nnz] tensor of
// buckets. Exact: buckets are never negative, so the rules index mode has for
// negative ids never applied, and a bucket >= V is an InvalidArgument in both.
// Only where the graph is to be served on a CPU (the optimizer's
// serving_device, or the op's placement): string keys have a CPU kernel only,
// and on a GPU the lookup has to stay beside its table.
#include <string>
#include <vector>

#include "cc/grappler/gathered_rows.h"
#include "cc/grappler/pattern.h"
#include "tensorflow/core/framework/attr_value.pb.h"

namespace tf_ctr {
namespace grappler {
namespace {

using tensorflow::NodeDef;

constexpr char kName[] = "string_keys";

class StringKeysPattern : public NamedPattern<kName> {
 public:
  int Stage() const override { return 3; }

  bool Rewrite(const NodeDef& anchor, RewriteContext* ctx) const override {
    if (!IsOp(&anchor, "CtrEmbeddingLookup") || StringAttr(anchor, "id_mode") != "index") return false;
    const GraphIndex& g = ctx->index();
    std::vector<const NodeDef*> chain;  // the Identity nodes, then the hash
    int port = 0;
    const NodeDef* hash = SkipIdentities(g, g.Producer(anchor, 1, &port), &chain);
    // The safe lookup's SparseReorder of ids not known to be in row order
    // permutes the strings instead: the hash is element-wise, so it commutes.
    const NodeDef* reorder = nullptr;
    if (IsOp(hash, "SparseReorder") && port == 1) {
      reorder = hash;
      hash = SkipIdentities(g, g.Producer(*reorder, 1), &chain);
    }
    if (!IsStringHash(hash)) return false;
    const std::string placed = DeviceType(anchor.device());
    const std::string serving = placed.empty() ? ctx->serving_device() : placed;
    if (serving != "CPU") return false;  // the buckets are what a GPU lookup reads
    chain.push_back(hash);
    for (const NodeDef* n : chain)
      if (g.DataConsumers(n->name()) != 1 || g.ControlConsumers(n->name()) != 0 || ctx->MustKeep(n->name()))
        return Skip(ctx, anchor, "intermediate " + Describe(*n) + " has another consumer");
    if (reorder != nullptr && (g.Consumers(reorder->name(), 1) != 1 || ctx->MustKeep(reorder->name())))
      return Skip(ctx, anchor, "the values of " + Describe(*reorder) + " have another consumer");
    const int64_t buckets = IntAttr(*hash, "num_buckets", 0);
    if (buckets <= 0) return Skip(ctx, anchor, Describe(*hash) + " has no positive num_buckets");

    std::vector<NodeDef> absorbed;  // copies: the graph changes under the index
    for (const NodeDef* n : chain) absorbed.push_back(*n);
    const std::string name = anchor.name();
    if (reorder != nullptr) {
      NodeDef* permute = ctx->Mutable(reorder->name());
      *permute->mutable_input(1) = absorbed.back().input(0);
      (*permute->mutable_attr())["T"].set_type(tensorflow::DT_STRING);
    }
    NodeDef* op = ctx->Mutable(name);
    if (reorder == nullptr) *op->mutable_input(1) = absorbed.back().input(0);
    auto& attr = *op->mutable_attr();
    attr["Tid"].set_type(tensorflow::DT_STRING);
    attr["id_mode"].set_s("hash");
    attr["num_buckets"].set_i(buckets);
    SetHashKeyAttr(StringHashKey(absorbed.back()), op);
    MatchRecord record{kName, name, "CtrEmbeddingLookup", {}};
    for (const NodeDef& n : absorbed) {
      CopyControlInputs(n, op);
      record.replaced.push_back(Describe(n));
      ctx->Remove(n.name(), name);
    }
    ctx->Matched(record);
    return true;
  }
};

REGISTER_CTR_FUSION_PATTERN(StringKeysPattern);

}  // namespace
}  // namespace grappler
}  // namespace tf_ctr

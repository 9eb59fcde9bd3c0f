// Pattern: a vocabulary lookup feeding a fused sparse lookup -- the
// vocabulary feature columns (categorical_column_with_vocabulary_list /
// _file) under an embedding column, and safe_embedding_lookup_sparse over
// table.lookup(sp_keys), once safe_lookup fused the lookup:
//
//   ids = LookupTableFindV2(table, keys, default)
//   [num_oov_buckets = n > 0, as IdTableWithHashBuckets looks keys up:
//      b   = StringToHashBucketFast(keys | AsString(keys), n)     (or _TensorToHashBucketFast)
//      ids = SelectV2(NotEqual(ids, default), ids, AddV2(b, LookupTableSizeV2(table)))]
//   CtrEmbeddingLookup(params, [Identity ->] [SparseReorder ->] ids, segments, num_rows, weights)   (index mode)
//
// becomes, under the lookup's name,
//
//   CtrVocabEmbeddingLookup(table, default, params, keys, segments, num_rows, weights)
//
// with num_oov_buckets n: the find, the buckets and the pooling in one CPU
// op, with no [nnz] tensor of ids between them. Exact: the op picks a key's
// bucket on the same condition (its found id equals the default), hashes it
// as the graph did and adds the same run-time table size; the pooling keeps
// the lookup's attrs. Lookup tables live on the host, so only where the
// graph is served on the CPU.
#include <string>
#include <vector>

#include "cc/grappler/pattern.h"
#include "cc/grappler/vocab_find.h"
#include "tensorflow/core/framework/attr_value.pb.h"

namespace tf_ctr {
namespace grappler {
namespace {

using tensorflow::NodeDef;

constexpr char kName[] = "vocab_sparse_lookup";
constexpr char kFusedOp[] = "CtrVocabEmbeddingLookup";

class VocabSparseLookupPattern : public NamedPattern<kName> {
 public:
  // After safe_lookup made the CtrEmbeddingLookup this absorbs the find into.
  int Stage() const override { return 3; }

  bool Rewrite(const NodeDef& anchor, RewriteContext* ctx) const override {
    if (!IsOp(&anchor, "CtrEmbeddingLookup") || StringAttr(anchor, "id_mode") != "index") return false;
    const GraphIndex& g = ctx->index();
    VocabIds ids;
    OovBuckets oov;
    int port = 0;
    const NodeDef* x = TraceIdentities(g, g.Producer(anchor, 1, &port), &port, &ids);
    const NodeDef* reorder = nullptr;
    if (IsOp(x, "SparseReorder") && port == 1) {
      reorder = x;
      x = TraceIdentities(g, g.Producer(*x, 1, &port), &port, &ids);
    }
    if (!MatchBucketedFind(g, x, port, &ids, &oov)) return false;

    // The subgraph has the right shape; now every condition for exactness.
    if (!ServedOnCpu(ctx, anchor))
      return Skip(ctx, anchor, "CtrVocabEmbeddingLookup runs on the CPU (lookup tables live on the host): "
                               "rewrite with serving_device='cpu' for a CPU server");
    std::string why;
    if (!FindTypesFuse(ctx, *ids.find, &why) || !FindOnAnchorDevice(*ids.find, anchor, &why) ||
        !BucketedFindFeedsOneReader(ctx, ids, oov, &why))
      return Skip(ctx, anchor, why);
    if (reorder != nullptr && (g.Consumers(reorder->name(), 1) != 1 || ctx->FetchedOrFed(reorder->name())))
      return Skip(ctx, anchor, "the values of " + Describe(*reorder) + " have another consumer");

    Replace(anchor, ids, oov, reorder, ctx);
    return true;
  }

 private:
  // Follows Identities up from `x` (read at *port), recording them.
  static const NodeDef* TraceIdentities(const GraphIndex& g, const NodeDef* x, int* port, VocabIds* ids) {
    while (IsOp(x, "Identity")) {
      ids->identities.push_back(x);
      x = g.Producer(*x, 0, port);
    }
    return x;
  }

  // A SparseReorder that the safe lookup put between the ids and the lookup
  // (ids not known to be in row order) permutes the keys instead: the find
  // is element-wise, so it commutes with the permutation.
  void Replace(const NodeDef& anchor_in, const VocabIds& ids, const OovBuckets& oov, const NodeDef* reorder_in,
               RewriteContext* ctx) const {
    const std::string reorder = reorder_in == nullptr ? "" : reorder_in->name();
    const NodeDef anchor = anchor_in;  // the graph changes under the reference
    const NodeDef find = *ids.find;
    const std::string name = anchor.name();
    MatchRecord record{kName, name, kFusedOp, {}};
    const std::vector<std::string> waits = AbsorbBucketedFind(ctx, ids, oov, name, {anchor}, &record.replaced);
    record.replaced.push_back(Describe(anchor));

    std::string keys = find.input(1);
    if (!reorder.empty()) {
      NodeDef* permute = ctx->Mutable(reorder);
      *permute->mutable_input(1) = keys;
      (*permute->mutable_attr())["T"].set_type(TypeAttr(find, "Tin"));
      keys = reorder + ":1";
    }
    NodeDef* fused = ctx->Mutable(name);
    fused->set_op(kFusedOp);
    fused->clear_input();
    for (const std::string& in : {find.input(0), find.input(2), anchor.input(0), keys, anchor.input(2),
                                  anchor.input(3), anchor.input(4)})
      fused->add_input(in);
    AddControlInputsOnce(waits, fused);
    auto& attr = *fused->mutable_attr();
    for (const char* gone : {"Tid", "id_mode", "num_buckets", "hash_key"}) attr.erase(gone);
    attr["Tkey"].set_type(TypeAttr(find, "Tin"));
    attr["num_oov_buckets"].set_i(oov.buckets);
    ctx->Matched(record);
  }
};

REGISTER_CTR_FUSION_PATTERN(VocabSparseLookupPattern);

}  // namespace
}  // namespace grappler
}  // namespace tf_ctr

// Pattern: a vocabulary lookup feeding an embedding gather -- Keras'
// StringLookup / IntegerLookup + Embedding, and tf.gather(params,
// table.lookup(keys)):
//
//   ids = LookupTableFindV2(table, keys, default)
//   [Keras' mask_token and num_oov_indices > 1 rules, as vocab_find.h
//    matches them (KerasKeyRules)]
//   [num_oov_indices=0: Keras asserts that every key is in the vocabulary,
//      w = Where(Equal(ids, m))
//      Assert(Equal(Size(w), 0), [StringFormat(GatherNd(keys, w))])
//    and reads ids through an Identity that waits on the Assert]
//   [Keras 3: SelectV2(Less(ids, 0), AddV2(ids, V), ids)]
//   {ResourceGather | GatherV2}(params, ids)     [+ Keras' Flatten]
//
// becomes CtrVocabEmbedding(table, keys, default, params [, mask key, mask
// id]): the find, Keras' mask and OOV-slot rules (num_masks; oov_slots,
// oov_id, oov_start), the check (missing_key "error", missing_id m) and the
// wrap in one CPU op, with Keras' Flatten absorbed as the hashed gather
// absorbs it. The Assert goes:
// the fused op raises the error it raised (naming the first missing key and
// its row), and what waited on the Assert waits on the fused op and on what
// the Assert waited on, so no ordering the graph had is lost and the fused
// lookups of a model stay free to run in parallel.
//
// Ids read by several gathers (DeepFM's StringLookup feeding its
// Embedding(N, 1) and Embedding(N, D)) fuse each gather alone: the find,
// Keras' rules and check stay for the others (each fused op does them too),
// and the last one absorbs them.
//
// Rows pooled over [B, L] ids (Embedding + GlobalAveragePooling1D) go to
// dense_reduce_lookup, which fuses the find with the pooling.
//
// Lookup tables live on the host, so the fused op runs on the CPU: it is
// only used when the graph is served on the CPU (a GPU server would copy the
// whole embedding table to the host on every call).
#include <set>
#include <string>
#include <utility>
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

constexpr char kName[] = "vocab_lookup";
constexpr char kFusedOp[] = "CtrVocabEmbedding";

class VocabLookupPattern : public NamedPattern<kName> {
 public:
  bool Rewrite(const NodeDef& anchor, RewriteContext* ctx) const override {
    const bool resource = IsOp(&anchor, "ResourceGather");
    if (!resource && !IsOp(&anchor, "GatherV2")) return false;
    const GraphIndex& g = ctx->index();
    VocabIds ids;
    if (!TraceToFind(g, UnwrapNegativeIndexFix(g, g.Producer(anchor, 1), &ids.wrap), &ids)) return false;

    // The subgraph has the right shape; now every condition for exactness.
    if (!ServedOnCpu(ctx, anchor))
      return Skip(ctx, anchor, "CtrVocabEmbedding runs on the CPU (lookup tables live on the host): "
                               "rewrite with serving_device='cpu' for a CPU server");
    const DataType T = GatheredType(anchor, resource);
    if (!IsEmbeddingDtype(T) && T != tensorflow::DT_DOUBLE)
      return Skip(ctx, anchor, "table dtype " + tensorflow::DataType_Name(T) + " is not a float type");
    // Rows pooled over [B, L] ids: dense_reduce_lookup fuses the find, the
    // gather and the pooling into one op.
    int ids_port = 0;
    const NodeDef* gathered_ids = g.Producer(anchor, 1, &ids_port);
    if (RowsArePooledBags(ctx, anchor, *gathered_ids, ids_port, T)) return false;
    std::string why;
    if (!FindTypesFuse(ctx, *ids.find, &why) || !FindOnAnchorDevice(*ids.find, anchor, &why) ||
        !GathersWholeRows(g, anchor, &why))
      return Skip(ctx, anchor, why);
    if (!ids.wrap.empty() && !WrapShiftIsRowCount(ctx, ids, anchor, resource))
      return Skip(ctx, anchor, "cannot prove that the negative-index wrap adds the table's row count");
    std::set<const NodeDef*> kept;
    if (!MatchVocabWaits(g, &ids, &why) || !OnlyFeedsTheGather(ctx, anchor, ids, &kept, &why))
      return Skip(ctx, anchor, why);
    for (const NodeDef* n : ids.check)
      if (ctx->FetchedOrFed(n->name())) return Skip(ctx, anchor, "the caller reads " + Describe(*n));
    if (!MaskIsScalar(ctx, ids.rules)) return Skip(ctx, anchor, "the mask key or its id is not a scalar");
    // CtrVocabEmbedding refuses a table of vector keys when it runs.
    AssumeScalarKeyFinds scalar_keys;
    const int rank = ctx->Rank(*ids.find, 0);
    FlattenOfRows flatten;
    if (rank == 2 && ctx->Dim(*ids.find, 0, 1) == 1) MatchFlatten(ctx, anchor, &flatten);

    Replace(anchor, ids, resource, T, flatten, kept, ctx);
    return true;
  }

 private:
  // Each intermediate feeds only the next one (a training graph's gather
  // gradient reads the ids too), and the find feeds only them and the check.
  // What waits on the find (automatic control dependencies) waits on the
  // fused op, which does the find. Or the ids the gather reads (or its wrap,
  // which Grappler merges for tables of one row count) are other gathers'
  // too: then only what is this gather's alone goes (*kept, the rest).
  static bool OnlyFeedsTheGather(RewriteContext* ctx, const NodeDef& anchor, const VocabIds& ids,
                                 std::set<const NodeDef*>* kept, std::string* why) {
    const GraphIndex& g = ctx->index();
    const NodeDef& gathered = ids.identities.empty() ? IdsSource(ids) : *ids.identities.front();
    const bool checked_here = ids.identities.empty() && ids.assert_node != nullptr;  // the check reads it too
    std::vector<const NodeDef*> match = ids.wrap;
    match.push_back(&gathered);
    std::string unshared;
    if (!checked_here && !ctx->FetchedOrFed(gathered.name()) &&
        SharedWithOtherGathers(g, match, anchor, ids.wrap.empty() ? nullptr : &gathered, kept, &unshared) &&
        !kept->empty())
      return true;
    kept->clear();
    return LookupFeedsOnly(ctx, ids, ids.wrap.empty() ? 1 : 3, why);  // the wrap reads the ids three times
  }

  void Replace(const NodeDef& anchor_in, const VocabIds& ids, bool resource, DataType T, const FlattenOfRows& flatten,
               const std::set<const NodeDef*>& kept, RewriteContext* ctx) const {
    const NodeDef anchor = anchor_in;  // the graph changes under the reference
    const NodeDef find = *ids.find;
    const std::string name = anchor.name(), device = anchor.device();
    MatchRecord record{kName, name, kFusedOp, {}};
    const bool checked = ids.assert_node != nullptr;
    const int64_t missing_id = ids.missing_id;
    const KerasKeyRules rules = ids.rules;  // its nodes go: only their absence or presence is read below
    // The mask's key and id, which the fused op reads as the Equal and the
    // Select did (a SavedModel's function takes Keras' as captured inputs).
    const std::vector<std::string> masks =
        rules.mask == nullptr ? std::vector<std::string>{}
                              : std::vector<std::string>{rules.mask_equal->input(rules.mask_key_operand),
                                                         rules.mask->input(1)};
    if (!kept.empty()) {
      std::vector<const NodeDef*> own;
      for (const NodeDef* n : ids.wrap)
        if (!kept.count(n)) own.push_back(n);
      AbsorbWrap(ctx, own, name, &record.replaced);
    } else {
      AbsorbVocabNodes(ctx, ids, name, {}, &record.replaced);
    }
    record.replaced.push_back(Describe(anchor));

    const std::string params = GatheredTable(ctx, anchor, resource, T);
    const std::string keys =
        flatten.found() ? FlattenKeys(ctx, name, find.input(1), TypeAttr(find, "Tin"), 2, device) : find.input(1);
    // The fused op's output has the gather's shape, keys.shape + params.shape[1:],
    // whatever the keys' rank: it takes the gather's place (rank passed as 1).
    NodeDef* fused = BecomeGatherOutput(ctx, anchor, kFusedOp, T, 1, flatten, &record);
    for (const std::string& in : {find.input(0), keys, find.input(2), params}) fused->add_input(in);
    for (const std::string& in : masks) fused->add_input(in);
    CopyControlInputs(find, fused);
    auto& attr = *fused->mutable_attr();
    attr["T"].set_type(T);
    attr["Tkey"].set_type(TypeAttr(find, "Tin"));
    attr["missing_key"].set_s(checked ? "error" : "default");
    attr["missing_id"].set_i(missing_id);
    attr["wrap_negative_ids"].set_b(!ids.wrap.empty());
    SetKeyRuleAttrs(rules, fused);
    ctx->Matched(record);
  }

  // Only this gather's own part of its negative-index wrap: the ids stay for the other gathers.
  static void AbsorbWrap(RewriteContext* ctx, const std::vector<const NodeDef*>& wrap, const std::string& fused,
                         std::vector<std::string>* replaced) {
    for (const NodeDef* n : wrap) {
      replaced->push_back(Describe(*n));
      ctx->RedirectControlEdges(n->name(), fused);
    }
    for (const NodeDef* n : wrap)
      for (int i = 0; i < n->input_size(); ++i) RemoveIfDeadShapeMath(ctx, ctx->index().Producer(*n, i), fused, 4);
    for (const NodeDef* n : wrap) ctx->Remove(n->name(), fused);
  }

  static void SetKeyRuleAttrs(const KerasKeyRules& rules, NodeDef* fused) {
    auto& attr = *fused->mutable_attr();
    attr["num_masks"].set_i(rules.mask != nullptr ? 1 : 0);
    attr["oov_slots"].set_i(rules.oov_slots);
    attr["oov_id"].set_i(rules.oov_id);
    attr["oov_start"].set_i(rules.oov_start);
  }
};

REGISTER_CTR_FUSION_PATTERN(VocabLookupPattern);

}  // namespace
}  // namespace grappler
}  // namespace tf_ctr

// Pattern: an indicator column of a vocabulary column
// (tf.compat.v1.feature_column.indicator_column over
// categorical_column_with_vocabulary_list / _file, with or without OOV
// buckets):
//
//   ids   = LookupTableFindV2(table, keys, default)   [+ the OOV buckets, as vocab_find.h matches them]
//   dense = SparseToDense(indices, dense_shape, [Identity ->] ids, d)   validate_indices, d < 0
//   Sum(OneHot(dense, depth, 1, 0, axis=-1), axis=1 or -2)
//
// becomes, under the Sum's name,
//
//   CtrVocabIndicator(table, default, keys, indices, dense_shape)   depth, num_oov_buckets
//
// which counts each row's ids in [0, depth) without the [B, N] ids or the
// [B, N, depth] one-hot tensor. Exact: OneHot gives an id outside
// [0, depth) (the negative fill d among them) a row of zeros, so the Sum of
// a row is its count of each id, a sum of ones; the fused op checks the
// indices as SparseToDense does. CPU serving only, as the tables are.
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

constexpr char kName[] = "vocab_indicator";
constexpr char kFusedOp[] = "CtrVocabIndicator";

class VocabIndicatorPattern : public NamedPattern<kName> {
 public:
  bool Rewrite(const NodeDef& anchor, RewriteContext* ctx) const override {
    if (!IsOp(&anchor, "Sum") || BoolAttr(anchor, "keep_dims", false)) return false;
    const GraphIndex& g = ctx->index();
    int port = 0;
    const NodeDef* one_hot = g.Producer(anchor, 0, &port);
    if (!IsOp(one_hot, "OneHot") || port != 0) return false;
    const NodeDef* dense = g.Producer(*one_hot, 0, &port);
    if (!IsOp(dense, "SparseToDense") || port != 0) return false;
    VocabIds ids;
    OovBuckets oov;
    const NodeDef* x = g.Producer(*dense, 2, &port);
    while (IsOp(x, "Identity")) {
      ids.identities.push_back(x);
      x = g.Producer(*x, 0, &port);
    }
    if (!MatchBucketedFind(g, x, port, &ids, &oov)) return false;

    // The subgraph has the right shape; now every condition for exactness.
    if (!ServedOnCpu(ctx, anchor))
      return Skip(ctx, anchor, "CtrVocabIndicator runs on the CPU (lookup tables live on the host): "
                               "rewrite with serving_device='cpu' for a CPU server");
    std::string why;
    if (!FindTypesFuse(ctx, *ids.find, &why) || !FindOnAnchorDevice(*ids.find, anchor, &why) ||
        !EncodesCounts(ctx, anchor, *one_hot, *dense, &why) || !FindsAVectorOfKeys(ctx, *ids.find, &why) ||
        !BucketedFindFeedsOneReader(ctx, ids, oov, &why) ||
        !OnlyReadBy(ctx, *dense, 1, &why) || !OnlyReadBy(ctx, *one_hot, 1, &why))
      return Skip(ctx, anchor, why);

    Replace(anchor, ids, oov, *one_hot, *dense, ctx);
    return true;
  }

 private:
  // Whether the Sum adds up one-hot rows of the densified ids over their
  // columns: a float OneHot on the last axis of [B, N] ids, of 1 and 0 and a
  // constant depth, a SparseToDense that checks its int64 indices and fills
  // with a negative constant, and the Sum over axis 1 of the [B, N, depth].
  static bool EncodesCounts(RewriteContext* ctx, const NodeDef& sum, const NodeDef& one_hot, const NodeDef& dense,
                            std::string* why) {
    const GraphIndex& g = ctx->index();
    const DataType t = TypeAttr(sum, "T");
    int64_t depth = -1, fill = 0, axis = 0;
    if (t != tensorflow::DT_FLOAT && t != tensorflow::DT_DOUBLE) {
      *why = "the one-hot encoding is " + tensorflow::DataType_Name(t) + ", not float32 or float64";
    } else if (IntAttr(one_hot, "axis", -1) != -1 || !ConstScalarInt(g.Producer(one_hot, 1), &depth) || depth < 0 ||
               !IsScalarConst(g, g.Producer(one_hot, 2), 1) || !IsScalarConst(g, g.Producer(one_hot, 3), 0)) {
      *why = Describe(one_hot) + " is not a one-hot of 1 and 0 on a new last axis of a constant depth";
    } else if (!BoolAttr(dense, "validate_indices", true) || TypeAttr(dense, "Tindices") != tensorflow::DT_INT64) {
      *why = Describe(dense) + " does not check its int64 indices";
    } else if (!ConstScalarInt(g.Producer(dense, 3), &fill) || fill >= 0) {
      *why = Describe(dense) + " fills with no negative constant (a fill would count as an id)";
    } else if (ctx->Rank(dense, 0) != 2) {
      *why = "cannot prove the densified ids are a [B, N] matrix";
    } else if (!SumsOneAxis(g.Producer(sum, 1), &axis) || (axis != 1 && axis != -2)) {
      *why = Describe(sum) + " does not sum over the ids' column axis alone";
    } else {
      return true;
    }
    return false;
  }

  // SparseToDense also takes one scalar value for every index, where the
  // fused op reads one key per index.
  static bool FindsAVectorOfKeys(RewriteContext* ctx, const NodeDef& find, std::string* why) {
    if (ctx->Rank(find, 0) == 1) return true;
    *why = "cannot prove " + Describe(find) + " finds a vector of keys, one per index (SparseToDense also "
           "broadcasts a scalar)";
    return false;
  }

  // The one axis a reduction's constant names (a scalar or a vector of one).
  static bool SumsOneAxis(const NodeDef* axes, int64_t* axis) {
    std::vector<int64_t> v;
    if (ConstScalarInt(axes, axis)) return true;
    if (!ConstIntVector(axes, &v) || v.size() != 1) return false;
    *axis = v[0];
    return true;
  }

  void Replace(const NodeDef& anchor_in, const VocabIds& ids, const OovBuckets& oov, const NodeDef& one_hot_in,
               const NodeDef& dense_in, RewriteContext* ctx) const {
    const NodeDef anchor = anchor_in, one_hot = one_hot_in, dense = dense_in;  // the graph changes under them
    const NodeDef find = *ids.find;
    const std::string name = anchor.name();
    const int64_t depth = [&] {
      int64_t d = 0;
      ConstScalarInt(ctx->index().Producer(one_hot, 1), &d);
      return d;
    }();
    MatchRecord record{kName, name, kFusedOp, {}};
    const std::vector<std::string> waits =
        AbsorbBucketedFind(ctx, ids, oov, name, {anchor, one_hot, dense}, &record.replaced);
    for (const NodeDef* n : {&dense, &one_hot}) {
      record.replaced.push_back(Describe(*n));
      ctx->RedirectControlEdges(n->name(), name);
    }
    record.replaced.push_back(Describe(anchor));
    // The constants only they read go with them.
    const GraphIndex& g = ctx->index();
    for (int i : {1, 2, 3}) RemoveIfDeadShapeMath(ctx, g.Producer(one_hot, i), name, 1);
    RemoveIfDeadShapeMath(ctx, g.Producer(dense, 3), name, 1);
    RemoveIfDeadShapeMath(ctx, g.Producer(anchor, 1), name, 1);
    for (const NodeDef* n : {&dense, &one_hot}) ctx->Remove(n->name(), name);

    NodeDef* fused = ctx->Mutable(name);
    const DataType t = TypeAttr(anchor, "T");
    fused->set_op(kFusedOp);
    fused->clear_input();
    for (const std::string& in : {find.input(0), find.input(2), find.input(1), dense.input(0), dense.input(1)})
      fused->add_input(in);
    AddControlInputsOnce(waits, fused);
    auto& attr = *fused->mutable_attr();
    attr.clear();
    attr["T"].set_type(t);
    attr["Tkey"].set_type(TypeAttr(find, "Tin"));
    attr["depth"].set_i(depth);
    attr["num_oov_buckets"].set_i(oov.buckets);
    ctx->Matched(record);
  }
};

REGISTER_CTR_FUSION_PATTERN(VocabIndicatorPattern);

}  // namespace
}  // namespace grappler
}  // namespace tf_ctr

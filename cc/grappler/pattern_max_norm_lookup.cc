// Pattern: the clip of tf.nn.embedding_lookup_sparse(..., max_norm=c), after
// the pooling itself was fused (sparse_segment_lookup or weighted_lookup):
//
//   rows  = {ResourceGather | GatherV2}(table, Unique(ids).y) [-> Identity]
//   l2sum = Sum(rows * rows | Square(rows), [1], keep_dims)
//   pred  = l2sum > 0
//   l2    = Select(pred, Sqrt(Select(pred, l2sum, ones_like(l2sum))), l2sum)
//   clip  = rows * c / Maximum(l2, c)                        (tf.clip_by_norm;
//                                                             no Mul once Grappler drops "* 1")
//   CtrEmbeddingLookup(clip, Unique.idx, ...)
//
// becomes CtrEmbeddingLookup(table, ids, ...) with max_norm = c, whose clip is
// the same function of each row: rows * c / max(|row|, c), NaN rows staying
// NaN (Maximum propagates NaN). Only float32 tables: TF clips half rows in
// half precision, where squares overflow that the fused op keeps in float32.
#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "cc/grappler/absorbed_set.h"
#include "cc/grappler/gathered_rows.h"
#include "cc/grappler/pattern.h"
#include "tensorflow/core/framework/attr_value.pb.h"

namespace tf_ctr {
namespace grappler {
namespace {

using tensorflow::NodeDef;

constexpr char kName[] = "max_norm_lookup";

// The clip's nodes, found from its output.
struct Clip {
  float max_norm = 0.f;
  std::string rows;  // the clipped tensor
  std::vector<const NodeDef*> nodes;
};

// Of a binary op's inputs, the one that is a float32 scalar Const (its value
// in *c) and the other (*other), or false.
bool SplitConstOperand(const GraphIndex& g, const NodeDef& op, float* c, std::string* other) {
  float unused = 0.f;
  for (int i : {0, 1}) {
    if (ConstScalarFloat(g.Producer(op, i), c) && !ConstScalarFloat(g.Producer(op, 1 - i), &unused)) {
      *other = op.input(1 - i);
      return true;
    }
  }
  return false;
}

bool IsLastAxis(const GraphIndex& g, const NodeDef& sum) {
  std::vector<int64_t> axes;
  int64_t axis = 0;
  if (ConstIntVector(g.Producer(sum, 1), &axes)) return axes == std::vector<int64_t>{1} || axes == std::vector<int64_t>{-1};
  return ConstScalarInt(g.Producer(sum, 1), &axis) && (axis == 1 || axis == -1);
}

// Fills *clip from the node producing the clipped rows, or says why not.
bool MatchClip(const GraphIndex& g, const NodeDef* out, Clip* clip, std::string* why) {
  std::vector<const NodeDef*> identities;
  const NodeDef* div = SkipIdentities(g, out, &identities);
  if (!IsOp(div, "RealDiv")) return false;
  const NodeDef* scaled = g.Producer(*div, 0);
  const NodeDef* maximum = g.Producer(*div, 1);
  if (!IsOp(maximum, "Maximum")) return false;
  if (TypeAttr(*div, "T") != tensorflow::DT_FLOAT) {
    *why = "clip dtype " + tensorflow::DataType_Name(TypeAttr(*div, "T")) +
           " is not float32 (TF clips half rows in half precision)";
    return false;
  }
  float c = 0.f, c2 = 0.f;
  std::string rows, l2_name;
  if (!SplitConstOperand(g, *maximum, &c2, &l2_name)) return false;
  // Grappler's arithmetic optimizer drops the Mul when max_norm is 1.
  if (!IsOp(scaled, "Mul") || !SplitConstOperand(g, *scaled, &c, &rows)) {
    scaled = nullptr;
    rows = div->input(0);
    c = 1.f;
  }
  const NodeDef* l2 = g.Node(ParseTensorName(l2_name).node);
  if (!IsSelect(l2)) return false;
  const NodeDef* pred = g.Producer(*l2, 0);
  const NodeDef* sqrt = g.Producer(*l2, 1);
  const NodeDef* safe = sqrt && IsOp(sqrt, "Sqrt") ? g.Producer(*sqrt, 0) : nullptr;
  if (!IsOp(pred, "Greater") || !IsSelect(safe) || safe->input(0) != l2->input(0)) return false;
  const std::string l2sum_name = l2->input(2);
  const NodeDef* l2sum = g.Node(ParseTensorName(l2sum_name).node);
  if (!IsOp(l2sum, "Sum") || safe->input(1) != l2sum_name || pred->input(0) != l2sum_name) return false;
  const NodeDef* square = g.Producer(*l2sum, 0);
  const bool squared = IsOp(square, "Square") && square->input(0) == rows;
  const bool multiplied = IsOp(square, "Mul") && square->input(0) == rows && square->input(1) == rows;
  if (!squared && !multiplied) return false;

  // The right shape; now the conditions for an exact rewrite.
  if (c != c2) {
    *why = "the clip's Maximum uses another norm (" + std::to_string(c2) + ") than its Mul (" + std::to_string(c) + ")";
    return false;
  }
  if (!(c > 0.f) || c == std::numeric_limits<float>::infinity()) {
    *why = "max_norm " + std::to_string(c) + " is not a positive finite number";
    return false;
  }
  float zero = 1.f;
  if (!ConstScalarFloat(g.Producer(*pred, 1), &zero) || zero != 0.f) {
    *why = "the clip's norm test is not l2sum > 0";
    return false;
  }
  if (!BoolAttr(*l2sum, "keep_dims", false) || !IsLastAxis(g, *l2sum)) {
    *why = "the squared norm is not summed over axis 1 with keep_dims";
    return false;
  }
  // The kernels run with denormals flushed, where a denormal max_norm reads
  // as 0 (no clipping); TF's own clip of such a norm gives zeros, as the
  // least normal float does.
  clip->max_norm = std::max(c, std::numeric_limits<float>::min());
  clip->rows = rows;
  clip->nodes = identities;
  for (const NodeDef* n : {div, scaled, maximum, l2, sqrt, safe, pred, l2sum, square})
    if (n != nullptr) clip->nodes.push_back(n);
  // ones_like(l2sum) only keeps Sqrt's gradient finite; its value never
  // reaches the output. It goes with the clip when it is one of TF's forms.
  const NodeDef* ones = g.Producer(*safe, 2);
  if (IsOp(ones, "OnesLike") && ones->input(0) == l2sum_name) {
    clip->nodes.push_back(ones);
  } else if (IsOp(ones, "Fill") && IsOp(g.Producer(*ones, 0), "Shape") && g.Producer(*ones, 0)->input(0) == l2sum_name) {
    clip->nodes.push_back(ones);
    clip->nodes.push_back(g.Producer(*ones, 0));
  } else if (!IsOp(ones, "Const")) {
    *why = "the clip's placeholder norm is neither ones_like(l2sum) nor a constant";
    return false;
  }
  return true;
}

class MaxNormLookupPattern : public NamedPattern<kName> {
 public:
  bool Rewrite(const NodeDef& anchor, RewriteContext* ctx) const override {
    if (!IsOp(&anchor, "CtrEmbeddingLookup") || StringAttr(anchor, "segment_kind") != "row_ids" ||
        StringAttr(anchor, "id_mode") != "index")
      return false;
    const GraphIndex& g = ctx->index();
    int idx_port = 0;
    const NodeDef* unique = g.Producer(anchor, 1, &idx_port);
    if (!IsOp(unique, "Unique") || idx_port != 1) return false;
    Clip clip;
    std::string why;
    if (!MatchClip(g, g.Producer(anchor, 0), &clip, &why)) return why.empty() ? false : Skip(ctx, anchor, why);
    const auto max_norm = anchor.attr().find("max_norm");  // absent: the default, -1
    if ((max_norm != anchor.attr().end() && max_norm->second.f() > 0.f) || StringAttr(anchor, "invalid_ids") != "error" ||
        IntAttr(anchor, "default_id", -1) != -1 || BoolAttr(anchor, "prune_weights", false))
      return Skip(ctx, anchor, "the pooled lookup already clips, drops or defaults ids");

    // rows = Gather(table, Unique.y), possibly through Identity nodes.
    std::vector<const NodeDef*> identities;
    int y_port = 0;
    const NodeDef* rows = g.Node(ParseTensorName(clip.rows).node);
    const NodeDef* gather = SkipIdentities(g, rows, &identities);
    const bool resource = IsOp(gather, "ResourceGather");
    if (!(resource || IsOp(gather, "GatherV2")) || g.Producer(*gather, 1, &y_port) != unique || y_port != 0)
      return Skip(ctx, anchor, "the clipped rows are not Gather(table, Unique(ids).y)");
    if (!GathersWholeRows(g, *gather, &why)) return Skip(ctx, anchor, why);
    const int rank = resource ? ResourceTableRank(ctx, *gather) : ctx->Rank(*gather, 0);
    if (rank != 2)
      return Skip(ctx, anchor, rank < 0 ? "cannot prove the table is a matrix (rank unknown)" : "the table is not a matrix");
    const tensorflow::DataType key_type = TypeAttr(*unique, "T");
    if (!IsIndexDtype(key_type)) return Skip(ctx, anchor, "ids are not int32/int64");

    std::vector<const NodeDef*> absorbed = clip.nodes;
    absorbed.insert(absorbed.end(), identities.begin(), identities.end());
    absorbed.push_back(gather);
    absorbed.push_back(unique);
    std::string outsider;
    if (!OnlyReadWithin(g, &absorbed, anchor, &outsider))
      return Skip(ctx, anchor, "intermediate " + outsider + " has another consumer");

    // Rewrite: the table and the ids go straight into the lookup.
    RowSource src;
    src.keys = unique->input(0);
    src.key_type = key_type;
    src.grad_indices = "first_appearance";
    SetTableOfGather(*gather, resource, &src);
    src.absorbed = absorbed;
    FuseHashProducer(ctx, &src);
    const std::string anchor_name = anchor.name();
    const std::string table = TableTensor(ctx, src, anchor_name + "/ctr_table");
    MatchRecord record{kName, anchor_name, "CtrEmbeddingLookup", {}};
    AbsorbNodes(ctx, src.absorbed, anchor_name, &record);
    record.replaced.push_back(Describe(*ctx->index().Node(anchor_name)));
    NodeDef* fused = ctx->Mutable(anchor_name);
    *fused->mutable_input(0) = table;
    *fused->mutable_input(1) = src.keys;
    auto& attr = *fused->mutable_attr();
    attr["Tid"].set_type(src.key_type);
    attr["id_mode"].set_s(src.id_mode);
    attr["num_buckets"].set_i(src.num_buckets);
    SetHashKeyAttr(src.hash_key, fused);
    attr["max_norm"].set_f(clip.max_norm);
    attr["grad_indices"].set_s(src.grad_indices);
    ctx->Matched(record);
    return true;
  }
};

REGISTER_CTR_FUSION_PATTERN(MaxNormLookupPattern);

}  // namespace
}  // namespace grappler
}  // namespace tf_ctr

// Pattern: the weighted lookup of tf.nn.embedding_lookup_sparse(params, ids,
// weights, combiner), without max_norm, on a float32 table:
//
//   rows = GatherV2(gathered unique rows | table, idx)          (see gathered_rows.h)
//   w2   = Reshape(weights, [n, 1])
//   sum:   SegmentSum(rows * w2, seg)
//   mean:  DivNoNan(SegmentSum(rows * w2, seg), SegmentSum(w2, seg))
//   sqrtn: DivNoNan(SegmentSum(rows * w2, seg), Sqrt(SegmentSum(Pow(w2, 2), seg)))
//
// becomes one CtrEmbeddingLookup(table, ids, seg, weights) with has_weights.
#include <string>

#include "cc/grappler/gathered_rows.h"
#include "cc/grappler/pattern.h"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/tensor.pb.h"

namespace tf_ctr {
namespace grappler {
namespace {

using tensorflow::NodeDef;

constexpr char kName[] = "weighted_lookup";

bool ConstFloatEquals(const NodeDef* node, float value) {
  if (!IsOp(node, "Const")) return false;
  const tensorflow::TensorProto& t = node->attr().at("value").tensor();
  if (t.dtype() != tensorflow::DT_FLOAT || t.tensor_shape().dim_size() != 0) return false;
  if (!t.tensor_content().empty()) return false;
  return t.float_val_size() == 1 ? t.float_val(0) == value : (t.float_val_size() == 0 && value == 0.f);
}

// The nodes of one weighted pooling, found from its last node.
struct Weighted {
  std::string combiner;
  const NodeDef* weighted_sum = nullptr;  // SegmentSum(rows * w2, seg)
  const NodeDef* weight_sum = nullptr;    // SegmentSum(w2 or w2^2, seg)
  const NodeDef* sqrt = nullptr;
  const NodeDef* pow = nullptr;
  const NodeDef* mul = nullptr;
  const NodeDef* rows = nullptr;  // GatherV2
  const NodeDef* reshape = nullptr;
};

bool FindWeighted(const GraphIndex& g, const NodeDef& anchor, Weighted* w) {
  if (IsOp(&anchor, "SegmentSum")) {
    w->combiner = "sum";
    w->weighted_sum = &anchor;
  } else if (IsOp(&anchor, "DivNoNan")) {
    w->weighted_sum = g.Producer(anchor, 0);
    const NodeDef* den = g.Producer(anchor, 1);
    if (!IsOp(w->weighted_sum, "SegmentSum")) return false;
    if (IsOp(den, "SegmentSum")) {
      w->combiner = "mean";
      w->weight_sum = den;
    } else if (IsOp(den, "Sqrt") && IsOp(g.Producer(*den, 0), "SegmentSum")) {
      w->combiner = "sqrtn";
      w->sqrt = den;
      w->weight_sum = g.Producer(*den, 0);
      w->pow = g.Producer(*w->weight_sum, 0);
      // Grappler's arithmetic optimizer may have turned Pow(x, 2) into Square(x).
      if (!IsOp(w->pow, "Pow") && !IsOp(w->pow, "Square")) return false;
    } else {
      return false;
    }
  } else {
    return false;
  }
  w->mul = g.Producer(*w->weighted_sum, 0);
  if (!IsOp(w->mul, "Mul")) return false;
  w->rows = g.Producer(*w->mul, 0);
  w->reshape = g.Producer(*w->mul, 1);
  if (IsOp(w->rows, "Reshape")) std::swap(w->rows, w->reshape);
  return IsOp(w->rows, "GatherV2") && IsOp(w->reshape, "Reshape");
}

// Reshape(w, shape) yields [n, 1]: known statically, or built as
// embedding_lookup_sparse does, concat(Shape(w), Fill([rank - 1], 1)) with a
// rank-2 result.
bool ReshapedToColumn(const GraphIndex& g, RewriteContext* ctx, const NodeDef& reshape) {
  if (ctx->Rank(reshape, 0) == 2 && ctx->Dim(reshape, 0, 1) == 1) return true;
  const NodeDef* concat = g.Producer(reshape, 1);
  if (!IsOp(concat, "ConcatV2") || IntAttr(*concat, "N", 0) != 2) return false;
  const NodeDef* shape_of = g.Producer(*concat, 0);
  const NodeDef* fill = g.Producer(*concat, 1);
  int64_t one = 0;
  if (!IsOp(shape_of, "Shape") || shape_of->input(0) != reshape.input(0) || !IsOp(fill, "Fill") ||
      !ConstScalarInt(g.Producer(*fill, 1), &one) || one != 1)
    return false;
  // Fill's length is expand_dims(rank(rows) - 1): one 1 for matrix rows.
  const NodeDef* dims = g.Producer(*fill, 0);
  std::vector<int64_t> folded;
  if (ConstIntVector(dims, &folded)) return folded == std::vector<int64_t>{1};
  const NodeDef* sub = IsOp(dims, "ExpandDims") ? g.Producer(*dims, 0) : nullptr;
  int64_t rank = 0, minus = 0;
  return IsOp(sub, "Sub") && ConstScalarInt(g.Producer(*sub, 0), &rank) &&
         ConstScalarInt(g.Producer(*sub, 1), &minus) && rank - minus == 1;
}

class WeightedLookupPattern : public NamedPattern<kName> {
 public:
  bool Rewrite(const NodeDef& anchor, RewriteContext* ctx) const override {
    const GraphIndex& g = ctx->index();
    Weighted w;
    if (!FindWeighted(g, anchor, &w)) return false;
    const tensorflow::DataType T = TypeAttr(anchor, "T");
    if (T != tensorflow::DT_FLOAT)
      return Skip(ctx, anchor, "data dtype " + tensorflow::DataType_Name(T) +
                                   " is not float32 (the fused weighted op pools in float32, TF in the "
                                   "table's own precision)");
    const std::string seg = w.weighted_sum->input(1);
    const tensorflow::DataType Tseg = TypeAttr(*w.weighted_sum, "Tindices");
    if (!IsIndexDtype(Tseg)) return Skip(ctx, anchor, "segment ids are not int32/int64");
    if (w.weight_sum != nullptr) {
      if (w.weight_sum->input(1) != seg) return Skip(ctx, anchor, "the weight sums use other segment ids");
      const NodeDef* summed = g.Producer(*w.weight_sum, 0);
      const bool squares = w.pow && g.Producer(*w.pow, 0) == w.reshape &&
                           (IsOp(w.pow, "Square") || ConstFloatEquals(g.Producer(*w.pow, 1), 2.f));
      if (w.pow ? !squares : summed != w.reshape)
        return Skip(ctx, anchor, "the weight sums do not sum the same weights");
    }
    // w2 = Reshape(weights, [n, 1]) of a weight vector.
    int wport = 0;
    const NodeDef* weights = g.Producer(*w.reshape, 0, &wport);
    if (weights == nullptr || ctx->Rank(*weights, wport) != 1 || !ReshapedToColumn(g, ctx, *w.reshape))
      return Skip(ctx, anchor, "cannot prove the weights are a vector reshaped to [n, 1] (weights rank " +
                                   std::to_string(weights ? ctx->Rank(*weights, wport) : -1) + ", reshaped rank " +
                                   std::to_string(ctx->Rank(*w.reshape, 0)) + ")");
    if (TypeAttr(*w.reshape, "T") != tensorflow::DT_FLOAT) return Skip(ctx, anchor, "weights are not float32");
    int64_t axis = -1;
    if (!ConstScalarInt(g.Producer(*w.rows, 2), &axis) || axis != 0 || IntAttr(*w.rows, "batch_dims", 0) != 0)
      return Skip(ctx, anchor, "the row gather is not along axis 0 (axis from " +
                                   (g.Producer(*w.rows, 2) ? Describe(*g.Producer(*w.rows, 2)) : std::string("?")) + ")");

    RowSource src;
    std::string why;
    const SourceMatch shape = MatchGatheredRows(*w.rows, 0, 1, ctx, &src, &why);
    if (shape == SourceMatch::kRejected) return Skip(ctx, anchor, why);
    if (shape == SourceMatch::kOther && !MatchDirectRows(*w.rows, 0, 1, TypeAttr(*w.rows, "Tindices"), ctx, &src, &why))
      return Skip(ctx, anchor, why);
    FuseHashProducer(ctx, &src);

    // Each intermediate must feed only this subgraph.
    const int reshape_readers = w.combiner == "sum" ? 1 : 2;
    std::vector<std::pair<const NodeDef*, int>> expected = {{w.rows, 1}, {w.mul, 1}, {w.reshape, reshape_readers}};
    if (w.weighted_sum != &anchor) expected.push_back({w.weighted_sum, 1});
    if (w.weight_sum) expected.push_back({w.weight_sum, 1});
    if (w.sqrt) expected.push_back({w.sqrt, 1});
    if (w.pow) expected.push_back({w.pow, 1});
    for (const auto& [node, readers] : expected)
      if (g.DataConsumers(node->name()) != readers)
        return Skip(ctx, anchor, "intermediate " + Describe(*node) + " has another consumer");

    // Rewrite.
    const std::string anchor_name = anchor.name();
    const std::string device = anchor.device();
    const std::string weights_tensor = w.reshape->input(0);
    const std::string num_rows = AddInt64Scalar(ctx, anchor_name + "/ctr_num_rows", -1, device);
    const std::string table = TableTensor(ctx, src, anchor_name + "/ctr_table");
    MatchRecord record{kName, anchor_name, "CtrEmbeddingLookup", {}};
    AbsorbSource(ctx, src, anchor_name, &record);
    for (const auto& [node, readers] : expected) {
      record.replaced.push_back(Describe(*node));
      ctx->RedirectControlEdges(node->name(), anchor_name);
      ctx->Remove(node->name(), anchor_name);
    }
    record.replaced.push_back(Describe(anchor));
    BecomeFusedLookup(ctx, anchor_name, src,
                      FusedLookup{table, seg, num_rows, weights_tensor, tensorflow::DT_FLOAT, Tseg, w.combiner,
                                  /*has_weights=*/true});
    ctx->Matched(record);
    return true;
  }
};

REGISTER_CTR_FUSION_PATTERN(WeightedLookupPattern);

}  // namespace
}  // namespace grappler
}  // namespace tf_ctr

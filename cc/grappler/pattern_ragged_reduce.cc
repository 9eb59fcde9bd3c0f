// Pattern: the sum over the ragged dimension of gathered rows --
// tf.reduce_sum(tf.nn.embedding_lookup(table, ragged_ids), axis=1):
//
//   rows = {ResourceGather | GatherV2}(table, ids.values) [-> Identity]
//   UnsortedSegmentSum(rows, RaggedSplitsToSegmentIds(splits), len(splits) - 1)
//
// becomes CtrEmbeddingLookup(table, ids.values, splits) in row_splits mode
// with combiner sum. When the ids are the tokens of tf.strings.split(strings,
// sep) converted by to_number(int64) or to_hash_bucket_fast, and the splits
// are that split's row partition, the whole chain becomes CtrPackStrings +
// CtrStringEmbedding (skip_empty false: tf.strings.split keeps empty tokens).
//
// The segment ids and the row partition are recognized by what they are
// computed from (the splits alone, or the split's outputs alone) and by the
// ops that make RaggedSplitsToSegmentIds (Range, Tile, Where) and
// RowPartitionFromValueRowIds (a bincount, Cumsum), not node by node:
// Grappler's own passes reshape those subgraphs before custom optimizers run.
//
// tf.reduce_mean adds RealDiv(sum, count), count = UnsortedSegmentSum of
// ones_like(rows) over the same segments. On int ids the sum is fused and
// the count becomes the row lengths of the splits (cast, one column): an
// empty row stays 0 / 0 = NaN, as TF gives it, where the fused mean would
// give 0. On split strings no row is empty (tf.strings.split gives an empty
// string one empty token), so the fused mean replaces the division.
//
// Only float32 tables: UnsortedSegmentSum adds half and bfloat16 rows in
// their own precision (2048 + 1 + 1 + 1 stays 2048 in half), where the fused
// op accumulates in float32 and rounds once.
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cc/grappler/gathered_rows.h"
#include "cc/grappler/pattern.h"
#include "cc/grappler/vocab_find.h"
#include "cc/grappler/keras_gather.h"
#include "cc/grappler/split_source.h"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/tensor.pb.h"
#include "tensorflow/core/framework/tensor_shape.pb.h"

namespace tf_ctr {
namespace grappler {
namespace {

using tensorflow::DataType;
using tensorflow::NodeDef;

constexpr char kName[] = "ragged_reduce_lookup";

// len(splits) - 1, as RaggedReduceSum computes its segment count: the splits tensor, or "".
std::string SplitsOfRowCount(const GraphIndex& g, const NodeDef& sub) {
  int64_t one = 0;
  if (!IsOp(&sub, "Sub") || !ConstScalarInt(g.Producer(sub, 1), &one) || one != 1) return "";
  const NodeDef* slice = g.Producer(sub, 0);
  if (!IsFirstElementSlice(g, slice)) return "";
  const NodeDef* shape = g.Producer(*slice, 0);
  if (!IsOp(shape, "Shape")) return "";
  const TensorId s = ParseTensorName(shape->input(0));
  return TensorName(s.node, s.port);
}

// S in RaggedSplitsToSegmentIds(S): row lengths are S[1:] - S[:-1], a Sub
// of two StridedSlices of S. Empty unless exactly one such S is found.
std::string SplitsOfSegmentIds(const GraphIndex& g, const std::string& segment_ids, DataType* type) {
  constexpr size_t kMaxNodes = 400;
  std::vector<std::string> stack{segment_ids};
  std::set<std::string> seen, found;
  while (!stack.empty() && seen.size() < kMaxNodes) {
    const NodeDef* n = g.Node(ParseTensorName(stack.back()).node);
    stack.pop_back();
    if (n == nullptr || !IsIndexArithmetic(n->op()) || !seen.insert(n->name()).second) continue;
    if (n->op() == "Sub") {
      const NodeDef* hi = g.Producer(*n, 0);
      const NodeDef* lo = g.Producer(*n, 1);
      if (IsOp(hi, "StridedSlice") && IsOp(lo, "StridedSlice")) {
        const TensorId a = ParseTensorName(hi->input(0)), b = ParseTensorName(lo->input(0));
        if (a.node == b.node && a.port == b.port) {
          found.insert(TensorName(a.node, a.port));
          *type = TypeAttr(*hi, "T");  // StridedSlice's T is its input's dtype
        }
      }
    }
    for (const auto& in : n->input())
      if (!in.empty() && in[0] != '^') stack.push_back(in);
  }
  return found.size() == 1 ? *found.begin() : "";
}

// Whether `count` is len(splits) - 1: computed so, or a constant that the
// splits' static length confirms (functions specialized to their call's shapes).
bool IsRowCountOf(RewriteContext* ctx, const NodeDef& count, const std::string& splits) {
  if (SplitsOfRowCount(ctx->index(), count) == splits) return true;
  int64_t rows = 0;
  if (!ConstScalarInt(&count, &rows)) return false;
  const TensorId s = ParseTensorName(splits);
  const NodeDef* producer = ctx->index().Node(s.node);
  return producer != nullptr && ctx->Dim(*producer, s.port, 0) == rows + 1;
}

class RaggedReduceLookupPattern : public NamedPattern<kName> {
 public:
  bool Rewrite(const NodeDef& anchor, RewriteContext* ctx) const override {
    if (!IsOp(&anchor, "UnsortedSegmentSum")) return false;
    const GraphIndex& g = ctx->index();
    std::vector<const NodeDef*> identities;
    const NodeDef* gather = SkipIdentities(g, g.Producer(anchor, 0), &identities);
    const bool resource = IsOp(gather, "ResourceGather");
    const NodeDef* row_count = g.Producer(anchor, 2);
    DataType seg_type = tensorflow::DT_INVALID;
    const std::string splits = SplitsOfSegmentIds(g, anchor.input(1), &seg_type);
    if (row_count == nullptr || splits.empty()) return false;
    // vocab_lookup (stage 0) took the gather with its table's find: the rows
    // are a fused op's, which pools nothing.
    if (IsOp(gather, "CtrVocabEmbedding"))
      return Skip(ctx, anchor, "the rows come from a fused vocabulary lookup (CtrVocabEmbedding: the find and "
                               "the gather); its ragged pooling stays TF's");
    if (!resource && !IsOp(gather, "GatherV2")) return false;

    // The subgraph has the right shape; now every condition for exactness.
    std::set<std::string> index_nodes;
    if (!ComputedOnlyFrom(g, anchor.input(1), {splits}, {}, {{"Range"}, {"Tile"}, {"Where"}}, &index_nodes))
      return Skip(ctx, anchor, "segment ids are not RaggedSplitsToSegmentIds of the splits alone");
    if (!IsRowCountOf(ctx, *row_count, splits))
      return Skip(ctx, anchor, "the segment count is not len(splits) - 1");
    const DataType T = TypeAttr(anchor, "T");
    if (T != tensorflow::DT_FLOAT)
      return Skip(ctx, anchor, "data dtype " + tensorflow::DataType_Name(T) +
                                   " is not float32 (the fused op adds rows in float32, TF's UnsortedSegmentSum "
                                   "in the table's own precision)");
    std::string why;
    if (!GathersWholeRows(g, *gather, &why)) return Skip(ctx, anchor, why);
    MeanCount mean;
    const bool is_mean = MatchMean(ctx, anchor, splits, &mean);
    // The rows' reader besides the sum is the mean's ones_like.
    const NodeDef* rows = identities.empty() ? gather : identities.front();
    for (const NodeDef* n : identities)
      if (g.DataConsumers(n->name()) != 1 + (is_mean && n == rows)) return Skip(ctx, anchor, OtherConsumer(*n));
    if (g.DataConsumers(gather->name()) != 1 + (is_mean && gather == rows))
      return Skip(ctx, anchor, OtherConsumer(*gather));
    int ids_port = 0;
    const NodeDef* ids = g.Producer(*gather, 1, &ids_port);
    if (ids == nullptr || ctx->Rank(*ids, ids_port) != 1) return Skip(ctx, anchor, "ids are not known to be a vector");
    const int table_rank = resource ? ResourceTableRank(ctx, *gather) : ctx->Rank(*gather, 0);
    if (table_rank != 2)
      return Skip(ctx, anchor,
                  table_rank < 0 ? "cannot prove the table is a matrix (rank unknown)" : "the table is not a matrix");
    const DataType id_type = TypeAttr(*gather, "Tindices");
    if (!IsIndexDtype(id_type)) return Skip(ctx, anchor, "ids are not int32/int64");
    if (!IsIndexDtype(seg_type)) return Skip(ctx, anchor, "row splits are not int32/int64");

    // Everything checked: from here on the graph changes.
    RowSource src;
    src.keys = gather->input(1);
    src.key_type = id_type;
    SetTableOfGather(*gather, resource, &src);
    src.absorbed = {gather};
    src.absorbed.insert(src.absorbed.end(), identities.begin(), identities.end());
    std::set<std::string> dead = index_nodes;
    dead.insert(row_count->name());
    if (IsOp(row_count, "Sub")) {  // Sub(StridedSlice(Shape(splits)), 1), checked above
      const NodeDef* slice = g.Producer(*row_count, 0);
      dead.insert(slice->name());
      dead.insert(g.Producer(*slice, 0)->name());
    }

    if (is_mean) dead.insert(mean.nodes.begin(), mean.nodes.end());

    SplitSource split;
    const std::string name = anchor.name();
    if (MatchRaggedSplit(g, ctx, *ids, ids_port, splits, &split, &dead) ||
        MatchWrappedSplitHash(ctx, *ids, splits, &split, &dead)) {
      RewriteStrings(anchor, src, split, T, dead, is_mean ? mean.div : nullptr, ctx);
    } else {
      FuseHashProducer(ctx, &src, ServedOnCpu(ctx, anchor));
      const std::string div = is_mean ? mean.div->name() : "";
      RewriteIds(anchor, src, splits, T, seg_type, dead, is_mean ? mean.div : nullptr, ctx);
      if (!div.empty()) DivideByRowLengths(ctx, div, splits, seg_type, T, ctx->Mutable(name)->device());
    }
    return true;
  }

 private:
  static std::string OtherConsumer(const NodeDef& n) { return "intermediate " + Describe(n) + " has another consumer"; }

  // The hashed tokens of a split through Keras 3's wrap (an Embedding over
  // tf.ragged.map_flat_values of a Hashing layer's ids): a hash is never
  // negative, so the wrap passes them through and goes with the split, as
  // does its shift's shape math where only it reads it.
  static bool MatchWrappedSplitHash(RewriteContext* ctx, const NodeDef& ids, const std::string& splits,
                                    SplitSource* split, std::set<std::string>* dead) {
    const GraphIndex& g = ctx->index();
    std::vector<const NodeDef*> wrap;
    const NodeDef* hash = UnwrapNegativeIndexFix(g, &ids, &wrap);
    if (wrap.empty() || !IsStringHash(hash) || !WrapFeedsOnlyTheGather(ctx, wrap) ||
        !MatchRaggedSplit(g, ctx, *hash, 0, splits, split, dead, 3))
      return false;
    for (const NodeDef* n : wrap) dead->insert(n->name());
    std::vector<const NodeDef*> math = WrapOperands(g, wrap);
    for (size_t i = 0; i < math.size(); ++i) {  // the shift: Cast(StridedSlice(Shape(params), ...))
      static const std::set<std::string> kShapeMath = {"Const", "Cast", "StridedSlice", "Shape"};
      if (!kShapeMath.count(math[i]->op()) || HasControlInputs(*math[i])) continue;
      dead->insert(math[i]->name());
      if (IsOp(math[i], "Shape")) continue;  // what it reads is the table's
      for (int k = 0; k < math[i]->input_size(); ++k)
        if (const NodeDef* in = g.Producer(*math[i], k)) math.push_back(in);
    }
    return true;
  }

  // RaggedReduceMean's division and the nodes of its count.
  struct MeanCount {
    const NodeDef* div = nullptr;
    std::set<std::string> nodes;  // the count and what only it reads
  };

  static bool IsScalarOne(const NodeDef* node) {
    if (!IsOp(node, "Const")) return false;
    const tensorflow::TensorProto& t = node->attr().at("value").tensor();
    if (t.tensor_shape().dim_size() != 0) return false;
    switch (t.dtype()) {
      case tensorflow::DT_FLOAT:
        return t.float_val_size() == 1 ? t.float_val(0) == 1.f
                                       : t.tensor_content().size() == 4 && t.tensor_content() == std::string("\0\0\x80\x3f", 4);
      case tensorflow::DT_HALF:
        return t.half_val_size() == 1 && t.half_val(0) == 0x3C00;
      case tensorflow::DT_BFLOAT16:
        return t.half_val_size() == 1 && t.half_val(0) == 0x3F80;
      default:
        return false;
    }
  }

  // anchor / UnsortedSegmentSum(ones_like(the anchor's rows), the same
  // segments, the same count): what tf.reduce_mean over the ragged axis adds.
  static bool MatchMean(RewriteContext* ctx, const NodeDef& anchor, const std::string& splits, MeanCount* out) {
    const GraphIndex& g = ctx->index();
    const auto& readers = g.DataReaders(anchor.name());
    if (readers.size() != 1 || !IsOp(readers[0], "RealDiv") || g.Consumers(anchor.name(), 0) != 1) return false;
    const NodeDef* div = readers[0];
    int port = 0;
    if (g.Producer(*div, 0, &port) != &anchor || port != 0) return false;
    const NodeDef* count = g.Producer(*div, 1, &port);
    if (!IsOp(count, "UnsortedSegmentSum") || port != 0 || count == &anchor || g.DataConsumers(count->name()) != 1)
      return false;
    const NodeDef* ones = g.Producer(*count, 0);
    if (ones == nullptr || g.DataConsumers(ones->name()) != 1) return false;
    std::string rows_tensor;
    std::set<std::string> nodes{count->name(), ones->name()};
    if (IsOp(ones, "OnesLike")) {
      rows_tensor = ones->input(0);
    } else if (IsOp(ones, "Fill") && IsScalarOne(g.Producer(*ones, 1))) {
      const NodeDef* shape = g.Producer(*ones, 0);
      if (!IsOp(shape, "Shape") || g.DataConsumers(shape->name()) != 1) return false;
      rows_tensor = shape->input(0);
      nodes.insert({shape->name(), g.Producer(*ones, 1)->name()});
    } else {
      return false;
    }
    const TensorId a = ParseTensorName(rows_tensor), b = ParseTensorName(anchor.input(0));
    if (a.node != b.node || a.port != b.port) return false;
    DataType seg_type = tensorflow::DT_INVALID;
    const NodeDef* row_count = g.Producer(*count, 2);
    if (SplitsOfSegmentIds(g, count->input(1), &seg_type) != splits || row_count == nullptr ||
        !IsRowCountOf(ctx, *row_count, splits))
      return false;
    if (!ComputedOnlyFrom(g, count->input(1), {splits}, {}, {{"Range"}, {"Tile"}, {"Where"}}, &nodes)) return false;
    nodes.insert(row_count->name());
    if (IsOp(row_count, "Sub")) {
      const NodeDef* slice = g.Producer(*row_count, 0);
      nodes.insert({slice->name(), g.Producer(*slice, 0)->name()});
    }
    out->div = div;
    out->nodes = std::move(nodes);
    return true;
  }

  // Points the mean's division at count = cast(splits[1:] - splits[:-1]) as
  // one column: TF's count of ones per row, so an empty row is still 0 / 0.
  static void DivideByRowLengths(RewriteContext* ctx, const std::string& div, const std::string& splits,
                                 DataType seg_type, DataType T, const std::string& device) {
    const std::string base = div + "/ctr_row_lengths";
    auto slice = [&](const std::string& which, int64_t begin, int64_t end, bool begin_mask, bool end_mask) {
      NodeDef* n = ctx->AddNode(base + "/" + which, "StridedSlice", device);
      n->add_input(splits);
      for (int64_t v : {begin, end, int64_t{1}}) n->add_input(AddInt64Vector(ctx, n->name() + "/arg", {v}, device));
      auto& attr = *n->mutable_attr();
      attr["T"].set_type(seg_type);
      attr["Index"].set_type(tensorflow::DT_INT64);
      attr["begin_mask"].set_i(begin_mask ? 1 : 0);
      attr["end_mask"].set_i(end_mask ? 1 : 0);
      for (const char* m : {"ellipsis_mask", "new_axis_mask", "shrink_axis_mask"}) attr[m].set_i(0);
      return n->name();
    };
    const std::string hi = slice("ends", 1, 0, false, true);
    const std::string lo = slice("starts", 0, -1, true, false);
    NodeDef* sub = ctx->AddNode(base, "Sub", device);
    sub->add_input(hi);
    sub->add_input(lo);
    (*sub->mutable_attr())["T"].set_type(seg_type);
    const std::string lengths = AddCast(ctx, base + "/cast", sub->name(), seg_type, T, device);
    NodeDef* column = ctx->AddNode(base + "/column", "ExpandDims", device);
    column->add_input(lengths);
    column->add_input(AddInt64Scalar(ctx, base + "/axis", -1, device));
    (*column->mutable_attr())["T"].set_type(T);
    (*column->mutable_attr())["Tdim"].set_type(tensorflow::DT_INT64);
    ctx->Mutable(div)->set_input(1, column->name());
  }

  void RewriteIds(const NodeDef& anchor_in, const RowSource& src, const std::string& splits, DataType T,
                  DataType seg_type, const std::set<std::string>& dead, const NodeDef* mean_div,
                  RewriteContext* ctx) const {
    const NodeDef anchor = anchor_in;
    const std::string name = anchor.name(), device = anchor.device();
    std::set<std::string> replaced{name};
    if (mean_div != nullptr) replaced.insert(mean_div->name());  // its count is replaced
    for (const NodeDef* n : src.absorbed) replaced.insert(n->name());
    RemoveDeadNodes(ctx, dead, replaced, name);
    const std::string num_rows = AddInt64Scalar(ctx, name + "/ctr_num_rows", -1, device);
    const std::string weights = AddEmptyFloatVector(ctx, name + "/ctr_no_weights", device);
    const std::string table = TableTensor(ctx, src, name + "/ctr_table");
    MatchRecord record{kName, name, "CtrEmbeddingLookup", {}};
    AbsorbSource(ctx, src, name, &record);
    record.replaced.push_back(Describe(anchor));
    if (mean_div != nullptr) record.replaced.push_back("the row count of " + Describe(*mean_div));
    BecomeFusedLookup(ctx, name, src, FusedLookup{table, splits, num_rows, weights, T, seg_type, "sum", false});
    (*ctx->Mutable(name)->mutable_attr())["segment_kind"].set_s("row_splits");
    ctx->Matched(record);
  }

  void RewriteStrings(const NodeDef& anchor_in, const RowSource& src, const SplitSource& split, DataType T,
                      const std::set<std::string>& dead_in, const NodeDef* mean_div, RewriteContext* ctx) const {
    const NodeDef anchor = anchor_in;
    const std::string name = anchor.name(), device = anchor.device();
    const std::string strings = split.split->input(0);
    const int64_t buckets = split.hashed ? IntAttr(*split.convert, "num_buckets", 0) : 0;
    std::set<std::string> dead = dead_in;
    dead.insert(split.convert->name());
    std::set<std::string> replaced{name};
    for (const NodeDef* n : src.absorbed) replaced.insert(n->name());
    const std::string div = mean_div != nullptr ? mean_div->name() : "";
    if (!div.empty()) replaced.insert(div);
    MatchRecord record{kName, name, "CtrStringEmbedding", {}};
    for (const NodeDef* n : {split.split, split.convert}) record.replaced.push_back(Describe(*n));
    if (!div.empty()) record.replaced.push_back(Describe(*mean_div));
    RemoveDeadNodes(ctx, dead, replaced, name);
    const std::string table = TableTensor(ctx, src, name + "/ctr_table");
    AbsorbSource(ctx, src, name, &record);
    record.replaced.push_back(Describe(anchor));

    NodeDef* fused = ctx->Mutable(name);
    fused->clear_input();
    fused->clear_attr();
    FusedStrings f{table, strings, T};
    f.vector_only = true;
    f.id_mode = split.hashed ? "hash" : "index";
    f.delimiter = split.delimiter;  // empty tokens kept, as tf.strings.split keeps them
    f.num_buckets = buckets;
    if (split.hashed) f.hash_key = StringHashKey(*split.convert);
    if (!div.empty()) f.combiner = "mean";
    BecomeStringEmbedding(ctx, name, device, f, fused);
    CopyControlInputs(anchor, fused);
    for (const NodeDef* n : src.absorbed) CopyControlInputs(*n, fused);
    if (!div.empty()) {
      // The division becomes a pass-through of the fused mean (it may be fetched).
      NodeDef* pass = ctx->Mutable(div);
      pass->set_op("Identity");
      pass->clear_attr();
      (*pass->mutable_attr())["T"].set_type(T);
      std::vector<std::string> controls;
      AppendControlInputs(*pass, &controls);
      pass->clear_input();
      pass->add_input(name);
      for (const auto& c : controls) pass->add_input(c);
    }
    ctx->Matched(record);
  }
};

REGISTER_CTR_FUSION_PATTERN(RaggedReduceLookupPattern);

}  // namespace
}  // namespace grappler
}  // namespace tf_ctr

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
// reduce_mean is left alone: TF's mean of an empty row is 0 / 0 = NaN where
// the fused mean gives 0, and the gathered rows feed its count too.
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cc/grappler/gathered_rows.h"
#include "cc/grappler/pattern.h"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/tensor.pb.h"
#include "tensorflow/core/framework/tensor_shape.pb.h"

namespace tf_ctr {
namespace grappler {
namespace {

using tensorflow::DataType;
using tensorflow::NodeDef;

constexpr char kName[] = "ragged_reduce_lookup";

// Stateless ops the two index subgraphs are built from.
const std::set<std::string>& IndexArithmeticOps() {
  static const auto* ops = new std::set<std::string>{
      "BroadcastTo", "Bincount", "Cast", "ConcatV2", "Const", "Cumsum", "DenseBincount", "ExpandDims",
      "Fill", "GatherV2", "Greater", "Identity", "Less", "Max", "Maximum", "Minimum", "Mul", "Pack",
      "Prod", "Range", "Reshape", "Shape", "Size", "Squeeze", "StridedSlice", "Sub", "AddV2", "Add", "Tile",
      "Where", "ZerosLike", "OnesLike"};
  return *ops;
}

// The nodes between `root` and `sources`: root is computed only from the
// given tensors (any output of the source nodes) and constants, through
// IndexArithmeticOps, and every op in `required` occurs on the way.
bool ComputedOnlyFrom(const GraphIndex& g, const std::string& root, const std::set<std::string>& source_tensors,
                      const std::set<std::string>& source_nodes, const std::vector<std::vector<std::string>>& required,
                      std::set<std::string>* nodes) {
  constexpr size_t kMaxNodes = 400;
  std::vector<std::string> stack{root};
  std::set<std::string> ops_seen;
  bool reached = false;
  while (!stack.empty()) {
    const std::string t = stack.back();
    stack.pop_back();
    const TensorId id = ParseTensorName(t);
    if (source_tensors.count(TensorName(id.node, id.port)) || source_nodes.count(id.node)) {
      reached = true;
      continue;
    }
    if (nodes->count(id.node)) continue;
    const NodeDef* n = g.Node(id.node);
    if (n == nullptr || !IndexArithmeticOps().count(n->op()) || nodes->size() >= kMaxNodes) return false;
    nodes->insert(n->name());
    ops_seen.insert(n->op());
    int data_inputs = 0;
    for (const auto& in : n->input()) {
      if (in.empty() || in[0] == '^') continue;
      ++data_inputs;
      stack.push_back(in);
    }
    if (data_inputs == 0 && n->op() != "Const") return false;
  }
  for (const auto& any_of : required) {
    bool found = false;
    for (const auto& op : any_of) found |= ops_seen.count(op) > 0;
    if (!found) return false;
  }
  return reached;
}

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
    if (n == nullptr || !IndexArithmeticOps().count(n->op()) || !seen.insert(n->name()).second) continue;
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

bool ConstString(const NodeDef* node, std::string* out) {
  if (!IsOp(node, "Const")) return false;
  const tensorflow::TensorProto& t = node->attr().at("value").tensor();
  if (t.dtype() != tensorflow::DT_STRING || t.tensor_shape().dim_size() != 0 || t.string_val_size() != 1) return false;
  *out = t.string_val(0);
  return true;
}

// The tf.strings.split(strings, sep) + conversion the ids come from.
struct SplitSource {
  const NodeDef* split = nullptr;
  const NodeDef* convert = nullptr;  // StringToHashBucketFast or StringToNumber
  std::string delimiter;
  bool hashed = false;
};

class RaggedReduceLookupPattern : public NamedPattern<kName> {
 public:
  bool Rewrite(const NodeDef& anchor, RewriteContext* ctx) const override {
    if (!IsOp(&anchor, "UnsortedSegmentSum")) return false;
    const GraphIndex& g = ctx->index();
    std::vector<const NodeDef*> identities;
    const NodeDef* gather = SkipIdentities(g, g.Producer(anchor, 0), &identities);
    const bool resource = IsOp(gather, "ResourceGather");
    if (!resource && !IsOp(gather, "GatherV2")) return false;
    const NodeDef* row_count = g.Producer(anchor, 2);
    DataType seg_type = tensorflow::DT_INVALID;
    const std::string splits = SplitsOfSegmentIds(g, anchor.input(1), &seg_type);
    if (row_count == nullptr || splits.empty()) return false;

    // The subgraph has the right shape; now every condition for exactness.
    std::set<std::string> index_nodes;
    if (!ComputedOnlyFrom(g, anchor.input(1), {splits}, {}, {{"Range"}, {"Tile"}, {"Where"}}, &index_nodes))
      return Skip(ctx, anchor, "segment ids are not RaggedSplitsToSegmentIds of the splits alone");
    if (!IsRowCountOf(ctx, *row_count, splits))
      return Skip(ctx, anchor, "the segment count is not len(splits) - 1");
    const DataType T = TypeAttr(anchor, "T");
    if (!IsEmbeddingDtype(T))
      return Skip(ctx, anchor, "data dtype " + tensorflow::DataType_Name(T) + " is not float, half or bfloat16");
    if (IntAttr(*gather, "batch_dims", 0) != 0) return Skip(ctx, anchor, "Gather has batch_dims != 0");
    if (!resource) {
      int64_t axis = -1;
      if (!ConstScalarInt(g.Producer(*gather, 2), &axis) || axis != 0)
        return Skip(ctx, anchor, "GatherV2 axis is not a constant 0");
    }
    for (const NodeDef* n : identities)
      if (g.DataConsumers(n->name()) != 1) return Skip(ctx, anchor, OtherConsumer(*n));
    if (g.DataConsumers(gather->name()) != 1)
      return Skip(ctx, anchor, OtherConsumer(*gather) + " (reduce_mean counts the rows too)");
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

    SplitSource split;
    if (MatchSplit(g, ctx, *ids, ids_port, splits, &split, &dead)) {
      RewriteStrings(anchor, src, split, T, dead, ctx);
    } else {
      FuseHashProducer(ctx, &src);
      RewriteIds(anchor, src, splits, T, seg_type, dead, ctx);
    }
    return true;
  }

 private:
  static std::string OtherConsumer(const NodeDef& n) { return "intermediate " + Describe(n) + " has another consumer"; }

  // ids = convert(StringSplitV2(strings, sep).values), and the splits are that
  // split's row partition. Adds the split's nodes that die with it to `dead`.
  static bool MatchSplit(const GraphIndex& g, RewriteContext* ctx, const NodeDef& ids, int ids_port,
                         const std::string& splits, SplitSource* out, std::set<std::string>* dead) {
    const bool hashed = IsOp(&ids, "StringToHashBucketFast");
    if (ids_port != 0 || !(hashed || (IsOp(&ids, "StringToNumber") &&
                                      TypeAttr(ids, "out_type") == tensorflow::DT_INT64)))
      return false;
    int port = 0;
    const NodeDef* split = g.Producer(ids, 0, &port);
    if (!IsOp(split, "StringSplitV2") || port != 1 || IntAttr(*split, "maxsplit", -1) != -1) return false;
    std::string delimiter;
    if (!ConstString(g.Producer(*split, 1), &delimiter) || delimiter.empty() || delimiter.size() > 16) return false;
    const NodeDef* strings = g.Producer(*split, 0, &port);
    if (strings == nullptr || ctx->Rank(*strings, port) != 1) return false;
    if (g.Consumers(split->name(), 1) != 1 || g.DataConsumers(ids.name()) != 1) return false;
    std::set<std::string> partition;
    const TensorId s = ParseTensorName(split->input(0));
    if (!ComputedOnlyFrom(g, splits, {TensorName(s.node, s.port)}, {split->name()},
                          {{"Cumsum"}, {"Bincount", "DenseBincount"}}, &partition))
      return false;
    out->split = split;
    out->convert = &ids;
    out->delimiter = delimiter;
    out->hashed = hashed;
    dead->insert(partition.begin(), partition.end());
    dead->insert(split->name());
    return true;
  }

  // Removes the nodes of `dead` that only the replaced subgraph reads (to a
  // fixpoint: a node some survivor reads survives too).
  static void RemoveDead(RewriteContext* ctx, std::set<std::string> dead, const std::set<std::string>& replaced,
                         const std::string& fused) {
    const GraphIndex& g = ctx->index();
    for (bool changed = true; changed;) {
      changed = false;
      std::map<std::string, int> readers;
      for (const std::set<std::string>* group : {&std::as_const(dead), &replaced}) {
        for (const std::string& name : *group) {
          const NodeDef* n = g.Node(name);
          if (n == nullptr) continue;
          for (const auto& in : n->input())
            if (!in.empty() && in[0] != '^') ++readers[ParseTensorName(in).node];
        }
      }
      for (auto it = dead.begin(); it != dead.end();) {
        if (g.Node(*it) == nullptr || g.DataConsumers(*it) != readers[*it]) {
          it = dead.erase(it);
          changed = true;
        } else {
          ++it;
        }
      }
    }
    for (const std::string& name : dead) {
      ctx->RedirectControlEdges(name, fused);
      ctx->Remove(name, fused);
    }
  }

  void RewriteIds(const NodeDef& anchor_in, const RowSource& src, const std::string& splits, DataType T,
                  DataType seg_type, const std::set<std::string>& dead, RewriteContext* ctx) const {
    const NodeDef anchor = anchor_in;
    const std::string name = anchor.name(), device = anchor.device();
    std::set<std::string> replaced{name};
    for (const NodeDef* n : src.absorbed) replaced.insert(n->name());
    RemoveDead(ctx, dead, replaced, name);
    const std::string num_rows = AddInt64Scalar(ctx, name + "/ctr_num_rows", -1, device);
    const std::string weights = AddEmptyFloatVector(ctx, name + "/ctr_no_weights", device);
    const std::string table = TableTensor(ctx, src, name + "/ctr_table");
    MatchRecord record{kName, name, "CtrEmbeddingLookup", {}};
    AbsorbSource(ctx, src, name, &record);
    record.replaced.push_back(Describe(anchor));
    BecomeFusedLookup(ctx, name, src, FusedLookup{table, splits, num_rows, weights, T, seg_type, "sum", false});
    (*ctx->Mutable(name)->mutable_attr())["segment_kind"].set_s("row_splits");
    ctx->Matched(record);
  }

  void RewriteStrings(const NodeDef& anchor_in, const RowSource& src, const SplitSource& split, DataType T,
                      const std::set<std::string>& dead_in, RewriteContext* ctx) const {
    const NodeDef anchor = anchor_in;
    const std::string name = anchor.name(), device = anchor.device();
    const std::string strings = split.split->input(0);
    const int64_t buckets = split.hashed ? IntAttr(*split.convert, "num_buckets", 0) : 0;
    std::set<std::string> dead = dead_in;
    dead.insert(split.convert->name());
    std::set<std::string> replaced{name};
    for (const NodeDef* n : src.absorbed) replaced.insert(n->name());
    MatchRecord record{kName, name, "CtrStringEmbedding", {}};
    for (const NodeDef* n : {split.split, split.convert}) record.replaced.push_back(Describe(*n));
    RemoveDead(ctx, dead, replaced, name);
    const std::string table = TableTensor(ctx, src, name + "/ctr_table");
    AbsorbSource(ctx, src, name, &record);
    record.replaced.push_back(Describe(anchor));

    NodeDef* fused = ctx->Mutable(name);
    fused->clear_input();
    fused->clear_attr();
    FusedStrings f{table, strings, T};
    f.id_mode = split.hashed ? "hash" : "index";
    f.delimiter = split.delimiter;  // empty tokens kept, as tf.strings.split keeps them
    f.num_buckets = buckets;
    BecomeStringEmbedding(ctx, name, device, f, fused);
    CopyControlInputs(anchor, fused);
    for (const NodeDef* n : src.absorbed) CopyControlInputs(*n, fused);
    ctx->Matched(record);
  }
};

REGISTER_CTR_FUSION_PATTERN(RaggedReduceLookupPattern);

}  // namespace
}  // namespace grappler
}  // namespace tf_ctr

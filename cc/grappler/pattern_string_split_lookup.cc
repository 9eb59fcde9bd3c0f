// Pattern: strings split into a SparseTensor, converted, then looked up --
// what tf.compat.v1.string_split (StringSplit) or
// tf.compat.v1.strings.split(..., result_type="SparseTensor") (StringSplitV2)
// feed into tf.nn.embedding_lookup_sparse:
//
//   split = StringSplit[V2](strings, delimiter)
//   keys  = StringToHashBucketFast(split.values) | StringToNumber<int64>(split.values)
//   CtrEmbeddingLookup(table, keys, split.indices[:, 0], num_rows = -1)
//
// (the lookup itself was fused by sparse_segment_lookup) becomes
//
//   CtrStringEmbedding(table, CtrPackStrings(strings), trim_empty_tail)
//
// trim_empty_tail keeps embedding_lookup_sparse's row count (last row with a
// token + 1).
#include <string>

#include "cc/grappler/gathered_rows.h"
#include "cc/grappler/pattern.h"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/tensor.pb.h"
#include "tensorflow/core/framework/tensor_shape.pb.h"

namespace tf_ctr {
namespace grappler {
namespace {

using tensorflow::NodeDef;

constexpr char kName[] = "string_split_lookup";

bool ConstString(const NodeDef* node, std::string* out) {
  if (!IsOp(node, "Const")) return false;
  const tensorflow::TensorProto& t = node->attr().at("value").tensor();
  if (t.dtype() != tensorflow::DT_STRING || t.tensor_shape().dim_size() != 0 || t.string_val_size() != 1) return false;
  *out = t.string_val(0);
  return true;
}

// x[:, 0] of a [N, 2] tensor, as Python slicing emits it.
bool IsFirstColumn(const GraphIndex& g, const NodeDef& slice) {
  std::vector<int64_t> begin, end, strides;
  return IsOp(&slice, "StridedSlice") && ConstIntVector(g.Producer(slice, 1), &begin) &&
         ConstIntVector(g.Producer(slice, 2), &end) && ConstIntVector(g.Producer(slice, 3), &strides) &&
         begin.size() == 2 && end.size() == 2 && strides == std::vector<int64_t>{1, 1} && begin[1] == 0 &&
         end[1] == 1 && (IntAttr(slice, "begin_mask", 0) & 1) && (IntAttr(slice, "end_mask", 0) & 1) &&
         IntAttr(slice, "shrink_axis_mask", 0) == 2 && IntAttr(slice, "ellipsis_mask", 0) == 0 &&
         IntAttr(slice, "new_axis_mask", 0) == 0;
}

class StringSplitLookupPattern : public NamedPattern<kName> {
 public:
  bool Rewrite(const NodeDef& anchor, RewriteContext* ctx) const override {
    if (!IsOp(&anchor, "CtrEmbeddingLookup") || StringAttr(anchor, "segment_kind") != "row_ids" ||
        StringAttr(anchor, "id_mode") != "index")
      return false;
    const GraphIndex& g = ctx->index();
    int keys_port = 0, seg_port = 0, split_port = 0;
    const NodeDef* keys = g.Producer(anchor, 1, &keys_port);
    const NodeDef* slice = g.Producer(anchor, 2, &seg_port);
    const bool hashed = IsOp(keys, "StringToHashBucketFast");
    if (!(hashed || IsOp(keys, "StringToNumber")) || !IsOp(slice, "StridedSlice")) return false;
    const NodeDef* split = g.Producer(*keys, 0, &split_port);
    if (!(IsOp(split, "StringSplit") || IsOp(split, "StringSplitV2")) || split_port != 1) return false;
    int indices_port = 0;
    if (g.Producer(*slice, 0, &indices_port) != split || indices_port != 0)
      return Skip(ctx, anchor, "segment ids are not the row column of the same split");

    // The subgraph has the right shape; now every condition for exactness.
    if (!IsFirstColumn(g, *slice)) return Skip(ctx, anchor, "segment ids are not split.indices[:, 0]");
    if (BoolAttr(anchor, "has_weights", false)) return Skip(ctx, anchor, "weighted lookup");
    if (IntAttr(anchor, "default_id", -1) != -1 || StringAttr(anchor, "invalid_ids") != "error")
      return Skip(ctx, anchor, "lookup drops or defaults ids");
    int64_t num_rows = 0;
    if (!ConstScalarInt(g.Producer(anchor, 3), &num_rows) || num_rows != -1)
      return Skip(ctx, anchor, "the lookup's row count is given explicitly");
    if (!hashed && TypeAttr(*keys, "out_type") != tensorflow::DT_INT64)
      return Skip(ctx, anchor, "StringToNumber out_type is not int64");
    std::string delimiter;
    if (!ConstString(g.Producer(*split, 1), &delimiter))
      return Skip(ctx, anchor, "the delimiter is not a constant");
    const bool v1 = IsOp(split, "StringSplit");
    if (v1 && delimiter.size() != 1)
      return Skip(ctx, anchor, "StringSplit splits on each of several characters; only one-byte delimiters fuse");
    if (!v1 && IntAttr(*split, "maxsplit", -1) != -1) return Skip(ctx, anchor, "maxsplit is not -1");
    if (delimiter.empty()) return Skip(ctx, anchor, "empty delimiter (whitespace or character splitting)");
    if (delimiter.size() > 16) return Skip(ctx, anchor, "delimiter longer than 16 bytes");
    if (g.Consumers(split->name(), 0) != 1 || g.Consumers(split->name(), 1) != 1 ||
        g.Consumers(split->name(), 2) != 0)
      return Skip(ctx, anchor, "intermediate " + Describe(*split) + " has another consumer");
    if (g.DataConsumers(keys->name()) != 1) return Skip(ctx, anchor, "intermediate " + Describe(*keys) + " has another consumer");
    if (g.DataConsumers(slice->name()) != 1)
      return Skip(ctx, anchor, "intermediate " + Describe(*slice) + " has another consumer");

    // Rewrite.
    const std::string anchor_name = anchor.name();
    const std::string device = anchor.device();
    const std::string strings = split->input(0);
    MatchRecord record{kName, anchor_name, "CtrStringEmbedding", {Describe(*split), Describe(*keys), Describe(*slice)}};
    record.replaced.push_back(Describe(anchor));
    const bool skip_empty = v1 ? BoolAttr(*split, "skip_empty", true) : false;
    const int64_t buckets = hashed ? IntAttr(*keys, "num_buckets", 0) : 0;
    for (const NodeDef* n : {split, keys, slice}) {
      ctx->RedirectControlEdges(n->name(), anchor_name);
      ctx->Remove(n->name(), anchor_name);
    }
    NodeDef* fused = ctx->Mutable(anchor_name);
    const NodeDef old = *fused;
    fused->clear_input();
    fused->clear_attr();
    FusedStrings f{old.input(0), strings, old.attr().at("T").type(), old.attr().at("combiner").s()};
    f.id_mode = hashed ? "hash" : "index";
    f.delimiter = delimiter;
    f.skip_empty = skip_empty;
    f.max_norm = old.attr().at("max_norm").f();
    f.num_buckets = buckets;
    f.trim_empty_tail = true;  // the lookup's rows end at the last row id + 1
    BecomeStringEmbedding(ctx, anchor_name, device, f, fused);
    CopyControlInputs(old, fused);
    // The old lookup's num_rows and weights constants lose their reader.
    for (int i : {3, 4}) {
      const NodeDef* c = g.Producer(old, i);
      if (IsOp(c, "Const") && g.DataConsumers(c->name()) == 1 && g.Node(c->name())) ctx->Remove(c->name(), anchor_name);
    }
    ctx->Matched(record);
    return true;
  }
};

REGISTER_CTR_FUSION_PATTERN(StringSplitLookupPattern);

}  // namespace
}  // namespace grappler
}  // namespace tf_ctr

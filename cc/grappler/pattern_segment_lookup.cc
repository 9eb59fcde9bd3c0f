// Pattern: the pooled lookup of tf.nn.embedding_lookup_sparse without weights
// or max_norm, and of any SparseSegment{Sum,Mean,SqrtN} over a matrix:
//
//   ids -> Unique -> {ResourceGather | GatherV2}(table, unique ids)
//       -> SparseSegment{Sum,Mean,SqrtN}[WithNumSegments](rows, unique idx, segment ids)
//
// becomes one CtrEmbeddingLookup(table, ids, segment ids) in row_ids mode.
// When ids come from StringToHashBucketFast(AsString(int keys)), the hashing
// is fused too (hash mode, with the producer's bucket count).
#include <string>

#include "cc/grappler/pattern.h"
#include "tensorflow/core/framework/attr_value.pb.h"

namespace tf_ctr {
namespace grappler {
namespace {

using tensorflow::DataType;
using tensorflow::NodeDef;

constexpr char kName[] = "sparse_segment_lookup";

bool IsSparseSegmentReduction(const NodeDef& n, std::string* combiner, bool* with_num_segments) {
  static const struct {
    const char* op;
    const char* combiner;
    bool num_segments;
  } kOps[] = {{"SparseSegmentSum", "sum", false}, {"SparseSegmentMean", "mean", false},
              {"SparseSegmentSqrtN", "sqrtn", false}, {"SparseSegmentSumWithNumSegments", "sum", true},
              {"SparseSegmentMeanWithNumSegments", "mean", true}, {"SparseSegmentSqrtNWithNumSegments", "sqrtn", true}};
  for (const auto& k : kOps) {
    if (n.op() == k.op) {
      *combiner = k.combiner;
      *with_num_segments = k.num_segments;
      return true;
    }
  }
  return false;
}

// Where the pooled rows come from: the table and the (non-unique) keys.
struct Source {
  std::string table;      // tensor holding the [V, D] table, or
  std::string resource;   // the variable handle to read it from
  DataType resource_dtype = tensorflow::DT_INVALID;
  std::string resource_device;
  std::string keys;       // int keys, one per pooled entry
  DataType key_type = tensorflow::DT_INVALID;
  std::string id_mode = "index";
  int64_t num_buckets = 0;
  std::vector<const NodeDef*> absorbed;  // nodes the fused op replaces
};

class SparseSegmentLookupPattern : public FusionPattern {
 public:
  std::string name() const override { return kName; }

  bool Rewrite(const NodeDef& anchor, RewriteContext* ctx) const override {
    std::string combiner;
    bool with_num_segments = false;
    if (!IsSparseSegmentReduction(anchor, &combiner, &with_num_segments)) return false;
    const GraphIndex& g = ctx->index();
    const DataType T = TypeAttr(anchor, "T");
    if (!IsEmbeddingDtype(T))
      return Skip(ctx, anchor, "data dtype " + tensorflow::DataType_Name(T) + " is not float, half or bfloat16");
    const DataType Tseg = TypeAttr(anchor, "Tsegmentids");
    if (!IsIndexDtype(Tseg)) return Skip(ctx, anchor, "segment ids are not int32/int64");

    Source src;
    std::string why;
    const Shape shape = FromUniqueGather(anchor, ctx, &src, &why);
    if (shape == Shape::kRejected) return Skip(ctx, anchor, why);
    if (shape == Shape::kOther && !FromDirectData(anchor, ctx, &src, &why)) return Skip(ctx, anchor, why);
    FuseHashProducer(ctx, &src);

    // Everything checked: from here on the graph changes.
    const std::string anchor_name = anchor.name();
    const std::string device = anchor.device();
    std::string num_rows;
    if (with_num_segments) {
      int port = 0;
      const NodeDef* n = g.Producer(anchor, 3, &port);
      const DataType nt = TypeAttr(anchor, "Tnumsegments");
      num_rows = TensorName(n->name(), port);
      if (nt != tensorflow::DT_INT64)
        num_rows = AddCast(ctx, anchor_name + "/ctr_num_rows", num_rows, nt, tensorflow::DT_INT64, device);
    } else {
      num_rows = AddInt64Scalar(ctx, anchor_name + "/ctr_num_rows", -1, device);
    }
    const std::string weights = AddEmptyFloatVector(ctx, anchor_name + "/ctr_no_weights", device);
    if (!src.resource.empty())
      src.table = AddReadVariable(ctx, anchor_name + "/ctr_table", src.resource, src.resource_dtype, src.resource_device);
    const std::string segments = anchor.input(2);

    MatchRecord record{kName, anchor_name, "CtrEmbeddingLookup", {}};
    for (const NodeDef* n : src.absorbed) {
      record.replaced.push_back(Describe(*n));
      ctx->RedirectControlEdges(n->name(), anchor_name);
      ctx->Remove(n->name());
    }
    record.replaced.push_back(Describe(anchor));
    NodeDef* fused = ctx->Mutable(anchor_name);
    NodeDef old = *fused;
    fused->clear_input();
    fused->clear_attr();
    fused->set_op("CtrEmbeddingLookup");
    for (const std::string& in : {src.table, src.keys, segments, num_rows, weights}) fused->add_input(in);
    CopyControlInputs(old, fused);
    for (const NodeDef* n : src.absorbed) CopyControlInputs(*n, fused);
    auto& attr = *fused->mutable_attr();
    attr["T"].set_type(T);
    attr["Tid"].set_type(src.key_type);
    attr["Tseg"].set_type(Tseg);
    attr["combiner"].set_s(combiner);
    attr["segment_kind"].set_s("row_ids");
    attr["id_mode"].set_s(src.id_mode);
    attr["invalid_ids"].set_s("error");
    attr["prune_weights"].set_b(false);
    attr["default_id"].set_i(-1);
    attr["max_norm"].set_f(-1.f);
    attr["has_weights"].set_b(false);
    attr["num_buckets"].set_i(src.num_buckets);
    ctx->Matched(record);
    return true;
  }

 private:
  static bool Skip(RewriteContext* ctx, const NodeDef& anchor, const std::string& reason) {
    ctx->Skipped(kName, anchor.name(), reason);
    return false;
  }

  enum class Shape { kOther, kRejected, kMatched };

  // ids -> Unique -> Gather(table, y); anchor(rows, idx, seg). kOther when
  // the data is not gathered rows at all; kRejected when it is but a
  // condition fails (then the subgraph is left alone, with the reason).
  static Shape FromUniqueGather(const NodeDef& anchor, RewriteContext* ctx, Source* src, std::string* why) {
    const GraphIndex& g = ctx->index();
    int rows_port = 0, idx_port = 0, y_port = 0;
    std::vector<const NodeDef*> identities;
    const NodeDef* gather = SkipIdentities(g, g.Producer(anchor, 0, &rows_port), &identities);
    const NodeDef* unique = g.Producer(anchor, 1, &idx_port);
    const bool resource = IsOp(gather, "ResourceGather");
    if (!(resource || IsOp(gather, "GatherV2")) || !IsOp(unique, "Unique") || idx_port != 1) return Shape::kOther;
    if (g.Producer(*gather, 1, &y_port) != unique || y_port != 0) {
      *why = "the Gather does not read the Unique ids";
      return Shape::kRejected;
    }
    if (IntAttr(*gather, "batch_dims", 0) != 0) {
      *why = "Gather has batch_dims != 0";
      return Shape::kRejected;
    }
    if (!resource) {
      int64_t axis = -1;
      if (!ConstScalarInt(g.Producer(*gather, 2), &axis) || axis != 0) {
        *why = "GatherV2 axis is not a constant 0";
        return Shape::kRejected;
      }
    }
    // Each intermediate must feed only this subgraph.
    if (g.Consumers(unique->name(), 0) != 1 || g.Consumers(unique->name(), 1) != 1 ||
        g.DataConsumers(unique->name()) != 2) {
      *why = "intermediate " + Describe(*unique) + " has another consumer";
      return Shape::kRejected;
    }
    for (const NodeDef* id : identities) {
      if (g.DataConsumers(id->name()) != 1) {
        *why = "intermediate " + Describe(*id) + " has another consumer";
        return Shape::kRejected;
      }
    }
    if (g.Consumers(gather->name(), 0) != 1 || g.DataConsumers(gather->name()) != 1) {
      *why = "intermediate " + Describe(*gather) + " has another consumer";
      return Shape::kRejected;
    }
    const int rank = resource ? ResourceTableRank(ctx, *gather) : ctx->Rank(*gather, 0);
    if (rank != 2) {
      *why = rank < 0 ? "cannot prove the table is a matrix (rank unknown)" : "the table is not a matrix";
      return Shape::kRejected;
    }
    src->key_type = TypeAttr(*unique, "T");
    if (!IsIndexDtype(src->key_type)) {
      *why = "ids are not int32/int64";
      return Shape::kRejected;
    }
    src->keys = unique->input(0);
    if (resource) {
      src->resource = gather->input(0);
      src->resource_dtype = TypeAttr(*gather, "dtype");
      src->resource_device = gather->device();
    } else {
      src->table = gather->input(0);
    }
    src->absorbed = {unique, gather};
    src->absorbed.insert(src->absorbed.end(), identities.begin(), identities.end());
    return Shape::kMatched;
  }

  // Rank of a variable's value: the gather's inferred output (ids are a
  // vector, so it equals the table's), else the handle's declared shape
  // (VarHandleOp `shape`, or `_handle_shapes` on a captured handle).
  static int ResourceTableRank(RewriteContext* ctx, const NodeDef& gather) {
    const int rank = ctx->Rank(gather, 0);
    if (rank >= 0) return rank;
    const NodeDef* handle = ctx->index().Producer(gather, 0);
    if (handle == nullptr) return -1;
    auto it = handle->attr().find("_handle_shapes");
    if (it != handle->attr().end() && it->second.list().shape_size() == 1 &&
        !it->second.list().shape(0).unknown_rank())
      return it->second.list().shape(0).dim_size();
    if (IsOp(handle, "VarHandleOp")) {
      it = handle->attr().find("shape");
      if (it != handle->attr().end() && !it->second.shape().unknown_rank()) return it->second.shape().dim_size();
    }
    return -1;
  }

  // anchor(data, indices, seg) on a matrix `data`: keys are the indices.
  static bool FromDirectData(const NodeDef& anchor, RewriteContext* ctx, Source* src, std::string* why) {
    int port = 0;
    const NodeDef* data = ctx->index().Producer(anchor, 0, &port);
    if (data == nullptr || ctx->Rank(*data, port) != 2) {
      *why = "cannot prove the data is a matrix (rank unknown or not 2)";
      return false;
    }
    src->table = anchor.input(0);
    src->keys = anchor.input(1);
    src->key_type = TypeAttr(anchor, "Tidx");
    if (!IsIndexDtype(src->key_type)) *why = "indices are not int32/int64";
    return IsIndexDtype(src->key_type);
  }

  // keys = StringToHashBucketFast(AsString(int keys)) with default AsString
  // formatting: hash the integers inside the fused op instead.
  static void FuseHashProducer(RewriteContext* ctx, Source* src) {
    const GraphIndex& g = ctx->index();
    const NodeDef* hash = g.Node(ParseTensorName(src->keys).node);
    if (!IsOp(hash, "StringToHashBucketFast") || g.DataConsumers(hash->name()) != 1) return;
    const NodeDef* as_string = g.Producer(*hash, 0);
    if (!IsOp(as_string, "AsString") || g.DataConsumers(as_string->name()) != 1) return;
    const DataType kt = TypeAttr(*as_string, "T");
    if (!IsIndexDtype(kt) || IntAttr(*as_string, "precision", -1) != -1 || IntAttr(*as_string, "width", -1) != -1 ||
        BoolAttr(*as_string, "scientific", false) || BoolAttr(*as_string, "shortest", false) ||
        !StringAttr(*as_string, "fill").empty())
      return;
    src->keys = as_string->input(0);
    src->key_type = kt;
    src->id_mode = "hash";
    src->num_buckets = IntAttr(*hash, "num_buckets", 0);
    src->absorbed.push_back(hash);
    src->absorbed.push_back(as_string);
  }
};

REGISTER_CTR_FUSION_PATTERN(SparseSegmentLookupPattern);

}  // namespace
}  // namespace grappler
}  // namespace tf_ctr

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

#include "cc/grappler/gathered_rows.h"
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

class SparseSegmentLookupPattern : public NamedPattern<kName> {
 public:
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

    RowSource src;
    std::string why;
    const SourceMatch shape = MatchGatheredRows(anchor, 0, 1, ctx, &src, &why);
    if (shape == SourceMatch::kRejected) return Skip(ctx, anchor, why);
    if (shape == SourceMatch::kOther) {
      if (!MatchDirectRows(anchor, 0, 1, TypeAttr(anchor, "Tidx"), ctx, &src, &why)) return Skip(ctx, anchor, why);
      // The reduction's own gradient: dense, or with sparse_gradient its
      // rows of distinct ids (sorted, where the fused op's come in order of
      // first appearance: the same update).
      src.grad_indices = BoolAttr(anchor, "sparse_gradient", false) ? "first_appearance" : "dense";
    }
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
    const std::string table = TableTensor(ctx, src, anchor_name + "/ctr_table");
    const std::string segments = anchor.input(2);

    MatchRecord record{kName, anchor_name, "CtrEmbeddingLookup", {}};
    AbsorbSource(ctx, src, anchor_name, &record);
    record.replaced.push_back(Describe(anchor));
    BecomeFusedLookup(ctx, anchor_name, src,
                      FusedLookup{table, segments, num_rows, weights, T, Tseg, combiner, /*has_weights=*/false});
    ctx->Matched(record);
    return true;
  }
};

REGISTER_CTR_FUSION_PATTERN(SparseSegmentLookupPattern);

}  // namespace
}  // namespace grappler
}  // namespace tf_ctr

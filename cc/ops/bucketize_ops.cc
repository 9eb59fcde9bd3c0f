// Bucketized-feature embedding: tf.raw_ops.Bucketize (bucketized_column) and
// the pooled lookup of its bucket ids, in one op.
#include "cc/ops/pooled_shape.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace {

using shape_inference::DimensionHandle;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// output [B] + params.shape[1:], ids [B * S], row_splits [B + 1], dense_shape [2].
absl::Status BucketizeLookupShape(InferenceContext* c) {
  ShapeHandle params, row_shape, input, out;
  TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &params));
  TF_RETURN_IF_ERROR(c->Subshape(params, 1, &row_shape));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &input));
  const DimensionHandle rows = c->Dim(input, 0);
  TF_RETURN_IF_ERROR(c->Concatenate(c->Vector(rows), row_shape, &out));
  c->set_output(0, out);
  DimensionHandle ids, splits;
  TF_RETURN_IF_ERROR(c->Multiply(rows, c->Dim(input, 1), &ids));
  TF_RETURN_IF_ERROR(c->Add(rows, 1, &splits));
  c->set_output(1, c->Vector(ids));
  c->set_output(2, c->Vector(splits));
  c->set_output(3, c->Vector(2));
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("CtrBucketizeEmbeddingLookup")
    .Input("params: T")
    .Input("input: Tin")
    .Output("output: T")
    .Output("ids: int64")
    .Output("row_splits: int64")
    .Output("dense_shape: int64")
    .Attr("Tin: {int32, int64, float, double}")
    .Attr("boundaries: list(float)")
    .Attr("column_stride: int >= 0")
    .Attr("T: {float, half, bfloat16, double}")
    .Attr("combiner: {'sum', 'mean', 'sqrtn'} = 'mean'")
    .Attr("default_id: int = -1")
    .Attr("max_norm: float = -1.0")
    .CTR_GRAD_FORM_ATTRS
    .SetShapeFn(BucketizeLookupShape)
    .Doc(std::string(R"doc(
Buckets the values of `input` [B, S] and pools the rows of `params` [V, ...]
their bucket ids name: output [B, ...], in one op.

Replaces tf.raw_ops.Bucketize and the SparseTensor a bucketized_column builds
of its buckets (Range, Tile, ExpandDims, Reshape, Mul, AddV2, Pack, Transpose,
Cast) under a linear model or an embedding column, with the
safe_embedding_lookup_sparse of its ids. Each row has S ids: the bucket of
value s (the index of the first of the sorted boundaries greater than it, as
Bucketize finds it) plus s * column_stride (len(boundaries) + 1 in a
bucketized column). combiner, default_id and max_norm are
safe_embedding_lookup_sparse's; half types accumulate in float32. An id >= V
is an InvalidArgument naming the id and its row.

The outputs after the pooled one are the ids and their bags' row_splits (for
the gradient), and the bucketized column's dense_shape, [B, S].
)doc") + ctr_shapes::kGradFormAttrsDoc);

}  // namespace tensorflow

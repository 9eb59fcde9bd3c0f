// Crossed-feature embedding: tf.sparse.cross_hashed (crossed_column, Keras
// HashedCrossing) and the pooled lookup of its ids, in one op.
#include "cc/ops/pooled_shape.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace {

using shape_inference::DimensionHandle;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// output [B] + params.shape[1:], ids [nnz], row_splits [B + 1], dense_shape
// [2]; B from the first dense input when there is one (the sparse inputs'
// batch is in their shape tensors' values).
absl::Status CrossLookupShape(InferenceContext* c) {
  int n;
  TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
  std::vector<tensorflow::DataType> sparse_types;
  TF_RETURN_IF_ERROR(c->GetAttr("sparse_types", &sparse_types));
  if (static_cast<int>(sparse_types.size()) != n)  // the inputs below are read at offsets of N
    return tensorflow::errors::InvalidArgument("sparse_types must have N = ", n, " entries (one values tensor per "
                                               "sparse input), got ", sparse_types.size());
  ShapeHandle params, row_shape, shape, out;
  TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &params));
  TF_RETURN_IF_ERROR(c->Subshape(params, 1, &row_shape));
  for (int i = 0; i < n; ++i) {
    TF_RETURN_IF_ERROR(c->WithRank(c->input(1 + i), 2, &shape));
    TF_RETURN_IF_ERROR(c->WithRank(c->input(1 + n + i), 1, &shape));
    TF_RETURN_IF_ERROR(c->WithRank(c->input(1 + 2 * n + i), 1, &shape));
  }
  DimensionHandle rows = c->UnknownDim();
  for (int j = 1 + 3 * n; j < c->num_inputs(); ++j) {
    TF_RETURN_IF_ERROR(c->WithRank(c->input(j), 2, &shape));
    if (n == 0) TF_RETURN_IF_ERROR(c->Merge(rows, c->Dim(shape, 0), &rows));
  }
  TF_RETURN_IF_ERROR(c->Concatenate(c->Vector(rows), row_shape, &out));
  c->set_output(0, out);
  c->set_output(1, c->Vector(c->UnknownDim()));
  DimensionHandle splits = c->UnknownDim();
  if (c->ValueKnown(rows)) TF_RETURN_IF_ERROR(c->Add(rows, 1, &splits));  // refuses a batch of INT64_MAX
  c->set_output(2, c->Vector(splits));
  c->set_output(3, c->Vector(2));
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("CtrCrossEmbeddingLookup")
    .Input("params: T")
    .Input("indices: N * int64")
    .Input("values: sparse_types")
    .Input("shapes: N * int64")
    .Input("dense_inputs: dense_types")
    .Output("output: T")
    .Output("ids: int64")
    .Output("row_splits: int64")
    .Output("dense_shape: int64")
    .Attr("N: int >= 0")
    .Attr("sparse_types: list({int64, string}) >= 0")
    .Attr("dense_types: list({int64, string}) >= 0")
    .Attr("num_buckets: int >= 0")
    .Attr("hash_key: int")
    .Attr("T: {float, half, bfloat16, double}")
    .Attr("combiner: {'sum', 'mean', 'sqrtn'} = 'mean'")
    .Attr("default_id: int = -1")
    .Attr("max_norm: float = -1.0")
    .CTR_GRAD_FORM_ATTRS
    .SetShapeFn(CrossLookupShape)
    .Doc(std::string(R"doc(
Crosses the features of each row and pools the rows of `params` [V, ...] that
the crossed ids name: output [B, ...], in one op.

Replaces tf.sparse.cross_hashed (SparseCross with hashed_output, as
crossed_column and Keras HashedCrossing build it) and the
safe_embedding_lookup_sparse of its ids (SparseReshape, SparseFillEmptyRows,
Unique, Gather, SparseSegment*): no [nnz, 2] indices and no [nnz] ids between
them. The inputs are SparseCross's: N sparse features as (indices [nnz, 2],
values, dense_shape [2]) in row-major order, and dense features [B, k].
A row's crosses are the cartesian product of its features, the last input
varying fastest; each id is FingerprintCat64 chained from hash_key over the
features (Fingerprint64 of a string, an int64 as it is) modulo num_buckets
(modulo 2^63 - 1 when num_buckets is 0), bit-exact with SparseCross. A row
missing any feature has no crosses: it pools to zeros, or to the row
default_id when that is >= 0. combiner and max_norm are
safe_embedding_lookup_sparse's; half types accumulate in float32. An id >= V
is an InvalidArgument naming the id and its row.

The outputs after the pooled one are the crossed ids and their bags'
row_splits (for the gradient), and SparseCross's dense_shape: [B, the largest
cross count of a row].
)doc") + ctr_shapes::kGradFormAttrsDoc);

}  // namespace tensorflow

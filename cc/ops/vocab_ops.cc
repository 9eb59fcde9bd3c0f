// Vocabulary embedding: a lookup-table find (StringLookup, IntegerLookup,
// categorical_column_with_vocabulary_*) and the gather of the rows it names,
// with Keras' checks, in one op.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace {

using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

absl::Status VocabEmbeddingShape(InferenceContext* c) {
  ShapeHandle unused, params, row_shape, out;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &unused));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 0, &unused));
  TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(3), 1, &params));
  TF_RETURN_IF_ERROR(c->Subshape(params, 1, &row_shape));
  TF_RETURN_IF_ERROR(c->Concatenate(c->input(1), row_shape, &out));
  c->set_output(0, out);
  c->set_output(1, c->input(1));
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("CtrVocabEmbedding")
    .Input("table_handle: resource")
    .Input("keys: Tkey")
    .Input("default_value: int64")
    .Input("params: T")
    .Output("output: T")
    .Output("rows: int64")
    .Attr("T: {float, half, bfloat16, double}")
    .Attr("Tkey: {string, int64}")  // TF has no int32 -> int64 table
    .Attr("missing_key: {'default', 'error'} = 'default'")
    .Attr("missing_id: int = -1")
    .Attr("wrap_negative_ids: bool = false")
    .SetShapeFn(VocabEmbeddingShape)
    .Doc(R"doc(
Looks `keys` up in a key -> int64 lookup table (a tf.lookup.StaticHashTable,
as StringLookup, IntegerLookup and the vocabulary feature columns build) and
gathers the rows of `params` [V, ...] they name: output keys.shape +
params.shape[1:], one row per key.

Replaces LookupTableFindV2 + (Keras' Equal/Where/Assert vocabulary check) +
(Keras' negative-index wrap) + Gather.
missing_key: "default": a key the table lacks gets `default_value`, as
  LookupTableFindV2 gives it. "error": a key whose id is `missing_id` (the
  table's default) is an InvalidArgument naming it and its row (StringLookup /
  IntegerLookup with num_oov_indices=0 assert that every key is in the
  vocabulary).
wrap_negative_ids: a negative id i reads row V + i (keras.ops.take, which a
  Keras Embedding gathers with). Any id still outside [0, V) is an
  InvalidArgument naming the key, the id and the row.
rows: the row each key read, for the gradient.
)doc");

}  // namespace tensorflow

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
  // Keras' mask keys and their ids are scalars.
  for (int i = 4; i < c->num_inputs(); ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &unused));
  return absl::OkStatus();
}

// [B, sum of the tables' and dense inputs' widths]: B from any key vector or
// dense input.
absl::Status ConcatVocabShape(InferenceContext* c) {
  int n, m;
  TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
  TF_RETURN_IF_ERROR(c->GetAttr("M", &m));
  std::vector<tensorflow::DataType> key_types;
  TF_RETURN_IF_ERROR(c->GetAttr("Tkeys", &key_types));
  if (static_cast<int>(key_types.size()) != n)  // the inputs below are read at offsets of N
    return tensorflow::errors::InvalidArgument("Tkeys must have N = ", n, " entries (one key tensor per feature), "
                                               "got ", key_types.size());
  shape_inference::DimensionHandle width = c->MakeDim(0), rows = c->UnknownDim();
  ShapeHandle shape;
  for (int i = 0; i < n; ++i) {
    TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &shape));
    TF_RETURN_IF_ERROR(c->WithRank(c->input(n + i), 1, &shape));
    TF_RETURN_IF_ERROR(c->Merge(rows, c->Dim(shape, 0), &rows));
    TF_RETURN_IF_ERROR(c->WithRank(c->input(2 * n + i), 0, &shape));
    TF_RETURN_IF_ERROR(c->WithRank(c->input(3 * n + i), 2, &shape));
    TF_RETURN_IF_ERROR(c->Add(width, c->Dim(shape, 1), &width));
  }
  for (int j = 0; j < m; ++j) {
    TF_RETURN_IF_ERROR(c->WithRank(c->input(4 * n + j), 2, &shape));
    TF_RETURN_IF_ERROR(c->Add(width, c->Dim(shape, 1), &width));
    TF_RETURN_IF_ERROR(c->Merge(rows, c->Dim(shape, 0), &rows));
  }
  // Keras' mask keys and their ids are scalars.
  for (int i = 4 * n + m; i < c->num_inputs(); ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &shape));
  c->set_output(0, c->Matrix(rows, width));
  return absl::OkStatus();
}

// [B, units] from [B, L] keys and a [depth, units] kernel.
absl::Status VocabMultiHotShape(InferenceContext* c) {
  ShapeHandle unused, keys, kernel;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &unused));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &keys));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 0, &unused));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 2, &kernel));
  c->set_output(0, c->Matrix(c->Dim(keys, 0), c->Dim(kernel, 1)));
  c->set_output(1, keys);
  return absl::OkStatus();
}

// [dense_shape[0], depth].
absl::Status VocabIndicatorShape(InferenceContext* c) {
  ShapeHandle unused, shape;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &unused));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &unused));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &unused));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 2, &unused));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 1, &shape));
  int64_t depth;
  TF_RETURN_IF_ERROR(c->GetAttr("depth", &depth));
  shape_inference::DimensionHandle rows = c->UnknownDim();
  const Tensor* dense_shape = c->input_tensor(4);
  if (dense_shape != nullptr && dense_shape->NumElements() == 2 && dense_shape->vec<int64_t>()(0) >= 0)
    rows = c->MakeDim(dense_shape->vec<int64_t>()(0));
  c->set_output(0, c->Matrix(rows, depth));
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("CtrVocabEmbedding")
    .Input("table_handle: resource")
    .Input("keys: Tkey")
    .Input("default_value: int64")
    .Input("params: T")
    .Input("mask_keys: num_masks * Tkey")
    .Input("mask_ids: num_masks * int64")
    .Output("output: T")
    .Output("rows: int64")
    .Attr("T: {float, half, bfloat16, double}")
    .Attr("Tkey: {string, int64}")  // TF has no int32 -> int64 table
    .Attr("missing_key: {'default', 'error'} = 'default'")
    .Attr("missing_id: int = -1")
    .Attr("wrap_negative_ids: bool = false")
    .Attr("num_masks: int >= 0 = 0")
    .Attr("oov_slots: int >= 0 = 0")
    .Attr("oov_id: int = -1")
    .Attr("oov_start: int = 0")
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
mask_keys, mask_ids: scalars; a key equal to mask_keys[i] gets id
  mask_ids[i] whatever the table says (StringLookup / IntegerLookup's
  mask_token). Inputs, not attrs: a SavedModel's function takes Keras' mask
  key and id as captured tensors.
oov_slots, oov_id, oov_start: with oov_slots > 0, a key whose id is then
  `oov_id` (the table's default, as Keras compares it) gets oov_start + its slot: to_hash_bucket_fast(key,
  oov_slots) of a string key, floormod(key, oov_slots) of an int64 key
  (StringLookup / IntegerLookup with num_oov_indices > 1). The missing_key
  check and the wrap see the ids after both rules, as Keras' ops run.
rows: the row each key read, for the gradient.
)doc");

REGISTER_OP("CtrVocabMultiHot")
    .Input("table_handle: resource")
    .Input("keys: Tkey")
    .Input("default_value: int64")
    .Input("kernel: T")
    .Output("output: T")
    .Output("ids: int64")
    .Attr("T: {float, double}")
    .Attr("Tkey: {string, int64}")
    .Attr("missing_key: {'default', 'error'} = 'default'")
    .Attr("missing_id: int = -1")
    .Attr("binary_output: bool = true")
    .Attr("id_casts: list({int32, int64, float, double}) = []")
    .SetShapeFn(VocabMultiHotShape)
    .Doc(R"doc(
A Dense layer's MatMul over a multi-hot (or count) encoding of vocabulary
ids, without the encoding: looks the [B, L] `keys` up in a key -> int64
lookup table and, for each row b, sums the rows of `kernel` [depth, units]
its ids name: output[b] = sum over the distinct ids i of row b of
count(i) * kernel[i], with count(i) = 1 when binary_output (multi-hot), else
the times i occurs in the row. Ids >= depth count for nothing, as
DenseBincount(size=depth) drops them.

Replaces LookupTableFindV2 + (Keras' vocabulary check) + DenseBincount(ids,
depth) [+ Cast] + MatMul(encoding, kernel): StringLookup / IntegerLookup with
output_mode="multi_hot" or "count", or CategoryEncoding, feeding a Dense.
The sum runs over the ids in increasing order, as MatMul's dot product runs
over the encoding's columns.
missing_key: as CtrVocabEmbedding's (Keras' num_oov_indices=0 check).
id_casts: the types the ids were cast to, in order, before the bincount
  (Keras' CategoryEncoding casts them to float32 and back to int32): each id
  goes through the same conversions, as TF's CPU Cast makes them.
A negative id (after the casts) is an InvalidArgument naming the key, the id
and the row, as DenseBincount rejects it.
ids: the ids the bincount counted (after the casts), for the gradient.
)doc");

REGISTER_OP("CtrConcatVocabEmbedding")
    .Input("table_handles: N * resource")
    .Input("keys: Tkeys")
    .Input("default_values: N * int64")
    .Input("params: N * T")
    .Input("dense: M * T")
    .Input("mask_keys: Tmasks")
    .Input("mask_ids: num_masked * int64")
    .Output("output: T")
    .Attr("N: int >= 1")
    .Attr("M: int >= 0 = 0")
    .Attr("T: {float, half, bfloat16, double}")
    .Attr("Tkeys: list({string, int64})")
    .Attr("missing_keys: list(string)")
    .Attr("missing_ids: list(int)")
    .Attr("wrap_negative_ids: list(bool)")
    .Attr("layout: list(int) = []")
    .Attr("Tmasks: list({string, int64}) >= 0 = []")
    .Attr("num_masked: int >= 0 = 0")
    .Attr("masked_features: list(int) = []")
    .Attr("oov_slots: list(int) = []")
    .Attr("oov_ids: list(int) = []")
    .Attr("oov_starts: list(int) = []")
    .SetShapeFn(ConcatVocabShape)
    .Doc(R"doc(
N vocabulary embeddings concatenated along axis 1, as the Concatenate before
a CTR model's MLP takes them: feature i is CtrVocabEmbedding(table_handles[i],
keys[i], default_values[i], params[i]) with missing_keys[i], missing_ids[i]
and wrap_negative_ids[i], keys[i] a [B] vector and params[i] a [V_i, D_i]
matrix; the output [B, D_1 + ... + D_N + widths of dense] is written in
place, with no copy of the N gathered outputs. Inputs whose row counts differ
are an InvalidArgument naming them, where the concatenation fails.

dense: M other [B, w_j] matrices of the concatenation, copied into their columns.
layout: the order of the output's column blocks: i < N is feature i, N + j
  dense input j; empty: the features, then the dense inputs.
mask_keys, mask_ids, masked_features: CtrVocabEmbedding's mask of feature
  masked_features[j] is mask_keys[j] with id mask_ids[j] (features in
  increasing order, at most one mask each).
oov_slots, oov_ids, oov_starts: CtrVocabEmbedding's attrs of each feature
  (N entries each), or none: no feature has OOV slots.
)doc");

REGISTER_OP("CtrVocabIndicator")
    .Input("table_handle: resource")
    .Input("default_value: int64")
    .Input("keys: Tkey")
    .Input("indices: int64")
    .Input("dense_shape: int64")
    .Output("output: T")
    .Attr("T: {float, double}")
    .Attr("Tkey: {string, int64}")
    .Attr("depth: int >= 0")
    .Attr("num_oov_buckets: int >= 0 = 0")
    .SetShapeFn(VocabIndicatorShape)
    .Doc(R"doc(
An indicator column of vocabulary ids: looks the sparse `keys` [nnz] (at
`indices` [nnz, 2] of a [rows, columns] `dense_shape`) up in a key -> int64
lookup table and writes output [rows, depth], the count of each id in
[0, depth) in each row.

Replaces LookupTableFindV2 (with IdTableWithHashBuckets' out-of-vocabulary
buckets, as CtrVocabEmbeddingLookup takes them) + SparseToDense(default -1)
+ OneHot(depth, 1, 0) + Sum over the columns, as
tf.compat.v1.feature_column.indicator_column of a vocabulary column builds it.
A negative id (a key the table lacks, without buckets) or one >= depth counts
for nothing, as OneHot gives it a row of zeros. The indices must be in bounds,
in row-major order and distinct, as SparseToDense checks them: else an
InvalidArgument naming the index.
num_oov_buckets: as CtrVocabEmbeddingLookup's.
)doc");

}  // namespace tensorflow

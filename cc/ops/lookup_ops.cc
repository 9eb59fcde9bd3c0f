// Fused sparse / hash embedding lookup: one op replaces Unique + Gather +
// (clip) + SparseSegment{Sum,Mean,SqrtN} (or the weighted Mul + SegmentSum +
// DivNoNan chain), and for hashed keys also AsString + StringToHashBucketFast.
#include "cc/ops/pooled_shape.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace {

using ctr_shapes::PooledLookupShape;
using ctr_shapes::SetPooledOutput;
using ctr_shapes::TableShape;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

constexpr char kPoolingAttrs[] = R"doc(
combiner: "sum", "mean" or "sqrtn", as tf.nn.embedding_lookup_sparse defines them.
segment_kind: "row_splits" when `segments` are ragged row_splits [B+1];
  "row_ids" when they are the sorted row of each id [nnz] (SparseTensor indices[:, 0]).
invalid_ids: what happens to ids outside [0, V) in index mode: "error" (InvalidArgument
  naming the row and the id), "skip_negative" (negative ids are dropped), or
  "skip_padding" (-1 is dropped, anything else is an error).
prune_weights: drop entries whose weight is not > 0 (safe_embedding_lookup_sparse).
default_id: row used for bags left empty; -1 gives zeros. Any other value
  that is not a table row fails only where a bag is left empty, as TF's
  gather of it does: an InvalidArgument naming the row on the CPU, zeros on
  the GPU.
max_norm: clip each looked-up row to this L2 norm first; <= 0 disables.
has_weights: whether `weights` holds one float per id (else it is ignored).
prune_broadcast: with has_weights and row_ids segments, prune as
  safe_embedding_lookup_sparse does, with one mask of ids and weights that TF
  broadcasts: one id and no weight, or one weight and no id (a request whose
  weight feature is missing, or its id feature), leave every bag empty where
  it would fail. Other counts that differ fail (TF too, but for N ids and one
  weight where only the first id is kept, or one negative id and N weights).
)doc";

constexpr char kIdAttrs[] = R"doc(
id_mode: "index": ids are table rows. "hash": ids are keys, hashed to
  Fingerprint64(as_string(key)) % V for integers and Fingerprint64(key) % V
  for strings, bit-exact with tf.strings.to_hash_bucket_fast. String ids
  (CPU only) need "hash".
num_buckets: hash mode only: the bucket count of the hash (0: V). A bucket
  outside the table is an InvalidArgument error, as the Gather it replaces says.
hash_key: hash mode only: empty, or two integers that make the hash SipHash-2-4
  keyed with them, bit-exact with tf.strings.to_hash_bucket_strong(key=...)
  (keras.layers.Hashing with a salt).
)doc";


template <bool kResource>
absl::Status LookupShape(InferenceContext* c) {
  return PooledLookupShape(c, 0, kResource);
}

// CtrVocabEmbeddingLookup: the table handle and default in front of the
// lookup's inputs; the found ids have the keys' shape.
absl::Status VocabLookupShape(InferenceContext* c) {
  ShapeHandle unused;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &unused));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &unused));
  TF_RETURN_IF_ERROR(PooledLookupShape(c, 2, false));
  c->set_output(1, c->input(3));
  return absl::OkStatus();
}

template <bool kResource>
absl::Status LookupGradShape(InferenceContext* c) {
  ShapeHandle params;
  TF_RETURN_IF_ERROR(TableShape(c, 1, kResource, &params));
  TF_RETURN_IF_ERROR(SetPooledOutput(c, 0, c->UnknownDim(), params));
  c->set_output(1, c->Vector(c->UnknownDim()));
  c->set_output(2, c->input(5));
  c->set_output(3, c->Scalar());
  return absl::OkStatus();
}

}  // namespace

// The attrs of pooling rows, whatever names them.
#define CTR_POOLING_ATTRS                                                         \
  Attr("T: {float, half, bfloat16, double}")                                      \
      .Attr("Tseg: {int32, int64}")                                               \
      .Attr("combiner: {'sum', 'mean', 'sqrtn'} = 'mean'")                        \
      .Attr("segment_kind: {'row_splits', 'row_ids'}")                            \
      .Attr("invalid_ids: {'error', 'skip_negative', 'skip_padding'} = 'error'") \
      .Attr("prune_weights: bool = false")                                        \
      .Attr("default_id: int = -1")                                               \
      .Attr("max_norm: float = -1.0")                                             \
      .Attr("has_weights: bool = false")                                          \
      .Attr("prune_broadcast: bool = false")
#define CTR_LOOKUP_ATTRS                                 \
  CTR_POOLING_ATTRS.Attr("Tid: {int32, int64, string}")  \
      .Attr("id_mode: {'index', 'hash'} = 'index'")      \
      .Attr("num_buckets: int = 0")                      \
      .Attr("hash_key: list(int) = []")                  \
      .CTR_GRAD_FORM_ATTRS

// Each op has a form reading its table from a variable (PARAMS "resource").
#define CTR_LOOKUP_SIGNATURE(PARAMS)                                                                    \
  Input("params: " PARAMS).Input("ids: Tid").Input("segments: Tseg").Input("num_rows: int64").Input(  \
      "weights: float").Output("output: T").CTR_LOOKUP_ATTRS
#define CTR_LOOKUP_GRAD_SIGNATURE(PARAMS)                                                               \
  Input("grad: T").Input("params: " PARAMS).Input("ids: Tid").Input("segments: Tseg").Input(          \
      "num_rows: int64").Input("weights: float").Output("values: T").Output("indices: int64").Output( \
      "weights_grad: float").Output("merged: bool").CTR_LOOKUP_ATTRS

REGISTER_OP("CtrEmbeddingLookup")
    .CTR_LOOKUP_SIGNATURE("T")
    .SetShapeFn(LookupShape<false>)
    .Doc(std::string(R"doc(
Pools rows of `params` [V, ...] over bags of ids in one pass: output [B, ...]
(a table of any rank >= 1 is read as [V, D], D the product of its other dims).

Replaces tf.nn.embedding_lookup_sparse / safe_embedding_lookup_sparse (Unique,
Gather, clip_by_norm, SparseSegment* or Mul+SegmentSum+DivNoNan) and, in hash
mode, AsString + StringToHashBucketFast (or Strong, with hash_key) before them. Half types accumulate in
float32. num_rows: the bag count for row_ids segments; -1 takes last row id + 1
as tf.math.segment_sum does. Ignored for row_splits.
)doc") + kPoolingAttrs + kIdAttrs + ctr_shapes::kGradFormAttrsDoc);

REGISTER_OP("CtrEmbeddingLookupGrad")
    .CTR_LOOKUP_GRAD_SIGNATURE("T")
    .SetShapeFn(LookupGradShape<false>)
    .Doc(std::string(R"doc(
Gradient of CtrEmbeddingLookup: the params gradient as IndexedSlices
(values [n, ...], indices [n]: one row per kept id, plus the default row of bags
left empty; or, with grad_indices "first_appearance", one per table row: see
`merged`) and the dense gradient of `weights` (zeros when has_weights is false).
merged: whether the kernel merged the rows as grad_indices asks (the CPU
kernel does; the GPU kernel leaves one row per id, for the caller to merge).
)doc") + kPoolingAttrs + kIdAttrs + ctr_shapes::kGradFormAttrsDoc);

REGISTER_OP("CtrResourceEmbeddingLookup")
    .CTR_LOOKUP_SIGNATURE("resource")
    .SetShapeFn(LookupShape<true>)
    .Doc(std::string(R"doc(
CtrEmbeddingLookup of the table in a resource variable of T (on the host),
read in place under the variable's lock as ResourceGather reads it. A
ReadVariableOp would hand out the variable's buffer, and the next sparse
update of the table (an optimizer's) would then copy all of it.
)doc") + kPoolingAttrs + kIdAttrs + ctr_shapes::kGradFormAttrsDoc);

REGISTER_OP("CtrResourceEmbeddingLookupGrad")
    .CTR_LOOKUP_GRAD_SIGNATURE("resource")
    .SetShapeFn(LookupGradShape<true>)
    .Doc(std::string(R"doc(
CtrEmbeddingLookupGrad of CtrResourceEmbeddingLookup: the table is read in
place from its variable.
)doc") + kPoolingAttrs + kIdAttrs + ctr_shapes::kGradFormAttrsDoc);

REGISTER_OP("CtrVocabEmbeddingLookup")
    .Input("table_handle: resource")
    .Input("default_value: int64")
    .Input("params: T")
    .Input("keys: Tkey")
    .Input("segments: Tseg")
    .Input("num_rows: int64")
    .Input("weights: float")
    .Input("mask_keys: num_masks * Tkey")
    .Input("mask_ids: num_masks * int64")
    .Output("output: T")
    .Output("ids: int64")
    .CTR_POOLING_ATTRS
    .Attr("Tkey: {string, int64}")  // TF has no int32 -> int64 table
    .Attr("num_oov_buckets: int >= 0 = 0")
    .Attr("missing_key: {'default', 'error'} = 'default'")
    .Attr("missing_id: int = -1")
    .Attr("num_masks: int >= 0 = 0")
    .Attr("oov_slots: int >= 0 = 0")
    .Attr("oov_id: int = -1")
    .Attr("oov_start: int = 0")
    .Attr("wrap_negative_ids: bool = false")
    .Attr("drop_zero_ids: bool = false")
    .CTR_GRAD_FORM_ATTRS
    .SetShapeFn(VocabLookupShape)
    .Doc(std::string(R"doc(
Looks each of `keys` [nnz] up in a key -> int64 lookup table (a
tf.lookup.StaticHashTable, as the vocabulary feature columns build) and pools
the rows of `params` [V, ...] the found ids name over bags, as
CtrEmbeddingLookup pools ids: output [B, ...], in one op.

Replaces LookupTableFindV2 (and the out-of-vocabulary buckets that
IdTableWithHashBuckets adds with NotEqual, StringToHashBucketFast,
LookupTableSizeV2, AddV2 and SelectV2) before a fused lookup, as the
vocabulary feature columns under an embedding column and
tf.nn.safe_embedding_lookup_sparse(params, table.lookup(sp_keys)) build it.
num_oov_buckets: 0: a key the table lacks gets `default_value` as its id (a
  negative one is then what invalid_ids says). n > 0: a key whose found id
  equals `default_value` gets table.size() + to_hash_bucket_fast(key, n)
  instead (integer keys hash as their decimal string, as
  index_table_from_tensor hashes them).
Keras' StringLookup / IntegerLookup rules between the find and the ids, as
CtrVocabEmbedding takes them (a Keras Embedding pooled over [B, L] ids:
GlobalAveragePooling1D, with mask_zero=True or not):
missing_key, missing_id: "error": a key whose found id is missing_id is an
  InvalidArgument naming the key and its row (Keras' num_oov_indices=0 check).
num_masks, mask_keys, mask_ids: a key equal to a mask key gets its mask id.
oov_slots, oov_id, oov_start: oov_slots > 0: a key whose id is oov_id gets
  oov_start + its slot (to_hash_bucket_fast(key, oov_slots) of a string,
  floormod(key, oov_slots) of an integer).
wrap_negative_ids: a negative id reads row id + V (Keras 3's Embedding
  wraps its indices so); `ids` keeps the id before the wrap.
drop_zero_ids: ids equal to 0 (before the wrap) are dropped from their bags,
  as Embedding(mask_zero=True) masks them; needs has_weights false.
ids: the id each key found (after the buckets and Keras' rules, before the
  wrap), for the gradient, which is CtrEmbeddingLookupGrad's on these ids.
A found id outside [0, V) (after the wrap) is an InvalidArgument naming the
key, its id and its row.
)doc") + kPoolingAttrs + ctr_shapes::kGradFormAttrsDoc);

REGISTER_OP("CtrCheckBags")
    .Input("ids: Tid")
    .Input("segments: Tseg")
    .Input("num_rows: int64")
    .Input("weights: float")
    .Output("checked_ids: Tid")
    .Attr("Tid: type")
    .Attr("Tseg: {int32, int64}")
    .Attr("segment_kind: {'row_splits', 'row_ids'}")
    .Attr("has_weights: bool = false")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(0));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Passes `ids` through once their bags are valid, with the checks and the
InvalidArgument messages of CtrEmbeddingLookup's: an op that changes state
with the ids (an inserting CtrHashTableFind) reads checked_ids, so bags that
the pooling after it would refuse change nothing. The inputs are those of
CtrEmbeddingLookup but `params`.
segment_kind: as in CtrEmbeddingLookup; num_rows is the bag count of row ids.
has_weights: whether `weights` must hold one value per id.
)doc");

REGISTER_OP("CtrUniqueKept")
    .Input("ids: int64")
    .Input("segments: Tseg")
    .Input("num_rows: int64")
    .Input("weights: float")
    .Output("unique: int64")
    .Output("idx: int64")
    .Output("fill_idx: int64")
    .Attr("Tseg: {int32, int64}")
    .Attr("segment_kind: {'row_splits', 'row_ids'}")
    .Attr("has_weights: bool = false")
    .Attr("table_rows: int >= 0")
    .Attr("prune_weights: bool = false")
    .Attr("fill_id: int = -1")
    .Attr("idx_base: int >= 0 = 0")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle ids;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 1, &ids));
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(1, ids);
      c->set_output(2, c->Scalar());
      return absl::OkStatus();
    })
    .Doc(R"doc(
The ids a lookup of a table in shards gathers, de-duplicated in the order
TF's lookups list them (its Unique's order: first appearance). An entry is
kept when its id is in [0, table_rows) and, with prune_weights, its weight is
> 0; `unique` lists the kept ids and idx[e] is the index of entry e in it, or
-1 where it is not kept. With fill_id >= 0, the id TF's safe lookup puts in
an empty bag (sparse_fill_empty_rows) is listed where the first bag with no
kept entry begins, and fill_idx is its index, or -1 where no bag is empty.
idx_base is added to idx where it is not -1 (1: the rows gathered for
`unique` follow a row of the fill, as the pooling op reads them).
The bag inputs and their checks are CtrCheckBags'. CPU only: TF's Unique,
the masks and the fill's placement around it took longer than the fused
lookup (cc/core/first_appearance.h).
)doc");

#undef CTR_LOOKUP_GRAD_SIGNATURE
#undef CTR_LOOKUP_SIGNATURE
#undef CTR_LOOKUP_ATTRS
#undef CTR_POOLING_ATTRS

}  // namespace tensorflow

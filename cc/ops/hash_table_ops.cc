// Key-to-row hash table: finds (and in training inserts) the value-matrix row
// of each key, so that two keys never share a row. The table is an int64
// variable (layout in cc/core/hash_table.h); the pooling of the rows is
// CtrEmbeddingLookup's, so its gradient reaches the value matrix as
// IndexedSlices and any optimizer updates only the touched rows.
// CtrHashTableEmbedding, the read-only find and pooling in one op, outputs the
// rows it found for that gradient.
#include "cc/ops/pooled_shape.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {

REGISTER_OP("CtrHashTableFind")
    .Input("table: resource")
    .Input("keys: Tkey")
    .Output("rows: int64")
    .Output("reused_rows: int64")
    .Attr("Tkey: {int32, int64}")
    .Attr("capacity: int >= 0")
    .Attr("insert: bool = false")
    .Attr("admit_after: int >= 1 = 1")
    .Attr("dense_padding: bool = false")
    .Attr("eviction: {'none', 'lru', 'lfu'} = 'none'")
    .Attr("new_step: bool = true")
    .SetIsStateful()
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(1));
      c->set_output(1, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc(R"doc(
The row of each key in a key-to-row hash table, -1 for a key without one.

table: an int64 resource variable [2 + S + ceil(capacity / 4), 4] in the
  layout of cc/core/hash_table.h (S a power of two), on the CPU.
capacity: rows of the value matrix; rows [0, capacity) are handed out.
insert: give each key without a row the next free row (training). When all
  `capacity` rows are taken (and eviction frees none), or 3/4 of the slots
  are, a new key gets -1 and is counted as dropped. Without insert the table
  is only read.
admit_after: with insert, a key gets a row on its admit_after-th sighting;
  before that it reads -1 (an admission filter against one-off keys).
dense_padding: a key equal to -1 is padding: it reads -1 and is never inserted.
eviction: with insert, when all rows are taken: "lru" evicts the keys least
  recently seen by inserting calls, "lfu" those seen least often, capacity/16
  at a time, never a key this step has seen. "none" drops new keys instead.
new_step: with insert, this call starts a training step (advances the
  table's clock, the step keys are stamped with); false continues the step of
  the table's previous inserting call, whose keys it then never evicts (a
  table read by two calls in one step).
reused_rows: rows freed by eviction and given to new keys in this call, whose
  values (still the evicted keys') the caller resets.
)doc");

REGISTER_OP("CtrHashTableEmbedding")
    .Input("table: resource")
    .Input("values: resource")
    .Input("keys: Tkey")
    .Input("segments: Tseg")
    .Input("num_rows: int64")
    .Input("weights: float")
    .Output("output: T")
    .Output("rows: int64")
    .Attr("T: {float, half, bfloat16, double}")
    .Attr("Tkey: {int32, int64}")
    .Attr("Tseg: {int32, int64}")
    .Attr("capacity: int >= 0")
    .Attr("dense_padding: bool = false")
    .Attr("combiner: {'sum', 'mean', 'sqrtn'} = 'mean'")
    .Attr("segment_kind: {'row_splits', 'row_ids'}")
    .Attr("prune_weights: bool = false")
    .Attr("max_norm: float = -1.0")
    .Attr("has_weights: bool = false")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &unused));
      TF_RETURN_IF_ERROR(ctr_shapes::PooledLookupShape(c, 1, /*resource=*/true));
      c->set_output(1, c->input(2));
      return absl::OkStatus();
    })
    .Doc(R"doc(
CtrHashTableFind without insert and CtrResourceEmbeddingLookup of the rows it
finds, in one pass over the keys: pools the rows of `values` [capacity, ...]
that the table gives `keys` over bags, output [B, ...]. A key without a row
is left out of its bag (a bag left empty pools to zeros). Reads both
variables in place, on the CPU.

table, capacity, dense_padding: as in CtrHashTableFind.
values: the resource variable of the value matrix.
keys, segments, num_rows, weights, combiner, segment_kind, prune_weights,
  max_norm, has_weights: as `ids` and the attrs of CtrEmbeddingLookup.
rows: each key's row, -1 for none, as CtrHashTableFind gives them: the
  gradient is CtrResourceEmbeddingLookupGrad's of these rows (skip_negative).
)doc");

}  // namespace tensorflow

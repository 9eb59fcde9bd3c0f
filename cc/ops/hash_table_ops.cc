// Key-to-row hash table: finds (and in training inserts) the value-matrix row
// of each key, so that two keys never share a row. The table is an int64
// variable (layout in cc/core/hash_table.h); the pooling of the rows is
// CtrEmbeddingLookup's, so its gradient reaches the value matrix as
// IndexedSlices and any optimizer updates only the touched rows.
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
  at a time, never a key this call has seen. "none" drops new keys instead.
reused_rows: rows freed by eviction and given to new keys in this call, whose
  values (still the evicted keys') the caller resets.
)doc");

}  // namespace tensorflow

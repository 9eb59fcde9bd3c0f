// A Keras Embedding's gather, as patterns that replace it see it: Keras 3's
// take() wraps negative indices before the gather, and a Flatten of the
// [B, 1, D] rows often follows it. A pattern that turns the gather into a
// fused op absorbs both where exact.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "cc/grappler/pattern.h"
#include "tensorflow/core/framework/node_def.pb.h"
#include "tensorflow/core/framework/types.pb.h"

namespace tf_ctr {
namespace grappler {

// The dtype of the rows a GatherV2 or ResourceGather gathers.
tensorflow::DataType GatheredType(const tensorflow::NodeDef& gather, bool resource);
// The table a fused op replacing `gather` reads: GatherV2's params, or a new
// read of ResourceGather's variable (named after the gather).
std::string GatheredTable(RewriteContext* ctx, const tensorflow::NodeDef& gather, bool resource,
                          tensorflow::DataType T);
// An int64 -> int32/int64 Cast of ids, as before an int32 Keras Embedding input.
bool IsIndexCast(const tensorflow::NodeDef* n);

// Keras 3's take() wraps negative indices: SelectV2(Less(h, 0), AddV2(h, n), h).
// Returns h and sets `wrap` to {select, less, add} when `select` is that
// wrap; returns `select` itself otherwise.
const tensorflow::NodeDef* UnwrapNegativeIndexFix(const GraphIndex& g, const tensorflow::NodeDef* select,
                                                  std::vector<const tensorflow::NodeDef*>* wrap);
// SelectV2 broadcasts: the wrap keeps h's shape only when the shift n is a scalar.
bool WrapShiftIsScalar(RewriteContext* ctx, const std::vector<const tensorflow::NodeDef*>& wrap);
// Whether each node of the wrap feeds only the next (the Select only the
// gather) and broadcasts nothing: a wrap of ids never negative (a hash's)
// passes them through, and may go with the gather.
bool WrapFeedsOnlyTheGather(RewriteContext* ctx, const std::vector<const tensorflow::NodeDef*>& wrap);
// The wrap's operands other than h and its own nodes: the constant 0 and the
// shift (Keras' Cast(Shape(params)[0])), which go with it where only it reads them.
std::vector<const tensorflow::NodeDef*> WrapOperands(const GraphIndex& g,
                                                     const std::vector<const tensorflow::NodeDef*>& wrap);

// The nodes of `match` (the intermediates between a feature's ids and
// `gather`, which a fused op replacing the gather would absorb) that must
// stay because other gathers of the same ids read them: the gathers of one
// feature by several Embeddings (DeepFM's Embedding(N, 1) and
// Embedding(N, D) of one Hashing or StringLookup layer), each fused on its
// own while what they share stays for the others -- also a negative-index
// wrap Grappler merged when both tables have N rows. A reader outside
// `match` may be a gather (at its indices), an index cast, a StridedSlice of
// it (another field of [B, F] ids), or a node of a
// wrap of `wrapped` (the ids the wraps read; null: none); a kept node keeps
// what it reads in `match`. False, with *why, when another reader (or the
// caller) reads a node of `match`.
bool SharedWithOtherGathers(const GraphIndex& g, const std::vector<const tensorflow::NodeDef*>& match,
                            const tensorflow::NodeDef& gather, const tensorflow::NodeDef* wrapped,
                            std::set<const tensorflow::NodeDef*>* kept, std::string* why);

// Weights [B, L] expanded to [B, L, 1] to scale gathered rows [B, L, D]:
// ExpandDims(w, -1 or 2), w[..., None] or w[:, :, None] (StridedSlice),
// or Reshape(w, [-1, L, 1]) (an expansion only where w is known to have L
// columns: `reshaped_length` is L, for the caller to check), perhaps cast
// (a bool mask cast to float).
struct ExpandedWeights {
  const tensorflow::NodeDef* expand = nullptr;
  const tensorflow::NodeDef* cast = nullptr;  // Cast(expand), or null
  std::string weights;                        // w
  tensorflow::DataType type = tensorflow::DT_INVALID;  // w's
  std::vector<std::string> constants;         // the axis, the slice's begin, end and strides, or the shape
  int64_t reshaped_length = 0;                // L of a Reshape to [-1, L, 1]; 0: no Reshape
};
bool MatchExpandedWeights(const GraphIndex& g, const tensorflow::NodeDef* x, ExpandedWeights* w);

// Whether `axes` is the constant axis 1 of a rank-3 tensor (1 or -2, as a
// scalar or a one-element vector): the id axis of gathered [B, L, D] rows.
bool IsAxisOne(const tensorflow::NodeDef* axes);

// Whether `gather`'s rows are a padded pooling's bags as dense_reduce_lookup
// fuses them whole: `ids` [B, L] of a known L into a table of T float32, the
// rows read (through Identities) by one Sum or Mean over the id axis, by the
// Select of Keras' masked mean, or by a Mul (weights) one Sum over the id
// axis reads, and dense_reduce_lookup is not switched off. A pattern that would take the
// gather alone leaves it to that one, which fuses the pooling too.
bool RowsArePooledBags(RewriteContext* ctx, const tensorflow::NodeDef& gather, const tensorflow::NodeDef& ids,
                       int ids_port, tensorflow::DataType T);

// Keras' Flatten of the gathered rows (through the Identity that
// tf.nn.embedding_lookup ends in), or a Squeeze of their axis 1: `reshape`
// is the node whose [B, D] output the fused op's equals (the Squeeze has no
// shape, slice or pack).
struct FlattenOfRows {
  std::vector<std::string> identities;
  std::string shape, slice, pack, reshape;
  bool found() const { return !reshape.empty(); }
};

// Whether the gather's [B, 1, D] output feeds nothing but a Flatten to
// [B, D] (D a known constant): then the Flatten's output is exactly the
// fused op's, bit for bit. Control edges on the gather stay valid (the
// fused node takes its name); the nodes in between must have none.
// What a pattern proved of the gather's ids where shape inference cannot:
// ids from a run-time dense_shape (a SparseCross's, online, where Keras'
// set_shape left no recorded shape) are [batch, 1] ([0, 0] at B = 0), the
// batch known from the cross's inputs (a function traced for one batch).
struct ProvenIds {
  bool one_per_row = false;
  int64_t batch = -1;  // -1: unknown
};
bool MatchFlatten(RewriteContext* ctx, const tensorflow::NodeDef& gather, FlattenOfRows* f,
                  const ProvenIds& proven = {});

// The rank of the table a gather reads: its output has rank ids + table - 1;
// the variable's declared shape is the fallback. -1 when unknown.
int GatherTableRank(RewriteContext* ctx, const tensorflow::NodeDef& gather, bool resource, int ids_rank);

// Removes `node` when the absorbed nodes were its only readers, and its own
// inputs after it, down to `depth` levels: shape arithmetic only.
void RemoveIfDeadShapeMath(RewriteContext* ctx, const tensorflow::NodeDef* node, const std::string& fused,
                           int depth);

// Flattens [B, 1] keys to [B] (a Reshape to [-1]); rank-1 keys stay as they are.
std::string FlattenKeys(RewriteContext* ctx, const std::string& base, const std::string& input,
                        tensorflow::DataType t, int rank, const std::string& device);

// The Flatten's readers read the fused [B, D] output instead; its nodes,
// and the constants only they read, go.
void AbsorbFlatten(RewriteContext* ctx, const std::string& fused, const FlattenOfRows& f, MatchRecord* record);

// Turns the gather `anchor` into the fused node (rank 1, or rank 2 read only
// by a Flatten), or into ExpandDims of a new fused node (rank 2), keeping the
// anchor's name for its consumers. Returns the fused node, inputs and
// attributes still to fill.
tensorflow::NodeDef* BecomeGatherOutput(RewriteContext* ctx, const tensorflow::NodeDef& anchor,
                                        const std::string& op, tensorflow::DataType T, int rank,
                                        const FlattenOfRows& flatten, MatchRecord* record);
// The same for keys of any shape (`keys`, of type `key_type`) whose rows the
// fused op gives flat, one per key: the gather becomes a Reshape of them to
// keys.shape + [D].
tensorflow::NodeDef* BecomeGatherOutputOfKeys(RewriteContext* ctx, const tensorflow::NodeDef& anchor,
                                              const std::string& op, tensorflow::DataType T,
                                              const std::string& keys, tensorflow::DataType key_type);

}  // namespace grappler
}  // namespace tf_ctr

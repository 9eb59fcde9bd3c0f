// The sparse ids a fused lookup pools, traced back to the SparseTensor they
// were built as: what the patterns that absorb the ids' producer into the
// lookup (a feature cross, a bucketized column) share.
#pragma once

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "cc/grappler/pattern.h"

namespace tf_ctr {
namespace grappler {

// A CtrEmbeddingLookup bagged by row ids reads a SparseTensor (indices,
// values, dense_shape) through, from the lookup up:
//   ids      [SparseReorder:1 ->] [Identity ->]* values'
//   rows     [:, 0] of [SparseReorder:0 | indices']
//   num_rows dense_shape'[0]
// where (indices', values', dense_shape') come from (indices, values,
// dense_shape) through SparseReshapes that keep every entry in its row (the
// linear model's [S[0], -1], the safe lookup's flattening) and Identities.
// When the base SparseTensor is in row-major order, its rows are the
// lookup's bags.
struct SparseChain {
  std::string indices, values, shape;  // the base SparseTensor
  std::vector<const tensorflow::NodeDef*> reshapes;  // from the base down
  std::vector<const tensorflow::NodeDef*> identities;  // on the values
  const tensorflow::NodeDef* reorder = nullptr;
  const tensorflow::NodeDef* rows = nullptr;
  const tensorflow::NodeDef* num_rows = nullptr;

  // The nodes between the base and the lookup, which a fused op replaces.
  std::vector<const tensorflow::NodeDef*> Nodes() const;
  // Whether `port` of `node` is a dense shape along the chain (the base's
  // is the caller's to judge).
  bool IsReshapedShape(const tensorflow::NodeDef& node, int port) const;
};

// Traces the bags of `lookup` (a CtrEmbeddingLookup). False without a
// reason when the ids are not a SparseTensor's values; false with *why when
// they are, but the rows or row count are not the chain's.
bool TraceLookupBags(const GraphIndex& g, const tensorflow::NodeDef& lookup, SparseChain* c, std::string* why);

// Whether nothing outside the chain, `base` (the nodes building the base
// SparseTensor, which the fused op also replaces) and the lookup reads their
// outputs, except dense shapes (`is_shape` says which: the fused op gives
// them), and nothing of them is fetched or fed; else *why names the reader.
bool OnlyChainReads(RewriteContext* ctx, const tensorflow::NodeDef& lookup, const SparseChain& c,
                    const std::vector<const tensorflow::NodeDef*>& base,
                    const std::function<bool(const tensorflow::NodeDef&, int)>& is_shape, std::string* why);

// Producers of `from` (and theirs), while they are stateless shape
// arithmetic that only nodes of `inside` read: they go with those nodes.
void CollectShapeMathOnlyFor(RewriteContext* ctx, const tensorflow::NodeDef* from,
                             std::set<const tensorflow::NodeDef*>* inside, std::vector<const tensorflow::NodeDef*>* out);

// Replaces the chain, `base` and `extra` by the fused node `fused` (already
// rewritten in place of the lookup): the readers of every dense shape along
// the chain (`shapes`, as tensor names) read `fused_shape` instead.
void AbsorbChain(RewriteContext* ctx, const SparseChain& c, const std::vector<const tensorflow::NodeDef*>& base,
                 const std::vector<std::string>& shapes, const std::string& fused_shape, MatchRecord* record);

}  // namespace grappler
}  // namespace tf_ctr

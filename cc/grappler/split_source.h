// Where string ids come from, shared by the patterns that fuse a string split
// into CtrStringEmbedding: the tokens of tf.strings.split, converted to ids,
// and the row partition TF builds from the split's outputs.
//
// The row partition is recognized by what it is computed from (the split's
// outputs alone) and by the ops that make RowPartitionFromValueRowIds (a
// bincount, Cumsum), not node by node: Grappler's own passes reshape such
// index subgraphs before custom optimizers run.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "cc/grappler/pattern.h"

namespace tf_ctr {
namespace grappler {

// Whether `op` is one of the stateless ops ragged index subgraphs are built from.
bool IsIndexArithmetic(const std::string& op);

// Whether `root` is computed only from the given tensors (or any output of
// `source_nodes`) and constants, through stateless index arithmetic, with
// every op of each `required` alternative list occurring on the way. The
// nodes passed through are added to *nodes.
bool ComputedOnlyFrom(const GraphIndex& g, const std::string& root, const std::set<std::string>& source_tensors,
                      const std::set<std::string>& source_nodes, const std::vector<std::vector<std::string>>& required,
                      std::set<std::string>* nodes);

// Removes the nodes of `dead` that only the replaced subgraph reads (`dead`
// and `replaced`), to a fixpoint: a node some survivor reads survives too.
// Their control edges move onto `fused`.
void RemoveDeadNodes(RewriteContext* ctx, std::set<std::string> dead, const std::set<std::string>& replaced,
                     const std::string& fused);

// tf.strings.split(strings, sep) + conversion of its tokens to ids.
struct SplitSource {
  const tensorflow::NodeDef* split = nullptr;    // StringSplitV2
  const tensorflow::NodeDef* convert = nullptr;  // StringToHashBucketFast or StringToNumber<int64>
  std::string delimiter;
  bool hashed = false;
};

// `ids` (output ids_port) = convert(StringSplitV2(strings, sep).values) with
// maxsplit -1, a constant delimiter of 1..16 bytes and vector strings, read
// only by the caller (`ids_readers` times: Keras' wrap reads a hash thrice);
// and `splits` is that split's row partition. Adds the partition's nodes and
// the split to *dead.
bool MatchRaggedSplit(const GraphIndex& g, RewriteContext* ctx, const tensorflow::NodeDef& ids, int ids_port,
                      const std::string& splits, SplitSource* out, std::set<std::string>* dead,
                      int ids_readers = 1);

}  // namespace grappler
}  // namespace tf_ctr

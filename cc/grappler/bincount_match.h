// The encodings of ids a Dense layer reads: DenseBincount (tf.math.bincount
// with axis=-1; Keras' CategoryEncoding, and lookups with a one_hot,
// multi_hot or count output_mode) and the shape math Keras computes its size
// with. Shared by the patterns that turn a MatMul over encodings into a sum
// of kernel rows (vocab_multi_hot, multi_hot_dense).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "cc/grappler/pattern.h"
#include "tensorflow/core/framework/node_def.pb.h"

namespace tf_ctr {
namespace grappler {

// Whether `node` is a Const holding no elements (an unweighted bincount's weights).
bool IsEmptyConst(const tensorflow::NodeDef* node);

// Whether `node` and everything that reads it is shape math whose result
// nothing reads (Keras computes a batch size it then does not use); collects
// them into `dead`.
bool CollectDeadEnd(RewriteContext* ctx, const tensorflow::NodeDef* node, std::vector<const tensorflow::NodeDef*>* dead);

// Collects the shape math under `node` down to `ids` (which it reads) into
// `nodes`: integer arithmetic on the ids' size and maximum. Control inputs
// fail it, unless `waits` is given, which collects what they name.
bool CollectSizeMath(const GraphIndex& g, const tensorflow::NodeDef* node, const tensorflow::NodeDef* ids,
                     std::vector<const tensorflow::NodeDef*>* nodes, std::set<std::string>* waits = nullptr);

// The bincount's size when it is known before run time: a constant, or
// Minimum(hi, Maximum(lo, x)) with constants lo >= hi, which is hi; else -1.
int64_t KnownSize(const GraphIndex& g, const tensorflow::NodeDef* size);

}  // namespace grappler
}  // namespace tf_ctr

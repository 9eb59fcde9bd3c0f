// A Dense layer's product as the patterns that replace it by a sum of kernel
// rows see it (vocab_multi_hot, multi_hot_dense): a MatMul, or, where TF's
// remapper ran first (online rewriting runs after TF's own passes), a
// _FusedMatMul that also adds the bias and applies the activation. The fused
// op then takes the product's place and the bias and activation are written
// back as the TF ops they stand for.
#pragma once

#include <string>

#include "cc/grappler/rewrite_context.h"
#include "tensorflow/core/framework/node_def.pb.h"

namespace tf_ctr {
namespace grappler {

struct DenseProduct {
  std::string bias;        // the _FusedMatMul's bias tensor; empty for a MatMul
  std::string activation;  // the op of its activation, or empty
};

// Whether `node` is such a product. False with `why` empty when it is no
// matrix product at all; false with `why` set for a _FusedMatMul whose fused
// ops are not a bias and one of the activations TF has an op for.
bool ReadDenseProduct(const tensorflow::NodeDef& node, DenseProduct* product, std::string* why);

// The node the fused op is to be written into (cleared): the anchor itself
// for a MatMul; for a _FusedMatMul a new node, while the anchor becomes the
// activation (or the BiasAdd) of the chain fused op -> BiasAdd -> activation,
// so that its readers read the same values under the same name.
tensorflow::NodeDef* ProductNode(RewriteContext* ctx, const tensorflow::NodeDef& anchor,
                                 const DenseProduct& product);

}  // namespace grappler
}  // namespace tf_ctr

#include "cc/grappler/dense_product.h"

#include <set>

#include "cc/grappler/node_match.h"
#include "tensorflow/core/framework/attr_value.pb.h"

namespace tf_ctr {
namespace grappler {

using tensorflow::NodeDef;

bool ReadDenseProduct(const NodeDef& node, DenseProduct* product, std::string* why) {
  why->clear();
  *product = DenseProduct{};
  if (IsOp(&node, "MatMul")) return true;
  if (!IsOp(&node, "_FusedMatMul")) return false;
  // Activations whose TF op computes what the fused kernel does on every
  // finite value (LeakyRelu's alpha goes with it).
  static const std::set<std::string> kActivations = {"Relu", "Relu6", "Elu", "LeakyRelu", "Tanh", "Sigmoid"};
  const auto it = node.attr().find("fused_ops");
  std::vector<std::string> ops;
  if (it != node.attr().end())
    for (const std::string& op : it->second.list().s()) ops.push_back(op);
  const bool fits = IntAttr(node, "num_args", 0) == 1 && node.input_size() >= 3 && node.input(2)[0] != '^' &&
                    (ops.size() == 1 || ops.size() == 2) && ops[0] == "BiasAdd" &&
                    (ops.size() == 1 || kActivations.count(ops[1]));
  if (!fits) {
    std::string joined;
    for (const std::string& op : ops) joined += (joined.empty() ? "" : ", ") + op;
    *why = Describe(node) + " fuses [" + joined + "], not a bias and one of Relu, Relu6, Elu, LeakyRelu, Tanh, "
           "Sigmoid";
    return false;
  }
  product->bias = node.input(2);
  if (ops.size() == 2) product->activation = ops[1];
  return true;
}

NodeDef* ProductNode(RewriteContext* ctx, const NodeDef& anchor_in, const DenseProduct& product) {
  const NodeDef anchor = anchor_in;  // the graph changes under the reference
  if (product.bias.empty()) {
    NodeDef* node = ctx->Mutable(anchor.name());
    node->clear_input();
    node->clear_attr();
    return node;
  }
  const tensorflow::DataType T = TypeAttr(anchor, "T");
  NodeDef* fused = ctx->AddNode(anchor.name() + "/product", "", anchor.device());
  const std::string fused_name = fused->name();
  std::string biased_name;
  if (product.activation.empty()) {
    biased_name = anchor.name();
  } else {
    NodeDef* activation = ctx->Mutable(anchor.name());
    NodeDef* biased = ctx->AddNode(anchor.name() + "/bias_add", "BiasAdd", anchor.device());
    biased_name = biased->name();
    activation->clear_input();
    activation->clear_attr();
    activation->set_op(product.activation);
    activation->add_input(biased_name);
    (*activation->mutable_attr())["T"].set_type(T);
    if (product.activation == "LeakyRelu")
      (*activation->mutable_attr())["alpha"].set_f(anchor.attr().at("leakyrelu_alpha").f());
  }
  NodeDef* biased = ctx->Mutable(biased_name);
  biased->clear_input();
  biased->clear_attr();
  biased->set_op("BiasAdd");
  biased->add_input(fused_name);
  biased->add_input(product.bias);
  (*biased->mutable_attr())["T"].set_type(T);
  (*biased->mutable_attr())["data_format"].set_s("NHWC");
  return ctx->Mutable(fused_name);
}

}  // namespace grappler
}  // namespace tf_ctr

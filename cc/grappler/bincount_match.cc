#include "cc/grappler/bincount_match.h"

#include <set>
#include <string>

namespace tf_ctr {
namespace grappler {

using tensorflow::NodeDef;

bool IsEmptyConst(const NodeDef* node) {
  if (!IsOp(node, "Const")) return false;
  const auto& shape = node->attr().at("value").tensor().tensor_shape();
  for (const auto& dim : shape.dim())
    if (dim.size() == 0) return true;
  return false;
}

bool CollectDeadEnd(RewriteContext* ctx, const NodeDef* node, std::vector<const NodeDef*>* dead) {
  static const std::set<std::string> kShapeOps = {"Shape", "StridedSlice", "Size", "Rank"};
  const GraphIndex& g = ctx->index();
  if (!kShapeOps.count(node->op()) || ctx->MustKeep(node->name()) || HasControlInputs(*node) ||
      g.ControlConsumers(node->name()) != 0)
    return false;
  for (const NodeDef* reader : g.DataReaders(node->name()))
    if (!CollectDeadEnd(ctx, reader, dead)) return false;
  for (const NodeDef* n : *dead)
    if (n == node) return true;
  dead->push_back(node);
  return true;
}

bool CollectSizeMath(const GraphIndex& g, const NodeDef* node, const NodeDef* ids, std::vector<const NodeDef*>* nodes,
                     std::set<std::string>* waits) {
  static const std::set<std::string> kPure = {"Const", "Mul", "AddV2", "Add", "Cast", "Greater",
                                              "Size", "Max", "Maximum", "Minimum"};
  if (node == ids) return true;
  if (node == nullptr || !kPure.count(node->op()) || (waits == nullptr && HasControlInputs(*node))) return false;
  for (const NodeDef* n : *nodes)
    if (n == node) return true;
  nodes->push_back(node);
  for (int i = 0; i < node->input_size(); ++i) {
    if (!node->input(i).empty() && node->input(i)[0] == '^') {
      waits->insert(node->input(i).substr(1));
      continue;
    }
    if (!CollectSizeMath(g, g.Producer(*node, i), ids, nodes, waits)) return false;
  }
  return true;
}

int64_t KnownSize(const GraphIndex& g, const NodeDef* size) {
  int64_t value = -1;
  if (ConstScalarInt(size, &value)) return value;
  if (!IsOp(size, "Minimum")) return -1;
  for (int side = 0; side < 2; ++side) {
    int64_t hi = -1, lo = -1;
    const NodeDef* other = g.Producer(*size, 1 - side);
    if (!ConstScalarInt(g.Producer(*size, side), &hi) || !IsOp(other, "Maximum")) continue;
    for (int s = 0; s < 2; ++s)
      if (ConstScalarInt(g.Producer(*other, s), &lo) && lo >= hi) return hi;
  }
  return -1;
}

}  // namespace grappler
}  // namespace tf_ctr

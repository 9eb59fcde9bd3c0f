#include "cc/grappler/sparse_chain.h"

#include <algorithm>

#include "cc/grappler/absorbed_set.h"

namespace tf_ctr {
namespace grappler {

using tensorflow::NodeDef;

std::vector<const NodeDef*> SparseChain::Nodes() const {
  std::vector<const NodeDef*> nodes = {rows, num_rows};
  nodes.insert(nodes.end(), reshapes.begin(), reshapes.end());
  nodes.insert(nodes.end(), identities.begin(), identities.end());
  if (reorder != nullptr) nodes.push_back(reorder);
  return nodes;
}

bool SparseChain::IsReshapedShape(const NodeDef& node, int port) const {
  return port == 1 && std::find(reshapes.begin(), reshapes.end(), &node) != reshapes.end();
}

bool TraceLookupBags(const GraphIndex& g, const NodeDef& lookup, SparseChain* c, std::string* why) {
  if (StringAttr(lookup, "segment_kind") != "row_ids") return false;
  int port = 0;
  const NodeDef* x = g.Producer(lookup, 1, &port);
  std::string values = lookup.input(1);
  if (IsOp(x, "SparseReorder") && port == 1) {
    c->reorder = x;
    values = x->input(1);
  }
  for (const NodeDef* n = g.Node(ParseTensorName(values).node); IsOp(n, "Identity");
       n = g.Node(ParseTensorName(values).node)) {
    c->identities.push_back(n);
    values = n->input(0);
  }
  c->values = values;  // set first: the caller judges the producer even when the rest does not trace

  c->rows = g.Producer(lookup, 2);
  if (!IsFirstColumn(g, c->rows)) {
    *why = "the lookup's row ids are not the first column of its ids' indices";
    return false;
  }
  std::string indices = c->rows->input(0);
  if (c->reorder != nullptr) {
    if (!SameTensor(indices, TensorName(c->reorder->name(), 0))) {
      *why = "the lookup's row ids are not those of " + Describe(*c->reorder);
      return false;
    }
    indices = c->reorder->input(0);
  }
  std::vector<const NodeDef*> up;  // from the lookup up to the base
  for (const NodeDef* n = g.Node(ParseTensorName(indices).node); IsOp(n, "SparseReshape");
       n = g.Node(ParseTensorName(indices).node)) {
    if (ParseTensorName(indices).port != 0 || !(IsFlattenToRank2(g, *n) || IsReshapeToBatchRows(g, *n))) {
      *why = Describe(*n) + " may move entries between rows";
      return false;
    }
    up.push_back(n);
    indices = n->input(0);
  }
  c->reshapes.assign(up.rbegin(), up.rend());
  c->indices = indices;
  c->shape = c->reshapes.empty() ? "" : c->reshapes.front()->input(1);
  std::string shape = c->shape;
  for (const NodeDef* r : c->reshapes) {
    if (!SameTensor(r->input(1), shape)) {
      *why = Describe(*r) + " is not given the dense shape of what it reshapes";
      return false;
    }
    shape = TensorName(r->name(), 1);
  }
  c->num_rows = g.Producer(lookup, 3);
  if (!IsFirstElementSlice(g, c->num_rows)) {
    *why = "the lookup's row count is not its ids' dense_shape[0]";
    return false;
  }
  // Without a reshape the dense shape is known only from the row count (or the reorder).
  if (c->shape.empty()) c->shape = shape = c->num_rows->input(0);
  if (!SameTensor(c->num_rows->input(0), shape) ||
      (c->reorder != nullptr && !SameTensor(c->reorder->input(2), shape))) {
    *why = "the lookup's row count is not its ids' dense_shape[0]";
    return false;
  }
  return true;
}

bool OnlyChainReads(RewriteContext* ctx, const NodeDef& lookup, const SparseChain& c,
                    const std::vector<const NodeDef*>& base, const std::function<bool(const NodeDef&, int)>& is_shape,
                    std::string* why) {
  const GraphIndex& g = ctx->index();
  std::vector<const NodeDef*> nodes = c.Nodes();
  nodes.insert(nodes.end(), base.begin(), base.end());
  std::set<const NodeDef*> inside(nodes.begin(), nodes.end());
  inside.insert(&lookup);
  for (const NodeDef* n : nodes) {
    if (ctx->FetchedOrFed(n->name())) {
      *why = "intermediate " + Describe(*n) + " is fetched or fed";
      return false;
    }
    for (const NodeDef* reader : g.DataReaders(n->name())) {
      if (inside.count(reader)) continue;
      for (const std::string& in : reader->input()) {
        const TensorId t = ParseTensorName(in);
        if (t.node == n->name() && t.port >= 0 && !c.IsReshapedShape(*n, t.port) && !is_shape(*n, t.port)) {
          *why = "intermediate " + Describe(*n) + " is read by " + Describe(*reader);
          return false;
        }
      }
    }
  }
  return true;
}

void CollectShapeMathOnlyFor(RewriteContext* ctx, const NodeDef* from, std::set<const NodeDef*>* inside,
                             std::vector<const NodeDef*>* out) {
  static const std::set<std::string> kShapeMath = {"Pack", "Cast", "StridedSlice", "Prod", "Slice", "GatherV2",
                                                   "Shape", "Range", "Tile", "ExpandDims", "Reshape", "Mul",
                                                   "Transpose"};
  const GraphIndex& g = ctx->index();
  std::vector<const NodeDef*> todo = {from};
  while (!todo.empty()) {
    const NodeDef* n = todo.back();
    todo.pop_back();
    if (n == nullptr || inside->count(n) || !kShapeMath.count(n->op()) || ctx->MustKeep(n->name()) ||
        g.ControlConsumers(n->name()) > 0 || HasControlInputs(*n))
      continue;
    bool only_inside = true;
    for (const NodeDef* reader : g.DataReaders(n->name())) only_inside = only_inside && inside->count(reader);
    if (!only_inside) continue;
    inside->insert(n);
    out->push_back(n);
    for (int i = 0; i < n->input_size(); ++i) todo.push_back(g.Producer(*n, i));
  }
}

void AbsorbChain(RewriteContext* ctx, const SparseChain& c, const std::vector<const NodeDef*>& base,
                 const std::vector<std::string>& shapes, const std::string& fused_shape, MatchRecord* record) {
  for (const std::string& shape : shapes) {
    const TensorId t = ParseTensorName(shape);
    ctx->RedirectDataEdges(std::string(t.node), t.port, fused_shape);
  }
  for (const NodeDef* r : c.reshapes) ctx->RedirectDataEdges(r->name(), 1, fused_shape);
  std::vector<const NodeDef*> absorbed = c.Nodes();
  absorbed.insert(absorbed.end(), base.begin(), base.end());
  AbsorbNodes(ctx, absorbed, record->fused_node, record);
}

}  // namespace grappler
}  // namespace tf_ctr

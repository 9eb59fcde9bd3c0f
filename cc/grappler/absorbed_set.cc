#include "cc/grappler/absorbed_set.h"

#include <cstring>
#include <set>
#include <unordered_map>

#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/tensor.pb.h"
#include "tensorflow/core/framework/tensor_shape.pb.h"

namespace tf_ctr {
namespace grappler {

using tensorflow::NodeDef;

// Stateless shape arithmetic whose output nothing reads, directly or
// through other such nodes; nothing waits on it and it is not fetched.
static bool IsDeadShapeArithmetic(const GraphIndex& g, const NodeDef& n, std::set<std::string>* dead, int depth) {
  static const std::set<std::string> kPure = {"Shape", "Size", "Rank", "ConcatV2", "Fill", "ExpandDims", "Sub",
                                              "Pack", "Reshape", "StridedSlice", "Slice", "Cast", "Identity"};
  if (dead->count(n.name())) return true;
  if (depth > 8 || !kPure.count(n.op()) || g.ControlConsumers(n.name()) > 0) return false;
  const auto& readers = g.DataReaders(n.name());
  if (static_cast<int>(readers.size()) != g.DataConsumers(n.name())) return false;  // fetched
  for (const NodeDef* r : readers)
    if (!IsDeadShapeArithmetic(g, *r, dead, depth + 1)) return false;
  dead->insert(n.name());
  return true;
}

bool OnlyReadWithin(const GraphIndex& g, std::vector<const NodeDef*>* absorbed, const NodeDef& keeper,
                    std::string* outsider) {
  std::set<std::string> inside = {keeper.name()};
  for (const NodeDef* n : *absorbed) inside.insert(n->name());
  std::set<std::string> dead;
  const size_t given = absorbed->size();
  for (size_t i = 0; i < given; ++i) {
    const NodeDef* n = (*absorbed)[i];
    const auto& readers = g.DataReaders(n->name());
    bool ok = static_cast<int>(readers.size()) == g.DataConsumers(n->name());  // else fetched
    for (const NodeDef* r : readers) ok = ok && (inside.count(r->name()) || IsDeadShapeArithmetic(g, *r, &dead, 0));
    if (!ok) {
      *outsider = Describe(*n);
      return false;
    }
  }
  for (const std::string& name : dead)
    if (!inside.count(name)) absorbed->push_back(g.Node(name));
  return true;
}

void AbsorbNodes(RewriteContext* ctx, const std::vector<const NodeDef*>& absorbed, const std::string& fused,
                 MatchRecord* record) {
  NodeDef* target = ctx->Mutable(fused);
  for (const NodeDef* n : absorbed) {
    if (n->name() == fused) continue;
    record->replaced.push_back(Describe(*n));
    CopyControlInputs(*n, target);
    ctx->RedirectControlEdges(n->name(), fused);
    ctx->Remove(n->name(), fused);
  }
}

bool ConstScalarFloat(const NodeDef* node, float* value) {
  if (!IsOp(node, "Const")) return false;
  auto it = node->attr().find("value");
  if (it == node->attr().end()) return false;
  const tensorflow::TensorProto& t = it->second.tensor();
  if (t.dtype() != tensorflow::DT_FLOAT || t.tensor_shape().dim_size() != 0) return false;
  if (!t.tensor_content().empty()) {
    if (t.tensor_content().size() != sizeof(float)) return false;
    memcpy(value, t.tensor_content().data(), sizeof(float));
    return true;
  }
  if (t.float_val_size() > 1) return false;
  *value = t.float_val_size() ? t.float_val(0) : 0.f;  // TF stores a zero scalar as no values
  return true;
}

// Dim 0 of the variable behind a resource handle, looking through Identity.
static int64_t HandleRows(const GraphIndex& g, const NodeDef* handle) {
  while (IsOp(handle, "Identity")) handle = g.Producer(*handle, 0);
  if (handle == nullptr) return -1;
  auto it = handle->attr().find("_handle_shapes");
  if (it != handle->attr().end() && it->second.list().shape_size() == 1) {
    const auto& s = it->second.list().shape(0);
    return (!s.unknown_rank() && s.dim_size() == 2) ? s.dim(0).size() : -1;
  }
  if (IsOp(handle, "VarHandleOp")) {
    it = handle->attr().find("shape");
    if (it != handle->attr().end() && !it->second.shape().unknown_rank() && it->second.shape().dim_size() == 2)
      return it->second.shape().dim(0).size();
  }
  return -1;
}

int64_t TableRows(RewriteContext* ctx, const std::string& table) {
  const GraphIndex& g = ctx->index();
  const TensorId id = ParseTensorName(table);
  const NodeDef* node = g.Node(id.node);
  if (node == nullptr) return -1;
  if (ctx->Rank(*node, id.port) == 2) {
    const int64_t rows = ctx->Dim(*node, id.port, 0);
    if (rows >= 0) return rows;
  }
  return IsOp(node, "ReadVariableOp") ? HandleRows(g, g.Producer(*node, 0)) : -1;
}

std::set<std::string> Ancestors(const GraphIndex& g, const std::vector<std::string>& roots) {
  std::set<std::string> seen;
  std::vector<std::string> todo;
  for (const std::string& r : roots) todo.push_back(ParseTensorName(r).node);
  while (!todo.empty()) {
    const std::string name = todo.back();
    todo.pop_back();
    if (!seen.insert(name).second) continue;
    const NodeDef* node = g.Node(name);
    if (node == nullptr) continue;
    for (const std::string& in : node->input()) todo.push_back(ParseTensorName(in).node);
  }
  return seen;
}

bool MergeKeepsOrder(const GraphIndex& g, const std::vector<const NodeDef*>& members, std::string* why) {
  std::set<std::string> inside;
  for (const NodeDef* m : members) inside.insert(m->name());
  std::vector<std::string> roots;
  for (const NodeDef* m : members)
    for (const std::string& in : m->input())
      if (!inside.count(ParseTensorName(in).node)) roots.push_back(in);
  const std::set<std::string> upstream = Ancestors(g, roots);
  for (const NodeDef* m : members) {
    for (const auto* readers : {&g.DataReaders(m->name()), &g.ControlReaders(m->name())}) {
      for (const NodeDef* reader : *readers) {
        if (inside.count(reader->name()) || !upstream.count(reader->name())) continue;
        *why = Describe(*reader) + " depends on " + Describe(*m) + " and another of the ops to merge depends on "
               "it: one op cannot run both before and after it";
        return false;
      }
    }
  }
  return true;
}

}  // namespace grappler
}  // namespace tf_ctr

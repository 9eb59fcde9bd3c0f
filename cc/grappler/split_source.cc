#include "cc/grappler/split_source.h"

#include "cc/grappler/gathered_rows.h"

#include <map>
#include <string>
#include <utility>

namespace tf_ctr {
namespace grappler {

using tensorflow::NodeDef;

namespace {

// Stateless ops the index subgraphs of ragged tensors are built from.
const std::set<std::string>& IndexArithmeticOps() {
  static const auto* ops = new std::set<std::string>{
      "BroadcastTo", "Bincount", "Cast", "ConcatV2", "Const", "Cumsum", "DenseBincount", "ExpandDims",
      "Fill", "GatherV2", "Greater", "Identity", "Less", "Max", "Maximum", "Minimum", "Mul", "Pack",
      "Prod", "Range", "Reshape", "Shape", "Size", "Squeeze", "StridedSlice", "Sub", "AddV2", "Add", "Tile",
      "Where", "ZerosLike", "OnesLike"};
  return *ops;
}

}  // namespace

bool IsIndexArithmetic(const std::string& op) { return IndexArithmeticOps().count(op) > 0; }

bool ComputedOnlyFrom(const GraphIndex& g, const std::string& root, const std::set<std::string>& source_tensors,
                      const std::set<std::string>& source_nodes, const std::vector<std::vector<std::string>>& required,
                      std::set<std::string>* nodes) {
  constexpr size_t kMaxNodes = 400;
  std::vector<std::string> stack{root};
  std::set<std::string> ops_seen;
  bool reached = false;
  while (!stack.empty()) {
    const std::string t = stack.back();
    stack.pop_back();
    const TensorId id = ParseTensorName(t);
    if (source_tensors.count(TensorName(id.node, id.port)) || source_nodes.count(id.node)) {
      reached = true;
      continue;
    }
    if (nodes->count(id.node)) continue;
    const NodeDef* n = g.Node(id.node);
    if (n == nullptr || !IndexArithmeticOps().count(n->op()) || nodes->size() >= kMaxNodes) return false;
    nodes->insert(n->name());
    ops_seen.insert(n->op());
    int data_inputs = 0;
    for (const auto& in : n->input()) {
      if (in.empty() || in[0] == '^') continue;
      ++data_inputs;
      stack.push_back(in);
    }
    if (data_inputs == 0 && n->op() != "Const") return false;
  }
  for (const auto& any_of : required) {
    bool found = false;
    for (const auto& op : any_of) found |= ops_seen.count(op) > 0;
    if (!found) return false;
  }
  return reached;
}

void RemoveDeadNodes(RewriteContext* ctx, std::set<std::string> dead, const std::set<std::string>& replaced,
                     const std::string& fused) {
  const GraphIndex& g = ctx->index();
  for (bool changed = true; changed;) {
    changed = false;
    std::map<std::string, int> readers;
    for (const std::set<std::string>* group : {&std::as_const(dead), &replaced}) {
      for (const std::string& name : *group) {
        const NodeDef* n = g.Node(name);
        if (n == nullptr) continue;
        for (const auto& in : n->input())
          if (!in.empty() && in[0] != '^') ++readers[ParseTensorName(in).node];
      }
    }
    for (auto it = dead.begin(); it != dead.end();) {
      if (g.Node(*it) == nullptr || g.DataConsumers(*it) != readers[*it]) {
        it = dead.erase(it);
        changed = true;
      } else {
        ++it;
      }
    }
  }
  for (const std::string& name : dead) {
    ctx->RedirectControlEdges(name, fused);
    ctx->Remove(name, fused);
  }
}

bool MatchRaggedSplit(const GraphIndex& g, RewriteContext* ctx, const NodeDef& ids, int ids_port,
                      const std::string& splits, SplitSource* out, std::set<std::string>* dead, int ids_readers) {
  const bool hashed = IsStringHash(&ids);
  if (ids_port != 0 ||
      !(hashed || (IsOp(&ids, "StringToNumber") && TypeAttr(ids, "out_type") == tensorflow::DT_INT64)))
    return false;
  int port = 0;
  const NodeDef* split = g.Producer(ids, 0, &port);
  if (!IsOp(split, "StringSplitV2") || port != 1 || IntAttr(*split, "maxsplit", -1) != -1) return false;
  std::string delimiter;
  if (!ConstString(g.Producer(*split, 1), &delimiter) || delimiter.empty() || delimiter.size() > 16) return false;
  const NodeDef* strings = g.Producer(*split, 0, &port);
  if (strings == nullptr || ctx->Rank(*strings, port) != 1) return false;
  if (g.Consumers(split->name(), 1) != 1 || g.DataConsumers(ids.name()) != ids_readers) return false;
  std::set<std::string> partition;
  const TensorId s = ParseTensorName(split->input(0));
  if (!ComputedOnlyFrom(g, splits, {TensorName(s.node, s.port)}, {split->name()},
                        {{"Cumsum"}, {"Bincount", "DenseBincount"}}, &partition))
    return false;
  out->split = split;
  out->convert = &ids;
  out->delimiter = delimiter;
  out->hashed = hashed;
  dead->insert(partition.begin(), partition.end());
  dead->insert(split->name());
  return true;
}

}  // namespace grappler
}  // namespace tf_ctr

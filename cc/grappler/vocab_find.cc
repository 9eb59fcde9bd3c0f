#include "cc/grappler/vocab_find.h"

#include <string>
#include <vector>

#include "cc/grappler/keras_gather.h"

namespace tf_ctr {
namespace grappler {

using tensorflow::NodeDef;

namespace {

bool ConstScalarIs(const NodeDef* node, int64_t want) {
  int64_t v = 0;
  return ConstScalarInt(node, &v) && v == want;
}

// What waited on the Assert waits on the fused op and on what the Assert
// waited on.
void BypassAssert(RewriteContext* ctx, const NodeDef& assert_node, const std::vector<std::string>& absorbed,
                  const std::string& fused) {
  std::vector<std::string> waits;
  AppendControlInputs(assert_node, &waits);
  for (const NodeDef* reader : ctx->index().ControlReaders(assert_node.name())) {
    bool is_absorbed = false;
    for (const std::string& a : absorbed) is_absorbed |= a == reader->name();
    if (!is_absorbed && !waits.empty()) AddControlInputsOnce(waits, ctx->Mutable(reader->name()));
  }
  ctx->RedirectControlEdges(assert_node.name(), fused);
}

}  // namespace

bool MatchVocabCheck(const GraphIndex& g, const NodeDef& assert_node, const NodeDef& find, VocabIds* ids) {
  if (!IsOp(&assert_node, "Assert") || assert_node.input_size() < 2) return false;
  const NodeDef* is_empty = g.Producer(assert_node, 0);
  if (!IsOp(is_empty, "Equal") || !ConstScalarIs(g.Producer(*is_empty, 1), 0)) return false;
  const NodeDef* size = g.Producer(*is_empty, 0);
  if (!IsOp(size, "Size")) return false;
  const NodeDef* where = g.Producer(*size, 0);
  if (!IsOp(where, "Where")) return false;
  const NodeDef* missing = g.Producer(*where, 0);
  int port = -1;
  if (!IsOp(missing, "Equal") || g.Producer(*missing, 0, &port) != &find || port != 0) return false;
  if (!ConstScalarInt(g.Producer(*missing, 1), &ids->missing_id)) return false;
  std::vector<const NodeDef*> nodes = {is_empty, size, where, missing};
  int formats = 0;
  for (int i = 1; i < assert_node.input_size() && assert_node.input(i)[0] != '^'; ++i, ++formats) {
    const NodeDef* format = g.Producer(assert_node, i);
    if (!IsOp(format, "StringFormat") || format->input_size() != 1) return false;
    const NodeDef* gather = g.Producer(*format, 0);
    if (!IsOp(gather, "GatherNd") || gather->input(0) != find.input(1) || g.Producer(*gather, 1) != where)
      return false;
    nodes.push_back(format);
    nodes.push_back(gather);
  }
  // Every node of the check serves the check alone: one reader each, but the
  // Where, which the Size and each GatherNd read.
  for (const NodeDef* n : nodes) {
    const int readers = n == where ? 1 + formats : 1;
    if (HasControlInputs(*n) || g.ControlConsumers(n->name()) != 0 || g.DataConsumers(n->name()) != readers)
      return false;
  }
  ids->assert_node = &assert_node;
  ids->check = nodes;
  return true;
}

bool TraceToFind(const GraphIndex& g, const NodeDef* x, VocabIds* ids) {
  while (IsOp(x, "Identity")) {
    ids->identities.push_back(x);
    x = g.Producer(*x, 0);
  }
  if (!IsOp(x, "LookupTableFindV2")) return false;
  ids->find = x;
  return true;
}

bool MatchVocabWaits(const GraphIndex& g, VocabIds* ids, std::string* why) {
  for (const NodeDef* identity : ids->identities) {
    for (const std::string& in : identity->input()) {
      if (in.empty() || in[0] != '^') continue;
      const NodeDef* waited = g.Node(in.substr(1));
      if (ids->assert_node != nullptr || waited == nullptr || !MatchVocabCheck(g, *waited, *ids->find, ids)) {
        *why = Describe(*identity) + " waits on " + in.substr(1) + ", which is not the vocabulary check";
        return false;
      }
    }
  }
  return true;
}

bool ServedOnCpu(RewriteContext* ctx, const NodeDef& anchor) {
  const std::string placed = DeviceType(anchor.device());
  return (placed.empty() ? ctx->serving_device() : placed) == "CPU";
}

void AbsorbVocabNodes(RewriteContext* ctx, const VocabIds& ids, const std::string& fused,
                      const std::vector<std::string>& extra, std::vector<std::string>* replaced) {
  std::vector<const NodeDef*> absorbed = ids.wrap;
  absorbed.insert(absorbed.end(), ids.identities.begin(), ids.identities.end());
  absorbed.insert(absorbed.end(), ids.check.begin(), ids.check.end());
  if (ids.assert_node != nullptr) absorbed.push_back(ids.assert_node);
  absorbed.push_back(ids.find);
  std::vector<std::string> names = extra;
  for (const NodeDef* n : absorbed) names.push_back(n->name());
  if (ids.assert_node != nullptr) BypassAssert(ctx, *ids.assert_node, names, fused);
  for (const NodeDef* n : absorbed) {
    replaced->push_back(Describe(*n));
    if (n != ids.assert_node) ctx->RedirectControlEdges(n->name(), fused);
  }
  for (const NodeDef* n : ids.wrap)
    for (int i = 0; i < n->input_size(); ++i) RemoveIfDeadShapeMath(ctx, ctx->index().Producer(*n, i), fused, 4);
  for (const NodeDef* n : ids.check)
    for (int i = 0; i < n->input_size(); ++i) {
      const NodeDef* input = ctx->index().Producer(*n, i);
      if (IsOp(input, "Const")) RemoveIfDeadShapeMath(ctx, input, fused, 1);
    }
  for (const NodeDef* n : absorbed) ctx->Remove(n->name(), fused);
}

}  // namespace grappler
}  // namespace tf_ctr

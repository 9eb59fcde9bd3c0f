#include "cc/grappler/rewrite_context.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <unordered_set>

#include "cc/grappler/node_match.h"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/tensor.pb.h"
#include "tensorflow/core/framework/tensor_shape.pb.h"
#include "tensorflow/core/platform/logging.h"

namespace tf_ctr {
namespace grappler {

using tensorflow::NodeDef;

RewriteContext::RewriteContext(tensorflow::GraphDef* graph, std::vector<std::string> fetch,
                               std::set<std::string> preserve, const tensorflow::grappler::GraphProperties* properties)
    : graph_(graph), fetch_(std::move(fetch)), properties_(properties), preserve_(std::move(preserve)) {
  index_ = std::make_unique<GraphIndex>(*graph_, fetch_);
  const char* check = std::getenv("TF_CTR_OPS_CHECK_INDEX");
  check_index_ = check != nullptr && check[0] != '\0' && check[0] != '0';
}

void RewriteContext::Touch(NodeDef* node) {
  changed_.insert(node->name());
  if (!pending_.count(node->name())) touched_.emplace(node->name(), node);
}

NodeDef* RewriteContext::Mutable(const std::string& name) {
  // Indexed nodes belong to graph_, which this context may change.
  if (const NodeDef* n = index_->Node(name)) {
    NodeDef* node = const_cast<NodeDef*>(n);
    Touch(node);
    return node;
  }
  auto it = pending_.find(name);
  return it == pending_.end() ? nullptr : it->second;
}

std::vector<NodeDef*> RewriteContext::PossibleReaders(const std::string& from, bool control) {
  std::vector<NodeDef*> out;
  std::unordered_set<const NodeDef*> seen;
  auto add = [&](NodeDef* n) {
    if (seen.insert(n).second) out.push_back(n);
  };
  for (const NodeDef* n : control ? index_->ControlReaders(from) : index_->DataReaders(from))
    add(const_cast<NodeDef*>(n));  // indexed nodes belong to graph_
  for (auto& [name, n] : touched_) add(n);
  for (auto& [name, n] : pending_) add(n);
  return out;
}

NodeDef* RewriteContext::AddNode(const std::string& base, const std::string& op, const std::string& device) {
  std::string name = base;
  for (int i = 1; index_->Node(name) != nullptr || pending_.count(name) > 0; ++i)
    name = base + "_" + std::to_string(i);
  NodeDef* n = graph_->add_node();
  added_.insert(name);
  pending_[name] = n;
  n->set_name(name);
  n->set_op(op);
  n->set_device(device);
  return n;
}

void RewriteContext::RedirectControlEdges(const std::string& from, const std::string& to) {
  const std::string old_edge = "^" + from, new_edge = "^" + to;
  for (NodeDef* n : PossibleReaders(from, /*control=*/true)) {
    if (n->name() == to) continue;
    bool has_old = false;
    for (const auto& in : n->input()) has_old |= in == old_edge;
    if (!has_old) continue;
    Touch(n);
    bool has_new = false;
    for (const auto& in : n->input()) has_new |= in == new_edge;
    auto* inputs = n->mutable_input();
    for (int i = 0; i < inputs->size(); ++i) {
      if (inputs->Get(i) != old_edge) continue;
      if (has_new) {
        inputs->DeleteSubrange(i--, 1);
      } else {
        *inputs->Mutable(i) = new_edge;
        has_new = true;
      }
    }
  }
}

void RewriteContext::RedirectDataEdges(const std::string& from, int port, const std::string& to) {
  for (NodeDef* n : PossibleReaders(from, /*control=*/false)) {
    auto* inputs = n->mutable_input();
    for (int i = 0; i < inputs->size(); ++i) {
      const std::string& in = inputs->Get(i);
      if (in.compare(0, from.size(), from) != 0) continue;  // cheap test before parsing
      const TensorId t = ParseTensorName(in);
      if (t.node == from && t.port == port) {
        *inputs->Mutable(i) = to;
        Touch(n);
      }
    }
  }
}

void RewriteContext::DropStaleShapes() {
  for (auto& n : *graph_->mutable_node()) {
    n.mutable_attr()->erase("_ctr_output_shapes");
    if (changed_.count(n.name())) n.mutable_attr()->erase("_output_shapes");
  }
}

bool RewriteContext::MustKeep(const std::string& name) const {
  return preserve_.count(name) || FetchedOrFed(name);
}

bool RewriteContext::FetchedOrFed(const std::string& name) const {
  if (fed_.count(name)) return true;
  for (const std::string& f : fetch_)
    if (ParseTensorName(f).node == name) return true;
  return false;
}

void RewriteContext::Remove(const std::string& name, const std::string& replaced_by) {
  absorbed_by_[name] = replaced_by;
  if (preserve_.count(name)) {
    kept_as_noop_.emplace_back(name, replaced_by);
  } else {
    removed_.insert(name);
  }
}

const NodeDef* RewriteContext::Current(const std::string& name) const {
  auto p = pending_.find(name);
  return p != pending_.end() ? p->second : index_->Node(name);
}

bool RewriteContext::DependsOn(const std::string& node, const std::string& ancestor,
                               const std::map<std::string, std::string>& absorbed) const {
  std::vector<std::string> stack = {node};
  std::unordered_set<std::string> seen = {node};
  while (!stack.empty()) {
    const std::string name = stack.back();
    stack.pop_back();
    const auto into = absorbed.find(name);
    if (name == ancestor || (into != absorbed.end() && into->second == ancestor)) return true;
    const NodeDef* n = Current(name);
    if (n == nullptr) continue;
    for (const std::string& in : n->input()) {
      const std::string from = ParseTensorName(in).node;
      if (seen.insert(from).second) stack.push_back(from);
    }
  }
  return false;
}

void RewriteContext::AddWait(const std::string& target, const std::string& waited,
                             const std::map<std::string, std::string>& absorbed) {
  NodeDef* t = Mutable(target);
  if (t == nullptr || target == waited) return;
  for (const std::string& in : t->input())
    if (ParseTensorName(in).node == waited) return;
  if (DependsOn(waited, target, absorbed)) {
    VLOG(1) << "CtrFusionOptimizer: " << target << " cannot wait on " << waited << ", which reads it";
    return;
  }
  t->add_input("^" + waited);
}

void RewriteContext::KeepWaitsOfAbsorbed() {
  std::set<std::string> fused;
  for (size_t i = matches_committed_; i < matches_.size(); ++i) fused.insert(matches_[i].fused_node);
  matches_committed_ = matches_.size();
  std::map<std::string, std::string> absorbed;
  absorbed.swap(absorbed_by_);
  for (const auto& [name, by] : absorbed) {
    fused.insert(by);
    const NodeDef* n = Current(name);
    // A check (Keras' vocabulary Assert) waits only to keep the checks in
    // program order (TF2 chains stateful ops): it reads no state.
    if (n == nullptr || n->op() == "Assert") continue;
    for (const std::string& in : n->input())
      if (!in.empty() && in[0] == '^' && !absorbed.count(in.substr(1))) AddWait(by, in.substr(1), absorbed);
  }
  // A variable read this rewrite added (AddReadVariable) feeds a fused node
  // and must see the variable as that node would: after what it waits on.
  // That is what the matches' fused nodes wait on, and what the read's own
  // readers do: a match's record may name a node that only reshapes the op
  // that reads the table (its anchor, kept under its name), which the
  // anchor's waits moved to.
  std::vector<std::string> reads;
  for (const auto& [name, n] : pending_)
    if (n->op() == "ReadVariableOp" || n->op() == "DisableCopyOnRead") reads.push_back(name);
  if (reads.empty()) return;
  std::set<std::string> waited;
  auto add_waits_of = [&waited](const NodeDef& n) {
    for (const std::string& in : n.input())
      if (!in.empty() && in[0] == '^') waited.insert(in.substr(1));
  };
  for (const std::string& f : fused)
    if (const NodeDef* n = Current(f)) add_waits_of(*n);
  const std::set<std::string> read_set(reads.begin(), reads.end());
  for (const auto* nodes : {&pending_, &touched_})
    for (const auto& [name, n] : *nodes)
      for (const std::string& in : n->input())
        if (!in.empty() && in[0] != '^' && read_set.count(ParseTensorName(in).node)) add_waits_of(*n);
  for (const std::string& read : reads)
    for (const std::string& w : waited) AddWait(read, w, absorbed);
}

void RewriteContext::OrderInputs() {
  auto order = [](NodeDef* n) {
    auto* inputs = n->mutable_input();
    std::stable_partition(inputs->begin(), inputs->end(),
                          [](const std::string& in) { return in.empty() || in[0] != '^'; });
  };
  for (auto& [name, n] : pending_) order(n);
  for (auto& [name, n] : touched_) order(n);
}

void RewriteContext::Commit() {
  KeepWaitsOfAbsorbed();
  OrderInputs();
  for (const auto& [name, fused] : kept_as_noop_) {
    NodeDef* n = Mutable(name);
    if (n == nullptr) continue;
    const std::string device = n->device();
    n->Clear();
    n->set_name(name);
    n->set_op("NoOp");
    n->set_device(device);
    n->add_input("^" + fused);
  }
  kept_as_noop_.clear();
  std::vector<const NodeDef*> removed, added, changed;
  for (const std::string& name : removed_) {
    auto p = pending_.find(name);
    const NodeDef* n = p != pending_.end() ? p->second : index_->Node(name);
    if (n == nullptr) continue;
    doomed_.insert(n);
    if (p != pending_.end()) {
      pending_.erase(p);  // added and dropped by the same rewrite: never indexed
    } else {
      removed.push_back(n);
    }
    touched_.erase(name);
  }
  removed_.clear();
  for (const auto& [name, n] : pending_) added.push_back(n);
  for (const auto& [name, n] : touched_) changed.push_back(n);
  index_->Update(removed, added, changed);
  pending_.clear();
  touched_.clear();
  if (check_index_) {
    // The graph less the removed nodes awaiting Compact, indexed from scratch.
    tensorflow::GraphDef live;
    for (const auto& n : graph_->node())
      if (!doomed_.count(&n)) *live.add_node() = n;
    const std::string difference = index_->Difference(GraphIndex(live, fetch_));
    if (!difference.empty()) LOG(FATAL) << "CtrFusionOptimizer: index out of date: " << difference;
  }
}

void RewriteContext::Compact() {
  if (doomed_.empty()) return;
  // Compacts in place, in order: only pointers move, no node is copied, so
  // the index's pointers to the nodes kept stay valid.
  auto* nodes = graph_->mutable_node();
  int kept = 0;
  for (int i = 0; i < nodes->size(); ++i)
    if (!doomed_.count(&nodes->Get(i))) nodes->SwapElements(kept++, i);
  nodes->DeleteSubrange(kept, nodes->size() - kept);
  doomed_.clear();
  if (check_index_) {
    const std::string difference = index_->Difference(GraphIndex(*graph_, fetch_));
    if (!difference.empty()) LOG(FATAL) << "CtrFusionOptimizer: index out of date: " << difference;
  }
}

// The static shape of an output: Grappler's inference first, then the
// `_output_shapes` attribute graphs exported with add_shapes carry.
static const tensorflow::TensorShapeProto* KnownShape(const tensorflow::grappler::GraphProperties* props,
                                                      const NodeDef& node, int port) {
  if (props && props->HasOutputProperties(node.name())) {
    const auto& out = props->GetOutputProperties(node.name());
    if (port < static_cast<int>(out.size()) && !out[port].shape().unknown_rank()) return &out[port].shape();
  }
  // Grappler's item builder erases `_output_shapes`; offline rewriting copies
  // them to `_ctr_output_shapes` first (tf_ctr_ops.rewrite).
  for (const char* key : {"_ctr_output_shapes", "_output_shapes"}) {
    auto it = node.attr().find(key);
    if (it != node.attr().end() && port < it->second.list().shape_size() &&
        !it->second.list().shape(port).unknown_rank())
      return &it->second.list().shape(port);
  }
  return nullptr;
}

// The declared shape of the variable behind a resource handle: `_handle_shapes`
// on a captured handle, or a VarHandleOp's `shape`, looking through Identity.
static const tensorflow::TensorShapeProto* HandleShape(const GraphIndex& g, const NodeDef* handle) {
  while (IsOp(handle, "Identity")) handle = g.Producer(*handle, 0);
  if (handle == nullptr) return nullptr;
  auto it = handle->attr().find("_handle_shapes");
  if (it != handle->attr().end() && it->second.list().shape_size() == 1 && !it->second.list().shape(0).unknown_rank())
    return &it->second.list().shape(0);
  if (IsOp(handle, "VarHandleOp")) {
    it = handle->attr().find("shape");
    if (it != handle->attr().end() && !it->second.shape().unknown_rank()) return &it->second.shape();
  }
  return nullptr;
}

// Online, a captured lookup table has no handle shapes, so inference knows
// neither a find's shape nor that of what reads it: Keras' negative-index
// wrap (Less, AddV2, SelectV2 against scalars) and the Embedding's gather.
// Their shapes follow from their operands': a find of scalar values in a
// table of scalar keys has its keys' shape (TF's LookupTableFindV2 gives
// keys.shape minus the key's dims, plus the default's shape: see
// AssumeScalarKeyFinds); an elementwise op whose operands are scalars or of one shape has
// that shape; a gather of whole rows has its ids' shape, then the table's
// row shape. Each asks its operands, so the walk is bounded.
constexpr int kMaxShapeWalk = 8;
thread_local int shape_walk_depth = 0;
thread_local int scalar_key_finds = 0;

AssumeScalarKeyFinds::AssumeScalarKeyFinds() { ++scalar_key_finds; }
AssumeScalarKeyFinds::~AssumeScalarKeyFinds() { --scalar_key_finds; }

class ShapeWalkStep {
 public:
  ShapeWalkStep() { ++shape_walk_depth; }
  ~ShapeWalkStep() { --shape_walk_depth; }
  bool too_deep() const { return shape_walk_depth > kMaxShapeWalk; }
};

static bool IsBroadcastingElementwise(const NodeDef& node) {
  static const char* kOps[] = {"Less", "LessEqual", "Greater", "GreaterEqual", "Equal", "NotEqual", "AddV2",
                               "Sub", "Mul", "Maximum", "Minimum", "SelectV2", "LogicalAnd", "LogicalOr"};
  for (const char* op : kOps)
    if (node.op() == op) return true;
  return false;
}

// The operand whose shape an op's output 0 has where inference knows none
// (nullptr if none is known to give it); for a row gather, its ids.
static const NodeDef* ShapeSource(const RewriteContext& ctx, const NodeDef& node, int port, int* source_port) {
  const GraphIndex& g = ctx.index();
  if (port != 0) return nullptr;
  if (node.op() == "Identity" || node.op() == "Cast") return g.Producer(node, 0, source_port);
  if (IsOp(&node, "LookupTableFindV2")) {
    if (scalar_key_finds == 0) return nullptr;
    int default_port = 0;
    const NodeDef* value = g.Producer(node, 2, &default_port);
    return value != nullptr && ctx.Rank(*value, default_port) == 0 ? g.Producer(node, 1, source_port) : nullptr;
  }
  std::string why;
  if ((IsOp(&node, "ResourceGather") || IsOp(&node, "GatherV2")) && GathersWholeRows(g, node, &why))
    return g.Producer(node, 1, source_port);
  if (!IsBroadcastingElementwise(node)) return nullptr;
  const NodeDef* source = nullptr;  // the first operand that is not a scalar; the others must match it
  for (int i = 0; i < node.input_size() && node.input(i)[0] != '^'; ++i) {
    int in_port = 0;
    const NodeDef* in = g.Producer(node, i, &in_port);
    if (in == nullptr) return nullptr;
    const int rank = ctx.Rank(*in, in_port);
    if (rank < 0) return nullptr;
    if (rank == 0) continue;
    if (source == nullptr) {
      source = in;
      *source_port = in_port;
      continue;
    }
    if (rank != ctx.Rank(*source, *source_port)) return nullptr;
    for (int d = 0; d < rank; ++d) {
      const int64_t a = ctx.Dim(*in, in_port, d), b = ctx.Dim(*source, *source_port, d);
      if (a == -1 || a != b) return nullptr;  // a -1 might broadcast
    }
  }
  return source;
}

// The rank / dim `dim` of the table a row gather reads: the variable's
// declared shape, or the params'.
static int64_t GatheredTableShape(const RewriteContext& ctx, const NodeDef& gather, int dim) {
  if (IsOp(&gather, "ResourceGather")) {
    const tensorflow::TensorShapeProto* s = HandleShape(ctx.index(), ctx.index().Producer(gather, 0));
    if (s == nullptr) return -1;
    return dim < 0 ? s->dim_size() : dim < s->dim_size() ? s->dim(dim).size() : -1;
  }
  int port = 0;
  const NodeDef* params = ctx.index().Producer(gather, 0, &port);
  if (params == nullptr) return -1;
  return dim < 0 ? ctx.Rank(*params, port) : ctx.Dim(*params, port, dim);
}

static bool IsGather(const NodeDef& node) { return node.op() == "ResourceGather" || node.op() == "GatherV2"; }

int RewriteContext::Rank(const NodeDef& node, int port) const {
  const tensorflow::TensorShapeProto* s = KnownShape(Added(node.name()) ? nullptr : properties_, node, port);
  if (s) return s->dim_size();
  if (node.op() == "ReadVariableOp") {
    s = HandleShape(*index_, index_->Producer(node, 0));
    return s ? s->dim_size() : -1;
  }
  ShapeWalkStep step;
  int in_port = 0;
  const NodeDef* source = step.too_deep() ? nullptr : ShapeSource(*this, node, port, &in_port);
  if (source == nullptr) return -1;
  const int rank = Rank(*source, in_port);
  if (!IsGather(node)) return rank;
  const int64_t table_rank = GatheredTableShape(*this, node, -1);
  return rank < 0 || table_rank < 1 ? -1 : rank + static_cast<int>(table_rank) - 1;
}

int64_t RewriteContext::Dim(const NodeDef& node, int port, int dim) const {
  const tensorflow::TensorShapeProto* s = KnownShape(Added(node.name()) ? nullptr : properties_, node, port);
  int64_t size = (s && dim < s->dim_size()) ? s->dim(dim).size() : -1;
  if (size >= 0) return size;
  if (node.op() == "ReadVariableOp") {
    // A variable's value has its declared shape.
    const tensorflow::TensorShapeProto* declared = HandleShape(*index_, index_->Producer(node, 0));
    if (declared && dim < declared->dim_size() && declared->dim(dim).size() >= 0) return declared->dim(dim).size();
  } else if (size == -1) {  // not a symbolic size of inference's
    ShapeWalkStep step;
    int in_port = 0;
    const NodeDef* source = step.too_deep() ? nullptr : ShapeSource(*this, node, port, &in_port);
    if (source != nullptr && !IsGather(node)) {
      size = Dim(*source, in_port, dim);
    } else if (source != nullptr) {
      const int ids_rank = Rank(*source, in_port);
      if (ids_rank >= 0)
        size = dim < ids_rank ? Dim(*source, in_port, dim) : GatheredTableShape(*this, node, dim - ids_rank + 1);
    }
  }
  if (size >= 0) return size;
  // Inference may know the rank but not the size that Python's set_shape recorded.
  auto it = node.attr().find("_output_shapes");
  if (it != node.attr().end() && port < it->second.list().shape_size()) {
    const auto& recorded = it->second.list().shape(port);
    // An unknown recorded size keeps inference's symbolic id.
    if (!recorded.unknown_rank() && dim < recorded.dim_size() && recorded.dim(dim).size() >= 0)
      size = recorded.dim(dim).size();
  }
  return size;
}

void RewriteContext::Skipped(const std::string& pattern, const std::string& node, const std::string& reason) {
  skips_.push_back(SkipRecord{pattern, node, reason});
}

}  // namespace grappler
}  // namespace tf_ctr

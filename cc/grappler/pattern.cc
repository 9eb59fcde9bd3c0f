#include "cc/grappler/pattern.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <unordered_set>

#include "tensorflow/core/platform/logging.h"

#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/tensor.pb.h"
#include "tensorflow/core/framework/tensor_shape.pb.h"

namespace tf_ctr {
namespace grappler {

using tensorflow::NodeDef;

std::vector<std::unique_ptr<FusionPattern>>& RegisteredPatterns() {
  static auto* patterns = new std::vector<std::unique_ptr<FusionPattern>>();
  return *patterns;
}

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
  if (preserve_.count(name)) {
    kept_as_noop_.emplace_back(name, replaced_by);
  } else {
    removed_.insert(name);
  }
}

void RewriteContext::Commit() {
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

int RewriteContext::Rank(const NodeDef& node, int port) const {
  const tensorflow::TensorShapeProto* s = KnownShape(Added(node.name()) ? nullptr : properties_, node, port);
  if (s) return s->dim_size();
  // Shape-preserving ops pass the rank of their input through.
  if (node.op() == "Identity" || node.op() == "Cast") {
    const NodeDef* in = index_->Producer(node, 0, &port);
    return in ? Rank(*in, port) : -1;
  }
  if (node.op() == "ReadVariableOp") {
    s = HandleShape(*index_, index_->Producer(node, 0));
    return s ? s->dim_size() : -1;
  }
  return -1;
}

int64_t RewriteContext::Dim(const NodeDef& node, int port, int dim) const {
  const tensorflow::TensorShapeProto* s = KnownShape(Added(node.name()) ? nullptr : properties_, node, port);
  int64_t size = (s && dim < s->dim_size()) ? s->dim(dim).size() : -1;
  if (size < 0 && node.op() == "ReadVariableOp") {
    // A variable's value has its declared shape.
    const tensorflow::TensorShapeProto* declared = HandleShape(*index_, index_->Producer(node, 0));
    if (declared && dim < declared->dim_size() && declared->dim(dim).size() >= 0) return declared->dim(dim).size();
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

bool IsOp(const NodeDef* node, const char* op) { return node != nullptr && node->op() == op; }

tensorflow::DataType TypeAttr(const NodeDef& node, const char* name) {
  auto it = node.attr().find(name);
  return it == node.attr().end() ? tensorflow::DT_INVALID : it->second.type();
}

int64_t IntAttr(const NodeDef& node, const char* name, int64_t fallback) {
  auto it = node.attr().find(name);
  return it == node.attr().end() ? fallback : it->second.i();
}

bool BoolAttr(const NodeDef& node, const char* name, bool fallback) {
  auto it = node.attr().find(name);
  return it == node.attr().end() ? fallback : it->second.b();
}

std::string StringAttr(const NodeDef& node, const char* name) {
  auto it = node.attr().find(name);
  return it == node.attr().end() ? std::string() : it->second.s();
}

bool ConstScalarInt(const NodeDef* node, int64_t* value) {
  if (!IsOp(node, "Const")) return false;
  auto it = node->attr().find("value");
  if (it == node->attr().end()) return false;
  const tensorflow::TensorProto& t = it->second.tensor();
  if (t.tensor_shape().dim_size() != 0) return false;
  if (!t.tensor_content().empty()) {
    if (t.dtype() == tensorflow::DT_INT32 && t.tensor_content().size() == 4) {
      int32_t v;
      memcpy(&v, t.tensor_content().data(), 4);
      *value = v;
      return true;
    }
    if (t.dtype() == tensorflow::DT_INT64 && t.tensor_content().size() == 8) {
      memcpy(value, t.tensor_content().data(), 8);
      return true;
    }
    return false;
  }
  // TF compresses a zero scalar to no values at all.
  if (t.dtype() == tensorflow::DT_INT32 && t.int_val_size() <= 1) {
    *value = t.int_val_size() ? t.int_val(0) : 0;
    return true;
  }
  if (t.dtype() == tensorflow::DT_INT64 && t.int64_val_size() <= 1) {
    *value = t.int64_val_size() ? t.int64_val(0) : 0;
    return true;
  }
  return false;
}

bool IsFirstElementSlice(const GraphIndex& g, const NodeDef* slice) {
  std::vector<int64_t> begin, end, strides;
  return IsOp(slice, "StridedSlice") && ConstIntVector(g.Producer(*slice, 1), &begin) &&
         ConstIntVector(g.Producer(*slice, 2), &end) && ConstIntVector(g.Producer(*slice, 3), &strides) &&
         begin == std::vector<int64_t>{0} && end == std::vector<int64_t>{1} && strides == std::vector<int64_t>{1} &&
         IntAttr(*slice, "shrink_axis_mask", 0) == 1 && IntAttr(*slice, "begin_mask", 0) == 0 &&
         IntAttr(*slice, "end_mask", 0) == 0 && IntAttr(*slice, "ellipsis_mask", 0) == 0 &&
         IntAttr(*slice, "new_axis_mask", 0) == 0;
}

bool IsFirstColumn(const GraphIndex& g, const NodeDef* slice) {
  std::vector<int64_t> begin, end, strides;
  return IsOp(slice, "StridedSlice") && ConstIntVector(g.Producer(*slice, 1), &begin) &&
         ConstIntVector(g.Producer(*slice, 2), &end) && ConstIntVector(g.Producer(*slice, 3), &strides) &&
         begin.size() == 2 && end.size() == 2 && strides == std::vector<int64_t>{1, 1} && begin[1] == 0 &&
         end[1] == 1 && (IntAttr(*slice, "begin_mask", 0) & 1) && (IntAttr(*slice, "end_mask", 0) & 1) &&
         IntAttr(*slice, "shrink_axis_mask", 0) == 2 && IntAttr(*slice, "ellipsis_mask", 0) == 0 &&
         IntAttr(*slice, "new_axis_mask", 0) == 0;
}

bool IsSelect(const NodeDef* node) { return IsOp(node, "Select") || IsOp(node, "SelectV2"); }

bool HasControlInputs(const NodeDef& node) {
  for (const auto& in : node.input())
    if (!in.empty() && in[0] == '^') return true;
  return false;
}

bool ConstString(const NodeDef* node, std::string* out) {
  if (!IsOp(node, "Const")) return false;
  auto it = node->attr().find("value");
  if (it == node->attr().end()) return false;
  const tensorflow::TensorProto& t = it->second.tensor();
  if (t.dtype() != tensorflow::DT_STRING || t.tensor_shape().dim_size() != 0 || t.string_val_size() != 1) return false;
  *out = t.string_val(0);
  return true;
}

bool IsSqueezeOfAxis(const NodeDef* node, int64_t axis, int rank) {
  if (!IsOp(node, "Squeeze")) return false;
  const auto it = node->attr().find("squeeze_dims");
  if (it == node->attr().end() || it->second.list().i_size() != 1) return false;
  const int64_t d = it->second.list().i(0);
  return (d < 0 ? d + rank : d) == axis;
}

bool ConstIntVector(const NodeDef* node, std::vector<int64_t>* out) {
  if (!IsOp(node, "Const")) return false;
  auto it = node->attr().find("value");
  if (it == node->attr().end()) return false;
  const tensorflow::TensorProto& t = it->second.tensor();
  if (t.tensor_shape().dim_size() != 1) return false;
  const int64_t n = t.tensor_shape().dim(0).size();
  const bool is32 = t.dtype() == tensorflow::DT_INT32;
  if (!is32 && t.dtype() != tensorflow::DT_INT64) return false;
  out->clear();
  if (!t.tensor_content().empty()) {
    const std::string& bytes = t.tensor_content();
    const size_t width = is32 ? 4 : 8;
    if (bytes.size() != static_cast<size_t>(n) * width) return false;
    for (int64_t i = 0; i < n; ++i) {
      int64_t v = 0;
      if (is32) {
        int32_t v32;
        memcpy(&v32, bytes.data() + i * width, 4);  // little-endian hosts only, as TF itself
        v = v32;
      } else {
        memcpy(&v, bytes.data() + i * width, 8);
      }
      out->push_back(v);
    }
    return true;
  }
  // TF compresses repeated trailing values: fewer values than elements repeat
  // the last one, and none at all means zeros.
  const int given = is32 ? t.int_val_size() : t.int64_val_size();
  if (given > n) return false;
  for (int64_t i = 0; i < n; ++i) {
    if (given == 0) {
      out->push_back(0);
    } else {
      const int j = static_cast<int>(std::min<int64_t>(i, given - 1));
      out->push_back(is32 ? t.int_val(j) : t.int64_val(j));
    }
  }
  return true;
}

std::string Describe(const NodeDef& node) { return node.name() + " (" + node.op() + ")"; }

const NodeDef* SkipIdentities(const GraphIndex& g, const NodeDef* node, std::vector<const NodeDef*>* identities) {
  while (IsOp(node, "Identity")) {
    identities->push_back(node);
    node = g.Producer(*node, 0);
  }
  return node;
}

bool IsEmbeddingDtype(tensorflow::DataType t) {
  return t == tensorflow::DT_FLOAT || t == tensorflow::DT_HALF || t == tensorflow::DT_BFLOAT16;
}

bool IsIndexDtype(tensorflow::DataType t) { return t == tensorflow::DT_INT32 || t == tensorflow::DT_INT64; }

void KeepAsIdentity(RewriteContext* ctx, const std::string& name, const std::string& output,
                    const tensorflow::AttrValue& t) {
  NodeDef* kept = ctx->Mutable(name);
  const std::string device = kept->device();
  kept->Clear();
  kept->set_name(name);
  kept->set_op("Identity");
  kept->set_device(device);
  kept->add_input(output);
  (*kept->mutable_attr())["T"] = t;
}

void CopyControlInputs(const NodeDef& from, NodeDef* to) {
  for (const auto& in : from.input())
    if (!in.empty() && in[0] == '^') to->add_input(in);
}

void AppendControlInputs(const NodeDef& from, std::vector<std::string>* controls) {
  for (const auto& in : from.input())
    if (!in.empty() && in[0] == '^') controls->push_back(in);
}

void AddControlInputsOnce(const std::vector<std::string>& controls, NodeDef* to) {
  std::set<std::string> have(to->input().begin(), to->input().end());
  for (const std::string& c : controls)
    if (have.insert(c).second) to->add_input(c);
}

// A Const node of an integer dtype, shaped [] (size < 0) or [size]: its value
// proto for the caller to fill, and its name in *name.
static tensorflow::TensorProto* AddIntConst(RewriteContext* ctx, const std::string& base, tensorflow::DataType dtype,
                                            int64_t size, const std::string& device, std::string* name) {
  NodeDef* n = ctx->AddNode(base, "Const", device);
  (*n->mutable_attr())["dtype"].set_type(dtype);
  tensorflow::TensorProto* t = (*n->mutable_attr())["value"].mutable_tensor();
  t->set_dtype(dtype);
  auto* shape = t->mutable_tensor_shape();
  if (size >= 0) shape->add_dim()->set_size(size);
  *name = n->name();
  return t;
}

std::string AddInt64Scalar(RewriteContext* ctx, const std::string& base, int64_t value, const std::string& device) {
  std::string name;
  AddIntConst(ctx, base, tensorflow::DT_INT64, -1, device, &name)->add_int64_val(value);
  return name;
}

template <typename Int>
static std::string AddIntVector(RewriteContext* ctx, const std::string& base, const std::vector<Int>& values,
                                const std::string& device) {
  constexpr bool kInt64 = sizeof(Int) == 8;
  std::string name;
  tensorflow::TensorProto* t = AddIntConst(ctx, base, kInt64 ? tensorflow::DT_INT64 : tensorflow::DT_INT32,
                                           static_cast<int64_t>(values.size()), device, &name);
  for (Int v : values) {
    if constexpr (kInt64) {
      t->add_int64_val(v);
    } else {
      t->add_int_val(v);
    }
  }
  return name;
}

std::string AddInt64Vector(RewriteContext* ctx, const std::string& base, const std::vector<int64_t>& values,
                           const std::string& device) {
  return AddIntVector(ctx, base, values, device);
}

std::string AddInt32Vector(RewriteContext* ctx, const std::string& base, const std::vector<int32_t>& values,
                           const std::string& device) {
  return AddIntVector(ctx, base, values, device);
}

std::string AddEmptyFloatVector(RewriteContext* ctx, const std::string& base, const std::string& device) {
  NodeDef* n = ctx->AddNode(base, "Const", device);
  (*n->mutable_attr())["dtype"].set_type(tensorflow::DT_FLOAT);
  tensorflow::TensorProto* t = (*n->mutable_attr())["value"].mutable_tensor();
  t->set_dtype(tensorflow::DT_FLOAT);
  t->mutable_tensor_shape()->add_dim()->set_size(0);
  return n->name();
}

std::string AddCast(RewriteContext* ctx, const std::string& base, const std::string& input,
                    tensorflow::DataType from, tensorflow::DataType to, const std::string& device) {
  NodeDef* n = ctx->AddNode(base, "Cast", device);
  n->add_input(input);
  (*n->mutable_attr())["SrcT"].set_type(from);
  (*n->mutable_attr())["DstT"].set_type(to);
  (*n->mutable_attr())["Truncate"].set_b(false);
  return n->name();
}

std::string AddReadVariable(RewriteContext* ctx, const std::string& base, const std::string& resource,
                            tensorflow::DataType dtype, const std::string& device) {
  NodeDef* n = ctx->AddNode(base, "ReadVariableOp", device);
  n->add_input(resource);
  (*n->mutable_attr())["dtype"].set_type(dtype);
  return n->name();
}

}  // namespace grappler
}  // namespace tf_ctr

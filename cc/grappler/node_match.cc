#include "cc/grappler/node_match.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <unordered_set>

#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor.pb.h"
#include "tensorflow/core/framework/tensor_shape.pb.h"

namespace tf_ctr {
namespace grappler {

using tensorflow::NodeDef;

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

bool IsScalarConst(const GraphIndex& g, const NodeDef* node, double want) {
  while (IsOp(node, "Cast")) node = g.Producer(*node, 0);
  if (!IsOp(node, "Const")) return false;
  auto it = node->attr().find("value");
  tensorflow::Tensor t;
  if (it == node->attr().end() || !t.FromProto(it->second.tensor()) || t.dims() != 0) return false;
  switch (t.dtype()) {
    case tensorflow::DT_FLOAT: return t.scalar<float>()() == want;
    case tensorflow::DT_DOUBLE: return t.scalar<double>()() == want;
    case tensorflow::DT_INT32: return t.scalar<int32_t>()() == want;
    case tensorflow::DT_INT64: return static_cast<double>(t.scalar<int64_t>()()) == want;
    // A mixed-precision graph's constants (Keras' masked mean selects a half 0).
    case tensorflow::DT_HALF: return static_cast<float>(t.scalar<Eigen::half>()()) == want;
    case tensorflow::DT_BFLOAT16: return static_cast<float>(t.scalar<tensorflow::bfloat16>()()) == want;
    default: return false;
  }
}

bool JoinsSideBySide(const GraphIndex& g, const NodeDef& join, std::string* why) {
  if (IsOp(&join, "Pack")) {
    const int64_t axis = IntAttr(join, "axis", 0);
    if (axis == 1 || axis == -2) return true;
    *why = "it does not stack along axis 1 (or -2) of the [B, D] embeddings";
    return false;
  }
  int64_t axis = 0;
  const int n = static_cast<int>(IntAttr(join, "N", 0));
  if (IsOp(&join, "ConcatV2") && ConstScalarInt(g.Producer(join, n), &axis) && (axis == 1 || axis == -1))
    return true;
  *why = "it does not concatenate along axis 1 (or -1) of the [B, D] embeddings";
  return false;
}

const NodeDef* AxisConstOnlyFor(RewriteContext* ctx, const NodeDef& concat) {
  const GraphIndex& g = ctx->index();
  const NodeDef* axis = g.Producer(concat, static_cast<int>(IntAttr(concat, "N", 0)));
  if (axis == nullptr || g.DataConsumers(axis->name()) != 1 || g.ControlConsumers(axis->name()) != 0 ||
      ctx->MustKeep(axis->name()))
    return nullptr;
  return axis;
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

bool ConstScalarIs(const NodeDef* node, int64_t want) {
  int64_t v = 0;
  return ConstScalarInt(node, &v) && v == want;
}

const NodeDef* OperandBesideConstInt(const GraphIndex& g, const NodeDef& op, int64_t* value, int* port) {
  if (op.input_size() < 2) return nullptr;
  int64_t values[2] = {0, 0};
  const bool is_const[2] = {ConstScalarInt(g.Producer(op, 0), &values[0]),
                            ConstScalarInt(g.Producer(op, 1), &values[1])};
  if (is_const[0] == is_const[1]) return nullptr;
  const int constant = is_const[0] ? 0 : 1;
  *value = values[constant];
  return g.Producer(op, 1 - constant, port);
}

bool ConstVectorIs(const NodeDef* node, const std::vector<int64_t>& want) {
  std::vector<int64_t> v;
  return ConstIntVector(node, &v) && v == want;
}

bool ConstVectorOrScalarIs(const NodeDef* node, int64_t want) {
  return ConstScalarIs(node, want) || ConstVectorIs(node, {want});
}

bool SameTensor(const std::string& a, const std::string& b) {
  const TensorId x = ParseTensorName(a), y = ParseTensorName(b);
  return x.node == y.node && x.port == y.port;
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

bool IsFlattenToRank2(const GraphIndex& g, const NodeDef& reshape) {
  const std::string& shape = reshape.input(1);
  const NodeDef* pack = g.Producer(reshape, 2);
  if (!IsOp(pack, "Pack") || IntAttr(*pack, "N", 0) != 2 || IntAttr(*pack, "axis", 0) != 0) return false;
  const NodeDef* prod = g.Producer(*pack, 0);
  const NodeDef* last = g.Producer(*pack, 1);
  if (!IsOp(prod, "Prod") || BoolAttr(*prod, "keep_dims", false) || !ConstVectorOrScalarIs(g.Producer(*prod, 1), 0))
    return false;
  const NodeDef* head = g.Producer(*prod, 0);
  if (!IsOp(head, "Slice") || !SameTensor(head->input(0), shape) || !ConstVectorOrScalarIs(g.Producer(*head, 1), 0) ||
      !ConstVectorOrScalarIs(g.Producer(*head, 2), 1))
    return false;
  return IsOp(last, "GatherV2") && SameTensor(last->input(0), shape) &&
         ConstVectorOrScalarIs(g.Producer(*last, 1), 1) && ConstVectorOrScalarIs(g.Producer(*last, 2), 0) &&
         IntAttr(*last, "batch_dims", 0) == 0;
}

bool IsReshapeToBatchRows(const GraphIndex& g, const NodeDef& reshape) {
  const NodeDef* target = g.Producer(reshape, 2);
  if (IsOp(target, "Cast")) target = g.Producer(*target, 0);
  if (!IsOp(target, "Pack") || IntAttr(*target, "N", 0) != 2 || IntAttr(*target, "axis", 0) != 0 ||
      !ConstScalarIs(g.Producer(*target, 1), -1))
    return false;
  const NodeDef* rows = g.Producer(*target, 0);
  if (!IsFirstElementSlice(g, rows)) return false;
  const NodeDef* shape = g.Producer(*rows, 0);
  std::string of = rows->input(0);
  if (IsOp(shape, "Cast")) of = shape->input(0);  // tf.shape of a SparseTensor casts its dense_shape
  return SameTensor(of, reshape.input(1));
}

bool IsPlainAsString(const NodeDef& n) {
  return IsOp(&n, "AsString") && IsIndexDtype(TypeAttr(n, "T")) && IntAttr(n, "precision", -1) == -1 &&
         IntAttr(n, "width", -1) == -1 && !BoolAttr(n, "scientific", false) && !BoolAttr(n, "shortest", false) &&
         StringAttr(n, "fill").empty();
}

bool IsRunnableHashedCross(const NodeDef& cross, std::string* why) {
  if (!BoolAttr(cross, "hashed_output", false) || TypeAttr(cross, "out_type") != tensorflow::DT_INT64) {
    *why = Describe(cross) + " crosses into strings, not hashed ids";
    return false;
  }
  if (TypeAttr(cross, "internal_type") != tensorflow::DT_STRING) return true;
  for (const char* types : {"sparse_types", "dense_types"}) {
    const auto it = cross.attr().find(types);
    if (it == cross.attr().end()) continue;
    for (int t : it->second.list().type()) {
      if (t == tensorflow::DT_INT64) {
        *why = Describe(cross) + " has an int64 input under a string internal type, which TF refuses";
        return false;
      }
    }
  }
  return true;
}

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

void CopyAttrsIfSet(const NodeDef& from, std::initializer_list<const char*> names, NodeDef* to) {
  for (const char* name : names) {
    const auto it = from.attr().find(name);
    if (it != from.attr().end()) (*to->mutable_attr())[name] = it->second;
  }
}

bool GathersWholeRows(const GraphIndex& g, const NodeDef& gather, std::string* why) {
  if (IntAttr(gather, "batch_dims", 0) != 0) {
    *why = "Gather has batch_dims != 0";
    return false;
  }
  int64_t axis = -1;
  if (IsOp(&gather, "GatherV2") && (!ConstScalarInt(g.Producer(gather, 2), &axis) || axis != 0)) {
    *why = "GatherV2 axis is not a constant 0";
    return false;
  }
  return true;
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

std::string DeviceType(const std::string& device) {
  const size_t at = device.rfind("device:");
  const size_t begin = at == std::string::npos ? device.rfind('/') : at + 6;
  if (begin == std::string::npos) return "";
  const size_t end = device.find(':', begin + 1);
  std::string type = device.substr(begin + 1, end == std::string::npos ? std::string::npos : end - begin - 1);
  for (char& c : type) c = static_cast<char>(toupper(static_cast<unsigned char>(c)));
  return type;
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

std::string ReshapeToStack(RewriteContext* ctx, const std::string& base, const std::string& output, int64_t n,
                           int64_t width, const tensorflow::AttrValue& t, const std::string& device) {
  const std::string shape = AddInt64Vector(ctx, base + "/ctr_stack_shape", {-1, n, width}, device);
  NodeDef* reshape = ctx->AddNode(base + "/ctr_stack", "Reshape", device);
  reshape->add_input(output);
  reshape->add_input(shape);
  (*reshape->mutable_attr())["T"] = t;
  (*reshape->mutable_attr())["Tshape"].set_type(tensorflow::DT_INT64);
  return TensorName(reshape->name(), 0);
}

void HandOver(RewriteContext* ctx, const NodeDef& node, const std::string& output, const std::string& fused) {
  const std::string name = node.name();  // `node` may be the one KeepAsIdentity rewrites
  if (ctx->MustKeep(name)) {
    const tensorflow::AttrValue t = node.attr().at("T");
    KeepAsIdentity(ctx, name, output, t);
    return;
  }
  ctx->RedirectDataEdges(name, 0, output);
  ctx->RedirectControlEdges(name, fused);
  ctx->Remove(name, fused);
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
  // A variable read sparsely (a ResourceGather left in the graph, a sparse
  // optimizer update) is in copy-on-read mode, where a plain read copies the
  // whole table on every call; tf.nn's lookups leave that mode first, and so
  // does this read.
  NodeDef* no_copy = ctx->AddNode(base + "/disable_copy_on_read", "DisableCopyOnRead", device);
  no_copy->add_input(resource);
  const std::string no_copy_name = no_copy->name();
  NodeDef* n = ctx->AddNode(base, "ReadVariableOp", device);
  n->add_input(resource);
  n->add_input("^" + no_copy_name);
  (*n->mutable_attr())["dtype"].set_type(dtype);
  return n->name();
}

}  // namespace grappler
}  // namespace tf_ctr

// Helpers for patterns whose anchor is a Keras Embedding's gather: see keras_gather.h.
#include "cc/grappler/keras_gather.h"

#include <algorithm>

#include <set>

#include "cc/grappler/split_source.h"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/tensor.pb.h"
#include "tensorflow/core/framework/tensor_shape.pb.h"

namespace tf_ctr {
namespace grappler {

using tensorflow::DataType;
using tensorflow::NodeDef;

DataType GatheredType(const NodeDef& gather, bool resource) {
  return resource ? TypeAttr(gather, "dtype") : TypeAttr(gather, "Tparams");
}

std::string GatheredTable(RewriteContext* ctx, const NodeDef& gather, bool resource, DataType T) {
  if (!resource) return gather.input(0);
  return AddReadVariable(ctx, gather.name() + "/ctr_table", gather.input(0), T, gather.device());
}

bool IsIndexCast(const NodeDef* n) {
  return IsOp(n, "Cast") && TypeAttr(*n, "SrcT") == tensorflow::DT_INT64 && IsIndexDtype(TypeAttr(*n, "DstT"));
}

const NodeDef* UnwrapNegativeIndexFix(const GraphIndex& g, const NodeDef* select, std::vector<const NodeDef*>* wrap) {
  if (!IsOp(select, "SelectV2")) return select;
  const NodeDef* less = g.Producer(*select, 0);
  const NodeDef* add = g.Producer(*select, 1);
  int h_port = 0, port = 0;
  const NodeDef* h = g.Producer(*select, 2, &h_port);
  int64_t zero = -1;
  if (!IsOp(less, "Less") || !IsOp(add, "AddV2") || h == nullptr || h_port != 0) return select;
  if (g.Producer(*less, 0, &port) != h || port != 0 || !ConstScalarInt(g.Producer(*less, 1), &zero) || zero != 0)
    return select;
  // AddV2 commutes, and Grappler's canonicalization may put the constant first.
  int port1 = 0;
  const bool adds_h = (g.Producer(*add, 0, &port) == h && port == 0) || (g.Producer(*add, 1, &port1) == h && port1 == 0);
  if (!adds_h) return select;
  *wrap = {select, less, add};
  return h;
}

bool SharedWithOtherGathers(const GraphIndex& g, const std::vector<const NodeDef*>& match, const NodeDef& gather,
                            const NodeDef* wrapped, std::set<const NodeDef*>* kept, std::string* why) {
  const std::set<const NodeDef*> ours(match.begin(), match.end());
  std::set<const NodeDef*> other_wraps;
  if (wrapped != nullptr)
    for (const NodeDef* r : g.DataReaders(wrapped->name())) {
      std::vector<const NodeDef*> wrap;
      if (UnwrapNegativeIndexFix(g, r, &wrap) == wrapped) other_wraps.insert(wrap.begin(), wrap.end());
    }
  kept->clear();
  for (const NodeDef* n : match) {
    const std::vector<const NodeDef*>& readers = g.DataReaders(n->name());
    bool others_read = g.DataConsumers(n->name()) != static_cast<int>(readers.size());  // the caller does
    for (const NodeDef* r : readers) {
      if (r == &gather || ours.count(r)) continue;
      const bool gathers_it = (IsOp(r, "ResourceGather") || IsOp(r, "GatherV2")) && g.Producer(*r, 1) == n;
      const bool slices_it = IsOp(r, "StridedSlice") && g.Producer(*r, 0) == n;  // another field of [B, F] ids
      if (!gathers_it && !slices_it && !IsIndexCast(r) && !other_wraps.count(r)) others_read = true;
      kept->insert(n);
    }
    if (others_read) {
      *why = "intermediate " + Describe(*n) + " has another consumer";
      return false;
    }
  }
  // What a kept node reads stays too.
  std::vector<const NodeDef*> todo(kept->begin(), kept->end());
  while (!todo.empty()) {
    const NodeDef* n = todo.back();
    todo.pop_back();
    for (int i = 0; i < n->input_size(); ++i) {
      const NodeDef* p = g.Producer(*n, i);
      if (p != nullptr && ours.count(p) && kept->insert(p).second) todo.push_back(p);
    }
  }
  return true;
}

bool WrapShiftIsScalar(RewriteContext* ctx, const std::vector<const NodeDef*>& wrap) {
  const GraphIndex& g = ctx->index();
  const NodeDef* ids = g.Producer(*wrap[0], 2);
  const NodeDef& add = *wrap[2];
  int port = 0;
  const NodeDef* shift = g.Producer(add, 0, &port);
  if (shift == ids) shift = g.Producer(add, 1, &port);
  return shift != nullptr && ctx->Rank(*shift, port) == 0;
}

bool WrapFeedsOnlyTheGather(RewriteContext* ctx, const std::vector<const NodeDef*>& wrap) {
  if (!WrapShiftIsScalar(ctx, wrap)) return false;
  for (const NodeDef* n : wrap)
    if (ctx->index().DataConsumers(n->name()) != 1 || ctx->FetchedOrFed(n->name())) return false;
  return true;
}

std::vector<const NodeDef*> WrapOperands(const GraphIndex& g, const std::vector<const NodeDef*>& wrap) {
  if (wrap.empty()) return {};
  const NodeDef* h = g.Producer(*wrap[0], 2);
  std::vector<const NodeDef*> operands;
  for (const NodeDef* n : wrap)
    for (int i = 0; i < n->input_size(); ++i) {
      const NodeDef* input = g.Producer(*n, i);
      if (input != nullptr && input != h && std::find(wrap.begin(), wrap.end(), input) == wrap.end())
        operands.push_back(input);
    }
  return operands;
}

// Reshape(rows, [b, D]) with a constant shape: Keras' Flatten once Grappler
// has folded its Shape(rows)[0] (a function specialized to its call's batch,
// as online rewriting sees it), b that known batch, or -1 with D > 0 (a -1
// beside a 0 fails on an empty batch, where the fused op would not).
static bool IsConstantFlatten(RewriteContext* ctx, const NodeDef& gather, const NodeDef& rows, const NodeDef* reshape,
                              int64_t proven_batch) {
  std::vector<int64_t> shape;
  if (!IsOp(reshape, "Reshape") || ctx->index().Producer(*reshape, 0) != &rows || HasControlInputs(*reshape) ||
      ctx->MustKeep(reshape->name()))
    return false;
  if (!ConstIntVector(ctx->index().Producer(*reshape, 1), &shape) || shape.size() != 2) return false;
  const int64_t batch = proven_batch >= 0 ? proven_batch : ctx->Dim(gather, 0, 0), dim = ctx->Dim(gather, 0, 2);
  return dim >= 0 && shape[1] == dim && ((shape[0] == -1 && dim > 0) || (batch >= 0 && shape[0] == batch));
}

bool MatchFlatten(RewriteContext* ctx, const NodeDef& gather, FlattenOfRows* f, const ProvenIds& proven) {
  const GraphIndex& g = ctx->index();
  if (ctx->MustKeep(gather.name())) return false;
  if (ctx->Rank(gather, 0) != 3 || (!proven.one_per_row && ctx->Dim(gather, 0, 1) != 1)) return false;
  const NodeDef* rows = &gather;
  std::vector<std::string> identities;
  while (g.DataConsumers(rows->name()) == 1) {
    const NodeDef* next = g.DataReaders(rows->name())[0];
    if (!IsOp(next, "Identity")) break;  // a Squeeze, say
    if (ctx->MustKeep(next->name()) || HasControlInputs(*next)) return false;
    if (rows != &gather && g.ControlConsumers(rows->name()) != 0) return false;
    identities.push_back(next->name());
    rows = next;
  }
  if (rows != &gather && g.ControlConsumers(rows->name()) != 0) return false;
  if (g.DataConsumers(rows->name()) == 1) {
    const NodeDef* squeeze = g.DataReaders(rows->name())[0];
    if (IsConstantFlatten(ctx, gather, *rows, squeeze, proven.batch)) {
      *f = FlattenOfRows{identities, "", "", "", squeeze->name()};
      return true;
    }
    if (!IsSqueezeOfAxis(squeeze, 1, 3) || g.Producer(*squeeze, 0) != rows || HasControlInputs(*squeeze) ||
        ctx->MustKeep(squeeze->name()))
      return false;
    *f = FlattenOfRows{identities, "", "", "", squeeze->name()};
    return true;
  }
  if (g.DataConsumers(rows->name()) != 2) return false;
  const NodeDef *shape = nullptr, *reshape = nullptr;
  for (const NodeDef* r : g.DataReaders(rows->name())) {
    if (IsOp(r, "Shape") && g.Producer(*r, 0) == rows) shape = r;
    if (IsOp(r, "Reshape") && g.Producer(*r, 0) == rows) reshape = r;
  }
  if (shape == nullptr || reshape == nullptr) return false;
  const NodeDef* pack = g.Producer(*reshape, 1);
  if (!IsOp(pack, "Pack") || IntAttr(*pack, "axis", 0) != 0 || pack->input_size() != 2) return false;
  const NodeDef* slice = g.Producer(*pack, 0);
  if (!IsFirstElementSlice(g, slice) || g.Producer(*slice, 0) != shape) return false;
  int64_t dim = -1;
  if (!ConstScalarInt(g.Producer(*pack, 1), &dim) || dim < 0 || ctx->Dim(gather, 0, 2) != dim) return false;
  for (const NodeDef* n : {shape, slice, pack})
    if (g.DataConsumers(n->name()) != 1 || g.ControlConsumers(n->name()) != 0 || ctx->MustKeep(n->name()))
      return false;
  for (const NodeDef* n : {shape, slice, pack, reshape})
    if (HasControlInputs(*n)) return false;  // ordered after something: keep it simple, keep it
  if (ctx->MustKeep(reshape->name())) return false;
  *f = FlattenOfRows{identities, shape->name(), slice->name(), pack->name(), reshape->name()};
  return true;
}

int GatherTableRank(RewriteContext* ctx, const NodeDef& gather, bool resource, int ids_rank) {
  const int out = ctx->Rank(gather, 0);
  if (out >= 0) return out - ids_rank + 1;
  int port = 0;
  const NodeDef* table = ctx->index().Producer(gather, 0, &port);
  if (!resource) return table == nullptr ? -1 : ctx->Rank(*table, port);
  NodeDef read;
  read.set_op("ReadVariableOp");
  read.add_input(gather.input(0));
  return ctx->Rank(read, 0);
}

void RemoveIfDeadShapeMath(RewriteContext* ctx, const NodeDef* node, const std::string& fused, int depth) {
  static const char* kPure[] = {"Const", "Cast", "StridedSlice", "Shape"};
  if (node == nullptr || depth == 0 || ctx->index().DataConsumers(node->name()) != 1) return;
  bool pure = false;
  for (const char* op : kPure) pure |= node->op() == op;
  if (!pure || HasControlInputs(*node)) return;  // ordered after something: keep it simple, keep it
  ctx->Remove(node->name(), fused);
  for (int i = 0; i < node->input_size(); ++i) RemoveIfDeadShapeMath(ctx, ctx->index().Producer(*node, i), fused, depth - 1);
}

std::string FlattenKeys(RewriteContext* ctx, const std::string& base, const std::string& input, DataType t,
                        int rank, const std::string& device) {
  if (rank == 1) return input;
  NodeDef* shape = ctx->AddNode(base + "/ctr_flat_shape", "Const", device);
  (*shape->mutable_attr())["dtype"].set_type(tensorflow::DT_INT32);
  auto* v = (*shape->mutable_attr())["value"].mutable_tensor();
  v->set_dtype(tensorflow::DT_INT32);
  v->mutable_tensor_shape()->add_dim()->set_size(1);
  v->add_int_val(-1);
  NodeDef* reshape = ctx->AddNode(base + "/ctr_flat", "Reshape", device);
  reshape->add_input(input);
  reshape->add_input(shape->name());
  (*reshape->mutable_attr())["T"].set_type(t);
  (*reshape->mutable_attr())["Tshape"].set_type(tensorflow::DT_INT32);
  return reshape->name();
}

void AbsorbFlatten(RewriteContext* ctx, const std::string& fused, const FlattenOfRows& f,
                          MatchRecord* record) {
  const GraphIndex& g = ctx->index();
  std::set<std::string> replaced, consts;
  for (const std::string& name : {f.shape, f.slice, f.pack, f.reshape})
    if (!name.empty()) replaced.insert(name);
  replaced.insert(f.identities.begin(), f.identities.end());
  for (const std::string& name : replaced) {
    const NodeDef* n = g.Node(name);
    record->replaced.push_back(Describe(*n));
    for (int i = 0; i < n->input_size(); ++i) {
      const NodeDef* in = g.Producer(*n, i);
      if (IsOp(in, "Const")) consts.insert(in->name());
    }
  }
  ctx->RedirectDataEdges(f.reshape, 0, TensorName(fused, 0));
  ctx->RedirectControlEdges(f.reshape, fused);
  RemoveDeadNodes(ctx, consts, replaced, fused);
  for (const std::string& name : replaced) ctx->Remove(name, fused);
}

NodeDef* BecomeGatherOutput(RewriteContext* ctx, const NodeDef& anchor, const std::string& op, DataType T,
                             int rank, const FlattenOfRows& flatten, MatchRecord* record) {
  const std::string name = anchor.name(), device = anchor.device();
  const NodeDef old = anchor;
  NodeDef* fused;
  if (flatten.found()) AbsorbFlatten(ctx, name, flatten, record);
  if (rank == 1 || flatten.found()) {
    fused = ctx->Mutable(name);
    fused->clear_input();
    fused->clear_attr();
    fused->set_op(op);
  } else {
    fused = ctx->AddNode(name + "/ctr_fused", op, device);
    const std::string axis = AddInt64Scalar(ctx, name + "/ctr_axis", 1, device);
    NodeDef* expand = ctx->Mutable(name);
    expand->clear_input();
    expand->clear_attr();
    expand->set_op("ExpandDims");
    expand->add_input(fused->name());
    expand->add_input(axis);
    (*expand->mutable_attr())["T"].set_type(T);
    (*expand->mutable_attr())["Tdim"].set_type(tensorflow::DT_INT64);
    fused = ctx->Mutable(fused->name());  // AddNode may have moved it
  }
  CopyControlInputs(old, fused);
  return fused;
}

NodeDef* BecomeGatherOutputOfKeys(RewriteContext* ctx, const NodeDef& anchor, const std::string& op, DataType T,
                                  const std::string& keys, DataType key_type) {
  const std::string name = anchor.name(), device = anchor.device();
  const NodeDef old = anchor;
  // Names first: AddNode may move the nodes it returned before.
  const std::string fused = ctx->AddNode(name + "/ctr_fused", op, device)->name();
  auto shape_of = [&](const std::string& base, const std::string& x, DataType t) {
    NodeDef* s = ctx->AddNode(base, "Shape", device);
    s->add_input(x);
    (*s->mutable_attr())["T"].set_type(t);
    (*s->mutable_attr())["out_type"].set_type(tensorflow::DT_INT32);
    return s->name();
  };
  const std::string keys_shape = shape_of(name + "/ctr_keys_shape", keys, key_type);
  const std::string rows_shape = shape_of(name + "/ctr_rows_shape", fused, T);
  const std::string begin = AddInt32Vector(ctx, name + "/ctr_row_begin", {1}, device);
  const std::string end = AddInt32Vector(ctx, name + "/ctr_row_end", {0}, device);
  const std::string stride = AddInt32Vector(ctx, name + "/ctr_row_stride", {1}, device);
  const std::string axis = AddInt64Scalar(ctx, name + "/ctr_out_axis", 0, device);
  // The shape of a row: rows_shape[1:].
  NodeDef* row = ctx->AddNode(name + "/ctr_row_shape", "StridedSlice", device);
  for (const std::string& in : {rows_shape, begin, end, stride}) row->add_input(in);
  auto& ra = *row->mutable_attr();
  ra["T"].set_type(tensorflow::DT_INT32);
  ra["Index"].set_type(tensorflow::DT_INT32);
  for (const char* mask : {"begin_mask", "ellipsis_mask", "new_axis_mask", "shrink_axis_mask"}) ra[mask].set_i(0);
  ra["end_mask"].set_i(1);
  const std::string row_shape = row->name();
  NodeDef* concat = ctx->AddNode(name + "/ctr_out_shape", "ConcatV2", device);
  for (const std::string& in : {keys_shape, row_shape, axis}) concat->add_input(in);
  (*concat->mutable_attr())["N"].set_i(2);
  (*concat->mutable_attr())["T"].set_type(tensorflow::DT_INT32);
  (*concat->mutable_attr())["Tidx"].set_type(tensorflow::DT_INT64);
  const std::string out_shape = concat->name();
  NodeDef* reshape = ctx->Mutable(name);
  reshape->clear_input();
  reshape->clear_attr();
  reshape->set_op("Reshape");
  reshape->add_input(fused);
  reshape->add_input(out_shape);
  (*reshape->mutable_attr())["T"].set_type(T);
  (*reshape->mutable_attr())["Tshape"].set_type(tensorflow::DT_INT32);
  NodeDef* fused_node = ctx->Mutable(fused);
  CopyControlInputs(old, fused_node);
  return fused_node;
}

namespace {

// w[..., None] (ellipsis, then a new axis) or w[:, :, None] (two whole axes,
// then a new one): w with a trailing unit axis, as ExpandDims(w, -1).
bool IsTrailingNewAxis(const GraphIndex& g, const NodeDef& slice) {
  if (IntAttr(slice, "shrink_axis_mask", 0) != 0) return false;
  std::vector<int64_t> begin, end, strides;
  if (!ConstIntVector(g.Producer(slice, 1), &begin) || !ConstIntVector(g.Producer(slice, 2), &end) ||
      !ConstIntVector(g.Producer(slice, 3), &strides) || begin.size() != end.size() ||
      begin.size() != strides.size())
    return false;
  const int64_t ellipsis = IntAttr(slice, "ellipsis_mask", 0), new_axis = IntAttr(slice, "new_axis_mask", 0);
  if (strides.size() == 2) return ellipsis == 1 && new_axis == 2;
  if (strides.size() != 3 || ellipsis != 0 || new_axis != 4 || strides[0] != 1 || strides[1] != 1) return false;
  return (IntAttr(slice, "begin_mask", 0) & 3) == 3 && (IntAttr(slice, "end_mask", 0) & 3) == 3;
}

}  // namespace

bool MatchExpandedWeights(const GraphIndex& g, const NodeDef* x, ExpandedWeights* w) {
  const NodeDef* cast = nullptr;
  if (IsOp(x, "Cast")) {
    cast = x;
    x = g.Producer(*x, 0);
  }
  if (x == nullptr) return false;
  int64_t axis = 0;
  if (IsOp(x, "ExpandDims")) {
    if (!ConstScalarInt(g.Producer(*x, 1), &axis) || (axis != 2 && axis != -1)) return false;
    *w = ExpandedWeights{x, cast, x->input(0), TypeAttr(*x, "T"), {ParseTensorName(x->input(1)).node}};
    return true;
  }
  std::vector<int64_t> shape;
  if (IsOp(x, "Reshape") && ConstIntVector(g.Producer(*x, 1), &shape) && shape.size() == 3 && shape[0] == -1 &&
      shape[1] > 0 && shape[2] == 1) {
    *w = ExpandedWeights{x, cast, x->input(0), TypeAttr(*x, "T"), {ParseTensorName(x->input(1)).node}, shape[1]};
    return true;
  }
  if (!IsOp(x, "StridedSlice") || !IsTrailingNewAxis(g, *x)) return false;
  *w = ExpandedWeights{x, cast, x->input(0), TypeAttr(*x, "T"), {}};
  for (int i = 1; i <= 3; ++i) w->constants.push_back(ParseTensorName(x->input(i)).node);
  return true;
}

bool IsAxisOne(const NodeDef* axes) {
  std::vector<int64_t> values;
  int64_t axis = 0;
  if (ConstScalarInt(axes, &axis)) values = {axis};
  else if (!ConstIntVector(axes, &values)) return false;
  return values.size() == 1 && (values[0] == 1 || values[0] == -2);
}

bool RowsArePooledBags(RewriteContext* ctx, const NodeDef& gather, const NodeDef& ids, int ids_port,
                       tensorflow::DataType T) {
  if (!ctx->PatternEnabled("dense_reduce_lookup")) return false;
  if (T != tensorflow::DT_FLOAT || ctx->Rank(ids, ids_port) != 2 || ctx->Dim(ids, ids_port, 1) < 1) return false;
  const GraphIndex& g = ctx->index();
  const NodeDef* rows = &gather;
  while (true) {
    const std::vector<const NodeDef*>& readers = g.DataReaders(rows->name());
    if (readers.size() != 1 || g.DataConsumers(rows->name()) != 1) return false;
    const NodeDef* r = readers[0];
    if (IsOp(r, "Mul")) {  // rows scaled by weights, summed
      const std::vector<const NodeDef*>& sums = g.DataReaders(r->name());
      ExpandedWeights w;
      const bool rows_first = ParseTensorName(r->input(0)).node == rows->name();
      return sums.size() == 1 && g.DataConsumers(r->name()) == 1 && IsOp(sums[0], "Sum") &&
             IsAxisOne(g.Producer(*sums[0], 1)) && !BoolAttr(*sums[0], "keep_dims", false) &&
             MatchExpandedWeights(g, g.Producer(*r, rows_first ? 1 : 0), &w);
    }
    // A reduction over another axis is no pooling of bags: dense_reduce_lookup
    // declines it, and the gather is then for the gather patterns to take.
    if (IsOp(r, "Sum") || IsOp(r, "Mean")) return IsAxisOne(g.Producer(*r, 1)) && !BoolAttr(*r, "keep_dims", false);
    if (!IsOp(r, "Identity")) return IsOp(r, "SelectV2") || IsOp(r, "Select");
    rows = r;
  }
}

}  // namespace grappler
}  // namespace tf_ctr

// Pattern: string features of one batch, each fused on its own, grouped --
//
//   CtrStringEmbedding(table_i, CtrPackStrings(strings_i))   i = 1..N
//
// (one string per bag, no trimming, each pack read by its embedding only)
// becomes
//
//   CtrMultiStringEmbedding(table_1..N, CtrPackStrings(strings_1..N))
//
// with output i replacing feature i's output: one pack and one pass instead
// of N of each, which is most of the cost of single-valued features.
//
// The grouped op splits the packed strings into N equal parts, so it is exact
// only for features of one batch size, which must be proven: their strings,
// their outputs, or tensors that keep those dims 0 (Flatten's Reshape,
// ExpandDims, Identity, a concatenation along another axis, which fails
// unless its inputs share dim 0) have the same known size or symbolic dim of
// Grappler's shape inference, or are one tensor. Features that nothing ties
// together stay single ops. The pack checks the sizes at run time too
// (equal_sizes), so a batch that would have failed the original graph (at
// the Concatenate before the MLP) still fails rather than pooling the wrong
// rows.
//
// Where every feature's strings are one whole column of the same [B, C]
// matrix (x[:, c], as models with one categorical input slice their fields),
// the pack reads those columns from the matrix (its `columns` attr) and the
// slices, which copied every string once more, go where nothing else reads
// them. Columns of one matrix share its batch, so no size check is needed.
//
// It runs after the other patterns (stage 1), so a group sees every feature
// they fused.
#include <map>
#include <string>
#include <vector>

#include "cc/grappler/absorbed_set.h"
#include "cc/grappler/gathered_rows.h"
#include "cc/grappler/pattern.h"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/tensor.pb.h"
#include "tensorflow/core/platform/logging.h"

namespace tf_ctr {
namespace grappler {
namespace {

using tensorflow::NodeDef;

constexpr char kName[] = "group_strings";
constexpr int kDepth = 4;  // shape-keeping ops followed from a feature's strings or output

// A feature that may join a group, and what proves its batch size.
struct Feature {
  const NodeDef* embedding = nullptr;
  const NodeDef* pack = nullptr;
  std::string strings;               // the pack's input
  // Ids of its batch size: "=<size>", "~<symbolic id>", or "@<tensor>" with
  // that dim 0.
  std::vector<std::string> batch;
  std::string key;                   // T and devices: only features of one key group
};

std::string BatchId(int64_t dim) {
  if (dim >= 0) return "=" + std::to_string(dim);
  if (dim < -1) return "~" + std::to_string(dim);
  return "";
}

void AddBatchId(int64_t dim, std::vector<std::string>* ids) {
  const std::string id = BatchId(dim);
  if (!id.empty()) ids->push_back(id);
}

// Whether every dim of `node`:port after the first is known to be 1.
bool OnlyFirstDimMayDiffer(RewriteContext* ctx, const NodeDef& node, int port) {
  const int rank = ctx->Rank(node, port);
  if (rank < 1) return false;
  for (int d = 1; d < rank; ++d)
    if (ctx->Dim(node, port, d) != 1) return false;
  return true;
}

// Whether a StridedSlice takes all of axis 0 (x[:, i:j], as Keras models
// slice one feature out of a [B, N] input): its output has the input's dim 0.
bool SliceKeepsDim0(const GraphIndex& g, const NodeDef& slice) {
  std::vector<int64_t> strides;
  return IsOp(&slice, "StridedSlice") && ConstIntVector(g.Producer(slice, 3), &strides) && !strides.empty() &&
         strides[0] == 1 && (IntAttr(slice, "begin_mask", 0) & 1) && (IntAttr(slice, "end_mask", 0) & 1) &&
         !(IntAttr(slice, "shrink_axis_mask", 0) & 1) && IntAttr(slice, "ellipsis_mask", 0) == 0 &&
         IntAttr(slice, "new_axis_mask", 0) == 0;
}

// Ids of dim 0 of tensor `input` of `user`: the inferred dim, and through
// shape-preserving producers (a Reshape to [-1] or a Squeeze of [B, 1], an
// Identity or EnsureShape, a slice that keeps all of axis 0) the dim 0 of what they read. Added nodes have no inferred shapes,
// so the flattening Reshapes the other patterns add are looked through.
void Dim0Ids(RewriteContext* ctx, const NodeDef& user, int input, int depth, std::vector<std::string>* ids) {
  int port = 0;
  const NodeDef* node = ctx->index().Producer(user, input, &port);
  if (node == nullptr || depth == 0) return;
  ids->push_back("@" + TensorName(node->name(), port));
  if (!ctx->Added(node->name()) && ctx->Rank(*node, port) >= 1) AddBatchId(ctx->Dim(*node, port, 0), ids);
  if (IsOp(node, "Identity") || IsOp(node, "EnsureShape") || SliceKeepsDim0(ctx->index(), *node))
    return Dim0Ids(ctx, *node, 0, depth - 1, ids);
  const NodeDef* in = ctx->index().Producer(*node, 0, &port);
  if (in == nullptr) return;
  std::vector<int64_t> shape;
  if (IsOp(node, "Reshape") && ConstIntVector(ctx->index().Producer(*node, 1), &shape) &&
      shape == std::vector<int64_t>{-1} && OnlyFirstDimMayDiffer(ctx, *in, port))
    return Dim0Ids(ctx, *node, 0, depth - 1, ids);
  if (IsSqueezeOfAxis(node, 1, 2) && ctx->Rank(*in, port) == 2 && OnlyFirstDimMayDiffer(ctx, *in, port))
    return Dim0Ids(ctx, *node, 0, depth - 1, ids);
}

// Column c of a [B, C] matrix, whole: x[:, c] (a StridedSlice shrinking axis
// 1) or x[:, c:c+1], read through a Reshape to [-1], an Identity, an
// EnsureShape (a fused split's vector check: the packed columns of a matrix
// are vectors, and the pack checks that it is one), or (of x[:, c:c+1]) a
// Squeeze of axis 1. The pack then reads the column from the
// matrix itself, and `chain` (the slice and what follows it, nearest the
// pack first) is left to remove where nothing else reads it.
struct ColumnSource {
  std::string matrix;
  int64_t column = -1;
  std::vector<std::string> chain;
};

bool IsWholeColumnSlice(RewriteContext* ctx, const NodeDef& slice, int64_t* column) {
  const GraphIndex& g = ctx->index();
  std::vector<int64_t> begin, end, strides;
  if (!IsOp(&slice, "StridedSlice") || !ConstIntVector(g.Producer(slice, 1), &begin) ||
      !ConstIntVector(g.Producer(slice, 2), &end) || !ConstIntVector(g.Producer(slice, 3), &strides))
    return false;
  if (begin.size() != 2 || end.size() != 2 || strides != std::vector<int64_t>{1, 1}) return false;
  const int64_t shrink = IntAttr(slice, "shrink_axis_mask", 0);
  if (IntAttr(slice, "begin_mask", 0) != 1 || IntAttr(slice, "end_mask", 0) != 1 ||
      IntAttr(slice, "ellipsis_mask", 0) != 0 || IntAttr(slice, "new_axis_mask", 0) != 0 ||
      (shrink != 0 && shrink != 2))
    return false;
  if (begin[1] < 0 || end[1] != begin[1] + 1) return false;
  int port = 0;
  const NodeDef* matrix = g.Producer(slice, 0, &port);
  if (matrix == nullptr || ctx->Added(matrix->name()) || ctx->Rank(*matrix, port) != 2) return false;
  *column = begin[1];
  return true;
}

// EnsureShape(x, [?]): vacuous on a column of a matrix.
bool IsVectorCheck(const NodeDef& node) {
  if (!IsOp(&node, "EnsureShape") || !node.attr().count("shape")) return false;
  const auto& shape = node.attr().at("shape").shape();
  return !shape.unknown_rank() && shape.dim_size() == 1 && shape.dim(0).size() == -1;
}

bool AsColumn(RewriteContext* ctx, const std::string& tensor, ColumnSource* out) {
  const GraphIndex& g = ctx->index();
  TensorId t = ParseTensorName(tensor);
  bool squeezed = false;
  for (int depth = 0; depth < kDepth; ++depth) {
    const NodeDef* node = g.Node(t.node);
    if (node == nullptr || t.port != 0) return false;
    out->chain.push_back(node->name());
    if (IsWholeColumnSlice(ctx, *node, &out->column)) {
      // A Squeeze of axis 1 fails on x[:, c] ([B]); only x[:, c:c+1] has it.
      if (squeezed && IntAttr(*node, "shrink_axis_mask", 0) != 0) return false;
      out->matrix = node->input(0);
      return true;
    }
    std::vector<int64_t> shape;
    if (IsOp(node, "Squeeze")) {
      if (!IsSqueezeOfAxis(node, 1, 2)) return false;
      squeezed = true;
    } else if (!IsOp(node, "Identity") && !IsVectorCheck(*node) &&
               !(IsOp(node, "Reshape") && ConstIntVector(g.Producer(*node, 1), &shape) &&
                 shape == std::vector<int64_t>{-1})) {
      return false;
    }
    if (node->input_size() < 1) return false;
    t = ParseTensorName(node->input(0));
  }
  return false;
}

// The column sources of every feature's strings when all are columns of one
// matrix; false otherwise (the group then packs its feature tensors).
bool ColumnsOfOneMatrix(RewriteContext* ctx, const std::vector<std::string>& strings,
                        std::vector<ColumnSource>* sources) {
  for (const std::string& s : strings) {
    ColumnSource c;
    if (!AsColumn(ctx, s, &c) || (!sources->empty() && c.matrix != sources->front().matrix)) return false;
    sources->push_back(std::move(c));
  }
  return !sources->empty();
}

// x[0] of Shape(tensor), as Python indexing emits it.
bool IsFirstDimOf(const GraphIndex& g, const NodeDef* slice, const std::string& tensor) {
  if (!IsFirstElementSlice(g, slice)) return false;
  int port = 0;
  const NodeDef* shape = g.Producer(*slice, 0, &port);
  if (!IsOp(shape, "Shape") || port != 0) return false;
  const TensorId t = ParseTensorName(shape->input(0));
  return TensorName(t.node, t.port) == tensor;
}

// Whether `reader`'s output 0 has dim 0 of its input `tensor`: ExpandDims
// after axis 0, Identity, Keras' Flatten -- Reshape(x, Pack(Shape(x)[0],
// ...)) -- and a concatenation or stack along another axis, which fails
// unless all its inputs share dim 0 (Keras' Concatenate before the MLP,
// keras.ops.stack of the field embeddings).
bool KeepsDim0(RewriteContext* ctx, const NodeDef& reader, int input, const std::string& tensor) {
  const GraphIndex& g = ctx->index();
  int64_t axis = 0;
  if (IsOp(&reader, "Pack")) return IntAttr(reader, "axis", 0) >= 1;
  if (IsOp(&reader, "ConcatV2")) {
    const int n = static_cast<int>(IntAttr(reader, "N", 0));
    if (input >= n || !ConstScalarInt(g.Producer(reader, n), &axis)) return false;
    const int rank = ctx->Added(reader.name()) ? -1 : ctx->Rank(reader, 0);
    return axis >= 1 || (axis < 0 && rank > 0 && axis + rank >= 1);
  }
  if (input != 0) return false;
  if (IsOp(&reader, "Identity")) return true;
  if (IsOp(&reader, "ExpandDims")) return ConstScalarInt(g.Producer(reader, 1), &axis) && axis >= 1;
  if (!IsOp(&reader, "Reshape")) return false;
  const NodeDef* pack = g.Producer(reader, 1);
  return IsOp(pack, "Pack") && IntAttr(*pack, "axis", 0) == 0 && pack->input_size() >= 1 &&
         IsFirstDimOf(g, g.Producer(*pack, 0), tensor);
}

// Ids of dim 0 of `tensor` found downstream: each tensor that keeps it (two
// features reaching the same one share their batch) and its inferred dim 0.
void ReaderDim0Ids(RewriteContext* ctx, const std::string& tensor, int depth, std::vector<std::string>* ids) {
  if (depth == 0) return;
  const TensorId t = ParseTensorName(tensor);
  for (const auto& [reader, input] : ctx->index().PortReaders(t.node, t.port)) {
    if (!KeepsDim0(ctx, *reader, input, tensor)) continue;
    const std::string out = TensorName(reader->name(), 0);
    ids->push_back("@" + out);
    if (!ctx->Added(reader->name()) && ctx->Rank(*reader, 0) >= 1) AddBatchId(ctx->Dim(*reader, 0, 0), ids);
    ReaderDim0Ids(ctx, out, depth - 1, ids);
  }
}

// TF1 control flow, as functional conds and loops are lowered to too.
bool IsControlFlow(const NodeDef& n) {
  static const char* kOps[] = {"Switch", "RefSwitch", "Merge", "RefMerge", "Enter", "RefEnter", "Exit",
                               "RefExit", "NextIteration", "RefNextIteration", "LoopCond"};
  for (const char* op : kOps)
    if (n.op() == op) return true;
  return false;
}

// Union-find over feature indices.
class Components {
 public:
  explicit Components(size_t n) : parent_(n) {
    for (size_t i = 0; i < n; ++i) parent_[i] = i;
  }
  size_t Find(size_t i) { return parent_[i] == i ? i : parent_[i] = Find(parent_[i]); }
  void Join(size_t a, size_t b) { parent_[Find(a)] = Find(b); }

 private:
  std::vector<size_t> parent_;
};

class GroupStringsPattern : public NamedPattern<kName> {
 public:
  int Stage() const override { return 1; }

  bool Rewrite(const NodeDef& anchor, RewriteContext* ctx) const override {
    if (!IsShaped(anchor)) return false;
    std::string why;
    Feature self;
    const bool joins = AsFeature(ctx, anchor, &self, &why);
    // Grouping needs a second feature; a lone one is simply left as it is.
    std::vector<Feature> features;
    bool control_flow = false;
    for (const auto& n : ctx->index().nodes()) {
      control_flow |= IsControlFlow(*n);
      Feature f;
      std::string unused;
      if (IsShaped(*n) && AsFeature(ctx, *n, &f, &unused)) {
        ReaderDim0Ids(ctx, n->name(), kDepth, &f.batch);
        if (VLOG_IS_ON(2)) {
          std::string dims;
          for (const std::string& id : f.batch) dims += " " + id;
          VLOG(2) << "CtrFusionOptimizer: string feature " << n->name() << " batch dims:" << dims;
        }
        features.push_back(std::move(f));
      }
    }
    size_t me = features.size();
    for (size_t i = 0; i < features.size(); ++i)
      if (features[i].embedding == &anchor) me = i;
    bool others = false;
    for (size_t i = 0; i < features.size(); ++i) others |= i != me && (!joins || features[i].key == self.key);
    if (!others) {
      VLOG(2) << "CtrFusionOptimizer: " << anchor.name() << " has no other string feature to group with";
      return false;
    }
    if (!joins) return Skip(ctx, anchor, why);
    // Features in two branches of a cond would make one op of which one
    // input is always dead (it never runs); and inferred shapes merge sizes
    // through ops of branches and loop bodies that may never run, so they
    // prove no batch size there.
    if (control_flow)
      return Skip(ctx, anchor, "the graph has control flow (tf.cond / tf.while_loop as Switch, Merge, Enter): "
                               "features may sit in branches that never run together");
    const std::vector<Feature> group = GroupOf(features, me);
    if (group.size() < 2) {
      std::string dims;
      for (const std::string& id : features[me].batch) dims += (dims.empty() ? "" : ", ") + id;
      return Skip(ctx, anchor, "cannot prove its batch size equals another string feature's (its batch dims: " +
                                   (dims.empty() ? std::string("unknown") : dims) + ")");
    }
    std::vector<const NodeDef*> members;
    for (const Feature& f : group) {
      members.push_back(f.embedding);
      members.push_back(f.pack);
    }
    if (!MergeKeepsOrder(ctx->index(), members, &why)) return Skip(ctx, anchor, why);
    Group(ctx, group);
    return true;
  }

 private:
  // One bag per string, every row kept, and no safe-lookup options (the
  // grouped op has neither): what the grouped op computes.
  static bool IsShaped(const NodeDef& n) {
    return IsOp(&n, "CtrStringEmbedding") && !BoolAttr(n, "bagged", true) && !BoolAttr(n, "trim_empty_tail", true) &&
           StringAttr(n, "invalid_ids") != "skip_negative" && IntAttr(n, "default_id", -1) < 0;
  }

  static bool AsFeature(RewriteContext* ctx, const NodeDef& emb, Feature* f, std::string* why) {
    const GraphIndex& g = ctx->index();
    int bytes_port = -1, splits_port = -1;
    const NodeDef* pack = g.Producer(emb, 1, &bytes_port);
    if (!IsOp(pack, "CtrPackStrings") || g.Producer(emb, 2, &splits_port) != pack || bytes_port != 0 ||
        splits_port != 1) {
      *why = "its strings are not packed by a CtrPackStrings of its own";
      return false;
    }
    if (IntAttr(*pack, "N", 1) != 1) {
      *why = "its CtrPackStrings packs several inputs";
      return false;
    }
    if (g.Consumers(pack->name(), 0) != 1 || g.Consumers(pack->name(), 1) != 1 || g.DataConsumers(pack->name()) != 2) {
      *why = "intermediate " + Describe(*pack) + " has another consumer (a gradient, say)";
      return false;
    }
    f->embedding = &emb;
    f->pack = pack;
    f->strings = pack->input(0);
    f->key = tensorflow::DataType_Name(TypeAttr(emb, "T")) + "|" + emb.device() + "|" + pack->device();
    // The strings' length is the batch, and so is the output's dim 0 (the
    // output of a node that replaced one of the same name and value; and
    // what its readers keep of it, found by the caller).
    Dim0Ids(ctx, *pack, 0, kDepth, &f->batch);
    if (!ctx->Added(emb.name()) && ctx->Rank(emb, 0) == 2) AddBatchId(ctx->Dim(emb, 0, 0), &f->batch);
    return true;
  }

  // The features of `features[me]`'s key connected to it by shared batch ids,
  // in graph order.
  static std::vector<Feature> GroupOf(const std::vector<Feature>& features, size_t me) {
    Components c(features.size());
    std::map<std::string, size_t> first_with_id;
    for (size_t i = 0; i < features.size(); ++i) {
      for (const std::string& id : features[i].batch) {
        auto [it, inserted] = first_with_id.emplace(id, i);
        if (!inserted) c.Join(i, it->second);
      }
    }
    std::vector<Feature> group;
    for (size_t i = 0; i < features.size(); ++i)
      if (features[i].key == features[me].key && c.Find(i) == c.Find(me)) group.push_back(features[i]);
    return group;
  }

  // Reshape(x, [-1]) read only by one pack, with no control edges either way.
  static bool IsFlatteningReshape(RewriteContext* ctx, const NodeDef* r) {
    const GraphIndex& g = ctx->index();
    std::vector<int64_t> shape;
    if (!IsOp(r, "Reshape") || !ConstIntVector(g.Producer(*r, 1), &shape) || shape != std::vector<int64_t>{-1})
      return false;
    if (g.DataConsumers(r->name()) != 1 || g.ControlConsumers(r->name()) != 0 || ctx->MustKeep(r->name()))
      return false;
    for (const auto& in : r->input())
      if (!in.empty() && in[0] == '^') return false;
    return IsOp(g.DataReaders(r->name())[0], "CtrPackStrings");
  }

  // Drops each column's slice chain from the pack backwards, as far as its
  // nodes have no reader but the next one (the old single pack first).
  static void RemoveUnreadChains(RewriteContext* ctx, const std::vector<ColumnSource>& columns,
                                 const std::vector<NodeDef>& chain_nodes, NodeDef* pack, MatchRecord* record) {
    const GraphIndex& g = ctx->index();
    size_t k = 0;
    for (const ColumnSource& c : columns) {
      bool unread = true;
      for (size_t i = 0; i < c.chain.size(); ++i, ++k) {
        const NodeDef& node = chain_nodes[k];
        unread = unread && g.DataConsumers(node.name()) == 1 && g.Consumers(node.name(), 0) == 1 &&
                 !ctx->MustKeep(node.name());
        if (!unread) continue;
        CopyControlInputs(node, pack);
        ctx->RedirectControlEdges(node.name(), pack->name());
        ctx->Remove(node.name(), pack->name());
        record->replaced.push_back(Describe(node));
      }
    }
  }

  static void Group(RewriteContext* ctx, const std::vector<Feature>& group_in) {
    // Copies: the graph changes under the index's pointers.
    std::vector<NodeDef> embeddings, packs;
    std::vector<std::string> strings;
    for (const Feature& f : group_in) {
      embeddings.push_back(*f.embedding);
      packs.push_back(*f.pack);
      strings.push_back(f.strings);
    }
    const GraphIndex& g = ctx->index();
    const NodeDef& first = embeddings[0];
    const int n = static_cast<int>(embeddings.size());
    MatchRecord record{kName, "", "CtrMultiStringEmbedding", {}};

    std::vector<ColumnSource> columns;
    const bool from_columns = ColumnsOfOneMatrix(ctx, strings, &columns);
    // The chains' nodes, copied while the index still points at them.
    std::vector<NodeDef> chain_nodes;
    for (const ColumnSource& c : columns)
      for (const std::string& name : c.chain) chain_nodes.push_back(*g.Node(name));

    // The pack reads each tensor in row-major order, as a Reshape to [-1]
    // would flatten it: such a Reshape read by the feature's pack alone goes.
    std::vector<std::string> unflattened;
    std::vector<NodeDef> flattenings;
    if (!from_columns) {
      for (const std::string& s : strings) {
        const NodeDef* r = g.Node(ParseTensorName(s).node);
        if (IsFlatteningReshape(ctx, r)) {
          flattenings.push_back(*r);
          unflattened.push_back(r->input(0));
        } else {
          unflattened.push_back(s);
        }
      }
    }

    NodeDef* pack = ctx->AddNode(first.name() + "/ctr_group_pack", "CtrPackStrings", packs[0].device());
    for (const NodeDef& p : packs) CopyControlInputs(p, pack);
    if (from_columns) {
      // All columns of one batch by construction: nothing to check at run time.
      pack->add_input(columns[0].matrix);
      (*pack->mutable_attr())["N"].set_i(1);
      for (const ColumnSource& c : columns) (*pack->mutable_attr())["columns"].mutable_list()->add_i(c.column);
    } else {
      for (const std::string& s : unflattened) pack->add_input(s);
      (*pack->mutable_attr())["N"].set_i(n);
      (*pack->mutable_attr())["equal_sizes"].set_b(true);
    }
    const std::string pack_name = pack->name();
    if (from_columns) RemoveUnreadChains(ctx, columns, chain_nodes, pack, &record);
    for (const NodeDef& r : flattenings) {
      ctx->Remove(r.name(), pack_name);
      record.replaced.push_back(Describe(r));
    }

    NodeDef* multi = ctx->AddNode(first.name() + "/ctr_group", "CtrMultiStringEmbedding", first.device());
    for (const NodeDef& e : embeddings) multi->add_input(e.input(0));
    multi->add_input(TensorName(pack_name, 0));
    multi->add_input(TensorName(pack_name, 1));
    auto& attr = *multi->mutable_attr();
    attr["N"].set_i(n);
    attr["T"] = first.attr().at("T");
    std::vector<std::vector<int64_t>> hash_keys;
    std::vector<GradForm> grad_forms;
    for (const NodeDef& e : embeddings) {
      hash_keys.push_back(HashKeyAttr(e));
      grad_forms.push_back(GradFormAttr(e));
      attr["combiners"].mutable_list()->add_s(StringAttr(e, "combiner"));
      attr["id_modes"].mutable_list()->add_s(StringAttr(e, "id_mode"));
      attr["delimiters"].mutable_list()->add_s(StringAttr(e, "delimiter"));
      attr["skip_empty"].mutable_list()->add_b(BoolAttr(e, "skip_empty", true));
      auto it = e.attr().find("max_norm");
      attr["max_norms"].mutable_list()->add_f(it == e.attr().end() ? -1.f : it->second.f());
      attr["num_buckets"].mutable_list()->add_i(IntAttr(e, "num_buckets", 0));
    }
    SetGroupedHashKeys(hash_keys, multi);
    SetGroupedGradForms(grad_forms, multi);
    const std::string multi_name = multi->name();
    record.fused_node = multi_name;

    std::vector<std::string> extra_controls;
    for (int i = 0; i < n; ++i) {
      const NodeDef& e = embeddings[i];
      record.replaced.push_back(Describe(packs[i]));
      record.replaced.push_back(Describe(e));
      ctx->RedirectControlEdges(packs[i].name(), pack_name);
      ctx->Remove(packs[i].name(), multi_name);
      AppendControlInputs(e, &extra_controls);
      // The empty bag_splits constant loses its reader.
      const NodeDef* bags = g.Producer(e, 3);
      if (IsOp(bags, "Const") && g.DataConsumers(bags->name()) == 1) {
        AppendControlInputs(*bags, &extra_controls);
        ctx->RedirectControlEdges(bags->name(), multi_name);
        ctx->Remove(bags->name(), multi_name);
      }
      HandOver(ctx, e, TensorName(multi_name, i), multi_name);
    }
    AddControlInputsOnce(extra_controls, ctx->Mutable(multi_name));
    VLOG(1) << "CtrFusionOptimizer: grouped " << n << " string features into " << multi_name;
    ctx->Matched(record);
  }
};

REGISTER_CTR_FUSION_PATTERN(GroupStringsPattern);

}  // namespace
}  // namespace grappler
}  // namespace tf_ctr

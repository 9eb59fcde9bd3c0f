// Pattern: string embeddings concatenated along axis 1, as CTR models join
// their fields before the MLP --
//
//   ConcatV2(e_1, ..., e_N, axis = 1 or -1)
//
// where every e_k is the output of a single CtrStringEmbedding (one string
// per bag, its own pack, trimmed or not) or an output of a
// CtrMultiStringEmbedding all of whose outputs this concatenation reads,
// becomes
//
//   CtrConcatStringEmbedding(tables, CtrPackStrings(strings))
//
// in the concatenation's order: one pack and one pass write the MLP's input in
// place, where the grouped op's outputs were copied again by the ConcatV2, and
// the trimmed features of tf.compat.v1.string_split (whose row counts are
// known only at run time) had to stay single ops.
//
// A stack of the same embeddings along axis 1, as FM-family models (DeepFM,
// AutoInt, DCN) gather their fields into [B, F, D] --
//
//   Pack(e_1, ..., e_N, axis = 1 or -2)
//
// is the same concatenation read as [B, N, D]: the fused op, then a Reshape
// to [-1, N, D]. It needs every input's width known and equal (D > 0), as the
// Pack needs equal shapes; otherwise the stack is left alone.
//
// Exact: each feature is pooled by the same code as before, and the fused op
// fails where the ConcatV2 would, when the features' row counts differ (a
// trimmed feature's count is found as the single op found it). It needs no
// proof that the features share a batch: the pack's input_splits tell it
// each feature's strings.
//
// It runs after the grouping (stage 2), so a concatenation of grouped
// features keeps what the group found (the columns of one input matrix,
// packed from the matrix); single features it takes as they are.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cc/grappler/absorbed_set.h"
#include "cc/grappler/gathered_rows.h"
#include "cc/grappler/pattern.h"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/platform/logging.h"

namespace tf_ctr {
namespace grappler {
namespace {

using tensorflow::NodeDef;

constexpr char kName[] = "concat_strings";

// One input of the concatenation: a feature, with what its pooling needs
// and the nodes that go with it, or a dense input copied in as it is.
struct Part {
  std::string dense;  // the tensor of a dense input; empty for a feature
  std::string group;  // the grouped op a feature comes from, if any
  std::vector<const NodeDef*> nodes;
  std::string table;
  std::string strings;  // the tensor its pack read; empty when a column of `matrix`
  std::string matrix;
  int64_t column = -1;
  std::string combiner, id_mode, delimiter;
  bool skip_empty = true;
  float max_norm = -1.f;
  int64_t buckets = 0;
  std::vector<int64_t> hash_key;
  GradForm grad;
  bool trim = false;
  int64_t width = -1;  // static columns (the table's dim, or a dense input's); -1 unknown
};

// What the rewrite removes and where it finds the features.
struct Sources {
  std::vector<Part> parts;
  // Pointers into the graph: Fuse renames no node and removes none before
  // Commit, and adding nodes does not move the others.
  std::vector<const NodeDef*> removed;
  bool placed = false;           // emb_device and pack_device set, by the first feature
  std::string emb_device, pack_device;
};

void Once(const NodeDef* node, std::set<std::string>* seen, std::vector<const NodeDef*>* nodes) {
  if (seen->insert(node->name()).second) nodes->push_back(node);
}

class ConcatStringsPattern : public NamedPattern<kName> {
 public:
  int Stage() const override { return 2; }

  bool Rewrite(const NodeDef& anchor, RewriteContext* ctx) const override {
    const bool stack = IsOp(&anchor, "Pack");
    if (!IsOp(&anchor, "ConcatV2") && !stack) return false;
    const GraphIndex& g = ctx->index();
    const int n = static_cast<int>(IntAttr(anchor, "N", 0));
    // A stack of one field is a stack too ([B, 1, D]); a concatenation takes two.
    if (n < (stack ? 1 : 2)) return false;
    // Only concatenations of string embeddings are this pattern's to judge.
    bool any = false;
    for (int k = 0; k < n; ++k) {
      int port = 0;
      const NodeDef* p = ProducerBehindIdentities(ctx, anchor, k, &port, nullptr);
      any |= IsOp(p, "CtrStringEmbedding") || IsOp(p, "CtrMultiStringEmbedding");
    }
    if (!any) {
      if (VLOG_IS_ON(2)) {
        std::string ins;
        for (int k = 0; k < n; ++k) {
          int port = 0;
          const NodeDef* p = ProducerBehindIdentities(ctx, anchor, k, &port, nullptr);
          ins += " " + (p ? Describe(*p) : std::string("none"));
        }
        VLOG(2) << "CtrFusionOptimizer: " << anchor.name() << " joins no string embedding:" << ins;
      }
      return false;
    }
    std::string why;
    if (!JoinsSideBySide(g, anchor, &why)) return Skip(ctx, anchor, why);
    Sources src;
    if (!CollectParts(ctx, anchor, n, &src, &why)) return Skip(ctx, anchor, why);
    int64_t width = 0;
    if (stack && !CommonWidth(ctx, anchor, &src, &width, &why)) return Skip(ctx, anchor, why);
    std::vector<const NodeDef*> members = src.removed;
    members.push_back(&anchor);
    if (!MergeKeepsOrder(g, members, &why)) return Skip(ctx, anchor, why);
    if (const NodeDef* axis_const = stack ? nullptr : AxisConstOnlyFor(ctx, anchor))
      src.removed.push_back(axis_const);
    Fuse(ctx, anchor, src, stack ? width : 0);
    return true;
  }

 private:
  // The producer of input k of `node`, through Identity nodes (as
  // tf.nn.embedding_lookup ends), which are collected in `identities`
  // (nullable) to go with the rewrite; `shared` (nullable) tells whether
  // anything else reads, waits on or fetches one of them. One that is only
  // preserved may go: online, a function's gather (stateful) is kept as an
  // Identity of the fused lookup, and becomes a NoOp here.
  static const NodeDef* ProducerBehindIdentities(RewriteContext* ctx, const NodeDef& node, int k, int* port,
                                                 std::vector<const NodeDef*>* identities, bool* shared = nullptr) {
    const GraphIndex& g = ctx->index();
    const NodeDef* p = g.Producer(node, k, port);
    while (IsOp(p, "Identity")) {
      if (shared)
        *shared |= g.Consumers(p->name(), 0) != 1 || !OnlyLaterNodesWaitOn(g, p->name(), node) ||
                   ctx->FetchedOrFed(p->name());
      if (identities) identities->push_back(p);
      p = g.Producer(*p, 0, port);
    }
    return p;
  }

  // Whether nothing that waits on `name` is an ancestor of `join`: then it
  // may wait on the op that replaces the join instead without closing a
  // cycle. A function's control outputs (TF waits on each stateful gather
  // with a NoOp its return value waits on) come after the join.
  static bool OnlyLaterNodesWaitOn(const GraphIndex& g, const std::string& name, const NodeDef& join) {
    const auto& waiting = g.ControlReaders(name);
    if (waiting.empty()) return true;
    const std::set<std::string> before = Ancestors(g, {join.name()});
    for (const NodeDef* r : waiting)
      if (before.count(r->name())) return false;
    return true;
  }

  // The static width of output `port` of `node` as a [B, D] matrix, or -1.
  static int64_t StaticWidth(RewriteContext* ctx, const NodeDef* node, int port) {
    if (node == nullptr || ctx->Rank(*node, port) != 2) return -1;
    const int64_t d = ctx->Dim(*node, port, 1);
    return d >= 0 ? d : -1;
  }

  // The one width D of a stack's inputs (features: their tables' dims), known
  // and positive: the Reshape to [-1, N, D] is then the Pack's result.
  static bool CommonWidth(RewriteContext* ctx, const NodeDef& pack, Sources* src, int64_t* width, std::string* why) {
    const GraphIndex& g = ctx->index();
    for (size_t k = 0; k < src->parts.size(); ++k) {
      Part& part = src->parts[k];
      if (!part.dense.empty()) {
        int port = 0;
        const NodeDef* p = g.Producer(pack, static_cast<int>(k), &port);
        part.width = StaticWidth(ctx, p, port);
      }
      if (part.width <= 0 || (k > 0 && part.width != src->parts[0].width)) {
        *why = "input " + std::to_string(k) + " of the stack has no static width equal to the others' (" +
               std::to_string(part.width) + " against " + std::to_string(src->parts[0].width) + ")";
        return false;
      }
    }
    *width = src->parts[0].width;
    return true;
  }

  // Sorts the concatenation's inputs into features, which the fused op takes
  // over (with the nodes that go), and dense inputs, copied in as they are:
  // any other tensor, and embeddings the op cannot take over (why says, for
  // the first, why not). False when no feature is left.
  static bool CollectParts(RewriteContext* ctx, const NodeDef& concat, int n, Sources* src, std::string* why) {
    // How many of each grouped op's outputs this concatenation reads.
    std::map<std::string, int64_t> reads;
    for (int k = 0; k < n; ++k) {
      int port = 0;
      const NodeDef* p = ProducerBehindIdentities(ctx, concat, k, &port, nullptr);
      if (IsOp(p, "CtrMultiStringEmbedding")) ++reads[p->name()];
    }
    for (int k = 0; k < n; ++k) {
      Part part;
      std::string reason;
      if (!AsFeature(ctx, concat, k, reads, src, &part, &reason)) {
        if (!reason.empty() && why->empty()) *why = reason;
        part = Part{};
        part.dense = concat.input(k);
      }
      src->parts.push_back(std::move(part));
    }
    // A grouped op goes whole or stays whole: if one of its outputs stays a
    // dense input, they all do.
    std::set<std::string> kept;
    for (size_t k = 0; k < src->parts.size(); ++k)
      if (!src->parts[k].dense.empty()) {
        int port = 0;
        const NodeDef* p = ProducerBehindIdentities(ctx, concat, static_cast<int>(k), &port, nullptr);
        if (IsOp(p, "CtrMultiStringEmbedding")) kept.insert(p->name());
      }
    std::set<std::string> seen;
    int features = 0;
    for (size_t k = 0; k < src->parts.size(); ++k) {
      Part& part = src->parts[k];
      if (part.dense.empty() && !part.group.empty() && kept.count(part.group)) {
        part = Part{};
        part.dense = concat.input(static_cast<int>(k));
      }
      if (!part.dense.empty()) continue;
      ++features;
      for (const NodeDef* node : part.nodes) Once(node, &seen, &src->removed);
    }
    if (features == 0) {
      if (why->empty()) *why = "no string embedding it could take over";
      return false;
    }
    bool columns = false, vectors = false;
    for (const Part& part : src->parts)
      if (part.dense.empty()) (part.column >= 0 ? columns : vectors) = true;
    if (columns && (vectors || !OneMatrix(src->parts))) {
      *why = "features packed as columns of a matrix cannot share a pack with other features";
      return false;
    }
    return true;
  }

  // Input k as a feature: a single string embedding, or an output of a
  // grouped one all of whose outputs the concatenation reads once each.
  static bool AsFeature(RewriteContext* ctx, const NodeDef& concat, int k, const std::map<std::string, int64_t>& reads,
                        Sources* src, Part* part, std::string* why) {
    const GraphIndex& g = ctx->index();
    int port = 0;
    std::vector<const NodeDef*> identities;
    bool shared = false;
    const NodeDef* p = ProducerBehindIdentities(ctx, concat, k, &port, &identities, &shared);
    if (!IsOp(p, "CtrStringEmbedding") && !IsOp(p, "CtrMultiStringEmbedding")) return false;  // plain dense
    const std::string where = "input " + std::to_string(k) + " (" + Describe(*p) + ")";
    const NodeDef* pack = g.Producer(*p, IsOp(p, "CtrStringEmbedding") ? 1 : IntAttr(*p, "N", 0));
    if (shared || g.Consumers(p->name(), port) != 1) {
      *why = where + " is read by another node";
    } else if (TypeAttr(*p, "T") != TypeAttr(concat, "T")) {
      *why = where + " has another dtype";
    } else if (ctx->MustKeep(p->name())) {
      *why = where + " is fetched or preserved";
    } else if (!IsOp(pack, "CtrPackStrings") || g.DataConsumers(pack->name()) != 2 || ctx->MustKeep(pack->name())) {
      *why = where + ": its strings are not packed by a CtrPackStrings that only it reads";
    } else if (src->placed && (p->device() != src->emb_device || pack->device() != src->pack_device)) {
      *why = where + " is placed on another device";
    } else if (IsOp(p, "CtrMultiStringEmbedding") &&
               (reads.at(p->name()) != IntAttr(*p, "N", 0) || g.DataConsumers(p->name()) != IntAttr(*p, "N", 0))) {
      *why = where + ": another node reads some of the grouped op's outputs";
    } else if (IsOp(p, "CtrStringEmbedding") && !AsSingle(ctx, *p, *pack, part, why)) {
      *why = where + ": " + *why;
    } else {
      if (IsOp(p, "CtrStringEmbedding")) {
        part->nodes.push_back(g.Producer(*p, 3));
      } else {
        GroupMember(*p, *pack, port, part);
        part->group = p->name();
      }
      int table_port = 0;
      const NodeDef* table = g.Producer(*p, IsOp(p, "CtrStringEmbedding") ? 0 : port, &table_port);
      part->width = StaticWidth(ctx, table, table_port);
      part->nodes.insert(part->nodes.end(), identities.begin(), identities.end());
      part->nodes.push_back(p);
      part->nodes.push_back(pack);
      if (!src->placed) {
        src->placed = true;
        src->emb_device = p->device();
        src->pack_device = pack->device();
      }
      return true;
    }
    VLOG(2) << "CtrFusionOptimizer: " << concat.name() << " copies " << where << " in as a dense input: " << *why;
    return false;
  }

  // A single feature: one string per bag, and none of the safe lookup's
  // options, which the concatenated op has not.
  static bool AsSingle(RewriteContext* ctx, const NodeDef& emb, const NodeDef& pack, Part* part, std::string* why) {
    const GraphIndex& g = ctx->index();
    if (BoolAttr(emb, "bagged", true) || StringAttr(emb, "invalid_ids") == "skip_negative" ||
        IntAttr(emb, "default_id", -1) >= 0) {
      *why = "it groups strings into bags or has safe_embedding_lookup_sparse options";
      return false;
    }
    int bytes_port = -1, splits_port = -1;
    if (g.Producer(emb, 1, &bytes_port) != &pack || g.Producer(emb, 2, &splits_port) != &pack || bytes_port != 0 ||
        splits_port != 1 || IntAttr(pack, "N", 1) != 1 ||
        (pack.attr().count("columns") && pack.attr().at("columns").list().i_size() > 0)) {
      *why = "its strings are not one input of its own CtrPackStrings";
      return false;
    }
    const NodeDef* bags = g.Producer(emb, 3);
    if (!IsOp(bags, "Const") || g.DataConsumers(bags->name()) != 1) {
      *why = "its empty bag_splits is not a constant of its own";
      return false;
    }
    part->table = emb.input(0);
    part->strings = pack.input(0);
    part->combiner = StringAttr(emb, "combiner");
    part->id_mode = StringAttr(emb, "id_mode");
    part->delimiter = StringAttr(emb, "delimiter");
    part->skip_empty = BoolAttr(emb, "skip_empty", true);
    auto it = emb.attr().find("max_norm");
    part->max_norm = it == emb.attr().end() ? -1.f : it->second.f();
    part->buckets = IntAttr(emb, "num_buckets", 0);
    part->hash_key = HashKeyAttr(emb);
    part->grad = GradFormAttr(emb);
    part->trim = BoolAttr(emb, "trim_empty_tail", false);
    return true;
  }

  // Feature i of a grouped op, from its attribute lists and its pack.
  static void GroupMember(const NodeDef& multi, const NodeDef& pack, int i, Part* part) {
    const auto& a = multi.attr();
    part->table = multi.input(i);
    auto columns = pack.attr().find("columns");
    if (columns != pack.attr().end() && columns->second.list().i_size() > 0) {
      part->matrix = pack.input(0);
      part->column = columns->second.list().i(i);
    } else {
      part->strings = pack.input(i);
    }
    part->combiner = a.at("combiners").list().s(i);
    part->id_mode = a.at("id_modes").list().s(i);
    part->delimiter = a.at("delimiters").list().s(i);
    part->skip_empty = a.at("skip_empty").list().b(i);
    part->max_norm = a.at("max_norms").list().f(i);
    auto buckets = a.find("num_buckets");
    part->buckets = buckets != a.end() && buckets->second.list().i_size() > i ? buckets->second.list().i(i) : 0;
    part->hash_key = GroupedHashKey(multi, i);
    part->grad = GroupedGradForm(multi, i);
  }

  static bool OneMatrix(const std::vector<Part>& parts) {
    for (const Part& p : parts)
      if (p.matrix != parts[0].matrix) return false;
    return true;
  }

  // stack_width > 0: the anchor is a Pack of inputs that wide, and the fused
  // op's output is reshaped to [-1, N, stack_width].
  static void Fuse(RewriteContext* ctx, const NodeDef& concat_in, const Sources& src, int64_t stack_width) {
    const NodeDef concat = concat_in;  // a copy: the graph changes under the index
    MatchRecord record{kName, "", "CtrConcatStringEmbedding", {}};
    std::vector<std::string> controls;
    AppendControlInputs(concat, &controls);
    for (const NodeDef* r : src.removed) AppendControlInputs(*r, &controls);

    std::vector<const Part*> features, dense;
    for (const Part& p : src.parts) (p.dense.empty() ? features : dense).push_back(&p);
    NodeDef* pack = ctx->AddNode(concat.name() + "/ctr_concat_pack", "CtrPackStrings", src.pack_device);
    if (features[0]->column >= 0) {
      pack->add_input(features[0]->matrix);
      (*pack->mutable_attr())["N"].set_i(1);
      for (const Part* p : features) (*pack->mutable_attr())["columns"].mutable_list()->add_i(p->column);
    } else {
      for (const Part* p : features) pack->add_input(p->strings);
      (*pack->mutable_attr())["N"].set_i(static_cast<int64_t>(features.size()));
    }
    const std::string pack_name = pack->name();

    NodeDef* op = ctx->AddNode(concat.name() + "/ctr_concat", "CtrConcatStringEmbedding", src.emb_device);
    for (const Part* p : features) op->add_input(p->table);
    for (int port = 0; port < 3; ++port) op->add_input(TensorName(pack_name, port));
    for (const Part* p : dense) op->add_input(p->dense);
    auto& attr = *op->mutable_attr();
    attr["N"].set_i(static_cast<int64_t>(features.size()));
    attr["M"].set_i(static_cast<int64_t>(dense.size()));
    attr["T"] = concat.attr().at("T");
    int64_t next_feature = 0, next_dense = static_cast<int64_t>(features.size());
    for (const Part& p : src.parts)
      attr["layout"].mutable_list()->add_i(p.dense.empty() ? next_feature++ : next_dense++);
    std::vector<std::vector<int64_t>> hash_keys;
    std::vector<GradForm> grad_forms;
    for (const Part* f : features) {
      const Part& p = *f;
      hash_keys.push_back(p.hash_key);
      grad_forms.push_back(p.grad);
      attr["combiners"].mutable_list()->add_s(p.combiner);
      attr["id_modes"].mutable_list()->add_s(p.id_mode);
      attr["delimiters"].mutable_list()->add_s(p.delimiter);
      attr["skip_empty"].mutable_list()->add_b(p.skip_empty);
      attr["max_norms"].mutable_list()->add_f(p.max_norm);
      attr["num_buckets"].mutable_list()->add_i(p.buckets);
      attr["trim_empty_tail"].mutable_list()->add_b(p.trim);
    }
    SetGroupedHashKeys(hash_keys, op);
    SetGroupedGradForms(grad_forms, op);
    AddControlInputsOnce(controls, op);
    const std::string op_name = op->name();
    record.fused_node = op_name;

    for (const NodeDef* r : src.removed) {
      record.replaced.push_back(Describe(*r));
      ctx->RedirectControlEdges(r->name(), op_name);
      ctx->Remove(r->name(), op_name);
    }
    record.replaced.push_back(Describe(concat));
    std::string output = TensorName(op_name, 0);
    if (stack_width > 0)
      output = ReshapeToStack(ctx, concat.name(), output, static_cast<int64_t>(src.parts.size()), stack_width,
                              concat.attr().at("T"), src.emb_device);
    HandOver(ctx, concat, output, op_name);
    VLOG(1) << "CtrFusionOptimizer: " << (stack_width > 0 ? "stacked " : "concatenated ") << features.size()
            << " string features and " << dense.size() << " other inputs into " << op_name;
    ctx->Matched(record);
  }
};

REGISTER_CTR_FUSION_PATTERN(ConcatStringsPattern);

}  // namespace
}  // namespace grappler
}  // namespace tf_ctr

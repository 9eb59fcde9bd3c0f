// Pattern: vocabulary embeddings concatenated along axis 1, as Keras models
// join their StringLookup / IntegerLookup + Embedding fields before the MLP --
//
//   ConcatV2(e_1, ..., e_N, axis = 1 or -1)
//
// where two or more e_k are [B, D] outputs of CtrVocabEmbedding (what the
// vocab_lookup pattern made of a lookup, its gather and Keras' Flatten: [B]
// keys, a [V, D] table) becomes
//
//   CtrConcatVocabEmbedding(tables, keys, defaults, params, other inputs)
//
// in the concatenation's order: each row of the MLP's input is written once.
// A stack along axis 1 (Pack, as FM-family models gather their fields into
// [B, F, D]) of features only, all of one known width D, is the same op
// reshaped to [-1, F, D].
// TF's ConcatV2 copies one small block per input per row (27 blocks of 64
// bytes a row in a 26-field model), which at batch 1024 costs as much as the
// finds themselves.
//
// Exact: each feature is found, checked and gathered by the same code as the
// single op, and the fused op fails where the ConcatV2 would, when the
// inputs' row counts differ. Only inference graphs: a feature whose `rows`
// output (its gradient's indices) is read stays a dense input.
#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "cc/grappler/absorbed_set.h"
#include "cc/grappler/pattern.h"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/platform/logging.h"

namespace tf_ctr {
namespace grappler {
namespace {

using tensorflow::NodeDef;

constexpr char kName[] = "concat_vocab";
constexpr char kFusedOp[] = "CtrConcatVocabEmbedding";

// "^name" or "name:port" -> "name".
std::string NodeName(const std::string& input) {
  const size_t begin = !input.empty() && input[0] == '^' ? 1 : 0;
  const size_t colon = input.find(':', begin);
  return input.substr(begin, colon == std::string::npos ? std::string::npos : colon - begin);
}

// One input of the concatenation: a vocabulary embedding taken over, or a
// tensor copied in as it is.
struct Part {
  const NodeDef* feature = nullptr;  // the CtrVocabEmbedding, or null for a dense input
  std::vector<const NodeDef*> identities;
  std::string dense;
};

class ConcatVocabPattern : public NamedPattern<kName> {
 public:
  int Stage() const override { return 2; }

  bool Rewrite(const NodeDef& anchor, RewriteContext* ctx) const override {
    const bool stack = IsOp(&anchor, "Pack");
    if (!IsOp(&anchor, "ConcatV2") && !stack) return false;
    const GraphIndex& g = ctx->index();
    const int n = static_cast<int>(IntAttr(anchor, "N", 0));
    if (n < 2) return false;
    int candidates = 0;
    for (int k = 0; k < n; ++k) candidates += IsOp(Behind(g, anchor, k, nullptr), "CtrVocabEmbedding");
    if (candidates < 2) return false;  // one feature has no copy to save

    std::string why;
    if (!JoinsSideBySide(g, anchor, &why)) return Skip(ctx, anchor, why);
    std::vector<Part> parts;
    int features = 0;
    std::string device;
    for (int k = 0; k < n; ++k) {
      Part part;
      const NodeDef* p = Behind(g, anchor, k, &part.identities);
      if (IsOp(p, "CtrVocabEmbedding") && Takes(ctx, anchor, *p, part.identities, device, &why)) {
        part.feature = p;
        device = p->device();
        ++features;
      } else {
        part = Part{};
        part.dense = anchor.input(k);
      }
      parts.push_back(part);
    }
    if (features < 2) return Skip(ctx, anchor, why.empty() ? "fewer than two features to take over" : why);
    int64_t width = 0;
    if (stack && !CommonWidth(ctx, parts, &width, &why)) return Skip(ctx, anchor, why);
    Edges edges;
    if (!PlanEdges(ctx, anchor, parts, &edges, &why)) return Skip(ctx, anchor, why);
    Fuse(ctx, anchor, parts, features, edges, width);
    return true;
  }

 private:
  // The producer of input k, through Identity nodes (collected when asked).
  static const NodeDef* Behind(const GraphIndex& g, const NodeDef& node, int k,
                               std::vector<const NodeDef*>* identities) {
    int port = 0;
    const NodeDef* p = g.Producer(node, k, &port);
    while (IsOp(p, "Identity") && port == 0) {
      if (identities) identities->push_back(p);
      p = g.Producer(*p, 0, &port);
    }
    return port == 0 ? p : nullptr;
  }

  // A stack ([B, N, D], as FM-family models gather their fields) is the
  // concatenation read as [B, N, D]: every input a feature, every table's
  // width D known and equal, as the Pack needs equal shapes.
  static bool CommonWidth(RewriteContext* ctx, const std::vector<Part>& parts, int64_t* width, std::string* why) {
    for (size_t k = 0; k < parts.size(); ++k) {
      int port = 0;
      const NodeDef* params =
          parts[k].feature ? ctx->index().Producer(*parts[k].feature, 3, &port) : nullptr;
      const int64_t d = params ? ctx->Dim(*params, port, 1) : -1;
      if (d <= 0 || (k > 0 && d != *width)) {
        *why = "input " + std::to_string(k) + " of the stack is not a feature of the others' known width";
        return false;
      }
      *width = d;
    }
    return true;
  }

  // The rank of input `i` of `node`: a Reshape to a constant shape (how
  // vocab_lookup flattens Keras' [B, 1] keys) has that shape's length;
  // otherwise what shape inference knows (the fused op's own output took
  // the gather's name, whose recorded shape predates the flatten).
  static int InputRank(RewriteContext* ctx, const NodeDef& node, int i) {
    int port = 0;
    const NodeDef* in = ctx->index().Producer(node, i, &port);
    std::vector<int64_t> shape;
    if (IsOp(in, "Reshape") && ConstIntVector(ctx->index().Producer(*in, 1), &shape))
      return static_cast<int>(shape.size());
    return in == nullptr ? -1 : ctx->Rank(*in, port);
  }

  // Who else reads `emb` (any output) than `concat`, for a skip reason: the
  // first two readers, or the caller.
  static std::string OtherReaders(const GraphIndex& g, const NodeDef& emb, const NodeDef& concat) {
    std::vector<std::string> names;
    int others = 0;
    for (int port : {0, 1})
      for (const auto& [reader, input] : g.PortReaders(emb.name(), port)) {
        if (reader == &concat) continue;
        if (++others <= 2) names.push_back(Describe(*reader));
      }
    if (others == 0) return "the caller fetches it";
    std::string out = names[0];
    if (names.size() > 1) out += ", " + names[1];
    if (others > 2) out += " and " + std::to_string(others - 2) + " more";
    return out;
  }

  // Whether the concatenation may take `emb` over; `why` says why not (the first reason).
  static bool Takes(RewriteContext* ctx, const NodeDef& concat, const NodeDef& emb,
                    const std::vector<const NodeDef*>& identities, const std::string& device, std::string* why) {
    const GraphIndex& g = ctx->index();
    std::string reason;
    for (const NodeDef* id : identities)
      if (g.DataConsumers(id->name()) != 1 || g.ControlConsumers(id->name()) != 0 || ctx->MustKeep(id->name()))
        reason = Describe(*id) + " is read by another node";
    if (!reason.empty()) {
    } else if (g.Consumers(emb.name(), 0) != 1 || g.Consumers(emb.name(), 1) != 0) {
      reason = "another node reads " + Describe(emb) + " or its rows (a gradient): " + OtherReaders(g, emb, concat);
    } else if (ctx->MustKeep(emb.name())) {
      // What waits on it (automatic control dependencies) waits on the fused op.
      reason = Describe(emb) + " is fetched or preserved";
    } else if (TypeAttr(emb, "T") != TypeAttr(concat, "T")) {
      reason = Describe(emb) + " has another dtype";
    } else if (InputRank(ctx, emb, 1) != 1 || InputRank(ctx, emb, 3) != 2) {
      reason = Describe(emb) + " is not [B] keys into a [V, D] table";
    } else if (!device.empty() && emb.device() != device) {
      reason = Describe(emb) + " is placed on another device";
    } else {
      return true;
    }
    if (why->empty()) *why = reason;
    VLOG(2) << "CtrFusionOptimizer: " << concat.name() << " copies " << Describe(emb) << " in: " << reason;
    return false;
  }

  // The control edges of the merged nodes. Keras chains every Assert of a
  // function in program order (automatic control dependencies), and the
  // vocab_lookup pattern made each fused lookup wait where its Assert
  // waited: so a feature the concatenation does not take (a multi-hot
  // lookup's check, say) can wait on one feature and feed another, or a
  // dense input. Merging the features into one node would then close a
  // cycle; such a waiting Assert waits instead on what the feature waited on,
  // which only frees the order in which the checks of different features run.
  // A waiting node of any other kind keeps the features apart.
  struct Edges {
    std::set<std::string> members;  // the merged nodes (features, their identities, the concatenation)
    std::vector<std::string> controls;  // what the fused op waits on
    std::vector<std::pair<std::string, std::string>> bypass;  // (Assert, feature it waited on)
  };

  static void ExternalControls(const GraphIndex& g, const NodeDef& node, const std::set<std::string>& members,
                               std::set<std::string>* seen, std::vector<std::string>* out) {
    for (const std::string& in : node.input()) {
      if (in.empty() || in[0] != '^' || !seen->insert(in).second) continue;
      const std::string name = in.substr(1);
      const NodeDef* producer = g.Node(name);
      if (!members.count(name)) {
        out->push_back(in);
      } else if (producer != nullptr) {
        ExternalControls(g, *producer, members, seen, out);
      }
    }
  }


  static bool PlanEdges(RewriteContext* ctx, const NodeDef& concat, const std::vector<Part>& parts, Edges* edges,
                        std::string* why) {
    const GraphIndex& g = ctx->index();
    std::vector<const NodeDef*> merged = {&concat};
    for (const Part& p : parts)
      if (p.feature != nullptr) {
        merged.insert(merged.end(), p.identities.begin(), p.identities.end());
        merged.push_back(p.feature);
      }
    for (const NodeDef* n : merged) edges->members.insert(n->name());
    std::set<std::string> seen;
    for (const NodeDef* n : merged) ExternalControls(g, *n, edges->members, &seen, &edges->controls);
    std::vector<std::string> roots = edges->controls;
    for (const Part& p : parts) {
      if (p.feature == nullptr) roots.push_back(p.dense);
      for (int i = 0; p.feature != nullptr && i < 4; ++i) roots.push_back(p.feature->input(i));
    }
    const std::set<std::string> upstream = Ancestors(g, roots);
    for (const NodeDef* n : merged) {
      if (n == &concat) continue;
      for (const NodeDef* reader : g.ControlReaders(n->name())) {
        if (edges->members.count(reader->name()) || !upstream.count(reader->name())) continue;
        if (!IsOp(reader, "Assert")) {
          *why = Describe(*reader) + " waits on " + Describe(*n) + " and feeds the concatenation: merging would "
                 "order it both before and after the fused op";
          return false;
        }
        edges->bypass.emplace_back(reader->name(), n->name());
      }
    }
    return true;
  }

  // The bypassed Assert waits on what the feature waited on (its external controls).
  static void Bypass(RewriteContext* ctx, const Edges& edges) {
    for (const auto& [reader_name, waited] : edges.bypass) {
      std::vector<std::string> instead;
      std::set<std::string> seen;
      ExternalControls(ctx->index(), *ctx->index().Node(waited), edges.members, &seen, &instead);
      NodeDef* reader = ctx->Mutable(reader_name);
      auto* inputs = reader->mutable_input();
      for (int i = 0; i < inputs->size(); ++i)
        if (inputs->Get(i) == "^" + waited) inputs->DeleteSubrange(i--, 1);
      AddControlInputsOnce(instead, reader);
    }
  }

  // Each feature's Keras mask (its inputs 4 and 5) and OOV slots, in the
  // grouped op's inputs and attrs.
  static void AddKeyRules(const std::vector<const NodeDef*>& taken, NodeDef* op) {
    auto& attr = *op->mutable_attr();
    std::vector<std::string> ids;
    bool any_slots = false;
    for (size_t i = 0; i < taken.size(); ++i) {
      any_slots |= IntAttr(*taken[i], "oov_slots", 0) > 0;
      if (IntAttr(*taken[i], "num_masks", 0) == 0) continue;
      op->add_input(taken[i]->input(4));
      ids.push_back(taken[i]->input(5));
      attr["masked_features"].mutable_list()->add_i(static_cast<int64_t>(i));
      attr["Tmasks"].mutable_list()->add_type(TypeAttr(*taken[i], "Tkey"));
    }
    for (const std::string& id : ids) op->add_input(id);
    attr["num_masked"].set_i(static_cast<int64_t>(ids.size()));
    for (const char* name : {"Tmasks", "masked_features", "oov_slots", "oov_ids", "oov_starts"})
      attr[name].mutable_list();  // present, if empty
    if (!any_slots) return;
    for (const NodeDef* f : taken) {
      attr["oov_slots"].mutable_list()->add_i(IntAttr(*f, "oov_slots", 0));
      attr["oov_ids"].mutable_list()->add_i(IntAttr(*f, "oov_id", -1));
      attr["oov_starts"].mutable_list()->add_i(IntAttr(*f, "oov_start", 0));
    }
  }

  // stack_width > 0: the anchor is a Pack of [B, stack_width] features, and
  // the fused op's output is reshaped to [-1, N, stack_width].
  static void Fuse(RewriteContext* ctx, const NodeDef& concat_in, const std::vector<Part>& parts, int features,
                   const Edges& edges, int64_t stack_width) {
    const NodeDef concat = concat_in;  // a copy: the graph changes under the index
    MatchRecord record{kName, "", kFusedOp, {}};
    std::vector<const NodeDef*> taken, removed;
    for (const Part& p : parts)
      if (p.feature != nullptr) {
        taken.push_back(p.feature);
        removed.insert(removed.end(), p.identities.begin(), p.identities.end());
        removed.push_back(p.feature);
      }
    std::vector<std::string> controls = edges.controls;
    if (const NodeDef* axis_const = stack_width > 0 ? nullptr : AxisConstOnlyFor(ctx, concat)) {
      removed.push_back(axis_const);
      AppendControlInputs(*axis_const, &controls);
    }
    Bypass(ctx, edges);

    NodeDef* op = ctx->AddNode(concat.name() + "/ctr_concat_vocab", kFusedOp, taken[0]->device());
    for (int input = 0; input < 4; ++input)
      for (const NodeDef* f : taken) op->add_input(f->input(input));
    auto& attr = *op->mutable_attr();
    int dense = 0;
    for (const Part& p : parts)
      if (p.feature == nullptr) {
        op->add_input(p.dense);
        ++dense;
      }
    attr["N"].set_i(features);
    attr["M"].set_i(dense);
    attr["T"] = concat.attr().at("T");
    int next_feature = 0, next_dense = features;
    for (const Part& p : parts) attr["layout"].mutable_list()->add_i(p.feature ? next_feature++ : next_dense++);
    for (const NodeDef* f : taken) {
      attr["Tkeys"].mutable_list()->add_type(TypeAttr(*f, "Tkey"));
      attr["missing_keys"].mutable_list()->add_s(StringAttr(*f, "missing_key"));
      attr["missing_ids"].mutable_list()->add_i(IntAttr(*f, "missing_id", -1));
      attr["wrap_negative_ids"].mutable_list()->add_b(BoolAttr(*f, "wrap_negative_ids", false));
    }
    AddKeyRules(taken, op);
    AddControlInputsOnce(controls, op);
    const std::string op_name = op->name();
    record.fused_node = op_name;
    for (const NodeDef* r : removed) {
      record.replaced.push_back(Describe(*r));
      ctx->RedirectControlEdges(r->name(), op_name);
      ctx->Remove(r->name(), op_name);
    }
    record.replaced.push_back(Describe(concat));
    std::string output = TensorName(op_name, 0);
    if (stack_width > 0)
      output = ReshapeToStack(ctx, concat.name(), output, static_cast<int64_t>(parts.size()), stack_width,
                              concat.attr().at("T"), taken[0]->device());
    HandOver(ctx, concat, output, op_name);
    VLOG(1) << "CtrFusionOptimizer: concatenated " << features << " vocabulary embeddings and " << dense
            << " other inputs into " << op_name;
    ctx->Matched(record);
  }
};

REGISTER_CTR_FUSION_PATTERN(ConcatVocabPattern);

}  // namespace
}  // namespace grappler
}  // namespace tf_ctr

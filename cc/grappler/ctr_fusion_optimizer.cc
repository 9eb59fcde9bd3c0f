// CtrFusionOptimizer: a Grappler custom optimizer that replaces TF-native CTR
// subgraphs with the fused tf-ctr-ops ops. It runs every registered pattern
// (cc/grappler/pattern_*.cc) over the graph; a subgraph whose semantics the
// fused op would not reproduce exactly is left alone, with the reason logged
// at VLOG(1) and written to the report file when one is configured
// (parameter_map["report_file"], JSON lines). parameter_map["serving_device"]
// ("cpu" or "gpu"; absent: either) says where the rewritten graph will run,
// for the patterns whose best form depends on it. parameter_map
// ["disabled_patterns"] (pattern names, comma-separated) switches patterns
// off: offline rewriting drops a pattern whose result failed verification.
#include <algorithm>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "cc/grappler/fusion_stats.h"
#include "cc/grappler/pattern.h"
#include "tensorflow/core/grappler/costs/graph_properties.h"
#include "tensorflow/core/grappler/grappler_item.h"
#include "tensorflow/core/grappler/optimizers/custom_graph_optimizer.h"
#include "tensorflow/core/grappler/optimizers/custom_graph_optimizer_registry.h"
#include "tensorflow/core/grappler/utils/frame.h"
#include "tensorflow/core/platform/env.h"
#include "tensorflow/core/platform/errors.h"
#include "tensorflow/core/platform/logging.h"
#include "tensorflow/core/protobuf/rewriter_config.pb.h"

namespace tf_ctr {
namespace grappler {

FusionStats& GlobalFusionStats() {
  static FusionStats* stats = new FusionStats();
  return *stats;
}

namespace {

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string MatchJson(const MatchRecord& m) {
  std::string replaced = "[";
  for (size_t i = 0; i < m.replaced.size(); ++i) replaced += (i ? ", " : "") + JsonString(m.replaced[i]);
  return "{\"kind\": \"match\", \"pattern\": " + JsonString(m.pattern) + ", \"fused_node\": " +
         JsonString(m.fused_node) + ", \"fused_op\": " + JsonString(m.fused_op) + ", \"replaced\": " + replaced + "]}";
}

std::string SkipJson(const SkipRecord& s) {
  return "{\"kind\": \"skip\", \"pattern\": " + JsonString(s.pattern) + ", \"node\": " + JsonString(s.node) +
         ", \"reason\": " + JsonString(s.reason) + "}";
}

// The nodes inside while loops of frame-based control flow (Enter ... Exit:
// TF1 loops, and functional loops once lowered, as TF runs tf.functions).
// A node a pattern adds takes no input from the loop's Enter nodes, so TF
// would put it in the outer frame and refuse the graph ("has inputs from
// different frames"): loop bodies are left alone. In a graph with loops
// whose frames cannot be inferred, every node counts as in one.
std::set<std::string> NodesInLoops(const tensorflow::GraphDef& graph) {
  std::set<std::string> names;
  const bool has_loops = std::any_of(graph.node().begin(), graph.node().end(), [](const tensorflow::NodeDef& n) {
    return n.op() == "Enter" || n.op() == "RefEnter";
  });
  if (!has_loops) return names;
  tensorflow::grappler::FrameView frames;
  const bool inferred = frames.InferFromGraph(graph).ok();
  for (const auto& n : graph.node())
    if (!inferred || frames.IsInFrame(n)) names.insert(n.name());
  return names;
}

// The first node whose output the run feeds that is not a graph input (a
// TF1 session may feed any tensor), or "". A fused op computes what it
// absorbs from the subgraph's own inputs, so it would compute such a tensor
// again and never read the fed value; and a fed node absorbed would be left
// without the outputs the feed needs.
std::string FedComputedNode(const tensorflow::GraphDef& graph, const std::set<std::string>& fed) {
  static const std::set<std::string> kInputs = {"Placeholder", "PlaceholderV2", "PlaceholderWithDefault", "_Arg"};
  for (const auto& n : graph.node())
    if (fed.count(n.name()) && !kInputs.count(n.op())) return n.name();
  return "";
}

class CtrFusionOptimizer : public tensorflow::grappler::CustomGraphOptimizer {
 public:
  std::string name() const override { return "CtrFusionOptimizer"; }
  bool UsesFunctionLibrary() const override { return false; }

  absl::Status Init(const tensorflow::RewriterConfig_CustomGraphOptimizer* config) override {
    // An instance may be configured again: nothing carries over.
    report_file_.clear();
    serving_device_.clear();
    disabled_.clear();
    if (config != nullptr) {
      auto it = config->parameter_map().find("report_file");
      if (it != config->parameter_map().end()) report_file_ = it->second.s();
      auto disabled = config->parameter_map().find("disabled_patterns");
      if (disabled != config->parameter_map().end()) {
        for (absl::string_view name : absl::StrSplit(disabled->second.s(), ',', absl::SkipEmpty()))
          disabled_.insert(std::string(name));
      }
      auto device = config->parameter_map().find("serving_device");
      if (device != config->parameter_map().end()) {
        const std::string& d = device->second.s();
        if (d == "cpu" || d == "CPU") serving_device_ = "CPU";
        else if (d == "gpu" || d == "GPU") serving_device_ = "GPU";
        else if (!d.empty())
          return tensorflow::errors::InvalidArgument("CtrFusionOptimizer: serving_device must be 'cpu', 'gpu' or "
                                                     "empty, got '", d, "'");
      }
    }
    return absl::OkStatus();
  }

  absl::Status Optimize(tensorflow::grappler::Cluster* cluster, const tensorflow::grappler::GrapplerItem& item,
                        tensorflow::GraphDef* optimized) override {
    const uint64_t t_start = tensorflow::Env::Default()->NowMicros();
    *optimized = item.graph;
    std::optional<tensorflow::grappler::GrapplerItem> defaults_fed;
    if (HasDefaultedInputs(item.graph)) defaults_fed = WithDefaultsAsPlaceholders(item);
    tensorflow::grappler::GraphProperties properties(defaults_fed ? *defaults_fed : item);
    // Feeds are taken to match their placeholders' declared shapes, as a
    // Python call checks (GuardFeedShapes holds a server's feeds to them).
    // Without shapes, patterns that need them skip with a reason.
    const absl::Status shapes_status = properties.InferStatically(
        /*assume_valid_feeds=*/true, /*aggressive_shape_inference=*/false,
        /*include_input_tensor_values=*/false, /*include_output_tensor_values=*/false);
    if (!shapes_status.ok()) VLOG(1) << "CtrFusionOptimizer: no static shapes for " << item.id << ": " << shapes_status;
    const bool have_shapes = shapes_status.ok();
    VLOG(2) << "CtrFusionOptimizer: shapes " << (tensorflow::Env::Default()->NowMicros() - t_start) / 1000 << " ms";
    const auto& keep = item.NodesToPreserve();
    RewriteContext ctx(optimized, item.fetch, std::set<std::string>(keep.begin(), keep.end()),
                       have_shapes ? &properties : nullptr);
    std::set<std::string> fed;
    for (const auto& feed : item.feed) fed.insert(ParseTensorName(feed.first).node);
    const std::string fed_computed = FedComputedNode(item.graph, fed);
    if (!fed_computed.empty()) {
      ctx.Skipped("all", fed_computed,
                  "the run feeds " + fed_computed + ", a computed tensor: the graph is left alone, as a fused op "
                  "would compute it again instead of reading the fed value");
      Report(item.id, ctx);
      return absl::OkStatus();
    }
    ctx.SetFed(std::move(fed));
    ctx.SetServingDevice(serving_device_);
    ctx.SetDisabledPatterns(disabled_);
    const std::set<std::string> in_loops = NodesInLoops(item.graph);
    // Patterns build on each other's output (a fused lookup can absorb its
    // string producers next), so passes repeat until nothing changes; the
    // patterns that combine fused ops (grouping, then concatenation) run once
    // the earlier stages are done, and the choice of forms for the serving
    // device last.
    constexpr int kMaxPasses = 8, kStages = 4;
    for (int pass = 0; pass < kMaxPasses; ++pass) {
      bool changed = false;
      for (int stage = 0; stage < kStages && (!changed || pass == kMaxPasses - 1); ++stage)
        changed |= RunPatterns(stage, disabled_, in_loops, optimized, &ctx);
      if (!changed || pass == kMaxPasses - 1) break;
      ctx.ForgetSkips();  // a later pass re-examines them with the new graph
    }
    if (!in_loops.empty())
      ctx.Skipped("all", *in_loops.begin(),
                  std::to_string(in_loops.size()) + " nodes inside while loops (Enter/Exit frames) left alone: "
                  "a fused op added there would run outside the loop's frame");
    VLOG(2) << "CtrFusionOptimizer: patterns done " << (tensorflow::Env::Default()->NowMicros() - t_start) / 1000 << " ms";
    if (have_shapes && !ctx.matches().empty()) GuardFeedShapes(&ctx);
    ctx.DropStaleShapes();
    if (FullyPlaced(item.graph)) PlaceAddedNodes(optimized);
    Report(item.id, ctx);
    VLOG(2) << "CtrFusionOptimizer: total " << (tensorflow::Env::Default()->NowMicros() - t_start) / 1000 << " ms";
    return absl::OkStatus();
  }

 private:
  // A TF1 session's graph reaches Grappler placed, every node on a device,
  // and the passes after it require that of the nodes added too (an empty
  // device fails the session's run with an InternalError).
  static bool FullyPlaced(const tensorflow::GraphDef& graph) {
    for (const auto& n : graph.node())
      if (n.device().empty()) return false;
    return graph.node_size() > 0;
  }

  // Gives each node the patterns added without a device (a pack, which
  // belongs beside its strings, and the shapes read from them) the device of
  // its first placed input's producer or, failing that, of a placed reader.
  static void PlaceAddedNodes(tensorflow::GraphDef* graph) {
    std::map<std::string, tensorflow::NodeDef*> by_name;
    for (auto& n : *graph->mutable_node()) by_name[n.name()] = &n;
    auto producer = [&](const std::string& input) -> tensorflow::NodeDef* {
      std::string name = input[0] == '^' ? input.substr(1) : input;
      name = name.substr(0, name.find(':'));
      auto it = by_name.find(name);
      return it == by_name.end() ? nullptr : it->second;
    };
    for (bool changed = true; changed;) {
      changed = false;
      for (auto& n : *graph->mutable_node()) {
        if (!n.device().empty()) continue;
        for (const std::string& in : n.input()) {
          const tensorflow::NodeDef* p = producer(in);
          if (in[0] != '^' && p != nullptr && !p->device().empty()) {
            n.set_device(p->device());
            changed = true;
            break;
          }
        }
      }
      for (const auto& n : graph->node()) {
        if (n.device().empty()) continue;
        for (const std::string& in : n.input()) {
          tensorflow::NodeDef* p = producer(in);
          if (p != nullptr && p->device().empty()) {
            p->set_device(n.device());
            changed = true;
          }
        }
      }
    }
  }

  // The item whose shapes the patterns read: a PlaceholderWithDefault
  // becomes the Placeholder it is to a feed, of its declared shape (inference
  // gives it its default value's, [2] for a default of two ids, which a feed
  // need not have).
  static bool HasDefaultedInputs(const tensorflow::GraphDef& graph) {
    for (const auto& n : graph.node())
      if (n.op() == "PlaceholderWithDefault") return true;
    return false;
  }

  static tensorflow::grappler::GrapplerItem WithDefaultsAsPlaceholders(const tensorflow::grappler::GrapplerItem& item) {
    tensorflow::grappler::GrapplerItem copy = item;
    for (auto& n : *copy.graph.mutable_node()) {
      if (n.op() != "PlaceholderWithDefault") continue;
      n.set_op("Placeholder");
      n.clear_input();
    }
    return copy;
  }

  // The patterns took the graph inputs' shapes from inference, which trusts
  // feeds to match them; a Python call checks that, but a model server's
  // session feeds tensors by name unchecked. So each input whose rank was
  // known is held to its shape at run time: a feed of another shape fails
  // (EnsureShape's error naming the input) where a fused op would have
  // computed something else than the nodes it replaced.
  static void GuardFeedShapes(RewriteContext* ctx) {
    static const std::set<std::string> kInputs = {"Placeholder", "PlaceholderV2", "PlaceholderWithDefault", "_Arg"};
    std::vector<const tensorflow::NodeDef*> inputs;
    for (const auto* n : ctx->index().nodes())
      if (kInputs.count(n->op())) inputs.push_back(n);
    for (const tensorflow::NodeDef* input : inputs) {
      const std::string name = input->name();
      const tensorflow::DataType dtype = TypeAttr(*input, input->op() == "_Arg" ? "T" : "dtype");
      const int rank = ctx->Rank(*input, 0);
      if (rank < 0 || dtype == tensorflow::DT_RESOURCE || dtype == tensorflow::DT_VARIANT ||
          dtype == tensorflow::DT_INVALID || !NeedsGuard(ctx->index(), name))
        continue;
      tensorflow::NodeDef* guard = ctx->AddNode(name + "/ctr_feed_shape", "EnsureShape", "");
      auto& attr = *guard->mutable_attr();
      attr["T"].set_type(dtype);
      auto* shape = attr["shape"].mutable_shape();
      for (int d = 0; d < rank; ++d) shape->add_dim()->set_size(std::max<int64_t>(ctx->Dim(*input, 0, d), -1));
      const std::string guard_name = guard->name();
      ctx->RedirectDataEdges(name, 0, guard_name);
      ctx->Mutable(guard_name)->add_input(name);
      ctx->Commit();
    }
  }

  // An input read by data edges, not all of them its shape check already (a
  // second run of the optimizer over its own output).
  static bool NeedsGuard(const GraphIndex& g, const std::string& input) {
    for (const tensorflow::NodeDef* reader : g.DataReaders(input))
      if (reader->op() != "EnsureShape") return true;
    return false;
  }

  static bool RunPatterns(int stage, const std::set<std::string>& disabled, const std::set<std::string>& in_loops,
                          tensorflow::GraphDef* graph, RewriteContext* ctx) {
    bool changed = false;
    for (const auto& pattern : RegisteredPatterns()) {
      if (pattern->Stage() != stage || disabled.count(pattern->name())) continue;
      const uint64_t t0 = tensorflow::Env::Default()->NowMicros();
      // Nodes a rewrite removes stay allocated until Compact, so the names
      // are read through them; a name's node may be a replacement by then.
      std::vector<const tensorflow::NodeDef*> nodes;
      nodes.reserve(graph->node_size());
      for (const auto& n : graph->node()) nodes.push_back(&n);
      for (const tensorflow::NodeDef* n : nodes) {
        const tensorflow::NodeDef* node = ctx->index().Node(n->name());
        if (node != nullptr && !in_loops.count(node->name()) && pattern->Rewrite(*node, ctx)) {
          ctx->Commit();
          changed = true;
        }
      }
      ctx->Compact();
      VLOG(2) << "CtrFusionOptimizer: " << pattern->name() << " " << (tensorflow::Env::Default()->NowMicros() - t0) / 1000 << " ms";
    }
    return changed;
  }

  void Report(const std::string& graph_id, const RewriteContext& ctx) {
    FusionStats& stats = GlobalFusionStats();
    ++stats.graphs;
    stats.rewrites += static_cast<int64_t>(ctx.matches().size());
    stats.skips += static_cast<int64_t>(ctx.skips().size());
    for (const auto& s : ctx.skips())
      VLOG(1) << "CtrFusionOptimizer: left " << s.node << " untouched (" << s.pattern << "): " << s.reason;
    for (const auto& m : ctx.matches())
      VLOG(1) << "CtrFusionOptimizer: " << m.pattern << " fused into " << m.fused_node << " (" << m.fused_op << ")";
    if (report_file_.empty()) return;
    std::ofstream out(report_file_, std::ios::app);
    for (const auto& m : ctx.matches()) out << MatchJson(m) << "\n";
    for (const auto& s : ctx.skips()) out << SkipJson(s) << "\n";
    out << "{\"kind\": \"graph\", \"id\": " << JsonString(graph_id) << ", \"matches\": " << ctx.matches().size()
        << ", \"skips\": " << ctx.skips().size() << "}\n";
  }

  std::string report_file_;
  std::string serving_device_;
  std::set<std::string> disabled_;
};

// TF's registrar aborts the process when the name is taken, as it is when a
// second copy of this library loads (an installed wheel beside an in-place
// build); that copy's op registrations then fail with an error instead, and
// the first copy's optimizer serves both.
const bool kRegistered = [] {
  using tensorflow::grappler::CustomGraphOptimizerRegistry;
  const auto names = CustomGraphOptimizerRegistry::GetRegisteredOptimizers();
  if (std::find(names.begin(), names.end(), "CtrFusionOptimizer") != names.end()) return false;
  CustomGraphOptimizerRegistry::RegisterOptimizerOrDie([] { return new CtrFusionOptimizer; }, "CtrFusionOptimizer");
  return true;
}();

}  // namespace

}  // namespace grappler
}  // namespace tf_ctr

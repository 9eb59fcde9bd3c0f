// Offline rewriting of one GraphDef and the library functions it calls, with
// CtrFusionOptimizer alone: what Grappler's meta optimizer does for
// `tf_optimizer.OptimizeGraph` with only this pass configured, without what
// that path costs besides the pass (a cluster with its session, the item
// builder, the meta optimizer's function-library and TFG passes). At 1,000
// features those took about two thirds of the rewrite time.
//
// The item is built as Grappler's item builder builds it from a MetaGraphDef
// whose "train_op" collection names the fetches: the fetches' nodes, recorded
// `_output_shapes` erased (the Python side keeps a copy the optimizer reads)
// and colocation constraints dropped, user placement kept. Function bodies
// become items as Grappler's MakeGrapplerFunctionItem makes them, through
// function_item.h (Grappler's own conversion for the functions it does not
// take, or with TF_CTR_OPS_GRAPPLER_FUNCTION_ITEMS=1, which tests compare it
// with).
//
// Called from Python through ctypes (tf_ctr_ops.rewrite), so it uses a C ABI
// and hands back malloc'd buffers that TfCtrFreeBuffer frees.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "cc/grappler/function_item.h"
#include "tensorflow/core/framework/function.h"
#include "tensorflow/core/framework/function.pb.h"
#include "tensorflow/core/framework/graph.pb.h"
#include "tensorflow/core/framework/graph_def_util.h"
#include "tensorflow/core/graph/validate.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/grappler/grappler_item.h"
#include "tensorflow/core/grappler/optimizers/custom_graph_optimizer.h"
#include "tensorflow/core/grappler/optimizers/custom_graph_optimizer_registry.h"
#include "tensorflow/core/grappler/utils/functions.h"
#include "tensorflow/core/grappler/utils/topological_sort.h"
#include "tensorflow/core/platform/env.h"
#include "tensorflow/core/platform/errors.h"
#include "tensorflow/core/platform/logging.h"
#include "tensorflow/core/protobuf/rewriter_config.pb.h"

namespace tf_ctr {
namespace grappler {
namespace {

using tensorflow::FunctionDef;
using tensorflow::FunctionLibraryDefinition;
using tensorflow::GraphDef;

std::string NodeOfTensor(std::string_view tensor) {
  if (!tensor.empty() && tensor[0] == '^') tensor.remove_prefix(1);
  return std::string(tensor.substr(0, tensor.find(':')));
}

// The library with the functions' signatures only, which the meta optimizer
// gives an optimizer that does not use function bodies: shape inference then
// does not instantiate every function the graph calls.
tensorflow::FunctionDefLibrary SignaturesOnly(const tensorflow::FunctionDefLibrary& library) {
  tensorflow::FunctionDefLibrary stub;
  for (const FunctionDef& f : library.function()) {
    FunctionDef* s = stub.add_function();
    *s->mutable_signature() = f.signature();
    *s->mutable_attr() = f.attr();
    *s->mutable_arg_attr() = f.arg_attr();
    *s->mutable_resource_arg_unique_id() = f.resource_arg_unique_id();
  }
  *stub.mutable_gradient() = library.gradient();
  return stub;
}

tensorflow::grappler::GrapplerItem MainItem(GraphDef graph, const std::vector<std::string>& fetches) {
  tensorflow::grappler::GrapplerItem item;
  item.id = "tf_ctr_ops";
  for (const auto& f : fetches) item.fetch.push_back(NodeOfTensor(f));
  for (auto& node : *graph.mutable_node()) {
    node.mutable_attr()->erase("_output_shapes");
    node.mutable_attr()->erase("_class");
  }
  item.graph = std::move(graph);
  return item;
}

bool UseGrapplerFunctionItems() {
  const char* v = std::getenv("TF_CTR_OPS_GRAPPLER_FUNCTION_ITEMS");
  return v != nullptr && std::string(v) == "1";
}

// `fdef` optimized through Grappler's own function item; false where
// Grappler cannot make an item of it (a parametrized function, typed only by
// its callers), which the meta optimizer leaves as it is.
absl::Status OptimizeWithGrapplerItem(tensorflow::grappler::CustomGraphOptimizer* optimizer, const FunctionDef& fdef,
                                      const FunctionLibraryDefinition& flib, int producer, FunctionDef* optimized,
                                      bool* done) {
  tensorflow::grappler::GrapplerFunctionItem item;
  *done = tensorflow::grappler::MakeGrapplerFunctionItem(fdef, flib, producer, &item).ok();
  if (!*done) return absl::OkStatus();
  item.optimization_options().allow_pruning_stateful_and_dataset_ops = false;
  GraphDef body;
  TF_RETURN_IF_ERROR(optimizer->Optimize(nullptr, item, &body));
  item.SwapFunctionBody(std::move(body));
  return tensorflow::grappler::MakeFunctionDef(item, flib, optimized);
}

absl::Status OptimizeFunction(tensorflow::grappler::CustomGraphOptimizer* optimizer, const FunctionDef& fdef,
                              const FunctionLibraryDefinition& flib, int producer, FunctionDef* optimized,
                              bool* done) {
  tensorflow::grappler::GrapplerItem item;
  FunctionBodyNames names;
  if (UseGrapplerFunctionItems() || !MakeFunctionBodyItem(fdef, flib, producer, &item, &names).ok())
    return OptimizeWithGrapplerItem(optimizer, fdef, flib, producer, optimized, done);
  GraphDef body;
  TF_RETURN_IF_ERROR(optimizer->Optimize(nullptr, item, &body));
  *done = true;
  return FunctionWithBody(fdef, names, flib, &body, optimized);
}

// The functions XLA compiles (tf.function(jit_compile=True)) and those they
// call: the fused ops have no XLA kernels, so these keep TF's ops (online,
// the meta optimizer leaves them alone too). Fused, one would fail to
// compile and cost its pattern the whole model's fallback.
std::set<std::string> CompiledByXla(const FunctionLibraryDefinition& flib, const std::vector<std::string>& names) {
  std::set<std::string> compiled;
  for (const std::string& name : names) {
    const FunctionDef* fdef = flib.Find(name);
    if (fdef == nullptr) continue;
    const auto must = fdef->attr().find("_XlaMustCompile");
    if (must == fdef->attr().end() || !must->second.b()) continue;
    compiled.insert(name);
    for (const std::string& callee : flib.ReachableDefinitions(*fdef).ListFunctionNames()) compiled.insert(callee);
  }
  return compiled;
}

// Optimizes every function `graph` reaches, in place in its library.
absl::Status OptimizeFunctions(tensorflow::grappler::CustomGraphOptimizer* optimizer, GraphDef* graph) {
  FunctionLibraryDefinition flib(tensorflow::OpRegistry::Global(), graph->library());
  const FunctionLibraryDefinition reachable = flib.ReachableDefinitions(*graph);
  std::vector<std::string> names = reachable.ListFunctionNames();
  std::sort(names.begin(), names.end());
  if (names.empty()) return absl::OkStatus();
  const std::set<std::string> compiled = CompiledByXla(flib, names);
  const int producer = graph->versions().producer();
  for (const std::string& name : names) {
    const FunctionDef* fdef = flib.Find(name);
    if (fdef == nullptr || compiled.count(name) > 0) continue;
    const uint64_t start = tensorflow::Env::Default()->NowMicros();
    FunctionDef optimized;
    bool done = false;
    TF_RETURN_IF_ERROR(OptimizeFunction(optimizer, *fdef, flib, producer, &optimized, &done));
    if (done) TF_RETURN_IF_ERROR(flib.ReplaceFunction(name, optimized));
    VLOG(2) << "CtrFusionOptimizer: function " << name << ": " << (tensorflow::Env::Default()->NowMicros() - start) / 1000
            << " ms";
  }
  *graph->mutable_library() = flib.ToProto();
  return absl::OkStatus();
}

// What TF checks before any graph it runs reaches Grappler, and the offline
// path must check itself: a hand-made or edited GraphDef could otherwise
// abort the process in TF's shape inference (duplicate names, a data input
// after a control one, a Const without its value) or send a pattern round an
// Identity cycle forever. Attrs an export stripped at their defaults
// (Estimator exports do) are put back first, as TF's loader does, so the
// patterns read every attr the op defines.
absl::Status CheckAndCompleteGraph(GraphDef* graph) {
  std::set<std::string> names;
  for (const tensorflow::NodeDef& node : graph->node())
    if (!names.insert(node.name()).second)
      return tensorflow::errors::InvalidArgument("the graph has two nodes named ", node.name());
  // Inputs that exist, no cycle but a loop's back edges.
  TF_RETURN_IF_ERROR(tensorflow::grappler::TopologicalSort(graph));
  const tensorflow::FunctionLibraryDefinition ops(tensorflow::OpRegistry::Global(), graph->library());
  TF_RETURN_IF_ERROR(tensorflow::AddDefaultAttrsToGraphDef(graph, ops, 0));
  return tensorflow::graph::ValidateGraphDefAgainstOpRegistry(*graph, ops);
}

absl::Status OptimizeSerialized(const std::string& graph_bytes, const std::string& fetches,
                                const std::string& config_bytes, std::string* out) {
  GraphDef graph;
  if (!graph.ParseFromString(graph_bytes)) return tensorflow::errors::InvalidArgument("not a serialized GraphDef");
  TF_RETURN_IF_ERROR(CheckAndCompleteGraph(&graph));
  tensorflow::RewriterConfig_CustomGraphOptimizer config;
  if (!config.ParseFromString(config_bytes))
    return tensorflow::errors::InvalidArgument("not a serialized RewriterConfig.CustomGraphOptimizer");
  std::unique_ptr<tensorflow::grappler::CustomGraphOptimizer> optimizer =
      tensorflow::grappler::CustomGraphOptimizerRegistry::CreateByNameOrNull("CtrFusionOptimizer");
  if (optimizer == nullptr) return tensorflow::errors::Internal("CtrFusionOptimizer is not registered");
  TF_RETURN_IF_ERROR(optimizer->Init(&config));
  std::vector<std::string> fetch_list = absl::StrSplit(fetches, '\n', absl::SkipEmpty());
  tensorflow::FunctionDefLibrary library;
  library.Swap(graph.mutable_library());
  if (!optimizer->UsesFunctionLibrary()) *graph.mutable_library() = SignaturesOnly(library);
  const tensorflow::grappler::GrapplerItem item = MainItem(std::move(graph), fetch_list);
  GraphDef optimized;
  TF_RETURN_IF_ERROR(optimizer->Optimize(nullptr, item, &optimized));
  optimized.mutable_library()->Swap(&library);  // the pass adds no functions
  TF_RETURN_IF_ERROR(OptimizeFunctions(optimizer.get(), &optimized));
  // The meta optimizer hands back a topologically sorted graph; so does this.
  TF_RETURN_IF_ERROR(tensorflow::grappler::TopologicalSort(&optimized));
  if (!optimized.SerializeToString(out)) return tensorflow::errors::Internal("cannot serialize the GraphDef");
  return absl::OkStatus();
}

char* CopyOut(const std::string& s, size_t* size) {
  char* buf = static_cast<char*>(std::malloc(s.size() + 1));
  if (buf == nullptr) return nullptr;
  std::memcpy(buf, s.data(), s.size());
  buf[s.size()] = '\0';
  if (size) *size = s.size();
  return buf;
}

}  // namespace
}  // namespace grappler
}  // namespace tf_ctr

extern "C" {

// Returns 0 and the optimized GraphDef in *out / *out_size, or 1 and a
// message in *error. Both buffers are freed with TfCtrFreeBuffer.
__attribute__((visibility("default"))) int TfCtrOptimizeGraphDef(const char* graph, size_t graph_size,
                                                                const char* fetches, const char* config,
                                                                size_t config_size, char** out, size_t* out_size,
                                                                char** error) {
  *out = nullptr;
  *error = nullptr;
  std::string result;
  absl::Status status;
  try {
    status = tf_ctr::grappler::OptimizeSerialized(std::string(graph, graph_size), fetches,
                                                  std::string(config, config_size), &result);
  } catch (const std::exception& e) {
    status = tensorflow::errors::Internal("CtrFusionOptimizer: ", e.what());
  }
  if (!status.ok()) {
    *error = tf_ctr::grappler::CopyOut(std::string(status.message()), nullptr);
    return 1;
  }
  *out = tf_ctr::grappler::CopyOut(result, out_size);
  return *out == nullptr ? 1 : 0;
}

__attribute__((visibility("default"))) void TfCtrFreeBuffer(char* buffer) { std::free(buffer); }

}  // extern "C"

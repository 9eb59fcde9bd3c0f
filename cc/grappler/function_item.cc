#include "cc/grappler/function_item.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tensorflow/core/framework/node_def_util.h"
#include "tensorflow/core/framework/op_def.pb.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/graph/tensor_id.h"
#include "tensorflow/core/grappler/utils/topological_sort.h"
#include "tensorflow/core/platform/errors.h"

namespace tf_ctr {
namespace grappler {
namespace {

using tensorflow::FunctionDef;
using tensorflow::FunctionLibraryDefinition;
using tensorflow::GraphDef;
using tensorflow::NodeDef;
using tensorflow::OpDef;

constexpr char kArgOp[] = "_Arg";
constexpr char kRetvalOp[] = "_Retval";

absl::Status Unsupported(const FunctionDef& f, absl::string_view why) {
  return absl::UnimplementedError(absl::StrCat("function ", f.signature().name(), ": ", why));
}

// What a concrete function is: its signature types every argument, and no
// node waits for an attr of its caller.
absl::Status CheckConcrete(const FunctionDef& f) {
  const OpDef& sig = f.signature();
  if (sig.attr_size() > 0) return Unsupported(f, "it is polymorphic (its signature has attrs)");
  for (const auto* args : {&sig.input_arg(), &sig.output_arg()}) {
    for (const OpDef::ArgDef& arg : *args) {
      if (arg.type() == tensorflow::DT_INVALID || !arg.number_attr().empty() || !arg.type_list_attr().empty())
        return Unsupported(f, absl::StrCat("argument ", arg.name(), " is not a single typed tensor"));
    }
  }
  for (const NodeDef& node : f.node_def()) {
    for (const auto& [name, value] : node.attr()) {
      if (value.value_case() == tensorflow::AttrValue::kPlaceholder)
        return Unsupported(f, absl::StrCat("node ", node.name(), " reads attr placeholder ", value.placeholder()));
    }
  }
  return absl::OkStatus();
}

// The output arguments of nodes, as index ranges: per op where no output's
// length depends on the node's attrs (nearly every op), per node otherwise.
class OutputRanges {
 public:
  explicit OutputRanges(const FunctionLibraryDefinition& library) : library_(library) {}

  // The flat output index of `node`'s output argument `arg`, element `k`.
  absl::Status Index(const NodeDef& node, absl::string_view arg, int k, int* index) {
    const tensorflow::NameRangeMap* ranges;
    TF_RETURN_IF_ERROR(Of(node, &ranges));
    const auto it = ranges->find(arg);
    if (it == ranges->end() || k < 0 || it->second.first + k >= it->second.second)
      return absl::InvalidArgumentError(absl::StrCat("node ", node.name(), " (", node.op(), ") has no output ", arg,
                                                     ":", k));
    *index = it->second.first + k;
    return absl::OkStatus();
  }

  // The output argument and element of `node`'s flat output `index`.
  absl::Status Name(const NodeDef& node, int index, std::string* arg, int* k) {
    const tensorflow::NameRangeMap* ranges;
    TF_RETURN_IF_ERROR(Of(node, &ranges));
    for (const auto& [name, range] : *ranges) {
      if (index >= range.first && index < range.second) {
        *arg = std::string(name);
        *k = index - range.first;
        return absl::OkStatus();
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat("node ", node.name(), " (", node.op(), ") has no output ", index));
  }

 private:
  absl::Status Of(const NodeDef& node, const tensorflow::NameRangeMap** ranges) {
    if (auto it = by_node_.find(&node); it != by_node_.end()) {
      *ranges = &it->second;
      return absl::OkStatus();
    }
    if (auto it = by_op_.find(node.op()); it != by_op_.end()) {
      *ranges = &it->second;
      return absl::OkStatus();
    }
    const tensorflow::OpRegistrationData* registration = nullptr;
    TF_RETURN_IF_ERROR(library_.LookUp(node.op(), &registration));
    tensorflow::NameRangeMap computed;
    TF_RETURN_IF_ERROR(tensorflow::NameRangesForNode(node, registration->op_def, nullptr, &computed));
    bool fixed = true;
    for (const OpDef::ArgDef& arg : registration->op_def.output_arg())
      fixed &= arg.number_attr().empty() && arg.type_list_attr().empty();
    auto& slot = fixed ? by_op_[node.op()] : by_node_[&node];
    slot = std::move(computed);
    *ranges = &slot;
    return absl::OkStatus();
  }

  const FunctionLibraryDefinition& library_;
  absl::flat_hash_map<std::string, tensorflow::NameRangeMap> by_op_;
  absl::flat_hash_map<const NodeDef*, tensorflow::NameRangeMap> by_node_;
};

void SetTypeAndIndex(tensorflow::DataType type, int index, NodeDef* node) {
  (*node->mutable_attr())["T"].set_type(type);
  (*node->mutable_attr())["index"].set_i(index);
}

tensorflow::DataType ArgType(const OpDef::ArgDef& arg) {
  return arg.is_ref() ? tensorflow::MakeRefType(arg.type()) : arg.type();
}

// FunctionDef inputs ("arg", "node:output:k", "^node") in GraphDef form.
class BodyInputs {
 public:
  BodyInputs(const FunctionDef& f, const FunctionLibraryDefinition& library) : ranges_(library) {
    for (const auto& arg : f.signature().input_arg()) args_.insert(arg.name());
    for (const NodeDef& node : f.node_def()) nodes_.emplace(node.name(), &node);
  }

  bool IsNode(absl::string_view name) const { return nodes_.contains(name); }
  bool Has(absl::string_view name) const { return args_.contains(name) || IsNode(name); }
  size_t node_count() const { return nodes_.size(); }

  absl::Status Convert(const std::string& input, std::string* out) {
    const std::vector<absl::string_view> parts = absl::StrSplit(input, ':');
    if (absl::StartsWith(input, "^") || (parts.size() == 1 && args_.contains(parts[0]))) {
      *out = input;
      return absl::OkStatus();
    }
    int k = 0, index = 0;
    const auto node = parts.size() == 3 ? nodes_.find(parts[0]) : nodes_.end();
    if (node == nodes_.end() || !absl::SimpleAtoi(parts[2], &k))
      return absl::InvalidArgumentError(absl::StrCat("unknown function input '", input, "'"));
    TF_RETURN_IF_ERROR(ranges_.Index(*node->second, parts[1], k, &index));
    *out = index == 0 ? std::string(parts[0]) : absl::StrCat(parts[0], ":", index);
    return absl::OkStatus();
  }

 private:
  OutputRanges ranges_;
  absl::flat_hash_set<absl::string_view> args_;
  absl::flat_hash_map<absl::string_view, const NodeDef*> nodes_;
};

}  // namespace

absl::Status MakeFunctionBodyItem(const FunctionDef& f, const FunctionLibraryDefinition& library, int producer,
                                  tensorflow::grappler::GrapplerItem* item, FunctionBodyNames* names) {
  TF_RETURN_IF_ERROR(CheckConcrete(f));
  const OpDef& sig = f.signature();
  BodyInputs inputs(f, library);
  if (inputs.node_count() != static_cast<size_t>(f.node_def_size())) return Unsupported(f, "two nodes share a name");
  for (const auto& arg : sig.input_arg()) {
    if (inputs.IsNode(arg.name())) return Unsupported(f, absl::StrCat("argument ", arg.name(), " is also a node's name"));
  }
  GraphDef& graph = item->graph;
  for (int i = 0; i < sig.input_arg_size(); ++i) {
    NodeDef* arg = graph.add_node();
    arg->set_name(sig.input_arg(i).name());
    arg->set_op(kArgOp);
    SetTypeAndIndex(ArgType(sig.input_arg(i)), i, arg);
    if (auto id = f.resource_arg_unique_id().find(i); id != f.resource_arg_unique_id().end())
      (*arg->mutable_attr())["_resource_arg_unique_id"].set_i(id->second);
    if (auto attrs = f.arg_attr().find(i); attrs != f.arg_attr().end())
      for (const auto& [name, value] : attrs->second.attr()) (*arg->mutable_attr())[name] = value;
  }
  // Grappler's conversion goes through a Graph, which fills in default attrs.
  for (const NodeDef& node : f.node_def()) {
    NodeDef* copy = graph.add_node();
    *copy = node;
    for (std::string& input : *copy->mutable_input()) TF_RETURN_IF_ERROR(inputs.Convert(std::string(input), &input));
    const tensorflow::OpRegistrationData* registration = nullptr;
    if (library.LookUp(node.op(), &registration).ok()) tensorflow::AddDefaultsToNodeDef(registration->op_def, copy);
  }
  names->retvals.clear();
  for (int i = 0; i < sig.output_arg_size(); ++i) {
    const auto& out = sig.output_arg(i);
    const auto ret = f.ret().find(out.name());
    if (ret == f.ret().end()) return absl::InvalidArgumentError(absl::StrCat("output ", out.name(), " is not returned"));
    NodeDef* retval = graph.add_node();
    retval->set_name(absl::StrCat(out.name(), "_RetVal"));
    if (inputs.Has(retval->name())) return Unsupported(f, absl::StrCat(retval->name(), " is a node's name"));
    retval->set_op(kRetvalOp);
    TF_RETURN_IF_ERROR(inputs.Convert(ret->second, retval->add_input()));
    SetTypeAndIndex(ArgType(out), i, retval);
    names->retvals.push_back(retval->name());
  }
  TF_RETURN_IF_ERROR(tensorflow::grappler::TopologicalSort(&graph));
  graph.mutable_versions()->set_producer(producer);
  *graph.mutable_library() = library.ReachableDefinitions(f).ToProto();
  item->id = sig.name();
  for (const auto& arg : sig.input_arg()) item->feed.emplace_back(arg.name(), tensorflow::Tensor());
  item->fetch = names->retvals;
  // Control outputs in the order of their names, as Grappler's item keeps them.
  std::map<std::string, std::string> control(f.control_ret().begin(), f.control_ret().end());
  for (const auto& [unused, node] : control) item->keep_ops.push_back(node);
  item->optimization_options().allow_pruning_stateful_and_dataset_ops = false;
  return absl::OkStatus();
}

absl::Status FunctionWithBody(const FunctionDef& f, const FunctionBodyNames& names,
                              const FunctionLibraryDefinition& library, GraphDef* body, FunctionDef* out) {
  const OpDef& sig = f.signature();
  absl::flat_hash_map<absl::string_view, NodeDef*> nodes;
  for (NodeDef& node : *body->mutable_node()) nodes.emplace(node.name(), &node);
  absl::flat_hash_set<absl::string_view> args;
  for (const auto& arg : sig.input_arg()) args.insert(arg.name());
  auto is_arg = [&](const NodeDef& n) { return n.op() == kArgOp && args.contains(n.name()); };
  absl::flat_hash_set<absl::string_view> retvals(names.retvals.begin(), names.retvals.end());
  auto is_retval = [&](const NodeDef& n) { return n.op() == kRetvalOp && retvals.contains(n.name()); };
  OutputRanges ranges(library);
  auto convert = [&](const std::string& input, std::string* converted) -> absl::Status {
    if (absl::StartsWith(input, "^")) {
      *converted = input;
      return absl::OkStatus();
    }
    const tensorflow::TensorId id = tensorflow::ParseTensorName(input);
    const auto source = nodes.find(id.node());
    if (source == nodes.end()) return absl::InvalidArgumentError(absl::StrCat("unknown input '", input, "'"));
    if (is_arg(*source->second)) {
      if (id.index() != 0) return absl::InvalidArgumentError(absl::StrCat("argument output ", input));
      *converted = std::string(id.node());
      return absl::OkStatus();
    }
    std::string arg;
    int k = 0;
    TF_RETURN_IF_ERROR(ranges.Name(*source->second, id.index(), &arg, &k));
    *converted = absl::StrCat(id.node(), ":", arg, ":", k);
    return absl::OkStatus();
  };

  *out->mutable_signature() = sig;
  *out->mutable_attr() = f.attr();
  *out->mutable_arg_attr() = f.arg_attr();
  *out->mutable_resource_arg_unique_id() = f.resource_arg_unique_id();
  *out->mutable_control_ret() = f.control_ret();
  for (int i = 0; i < sig.output_arg_size(); ++i) {
    const auto retval = nodes.find(names.retvals[i]);
    if (retval == nodes.end() || retval->second->input_size() < 1)
      return absl::InternalError(absl::StrCat("the optimized body of ", sig.name(), " lost ", names.retvals[i]));
    TF_RETURN_IF_ERROR(convert(retval->second->input(0), &(*out->mutable_ret())[sig.output_arg(i).name()]));
  }
  // Every input is converted before any node is moved out: a conversion
  // reads the source node's op and attrs.
  for (NodeDef& node : *body->mutable_node()) {
    if (is_arg(node) || is_retval(node)) continue;
    for (std::string& input : *node.mutable_input()) TF_RETURN_IF_ERROR(convert(std::string(input), &input));
  }
  for (NodeDef& node : *body->mutable_node()) {
    if (!is_arg(node) && !is_retval(node)) *out->add_node_def() = std::move(node);
  }
  return absl::OkStatus();
}

}  // namespace grappler
}  // namespace tf_ctr

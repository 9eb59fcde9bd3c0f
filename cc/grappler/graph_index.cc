#include "cc/grappler/graph_index.h"

namespace tf_ctr {
namespace grappler {

namespace {

struct TensorView {
  std::string_view node;
  int port = 0;
};

// ParseTensorName without copies: the index parses every input of every node
// at each rebuild.
TensorView ParseTensorView(std::string_view input) {
  if (!input.empty() && input[0] == '^') return {input.substr(1), -1};
  const size_t colon = input.rfind(':');
  if (colon == std::string_view::npos || colon + 1 == input.size()) return {input, 0};
  int port = 0;
  for (size_t i = colon + 1; i < input.size(); ++i) {
    const char c = input[i];
    if (c < '0' || c > '9' || port > 100000000) return {input, 0};  // not a port: part of the name
    port = port * 10 + (c - '0');
  }
  return {input.substr(0, colon), port};
}

}  // namespace

TensorId ParseTensorName(const std::string& input) {
  const TensorView v = ParseTensorView(input);
  return TensorId{std::string(v.node), v.port};
}

std::string TensorName(const std::string& node, int port) {
  return port == 0 ? node : node + ":" + std::to_string(port);
}

GraphIndex::GraphIndex(const tensorflow::GraphDef& graph, const std::vector<std::string>& fetch) {
  order_.reserve(graph.node_size());
  entries_.reserve(graph.node_size());
  size_t bytes = 0;
  for (const auto& n : graph.node()) bytes += n.name().size();
  names_.reserve(bytes);  // never grows past this: the views below stay valid
  for (const auto& n : graph.node()) {
    const size_t at = names_.size();
    names_ += n.name();
    entries_[std::string_view(names_).substr(at, n.name().size())].node = &n;
    order_.push_back(&n);
  }
  auto count_reader = [&](Entry* e, int port) {
    if (static_cast<int>(e->port_consumers.size()) <= port) e->port_consumers.resize(port + 1, 0);
    ++e->port_consumers[port];
    ++e->data_consumers;
  };
  for (const auto& n : graph.node()) {
    for (const auto& in : n.input()) {
      const TensorView id = ParseTensorView(in);
      auto it = entries_.find(id.node);
      if (it == entries_.end()) continue;  // a dangling input: no node to count it for
      if (id.port < 0) {
        ++it->second.control_consumers;
        continue;
      }
      it->second.readers.push_back(&n);
      count_reader(&it->second, id.port);
    }
  }
  for (const auto& f : fetch) {
    const TensorView id = ParseTensorView(f);
    auto it = entries_.find(id.node);
    if (it != entries_.end()) count_reader(&it->second, id.port < 0 ? 0 : id.port);
  }
}

const GraphIndex::Entry* GraphIndex::Find(std::string_view name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

const tensorflow::NodeDef* GraphIndex::Node(const std::string& name) const {
  const Entry* e = Find(name);
  return e == nullptr ? nullptr : e->node;
}

const tensorflow::NodeDef* GraphIndex::Producer(const tensorflow::NodeDef& node, int i, int* port) const {
  if (i >= node.input_size()) return nullptr;
  const TensorView id = ParseTensorView(node.input(i));
  if (id.port < 0) return nullptr;
  if (port) *port = id.port;
  const Entry* e = Find(id.node);
  return e == nullptr ? nullptr : e->node;
}

int GraphIndex::Consumers(const std::string& node, int port) const {
  const Entry* e = Find(node);
  if (e == nullptr || port < 0 || port >= static_cast<int>(e->port_consumers.size())) return 0;
  return e->port_consumers[port];
}

int GraphIndex::DataConsumers(const std::string& node) const {
  const Entry* e = Find(node);
  return e == nullptr ? 0 : e->data_consumers;
}

const std::vector<const tensorflow::NodeDef*>& GraphIndex::DataReaders(const std::string& node) const {
  static const auto* none = new std::vector<const tensorflow::NodeDef*>();
  const Entry* e = Find(node);
  return e == nullptr ? *none : e->readers;
}

int GraphIndex::ControlConsumers(const std::string& node) const {
  const Entry* e = Find(node);
  return e == nullptr ? 0 : e->control_consumers;
}

}  // namespace grappler
}  // namespace tf_ctr

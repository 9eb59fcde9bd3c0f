#include "cc/grappler/graph_index.h"

namespace tf_ctr {
namespace grappler {

TensorId ParseTensorName(const std::string& input) {
  TensorId id;
  if (!input.empty() && input[0] == '^') {
    id.node = input.substr(1);
    id.port = -1;
    return id;
  }
  const size_t colon = input.rfind(':');
  if (colon != std::string::npos && colon + 1 < input.size() &&
      input.find_first_not_of("0123456789", colon + 1) == std::string::npos) {
    id.node = input.substr(0, colon);
    id.port = std::stoi(input.substr(colon + 1));
  } else {
    id.node = input;
  }
  return id;
}

std::string TensorName(const std::string& node, int port) {
  return port == 0 ? node : node + ":" + std::to_string(port);
}

GraphIndex::GraphIndex(const tensorflow::GraphDef& graph, const std::vector<std::string>& fetch) {
  order_.reserve(graph.node_size());
  for (const auto& n : graph.node()) {
    nodes_[n.name()] = &n;
    order_.push_back(&n);
  }
  for (const auto& n : graph.node()) {
    for (const auto& in : n.input()) {
      const TensorId id = ParseTensorName(in);
      if (id.port < 0) {
        ++control_consumers_[id.node];
        continue;
      }
      readers_[id.node].push_back(&n);
      ++data_consumers_[id.node];
      ++consumers_[TensorName(id.node, id.port)];
    }
  }
  for (const auto& f : fetch) {
    const TensorId id = ParseTensorName(f);
    ++data_consumers_[id.node];
    ++consumers_[TensorName(id.node, id.port < 0 ? 0 : id.port)];
  }
}

const tensorflow::NodeDef* GraphIndex::Node(const std::string& name) const {
  auto it = nodes_.find(name);
  return it == nodes_.end() ? nullptr : it->second;
}

const tensorflow::NodeDef* GraphIndex::Producer(const tensorflow::NodeDef& node, int i, int* port) const {
  if (i >= node.input_size()) return nullptr;
  const TensorId id = ParseTensorName(node.input(i));
  if (id.port < 0) return nullptr;
  if (port) *port = id.port;
  return Node(id.node);
}

int GraphIndex::Consumers(const std::string& node, int port) const {
  auto it = consumers_.find(TensorName(node, port));
  return it == consumers_.end() ? 0 : it->second;
}

int GraphIndex::DataConsumers(const std::string& node) const {
  auto it = data_consumers_.find(node);
  return it == data_consumers_.end() ? 0 : it->second;
}

const std::vector<const tensorflow::NodeDef*>& GraphIndex::DataReaders(const std::string& node) const {
  static const auto* none = new std::vector<const tensorflow::NodeDef*>();
  auto it = readers_.find(node);
  return it == readers_.end() ? *none : it->second;
}

int GraphIndex::ControlConsumers(const std::string& node) const {
  auto it = control_consumers_.find(node);
  return it == control_consumers_.end() ? 0 : it->second;
}

}  // namespace grappler
}  // namespace tf_ctr

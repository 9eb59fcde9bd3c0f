#include "cc/grappler/graph_index.h"

#include <algorithm>
#include <set>
#include <sstream>
#include <unordered_set>

namespace tf_ctr {
namespace grappler {

namespace {

struct TensorView {
  std::string_view node;
  int port = 0;
};

// ParseTensorName without copies: the index parses every input it counts.
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

void Drop(std::vector<const tensorflow::NodeDef*>* readers, const tensorflow::NodeDef* reader) {
  // Removes one occurrence: a node reading twice was counted twice.
  auto it = std::find(readers->begin(), readers->end(), reader);
  if (it != readers->end()) readers->erase(it);
}

}  // namespace

TensorId ParseTensorName(const std::string& input) {
  const TensorView v = ParseTensorView(input);
  return TensorId{std::string(v.node), v.port};
}

std::string TensorName(const std::string& node, int port) {
  return port == 0 ? node : node + ":" + std::to_string(port);
}

GraphIndex::GraphIndex(const tensorflow::GraphDef& graph, const std::vector<std::string>& fetch) : graph_(graph) {
  for (const auto& f : fetch) {
    const TensorView id = ParseTensorView(f);
    fetched_[std::string(id.node)].push_back(id.port < 0 ? 0 : id.port);
  }
  entries_.reserve(graph.node_size());
  std::vector<Entry*> all;
  all.reserve(graph.node_size());
  for (const auto& n : graph.node()) all.push_back(AddEntry(&n));
  for (Entry* e : all) Link(e);
}

GraphIndex::Entry* GraphIndex::AddEntry(const tensorflow::NodeDef* node) {
  Entry& e = entries_[node->name()];
  e = Entry();
  e.node = node;
  auto f = fetched_.find(node->name());
  if (f != fetched_.end()) {
    for (int port : f->second) {
      if (static_cast<int>(e.port_consumers.size()) <= port) e.port_consumers.resize(port + 1, 0);
      ++e.port_consumers[port];
      ++e.data_consumers;
    }
  }
  order_valid_ = false;
  return &e;
}

void GraphIndex::LinkInput(const tensorflow::NodeDef* reader, const Input& in) {
  auto it = entries_.find(in.node);
  if (it == entries_.end()) return;  // a dangling input: no node to count it for
  Entry& producer = it->second;
  if (in.port < 0) {
    producer.control_readers.push_back(reader);
    return;
  }
  producer.readers.push_back(reader);
  if (static_cast<int>(producer.port_consumers.size()) <= in.port) producer.port_consumers.resize(in.port + 1, 0);
  ++producer.port_consumers[in.port];
  ++producer.data_consumers;
}

void GraphIndex::UnlinkInput(const tensorflow::NodeDef* reader, const Input& in) {
  auto it = entries_.find(in.node);
  if (it == entries_.end()) return;
  Entry& producer = it->second;
  if (in.port < 0) {
    Drop(&producer.control_readers, reader);
    return;
  }
  Drop(&producer.readers, reader);
  if (in.port < static_cast<int>(producer.port_consumers.size())) --producer.port_consumers[in.port];
  --producer.data_consumers;
}

void GraphIndex::Link(Entry* reader) {
  reader->inputs.clear();
  reader->inputs.reserve(reader->node->input_size());
  for (const auto& in : reader->node->input()) {
    const TensorView id = ParseTensorView(in);
    reader->inputs.push_back(Input{std::string(id.node), id.port});
    LinkInput(reader->node, reader->inputs.back());
  }
}

void GraphIndex::Unlink(Entry* reader) {
  for (const Input& in : reader->inputs) UnlinkInput(reader->node, in);
  reader->inputs.clear();
}

void GraphIndex::Relink(Entry* reader) {
  const auto& inputs = reader->node->input();
  if (static_cast<int>(reader->inputs.size()) != inputs.size()) {
    Unlink(reader);
    Link(reader);
    return;
  }
  for (int i = 0; i < inputs.size(); ++i) {
    const TensorView id = ParseTensorView(inputs.Get(i));
    Input& old = reader->inputs[i];
    if (old.port == id.port && old.node == id.node) continue;
    UnlinkInput(reader->node, old);
    old = Input{std::string(id.node), id.port};
    LinkInput(reader->node, old);
  }
}

void GraphIndex::Update(const std::vector<const tensorflow::NodeDef*>& removed,
                        const std::vector<const tensorflow::NodeDef*>& added,
                        const std::vector<const tensorflow::NodeDef*>& changed) {
  for (const tensorflow::NodeDef* n : removed) {
    auto it = entries_.find(n->name());
    if (it == entries_.end() || it->second.node != n) continue;
    Unlink(&it->second);
    entries_.erase(it);
  }
  // Added nodes get entries first: a changed node may now read one.
  std::vector<Entry*> linked;
  for (const tensorflow::NodeDef* n : added) linked.push_back(AddEntry(n));
  for (const tensorflow::NodeDef* n : changed) {
    auto it = entries_.find(n->name());
    if (it != entries_.end()) Relink(&it->second);
  }
  for (Entry* e : linked) Link(e);
  order_valid_ = false;
}

const std::vector<const tensorflow::NodeDef*>& GraphIndex::nodes() const {
  if (!order_valid_) {
    order_.clear();
    order_.reserve(entries_.size());
    for (const auto& n : graph_.node()) {
      const Entry* e = Find(n.name());
      if (e != nullptr && e->node == &n) order_.push_back(&n);
    }
    order_valid_ = true;
  }
  return order_;
}

const GraphIndex::Entry* GraphIndex::Find(std::string_view name) const {
  // Heterogeneous lookup is C++20; node names are short, so one copy is cheap.
  auto it = entries_.find(std::string(name));
  return it == entries_.end() ? nullptr : &it->second;
}

const tensorflow::NodeDef* GraphIndex::Node(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : it->second.node;
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
  auto it = entries_.find(node);
  if (it == entries_.end() || port < 0 || port >= static_cast<int>(it->second.port_consumers.size())) return 0;
  return it->second.port_consumers[port];
}

int GraphIndex::DataConsumers(const std::string& node) const {
  auto it = entries_.find(node);
  return it == entries_.end() ? 0 : it->second.data_consumers;
}

const std::vector<const tensorflow::NodeDef*>& GraphIndex::DataReaders(const std::string& node) const {
  static const auto* none = new std::vector<const tensorflow::NodeDef*>();
  auto it = entries_.find(node);
  return it == entries_.end() ? *none : it->second.readers;
}

const std::vector<const tensorflow::NodeDef*>& GraphIndex::ControlReaders(const std::string& node) const {
  static const auto* none = new std::vector<const tensorflow::NodeDef*>();
  auto it = entries_.find(node);
  return it == entries_.end() ? *none : it->second.control_readers;
}

std::vector<std::pair<const tensorflow::NodeDef*, int>> GraphIndex::PortReaders(const std::string& node,
                                                                                 int port) const {
  std::vector<std::pair<const tensorflow::NodeDef*, int>> out;
  std::unordered_set<const tensorflow::NodeDef*> seen;  // a reader of several inputs is listed once per edge
  for (const tensorflow::NodeDef* r : DataReaders(node)) {
    if (!seen.insert(r).second) continue;
    for (int i = 0; i < r->input_size(); ++i) {
      const TensorId id = ParseTensorName(r->input(i));
      if (id.node == node && id.port == port) out.emplace_back(r, i);
    }
  }
  return out;
}

int GraphIndex::ControlConsumers(const std::string& node) const {
  auto it = entries_.find(node);
  return it == entries_.end() ? 0 : static_cast<int>(it->second.control_readers.size());
}

std::string GraphIndex::Difference(const GraphIndex& other) const {
  std::ostringstream out;
  if (entries_.size() != other.entries_.size())
    out << "nodes " << entries_.size() << " vs " << other.entries_.size() << "; ";
  auto names = [](const std::vector<const tensorflow::NodeDef*>& v) {
    std::multiset<std::string> s;
    for (const auto* n : v) s.insert(n->name());
    return s;
  };
  for (const auto& [name, e] : entries_) {
    auto it = other.entries_.find(name);
    if (it == other.entries_.end()) {
      out << name << " only here; ";
      continue;
    }
    const Entry& o = it->second;
    std::vector<int> a = e.port_consumers, b = o.port_consumers;
    while (!a.empty() && a.back() == 0) a.pop_back();
    while (!b.empty() && b.back() == 0) b.pop_back();
    if (e.node->name() != o.node->name() || e.node->op() != o.node->op() || a != b || e.data_consumers != o.data_consumers ||
        names(e.readers) != names(o.readers) || names(e.control_readers) != names(o.control_readers))
      out << name << " differs; ";
  }
  return out.str();
}

}  // namespace grappler
}  // namespace tf_ctr

// A small read-only index over a GraphDef for pattern matching: nodes by
// name, the producer of each data input, and how many consumers each output
// has (fetches and control edges count, so a fused intermediate that anything
// else reads is never removed).
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tensorflow/core/framework/graph.pb.h"
#include "tensorflow/core/framework/node_def.pb.h"

namespace tf_ctr {
namespace grappler {

// "name:port" / "name" / "^name" split into node name and port (-1: control).
struct TensorId {
  std::string node;
  int port = 0;
};
TensorId ParseTensorName(const std::string& input);
std::string TensorName(const std::string& node, int port);

class GraphIndex {
 public:
  // The index points into `graph` (node names included): it is rebuilt
  // whenever nodes are added or removed.
  GraphIndex(const tensorflow::GraphDef& graph, const std::vector<std::string>& fetch);

  const tensorflow::NodeDef* Node(const std::string& name) const;
  // Every node, in graph order.
  const std::vector<const tensorflow::NodeDef*>& nodes() const { return order_; }
  // Producer of data input i of `node` (nullptr when absent or a control input).
  const tensorflow::NodeDef* Producer(const tensorflow::NodeDef& node, int i, int* port = nullptr) const;
  // Data consumers of output `port` of `node`, plus one if it is fetched.
  int Consumers(const std::string& node, int port) const;
  // Readers of any output of `node` through data edges or fetches. Control
  // edges are not counted: a rewrite moves them onto the fused node.
  int DataConsumers(const std::string& node) const;
  // Nodes reading any output of `node` through data edges (once per edge),
  // and how many nodes wait on it through control edges.
  const std::vector<const tensorflow::NodeDef*>& DataReaders(const std::string& node) const;
  int ControlConsumers(const std::string& node) const;

 private:
  // What is known of one node, keyed by a view into names_ (a copy of every
  // node name in one buffer: patterns may clear and refill a node in place
  // before the next rebuild). A rebuild, once per rewrite, then allocates per
  // node, not per name and edge.
  struct Entry {
    const tensorflow::NodeDef* node = nullptr;
    std::vector<int> port_consumers;  // data readers and fetches of each output port
    int data_consumers = 0;
    int control_consumers = 0;
    std::vector<const tensorflow::NodeDef*> readers;
  };
  const Entry* Find(std::string_view name) const;

  std::string names_;
  std::unordered_map<std::string_view, Entry> entries_;
  std::vector<const tensorflow::NodeDef*> order_;
};

}  // namespace grappler
}  // namespace tf_ctr

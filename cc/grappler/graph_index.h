// A small index over a GraphDef for pattern matching: nodes by name, the
// producer of each data input, and the consumers of each output (fetches and
// control edges count, so a fused intermediate that anything else reads is
// never removed). RewriteContext keeps it current after each rewrite by
// updating only the nodes the rewrite removed, added or changed, so a rewrite
// costs what it touches, not the size of the graph.
#pragma once

#include <map>
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
  // The index points into `graph`'s nodes, which must outlive it.
  GraphIndex(const tensorflow::GraphDef& graph, const std::vector<std::string>& fetch);

  const tensorflow::NodeDef* Node(const std::string& name) const;
  // Every indexed node, in graph order (a removed node awaiting compaction is
  // not indexed).
  const std::vector<const tensorflow::NodeDef*>& nodes() const;
  // Producer of data input i of `node` (nullptr when absent or a control input).
  const tensorflow::NodeDef* Producer(const tensorflow::NodeDef& node, int i, int* port = nullptr) const;
  // Data consumers of output `port` of `node`, plus one if it is fetched.
  int Consumers(const std::string& node, int port) const;
  // Readers of any output of `node` through data edges or fetches. Control
  // edges are not counted: a rewrite moves them onto the fused node.
  int DataConsumers(const std::string& node) const;
  // Nodes reading any output of `node` through data edges (once per edge),
  // and the nodes that wait on it through control edges (once per edge).
  const std::vector<const tensorflow::NodeDef*>& DataReaders(const std::string& node) const;
  const std::vector<const tensorflow::NodeDef*>& ControlReaders(const std::string& node) const;
  int ControlConsumers(const std::string& node) const;
  // Each (reader, input index) reading output `port` of `node`, in reader order.
  std::vector<std::pair<const tensorflow::NodeDef*, int>> PortReaders(const std::string& node, int port) const;

  // Brings the index up to date after a rewrite: `removed` nodes leave it,
  // `added` ones join it, and `changed` ones (edited in place, inputs
  // included) are counted again. Each node appears in one list at most.
  void Update(const std::vector<const tensorflow::NodeDef*>& removed,
              const std::vector<const tensorflow::NodeDef*>& added,
              const std::vector<const tensorflow::NodeDef*>& changed);
  // Where this index and `other` disagree (empty when they agree): the
  // incremental updates checked against a rebuild (TF_CTR_OPS_CHECK_INDEX).
  std::string Difference(const GraphIndex& other) const;

 private:
  struct Input {
    std::string node;
    int port = 0;
  };
  struct Entry {
    const tensorflow::NodeDef* node = nullptr;
    std::vector<int> port_consumers;  // data readers and fetches of each output port
    int data_consumers = 0;
    std::vector<const tensorflow::NodeDef*> readers;
    std::vector<const tensorflow::NodeDef*> control_readers;
    std::vector<Input> inputs;  // as counted at the producers, to take back
  };
  const Entry* Find(std::string_view name) const;
  Entry* AddEntry(const tensorflow::NodeDef* node);
  void Link(Entry* reader);    // counts the reader's inputs at their producers
  void Unlink(Entry* reader);  // takes those counts back
  // Link after the reader's inputs changed, touching only the inputs that
  // did: a concatenation of N features is relinked once per rewrite of one of
  // them, and relinking all N inputs each time made the rewrite quadratic.
  void Relink(Entry* reader);
  void LinkInput(const tensorflow::NodeDef* reader, const Input& in);
  void UnlinkInput(const tensorflow::NodeDef* reader, const Input& in);

  const tensorflow::GraphDef& graph_;
  std::unordered_map<std::string, Entry> entries_;
  std::map<std::string, std::vector<int>> fetched_;  // node -> fetched ports (repeats count)
  mutable std::vector<const tensorflow::NodeDef*> order_;
  mutable bool order_valid_ = false;
};

}  // namespace grappler
}  // namespace tf_ctr

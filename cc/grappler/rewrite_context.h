// The rewrite engine of CtrFusionOptimizer: a context over the graph being
// optimized through which every pattern reads (the graph index, inferred
// shapes) and changes it (added, mutated and removed nodes, redirected
// edges), committed incrementally after each rewrite.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cc/grappler/graph_index.h"
#include "tensorflow/core/framework/graph.pb.h"
#include "tensorflow/core/framework/node_def.pb.h"
#include "tensorflow/core/grappler/costs/graph_properties.h"

namespace tf_ctr {
namespace grappler {

struct MatchRecord {
  std::string pattern;
  std::string fused_node;
  std::string fused_op;
  std::vector<std::string> replaced;  // "name (Op)"
};

struct SkipRecord {
  std::string pattern;
  std::string node;
  std::string reason;
  bool with_match = false;  // why a match left this node out: no later pass re-examines it
};

class RewriteContext {
 public:
  RewriteContext(tensorflow::GraphDef* graph, std::vector<std::string> fetch, std::set<std::string> preserve,
                 const tensorflow::grappler::GraphProperties* properties);

  const GraphIndex& index() const { return *index_; }
  // A node fetched here counts as changed: its recorded shapes are dropped by
  // DropStaleShapes (a re-pointed reader may produce another shape).
  tensorflow::NodeDef* Mutable(const std::string& name);
  // Adds a node with a name derived from `base` that is unique in the graph.
  tensorflow::NodeDef* AddNode(const std::string& base, const std::string& op, const std::string& device);
  // Drops a node the fused node `replaced_by` absorbed. A node the graph must
  // keep (a function's control output, say) becomes a NoOp that waits on it.
  void Remove(const std::string& name, const std::string& replaced_by);
  // Points control edges from `from` at `to` instead (automatic control
  // dependencies on a stateful op the fused node replaces keep their order).
  void RedirectControlEdges(const std::string& from, const std::string& to);
  // Points every data input reading output `port` of `from` at tensor `to`.
  void RedirectDataEdges(const std::string& from, int port, const std::string& to);
  // Whether the graph must keep a node of this name (fetched, or preserved).
  bool MustKeep(const std::string& name) const;
  // Whether the caller sees its outputs (fetched) or replaces them (fed). A
  // preserved node that is neither (a function's stateful op, kept as an
  // Identity once fused) may go: Remove keeps its name as a NoOp.
  bool FetchedOrFed(const std::string& name) const;
  void SetFed(std::set<std::string> fed) { fed_ = std::move(fed); }
  // The device type the rewritten graph is to be served on ("CPU", "GPU"),
  // or empty: either, so rewrites keep what both need.
  void SetServingDevice(std::string type) { serving_device_ = std::move(type); }
  const std::string& serving_device() const { return serving_device_; }
  // Patterns switched off by the caller: a pattern that leaves a form to
  // another (a gather whose pooling dense_reduce_lookup takes whole) asks
  // first, so that switching one off never keeps the other from fusing.
  void SetDisabledPatterns(std::set<std::string> names) { disabled_patterns_ = std::move(names); }
  bool PatternEnabled(const std::string& name) const { return !disabled_patterns_.count(name); }
  // Applies removals and brings the index up to date (with the nodes this
  // rewrite removed, added or changed); call after each rewrite.
  void Commit();
  // Deletes the nodes removed since the last Compact from the graph (they
  // already left the index at Commit); call once per sweep over the graph.
  void Compact();
  // Erases the shapes recorded before the rewrite where they may no longer
  // hold: `_output_shapes` of every changed node (the importer rejects a
  // stale one when the graph is loaded) and the offline copy
  // `_ctr_output_shapes` everywhere. Call once, after the last pattern.
  void DropStaleShapes();

  // Static rank / dim `dim` of output `port` of `node`, -1 when unknown. A
  // dim may also be a symbolic id (< -1) of Grappler's shape inference: two
  // equal ids are one size. Nodes that rewrites added have no inferred shapes.
  int Rank(const tensorflow::NodeDef& node, int port) const;
  int64_t Dim(const tensorflow::NodeDef& node, int port, int dim) const;
  bool Added(const std::string& name) const { return added_.count(name) > 0; }

  void Matched(MatchRecord record) { matches_.push_back(std::move(record)); }
  void Skipped(const std::string& pattern, const std::string& node, const std::string& reason);
  // Why a pattern that matched left `node` (part of what it could have
  // absorbed) in place; kept when a later pass forgets the skips.
  void LeftOutOfMatch(const std::string& pattern, const std::string& node, const std::string& reason) {
    skips_.push_back(SkipRecord{pattern, node, reason, true});
  }

  // A later pass re-examines what the skips name with the new graph.
  void ForgetSkips() {
    std::vector<SkipRecord> kept;
    for (SkipRecord& s : skips_)
      if (s.with_match) kept.push_back(std::move(s));
    skips_ = std::move(kept);
  }
  const std::vector<MatchRecord>& matches() const { return matches_; }
  const std::vector<SkipRecord>& skips() const { return skips_; }

 private:
  // Gives the fused nodes what the nodes they absorbed waited on (an assign
  // before a lookup, as TF2's automatic control dependencies or an explicit
  // tf.control_dependencies order them), and the variable reads the rewrite
  // added too, which would otherwise read the table before the assign.
  void KeepWaitsOfAbsorbed();
  // Makes `target` wait on `waited`, unless it does, or `waited` reads it.
  void AddWait(const std::string& target, const std::string& waited, const std::map<std::string, std::string>& absorbed);
  // Data inputs first, then control inputs, as TF requires, in the nodes this
  // rewrite added or changed (a pattern may copy control inputs first).
  void OrderInputs();
  // Whether `node` is `ancestor` or reads it, directly or not (a control
  // edge from it would close a cycle); a node `absorbed` into `ancestor`
  // counts as it, as the edges it still has will be moved onto it.
  bool DependsOn(const std::string& node, const std::string& ancestor,
                 const std::map<std::string, std::string>& absorbed) const;
  const tensorflow::NodeDef* Current(const std::string& name) const;
  // Every node that may read `from`: its indexed data or control readers, and
  // the nodes added or changed since the last Commit.
  std::vector<tensorflow::NodeDef*> PossibleReaders(const std::string& from, bool control);
  void Touch(tensorflow::NodeDef* node);

  tensorflow::GraphDef* graph_;
  std::vector<std::string> fetch_;
  const tensorflow::grappler::GraphProperties* properties_;
  std::unique_ptr<GraphIndex> index_;
  std::set<std::string> preserve_;
  std::set<std::string> fed_;
  std::string serving_device_;
  std::set<std::string> disabled_patterns_;
  std::set<std::string> removed_;
  std::map<std::string, std::string> absorbed_by_;  // removed or kept as a NoOp -> the fused node, this rewrite
  size_t matches_committed_ = 0;                    // matches_ of the rewrites committed before this one
  std::set<std::string> changed_;  // fetched through Mutable or re-pointed, over the whole run
  // Indexed nodes changed since the last Commit, which the index still
  // describes as they were.
  std::unordered_map<std::string, tensorflow::NodeDef*> touched_;
  std::unordered_set<const tensorflow::NodeDef*> doomed_;  // removed, awaiting Compact
  bool check_index_ = false;  // TF_CTR_OPS_CHECK_INDEX: each Commit compared with a rebuild
  // Nodes rewrites added: inferred shapes under their names (a removed
  // original node's) do not describe them.
  std::set<std::string> added_;
  // Nodes added since the last Commit, which the index does not know yet.
  std::unordered_map<std::string, tensorflow::NodeDef*> pending_;
  std::vector<std::pair<std::string, std::string>> kept_as_noop_;  // (name, fused)
  std::vector<MatchRecord> matches_;
  std::vector<SkipRecord> skips_;
};

// While one lives on this thread, RewriteContext::Rank and Dim read a
// LookupTableFindV2 of scalar values as having its keys' shape, where
// inference knows none (a captured table online). That holds for tables of
// scalar keys only, which a graph may not show (a captured DenseHashTable
// of vector keys gives keys.shape[:-1]): only a pattern whose fused op does
// the find itself, and refuses such a table when it runs, may assume it.
class AssumeScalarKeyFinds {
 public:
  AssumeScalarKeyFinds();
  ~AssumeScalarKeyFinds();
  AssumeScalarKeyFinds(const AssumeScalarKeyFinds&) = delete;
  AssumeScalarKeyFinds& operator=(const AssumeScalarKeyFinds&) = delete;
};

}  // namespace grappler
}  // namespace tf_ctr

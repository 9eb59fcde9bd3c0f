// The matcher core of CtrFusionOptimizer: a rewrite context over the graph
// being optimized, and the interface every fusion pattern implements. Adding
// a pattern means adding one file that defines a FusionPattern and registers
// it with REGISTER_CTR_FUSION_PATTERN.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cc/grappler/graph_index.h"
#include "tensorflow/core/framework/graph.pb.h"
#include "tensorflow/core/framework/node_def.pb.h"
#include "tensorflow/core/framework/types.pb.h"
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

  void ForgetSkips() { skips_.clear(); }
  const std::vector<MatchRecord>& matches() const { return matches_; }
  const std::vector<SkipRecord>& skips() const { return skips_; }

 private:
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
  std::set<std::string> removed_;
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

class FusionPattern {
 public:
  virtual ~FusionPattern() = default;
  virtual std::string name() const = 0;
  // Rewrites the subgraph anchored at `anchor` and returns true, or returns
  // false, recording through ctx->Skipped why a subgraph of the right shape
  // was left alone. Must not touch the graph when it returns false.
  virtual bool Rewrite(const tensorflow::NodeDef& anchor, RewriteContext* ctx) const = 0;
  // Patterns run in stages: a stage runs only once the earlier ones have
  // nothing left to rewrite. 0: the fusions of TF subgraphs; 1: combining
  // fused ops (grouping); 2: combining groups (a concatenation of them); 3:
  // choosing a fused op's form for the serving device.
  virtual int Stage() const { return 0; }
};

// A pattern named by the constant Name, with the Skip every pattern uses:
// records why the subgraph at `anchor` was left alone and returns false, so a
// check reads `if (...) return Skip(ctx, anchor, "why");`.
template <const char* Name>
class NamedPattern : public FusionPattern {
 public:
  std::string name() const override { return Name; }

 protected:
  static bool Skip(RewriteContext* ctx, const tensorflow::NodeDef& anchor, const std::string& reason) {
    ctx->Skipped(Name, anchor.name(), reason);
    return false;
  }
};

std::vector<std::unique_ptr<FusionPattern>>& RegisteredPatterns();

struct PatternRegistration {
  explicit PatternRegistration(FusionPattern* p) { RegisteredPatterns().emplace_back(p); }
};

#define REGISTER_CTR_FUSION_PATTERN(Class) \
  static ::tf_ctr::grappler::PatternRegistration ctr_fusion_pattern_##Class(new Class())

// ---------------------------------------------------------------------------
// Node predicates and attribute access shared by patterns.

bool IsOp(const tensorflow::NodeDef* node, const char* op);
tensorflow::DataType TypeAttr(const tensorflow::NodeDef& node, const char* name);
int64_t IntAttr(const tensorflow::NodeDef& node, const char* name, int64_t fallback);
bool BoolAttr(const tensorflow::NodeDef& node, const char* name, bool fallback);
std::string StringAttr(const tensorflow::NodeDef& node, const char* name);
// Values of an int32/int64 Const vector (either proto encoding), or false.
bool ConstIntVector(const tensorflow::NodeDef* node, std::vector<int64_t>* out);
// Value of a scalar integer Const, or false.
bool ConstScalarInt(const tensorflow::NodeDef* node, int64_t* value);
// Value of a scalar string Const, or false.
bool ConstString(const tensorflow::NodeDef* node, std::string* out);
// Whether `node` is a Squeeze of exactly one axis, `axis` of a rank-`rank`
// input (a negative squeeze_dims entry counts from the end).
bool IsSqueezeOfAxis(const tensorflow::NodeDef* node, int64_t axis, int rank);
// Whether `slice` is x[0] of a vector, as Python indexing emits it
// (StridedSlice [0:1:1], shrinking axis 0, no other masks).
bool IsFirstElementSlice(const GraphIndex& g, const tensorflow::NodeDef* slice);
// x[:, 0] of a [N, 2+] tensor, as Python slicing emits it.
bool IsFirstColumn(const GraphIndex& g, const tensorflow::NodeDef* slice);
bool IsSelect(const tensorflow::NodeDef* node);  // Select or SelectV2
bool HasControlInputs(const tensorflow::NodeDef& node);
std::string Describe(const tensorflow::NodeDef& node);  // "name (Op)"
// Follows Identity nodes up to the first other producer, collecting them
// (tf.nn.embedding_lookup ends in an Identity).
const tensorflow::NodeDef* SkipIdentities(const GraphIndex& g, const tensorflow::NodeDef* node,
                                          std::vector<const tensorflow::NodeDef*>* identities);
bool IsEmbeddingDtype(tensorflow::DataType t);
bool IsIndexDtype(tensorflow::DataType t);
// Copies the control inputs ("^x") of `from` onto `to`.
void CopyControlInputs(const tensorflow::NodeDef& from, tensorflow::NodeDef* to);
// Appends the control inputs ("^x") of `from` to `controls`.
void AppendControlInputs(const tensorflow::NodeDef& from, std::vector<std::string>* controls);
// Adds each of `controls` that `to` lacks, after its other inputs.
void AddControlInputsOnce(const std::vector<std::string>& controls, tensorflow::NodeDef* to);
// Turns the node `name`, which the graph must keep (fetched), into an
// Identity of `output` of dtype `t`: a replaced node keeps its name.
void KeepAsIdentity(RewriteContext* ctx, const std::string& name, const std::string& output,
                    const tensorflow::AttrValue& t);

// Node builders for the inputs fused ops need; each returns the new node's name.
std::string AddInt64Scalar(RewriteContext* ctx, const std::string& base, int64_t value, const std::string& device);
std::string AddInt64Vector(RewriteContext* ctx, const std::string& base, const std::vector<int64_t>& values,
                           const std::string& device);
std::string AddInt32Vector(RewriteContext* ctx, const std::string& base, const std::vector<int32_t>& values,
                           const std::string& device);
std::string AddEmptyFloatVector(RewriteContext* ctx, const std::string& base, const std::string& device);
std::string AddCast(RewriteContext* ctx, const std::string& base, const std::string& input,
                    tensorflow::DataType from, tensorflow::DataType to, const std::string& device);
std::string AddReadVariable(RewriteContext* ctx, const std::string& base, const std::string& resource,
                            tensorflow::DataType dtype, const std::string& device);

}  // namespace grappler
}  // namespace tf_ctr

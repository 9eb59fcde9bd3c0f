// Helpers for patterns that absorb a whole subgraph: proving that nothing
// outside it reads its nodes, removing them, and the small constants and
// shape facts the replacement needs.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "cc/grappler/pattern.h"

namespace tf_ctr {
namespace grappler {

// True when every data reader (and fetch) of every node in `absorbed` is a
// node of `absorbed`, `keeper`, or dead shape arithmetic (readers an earlier
// rewrite left without consumers, as function instantiation would prune
// them); those are appended to *absorbed. Otherwise *outsider names the
// first node read from outside.
bool OnlyReadWithin(const GraphIndex& g, std::vector<const tensorflow::NodeDef*>* absorbed,
                    const tensorflow::NodeDef& keeper, std::string* outsider);

// Removes `absorbed` in favour of `fused`, moving their control edges onto it
// (and their control inputs into it), and lists them in the record.
void AbsorbNodes(RewriteContext* ctx, const std::vector<const tensorflow::NodeDef*>& absorbed,
                 const std::string& fused, MatchRecord* record);

// Every node that some tensor of `roots` depends on, through data or
// control edges, the roots' own nodes included.
std::set<std::string> Ancestors(const GraphIndex& g, const std::vector<std::string>& roots);

// Whether one op may stand for all of `members` at once: false, with `why`,
// when a node outside them depends on one member while another depends on
// it (an update of a table between two lookups of it, which TF2 and
// tf.control_dependencies order): the merged op would have to run both
// before and after it.
bool MergeKeepsOrder(const GraphIndex& g, const std::vector<const tensorflow::NodeDef*>& members,
                     std::string* why);

// Value of a scalar float32 Const, or false.
bool ConstScalarFloat(const tensorflow::NodeDef* node, float* value);

// Rows of the [V, D] table tensor `table` ("node:port"), -1 when unknown:
// inferred shapes, else the declared shape of the variable a ReadVariableOp reads.
int64_t TableRows(RewriteContext* ctx, const std::string& table);

}  // namespace grappler
}  // namespace tf_ctr

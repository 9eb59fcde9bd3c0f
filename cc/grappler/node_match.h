// Node predicates, attribute access and node builders shared by the fusion
// patterns: what a pattern asks of a node, and the small nodes it adds.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "cc/grappler/graph_index.h"
#include "cc/grappler/rewrite_context.h"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/node_def.pb.h"
#include "tensorflow/core/framework/types.pb.h"

namespace tf_ctr {
namespace grappler {

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
// Whether `node` is an integer Const holding `want`: the scalar, the vector,
// or either (the forms Python emits for an index).
bool ConstScalarIs(const tensorflow::NodeDef* node, int64_t want);
bool ConstVectorIs(const tensorflow::NodeDef* node, const std::vector<int64_t>& want);
// The operand of the two-input commutative `op` beside a scalar integer Const
// (whose value goes to `value`), in either order: Grappler's canonicalization
// may put the constant first. Null unless exactly one input is such a Const.
const tensorflow::NodeDef* OperandBesideConstInt(const GraphIndex& g, const tensorflow::NodeDef& op, int64_t* value,
                                                 int* port);
bool ConstVectorOrScalarIs(const tensorflow::NodeDef* node, int64_t want);
// Whether two input strings name the same tensor ("x" and "x:0" do).
bool SameTensor(const std::string& a, const std::string& b);
// Whether `node` is a scalar Const of a real or integer type equal to `want`
// (a zero of either sign for 0), seen through Cast nodes (Keras casts its
// constants).
bool IsScalarConst(const GraphIndex& g, const tensorflow::NodeDef* node, double want);
inline bool IsZeroScalar(const GraphIndex& g, const tensorflow::NodeDef* node) { return IsScalarConst(g, node, 0); }
// Value of a scalar string Const, or false.
bool ConstString(const tensorflow::NodeDef* node, std::string* out);
// Whether `join` (a ConcatV2 or Pack of [B, D] matrices) puts its inputs side
// by side in each row: a ConcatV2 along axis 1 (or -1) by a Const, a Pack
// along axis 1 (or -2). Else false with the reason in `why`.
bool JoinsSideBySide(const GraphIndex& g, const tensorflow::NodeDef& join, std::string* why);
// The axis Const of ConcatV2 `concat` where only `concat` reads it and the
// graph need not keep it, so that it goes with the concatenation; else null.
const tensorflow::NodeDef* AxisConstOnlyFor(RewriteContext* ctx, const tensorflow::NodeDef& concat);
// Whether `node` is a Squeeze of exactly one axis, `axis` of a rank-`rank`
// input (a negative squeeze_dims entry counts from the end).
bool IsSqueezeOfAxis(const tensorflow::NodeDef* node, int64_t axis, int rank);
// Whether `gather` (GatherV2 or ResourceGather) gathers whole rows of its
// table: batch_dims 0 and, for GatherV2, a constant axis 0. Else false with
// the reason in `why`.
bool GathersWholeRows(const GraphIndex& g, const tensorflow::NodeDef& gather, std::string* why);
// Whether `slice` is x[0] of a vector, as Python indexing emits it
// (StridedSlice [0:1:1], shrinking axis 0, no other masks).
bool IsFirstElementSlice(const GraphIndex& g, const tensorflow::NodeDef* slice);
// x[:, 0] of a [N, 2+] tensor, as Python slicing emits it.
bool IsFirstColumn(const GraphIndex& g, const tensorflow::NodeDef* slice);
bool IsSelect(const tensorflow::NodeDef* node);  // Select or SelectV2
// SparseReshapes of a SparseTensor S (input 1 its dense_shape) that keep every
// entry in its row when S is 2-D, so its indices stay as they were:
// safe_embedding_lookup_sparse's flattening [prod(S[:1]), S[1]], and the
// linear model's [S[0], -1]. Neither checks S's rank.
bool IsFlattenToRank2(const GraphIndex& g, const tensorflow::NodeDef& reshape);
bool IsReshapeToBatchRows(const GraphIndex& g, const tensorflow::NodeDef& reshape);
// An AsString of integers with no formatting attrs: the decimal form the
// kernels' integer hash (HashIntKeyBucket) formats.
bool IsPlainAsString(const tensorflow::NodeDef& node);
// A SparseCross that hashes into int64 ids, as CtrCrossEmbeddingLookup
// does, with input types TF runs it on (an internal type of string refuses
// int64 inputs; the fused op would cross them); else *why says why not.
bool IsRunnableHashedCross(const tensorflow::NodeDef& cross, std::string* why);
bool HasControlInputs(const tensorflow::NodeDef& node);
// The device type in a device name ("/job:x/device:GPU:0" -> "GPU"), or
// empty for an unplaced node.
std::string DeviceType(const std::string& device);
std::string Describe(const tensorflow::NodeDef& node);  // "name (Op)"
// Follows Identity nodes up to the first other producer, collecting them
// (tf.nn.embedding_lookup ends in an Identity).
const tensorflow::NodeDef* SkipIdentities(const GraphIndex& g, const tensorflow::NodeDef* node,
                                          std::vector<const tensorflow::NodeDef*>* identities);
bool IsEmbeddingDtype(tensorflow::DataType t);
bool IsIndexDtype(tensorflow::DataType t);
// Copies the attrs `names` that `from` sets onto `to`. An attr at its
// default may be absent (stripped on export); `to`'s op then takes the same
// default.
void CopyAttrsIfSet(const tensorflow::NodeDef& from, std::initializer_list<const char*> names,
                    tensorflow::NodeDef* to);
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
// Hands the single-output `node` (attr T) over to `output` of the fused op
// `fused`: its readers read `output` and what waited on it waits on `fused`,
// or, where the graph must keep it, it becomes an Identity of `output`.
void HandOver(RewriteContext* ctx, const tensorflow::NodeDef& node, const std::string& output,
              const std::string& fused);

// Node builders for the inputs fused ops need; each returns the new node's name.
// `output`, the [B, n * width] concatenation of n features, read as their
// stack [B, n, width] (a Reshape named base + "/ctr_stack"); its tensor name.
std::string ReshapeToStack(RewriteContext* ctx, const std::string& base, const std::string& output, int64_t n,
                           int64_t width, const tensorflow::AttrValue& t, const std::string& device);
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

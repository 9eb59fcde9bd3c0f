// A vocabulary lookup's ids as the patterns that absorb them see them: a
// LookupTableFindV2, Keras' num_oov_indices=0 check of its ids (an Assert an
// Identity of the ids waits on), and the Identities between. Shared by the
// patterns that fuse the find into what reads its ids (vocab_lookup: an
// embedding gather; vocab_multi_hot: a Dense layer over a multi-hot encoding).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cc/grappler/pattern.h"
#include "tensorflow/core/framework/node_def.pb.h"

namespace tf_ctr {
namespace grappler {

// Keras' rules between a find and its ids (StringLookup / IntegerLookup with
// output_mode "int"), in the order Keras applies them:
//   mask_token:           m = SelectV2(Equal(keys, mask), mask_id, find)
//   num_oov_indices > 1:  SelectV2(Equal(m, oov_id), AddV2(slot(keys), start), m)
// (oov_id is Keras' constant of the table's default, which a SavedModel's
// function may take as a captured input)
// with slot StringToHashBucketFast(keys, n) of string keys and
// FloorMod(keys, n) of int64 keys.
struct KerasKeyRules {
  std::vector<const tensorflow::NodeDef*> nodes;  // the Selects, Equals, AddV2 and slot
  const tensorflow::NodeDef* last = nullptr;      // the Select whose ids go on; null: no rules
  const tensorflow::NodeDef* mask = nullptr;      // the mask's Select
  const tensorflow::NodeDef* mask_equal = nullptr;
  int mask_key_operand = 1;  // of the mask's Equal; the mask's id is operand 1 of its Select
  int64_t oov_slots = 0;  // 0: no slot rule
  int64_t oov_id = -1;    // the id the slot rule's Equal compares with
  int64_t oov_start = 0;
};

struct VocabIds {
  const tensorflow::NodeDef* find = nullptr;
  KerasKeyRules rules;
  std::vector<const tensorflow::NodeDef*> identities;  // between the find (or its wrap) and the reader
  std::vector<const tensorflow::NodeDef*> wrap;        // Keras' negative-index wrap: SelectV2, Less, AddV2
  const tensorflow::NodeDef* assert_node = nullptr;    // Keras' vocabulary check, when there is one
  std::vector<const tensorflow::NodeDef*> check;       // the check's other nodes
  int64_t missing_id = -1;
};

// Keras' num_oov_indices=0 check on `find`'s ids: Assert(Equal(Size(w), 0),
// [StringFormat(GatherNd(keys, w))]), w = Where(Equal(ids, m)). Sets the
// check's nodes and m.
bool MatchVocabCheck(const GraphIndex& g, const tensorflow::NodeDef& assert_node, const tensorflow::NodeDef& find,
                     VocabIds* ids);

// Follows Identities up from `x` (recording them in ids->identities) to a
// LookupTableFindV2, which it records; false when there is none. Keras' mask
// and OOV-slot rules may sit between them (recorded in ids->rules).
bool TraceToFind(const GraphIndex& g, const tensorflow::NodeDef* x, VocabIds* ids);

// The node whose ids the Identities (and Keras' check) read: the last of
// Keras' rules, or the find.
const tensorflow::NodeDef& IdsSource(const VocabIds& ids);

// Whether each node of Keras' rules (and the find under them) feeds only the
// next; else *why says which does not.
bool KeyRulesFeedOnlyThemselves(RewriteContext* ctx, const VocabIds& ids, std::string* why);

// Keras' mask key and id are scalars: an operand of another known rank
// would broadcast in the Equal or the Select.
bool MaskIsScalar(RewriteContext* ctx, const KerasKeyRules& rules);

// Whether Keras' negative-index wrap of the ids (ids.wrap) adds the row count
// of the table `gather` reads, as the fused ops' own wrap does: table values
// and defaults may be negative, so only then is it exact.
bool WrapShiftIsRowCount(RewriteContext* ctx, const VocabIds& ids, const tensorflow::NodeDef& gather, bool resource);

// Whether the lookup's nodes feed only what the fused op replaces: the wrap
// and Keras' rules each only the next, the ids the reader reads (the
// Identity nearest it, or IdsSource) exactly `readers` times (the gather
// once, or Keras' wrap thrice, plus any mask of them the caller absorbs),
// the other Identities once, and IdsSource also Keras' check; else *why
// says which node has another consumer.
bool LookupFeedsOnly(RewriteContext* ctx, const VocabIds& ids, int readers, std::string* why);

// The only thing the ids may wait on is Keras' check of these ids.
bool MatchVocabWaits(const GraphIndex& g, VocabIds* ids, std::string* why);

// Whether the fused vocabulary ops take `find`'s table: int64 values (row
// ids), string or int64 keys, and a default known to be a scalar (a table of
// vector values, MutableHashTableOfTensors, finds a vector per key, and
// the fused ops' shapes take one id per key); else *why says what it is.
bool FindTypesFuse(RewriteContext* ctx, const tensorflow::NodeDef& find, std::string* why);

// Whether the fused op, which takes `anchor`'s place (and device), can read
// the table of `find`: a resource only ops on its device read, so in a placed
// graph (a tf.function's, a strategy's replicas on several devices) the find
// and the anchor must be on one device; else *why says where each is.
bool FindOnAnchorDevice(const tensorflow::NodeDef& find, const tensorflow::NodeDef& anchor, std::string* why);

// The fused op runs on the CPU (lookup tables live on the host): whether
// `anchor` is placed on one, or unplaced in a graph served on one.
bool ServedOnCpu(RewriteContext* ctx, const tensorflow::NodeDef& anchor);

// Removes the lookup's nodes (the wrap, the Identities, the check and its
// Assert, Keras' rules, the find) in favour of the fused node `fused`, which does all they
// did: what waited on the Assert waits on `fused` and on what the Assert
// waited on, what waited on the others waits on `fused`, and the constants
// and shape math only they read go too. Appends the removed nodes'
// descriptions to `replaced`. `extra` names other nodes the caller removes
// with them (their control edges to the Assert are theirs to drop).
void AbsorbVocabNodes(RewriteContext* ctx, const VocabIds& ids, const std::string& fused,
                      const std::vector<std::string>& extra, std::vector<std::string>* replaced);

// The out-of-vocabulary ids of IdTableWithHashBuckets and
// StaticVocabularyTable around a find (what the vocabulary feature columns
// with num_oov_buckets build):
//   SelectV2(NotEqual(find, default), find, AddV2(hash(keys), LookupTableSizeV2(table)))
// with hash StringToHashBucketFast of the string keys or of AsString of the
// integer keys (or Grappler's _TensorToHashBucketFast of them).
struct OovBuckets {
  std::vector<const tensorflow::NodeDef*> nodes;  // SelectV2, NotEqual, AddV2, the hash [, AsString]
  const tensorflow::NodeDef* size = nullptr;      // LookupTableSizeV2 of the table
  int64_t buckets = 0;                            // 0: no buckets, the find's ids as they are
};

// The ids produced by `x` at output `port`: a LookupTableFindV2's, or the
// SelectV2 of its buckets. Records the find in ids->find and the buckets in
// *oov; false when `x` is neither.
bool MatchBucketedFind(const GraphIndex& g, const tensorflow::NodeDef* x, int port, VocabIds* ids, OovBuckets* oov);

// Whether `n` has exactly `readers` data readers and the caller neither reads
// nor feeds it: an intermediate a fused node may absorb. Else *why says so.
bool OnlyReadBy(RewriteContext* ctx, const tensorflow::NodeDef& n, int readers, std::string* why);

// Whether the Identities, the buckets and the find feed only what follows
// each (the find: the NotEqual and the SelectV2 when there are buckets), and
// the caller reads none of them; else *why says which does not.
bool BucketedFindFeedsOneReader(RewriteContext* ctx, const VocabIds& ids, const OovBuckets& oov, std::string* why);

// Removes the find, its buckets (with the table size when only they read it)
// and the Identities, as AbsorbVocabNodes does, for the node `fused`, which
// reads the keys instead. `others` are copies of the nodes the caller
// replaces besides (the reader that becomes `fused` among them), whose names
// go in `extra` of AbsorbVocabNodes. Returns the control inputs of all of
// them that name no replaced node: what `fused` must wait on.
std::vector<std::string> AbsorbBucketedFind(RewriteContext* ctx, VocabIds ids, const OovBuckets& oov,
                                            const std::string& fused, const std::vector<tensorflow::NodeDef>& others,
                                            std::vector<std::string>* replaced);

}  // namespace grappler
}  // namespace tf_ctr

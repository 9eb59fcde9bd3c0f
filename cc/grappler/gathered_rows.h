// Matching the rows a pooled lookup reads, shared by the lookup patterns:
//
//   ids -> Unique -> {ResourceGather | GatherV2}(table, y) [-> Identity]
//       -> user(rows, Unique.idx, ...)
//
// (tf.nn.embedding_lookup_sparse's lookup), or a user reading a matrix
// directly with its own indices; and the AsString + string hash producer of
// integer keys, which the fused op hashes itself.
#pragma once

#include <string>
#include <vector>

#include "cc/grappler/pattern.h"

namespace tf_ctr {
namespace grappler {

// TF's string hashes into buckets: StringToHashBucketFast, or
// StringToHashBucketStrong (keras.layers.Hashing with a salt), whose `key`
// the fused ops take as their hash_key attr, bit for bit.
bool IsStringHash(const tensorflow::NodeDef* n);
// A string hash's key: empty for the fast hash.
std::vector<int64_t> StringHashKey(const tensorflow::NodeDef& hash);
// Sets a fused op's hash_key attr; the fast hash leaves it unset (its default).
void SetHashKeyAttr(const std::vector<int64_t>& key, tensorflow::NodeDef* fused);
// A fused op's hash_key attr (empty: the fast hash).
std::vector<int64_t> HashKeyAttr(const tensorflow::NodeDef& fused);
// Feature i's hash key in a grouped string op (keyed_features, hash_keys).
std::vector<int64_t> GroupedHashKey(const tensorflow::NodeDef& grouped, int i);
// Sets a grouped string op's keyed_features and hash_keys from each of its
// features' keys, in feature order; none keyed leaves both unset.
void SetGroupedHashKeys(const std::vector<std::vector<int64_t>>& keys, tensorflow::NodeDef* grouped);
// A fused op's params gradient form: its grad_indices and empty_grad_row.
struct GradForm {
  std::string indices = "per_id";
  int64_t empty_row = -1;
};
// A fused op's form (the defaults where unset); feature i's in a grouped
// string op; and a grouped op's lists from its features' (left unset when
// all are the defaults).
GradForm GradFormAttr(const tensorflow::NodeDef& fused);
GradForm GroupedGradForm(const tensorflow::NodeDef& grouped, int i);
void SetGroupedGradForms(const std::vector<GradForm>& forms, tensorflow::NodeDef* grouped);

// Where the pooled rows come from: the table and the (non-unique) keys.
struct RowSource {
  std::string table;     // tensor holding the [V, D] table, or
  std::string resource;  // the variable handle to read it from
  tensorflow::DataType resource_dtype = tensorflow::DT_INVALID;
  std::string resource_device;
  std::string keys;  // int keys, one per pooled entry
  tensorflow::DataType key_type = tensorflow::DT_INVALID;
  std::string id_mode = "index";
  int64_t num_buckets = 0;
  std::vector<int64_t> hash_key;  // hash mode: empty (fast) or the strong hash's key
  // The params gradient's form in TF's graph (the fused op's grad_indices):
  // one row per table row through Unique, else the reader's (a gather's one
  // row per id; a segment reduction of the table's, dense).
  std::string grad_indices = "per_id";
  std::vector<const tensorflow::NodeDef*> absorbed;  // nodes the fused op replaces
  // What only absorbed nodes read (the shift of a negative-index wrap): goes
  // with them where nothing else reads it.
  std::vector<const tensorflow::NodeDef*> shape_math;
};

// Sets src's table to what `gather` (ResourceGather when `resource`, else
// GatherV2) reads its rows from.
void SetTableOfGather(const tensorflow::NodeDef& gather, bool resource, RowSource* src);

// kOther: `user`'s data is not gathered rows at all; kRejected: it is, but a
// condition for an exact rewrite fails (*why says which).
enum class SourceMatch { kOther, kRejected, kMatched };

// `user` reads Gather(table, Unique(ids).y) at data_input and Unique.idx at idx_input.
SourceMatch MatchGatheredRows(const tensorflow::NodeDef& user, int data_input, int idx_input, RewriteContext* ctx,
                              RowSource* src, std::string* why);

// `user` reads a matrix at data_input with its own indices at idx_input.
bool MatchDirectRows(const tensorflow::NodeDef& user, int data_input, int idx_input, tensorflow::DataType idx_type,
                     RewriteContext* ctx, RowSource* src, std::string* why);

// Moves the string hash that produces the keys into the source (id_mode
// "hash"): AsString + hash of integer keys, and with `string_keys` (the
// fused op runs on the CPU, the only device where it hashes strings) the
// hash of string keys. Keras 3's negative-index wrap of the hashed ids goes
// too: a hash is never negative, so the wrap passes it through.
void FuseHashProducer(RewriteContext* ctx, RowSource* src, bool string_keys = false);

// The table tensor for the fused op, adding the variable read when needed.
// Call only once the rewrite is certain.
std::string TableTensor(RewriteContext* ctx, const RowSource& src, const std::string& base);

// Removes the absorbed nodes, moving their control edges onto `fused`, and
// lists them in the record.
void AbsorbSource(RewriteContext* ctx, const RowSource& src, const std::string& fused, MatchRecord* record);

// What a fused CtrEmbeddingLookup reads besides its source's table and keys.
struct FusedLookup {
  std::string table;
  std::string segments;  // row ids of each entry
  std::string num_rows;  // int64 scalar; -1: last row id + 1
  std::string weights;   // float vector, or an empty one
  tensorflow::DataType dtype = tensorflow::DT_FLOAT;
  tensorflow::DataType segment_dtype = tensorflow::DT_INT64;
  std::string combiner;
  bool has_weights = false;
};

// Turns node `name` into CtrEmbeddingLookup(table, keys, segments, num_rows,
// weights) in row_ids mode, keeping its control inputs and those of the
// absorbed source nodes.
void BecomeFusedLookup(RewriteContext* ctx, const std::string& name, const RowSource& src, const FusedLookup& f);

// Rank of a variable's value: the gather's inferred output, else the handle's
// declared shape (VarHandleOp `shape`, or `_handle_shapes` on a captured handle).
int ResourceTableRank(RewriteContext* ctx, const tensorflow::NodeDef& gather);

// What a fused CtrStringEmbedding with one bag per string reads, and how.
struct FusedStrings {
  std::string table;
  std::string strings;  // a string vector
  tensorflow::DataType dtype = tensorflow::DT_FLOAT;
  std::string combiner = "sum";
  std::string id_mode;    // hash, index or mod
  std::string delimiter;  // empty: each whole string is one token
  bool skip_empty = false;
  float max_norm = -1.f;
  int64_t num_buckets = 0;  // hash mode; 0: the table's rows
  std::vector<int64_t> hash_key;  // hash mode: empty (fast) or the strong hash's key
  GradForm grad;  // grad_indices as RowSource's; empty_grad_row as the safe lookup's
  bool trim_empty_tail = false;
  std::string invalid_ids = "error";  // or skip_negative (safe lookups)
  int64_t default_id = -1;
  // The strings fed a StringSplit, whose kernel refuses any other rank: a
  // server's feed is not held to the signature's shape, so a guard keeps that
  // error (the pack would flatten a [B, 1] feed and serve it).
  bool vector_only = false;
};

// Makes `fused` (which must have no data inputs yet) CtrStringEmbedding over
// CtrPackStrings(f.strings), with the empty bag_splits and f's attributes.
// Control inputs go on after this call, behind the data inputs.
void BecomeStringEmbedding(RewriteContext* ctx, const std::string& base, const std::string& device,
                           const FusedStrings& f, tensorflow::NodeDef* fused);

}  // namespace grappler
}  // namespace tf_ctr

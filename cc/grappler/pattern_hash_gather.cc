// Pattern: a single-valued hashed feature, one table row per string --
// tf.nn.embedding_lookup(table, tf.strings.to_hash_bucket_fast(s, n)) and
// keras.layers.Hashing(n) + keras.layers.Embedding (with a salt, the hash is
// StringToHashBucketStrong, whose key the fused op takes as hash_key):
//
//   h = StringToHashBucketFast(strings)        strings [B] or [B, 1]
//   [Keras 3: h = SelectV2(Less(h, 0), AddV2(h, rows), h)]
//   {ResourceGather | GatherV2}(table, h)
//
// becomes CtrStringEmbedding(table, CtrPackStrings(strings)) with an empty
// delimiter (each whole string is one token), skip_empty false and combiner
// sum: one row per string, bit-identical to the gather. [B, N] strings (all
// of a model's fields in one tensor, one Hashing layer) go through a Reshape
// to [B * N] and the rows back to [B, N, D]; [B, 1] strings go
// through a Reshape to [B] and the result gets its middle axis back -- unless
// the [B, 1, D] rows only feed Keras' Flatten,
//
//   Reshape(rows, Pack(StridedSlice(Shape(rows))[0], D))
//
// which turns them into the fused op's [B, D] again: the Flatten goes with
// the gather (five small ops per feature per call, a fifth of what was left
// of a Keras Embedding model's graph around the fused ops). So does a Squeeze
// of axis 1 (keras.ops.squeeze(embedding(keys), axis=1)), which would
// otherwise undo the ExpandDims that gives the rows their middle axis back.
//
// Integer keys hashed through AsString (the Hashing layer on ints; Grappler
// fuses AsString + StringToHashBucketFast into _TensorToHashBucketFast) become
// CtrEmbeddingLookup in hash mode with one key per row instead.
//
// A field sliced out of hashed [B, F] keys (h[:, f:f + 1], one Hashing layer
// over all fields, then a slice per field) is the hash of the keys' same
// slice: the fused op takes that slice of the keys.
//
// One hash read by several gathers (DeepFM's Hashing layer feeding its
// first-order Embedding(N, 1) and its Embedding(N, D)) fuses each gather
// alone: the hash stays for the others, and the last one absorbs it.
//
// Hashes of split tokens are left to the pooled patterns.
#include <climits>
#include <set>
#include <string>
#include <vector>

#include "cc/grappler/gathered_rows.h"
#include "cc/grappler/keras_gather.h"
#include "cc/grappler/pattern.h"
#include "cc/grappler/split_source.h"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/tensor.pb.h"
#include "tensorflow/core/framework/tensor_shape.pb.h"

namespace tf_ctr {
namespace grappler {
namespace {

using tensorflow::DataType;
using tensorflow::NodeDef;

constexpr char kName[] = "hash_gather";

// What the gather reads, traced back to the hash.
struct HashedKeys {
  const NodeDef* hash = nullptr;
  const NodeDef* as_string = nullptr;  // integer keys hashed through AsString
  const NodeDef* cast = nullptr;       // int64 -> int32 (an int32 Keras Embedding input)
  const NodeDef* slice = nullptr;      // a field of hashed [B, F] keys (h[:, f:f + 1]): the keys' slice hashed
  std::vector<const NodeDef*> wrap;    // Keras' negative-index wrap: SelectV2, Less, AddV2
  std::string int_keys;                // what is hashed, when it is integers
  DataType key_type = tensorflow::DT_INVALID;
  // Nodes other gathers of the same keys read too: they stay.
  std::set<const NodeDef*> kept;

  // Every node between the keys and the gather.
  std::vector<const NodeDef*> All() const {
    std::vector<const NodeDef*> all = wrap;
    for (const NodeDef* n : {cast, slice, hash, as_string})
      if (n != nullptr) all.push_back(n);
    return all;
  }
  // The node whose output the gather's ids are (before the wrap and cast).
  const NodeDef& Ids() const { return slice != nullptr ? *slice : *hash; }

  std::vector<const NodeDef*> Absorbed() const {
    std::vector<const NodeDef*> absorbed;
    for (const NodeDef* n : All())
      if (!kept.count(n)) absorbed.push_back(n);
    return absorbed;
  }
};

class HashGatherPattern : public NamedPattern<kName> {
 public:
  bool Rewrite(const NodeDef& anchor, RewriteContext* ctx) const override {
    const bool resource = IsOp(&anchor, "ResourceGather");
    if (!resource && !IsOp(&anchor, "GatherV2")) return false;
    const GraphIndex& g = ctx->index();
    HashedKeys keys;
    const NodeDef* h = UnwrapNegativeIndexFix(g, g.Producer(anchor, 1), &keys.wrap);
    if (IsIndexCast(h)) {
      keys.cast = h;
      h = g.Producer(*h, 0);
    }
    // A field sliced out of hashed [B, F] keys: the hash of the keys' same
    // slice, since a hash maps each key alone.
    if (IsOp(h, "StridedSlice")) {
      const NodeDef* hashed = g.Producer(*h, 0);
      if (!IsStringHash(hashed) && !IsOp(hashed, "_TensorToHashBucketFast")) return false;
      keys.slice = h;
      h = hashed;
    }
    // Grappler's remapper fuses AsString + StringToHashBucketFast on integers
    // into _TensorToHashBucketFast before custom optimizers run.
    const bool fused_int_hash = IsOp(h, "_TensorToHashBucketFast");
    if (!IsStringHash(h) && !fused_int_hash) return false;
    keys.hash = h;
    const NodeDef* strings = g.Producer(*h, 0);
    if (strings == nullptr) return false;
    // Tokens of a split belong to a pooled form, which other patterns fuse whole.
    if (IsOp(strings, "StringSplit") || IsOp(strings, "StringSplitV2")) return false;
    if (fused_int_hash) {
      keys.int_keys = h->input(0);
      keys.key_type = TypeAttr(*h, "T");
      if (!IsIndexDtype(keys.key_type)) return Skip(ctx, anchor, "hashed keys are not int32/int64");
    } else if (IsOp(strings, "AsString")) {
      keys.as_string = strings;
      keys.int_keys = strings->input(0);
      keys.key_type = TypeAttr(*strings, "T");
    }

    // The subgraph has the right shape; now every condition for exactness.
    const DataType T = GatheredType(anchor, resource);
    if (!IsEmbeddingDtype(T))
      return Skip(ctx, anchor, "table dtype " + tensorflow::DataType_Name(T) + " is not float, half or bfloat16");
    std::string why;
    if (!GathersWholeRows(g, anchor, &why)) return Skip(ctx, anchor, why);
    if (keys.as_string != nullptr && !IsPlainAsString(*keys.as_string))
      return Skip(ctx, anchor, "AsString has formatting attributes");
    const int64_t buckets = IntAttr(*h, "num_buckets", 0);
    if (keys.cast != nullptr && TypeAttr(*keys.cast, "DstT") == tensorflow::DT_INT32 && buckets > INT32_MAX)
      return Skip(ctx, anchor, "hash buckets do not fit the int32 cast");
    if (!keys.wrap.empty() && !WrapShiftIsScalar(ctx, keys.wrap))
      return Skip(ctx, anchor, "the negative-index wrap may broadcast (its shift is not known to be a scalar)");
    if (!OnlyFeedsTheGather(g, anchor, &keys, &why)) return Skip(ctx, anchor, why);
    const NodeDef& ids = keys.Ids();
    int rank = ctx->Rank(ids, 0);
    if (rank < 0) return Skip(ctx, anchor, "ids rank unknown");
    if (rank != 1 && rank != 2)
      return Skip(ctx, anchor, "ids of rank " + std::to_string(rank) + " (only [B] and [B, 1] fuse)");
    // [B, N] keys (all of a model's fields in one tensor) give [B, N, D] rows,
    // unless they are bags of a pooling, which the pooled patterns fuse whole.
    const bool one_per_row = rank == 1 || ctx->Dim(ids, 0, 1) == 1;
    if (!one_per_row && RowsArePooledBags(ctx, anchor, ids, 0, GatheredType(anchor, resource))) return false;
    const int table_rank = GatherTableRank(ctx, anchor, resource, rank);
    if (table_rank != 2)
      return Skip(ctx, anchor,
                  table_rank < 0 ? "cannot prove the table is a matrix (rank unknown)" : "the table is not a matrix");

    FlattenOfRows flatten;
    if (rank == 2 && one_per_row) MatchFlatten(ctx, anchor, &flatten);
    if (!one_per_row) rank = 0;  // the rows take the keys' shape (ShapedGatherOutput)

    // Everything checked: from here on the graph changes.
    if (!keys.int_keys.empty()) {
      RewriteIntKeys(anchor, keys, resource, T, rank, flatten, ctx);
    } else {
      RewriteStrings(anchor, keys, resource, T, rank, flatten, ctx);
    }
    return true;
  }

 private:
  // Each intermediate between the strings and the gather feeds only the next
  // one (the gradient of a gather reads its indices, so training graphs keep
  // them) -- or other gathers of the same keys too: those nodes stay.
  static bool OnlyFeedsTheGather(const GraphIndex& g, const NodeDef& anchor, HashedKeys* keys, std::string* why) {
    const NodeDef* wrapped = keys->wrap.empty() ? nullptr : g.Producer(*keys->wrap[0], 2);
    return SharedWithOtherGathers(g, keys->All(), anchor, wrapped, &keys->kept, why);
  }

  // The fused node in the gather's place: rank 1 and [B, 1] keys as
  // BecomeGatherOutput places it, rank 0 (keys [B, N]) reshaped to keys.shape + [D].
  static NodeDef* ShapedGatherOutput(RewriteContext* ctx, const NodeDef& anchor, const char* op, DataType T, int rank,
                                     const FlattenOfRows& flatten, const std::string& keys, DataType key_type,
                                     MatchRecord* record) {
    if (rank == 0) return BecomeGatherOutputOfKeys(ctx, anchor, op, T, keys, key_type);
    return BecomeGatherOutput(ctx, anchor, op, T, rank, flatten, record);
  }

  static MatchRecord Absorb(RewriteContext* ctx, const NodeDef& anchor, const HashedKeys& keys, const char* fused_op) {
    MatchRecord record{kName, anchor.name(), fused_op, {}};
    for (const NodeDef* n : keys.Absorbed()) {
      record.replaced.push_back(Describe(*n));
      ctx->RedirectControlEdges(n->name(), anchor.name());
      ctx->Remove(n->name(), anchor.name());
    }
    // The wrap's other operands (the table's row count, the constant 0) lose their reader.
    for (const NodeDef* n : keys.wrap)
      if (!keys.kept.count(n))
        for (int i = 0; i < n->input_size(); ++i)
          RemoveIfDeadShapeMath(ctx, ctx->index().Producer(*n, i), anchor.name(), 4);
    record.replaced.push_back(Describe(anchor));
    return record;
  }

  // `keys` (what the hash reads), cut as the slice of a field cut the hashed
  // keys; `keys` itself when the gather reads no slice.
  static std::string SlicedKeys(RewriteContext* ctx, const HashedKeys& hashed, const std::string& keys,
                                DataType type) {
    if (hashed.slice == nullptr) return keys;
    const NodeDef slice = *hashed.slice;
    NodeDef* n = ctx->AddNode(slice.name() + "/ctr_keys", "StridedSlice", slice.device());
    *n->mutable_input() = slice.input();
    n->set_input(0, keys);
    *n->mutable_attr() = slice.attr();
    (*n->mutable_attr())["T"].set_type(type);
    return n->name();
  }

  void RewriteStrings(const NodeDef& anchor_in, const HashedKeys& keys, bool resource, DataType T, int rank,
                      const FlattenOfRows& flatten, RewriteContext* ctx) const {
    const NodeDef anchor = anchor_in;  // the graph changes under the reference
    const std::string device = anchor.device();
    const std::string strings = SlicedKeys(ctx, keys, keys.hash->input(0), tensorflow::DT_STRING);
    const int64_t buckets = IntAttr(*keys.hash, "num_buckets", 0);
    std::vector<NodeDef> absorbed;
    for (const NodeDef* n : keys.Absorbed()) absorbed.push_back(*n);
    MatchRecord record = Absorb(ctx, anchor, keys, "CtrStringEmbedding");

    const std::string table = GatheredTable(ctx, anchor, resource, T);
    const std::string flat_strings = FlattenKeys(ctx, anchor.name(), strings, tensorflow::DT_STRING, rank, "");

    NodeDef* fused = ShapedGatherOutput(ctx, anchor, "CtrStringEmbedding", T, rank, flatten, strings,
                                        tensorflow::DT_STRING, &record);
    FusedStrings f{table, flat_strings, T};
    f.id_mode = "hash";
    f.num_buckets = buckets;  // whole strings (empty delimiter), each kept, summed alone: the gathered row
    f.hash_key = StringHashKey(*keys.hash);
    BecomeStringEmbedding(ctx, anchor.name(), device, f, fused);
    for (const NodeDef& n : absorbed) CopyControlInputs(n, fused);  // after the data inputs
    ctx->Matched(record);
  }

  // One key per row: row_splits 0, 1, ..., B.
  void RewriteIntKeys(const NodeDef& anchor_in, const HashedKeys& keys, bool resource, DataType T, int rank,
                      const FlattenOfRows& flatten, RewriteContext* ctx) const {
    const NodeDef anchor = anchor_in;
    const std::string device = anchor.device();
    const std::string base = anchor.name();
    const DataType kt = keys.key_type;
    const std::string int_keys = SlicedKeys(ctx, keys, keys.int_keys, kt);
    const int64_t buckets = IntAttr(*keys.hash, "num_buckets", 0);
    const std::vector<int64_t> hash_key = StringHashKey(*keys.hash);
    std::vector<NodeDef> absorbed;
    for (const NodeDef* n : keys.Absorbed()) absorbed.push_back(*n);
    MatchRecord record = Absorb(ctx, anchor, keys, "CtrEmbeddingLookup");

    const std::string table = GatheredTable(ctx, anchor, resource, T);
    const std::string flat = FlattenKeys(ctx, base, int_keys, kt, rank, device);
    NodeDef* size = ctx->AddNode(base + "/ctr_num_keys", "Size", device);
    size->add_input(flat);
    (*size->mutable_attr())["T"].set_type(kt);
    (*size->mutable_attr())["out_type"].set_type(tensorflow::DT_INT64);
    const std::string size_name = size->name();
    const std::string one = AddInt64Scalar(ctx, base + "/ctr_one", 1, device);
    NodeDef* limit = ctx->AddNode(base + "/ctr_splits_limit", "AddV2", device);
    limit->add_input(size_name);
    limit->add_input(one);
    (*limit->mutable_attr())["T"].set_type(tensorflow::DT_INT64);
    const std::string limit_name = limit->name();
    const std::string zero = AddInt64Scalar(ctx, base + "/ctr_zero", 0, device);
    NodeDef* range = ctx->AddNode(base + "/ctr_splits", "Range", device);
    range->add_input(zero);
    range->add_input(limit_name);
    range->add_input(one);
    (*range->mutable_attr())["Tidx"].set_type(tensorflow::DT_INT64);
    const std::string splits = range->name();
    const std::string num_rows = AddInt64Scalar(ctx, base + "/ctr_num_rows", -1, device);
    const std::string weights = AddEmptyFloatVector(ctx, base + "/ctr_no_weights", device);

    NodeDef* fused = ShapedGatherOutput(ctx, anchor, "CtrEmbeddingLookup", T, rank, flatten, int_keys, kt, &record);
    for (const NodeDef& n : absorbed) CopyControlInputs(n, fused);
    for (const std::string& in : {table, flat, splits, num_rows, weights}) fused->add_input(in);
    auto& attr = *fused->mutable_attr();
    attr["T"].set_type(T);
    attr["Tid"].set_type(kt);
    attr["Tseg"].set_type(tensorflow::DT_INT64);
    attr["combiner"].set_s("sum");
    attr["segment_kind"].set_s("row_splits");
    attr["id_mode"].set_s("hash");
    attr["invalid_ids"].set_s("error");
    attr["prune_weights"].set_b(false);
    attr["default_id"].set_i(-1);
    attr["max_norm"].set_f(-1.f);
    attr["has_weights"].set_b(false);
    attr["num_buckets"].set_i(buckets);
    SetHashKeyAttr(hash_key, fused);
    ctx->Matched(record);
  }
};

REGISTER_CTR_FUSION_PATTERN(HashGatherPattern);

}  // namespace
}  // namespace grappler
}  // namespace tf_ctr

// Pattern: a single-valued hashed feature, one table row per string --
// tf.nn.embedding_lookup(table, tf.strings.to_hash_bucket_fast(s, n)) and
// keras.layers.Hashing(n) + keras.layers.Embedding:
//
//   h = StringToHashBucketFast(strings)        strings [B] or [B, 1]
//   [Keras 3: h = SelectV2(Less(h, 0), AddV2(h, rows), h)]
//   {ResourceGather | GatherV2}(table, h)
//
// becomes CtrStringEmbedding(table, CtrPackStrings(strings)) with an empty
// delimiter (each whole string is one token), skip_empty false and combiner
// sum: one row per string, bit-identical to the gather. [B, 1] strings go
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
// fuses the two into _TensorToHashBucketFast) become
// CtrEmbeddingLookup in hash mode with one key per row instead.
//
// Hashes of split tokens are left to the pooled patterns.
#include <climits>
#include <set>
#include <string>
#include <vector>

#include "cc/grappler/gathered_rows.h"
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
  std::vector<const NodeDef*> wrap;    // Keras' negative-index wrap: SelectV2, Less, AddV2
  std::string int_keys;                // what is hashed, when it is integers
  DataType key_type = tensorflow::DT_INVALID;

  std::vector<const NodeDef*> Absorbed() const {
    std::vector<const NodeDef*> all = wrap;
    for (const NodeDef* n : {cast, hash, as_string})
      if (n != nullptr) all.push_back(n);
    return all;
  }
};

// Keras 3's take() wraps negative indices: SelectV2(Less(h, 0), AddV2(h, n), h).
// A hash bucket is never negative, so the select always yields h.
const NodeDef* UnwrapNegativeIndexFix(const GraphIndex& g, const NodeDef* select, HashedKeys* keys) {
  if (!IsOp(select, "SelectV2")) return select;
  const NodeDef* less = g.Producer(*select, 0);
  const NodeDef* add = g.Producer(*select, 1);
  int h_port = 0, port = 0;
  const NodeDef* h = g.Producer(*select, 2, &h_port);
  int64_t zero = -1;
  if (!IsOp(less, "Less") || !IsOp(add, "AddV2") || h == nullptr || h_port != 0) return select;
  if (g.Producer(*less, 0, &port) != h || port != 0 || !ConstScalarInt(g.Producer(*less, 1), &zero) || zero != 0)
    return select;
  // AddV2 commutes, and Grappler's canonicalization may put the constant first.
  int port1 = 0;
  const bool adds_h = (g.Producer(*add, 0, &port) == h && port == 0) || (g.Producer(*add, 1, &port1) == h && port1 == 0);
  if (!adds_h) return select;
  keys->wrap = {select, less, add};
  return h;
}

// Keras' Flatten of the gathered rows (through the Identity that
// tf.nn.embedding_lookup ends in), or a Squeeze of their axis 1: `reshape`
// is the node whose [B, D] output the fused op's equals (the Squeeze has no
// shape, slice or pack).
struct FlattenOfRows {
  std::vector<std::string> identities;
  std::string shape, slice, pack, reshape;
  bool found() const { return !reshape.empty(); }
};

bool HasControlInputs(const NodeDef& n) {
  for (const auto& in : n.input())
    if (!in.empty() && in[0] == '^') return true;
  return false;
}

// Reshape(rows, [b, D]) with a constant shape: Keras' Flatten once Grappler
// has folded its Shape(rows)[0] (a function specialized to its call's batch,
// as online rewriting sees it), b that known batch, or -1 with D > 0 (a -1
// beside a 0 fails on an empty batch, where the fused op would not).
bool IsConstantFlatten(RewriteContext* ctx, const NodeDef& gather, const NodeDef& rows, const NodeDef* reshape) {
  std::vector<int64_t> shape;
  if (!IsOp(reshape, "Reshape") || ctx->index().Producer(*reshape, 0) != &rows || HasControlInputs(*reshape) ||
      ctx->MustKeep(reshape->name()))
    return false;
  if (!ConstIntVector(ctx->index().Producer(*reshape, 1), &shape) || shape.size() != 2) return false;
  const int64_t batch = ctx->Dim(gather, 0, 0), dim = ctx->Dim(gather, 0, 2);
  return dim >= 0 && shape[1] == dim && ((shape[0] == -1 && dim > 0) || (batch >= 0 && shape[0] == batch));
}

// Whether the gather's [B, 1, D] output feeds nothing but a Flatten to
// [B, D] (D a known constant): then the Flatten's output is exactly the
// fused op's, bit for bit. Control edges on the gather stay valid (the
// fused node takes its name); the nodes in between must have none.
bool MatchFlatten(RewriteContext* ctx, const NodeDef& gather, FlattenOfRows* f) {
  const GraphIndex& g = ctx->index();
  if (ctx->MustKeep(gather.name())) return false;
  if (ctx->Rank(gather, 0) != 3 || ctx->Dim(gather, 0, 1) != 1) return false;
  const NodeDef* rows = &gather;
  std::vector<std::string> identities;
  while (g.DataConsumers(rows->name()) == 1) {
    const NodeDef* next = g.DataReaders(rows->name())[0];
    if (!IsOp(next, "Identity")) break;  // a Squeeze, say
    if (ctx->MustKeep(next->name()) || HasControlInputs(*next)) return false;
    if (rows != &gather && g.ControlConsumers(rows->name()) != 0) return false;
    identities.push_back(next->name());
    rows = next;
  }
  if (rows != &gather && g.ControlConsumers(rows->name()) != 0) return false;
  if (g.DataConsumers(rows->name()) == 1) {
    const NodeDef* squeeze = g.DataReaders(rows->name())[0];
    if (IsConstantFlatten(ctx, gather, *rows, squeeze)) {
      *f = FlattenOfRows{identities, "", "", "", squeeze->name()};
      return true;
    }
    if (!IsSqueezeOfAxis(squeeze, 1, 3) || g.Producer(*squeeze, 0) != rows || HasControlInputs(*squeeze) ||
        ctx->MustKeep(squeeze->name()))
      return false;
    *f = FlattenOfRows{identities, "", "", "", squeeze->name()};
    return true;
  }
  if (g.DataConsumers(rows->name()) != 2) return false;
  const NodeDef *shape = nullptr, *reshape = nullptr;
  for (const NodeDef* r : g.DataReaders(rows->name())) {
    if (IsOp(r, "Shape") && g.Producer(*r, 0) == rows) shape = r;
    if (IsOp(r, "Reshape") && g.Producer(*r, 0) == rows) reshape = r;
  }
  if (shape == nullptr || reshape == nullptr) return false;
  const NodeDef* pack = g.Producer(*reshape, 1);
  if (!IsOp(pack, "Pack") || IntAttr(*pack, "axis", 0) != 0 || pack->input_size() != 2) return false;
  const NodeDef* slice = g.Producer(*pack, 0);
  if (!IsFirstElementSlice(g, slice) || g.Producer(*slice, 0) != shape) return false;
  int64_t dim = -1;
  if (!ConstScalarInt(g.Producer(*pack, 1), &dim) || dim < 0 || ctx->Dim(gather, 0, 2) != dim) return false;
  for (const NodeDef* n : {shape, slice, pack})
    if (g.DataConsumers(n->name()) != 1 || g.ControlConsumers(n->name()) != 0 || ctx->MustKeep(n->name()))
      return false;
  for (const NodeDef* n : {shape, slice, pack, reshape})
    if (HasControlInputs(*n)) return false;  // ordered after something: keep it simple, keep it
  if (ctx->MustKeep(reshape->name())) return false;
  *f = FlattenOfRows{identities, shape->name(), slice->name(), pack->name(), reshape->name()};
  return true;
}

bool IsIndexCast(const NodeDef* n) {
  return IsOp(n, "Cast") && TypeAttr(*n, "SrcT") == tensorflow::DT_INT64 && IsIndexDtype(TypeAttr(*n, "DstT"));
}

bool IsPlainAsString(const NodeDef& n) {
  return IsIndexDtype(TypeAttr(n, "T")) && IntAttr(n, "precision", -1) == -1 && IntAttr(n, "width", -1) == -1 &&
         !BoolAttr(n, "scientific", false) && !BoolAttr(n, "shortest", false) && StringAttr(n, "fill").empty();
}

class HashGatherPattern : public NamedPattern<kName> {
 public:
  bool Rewrite(const NodeDef& anchor, RewriteContext* ctx) const override {
    const bool resource = IsOp(&anchor, "ResourceGather");
    if (!resource && !IsOp(&anchor, "GatherV2")) return false;
    const GraphIndex& g = ctx->index();
    HashedKeys keys;
    const NodeDef* h = UnwrapNegativeIndexFix(g, g.Producer(anchor, 1), &keys);
    if (IsIndexCast(h)) {
      keys.cast = h;
      h = g.Producer(*h, 0);
    }
    // Grappler's remapper fuses AsString + StringToHashBucketFast on integers
    // into _TensorToHashBucketFast before custom optimizers run.
    const bool fused_int_hash = IsOp(h, "_TensorToHashBucketFast");
    if (!IsOp(h, "StringToHashBucketFast") && !fused_int_hash) return false;
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
    const DataType T = resource ? TypeAttr(anchor, "dtype") : TypeAttr(anchor, "Tparams");
    if (!IsEmbeddingDtype(T))
      return Skip(ctx, anchor, "table dtype " + tensorflow::DataType_Name(T) + " is not float, half or bfloat16");
    if (IntAttr(anchor, "batch_dims", 0) != 0) return Skip(ctx, anchor, "Gather has batch_dims != 0");
    if (!resource) {
      int64_t axis = -1;
      if (!ConstScalarInt(g.Producer(anchor, 2), &axis) || axis != 0)
        return Skip(ctx, anchor, "GatherV2 axis is not a constant 0");
    }
    if (keys.as_string != nullptr && !IsPlainAsString(*keys.as_string))
      return Skip(ctx, anchor, "AsString has formatting attributes");
    const int64_t buckets = IntAttr(*h, "num_buckets", 0);
    if (keys.cast != nullptr && TypeAttr(*keys.cast, "DstT") == tensorflow::DT_INT32 && buckets > INT32_MAX)
      return Skip(ctx, anchor, "hash buckets do not fit the int32 cast");
    if (!keys.wrap.empty() && !WrapIsScalarShift(ctx, keys))
      return Skip(ctx, anchor, "the negative-index wrap may broadcast (its shift is not known to be a scalar)");
    std::string why;
    if (!OnlyFeedsTheGather(g, keys, &why)) return Skip(ctx, anchor, why);
    const int rank = ctx->Rank(*h, 0);
    if (rank < 0) return Skip(ctx, anchor, "ids rank unknown");
    if (rank != 1 && rank != 2)
      return Skip(ctx, anchor, "ids of rank " + std::to_string(rank) + " (only [B] and [B, 1] fuse)");
    if (rank == 2 && ctx->Dim(*h, 0, 1) != 1) return Skip(ctx, anchor, "ids are [B, N] with N not known to be 1");
    const int table_rank = TableRank(ctx, anchor, resource, rank);
    if (table_rank != 2)
      return Skip(ctx, anchor,
                  table_rank < 0 ? "cannot prove the table is a matrix (rank unknown)" : "the table is not a matrix");

    FlattenOfRows flatten;
    if (rank == 2) MatchFlatten(ctx, anchor, &flatten);

    // Everything checked: from here on the graph changes.
    if (!keys.int_keys.empty()) {
      RewriteIntKeys(anchor, keys, resource, T, rank, flatten, ctx);
    } else {
      RewriteStrings(anchor, keys, resource, T, rank, flatten, ctx);
    }
    return true;
  }

 private:
  // A gather's output has rank ids + table - 1; the variable's declared shape
  // is the fallback.
  static int TableRank(RewriteContext* ctx, const NodeDef& gather, bool resource, int ids_rank) {
    const int out = ctx->Rank(gather, 0);
    if (out >= 0) return out - ids_rank + 1;
    int port = 0;
    const NodeDef* table = ctx->index().Producer(gather, 0, &port);
    if (!resource) return table == nullptr ? -1 : ctx->Rank(*table, port);
    NodeDef read;
    read.set_op("ReadVariableOp");
    read.add_input(gather.input(0));
    return ctx->Rank(read, 0);
  }

  // SelectV2 broadcasts: the wrap yields h itself only when AddV2(h, n) has
  // h's shape, that is when n is a scalar.
  static bool WrapIsScalarShift(RewriteContext* ctx, const HashedKeys& keys) {
    const NodeDef& add = *keys.wrap[2];
    const GraphIndex& g = ctx->index();
    const NodeDef* h = keys.cast != nullptr ? keys.cast : keys.hash;
    int port = 0;
    const NodeDef* shift = g.Producer(add, 0, &port);
    if (shift == h) shift = g.Producer(add, 1, &port);
    return shift != nullptr && ctx->Rank(*shift, port) == 0;
  }

  // Each intermediate between the strings and the gather feeds only the next
  // one (the gradient of a gather reads its indices, so training graphs keep them).
  static bool OnlyFeedsTheGather(const GraphIndex& g, const HashedKeys& keys, std::string* why) {
    auto only = [&](const NodeDef* n, int readers) {
      if (n == nullptr || g.DataConsumers(n->name()) == readers) return true;
      *why = "intermediate " + Describe(*n) + " has another consumer";
      return false;
    };
    for (const NodeDef* n : keys.wrap)
      if (!only(n, 1)) return false;
    const int index_readers = keys.wrap.empty() ? 1 : 3;  // the wrap reads the index three times
    if (keys.cast != nullptr) return only(keys.cast, index_readers) && only(keys.hash, 1) && only(keys.as_string, 1);
    return only(keys.hash, index_readers) && only(keys.as_string, 1);
  }

  static std::string Table(RewriteContext* ctx, const NodeDef& anchor, bool resource, DataType T) {
    if (!resource) return anchor.input(0);
    return AddReadVariable(ctx, anchor.name() + "/ctr_table", anchor.input(0), T, anchor.device());
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
      for (int i = 0; i < n->input_size(); ++i) RemoveIfDead(ctx, ctx->index().Producer(*n, i), anchor.name(), 4);
    record.replaced.push_back(Describe(anchor));
    return record;
  }

  // Removes `node` when the absorbed nodes were its only readers, and its own
  // inputs after it, down to `depth` levels: shape arithmetic only.
  static void RemoveIfDead(RewriteContext* ctx, const NodeDef* node, const std::string& fused, int depth) {
    static const char* kPure[] = {"Const", "Cast", "StridedSlice", "Shape"};
    if (node == nullptr || depth == 0 || ctx->index().DataConsumers(node->name()) != 1) return;
    bool pure = false;
    for (const char* op : kPure) pure |= node->op() == op;
    if (!pure || HasControlInputs(*node)) return;  // ordered after something: keep it simple, keep it
    ctx->Remove(node->name(), fused);
    for (int i = 0; i < node->input_size(); ++i) RemoveIfDead(ctx, ctx->index().Producer(*node, i), fused, depth - 1);
  }

  // Flattens [B, 1] keys to [B] (a Reshape to [-1]).
  static std::string Flat(RewriteContext* ctx, const std::string& base, const std::string& input, DataType t,
                          int rank, const std::string& device) {
    if (rank == 1) return input;
    NodeDef* shape = ctx->AddNode(base + "/ctr_flat_shape", "Const", device);
    (*shape->mutable_attr())["dtype"].set_type(tensorflow::DT_INT32);
    auto* v = (*shape->mutable_attr())["value"].mutable_tensor();
    v->set_dtype(tensorflow::DT_INT32);
    v->mutable_tensor_shape()->add_dim()->set_size(1);
    v->add_int_val(-1);
    NodeDef* reshape = ctx->AddNode(base + "/ctr_flat", "Reshape", device);
    reshape->add_input(input);
    reshape->add_input(shape->name());
    (*reshape->mutable_attr())["T"].set_type(t);
    (*reshape->mutable_attr())["Tshape"].set_type(tensorflow::DT_INT32);
    return reshape->name();
  }

  // The Flatten's readers read the fused [B, D] output instead; its nodes,
  // and the constants only they read, go.
  static void AbsorbFlatten(RewriteContext* ctx, const std::string& fused, const FlattenOfRows& f,
                            MatchRecord* record) {
    const GraphIndex& g = ctx->index();
    std::set<std::string> replaced, consts;
    for (const std::string& name : {f.shape, f.slice, f.pack, f.reshape})
      if (!name.empty()) replaced.insert(name);
    replaced.insert(f.identities.begin(), f.identities.end());
    for (const std::string& name : replaced) {
      const NodeDef* n = g.Node(name);
      record->replaced.push_back(Describe(*n));
      for (int i = 0; i < n->input_size(); ++i) {
        const NodeDef* in = g.Producer(*n, i);
        if (IsOp(in, "Const")) consts.insert(in->name());
      }
    }
    ctx->RedirectDataEdges(f.reshape, 0, TensorName(fused, 0));
    ctx->RedirectControlEdges(f.reshape, fused);
    RemoveDeadNodes(ctx, consts, replaced, fused);
    for (const std::string& name : replaced) ctx->Remove(name, fused);
  }

  // Turns the anchor into the fused node (rank 1, or rank 2 read only by a
  // Flatten), or into ExpandDims of a new fused node (rank 2), keeping the
  // anchor's name for its consumers. Returns the fused node, inputs and
  // attributes still to fill.
  static NodeDef* BecomeOutput(RewriteContext* ctx, const NodeDef& anchor, const std::string& op, DataType T,
                               int rank, const FlattenOfRows& flatten, MatchRecord* record) {
    const std::string name = anchor.name(), device = anchor.device();
    const NodeDef old = anchor;
    NodeDef* fused;
    if (flatten.found()) AbsorbFlatten(ctx, name, flatten, record);
    if (rank == 1 || flatten.found()) {
      fused = ctx->Mutable(name);
      fused->clear_input();
      fused->clear_attr();
      fused->set_op(op);
    } else {
      fused = ctx->AddNode(name + "/ctr_fused", op, device);
      const std::string axis = AddInt64Scalar(ctx, name + "/ctr_axis", 1, device);
      NodeDef* expand = ctx->Mutable(name);
      expand->clear_input();
      expand->clear_attr();
      expand->set_op("ExpandDims");
      expand->add_input(fused->name());
      expand->add_input(axis);
      (*expand->mutable_attr())["T"].set_type(T);
      (*expand->mutable_attr())["Tdim"].set_type(tensorflow::DT_INT64);
      fused = ctx->Mutable(fused->name());  // AddNode may have moved it
    }
    CopyControlInputs(old, fused);
    return fused;
  }

  void RewriteStrings(const NodeDef& anchor_in, const HashedKeys& keys, bool resource, DataType T, int rank,
                      const FlattenOfRows& flatten, RewriteContext* ctx) const {
    const NodeDef anchor = anchor_in;  // the graph changes under the reference
    const std::string device = anchor.device();
    const std::string strings = keys.hash->input(0);
    const int64_t buckets = IntAttr(*keys.hash, "num_buckets", 0);
    std::vector<NodeDef> absorbed;
    for (const NodeDef* n : keys.Absorbed()) absorbed.push_back(*n);
    MatchRecord record = Absorb(ctx, anchor, keys, "CtrStringEmbedding");

    const std::string table = Table(ctx, anchor, resource, T);
    const std::string flat_strings = Flat(ctx, anchor.name(), strings, tensorflow::DT_STRING, rank, "");

    NodeDef* fused = BecomeOutput(ctx, anchor, "CtrStringEmbedding", T, rank, flatten, &record);
    FusedStrings f{table, flat_strings, T};
    f.id_mode = "hash";
    f.num_buckets = buckets;  // whole strings (empty delimiter), each kept, summed alone: the gathered row
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
    const std::string int_keys = keys.int_keys;
    const int64_t buckets = IntAttr(*keys.hash, "num_buckets", 0);
    std::vector<NodeDef> absorbed;
    for (const NodeDef* n : keys.Absorbed()) absorbed.push_back(*n);
    MatchRecord record = Absorb(ctx, anchor, keys, "CtrEmbeddingLookup");

    const std::string table = Table(ctx, anchor, resource, T);
    const std::string flat = Flat(ctx, base, int_keys, kt, rank, device);
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

    NodeDef* fused = BecomeOutput(ctx, anchor, "CtrEmbeddingLookup", T, rank, flatten, &record);
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
    ctx->Matched(record);
  }
};

REGISTER_CTR_FUSION_PATTERN(HashGatherPattern);

}  // namespace
}  // namespace grappler
}  // namespace tf_ctr

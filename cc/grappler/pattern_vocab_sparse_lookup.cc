// Pattern: a vocabulary lookup feeding a fused sparse lookup -- the
// vocabulary feature columns (categorical_column_with_vocabulary_list /
// _file) under an embedding column, and safe_embedding_lookup_sparse over
// table.lookup(sp_keys), once safe_lookup fused the lookup:
//
//   ids = LookupTableFindV2(table, keys, default)
//   [num_oov_buckets = n > 0, as IdTableWithHashBuckets looks keys up:
//      b   = StringToHashBucketFast(keys | AsString(keys), n)     (or _TensorToHashBucketFast)
//      ids = SelectV2(NotEqual(ids, default), ids, AddV2(b, LookupTableSizeV2(table)))]
//   CtrEmbeddingLookup(params, [Identity ->] [SparseReorder ->] ids, segments, num_rows, weights)   (index mode)
//
// becomes, under the lookup's name,
//
//   CtrVocabEmbeddingLookup(table, default, params, keys, segments, num_rows, weights)
//
// with num_oov_buckets n: the find, the buckets and the pooling in one CPU
// op, with no [nnz] tensor of ids between them. Exact: the op picks a key's
// bucket on the same condition (its found id equals the default), hashes it
// as the graph did and adds the same run-time table size; the pooling keeps
// the lookup's attrs. Lookup tables live on the host, so only where the
// graph is served on the CPU.
#include <set>
#include <string>
#include <vector>

#include "cc/grappler/pattern.h"
#include "cc/grappler/vocab_find.h"
#include "tensorflow/core/framework/attr_value.pb.h"

namespace tf_ctr {
namespace grappler {
namespace {

using tensorflow::DataType;
using tensorflow::NodeDef;

constexpr char kName[] = "vocab_sparse_lookup";
constexpr char kFusedOp[] = "CtrVocabEmbeddingLookup";

// Whether inputs `i` of `a` and `j` of `b` are one tensor.
bool SameTensor(const GraphIndex& g, const NodeDef& a, int i, const NodeDef& b, int j) {
  int pa = -1, pb = -1;
  const NodeDef* x = g.Producer(a, i, &pa);
  const NodeDef* y = g.Producer(b, j, &pb);
  return x != nullptr && x == y && pa == pb;
}

// Whether input `i` of `a` holds the find's default: the same tensor, or an
// equal integer constant.
bool IsFindDefault(const GraphIndex& g, const NodeDef& a, int i, const NodeDef& find) {
  if (SameTensor(g, a, i, find, 2)) return true;
  int64_t x = 0, y = 0;
  return ConstScalarInt(g.Producer(a, i), &x) && ConstScalarInt(g.Producer(find, 2), &y) && x == y;
}

// IdTableWithHashBuckets' out-of-vocabulary ids around a find.
struct OovBuckets {
  std::vector<const NodeDef*> nodes;  // SelectV2, NotEqual, AddV2, the hash [, AsString]
  const NodeDef* size = nullptr;      // LookupTableSizeV2 of the table
  int64_t buckets = 0;
};

// The hash of the find's keys: StringToHashBucketFast of the string keys or
// of AsString of the integer keys, or Grappler's fusion of the latter two.
bool MatchKeyHash(const GraphIndex& g, const NodeDef* hash, const NodeDef& find, OovBuckets* oov) {
  if (IsOp(hash, "_TensorToHashBucketFast")) {
    if (!SameTensor(g, *hash, 0, find, 1)) return false;
    oov->nodes.push_back(hash);
  } else if (IsOp(hash, "StringToHashBucketFast")) {
    oov->nodes.push_back(hash);
    if (!SameTensor(g, *hash, 0, find, 1)) {
      const NodeDef* as_string = g.Producer(*hash, 0);
      if (as_string == nullptr || !IsPlainAsString(*as_string) || !SameTensor(g, *as_string, 0, find, 1))
        return false;
      oov->nodes.push_back(as_string);
    }
  } else {
    return false;
  }
  oov->buckets = IntAttr(*hash, "num_buckets", 0);
  return true;
}

// SelectV2(NotEqual(find, default), find, AddV2(hash(keys), LookupTableSizeV2(table))),
// the operands of NotEqual and AddV2 in either order.
bool MatchOovBuckets(const GraphIndex& g, const NodeDef& select, VocabIds* ids, OovBuckets* oov) {
  int port = -1;
  const NodeDef* find = g.Producer(select, 1, &port);
  if (!IsOp(find, "LookupTableFindV2") || port != 0) return false;
  const NodeDef* differs = g.Producer(select, 0);
  const NodeDef* shifted = g.Producer(select, 2);
  if (!IsOp(differs, "NotEqual") || !(IsOp(shifted, "AddV2") || IsOp(shifted, "Add"))) return false;
  const bool find_first = g.Producer(*differs, 0, &port) == find && port == 0;
  if (!find_first && !(g.Producer(*differs, 1, &port) == find && port == 0)) return false;
  if (!IsFindDefault(g, *differs, find_first ? 1 : 0, *find)) return false;
  for (int s = 0; s < 2; ++s) {
    const NodeDef* size = g.Producer(*shifted, s);
    if (!IsOp(size, "LookupTableSizeV2") || !SameTensor(g, *size, 0, *find, 0)) continue;
    oov->nodes = {&select, differs, shifted};
    if (!MatchKeyHash(g, g.Producer(*shifted, 1 - s), *find, oov)) return false;
    oov->size = size;
    ids->find = find;
    return true;
  }
  return false;
}

class VocabSparseLookupPattern : public NamedPattern<kName> {
 public:
  // After safe_lookup made the CtrEmbeddingLookup this absorbs the find into.
  int Stage() const override { return 3; }

  bool Rewrite(const NodeDef& anchor, RewriteContext* ctx) const override {
    if (!IsOp(&anchor, "CtrEmbeddingLookup") || StringAttr(anchor, "id_mode") != "index") return false;
    const GraphIndex& g = ctx->index();
    VocabIds ids;
    OovBuckets oov;
    int port = 0;
    const NodeDef* x = TraceIdentities(g, g.Producer(anchor, 1, &port), &port, &ids);
    const NodeDef* reorder = nullptr;
    if (IsOp(x, "SparseReorder") && port == 1) {
      reorder = x;
      x = TraceIdentities(g, g.Producer(*x, 1, &port), &port, &ids);
    }
    if (port != 0) return false;
    if (IsSelect(x)) {
      if (!MatchOovBuckets(g, *x, &ids, &oov)) return false;
    } else if (IsOp(x, "LookupTableFindV2")) {
      ids.find = x;
    } else {
      return false;
    }

    // The subgraph has the right shape; now every condition for exactness.
    if (!ServedOnCpu(ctx, anchor))
      return Skip(ctx, anchor, "CtrVocabEmbeddingLookup runs on the CPU (lookup tables live on the host): "
                               "rewrite with serving_device='cpu' for a CPU server");
    if (TypeAttr(*ids.find, "Tout") != tensorflow::DT_INT64 || TypeAttr(anchor, "Tid") != tensorflow::DT_INT64)
      return Skip(ctx, anchor, "the table's values are not int64");
    const DataType key_type = TypeAttr(*ids.find, "Tin");
    if (key_type != tensorflow::DT_STRING && key_type != tensorflow::DT_INT64)
      return Skip(ctx, anchor, "keys are " + tensorflow::DataType_Name(key_type));
    if (!oov.nodes.empty() && oov.buckets <= 0)
      return Skip(ctx, anchor, "the out-of-vocabulary hash has no positive num_buckets");
    std::string why;
    if (!OnlyFeedTheLookup(ctx, ids, oov, &why)) return Skip(ctx, anchor, why);
    if (reorder != nullptr && (g.Consumers(reorder->name(), 1) != 1 || ctx->FetchedOrFed(reorder->name())))
      return Skip(ctx, anchor, "the values of " + Describe(*reorder) + " have another consumer");

    Replace(anchor, ids, oov, reorder, ctx);
    return true;
  }

 private:
  // Follows Identities up from `x` (read at *port), recording them.
  static const NodeDef* TraceIdentities(const GraphIndex& g, const NodeDef* x, int* port, VocabIds* ids) {
    while (IsOp(x, "Identity")) {
      ids->identities.push_back(x);
      x = g.Producer(*x, 0, port);
    }
    return x;
  }

  // Every intermediate feeds only the next one: the find the NotEqual and the
  // SelectV2 when there are buckets, each other node one reader.
  static bool OnlyFeedTheLookup(RewriteContext* ctx, const VocabIds& ids, const OovBuckets& oov, std::string* why) {
    const GraphIndex& g = ctx->index();
    auto only = [&](const NodeDef* n, int readers) {
      if (g.DataConsumers(n->name()) == readers && !ctx->FetchedOrFed(n->name())) return true;
      *why = "intermediate " + Describe(*n) + " has another consumer";
      return false;
    };
    for (const NodeDef* n : ids.identities)
      if (!only(n, 1)) return false;
    for (const NodeDef* n : oov.nodes)
      if (!only(n, 1)) return false;
    return only(ids.find, oov.nodes.empty() ? 1 : 2);
  }

  // A SparseReorder that the safe lookup put between the ids and the lookup
  // (ids not known to be in row order) permutes the keys instead: the find
  // is element-wise, so it commutes with the permutation.
  void Replace(const NodeDef& anchor_in, VocabIds ids, const OovBuckets& oov, const NodeDef* reorder_in,
               RewriteContext* ctx) const {
    const std::string reorder = reorder_in == nullptr ? "" : reorder_in->name();
    const NodeDef anchor = anchor_in;  // the graph changes under the reference
    const NodeDef find = *ids.find;
    const std::string name = anchor.name();
    MatchRecord record{kName, name, kFusedOp, {}};
    // The table size has no other reader once its AddV2 goes (a caller may
    // still ask for it).
    ids.wrap = oov.nodes;
    if (oov.size != nullptr && ctx->index().DataConsumers(oov.size->name()) == 1 &&
        !ctx->FetchedOrFed(oov.size->name()))
      ids.wrap.push_back(oov.size);
    // What the absorbed nodes waited on, the fused op waits on.
    std::vector<std::string> waits, kept_waits;
    std::set<std::string> absorbed = {find.name(), name};
    for (const std::vector<const NodeDef*>* nodes : {&ids.wrap, &ids.identities})
      for (const NodeDef* n : *nodes) {
        absorbed.insert(n->name());
        AppendControlInputs(*n, &waits);
      }
    AppendControlInputs(anchor, &waits);
    AppendControlInputs(find, &waits);
    for (const std::string& w : waits)
      if (!absorbed.count(w.substr(1))) kept_waits.push_back(w);
    AbsorbVocabNodes(ctx, ids, name, {}, &record.replaced);
    record.replaced.push_back(Describe(anchor));

    std::string keys = find.input(1);
    if (!reorder.empty()) {
      NodeDef* permute = ctx->Mutable(reorder);
      *permute->mutable_input(1) = keys;
      (*permute->mutable_attr())["T"].set_type(TypeAttr(find, "Tin"));
      keys = reorder + ":1";
    }
    NodeDef* fused = ctx->Mutable(name);
    fused->set_op(kFusedOp);
    fused->clear_input();
    for (const std::string& in : {find.input(0), find.input(2), anchor.input(0), keys, anchor.input(2),
                                  anchor.input(3), anchor.input(4)})
      fused->add_input(in);
    AddControlInputsOnce(kept_waits, fused);
    auto& attr = *fused->mutable_attr();
    for (const char* gone : {"Tid", "id_mode", "num_buckets", "grad_indices"}) attr.erase(gone);
    attr["Tkey"].set_type(TypeAttr(find, "Tin"));
    attr["num_oov_buckets"].set_i(oov.buckets);
    ctx->Matched(record);
  }
};

REGISTER_CTR_FUSION_PATTERN(VocabSparseLookupPattern);

}  // namespace
}  // namespace grappler
}  // namespace tf_ctr

// Pattern: strings split into a SparseTensor, converted to ids, then looked up
// by tf.nn.embedding_lookup_sparse or tf.nn.safe_embedding_lookup_sparse.
// The SparseTensor comes from
//
//   TF1: sp = StringSplit[V2](strings, sep)            (tf.compat.v1.string_split)
//        SparseTensor(sp.indices, convert(sp.values), sp.dense_shape)
//   TF2: rt = tf.strings.split(strings, sep)           (StringSplitV2 + row partition)
//        RaggedTensorToSparse(rt.row_splits, convert(rt.values))   (.to_sparse())
//
// with convert = StringToHashBucketFast or StringToNumber<int64>. Once
// sparse_segment_lookup (and, for the safe form, safe_lookup) fused the
// lookup, what is left is
//
//   CtrEmbeddingLookup(table, ids.values, ids.indices[:, 0], num_rows = -1)
//   safe: ids = SparseReorder(SparseReshape(ids, [B, W] -> [B, W])), invalid
//         ids skipped, num_rows = dense_shape[0]
//
// and it becomes CtrStringEmbedding(table, CtrPackStrings(strings)):
// trim_empty_tail keeps embedding_lookup_sparse's row count (last row id +
// 1); the safe form keeps every row and drops negative ids as it prunes them.
// Readers of the safe form's dense_shape that only take its first element
// (the batch, for the final reshape) read Shape(strings) instead.
#include <set>
#include <string>
#include <vector>

#include "cc/grappler/absorbed_set.h"
#include "cc/grappler/gathered_rows.h"
#include "cc/grappler/pattern.h"
#include "cc/grappler/split_source.h"
#include "tensorflow/core/framework/attr_value.pb.h"

namespace tf_ctr {
namespace grappler {
namespace {

using tensorflow::NodeDef;

constexpr char kName[] = "string_split_lookup";

// Whether `node` reads only element 0 of its input 0 (a [0:1] Slice, or x[0]).
bool TakesFirstElement(const GraphIndex& g, const NodeDef* node) {
  if (IsFirstElementSlice(g, node)) return true;
  return IsOp(node, "Slice") && ConstVectorIs(g.Producer(*node, 1), {0}) && ConstVectorIs(g.Producer(*node, 2), {1});
}

// The distinct nodes reading output `port` of `node` through data edges.
std::vector<const NodeDef*> DistinctPortReaders(const GraphIndex& g, const std::string& node, int port) {
  std::vector<const NodeDef*> out;
  for (const auto& [reader, input] : g.PortReaders(node, port))
    if (out.empty() || out.back() != reader) out.push_back(reader);
  return out;
}

// The SparseTensor a lookup reads, as tensor names.
struct SparseIds {
  std::string indices, values, shape;
};

// Everything the rewrite needs, gathered before the graph changes.
struct SplitLookup {
  SparseIds ids;  // the split's (or RaggedTensorToSparse's) own outputs
  bool safe = false;
  bool v1 = false;  // StringSplit: one-byte delimiter, skip_empty attribute
  const NodeDef* split = nullptr;
  const NodeDef* convert = nullptr;
  std::string delimiter;
  bool hashed = false;
  std::set<std::string> dead;                // nodes that die with the rewrite
  std::set<std::string> shape_readers;       // take dense_shape[0] only
  std::set<std::string> consumed;            // readers accounted for, by name
  std::vector<std::string> replaced;         // for the record
};

class StringSplitLookupPattern : public NamedPattern<kName> {
 public:
  bool Rewrite(const NodeDef& anchor, RewriteContext* ctx) const override {
    if (!IsOp(&anchor, "CtrEmbeddingLookup") || StringAttr(anchor, "segment_kind") != "row_ids" ||
        StringAttr(anchor, "id_mode") != "index")
      return false;
    const GraphIndex& g = ctx->index();
    const NodeDef* slice = g.Producer(anchor, 2);
    if (slice == nullptr || !IsFirstColumn(g, slice)) return false;
    SplitLookup m;
    std::string why;
    if (!UnwrapSafe(g, anchor, *slice, &m, &why)) return why.empty() ? false : Skip(ctx, anchor, why);
    if (!MatchSource(g, ctx, &m, &why)) return why.empty() ? false : Skip(ctx, anchor, why);

    // The subgraph has the right shape; now every condition for exactness.
    if (BoolAttr(anchor, "has_weights", false)) return Skip(ctx, anchor, "weighted lookup");
    const std::string invalid = StringAttr(anchor, "invalid_ids");
    if (invalid != (m.safe ? "skip_negative" : "error")) return Skip(ctx, anchor, "lookup drops ids otherwise");
    const int64_t default_id = IntAttr(anchor, "default_id", -1);
    if (!m.safe && default_id != -1) return Skip(ctx, anchor, "lookup defaults empty rows");
    // The lookup fails on a default_id that is not a table row only where a
    // row is left empty; the string op refuses it on every call.
    if (default_id != -1 && (default_id < 0 || default_id >= TableRows(ctx, anchor.input(0))))
      return Skip(ctx, anchor, "cannot prove default_id " + std::to_string(default_id) + " is a table row");
    if (BoolAttr(anchor, "prune_weights", false)) return Skip(ctx, anchor, "lookup prunes weights");
    if (!m.hashed && TypeAttr(*m.convert, "out_type") != tensorflow::DT_INT64)
      return Skip(ctx, anchor, "StringToNumber out_type is not int64");
    if (m.v1 && m.delimiter.size() != 1)
      return Skip(ctx, anchor, "StringSplit splits on each of several characters; only one-byte delimiters fuse");
    if (!m.v1 && IntAttr(*m.split, "maxsplit", -1) != -1) return Skip(ctx, anchor, "maxsplit is not -1");
    // StringSplit gives "" no token even with skip_empty=false; the fused
    // op's skip_empty=false is tf.strings.split's, which gives it one.
    if (m.v1 && !BoolAttr(*m.split, "skip_empty", true))
      return Skip(ctx, anchor, "StringSplit with skip_empty=false gives an empty string no token, where the "
                               "fused op (as tf.strings.split) would give it one empty token");
    if (m.delimiter.empty()) return Skip(ctx, anchor, "empty delimiter (whitespace or character splitting)");
    if (m.delimiter.size() > 16) return Skip(ctx, anchor, "delimiter longer than 16 bytes");
    if (!CheckConsumers(g, anchor, *slice, &m, &why)) return Skip(ctx, anchor, why);

    RewriteAsStrings(anchor, *slice, m, ctx);
    return true;
  }

 private:
  // The safe form: the ids went through an identity SparseReshape and a
  // SparseReorder, and the row count is dense_shape[0]. Sets m->ids to the
  // SparseTensor before them; otherwise to what the lookup reads directly.
  static bool UnwrapSafe(const GraphIndex& g, const NodeDef& anchor, const NodeDef& slice, SplitLookup* m,
                         std::string* why) {
    int keys_port = 0, rows_port = 0;
    const NodeDef* reorder = g.Producer(anchor, 1, &keys_port);
    if (!IsOp(reorder, "SparseReorder")) {
      int64_t num_rows = 0;
      if (!ConstScalarInt(g.Producer(anchor, 3), &num_rows) || num_rows != -1) {
        // A reason only for ids converted from strings: any other lookup
        // (a fused feature column's, say) is not this pattern's shape.
        const NodeDef* ids = g.Producer(anchor, 1);
        if (IsStringHash(ids) || IsOp(ids, "StringToNumber") || IsOp(ids, "RaggedTensorToSparse"))
          *why = "the lookup's row count is given explicitly";
        return false;
      }
      m->ids = SparseIds{slice.input(0), anchor.input(1), ""};
      return true;
    }
    if (keys_port != 1 || g.Producer(slice, 0, &rows_port) != reorder || rows_port != 0) return false;
    int port = 0;
    const NodeDef* reshape = g.Producer(*reorder, 0, &port);
    if (!IsOp(reshape, "SparseReshape") || port != 0) return false;
    if (g.Producer(*reorder, 2, &port) != reshape || port != 1) return false;
    std::vector<const NodeDef*> identities;
    int values_port = 0;
    const NodeDef* values = SkipIdentities(g, g.Producer(*reorder, 1, &values_port), &identities);
    if (values == nullptr) return false;
    if (!IsRank2Identity(g, *reshape)) {
      *why = "SparseReshape is not the safe lookup's reshape of 2-D ids to 2-D";
      return false;
    }
    const NodeDef* num_rows = g.Producer(anchor, 3, &port);
    if (!IsFirstElementSlice(g, num_rows) || g.Producer(*num_rows, 0, &port) != reshape || port != 1) {
      *why = "the lookup's row count is not dense_shape[0]";
      return false;
    }
    const std::string values_tensor = identities.empty() ? reorder->input(1) : identities.back()->input(0);
    m->safe = true;
    m->ids = SparseIds{reshape->input(0), values_tensor, reshape->input(1)};
    const NodeDef* pack = g.Producer(*reshape, 2);
    for (const NodeDef* n : {reorder, reshape, num_rows, pack, g.Producer(*pack, 0), g.Producer(*pack, 1),
                             g.Producer(*g.Producer(*pack, 0), 0)})
      m->dead.insert(n->name());
    for (const NodeDef* n : identities) m->dead.insert(n->name());
    m->consumed = {reshape->name(), g.Producer(*pack, 1)->name(), g.Producer(*g.Producer(*pack, 0), 0)->name()};
    m->replaced.push_back(Describe(*reshape));
    m->replaced.push_back(Describe(*reorder));
    return true;
  }

  // The safe lookup's flattening of 2-D ids, whose shape arithmetic only it reads.
  static bool IsRank2Identity(const GraphIndex& g, const NodeDef& reshape) {
    if (!IsFlattenToRank2(g, reshape)) return false;
    const NodeDef* pack = g.Producer(reshape, 2);
    const NodeDef* prod = g.Producer(*pack, 0);
    for (const NodeDef* n : {pack, prod, g.Producer(*prod, 0), g.Producer(*pack, 1)})
      if (g.DataConsumers(n->name()) != 1) return false;
    return true;
  }

  // m->ids is a string split's SparseTensor (TF1) or a split's ragged tokens
  // turned sparse (TF2).
  static bool MatchSource(const GraphIndex& g, RewriteContext* ctx, SplitLookup* m, std::string* why) {
    const TensorId indices = ParseTensorName(m->ids.indices);
    const TensorId values = ParseTensorName(m->ids.values);
    const NodeDef* producer = g.Node(indices.node);
    if (producer == nullptr || indices.port != 0) return false;
    if (IsOp(producer, "RaggedTensorToSparse")) {
      if (IntAttr(*producer, "RAGGED_RANK", 0) != 1 || !SameTensor(m->ids.values, TensorName(producer->name(), 1)))
        return false;
      if (m->safe && !SameTensor(m->ids.shape, TensorName(producer->name(), 2))) return false;
      int port = 0;
      const NodeDef* convert = g.Producer(*producer, 1, &port);
      SplitSource src;
      if (convert == nullptr || !MatchRaggedSplit(g, ctx, *convert, port, producer->input(0), &src, &m->dead)) {
        *why = "the sparse ids are not the converted tokens of tf.strings.split and its row partition";
        return false;
      }
      m->split = src.split;
      m->convert = src.convert;
      m->delimiter = src.delimiter;
      m->hashed = src.hashed;
      m->dead.insert({producer->name(), convert->name()});
      m->replaced.push_back(Describe(*producer));
    } else if (IsOp(producer, "StringSplit") || IsOp(producer, "StringSplitV2")) {
      const NodeDef* convert = g.Node(values.node);
      int port = 0;
      if (values.port != 0 || convert == nullptr || convert->input_size() < 1 ||
          g.Producer(*convert, 0, &port) != producer || port != 1)
        return false;
      if (!IsStringHash(convert) && !IsOp(convert, "StringToNumber")) return false;
      if (m->safe && !SameTensor(m->ids.shape, TensorName(producer->name(), 2))) {
        *why = "the sparse ids' dense_shape is not the split's";
        return false;
      }
      if (!ConstString(g.Producer(*producer, 1), &m->delimiter)) {
        *why = "the delimiter is not a constant";
        return false;
      }
      m->split = producer;
      m->convert = convert;
      m->hashed = IsStringHash(convert);
      m->v1 = IsOp(producer, "StringSplit");
      m->dead.insert({producer->name(), convert->name()});
    } else {
      return false;
    }
    m->replaced.push_back(Describe(*m->split));
    m->replaced.push_back(Describe(*m->convert));
    return true;
  }

  // Intermediates read only inside the subgraph; dense_shape read elsewhere
  // only for its first element (the batch).
  static bool CheckConsumers(const GraphIndex& g, const NodeDef& anchor, const NodeDef& slice, SplitLookup* m,
                             std::string* why) {
    const TensorId ind = ParseTensorName(m->ids.indices);
    const int index_readers = g.Consumers(ind.node, 0);
    if (index_readers != 1) {
      *why = "intermediate " + m->ids.indices + " has another consumer";
      return false;
    }
    if (g.DataConsumers(slice.name()) != 1) {
      *why = "intermediate " + Describe(slice) + " has another consumer";
      return false;
    }
    const TensorId vals = ParseTensorName(m->ids.values);
    if (g.Consumers(vals.node, vals.port) != 1 || g.DataConsumers(m->convert->name()) != 1) {
      *why = "intermediate " + Describe(*m->convert) + " has another consumer";
      return false;
    }
    if (m->v1 || IsOp(g.Node(ind.node), "StringSplitV2")) {
      if (g.Consumers(m->split->name(), 1) != 1) {
        *why = "intermediate " + Describe(*m->split) + " has another consumer";
        return false;
      }
    }
    const std::string shape = TensorName(ind.node, 2);
    for (const NodeDef* reader : DistinctPortReaders(g, ind.node, 2)) {
      if (m->consumed.count(reader->name())) continue;
      if (!m->safe || !ReadsOnlyFirstElement(g, *reader, shape)) {
        *why = "intermediate " + Describe(*g.Node(ind.node)) + " has another consumer (" + Describe(*reader) +
               " reads its dense_shape)";
        return false;
      }
      m->shape_readers.insert(reader->name());
    }
    (void)anchor;
    return true;
  }

  // `reader` uses `shape` (as every one of its data inputs that read it) for
  // element 0 only: it is such a slice, or a Cast only such slices read.
  static bool ReadsOnlyFirstElement(const GraphIndex& g, const NodeDef& reader, const std::string& shape) {
    if (reader.input_size() < 1 || !SameTensor(reader.input(0), shape)) return false;
    for (int i = 1; i < reader.input_size(); ++i)
      if (SameTensor(reader.input(i), shape)) return false;
    if (TakesFirstElement(g, &reader)) return true;
    if (!IsOp(&reader, "Cast")) return false;
    const std::vector<const NodeDef*> users = DistinctPortReaders(g, reader.name(), 0);
    if (users.empty() || g.DataConsumers(reader.name()) != static_cast<int>(users.size())) return false;
    for (const NodeDef* u : users)
      if (!TakesFirstElement(g, u) || !SameTensor(u->input(0), reader.name())) return false;
    return true;
  }

  void RewriteAsStrings(const NodeDef& anchor_in, const NodeDef& slice, const SplitLookup& m,
                        RewriteContext* ctx) const {
    const GraphIndex& g = ctx->index();
    const NodeDef anchor = anchor_in;
    const std::string name = anchor.name(), device = anchor.device();
    const std::string strings = m.split->input(0);
    MatchRecord record{kName, name, "CtrStringEmbedding", m.replaced};
    record.replaced.push_back(Describe(slice));
    record.replaced.push_back(Describe(anchor));

    std::set<std::string> dead = m.dead;
    dead.insert(slice.name());
    for (int i : {3, 4}) {  // the old lookup's num_rows and weights constants
      const NodeDef* c = g.Producer(anchor, i);
      if (IsOp(c, "Const")) dead.insert(c->name());
    }
    std::set<std::string> replaced = m.shape_readers;  // their dense_shape reads move to Shape(strings)
    replaced.insert(name);
    RemoveDeadNodes(ctx, dead, replaced, name);

    if (!m.shape_readers.empty()) {
      NodeDef* shape = ctx->AddNode(name + "/ctr_batch_shape", "Shape", "");
      shape->add_input(strings);
      (*shape->mutable_attr())["T"].set_type(tensorflow::DT_STRING);
      (*shape->mutable_attr())["out_type"].set_type(tensorflow::DT_INT64);
      const std::string dense_shape = TensorName(ParseTensorName(m.ids.indices).node, 2);
      const std::string shape_name = shape->name();
      for (const std::string& reader : m.shape_readers) {
        NodeDef* r = ctx->Mutable(reader);
        for (int i = 0; i < r->input_size(); ++i)
          if (SameTensor(r->input(i), dense_shape)) r->set_input(i, shape_name);
      }
    }

    NodeDef* fused = ctx->Mutable(name);
    fused->clear_input();
    fused->clear_attr();
    FusedStrings f{anchor.input(0), strings, anchor.attr().at("T").type(), anchor.attr().at("combiner").s()};
    f.vector_only = true;
    f.id_mode = m.hashed ? "hash" : "index";
    f.delimiter = m.delimiter;
    f.skip_empty = m.v1 ? BoolAttr(*m.split, "skip_empty", true) : false;
    f.max_norm = anchor.attr().at("max_norm").f();
    f.num_buckets = m.hashed ? IntAttr(*m.convert, "num_buckets", 0) : 0;
    if (m.hashed) f.hash_key = StringHashKey(*m.convert);
    f.grad = GradFormAttr(anchor);
    f.trim_empty_tail = !m.safe;  // embedding_lookup_sparse's rows end at the last row id + 1
    if (m.safe) {
      // Hash buckets are never negative: "error" keeps such features groupable.
      f.invalid_ids = m.hashed ? "error" : "skip_negative";
      f.default_id = IntAttr(anchor, "default_id", -1);
    }
    BecomeStringEmbedding(ctx, name, device, f, fused);
    CopyControlInputs(anchor, fused);
    ctx->Matched(record);
  }
};

REGISTER_CTR_FUSION_PATTERN(StringSplitLookupPattern);

}  // namespace
}  // namespace grappler
}  // namespace tf_ctr

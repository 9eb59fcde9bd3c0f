// Pattern: the mean or sum of gathered rows over a fixed-length id axis --
// Keras' Embedding + GlobalAveragePooling1D over padded ids, and
// tf.reduce_mean / reduce_sum(tf.nn.embedding_lookup(table, ids), axis=1):
//
//   rows = {ResourceGather | GatherV2}(table, ids [B, L]) [-> Identity]   [B, L, D]
//   {Mean | Sum}(rows, axis 1)                                              [B, D]
//
// becomes CtrEmbeddingLookup(table, Reshape(ids, [-1]), Range(0, B * L + 1,
// L)) in row_splits mode, combiner mean or sum: every bag holds its row's L
// ids, padding included, as the reduction counts them, and the fused op adds
// them in the same order. (Keras 3's negative-index wrap before the gather,
// if any, stays: the fused op reads the wrapped ids.)
//
// Keras' masked mean (Embedding(mask_zero=True) + GlobalAveragePooling1D)
// sums the rows of the ids that are not 0 and divides by their count:
//
//   mask = NotEqual(h, 0)     h: the ids, or their value before the wrap
//   Sum(SelectV2(ExpandDims(mask, -1), rows, 0), axis 1) / Sum(Cast(ExpandDims(mask, -1)), axis 1)
//
// The Sum becomes the same CtrEmbeddingLookup (sum) with the mask as
// weights, 1 or 0, and prune_weights: a masked id is dropped, not added as
// 0 * row (a row of inf would give NaN where the Select gives 0). Its id is
// 0, which the Gather accepts, so dropping it unchecked changes no error.
// The count and the division stay (an all-masked row is 0 / 0 = NaN in both).
//
// Exact only where: L is a known constant >= 1 (over an empty axis TF's mean
// is 0 / 0 = NaN, the fused op's 0); the table is a float32 matrix (TF
// reduces half types in their own precision, the fused op in float32); the
// rows have no other reader (a gradient's Shape of them, say); the reduced
// axis is dropped.
#include <algorithm>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cc/grappler/gathered_rows.h"
#include "cc/grappler/keras_gather.h"
#include "cc/grappler/pattern.h"
#include "cc/grappler/split_source.h"
#include "cc/grappler/vocab_find.h"

namespace tf_ctr {
namespace grappler {
namespace {

using tensorflow::DataType;
using tensorflow::NodeDef;

constexpr char kName[] = "dense_reduce_lookup";
constexpr char kVocabOp[] = "CtrVocabEmbeddingLookup";

// Range(0, size(keys) + 1, length) as int64: the row splits of bags of
// `length` consecutive keys.
std::string FixedLengthSplits(RewriteContext* ctx, const std::string& base, const std::string& keys,
                              DataType key_type, int64_t length, const std::string& device) {
  NodeDef* size = ctx->AddNode(base + "/size", "Size", device);
  size->add_input(keys);
  (*size->mutable_attr())["T"].set_type(key_type);
  (*size->mutable_attr())["out_type"].set_type(tensorflow::DT_INT64);
  NodeDef* limit = ctx->AddNode(base + "/limit", "AddV2", device);
  limit->add_input(size->name());
  limit->add_input(AddInt64Scalar(ctx, base + "/one", 1, device));
  (*limit->mutable_attr())["T"].set_type(tensorflow::DT_INT64);
  NodeDef* range = ctx->AddNode(base, "Range", device);
  range->add_input(AddInt64Scalar(ctx, base + "/start", 0, device));
  range->add_input(limit->name());
  range->add_input(AddInt64Scalar(ctx, base + "/length", length, device));
  (*range->mutable_attr())["Tidx"].set_type(tensorflow::DT_INT64);
  return range->name();
}

// Keras' mask select: SelectV2(ExpandDims(mask [B, L], -1 or 2), rows, 0).
struct MaskedRows {
  const NodeDef* select = nullptr;
  const NodeDef* not_equal = nullptr;
  int ids_operand = 0;    // of not_equal
  std::string mask;       // the bool [B, L] tensor
  std::string mask_of;    // the ids it compares with 0
  std::string zero;       // the Select's else constant
  bool found() const { return select != nullptr; }
};

// Whether `node` computes its value from a LookupTableFindV2 within a few
// elementwise steps (Keras' mask-token select, negative-index wrap, casts).
bool ComesFromTableFind(const GraphIndex& g, const NodeDef* node, int depth = 6) {
  if (node == nullptr || depth == 0) return false;
  if (IsOp(node, "LookupTableFindV2")) return true;
  static const char* kSteps[] = {"Identity", "SelectV2", "Select", "AddV2", "Less", "Cast"};
  bool step = false;
  for (const char* op : kSteps) step = step || IsOp(node, op);
  if (!step) return false;
  for (int i = 0; i < node->input_size() && node->input(i)[0] != '^'; ++i)
    if (ComesFromTableFind(g, g.Producer(*node, i), depth - 1)) return true;
  return false;
}

std::string UnknownIdsShape(const GraphIndex& g, const NodeDef* ids) {
  std::string why = "cannot prove the ids are a [B, L] matrix of a known L (their shape is unknown)";
  // Its keys' shape may not be its own: a table of vector keys (a
  // DenseHashTable's) finds one id per key vector.
  if (ComesFromTableFind(g, ids))
    why += ": they come from a lookup table's find, whose shape the table does not show (a table a function "
           "captures online; offline, a SavedModel shows a StaticHashTable's, not a MutableHashTable's)";
  return why;
}

bool MatchMaskSelect(const GraphIndex& g, const NodeDef* select, MaskedRows* m) {
  if (!IsOp(select, "SelectV2")) return false;
  const NodeDef* expand = g.Producer(*select, 0);
  int64_t axis = 0;
  if (!IsOp(expand, "ExpandDims") || !ConstScalarInt(g.Producer(*expand, 1), &axis) || (axis != 2 && axis != -1))
    return false;
  if (!IsZeroScalar(g, g.Producer(*select, 2))) return false;
  int mask_port = 0;
  const NodeDef* ne = g.Producer(*expand, 0, &mask_port);
  if (!IsOp(ne, "NotEqual") || mask_port != 0) return false;
  for (int side = 0; side < 2; ++side) {
    if (!IsZeroScalar(g, g.Producer(*ne, 1 - side))) continue;
    m->select = select;
    m->not_equal = ne;
    m->ids_operand = side;
    m->mask = expand->input(0);
    m->mask_of = ne->input(side);
    m->zero = ParseTensorName(select->input(2)).node;
    return true;
  }
  return false;
}

// Weights written by hand: Mul(rows, w [B, L] expanded to [B, L, 1]).
struct WeightedRows {
  const NodeDef* mul = nullptr;
  int rows_operand = 0;
  ExpandedWeights w;
  // The weights may not be [B, L] as the ids are: the Mul broadcasts them
  // (or the ids), so the fused op reads both broadcast to their common shape.
  bool broadcast = false;
  bool found() const { return mul != nullptr; }
};

// Whether input `i` of `node` is gathered rows (through Identities and Casts).
bool ReadsGatheredRows(const GraphIndex& g, const NodeDef& node, int i) {
  const NodeDef* x = g.Producer(node, i);
  while (IsOp(x, "Identity") || IsOp(x, "Cast")) x = g.Producer(*x, 0);
  return IsOp(x, "GatherV2") || IsOp(x, "ResourceGather");
}

bool MatchWeightedRows(const GraphIndex& g, const NodeDef* mul, WeightedRows* w) {
  if (!IsOp(mul, "Mul")) return false;
  for (int side = 0; side < 2; ++side) {
    if (!ReadsGatheredRows(g, *mul, side)) continue;
    w->mul = mul;
    w->rows_operand = side;
    return MatchExpandedWeights(g, g.Producer(*mul, 1 - side), &w->w);
  }
  return false;
}

// Whether `a` and `b` are one size: equal known dims, or one symbolic dim of
// Grappler's shape inference.
bool SameDim(int64_t a, int64_t b) { return a == b && (a >= 0 || a < -1); }

class DenseReduceLookupPattern : public NamedPattern<kName> {
 public:
  // After the first stage: a vocabulary lookup's gather goes to vocab_lookup
  // first, which also absorbs the table's find and Keras' checks; its
  // pooling then stays native.
  int Stage() const override { return 1; }

  bool Rewrite(const NodeDef& anchor, RewriteContext* ctx) const override {
    const bool mean = IsOp(&anchor, "Mean");
    if (!mean && !IsOp(&anchor, "Sum")) return false;
    const GraphIndex& g = ctx->index();
    MaskedRows masked;
    const NodeDef* input = g.Producer(anchor, 0);
    if (!mean && MatchMaskSelect(g, input, &masked)) input = g.Producer(*input, 1);
    if (IsOp(input, "Mul") && ReadsGatheredRows(g, *input, 0) && ReadsGatheredRows(g, *input, 1))
      return Skip(ctx, anchor, "it sums a product of gathered rows (their squares in an FM term or a max_norm "
                               "clip's norm, keys times a query in attention), not the rows");
    WeightedRows weighted;
    if (IsOp(input, "Mul") && (ReadsGatheredRows(g, *input, 0) || ReadsGatheredRows(g, *input, 1))) {
      if (mean)
        return Skip(ctx, anchor, "a mean of weighted rows divides by the id axis' length, where the fused op's "
                                 "weighted mean divides by the weights' sum");
      if (!MatchWeightedRows(g, input, &weighted))
        return Skip(ctx, anchor, "the gathered rows are multiplied by something other than weights [B, L] "
                                 "expanded on their last axis (ExpandDims(w, -1), w[..., None], Reshape(w, [-1, L, "
                                 "1])) before the reduction");
      input = g.Producer(*input, weighted.rows_operand);
    }
    std::vector<const NodeDef*> identities;
    const NodeDef* gather = SkipIdentities(g, input, &identities);
    // A mixed-precision policy's casts: the rows to the compute dtype, and
    // (keras.ops.mean) half rows back to float32 for the reduction.
    const NodeDef* cast = nullptr;
    for (int casts = 0; casts < 2 && IsOp(gather, "Cast"); ++casts) {
      cast = gather;  // the innermost: what the rows were cast from
      gather = SkipIdentities(g, g.Producer(*gather, 0), &identities);
    }
    const bool resource = IsOp(gather, "ResourceGather");
    if (!resource && !IsOp(gather, "GatherV2")) return false;
    int ids_port = 0;
    const NodeDef* ids = g.Producer(*gather, 1, &ids_port);
    if (ids == nullptr) return false;
    const int ids_rank = ctx->Rank(*ids, ids_port);
    if (ids_rank < 0 && IsAxisOne(g.Producer(anchor, 1)))
      return Skip(ctx, anchor, UnknownIdsShape(g, ids));  // padded ids [B, L], perhaps: say why it cannot tell
    if (ids_rank != 2) return false;  // not padded ids [B, L]

    // The subgraph has the right shape; now every condition for exactness.
    if (cast != nullptr)
      return Skip(ctx, anchor, "the gathered rows are cast from " +
                                   tensorflow::DataType_Name(TypeAttr(*cast, "SrcT")) + " to " +
                                   tensorflow::DataType_Name(TypeAttr(*cast, "DstT")) +
                                   " before the reduction (a mixed-precision policy): TF reduces the cast rows, the "
                                   "fused op would reduce the table's own");
    if (!IsAxisOne(g.Producer(anchor, 1))) return Skip(ctx, anchor, "it does not reduce the id axis (1) alone");
    if (BoolAttr(anchor, "keep_dims", false)) return Skip(ctx, anchor, "it keeps the reduced axis");
    const DataType T = TypeAttr(anchor, "T");
    if (T != tensorflow::DT_FLOAT)
      return Skip(ctx, anchor, "data dtype " + tensorflow::DataType_Name(T) +
                                   " is not float32 (TF reduces each type in its own precision, the fused op in "
                                   "float32)");
    std::string why;
    if (!GathersWholeRows(g, *gather, &why)) return Skip(ctx, anchor, why);
    const int table_rank = GatherTableRank(ctx, *gather, resource, 2);
    if (table_rank != 2)
      return Skip(ctx, anchor,
                  table_rank < 0 ? "cannot prove the table is a matrix (rank unknown)" : "the table is not a matrix");
    const int64_t length = ctx->Dim(*ids, ids_port, 1);
    if (length == 0) return Skip(ctx, anchor, "the id axis is empty (TF's mean over it is 0 / 0)");
    if (length < 0) return Skip(ctx, anchor, "the length of the id axis is not a known constant");
    for (const NodeDef* n : identities)
      if (g.DataConsumers(n->name()) != 1) return Skip(ctx, anchor, OtherConsumer(*n));
    if (g.DataConsumers(gather->name()) != 1) return Skip(ctx, anchor, OtherConsumer(*gather));
    if (masked.found()) {
      if (g.DataConsumers(masked.select->name()) != 1) return Skip(ctx, anchor, OtherConsumer(*masked.select));
      // The masked ids must be 0 where the Gather reads them: the mask
      // compares the gathered ids, or the ids Keras' wrap maps to them.
      std::vector<const NodeDef*> wrap;
      const NodeDef* ids_node = g.Node(ParseTensorName(gather->input(1)).node);
      UnwrapNegativeIndexFix(g, ids_node, &wrap);
      const bool same = SameTensor(masked.mask_of, gather->input(1)) ||
                        (!wrap.empty() && SameTensor(masked.mask_of, wrap[0]->input(2)));
      if (!same) return Skip(ctx, anchor, "the mask does not compare the gathered ids with 0");
    }
    if (weighted.found() && !WeightsFit(ctx, *ids, ids_port, length, &weighted, &why)) return Skip(ctx, anchor, why);
    const DataType id_type = TypeAttr(*gather, "Tindices");
    if (!IsIndexDtype(id_type)) return Skip(ctx, anchor, "ids are not int32/int64");
    // The ids of a vocabulary lookup (StringLookup / IntegerLookup): its find
    // goes into the fused op where it can; else the pooling fuses alone.
    VocabIds vocab;
    const bool from_vocab = TraceToFind(g, UnwrapNegativeIndexFix(g, ids, &vocab.wrap), &vocab);
    std::vector<const NodeDef*> dead_masks;
    const bool fuse_find =
        from_vocab && FindFuses(ctx, anchor, *gather, resource, masked, &vocab, &dead_masks, &why);
    if (from_vocab && !fuse_find)
      ctx->LeftOutOfMatch(kName, vocab.find->name(), "the pooling fused without the find: " + why);

    // Everything checked: from here on the graph changes.
    const NodeDef reduction = anchor;
    const std::string name = reduction.name(), device = reduction.device();
    if (fuse_find) {
      ReplaceWithVocabLookup(ctx, reduction, *gather, resource, identities, masked, weighted, vocab, dead_masks,
                             length);
      return true;
    }
    RowSource src;
    src.keys = gather->input(1);
    src.key_type = id_type;
    SetTableOfGather(*gather, resource, &src);
    src.absorbed = {gather};
    src.absorbed.insert(src.absorbed.end(), identities.begin(), identities.end());
    FuseHashProducer(ctx, &src, ServedOnCpu(ctx, reduction));
    const std::string axes = NodeOfInput(reduction.input(1));
    std::set<std::string> replaced{name};
    std::set<std::string> dead{axes};
    const MaskedRows mask = masked;
    if (mask.found()) {
      src.absorbed.push_back(mask.select);
      dead.insert(mask.zero);
    }
    const WeightedRows weights_of = weighted;
    if (weights_of.found()) AbsorbWeightedMul(weights_of, &src.absorbed, &dead);
    for (const NodeDef* n : src.absorbed) replaced.insert(n->name());
    RemoveDeadNodes(ctx, dead, replaced, name);

    std::string weights_in = weights_of.w.weights;
    if (weights_of.broadcast)
      std::tie(src.keys, weights_in) = BroadcastBags(ctx, name, src.keys, src.key_type, weights_of.w, device);
    const std::string splits = FixedLengthSplits(ctx, name + "/ctr_splits", src.keys, src.key_type, length, device);
    src.keys = FlattenKeys(ctx, name, src.keys, src.key_type, 2, device);
    const std::string num_rows = AddInt64Scalar(ctx, name + "/ctr_num_rows", -1, device);
    const std::string weights =
        mask.found() ? AddCast(ctx, name + "/ctr_mask_weights",
                               FlattenKeys(ctx, name + "/ctr_mask", mask.mask, tensorflow::DT_BOOL, 2, device),
                               tensorflow::DT_BOOL, tensorflow::DT_FLOAT, device)
        : weights_of.found() ? FlatWeights(ctx, name, weights_of.w, weights_in, device)
                             : AddEmptyFloatVector(ctx, name + "/ctr_no_weights", device);
    const std::string table = TableTensor(ctx, src, name + "/ctr_table");
    MatchRecord record{kName, name, "CtrEmbeddingLookup", {}};
    AbsorbSource(ctx, src, name, &record);
    record.replaced.push_back(Describe(reduction));
    BecomeFusedLookup(ctx, name, src,
                      FusedLookup{table, splits, num_rows, weights, T, tensorflow::DT_INT64, mean ? "mean" : "sum",
                                  mask.found() || weights_of.found()});
    auto& attr = *ctx->Mutable(name)->mutable_attr();
    attr["segment_kind"].set_s("row_splits");
    attr["prune_weights"].set_b(mask.found());  // masked ids are dropped, not added as 0 * row
    ctx->Matched(record);
    return true;
  }

 private:
  static std::string OtherConsumer(const NodeDef& n) { return "intermediate " + Describe(n) + " has another consumer"; }

  // The weights are float32 once cast as the graph casts them, and of rank
  // 2 or less, so that they broadcast against [B, L] ids as the Mul
  // broadcasts them against the rows; sets weighted->broadcast unless they
  // are known to be [B, L] as the ids are (the ids' length, and a batch
  // known to be theirs).
  static bool WeightsFit(RewriteContext* ctx, const NodeDef& ids, int ids_port, int64_t length,
                         WeightedRows* weighted, std::string* why) {
    const GraphIndex& g = ctx->index();
    const ExpandedWeights& w = weighted->w;
    const DataType to = w.cast != nullptr ? TypeAttr(*w.cast, "DstT") : w.type;
    if (to != tensorflow::DT_FLOAT) {
      *why = "the weights are " + tensorflow::DataType_Name(to) + ", not float32";
      return false;
    }
    if (w.cast != nullptr && w.type != tensorflow::DT_BOOL && !IsIndexDtype(w.type) && w.type != tensorflow::DT_FLOAT) {
      *why = "the weights are cast from " + tensorflow::DataType_Name(w.type);
      return false;
    }
    int port = 0;
    const NodeDef* weights = g.Producer(*w.expand, 0, &port);
    const int rank = weights == nullptr ? -1 : ctx->Rank(*weights, port);
    // A Reshape to [-1, L, 1] expands w only where w has L columns (else it
    // moves values between rows).
    if (w.reshaped_length != 0 &&
        (rank != 2 || ctx->Dim(*weights, port, 1) != w.reshaped_length || w.reshaped_length != length)) {
      *why = "the weights' Reshape to [-1, " + std::to_string(w.reshaped_length) +
             ", 1] is not known to keep each weight beside its id";
      return false;
    }
    if (rank < 0 || rank > 2) {
      *why = rank < 0 ? "the weights' rank is unknown" : "the weights have rank " + std::to_string(rank) + ", not 2";
      return false;
    }
    if (g.DataConsumers(weighted->mul->name()) != 1 || ctx->FetchedOrFed(weighted->mul->name())) {
      *why = "intermediate " + Describe(*weighted->mul) + " has another consumer";
      return false;
    }
    weighted->broadcast = !(rank == 2 && ctx->Dim(*weights, port, 1) == length &&
                            SameDim(ctx->Dim(*weights, port, 0), ctx->Dim(ids, ids_port, 0)));
    // The bags keep the ids' length L unless a single id broadcasts over
    // longer weights.
    if (weighted->broadcast && length == 1 && rank > 0 && ctx->Dim(*weights, port, rank - 1) != 1) {
      *why = "one id per row may broadcast over weights of another length";
      return false;
    }
    return true;
  }

  // Keys and weights broadcast to their common shape, as the Mul of the rows
  // and the expanded weights broadcasts them (an error where it fails);
  // BroadcastTo hands a tensor of that shape on as it is.
  static std::pair<std::string, std::string> BroadcastBags(RewriteContext* ctx, const std::string& name,
                                                           const std::string& keys, DataType key_type,
                                                           const ExpandedWeights& w, const std::string& device) {
    auto shape_of = [&](const std::string& x, DataType t, const char* suffix) {
      NodeDef* shape = ctx->AddNode(name + suffix, "Shape", device);
      shape->add_input(x);
      (*shape->mutable_attr())["T"].set_type(t);
      (*shape->mutable_attr())["out_type"].set_type(tensorflow::DT_INT64);
      return shape->name();
    };
    NodeDef* common = ctx->AddNode(name + "/ctr_bags_shape", "BroadcastArgs", device);
    common->add_input(shape_of(keys, key_type, "/ctr_keys_shape"));
    common->add_input(shape_of(w.weights, w.type, "/ctr_weights_shape"));
    (*common->mutable_attr())["T"].set_type(tensorflow::DT_INT64);
    const std::string shape = common->name();
    auto broadcast = [&](const std::string& x, DataType t, const char* suffix) {
      NodeDef* to = ctx->AddNode(name + suffix, "BroadcastTo", device);
      to->add_input(x);
      to->add_input(shape);
      (*to->mutable_attr())["T"].set_type(t);
      (*to->mutable_attr())["Tidx"].set_type(tensorflow::DT_INT64);
      return to->name();
    };
    return {broadcast(keys, key_type, "/ctr_keys_broadcast"), broadcast(w.weights, w.type, "/ctr_weights_broadcast")};
  }

  // The Mul goes with the fused op; the ExpandDims and its Cast where only it read them.
  static void AbsorbWeightedMul(const WeightedRows& weighted, std::vector<const NodeDef*>* absorbed,
                                std::set<std::string>* dead) {
    absorbed->push_back(weighted.mul);
    dead->insert(weighted.w.expand->name());
    dead->insert(weighted.w.constants.begin(), weighted.w.constants.end());
    if (weighted.w.cast != nullptr) dead->insert(weighted.w.cast->name());
  }

  // The weights (`weights`: w, or w broadcast to the bags) flattened to one
  // per id, as float32 (cast as the graph cast them).
  static std::string FlatWeights(RewriteContext* ctx, const std::string& name, const ExpandedWeights& w,
                                 const std::string& weights, const std::string& device) {
    const std::string flat = FlattenKeys(ctx, name + "/ctr_weights", weights, w.type, 2, device);
    if (w.type == tensorflow::DT_FLOAT) return flat;
    return AddCast(ctx, name + "/ctr_weights_cast", flat, w.type, tensorflow::DT_FLOAT, device);
  }

  // Whether CtrVocabEmbeddingLookup can take the find (and Keras' rules,
  // check and wrap) of the pooled ids with the pooling: served on the CPU,
  // the find's table one it reads, and every node between the find and the
  // gather read only by the next (and the mask's NotEqual, which then reads
  // the fused op's ids); else *why says why not.
  static bool FindFuses(RewriteContext* ctx, const NodeDef& anchor, const NodeDef& gather, bool resource,
                        const MaskedRows& masked, VocabIds* vocab, std::vector<const NodeDef*>* dead_masks,
                        std::string* why) {
    if (!ServedOnCpu(ctx, anchor)) {
      *why = "CtrVocabEmbeddingLookup runs on the CPU (lookup tables live on the host): rewrite with "
             "serving_device='cpu' for a CPU server";
      return false;
    }
    if (!FindTypesFuse(ctx, *vocab->find, why) || !FindOnAnchorDevice(*vocab->find, anchor, why) ||
        !MatchVocabWaits(ctx->index(), vocab, why))
      return false;
    if (!vocab->wrap.empty() && !WrapShiftIsRowCount(ctx, *vocab, gather, resource)) {
      *why = "cannot prove that the negative-index wrap adds the table's row count";
      return false;
    }
    if (!MaskIsScalar(ctx, vocab->rules)) {
      *why = "the mask key or its id is not a scalar";
      return false;
    }
    for (const NodeDef* n : vocab->check)
      if (ctx->FetchedOrFed(n->name())) {
        *why = "the caller reads " + Describe(*n);
        return false;
      }
    const NodeDef& pooled = PooledIds(*vocab);
    if (masked.found() && !SameTensor(masked.mask_of, pooled.name()) && !SameTensor(masked.mask_of, pooled.name() + ":0")) {
      *why = "the mask does not compare the lookup's ids with 0";
      return false;
    }
    *dead_masks = DeadMasksOf(ctx, pooled);
    const int readers = (vocab->wrap.empty() ? 1 : 3) + (masked.found() ? 1 : 0) + dead_masks->size();
    return LookupFeedsOnly(ctx, *vocab, readers, why);
  }

  // Keras computes a mask for every layer of a functional model: the masks
  // no layer reads are NotEquals of the ids nothing reads, which go with them.
  static std::vector<const NodeDef*> DeadMasksOf(RewriteContext* ctx, const NodeDef& ids) {
    const GraphIndex& g = ctx->index();
    std::vector<const NodeDef*> dead;
    for (const NodeDef* r : g.DataReaders(ids.name()))
      if (IsOp(r, "NotEqual") && g.DataConsumers(r->name()) == 0 && g.ControlConsumers(r->name()) == 0 &&
          !HasControlInputs(*r) && !ctx->MustKeep(r->name()) &&
          std::find(dead.begin(), dead.end(), r) == dead.end())
        dead.push_back(r);
    return dead;
  }

  // The ids the gather (through Keras' wrap) and Keras' mask read.
  static const NodeDef& PooledIds(const VocabIds& vocab) {
    return vocab.identities.empty() ? IdsSource(vocab) : *vocab.identities.front();
  }

  // CtrVocabEmbeddingLookup(table, default, params, keys [B * L], Range
  // splits, -1, no weights [, mask key, mask id]) in the reduction's place.
  // Keras' mask reads the fused op's ids ([B, L] again): with drop_zero_ids
  // the op drops the 0s the Select zeroed, and the count of the rest stays.
  static void ReplaceWithVocabLookup(RewriteContext* ctx, const NodeDef& reduction, const NodeDef& gather_in,
                                     bool resource, const std::vector<const NodeDef*>& identities,
                                     const MaskedRows& masked, const WeightedRows& weighted, const VocabIds& vocab,
                                     const std::vector<const NodeDef*>& dead_masks, int64_t length) {
    const std::string name = reduction.name(), device = reduction.device();
    const NodeDef gather = gather_in, find = *vocab.find;
    const DataType key_type = TypeAttr(find, "Tin");
    const KerasKeyRules rules = vocab.rules;
    const std::vector<std::string> masks =
        rules.mask == nullptr ? std::vector<std::string>{}
                              : std::vector<std::string>{rules.mask_equal->input(rules.mask_key_operand),
                                                         rules.mask->input(1)};
    MatchRecord record{kName, name, kVocabOp, {}};
    std::vector<std::string> extra{gather.name()};
    for (const NodeDef* n : identities) extra.push_back(n->name());
    if (masked.found()) {
      extra.push_back(masked.select->name());
      NodeDef* shape = ctx->AddNode(name + "/ctr_keys_shape", "Shape", device);
      shape->add_input(find.input(1));
      (*shape->mutable_attr())["T"].set_type(key_type);
      (*shape->mutable_attr())["out_type"].set_type(tensorflow::DT_INT32);
      NodeDef* ids = ctx->AddNode(name + "/ctr_ids", "Reshape", device);
      ids->add_input(TensorName(name, 1));
      ids->add_input(shape->name());
      (*ids->mutable_attr())["T"].set_type(tensorflow::DT_INT64);
      (*ids->mutable_attr())["Tshape"].set_type(tensorflow::DT_INT32);
      *ctx->Mutable(masked.not_equal->name())->mutable_input(masked.ids_operand) = ids->name();
    }
    for (const NodeDef* n : dead_masks) {
      extra.push_back(n->name());
      for (int i = 0; i < n->input_size(); ++i) RemoveIfDeadShapeMath(ctx, ctx->index().Producer(*n, i), name, 2);
      ctx->Remove(n->name(), name);
    }
    AbsorbVocabNodes(ctx, vocab, name, extra, &record.replaced);
    std::vector<const NodeDef*> rows{&gather};
    rows.insert(rows.end(), identities.begin(), identities.end());
    if (masked.found()) rows.push_back(masked.select);
    std::set<std::string> dead{NodeOfInput(reduction.input(1))};
    if (weighted.found()) AbsorbWeightedMul(weighted, &rows, &dead);
    for (const NodeDef* n : rows) {
      record.replaced.push_back(Describe(*n));
      ctx->RedirectControlEdges(n->name(), name);
    }
    record.replaced.push_back(Describe(reduction));
    std::set<std::string> replaced{name};
    for (const std::string& n : extra) replaced.insert(n);
    for (const NodeDef* n : rows) replaced.insert(n->name());
    if (masked.found()) dead.insert(masked.zero);
    RemoveDeadNodes(ctx, dead, replaced, name);
    for (const NodeDef* n : rows) ctx->Remove(n->name(), name);

    const std::string params = GatheredTable(ctx, gather, resource, tensorflow::DT_FLOAT);
    std::string bag_keys = find.input(1), weights = weighted.w.weights;
    if (weighted.broadcast) std::tie(bag_keys, weights) = BroadcastBags(ctx, name, bag_keys, key_type, weighted.w, device);
    const std::string splits = FixedLengthSplits(ctx, name + "/ctr_splits", bag_keys, key_type, length, device);
    const std::string keys = FlattenKeys(ctx, name, bag_keys, key_type, 2, device);
    NodeDef* fused = ctx->Mutable(name);
    const NodeDef old = *fused;
    fused->clear_input();
    fused->clear_attr();
    fused->set_op(kVocabOp);
    for (const std::string& in : {find.input(0), find.input(2), params, keys, splits,
                                  AddInt64Scalar(ctx, name + "/ctr_num_rows", -1, device),
                                  weighted.found() ? FlatWeights(ctx, name, weighted.w, weights, device)
                                                   : AddEmptyFloatVector(ctx, name + "/ctr_no_weights", device)})
      fused->add_input(in);
    for (const std::string& in : masks) fused->add_input(in);
    CopyControlInputs(old, fused);
    CopyControlInputs(find, fused);
    auto& attr = *fused->mutable_attr();
    attr["T"].set_type(tensorflow::DT_FLOAT);
    attr["Tseg"].set_type(tensorflow::DT_INT64);
    attr["Tkey"].set_type(key_type);
    attr["combiner"].set_s(IsOp(&old, "Mean") ? "mean" : "sum");
    attr["segment_kind"].set_s("row_splits");
    attr["invalid_ids"].set_s("error");
    attr["prune_weights"].set_b(false);
    attr["default_id"].set_i(-1);
    attr["max_norm"].set_f(-1.f);
    attr["has_weights"].set_b(weighted.found());
    attr["num_oov_buckets"].set_i(0);
    attr["missing_key"].set_s(vocab.assert_node != nullptr ? "error" : "default");
    attr["missing_id"].set_i(vocab.missing_id);
    attr["num_masks"].set_i(masks.empty() ? 0 : 1);
    attr["oov_slots"].set_i(rules.oov_slots);
    attr["oov_id"].set_i(rules.oov_id);
    attr["oov_start"].set_i(rules.oov_start);
    attr["wrap_negative_ids"].set_b(!vocab.wrap.empty());
    attr["drop_zero_ids"].set_b(masked.found());
    ctx->Matched(record);
  }

  static std::string NodeOfInput(const std::string& input) { return ParseTensorName(input).node; }
};

REGISTER_CTR_FUSION_PATTERN(DenseReduceLookupPattern);

}  // namespace
}  // namespace grappler
}  // namespace tf_ctr

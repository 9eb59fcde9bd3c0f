// Pattern: tf.nn.safe_embedding_lookup_sparse around a lookup that was already
// fused (sparse_segment_lookup, weighted_lookup, max_norm_lookup):
//
//   sr    = SparseReshape(ids, [prod(shape[:-1]), shape[-1]])
//   keep  = sparse_retain(sr, ids >= 0 [and ones_like(weights)])          (Where, Reshape, GatherV2 x2)
//         [ then sparse_retain(.., weights > 0) for combiners other than sum ]
//   fill  = SparseFillEmptyRows(kept ids, default_id or 0) [and of the weights, with 1.0]
//   pool  = CtrEmbeddingLookup(table, fill.values, fill.indices[:, 0] [-> Cast], -1, [fill_w.values])
//   out   = Select(Tile(Reshape(fill.empty_row_indicator, [-1, 1]), [1, D]), ZerosLike(pool), pool)
//           (only when default_id is None)
//   Reshape(out, concat(shape[:-1], Shape(out)[1:]))
//
// becomes
//
//   ids'  = SparseReorder(sr.indices, sr.values-of-ids, sr.shape) [and of the weights]
//   out   = CtrEmbeddingLookup(table, ids'.values, ids'.indices[:, 0], sr.shape[0], [w'.values])
//           with invalid_ids = skip_negative, prune_weights when the weights are pruned, default_id
//   Reshape(out, ...)                                                      (kept)
//
// SparseReshape stays: it linearizes ids of rank > 2 exactly as TF does. For
// ids of rank 2 straight from ParseExample (feature columns) it moves
// nothing: the fused op reads ParseExample's outputs, and the final Reshape
// to [shape[0], D], which the fused output already has, goes too (eleven
// small ops per feature).
// SparseReorder (a pass-through for ids in canonical order) stands in for the
// row sort SparseFillEmptyRows does for unordered ids; the fused op needs
// sorted rows. Where the ids are canonical by construction (ParseExample's
// sparse outputs and SparseCross's, which SparseReshapes keep in order) it is
// left out: a sort per feature that never moves anything. The row count is the reshaped
// dense shape's, as after SparseFillEmptyRows.
#include <algorithm>
#include <string>
#include <vector>

#include "cc/grappler/absorbed_set.h"
#include "cc/grappler/pattern.h"
#include "tensorflow/core/framework/attr_value.pb.h"

namespace tf_ctr {
namespace grappler {
namespace {

using tensorflow::NodeDef;

constexpr char kName[] = "safe_lookup";

// Follows Identity nodes from tensor `name` up to the first other producer's
// tensor, collecting the identities.
std::string ThroughIdentities(const GraphIndex& g, std::string name, std::vector<const NodeDef*>* identities) {
  for (const NodeDef* n = g.Node(ParseTensorName(name).node); IsOp(n, "Identity"); n = g.Node(ParseTensorName(name).node)) {
    identities->push_back(n);
    name = n->input(0);
  }
  return name;
}

// One sparse_retain: GatherV2(indices | values, Reshape(Where(mask), [-1]), 0).
struct Retain {
  std::string mask;
  const NodeDef* indices_gather = nullptr;
  const NodeDef* values_gather = nullptr;
  std::vector<const NodeDef*> selection;  // Reshape, Where (per gather pair)
};

// The mask of a retain selection Reshape(Where(mask), [-1]), or "".
std::string SelectionMask(const GraphIndex& g, const std::string& selection, std::vector<const NodeDef*>* nodes) {
  const NodeDef* reshape = g.Node(ParseTensorName(selection).node);
  if (!IsOp(reshape, "Reshape")) return "";
  std::vector<int64_t> shape;
  if (!ConstIntVector(g.Producer(*reshape, 1), &shape) || shape != std::vector<int64_t>{-1}) return "";
  const NodeDef* where = g.Producer(*reshape, 0);
  if (!IsOp(where, "Where")) return "";
  nodes->push_back(reshape);
  nodes->push_back(where);
  return where->input(0);
}

bool IsRowGather(const GraphIndex& g, const NodeDef* n) {
  int64_t axis = -1;
  return IsOp(n, "GatherV2") && IntAttr(*n, "batch_dims", 0) == 0 && ConstScalarInt(g.Producer(*n, 2), &axis) &&
         axis == 0;
}

// A SparseTensor traced back through its retains to the reshaped ids.
struct RetainChain {
  std::vector<Retain> retains;  // outermost first
  std::string base_indices;
  std::string base_values;
};

void TraceRetains(const GraphIndex& g, std::string indices, std::string values, RetainChain* chain) {
  for (;;) {
    const NodeDef* gi = g.Node(ParseTensorName(indices).node);
    const NodeDef* gv = g.Node(ParseTensorName(values).node);
    if (!IsRowGather(g, gi) || !IsRowGather(g, gv) || gi->input(1) != gv->input(1)) break;
    Retain r;
    r.mask = SelectionMask(g, gi->input(1), &r.selection);
    if (r.mask.empty()) break;
    r.indices_gather = gi;
    r.values_gather = gv;
    chain->retains.push_back(r);
    indices = gi->input(0);
    values = gv->input(0);
  }
  chain->base_indices = indices;
  chain->base_values = values;
}

bool IsConstInt(const NodeDef* n, int64_t want) {
  int64_t v = 0;
  return ConstScalarInt(n, &v) && v == want;
}

bool IsConstFloat(const NodeDef* n, float want) {
  float v = 0.f;
  return ConstScalarFloat(n, &v) && v == want;
}

// ones_like(w, dtype=bool): Fill(Shape(w), true) or OnesLike(w).
bool IsTrueLike(const GraphIndex& g, const NodeDef* n, const std::string& w, std::vector<const NodeDef*>* nodes) {
  if (IsOp(n, "OnesLike") && n->input(0) == w) {
    nodes->push_back(n);
    return true;
  }
  if (!IsOp(n, "Fill")) return false;
  const NodeDef* shape = g.Producer(*n, 0);
  const NodeDef* value = g.Producer(*n, 1);
  if (!IsOp(shape, "Shape") || shape->input(0) != w || !IsOp(value, "Const") || !value->attr().count("value"))
    return false;
  const auto& t = value->attr().at("value").tensor();
  if (t.dtype() != tensorflow::DT_BOOL || t.tensor_shape().dim_size() != 0 || t.bool_val_size() != 1 || !t.bool_val(0))
    return false;
  nodes->push_back(n);
  nodes->push_back(shape);
  return true;
}

// Everything the rewrite needs, found from the pooled lookup.
struct Safe {
  const NodeDef* fill = nullptr;
  const NodeDef* fill_w = nullptr;  // of the weights, when weighted
  const NodeDef* out = nullptr;  // the node whose output the fused lookup replaces
  const NodeDef* reshape = nullptr;  // SparseReshape
  std::string ids;      // reshaped ids' values (before any retain)
  std::string weights;  // weights' values (before any retain)
  bool prune_weights = false;
  int64_t default_id = -1;
  int64_t empty_grad_row = -1;
  std::vector<const NodeDef*> absorbed;
};

// The sparse ids the fused op reads.
struct SparseIds {
  std::string indices, shape;
  bool rank2 = false;  // read before a SparseReshape that moves nothing
};

class SafeLookupPattern : public NamedPattern<kName> {
 public:
  // Anchored at the zeroing Select when default_id is None, else at the
  // pooled lookup itself.
  bool Rewrite(const NodeDef& anchor, RewriteContext* ctx) const override {
    const GraphIndex& g = ctx->index();
    const NodeDef* pool = &anchor;
    const bool zeroed = IsSelect(&anchor);
    if (zeroed) pool = g.Producer(anchor, 2);
    if (!IsOp(pool, "CtrEmbeddingLookup") || StringAttr(*pool, "segment_kind") != "row_ids") return false;
    int port = 0;
    const NodeDef* fill = g.Producer(*pool, 1, &port);
    if (!IsOp(fill, "SparseFillEmptyRows") || port != 1) return false;
    // Empty rows zeroed by a Select are matched there (this record is then
    // dropped with the pass that rewrites it).
    if (!zeroed && g.Consumers(fill->name(), 2) > 0)
      return Skip(ctx, anchor, "the empty-row indicator of " + Describe(*fill) + " is read outside a zeroing Select");
    Safe s;
    s.fill = fill;
    s.out = &anchor;
    std::string why;
    if (zeroed && !ZeroingSelect(g, anchor, *pool, *fill, &s.absorbed))
      return Skip(ctx, anchor, "empty rows are not zeroed as safe_embedding_lookup_sparse zeroes them");
    if (zeroed) s.absorbed.push_back(pool);
    if (!Match(*pool, ctx, &s, &why)) return Skip(ctx, anchor, why);
    Fuse(*pool, ctx, s);
    return true;
  }

 private:
  static bool Match(const NodeDef& pool, RewriteContext* ctx, Safe* s, std::string* why) {
    const GraphIndex& g = ctx->index();
    auto fail = [&](const std::string& reason) {
      *why = reason;
      return false;
    };
    if (StringAttr(pool, "invalid_ids") != "error" || IntAttr(pool, "default_id", -1) != -1 ||
        BoolAttr(pool, "prune_weights", false))
      return fail("the pooled lookup already drops or defaults ids");
    int64_t num_rows = 0;
    if (!ConstScalarInt(g.Producer(pool, 3), &num_rows) || num_rows != -1)
      return fail("the pooled lookup's row count is given explicitly");
    const NodeDef* fill = s->fill;
    s->absorbed.push_back(fill);

    // Segments: fill.indices[:, 0], cast to int32 in the weighted form.
    const NodeDef* seg = g.Producer(pool, 2);
    if (IsOp(seg, "Cast")) {
      s->absorbed.push_back(seg);
      seg = g.Producer(*seg, 0);
    }
    int seg_port = 0;
    if (!IsFirstColumn(g, seg) || g.Producer(*seg, 0, &seg_port) != fill || seg_port != 0)
      return fail("segment ids are not the row column of the filled ids");
    s->absorbed.push_back(seg);

    // The ids: SparseReshape's output, through the retains.
    RetainChain ids;
    TraceRetains(g, fill->input(0), fill->input(1), &ids);
    std::vector<const NodeDef*> shape_ids;
    const std::string fill_shape = ThroughIdentities(g, fill->input(2), &shape_ids);
    const NodeDef* sr = g.Node(ParseTensorName(ids.base_indices).node);
    if (!IsOp(sr, "SparseReshape") || ParseTensorName(ids.base_indices).port != 0 ||
        fill_shape != TensorName(sr->name(), 1))
      return fail("the filled ids are not retained from one SparseReshape of the ids");
    s->reshape = sr;
    s->ids = ids.base_values;
    s->absorbed.insert(s->absorbed.end(), shape_ids.begin(), shape_ids.end());

    // The weights: filled with 1.0, from the same reshape through the same retains.
    const bool weighted = BoolAttr(pool, "has_weights", false);
    RetainChain w;
    if (weighted) {
      int port = 0;
      const NodeDef* fill_w = g.Producer(pool, 4, &port);
      if (!IsOp(fill_w, "SparseFillEmptyRows") || port != 1 || !IsConstFloat(g.Producer(*fill_w, 3), 1.f))
        return fail("the weights are not filled with 1.0 for empty rows");
      s->fill_w = fill_w;
      s->absorbed.push_back(fill_w);
      TraceRetains(g, fill_w->input(0), fill_w->input(1), &w);
      std::vector<const NodeDef*> shape_w;
      if (w.base_indices != ids.base_indices || ThroughIdentities(g, fill_w->input(2), &shape_w) != fill_shape)
        return fail("the weights are not indexed like the ids");
      s->absorbed.insert(s->absorbed.end(), shape_w.begin(), shape_w.end());
      if (w.retains.size() != ids.retains.size()) return fail("the ids and the weights are retained differently");
      for (size_t i = 0; i < w.retains.size(); ++i)
        if (w.retains[i].mask != ids.retains[i].mask) return fail("the ids and the weights are retained differently");
      s->weights = w.base_values;
    }

    // The retains, innermost first: ids >= 0 [and ones_like(w)], then w > 0.
    const size_t n = ids.retains.size();
    if (n == 0 || n > (weighted ? 2u : 1u))
      return fail("the ids are not pruned as safe_embedding_lookup_sparse prunes them");
    std::vector<const NodeDef*> mask_nodes;
    if (!IsIdMask(g, ids.retains[n - 1].mask, ids.base_values, weighted ? w.base_values : "", &mask_nodes))
      return fail("the first retain is not ids >= 0");
    if (n == 2) {
      const NodeDef* greater = g.Node(ParseTensorName(ids.retains[0].mask).node);
      const std::string kept_weights = w.retains[1].values_gather->name();
      if (!IsOp(greater, "Greater") || greater->input(0) != kept_weights ||
          !IsConstFloat(g.Producer(*greater, 1), 0.f))
        return fail("the second retain is not weights > 0");
      mask_nodes.push_back(greater);
      s->prune_weights = true;
    }
    for (const RetainChain* chain : {&ids, &w}) {
      for (const Retain& r : chain->retains) {
        s->absorbed.push_back(r.indices_gather);
        s->absorbed.push_back(r.values_gather);
        s->absorbed.insert(s->absorbed.end(), r.selection.begin(), r.selection.end());
      }
    }
    s->absorbed.insert(s->absorbed.end(), mask_nodes.begin(), mask_nodes.end());

    // Rows left empty: zeros (the Select) or the filled default id.
    int64_t fill_value = 0;
    if (!ConstScalarInt(g.Producer(*fill, 3), &fill_value)) return fail("the fill value is not a constant");
    if (s->out == &pool) {
      // Only a proven row: fused ops downstream (the string forms) refuse
      // any other default_id on every call, where TF fails only on a row
      // left empty.
      if (fill_value < 0) return fail("default_id " + std::to_string(fill_value) + " is negative");
      const int64_t rows = TableRows(ctx, pool.input(0));
      if (rows < 0 || fill_value >= rows)
        return fail(rows < 0 ? "cannot prove default_id is a table row (table rows unknown)"
                             : "default_id " + std::to_string(fill_value) + " is not a table row");
      s->default_id = fill_value;
    } else {
      // The zeroed rows' filled id still reads its row in TF's graph: its
      // gradient lists that row, with zeros.
      s->empty_grad_row = fill_value;
    }
    std::string outsider;
    s->absorbed = Unique(s->absorbed);
    if (!OnlyReadWithin(g, &s->absorbed, *s->out, &outsider))
      return fail("intermediate " + outsider + " has another consumer");
    return true;
  }

  static std::vector<const NodeDef*> Unique(std::vector<const NodeDef*> nodes) {
    std::vector<const NodeDef*> out;
    for (const NodeDef* n : nodes)
      if (std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
    return out;
  }

  // ids >= 0, or logical_and(ids >= 0, ones_like(weights, bool)).
  static bool IsIdMask(const GraphIndex& g, const std::string& mask, const std::string& ids,
                       const std::string& weights, std::vector<const NodeDef*>* nodes) {
    const NodeDef* m = g.Node(ParseTensorName(mask).node);
    if (!weights.empty()) {
      if (!IsOp(m, "LogicalAnd") || !IsTrueLike(g, g.Producer(*m, 1), weights, nodes)) return false;
      nodes->push_back(m);
      m = g.Producer(*m, 0);
    }
    if (!IsOp(m, "GreaterEqual") || m->input(0) != ids || !IsConstInt(g.Producer(*m, 1), 0)) return false;
    nodes->push_back(m);
    return true;
  }

  // select = Select(Tile(Reshape(fill.empty_row_indicator, [-1, 1]), Pack(1, Shape(pool)[1])),
  //                 ZerosLike(pool), pool)
  static bool ZeroingSelect(const GraphIndex& g, const NodeDef& select, const NodeDef& pool, const NodeDef& fill,
                            std::vector<const NodeDef*>* absorbed) {
    const NodeDef* zeros = g.Producer(select, 1);
    const NodeDef* tile = g.Producer(select, 0);
    if (select.input(2) != pool.name() || !IsOp(zeros, "ZerosLike") || zeros->input(0) != pool.name() ||
        !IsOp(tile, "Tile"))
      return false;
    const NodeDef* column = g.Producer(*tile, 0);
    std::vector<int64_t> col_shape;
    if (!IsOp(column, "Reshape") || column->input(0) != TensorName(fill.name(), 2) ||
        !ConstIntVector(g.Producer(*column, 1), &col_shape) || col_shape != std::vector<int64_t>{-1, 1})
      return false;
    const NodeDef* pack = g.Producer(*tile, 1);
    if (!IsOp(pack, "Pack") || IntAttr(*pack, "N", 0) != 2 || !IsConstInt(g.Producer(*pack, 0), 1)) return false;
    const NodeDef* width = g.Producer(*pack, 1);
    const NodeDef* shape = width ? g.Producer(*width, 0) : nullptr;
    std::vector<int64_t> begin, end, strides;
    if (!IsOp(width, "StridedSlice") || !IsOp(shape, "Shape") || shape->input(0) != pool.name() ||
        !ConstIntVector(g.Producer(*width, 1), &begin) || !ConstIntVector(g.Producer(*width, 2), &end) ||
        !ConstIntVector(g.Producer(*width, 3), &strides) || begin != std::vector<int64_t>{1} ||
        end != std::vector<int64_t>{2} || strides != std::vector<int64_t>{1} ||
        IntAttr(*width, "shrink_axis_mask", 0) != 1 || IntAttr(*width, "begin_mask", 0) != 0 ||
        IntAttr(*width, "end_mask", 0) != 0)
      return false;
    for (const NodeDef* n : {zeros, tile, column, pack, width, shape}) absorbed->push_back(n);
    return true;
  }

  static std::string AddStridedSlice(RewriteContext* ctx, const std::string& base, const std::string& input,
                                     const std::vector<int32_t>& begin, const std::vector<int32_t>& end,
                                     int begin_mask, int end_mask, int shrink, const std::string& device) {
    const std::string b = AddInt32Vector(ctx, base + "/begin", begin, device);
    const std::string e = AddInt32Vector(ctx, base + "/end", end, device);
    const std::string st = AddInt32Vector(ctx, base + "/strides", std::vector<int32_t>(begin.size(), 1), device);
    NodeDef* n = ctx->AddNode(base, "StridedSlice", device);
    for (const std::string& in : {input, b, e, st}) n->add_input(in);
    auto& attr = *n->mutable_attr();
    attr["T"].set_type(tensorflow::DT_INT64);
    attr["Index"].set_type(tensorflow::DT_INT32);
    attr["begin_mask"].set_i(begin_mask);
    attr["end_mask"].set_i(end_mask);
    attr["shrink_axis_mask"].set_i(shrink);
    attr["ellipsis_mask"].set_i(0);
    attr["new_axis_mask"].set_i(0);
    return n->name();
  }

  static std::string AddReorder(RewriteContext* ctx, const std::string& base, const SparseIds& sp,
                                const std::string& values, tensorflow::DataType dtype, const std::string& device) {
    NodeDef* n = ctx->AddNode(base, "SparseReorder", device);
    n->add_input(sp.indices);
    n->add_input(values);
    n->add_input(sp.shape);
    (*n->mutable_attr())["T"].set_type(dtype);
    return n->name();
  }

  // Whether the reshaped ids are in canonical order whatever their values:
  // their indices are a ParseExample's sparse indices or a SparseCross's
  // (row-major by construction), and a SparseReshape keeps the order of the
  // entries (each keeps its linear index), so the linear model's own
  // reshape before this one does too.
  static bool CanonicalBySource(const GraphIndex& g, const NodeDef& reshape) {
    int port = 0;
    const NodeDef* source = g.Producer(reshape, 0, &port);
    for (int depth = 0; IsOp(source, "SparseReshape") && port == 0 && depth < 4; ++depth)
      source = g.Producer(*source, 0, &port);
    if (IsOp(source, "SparseCross") || IsOp(source, "SparseCrossHashed") || IsOp(source, "SparseCrossV2"))
      return port == 0;
    if (IsOp(source, "ParseExampleV2")) return port < IntAttr(*source, "num_sparse", 0);
    if (IsOp(source, "ParseExample")) return port < IntAttr(*source, "Nsparse", 0);
    return false;
  }

  // Whether `sr` reshapes ids of rank 2 to [prod(shape[:1]), shape[1]], as
  // safe_embedding_lookup_sparse does for every rank: then it moves nothing.
  static bool IsRank2Identity(RewriteContext* ctx, const NodeDef& sr) {
    const GraphIndex& g = ctx->index();
    int port = 0;
    const NodeDef* shape = g.Producer(sr, 1, &port);
    return shape != nullptr && ctx->Rank(*shape, port) == 1 && ctx->Dim(*shape, port, 0) == 2 &&
           IsFlattenToRank2(g, sr);
  }

  // The final Reshape(out, concat(Cast(shape)[:1], Shape(out)[1:])) of the
  // safe lookup for ids of rank 2, where `shape` is theirs: [shape[0], D],
  // which the fused op already has (its row count is shape[0]). Returns the
  // Reshape and the nodes only it reads, or an empty vector.
  static std::vector<const NodeDef*> IdentityFinalReshape(RewriteContext* ctx, const std::string& out,
                                                          const std::string& shape) {
    const GraphIndex& g = ctx->index();
    for (const NodeDef* reshape : g.DataReaders(out)) {
      if (!IsOp(reshape, "Reshape") || reshape->input(0) != out || ctx->MustKeep(reshape->name())) continue;
      const NodeDef* concat = g.Producer(*reshape, 1);
      if (!IsOp(concat, "ConcatV2") || IntAttr(*concat, "N", 0) != 2 ||
          !ConstVectorOrScalarIs(g.Producer(*concat, 2), 0))
        continue;
      const NodeDef* head = g.Producer(*concat, 0);
      const NodeDef* tail = g.Producer(*concat, 1);
      if (!IsOp(head, "Slice") || !IsOp(tail, "Slice")) continue;
      const NodeDef* cast = g.Producer(*head, 0);
      const NodeDef* of_out = g.Producer(*tail, 0);
      std::vector<int64_t> tail_size;
      if (!IsOp(cast, "Cast") || cast->input(0) != shape || !ConstVectorOrScalarIs(g.Producer(*head, 1), 0) ||
          !ConstVectorOrScalarIs(g.Producer(*head, 2), 1))
        continue;
      if (!IsOp(of_out, "Shape") || of_out->input(0) != out || !ConstVectorOrScalarIs(g.Producer(*tail, 1), 1) ||
          !ConstIntVector(g.Producer(*tail, 2), &tail_size) || tail_size != std::vector<int64_t>{-1})
        continue;
      std::vector<const NodeDef*> nodes = {reshape};
      for (const NodeDef* n : {concat, head, tail, cast, of_out}) {
        if (g.DataConsumers(n->name()) != 1 || g.ControlConsumers(n->name()) != 0 || HasControlInputs(*n) ||
            ctx->MustKeep(n->name()))
          break;
        nodes.push_back(n);
      }
      if (HasControlInputs(*reshape)) continue;
      return nodes;
    }
    return {};
  }

  // Where the fused op reads the sparse ids: the SparseReshape's outputs, or
  // its inputs when it moves nothing and they come from ParseExample (ids
  // from a split keep the reshape, which the string patterns fuse further).
  static SparseIds ReshapedIds(RewriteContext* ctx, const NodeDef& sr) {
    if (CanonicalBySource(ctx->index(), sr) && IsRank2Identity(ctx, sr))
      return SparseIds{sr.input(0), sr.input(1), true};
    return SparseIds{TensorName(sr.name(), 0), TensorName(sr.name(), 1), false};
  }

  static void Fuse(const NodeDef& pool_node, RewriteContext* ctx, const Safe& s) {
    const NodeDef pool = pool_node;
    const std::string out_name = s.out->name();
    const std::string base = out_name + "/ctr_safe";
    // The sparse bookkeeping stays where SparseReshape runs (host-only ops).
    const std::string sparse_device = s.reshape->device();
    const SparseIds sp = ReshapedIds(ctx, *s.reshape);
    const std::vector<const NodeDef*> final_reshape =
        sp.rank2 ? IdentityFinalReshape(ctx, out_name, s.reshape->input(1)) : std::vector<const NodeDef*>{};
    std::string indices = sp.indices, ids = s.ids, weights = pool.input(4);
    if (!CanonicalBySource(ctx->index(), *s.reshape)) {
      const std::string reorder = AddReorder(ctx, base + "/ids", sp, s.ids, TypeAttr(pool, "Tid"), sparse_device);
      indices = TensorName(reorder, 0);
      ids = TensorName(reorder, 1);
      if (s.fill_w)
        weights = TensorName(AddReorder(ctx, base + "/weights", sp, s.weights, tensorflow::DT_FLOAT, sparse_device),
                             1);
    } else if (s.fill_w) {
      weights = s.weights;
    }
    const std::string rows = AddStridedSlice(ctx, base + "/rows", indices, {0, 0}, {0, 1}, 1, 1, 2, sparse_device);
    const std::string num_rows = AddStridedSlice(ctx, base + "/num_rows", sp.shape, {0}, {1}, 0, 0, 1, sparse_device);

    MatchRecord record{kName, out_name, "CtrEmbeddingLookup", {}};
    AbsorbNodes(ctx, Unique(s.absorbed), out_name, &record);
    NodeDef* fused = ctx->Mutable(out_name);
    record.replaced.push_back(Describe(*fused));
    const NodeDef old = *fused;
    fused->clear_input();
    for (const std::string& in : {pool.input(0), ids, rows, num_rows, weights}) fused->add_input(in);
    CopyControlInputs(old, fused);
    if (old.name() != pool.name()) CopyControlInputs(pool, fused);
    fused->set_op("CtrEmbeddingLookup");
    *fused->mutable_attr() = pool.attr();
    auto& attr = *fused->mutable_attr();
    attr["Tseg"].set_type(tensorflow::DT_INT64);
    attr["invalid_ids"].set_s("skip_negative");
    attr["prune_weights"].set_b(s.prune_weights);
    // TF prunes ids and weights with one broadcast mask (see the attr's doc).
    attr["prune_broadcast"].set_b(BoolAttr(pool, "has_weights", false));
    attr["default_id"].set_i(s.default_id);
    if (StringAttr(pool, "grad_indices") != "dense") attr["empty_grad_row"].set_i(s.empty_grad_row);
    if (!final_reshape.empty()) DropFinalReshape(ctx, final_reshape, out_name, &record);
    if (sp.rank2) DropUnreadReshape(ctx, *s.reshape, Unique(s.absorbed), out_name, &record);
    ctx->Matched(record);
  }

  // The SparseReshape the fused op no longer reads, and its shape arithmetic,
  // when nothing else reads them.
  static void DropUnreadReshape(RewriteContext* ctx, const NodeDef& sr, const std::vector<const NodeDef*>& absorbed,
                                const std::string& fused, MatchRecord* record) {
    const GraphIndex& g = ctx->index();
    if (ctx->MustKeep(sr.name()) || g.ControlConsumers(sr.name()) != 0 || HasControlInputs(sr)) return;
    for (const NodeDef* reader : g.DataReaders(sr.name()))
      if (std::find(absorbed.begin(), absorbed.end(), reader) == absorbed.end()) return;
    // Each goes only with its one reader.
    auto only_read_by = [&](const NodeDef* n, const NodeDef* reader) {
      return n != nullptr && g.DataConsumers(n->name()) == 1 && g.DataReaders(n->name())[0] == reader &&
             g.ControlConsumers(n->name()) == 0 && !HasControlInputs(*n) && !ctx->MustKeep(n->name());
    };
    std::vector<const NodeDef*> dead = {&sr};
    const NodeDef* pack = g.Producer(sr, 2);
    if (only_read_by(pack, &sr)) {
      dead.push_back(pack);
      const NodeDef* prod = g.Producer(*pack, 0);
      const NodeDef* last = g.Producer(*pack, 1);
      if (only_read_by(last, pack)) dead.push_back(last);
      if (only_read_by(prod, pack)) {
        dead.push_back(prod);
        const NodeDef* head = g.Producer(*prod, 0);
        if (only_read_by(head, prod)) dead.push_back(head);
      }
    }
    for (const NodeDef* n : dead) record->replaced.push_back(Describe(*n));
    RemoveWithConsts(ctx, dead, fused);
  }

  static void DropFinalReshape(RewriteContext* ctx, const std::vector<const NodeDef*>& nodes, const std::string& out,
                               MatchRecord* record) {
    const std::string reshape = nodes[0]->name();
    for (const NodeDef* n : nodes) record->replaced.push_back(Describe(*n));
    ctx->RedirectDataEdges(reshape, 0, TensorName(out, 0));
    ctx->RedirectControlEdges(reshape, out);
    RemoveWithConsts(ctx, nodes, out);
  }

  // Removes `nodes` and the constants only one of them reads.
  static void RemoveWithConsts(RewriteContext* ctx, const std::vector<const NodeDef*>& nodes,
                               const std::string& fused) {
    const GraphIndex& g = ctx->index();
    std::vector<std::string> consts;
    for (const NodeDef* n : nodes)
      for (int i = 0; i < n->input_size(); ++i) {
        const NodeDef* c = g.Producer(*n, i);
        if (IsOp(c, "Const") && g.DataConsumers(c->name()) == 1 && g.ControlConsumers(c->name()) == 0 &&
            !ctx->MustKeep(c->name()))
          consts.push_back(c->name());
      }
    for (const NodeDef* n : nodes) ctx->Remove(n->name(), fused);
    for (const std::string& c : consts) ctx->Remove(c, fused);
  }
};

REGISTER_CTR_FUSION_PATTERN(SafeLookupPattern);

}  // namespace
}  // namespace grappler
}  // namespace tf_ctr

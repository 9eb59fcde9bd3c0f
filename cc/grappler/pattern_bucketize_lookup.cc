// Pattern: a bucketized column's ids feeding a fused sparse lookup -- a
// bucketized_column under a linear model or an embedding column, once
// safe_lookup fused the lookup. The column builds a SparseTensor of its
// buckets, S to a row:
//
//   bk      = Bucketize(x)                                       (x [B, S])
//   B       = Shape(bk)[0]
//   cols    = Tile(Range(0, S, 1), [B])
//   values  = AddV2(Reshape(bk, [-1]), Mul(stride, cols))
//   rows    = Reshape(Tile(ExpandDims(Range(0, B, 1), 1), [1, S]), [-1])
//   indices = Cast(Transpose(Pack(rows, cols)), int64)
//   shape   = Cast(Pack(B, S), int64)
//   ... [SparseReshape ->] [SparseReorder ->] CtrEmbeddingLookup(params, values, indices[:, 0], shape[0])
//
// and it becomes, under the lookup's name,
//
//   CtrBucketizeEmbeddingLookup(params, x)     boundaries, column_stride = stride
//
// Exact: value s of row b gets id bucket(x[b, s]) + stride * s in both, the
// indices are in row-major order (so the reshapes and the reorder move
// nothing) and every row is one bag of S ids. x's second dimension must be
// known to be S. The nodes building the SparseTensor go with the lookup
// unless something else (a crossed column of the same bucketized column)
// reads them; the fused op buckets x again, which costs less than a pass
// over the ids. Only where the graph is served on a CPU.
#include <algorithm>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "cc/grappler/pattern.h"
#include "cc/grappler/sparse_chain.h"
#include "cc/grappler/vocab_find.h"
#include "tensorflow/core/framework/attr_value.pb.h"

namespace tf_ctr {
namespace grappler {
namespace {

using tensorflow::NodeDef;

constexpr char kName[] = "bucketize_lookup";
constexpr char kFusedOp[] = "CtrBucketizeEmbeddingLookup";
constexpr int kShapeOutput = 3;  // the fused op's dense_shape

// The bucketized column's SparseTensor, node by node.
struct Bucketized {
  const NodeDef* bucketize = nullptr;
  int64_t width = 0;   // S
  int64_t stride = 0;  // the id offset between columns
  std::vector<const NodeDef*> nodes;  // everything that builds the SparseTensor
};

// Range(0, limit, 1), limit the tensor `limit` (or, when empty, a constant
// written to *value).
bool IsRangeFromZero(const GraphIndex& g, const NodeDef* range, const std::string& limit, int64_t* value) {
  if (!IsOp(range, "Range") || !ConstScalarIs(g.Producer(*range, 0), 0) || !ConstScalarIs(g.Producer(*range, 2), 1))
    return false;
  if (!limit.empty()) return SameTensor(range->input(1), limit);
  return ConstScalarInt(g.Producer(*range, 1), value);
}

// values = AddV2(Reshape(bk, [-1]), Mul(stride, cols)): fills bk, the
// stride, S, and returns the batch size tensor and `cols` (the Tile).
bool MatchValues(const GraphIndex& g, const NodeDef* add, Bucketized* m, std::string* batch, const NodeDef** cols) {
  if (!IsOp(add, "AddV2") && !IsOp(add, "Add")) return false;
  for (int flat_side = 0; flat_side < 2; ++flat_side) {
    const NodeDef* flat = g.Producer(*add, flat_side);
    const NodeDef* mul = g.Producer(*add, 1 - flat_side);
    if (!IsOp(flat, "Reshape") || !ConstVectorIs(g.Producer(*flat, 1), {-1}) || !IsOp(mul, "Mul")) continue;
    const NodeDef* bk = g.Producer(*flat, 0);
    if (!IsOp(bk, "Bucketize")) continue;
    for (int const_side = 0; const_side < 2; ++const_side) {
      const NodeDef* tile = g.Producer(*mul, 1 - const_side);
      if (!ConstScalarInt(g.Producer(*mul, const_side), &m->stride) || !IsOp(tile, "Tile")) continue;
      const NodeDef* multiples = g.Producer(*tile, 1);
      if (!IsOp(multiples, "Pack") || IntAttr(*multiples, "N", 0) != 1) continue;
      const NodeDef* b = g.Producer(*multiples, 0);
      const NodeDef* shape = IsFirstElementSlice(g, b) ? g.Producer(*b, 0) : nullptr;
      if (!IsOp(shape, "Shape") || g.Producer(*shape, 0) != bk) continue;
      if (!IsRangeFromZero(g, g.Producer(*tile, 0), "", &m->width)) continue;
      m->bucketize = bk;
      *batch = multiples->input(0);
      *cols = tile;
      m->nodes = {bk, flat, mul, tile, multiples, g.Producer(*tile, 0), b, shape, add};
      return true;
    }
  }
  return false;
}

// indices = Cast(Transpose(Pack(rows, cols), [1, 0]), int64) with
// rows = Reshape(Tile(ExpandDims(Range(0, B, 1), 1), [1, S]), [-1]).
bool MatchIndices(const GraphIndex& g, const NodeDef* cast, const NodeDef& cols, const std::string& batch,
                  Bucketized* m) {
  if (!IsOp(cast, "Cast") || TypeAttr(*cast, "DstT") != tensorflow::DT_INT64) return false;
  const NodeDef* transpose = g.Producer(*cast, 0);
  if (!IsOp(transpose, "Transpose") || !ConstVectorIs(g.Producer(*transpose, 1), {1, 0})) return false;
  const NodeDef* pack = g.Producer(*transpose, 0);
  if (!IsOp(pack, "Pack") || IntAttr(*pack, "N", 0) != 2 || IntAttr(*pack, "axis", 0) != 0 ||
      g.Producer(*pack, 1) != &cols)
    return false;
  const NodeDef* flat = g.Producer(*pack, 0);
  if (!IsOp(flat, "Reshape") || !ConstVectorIs(g.Producer(*flat, 1), {-1})) return false;
  const NodeDef* tile = g.Producer(*flat, 0);
  if (!IsOp(tile, "Tile") || !ConstVectorIs(g.Producer(*tile, 1), {1, m->width})) return false;
  const NodeDef* expand = g.Producer(*tile, 0);
  if (!IsOp(expand, "ExpandDims") || !ConstVectorOrScalarIs(g.Producer(*expand, 1), 1)) return false;
  int64_t unused = 0;
  const NodeDef* range = g.Producer(*expand, 0);
  if (!IsRangeFromZero(g, range, batch, &unused)) return false;
  m->nodes.insert(m->nodes.end(), {cast, transpose, pack, flat, tile, expand, range});
  return true;
}

// shape = Cast(Pack(B, S), int64).
bool MatchShape(const GraphIndex& g, const NodeDef* cast, const std::string& batch, Bucketized* m) {
  if (!IsOp(cast, "Cast") || TypeAttr(*cast, "DstT") != tensorflow::DT_INT64) return false;
  const NodeDef* pack = g.Producer(*cast, 0);
  if (!IsOp(pack, "Pack") || IntAttr(*pack, "N", 0) != 2 || IntAttr(*pack, "axis", 0) != 0 ||
      !SameTensor(pack->input(0), batch) || !ConstScalarIs(g.Producer(*pack, 1), m->width))
    return false;
  m->nodes.insert(m->nodes.end(), {cast, pack});
  return true;
}

class BucketizeLookupPattern : public NamedPattern<kName> {
 public:
  // After safe_lookup made the CtrEmbeddingLookup this absorbs the buckets into.
  int Stage() const override { return 3; }

  bool Rewrite(const NodeDef& anchor, RewriteContext* ctx) const override {
    if (!IsOp(&anchor, "CtrEmbeddingLookup") || StringAttr(anchor, "id_mode") != "index") return false;
    const GraphIndex& g = ctx->index();
    SparseChain c;
    std::string why, batch;
    const bool traced = TraceLookupBags(g, anchor, &c, &why);
    Bucketized m;
    const NodeDef* cols = nullptr;
    if (!MatchValues(g, g.Node(ParseTensorName(c.values).node), &m, &batch, &cols)) return false;

    // The subgraph has the right shape; now every condition for exactness.
    if (!traced) return Skip(ctx, anchor, why);
    if (!MatchIndices(g, g.Node(ParseTensorName(c.indices).node), *cols, batch, &m) ||
        !MatchShape(g, g.Node(ParseTensorName(c.shape).node), batch, &m))
      return Skip(ctx, anchor, "the bucket ids' indices or dense shape are not the bucketized column's");
    int port = 0;
    const NodeDef* x = g.Producer(*m.bucketize, 0, &port);
    if (x == nullptr || ctx->Rank(*x, port) != 2 || ctx->Dim(*x, port, 1) != m.width)
      return Skip(ctx, anchor, "the bucketized values are not known to be [B, " + std::to_string(m.width) + "]");
    if (BoolAttr(anchor, "has_weights", false)) return Skip(ctx, anchor, "the lookup of the bucket ids is weighted");
    if (!ServedOnCpu(ctx, anchor))
      return Skip(ctx, anchor, "CtrBucketizeEmbeddingLookup runs on the CPU: rewrite with serving_device='cpu' "
                               "for a CPU server");
    const auto none = [](const NodeDef&, int) { return false; };
    if (!OnlyChainReads(ctx, anchor, c, {}, none, &why)) return Skip(ctx, anchor, why);
    Replace(anchor, m, c, ctx);
    return true;
  }

 private:
  // The nodes of the column that only the chain, the lookup and each other
  // read (and nothing fetches): they go; the rest stay for their readers.
  // Readers of the column's dense shape read the op's instead.
  static std::vector<const NodeDef*> Removable(RewriteContext* ctx, const NodeDef& anchor, const SparseChain& c,
                                               const Bucketized& m) {
    const GraphIndex& g = ctx->index();
    std::set<const NodeDef*> gone(m.nodes.begin(), m.nodes.end());
    std::set<const NodeDef*> chain = {&anchor};
    for (const NodeDef* n : c.Nodes()) chain.insert(n);
    const std::string shape_node = ParseTensorName(c.shape).node;
    auto reads_only_the_shape = [&](const NodeDef& reader) {
      for (const std::string& in : reader.input())
        if (ParseTensorName(in).node == shape_node && !SameTensor(in, c.shape)) return false;
      return true;
    };
    for (bool changed = true; changed;) {
      changed = false;
      for (auto it = gone.begin(); it != gone.end();) {
        bool keep = ctx->FetchedOrFed((*it)->name());
        for (const NodeDef* reader : g.DataReaders((*it)->name()))
          keep = keep || !(gone.count(reader) || chain.count(reader) ||
                           ((*it)->name() == shape_node && reads_only_the_shape(*reader)));
        if (keep) {
          it = gone.erase(it);
          changed = true;
        } else {
          ++it;
        }
      }
    }
    std::vector<const NodeDef*> out;
    for (const NodeDef* n : m.nodes)
      if (gone.count(n)) out.push_back(n);
    return out;
  }

  static void Replace(const NodeDef& anchor_in, const Bucketized& m, const SparseChain& c, RewriteContext* ctx) {
    const std::vector<const NodeDef*> removable = Removable(ctx, anchor_in, c, m);
    const NodeDef anchor = anchor_in;  // the graph changes under the references
    const NodeDef bucketize = *m.bucketize;
    const std::string name = anchor.name();
    // A kept column's dense shape still serves its other readers; the chain's reshaped ones are the op's.
    std::vector<std::string> shapes;
    if (std::find(removable.begin(), removable.end(), ctx->index().Node(ParseTensorName(c.shape).node)) !=
        removable.end())
      shapes.push_back(c.shape);

    NodeDef* fused = ctx->Mutable(name);
    fused->set_op(kFusedOp);
    fused->clear_input();
    fused->add_input(anchor.input(0));
    fused->add_input(bucketize.input(0));
    CopyControlInputs(anchor, fused);
    auto& attr = *fused->mutable_attr();
    attr.clear();
    CopyAttrsIfSet(anchor, {"T", "combiner", "default_id", "max_norm", "grad_indices", "empty_grad_row"}, fused);
    attr["Tin"] = bucketize.attr().at("T");
    attr["boundaries"] = bucketize.attr().at("boundaries");
    attr["column_stride"].set_i(m.stride);

    MatchRecord record{kName, name, kFusedOp, {Describe(anchor)}};
    AbsorbChain(ctx, c, removable, shapes, TensorName(name, kShapeOutput), &record);
    ctx->Matched(record);
  }
};

REGISTER_CTR_FUSION_PATTERN(BucketizeLookupPattern);

}  // namespace
}  // namespace grappler
}  // namespace tf_ctr

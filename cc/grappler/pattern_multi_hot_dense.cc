// Pattern: a Dense layer over encodings of ids, concatenated or alone, with
// dense columns -- Keras' FeatureSpace(output_mode="concat") feeding a Dense,
// and any CategoryEncoding, Discretization, HashedCrossing or lookup with a
// one_hot, multi_hot or count output_mode concatenated before a Dense:
//
//   enc_i = DenseBincount(ids_i [B, L], size_i, weights=[], binary_output)
//           [+ Cast to the kernel's type]
//           size_i: a constant, or Keras' Minimum(maxlength, Maximum(minlength,
//           f(ids))) with minlength >= maxlength (the shape math goes too)
//         | OneHot(ids_i [B], depth_i, on 1, off 0, axis -1)   [+ Cast]
//           (Keras' one_hot output_mode; a negative id is a row of zeros)
//         | Reshape(OneHot(ids_i [B, S], d, 1, 0, -1), [B, S * d])   [+ Cast]
//           (TF1's input_layer of a bucketized column: S one-hots side by side)
//   MatMul(ConcatV2(enc_1, x_1, enc_2, ..., axis 1), kernel)   [or MatMul(enc_1, kernel)]
//   MatMul(Cast(ConcatV2(enc_1, ..., enc_n)), kernel)   (integer encodings only,
//     cast together: Keras' Dense over a Concatenate of count and one-hot lookups)
//
// (also where several Dense layers read one concatenation -- Wide & Deep's
// linear head and deep tower -- each then fused on its own, the encodings
// kept until the last goes)
//
// becomes CtrMultiHotDense(ids_1, ..., x_1, ..., kernel): each encoded block
// adds the kernel rows its ids name, each dense block is multiplied as the
// MatMul multiplies it, and neither the [B, depth] encodings nor their
// concatenation is built. The ids stay as the graph computes them (a lookup,
// a cross, a Bucketize, an input), so whatever made them is kept; a lookup's
// encoding feeding the MatMul alone was taken whole by vocab_multi_hot
// (stage 0) first. An encoding that cannot be fused (weighted, a size known
// only at run time) stays in the graph as a dense block.
//
// One-hot blocks become blocks of [B, 1] ids (an ExpandDims of the OneHot's)
// whose negative ids count for nothing, as OneHot makes them a row of zeros;
// reshaped ones, blocks of their [B, S] ids with column_depths d.
//
// The sums run over the columns in order, as the MatMul's dot product does;
// the encodings' zero columns are never read (a kernel row of inf or NaN that
// no id names stays out, where the MatMul gives NaN). The op has a CPU kernel
// only, so it is used where the graph is served on the CPU.
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "cc/grappler/bincount_match.h"
#include "cc/grappler/dense_product.h"
#include "cc/grappler/keras_gather.h"
#include "cc/grappler/pattern.h"
#include "cc/grappler/vocab_find.h"
#include "tensorflow/core/framework/attr_value.pb.h"

namespace tf_ctr {
namespace grappler {
namespace {

using tensorflow::DataType;
using tensorflow::NodeDef;

constexpr char kName[] = "multi_hot_dense";
constexpr char kFusedOp[] = "CtrMultiHotDense";

// One encoded block, from the concatenation's input up to the ids.
struct Encoding {
  const NodeDef* to_float = nullptr;  // Cast of the counts to the kernel's type, or none
  const NodeDef* encoder = nullptr;   // the DenseBincount or the OneHot
  const NodeDef* reshape = nullptr;   // the Reshape of a [B, S, d] OneHot to [B, S * d], or none
  bool one_hot = false;
  int64_t column_depth = 0;               // d of a reshaped OneHot
  std::vector<const NodeDef*> size_math;  // the bincount's size or the reshape's shape, constants included
  std::vector<const NodeDef*> dead;       // shape reads of the ids nothing reads
  int64_t depth = -1;
  int input = -1;  // its input of the concatenation
};

// The encoding at `x`: a DenseBincount or a OneHot, or a Cast of one; false
// for any other block.
bool MatchEncodingShape(const GraphIndex& g, const NodeDef* x, int port, Encoding* e) {
  if (IsOp(x, "Cast") && port == 0) {
    e->to_float = x;
    x = g.Producer(*x, 0, &port);
  }
  if (IsOp(x, "Reshape") && port == 0) {
    e->reshape = x;
    x = g.Producer(*x, 0, &port);
    if (!IsOp(x, "OneHot")) return false;
  }
  if (!(IsOp(x, "DenseBincount") || IsOp(x, "OneHot")) || port != 0) return false;
  e->encoder = x;
  e->one_hot = IsOp(x, "OneHot");
  return true;
}

bool IsCountType(DataType t) {
  return t == tensorflow::DT_INT32 || t == tensorflow::DT_INT64 || t == tensorflow::DT_FLOAT;
}

// Collects the shape math of a Reshape's shape: Pack, StridedSlice, Shape
// (of the OneHot or of anything else) and constants, no control edges.
bool CollectReshapeShape(const GraphIndex& g, const NodeDef* node, std::vector<const NodeDef*>* nodes) {
  static const std::set<std::string> kShapeMath = {"Const", "Pack", "StridedSlice", "Shape"};
  if (node == nullptr || !kShapeMath.count(node->op()) || HasControlInputs(*node)) return false;
  for (const NodeDef* n : *nodes)
    if (n == node) return true;
  nodes->push_back(node);
  if (IsOp(node, "Shape")) return true;
  for (int i = 0; i < node->input_size(); ++i)
    if (!CollectReshapeShape(g, g.Producer(*node, i), nodes)) return false;
  return true;
}

// A OneHot of [B] int ids into [B, depth] ones and zeros (a one-hot block),
// or of [B, S] ids reshaped to [B, S * d] (S one-hot blocks side by side).
bool OneHotFuses(RewriteContext* ctx, Encoding* e, std::string* why) {
  const GraphIndex& g = ctx->index();
  const NodeDef& one_hot = *e->encoder;
  const tensorflow::DataType index = TypeAttr(one_hot, "TI");
  int port = 0;
  const NodeDef* ids = g.Producer(one_hot, 0, &port);
  if ((index != tensorflow::DT_INT32 && index != tensorflow::DT_INT64) || ids == nullptr ||
      ctx->Rank(*ids, port) != (e->reshape != nullptr ? 2 : 1) || IntAttr(one_hot, "axis", -1) != -1) {
    *why = e->reshape != nullptr
               ? "the reshaped one-hot encoding is not of a [B, S] int32 or int64 id matrix along a new last axis"
               : "the one-hot encoding is not of a [B] int32 or int64 id vector along a new last axis";
    return false;
  }
  if (!ConstScalarInt(g.Producer(one_hot, 1), &e->depth) || e->depth < 0) {
    *why = "the one-hot encoding's depth is known only at run time";
    return false;
  }
  if (!IsScalarConst(g, g.Producer(one_hot, 2), 1) || !IsZeroScalar(g, g.Producer(one_hot, 3))) {
    *why = "the one-hot encoding's values are not 1 and 0";
    return false;
  }
  if (e->reshape == nullptr) return true;
  // [B, S, d] to [B, S * d]: with S * d known and > 0 the first dimension
  // can only be B.
  const int64_t columns = ctx->Dim(*ids, port, 1);
  if (columns <= 0 || e->depth == 0 || ctx->Rank(*e->reshape, 0) != 2 ||
      ctx->Dim(*e->reshape, 0, 1) != columns * e->depth) {
    *why = "cannot prove that the reshape flattens the one-hot encodings of each row";
    return false;
  }
  if (!CollectReshapeShape(g, g.Producer(*e->reshape, 1), &e->size_math)) {
    *why = "the reshape's shape is computed by more than shape math";
    return false;
  }
  e->column_depth = e->depth;
  e->depth = columns * e->depth;
  return true;
}

// A DenseBincount of [B, L] ids, unweighted, its size known before run time
// and computed by shape math only.
bool BincountFuses(RewriteContext* ctx, Encoding* e, std::string* why) {
  const GraphIndex& g = ctx->index();
  if (!IsEmptyConst(g.Producer(*e->encoder, 2))) {
    *why = "the bincount is weighted";
    return false;
  }
  int port = 0;
  const NodeDef* ids = g.Producer(*e->encoder, 0, &port);
  if (ids == nullptr || ctx->Rank(*ids, port) != 2) {
    *why = "the ids are not known to be a [B, L] matrix (a bincount of a vector counts the whole batch)";
    return false;
  }
  e->depth = KnownSize(g, g.Producer(*e->encoder, 1));
  if (e->depth < 0) {
    *why = "the encoding's depth is known only at run time";
    return false;
  }
  if (!CollectSizeMath(g, g.Producer(*e->encoder, 1), ids, &e->size_math)) {
    *why = "the encoding's size is computed by more than shape math on the ids";
    return false;
  }
  return true;
}

// The conditions on one encoding alone: its types, then its kind's own.
// `outer_cast`: the Cast of the whole concatenation to the kernel's type
// (Keras' Dense casts an integer concatenation of count and one-hot
// encodings), or none.
bool EncodingFuses(RewriteContext* ctx, DataType T, const NodeDef* outer_cast, Encoding* e, std::string* why) {
  const DataType counts = TypeAttr(*e->encoder, "T");
  bool typed;
  if (outer_cast != nullptr) {
    typed = e->to_float == nullptr && IsCountType(counts) && counts == TypeAttr(*outer_cast, "SrcT");
  } else {
    typed = e->to_float != nullptr ? IsCountType(counts) && TypeAttr(*e->to_float, "DstT") == T : counts == T;
  }
  if (!typed) {
    *why = "the encoding's type is " + tensorflow::DataType_Name(counts);
    return false;
  }
  for (const NodeDef* n : {e->encoder, e->reshape, e->to_float})
    if (n != nullptr && HasControlInputs(*n)) {
      *why = Describe(*n) + " waits on another node";
      return false;
    }
  return e->one_hot ? OneHotFuses(ctx, e, why) : BincountFuses(ctx, e, why);
}

class MultiHotDensePattern : public NamedPattern<kName> {
 public:
  int Stage() const override { return 1; }

  bool Rewrite(const NodeDef& anchor, RewriteContext* ctx) const override {
    DenseProduct product;
    std::string why;
    const bool is_product = ReadDenseProduct(anchor, &product, &why);
    if (!is_product && why.empty()) return false;
    const GraphIndex& g = ctx->index();
    int port = 0;
    const NodeDef* left = g.Producer(anchor, 0, &port);
    if (left == nullptr) return false;
    const NodeDef* outer_cast = CastOfConcat(g, left, port);
    if (outer_cast != nullptr) left = g.Producer(*outer_cast, 0, &port);
    const NodeDef* concat = IsOp(left, "ConcatV2") && port == 0 ? left : nullptr;
    std::vector<Encoding> encodings;
    const int blocks = concat != nullptr ? static_cast<int>(IntAttr(*concat, "N", 0)) : 1;
    for (int i = 0; i < blocks; ++i) {
      Encoding e;
      e.input = i;
      const NodeDef* x = concat != nullptr ? g.Producer(*concat, i, &port) : left;
      if (MatchEncodingShape(g, x, port, &e)) encodings.push_back(e);
    }
    if (encodings.empty()) return false;

    // The subgraph has the right shape; now every condition for exactness.
    if (!is_product) return Skip(ctx, anchor, why);
    if (!ServedOnCpu(ctx, anchor))
      return Skip(ctx, anchor, "CtrMultiHotDense has a CPU kernel only: rewrite with serving_device='cpu' "
                               "for a CPU server");
    const DataType T = TypeAttr(anchor, "T");
    if (T != tensorflow::DT_FLOAT && T != tensorflow::DT_DOUBLE)
      return Skip(ctx, anchor, "the kernel is " + tensorflow::DataType_Name(T) + ", not float32 or float64");
    if (BoolAttr(anchor, "transpose_a", false) || BoolAttr(anchor, "transpose_b", false))
      return Skip(ctx, anchor, "the MatMul transposes an operand");
    if (concat != nullptr && !JoinsSideBySide(g, *concat, &why)) return Skip(ctx, anchor, why);
    if (concat != nullptr && HasControlInputs(*concat))
      return Skip(ctx, anchor, Describe(*concat) + " waits on another node");
    if (outer_cast != nullptr) {
      if (TypeAttr(*outer_cast, "DstT") != T)
        return Skip(ctx, anchor, "the concatenation is cast to " +
                                     tensorflow::DataType_Name(TypeAttr(*outer_cast, "DstT")) + ", not the kernel's " +
                                     tensorflow::DataType_Name(T));
      if (HasControlInputs(*outer_cast) || !OnlyReadBy(ctx, *concat, 1, &why))
        return Skip(ctx, anchor, why.empty() ? Describe(*outer_cast) + " waits on another node" : why);
    }
    // What the MatMul reads may be read by others too (Wide & Deep: the
    // linear head and the deep tower's first Dense over one Concatenate):
    // this product fuses alone, and the encodings stay until the last goes.
    const NodeDef* joined = outer_cast != nullptr ? outer_cast : concat;
    std::string shared;
    const bool keep_blocks = joined != nullptr && !OnlyReadBy(ctx, *joined, 1, &shared);
    if (keep_blocks && !ReadByProductsOnly(ctx, *joined)) return Skip(ctx, anchor, shared);
    // An encoding that cannot be fused is a dense block like any other.
    std::vector<Encoding> fused;
    std::string first_reason;
    for (Encoding& e : encodings) {
      if (EncodingFuses(ctx, T, outer_cast, &e, &why)) {
        fused.push_back(e);
      } else if (first_reason.empty()) {
        first_reason = why;
      }
    }
    if (fused.empty()) return Skip(ctx, anchor, first_reason);
    // The fused op takes its dense blocks in the kernel's type, which they
    // have only after a cast of the whole concatenation.
    if (outer_cast != nullptr && static_cast<int64_t>(fused.size()) != IntAttr(*concat, "N", 0))
      return Skip(ctx, anchor, !first_reason.empty() ? first_reason
                                                     : "the concatenation cast to the kernel's type joins blocks "
                                                       "that are not encodings");
    if (!EncodingsDominate(ctx, concat, fused, &why)) return Skip(ctx, anchor, why);
    if (!OnlyFeedTheMatMul(ctx, &fused, &why)) return Skip(ctx, anchor, why);
    Replace(anchor, concat, outer_cast, fused, product, T, keep_blocks, ctx);
    return true;
  }

 private:
  // The Cast of a ConcatV2 that feeds the MatMul, or none.
  static const NodeDef* CastOfConcat(const GraphIndex& g, const NodeDef* left, int port) {
    if (!IsOp(left, "Cast") || port != 0) return nullptr;
    int concat_port = 0;
    const NodeDef* concat = g.Producer(*left, 0, &concat_port);
    return IsOp(concat, "ConcatV2") && concat_port == 0 ? left : nullptr;
  }

  // Whether everything that reads `joined` is a Dense layer's product over
  // it (its left operand, not transposed), which this pattern fuses in turn:
  // a training graph's gradient, or any other reader, would keep the
  // encodings for good, and the fused op would only add to them.
  static bool ReadByProductsOnly(RewriteContext* ctx, const NodeDef& joined) {
    const GraphIndex& g = ctx->index();
    if (ctx->FetchedOrFed(joined.name()) || g.ControlConsumers(joined.name()) != 0) return false;
    for (const NodeDef* reader : g.DataReaders(joined.name())) {
      DenseProduct product;
      std::string why;
      if (!ReadDenseProduct(*reader, &product, &why) || ParseTensorName(reader->input(0)).node != joined.name() ||
          ParseTensorName(reader->input(1)).node == joined.name() || BoolAttr(*reader, "transpose_a", false) ||
          BoolAttr(*reader, "transpose_b", false))
        return false;
    }
    return true;
  }

  // The fused op gains on the encoded columns (it reads one kernel row per
  // id instead of multiplying the zeros) and multiplies the dense ones about
  // 1.5x slower than TF's MatMul: it is used where the encoded columns are at
  // least twice the dense ones, whose widths must be known.
  static bool EncodingsDominate(RewriteContext* ctx, const NodeDef* concat, const std::vector<Encoding>& fused,
                                std::string* why) {
    if (concat == nullptr) return true;
    // Depths and widths come from the graph's constants: the sums saturate
    // instead of overflowing (a width beyond int64 is dense enough anyway).
    auto add = [](int64_t a, int64_t b) {
      int64_t sum;
      return __builtin_add_overflow(a, b, &sum) ? std::numeric_limits<int64_t>::max() : sum;
    };
    int64_t encoded = 0, dense = 0;
    std::vector<bool> is_encoded(IntAttr(*concat, "N", 0), false);
    for (const Encoding& e : fused) {
      is_encoded[e.input] = true;
      encoded = add(encoded, e.depth);
    }
    for (int i = 0; i < static_cast<int>(is_encoded.size()); ++i) {
      if (is_encoded[i]) continue;
      int port = 0;
      const NodeDef* block = ctx->index().Producer(*concat, i, &port);
      int64_t width = block == nullptr ? -1 : ctx->Dim(*block, port, 1);
      Encoding unfused;  // a weighted bincount: its size may be known where its shape is not
      if (width < 0 && MatchEncodingShape(ctx->index(), block, port, &unfused) && !unfused.one_hot)
        width = KnownSize(ctx->index(), ctx->index().Producer(*unfused.encoder, 1));
      if (width < 0) {
        *why = "the width of " + concat->input(i) + " is known only at run time";
        return false;
      }
      dense = add(dense, width);
    }
    if (encoded >= add(dense, dense)) return true;
    *why = "the encodings are " + std::to_string(encoded) + " of the " + std::to_string(add(encoded, dense)) +
           " columns: TF's MatMul multiplies the other " + std::to_string(dense) + " faster than the fused op would";
    return false;
  }

  // Each encoding feeds only the concatenation (a training graph's MatMul
  // gradient reads it too), and its size math only itself and the bincount
  // (constants aside: they stay where anything else reads them).
  static bool OnlyFeedTheMatMul(RewriteContext* ctx, std::vector<Encoding>* fused, std::string* why) {
    const GraphIndex& g = ctx->index();
    std::set<const NodeDef*> inside;
    for (const Encoding& e : *fused) {
      inside.insert(e.size_math.begin(), e.size_math.end());
      for (const NodeDef* n : {e.encoder, e.reshape, e.to_float})
        if (n != nullptr) inside.insert(n);
    }
    for (Encoding& e : *fused) {
      auto live_readers = [&](const NodeDef* n) {
        int live = 0;
        for (const NodeDef* reader : g.DataReaders(n->name()))
          live += !inside.count(reader) && !CollectDeadEnd(ctx, reader, &e.dead);
        return live;
      };
      for (const NodeDef* n : e.size_math) {
        if (IsOp(n, "Const")) continue;
        if (ctx->FetchedOrFed(n->name()) || g.ControlConsumers(n->name()) != 0 || live_readers(n) != 0) {
          *why = "intermediate " + Describe(*n) + " has another consumer";
          return false;
        }
      }
      // The chain up to the concatenation: each node read by the next (and
      // the OneHot by the Shape of the reshape's shape too), the last by the
      // concatenation alone.
      std::vector<const NodeDef*> chain;
      for (const NodeDef* n : {e.encoder, e.reshape, e.to_float})
        if (n != nullptr) chain.push_back(n);
      for (const NodeDef* n : chain) {
        const bool last = n == chain.back();
        const int outside = live_readers(n);
        if (ctx->FetchedOrFed(n->name()) || g.ControlConsumers(n->name()) != 0 || outside != (last ? 1 : 0) ||
            (last && g.DataConsumers(n->name()) != 1)) {
          *why = "intermediate " + Describe(*n) + " has another consumer";
          return false;
        }
      }
    }
    return true;
  }

  // The OneHot's [B] ids as a [B, 1] column.
  static std::string ExpandToColumn(RewriteContext* ctx, const NodeDef& one_hot) {
    const std::string axis = AddInt64Scalar(ctx, one_hot.name() + "/ctr_column_axis", -1, one_hot.device());
    NodeDef* expand = ctx->AddNode(one_hot.name() + "/ctr_column", "ExpandDims", one_hot.device());
    expand->add_input(one_hot.input(0));
    expand->add_input(axis);
    (*expand->mutable_attr())["T"].set_type(TypeAttr(one_hot, "TI"));
    (*expand->mutable_attr())["Tdim"].set_type(tensorflow::DT_INT64);
    return expand->name();
  }

  // `keep_blocks`: other readers of the concatenation keep it and its
  // encodings; only the MatMul goes.
  void Replace(const NodeDef& anchor_in, const NodeDef* concat_in, const NodeDef* outer_cast,
               const std::vector<Encoding>& fused, const DenseProduct& product, DataType T, bool keep_blocks,
               RewriteContext* ctx) const {
    const NodeDef anchor = anchor_in;  // the graph changes under the references
    const GraphIndex& g = ctx->index();
    const std::string name = anchor.name();
    MatchRecord record{kName, name, kFusedOp, {}};
    std::vector<std::string> blocks;  // each concatenated input, in order
    if (concat_in != nullptr) {
      for (int i = 0; i < IntAttr(*concat_in, "N", 0); ++i) blocks.push_back(concat_in->input(i));
    } else {
      blocks.push_back(anchor.input(0));
    }
    std::vector<std::string> ids, dense;
    std::vector<int64_t> depths, layout;
    std::vector<bool> binary, drop_negative;
    std::vector<int64_t> column_depths;
    std::vector<DataType> id_types;
    std::set<std::string> gone;
    std::vector<const NodeDef*> consts;
    std::vector<int> encoded_at(blocks.size(), -1);
    for (size_t k = 0; k < fused.size(); ++k) encoded_at[fused[k].input] = static_cast<int>(k);
    int dense_blocks = 0;
    for (size_t i = 0; i < blocks.size(); ++i) {
      const int k = encoded_at[i];
      if (k < 0) {
        dense.push_back(blocks[i]);
        layout.push_back(-1 - dense_blocks++);  // placed once the encoded count is known
        continue;
      }
      const Encoding& e = fused[k];
      ids.push_back(e.one_hot && e.reshape == nullptr ? ExpandToColumn(ctx, *e.encoder) : e.encoder->input(0));
      id_types.push_back(TypeAttr(*e.encoder, e.one_hot ? "TI" : "Tidx"));
      depths.push_back(e.depth);
      binary.push_back(e.one_hot || BoolAttr(*e.encoder, "binary_output", false));
      drop_negative.push_back(e.one_hot);
      column_depths.push_back(e.column_depth);
      layout.push_back(static_cast<int64_t>(ids.size()) - 1);
      if (keep_blocks) continue;
      std::vector<const NodeDef*> nodes = e.size_math;
      nodes.push_back(e.encoder);
      if (e.reshape != nullptr) nodes.push_back(e.reshape);
      if (e.to_float != nullptr) nodes.push_back(e.to_float);
      nodes.insert(nodes.end(), e.dead.begin(), e.dead.end());
      for (const NodeDef* n : nodes) {
        if (IsOp(n, "Const")) {
          consts.push_back(n);
        } else if (gone.insert(n->name()).second) {
          record.replaced.push_back(Describe(*n));
        }
      }
      // The bincount's empty weights; the OneHot's depth and values.
      for (int i = e.one_hot ? 1 : 2; i < e.encoder->input_size() && e.encoder->input(i)[0] != '^'; ++i)
        consts.push_back(g.Producer(*e.encoder, i));
    }
    for (int64_t& b : layout)
      if (b < 0) b = static_cast<int64_t>(ids.size()) - 1 - b;
    if (concat_in != nullptr && !keep_blocks) {
      record.replaced.push_back(Describe(*concat_in));
      gone.insert(concat_in->name());
      if (const NodeDef* axis = AxisConstOnlyFor(ctx, *concat_in)) consts.push_back(axis);
    }
    if (outer_cast != nullptr && !keep_blocks) {
      record.replaced.push_back(Describe(*outer_cast));
      gone.insert(outer_cast->name());
    }
    for (const NodeDef* n : consts)
      if (n != nullptr && !gone.count(n->name())) RemoveIfDeadShapeMath(ctx, n, name, 1);
    for (const std::string& n : gone) {
      ctx->RedirectControlEdges(n, name);
      ctx->Remove(n, name);
    }
    record.replaced.push_back(Describe(anchor));

    NodeDef* op = ProductNode(ctx, anchor, product);
    op->set_op(kFusedOp);
    for (const std::string& in : ids) op->add_input(in);
    for (const std::string& in : dense) op->add_input(in);
    op->add_input(anchor.input(1));
    CopyControlInputs(anchor, op);
    auto& attr = *op->mutable_attr();
    attr["T"].set_type(T);
    attr["M"].set_i(static_cast<int64_t>(dense.size()));
    for (DataType t : id_types) attr["Tids"].mutable_list()->add_type(t);
    for (int64_t d : depths) attr["depths"].mutable_list()->add_i(d);
    for (bool b : binary) attr["binary_output"].mutable_list()->add_b(b);
    for (bool b : drop_negative) attr["drop_negative"].mutable_list()->add_b(b);
    for (int64_t d : column_depths) attr["column_depths"].mutable_list()->add_i(d);
    for (int64_t b : layout) attr["layout"].mutable_list()->add_i(b);
    ctx->Matched(record);
  }
};

REGISTER_CTR_FUSION_PATTERN(MultiHotDensePattern);

}  // namespace
}  // namespace grappler
}  // namespace tf_ctr

// Pattern: a Dense layer over the multi-hot (or count) encoding of a
// vocabulary lookup's ids -- Keras' StringLookup / IntegerLookup with
// output_mode="multi_hot" or "count", or CategoryEncoding after a lookup,
// feeding a Dense:
//
//   ids = LookupTableFindV2(table, keys, default)     [keys [B, L]]
//   [Keras' num_oov_indices=0 check and the Identity that waits on it]
//   [Casts between integer and float types: Keras' CategoryEncoding casts
//    the ids to float32 and back to int32]
//   hot = DenseBincount(ids, size, weights=[], binary_output)
//         size: a constant, or Keras' Minimum(maxlength, Maximum(minlength,
//         f(ids))) with minlength >= maxlength, which is maxlength whatever
//         f's value (f: Size / Max shape math on the ids, which goes too)
//   [Cast to the kernel's type]
//   MatMul(hot, kernel)                               [kernel [size, units]]
//
// becomes CtrVocabMultiHot(table, keys, default, kernel): a dense layer over
// a multi-hot vector is a sum of the kernel rows its ids name. The [B, V]
// encoding is never built; the bias and activation after the MatMul stay
// (a _FusedMatMul's are written back as BiasAdd and activation ops).
// Like CtrVocabEmbedding it runs on the CPU, so it is used where the graph
// is served on the CPU.
#include <set>
#include <string>
#include <vector>

#include "cc/grappler/bincount_match.h"
#include "cc/grappler/dense_product.h"
#include "cc/grappler/keras_gather.h"
#include "cc/grappler/pattern.h"
#include "cc/grappler/vocab_find.h"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/tensor.pb.h"
#include "tensorflow/core/framework/tensor_shape.pb.h"

namespace tf_ctr {
namespace grappler {
namespace {

using tensorflow::DataType;
using tensorflow::NodeDef;

constexpr char kName[] = "vocab_multi_hot";
constexpr char kFusedOp[] = "CtrVocabMultiHot";

bool IsIntType(DataType t) { return t == tensorflow::DT_INT32 || t == tensorflow::DT_INT64; }
bool IsIdCastType(DataType t) { return IsIntType(t) || t == tensorflow::DT_FLOAT || t == tensorflow::DT_DOUBLE; }

// The encoding's subgraph, from the MatMul up to the find.
struct MultiHot {
  const NodeDef* to_float = nullptr;  // Cast of the counts to the kernel's type, or none
  const NodeDef* bincount = nullptr;
  std::vector<const NodeDef*> casts;  // between the find and the bincount, the last first
  std::vector<const NodeDef*> size_math;  // what computes the bincount's size, constants included
  std::vector<const NodeDef*> dead;       // shape reads of the ids nothing reads (Keras leaves them)
  int64_t depth = -1;
  VocabIds ids;
};

// Follows Identities and Casts (between integer and float types) up from the
// bincount's input to the find; the Identities go into ids.identities, the
// Casts into casts.
bool TraceIds(const GraphIndex& g, const NodeDef* x, MultiHot* m) {
  while (IsOp(x, "Identity") || IsOp(x, "Cast")) {
    if (IsOp(x, "Cast")) {
      if (!IsIdCastType(TypeAttr(*x, "SrcT")) || !IsIdCastType(TypeAttr(*x, "DstT"))) return false;
      m->casts.push_back(x);
    } else {
      m->ids.identities.push_back(x);
    }
    x = g.Producer(*x, 0);
  }
  if (!IsOp(x, "LookupTableFindV2")) return false;
  m->ids.find = x;
  return true;
}

class VocabMultiHotPattern : public NamedPattern<kName> {
 public:
  bool Rewrite(const NodeDef& anchor, RewriteContext* ctx) const override {
    DenseProduct product;
    std::string why;
    const bool is_product = ReadDenseProduct(anchor, &product, &why);
    if (!is_product && why.empty()) return false;
    const GraphIndex& g = ctx->index();
    MultiHot m;
    const NodeDef* hot = g.Producer(anchor, 0);
    if (IsOp(hot, "Cast")) {
      m.to_float = hot;
      hot = g.Producer(*hot, 0);
    }
    if (!IsOp(hot, "DenseBincount") || !TraceIds(g, g.Producer(*hot, 0), &m)) return false;
    m.bincount = hot;

    // The subgraph has the right shape; now every condition for exactness.
    if (!is_product) return Skip(ctx, anchor, why);
    if (!ServedOnCpu(ctx, anchor))
      return Skip(ctx, anchor, "CtrVocabMultiHot runs on the CPU (lookup tables live on the host): "
                               "rewrite with serving_device='cpu' for a CPU server");
    const DataType T = TypeAttr(anchor, "T");
    if (T != tensorflow::DT_FLOAT && T != tensorflow::DT_DOUBLE)
      return Skip(ctx, anchor, "the kernel is " + tensorflow::DataType_Name(T) + ", not float32 or float64");
    if (BoolAttr(anchor, "transpose_a", false) || BoolAttr(anchor, "transpose_b", false))
      return Skip(ctx, anchor, "the MatMul transposes an operand");
    const DataType counts = TypeAttr(*m.bincount, "T");
    if (m.to_float != nullptr ? !IsIntType(counts) && counts != tensorflow::DT_FLOAT : counts != T)
      return Skip(ctx, anchor, "the encoding's type is " + tensorflow::DataType_Name(counts));
    if (!IsEmptyConst(g.Producer(*m.bincount, 2)))
      return Skip(ctx, anchor, "the bincount is weighted");
    if (!FindTypesFuse(ctx, *m.ids.find, &why) || !FindOnAnchorDevice(*m.ids.find, anchor, &why))
      return Skip(ctx, anchor, why);
    // Online, a captured table's handle carries no value shape, so the find's
    // is unknown; the kernel refuses a table of other than scalar values (on
    // which the bincount would fail too), so the keys' rank is enough.
    int keys_port = 0;
    const NodeDef* keys = g.Producer(*m.ids.find, 1, &keys_port);
    const int rank = ctx->Rank(*m.ids.find, 0) >= 0 ? ctx->Rank(*m.ids.find, 0)
                     : keys != nullptr                ? ctx->Rank(*keys, keys_port)
                                                      : -1;
    if (rank != 2) return Skip(ctx, anchor, "the keys are not known to be a [B, L] matrix");
    m.depth = KnownSize(g, g.Producer(*m.bincount, 1));
    int port = 0;
    const NodeDef* kernel = g.Producer(anchor, 1, &port);
    const int64_t rows = kernel == nullptr ? -1 : ctx->Dim(*kernel, port, 0);
    if (m.depth < 0 || rows != m.depth)
      return Skip(ctx, anchor, "cannot prove that the encoding's depth is the kernel's row count");
    const NodeDef* last = g.Producer(*m.bincount, 0);
    std::set<std::string> size_waits;
    if (!CollectSizeMath(g, g.Producer(*m.bincount, 1), last, &m.size_math, &size_waits))
      return Skip(ctx, anchor, "the encoding's size is computed by more than shape math on the ids");
    // What the encoding's nodes wait on would be lost with them: only the
    // Identities may wait, on Keras' check (MatchVocabWaits).
    std::vector<const NodeDef*> encoding = m.casts;
    encoding.push_back(m.bincount);
    if (m.to_float != nullptr) encoding.push_back(m.to_float);
    for (const NodeDef* n : encoding)
      if (HasControlInputs(*n)) return Skip(ctx, anchor, Describe(*n) + " waits on another node");
    if (!MatchVocabWaits(g, &m.ids, &why) || !MatchSizeMathWaits(g, size_waits, &m, &why) ||
        !OnlyFeedsTheMatMul(ctx, m, &why))
      return Skip(ctx, anchor, why);
    for (const NodeDef* n : m.ids.check)
      if (ctx->FetchedOrFed(n->name())) return Skip(ctx, anchor, "the caller reads " + Describe(*n));
    Replace(anchor, m, product, T, ctx);
    return true;
  }

 private:
  // Online, TF's dependency optimizer has removed Keras' Identity of the ids
  // and moved its wait on the check to what read it: the size math. The
  // size math may wait on the check alone, found there when no Identity did.
  static bool MatchSizeMathWaits(const GraphIndex& g, const std::set<std::string>& waits, MultiHot* m,
                                 std::string* why) {
    for (const std::string& name : waits) {
      if (m->ids.assert_node != nullptr && name == m->ids.assert_node->name()) continue;
      const NodeDef* waited = g.Node(name);
      if (m->ids.assert_node != nullptr || waited == nullptr ||
          !MatchVocabCheck(g, *waited, *m->ids.find, &m->ids)) {
        *why = "the encoding's size waits on " + name + ", which is not the vocabulary check";
        return false;
      }
    }
    return true;
  }

  // Each node between the find and the MatMul feeds only the next one (a
  // training graph's MatMul gradient reads the encoding), but the ids the
  // bincount reads, which its size math reads too; the size math feeds only
  // itself and the bincount (constants aside: TF's CSE shares them between
  // layers, and they stay where anything else reads them).
  static bool OnlyFeedsTheMatMul(RewriteContext* ctx, MultiHot& m, std::string* why) {
    const GraphIndex& g = ctx->index();
    std::set<const NodeDef*> inside(m.size_math.begin(), m.size_math.end());
    inside.insert(m.bincount);
    // The check reads the find's ids where no Identity is between them.
    if (m.ids.identities.empty()) inside.insert(m.ids.check.begin(), m.ids.check.end());
    // What waits on the find (automatic control dependencies on a stateful
    // op) waits on the fused op, which does the find.
    auto only_inside = [&](const NodeDef* n) {
      if (ctx->FetchedOrFed(n->name()) || (n != m.ids.find && g.ControlConsumers(n->name()) != 0)) return false;
      for (const NodeDef* reader : g.DataReaders(n->name()))
        if (!inside.count(reader) && !CollectDeadEnd(ctx, reader, &m.dead)) return false;
      return true;
    };
    auto one_reader = [&](const NodeDef* n) {
      if (ctx->FetchedOrFed(n->name())) return false;
      int live = 0;
      for (const NodeDef* reader : g.DataReaders(n->name())) live += !CollectDeadEnd(ctx, reader, &m.dead);
      return live == 1;
    };
    for (const NodeDef* n : m.size_math)
      if (!IsOp(n, "Const") && !only_inside(n)) return Fail(why, *n);
    if (!one_reader(m.bincount) || (m.to_float != nullptr && !one_reader(m.to_float)))
      return Fail(why, m.to_float != nullptr && one_reader(m.bincount) ? *m.to_float : *m.bincount);
    const NodeDef* last = ctx->index().Producer(*m.bincount, 0);
    std::vector<const NodeDef*> chain = m.casts;
    chain.insert(chain.end(), m.ids.identities.begin(), m.ids.identities.end());
    for (const NodeDef* n : chain)
      if (n == last ? !only_inside(n) : !one_reader(n)) return Fail(why, *n);
    const int check_readers = m.ids.assert_node != nullptr ? 1 : 0;
    const bool direct = chain.empty();
    if (direct ? !only_inside(m.ids.find) : g.DataConsumers(m.ids.find->name()) != 1 + check_readers ||
                                                ctx->FetchedOrFed(m.ids.find->name()))
      return Fail(why, *m.ids.find);
    return true;
  }

  static bool Fail(std::string* why, const NodeDef& n) {
    *why = "intermediate " + Describe(n) + " has another consumer";
    return false;
  }

  void Replace(const NodeDef& anchor_in, const MultiHot& m, const DenseProduct& product, DataType T,
               RewriteContext* ctx) const {
    const NodeDef anchor = anchor_in;  // the graph changes under the reference
    const NodeDef find = *m.ids.find;
    const std::string name = anchor.name();
    MatchRecord record{kName, name, kFusedOp, {}};
    std::vector<const NodeDef*> encoding = m.casts;
    encoding.insert(encoding.end(), m.size_math.begin(), m.size_math.end());
    encoding.push_back(m.bincount);
    if (m.to_float != nullptr) encoding.push_back(m.to_float);
    encoding.insert(encoding.end(), m.dead.begin(), m.dead.end());
    std::vector<std::string> encoding_names;
    for (const NodeDef* n : encoding) encoding_names.push_back(n->name());
    AbsorbVocabNodes(ctx, m.ids, name, encoding_names, &record.replaced);
    for (const NodeDef* n : encoding) {
      if (IsOp(n, "Const")) {
        RemoveIfDeadShapeMath(ctx, n, name, 1);
        continue;
      }
      record.replaced.push_back(Describe(*n));
      ctx->RedirectControlEdges(n->name(), name);
      ctx->Remove(n->name(), name);
    }
    for (const NodeDef* n : m.dead)  // a StridedSlice's begin, end and strides
      for (int i = 0; i < n->input_size(); ++i) {
        const NodeDef* input = ctx->index().Producer(*n, i);
        if (IsOp(input, "Const")) RemoveIfDeadShapeMath(ctx, input, name, 1);
      }
    record.replaced.push_back(Describe(anchor));

    NodeDef* fused = ProductNode(ctx, anchor, product);
    fused->set_op(kFusedOp);
    for (const std::string& in : {find.input(0), find.input(1), find.input(2), anchor.input(1)}) fused->add_input(in);
    CopyControlInputs(find, fused);
    CopyControlInputs(anchor, fused);
    auto& attr = *fused->mutable_attr();
    attr["T"].set_type(T);
    attr["Tkey"].set_type(TypeAttr(find, "Tin"));
    attr["missing_key"].set_s(m.ids.assert_node != nullptr ? "error" : "default");
    attr["missing_id"].set_i(m.ids.missing_id);
    attr["binary_output"].set_b(BoolAttr(*m.bincount, "binary_output", false));
    auto* casts = attr["id_casts"].mutable_list();
    for (auto c = m.casts.rbegin(); c != m.casts.rend(); ++c) casts->add_type(TypeAttr(**c, "DstT"));
    ctx->Matched(record);
  }
};

REGISTER_CTR_FUSION_PATTERN(VocabMultiHotPattern);

}  // namespace
}  // namespace grappler
}  // namespace tf_ctr

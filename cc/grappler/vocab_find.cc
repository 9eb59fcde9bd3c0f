#include "cc/grappler/vocab_find.h"

#include <set>
#include <string>
#include <vector>

#include "cc/grappler/keras_gather.h"

namespace tf_ctr {
namespace grappler {

using tensorflow::NodeDef;

namespace {

// What waited on the Assert waits on the fused op and on what the Assert
// waited on.
void BypassAssert(RewriteContext* ctx, const NodeDef& assert_node, const std::vector<std::string>& absorbed,
                  const std::string& fused) {
  std::vector<std::string> waits;
  AppendControlInputs(assert_node, &waits);
  for (const NodeDef* reader : ctx->index().ControlReaders(assert_node.name())) {
    bool is_absorbed = false;
    for (const std::string& a : absorbed) is_absorbed |= a == reader->name();
    if (!is_absorbed && !waits.empty()) AddControlInputsOnce(waits, ctx->Mutable(reader->name()));
  }
  ctx->RedirectControlEdges(assert_node.name(), fused);
}

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
  return oov->buckets > 0;
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

// Whether operand `i` of `node` is the keys the find looks up.
bool ReadsFindKeys(const GraphIndex& g, const NodeDef& node, int i, const NodeDef& find) {
  return SameTensor(g, node, i, find, 1);
}

// Keras' mask rule: SelectV2(Equal(keys, mask), mask_id, find), the Equal's
// operands in either order (the pattern checks that both are scalars).
bool MatchMaskRule(const GraphIndex& g, const NodeDef& select, const NodeDef& find, KerasKeyRules* r) {
  const NodeDef* equal = g.Producer(select, 0);
  if (!IsOp(equal, "Equal") || g.Producer(select, 1) == nullptr) return false;
  for (int k = 0; k < 2; ++k) {
    if (!ReadsFindKeys(g, *equal, k, find) || g.Producer(*equal, 1 - k) == nullptr) continue;
    r->mask_key_operand = 1 - k;
    r->mask = &select;
    r->mask_equal = equal;
    r->nodes.push_back(&select);
    r->nodes.push_back(equal);
    return true;
  }
  return false;
}

// The slot of each key: StringToHashBucketFast(keys, n) or FloorMod(keys, n).
bool MatchKeySlot(const GraphIndex& g, const NodeDef* slot, const NodeDef& find, int64_t* slots) {
  if (IsOp(slot, "StringToHashBucketFast")) {
    *slots = IntAttr(*slot, "num_buckets", 0);
    return ReadsFindKeys(g, *slot, 0, find) && *slots > 0;
  }
  return IsOp(slot, "FloorMod") && ReadsFindKeys(g, *slot, 0, find) && ConstScalarInt(g.Producer(*slot, 1), slots) &&
         *slots > 0;
}

// Keras' OOV-slot rule over `below` (the mask's Select, or the find):
// SelectV2(Equal(below, oov_id), AddV2(slot(keys), start), below).
bool MatchSlotRule(const GraphIndex& g, const NodeDef& select, const NodeDef& below, const NodeDef& find,
                   KerasKeyRules* r) {
  int port = -1;
  const NodeDef* equal = g.Producer(select, 0);
  const NodeDef* shifted = g.Producer(select, 1);
  if (!IsOp(equal, "Equal") || !(IsOp(shifted, "AddV2") || IsOp(shifted, "Add"))) return false;
  if (OperandBesideConstInt(g, *equal, &r->oov_id, &port) != &below || port != 0) return false;
  const NodeDef* slot = OperandBesideConstInt(g, *shifted, &r->oov_start, &port);
  if (slot == nullptr || port != 0 || !MatchKeySlot(g, slot, find, &r->oov_slots)) return false;
  for (const NodeDef* n : {&select, equal, shifted, slot}) r->nodes.push_back(n);
  return true;
}

// Keras' rules from `x` (a Select) up to the find, each reading the ids of
// the one before as its third operand: the mask's next to the find, the
// slots' after it.
bool MatchKerasKeyRules(const GraphIndex& g, const NodeDef* x, VocabIds* ids) {
  std::vector<const NodeDef*> selects;  // from the last rule up
  int port = 0;
  while (IsSelect(x) && selects.size() < 2 && port == 0) {
    selects.push_back(x);
    x = g.Producer(*x, 2, &port);
  }
  if (!IsOp(x, "LookupTableFindV2") || port != 0) return false;
  KerasKeyRules r;
  size_t left = selects.size();
  if (MatchMaskRule(g, *selects[left - 1], *x, &r)) --left;
  if (left == 1 && MatchSlotRule(g, *selects[0], selects.size() == 2 ? *selects[1] : *x, *x, &r)) --left;
  if (left != 0) return false;
  r.last = selects[0];
  ids->find = x;
  ids->rules = r;
  return true;
}

}  // namespace

bool MatchVocabCheck(const GraphIndex& g, const NodeDef& assert_node, const NodeDef& find, VocabIds* ids) {
  if (!IsOp(&assert_node, "Assert") || assert_node.input_size() < 2) return false;
  const NodeDef* is_empty = g.Producer(assert_node, 0);
  int64_t zero = -1;
  int port = -1;
  if (!IsOp(is_empty, "Equal")) return false;
  const NodeDef* size = OperandBesideConstInt(g, *is_empty, &zero, &port);
  if (zero != 0 || !IsOp(size, "Size")) return false;
  const NodeDef* where = g.Producer(*size, 0);
  if (!IsOp(where, "Where")) return false;
  const NodeDef* missing = g.Producer(*where, 0);
  const NodeDef* source = ids->rules.last != nullptr ? ids->rules.last : &find;
  if (!IsOp(missing, "Equal") || OperandBesideConstInt(g, *missing, &ids->missing_id, &port) != source || port != 0)
    return false;
  std::vector<const NodeDef*> nodes = {is_empty, size, where, missing};
  int formats = 0;
  for (int i = 1; i < assert_node.input_size() && assert_node.input(i)[0] != '^'; ++i, ++formats) {
    const NodeDef* format = g.Producer(assert_node, i);
    if (!IsOp(format, "StringFormat") || format->input_size() != 1) return false;
    const NodeDef* gather = g.Producer(*format, 0);
    if (!IsOp(gather, "GatherNd") || gather->input(0) != find.input(1) || g.Producer(*gather, 1) != where)
      return false;
    nodes.push_back(format);
    nodes.push_back(gather);
  }
  // Every node of the check serves the check alone: one reader each, but the
  // Where, which the Size and each GatherNd read.
  for (const NodeDef* n : nodes) {
    const int readers = n == where ? 1 + formats : 1;
    if (HasControlInputs(*n) || g.ControlConsumers(n->name()) != 0 || g.DataConsumers(n->name()) != readers)
      return false;
  }
  ids->assert_node = &assert_node;
  ids->check = nodes;
  return true;
}

bool TraceToFind(const GraphIndex& g, const NodeDef* x, VocabIds* ids) {
  while (IsOp(x, "Identity")) {
    ids->identities.push_back(x);
    x = g.Producer(*x, 0);
  }
  if (IsSelect(x)) return MatchKerasKeyRules(g, x, ids);
  if (!IsOp(x, "LookupTableFindV2")) return false;
  ids->find = x;
  return true;
}

const NodeDef& IdsSource(const VocabIds& ids) { return ids.rules.last != nullptr ? *ids.rules.last : *ids.find; }

bool KeyRulesFeedOnlyThemselves(RewriteContext* ctx, const VocabIds& ids, std::string* why) {
  const KerasKeyRules& r = ids.rules;
  if (r.last == nullptr) return true;
  // The Select the slot rule reads (the mask's, or the find) is read by its
  // Equal and its Select.
  const NodeDef* under_slots = r.oov_slots > 0 ? (r.mask != nullptr ? r.mask : ids.find) : nullptr;
  for (const NodeDef* n : r.nodes)
    if (n != r.last && !OnlyReadBy(ctx, *n, n == under_slots ? 2 : 1, why)) return false;
  if (under_slots == ids.find) return OnlyReadBy(ctx, *ids.find, 2, why);
  return OnlyReadBy(ctx, *ids.find, 1, why);
}

namespace {

// The value of an integer scalar known before run time, or -1: a constant,
// or Keras' Cast(Shape(params)[0]) with that dim known (Grappler may have
// folded the Shape into a constant vector).
int64_t KnownScalar(RewriteContext* ctx, const NodeDef* node) {
  const GraphIndex& g = ctx->index();
  int64_t value = -1;
  if (ConstScalarInt(node, &value)) return value;
  if (IsOp(node, "Cast")) return KnownScalar(ctx, g.Producer(*node, 0));
  if (!IsFirstElementSlice(g, node)) return -1;
  int port = 0;
  const NodeDef* shape = g.Producer(*node, 0, &port);
  std::vector<int64_t> dims;
  if (ConstIntVector(shape, &dims)) return dims.empty() ? -1 : dims[0];
  if (!IsOp(shape, "Shape")) return -1;
  const NodeDef* of = g.Producer(*shape, 0, &port);
  return of == nullptr ? -1 : ctx->Dim(*of, port, 0);
}

}  // namespace

bool MaskIsScalar(RewriteContext* ctx, const KerasKeyRules& rules) {
  if (rules.mask == nullptr) return true;
  const GraphIndex& g = ctx->index();
  for (const auto& [node, operand] :
       {std::make_pair(rules.mask_equal, rules.mask_key_operand), std::make_pair(rules.mask, 1)}) {
    int port = 0;
    const NodeDef* producer = g.Producer(*node, operand, &port);
    const int rank = producer == nullptr ? -2 : ctx->Rank(*producer, port);
    if (rank != 0 && rank != -1) return false;
  }
  return true;
}

bool WrapShiftIsRowCount(RewriteContext* ctx, const VocabIds& ids, const NodeDef& gather, bool resource) {
  const GraphIndex& g = ctx->index();
  const NodeDef* wrapped = g.Producer(*ids.wrap[0], 2);
  const NodeDef* shift = g.Producer(*ids.wrap[2], 0);
  if (shift == wrapped) shift = g.Producer(*ids.wrap[2], 1);
  const int64_t n = KnownScalar(ctx, shift);
  int64_t rows = -1;
  if (resource) {
    NodeDef read;  // the variable's declared shape
    read.set_op("ReadVariableOp");
    read.add_input(gather.input(0));
    rows = ctx->Dim(read, 0, 0);
  } else {
    int port = 0;
    const NodeDef* params = g.Producer(gather, 0, &port);
    rows = params == nullptr ? -1 : ctx->Dim(*params, port, 0);
  }
  return rows >= 0 && n == rows;
}

bool LookupFeedsOnly(RewriteContext* ctx, const VocabIds& ids, int readers, std::string* why) {
  for (const NodeDef* n : ids.wrap)
    if (!OnlyReadBy(ctx, *n, 1, why)) return false;
  const NodeDef* nearest = ids.identities.empty() ? nullptr : ids.identities.front();
  for (const NodeDef* n : ids.identities)
    if (!OnlyReadBy(ctx, *n, n == nearest ? readers : 1, why)) return false;
  const int check_readers = ids.assert_node != nullptr ? 1 : 0;
  return OnlyReadBy(ctx, IdsSource(ids), (nearest == nullptr ? readers : 1) + check_readers, why) &&
         KeyRulesFeedOnlyThemselves(ctx, ids, why);
}

bool MatchVocabWaits(const GraphIndex& g, VocabIds* ids, std::string* why) {
  for (const NodeDef* identity : ids->identities) {
    for (const std::string& in : identity->input()) {
      if (in.empty() || in[0] != '^') continue;
      const NodeDef* waited = g.Node(in.substr(1));
      if (ids->assert_node != nullptr || waited == nullptr || !MatchVocabCheck(g, *waited, *ids->find, ids)) {
        *why = Describe(*identity) + " waits on " + in.substr(1) + ", which is not the vocabulary check";
        return false;
      }
    }
  }
  return true;
}

bool FindTypesFuse(RewriteContext* ctx, const NodeDef& find, std::string* why) {
  if (TypeAttr(find, "Tout") != tensorflow::DT_INT64) {
    *why = "the table's values are not int64";
    return false;
  }
  const tensorflow::DataType keys = TypeAttr(find, "Tin");
  if (keys != tensorflow::DT_STRING && keys != tensorflow::DT_INT64) {
    *why = "keys are " + tensorflow::DataType_Name(keys);
    return false;
  }
  int port = 0;
  const NodeDef* fallback = ctx->index().Producer(find, 2, &port);
  if (fallback == nullptr || ctx->Rank(*fallback, port) != 0) {
    *why = "the find's default is not known to be a scalar (a table of vector values finds a vector per key)";
    return false;
  }
  return true;
}

bool FindOnAnchorDevice(const NodeDef& find, const NodeDef& anchor, std::string* why) {
  // Unplaced nodes (an offline rewrite's graph) go where the placer puts
  // the fused op: beside the table it reads.
  if (find.device().empty() || anchor.device().empty() || find.device() == anchor.device()) return true;
  *why = "the lookup table is read on " + find.device() + " and " + Describe(anchor) + " runs on " +
         anchor.device() + ": one op cannot read the table there";
  return false;
}

bool ServedOnCpu(RewriteContext* ctx, const NodeDef& anchor) {
  const std::string placed = DeviceType(anchor.device());
  return (placed.empty() ? ctx->serving_device() : placed) == "CPU";
}

void AbsorbVocabNodes(RewriteContext* ctx, const VocabIds& ids, const std::string& fused,
                      const std::vector<std::string>& extra, std::vector<std::string>* replaced) {
  std::vector<const NodeDef*> absorbed = ids.wrap;
  absorbed.insert(absorbed.end(), ids.identities.begin(), ids.identities.end());
  absorbed.insert(absorbed.end(), ids.check.begin(), ids.check.end());
  absorbed.insert(absorbed.end(), ids.rules.nodes.begin(), ids.rules.nodes.end());
  if (ids.assert_node != nullptr) absorbed.push_back(ids.assert_node);
  absorbed.push_back(ids.find);
  std::vector<std::string> names = extra;
  for (const NodeDef* n : absorbed) names.push_back(n->name());
  if (ids.assert_node != nullptr) BypassAssert(ctx, *ids.assert_node, names, fused);
  for (const NodeDef* n : absorbed) {
    replaced->push_back(Describe(*n));
    if (n != ids.assert_node) ctx->RedirectControlEdges(n->name(), fused);
  }
  for (const NodeDef* n : ids.wrap)
    for (int i = 0; i < n->input_size(); ++i) RemoveIfDeadShapeMath(ctx, ctx->index().Producer(*n, i), fused, 4);
  // The mask's key and id stay: the fused op reads them.
  std::vector<const NodeDef*> with_consts = ids.check;
  for (const NodeDef* n : ids.rules.nodes)
    if (n != ids.rules.mask && n != ids.rules.mask_equal) with_consts.push_back(n);
  for (const NodeDef* n : with_consts)
    for (int i = 0; i < n->input_size(); ++i) {
      const NodeDef* input = ctx->index().Producer(*n, i);
      if (IsOp(input, "Const")) RemoveIfDeadShapeMath(ctx, input, fused, 1);
    }
  for (const NodeDef* n : absorbed) ctx->Remove(n->name(), fused);
}

bool MatchBucketedFind(const GraphIndex& g, const NodeDef* x, int port, VocabIds* ids, OovBuckets* oov) {
  if (port != 0) return false;
  if (IsSelect(x)) return MatchOovBuckets(g, *x, ids, oov);
  if (!IsOp(x, "LookupTableFindV2")) return false;
  ids->find = x;
  return true;
}

bool OnlyReadBy(RewriteContext* ctx, const NodeDef& n, int readers, std::string* why) {
  // A function keeps its stateful ops (the find): as a NoOp once fused.
  if (ctx->index().DataConsumers(n.name()) == readers && !ctx->FetchedOrFed(n.name())) return true;
  *why = "intermediate " + Describe(n) + " has another consumer";
  return false;
}

bool BucketedFindFeedsOneReader(RewriteContext* ctx, const VocabIds& ids, const OovBuckets& oov, std::string* why) {
  for (const NodeDef* n : ids.identities)
    if (!OnlyReadBy(ctx, *n, 1, why)) return false;
  for (const NodeDef* n : oov.nodes)
    if (!OnlyReadBy(ctx, *n, 1, why)) return false;
  return OnlyReadBy(ctx, *ids.find, oov.nodes.empty() ? 1 : 2, why);
}

std::vector<std::string> AbsorbBucketedFind(RewriteContext* ctx, VocabIds ids, const OovBuckets& oov,
                                            const std::string& fused, const std::vector<NodeDef>& others,
                                            std::vector<std::string>* replaced) {
  ids.wrap = oov.nodes;
  // The table size goes with the AddV2 that reads it, unless the caller asks for it.
  if (oov.size != nullptr && ctx->index().DataConsumers(oov.size->name()) == 1 &&
      !ctx->FetchedOrFed(oov.size->name()))
    ids.wrap.push_back(oov.size);
  std::set<std::string> gone = {ids.find->name(), fused};
  std::vector<std::string> waits, extra;
  AppendControlInputs(*ids.find, &waits);
  for (const std::vector<const NodeDef*>* nodes : {&ids.wrap, &ids.identities})
    for (const NodeDef* n : *nodes) {
      gone.insert(n->name());
      AppendControlInputs(*n, &waits);
    }
  for (const NodeDef& n : others) {
    gone.insert(n.name());
    AppendControlInputs(n, &waits);
    if (n.name() != fused) extra.push_back(n.name());
  }
  std::vector<std::string> kept;
  for (const std::string& w : waits)
    if (!gone.count(w.substr(1))) kept.push_back(w);
  AbsorbVocabNodes(ctx, ids, fused, extra, replaced);
  return kept;
}

}  // namespace grappler
}  // namespace tf_ctr

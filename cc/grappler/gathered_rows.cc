#include "cc/grappler/gathered_rows.h"

#include <algorithm>

#include "cc/grappler/keras_gather.h"

#include "tensorflow/core/framework/attr_value.pb.h"

namespace tf_ctr {
namespace grappler {

using tensorflow::DataType;
using tensorflow::NodeDef;

void SetTableOfGather(const NodeDef& gather, bool resource, RowSource* src) {
  if (resource) {
    src->resource = gather.input(0);
    src->resource_dtype = TypeAttr(gather, "dtype");
    src->resource_device = gather.device();
  } else {
    src->table = gather.input(0);
  }
}

SourceMatch MatchGatheredRows(const NodeDef& user, int data_input, int idx_input, RewriteContext* ctx, RowSource* src,
                              std::string* why) {
  const GraphIndex& g = ctx->index();
  int rows_port = 0, idx_port = 0, y_port = 0;
  std::vector<const NodeDef*> identities;
  const NodeDef* gather = SkipIdentities(g, g.Producer(user, data_input, &rows_port), &identities);
  const NodeDef* unique = g.Producer(user, idx_input, &idx_port);
  const bool resource = IsOp(gather, "ResourceGather");
  if (!(resource || IsOp(gather, "GatherV2")) || !IsOp(unique, "Unique") || idx_port != 1) return SourceMatch::kOther;
  if (g.Producer(*gather, 1, &y_port) != unique || y_port != 0) {
    *why = "the Gather does not read the Unique ids";
    return SourceMatch::kRejected;
  }
  if (!GathersWholeRows(g, *gather, why)) return SourceMatch::kRejected;
  // Each intermediate must feed only this subgraph.
  if (g.Consumers(unique->name(), 0) != 1 || g.Consumers(unique->name(), 1) != 1 ||
      g.DataConsumers(unique->name()) != 2) {
    *why = "intermediate " + Describe(*unique) + " has another consumer";
    return SourceMatch::kRejected;
  }
  for (const NodeDef* id : identities) {
    if (g.DataConsumers(id->name()) != 1) {
      *why = "intermediate " + Describe(*id) + " has another consumer";
      return SourceMatch::kRejected;
    }
  }
  if (g.Consumers(gather->name(), 0) != 1 || g.DataConsumers(gather->name()) != 1) {
    *why = "intermediate " + Describe(*gather) + " has another consumer";
    return SourceMatch::kRejected;
  }
  const int rank = resource ? ResourceTableRank(ctx, *gather) : ctx->Rank(*gather, 0);
  if (rank != 2) {
    *why = rank < 0 ? "cannot prove the table is a matrix (rank unknown)" : "the table is not a matrix";
    return SourceMatch::kRejected;
  }
  src->key_type = TypeAttr(*unique, "T");
  if (!IsIndexDtype(src->key_type)) {
    *why = "ids are not int32/int64";
    return SourceMatch::kRejected;
  }
  src->keys = unique->input(0);
  src->grad_indices = "first_appearance";
  SetTableOfGather(*gather, resource, src);
  src->absorbed = {unique, gather};
  src->absorbed.insert(src->absorbed.end(), identities.begin(), identities.end());
  return SourceMatch::kMatched;
}

// Rank of a variable's value: the gather's inferred output (ids are a
// vector, so it equals the table's), else the handle's declared shape
// (VarHandleOp `shape`, or `_handle_shapes` on a captured handle).
int ResourceTableRank(RewriteContext* ctx, const NodeDef& gather) {
  const int rank = ctx->Rank(gather, 0);
  if (rank >= 0) return rank;
  // ReadVariableOp's rank is the handle's declared one, looking through Identity.
  NodeDef read;
  read.set_op("ReadVariableOp");
  read.add_input(gather.input(0));
  return ctx->Rank(read, 0);
}

bool MatchDirectRows(const NodeDef& user, int data_input, int idx_input, tensorflow::DataType idx_type,
                     RewriteContext* ctx, RowSource* src, std::string* why) {
  int port = 0;
  const NodeDef* data = ctx->index().Producer(user, data_input, &port);
  if (data == nullptr || ctx->Rank(*data, port) != 2) {
    *why = "cannot prove the data is a matrix (rank unknown or not 2)";
    return false;
  }
  src->table = user.input(data_input);
  src->keys = user.input(idx_input);
  src->key_type = idx_type;
  if (!IsIndexDtype(src->key_type)) *why = "indices are not int32/int64";
  return IsIndexDtype(src->key_type);
}

bool IsStringHash(const NodeDef* n) {
  return IsOp(n, "StringToHashBucketFast") || IsOp(n, "StringToHashBucketStrong");
}

std::vector<int64_t> StringHashKey(const NodeDef& hash) {
  std::vector<int64_t> key;
  if (!IsOp(&hash, "StringToHashBucketStrong")) return key;
  auto it = hash.attr().find("key");
  if (it != hash.attr().end())
    for (int64_t k : it->second.list().i()) key.push_back(k);
  return key;
}

void SetHashKeyAttr(const std::vector<int64_t>& key, NodeDef* fused) {
  if (key.empty()) return;
  auto* list = (*fused->mutable_attr())["hash_key"].mutable_list();
  for (int64_t k : key) list->add_i(k);
}

namespace {
std::vector<int64_t> IntListAttr(const NodeDef& n, const char* name) {
  std::vector<int64_t> out;
  auto it = n.attr().find(name);
  if (it != n.attr().end())
    for (int64_t v : it->second.list().i()) out.push_back(v);
  return out;
}
}  // namespace

std::vector<int64_t> HashKeyAttr(const NodeDef& fused) { return IntListAttr(fused, "hash_key"); }

std::vector<int64_t> GroupedHashKey(const NodeDef& grouped, int i) {
  const std::vector<int64_t> features = IntListAttr(grouped, "keyed_features");
  const std::vector<int64_t> keys = IntListAttr(grouped, "hash_keys");
  for (size_t k = 0; k < features.size() && 2 * k + 1 < keys.size(); ++k)
    if (features[k] == i) return {keys[2 * k], keys[2 * k + 1]};
  return {};
}

void SetGroupedHashKeys(const std::vector<std::vector<int64_t>>& keys, NodeDef* grouped) {
  auto& attr = *grouped->mutable_attr();
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i].empty()) continue;
    attr["keyed_features"].mutable_list()->add_i(static_cast<int64_t>(i));
    for (int64_t k : keys[i]) attr["hash_keys"].mutable_list()->add_i(k);
  }
}

GradForm GradFormAttr(const NodeDef& fused) {
  GradForm form;
  if (!StringAttr(fused, "grad_indices").empty()) form.indices = StringAttr(fused, "grad_indices");
  form.empty_row = IntAttr(fused, "empty_grad_row", -1);
  return form;
}

GradForm GroupedGradForm(const NodeDef& grouped, int i) {
  GradForm form;
  auto indices = grouped.attr().find("grad_indices");
  if (indices != grouped.attr().end() && indices->second.list().s_size() > i)
    form.indices = indices->second.list().s(i);
  auto rows = grouped.attr().find("empty_grad_rows");
  if (rows != grouped.attr().end() && rows->second.list().i_size() > i) form.empty_row = rows->second.list().i(i);
  return form;
}

void SetGroupedGradForms(const std::vector<GradForm>& forms, NodeDef* grouped) {
  if (std::all_of(forms.begin(), forms.end(),
                  [](const GradForm& f) { return f.indices == "per_id" && f.empty_row < 0; }))
    return;
  auto& attr = *grouped->mutable_attr();
  for (const GradForm& f : forms) {
    attr["grad_indices"].mutable_list()->add_s(f.indices);
    attr["empty_grad_rows"].mutable_list()->add_i(f.empty_row);
  }
}

void FuseHashProducer(RewriteContext* ctx, RowSource* src, bool string_keys) {
  const GraphIndex& g = ctx->index();
  std::vector<const NodeDef*> wrap;
  const NodeDef* hash = UnwrapNegativeIndexFix(g, g.Node(ParseTensorName(src->keys).node), &wrap);
  if (!IsStringHash(hash) || ctx->FetchedOrFed(hash->name())) return;
  if (g.DataConsumers(hash->name()) != (wrap.empty() ? 1 : 3)) return;  // the wrap reads it three times
  if (!wrap.empty() && !WrapFeedsOnlyTheGather(ctx, wrap)) return;
  const NodeDef* as_string = g.Producer(*hash, 0);
  const bool int_keys =
      as_string != nullptr && IsPlainAsString(*as_string) && g.DataConsumers(as_string->name()) == 1;
  if (int_keys) {
    src->keys = as_string->input(0);
    src->key_type = TypeAttr(*as_string, "T");
  } else if (string_keys) {
    src->keys = hash->input(0);
    src->key_type = tensorflow::DT_STRING;
  } else {
    return;
  }
  src->id_mode = "hash";
  src->num_buckets = IntAttr(*hash, "num_buckets", 0);
  src->hash_key = StringHashKey(*hash);
  src->absorbed.insert(src->absorbed.end(), wrap.begin(), wrap.end());
  if (!wrap.empty()) src->shape_math = WrapOperands(g, wrap);
  src->absorbed.push_back(hash);
  if (int_keys) src->absorbed.push_back(as_string);
}

std::string TableTensor(RewriteContext* ctx, const RowSource& src, const std::string& base) {
  if (src.resource.empty()) return src.table;
  return AddReadVariable(ctx, base, src.resource, src.resource_dtype, src.resource_device);
}

void AbsorbSource(RewriteContext* ctx, const RowSource& src, const std::string& fused, MatchRecord* record) {
  for (const NodeDef* n : src.shape_math) RemoveIfDeadShapeMath(ctx, n, fused, 4);
  for (const NodeDef* n : src.absorbed) {
    record->replaced.push_back(Describe(*n));
    ctx->RedirectControlEdges(n->name(), fused);
    ctx->Remove(n->name(), fused);
  }
}

void BecomeFusedLookup(RewriteContext* ctx, const std::string& name, const RowSource& src, const FusedLookup& f) {
  NodeDef* fused = ctx->Mutable(name);
  const NodeDef old = *fused;
  fused->clear_input();
  fused->clear_attr();
  fused->set_op("CtrEmbeddingLookup");
  for (const std::string& in : {f.table, src.keys, f.segments, f.num_rows, f.weights}) fused->add_input(in);
  CopyControlInputs(old, fused);
  for (const NodeDef* n : src.absorbed) CopyControlInputs(*n, fused);
  auto& attr = *fused->mutable_attr();
  attr["T"].set_type(f.dtype);
  attr["Tid"].set_type(src.key_type);
  attr["Tseg"].set_type(f.segment_dtype);
  attr["combiner"].set_s(f.combiner);
  attr["segment_kind"].set_s("row_ids");
  attr["id_mode"].set_s(src.id_mode);
  attr["invalid_ids"].set_s("error");
  attr["prune_weights"].set_b(false);
  attr["default_id"].set_i(-1);
  attr["max_norm"].set_f(-1.f);
  attr["has_weights"].set_b(f.has_weights);
  attr["num_buckets"].set_i(src.num_buckets);
  attr["grad_indices"].set_s(src.grad_indices);
  SetHashKeyAttr(src.hash_key, fused);
}

// EnsureShape(strings, [?]): StringSplit's "input must be a vector" kept.
static std::string StringVectorGuard(RewriteContext* ctx, const std::string& base, const std::string& strings) {
  NodeDef* guard = ctx->AddNode(base + "/ctr_strings_vector", "EnsureShape", "");
  guard->add_input(strings);
  auto& attr = *guard->mutable_attr();
  attr["T"].set_type(tensorflow::DT_STRING);
  attr["shape"].mutable_shape()->add_dim()->set_size(-1);
  return guard->name();
}

void BecomeStringEmbedding(RewriteContext* ctx, const std::string& base, const std::string& device,
                           const FusedStrings& f, NodeDef* fused) {
  // Packing is host work: no device, so it stays beside the strings.
  NodeDef* pack = ctx->AddNode(base + "/ctr_pack_strings", "CtrPackStrings", "");
  pack->add_input(f.vector_only ? StringVectorGuard(ctx, base, f.strings) : f.strings);
  (*pack->mutable_attr())["N"].set_i(1);
  const std::string pack_name = pack->name();
  NodeDef* no_bags = ctx->AddNode(base + "/ctr_no_bags", "Const", device);
  (*no_bags->mutable_attr())["dtype"].set_type(tensorflow::DT_INT64);
  auto* t = (*no_bags->mutable_attr())["value"].mutable_tensor();
  t->set_dtype(tensorflow::DT_INT64);
  t->mutable_tensor_shape()->add_dim()->set_size(0);
  fused->set_op("CtrStringEmbedding");
  fused->add_input(f.table);
  fused->add_input(TensorName(pack_name, 0));
  fused->add_input(TensorName(pack_name, 1));
  fused->add_input(no_bags->name());
  auto& attr = *fused->mutable_attr();
  attr["T"].set_type(f.dtype);
  attr["combiner"].set_s(f.combiner);
  attr["id_mode"].set_s(f.id_mode);
  attr["delimiter"].set_s(f.delimiter);
  attr["skip_empty"].set_b(f.skip_empty);
  attr["max_norm"].set_f(f.max_norm);
  attr["bagged"].set_b(false);
  attr["num_buckets"].set_i(f.num_buckets);
  SetHashKeyAttr(f.hash_key, fused);
  attr["trim_empty_tail"].set_b(f.trim_empty_tail);
  attr["invalid_ids"].set_s(f.invalid_ids);
  attr["default_id"].set_i(f.default_id);
  attr["grad_indices"].set_s(f.grad.indices);
  attr["empty_grad_row"].set_i(f.grad.empty_row);
}

}  // namespace grappler
}  // namespace tf_ctr

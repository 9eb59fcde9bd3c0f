// Attribute parsing and input validation shared by the CPU and GPU kernels
// of CtrEmbeddingLookup and its gradient. Everything here reads shapes and
// attributes only, never tensor contents, so it is device-agnostic.
#pragma once

#include <map>
#include <string>

#include "cc/core/lookup.h"
#include "cc/kernels/tf_types.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_ctr {

struct LookupAttrs {
  ctr::LookupSpec spec;  // vocab and dim are filled per call
  bool segments_are_splits = false;
  bool has_weights = false;
  bool merge_grad_rows = false;  // grad_indices "first_appearance"
  bool prune_broadcast = false;  // TF's safe-lookup mask (see AllPrunedByBroadcast)
  // A default_id that is not a row of the bound table (BindTable moves it
  // here and leaves spec.default_id -1), or -1. TF's safe lookup fills empty
  // rows with default_id before its gather, so such a default fails only
  // where a bag keeps no entry: on the CPU an InvalidArgument names that row
  // (PoolLookupCpu); on the GPU the bag pools to zeros, as TF's GPU gather
  // reads an index out of range as zeros.
  int64_t default_not_a_row = -1;
};

// The attrs of pooling rows into bags, whatever names the rows. default_id
// is optional: an op whose rows a table hands out (CtrHashTableEmbedding) has
// no row to name, and pools an empty bag to zeros.
inline absl::Status ReadPoolingAttrs(tensorflow::OpKernelConstruction* c, ctr::LookupSpec* spec) {
  std::string combiner;
  TF_RETURN_IF_ERROR(c->GetAttr("combiner", &combiner));
  if (c->HasAttr("default_id")) TF_RETURN_IF_ERROR(c->GetAttr("default_id", &spec->default_id));
  TF_RETURN_IF_ERROR(c->GetAttr("max_norm", &spec->max_norm));
  TF_RETURN_IF_ERROR(CoreStatus(ctr::CheckMaxNorm(spec->max_norm)));
  TF_RETURN_IF_ERROR(CoreStatus(ctr::ParseCombiner(combiner, &spec->combiner)));
  return absl::OkStatus();
}

// The attrs of every op over bags: how the segments name them, and whether
// the entries have weights.
inline absl::Status ReadBagAttrs(tensorflow::OpKernelConstruction* c, LookupAttrs* a) {
  std::string kind;
  TF_RETURN_IF_ERROR(c->GetAttr("segment_kind", &kind));
  TF_RETURN_IF_ERROR(c->GetAttr("has_weights", &a->has_weights));
  a->segments_are_splits = kind == "row_splits";
  return absl::OkStatus();
}

// The id attrs (id_mode, num_buckets) are optional: an op whose ids are
// always table rows (CtrVocabEmbeddingLookup's found ids) has none of them,
// and reads as index mode. So are the gradient's (grad_indices,
// empty_grad_row), which only the gradient kernels use.
inline absl::Status ReadLookupAttrs(tensorflow::OpKernelConstruction* c, LookupAttrs* a) {
  std::string mode = "index", invalid, grad_indices = "per_id";
  TF_RETURN_IF_ERROR(ReadPoolingAttrs(c, &a->spec));
  TF_RETURN_IF_ERROR(ReadBagAttrs(c, a));
  TF_RETURN_IF_ERROR(c->GetAttr("invalid_ids", &invalid));
  TF_RETURN_IF_ERROR(c->GetAttr("prune_weights", &a->spec.prune_weights));
  if (c->HasAttr("id_mode")) {
    TF_RETURN_IF_ERROR(c->GetAttr("id_mode", &mode));
    TF_RETURN_IF_ERROR(c->GetAttr("num_buckets", &a->spec.buckets));
    std::vector<int64_t> hash_key;
    if (c->HasAttr("hash_key")) TF_RETURN_IF_ERROR(c->GetAttr("hash_key", &hash_key));
    TF_RETURN_IF_ERROR(CoreStatus(ctr::SetHashKey(hash_key, &a->spec.hash)));
  }
  if (c->HasAttr("grad_indices")) TF_RETURN_IF_ERROR(c->GetAttr("grad_indices", &grad_indices));
  if (c->HasAttr("empty_grad_row")) TF_RETURN_IF_ERROR(c->GetAttr("empty_grad_row", &a->spec.empty_grad_row));
  if (c->HasAttr("prune_broadcast")) TF_RETURN_IF_ERROR(c->GetAttr("prune_broadcast", &a->prune_broadcast));
  a->merge_grad_rows = grad_indices == "first_appearance";
  if (a->spec.buckets < 0)
    return tensorflow::errors::InvalidArgument("num_buckets must be >= 0, got ", a->spec.buckets);
  TF_RETURN_IF_ERROR(CoreStatus(ctr::ParseIdMode(mode, &a->spec.id_mode)));
  return CoreStatus(ctr::ParseInvalidIds(invalid, &a->spec.invalid_ids));
}

// Binds the table to the attrs' spec: a table [V, d1, ..., dk] is read as
// [V, d1 * ... * dk], so a bag pools whole rows, whatever their shape ([V]
// has rows of one element). A default_id that is not one of its rows (-1 is
// none) moves to a->default_not_a_row.
inline absl::Status BindTable(const tensorflow::Tensor& params, LookupAttrs* a) {
  using tensorflow::errors::InvalidArgument;
  ctr::LookupSpec* spec = &a->spec;
  if (params.dims() < 1)
    return InvalidArgument("params must have rank >= 1 ([V] or [V, d1, ...]), got a scalar");
  spec->vocab = params.dim_size(0);
  spec->dim = 1;
  for (int i = 1; i < params.dims(); ++i) {
    // [0, 2^62, 8] has no element but rows of 2^65.
    if (__builtin_mul_overflow(spec->dim, params.dim_size(i), &spec->dim))
      return InvalidArgument("params ", params.shape().DebugString(), " has rows of more than 2^63 elements");
  }
  if (spec->id_mode == ctr::IdMode::kHash && spec->vocab <= 0)
    return InvalidArgument("hash mode needs at least one bucket (table row), got ", spec->vocab);
  if (spec->default_id < -1 || spec->default_id >= spec->vocab) {
    a->default_not_a_row = spec->default_id;
    spec->default_id = -1;
  }
  if (spec->empty_grad_row >= spec->vocab) spec->empty_grad_row = -1;
  return absl::OkStatus();
}

// The lookup inputs after validation of their shapes, in the order both ops
// take them (the gradient op has `grad` in front).
struct LookupInputs {
  const tensorflow::Tensor* params;
  const tensorflow::Tensor* ids;
  const tensorflow::Tensor* segments;
  int64_t num_rows_arg;  // -1: infer from the row ids
  const tensorflow::Tensor* weights;  // nullptr when unweighted
  bool all_pruned = false;  // the bags are empty views (AllPrunedByBroadcast)
  int64_t nnz() const { return ids->NumElements(); }
};

// Whether TF's safe lookup would prune every entry of these bags, where ours
// would refuse them: it prunes ids and weights with one mask,
// logical_and(ids >= 0, ones_like(weights)), which broadcasts one value
// against none. So one id without a weight, or one weight without an id (a
// served request missing a weighted column's weight feature, or its id
// feature) is served as bags left empty. With row_splits the splits count
// the ids: only row ids are views TF could have given it.
inline bool AllPrunedByBroadcast(const LookupAttrs& a, int64_t num_ids, int64_t num_weights) {
  return a.prune_broadcast && a.has_weights && !a.segments_are_splits && num_ids + num_weights == 1;
}

// An empty vector of `dtype`, shared and never written.
inline const tensorflow::Tensor& EmptyVector(tensorflow::DataType dtype) {
  static const auto* const kEmpty = [] {
    auto* empty = new std::map<tensorflow::DataType, tensorflow::Tensor>();
    for (tensorflow::DataType t : {tensorflow::DT_INT32, tensorflow::DT_INT64, tensorflow::DT_STRING,
                                   tensorflow::DT_FLOAT})
      empty->emplace(t, tensorflow::Tensor(t, tensorflow::TensorShape({0})));
    return empty;
  }();
  return kEmpty->at(dtype);
}

// The bags (ids, segments, num_rows, weights: inputs first.. first + 3) after
// validation of their shapes; BuildOffsets checks their values.
inline absl::Status ValidateBagInputs(tensorflow::OpKernelContext* ctx, int first, const LookupAttrs& a,
                                      LookupInputs* in) {
  using tensorflow::errors::InvalidArgument;
  const tensorflow::Tensor& ids = ctx->input(first);
  const tensorflow::Tensor& segments = ctx->input(first + 1);
  const tensorflow::Tensor& num_rows = ctx->input(first + 2);
  const tensorflow::Tensor& weights = ctx->input(first + 3);
  if (ids.dims() != 1)
    return InvalidArgument("ids must be a vector, got shape ", ids.shape().DebugString());
  if (segments.dims() != 1)
    return InvalidArgument("segments must be a vector, got shape ", segments.shape().DebugString());
  if (num_rows.dims() != 0)
    return InvalidArgument("num_rows must be a scalar, got shape ", num_rows.shape().DebugString());
  in->num_rows_arg = num_rows.scalar<int64_t>()();
  if (in->num_rows_arg < -1)
    return InvalidArgument("num_rows must be >= -1, got ", in->num_rows_arg);
  if (weights.dims() == 1 && segments.NumElements() == ids.NumElements() &&
      AllPrunedByBroadcast(a, ids.NumElements(), weights.NumElements())) {
    in->ids = &EmptyVector(ids.dtype());
    in->segments = &EmptyVector(segments.dtype());
    in->weights = &EmptyVector(tensorflow::DT_FLOAT);
    in->all_pruned = true;
    return absl::OkStatus();
  }
  if (a.has_weights && (weights.dims() != 1 || weights.NumElements() != ids.NumElements()))
    return InvalidArgument("weights must have one value per id: ids has shape ",
                           ids.shape().DebugString(), ", weights has shape ",
                           weights.shape().DebugString());
  if (a.segments_are_splits && segments.NumElements() < 1)
    return InvalidArgument("row_splits must have at least one element");
  if (!a.segments_are_splits && segments.NumElements() != ids.NumElements())
    return InvalidArgument("row ids must have one value per id: ids has ", ids.NumElements(),
                           " values, row ids have ", segments.NumElements());
  in->ids = &ids;
  in->segments = &segments;
  in->weights = a.has_weights ? &weights : nullptr;
  return absl::OkStatus();
}

// `params` is the table (input `first`, or the variable it names); the bags follow it.
inline absl::Status ValidateLookupInputs(tensorflow::OpKernelContext* ctx, int first,
                                         const tensorflow::Tensor& params, LookupAttrs* a, LookupInputs* in) {
  TF_RETURN_IF_ERROR(ValidateBagInputs(ctx, first + 1, *a, in));
  TF_RETURN_IF_ERROR(BindTable(params, a));
  in->params = &params;
  return absl::OkStatus();
}

// [rows] + params.shape[1:]: the shape of `rows` pooled rows of params.
inline absl::Status PooledShape(const tensorflow::Tensor& params, int64_t rows,
                                tensorflow::TensorShape* shape) {
  TF_RETURN_IF_ERROR(tensorflow::TensorShape::BuildTensorShape({rows}, shape));
  for (int i = 1; i < params.dims(); ++i) TF_RETURN_IF_ERROR(shape->AddDimWithStatus(params.dim_size(i)));
  return absl::OkStatus();
}

inline absl::Status AllocatePooled(tensorflow::OpKernelContext* ctx, int index, const tensorflow::Tensor& params,
                                   int64_t rows, tensorflow::Tensor** out) {
  tensorflow::TensorShape shape;
  TF_RETURN_IF_ERROR(PooledShape(params, rows, &shape));
  return ctx->allocate_output(index, shape, out);
}

// The gradient op's incoming grad must have the forward output's shape.
inline absl::Status CheckPooledGradShape(const tensorflow::Tensor& grad, const tensorflow::Tensor& params,
                                         int64_t rows) {
  tensorflow::TensorShape expected;
  TF_RETURN_IF_ERROR(PooledShape(params, rows, &expected));
  if (grad.shape() == expected) return absl::OkStatus();
  return tensorflow::errors::InvalidArgument("grad must have shape ", expected.DebugString(), ", got ",
                                             grad.shape().DebugString());
}

// What every lookup kernel (CPU and GPU, forward and gradient) does before its
// device work: the attributes are read once, and each call binds them to its
// validated inputs.
// Base is OpKernel, or AsyncOpKernel for the GPU forward kernel.
template <typename Base>
class LookupKernelOn : public Base {
 public:
  explicit LookupKernelOn(tensorflow::OpKernelConstruction* c) : Base(c) {
    OP_REQUIRES_OK(c, ReadLookupAttrs(c, &attrs_));
  }

 protected:
  // `first`: the index of `params` (the gradient op has `grad` in front);
  // `params`: the table it gives (TableInput).
  absl::Status BindInputs(tensorflow::OpKernelContext* ctx, int first, const tensorflow::Tensor& params,
                          LookupAttrs* a, LookupInputs* in) const {
    *a = attrs_;
    return ValidateLookupInputs(ctx, first, params, a, in);
  }

 private:
  LookupAttrs attrs_;
};
using LookupKernel = LookupKernelOn<tensorflow::OpKernel>;

// Rough cost of pooling one bag, for the thread pool's sharding.
inline int64_t BagCost(const LookupInputs& in, const ctr::LookupSpec& spec, int64_t num_rows) {
  const double avg = num_rows > 0 ? in.nnz() / num_rows + 1 : 1;
  const double per_key = 2.0 * spec.dim + (spec.id_mode == ctr::IdMode::kHash ? 40 : 4);
  return ShardCost(avg * per_key + spec.dim);
}

}  // namespace tf_ctr

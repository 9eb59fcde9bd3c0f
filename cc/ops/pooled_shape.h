// Shape functions and gradient-form attrs shared by the ops that pool table rows over bags.
#pragma once

#include <string>

#include "tensorflow/core/framework/shape_inference.h"

// The params gradient's form, on ops that stand in for TF subgraphs whose
// gradients differ in form (a gather's, one row per id; Unique + Gather's, one
// per table row; a segment reduction of the table itself, dense): the rewrite
// sets it to the form of the subgraph it replaced, so that an optimizer
// fine-tuning a rewritten model updates its rows as it did the original's.
#define CTR_GRAD_FORM_ATTRS                                                    \
  Attr("grad_indices: {'per_id', 'first_appearance', 'dense'} = 'per_id'") \
      .Attr("empty_grad_row: int = -1")

namespace tensorflow {
namespace ctr_shapes {

constexpr char kGradFormAttrsDoc[] = R"doc(
grad_indices: the params gradient's rows: "per_id", one per looked-up id in bag
  order; "first_appearance", the rows of each table row summed into one, in
  order of first appearance, as TF's Unique + Gather gives them; "dense", the
  gradient op's rows are per id, and the caller sums them into a dense
  [V, ...] gradient, as TF's lookup without Unique (allow_fast_lookup on a
  tensor table, unweighted) gives it.
empty_grad_row: without a default_id, the row a bag left empty lists in the
  params gradient, with a zero row (-1: none, or not a table row). TF's
  safe_embedding_lookup_sparse fills such a bag with id 0 and zeroes its
  output, so its gradient names row 0.
)doc";

using shape_inference::DimensionHandle;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// Output `index` is [rows] + params.shape[1:].
inline absl::Status SetPooledOutput(InferenceContext* c, int index, DimensionHandle rows, ShapeHandle params) {
  ShapeHandle row_shape, out;
  TF_RETURN_IF_ERROR(c->Subshape(params, 1, &row_shape));
  TF_RETURN_IF_ERROR(c->Concatenate(c->Vector(rows), row_shape, &out));
  c->set_output(index, out);
  return absl::OkStatus();
}

// The table's shape: input `index` itself, or, for the Resource ops, the
// shape its variable handle carries (unknown when it carries none).
inline absl::Status TableShape(InferenceContext* c, int index, bool resource, ShapeHandle* params) {
  if (!resource) return c->WithRankAtLeast(c->input(index), 1, params);
  TF_RETURN_IF_ERROR(c->WithRank(c->input(index), 0, params));
  const auto* handle_data = c->input_handle_shapes_and_types(index);
  if (handle_data == nullptr || handle_data->empty()) {
    *params = c->UnknownShape();
    return absl::OkStatus();
  }
  return c->WithRankAtLeast((*handle_data)[0].shape, 1, params);
}

// The pooled output of a lookup whose table is input `first`, followed by
// ids, segments, num_rows and weights.
inline absl::Status PooledLookupShape(InferenceContext* c, int first, bool resource) {
  ShapeHandle params, unused;
  TF_RETURN_IF_ERROR(TableShape(c, first, resource, &params));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(first + 1), 1, &unused));  // ids
  TF_RETURN_IF_ERROR(c->WithRank(c->input(first + 2), 1, &unused));  // segments
  TF_RETURN_IF_ERROR(c->WithRank(c->input(first + 3), 0, &unused));  // num_rows
  TF_RETURN_IF_ERROR(c->WithRank(c->input(first + 4), 1, &unused));  // weights
  std::string kind;
  TF_RETURN_IF_ERROR(c->GetAttr("segment_kind", &kind));
  DimensionHandle rows = c->UnknownDim();
  if (kind == "row_splits") {
    DimensionHandle splits = c->Dim(c->input(first + 2), 0);
    if (c->ValueKnown(splits)) TF_RETURN_IF_ERROR(c->Subtract(splits, 1, &rows));
  } else {
    // A constant num_rows fixes the batch; -1 (infer) leaves it unknown.
    const Tensor* num_rows = c->input_tensor(first + 3);
    if (num_rows != nullptr && num_rows->scalar<int64_t>()() >= 0)
      rows = c->MakeDim(num_rows->scalar<int64_t>()());
  }
  return SetPooledOutput(c, 0, rows, params);
}

}  // namespace ctr_shapes
}  // namespace tensorflow

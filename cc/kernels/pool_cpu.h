// The pooling of a lookup's bags on the host, shared by the kernels that
// pool on the CPU (the id lookups and the vocabulary lookup).
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "cc/core/lookup_cpu.h"
#include "cc/core/lowest_row_error.h"
#include "cc/core/segments.h"
#include "cc/kernels/lookup_common.h"
#include "cc/kernels/tf_types.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_ctr {

// CSR offsets of the bags, from either segment encoding, in a TF temp tensor:
// the bag count comes from input values (num_rows, or the last row id), so it
// is checked, and the offsets are allocated through TF (an impossible size is
// an error status, not a std::bad_alloc escaping the kernel).
template <typename TSeg>
inline absl::Status BuildOffsets(tensorflow::OpKernelContext* ctx, const LookupAttrs& a, const LookupInputs& in,
                                 tensorflow::Tensor* offsets) {
  const TSeg* seg = in.segments->flat<TSeg>().data();
  const int64_t n = in.segments->NumElements();
  if (a.segments_are_splits) {
    TF_RETURN_IF_ERROR(CoreStatus(ctr::ValidateRowSplits(seg, n, in.nnz())));
    TF_RETURN_IF_ERROR(AllocateTemp(ctx, tensorflow::DT_INT64, {n}, offsets));
    ctr::CopySplits(seg, n, offsets->flat<int64_t>().data());
    return absl::OkStatus();
  }
  if (in.num_rows_arg < 0 && n > 0) {
    const int64_t last = static_cast<int64_t>(seg[n - 1]);
    if (last < 0 || last == std::numeric_limits<int64_t>::max())
      return tensorflow::errors::InvalidArgument("row id ", last, " of entry ", n - 1,
                                                 " is out of range [0, 2^63 - 1)");
  }
  const int64_t rows = ctr::InferNumRows(seg, n, in.num_rows_arg);
  if (rows == std::numeric_limits<int64_t>::max())
    return tensorflow::errors::InvalidArgument("num_rows must be < 2^63 - 1, got ", rows);
  TF_RETURN_IF_ERROR(AllocateTemp(ctx, tensorflow::DT_INT64, {rows + 1}, offsets));
  const std::string error = ctr::RowIdsToOffsets(seg, n, rows, offsets->flat<int64_t>().data());
  if (!error.empty() && in.num_rows_arg < 0) {
    // The row count came from the last row id, so a larger one before it is
    // out of order, not out of range: say so.
    for (int64_t i = 0; i < n; ++i)
      if (static_cast<int64_t>(seg[i]) >= rows)
        return tensorflow::errors::InvalidArgument("row ids must be sorted: entry ", i, " has row ", seg[i],
                                                   ", after which the last entry has row ", rows - 1);
  }
  return CoreStatus(error);
}

// A default_id that is not a table row is an error only where a bag is left
// empty: the lookup and its gradient fail alike.
template <typename TId>
absl::Status CheckDefaultOfEmptyBags(const LookupAttrs& a, const TId* ids, const float* weights,
                                     const int64_t* offsets, int64_t rows) {
  if (a.default_not_a_row == -1) return absl::OkStatus();
  const int64_t empty = ctr::FirstBagWithoutEntries(a.spec, ids, weights, offsets, rows);
  if (empty < 0) return absl::OkStatus();
  return tensorflow::errors::InvalidArgument("default_id ", a.default_not_a_row, " for empty row ", empty,
                                             " is out of range [0, ", a.spec.vocab, ")");
}

// Pools the bags of a bound lookup (its ids of type TId) into output 0, on
// TF's intra-op pool. A bad key stops its range: *error is then the one in
// the lowest row (found() is false when every key was good). A default_id
// that is not a table row is an error only where a bag is left empty.
template <typename T, typename TId, typename TSeg>
absl::Status PoolLookupCpu(tensorflow::OpKernelContext* ctx, const LookupAttrs& a, const LookupInputs& in,
                           ctr::KeyError* error) {
  tensorflow::Tensor offsets_t;
  TF_RETURN_IF_ERROR(BuildOffsets<TSeg>(ctx, a, in, &offsets_t));
  const int64_t* offsets = offsets_t.flat<int64_t>().data();
  const int64_t rows = offsets_t.NumElements() - 1;
  tensorflow::Tensor* out = nullptr;
  TF_RETURN_IF_ERROR(AllocatePooled(ctx, 0, *in.params, rows, &out));

  using CT = typename CoreType<T>::type;
  const CT* params = CorePtr<T>(*in.params);
  const TId* ids = in.ids->flat<TId>().data();
  const float* weights = in.weights ? in.weights->flat<float>().data() : nullptr;
  CT* dst = CorePtr<T>(out);
  ctr::LowestRowError<ctr::KeyError> first_error;
  ParallelFor(ctx, rows, BagCost(in, a.spec, rows), [&](int64_t begin, int64_t end) {
    std::vector<ctr::AccT<CT>> acc(a.spec.dim);
    ctr::KeyError err;
    ctr::PoolBagsCpu(a.spec, params, ids, weights, offsets, begin, end, acc.data(), dst, &err);
    first_error.Offer(err);
  });
  *error = first_error.found() ? first_error.error() : ctr::KeyError();
  return error->found() ? absl::OkStatus() : CheckDefaultOfEmptyBags(a, ids, weights, offsets, rows);
}

// Pools the bags of int64 ids an op computed itself (crossed, bucketized),
// given as row splits, into output 0 with the attrs `a` (bound to `params`).
// An id >= V is an InvalidArgument naming the id (`what` says which kind)
// and its row.
template <typename T>
absl::Status PoolComputedIds(tensorflow::OpKernelContext* ctx, const LookupAttrs& a, const tensorflow::Tensor& params,
                             const tensorflow::Tensor& ids, const tensorflow::Tensor& splits, const char* what) {
  LookupAttrs bags = a;
  bags.segments_are_splits = true;
  bags.has_weights = false;
  const LookupInputs in{&params, &ids, &splits, -1, nullptr};
  ctr::KeyError e;
  TF_RETURN_IF_ERROR((PoolLookupCpu<T, int64_t, int64_t>(ctx, bags, in, &e)));
  if (e.found()) return tensorflow::errors::InvalidArgument(what, " ", ctr::DescribeKeyError(e, a.spec.vocab));
  return absl::OkStatus();
}

}  // namespace tf_ctr

// CPU kernel of CtrCrossEmbeddingLookup: SparseCross's checks and its walk
// over each sparse input's rows, each feature hashed once (not once per cross
// it is in), each row's crosses chained as an odometer that re-hashes only
// the columns that moved, then the shared pooling of the crossed ids.
// CPU only: SparseCross has no GPU kernel either, and its string features
// live on the host.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "cc/core/cross.h"
#include "cc/core/lookup.h"
#include "cc/kernels/huge_pages.h"
#include "cc/kernels/lookup_common.h"
#include "cc/kernels/pool_cpu.h"
#include "cc/kernels/tf_types.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"

namespace tf_ctr {
namespace {

using tensorflow::OpInputList;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::errors::InvalidArgument;

// One input of the cross, as 64-bit features: a sparse input's features of
// row b are features[start[b], start[b + 1]); a dense one's are its row's
// `width` values.
struct CrossColumn {
  std::vector<uint64_t> features;
  // A TF tensor, not a vector: its size is the batch the input claims, and an
  // allocation too large must fail as an error, not as an exception.
  Tensor starts;
  const int64_t* start = nullptr;
  int64_t width = -1;  // >= 0 for a dense input
  int64_t Count(int64_t b) const { return width >= 0 ? width : start[b + 1] - start[b]; }
  uint64_t Feature(int64_t b, int64_t n) const {
    return features[width >= 0 ? b * width + n : start[b] + n];
  }
};

// The features of a values tensor (string or int64), hashed in parallel.
void HashFeatures(OpKernelContext* ctx, const Tensor& values, std::vector<uint64_t>* out) {
  const int64_t n = values.NumElements();
  out->resize(n);
  uint64_t* dst = out->data();
  if (values.dtype() == tensorflow::DT_STRING) {
    const auto* v = values.flat<tensorflow::tstring>().data();
    ParallelFor(ctx, n, 60, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        dst[i] = ctr::CrossFeature(reinterpret_cast<const uint8_t*>(v[i].data()), v[i].size());
    });
  } else {
    const int64_t* v = values.flat<int64_t>().data();
    for (int64_t i = 0; i < n; ++i) dst[i] = ctr::CrossFeature(v[i]);
  }
}

// SparseCross's checks, its messages first (TF's tests match them); the batch
// is the first sparse input's dense_shape[0], else the first dense input's rows.
absl::Status ValidateCross(const OpInputList& indices, const OpInputList& values, const OpInputList& shapes,
                           const OpInputList& dense, int64_t* batch) {
  const int n = indices.size();
  if (values.size() != n)
    return InvalidArgument("sparse_types must have N = ", n, " entries (one values tensor per sparse input), got ",
                           values.size());
  for (int i = 0; i < n; ++i) {
    if (indices[i].dims() != 2)
      return InvalidArgument("Input indices should be a matrix but received shape ",
                             indices[i].shape().DebugString(), " at position ", i,
                             ": indices of sparse input ", i, " must be [nnz, 2]");
    if (indices[i].dim_size(1) != 2)
      return InvalidArgument("Expected D2 of index to be 2 got ", indices[i].dim_size(1), " at position ", i,
                             ": indices of sparse input ", i, " must be [nnz, 2] (a 2-D SparseTensor)");
    if (values[i].dims() != 1 || values[i].dim_size(0) != indices[i].dim_size(0))
      return InvalidArgument("values of sparse input ", i, " must be [", indices[i].dim_size(0),
                             "], one per index, got shape ", values[i].shape().DebugString());
    if (shapes[i].dims() != 1 || shapes[i].NumElements() != 2)
      return InvalidArgument("dense_shape of sparse input ", i, " must be [2] (a 2-D SparseTensor), got shape ",
                             shapes[i].shape().DebugString());
  }
  for (int j = 0; j < dense.size(); ++j)
    if (dense[j].dims() != 2)
      return InvalidArgument("Dense inputs should be a matrix but received shape ",
                             dense[j].shape().DebugString(), " at position ", j, ": dense input ", j,
                             " must be [B, k]");
  *batch = n > 0 ? shapes[0].vec<int64_t>()(0) : dense.size() > 0 ? dense[0].dim_size(0) : 0;
  if (*batch < 0) return InvalidArgument("the batch size (dense_shape[0] of sparse input 0) is negative: ", *batch);
  // Row offsets take batch + 1 entries.
  if (*batch == std::numeric_limits<int64_t>::max())
    return InvalidArgument("the batch size (dense_shape[0] of sparse input 0) is too large: ", *batch);
  for (int i = 0; i < n; ++i)
    if (shapes[i].vec<int64_t>()(0) != *batch)
      return InvalidArgument("Expected batch size ", *batch, " got ", shapes[i].vec<int64_t>()(0),
                             ": sparse input ", i, " has batch size ", shapes[i].vec<int64_t>()(0), ", expected ",
                             *batch);
  for (int j = 0; j < dense.size(); ++j)
    if (dense[j].dim_size(0) != *batch)
      return InvalidArgument("Expected batch size ", *batch, " got ", dense[j].dim_size(0), ": dense input ", j,
                             " has batch size ", dense[j].dim_size(0), ", expected ", *batch);
  return absl::OkStatus();
}

// Each row's features of a sparse input, as SparseCross finds them: the run of
// entries whose row index is b, from where row b - 1's run ended (so entries
// out of row order, or of rows outside [0, batch), are in no row).
absl::Status WalkRows(OpKernelContext* ctx, const Tensor& indices, int64_t batch, CrossColumn* col) {
  TF_RETURN_IF_ERROR(AllocateTemp(ctx, tensorflow::DT_INT64, {batch + 1}, &col->starts));
  int64_t* start = col->starts.flat<int64_t>().data();
  col->start = start;
  const auto idx = indices.matrix<int64_t>();
  const int64_t nnz = indices.dim_size(0);
  int64_t at = 0;
  for (int64_t b = 0; b < batch; ++b) {
    start[b] = at;
    while (at < nnz && idx(at, 0) == b) ++at;
  }
  start[batch] = at;
  return absl::OkStatus();
}

// Row b's cross count (the product of its feature counts), or an error when
// it does not fit in int64.
absl::Status CrossCount(const std::vector<CrossColumn>& cols, int64_t b, int64_t* count) {
  int64_t product = cols.empty() ? 0 : 1;
  for (size_t i = 0; i < cols.size(); ++i) {
    const int64_t c = cols[i].Count(b);
    if (c == 0) {
      product = 0;
      break;
    }
    if (__builtin_mul_overflow(product, c, &product))
      return InvalidArgument("row ", b, " has more crosses than fit in int64");
  }
  *count = product;
  return absl::OkStatus();
}

// Row b's crossed ids, in SparseCross's order (the last input varies fastest).
// chain[i + 1] is the hash key chained over the first i + 1 current features,
// so a step re-chains only from the column that moved. `at` and `chain` are
// the caller's scratch (k and k + 1 entries), reused across rows.
void CrossRow(const std::vector<CrossColumn>& cols, int64_t b, uint64_t hash_key, int64_t buckets, int64_t count,
              int64_t* at, uint64_t* chain, int64_t* out) {
  if (count == 0) return;  // a column without features in this row: nothing to read
  const size_t k = cols.size();
  chain[0] = hash_key;
  for (size_t i = 0; i < k; ++i) {
    at[i] = 0;
    chain[i + 1] = ctr::FingerprintCat64(chain[i], cols[i].Feature(b, 0));
  }
  for (int64_t c = 0; c < count; ++c) {
    out[c] = ctr::CrossBucket(chain[k], buckets);
    size_t moved = k;
    while (moved > 0) {
      --moved;
      if (++at[moved] < cols[moved].Count(b)) break;
      at[moved] = 0;
    }
    for (size_t i = moved; i < k; ++i) chain[i + 1] = ctr::FingerprintCat64(chain[i], cols[i].Feature(b, at[i]));
  }
}

template <typename T>
class CrossEmbeddingLookupOp : public tensorflow::OpKernel {
 public:
  explicit CrossEmbeddingLookupOp(tensorflow::OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, ReadPoolingAttrs(c, &attrs_.spec));
    OP_REQUIRES_OK(c, c->GetAttr("num_buckets", &buckets_));
    int64_t key = 0;
    OP_REQUIRES_OK(c, c->GetAttr("hash_key", &key));
    hash_key_ = static_cast<uint64_t>(key);  // an int attr carries the uint64 key's bits
  }

  void Compute(OpKernelContext* ctx) override {
    OpInputList indices, values, shapes, dense;
    OP_REQUIRES_OK(ctx, ctx->input_list("indices", &indices));
    OP_REQUIRES_OK(ctx, ctx->input_list("values", &values));
    OP_REQUIRES_OK(ctx, ctx->input_list("shapes", &shapes));
    OP_REQUIRES_OK(ctx, ctx->input_list("dense_inputs", &dense));
    const Tensor& params = ctx->input(0);
    LookupAttrs a = attrs_;
    OP_REQUIRES_OK(ctx, BindTable(params, &a));
    AdviseHugePages(ctx, params);
    int64_t batch = 0;
    OP_REQUIRES_OK(ctx, ValidateCross(indices, values, shapes, dense, &batch));

    std::vector<CrossColumn> cols(indices.size() + dense.size());
    for (int i = 0; i < indices.size(); ++i) {
      HashFeatures(ctx, values[i], &cols[i].features);
      OP_REQUIRES_OK(ctx, WalkRows(ctx, indices[i], batch, &cols[i]));
    }
    for (int j = 0; j < dense.size(); ++j) {
      CrossColumn& col = cols[indices.size() + j];
      HashFeatures(ctx, dense[j], &col.features);
      col.width = dense[j].dim_size(1);
    }

    Tensor* splits = nullptr;
    OP_REQUIRES_OK(ctx, AllocateOutput(ctx, 2, {batch + 1}, &splits));
    int64_t* offsets = splits->flat<int64_t>().data();
    offsets[0] = 0;
    int64_t widest = 0;
    for (int64_t b = 0; b < batch; ++b) {
      int64_t count = 0;
      OP_REQUIRES_OK(ctx, CrossCount(cols, b, &count));
      OP_REQUIRES(ctx, !__builtin_add_overflow(offsets[b], count, &offsets[b + 1]),
                  InvalidArgument("the batch has more crosses than fit in int64 (at row ", b, ")"));
      widest = std::max(widest, count);
    }
    Tensor* shape = nullptr;
    OP_REQUIRES_OK(ctx, AllocateOutput(ctx, 3, {2}, &shape));
    shape->vec<int64_t>()(0) = batch;
    shape->vec<int64_t>()(1) = widest;

    Tensor* ids = nullptr;
    OP_REQUIRES_OK(ctx, AllocateOutput(ctx, 1, {offsets[batch]}, &ids));
    int64_t* out = ids->flat<int64_t>().data();
    const int64_t avg = batch > 0 ? offsets[batch] / batch + 1 : 1;
    ParallelFor(ctx, batch, ShardCost(20.0 * avg * (cols.size() + 1)), [&](int64_t begin, int64_t end) {
      std::vector<int64_t> at(cols.size());
      std::vector<uint64_t> chain(cols.size() + 1);
      for (int64_t b = begin; b < end; ++b)
        CrossRow(cols, b, hash_key_, buckets_, offsets[b + 1] - offsets[b], at.data(), chain.data(), out + offsets[b]);
    });

    OP_REQUIRES_OK(ctx, PoolComputedIds<T>(ctx, a, params, *ids, *splits, "crossed"));
  }

 private:
  LookupAttrs attrs_;
  int64_t buckets_ = 0;
  uint64_t hash_key_ = 0;
};

#define REGISTER_CPU(T)                                                                                  \
  REGISTER_KERNEL_BUILDER(Name("CtrCrossEmbeddingLookup").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
                          CrossEmbeddingLookupOp<T>);
REGISTER_CPU(float);
REGISTER_CPU(double);
REGISTER_CPU(Eigen::half);
REGISTER_CPU(Eigen::bfloat16);
#undef REGISTER_CPU

}  // namespace
}  // namespace tf_ctr

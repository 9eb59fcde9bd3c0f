// CPU kernels of CtrEmbeddingLookup and CtrEmbeddingLookupGrad: bag offsets
// are built once, then bags are pooled in parallel on TF's intra-op pool by
// the core loops in cc/core/lookup.h. Only these take string keys (hash
// mode): they are host memory, and hashing them inside the pooling loop
// overlaps it with the row loads, where a StringToHashBucketFast before the
// lookup is a pass of its own.
#include <algorithm>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/escaping.h"
#include "cc/core/first_appearance.h"
#include "cc/core/lookup.h"
#include "cc/core/lookup_cpu.h"
#include "cc/kernels/pool_cpu.h"
#include "cc/kernels/lookup_common.h"
#include "cc/kernels/table_input.h"
#include "cc/kernels/tf_types.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"

namespace tf_ctr {

using tensorflow::DEVICE_CPU;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;

template <typename TId>
constexpr bool kStringKeys = std::is_same_v<TId, tensorflow::tstring>;

// A string is a key to hash, never a table row.
template <typename TId>
absl::Status CheckKeyMode(const LookupAttrs& a) {
  if (kStringKeys<TId> && a.spec.id_mode != ctr::IdMode::kHash)
    return tensorflow::errors::InvalidArgument("string ids are keys to hash: they need id_mode \"hash\"");
  return absl::OkStatus();
}

// The message of a rejected key; a hashed key (string or integer) is named
// with its bucket (the id a Gather after tf.strings.to_hash_bucket_fast
// would reject).
template <typename TId>
std::string DescribeLookupKeyError(const ctr::KeyError& e, const ctr::LookupSpec& s, const Tensor& ids) {
  if constexpr (kStringKeys<TId>) {
    constexpr size_t kShown = 64;
    const tensorflow::tstring& key = ids.flat<TId>()(e.entry);
    const absl::string_view shown(key.data(), std::min(key.size(), kShown));
    return "key \"" + absl::CEscape(shown) + (key.size() > kShown ? "...\"" : "\"") + " in row " +
           std::to_string(e.row) + " hashes to bucket " + std::to_string(e.key) + ", out of range [0, " +
           std::to_string(s.vocab) + ")";
  }
  if (s.id_mode == ctr::IdMode::kHash) {
    return "key " + std::to_string(e.key) + " in row " + std::to_string(e.row) + " hashes to bucket " +
           std::to_string(ctr::HashIntKeyBucket(s.hash, e.key, s.buckets > 0 ? s.buckets : s.vocab)) +
           ", out of range [0, " + std::to_string(s.vocab) + ")";
  }
  return ctr::DescribeKeyError(e, s.vocab);
}

template <typename T, typename TId, typename TSeg>
class EmbeddingLookupCpuOp : public LookupKernel {
 public:
  using LookupKernel::LookupKernel;

  void Compute(OpKernelContext* ctx) override {
    TableInput table;
    OP_REQUIRES_OK(ctx, table.Bind<T>(ctx, 0));
    LookupAttrs a;
    LookupInputs in;
    OP_REQUIRES_OK(ctx, BindInputs(ctx, 0, table.tensor(), &a, &in));
    OP_REQUIRES_OK(ctx, CheckKeyMode<TId>(a));
    ctr::KeyError error;
    OP_REQUIRES_OK(ctx, (PoolLookupCpu<T, TId, TSeg>(ctx, a, in, &error)));
    OP_REQUIRES(ctx, !error.found(),
                tensorflow::errors::InvalidArgument(DescribeLookupKeyError<TId>(error, a.spec, *in.ids)));
  }
};

// The params gradient with one row per table row, in order of first
// appearance, as TF's gradient of Unique + Gather gives it: outputs 0 and 1,
// [U, ...] and [U]. Entry e of bag b contributes J^T (c_e g_b), J the clip's
// Jacobian at the table row and c_e its weight times the bag's combiner
// scale; J depends on the row only, so each row sums c_e g_b over its
// entries first (reading the small [B, D] grad, not per-entry rows) and
// applies ClipBackward once. The default row of an empty bag has c = 1; the
// zero row TF's safe lookup lists for one (empty_grad_row) adds nothing.
template <typename T, typename VisitBag>
absl::Status MergedGradRows(OpKernelContext* ctx, const ctr::LookupSpec& s, const Tensor& params,
                            const Tensor& grad, const VisitBag& visit, int64_t rows, int64_t total) {
  using CT = typename CoreType<T>::type;
  std::vector<float> scale(rows);
  ParallelFor(ctx, rows, 8 * (total / std::max<int64_t>(rows, 1) + 1), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      ctr::BagWeights bw;
      visit(r, [&](int64_t, float w, int64_t) { bw.Add(w); });
      scale[r] = ctr::CombinerScale(s.combiner, bw);
    }
  });
  // Entries in bag order, each with its table row, then that row's slot
  // (first appearance).
  std::vector<int64_t> row_of(total), slot(total), bag(total);
  std::vector<float> coef(total);
  int64_t k = 0;
  auto add = [&](int64_t row, int64_t r, float c) {
    row_of[k] = row;
    bag[k] = r;
    coef[k++] = c;
  };
  const ctr::EmptyBagGrad empty = ctr::EmptyBagGradRow(s);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t first = k;
    visit(r, [&](int64_t row, float w, int64_t) { add(row, r, w * scale[r]); });
    // A zero row names no bag: it adds nothing, even to an inf gradient.
    if (k == first && empty.row >= 0) add(empty.row, empty.zeros ? -1 : r, 1.f);
  }
  ctr::FirstAppearance slot_of(total);
  slot_of.Number(row_of.data(), total, slot.data());
  const std::vector<int64_t>& unique = slot_of.rows();
  const int64_t u = static_cast<int64_t>(unique.size());
  std::vector<int64_t> start(u + 1, 0), order(total);  // entries grouped by slot, in order
  for (int64_t i = 0; i < total; ++i) ++start[slot[i] + 1];
  for (int64_t i = 0; i < u; ++i) start[i + 1] += start[i];
  std::vector<int64_t> cursor(start.begin(), start.end() - 1);
  for (int64_t i = 0; i < total; ++i) order[cursor[slot[i]]++] = i;

  Tensor *values = nullptr, *indices = nullptr;
  TF_RETURN_IF_ERROR(AllocatePooled(ctx, 0, params, u, &values));
  TF_RETURN_IF_ERROR(AllocateOutput(ctx, 1, {u}, &indices));
  std::copy(unique.begin(), unique.end(), indices->flat<int64_t>().data());
  const int64_t dim = s.dim;
  const CT* g = CorePtr<T>(grad);
  const CT* table = CorePtr<T>(params);
  CT* out = CorePtr<T>(values);
  ParallelFor(ctx, u, ShardCost(2.0 * dim * (total / std::max<int64_t>(u, 1) + 1) + dim), [&](int64_t begin, int64_t end) {
    std::vector<ctr::AccT<CT>> sum(dim), dst(dim);
    for (int64_t i = begin; i < end; ++i) {
      std::fill(sum.begin(), sum.end(), 0.f);
      for (int64_t j = start[i]; j < start[i + 1]; ++j) {
        const int64_t e = order[j];
        if (bag[e] < 0) continue;
        const CT* gb = g + bag[e] * dim;
        for (int64_t d = 0; d < dim; ++d) sum[d] += coef[e] * ctr::ToFloat(gb[d]);
      }
      ctr::ClipBackward(table + unique[i] * dim, sum.data(), s, 1.f, dst.data());
      for (int64_t d = 0; d < dim; ++d) out[i * dim + d] = ctr::FromAcc<CT>(dst[d]);
    }
  });
  return absl::OkStatus();
}

template <typename T, typename TId, typename TSeg>
class EmbeddingLookupGradCpuOp : public LookupKernel {
 public:
  using LookupKernel::LookupKernel;

  void Compute(OpKernelContext* ctx) override {
    TableInput table;
    OP_REQUIRES_OK(ctx, table.Bind<T>(ctx, 1));
    LookupAttrs a;
    LookupInputs in;
    OP_REQUIRES_OK(ctx, BindInputs(ctx, 1, table.tensor(), &a, &in));
    OP_REQUIRES_OK(ctx, CheckKeyMode<TId>(a));
    Tensor offsets_t;
    OP_REQUIRES_OK(ctx, BuildOffsets<TSeg>(ctx, a, in, &offsets_t));
    const int64_t* offsets = offsets_t.flat<int64_t>().data();
    const int64_t rows = offsets_t.NumElements() - 1;
    const Tensor& grad = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckPooledGradShape(grad, *in.params, rows));
    using CT = typename CoreType<T>::type;
    const TId* ids = in.ids->flat<TId>().data();
    const float* weights = in.weights ? in.weights->flat<float>().data() : nullptr;

    const ctr::KeyBagVisitor<TId> visit{a.spec, ids, weights, offsets};
    Tensor grad_offsets_t;
    OP_REQUIRES_OK(ctx, AllocateTemp(ctx, tensorflow::DT_INT64, {rows + 1}, &grad_offsets_t));
    int64_t* grad_offsets = grad_offsets_t.flat<int64_t>().data();
    grad_offsets[0] = 0;
    ctr::LowestRowError<ctr::KeyError> first_error;
    ParallelFor(ctx, rows, 8 * (in.nnz() / std::max<int64_t>(rows, 1) + 1),
                [&](int64_t begin, int64_t end) {
                  ctr::KeyError err;
                  ctr::FindBadKey(a.spec, ids, weights, offsets, begin, end, &err);
                  first_error.Offer(err);
                  for (int64_t r = begin; r < end; ++r)
                    grad_offsets[r + 1] = ctr::CountBagGradRows(a.spec, visit, r);
                });
    if (first_error.found()) {
      ctx->CtxFailure(tensorflow::errors::InvalidArgument(
          DescribeLookupKeyError<TId>(first_error.error(), a.spec, *in.ids)));
      return;
    }
    OP_REQUIRES_OK(ctx, CheckDefaultOfEmptyBags(a, ids, weights, offsets, rows));
    for (int64_t r = 0; r < rows; ++r) grad_offsets[r + 1] += grad_offsets[r];
    const int64_t total = grad_offsets[rows];

    Tensor *weights_grad = nullptr, *merged = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, ctx->input(5).shape(), &weights_grad));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, {}, &merged));
    merged->scalar<bool>()() = a.merge_grad_rows;
    weights_grad->flat<float>().setZero();
    float* wgrad = weights ? weights_grad->flat<float>().data() : nullptr;
    if (a.merge_grad_rows) {
      OP_REQUIRES_OK(ctx, MergedGradRows<T>(ctx, a.spec, *in.params, grad, visit, rows, total));
      if (wgrad == nullptr) return;
    } else if (ctr::GradIsPooledGrad(a.spec, weights != nullptr, grad_offsets, rows)) {
      // As a gather's gradient is the upstream gradient itself, no copy.
      ctx->set_output(0, grad);
      Tensor* indices = nullptr;
      OP_REQUIRES_OK(ctx, AllocateOutput(ctx, 1, {rows}, &indices));
      ctr::OneRowBagIndices(a.spec, visit, rows, indices->flat<int64_t>().data());
      return;
    }
    // One row per id (into temporaries when the rows were merged above and
    // only the weights' gradient, computed alongside, is wanted here).
    Tensor values_t, indices_t;
    Tensor *values = &values_t, *indices = &indices_t;
    if (a.merge_grad_rows) {
      tensorflow::TensorShape shape;
      OP_REQUIRES_OK(ctx, PooledShape(*in.params, total, &shape));
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DataTypeToEnum<T>::value, shape, &values_t));
      OP_REQUIRES_OK(ctx, AllocateTemp(ctx, tensorflow::DT_INT64, {total}, &indices_t));
    } else {
      OP_REQUIRES_OK(ctx, AllocatePooled(ctx, 0, *in.params, total, &values));
      OP_REQUIRES_OK(ctx, AllocateOutput(ctx, 1, {total}, &indices));
    }
    ParallelFor(ctx, rows, BagCost(in, a.spec, rows), [&](int64_t begin, int64_t end) {
      std::vector<ctr::AccT<CT>> scratch(3 * a.spec.dim);
      ctr::BagGradCpu(a.spec, CorePtr<T>(*in.params), visit, CorePtr<T>(grad),
                      grad_offsets, begin, end, scratch.data(), CorePtr<T>(values),
                      indices->flat<int64_t>().data(), wgrad);
    });
  }
};

// The Resource ops share the kernels: TableInput reads either input.
#define REGISTER_LOOKUP_CPU_OP(OP, T, TId, TSeg, KERNEL)                            \
  REGISTER_KERNEL_BUILDER(                                                           \
      Name(OP).Device(DEVICE_CPU).TypeConstraint<T>("T").TypeConstraint<TId>("Tid").TypeConstraint<TSeg>("Tseg"), \
      KERNEL<T, TId, TSeg>);
#define REGISTER_LOOKUP_CPU(T, TId, TSeg)                                                          \
  REGISTER_LOOKUP_CPU_OP("CtrEmbeddingLookup", T, TId, TSeg, EmbeddingLookupCpuOp)                 \
  REGISTER_LOOKUP_CPU_OP("CtrResourceEmbeddingLookup", T, TId, TSeg, EmbeddingLookupCpuOp)         \
  REGISTER_LOOKUP_CPU_OP("CtrEmbeddingLookupGrad", T, TId, TSeg, EmbeddingLookupGradCpuOp)         \
  REGISTER_LOOKUP_CPU_OP("CtrResourceEmbeddingLookupGrad", T, TId, TSeg, EmbeddingLookupGradCpuOp)
#define REGISTER_LOOKUP_CPU_IDS(T)                 \
  REGISTER_LOOKUP_CPU(T, int32_t, int32_t)         \
  REGISTER_LOOKUP_CPU(T, int32_t, int64_t)         \
  REGISTER_LOOKUP_CPU(T, int64_t, int32_t)         \
  REGISTER_LOOKUP_CPU(T, int64_t, int64_t)         \
  REGISTER_LOOKUP_CPU(T, tensorflow::tstring, int32_t) \
  REGISTER_LOOKUP_CPU(T, tensorflow::tstring, int64_t)
REGISTER_LOOKUP_CPU_IDS(float)
REGISTER_LOOKUP_CPU_IDS(double)
REGISTER_LOOKUP_CPU_IDS(Eigen::half)
REGISTER_LOOKUP_CPU_IDS(Eigen::bfloat16)
#undef REGISTER_LOOKUP_CPU_IDS
#undef REGISTER_LOOKUP_CPU
#undef REGISTER_LOOKUP_CPU_OP

// CtrCheckBags: the lookup's checks of its bags, on their own, before a
// stateful op uses the ids (see the op's doc).
template <typename TSeg>
class CheckBagsOp : public tensorflow::OpKernel {
 public:
  explicit CheckBagsOp(tensorflow::OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, ReadBagAttrs(c, &attrs_));
  }

  void Compute(tensorflow::OpKernelContext* ctx) override {
    LookupInputs in{};
    OP_REQUIRES_OK(ctx, ValidateBagInputs(ctx, 0, attrs_, &in));
    tensorflow::Tensor offsets;
    OP_REQUIRES_OK(ctx, BuildOffsets<TSeg>(ctx, attrs_, in, &offsets));
    ctx->set_output(0, ctx->input(0));
  }

 private:
  LookupAttrs attrs_;
};

REGISTER_KERNEL_BUILDER(Name("CtrCheckBags").Device(tensorflow::DEVICE_CPU).TypeConstraint<int32_t>("Tseg"),
                        CheckBagsOp<int32_t>);
REGISTER_KERNEL_BUILDER(Name("CtrCheckBags").Device(tensorflow::DEVICE_CPU).TypeConstraint<int64_t>("Tseg"),
                        CheckBagsOp<int64_t>);

// CtrUniqueKept: the bags' checks (CtrCheckBags'), then one numbering pass.
template <typename TSeg>
class UniqueKeptOp : public tensorflow::OpKernel {
 public:
  explicit UniqueKeptOp(tensorflow::OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, ReadBagAttrs(c, &attrs_));
    OP_REQUIRES_OK(c, c->GetAttr("table_rows", &table_rows_));
    OP_REQUIRES_OK(c, c->GetAttr("prune_weights", &prune_weights_));
    OP_REQUIRES_OK(c, c->GetAttr("fill_id", &fill_id_));
    OP_REQUIRES_OK(c, c->GetAttr("idx_base", &idx_base_));
  }

  void Compute(tensorflow::OpKernelContext* ctx) override {
    LookupInputs in{};
    OP_REQUIRES_OK(ctx, ValidateBagInputs(ctx, 0, attrs_, &in));
    Tensor offsets;
    OP_REQUIRES_OK(ctx, BuildOffsets<TSeg>(ctx, attrs_, in, &offsets));
    const int64_t n = in.nnz();
    const int64_t* ids = in.ids->flat<int64_t>().data();
    const float* weights = in.weights != nullptr && prune_weights_ ? in.weights->flat<float>().data() : nullptr;
    auto kept = [&](int64_t e) {
      return ids[e] >= 0 && ids[e] < table_rows_ && (weights == nullptr || weights[e] > 0.f);
    };
    Tensor* idx = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, {n}, &idx));
    ctr::FirstAppearance slots(n + 1);
    const int64_t fill_slot = ctr::NumberKeptEntries(ids, offsets.flat<int64_t>().data(), offsets.NumElements() - 1,
                                                     kept, fill_id_, &slots, idx->flat<int64_t>().data());
    // Slots are < n + 1, so idx + idx_base overflows only for a base past that.
    OP_REQUIRES(ctx, idx_base_ <= std::numeric_limits<int64_t>::max() - (n + 1),
                tensorflow::errors::InvalidArgument("idx_base ", idx_base_, " overflows int64 indices of ", n,
                                                    " ids"));
    if (idx_base_ != 0) {
      int64_t* idx_flat = idx->flat<int64_t>().data();
      for (int64_t e = 0; e < n; ++e) idx_flat[e] += idx_flat[e] >= 0 ? idx_base_ : 0;
    }
    const std::vector<int64_t>& unique = slots.rows();
    Tensor *out = nullptr, *fill = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, {static_cast<int64_t>(unique.size())}, &out));
    std::copy(unique.begin(), unique.end(), out->flat<int64_t>().data());
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, {}, &fill));
    fill->scalar<int64_t>()() = fill_slot;
  }

 private:
  LookupAttrs attrs_;
  int64_t table_rows_ = 0;
  bool prune_weights_ = false;
  int64_t fill_id_ = -1;
  int64_t idx_base_ = 0;
};

REGISTER_KERNEL_BUILDER(Name("CtrUniqueKept").Device(tensorflow::DEVICE_CPU).TypeConstraint<int32_t>("Tseg"),
                        UniqueKeptOp<int32_t>);
REGISTER_KERNEL_BUILDER(Name("CtrUniqueKept").Device(tensorflow::DEVICE_CPU).TypeConstraint<int64_t>("Tseg"),
                        UniqueKeptOp<int64_t>);
#ifdef CTR_WITH_CUDA
// Host work by nature (a serial hash map): on a GPU device it runs on host
// memory, so a graph pinned to a GPU without soft placement still places it.
#define REGISTER_UNIQUE_KEPT_GPU(TSeg)                                                                     \
  REGISTER_KERNEL_BUILDER(Name("CtrUniqueKept")                                                          \
                              .Device(tensorflow::DEVICE_GPU)                                            \
                              .TypeConstraint<TSeg>("Tseg")                                              \
                              .HostMemory("ids")                                                         \
                              .HostMemory("segments")                                                    \
                              .HostMemory("num_rows")                                                    \
                              .HostMemory("weights")                                                     \
                              .HostMemory("unique")                                                      \
                              .HostMemory("idx")                                                         \
                              .HostMemory("fill_idx"),                                                   \
                          UniqueKeptOp<TSeg>);
REGISTER_UNIQUE_KEPT_GPU(int32_t)
REGISTER_UNIQUE_KEPT_GPU(int64_t)
#undef REGISTER_UNIQUE_KEPT_GPU
#endif

}  // namespace tf_ctr

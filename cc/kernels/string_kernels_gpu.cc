// GPU kernels of the string embedding ops. The packed bytes arrive on the
// device through TF's single host-to-device copy of CtrPackStrings' output;
// splits are validated on the device, and rejected tokens are read back
// (one small synchronous copy) to raise the CPU kernel's InvalidArgument.
#ifdef CTR_WITH_CUDA

#include <algorithm>
#include <string>
#include <vector>

#include "cc/core/strings.h"
#include "cc/kernels/gpu_util.h"
#include "cc/kernels/string_common.h"
#include "cc/kernels/tf_types.h"
#include "cuda/device_util.h"
#include "cuda/lookup_launchers.h"
#include "cuda/string_launchers.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_ctr {

using tensorflow::DEVICE_GPU;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

// Device-side bags: validated string splits, and (when bagged) validated bag
// splits copied to int64 scratch.
struct DeviceStrings {
  const uint8_t* bytes = nullptr;
  const int64_t* string_splits = nullptr;
  const int64_t* bag_splits = nullptr;
  int64_t num_bags = 0;
  Tensor bag_scratch;
};

absl::Status PrepareDeviceStrings(OpKernelContext* ctx, const Tensor& bytes, const Tensor& splits,
                                  const Tensor& bag_splits, bool bagged, void* stream, DeviceStrings* out) {
  TF_RETURN_IF_ERROR(CheckVector(bytes, "bytes"));
  TF_RETURN_IF_ERROR(CheckVector(splits, "row_splits"));
  TF_RETURN_IF_ERROR(CheckVector(bag_splits, "bag_splits"));
  if (splits.NumElements() < 1) return tensorflow::errors::InvalidArgument("string row_splits must have at least one element");
  Tensor status;
  TF_RETURN_IF_ERROR(DeviceScratch(ctx, 3, &status));
  int64_t* st = status.flat<int64_t>().data();
  out->bytes = bytes.flat<uint8_t>().data();
  out->string_splits = splits.flat<int64_t>().data();
  TF_RETURN_IF_ERROR(LaunchStatus(ctr::gpu::ValidateStringSplits(out->string_splits, splits.NumElements(),
                                                                  bytes.NumElements(), st, stream)));
  int64_t h[2];
  TF_RETURN_IF_ERROR(LaunchStatus(ctr::gpu::ReadInt64(st, 2, h, stream)));
  if (h[0] >= 0)
    return tensorflow::errors::InvalidArgument("string row_splits[", h[0], "] = ", h[1],
                                               " is negative, decreasing or outside the packed buffer of ",
                                               bytes.NumElements(), " bytes");
  const int64_t num_strings = splits.NumElements() - 1;
  out->num_bags = num_strings;
  if (!bagged) return absl::OkStatus();
  if (bag_splits.NumElements() < 1) return tensorflow::errors::InvalidArgument("bag_splits must have at least one element");
  TF_RETURN_IF_ERROR(DeviceScratch(ctx, bag_splits.NumElements(), &out->bag_scratch));
  int64_t* b = out->bag_scratch.flat<int64_t>().data();
  TF_RETURN_IF_ERROR(LaunchStatus(ctr::gpu::InitStatus(st, stream)));
  TF_RETURN_IF_ERROR(LaunchStatus(ctr::gpu::SplitsToOffsets(bag_splits.flat<int64_t>().data(), bag_splits.NumElements(),
                                                            num_strings, b, st, stream)));
  TF_RETURN_IF_ERROR(LaunchStatus(ctr::gpu::ReadInt64(st, 2, h, stream)));
  if (h[0] >= 0)
    return tensorflow::errors::InvalidArgument("invalid bag_splits: entry ", h[0], " has value ", h[1], " (",
                                               num_strings, " strings)");
  out->bag_splits = b;
  out->num_bags = bag_splits.NumElements() - 1;
  return absl::OkStatus();
}

// Reads a TokenError back from the device, with the token's first bytes for
// the message. A grouped launch records the string's index: first (each
// feature's first string, ascending) maps it to its feature and row.
absl::Status TokenStatus(const int64_t* d_status, const uint8_t* d_bytes, const ctr::StringSpec* specs,
                         const std::vector<int64_t>& first, void* stream) {
  int64_t h[ctr::gpu::kTokenStatusSize];
  TF_RETURN_IF_ERROR(LaunchStatus(ctr::gpu::ReadInt64(d_status, ctr::gpu::kTokenStatusSize, h, stream)));
  ctr::TokenError err{h[0], h[1], h[2], h[3], h[4]};
  if (!err.found()) return absl::OkStatus();
  const int64_t shown = std::min<int64_t>(err.len, 65);  // 64 bytes and a hint that more follow
  std::vector<uint8_t> token(static_cast<size_t>(shown));
  TF_RETURN_IF_ERROR(LaunchStatus(ctr::gpu::CopyToHost(d_bytes + err.begin, token.data(), token.size(), stream)));
  std::string prefix;
  const ctr::StringSpec* spec = specs;
  if (!first.empty()) {
    const int64_t f = std::upper_bound(first.begin(), first.end(), err.row) - first.begin() - 1;
    prefix = "feature " + std::to_string(f) + ": ";
    spec = specs + f;
    err.row -= first[f];
  }
  err.begin = 0;
  err.len = shown;
  return tensorflow::errors::InvalidArgument(prefix, ctr::DescribeTokenError(err, token.data(), spec->lookup.vocab));
}

template <typename T>
class StringEmbeddingGpuOp : public StringKernel {
 public:
  using StringKernel::StringKernel;

  void Compute(OpKernelContext* ctx) override {
    ctr::StringSpec spec;
    OP_REQUIRES_OK(ctx, BindSpec(ctx->input(0), &spec));
    void* stream = GpuStream(ctx);
    DeviceStrings in;
    OP_REQUIRES_OK(ctx, PrepareDeviceStrings(ctx, ctx->input(1), ctx->input(2), ctx->input(3), bagged(), stream, &in));
    Tensor pooled;
    Tensor* dst = nullptr;
    OP_REQUIRES_OK(ctx, AllocatePooled(ctx, tensorflow::DataTypeToEnum<T>::value, in.num_bags, spec.lookup.dim,
                                       trim_empty_tail(), &pooled, &dst));
    if (in.num_bags > 0) {
      Tensor status;
      OP_REQUIRES_OK(ctx, DeviceScratch(ctx, ctr::gpu::kTokenStatusSize, &status));
      int64_t* st = status.flat<int64_t>().data();
      OP_REQUIRES_OK(ctx, LaunchStatus(ctr::gpu::InitTokenStatus(st, stream)));
      OP_REQUIRES_OK(ctx, LaunchStatus(ctr::gpu::StringEmbedding(spec, CorePtr<T>(ctx->input(0)), in.bytes,
                                                                 in.string_splits, in.bag_splits, in.num_bags,
                                                                 CorePtr<T>(dst), st, stream)));
      OP_REQUIRES_OK(ctx, TokenStatus(st, in.bytes, &spec, {}, stream));
    }
    if (!trim_empty_tail()) return;
    // Rows through the last bag with a token: the per-bag token counts of the
    // gradient pass, then the last non-zero one.
    int64_t rows = 0;
    if (in.num_bags > 0) {
      Tensor counts;
      OP_REQUIRES_OK(ctx, DeviceScratch(ctx, in.num_bags, &counts));
      ctr::StringSpec no_default = spec;
      no_default.lookup.default_id = -1;
      OP_REQUIRES_OK(ctx, LaunchStatus(ctr::gpu::StringGradRowCounts(no_default, in.bytes, in.string_splits,
                                                                     in.bag_splits, in.num_bags,
                                                                     counts.flat<int64_t>().data(), stream)));
      OP_REQUIRES_OK(ctx, LaunchStatus(ctr::gpu::CountThroughLastNonZero(counts.flat<int64_t>().data(), in.num_bags,
                                                                         &rows, stream)));
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, AllocateOutput(ctx, 0, {rows, spec.lookup.dim}, &out));
    OP_REQUIRES_OK(ctx, LaunchStatus(ctr::gpu::CopyDeviceToDevice(pooled.flat<T>().data(), out->flat<T>().data(),
                                                                  rows * spec.lookup.dim * sizeof(T), stream)));
  }
};

template <typename T>
class StringEmbeddingGradGpuOp : public StringKernel {
 public:
  using StringKernel::StringKernel;

  void Compute(OpKernelContext* ctx) override {
    ctr::StringSpec spec;
    OP_REQUIRES_OK(ctx, BindSpec(ctx->input(1), &spec));
    void* stream = GpuStream(ctx);
    DeviceStrings in;
    OP_REQUIRES_OK(ctx, PrepareDeviceStrings(ctx, ctx->input(2), ctx->input(3), ctx->input(4), bagged(), stream, &in));
    const Tensor& grad = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckGradShape(grad, in.num_bags, spec.lookup.dim));
    const int64_t rows = in.num_bags;
    Tensor counts, grad_offsets, scan_temp;
    OP_REQUIRES_OK(ctx, DeviceScratch(ctx, std::max<int64_t>(rows, 1), &counts));
    OP_REQUIRES_OK(ctx, DeviceScratch(ctx, rows + 1, &grad_offsets));
    const size_t temp_bytes = ctr::gpu::ExclusiveScanTempBytes(rows);
    OP_REQUIRES_OK(ctx, AllocateTemp(ctx, tensorflow::DT_INT8, {static_cast<int64_t>(temp_bytes) + 1}, &scan_temp));
    int64_t* goff = grad_offsets.flat<int64_t>().data();
    OP_REQUIRES_OK(ctx, LaunchStatus(ctr::gpu::StringGradRowCounts(spec, in.bytes, in.string_splits, in.bag_splits,
                                                                   rows, counts.flat<int64_t>().data(), stream)));
    OP_REQUIRES_OK(ctx, LaunchStatus(ctr::gpu::ExclusiveScan(counts.flat<int64_t>().data(), rows, goff,
                                                             scan_temp.flat<int8_t>().data(), temp_bytes, stream)));
    int64_t total = 0;
    OP_REQUIRES_OK(ctx, LaunchStatus(ctr::gpu::ReadInt64(goff + rows, 1, &total, stream)));
    Tensor *values = nullptr, *indices = nullptr;
    OP_REQUIRES_OK(ctx, AllocateOutput(ctx, 0, {total, spec.lookup.dim}, &values));
    OP_REQUIRES_OK(ctx, AllocateOutput(ctx, 1, {total}, &indices));
    if (total == 0) return;
    OP_REQUIRES_OK(ctx, LaunchStatus(ctr::gpu::StringGrad(spec, CorePtr<T>(ctx->input(1)), in.bytes, in.string_splits,
                                                          in.bag_splits, rows, CorePtr<T>(grad), goff,
                                                          CorePtr<T>(values), indices->flat<int64_t>().data(), stream)));
  }
};

// The packed strings of a grouped op (inputs n and n + 1) on the device,
// validated.
absl::Status GroupStrings(OpKernelContext* ctx, int n, void* stream, DeviceStrings* in) {
  const Tensor& splits = ctx->input(n + 1);
  return PrepareDeviceStrings(ctx, ctx->input(n), splits, splits, false, stream, in);
}

// One launch of ctr::gpu::MultiStringEmbedding over `features`, then its
// token errors read back.
template <typename T>
absl::Status LaunchFeatures(OpKernelContext* ctx, const std::vector<ctr::gpu::FeatureDesc>& features, int64_t batch,
                            const DeviceStrings& in, const std::vector<ctr::StringSpec>& specs,
                            const std::vector<int64_t>& first, void* stream) {
  const int64_t n = static_cast<int64_t>(features.size());
  Tensor d_features, status;
  TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DT_INT8,
                                        TensorShape({static_cast<int64_t>(n * sizeof(ctr::gpu::FeatureDesc))}),
                                        &d_features));
  TF_RETURN_IF_ERROR(DeviceScratch(ctx, ctr::gpu::kTokenStatusSize, &status));
  int64_t* st = status.flat<int64_t>().data();
  TF_RETURN_IF_ERROR(LaunchStatus(ctr::gpu::InitTokenStatus(st, stream)));
  TF_RETURN_IF_ERROR(LaunchStatus(ctr::gpu::MultiStringEmbedding<typename CoreType<T>::type>(
      features.data(), reinterpret_cast<ctr::gpu::FeatureDesc*>(d_features.flat<int8_t>().data()), n, batch,
      in.bytes, in.string_splits, st, stream)));
  return TokenStatus(st, in.bytes, specs.data(), first, stream);
}

template <typename T>
class MultiStringEmbeddingGpuOp : public MultiStringKernel {
 public:
  using MultiStringKernel::MultiStringKernel;

  void Compute(OpKernelContext* ctx) override {
    const int n = num_features();
    void* stream = GpuStream(ctx);
    DeviceStrings in;
    OP_REQUIRES_OK(ctx, GroupStrings(ctx, n, stream, &in));
    int64_t batch = 0;
    OP_REQUIRES_OK(ctx, GroupBatch(ctx->input(n + 1), &batch));
    std::vector<ctr::StringSpec> specs;
    std::vector<Tensor*> outs;
    OP_REQUIRES_OK(ctx, BindFeatures(ctx, batch, &specs, &outs));
    std::vector<ctr::gpu::FeatureDesc> features(n);
    std::vector<int64_t> first(n);
    for (int i = 0; i < n; ++i) {
      first[i] = i * batch;
      features[i] = ctr::gpu::FeatureDesc{specs[i], CorePtr<T>(ctx->input(i)), CorePtr<T>(outs[i]),
                                          first[i], batch, batch, specs[i].lookup.dim};
    }
    if (batch == 0) return;
    OP_REQUIRES_OK(ctx, LaunchFeatures<T>(ctx, features, batch, in, specs, first, stream));
  }
};

template <typename T>
class ConcatStringEmbeddingGpuOp : public ConcatStringKernel {
 public:
  using ConcatStringKernel::ConcatStringKernel;

  void Compute(OpKernelContext* ctx) override {
    const int n = num_features();
    void* stream = GpuStream(ctx);
    DeviceStrings in;
    OP_REQUIRES_OK(ctx, GroupStrings(ctx, n, stream, &in));
    Plan plan;
    OP_REQUIRES_OK(ctx, MakePlan(ctx, in.num_bags, [&](int f, const Plan& p, int64_t* rows) {
      return FeatureRows(ctx, p.specs[f], f, in, p.first, stream, rows);
    }, &plan));
    std::vector<int64_t>& first = plan.first;
    const std::vector<ctr::StringSpec>& specs = plan.specs;
    const std::vector<int64_t>& columns = plan.columns;
    const int64_t common = plan.rows, width = plan.width();
    Tensor* out = plan.out;
    int64_t longest = 0;
    for (int f = 0; f < n; ++f) longest = std::max(longest, first[f + 1] - first[f]);
    for (int j = 0; j < num_dense(); ++j) {
      const Tensor& d = dense(ctx, j);
      OP_REQUIRES_OK(ctx, LaunchStatus(ctr::gpu::CopyRows2D(
                              d.flat<T>().data(), d.dim_size(1) * sizeof(T), out->flat<T>().data() + columns[n + j],
                              width * sizeof(T), d.dim_size(1) * sizeof(T), common, stream)));
    }
    if (longest == 0) return;
    // Every string is split, a trimmed feature's tail past `common` too (so a
    // bad token there is reported, as on the CPU), but only rows < common are
    // written.
    std::vector<ctr::gpu::FeatureDesc> features(n);
    for (int f = 0; f < n; ++f)
      features[f] = ctr::gpu::FeatureDesc{specs[f], CorePtr<T>(ctx->input(f)), CorePtr<T>(out) + columns[f],
                                          first[f], first[f + 1] - first[f], common, width};
    first.pop_back();
    OP_REQUIRES_OK(ctx, LaunchFeatures<T>(ctx, features, longest, in, specs, first, stream));
  }

 private:
  // Feature f's output rows: its strings, or, trimmed, the bags through its
  // last one with a table row (the gradient pass's per-bag counts, where a
  // rejected token is no row; the pooling pass then reports it).
  absl::Status FeatureRows(OpKernelContext* ctx, const ctr::StringSpec& spec, int f, const DeviceStrings& in,
                           const std::vector<int64_t>& first, void* stream, int64_t* rows) const {
    const int64_t count = first[f + 1] - first[f];
    *rows = count;
    if (!trimmed(f) || count == 0) return absl::OkStatus();
    Tensor counts;
    TF_RETURN_IF_ERROR(DeviceScratch(ctx, count, &counts));
    ctr::StringSpec no_default = spec;
    no_default.lookup.default_id = -1;
    TF_RETURN_IF_ERROR(LaunchStatus(ctr::gpu::StringGradRowCounts(no_default, in.bytes, in.string_splits + first[f],
                                                                  nullptr, count, counts.flat<int64_t>().data(),
                                                                  stream)));
    return LaunchStatus(ctr::gpu::CountThroughLastNonZero(counts.flat<int64_t>().data(), count, rows, stream));
  }
};

#define REGISTER_STRING_GPU(T)                                                                       \
  REGISTER_KERNEL_BUILDER(Name("CtrStringEmbedding").Device(DEVICE_GPU).TypeConstraint<T>("T"),      \
                          StringEmbeddingGpuOp<T>);                                                  \
  REGISTER_KERNEL_BUILDER(Name("CtrStringEmbeddingGrad").Device(DEVICE_GPU).TypeConstraint<T>("T"),  \
                          StringEmbeddingGradGpuOp<T>);                                              \
  REGISTER_KERNEL_BUILDER(Name("CtrMultiStringEmbedding").Device(DEVICE_GPU).TypeConstraint<T>("T"), \
                          MultiStringEmbeddingGpuOp<T>);                                             \
  REGISTER_KERNEL_BUILDER(Name("CtrConcatStringEmbedding")                                           \
                              .Device(DEVICE_GPU)                                                    \
                              .TypeConstraint<T>("T")                                                \
                              .HostMemory("input_splits"),                                           \
                          ConcatStringEmbeddingGpuOp<T>);
REGISTER_STRING_GPU(float)
REGISTER_STRING_GPU(Eigen::half)
REGISTER_STRING_GPU(Eigen::bfloat16)
#undef REGISTER_STRING_GPU

}  // namespace tf_ctr

#endif  // CTR_WITH_CUDA

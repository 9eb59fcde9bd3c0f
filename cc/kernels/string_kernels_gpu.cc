// GPU kernels of the string embedding ops. The packed bytes arrive on the
// device through TF's single host-to-device copy of CtrPackStrings' output.
//
// The forward kernels are asynchronous, as the id lookup's is: the string
// splits and bag splits are checked on the device, each check writing its
// lowest bad entry into a status word; the kernels behind them read a gated
// copy of the splits (all zeros, every string empty, when any is bad) and
// clamped bag offsets, so nothing reads outside the packed bytes before the
// status is known. The pooling records the first rejected token, a small
// kernel copies its first bytes beside it, and one copy of all the status
// words into pinned memory is checked in an EventMgr callback once the
// stream reaches it, raising the CPU kernel's InvalidArgument (the splits'
// first, as the CPU checks them first). A synchronous read per op would block
// the compute thread and drain the stream, serializing a served model of
// many features; the splits cannot be checked on the host, where they are
// not. What still reads back synchronously needs a count to size an output:
// the rows of a trimmed feature (plain embedding_lookup_sparse drops empty
// trailing rows) and the gradient's row count; those ops also check the
// splits at once, so a bad split is reported as such, not as the
// concatenation's or the gradient's row mismatch it would cause.
#ifdef CTR_WITH_CUDA

#include <algorithm>
#include <string>
#include <utility>
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

// One op's status words, read back once: the string splits' check {index,
// value, scratch}, the bag splits' {entry, value}, the token error, and the
// rejected token's first bytes.
constexpr int kSplitsStatus = 0;
constexpr int kBagsStatus = 3;
constexpr int kTokenStatus = 5;
constexpr int kTokenBytes = kTokenStatus + ctr::gpu::kTokenStatusSize;
constexpr int64_t kShownBytes = 65;  // 64 bytes and a hint that more follow
constexpr int kStatusWords = kTokenBytes + (kShownBytes + 7) / 8;

// Device-side bags: gated string splits, and (when bagged) bag splits turned
// into clamped int64 offsets.
struct DeviceStrings {
  const uint8_t* bytes = nullptr;
  const int64_t* string_splits = nullptr;
  const int64_t* bag_splits = nullptr;
  int64_t num_bags = 0;
  int64_t num_bytes = 0;
  int64_t num_strings = 0;
  Tensor gated_splits;
  Tensor bag_scratch;
};

// What an error message needs of the strings once the device is done.
struct StringCounts {
  int64_t bytes = 0;
  int64_t strings = 0;
};

// Queues the checks of the splits (into st, kStatusWords device words) and
// the gated copies the kernels read; only shapes are checked here.
absl::Status PrepareDeviceStrings(OpKernelContext* ctx, const Tensor& bytes, const Tensor& splits,
                                  const Tensor& bag_splits, bool bagged, int64_t* st, void* stream,
                                  DeviceStrings* out) {
  TF_RETURN_IF_ERROR(CheckVector(bytes, "bytes"));
  TF_RETURN_IF_ERROR(CheckVector(splits, "row_splits"));
  TF_RETURN_IF_ERROR(CheckVector(bag_splits, "bag_splits"));
  if (splits.NumElements() < 1) return tensorflow::errors::InvalidArgument("string row_splits must have at least one element");
  if (bagged && bag_splits.NumElements() < 1)
    return tensorflow::errors::InvalidArgument("bag_splits must have at least one element");
  out->bytes = bytes.flat<uint8_t>().data();
  out->num_bytes = bytes.NumElements();
  out->num_strings = splits.NumElements() - 1;
  out->num_bags = out->num_strings;
  TF_RETURN_IF_ERROR(DeviceScratch(ctx, splits.NumElements(), &out->gated_splits));
  int64_t* gated = out->gated_splits.flat<int64_t>().data();
  const int64_t* raw = splits.flat<int64_t>().data();
  TF_RETURN_IF_ERROR(LaunchStatus(ctr::gpu::InitTokenStatus(st + kTokenStatus, stream)));
  TF_RETURN_IF_ERROR(LaunchStatus(ctr::gpu::InitStatus(st + kBagsStatus, stream)));
  TF_RETURN_IF_ERROR(LaunchStatus(
      ctr::gpu::ValidateStringSplits(raw, splits.NumElements(), out->num_bytes, st + kSplitsStatus, stream)));
  TF_RETURN_IF_ERROR(LaunchStatus(
      ctr::gpu::GateStringSplits(raw, splits.NumElements(), st + kSplitsStatus, gated, stream)));
  out->string_splits = gated;
  if (!bagged) return absl::OkStatus();
  TF_RETURN_IF_ERROR(DeviceScratch(ctx, bag_splits.NumElements(), &out->bag_scratch));
  int64_t* b = out->bag_scratch.flat<int64_t>().data();
  TF_RETURN_IF_ERROR(LaunchStatus(ctr::gpu::SplitsToOffsets(bag_splits.flat<int64_t>().data(), bag_splits.NumElements(),
                                                            out->num_strings, b, st + kBagsStatus, stream)));
  out->bag_splits = b;
  out->num_bags = bag_splits.NumElements() - 1;
  return absl::OkStatus();
}

// The InvalidArgument of the splits' status words (h's first kTokenStatus),
// the string splits' before the bag splits', as the CPU kernel checks them.
absl::Status SplitsStatusError(const int64_t* h, const StringCounts& counts) {
  const int64_t* split = h + kSplitsStatus;
  if (split[0] >= 0)
    return tensorflow::errors::InvalidArgument("string row_splits[", split[0], "] = ", split[1],
                                               " is negative, decreasing or outside the packed buffer of ",
                                               counts.bytes, " bytes");
  const int64_t* bag = h + kBagsStatus;
  if (bag[0] >= 0)
    return tensorflow::errors::InvalidArgument("invalid bag_splits: entry ", bag[0], " has value ", bag[1], " (",
                                               counts.strings, " strings)");
  return absl::OkStatus();
}

// The InvalidArgument all the status words `h` stand for: the splits', then
// the first rejected token's. A grouped launch records the string's index:
// first (each feature's first string, ascending) maps it to its feature and
// row.
absl::Status StringStatusError(const int64_t* h, const StringCounts& counts, const ctr::StringSpec* specs,
                               const std::vector<int64_t>& first) {
  TF_RETURN_IF_ERROR(SplitsStatusError(h, counts));
  const int64_t* t = h + kTokenStatus;
  ctr::TokenError err{t[0], t[1], t[2], t[3], t[4]};
  if (!err.found()) return absl::OkStatus();
  std::string prefix;
  const ctr::StringSpec* spec = specs;
  if (!first.empty()) {
    const int64_t f = std::upper_bound(first.begin(), first.end(), err.row) - first.begin() - 1;
    prefix = "feature " + std::to_string(f) + ": ";
    spec = specs + f;
    err.row -= first[f];
  }
  err.begin = 0;
  err.len = std::min(err.len, kShownBytes);
  return tensorflow::errors::InvalidArgument(
      prefix, ctr::DescribeTokenError(err, reinterpret_cast<const uint8_t*>(h + kTokenBytes), spec->lookup.vocab));
}

// Queues the capture of a rejected token's bytes and one copy of every
// status word into pinned memory (*host), which a callback reads.
absl::Status QueueStatusRead(OpKernelContext* ctx, int64_t* st, const DeviceStrings& in, void* stream, Tensor* host) {
  TF_RETURN_IF_ERROR(HostScratch(ctx, kStatusWords, host));
  TF_RETURN_IF_ERROR(LaunchStatus(ctr::gpu::CaptureTokenBytes(st + kTokenStatus, in.bytes, kShownBytes,
                                                              reinterpret_cast<uint8_t*>(st + kTokenBytes), stream)));
  return LaunchStatus(
      ctr::gpu::CopyToHostAsync(st, host->flat<int64_t>().data(), kStatusWords * sizeof(int64_t), stream));
}

// Reads the splits' status words now (before an op sizes an output from
// counts the gated splits would give).
absl::Status CheckSplitsNow(int64_t* st, const DeviceStrings& in, void* stream) {
  int64_t h[kTokenStatus] = {};
  TF_RETURN_IF_ERROR(LaunchStatus(ctr::gpu::ReadInt64(st, kTokenStatus, h, stream)));
  return SplitsStatusError(h, StringCounts{in.num_bytes, in.num_strings});
}

// Queues the status read, then ends the op in a callback once the stream
// has reached it: with the first error the words hold, or none.
void FinishAsync(OpKernelContext* ctx, tensorflow::AsyncOpKernel::DoneCallback done, int64_t* st,
                 const DeviceStrings& in, void* stream, std::vector<ctr::StringSpec> specs,
                 std::vector<int64_t> first) {
  // Device scratch may be freed once this returns: TF's GPU allocator orders
  // reuse on this stream. The pinned words live in the callback.
  Tensor host;
  OP_REQUIRES_OK_ASYNC(ctx, QueueStatusRead(ctx, st, in, stream, &host), done);
  const StringCounts counts{in.num_bytes, in.num_strings};
  ThenExecute(ctx, [ctx, done, host, counts, specs = std::move(specs), first = std::move(first)]() {
    OP_REQUIRES_OK_ASYNC(ctx, StringStatusError(host.flat<int64_t>().data(), counts, specs.data(), first), done);
    done();
  });
}

template <typename T>
class StringEmbeddingGpuOp : public StringKernelOn<tensorflow::AsyncOpKernel> {
 public:
  using StringKernelOn::StringKernelOn;

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    ctr::StringSpec spec;
    OP_REQUIRES_OK_ASYNC(ctx, BindSpec(ctx->input(0), &spec), done);
    void* stream = GpuStream(ctx);
    Tensor status;
    OP_REQUIRES_OK_ASYNC(ctx, DeviceScratch(ctx, kStatusWords, &status), done);
    int64_t* st = status.flat<int64_t>().data();
    DeviceStrings in;
    OP_REQUIRES_OK_ASYNC(
        ctx, PrepareDeviceStrings(ctx, ctx->input(1), ctx->input(2), ctx->input(3), bagged(), st, stream, &in), done);
    Tensor pooled;
    Tensor* dst = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx,
                         AllocatePooled(ctx, tensorflow::DataTypeToEnum<T>::value, in.num_bags, spec.lookup.dim,
                                        trim_empty_tail(), &pooled, &dst),
                         done);
    if (in.num_bags > 0)
      OP_REQUIRES_OK_ASYNC(ctx,
                           LaunchStatus(ctr::gpu::StringEmbedding(spec, CorePtr<T>(ctx->input(0)), in.bytes,
                                                                  in.string_splits, in.bag_splits, in.num_bags,
                                                                  CorePtr<T>(dst), st + kTokenStatus, stream)),
                           done);
    if (trim_empty_tail()) OP_REQUIRES_OK_ASYNC(ctx, OutputThroughLastRow(ctx, spec, in, pooled, stream), done);
    FinishAsync(ctx, std::move(done), st, in, stream, {spec}, {});
  }

 private:
  // Output 0: the pooled rows through the last bag with a token (the
  // gradient pass's per-bag token counts, then the last non-zero one), read
  // back to size it. Bad splits leave no token (the callback reports them).
  static absl::Status OutputThroughLastRow(OpKernelContext* ctx, const ctr::StringSpec& spec, const DeviceStrings& in,
                                           const Tensor& pooled, void* stream) {
    int64_t rows = 0;
    if (in.num_bags > 0) {
      Tensor counts;
      TF_RETURN_IF_ERROR(DeviceScratch(ctx, in.num_bags + 1, &counts));  // the last: CountThroughLastNonZero's
      const ctr::StringSpec tokens = TokenCountSpec(spec);
      TF_RETURN_IF_ERROR(LaunchStatus(ctr::gpu::StringGradRowCounts(tokens, in.bytes, in.string_splits,
                                                                    in.bag_splits, in.num_bags,
                                                                    counts.flat<int64_t>().data(), nullptr,
                                                                    stream)));
      TF_RETURN_IF_ERROR(LaunchStatus(
          ctr::gpu::CountThroughLastNonZero(counts.flat<int64_t>().data(), in.num_bags,
                                            counts.flat<int64_t>().data() + in.num_bags, &rows, stream)));
    }
    Tensor* out = nullptr;
    TF_RETURN_IF_ERROR(AllocateOutput(ctx, 0, {rows, spec.lookup.dim}, &out));
    using CT = typename CoreType<T>::type;
    return LaunchStatus(ctr::gpu::CopyDeviceToDevice(CorePtr<T>(pooled), CorePtr<T>(out),
                                                     rows * spec.lookup.dim * sizeof(CT), stream));
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
    Tensor status;
    OP_REQUIRES_OK(ctx, DeviceScratch(ctx, kStatusWords, &status));
    int64_t* st = status.flat<int64_t>().data();
    DeviceStrings in;
    OP_REQUIRES_OK(ctx, PrepareDeviceStrings(ctx, ctx->input(2), ctx->input(3), ctx->input(4), bagged(), st, stream,
                                             &in));
    OP_REQUIRES_OK(ctx, CheckSplitsNow(st, in, stream));
    const Tensor& grad = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckGradShape(grad, in.num_bags, spec.lookup.dim));
    const int64_t rows = in.num_bags;
    Tensor counts, grad_offsets, scan_temp;
    OP_REQUIRES_OK(ctx, DeviceScratch(ctx, std::max<int64_t>(rows, 1), &counts));
    OP_REQUIRES_OK(ctx, DeviceScratch(ctx, rows + 1, &grad_offsets));
    const size_t temp_bytes = ctr::gpu::ExclusiveScanTempBytes(rows);
    OP_REQUIRES_OK(ctx, AllocateTemp(ctx, tensorflow::DT_INT8, {static_cast<int64_t>(temp_bytes) + 1}, &scan_temp));
    int64_t* goff = grad_offsets.flat<int64_t>().data();
    // The counts record the first token the forward op would reject: called
    // on its own, the gradient fails on it too.
    OP_REQUIRES_OK(ctx, LaunchStatus(ctr::gpu::StringGradRowCounts(spec, in.bytes, in.string_splits, in.bag_splits,
                                                                   rows, counts.flat<int64_t>().data(),
                                                                   st + kTokenStatus, stream)));
    OP_REQUIRES_OK(ctx, LaunchStatus(ctr::gpu::ExclusiveScan(counts.flat<int64_t>().data(), rows, goff,
                                                             scan_temp.flat<int8_t>().data(), temp_bytes, stream)));
    OP_REQUIRES_OK(ctx, LaunchStatus(ctr::gpu::CaptureTokenBytes(st + kTokenStatus, in.bytes, kShownBytes,
                                                                 reinterpret_cast<uint8_t*>(st + kTokenBytes),
                                                                 stream)));
    int64_t total = 0, h[kStatusWords];
    OP_REQUIRES_OK(ctx, LaunchStatus(ctr::gpu::ReadInt64(goff + rows, 1, &total, stream)));
    OP_REQUIRES_OK(ctx, LaunchStatus(ctr::gpu::ReadInt64(st, kStatusWords, h, stream)));
    OP_REQUIRES_OK(ctx, StringStatusError(h, StringCounts{in.num_bytes, in.num_strings}, &spec, {}));
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
// their checks queued into st.
absl::Status GroupStrings(OpKernelContext* ctx, int n, int64_t* st, void* stream, DeviceStrings* in) {
  const Tensor& splits = ctx->input(n + 1);
  return PrepareDeviceStrings(ctx, ctx->input(n), splits, splits, false, st, stream, in);
}

// Queues one launch of ctr::gpu::MultiStringEmbedding over `features`, its
// token errors recorded in st.
template <typename T>
absl::Status LaunchFeatures(OpKernelContext* ctx, const std::vector<ctr::gpu::FeatureDesc>& features, int64_t batch,
                            const DeviceStrings& in, int64_t* st, void* stream) {
  const int64_t n = static_cast<int64_t>(features.size());
  Tensor d_features;
  TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DT_INT8,
                                        TensorShape({static_cast<int64_t>(n * sizeof(ctr::gpu::FeatureDesc))}),
                                        &d_features));
  return LaunchStatus(ctr::gpu::MultiStringEmbedding<typename CoreType<T>::type>(
      features.data(), reinterpret_cast<ctr::gpu::FeatureDesc*>(d_features.flat<int8_t>().data()), n, batch,
      in.bytes, in.string_splits, st + kTokenStatus, stream));
}

template <typename T>
class MultiStringEmbeddingGpuOp : public MultiStringKernelOn<tensorflow::AsyncOpKernel> {
 public:
  using MultiStringKernelOn::MultiStringKernelOn;

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const int n = num_features();
    void* stream = GpuStream(ctx);
    Tensor status;
    OP_REQUIRES_OK_ASYNC(ctx, DeviceScratch(ctx, kStatusWords, &status), done);
    int64_t* st = status.flat<int64_t>().data();
    DeviceStrings in;
    OP_REQUIRES_OK_ASYNC(ctx, GroupStrings(ctx, n, st, stream, &in), done);
    int64_t batch = 0;
    OP_REQUIRES_OK_ASYNC(ctx, GroupBatch(ctx->input(n + 1), &batch), done);
    std::vector<ctr::StringSpec> specs;
    std::vector<Tensor*> outs;
    OP_REQUIRES_OK_ASYNC(ctx, BindFeatures(ctx, batch, &specs, &outs), done);
    std::vector<ctr::gpu::FeatureDesc> features(n);
    std::vector<int64_t> first(n);
    for (int i = 0; i < n; ++i) {
      first[i] = i * batch;
      features[i] = ctr::gpu::FeatureDesc{specs[i], CorePtr<T>(ctx->input(i)), CorePtr<T>(outs[i]),
                                          first[i], batch, batch, specs[i].lookup.dim};
    }
    if (batch > 0) OP_REQUIRES_OK_ASYNC(ctx, LaunchFeatures<T>(ctx, features, batch, in, st, stream), done);
    FinishAsync(ctx, std::move(done), st, in, stream, std::move(specs), std::move(first));
  }
};

template <typename T>
class ConcatStringEmbeddingGpuOp : public ConcatStringKernelOn<tensorflow::AsyncOpKernel> {
 public:
  using ConcatStringKernelOn::ConcatStringKernelOn;

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const int n = num_features();
    void* stream = GpuStream(ctx);
    Tensor status;
    OP_REQUIRES_OK_ASYNC(ctx, DeviceScratch(ctx, kStatusWords, &status), done);
    int64_t* st = status.flat<int64_t>().data();
    DeviceStrings in;
    OP_REQUIRES_OK_ASYNC(ctx, GroupStrings(ctx, n, st, stream, &in), done);
    // A trimmed feature's rows are counted on the device (and read back): bad
    // splits must be reported before they turn into a row-count mismatch.
    bool any_trimmed = false;
    for (int f = 0; f < n; ++f) any_trimmed = any_trimmed || trimmed(f);
    if (any_trimmed) OP_REQUIRES_OK_ASYNC(ctx, CheckSplitsNow(st, in, stream), done);
    Plan plan;
    OP_REQUIRES_OK_ASYNC(ctx, MakePlan(ctx, in.num_bags, [&](int f, const Plan& p, int64_t* rows) {
      return FeatureRows(ctx, p.specs[f], f, in, p.first, stream, rows);
    }, &plan), done);
    std::vector<int64_t>& first = plan.first;
    const std::vector<ctr::StringSpec>& specs = plan.specs;
    const std::vector<int64_t>& columns = plan.columns;
    const int64_t common = plan.rows, width = plan.width();
    Tensor* out = plan.out;
    int64_t longest = 0;
    for (int f = 0; f < n; ++f) longest = std::max(longest, first[f + 1] - first[f]);
    for (int j = 0; j < num_dense(); ++j) {
      const Tensor& d = dense(ctx, j);
      OP_REQUIRES_OK_ASYNC(ctx,
                           LaunchStatus(ctr::gpu::CopyRows2D(d.flat<T>().data(), d.dim_size(1) * sizeof(T),
                                                             out->flat<T>().data() + columns[n + j], width * sizeof(T),
                                                             d.dim_size(1) * sizeof(T), common, stream)),
                           done);
    }
    // Every string is split, a trimmed feature's tail past `common` too (so a
    // bad token there is reported, as on the CPU), but only rows < common are
    // written.
    std::vector<ctr::gpu::FeatureDesc> features(n);
    for (int f = 0; f < n; ++f)
      features[f] = ctr::gpu::FeatureDesc{specs[f], CorePtr<T>(ctx->input(f)), CorePtr<T>(out) + columns[f],
                                          first[f], first[f + 1] - first[f], common, width};
    first.pop_back();
    if (longest > 0) OP_REQUIRES_OK_ASYNC(ctx, LaunchFeatures<T>(ctx, features, longest, in, st, stream), done);
    FinishAsync(ctx, std::move(done), st, in, stream, specs, std::move(first));
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
    TF_RETURN_IF_ERROR(DeviceScratch(ctx, count + 1, &counts));  // the last: CountThroughLastNonZero's
    const ctr::StringSpec tokens = TokenCountSpec(spec);
    TF_RETURN_IF_ERROR(LaunchStatus(ctr::gpu::StringGradRowCounts(tokens, in.bytes, in.string_splits + first[f],
                                                                  nullptr, count, counts.flat<int64_t>().data(),
                                                                  nullptr, stream)));
    return LaunchStatus(ctr::gpu::CountThroughLastNonZero(counts.flat<int64_t>().data(), count,
                                                          counts.flat<int64_t>().data() + count, rows, stream));
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

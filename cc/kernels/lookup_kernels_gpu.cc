// GPU kernels of CtrEmbeddingLookup and its gradient: validation of shapes
// and attributes is shared with the CPU kernels; the work is launched in
// cuda/lookup_kernels.cu.
//
// The forward kernel is asynchronous. Bad row ids, splits and ids are found on
// the device, where each check writes the lowest bad entry into a status
// word; the op queues the offsets and the pooling back to back (the offsets
// are kept inside the ids even when invalid, so the pooling never reads out
// of bounds), then one copy of the status words into pinned memory, and
// checks them in an EventMgr callback once the stream reaches it, raising the
// CPU kernel's InvalidArgument. A synchronous read would block the compute
// thread and drain the stream on every call, which serializes a served model
// of many features. Checking ids on the host first is no option: they live
// on the device. The one read left is the bag count of row ids given without
// num_rows (the output's shape needs it), as in TF's own segment kernels.
//
// A default_id that is not a table row pools an empty bag to zeros, as TF's
// GPU gather reads an index out of range (the CPU kernel raises, as TF's CPU
// gather does); finding empty bags on the host would need the ids there.
//
// The gradient needs the number of gradient rows to size its outputs, so it
// reads that back synchronously; training steps pay it once per table. It
// reads back its ids' check then too: called on its own, it fails on the ids
// the forward op rejects.
#ifdef CTR_WITH_CUDA

#include <limits>

#include "cc/core/lookup.h"
#include "cc/core/segments.h"
#include "cc/kernels/gpu_util.h"
#include "cc/kernels/lookup_common.h"
#include "cc/kernels/tf_types.h"
#include "cuda/device_util.h"
#include "cuda/lookup_launchers.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_ctr {

using tensorflow::DEVICE_GPU;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;

// The bag count: num_rows, the splits' length, or (row ids without num_rows)
// the last row id + 1, read back synchronously.
template <typename TSeg>
absl::Status BagCount(OpKernelContext* ctx, const LookupAttrs& a, const LookupInputs& in, void* stream,
                      int64_t* rows) {
  const int64_t n = in.segments->NumElements();
  if (a.segments_are_splits) {
    *rows = n - 1;
  } else if (in.num_rows_arg >= 0) {
    *rows = in.num_rows_arg;
  } else if (n == 0) {
    *rows = 0;
  } else {
    int64_t last = 0;
    Tensor scratch;
    TF_RETURN_IF_ERROR(DeviceScratch(ctx, 1, &scratch));
    TF_RETURN_IF_ERROR(LaunchStatus(ctr::gpu::ReadLastAsInt64(in.segments->flat<TSeg>().data(), n,
                                                             scratch.flat<int64_t>().data(), &last, stream)));
    if (last < 0 || last == std::numeric_limits<int64_t>::max())
      return tensorflow::errors::InvalidArgument("row id ", last, " of entry ", n - 1,
                                                 " is out of range [0, 2^63 - 1)");
    *rows = last + 1;
  }
  if (*rows == std::numeric_limits<int64_t>::max())
    return tensorflow::errors::InvalidArgument("num_rows must be < 2^63 - 1, got ", *rows);
  return absl::OkStatus();
}

// Queues CSR offsets [rows + 1] built from the row ids or splits, with their
// check recording {entry, value} of the first bad one in d_status[0..1].
template <typename TSeg>
absl::Status QueueOffsets(OpKernelContext* ctx, const LookupAttrs& a, const LookupInputs& in, int64_t rows,
                          void* stream, int64_t* d_status, Tensor* offsets) {
  TF_RETURN_IF_ERROR(DeviceScratch(ctx, rows + 1, offsets));
  const TSeg* seg = in.segments->flat<TSeg>().data();
  const int64_t n = in.segments->NumElements();
  int64_t* off = offsets->flat<int64_t>().data();
  TF_RETURN_IF_ERROR(LaunchStatus(ctr::gpu::InitStatus(d_status, stream)));
  return LaunchStatus(a.segments_are_splits ? ctr::gpu::SplitsToOffsets(seg, n, in.nnz(), off, d_status, stream)
                                            : ctr::gpu::RowIdsToOffsets(seg, n, rows, off, d_status, stream));
}

// The error an offsets status {entry, value} read back stands for, in the
// CPU kernel's words.
absl::Status OffsetsError(const LookupAttrs& a, const LookupInputs& in, int64_t rows, const int64_t* h) {
  if (h[0] < 0) return absl::OkStatus();
  return tensorflow::errors::InvalidArgument(
      a.segments_are_splits ? ctr::DescribeSplitError(h[0], h[1], in.segments->NumElements(), in.nnz())
                            : ctr::DescribeRowIdError(h[0], h[1], rows));
}

// Offsets for the gradient, checked at once (it reads back anyway).
template <typename TSeg>
absl::Status DeviceOffsets(OpKernelContext* ctx, const LookupAttrs& a, const LookupInputs& in, void* stream,
                           Tensor* offsets, int64_t* rows) {
  TF_RETURN_IF_ERROR(BagCount<TSeg>(ctx, a, in, stream, rows));
  Tensor status;
  TF_RETURN_IF_ERROR(DeviceScratch(ctx, 2, &status));
  int64_t* st = status.flat<int64_t>().data();
  TF_RETURN_IF_ERROR(QueueOffsets<TSeg>(ctx, a, in, *rows, stream, st, offsets));
  int64_t h[2];
  TF_RETURN_IF_ERROR(LaunchStatus(ctr::gpu::ReadInt64(st, 2, h, stream)));
  return OffsetsError(a, in, *rows, h);
}

template <typename T, typename TId, typename TSeg>
class EmbeddingLookupGpuOp : public LookupKernelOn<tensorflow::AsyncOpKernel> {
 public:
  using LookupKernelOn::LookupKernelOn;

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    LookupAttrs a;
    LookupInputs in;
    OP_REQUIRES_OK_ASYNC(ctx, BindInputs(ctx, 0, ctx->input(0), &a, &in), done);
    void* stream = GpuStream(ctx);
    int64_t rows = 0;
    OP_REQUIRES_OK_ASYNC(ctx, BagCount<TSeg>(ctx, a, in, stream, &rows), done);
    // Status words: the offsets' {entry, value}, then the ids' {row, id}.
    Tensor status, offsets, host_status;
    OP_REQUIRES_OK_ASYNC(ctx, DeviceScratch(ctx, 4, &status), done);
    OP_REQUIRES_OK_ASYNC(ctx, HostScratch(ctx, 4, &host_status), done);
    int64_t* st = status.flat<int64_t>().data();
    OP_REQUIRES_OK_ASYNC(ctx, QueueOffsets<TSeg>(ctx, a, in, rows, stream, st, &offsets), done);
    OP_REQUIRES_OK_ASYNC(ctx, LaunchStatus(ctr::gpu::InitStatus(st + 2, stream)), done);
    Tensor* out = nullptr;
    OP_REQUIRES_OK_ASYNC(ctx, AllocatePooled(ctx, 0, *in.params, rows, &out), done);
    if (rows > 0)  // with D = 0 too: the ids are checked as the CPU checks them
      OP_REQUIRES_OK_ASYNC(ctx,
                           LaunchStatus(ctr::gpu::EmbeddingLookup(
                               a.spec, CorePtr<T>(*in.params), in.ids->flat<TId>().data(),
                               in.weights ? in.weights->flat<float>().data() : nullptr,
                               offsets.flat<int64_t>().data(), rows, in.nnz(), CorePtr<T>(out), st + 2,
                               stream)),
                           done);
    OP_REQUIRES_OK_ASYNC(ctx,
                         LaunchStatus(ctr::gpu::CopyToHostAsync(st, host_status.flat<int64_t>().data(),
                                                                4 * sizeof(int64_t), stream)),
                         done);
    // Device scratch may be freed now: TF's GPU allocator orders reuse on
    // this stream. The pinned words must live until the callback reads them.
    const int64_t vocab = a.spec.vocab;
    ThenExecute(ctx, [ctx, done, host_status, a, in, rows, vocab]() {
      const int64_t* h = host_status.flat<int64_t>().data();
      OP_REQUIRES_OK_ASYNC(ctx, OffsetsError(a, in, rows, h), done);
      ctr::KeyError err;
      err.row = h[2];
      err.key = h[3];
      OP_REQUIRES_ASYNC(ctx, !err.found(), tensorflow::errors::InvalidArgument(ctr::DescribeKeyError(err, vocab)),
                        done);
      done();
    });
  }
};

template <typename T, typename TId, typename TSeg>
class EmbeddingLookupGradGpuOp : public LookupKernel {
 public:
  using LookupKernel::LookupKernel;

  void Compute(OpKernelContext* ctx) override {
    LookupAttrs a;
    LookupInputs in;
    OP_REQUIRES_OK(ctx, BindInputs(ctx, 1, ctx->input(1), &a, &in));
    void* stream = GpuStream(ctx);
    Tensor offsets;
    int64_t rows = 0;
    OP_REQUIRES_OK(ctx, DeviceOffsets<TSeg>(ctx, a, in, stream, &offsets, &rows));
    const Tensor& grad = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckPooledGradShape(grad, *in.params, rows));
    const TId* ids = in.ids->flat<TId>().data();
    const float* weights = in.weights ? in.weights->flat<float>().data() : nullptr;
    const int64_t* off = offsets.flat<int64_t>().data();

    Tensor counts, grad_offsets, scan_temp, status;
    OP_REQUIRES_OK(ctx, DeviceScratch(ctx, 2, &status));
    int64_t* st = status.flat<int64_t>().data();
    OP_REQUIRES_OK(ctx, LaunchStatus(ctr::gpu::InitStatus(st, stream)));
    OP_REQUIRES_OK(ctx, DeviceScratch(ctx, std::max<int64_t>(rows, 1), &counts));
    OP_REQUIRES_OK(ctx, DeviceScratch(ctx, rows + 1, &grad_offsets));
    const size_t temp_bytes = ctr::gpu::ExclusiveScanTempBytes(rows);
    OP_REQUIRES_OK(ctx, AllocateTemp(ctx, tensorflow::DT_INT8, {static_cast<int64_t>(temp_bytes) + 1}, &scan_temp));
    int64_t* goff = grad_offsets.flat<int64_t>().data();
    OP_REQUIRES_OK(ctx, LaunchStatus(ctr::gpu::GradRowCounts(a.spec, ids, weights, off, rows,
                                                             counts.flat<int64_t>().data(), st, stream)));
    OP_REQUIRES_OK(ctx, LaunchStatus(ctr::gpu::ExclusiveScan(counts.flat<int64_t>().data(), rows, goff,
                                                             scan_temp.flat<int8_t>().data(), temp_bytes, stream)));
    int64_t total = 0, h[2];
    OP_REQUIRES_OK(ctx, LaunchStatus(ctr::gpu::ReadInt64(goff + rows, 1, &total, stream)));
    OP_REQUIRES_OK(ctx, LaunchStatus(ctr::gpu::ReadInt64(st, 2, h, stream)));  // the stream is drained: cheap
    ctr::KeyError err;
    err.row = h[0];
    err.key = h[1];
    OP_REQUIRES(ctx, !err.found(), tensorflow::errors::InvalidArgument(ctr::DescribeKeyError(err, a.spec.vocab)));

    Tensor *values = nullptr, *indices = nullptr, *weights_grad = nullptr;
    OP_REQUIRES_OK(ctx, AllocatePooled(ctx, 0, *in.params, total, &values));
    OP_REQUIRES_OK(ctx, AllocateOutput(ctx, 1, {total}, &indices));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, ctx->input(5).shape(), &weights_grad));
    // One row per id: the Python gradient merges them (tf.unique + unsorted_segment_sum on the device).
    Tensor* merged = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, {}, &merged));
    merged->scalar<bool>()() = false;
    OP_REQUIRES_OK(ctx, LaunchStatus(ctr::gpu::ZeroFill(weights_grad->flat<float>().data(),
                                                        weights_grad->NumElements() * sizeof(float), stream)));
    if (rows == 0) return;
    OP_REQUIRES_OK(ctx, LaunchStatus(ctr::gpu::LookupGrad(
                            a.spec, CorePtr<T>(*in.params), ids, weights, off, CorePtr<T>(grad), goff, rows,
                            CorePtr<T>(values), indices->flat<int64_t>().data(),
                            weights ? weights_grad->flat<float>().data() : nullptr, stream)));
  }
};

#define REGISTER_LOOKUP_GPU(T, TId, TSeg)                                                              \
  REGISTER_KERNEL_BUILDER(Name("CtrEmbeddingLookup")                                                   \
                              .Device(DEVICE_GPU)                                                      \
                              .HostMemory("num_rows")                                                  \
                              .TypeConstraint<T>("T")                                                  \
                              .TypeConstraint<TId>("Tid")                                              \
                              .TypeConstraint<TSeg>("Tseg"),                                           \
                          EmbeddingLookupGpuOp<T, TId, TSeg>);                                         \
  REGISTER_KERNEL_BUILDER(Name("CtrEmbeddingLookupGrad")                                               \
                              .Device(DEVICE_GPU)                                                      \
                              .HostMemory("num_rows")                                                  \
                              .HostMemory("merged")                                                    \
                              .TypeConstraint<T>("T")                                                  \
                              .TypeConstraint<TId>("Tid")                                              \
                              .TypeConstraint<TSeg>("Tseg"),                                           \
                          EmbeddingLookupGradGpuOp<T, TId, TSeg>);
#define REGISTER_LOOKUP_GPU_IDS(T)         \
  REGISTER_LOOKUP_GPU(T, int32_t, int32_t) \
  REGISTER_LOOKUP_GPU(T, int32_t, int64_t) \
  REGISTER_LOOKUP_GPU(T, int64_t, int32_t) \
  REGISTER_LOOKUP_GPU(T, int64_t, int64_t)
REGISTER_LOOKUP_GPU_IDS(float)
REGISTER_LOOKUP_GPU_IDS(Eigen::half)
REGISTER_LOOKUP_GPU_IDS(Eigen::bfloat16)
#undef REGISTER_LOOKUP_GPU_IDS
#undef REGISTER_LOOKUP_GPU

}  // namespace tf_ctr

#endif  // CTR_WITH_CUDA

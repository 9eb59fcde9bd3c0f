// CPU kernels of the string ops: packing, and one pass per bag over the packed
// bytes on TF's intra-op pool (cc/core/strings.h does the per-token work).
#include <algorithm>
#include <cstring>
#include <vector>

#include "cc/core/lowest_row_error.h"
#include "cc/core/segments.h"
#include "cc/core/strings.h"
#include "cc/core/strings_cpu.h"
#include "cc/kernels/string_common.h"
#include "cc/kernels/string_cpu.h"
#include "cc/kernels/string_runs.h"
#include "cc/kernels/tf_types.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_ctr {

using tensorflow::DEVICE_CPU;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::tstring;

class PackStringsOp : public OpKernel {
 public:
  explicit PackStringsOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("equal_sizes", &equal_sizes_));
    OP_REQUIRES_OK(c, c->GetAttr("columns", &columns_));
  }

  void Compute(OpKernelContext* ctx) override {
    tensorflow::OpInputList inputs;
    OP_REQUIRES_OK(ctx, ctx->input_list("strings", &inputs));
    std::vector<StringRun> runs;
    OP_REQUIRES_OK(ctx, columns_.empty() ? InputStringRuns(inputs, equal_sizes_, "pack_strings", &runs)
                                          : ColumnStringRuns(inputs, columns_, "pack_strings", &runs));
    int64_t n = 0;
    for (const StringRun& run : runs) n += run.count;
    Tensor* splits = nullptr;
    OP_REQUIRES_OK(ctx, AllocateOutput(ctx, 1, {n + 1}, &splits));
    int64_t* s = splits->flat<int64_t>().data();
    // first[i]: the packing index of run i's first string.
    std::vector<int64_t> first(runs.size() + 1, 0);
    s[0] = 0;
    for (size_t i = 0; i < runs.size(); ++i) {
      const StringRun& run = runs[i];
      int64_t* out = s + first[i];
      for (int64_t j = 0; j < run.count; ++j) out[j + 1] = out[j] + static_cast<int64_t>(run[j].size());
      first[i + 1] = first[i] + run.count;
    }
    Tensor* input_splits = nullptr;
    OP_REQUIRES_OK(ctx, AllocateOutput(ctx, 2, {static_cast<int64_t>(first.size())}, &input_splits));
    std::copy(first.begin(), first.end(), input_splits->flat<int64_t>().data());
    Tensor* bytes = nullptr;
    OP_REQUIRES_OK(ctx, AllocateOutput(ctx, 0, {s[n]}, &bytes));
    uint8_t* dst = bytes->flat<uint8_t>().data();
    // Each shard walks the runs from the one holding its first string: no
    // per-string table of pointers to build first.
    auto copy = [&](int64_t begin, int64_t end) {
      size_t i = static_cast<size_t>(std::upper_bound(first.begin(), first.end(), begin) - first.begin()) - 1;
      for (int64_t k = begin; k < end; ++i) {
        const int64_t stop = std::min(end, first[i + 1]);
        for (; k < stop; ++k) CopyString(runs[i][k - first[i]], dst + s[k]);
      }
    };
    // Packs of up to about 2 MB (tstring headers read plus bytes written) are
    // copied on the caller's thread: splitting 26 x 1024 Criteo-like strings
    // over two pool threads took 201 us against 106 us on one, as waking and
    // joining the pool costs more than the copy saves. Large packs are split.
    constexpr int64_t kInlineCopyBytes = 2 << 20, kStringBytes = 32;
    const int64_t work = s[n] + kStringBytes * n;
    if (work <= kInlineCopyBytes) {
      copy(0, n);
    } else {
      ParallelFor(ctx, n, 8 + s[n] / n, copy);
    }
  }

 private:
  bool equal_sizes_ = false;
  std::vector<int64_t> columns_;
};

REGISTER_KERNEL_BUILDER(Name("CtrPackStrings").Device(DEVICE_CPU), PackStringsOp);
#ifdef CTR_WITH_CUDA
// Packing is host work by nature: on a GPU device it runs on host memory, and
// TF's one copy of the packed buffer feeds the GPU string kernels.
REGISTER_KERNEL_BUILDER(Name("CtrPackStrings")
                            .Device(tensorflow::DEVICE_GPU)
                            .HostMemory("strings")
                            .HostMemory("bytes")
                            .HostMemory("row_splits")
                            .HostMemory("input_splits"),
                        PackStringsOp);
#endif

using FirstTokenError = ctr::LowestRowError<ctr::TokenError>;

absl::Status TokenErrorStatus(const FirstTokenError& first, const uint8_t* bytes, int64_t vocab,
                              const std::string& prefix = "") {
  if (!first.found()) return absl::OkStatus();
  return tensorflow::errors::InvalidArgument(prefix, ctr::DescribeTokenError(first.error(), bytes, vocab));
}

// The validated inputs of one string embedding: bytes, string and bag splits.
struct StringInputs {
  const uint8_t* bytes = nullptr;
  int64_t num_bytes = 0;
  const int64_t* string_splits = nullptr;
  const int64_t* bag_splits = nullptr;  // null: one bag per string
  int64_t num_bags = 0;
};

inline absl::Status ValidateStringInputs(const Tensor& bytes, const Tensor& splits,
                                         const Tensor& bag_splits, bool bagged, StringInputs* in) {
  TF_RETURN_IF_ERROR(CheckVector(bytes, "bytes"));
  TF_RETURN_IF_ERROR(CheckVector(splits, "row_splits"));
  TF_RETURN_IF_ERROR(CheckVector(bag_splits, "bag_splits"));
  in->bytes = bytes.flat<uint8_t>().data();
  in->num_bytes = bytes.NumElements();
  in->string_splits = splits.flat<int64_t>().data();
  const int64_t num_strings = splits.NumElements() - 1;
  TF_RETURN_IF_ERROR(CoreStatus(
      ctr::ValidateStringSplits(in->string_splits, splits.NumElements(), bytes.NumElements())));
  if (!bagged) {
    in->num_bags = num_strings;
    return absl::OkStatus();
  }
  const int64_t* b = bag_splits.flat<int64_t>().data();
  TF_RETURN_IF_ERROR(CoreStatus(ctr::ValidateRowSplits(b, bag_splits.NumElements(), num_strings, "bag_splits", "strings")));
  in->bag_splits = b;
  in->num_bags = bag_splits.NumElements() - 1;
  return absl::OkStatus();
}

template <typename T>
class StringEmbeddingCpuOp : public StringKernel {
 public:
  using StringKernel::StringKernel;

  void Compute(OpKernelContext* ctx) override {
    ctr::StringSpec spec;
    StringInputs in;
    OP_REQUIRES_OK(ctx, BindSpec(ctx->input(0), &spec));
    OP_REQUIRES_OK(ctx, ValidateStringInputs(ctx->input(1), ctx->input(2), ctx->input(3), bagged(), &in));
    AdviseHugePages(ctx, ctx->input(0));
    const bool trim = trim_empty_tail();
    Tensor pooled;
    Tensor* dst = nullptr;
    OP_REQUIRES_OK(ctx, AllocatePooled(ctx, tensorflow::DataTypeToEnum<T>::value, in.num_bags, spec.lookup.dim,
                                       trim, &pooled, &dst));
    const auto* params = CorePtr<T>(ctx->input(0));
    std::vector<uint8_t> nonempty(trim ? in.num_bags : 0);
    FirstTokenError first;
    ParallelFor(ctx, in.num_bags, StringBagCost(spec, ctx->input(1).NumElements(), in.num_bags),
                [&](int64_t begin, int64_t end) {
                  std::vector<float> acc(spec.lookup.dim);
                  ctr::TokenError err;
                  ctr::PoolStringBagsCpu(spec, params, in.bytes, in.num_bytes, in.string_splits, in.bag_splits,
                                         begin, end, acc.data(), CorePtr<T>(dst), &err,
                                         trim ? nonempty.data() : nullptr);
                  first.Offer(err);
                });
    OP_REQUIRES_OK(ctx, TokenErrorStatus(first, in.bytes, spec.lookup.vocab));
    if (!trim) return;
    int64_t rows = in.num_bags;
    while (rows > 0 && !nonempty[rows - 1]) --rows;
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, AllocateOutput(ctx, 0, {rows, spec.lookup.dim}, &out));
    if (rows > 0) std::memcpy(out->flat<T>().data(), pooled.flat<T>().data(), rows * spec.lookup.dim * sizeof(T));
  }
};

template <typename T>
class StringEmbeddingGradCpuOp : public StringKernel {
 public:
  using StringKernel::StringKernel;

  void Compute(OpKernelContext* ctx) override {
    ctr::StringSpec spec;
    StringInputs in;
    OP_REQUIRES_OK(ctx, BindSpec(ctx->input(1), &spec));
    OP_REQUIRES_OK(ctx, ValidateStringInputs(ctx->input(2), ctx->input(3), ctx->input(4), bagged(), &in));
    const Tensor& grad = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckGradShape(grad, in.num_bags, spec.lookup.dim));
    const ctr::TokenBagVisitor visit{spec, in.bytes, in.num_bytes, in.string_splits, in.bag_splits, nullptr};
    std::vector<int64_t> grad_offsets(in.num_bags + 1, 0);
    const int64_t cost = StringBagCost(spec, ctx->input(2).NumElements(), in.num_bags);
    // Counted with a visitor that stops at a bad token, so that strings the
    // forward op would reject fail here as they fail there.
    FirstTokenError first;
    ParallelFor(ctx, in.num_bags, cost, [&](int64_t begin, int64_t end) {
      ctr::TokenError err;
      const ctr::TokenBagVisitor checked{spec, in.bytes, in.num_bytes, in.string_splits, in.bag_splits, &err};
      for (int64_t r = begin; r < end && !err.found(); ++r)
        grad_offsets[r + 1] = ctr::CountBagGradRows(spec.lookup, checked, r);
      first.Offer(err);
    });
    OP_REQUIRES_OK(ctx, TokenErrorStatus(first, in.bytes, spec.lookup.vocab));
    for (int64_t r = 0; r < in.num_bags; ++r) grad_offsets[r + 1] += grad_offsets[r];
    const int64_t total = grad_offsets[in.num_bags];
    Tensor *values = nullptr, *indices = nullptr;
    if (ctr::GradIsPooledGrad(spec.lookup, false, grad_offsets.data(), in.num_bags)) {
      ctx->set_output(0, grad);  // [num_bags, dim]: one row per bag, as the lookup's
      OP_REQUIRES_OK(ctx, AllocateOutput(ctx, 1, {total}, &indices));
      ctr::OneRowBagIndices(spec.lookup, visit, in.num_bags, indices->flat<int64_t>().data());
      return;
    }
    OP_REQUIRES_OK(ctx, AllocateOutput(ctx, 0, {total, spec.lookup.dim}, &values));
    OP_REQUIRES_OK(ctx, AllocateOutput(ctx, 1, {total}, &indices));
    ParallelFor(ctx, in.num_bags, 2 * cost, [&](int64_t begin, int64_t end) {
      std::vector<float> scratch(3 * spec.lookup.dim);
      ctr::BagGradCpu(spec.lookup, CorePtr<T>(ctx->input(1)), visit, CorePtr<T>(grad), grad_offsets.data(),
                      begin, end, scratch.data(), CorePtr<T>(values), indices->flat<int64_t>().data(),
                      nullptr);
    });
  }
};

// The packed bytes and string splits of a grouped op (inputs n and n + 1),
// validated.
absl::Status PackedStrings(OpKernelContext* ctx, int n, const Tensor** bytes, const Tensor** splits) {
  *bytes = &ctx->input(n);
  *splits = &ctx->input(n + 1);
  TF_RETURN_IF_ERROR(CheckVector(**bytes, "bytes"));
  TF_RETURN_IF_ERROR(CheckVector(**splits, "row_splits"));
  return CoreStatus(ctr::ValidateStringSplits((*splits)->flat<int64_t>().data(), (*splits)->NumElements(),
                                              (*bytes)->NumElements()));
}

template <typename T>
class MultiStringEmbeddingCpuOp : public MultiStringKernel {
 public:
  using MultiStringKernel::MultiStringKernel;

  void Compute(OpKernelContext* ctx) override {
    const int n = num_features();
    const Tensor *packed, *string_splits;
    OP_REQUIRES_OK(ctx, PackedStrings(ctx, n, &packed, &string_splits));
    const Tensor& bytes = *packed;
    int64_t batch = 0;
    OP_REQUIRES_OK(ctx, GroupBatch(*string_splits, &batch));
    const int64_t num_strings = n * batch;
    const int64_t* s = string_splits->flat<int64_t>().data();
    std::vector<ctr::StringSpec> specs;
    std::vector<Tensor*> outs;
    OP_REQUIRES_OK(ctx, BindFeatures(ctx, batch, &specs, &outs));
    const uint8_t* b = bytes.flat<uint8_t>().data();
    int64_t max_dim = 0;
    for (const auto& sp : specs) max_dim = std::max(max_dim, sp.lookup.dim);
    std::vector<FirstTokenError> first(n);
    // One pass over all N * B rows: the CPU form of the grouped launch.
    auto pool_rows = [&](int64_t begin, int64_t end) {
      std::vector<float> acc(max_dim);
      while (begin < end) {
        const int f = static_cast<int>(begin / batch);
        const int64_t stop = std::min(end, (f + 1) * batch);
        ctr::TokenError err;
        ctr::PoolStringBagsCpu(specs[f], CorePtr<T>(ctx->input(f)), b, bytes.NumElements(), s + f * batch, nullptr,
                               begin - f * batch, stop - f * batch, acc.data(), CorePtr<T>(outs[f]), &err);
        first[f].Offer(err);
        begin = stop;
      }
    };
    ParallelForBytes(ctx, s, num_strings, StringBagCost(specs[0], bytes.NumElements(), num_strings), pool_rows);
    for (int f = 0; f < n; ++f)
      OP_REQUIRES_OK(ctx, TokenErrorStatus(first[f], b, specs[f].lookup.vocab, "feature " + std::to_string(f) + ": "));
  }
};

template <typename T>
class ConcatStringEmbeddingCpuOp : public ConcatStringKernel {
 public:
  using ConcatStringKernel::ConcatStringKernel;

  void Compute(OpKernelContext* ctx) override {
    const int n = num_features();
    const Tensor *packed, *string_splits;
    OP_REQUIRES_OK(ctx, PackedStrings(ctx, n, &packed, &string_splits));
    const Tensor& bytes = *packed;
    const int64_t* s = string_splits->flat<int64_t>().data();
    const int64_t num_strings = string_splits->NumElements() - 1;
    const uint8_t* b = bytes.flat<uint8_t>().data();
    Plan plan;
    OP_REQUIRES_OK(ctx, MakePlan(ctx, num_strings, [&](int f, const Plan& p, int64_t* rows) {
      *rows = FeatureRows(p.specs[f], f, b, bytes.NumElements(), s + p.first[f], p.first[f + 1] - p.first[f]);
      return absl::OkStatus();
    }, &plan));
    const std::vector<int64_t>& first = plan.first;
    const std::vector<ctr::StringSpec>& specs = plan.specs;
    const std::vector<int64_t>& columns = plan.columns;
    const int64_t common = plan.rows, width = plan.width();
    Tensor* out = plan.out;
    CopyDenseColumns<T>(DenseInputs(ctx), plan.columns.data() + num_features(), plan.rows, plan.out);
    auto* dst = CorePtr<T>(out);
    int64_t max_dim = 0;
    for (const auto& sp : specs) max_dim = std::max(max_dim, sp.lookup.dim);
    std::vector<FirstTokenError> errors(n);
    // Shards of the packed strings, cut at equal bytes; each pools the part
    // of every feature it overlaps into that feature's columns. A trimmed
    // feature's strings past `common` hold no table row: they are only
    // checked for bad tokens, as the single op checks every bag.
    auto pool = [&](int64_t begin, int64_t end) {
      std::vector<float> acc(max_dim);
      int f = static_cast<int>(std::upper_bound(first.begin(), first.end(), begin) - first.begin()) - 1;
      for (; f < n && begin < end; ++f) {
        const int64_t stop = std::min(end, first[f + 1]);
        const int64_t lo = begin - first[f], hi = std::min(stop - first[f], common);
        if (lo < hi) {
          ctr::TokenError err;
          ctr::PoolStringBagsCpu(specs[f], CorePtr<T>(ctx->input(f)), b, bytes.NumElements(), s + first[f], nullptr,
                                 lo, hi, acc.data(), dst + columns[f], &err, nullptr, width);
          errors[f].Offer(err);
        }
        begin = stop;
      }
    };
    ParallelForBytes(ctx, s, num_strings, StringBagCost(specs[0], bytes.NumElements(), num_strings), pool);
    for (int f = 0; f < n; ++f) {
      if (first[f + 1] - first[f] > common) {
        ctr::TokenError err;
        const ctr::TokenBagVisitor visit{specs[f], b, bytes.NumElements(), s + first[f], nullptr, &err};
        ctr::CheckBagTokens(visit, common, first[f + 1] - first[f]);
        errors[f].Offer(err);
      }
      OP_REQUIRES_OK(ctx, TokenErrorStatus(errors[f], b, specs[f].lookup.vocab, "feature " + std::to_string(f) + ": "));
    }
  }

 private:
  // Feature f's output rows: its strings, or, trimmed, the bags through its
  // last one with a table row.
  int64_t FeatureRows(const ctr::StringSpec& spec, int f, const uint8_t* bytes, int64_t num_bytes,
                      const int64_t* splits, int64_t count) const {
    if (!trimmed(f)) return count;
    const ctr::TokenBagVisitor visit{spec, bytes, num_bytes, splits, nullptr, nullptr};
    return ctr::RowsThroughLastToken(visit, count);
  }
};

#define REGISTER_STRING_CPU(T)                                                                          \
  REGISTER_KERNEL_BUILDER(Name("CtrStringEmbedding").Device(DEVICE_CPU).TypeConstraint<T>("T"),         \
                          StringEmbeddingCpuOp<T>);                                                     \
  REGISTER_KERNEL_BUILDER(Name("CtrStringEmbeddingGrad").Device(DEVICE_CPU).TypeConstraint<T>("T"),     \
                          StringEmbeddingGradCpuOp<T>);                                                 \
  REGISTER_KERNEL_BUILDER(Name("CtrMultiStringEmbedding").Device(DEVICE_CPU).TypeConstraint<T>("T"),    \
                          MultiStringEmbeddingCpuOp<T>);                                                \
  REGISTER_KERNEL_BUILDER(Name("CtrConcatStringEmbedding").Device(DEVICE_CPU).TypeConstraint<T>("T"),   \
                          ConcatStringEmbeddingCpuOp<T>);
REGISTER_STRING_CPU(float)
REGISTER_STRING_CPU(Eigen::half)
REGISTER_STRING_CPU(Eigen::bfloat16)
#undef REGISTER_STRING_CPU

}  // namespace tf_ctr

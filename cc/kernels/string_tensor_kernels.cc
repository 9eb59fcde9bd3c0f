// CtrConcatStringTensorEmbedding's CPU kernel: CtrConcatStringEmbedding on the
// string tensors themselves. Whole-string keys are resolved where they are;
// each shard copies the id lists it pools into a buffer of its own, which
// stays in its core's cache, in place of one packed copy of every string made
// on one thread before the pooling starts. Per-token work is the core's
// (cc/core/strings.h), unchanged, so outputs and errors are the packed op's.
#include <algorithm>
#include <string>
#include <vector>

#include "cc/core/lowest_row_error.h"
#include "cc/core/strings.h"
#include "cc/core/strings_cpu.h"
#include "cc/kernels/string_common.h"
#include "cc/kernels/string_cpu.h"
#include "cc/kernels/string_runs.h"
#include "cc/kernels/tf_types.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_ctr {
namespace {

using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;

constexpr char kOpName[] = "CtrConcatStringTensorEmbedding";

// Strings [lo, hi) of a run packed into a buffer of the caller's own, with a
// chunk of slack past the last string so the core's word and chunk reads
// stay inside it.
class LocalPack {
 public:
  void Fill(const StringRun& run, int64_t lo, int64_t hi) {
    splits_.resize(hi - lo + 1);
    splits_[0] = 0;
    for (int64_t r = lo; r < hi; ++r) splits_[r - lo + 1] = splits_[r - lo] + run.size(r);
    bytes_.resize(splits_.back() + ctr::kSplitChunk);
    for (int64_t r = lo; r < hi; ++r) CopyString(run[r], bytes_.data() + splits_[r - lo]);
  }
  const uint8_t* bytes() const { return bytes_.data(); }
  int64_t readable() const { return static_cast<int64_t>(bytes_.size()); }
  const int64_t* splits() const { return splits_.data(); }
  ctr::TokenBagVisitor Visitor(const ctr::StringSpec& spec, ctr::TokenError* err) const {
    return ctr::TokenBagVisitor{spec, bytes(), readable(), splits(), nullptr, err};
  }

 private:
  std::vector<uint8_t> bytes_;
  std::vector<int64_t> splits_;
};

// The rejected token of the lowest row, described while its bytes are at
// hand (a shard's buffer does not outlive the shard).
class FirstBadToken {
 public:
  void Offer(const ctr::TokenError& e, int64_t row_base, const uint8_t* bytes, int64_t vocab) {
    if (!e.found()) return;
    ctr::TokenError at = e;
    at.row += row_base;
    first_.Offer(ctr::DescribedError{at.row, ctr::DescribeTokenError(at, bytes, vocab)});
  }
  absl::Status ToStatus(int feature) const {
    if (!first_.found()) return absl::OkStatus();
    return tensorflow::errors::InvalidArgument("feature ", feature, ": ", first_.error().message);
  }

 private:
  ctr::LowestRowError<ctr::DescribedError> first_;
};

// A feature's ParallelFor weight per row: the mean bytes of its first strings
// plus the row's fixed share, so that shards need no pass over every string.
int64_t RowWeight(const StringRun& run) {
  constexpr int64_t kSample = 32;
  const int64_t n = std::min(run.count, kSample);
  int64_t bytes = 0;
  for (int64_t r = 0; r < n; ++r) bytes += run.size(r);
  return (n > 0 ? bytes / n : 0) + kStringRowWeight;
}

template <typename T>
class ConcatStringTensorEmbeddingCpuOp : public ConcatStringKernel {
 public:
  explicit ConcatStringTensorEmbeddingCpuOp(OpKernelConstruction* c) : ConcatStringKernel(c, StringInputs(c)) {
    OP_REQUIRES_OK(c, c->GetAttr("columns", &columns_));
    const int k = StringInputs(c);
    OP_REQUIRES(c, columns_.empty() ? k == num_features() : k == 1 && static_cast<int>(columns_.size()) == num_features(),
                tensorflow::errors::InvalidArgument(kOpName, " takes N = ", num_features(),
                                                    " string tensors, or one matrix and N columns; got K = ", k,
                                                    " and ", columns_.size(), " columns"));
  }

  void Compute(OpKernelContext* ctx) override {
    const int n = num_features();
    tensorflow::OpInputList inputs;
    OP_REQUIRES_OK(ctx, ctx->input_list("strings", &inputs));
    std::vector<StringRun> runs;
    OP_REQUIRES_OK(ctx, columns_.empty() ? InputStringRuns(inputs, false, kOpName, &runs)
                                         : ColumnStringRuns(inputs, columns_, kOpName, &runs));
    Plan plan;
    plan.first.assign(n + 1, 0);
    for (int f = 0; f < n; ++f) plan.first[f + 1] = plan.first[f] + runs[f].count;
    OP_REQUIRES_OK(ctx, PlanFeatures(ctx, [&](int f, const Plan& p, int64_t* rows) {
      *rows = trimmed(f) ? RowsThroughLastToken(p.specs[f], runs[f]) : runs[f].count;
      return absl::OkStatus();
    }, &plan));
    CopyDenseColumns<T>(DenseInputs(ctx), plan.columns.data() + num_features(), plan.rows, plan.out);
    std::vector<FirstBadToken> errors(n);
    Pool(ctx, runs, plan, &errors);
    for (int f = 0; f < n; ++f) {
      if (runs[f].count > plan.rows) CheckTrimmedTail(plan.specs[f], runs[f], plan.rows, &errors[f]);
      OP_REQUIRES_OK(ctx, errors[f].ToStatus(f));
    }
  }

 private:
  static int StringInputs(OpKernelConstruction* c) {
    int k = 0;
    return c->GetAttr("K", &k).ok() ? k : 0;
  }

  // Shards of about equal weight over all features' rows; each pools the
  // part of every feature it overlaps into that feature's columns.
  void Pool(OpKernelContext* ctx, const std::vector<StringRun>& runs, const Plan& plan,
            std::vector<FirstBadToken>* errors) const {
    const int n = num_features();
    const std::vector<int64_t>& first = plan.first;
    std::vector<int64_t> weight(n), prefix(n + 1, 0);  // per row; of all rows before feature f
    for (int f = 0; f < n; ++f) {
      weight[f] = RowWeight(runs[f]);
      prefix[f + 1] = prefix[f] + weight[f] * runs[f].count;
    }
    auto row_prefix = [&](int64_t r) {
      const int f = FeatureOf(first, r);
      return f >= n ? prefix[n] : prefix[f] + (r - first[f]) * weight[f];
    };
    int64_t max_dim = 0;
    for (const auto& sp : plan.specs) max_dim = std::max(max_dim, sp.lookup.dim);
    auto* dst = CorePtr<T>(plan.out);
    const int64_t width = plan.width();
    auto pool = [&](int64_t begin, int64_t end) {
      std::vector<float> acc(max_dim);
      LocalPack local;
      for (int f = FeatureOf(first, begin); f < n && begin < end; ++f) {
        const int64_t stop = std::min(end, first[f + 1]);
        const int64_t lo = begin - first[f], hi = std::min(stop - first[f], plan.rows);
        if (lo < hi) PoolFeatureRows(ctx, plan.specs[f], f, runs[f], lo, hi, dst + plan.columns[f], width,
                                     acc.data(), &local, &(*errors)[f]);
        begin = stop;
      }
    };
    const int64_t cost = StringBagCost(plan.specs[0], prefix[n], first[n]);
    ParallelForWeighted(ctx, first[n], cost, row_prefix, pool);
  }

  // The feature a row of all features' rows belongs to (n past the last).
  static int FeatureOf(const std::vector<int64_t>& first, int64_t r) {
    return static_cast<int>(std::upper_bound(first.begin(), first.end() - 1, r) - first.begin()) - 1;
  }

  // Rows [lo, hi) of feature f into its columns (out: its first column).
  void PoolFeatureRows(OpKernelContext* ctx, const ctr::StringSpec& spec, int f, const StringRun& run, int64_t lo,
                       int64_t hi, typename CoreType<T>::type* out, int64_t width, float* acc, LocalPack* local, FirstBadToken* error) const {
    const auto* params = CorePtr<T>(ctx->input(f));
    ctr::TokenError err;
    if (ctr::IsWholeStringLookup(spec, nullptr)) {
      ctr::CopyWholeStringRowsCpu(spec, params, run, lo, hi, out, &err, nullptr, width);
      if (err.found()) error->Offer(err, 0, run.data(err.row), spec.lookup.vocab);
      return;
    }
    local->Fill(run, lo, hi);
    ctr::PoolStringBagsCpu(spec, params, local->bytes(), local->readable(), local->splits(), nullptr, 0, hi - lo,
                           acc, out + lo * width, &err, nullptr, width);
    error->Offer(err, lo, local->bytes(), spec.lookup.vocab);
  }

  // trim_empty_tail's row count, as the packed op finds it: bags through the
  // last one with a table row, scanning back one string at a time.
  static int64_t RowsThroughLastToken(const ctr::StringSpec& spec, const StringRun& run) {
    LocalPack one;
    for (int64_t r = run.count - 1; r >= 0; --r) {
      one.Fill(run, r, r + 1);
      bool any = false;
      one.Visitor(spec, nullptr)(0, [&](int64_t, float, int64_t) { any = true; });
      if (any) return r + 1;
    }
    return 0;
  }

  // A trimmed feature's strings past the output hold no row; they are only
  // checked for bad tokens, as the single op checks every bag.
  static void CheckTrimmedTail(const ctr::StringSpec& spec, const StringRun& run, int64_t rows,
                               FirstBadToken* error) {
    LocalPack tail;
    tail.Fill(run, rows, run.count);
    ctr::TokenError err;
    ctr::CheckBagTokens(tail.Visitor(spec, &err), 0, run.count - rows);
    error->Offer(err, rows, tail.bytes(), spec.lookup.vocab);
  }

  std::vector<int64_t> columns_;
};

}  // namespace

#define REGISTER_STRING_TENSOR_CPU(T)                                                                        \
  REGISTER_KERNEL_BUILDER(                                                                                     \
      Name("CtrConcatStringTensorEmbedding").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"),            \
      ConcatStringTensorEmbeddingCpuOp<T>);
REGISTER_STRING_TENSOR_CPU(float)
REGISTER_STRING_TENSOR_CPU(Eigen::half)
REGISTER_STRING_TENSOR_CPU(Eigen::bfloat16)
#undef REGISTER_STRING_TENSOR_CPU

}  // namespace tf_ctr

// Attribute parsing and shape validation shared by the CPU and GPU string
// embedding kernels (shapes and attributes only, never tensor contents).
#pragma once

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "cc/core/segments.h"
#include "cc/core/strings.h"
#include "cc/kernels/block_layout.h"  // AddBlockWidth
#include "cc/kernels/huge_pages.h"
#include "cc/kernels/lookup_common.h"
#include "cc/kernels/tf_types.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_ctr {

// One feature's spec from attribute values (vocab and dim are set per call).
inline absl::Status MakeStringSpec(const std::string& combiner, const std::string& mode,
                                   const std::string& delimiter, bool skip_empty, float max_norm,
                                   ctr::StringSpec* s) {
  TF_RETURN_IF_ERROR(CoreStatus(ctr::ParseCombiner(combiner, &s->lookup.combiner)));
  TF_RETURN_IF_ERROR(CoreStatus(ctr::CheckMaxNorm(max_norm)));
  s->lookup.max_norm = max_norm;
  TF_RETURN_IF_ERROR(CoreStatus(ctr::ParseTokenMode(mode, &s->mode)));
  s->skip_empty = skip_empty;
  return CoreStatus(ctr::SetDelimiter(s, delimiter));
}

inline absl::Status ReadStringAttrs(tensorflow::OpKernelConstruction* c, ctr::StringSpec* s,
                                    bool* bagged, bool* trim_empty_tail) {
  std::string combiner, mode, delimiter;
  bool skip_empty;
  float max_norm;
  TF_RETURN_IF_ERROR(c->GetAttr("num_buckets", &s->buckets));
  TF_RETURN_IF_ERROR(c->GetAttr("trim_empty_tail", trim_empty_tail));
  if (s->buckets < 0) return tensorflow::errors::InvalidArgument("num_buckets must be >= 0, got ", s->buckets);
  TF_RETURN_IF_ERROR(c->GetAttr("combiner", &combiner));
  TF_RETURN_IF_ERROR(c->GetAttr("id_mode", &mode));
  TF_RETURN_IF_ERROR(c->GetAttr("delimiter", &delimiter));
  TF_RETURN_IF_ERROR(c->GetAttr("skip_empty", &skip_empty));
  TF_RETURN_IF_ERROR(c->GetAttr("max_norm", &max_norm));
  TF_RETURN_IF_ERROR(c->GetAttr("bagged", bagged));
  std::string invalid_ids;
  TF_RETURN_IF_ERROR(c->GetAttr("invalid_ids", &invalid_ids));
  s->skip_negative = invalid_ids == "skip_negative";
  TF_RETURN_IF_ERROR(c->GetAttr("default_id", &s->lookup.default_id));
  if (c->HasAttr("empty_grad_row")) TF_RETURN_IF_ERROR(c->GetAttr("empty_grad_row", &s->lookup.empty_grad_row));
  std::vector<int64_t> hash_key;
  if (c->HasAttr("hash_key")) TF_RETURN_IF_ERROR(c->GetAttr("hash_key", &hash_key));
  TF_RETURN_IF_ERROR(CoreStatus(ctr::SetHashKey(hash_key, &s->lookup.hash)));
  if (s->lookup.default_id < -1)
    return tensorflow::errors::InvalidArgument("default_id must be >= -1, got ", s->lookup.default_id);
  return MakeStringSpec(combiner, mode, delimiter, skip_empty, max_norm, s);
}

// The grouped ops' keyed hashes: keyed_features (increasing feature indices)
// and hash_keys, two integers per keyed feature.
inline absl::Status ReadHashKeys(tensorflow::OpKernelConstruction* c, std::vector<ctr::StringSpec>* specs) {
  std::vector<int64_t> features, keys;
  if (c->HasAttr("keyed_features")) TF_RETURN_IF_ERROR(c->GetAttr("keyed_features", &features));
  if (c->HasAttr("hash_keys")) TF_RETURN_IF_ERROR(c->GetAttr("hash_keys", &keys));
  if (keys.size() != 2 * features.size())
    return tensorflow::errors::InvalidArgument("hash_keys must hold 2 integers per keyed feature (",
                                               features.size(), "), got ", keys.size());
  const int64_t n = static_cast<int64_t>(specs->size());
  for (size_t k = 0; k < features.size(); ++k) {
    const int64_t f = features[k];
    if (f < 0 || f >= n || (k > 0 && f <= features[k - 1]))
      return tensorflow::errors::InvalidArgument("keyed_features must be increasing feature indices in [0, ", n,
                                                 "), got ", f, " at position ", k);
    const std::vector<int64_t> key{keys[2 * k], keys[2 * k + 1]};
    TF_RETURN_IF_ERROR(CoreStatus(ctr::SetHashKey(key, &(*specs)[f].lookup.hash)));
  }
  return absl::OkStatus();
}

inline absl::Status ReadMultiStringAttrs(tensorflow::OpKernelConstruction* c,
                                         std::vector<ctr::StringSpec>* specs) {
  int n;
  std::vector<std::string> combiners, modes, delimiters;
  std::vector<bool> skip_empty;
  std::vector<float> max_norms;
  std::vector<int64_t> buckets;
  TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
  TF_RETURN_IF_ERROR(c->GetAttr("num_buckets", &buckets));
  if (!buckets.empty() && static_cast<int>(buckets.size()) != n)
    return tensorflow::errors::InvalidArgument("num_buckets must be empty or have N = ", n, " entries, got ",
                                               buckets.size());
  TF_RETURN_IF_ERROR(c->GetAttr("combiners", &combiners));
  TF_RETURN_IF_ERROR(c->GetAttr("id_modes", &modes));
  TF_RETURN_IF_ERROR(c->GetAttr("delimiters", &delimiters));
  TF_RETURN_IF_ERROR(c->GetAttr("skip_empty", &skip_empty));
  TF_RETURN_IF_ERROR(c->GetAttr("max_norms", &max_norms));
  for (size_t len : {combiners.size(), modes.size(), delimiters.size(), skip_empty.size(), max_norms.size()})
    if (static_cast<int>(len) != n)
      return tensorflow::errors::InvalidArgument(
          "every per-feature attribute list must have N = ", n, " entries, got combiners ",
          combiners.size(), ", id_modes ", modes.size(), ", delimiters ", delimiters.size(),
          ", skip_empty ", skip_empty.size(), ", max_norms ", max_norms.size());
  specs->resize(n);
  for (int i = 0; i < n; ++i) {
    const absl::Status made =
        MakeStringSpec(combiners[i], modes[i], delimiters[i], skip_empty[i], max_norms[i], &(*specs)[i]);
    if (!made.ok()) return tensorflow::errors::InvalidArgument("feature ", i, ": ", made.message());
    if (!buckets.empty()) {
      if (buckets[i] < 0)
        return tensorflow::errors::InvalidArgument("feature ", i, ": num_buckets must be >= 0, got ", buckets[i]);
      (*specs)[i].buckets = buckets[i];
    }
  }
  return ReadHashKeys(c, specs);
}

// Sets vocab/dim from a table and checks what every mode needs of it.
inline absl::Status BindTable(const tensorflow::Tensor& params, ctr::StringSpec* s) {
  if (params.dims() != 2)
    return tensorflow::errors::InvalidArgument("params must be a matrix [V, D], got shape ",
                                               params.shape().DebugString());
  s->lookup.vocab = params.dim_size(0);
  s->lookup.dim = params.dim_size(1);
  if (s->lookup.default_id >= s->lookup.vocab)
    return tensorflow::errors::InvalidArgument("default_id ", s->lookup.default_id, " is out of range [0, ",
                                               s->lookup.vocab, ")");
  if (s->lookup.empty_grad_row >= s->lookup.vocab) s->lookup.empty_grad_row = -1;
  if (s->lookup.vocab <= 0 && s->mode != ctr::TokenMode::kIndex)
    return tensorflow::errors::InvalidArgument(
        "hash and mod modes need a table with at least one row, got ", s->lookup.vocab);
  return absl::OkStatus();
}

// `s` for counting each bag's tokens with the gradient's row counter: no
// default row and no zero row for a bag without tokens.
inline ctr::StringSpec TokenCountSpec(ctr::StringSpec s) {
  s.lookup.default_id = -1;
  s.lookup.empty_grad_row = -1;
  return s;
}

// What every single-feature string kernel (CPU and GPU, forward and
// gradient) shares: the attributes, read once and bound per call to a table.
// Base is OpKernel, or AsyncOpKernel for the GPU forward kernels.
template <typename Base>
class StringKernelOn : public Base {
 public:
  explicit StringKernelOn(tensorflow::OpKernelConstruction* c) : Base(c) {
    OP_REQUIRES_OK(c, ReadStringAttrs(c, &spec_, &bagged_, &trim_empty_tail_));
  }

 protected:
  // This call's spec: the attributes with the vocab and dim of `params`.
  absl::Status BindSpec(const tensorflow::Tensor& params, ctr::StringSpec* spec) const {
    *spec = spec_;
    return BindTable(params, spec);
  }
  bool bagged() const { return bagged_; }
  bool trim_empty_tail() const { return trim_empty_tail_; }

 private:
  ctr::StringSpec spec_;
  bool bagged_ = false;
  bool trim_empty_tail_ = false;
};
using StringKernel = StringKernelOn<tensorflow::OpKernel>;

// The grouped kernels' counterpart: N features, whose strings are packed
// feature after feature (N * B strings), each with its own table and output.
template <typename Base>
class MultiStringKernelOn : public Base {
 public:
  explicit MultiStringKernelOn(tensorflow::OpKernelConstruction* c) : Base(c) {
    OP_REQUIRES_OK(c, ReadMultiStringAttrs(c, &specs_));
  }

 protected:
  int num_features() const { return static_cast<int>(specs_.size()); }

  // B, from the N * B strings of the pack.
  absl::Status GroupBatch(const tensorflow::Tensor& splits, int64_t* batch) const {
    const int64_t num_strings = splits.NumElements() - 1;
    const int n = num_features();
    if (num_strings < 0 || num_strings % n != 0)
      return tensorflow::errors::InvalidArgument("row_splits must hold N * B + 1 = ", n, " * B + 1 entries, got ",
                                                 splits.NumElements());
    *batch = num_strings / n;
    return absl::OkStatus();
  }

  // Each feature's spec bound to its table (input i).
  absl::Status BindTables(tensorflow::OpKernelContext* ctx, std::vector<ctr::StringSpec>* specs) const {
    *specs = specs_;
    for (int i = 0; i < num_features(); ++i) {
      const absl::Status bound = BindTable(ctx->input(i), &(*specs)[i]);
      if (!bound.ok()) return tensorflow::errors::InvalidArgument("feature ", i, ": ", bound.message());
      AdviseHugePages(ctx, ctx->input(i));
    }
    return absl::OkStatus();
  }

  // BindTables, and each feature's [B, D_i] output i.
  absl::Status BindFeatures(tensorflow::OpKernelContext* ctx, int64_t batch, std::vector<ctr::StringSpec>* specs,
                            std::vector<tensorflow::Tensor*>* outs) const {
    TF_RETURN_IF_ERROR(BindTables(ctx, specs));
    outs->assign(specs_.size(), nullptr);
    for (int i = 0; i < num_features(); ++i)
      TF_RETURN_IF_ERROR(AllocateOutput(ctx, i, {batch, (*specs)[i].lookup.dim}, &(*outs)[i]));
    return absl::OkStatus();
  }

 private:
  std::vector<ctr::StringSpec> specs_;
};
using MultiStringKernel = MultiStringKernelOn<tensorflow::OpKernel>;

// Where a forward string kernel pools its [rows, dim]: output 0 itself, or,
// when trim_empty_tail drops trailing empty rows, a temp (the output is
// allocated once the kept count is known).
inline absl::Status AllocatePooled(tensorflow::OpKernelContext* ctx, tensorflow::DataType dtype, int64_t rows,
                                   int64_t dim, bool trim_empty_tail, tensorflow::Tensor* temp,
                                   tensorflow::Tensor** dst) {
  if (!trim_empty_tail) return AllocateOutput(ctx, 0, {rows, dim}, dst);
  TF_RETURN_IF_ERROR(AllocateTemp(ctx, dtype, {rows, dim}, temp));
  *dst = temp;
  return absl::OkStatus();
}

inline absl::Status CheckVector(const tensorflow::Tensor& t, const char* what) {
  if (t.dims() != 1)
    return tensorflow::errors::InvalidArgument(what, " must be a vector, got shape ",
                                               t.shape().DebugString());
  return absl::OkStatus();
}

// CtrConcatStringEmbedding's kernels (CPU and GPU): N features pooled into
// one output, feature i's strings at [input_splits[i], input_splits[i + 1])
// of the pack, and M dense inputs copied in: the output's column blocks are
// feature i (block i) and dense input j (block N + j) in `layout` order.
template <typename Base>
class ConcatStringKernelOn : public MultiStringKernelOn<Base> {
  using Multi = MultiStringKernelOn<Base>;

 public:
  // string_inputs: how many inputs carry the strings, between the tables
  // and the dense inputs (the pack's three outputs, or the string tensors).
  ConcatStringKernelOn(tensorflow::OpKernelConstruction* c, int string_inputs = 3)
      : Multi(c), string_inputs_(string_inputs) {
    std::vector<bool> trim;
    OP_REQUIRES_OK(c, c->GetAttr("trim_empty_tail", &trim));
    OP_REQUIRES(c, trim.empty() || static_cast<int>(trim.size()) == num_features(),
                tensorflow::errors::InvalidArgument("trim_empty_tail must be empty or have N = ", num_features(),
                                                    " entries, got ", trim.size()));
    trim_.assign(num_features(), false);
    for (size_t i = 0; i < trim.size(); ++i) trim_[i] = trim[i];
    OP_REQUIRES_OK(c, c->GetAttr("M", &num_dense_));
    OP_REQUIRES_OK(c, ReadLayout(c));
  }

 protected:
  using Multi::BindTables;
  using Multi::num_features;

  // One call's validated layout: each feature's first string (and, at N,
  // the total), its spec bound to its table, the first output column of
  // each block (and, at N + M, the width), the one row count, and the
  // output. Feature rows differ by device (a trimmed feature's are counted
  // where its strings are), so feature_rows(f, plan, &rows) supplies them.
  struct Plan {
    std::vector<int64_t> first;
    std::vector<ctr::StringSpec> specs;
    std::vector<int64_t> columns;
    int64_t rows = 0;
    tensorflow::Tensor* out = nullptr;
    int64_t width() const { return columns.back(); }
  };
  using FeatureRowsFn = std::function<absl::Status(int f, const Plan& plan, int64_t* rows)>;

  absl::Status MakePlan(tensorflow::OpKernelContext* ctx, int64_t num_strings, const FeatureRowsFn& feature_rows,
                        Plan* plan) const {
    TF_RETURN_IF_ERROR(FeatureStrings(ctx->input(num_features() + 2), num_strings, &plan->first));
    return PlanFeatures(ctx, feature_rows, plan);
  }

  // MakePlan once plan->first is known.
  absl::Status PlanFeatures(tensorflow::OpKernelContext* ctx, const FeatureRowsFn& feature_rows, Plan* plan) const {
    TF_RETURN_IF_ERROR(BindTables(ctx, &plan->specs));
    std::vector<int64_t> rows(num_features());
    for (int f = 0; f < num_features(); ++f) TF_RETURN_IF_ERROR(feature_rows(f, *plan, &rows[f]));
    TF_RETURN_IF_ERROR(Columns(ctx, plan->specs, &plan->columns));
    TF_RETURN_IF_ERROR(CommonRows(ctx, rows, &plan->rows));
    return AllocateOutput(ctx, 0, {plan->rows, plan->width()}, &plan->out);
  }

  bool trimmed(int f) const { return trim_[f]; }
  int num_dense() const { return num_dense_; }
  const tensorflow::Tensor& dense(tensorflow::OpKernelContext* ctx, int j) const {
    return ctx->input(num_features() + string_inputs_ + j);
  }

  // The dense inputs, in input order.
  std::vector<const tensorflow::Tensor*> DenseInputs(tensorflow::OpKernelContext* ctx) const {
    std::vector<const tensorflow::Tensor*> out;
    for (int j = 0; j < num_dense(); ++j) out.push_back(&dense(ctx, j));
    return out;
  }

  // Each feature's first string (and, at N, the total), from input_splits.
  absl::Status FeatureStrings(const tensorflow::Tensor& input_splits, int64_t num_strings,
                              std::vector<int64_t>* first) const {
    TF_RETURN_IF_ERROR(CheckVector(input_splits, "input_splits"));
    if (input_splits.NumElements() != num_features() + 1)
      return tensorflow::errors::InvalidArgument("input_splits must hold N + 1 = ", num_features() + 1,
                                                 " entries, got ", input_splits.NumElements());
    const int64_t* v = input_splits.flat<int64_t>().data();
    const std::string err = ctr::ValidateRowSplits(v, input_splits.NumElements(), num_strings, "input_splits",
                                                   "strings");
    if (!err.empty()) return tensorflow::errors::InvalidArgument(err);
    first->assign(v, v + input_splits.NumElements());
    return absl::OkStatus();
  }

  // The first output column of each block (feature i at i, dense input j at
  // N + j) and, at N + M, the output's width. Dense inputs must be matrices.
  absl::Status Columns(tensorflow::OpKernelContext* ctx, const std::vector<ctr::StringSpec>& specs,
                       std::vector<int64_t>* columns) const {
    const int n = num_features();
    std::vector<int64_t> width(n + num_dense_);
    for (int i = 0; i < n; ++i) width[i] = specs[i].lookup.dim;
    for (int j = 0; j < num_dense_; ++j) {
      const tensorflow::Tensor& d = dense(ctx, j);
      if (d.dims() != 2)
        return tensorflow::errors::InvalidArgument("dense input ", j, " must be a matrix [rows, width], got shape ",
                                                   d.shape().DebugString());
      width[n + j] = d.dim_size(1);
    }
    columns->assign(n + num_dense_ + 1, 0);
    int64_t column = 0;
    for (const int block : layout_) {
      (*columns)[block] = column;
      TF_RETURN_IF_ERROR(AddBlockWidth(width[block], &column));
    }
    columns->back() = column;
    return absl::OkStatus();
  }

  // The one row count of all features and dense inputs, or the
  // InvalidArgument of the concatenation that would fail.
  absl::Status CommonRows(tensorflow::OpKernelContext* ctx, const std::vector<int64_t>& feature_rows,
                          int64_t* common) const {
    *common = feature_rows.empty() ? 0 : feature_rows[0];
    for (size_t i = 1; i < feature_rows.size(); ++i)
      if (feature_rows[i] != *common)
        return tensorflow::errors::InvalidArgument("feature ", i, " has ", feature_rows[i],
                                                   " rows where feature 0 has ", *common,
                                                   ": their outputs cannot be concatenated");
    for (int j = 0; j < num_dense_; ++j)
      if (dense(ctx, j).dim_size(0) != *common)
        return tensorflow::errors::InvalidArgument("dense input ", j, " has ", dense(ctx, j).dim_size(0),
                                                   " rows where feature 0 has ", *common,
                                                   ": they cannot be concatenated");
    return absl::OkStatus();
  }

 private:
  // layout: a permutation of the N + M blocks (empty: features, then dense).
  absl::Status ReadLayout(tensorflow::OpKernelConstruction* c) {
    std::vector<int64_t> layout;
    TF_RETURN_IF_ERROR(c->GetAttr("layout", &layout));
    const int blocks = num_features() + num_dense_;
    if (layout.empty())
      for (int b = 0; b < blocks; ++b) layout.push_back(b);
    std::vector<bool> seen(blocks, false);
    bool ok = static_cast<int>(layout.size()) == blocks;
    for (const int64_t b : layout) {
      ok = ok && b >= 0 && b < blocks && !seen[b];
      if (ok) seen[b] = true;
    }
    if (!ok)
      return tensorflow::errors::InvalidArgument("layout must list each of the N + M = ", blocks,
                                                 " blocks (features 0..N-1, dense inputs N..N+M-1) once");
    layout_.assign(layout.begin(), layout.end());
    return absl::OkStatus();
  }

  std::vector<bool> trim_;
  int string_inputs_ = 3;
  int num_dense_ = 0;
  std::vector<int> layout_;
};
using ConcatStringKernel = ConcatStringKernelOn<tensorflow::OpKernel>;

}  // namespace tf_ctr

// CPU kernel of CtrVocabEmbedding: the table's own Find (whatever table type
// the graph built), one pass of checks in key order, so the error names the
// first bad key, then the row copies on TF's intra-op pool.
#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "cc/core/vocab.h"
#include "cc/kernels/tf_types.h"
#include "tensorflow/core/framework/lookup_interface.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/kernels/lookup_util.h"

namespace tf_ctr {

using tensorflow::OpKernelContext;
using tensorflow::Tensor;

namespace {

constexpr size_t kMaxQuotedKey = 64;
constexpr uint64_t kInlineCopyBytes = 256 << 10;

std::string QuoteKey(const Tensor& keys, int64_t i) {
  if (keys.dtype() == tensorflow::DT_STRING) {
    const tensorflow::tstring& s = keys.flat<tensorflow::tstring>()(i);
    std::string shown(s.data(), std::min(s.size(), kMaxQuotedKey));
    return absl::StrCat("'", absl::CEscape(shown), s.size() > kMaxQuotedKey ? "'..." : "'");
  }
  if (keys.dtype() == tensorflow::DT_INT32) return std::to_string(keys.flat<int32_t>()(i));
  return std::to_string(keys.flat<int64_t>()(i));
}

// Row of flat key i: its index along axis 0 (keys of rank 0 are row 0).
int64_t RowOf(const Tensor& keys, int64_t i) {
  if (keys.dims() == 0 || keys.dim_size(0) == 0) return 0;
  return i / (keys.NumElements() / keys.dim_size(0));
}

}  // namespace

template <typename T>
class VocabEmbeddingOp : public tensorflow::OpKernel {
 public:
  explicit VocabEmbeddingOp(tensorflow::OpKernelConstruction* c) : OpKernel(c) {
    std::string missing;
    OP_REQUIRES_OK(c, c->GetAttr("missing_key", &missing));
    missing_is_error_ = missing == "error";
    OP_REQUIRES_OK(c, c->GetAttr("wrap_negative_ids", &wrap_negative_));
    OP_REQUIRES_OK(c, c->GetAttr("missing_id", &missing_id_));
  }

  void Compute(OpKernelContext* ctx) override {
    tensorflow::lookup::LookupInterface* table = nullptr;
    OP_REQUIRES_OK(ctx, tensorflow::lookup::GetLookupTable("table_handle", ctx, &table));
    tensorflow::core::ScopedUnref unref(table);
    const Tensor& keys = ctx->input(1);
    const Tensor& default_value = ctx->input(2);
    const Tensor& params = ctx->input(3);
    OP_REQUIRES(ctx, table->value_dtype() == tensorflow::DT_INT64,
                tensorflow::errors::InvalidArgument("the table's values must be int64 row ids, got ",
                                                    tensorflow::DataTypeString(table->value_dtype())));
    OP_REQUIRES_OK(ctx, table->CheckFindArguments(keys, default_value));
    OP_REQUIRES(ctx, params.dims() >= 1,
                tensorflow::errors::InvalidArgument("params must have rank >= 1, got shape ",
                                                    params.shape().DebugString()));

    Tensor* rows = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, keys.shape(), &rows));
    OP_REQUIRES_OK(ctx, table->Find(ctx, keys, rows, default_value));
    OP_REQUIRES_OK(ctx, ResolveRows(keys, params.dim_size(0), rows));

    tensorflow::TensorShape out_shape = keys.shape();
    for (int d = 1; d < params.dims(); ++d) out_shape.AddDim(params.dim_size(d));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, out_shape, &out));
    CopyRows(ctx, params, *rows, out);
  }

 private:
  // Turns each found id into the row it reads, in key order so the error
  // names the first bad key.
  absl::Status ResolveRows(const Tensor& keys, int64_t vocab, Tensor* rows) const {
    auto r = rows->flat<int64_t>();
    for (int64_t i = 0; i < r.size(); ++i) {
      const int64_t id = r(i);
      if (missing_is_error_ && id == missing_id_)
        return tensorflow::errors::InvalidArgument("key ", QuoteKey(keys, i), " in row ", RowOf(keys, i),
                                                   " is not in the vocabulary (no out-of-vocabulary id)");
      const int64_t row = ctr::VocabRow(id, vocab, wrap_negative_);
      if (row < 0)
        return tensorflow::errors::InvalidArgument("id ", id, " of key ", QuoteKey(keys, i), " in row ",
                                                   RowOf(keys, i), " is out of range [0, ", vocab, ")");
      r(i) = row;
    }
    return absl::OkStatus();
  }

  static void CopyRows(OpKernelContext* ctx, const Tensor& params, const Tensor& rows, Tensor* out) {
    const int64_t n = rows.NumElements();
    if (n == 0 || params.dim_size(0) == 0) return;
    const int64_t width = params.NumElements() / params.dim_size(0);
    const size_t bytes = width * sizeof(T);
    const T* src = params.flat<T>().data();
    T* dst = out->flat<T>().data();
    const int64_t* r = rows.flat<int64_t>().data();
    auto copy = [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) std::memcpy(dst + i * width, src + r[i] * width, bytes);
    };
    // A serving batch of one feature is a few dozen KB: handing it to the
    // thread pool costs more than the copy.
    if (static_cast<uint64_t>(n) * bytes <= kInlineCopyBytes) {
      copy(0, n);
    } else {
      ParallelFor(ctx, n, static_cast<int64_t>(bytes) * 2, copy);
    }
  }

  bool missing_is_error_ = false;
  bool wrap_negative_ = false;
  int64_t missing_id_ = -1;
};

#define REGISTER_CPU(T) \
  REGISTER_KERNEL_BUILDER(Name("CtrVocabEmbedding").Device(tensorflow::DEVICE_CPU).TypeConstraint<T>("T"), \
                          VocabEmbeddingOp<T>);
REGISTER_CPU(float);
REGISTER_CPU(double);
REGISTER_CPU(Eigen::half);
REGISTER_CPU(Eigen::bfloat16);
#undef REGISTER_CPU

}  // namespace tf_ctr

// CPU kernel of CtrMultiHotDense: the ids checked block by block in row
// order (so the error names the first bad id; one-hot blocks drop them), then each output row summed
// on TF's intra-op pool from the kernel rows its blocks name.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "cc/core/multi_hot_cpu.h"
#include "cc/kernels/block_layout.h"
#include "cc/kernels/tf_types.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_ctr {

using tensorflow::OpKernelContext;
using tensorflow::Tensor;

namespace {

// A column block of the concatenation: an encoding of `ids` (width: its
// depth) or the dense matrix `dense`; `first` is its first kernel row.
template <typename T>
struct Block {
  const Tensor* ids = nullptr;
  const T* dense = nullptr;
  int64_t width = 0;
  int64_t depth = 0;
  bool binary = true;
  int64_t first = 0;
};

// DenseBincount rejects negative ids; the first one in row order is named.
template <typename Id>
absl::Status CheckNotNegative(const Tensor& ids, int block) {
  auto id = ids.matrix<Id>();
  for (int64_t r = 0; r < id.dimension(0); ++r)
    for (int64_t k = 0; k < id.dimension(1); ++k)
      if (id(r, k) < 0)
        return tensorflow::errors::InvalidArgument("id ", static_cast<int64_t>(id(r, k)), " in row ", r,
                                                   " of encoded block ", block,
                                                   " is negative: an encoding counts ids >= 0");
  return absl::OkStatus();
}

template <typename T>
class MultiHotDenseOp : public tensorflow::OpKernel {
 public:
  explicit MultiHotDenseOp(tensorflow::OpKernelConstruction* c) : OpKernel(c) {
    tensorflow::DataTypeVector id_types;
    OP_REQUIRES_OK(c, c->GetAttr("Tids", &id_types));
    n_ = static_cast<int>(id_types.size());
    OP_REQUIRES_OK(c, c->GetAttr("M", &m_));
    std::vector<bool> binary, drop_negative;
    OP_REQUIRES_OK(c, c->GetAttr("depths", &depths_));
    OP_REQUIRES_OK(c, c->GetAttr("binary_output", &binary));
    OP_REQUIRES_OK(c, c->GetAttr("drop_negative", &drop_negative));
    if (drop_negative.empty()) drop_negative.assign(n_, false);
    OP_REQUIRES(c,
                static_cast<int>(depths_.size()) == n_ && static_cast<int>(binary.size()) == n_ &&
                    static_cast<int>(drop_negative.size()) == n_,
                tensorflow::errors::InvalidArgument(
                    "depths, binary_output and drop_negative must have one entry per ids input (", n_, "); got ",
                    depths_.size(), ", ", binary.size(), " and ", drop_negative.size()));
    for (int i = 0; i < n_; ++i) {
      OP_REQUIRES(c, depths_[i] >= 0, tensorflow::errors::InvalidArgument("depths[", i, "] is negative: ", depths_[i]));
      binary_.push_back(binary[i]);
      drop_negative_.push_back(drop_negative[i]);
    }
    OP_REQUIRES_OK(c, ReadBlockLayout(c, n_ + m_, &layout_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& kernel = ctx->input(n_ + m_);
    OP_REQUIRES(ctx, kernel.dims() == 2,
                tensorflow::errors::InvalidArgument("kernel must be a [width, units] matrix; got shape ",
                                                    kernel.shape().DebugString()));
    std::vector<Block<T>> blocks;
    int64_t batch = -1;
    OP_REQUIRES_OK(ctx, ReadBlocks(ctx, &blocks, &batch));
    int64_t width = 0;
    for (int64_t b : layout_) {
      blocks[b].first = width;
      width += blocks[b].width;
    }
    OP_REQUIRES(ctx, width == kernel.dim_size(0),
                tensorflow::errors::InvalidArgument("the blocks are ", width, " columns wide but the kernel has ",
                                                    kernel.dim_size(0), " rows (kernel shape ",
                                                    kernel.shape().DebugString(), ")"));
    const int64_t units = kernel.dim_size(1);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tensorflow::TensorShape({batch, units}), &out));
    const T* rows = kernel.flat<T>().data();
    T* dst = out->flat<T>().data();
    int64_t cost = units + 8;
    for (const Block<T>& block : blocks) cost += (block.ids != nullptr ? block.ids->dim_size(1) : block.width) * units;
    ParallelFor(ctx, batch, cost, [&](int64_t begin, int64_t end) {
      std::vector<int64_t> sorted;
      for (int64_t r = begin; r < end; ++r) {
        T* at = dst + r * units;
        std::fill(at, at + units, T(0));
        for (int64_t b : layout_) AddBlockRow(blocks[b], r, rows, units, at, &sorted);
      }
    });
  }

 private:
  // The blocks from the inputs, checked: every one a matrix of `batch` rows,
  // the ids not negative.
  absl::Status ReadBlocks(OpKernelContext* ctx, std::vector<Block<T>>* blocks, int64_t* batch) const {
    for (int i = 0; i < n_ + m_; ++i) {
      const Tensor& in = ctx->input(i);
      if (in.dims() != 2 || (*batch >= 0 && in.dim_size(0) != *batch))
        return tensorflow::errors::InvalidArgument(
            i < n_ ? "ids " : "dense input ", i < n_ ? i : i - n_, " must be a matrix of ",
            *batch >= 0 ? std::to_string(*batch) : std::string("B"), " rows, as the first input has; got shape ",
            in.shape().DebugString());
      *batch = in.dim_size(0);
      Block<T> block;
      if (i < n_) {
        if (!drop_negative_[i])
          TF_RETURN_IF_ERROR(in.dtype() == tensorflow::DT_INT32 ? CheckNotNegative<int32_t>(in, i)
                                                                : CheckNotNegative<int64_t>(in, i));
        block.ids = &in;
        block.width = block.depth = depths_[i];
        block.binary = binary_[i];
      } else {
        block.dense = in.flat<T>().data();
        block.width = in.dim_size(1);
      }
      blocks->push_back(block);
    }
    return absl::OkStatus();
  }

  // Adds row r of `block` times its kernel rows to out[0, units).
  static void AddBlockRow(const Block<T>& block, int64_t r, const T* kernel, int64_t units, T* out,
                          std::vector<int64_t>* sorted) {
    const T* rows = kernel + block.first * units;
    if (block.ids == nullptr) {
      // Every column, zeros included: MatMul multiplies them too (0 * inf is NaN).
      const T* x = block.dense + r * block.width;
      for (int64_t k = 0; k < block.width; ++k)
        for (int64_t u = 0; u < units; ++u) out[u] += x[k] * rows[k * units + u];
      return;
    }
    const int64_t n = block.ids->dim_size(1);
    if (block.ids->dtype() == tensorflow::DT_INT32) {
      ctr::AddMultiHotRow(block.ids->template flat<int32_t>().data() + r * n, n, block.depth, block.binary, rows, units, out,
                          sorted);
    } else {
      ctr::AddMultiHotRow(block.ids->template flat<int64_t>().data() + r * n, n, block.depth, block.binary, rows, units, out,
                          sorted);
    }
  }

  int n_ = 0, m_ = 0;
  std::vector<int64_t> depths_;
  std::vector<bool> binary_, drop_negative_;
  std::vector<int64_t> layout_;
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name("CtrMultiHotDense").Device(tensorflow::DEVICE_CPU).TypeConstraint<float>("T"),
                        MultiHotDenseOp<float>);
REGISTER_KERNEL_BUILDER(Name("CtrMultiHotDense").Device(tensorflow::DEVICE_CPU).TypeConstraint<double>("T"),
                        MultiHotDenseOp<double>);

}  // namespace tf_ctr

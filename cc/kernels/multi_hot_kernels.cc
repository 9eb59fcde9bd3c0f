// CPU kernel of CtrMultiHotDense: the ids checked block by block in row
// order (so the error names the first bad id; one-hot blocks drop them), the
// dense blocks multiplied by their kernel rows as MatMul does, then the kernel
// rows each row's ids name added on TF's intra-op pool.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cc/core/multi_hot_cpu.h"
#include "cc/kernels/block_layout.h"
#include "cc/kernels/tf_types.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "unsupported/Eigen/CXX11/Tensor"

namespace tf_ctr {

using tensorflow::OpKernelContext;
using tensorflow::Tensor;

namespace {

constexpr int64_t kRowsPerShard = 64;

// A column block of the concatenation: an encoding of `ids` (width: its
// depth) or the dense matrix `dense`; `first` is its first kernel row.
template <typename T>
struct Block {
  const Tensor* ids = nullptr;
  const T* dense = nullptr;
  int64_t width = 0;
  int64_t depth = 0;
  bool binary = true;
  int64_t column_depth = 0;  // > 0: one one-hot encoding of this depth per id column
  int64_t first = 0;
};

// DenseBincount rejects negative ids; the first one in row order is named,
// with its block's position in the concatenation (the caller's block list).
template <typename Id>
absl::Status CheckNotNegative(const Tensor& ids, int64_t block) {
  // Over the elements, not rows x columns: 2^40 rows of no ids took hours.
  const auto id = ids.flat<Id>();
  for (int64_t e = 0; e < id.size(); ++e)
    if (id(e) < 0)
      return tensorflow::errors::InvalidArgument("id ", static_cast<int64_t>(id(e)), " in row ", e / ids.dim_size(1),
                                                 " of block ", block,
                                                 " (an encoding) is negative: an encoding counts ids >= 0");
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
    OP_REQUIRES_OK(c, c->GetAttr("column_depths", &column_depths_));
    if (column_depths_.empty()) column_depths_.assign(n_, 0);
    OP_REQUIRES_OK(c, c->GetAttr("depths", &depths_));
    OP_REQUIRES_OK(c, c->GetAttr("binary_output", &binary));
    OP_REQUIRES_OK(c, c->GetAttr("drop_negative", &drop_negative));
    if (drop_negative.empty()) drop_negative.assign(n_, false);
    OP_REQUIRES(c,
                static_cast<int>(depths_.size()) == n_ && static_cast<int>(binary.size()) == n_ &&
                    static_cast<int>(drop_negative.size()) == n_ && static_cast<int>(column_depths_.size()) == n_,
                tensorflow::errors::InvalidArgument(
                    "depths, binary_output, drop_negative and column_depths must have one entry per ids input (", n_,
                    "); got ", depths_.size(), ", ", binary.size(), ", ", drop_negative.size(), " and ",
                    column_depths_.size()));
    for (int i = 0; i < n_; ++i) {
      OP_REQUIRES(c, depths_[i] >= 0 && column_depths_[i] >= 0,
                  tensorflow::errors::InvalidArgument("depths[", i, "] and column_depths[", i,
                                                      "] must be >= 0; got ", depths_[i], " and ", column_depths_[i]));
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
    // Summed without overflow, whatever the depths attr holds: no block may
    // end past the kernel's rows.
    int64_t width = 0;
    bool fits = true;
    for (int64_t b : layout_) {
      blocks[b].first = width;
      fits &= blocks[b].width <= kernel.dim_size(0) - width;
      if (!fits) break;
      width += blocks[b].width;
    }
    OP_REQUIRES(ctx, fits && width == kernel.dim_size(0),
                tensorflow::errors::InvalidArgument("the blocks are ",
                                                    fits ? std::to_string(width)
                                                         : "more than " + std::to_string(kernel.dim_size(0)),
                                                    " columns wide but the kernel has ", kernel.dim_size(0),
                                                    " rows (kernel shape ", kernel.shape().DebugString(), ")"));
    const int64_t units = kernel.dim_size(1);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, AllocateOutput(ctx, 0, {batch, units}, &out));
    if (out->NumElements() == 0) return;
    const T* rows = kernel.flat<T>().data();
    T* dst = out->flat<T>().data();
    // Shards of kRowsPerShard rows at least: each runs one matrix product of
    // its rows, whose set-up would dominate a few rows' work.
    int64_t cost = units + 8;
    for (const Block<T>& block : blocks)
      cost += (block.ids != nullptr ? block.ids->dim_size(1) + 8 : block.width) * units;
    const int64_t shards = (batch + kRowsPerShard - 1) / kRowsPerShard;
    ParallelFor(ctx, shards, cost * kRowsPerShard, [&](int64_t first_shard, int64_t last_shard) {
      const int64_t begin = first_shard * kRowsPerShard, end = std::min(batch, last_shard * kRowsPerShard);
      MultiplyDenseBlocks(blocks, rows, begin, end, units, dst);
      std::vector<int64_t> sorted;
      for (int64_t r = begin; r < end; ++r)
        for (int64_t b : layout_)
          if (blocks[b].ids != nullptr) AddEncodedRow(blocks[b], r, rows, units, dst + r * units, &sorted);
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
      if (i < n_ && column_depths_[i] > 0 &&
          (depths_[i] % column_depths_[i] != 0 || in.dim_size(1) != depths_[i] / column_depths_[i])) {
        return tensorflow::errors::InvalidArgument("ids ", i, " have ", in.dim_size(1), " columns of one-hot depth ",
                                                   column_depths_[i], ", but the block is ", depths_[i], " wide");
      }
      if (i < n_) {
        if (!drop_negative_[i] && column_depths_[i] == 0)
          TF_RETURN_IF_ERROR(in.dtype() == tensorflow::DT_INT32 ? CheckNotNegative<int32_t>(in, PositionOf(i))
                                                                : CheckNotNegative<int64_t>(in, PositionOf(i)));
        block.ids = &in;
        block.width = block.depth = depths_[i];
        block.binary = binary_[i];
        block.column_depth = column_depths_[i];
      } else {
        block.dense = in.flat<T>().data();
        block.width = in.dim_size(1);
      }
      blocks->push_back(block);
    }
    return absl::OkStatus();
  }

  // Rows [begin, end) of out = the dense blocks times their kernel rows, as a
  // blocked, vectorized matrix product (Eigen's contraction, on this thread):
  // a loop over each row's columns was 3-4x slower than the MatMul it
  // replaces on the dense columns. Zeros without dense blocks.
  static void MultiplyDenseBlocks(const std::vector<Block<T>>& blocks, const T* kernel, int64_t begin, int64_t end,
                                  int64_t units, T* out) {
    // Unaligned maps: a kernel block starts at a row offset, and the rows at `begin`.
    using Matrix = Eigen::TensorMap<Eigen::Tensor<const T, 2, Eigen::RowMajor>>;
    const Eigen::array<Eigen::IndexPair<Eigen::Index>, 1> inner = {Eigen::IndexPair<Eigen::Index>(1, 0)};
    Eigen::TensorMap<Eigen::Tensor<T, 2, Eigen::RowMajor>> result(out + begin * units, end - begin, units);
    result.setZero();
    if (end == begin || units == 0) return;
    for (const Block<T>& block : blocks) {
      if (block.ids != nullptr || block.width == 0) continue;
      Matrix x(block.dense + begin * block.width, end - begin, block.width);
      Matrix k(kernel + block.first * units, block.width, units);
      result += x.contract(k, inner);
    }
  }

  // Adds the kernel rows row r of encoded `block` names to out[0, units).
  static void AddEncodedRow(const Block<T>& block, int64_t r, const T* kernel, int64_t units, T* out,
                            std::vector<int64_t>* sorted) {
    const T* rows = kernel + block.first * units;
    const int64_t n = block.ids->dim_size(1);
    if (block.column_depth > 0) {
      if (block.ids->dtype() == tensorflow::DT_INT32) {
        ctr::AddOneHotColumnsRow(block.ids->template flat<int32_t>().data() + r * n, n, block.column_depth, rows,
                                 units, out);
      } else {
        ctr::AddOneHotColumnsRow(block.ids->template flat<int64_t>().data() + r * n, n, block.column_depth, rows,
                                 units, out);
      }
      return;
    }
    if (block.ids->dtype() == tensorflow::DT_INT32) {
      ctr::AddMultiHotRow(block.ids->template flat<int32_t>().data() + r * n, n, block.depth, block.binary, rows, units, out,
                          sorted);
    } else {
      ctr::AddMultiHotRow(block.ids->template flat<int64_t>().data() + r * n, n, block.depth, block.binary, rows, units, out,
                          sorted);
    }
  }

  // Where input block `input` sits in the concatenation (layout_ is a permutation).
  int64_t PositionOf(int input) const {
    return std::find(layout_.begin(), layout_.end(), input) - layout_.begin();
  }

  int n_ = 0, m_ = 0;
  std::vector<int64_t> depths_, column_depths_;
  std::vector<bool> binary_, drop_negative_;
  std::vector<int64_t> layout_;
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name("CtrMultiHotDense").Device(tensorflow::DEVICE_CPU).TypeConstraint<float>("T"),
                        MultiHotDenseOp<float>);
REGISTER_KERNEL_BUILDER(Name("CtrMultiHotDense").Device(tensorflow::DEVICE_CPU).TypeConstraint<double>("T"),
                        MultiHotDenseOp<double>);

}  // namespace tf_ctr

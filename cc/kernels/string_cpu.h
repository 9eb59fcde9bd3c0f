// The CPU string kernels' own work on tensor contents: sharding rows over
// TF's intra-op pool by weight, and copying dense inputs into a concatenated
// output. string_common.h keeps what the GPU kernels share (attributes and
// shapes); nothing here is compiled for the GPU.
#pragma once

#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

#include "cc/core/strings.h"
#include "cc/kernels/tf_types.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_ctr {

// Runs fn(begin, end) over the rows [0, n) on TF's intra-op pool, in shards
// of about equal weight rather than equal rows: prefix(r) is the weight of
// rows [0, r), non-decreasing. A grouped op's rows range from one short key to
// long id lists (in feature order), and equal row counts would leave one
// thread with all the lists.
inline void ParallelForWeighted(tensorflow::OpKernelContext* ctx, int64_t n, int64_t cost_per_row,
                                const std::function<int64_t(int64_t)>& prefix,
                                const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const int64_t threads = ctx->device()->tensorflow_cpu_worker_threads()->num_threads;
  const int64_t k = std::min<int64_t>(n, std::max<int64_t>(1, 4 * threads));
  std::vector<int64_t> bounds(k + 1, n);
  bounds[0] = 0;
  const int64_t total = prefix(n);
  for (int64_t j = 1; j < k; ++j) {
    int64_t lo = bounds[j - 1], hi = n;  // first row whose prefix weight reaches j / k of the total
    const int64_t goal = static_cast<int64_t>(static_cast<double>(total) * j / k);
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (prefix(mid) < goal) lo = mid + 1; else hi = mid;
    }
    bounds[j] = lo;
  }
  ParallelFor(ctx, k, ShardCost(static_cast<double>(cost_per_row) * n / k), [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j)
      if (bounds[j] < bounds[j + 1]) fn(bounds[j], bounds[j + 1]);
  });
}

// A string row weighs its bytes plus a fixed share for its bag's output.
constexpr int64_t kStringRowWeight = 16;

// ParallelForWeighted over the rows of validated string splits, by bytes.
inline void ParallelForBytes(tensorflow::OpKernelContext* ctx, const int64_t* splits, int64_t n,
                             int64_t cost_per_row, const std::function<void(int64_t, int64_t)>& fn) {
  ParallelForWeighted(ctx, n, cost_per_row, [&](int64_t r) { return splits[r] - splits[0] + r * kStringRowWeight; },
                      fn);
}

// ParallelFor's cost per bag of `bags` holding `bytes` in all.
inline int64_t StringBagCost(const ctr::StringSpec& s, int64_t bytes, int64_t bags) {
  const int64_t avg_bytes = bags > 0 ? bytes / bags + 1 : 1;
  return ShardCost(12.0 * avg_bytes + 2.0 * (avg_bytes / 4 + 1) * s.lookup.dim);
}

// Each dense input's rows into its columns of out, [rows, width]: dense
// input j starts at column first_column[j].
template <typename T>
void CopyDenseColumns(const std::vector<const tensorflow::Tensor*>& dense, const int64_t* first_column, int64_t rows,
                      tensorflow::Tensor* out) {
  T* dst = out->flat<T>().data();
  const int64_t width = out->dim_size(1);
  for (size_t j = 0; j < dense.size(); ++j) {
    const int64_t w = dense[j]->dim_size(1);
    const T* src = dense[j]->flat<T>().data();
    T* to = dst + first_column[j];
    for (int64_t r = 0; r < rows && w > 0; ++r) std::memcpy(to + r * width, src + r * w, w * sizeof(T));
  }
}

}  // namespace tf_ctr

// Bucketized numeric features as tf.raw_ops.Bucketize computes them (a
// bucketized_column's ids): the index of the first boundary greater than
// the value, as std::upper_bound finds it over the sorted boundaries. A NaN
// is greater than nothing, so it lands in the last bucket. The value is
// compared in its own type against a float boundary, with C++'s usual
// conversions, as TF compares it.
#pragma once

#include <cstdint>

#include "cc/core/hd.h"

namespace ctr {

template <typename T>
CTR_HD int64_t BucketOf(T value, const float* boundaries, int64_t n) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (value < boundaries[mid]) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

// The id of column `column` of a bucketized feature of several values per
// row: its bucket offset by the buckets of the columns before it, as the
// bucketized column builds its sparse ids.
template <typename T>
CTR_HD int64_t BucketizedId(T value, const float* boundaries, int64_t n, int64_t column, int64_t stride) {
  return BucketOf(value, boundaries, n) + column * stride;
}

}  // namespace ctr

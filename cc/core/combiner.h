// Combiner arithmetic shared by every CPU and GPU pooling path.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "cc/core/enum_names.h"
#include "cc/core/hd.h"

namespace ctr {

enum class Combiner : int32_t { kSum = 0, kMean = 1, kSqrtn = 2 };
inline constexpr EnumName<Combiner> kCombinerNames[] = {
    {"sum", Combiner::kSum}, {"mean", Combiner::kMean}, {"sqrtn", Combiner::kSqrtn}};
inline std::string ParseCombiner(const std::string& s, Combiner* out) {
  return ParseEnum("combiner", kCombinerNames, s, out);
}

// The max_norm attr: <= 0 turns clipping off; a NaN would too, silently,
// where TF's clip_by_norm makes the rows NaN.
inline std::string CheckMaxNorm(float max_norm) {
  return std::isnan(max_norm) ? "max_norm must be a number (<= 0: no clipping), got nan" : "";
}

// Running sums a bag needs for its final scale. A bag whose weights are all 1
// (every unweighted bag) sums to its entry count, as TF's SparseSegmentMean /
// SqrtN and their gradients divide by float(count): float adds of 1 would
// stop counting at 2^24, where 2^24 + 1 rounds back to 2^24.
struct BagWeights {
  float sum = 0.f;
  float sum_sq = 0.f;
  int64_t count = 0;
  bool units = true;
  CTR_HD void Add(float w) {
    ++count;
    units = units && w == 1.f;
    if (units) {
      sum = sum_sq = static_cast<float>(count);
    } else {
      sum += w;
      sum_sq += w * w;
    }
  }
  // n Add(1.f) calls on fresh sums, without their chain of n dependent adds.
  CTR_HD static BagWeights Units(int64_t n) {
    BagWeights w;
    w.count = n;
    w.sum = w.sum_sq = static_cast<float>(n);
    return w;
  }
};

// What a bag's weighted sum is divided by: 1 (sum), the sum of the weights
// (mean) or the root of the sum of their squares (sqrtn).
CTR_HD float CombinerDivisor(Combiner c, const BagWeights& w) {
  switch (c) {
    case Combiner::kSum:
      return 1.f;
    case Combiner::kMean:
      return w.sum;
    case Combiner::kSqrtn:
      return sqrtf(w.sum_sq);
  }
  return 1.f;
}

// One output element of a bag: acc * scale (scale = OutputScale), or
// acc / divisor where the scale is 0, which is what TF's
// SparseSegmentMean/SqrtN compute, bit for bit. Two cases differ: a zero
// divisor gives exactly 0, as tf.math.div_no_nan does in the weighted
// composition, even when acc is NaN or infinite (a zero weight on an inf
// entry); and where the reciprocal is not a normal float (|divisor| above
// ~2^126, whose reciprocal is subnormal and flushed to zero in TF's threads,
// or so small that it overflows) the element is a true division, as TF's is.
CTR_HD bool CombineByScale(float scale) { return scale != 0.f && fabsf(scale) <= 3.402823466e38f; }
CTR_HD float CombineElement(float acc, float scale, float divisor) {
  if (divisor == 0.f) return 0.f;
  return CombineByScale(scale) ? acc * scale : acc / divisor;
}

// 1 / CombinerDivisor, the factor gradients scale by (and outputs, through
// OutputScale, of bags TF scales); 0 for a zero divisor, as div_no_nan and its gradient give.
CTR_HD float CombinerScale(Combiner c, const BagWeights& w) {
  switch (c) {
    case Combiner::kSum:
      return 1.f;
    case Combiner::kMean:
      return w.sum == 0.f ? 0.f : 1.f / w.sum;
    case Combiner::kSqrtn:
      return w.sum_sq == 0.f ? 0.f : 1.f / sqrtf(w.sum_sq);
  }
  return 1.f;
}

// The factor a bag's output is its sum times, or 0 where it is the sum
// divided by CombinerDivisor (CombineElement then divides). Unweighted, as
// TF's SparseSegmentMean / SqrtN pool: a bag of fewer than 10 ids is
// multiplied by the reciprocal of its count (or of its root) and a longer
// one divided. The two differ by a rounding, which a float16 or bfloat16
// output keeps where it falls on a boundary of the cast. Weighted, as TF's
// composition pools (segment_sum, then div_no_nan by the weight sum): always
// divided. Gradients scale by CombinerScale at any size, as TF's
// SparseSegmentMeanGrad and div_no_nan's gradient do.
CTR_HD float OutputScale(Combiner c, const BagWeights& w, bool weighted) {
  constexpr float kTfDividesFrom = 10.f;
  if (c != Combiner::kSum && (weighted || w.sum >= kTfDividesFrom)) return 0.f;
  return CombinerScale(c, w);
}

// d(loss)/d(w_i) for one entry of a bag, given g.e_i (the clipped row) and
// g.out (the pooled output). Mean: (g.e_i - g.out) / W. Sqrtn: g.e_i / S -
// g.out * w_i / S^2. A zero denominator has a zero gradient (div_no_nan).
CTR_HD float WeightGrad(Combiner c, const BagWeights& bw, float w, float scale,
                        float g_dot_e, float g_dot_out) {
  switch (c) {
    case Combiner::kSum:
      return g_dot_e;
    case Combiner::kMean:
      return bw.sum == 0.f ? 0.f : (g_dot_e - g_dot_out) * scale;
    case Combiner::kSqrtn:
      return bw.sum_sq == 0.f ? 0.f : g_dot_e * scale - g_dot_out * w * scale * scale;
  }
  return 0.f;
}

// Whether the clip's backward is something other than the identity for a
// row of this squared norm. A row of norm exactly max_norm counts (its value
// is unchanged, scaled by 1): tf.clip_by_norm's t * c / max(|t|, c) sends
// the gradient of a tie through |t|, as Maximum's gradient picks its first
// input when the two are equal. A NaN norm (a NaN entry) counts too: t * c
// / max(NaN, c) makes the whole row NaN.
CTR_HD bool ClipIsActive(float squared_norm, float max_norm) {
  const float norm = sqrtf(squared_norm);
  return max_norm > 0.f && !(norm < max_norm);
}

// tf.clip_by_norm(row, max_norm) as a scale on the row: max_norm / max(|row|, max_norm).
// max_norm <= 0 means no clipping.
CTR_HD float MaxNormScale(float squared_norm, float max_norm) {
  return ClipIsActive(squared_norm, max_norm) ? max_norm / sqrtf(squared_norm) : 1.f;
}

// One element of the clip's backward for an active clip, J^T g scaled by
// `scale`: scale * c * (g - x (x.g) / |x|^2) with c = MaxNormScale(|x|^2).
// Shared so the CPU and GPU gradients round identically per element. A row
// whose squared norm overflows float (|x| past about 1.3e19) is scaled by
// c = 0, and so is its gradient, as TF's clip_by_norm gives it; computed,
// x * (x.g) / |x|^2 would be inf / inf there, and 0 * NaN a NaN gradient.
CTR_HD float ClipBackwardElement(float x, float g, float x_dot_g,
                                 float squared_norm, float c, float scale) {
  if (c == 0.f) return 0.f;
  return scale * c * (g - x * x_dot_g / squared_norm);
}

}  // namespace ctr

// 16-bit float storage types the kernels read and write. They are plain bit
// containers with the same layout as Eigen::half / Eigen::bfloat16 (and CUDA's
// __half / __nv_bfloat16), so TF and device buffers can be reinterpreted
// without the core depending on either framework. All math happens in float.
#pragma once

#include <cstdint>
#include <cstring>

#include "cc/core/hd.h"

namespace ctr {

struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

CTR_HD uint32_t FloatBits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
CTR_HD float BitsFloat(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

CTR_HD float ToFloat(float v) { return v; }
// A double stays a double: ToFloat reads an element into the type its table
// is pooled in (AccT below), which is float for every other element type.
CTR_HD double ToFloat(double v) { return v; }
CTR_HD float ToFloat(BFloat16 v) { return BitsFloat(static_cast<uint32_t>(v.bits) << 16); }
CTR_HD float ToFloat(Half v) {
#if defined(__CUDA_ARCH__)
  // One exact conversion instruction: the bit-by-bit path below costs a
  // dozen per element, which made fp16 tables slower to pool than fp32 ones.
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
  return f;
#else
  uint32_t sign = (v.bits & 0x8000u) << 16;
  uint32_t exp = (v.bits >> 10) & 0x1f;
  uint32_t man = v.bits & 0x3ffu;
  if (exp == 0x1f) return BitsFloat(sign | 0x7f800000u | (man << 13));  // inf/nan
  if (exp == 0) {
    if (man == 0) return BitsFloat(sign);
    // Subnormal half: value = man * 2^-24.
    float f = static_cast<float>(man) * 5.9604644775390625e-8f;
    return sign ? -f : f;
  }
  return BitsFloat(sign | ((exp + 112) << 23) | (man << 13));
#endif
}

template <typename T>
CTR_HD T FromFloat(float f);

template <>
CTR_HD float FromFloat<float>(float f) {
  return f;
}

// Round to nearest even, as Eigen::bfloat16 does; NaN stays a quiet NaN.
template <>
CTR_HD BFloat16 FromFloat<BFloat16>(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return BFloat16{static_cast<uint16_t>((u >> 16) | 0x40)};
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return BFloat16{static_cast<uint16_t>((u + rounding) >> 16)};
}

// Round to nearest even, with overflow to inf and gradual underflow.
template <>
CTR_HD Half FromFloat<Half>(float f) {
  uint32_t u = FloatBits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return Half{static_cast<uint16_t>(sign | 0x7e00u)};
  if (a >= 0x477ff000u) return Half{static_cast<uint16_t>(sign | 0x7c00u)};  // rounds to inf
  if (a < 0x38800000u) {
    // Subnormal or zero in half: scale into integer units of 2^-24.
    float mag = BitsFloat(a) * 16777216.f;  // exact: power-of-two scaling
    uint32_t m = static_cast<uint32_t>(mag);
    float rem = mag - static_cast<float>(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return Half{static_cast<uint16_t>(sign | m)};
  }
  uint32_t rounded = a + 0xfffu + ((a >> 13) & 1u);
  return Half{static_cast<uint16_t>(sign | ((rounded - (112u << 23)) >> 13))};
}

// The type rows of a T table are pooled in: float for the 16- and 32-bit
// types (TF pools half types in float32 too), double for double tables.
template <typename T>
struct Accum {
  using type = float;
};
template <>
struct Accum<double> {
  using type = double;
};
template <typename T>
using AccT = typename Accum<T>::type;

// Writes a pooled value back as a T: FromFloat for the float-pooled types.
template <typename T>
CTR_HD T FromAcc(AccT<T> a) {
  return FromFloat<T>(a);
}
template <>
CTR_HD double FromAcc<double>(double a) {
  return a;
}

}  // namespace ctr

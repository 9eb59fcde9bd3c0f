// Token parsing with the exact acceptance rules of tf.strings.to_number(.., int64)
// (TF's safe_strto64): optional surrounding ASCII whitespace, an optional
// '+' or '-' sign, decimal digits only, and overflow is a rejection, not a wrap.
#pragma once

#include <cstdint>

#include "cc/core/hd.h"

namespace ctr {

CTR_HD bool IsAsciiSpace(uint8_t c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' ||
         c == '\r';
}
CTR_HD bool IsAsciiDigit(uint8_t c) { return c >= '0' && c <= '9'; }

// Returns false when TF would reject the token; *out is then unspecified.
CTR_HD bool ParseInt64(const uint8_t* s, int64_t len, int64_t* out) {
  // Fast path for the common token, 1 to 18 plain digits: it cannot overflow,
  // so no range check per digit. Anything else takes the full rules below.
  if (len > 0 && len <= 18) {
    int64_t v = 0;
    int64_t k = 0;
    for (; k < len; ++k) {
      const uint32_t digit = static_cast<uint32_t>(s[k]) - '0';
      if (digit > 9) break;
      v = v * 10 + digit;
    }
    if (k == len) {
      *out = v;
      return true;
    }
  }
  int64_t i = 0;
  while (i < len && IsAsciiSpace(s[i])) ++i;
  bool negative = false;
  if (i < len && (s[i] == '-' || s[i] == '+')) {
    negative = s[i] == '-';
    ++i;
  }
  if (i >= len || !IsAsciiDigit(s[i])) return false;
  // Accumulate as a negative number: its range includes INT64_MIN.
  const int64_t kMin = INT64_MIN;
  int64_t acc = 0;
  while (i < len && IsAsciiDigit(s[i])) {
    int digit = s[i] - '0';
    if (acc < (kMin + digit) / 10) return false;
    acc = acc * 10 - digit;
    ++i;
  }
  while (i < len && IsAsciiSpace(s[i])) ++i;
  if (i != len) return false;
  if (!negative) {
    if (acc == kMin) return false;
    acc = -acc;
  }
  *out = acc;
  return true;
}

// Floor modulo, as tf.math.floormod defines it for a positive divisor.
CTR_HD int64_t FloorMod(int64_t v, int64_t m) {
  int64_t r = v % m;
  return r < 0 ? r + m : r;
}

}  // namespace ctr

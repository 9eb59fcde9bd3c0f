// Fingerprint64 (FarmHash "na" Hash64, seed-free), the function behind
// tf.strings.to_hash_bucket_fast. Our own host/device implementation: buckets
// must be bit-exact with TF, so every constant and branch follows the
// published FarmHash algorithm; tests compare against TF on many lengths.
#pragma once

#include <cstdint>
#include <cstring>

#include "cc/core/hd.h"

#if !defined(__CUDA_ARCH__)
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "Load64 and Load32 read words as little-endian");
#endif

namespace ctr {
namespace fp {

constexpr uint64_t k0 = 0xc3a5c85c97cb3127ULL;
constexpr uint64_t k1 = 0xb492b66fbe98f273ULL;
constexpr uint64_t k2 = 0x9ae16a3b2f90404fULL;

// Little-endian loads at arbitrary byte offsets (token starts in the packed
// buffer). The GPU loads byte by byte, since unaligned word loads fault
// there; the host (x86-64, little-endian) loads the word at once, which the
// compiler did not make of the byte loop.
CTR_HD uint64_t Load64(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
#else
  uint64_t v;
  memcpy(&v, p, sizeof(v));
  return v;
#endif
}
CTR_HD uint64_t Load32(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(p[0]) | (static_cast<uint64_t>(p[1]) << 8) |
         (static_cast<uint64_t>(p[2]) << 16) |
         (static_cast<uint64_t>(p[3]) << 24);
#else
  uint32_t v;
  memcpy(&v, p, sizeof(v));
  return v;
#endif
}
CTR_HD uint64_t Rotate(uint64_t v, int s) {
  return s == 0 ? v : ((v >> s) | (v << (64 - s)));
}
CTR_HD uint64_t ShiftMix(uint64_t v) { return v ^ (v >> 47); }

CTR_HD uint64_t HashLen16(uint64_t u, uint64_t v, uint64_t mul) {
  uint64_t a = (u ^ v) * mul;
  a ^= (a >> 47);
  uint64_t b = (v ^ a) * mul;
  b ^= (b >> 47);
  return b * mul;
}
CTR_HD uint64_t HashLen16(uint64_t u, uint64_t v) {
  return HashLen16(u, v, 0x9ddfea08eb382d69ULL);
}

CTR_HD_HOT uint64_t HashLen0to16(const uint8_t* s, uint64_t len) {
  if (len >= 8) {
    uint64_t mul = k2 + len * 2;
    uint64_t a = Load64(s) + k2;
    uint64_t b = Load64(s + len - 8);
    uint64_t c = Rotate(b, 37) * mul + a;
    uint64_t d = (Rotate(a, 25) + b) * mul;
    return HashLen16(c, d, mul);
  }
  if (len >= 4) {
    uint64_t mul = k2 + len * 2;
    uint64_t a = Load32(s);
    return HashLen16(len + (a << 3), Load32(s + len - 4), mul);
  }
  if (len > 0) {
    uint32_t a = s[0], b = s[len >> 1], c = s[len - 1];
    uint32_t y = a + (b << 8);
    uint32_t z = static_cast<uint32_t>(len) + (c << 2);
    return ShiftMix(y * k2 ^ z * k0) * k2;
  }
  return k2;
}

CTR_HD uint64_t HashLen17to32(const uint8_t* s, uint64_t len) {
  uint64_t mul = k2 + len * 2;
  uint64_t a = Load64(s) * k1;
  uint64_t b = Load64(s + 8);
  uint64_t c = Load64(s + len - 8) * mul;
  uint64_t d = Load64(s + len - 16) * k2;
  return HashLen16(Rotate(a + b, 43) + Rotate(c, 30) + d,
                   a + Rotate(b + k2, 18) + c, mul);
}

CTR_HD uint64_t HashLen33to64(const uint8_t* s, uint64_t len) {
  uint64_t mul = k2 + len * 2;
  uint64_t a = Load64(s) * k2;
  uint64_t b = Load64(s + 8);
  uint64_t c = Load64(s + len - 8) * mul;
  uint64_t d = Load64(s + len - 16) * k2;
  uint64_t y = Rotate(a + b, 43) + Rotate(c, 30) + d;
  uint64_t z = HashLen16(y, a + Rotate(b + k2, 18) + c, mul);
  uint64_t e = Load64(s + 16) * mul;
  uint64_t f = Load64(s + 24);
  uint64_t g = (y + Load64(s + len - 32)) * mul;
  uint64_t h = (z + Load64(s + len - 24)) * mul;
  return HashLen16(Rotate(e + f, 43) + Rotate(g, 30) + h,
                   e + Rotate(f + a, 18) + g, mul);
}

struct Pair {
  uint64_t first, second;
};

CTR_HD Pair WeakHashLen32WithSeeds(const uint8_t* s, uint64_t a, uint64_t b) {
  uint64_t w = Load64(s), x = Load64(s + 8), y = Load64(s + 16),
           z = Load64(s + 24);
  a += w;
  b = Rotate(b + a + z, 21);
  uint64_t c = a;
  a += x;
  a += y;
  b += Rotate(a, 44);
  return Pair{a + z, b + c};
}

// Tokens longer than 16 bytes: rare in CTR features.
CTR_HD_COLD uint64_t Fingerprint64Long(const uint8_t* s, uint64_t len) {
  if (len <= 32) return HashLen17to32(s, len);
  if (len <= 64) return HashLen33to64(s, len);

  const uint64_t seed = 81;
  uint64_t x = seed;
  uint64_t y = seed * k1 + 113;
  uint64_t z = ShiftMix(y * k2 + 113) * k2;
  Pair v{0, 0}, w{0, 0};
  x = x * k2 + Load64(s);

  const uint8_t* end = s + ((len - 1) / 64) * 64;
  const uint8_t* last64 = end + ((len - 1) & 63) - 63;
  do {
    x = Rotate(x + y + v.first + Load64(s + 8), 37) * k1;
    y = Rotate(y + v.second + Load64(s + 48), 42) * k1;
    x ^= w.second;
    y += v.first + Load64(s + 40);
    z = Rotate(z + w.first, 33) * k1;
    v = WeakHashLen32WithSeeds(s, v.second * k1, x + w.first);
    w = WeakHashLen32WithSeeds(s + 32, z + w.second, y + Load64(s + 16));
    uint64_t t = z;
    z = x;
    x = t;
    s += 64;
  } while (s != end);
  uint64_t mul = k1 + ((z & 0xff) << 1);
  s = last64;
  w.first += ((len - 1) & 63);
  v.first += w.first;
  w.first += v.first;
  x = Rotate(x + y + v.first + Load64(s + 8), 37) * mul;
  y = Rotate(y + v.second + Load64(s + 48), 42) * mul;
  x ^= w.second * 9;
  y += v.first * 9 + Load64(s + 40);
  z = Rotate(z + w.first, 33) * mul;
  v = WeakHashLen32WithSeeds(s, v.second * mul, x + w.first);
  w = WeakHashLen32WithSeeds(s + 32, z + w.second, y + Load64(s + 16));
  uint64_t t = z;
  z = x;
  x = t;
  return HashLen16(HashLen16(v.first, w.first, mul) + ShiftMix(y) * k0 + z,
                   HashLen16(v.second, w.second, mul) + x, mul);
}

CTR_HD_HOT uint64_t Fingerprint64(const uint8_t* s, uint64_t len) {
  return len <= 16 ? HashLen0to16(s, len) : Fingerprint64Long(s, len);
}

}  // namespace fp

// Writes the decimal form of v, exactly as tf.strings.as_string prints an
// integer, into buf (>= 20 bytes) and returns its length. Integer keys are
// hashed through this so no string tensor is ever materialized.
CTR_HD int FormatInt64(int64_t v, uint8_t* buf) {
  // Work in unsigned so INT64_MIN does not overflow when negated.
  uint64_t mag = v < 0 ? (~static_cast<uint64_t>(v) + 1) : static_cast<uint64_t>(v);
  uint8_t tmp[20];
  int n = 0;
  do {
    tmp[n++] = static_cast<uint8_t>('0' + mag % 10);
    mag /= 10;
  } while (mag != 0);
  int len = 0;
  if (v < 0) buf[len++] = '-';
  while (n > 0) buf[len++] = tmp[--n];
  return len;
}

}  // namespace ctr

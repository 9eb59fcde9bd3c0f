// The two string hashes TF buckets keys with, as one host/device choice:
// Fingerprint64 (tf.strings.to_hash_bucket_fast, the Hashing layer and hashed
// feature columns) and, with a 128-bit key, SipHash-2-4
// (tf.strings.to_hash_bucket_strong, the Hashing layer with a salt). TF's
// StrongKeyedHash is highwayhash's SipHashState: standard SipHash-2-4 with a
// 64-bit result, written here from the published algorithm; tests compare it
// with TF's op on every length up to several words.
#pragma once

#include <cstdint>
#include <string>

#include "cc/core/fingerprint.h"
#include "cc/core/hd.h"

namespace ctr {
namespace sip {

CTR_HD uint64_t Rotl(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

struct State {
  uint64_t v0, v1, v2, v3;
};

CTR_HD void Round(State* s) {
  s->v0 += s->v1;
  s->v1 = Rotl(s->v1, 13) ^ s->v0;
  s->v0 = Rotl(s->v0, 32);
  s->v2 += s->v3;
  s->v3 = Rotl(s->v3, 16) ^ s->v2;
  s->v0 += s->v3;
  s->v3 = Rotl(s->v3, 21) ^ s->v0;
  s->v2 += s->v1;
  s->v1 = Rotl(s->v1, 17) ^ s->v2;
  s->v2 = Rotl(s->v2, 32);
}

// Two compression rounds per 8-byte word: the "2" of SipHash-2-4.
CTR_HD void Absorb(State* s, uint64_t word) {
  s->v3 ^= word;
  Round(s);
  Round(s);
  s->v0 ^= word;
}

CTR_HD uint64_t SipHash24(uint64_t k0, uint64_t k1, const uint8_t* p, uint64_t len) {
  State s{k0 ^ 0x736f6d6570736575ULL, k1 ^ 0x646f72616e646f6dULL, k0 ^ 0x6c7967656e657261ULL,
          k1 ^ 0x7465646279746573ULL};
  const uint64_t whole = len & ~uint64_t{7};
  for (uint64_t i = 0; i < whole; i += 8) Absorb(&s, fp::Load64(p + i));
  // The last word: the tail bytes, little-endian, and the length mod 256 in
  // its top byte.
  uint64_t last = len << 56;
  for (uint64_t i = whole; i < len; ++i) last |= static_cast<uint64_t>(p[i]) << (8 * (i - whole));
  Absorb(&s, last);
  s.v2 ^= 0xff;
  for (int r = 0; r < 4; ++r) Round(&s);
  return s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
}

}  // namespace sip

// Which hash buckets a string: keyed (to_hash_bucket_strong's `key`, two
// words) or not (to_hash_bucket_fast). Held by value in the specs, so a CUDA
// kernel takes it as a plain parameter.
struct StringHash {
  bool keyed = false;
  uint64_t key[2] = {0, 0};
};

CTR_HD_HOT int64_t HashBucket(const StringHash& h, const uint8_t* s, uint64_t len, int64_t buckets) {
  const uint64_t hash = h.keyed ? sip::SipHash24(h.key[0], h.key[1], s, len) : fp::Fingerprint64(s, len);
  return static_cast<int64_t>(hash % static_cast<uint64_t>(buckets));
}

// An integer key hashed as its decimal string (the Hashing layer on
// integers: AsString, then the string hash), with no string tensor.
CTR_HD int64_t HashIntKeyBucket(const StringHash& h, int64_t key, int64_t buckets) {
  uint8_t buf[20];
  const int len = FormatInt64(key, buf);
  return HashBucket(h, buf, static_cast<uint64_t>(len), buckets);
}

// The `hash_key` attribute: empty (the fast hash) or TF's two key words;
// empty on success, else why not.
template <typename Ints>
std::string SetHashKey(const Ints& key, StringHash* h) {
  if (key.empty()) {
    *h = StringHash{};
    return "";
  }
  if (key.size() != 2) return "hash_key must be empty or hold 2 integers, got " + std::to_string(key.size());
  h->keyed = true;
  h->key[0] = static_cast<uint64_t>(key[0]);
  h->key[1] = static_cast<uint64_t>(key[1]);
  return "";
}

}  // namespace ctr

// Feature crosses as tf.sparse.cross_hashed (SparseCross with hashed_output)
// computes them: each feature of a cross is a 64-bit value (Fingerprint64 of
// a string, the bits of an int64 as they are), the features are chained into
// the hash key with FingerprintCat64 in column order, and the chain is taken
// modulo the bucket count. Shared by every kernel that crosses, so a crossed
// id is bit-exact with TF's wherever it is computed.
#pragma once

#include <cstdint>
#include <limits>

#include "cc/core/fingerprint.h"
#include "cc/core/hd.h"

namespace ctr {

// TF's FingerprintCat64 (tensorflow/core/platform/fingerprint.h): an
// order-dependent combination of two fingerprints.
CTR_HD uint64_t FingerprintCat64(uint64_t fp1, uint64_t fp2) {
  constexpr uint64_t kMul = 0xc6a4a7935bd1e995ULL;
  uint64_t result = fp1 ^ kMul;
  result ^= fp::ShiftMix(fp2 * kMul) * kMul;
  result *= kMul;
  result = fp::ShiftMix(result) * kMul;
  return fp::ShiftMix(result);
}

// One feature of a cross: strings by their fingerprint, integers as they are.
CTR_HD uint64_t CrossFeature(const uint8_t* s, uint64_t len) { return fp::Fingerprint64(s, len); }
CTR_HD uint64_t CrossFeature(int64_t v) { return static_cast<uint64_t>(v); }

// The id of a chained cross: modulo the buckets, or (buckets == 0) modulo
// INT64_MAX so it is never negative, as SparseCross does.
CTR_HD int64_t CrossBucket(uint64_t chained, int64_t buckets) {
  const uint64_t mod = buckets > 0 ? static_cast<uint64_t>(buckets)
                                   : static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  return static_cast<int64_t>(chained % mod);
}

}  // namespace ctr

// One 64-bit mixer for every power-of-two table of integer keys in cc/core.
#pragma once

#include <cstdint>

#include "cc/core/hd.h"

namespace ctr {

// SplitMix64's finalizer: ids are often consecutive or strided, which would
// cluster in a power-of-two table unmixed.
CTR_HD uint64_t MixKey(uint64_t key) {
  key ^= key >> 30;
  key *= 0xbf58476d1ce4e5b9ULL;
  key ^= key >> 27;
  key *= 0x94d049bb133111ebULL;
  key ^= key >> 31;
  return key;
}

}  // namespace ctr

// The row a vocabulary id reads (CtrVocabEmbedding), and Keras' slot for a
// key out of the vocabulary: the host/device rules.
#pragma once

#include <cstdint>

#include "cc/core/hd.h"

namespace ctr {

// The row `id` reads in a table of `rows` rows, or -1 when it reads none.
// With wrap_negative, a negative id counts from the end, as keras.ops.take
// (a Keras Embedding's gather) does.
CTR_HD int64_t VocabRow(int64_t id, int64_t rows, bool wrap_negative) {
  if (wrap_negative && id < 0) id += rows;
  return id >= 0 && id < rows ? id : -1;
}

// The out-of-vocabulary slot of an integer key among `slots` (IntegerLookup
// with num_oov_indices > 1): tf.math.floormod(key, slots), in [0, slots) for
// negative keys too.
CTR_HD int64_t FloorModSlot(int64_t key, int64_t slots) {
  const int64_t r = key % slots;
  return r < 0 ? r + slots : r;
}

}  // namespace ctr

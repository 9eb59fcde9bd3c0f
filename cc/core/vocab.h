// The row a vocabulary id reads (CtrVocabEmbedding): the host/device rule.
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

}  // namespace ctr

// The `layout` attr of the ops that write a concatenation of column blocks
// (CtrConcatVocabEmbedding, CtrMultiHotDense): the order of the blocks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"

namespace tf_ctr {

// Reads `layout` into *layout: a permutation of [0, blocks), or, when empty,
// the blocks in input order.
inline absl::Status ReadBlockLayout(tensorflow::OpKernelConstruction* c, int blocks, std::vector<int64_t>* layout) {
  TF_RETURN_IF_ERROR(c->GetAttr("layout", layout));
  if (layout->empty())
    for (int b = 0; b < blocks; ++b) layout->push_back(b);
  std::vector<int64_t> sorted = *layout;
  std::sort(sorted.begin(), sorted.end());
  bool permutation = static_cast<int>(sorted.size()) == blocks;
  for (size_t b = 0; permutation && b < sorted.size(); ++b) permutation = sorted[b] == static_cast<int64_t>(b);
  if (permutation) return absl::OkStatus();
  return tensorflow::errors::InvalidArgument("layout must order the ", blocks, " column blocks, each once");
}

// The concatenation's width so far plus one block's: an overflow (blocks of
// tables [0, 2^62] have no element but that width) is an error, not a
// negative width for TensorShape to abort on.
inline absl::Status AddBlockWidth(int64_t block, int64_t* width) {
  if (__builtin_add_overflow(*width, block, width))
    return tensorflow::errors::InvalidArgument("the concatenated width overflows int64 at a block of width ", block);
  return absl::OkStatus();
}

}  // namespace tf_ctr

// String tensors read where they are: the runs of tstrings that CtrPackStrings
// packs, and that the CPU concatenated op reads in place (cc/kernels).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_ctr {

// Copies one string's bytes: short ones (most CTR tokens) without a libc
// call per string, as two overlapping word copies that read and write only
// [0, n); a byte loop cost a branch per byte.
inline void CopyString(const tensorflow::tstring& from, uint8_t* to) {
  const size_t n = from.size();
  const char* p = from.data();
  if (n >= 8 && n <= 16) {
    uint64_t head, tail;
    std::memcpy(&head, p, 8);
    std::memcpy(&tail, p + n - 8, 8);
    std::memcpy(to, &head, 8);
    std::memcpy(to + n - 8, &tail, 8);
  } else if (n >= 4 && n < 8) {
    uint32_t head, tail;
    std::memcpy(&head, p, 4);
    std::memcpy(&tail, p + n - 4, 4);
    std::memcpy(to, &head, 4);
    std::memcpy(to + n - 4, &tail, 4);
  } else if (n < 4) {
    for (size_t b = 0; b < n; ++b) to[b] = static_cast<uint8_t>(p[b]);
  } else {
    std::memcpy(to, p, n);
  }
}

// Strings one after another: count of them, stride apart from base (an input
// vector, or one column of a [B, C] matrix).
struct StringRun {
  const tensorflow::tstring* base;
  int64_t count;
  int64_t stride;
  const tensorflow::tstring& operator[](int64_t j) const { return base[j * stride]; }
  // The core's whole-string accessor (ctr::PackedStringsAt's interface): a
  // token's bytes are described from data(row) + begin, so offset is 0.
  const uint8_t* data(int64_t r) const { return reinterpret_cast<const uint8_t*>((*this)[r].data()); }
  int64_t size(int64_t r) const { return static_cast<int64_t>((*this)[r].size()); }
  int64_t offset(int64_t) const { return 0; }
};

// One run per input tensor (row-major). equal_sizes: every input must hold as
// many strings as the first. `op` names the op in errors.
inline absl::Status InputStringRuns(const tensorflow::OpInputList& inputs, bool equal_sizes, const std::string& op,
                                    std::vector<StringRun>* runs) {
  for (int i = 0; i < inputs.size(); ++i) {
    const tensorflow::Tensor& in = inputs[i];
    // A grouped op would split mismatched features at the wrong rows.
    if (equal_sizes && in.NumElements() != inputs[0].NumElements())
      return tensorflow::errors::InvalidArgument(op, ": grouped features must share one batch size, but feature ", i,
                                                 " holds ", in.NumElements(), " strings where feature 0 holds ",
                                                 inputs[0].NumElements());
    runs->push_back({in.flat<tensorflow::tstring>().data(), in.NumElements(), 1});  // flat() checks the dtype
  }
  return absl::OkStatus();
}

// One run per listed column of the one [B, C] input matrix.
inline absl::Status ColumnStringRuns(const tensorflow::OpInputList& inputs, const std::vector<int64_t>& columns,
                                     const std::string& op, std::vector<StringRun>* runs) {
  if (inputs.size() != 1 || inputs[0].dims() != 2)
    return tensorflow::errors::InvalidArgument(op, " with columns takes one [B, C] matrix of strings, got ",
                                               inputs.size(), " input(s) of shape ", inputs[0].shape().DebugString());
  const tensorflow::Tensor& m = inputs[0];
  const int64_t rows = m.dim_size(0), cols = m.dim_size(1);
  for (const int64_t c : columns) {
    // The slice x[:, c] it stands for fails the same way.
    if (c < 0 || c >= cols)
      return tensorflow::errors::InvalidArgument(op, ": column ", c, " is outside the input's ", cols,
                                                 " columns (shape ", m.shape().DebugString(), ")");
    const tensorflow::tstring* data = m.flat<tensorflow::tstring>().data();
    runs->push_back({rows > 0 ? data + c : data, rows, cols});
  }
  return absl::OkStatus();
}

}  // namespace tf_ctr

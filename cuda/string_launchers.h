// Host-side entry points of the CUDA string-embedding kernels. Plain C++ (no
// CUDA or TF headers); raw device pointers and a cudaStream_t passed as void*.
// Return "" on success, else a CUDA error message.
#pragma once

#include <cstdint>
#include <string>

#include "cc/core/strings.h"

namespace ctr {
namespace gpu {

// d_status layout for string kernels: int64[5] = the TokenError fields
// {row, begin, len, value, kind}; row -1 means no error.
constexpr int kTokenStatusSize = 5;
std::string InitTokenStatus(int64_t* d_status, void* stream);

// Copies the first min(len, max_bytes) bytes of the token a TokenError status
// names (d_status[1] its offset in `bytes`, d_status[2] its length) into
// d_out, when there is one: an op that reads the status back later has the
// token for its message without a second read.
std::string CaptureTokenBytes(const int64_t* d_status, const uint8_t* bytes, int64_t max_bytes, uint8_t* d_out,
                              void* stream);

// Reads a token status back (h_status[kTokenStatusSize]) with the first
// max_bytes bytes of the token it names (h_bytes), captured on the device by
// CaptureTokenBytes as the op kernels capture them; synchronizes.
std::string ReadTokenStatus(const int64_t* d_status, const uint8_t* bytes, int64_t max_bytes, int64_t* h_status,
                            uint8_t* h_bytes, void* stream);

// out[num_bags, dim] = pooled tokens of each bag. Bags are single strings when
// bag_splits is null, else strings [bag_splits[r], bag_splits[r+1]).
// string_splits are absolute byte offsets into `bytes` (validated by caller).
template <typename T>
std::string StringEmbedding(const StringSpec& spec, const T* params, const uint8_t* bytes,
                            const int64_t* string_splits, const int64_t* bag_splits,
                            int64_t num_bags, T* out, int64_t* d_status, void* stream);

// One launch for many features: feature f owns strings [first_string,
// first_string + num_strings) of string_splits (num_strings <= batch), table
// params, and bag r's output row out + r * out_stride for r < out_rows. Bags
// past out_rows (a trimmed feature's empty tail) are still split, so a bad
// token there is reported, but written nowhere. The grouped op's features are
// first_string = f * batch, num_strings = out_rows = batch, out_stride = dim;
// the concatenated op's share one output, each at its own columns.
struct FeatureDesc {
  StringSpec spec;
  const void* params;
  void* out;
  int64_t first_string;
  int64_t num_strings;
  int64_t out_rows;
  int64_t out_stride;
};
// h_features: host array of num_features; d_features: device scratch of the
// same size that the launcher fills (one small host-to-device copy).
template <typename T>
std::string MultiStringEmbedding(const FeatureDesc* h_features, FeatureDesc* d_features,
                                 int64_t num_features, int64_t batch, const uint8_t* bytes,
                                 const int64_t* string_splits, int64_t* d_status, void* stream);

// Gradient: counts[num_bags] of gradient rows (tokens, or 1 for an empty bag
// with a default row), then ctr::gpu::ExclusiveScan (lookup_launchers.h), then
// the rows, which leave bad tokens out. With a token status (InitTokenStatus
// first) the counts record the first token the forward pass would reject, as
// StringEmbedding does; null only counts.
std::string StringGradRowCounts(const StringSpec& spec, const uint8_t* bytes,
                                const int64_t* string_splits, const int64_t* bag_splits,
                                int64_t num_bags, int64_t* counts, int64_t* d_status, void* stream);
template <typename T>
std::string StringGrad(const StringSpec& spec, const T* params, const uint8_t* bytes,
                       const int64_t* string_splits, const int64_t* bag_splits, int64_t num_bags,
                       const T* grad_out, const int64_t* grad_offsets, T* grad_values,
                       int64_t* grad_indices, void* stream);

}  // namespace gpu
}  // namespace ctr

// Bag boundaries. Callers hand bags either as ragged row_splits or as the
// sorted row ids of a SparseTensor; kernels work on CSR offsets.
#pragma once

#include <cstdint>
#include <string>

namespace ctr {

// Empty string on success, else what is wrong; `name` is the splits' and
// `counted` what they split (bag_splits split strings, not ids).
template <typename TSeg>
std::string ValidateRowSplits(const TSeg* splits, int64_t num_splits, int64_t nnz,
                              const std::string& name = "row_splits", const char* counted = "ids") {
  if (num_splits < 1) return name + " must have at least one element";
  if (splits[0] != 0) return name + "[0] must be 0, got " + std::to_string(static_cast<int64_t>(splits[0]));
  for (int64_t i = 1; i < num_splits; ++i) {
    if (splits[i] < splits[i - 1])
      return name + " must be non-decreasing: " + name + "[" + std::to_string(i) + "] = " +
             std::to_string(static_cast<int64_t>(splits[i])) + " < " + name + "[" + std::to_string(i - 1) +
             "] = " + std::to_string(static_cast<int64_t>(splits[i - 1]));
  }
  if (splits[num_splits - 1] != nnz)
    return name + "[-1] = " + std::to_string(static_cast<int64_t>(splits[num_splits - 1])) +
           " does not match the number of " + counted + " " + std::to_string(nnz);
  return "";
}

// Number of bags implied by sorted row ids when the caller gives none
// (num_rows < 0): last row id + 1, as tf.math.segment_sum does.
template <typename TSeg>
int64_t InferNumRows(const TSeg* row_ids, int64_t nnz, int64_t num_rows) {
  if (num_rows >= 0) return num_rows;
  return nnz == 0 ? 0 : static_cast<int64_t>(row_ids[nnz - 1]) + 1;
}

// Converts sorted row ids to CSR offsets[num_rows + 1], validating order and range.
template <typename TSeg>
std::string RowIdsToOffsets(const TSeg* row_ids, int64_t nnz, int64_t num_rows,
                            int64_t* offsets) {
  int64_t prev = 0;
  int64_t next_row = 0;  // first row whose start offset is not yet written
  for (int64_t i = 0; i < nnz; ++i) {
    const int64_t r = static_cast<int64_t>(row_ids[i]);
    if (r < 0 || r >= num_rows)
      return "row id " + std::to_string(r) + " of entry " + std::to_string(i) +
             " is out of range [0, " + std::to_string(num_rows) + ")";
    if (r < prev)
      return "row ids must be sorted: entry " + std::to_string(i) + " has row " +
             std::to_string(r) + " after row " + std::to_string(prev);
    while (next_row <= r) offsets[next_row++] = i;
    prev = r;
  }
  while (next_row <= num_rows) offsets[next_row++] = nnz;
  return "";
}

// Messages for the {entry index, value} status the GPU conversions report
// (cuda/lookup_launchers.h). Same text as the checks above wherever the
// status holds enough to say it; an unsorted id or split is reported without
// its predecessor's value, which the status does not carry.
inline std::string DescribeRowIdError(int64_t entry, int64_t row, int64_t num_rows) {
  if (row < 0 || row >= num_rows)
    return "row id " + std::to_string(row) + " of entry " + std::to_string(entry) +
           " is out of range [0, " + std::to_string(num_rows) + ")";
  return "row ids must be sorted: entry " + std::to_string(entry) + " has row " +
         std::to_string(row) + " after a larger row";
}

inline std::string DescribeSplitError(int64_t entry, int64_t value, int64_t num_splits,
                                      int64_t nnz) {
  if (entry == 0 && value != 0) return "row_splits[0] must be 0, got " + std::to_string(value);
  if (entry == num_splits - 1 && value != nnz)
    return "row_splits[-1] = " + std::to_string(value) +
           " does not match the number of ids " + std::to_string(nnz);
  return "row_splits must be non-decreasing: row_splits[" + std::to_string(entry) + "] = " +
         std::to_string(value) + " is smaller than row_splits[" + std::to_string(entry - 1) + "]";
}

template <typename TSeg>
void CopySplits(const TSeg* splits, int64_t n, int64_t* offsets) {
  for (int64_t i = 0; i < n; ++i) offsets[i] = static_cast<int64_t>(splits[i]);
}

}  // namespace ctr

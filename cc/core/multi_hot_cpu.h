// A Dense layer's product with one row of a multi-hot (or count) encoding,
// without building the encoding: the kernel rows the row's ids name. Shared
// by CtrVocabMultiHot and CtrMultiHotDense. Host only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace ctr {

// Adds count(i) * kernel[i] to out[0, units) for each distinct id i of
// ids[0, n) below `depth` (count 1 when `binary`), in increasing id order:
// MatMul's dot product runs over the encoding's columns in that order, and
// its zero columns add nothing. Ids >= depth count for nothing, as
// DenseBincount(size=depth) drops them, and so do negative ids, as OneHot
// drops them (DenseBincount rejects them: its callers check first).
// `sorted` is the caller's scratch, reused across rows.
template <typename T, typename Id>
void AddMultiHotRow(const Id* ids, int64_t n, int64_t depth, bool binary, const T* kernel, int64_t units, T* out,
                    std::vector<int64_t>* sorted) {
  sorted->assign(ids, ids + n);
  std::sort(sorted->begin(), sorted->end());
  for (int64_t j = 0; j < n;) {
    const int64_t id = (*sorted)[j];
    int64_t count = 1;
    while (j + count < n && (*sorted)[j + count] == id) ++count;
    j += count;
    if (id < 0) continue;
    if (id >= depth) return;  // sorted: the rest are dropped too
    const T* row = kernel + id * units;
    const T times = binary ? T(1) : static_cast<T>(count);
    for (int64_t u = 0; u < units; ++u) out[u] += times * row[u];
  }
}

// Adds the kernel rows of `columns` one-hot encodings of `depth` side by
// side (the [B, S, depth] OneHot of [B, S] ids reshaped to [B, S * depth]):
// column s's id i in [0, depth) names row s * depth + i, in column order;
// any other id names none, as OneHot gives it zeros.
template <typename T, typename Id>
void AddOneHotColumnsRow(const Id* ids, int64_t columns, int64_t depth, const T* kernel, int64_t units, T* out) {
  for (int64_t s = 0; s < columns; ++s) {
    const int64_t id = static_cast<int64_t>(ids[s]);
    if (id < 0 || id >= depth) continue;
    const T* row = kernel + (s * depth + id) * units;
    for (int64_t u = 0; u < units; ++u) out[u] += row[u];
  }
}

}  // namespace ctr

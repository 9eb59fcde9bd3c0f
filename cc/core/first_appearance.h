// Numbers table rows in order of first appearance, as TF's Unique does: the
// slot of a row is how many distinct rows came before its first occurrence.
// A gradient merges its rows through this once per call, serially, so the
// map is a flat open-addressing table (one cache line per probe, sized once
// for the call, at most half full, its probes prefetched) rather than a
// general hash map, which spent three times as long on the random rows of a
// large table. Host only.
#pragma once

#include <cstdint>
#include <vector>

#include "cc/core/mix.h"

namespace ctr {

class FirstAppearance {
 public:
  // For at most max_rows occurrences (distinct or not).
  explicit FirstAppearance(int64_t max_rows) {
    int64_t capacity = 2;
    while (capacity < 2 * max_rows) capacity *= 2;
    mask_ = static_cast<uint64_t>(capacity - 1);
    entries_.assign(static_cast<size_t>(capacity), Entry{kEmpty, 0});
    rows_.reserve(static_cast<size_t>(max_rows));
  }

  // slots[i] = the slot of rows[i] (each >= 0), numbering rows in order.
  // The probes of a large table miss the cache; the entry of the row a few
  // steps ahead is fetched while this one is placed.
  void Number(const int64_t* rows, int64_t n, int64_t* slots) {
    constexpr int64_t kAhead = 16;
    for (int64_t i = 0; i < n; ++i) {
      if (i + kAhead < n) __builtin_prefetch(&entries_[Home(rows[i + kAhead])], 1);
      slots[i] = SlotOf(rows[i]);
    }
  }

  // The slot of `row` (>= 0), numbering it if it is new.
  int64_t SlotOf(int64_t row) {
    uint64_t i = Home(row);
    while (entries_[i].row != row && entries_[i].row != kEmpty) i = (i + 1) & mask_;
    Entry& e = entries_[i];
    if (e.row == kEmpty) {
      e = Entry{row, static_cast<int64_t>(rows_.size())};
      rows_.push_back(row);
    }
    return e.slot;
  }

  // The distinct rows, slot by slot.
  const std::vector<int64_t>& rows() const { return rows_; }

 private:
  static constexpr int64_t kEmpty = -1;  // table rows are never negative
  uint64_t Home(int64_t row) const { return MixKey(static_cast<uint64_t>(row)) & mask_; }
  struct Entry {
    int64_t row;
    int64_t slot;
  };
  uint64_t mask_ = 0;
  std::vector<Entry> entries_;
  std::vector<int64_t> rows_;
};

}  // namespace ctr

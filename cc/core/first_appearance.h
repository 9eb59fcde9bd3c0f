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

  // Fetches the entry of `row` ahead of its SlotOf, as Number does.
  void Prefetch(int64_t row) const { __builtin_prefetch(&entries_[Home(row)], 1); }

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

// The de-duplication of a lookup of a table in shards, in the order TF's
// own lookups list the rows: the kept entries of the bags (CSR `offsets`,
// entries in bag order) numbered by first appearance, idx[e] = the slot of
// entry e or -1 where kept(e) is false. With a fill id (>= 0), as TF's safe
// lookup lists the id sparse_fill_empty_rows puts in an empty bag: numbered
// where the first bag with no kept entry begins. Returns the fill's slot, or
// -1 where no bag is left empty (or there is no fill).
template <typename Kept>
int64_t NumberKeptEntries(const int64_t* ids, const int64_t* offsets, int64_t bags, Kept kept, int64_t fill_id,
                          FirstAppearance* slots, int64_t* idx) {
  const int64_t n = offsets[bags];
  int64_t fill_at = n + 1;  // past every entry: no fill
  for (int64_t b = 0; fill_id >= 0 && b < bags && fill_at > n; ++b) {
    int64_t e = offsets[b];
    while (e < offsets[b + 1] && !kept(e)) ++e;  // a bag's first kept entry ends its scan
    if (e == offsets[b + 1]) fill_at = offsets[b];
  }
  int64_t fill_slot = -1;
  constexpr int64_t kAhead = 16;
  for (int64_t e = 0; e <= n; ++e) {
    if (e + kAhead < n) slots->Prefetch(ids[e + kAhead]);
    if (e == fill_at) fill_slot = slots->SlotOf(fill_id);
    if (e < n) idx[e] = kept(e) ? slots->SlotOf(ids[e]) : -1;
  }
  return fill_slot;
}

}  // namespace ctr

// Key-to-row hash table (CtrHashTableFind): the layout and the per-key rules,
// host/device so that a GPU kernel can probe the same table the CPU builds.
//
// The whole table is one int64 tensor of shape [kHeaderRows + S + F, kColumns],
// held in an ordinary variable so that checkpoints, SavedModels, tf.distribute
// and serving see plain tensors and need no custom resource:
//   header (kHeaderRows rows, cells named by HeaderCell);
//   S rows of slots, S a power of two >= 2, linear probing: read flat, the
//     first 2S cells are each slot's (key, entry), what a find reads, and the
//     next 2S its (last_seen, count), which only inserting calls touch; kept
//     apart so that a find's cache lines hold keys only;
//   F = FreeListRows(capacity) rows holding the stack of rows freed by eviction.
// An entry >= 0 is the key's row of the value matrix. kEmptyEntry marks a
// free slot, so every int64 value is a valid key. An entry <= -2 is a key
// seen -entry - 1 times that the admission filter has not let in yet.
// last_seen is the inserting call that last saw the key (the header's clock),
// count how many times inserting calls saw it: the LRU and LFU scores.
#pragma once

#include <cstdint>

#include "cc/core/hd.h"
#include "cc/core/mix.h"

namespace ctr {

constexpr int64_t kColumns = 4;
constexpr int64_t kHeaderRows = 2;
constexpr int64_t kEmptyEntry = -1;
constexpr int64_t kNoRow = -1;

enum HeaderCell : int64_t {
  kNextRow = 0,     // rows handed out from the never-used ones
  kOccupied = 1,    // slots holding a key (with a row or waiting for admission)
  kDropped = 2,     // keys refused a row or a slot because the table was full
  kEvicted = 3,     // keys evicted to make room
  kFreeCount = 4,   // rows on the free stack
  kClock = 5,       // inserting calls so far
  kKeyKind = 6,     // 1: int64 keys, 2: string fingerprints, 0: unknown; written and
                    // read by Python only, so that a restore refuses the other kind
};

// Cells of a slot's pair (key, entry) and of its stats (last_seen, count).
enum PairCell : int64_t { kKey = 0, kEntry = 1 };
enum StatsCell : int64_t { kLastSeen = 0, kCount = 1 };

// A table's slots: pairs [S, 2] and stats [S, 2], laid out as described above.
struct Slots {
  int64_t* pairs;
  int64_t* stats;
  int64_t num_slots;
};
CTR_HD Slots SlotsOf(int64_t* first_slot_row, int64_t num_slots) {
  return {first_slot_row, first_slot_row + 2 * num_slots, num_slots};
}

// Rounded up without capacity + kColumns - 1, which overflows near INT64_MAX.
CTR_HD int64_t FreeListRows(int64_t capacity) { return capacity / kColumns + (capacity % kColumns != 0); }

// A table tensor's parts (ViewTable in hash_table_cpu.h cuts them).
struct TableView {
  int64_t* header = nullptr;
  Slots slots{};
  int64_t* free_rows = nullptr;
};

// Whether a header's counts fit a table of `capacity` rows and num_slots
// slots. The header indexes the free stack, so inserts into a table assigned
// garbage must not start until this holds.
CTR_HD bool HeaderFits(const int64_t* h, int64_t capacity, int64_t num_slots) {
  // The clock must still be able to advance: an inserting call adds 1.
  return h[kNextRow] >= 0 && h[kNextRow] <= capacity && h[kFreeCount] >= 0 && h[kFreeCount] <= h[kNextRow] &&
         h[kOccupied] >= 0 && h[kOccupied] <= num_slots && h[kClock] >= 0 && h[kClock] < INT64_MAX;
}

// The stack position of the first of the rows an inserting call may take off
// the free stack (its top `pops`) that is outside [0, capacity), else -1.
// Rows come off the stack as they are, so a table assigned garbage is refused
// before any key gets a row outside the values. A call takes at most one row
// per missing sighting, and rows its evictions push go on top, so the top
// min(free count, missing sightings) rows are all it can reach.
CTR_HD int64_t FirstBadFreeRow(const TableView& t, int64_t capacity, int64_t pops) {
  const int64_t top = t.header[kFreeCount];
  for (int64_t i = top - 1; i >= 0 && i >= top - pops; --i) {
    if (t.free_rows[i] < 0 || t.free_rows[i] >= capacity) return i;
  }
  return -1;
}

// Slots are claimed only while under 3/4 of them are occupied, and never the
// last empty one (2 slots, a capacity of 1, would otherwise fill: keys waiting
// for admission claim slots too), so a probe always ends at an empty slot,
// after a few steps on average.
CTR_HD int64_t ClaimableSlots(int64_t num_slots) { return num_slots - (num_slots >= 4 ? num_slots / 4 : 1); }
CTR_HD bool CanClaimSlot(int64_t occupied, int64_t num_slots) { return occupied < ClaimableSlots(num_slots); }

CTR_HD int64_t* PairAt(int64_t* pairs, int64_t s) { return pairs + 2 * s; }
CTR_HD const int64_t* PairAt(const int64_t* pairs, int64_t s) { return pairs + 2 * s; }
CTR_HD int64_t* StatsAt(const Slots& t, int64_t s) { return t.stats + 2 * s; }

// Where the probe for `key` starts.
CTR_HD int64_t HomeSlot(int64_t key, int64_t num_slots) {
  return static_cast<int64_t>(MixKey(static_cast<uint64_t>(key)) & (static_cast<uint64_t>(num_slots) - 1));
}

// The slot holding `key`, else the empty slot where it would go, probing from
// `home` through the slots' pairs; num_slots is a power of two and the table
// always has an empty slot (CanClaimSlot), so the probe ends.
CTR_HD int64_t ProbeSlotFrom(const int64_t* pairs, int64_t num_slots, int64_t key, int64_t home) {
  const int64_t mask = num_slots - 1;
  int64_t s = home;
  for (int64_t step = 0; step < num_slots; ++step) {
    const int64_t* pair = PairAt(pairs, s);
    if (pair[kEntry] == kEmptyEntry || pair[kKey] == key) return s;
    s = (s + 1) & mask;
  }
  return -1;  // unreachable for a table built by these rules; a corrupt one reads as "absent"
}

CTR_HD int64_t ProbeSlot(const int64_t* pairs, int64_t num_slots, int64_t key) {
  return ProbeSlotFrom(pairs, num_slots, key, HomeSlot(key, num_slots));
}

// Whether a key whose probe starts at `home` may sit at slot `at` once slot
// `hole` is emptied: only if `hole` is not on its probe path from home to at.
CTR_HD bool StaysAfterHole(int64_t home, int64_t hole, int64_t at) {
  return hole <= at ? (home > hole && home <= at) : (home > hole || home <= at);
}

// Empties slot s of a linear-probing table, moving later keys of the same
// probe run back so that every key stays reachable from its home slot (no
// tombstones: the table never degrades).
CTR_HD void DeleteSlot(const Slots& t, int64_t s) {
  const int64_t mask = t.num_slots - 1;
  int64_t hole = s;
  for (int64_t at = (s + 1) & mask; at != s; at = (at + 1) & mask) {
    const int64_t* next = PairAt(t.pairs, at);
    if (next[kEntry] == kEmptyEntry) break;
    if (StaysAfterHole(HomeSlot(next[kKey], t.num_slots), hole, at)) continue;
    for (int64_t c = 0; c < 2; ++c) {
      PairAt(t.pairs, hole)[c] = next[c];
      StatsAt(t, hole)[c] = StatsAt(t, at)[c];
    }
    hole = at;
  }
  PairAt(t.pairs, hole)[kKey] = 0;
  PairAt(t.pairs, hole)[kEntry] = kEmptyEntry;
  StatsAt(t, hole)[kLastSeen] = 0;
  StatsAt(t, hole)[kCount] = 0;
}

CTR_HD int64_t RowOfEntry(int64_t entry) { return entry >= 0 ? entry : kNoRow; }

// How often the admission filter has seen a key that has no row yet.
// (Negated after the +1: a corrupt entry of INT64_MIN must not overflow.)
CTR_HD int64_t TimesSeen(int64_t entry) { return entry <= -2 ? -(entry + 1) : 0; }
CTR_HD int64_t PendingEntry(int64_t times_seen) { return -times_seen - 1; }

// Whether this sighting of a key whose entry is `entry` earns it a row:
// its admit_after-th sighting does (admit_after 1: the first).
CTR_HD bool AdmitsKey(int64_t entry, int64_t admit_after) { return TimesSeen(entry) >= admit_after - 1; }

// Whether `key` is the padding of dense keys (never inserted, reads no row).
CTR_HD bool IsPaddingKey(int64_t key, bool dense_padding) { return dense_padding && key == -1; }

// The row `key` has, given the slot its probe ended at (kNoRow for none).
CTR_HD int64_t RowInSlot(const int64_t* pairs, int64_t s, int64_t key, bool dense_padding) {
  const int64_t entry = s >= 0 ? PairAt(pairs, s)[kEntry] : kEmptyEntry;
  return entry >= 0 && !IsPaddingKey(key, dense_padding) ? entry : kNoRow;
}

// Whether a key of an inserting call waits for admission in slot s: the find
// marks it as seen by the call (last_seen only; its sighting's count is
// PlaceKey's), so that no eviction of the call, run for a key before it,
// takes it before the inserter reaches it.
CTR_HD bool WaitsInSlot(const int64_t* pairs, int64_t s, int64_t key, bool dense_padding) {
  return s >= 0 && PairAt(pairs, s)[kEntry] < kEmptyEntry && !IsPaddingKey(key, dense_padding);
}

// The clock an inserting find stamps the keys it sees with (their last_seen).
// Keys stamped with the running step's clock are never evicted. A find that
// starts a step advances the clock; one that continues a step (a table read
// by two calls of one training step) keeps it, so it never evicts what the
// step's earlier finds have read. An inserting clock is > 0.
CTR_HD int64_t InsertingClock(int64_t* header, bool new_step) {
  if (new_step || header[kClock] == 0) ++header[kClock];
  return header[kClock];
}

// Adds one to a counter (dropped, evicted, a key's use count) short of
// INT64_MAX: the header check bounds the cells that index the table, not
// these, and a table assigned a count of INT64_MAX must not overflow.
CTR_HD void CountUp(int64_t* cell) {
  if (*cell < INT64_MAX) ++*cell;
}

// Marks slot s as seen by the inserting call of `clock`: the LRU and LFU scores.
CTR_HD void StampSlot(const Slots& t, int64_t s, int64_t clock) {
  int64_t* stats = StatsAt(t, s);
  stats[kLastSeen] = clock;
  CountUp(&stats[kCount]);
}

CTR_HD bool RowAvailable(const int64_t* h, int64_t capacity) {
  return h[kFreeCount] > 0 || h[kNextRow] < capacity;
}

// Whether `missing` sightings of keys without a row can each claim a slot and
// take a row with none evicted (a bound: a key seen twice takes one). Where
// it holds, an inserting call evicts nothing whatever its policy, so a GPU
// table inserts on the device; the CPU inserter tests it too, which keeps
// every CPU eviction test a test of this bound.
CTR_HD bool RoomForAll(const int64_t* h, int64_t capacity, int64_t num_slots, int64_t missing) {
  return h[kOccupied] + missing <= ClaimableSlots(num_slots) && missing <= h[kFreeCount] + capacity - h[kNextRow];
}

// One sighting of `key` by an inserting call, its probe having ended at slot
// s (after any eviction, which is the caller's): the key's row, given from the
// free stack first (*reused then says so: its values are an evicted key's),
// else the next never-used one; kNoRow while the admission filter holds it
// back, and when the table has no slot or row for it (counted as dropped).
// One thread at a time per table: the CPU inserter and the GPU's insert
// kernel both run it serially, in key order, so both assign the same rows.
CTR_HD int64_t PlaceKey(const TableView& t, int64_t s, int64_t key, int64_t capacity, int64_t admit_after,
                        bool* reused) {
  *reused = false;
  int64_t* h = t.header;
  const int64_t entry = s >= 0 ? PairAt(t.slots.pairs, s)[kEntry] : kEmptyEntry;
  if (entry >= 0) {  // inserted by an earlier key of this call
    StampSlot(t.slots, s, h[kClock]);
    return entry;
  }
  const bool admitted = AdmitsKey(entry, admit_after);
  const bool new_slot = entry == kEmptyEntry;
  if (s < 0 || (new_slot && !CanClaimSlot(h[kOccupied], t.slots.num_slots)) ||
      (admitted && !RowAvailable(h, capacity))) {
    CountUp(&h[kDropped]);
    return kNoRow;
  }
  int64_t* pair = PairAt(t.slots.pairs, s);
  if (new_slot) {
    pair[kKey] = key;
    StatsAt(t.slots, s)[kCount] = 0;
    ++h[kOccupied];
  }
  if (!admitted) {
    pair[kEntry] = PendingEntry(TimesSeen(entry) + 1);
  } else if (h[kFreeCount] > 0) {
    pair[kEntry] = t.free_rows[--h[kFreeCount]];
    *reused = true;
  } else {
    pair[kEntry] = h[kNextRow]++;
  }
  StampSlot(t.slots, s, h[kClock]);
  return RowOfEntry(pair[kEntry]);
}

enum class Eviction { kNone, kLru, kLfu };

struct InsertRules {
  int64_t capacity;
  int64_t admit_after;
  bool dense_padding;
  Eviction eviction;
};

// A slot's eviction order (lower goes first): LRU by last use, then by use
// count; LFU by use count, then by last use. Ties go by row.
struct EvictionScore {
  int64_t first, second, row;
  CTR_HD bool operator<(const EvictionScore& o) const {
    if (first != o.first) return first < o.first;
    if (second != o.second) return second < o.second;
    return row < o.row;
  }
};

CTR_HD EvictionScore ScoreOf(const Slots& t, int64_t s, Eviction policy) {
  const int64_t* stats = StatsAt(t, s);
  const int64_t row = PairAt(t.pairs, s)[kEntry];
  return policy == Eviction::kLfu ? EvictionScore{stats[kCount], stats[kLastSeen], row}
                                  : EvictionScore{stats[kLastSeen], stats[kCount], row};
}

// Keys seen by the running call (last_seen == clock) are never evicted: their
// rows may already be in this call's output. To free a row, only keys with a
// row go; to free a slot, keys waiting for admission may go too.
CTR_HD bool Evictable(const Slots& t, int64_t s, int64_t clock, bool rows_only) {
  const int64_t entry = PairAt(t.pairs, s)[kEntry];
  return (rows_only ? entry >= 0 : entry != kEmptyEntry) && StatsAt(t, s)[kLastSeen] < clock;
}

}  // namespace ctr

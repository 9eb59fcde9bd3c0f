// The CPU loops of the key-to-row hash table (CtrHashTableFind,
// CtrHashTableEmbedding and the core module's hash_table_find): finding keys,
// pooling their rows, inserting them with admission and eviction, on the
// rules of hash_table.h. Host only; framework-free.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cc/core/hash_table.h"
#include "cc/core/hash_table_parallel.h"
#include "cc/core/lookup_cpu.h"

namespace ctr {

// Each key's home slot is prefetched this many keys before it is probed, so
// the cache misses of a large table overlap instead of coming one by one. A
// rolling distance, not groups: prefetching a group and then probing it left
// no loads in flight at each group's start.
constexpr int64_t kProbeDistance = 32;
static_assert((kProbeDistance & (kProbeDistance - 1)) == 0, "the ring of home slots is indexed with a mask");
// Eviction frees this share of the capacity at once, so that a full table
// scans its slots once per capacity/16 new keys, not once per key.
constexpr int64_t kEvictionBatchDivisor = 16;

// Sets *num_slots for an int64 [rows, cols] table of `capacity` rows; an
// error message (empty on success) says what is wrong with its shape. The
// GPU kernel checks shapes alone: its header lives on the device.
inline std::string TableSlots(int64_t rows, int64_t cols, int64_t capacity, int64_t* num_slots) {
  const int64_t slots = cols == kColumns ? rows - kHeaderRows - FreeListRows(capacity) : 0;
  if (capacity < 0 || slots < 2 || (slots & (slots - 1)) != 0) {
    return "table must be an int64 variable of shape [" + std::to_string(kHeaderRows) + " + S + " +
           std::to_string(FreeListRows(capacity)) + ", " + std::to_string(kColumns) + "] for capacity " +
           std::to_string(capacity) + ", S a power of two >= 2 (tf_ctr_ops.HashTable builds it), got [" +
           std::to_string(rows) + ", " + std::to_string(cols) + "]";
  }
  if (capacity > slots) {
    return "capacity " + std::to_string(capacity) + " exceeds the table's " + std::to_string(slots) + " slots";
  }
  *num_slots = slots;
  return "";
}

// Views an int64 [rows, cols] table of `capacity` rows of values; an error
// message (empty on success) says what is wrong with it. The header is
// checked too: it indexes the free stack, so a table assigned garbage must
// not move it out of bounds.
inline std::string ViewTable(int64_t* data, int64_t rows, int64_t cols, int64_t capacity, TableView* view) {
  int64_t slots = 0;
  const std::string shape_error = TableSlots(rows, cols, capacity, &slots);
  if (!shape_error.empty()) return shape_error;
  *view = {data, SlotsOf(data + kColumns * kHeaderRows, slots), data + kColumns * (kHeaderRows + slots)};
  const int64_t* h = view->header;
  if (!HeaderFits(h, capacity, slots)) {
    return "corrupt hash table header: " + std::to_string(h[kNextRow]) + " rows handed out, " +
           std::to_string(h[kFreeCount]) + " free, " + std::to_string(h[kOccupied]) + " slots occupied, clock " +
           std::to_string(h[kClock]) + " (capacity " + std::to_string(capacity) + ", " + std::to_string(slots) +
           " slots)";
  }
  return "";
}

// Finds the slots of keys[begin, end), in order: each key's home slot is
// prefetched kProbeDistance keys before it is probed, and with `stamps` its
// stats too, for writing (see FindRows).
template <typename Key>
class SlotFinder {
 public:
  SlotFinder(const Slots& slots, const Key* keys, int64_t begin, int64_t end, bool stamps = false)
      : slots_(slots), keys_(keys), end_(end), stamps_(stamps) {
    for (int64_t i = begin; i < std::min(end, begin + kProbeDistance); ++i) Start(i);
  }

  // The slot of keys[i] (ProbeSlot's); i runs from begin to end - 1, in order.
  int64_t SlotOf(int64_t i) {
    const int64_t s = ProbeSlotFrom(slots_.pairs, slots_.num_slots, keys_[i], home_[i & (kProbeDistance - 1)]);
    if (i + kProbeDistance < end_) Start(i + kProbeDistance);
    return s;
  }

 private:
  void Start(int64_t i) {
    const int64_t h = HomeSlot(keys_[i], slots_.num_slots);
    home_[i & (kProbeDistance - 1)] = h;
    __builtin_prefetch(PairAt(slots_.pairs, h));
    if (stamps_) __builtin_prefetch(StatsAt(slots_, h), /*rw=*/1);
  }

  const Slots& slots_;
  const Key* keys_;
  int64_t end_;
  bool stamps_;
  int64_t home_[kProbeDistance];  // key i's home slot in home_[i % kProbeDistance]
};

// What a find met that no insert can have left (a table variable assigned
// something else: zeros make every slot hold key 0 with row 0): a probe that
// found no empty slot to end at, or a row past the capacity. Threads keep
// the first one; a find stops at it, so such a table costs one scan of its
// slots instead of one per key, and the op fails naming the key.
class TableFault {
 public:
  bool found() const { return kind_.load(std::memory_order_relaxed) != kNone; }
  void NoEmptySlot(int64_t key) { Record(kNoEmptySlot, key, 0); }
  void RowPastCapacity(int64_t key, int64_t row) { Record(kRowPastCapacity, key, row); }

  // The error message, empty when nothing was found. Read once the threads are done.
  std::string Describe(int64_t capacity, int64_t num_slots) const {
    const int kind = kind_.load(std::memory_order_acquire);
    if (kind == kNone) return "";
    const std::string what = kind == kNoEmptySlot
                                 ? "'s probe met no empty slot among its " + std::to_string(num_slots) + " slots"
                                 : " has row " + std::to_string(value_) + ", past its capacity " +
                                       std::to_string(capacity);
    return "corrupt hash table: key " + std::to_string(key_) + what +
           " (the table variable was assigned something else)";
  }

 private:
  enum : int { kClaimed = -1, kNone = 0, kNoEmptySlot = 1, kRowPastCapacity = 2 };
  void Record(int kind, int64_t key, int64_t value) {
    int none = kNone;
    if (!kind_.compare_exchange_strong(none, kClaimed)) return;
    key_ = key;
    value_ = value;
    kind_.store(kind, std::memory_order_release);
  }
  std::atomic<int> kind_{kNone};
  int64_t key_ = 0, value_ = 0;
};

// Rows of `keys` (kNoRow for none); a table no insert can have left stops
// the find with *fault set (TableFault). With clock > 0 (an inserting call), each
// found key is stamped as seen by this call and its use count goes up: the
// scores eviction reads; a key waiting for admission is stamped as seen only
// (WaitsInSlot). Threads may stamp one slot at once, hence atomics;
// the stats are prefetched with the pairs, since a locked add on a line not
// yet in cache stalls every later load until the line arrives: unprefetched,
// the stamps took two thirds of an inserting find of a table out of cache.
// parallel_for(n, fn) runs fn(begin, end) over [0, n), on threads or not.
template <typename Key, typename ParallelFor>
void FindRows(const TableView& t, int64_t capacity, const Key* keys, int64_t n, bool dense_padding, int64_t clock,
              int64_t* rows, TableFault* fault, ParallelFor&& parallel_for) {
  parallel_for(n, [&](int64_t begin, int64_t end) {
    SlotFinder<Key> finder(t.slots, keys, begin, end, /*stamps=*/clock > 0);
    for (int64_t i = begin; i < end; ++i) {
      if (fault->found()) return;
      const int64_t s = finder.SlotOf(i);
      if (s < 0) return fault->NoEmptySlot(static_cast<int64_t>(keys[i]));
      rows[i] = RowInSlot(t.slots.pairs, s, keys[i], dense_padding);
      if (rows[i] >= capacity) return fault->RowPastCapacity(static_cast<int64_t>(keys[i]), rows[i]);
      if (clock == 0) continue;
      int64_t* stats = StatsAt(t.slots, s);
      if (rows[i] != kNoRow) {
        __atomic_store_n(&stats[kLastSeen], clock, __ATOMIC_RELAXED);
        __atomic_fetch_add(&stats[kCount], 1, __ATOMIC_RELAXED);
      } else if (WaitsInSlot(t.slots.pairs, s, keys[i], dense_padding)) {
        __atomic_store_n(&stats[kLastSeen], clock, __ATOMIC_RELAXED);
      }
    }
  });
}

// Pools bags [row_begin, row_end) of keys (CSR offsets) over the rows of
// `values` [s.vocab, s.dim] the table gives them, and writes each key's row
// (kNoRow for none) to rows[]: CtrHashTableFind and the lookup of its rows in
// one op. The range's rows are all found first, then pooled: interleaving
// each key's probe with the row loads of earlier keys was up to 1.4x slower
// on uniform keys (one thread, 1M keys, D=32), the two streams of cache
// misses then contending for the same line-fill buffers. Keys without a row
// are left out of their bag, as the lookup's skip_negative leaves the find's
// -1 out, and the rules after that are the lookup's: a pruned entry is
// dropped before its row is checked; a row outside `values` (a table
// assigned other tensors) stops the range, recorded in *err with the key
// (its row is rows[err->entry]), and so does a row past `capacity`, as the
// find refuses it whatever rows the values have; a probe that meets no
// empty slot stops it before any pooling, recorded in *fault.
// The message of PoolTableBagsCpu's error, `row` being the key's (rows[e.entry]).
inline std::string DescribeTableRowError(const KeyError& e, int64_t row, int64_t num_values) {
  return "key " + std::to_string(e.key) + " in row " + std::to_string(e.row) + " has table row " +
         std::to_string(row) + ", out of range [0, " + std::to_string(num_values) +
         ") of the values: the table variable holds another table's rows";
}

template <typename T, typename Key>
void PoolTableBagsCpu(const Slots& slots, int64_t capacity, const LookupSpec& s, const T* values, const Key* keys,
                      const float* weights, const int64_t* offsets, int64_t row_begin, int64_t row_end,
                      bool dense_padding, AccT<T>* acc, T* out, int64_t* rows, KeyError* err,
                      TableFault* fault) {
  const int64_t first = offsets[row_begin], last = offsets[row_end];
  SlotFinder<Key> finder(slots, keys, first, last);
  for (int64_t i = first; i < last; ++i) {
    const int64_t s = finder.SlotOf(i);
    if (s < 0) return fault->NoEmptySlot(static_cast<int64_t>(keys[i]));
    rows[i] = RowInSlot(slots.pairs, s, keys[i], dense_padding);
  }
  LookupSpec found = s;
  found.id_mode = IdMode::kIndex;
  found.invalid_ids = InvalidIds::kSkipNegative;
  found.vocab = std::min(s.vocab, capacity);
  PoolBagsCpu(found, values, rows, weights, offsets, row_begin, row_end, acc, out, err);
  if (err->found()) err->key = static_cast<int64_t>(keys[err->entry]);
}

// An error message (empty when none) for a table whose free stack holds rows
// outside the values among the `missing` this call may take (FirstBadFreeRow).
inline std::string BadFreeRowError(const TableView& t, int64_t capacity, int64_t missing) {
  const int64_t bad = t.header[kFreeCount] == 0 ? -1 : FirstBadFreeRow(t, capacity, missing);
  if (bad < 0) return "";
  return "corrupt hash table: free row " + std::to_string(t.free_rows[bad]) + " at stack position " +
         std::to_string(bad) + " is out of range [0, " + std::to_string(capacity) +
         "): the table variable was assigned something else; nothing was inserted";
}

// Inserts of one call: rows for the keys FindRows left without one.
class Inserter {
 public:
  Inserter(const TableView& t, const InsertRules& rules) : t_(t), rules_(rules), h_(t.header) {}

  // `at`: the entries FindRows left without a row, in key order.
  template <typename Key>
  void InsertMissing(const Key* keys, const std::vector<int64_t>& at, int64_t* rows) {
    for (const int64_t i : at) rows[i] = Insert(static_cast<int64_t>(keys[i]));
  }

  // Rows freed by eviction and handed to new keys in this call: their values
  // are the evicted keys' and must be reset.
  const std::vector<int64_t>& reused_rows() const { return reused_; }

  // The first row past the capacity an eviction met (-1 for none): the table
  // was assigned something else, and such a row is never handed out.
  int64_t corrupt_row() const { return corrupt_row_; }

 private:
  // Evicts first where the key needs a row or a slot the table lacks; the
  // rest is PlaceKey's, which the GPU insert shares.
  int64_t Insert(int64_t key) {
    const Slots& t = t_.slots;
    int64_t s = ProbeSlot(t.pairs, t.num_slots, key);
    const int64_t entry = s >= 0 ? PairAt(t.pairs, s)[kEntry] : kEmptyEntry;
    if (entry < 0) {
      const bool needs_row = AdmitsKey(entry, rules_.admit_after) && !RowAvailable(h_, rules_.capacity);
      const bool needs_slot = entry == kEmptyEntry && !CanClaimSlot(h_[kOccupied], t.num_slots);
      // A key waiting for admission needs no slot, and a row needed frees
      // only keys holding one: the key itself is never evicted, so PlaceKey
      // reads the entry it had. A slot needed while rows are free frees
      // only keys waiting for admission: a stream of one-off keys must not
      // evict trained rows while rows are free, even when one call brings
      // more of them than there are slots (they wait with this call's clock,
      // so none of them can go, and the key is dropped).
      const Victims victims = needs_row                             ? Victims::kRowHolders
                              : RowAvailable(h_, rules_.capacity) ? Victims::kWaiting
                                                                  : Victims::kAny;
      if ((needs_row || needs_slot) && Evict(victims)) {
        s = ProbeSlot(t.pairs, t.num_slots, key);  // eviction moved keys
      }
    }
    bool reused = false;
    const int64_t row = PlaceKey(t_, s, key, rules_.capacity, rules_.admit_after, &reused);
    if (reused) reused_.push_back(row);
    return row;
  }

  // An eviction candidate. To free a slot, keys waiting for admission go
  // before keys holding a row, whatever their scores: they hold nothing
  // trained, and a stream of one-off keys filling the slots must not evict
  // trained rows while rows are free.
  struct Candidate {
    bool holds_row;
    EvictionScore score;
    int64_t key;
    bool operator<(const Candidate& o) const {
      if (holds_row != o.holds_row) return !holds_row;
      if (score < o.score || o.score < score) return score < o.score;
      return key < o.key;  // keys waiting for admission share entries
    }
  };

  // Which keys an eviction may take.
  enum class Victims { kRowHolders = 0, kWaiting = 1, kAny = 2 };

  // Evicts up to capacity/16 keys of `victims` that this call has not seen,
  // lowest first (Candidate's order); false when none can go.
  bool Evict(Victims victims) {
    const int v = static_cast<int>(victims);
    if (rules_.eviction == Eviction::kNone || exhausted_[v]) return false;
    const Slots& t = t_.slots;
    const int64_t clock = h_[kClock];
    std::vector<Candidate> candidates;
    for (int64_t s = 0; s < t.num_slots; ++s) {
      if (!Evictable(t, s, clock, /*rows_only=*/victims == Victims::kRowHolders)) continue;
      const int64_t* pair = PairAt(t.pairs, s);
      const bool holds_row = pair[kEntry] >= 0;
      if (victims == Victims::kWaiting && holds_row) continue;
      candidates.push_back({holds_row, ScoreOf(t, s, rules_.eviction), pair[kKey]});
    }
    if (candidates.empty()) {
      // Every key this call adds is stamped with its clock, so nothing becomes
      // evictable again before the next call: without this, a call with more
      // new keys than the table holds would scan every slot once per key.
      exhausted_[v] = true;
      if (victims == Victims::kAny) exhausted_[0] = exhausted_[1] = true;
      return false;
    }
    const int64_t want = std::max<int64_t>(1, rules_.capacity / kEvictionBatchDivisor);
    const auto cut = candidates.begin() + std::min<int64_t>(want, candidates.size());
    std::nth_element(candidates.begin(), cut - 1, candidates.end());
    // Pushed highest score first, so new keys take the lowest-scored key's row
    // first: a deterministic order that tests can replay.
    std::sort(candidates.begin(), cut);
    for (auto it = cut; it != candidates.begin();) {
      --it;
      // Keys, not slots: each deletion may move the others' slots.
      const int64_t s = ProbeSlot(t.pairs, t.num_slots, it->key);
      const int64_t entry = PairAt(t.pairs, s)[kEntry];
      // A key awaiting admission frees a slot and no row, so a full free
      // stack (every row free) must not stop its eviction; the bound only
      // keeps a corrupt table's rows from overflowing the stack.
      if (entry >= rules_.capacity && corrupt_row_ < 0) corrupt_row_ = entry;
      if (entry >= 0 && entry < rules_.capacity && h_[kFreeCount] < rules_.capacity)
        t_.free_rows[h_[kFreeCount]++] = entry;
      DeleteSlot(t, s);
      --h_[kOccupied];
      CountUp(&h_[kEvicted]);
    }
    return true;
  }

  const TableView& t_;
  const InsertRules& rules_;
  int64_t* h_;
  std::vector<int64_t> reused_;
  int64_t corrupt_row_ = -1;
  bool exhausted_[3] = {false, false, false};  // [Victims]: a scan of this call found nothing to evict
};

// The five phases of hash_table_parallel.h over the missing keys' sightings,
// in `at` (indices into keys and rows, ascending); returns the rows taken off
// the free stack, in the order the serial insert takes them.
template <typename Key, typename ParallelFor>
std::vector<int64_t> InsertInParallel(const TableView& t, const Key* keys, const std::vector<int64_t>& at,
                                      int64_t* rows, ParallelFor&& parallel_for) {
  const int64_t m = static_cast<int64_t>(at.size());
  std::vector<int64_t> sighted(m), slot(m), rank(m);
  for (int64_t j = 0; j < m; ++j) sighted[j] = static_cast<int64_t>(keys[at[j]]);
  const Slots& slots = t.slots;
  parallel_for(m, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) slot[j] = ClaimSlot(slots.pairs, slots.num_slots, sighted.data(), m, j);
  });
  const int64_t clock = t.header[kClock];
  parallel_for(m, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) rank[j] = TakeFirstSighting(slots, slot[j], sighted.data(), j, clock);
  });
  int64_t added = 0;
  for (int64_t j = 0; j < m; ++j) {
    const int64_t first = rank[j];
    rank[j] = first ? added : -1;
    added += first;
  }
  std::vector<int64_t> reused(std::min(added, t.header[kFreeCount]));
  parallel_for(m, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      if (rank[j] >= 0) GiveRow(t, slot[j], rank[j], reused.data());
      CountSighting(slots, slot[j]);
    }
  });
  parallel_for(m, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) rows[at[j]] = RowOfClaimedSlot(slots, slot[j]);
  });
  FinishParallelInsert(t.header, added);
  return reused;
}

// The parallel insert makes four random passes over the slots where the
// serial one makes one, so it pays only with threads to spread them over:
// 700k new keys into 2M slots took 1.5x the serial time on one thread and
// 1.1x on two (one 2-vCPU machine).
constexpr int kMinThreadsForParallelInsert = 4;

// Rows for the keys FindRows left without one: with `parallel` and where
// InsertsInParallel allows (a training step's new keys, the table not full)
// all at once, else by the Inserter, one key at a time in key order. Returns
// the rows given to new keys off the free stack (evicted keys' rows, to be
// reset); *error says where the free stack or an eviction found the table
// corrupt (nothing inserted in the first case).
// Where RoomForAll holds the inserter runs without its eviction policy: the
// same rows, and the bound the GPU relies on to insert on the device is
// checked by every CPU test that evicts.
template <typename Key, typename ParallelFor>
std::vector<int64_t> InsertMissing(const TableView& t, const InsertRules& rules, const Key* keys, int64_t n,
                                   int64_t* rows, bool parallel, ParallelFor&& parallel_for, std::string* error) {
  std::vector<int64_t> at;
  for (int64_t i = 0; i < n; ++i) {
    if (rows[i] == kNoRow && !IsPaddingKey(keys[i], rules.dense_padding)) at.push_back(i);
  }
  const int64_t missing = static_cast<int64_t>(at.size());
  *error = BadFreeRowError(t, rules.capacity, missing);
  if (!error->empty()) return {};
  if (parallel && InsertsInParallel(t.header, rules.capacity, t.slots.num_slots, rules.admit_after, missing)) {
    return InsertInParallel(t, keys, at, rows, parallel_for);
  }
  InsertRules serial = rules;
  if (RoomForAll(t.header, rules.capacity, t.slots.num_slots, missing)) serial.eviction = Eviction::kNone;
  Inserter inserter(t, serial);
  inserter.InsertMissing(keys, at, rows);
  if (inserter.corrupt_row() >= 0)
    *error = "corrupt hash table: an evicted key held row " + std::to_string(inserter.corrupt_row()) +
             ", out of range [0, " + std::to_string(rules.capacity) +
             "): the table variable was assigned something else";
  return inserter.reused_rows();
}

inline Eviction ParseEviction(const std::string& name) {
  if (name == "lru") return Eviction::kLru;
  if (name == "lfu") return Eviction::kLfu;
  return Eviction::kNone;
}

}  // namespace ctr

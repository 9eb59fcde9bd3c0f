// CPU kernel of CtrHashTableFind. Reads take the table variable's lock
// shared and probe in parallel; inserts take it exclusively, find every key
// in parallel first, then give rows to the missing ones in key order, so that
// rows are assigned in order of first appearance whatever the thread count.
#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cc/core/hash_table.h"
#include "cc/kernels/tf_types.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"

namespace tf_ctr {

using tensorflow::OpKernelContext;
using tensorflow::Tensor;

namespace {

constexpr int64_t kProbeCost = 40;
// Keys are probed in groups: the group's home slots are prefetched first, so
// the cache misses of a large table overlap instead of coming one by one.
constexpr int64_t kProbeGroup = 32;
// Eviction frees this share of the capacity at once, so that a full table
// scans its slots once per capacity/16 new keys, not once per key.
constexpr int64_t kEvictionBatchDivisor = 16;

// The table tensor's parts (cc/core/hash_table.h).
struct TableView {
  int64_t* header = nullptr;
  ctr::Slots slots{};
  int64_t* free_rows = nullptr;
};

absl::Status ViewTable(Tensor* table, int64_t capacity, TableView* view) {
  const bool matrix = table->dtype() == tensorflow::DT_INT64 && table->dims() == 2 &&
                      table->dim_size(1) == ctr::kColumns;
  const int64_t slots = matrix ? table->dim_size(0) - ctr::kHeaderRows - ctr::FreeListRows(capacity) : 0;
  if (!matrix || slots < 2 || (slots & (slots - 1)) != 0) {
    return tensorflow::errors::InvalidArgument(
        "table must be an int64 variable of shape [", ctr::kHeaderRows, " + S + ", ctr::FreeListRows(capacity),
        ", ", ctr::kColumns, "] for capacity ", capacity,
        ", S a power of two >= 2 (tf_ctr_ops.HashTable builds it), got ", tensorflow::DataTypeString(table->dtype()),
        " ", table->shape().DebugString());
  }
  if (capacity > slots) {
    return tensorflow::errors::InvalidArgument("capacity ", capacity, " exceeds the table's ", slots, " slots");
  }
  int64_t* data = table->flat<int64_t>().data();
  *view = {data, ctr::SlotsOf(data + ctr::kColumns * ctr::kHeaderRows, slots),
           data + ctr::kColumns * (ctr::kHeaderRows + slots)};
  // The header indexes the free stack: a table assigned garbage must not move it out of bounds.
  const int64_t* h = view->header;
  if (h[ctr::kNextRow] < 0 || h[ctr::kNextRow] > capacity || h[ctr::kFreeCount] < 0 ||
      h[ctr::kFreeCount] > h[ctr::kNextRow] || h[ctr::kOccupied] < 0 || h[ctr::kOccupied] > slots ||
      h[ctr::kClock] < 0) {
    return tensorflow::errors::InvalidArgument(
        "corrupt hash table header: ", h[ctr::kNextRow], " rows handed out, ", h[ctr::kFreeCount], " free, ",
        h[ctr::kOccupied], " slots occupied, clock ", h[ctr::kClock], " (capacity ", capacity, ", ", slots,
        " slots)");
  }
  return absl::OkStatus();
}

// Writes in place would change tensors that earlier reads of the variable
// still hold; copy the buffer first if anyone else references it.
absl::Status MakeTableExclusive(OpKernelContext* ctx, tensorflow::Var* var) {
  Tensor* table = var->tensor();
  if (table->RefCountIsOne()) return absl::OkStatus();
  Tensor copy;
  TF_RETURN_IF_ERROR(ctx->allocate_temp(table->dtype(), table->shape(), &copy));
  std::memcpy(copy.data(), table->data(), table->TotalBytes());
  *table = copy;
  return absl::OkStatus();
}

// Rows of `keys` (kNoRow for none). With clock > 0 (an inserting call), each
// found key is stamped as seen by this call and its use count goes up: the
// scores eviction reads. Threads may stamp one slot at once, hence atomics.
template <typename Key>
void FindRows(OpKernelContext* ctx, const TableView& t, const Key* keys, int64_t n, bool dense_padding,
              int64_t clock, int64_t* rows) {
  ParallelFor(ctx, n, kProbeCost, [&](int64_t begin, int64_t end) {
    int64_t home[kProbeGroup];
    for (int64_t g = begin; g < end; g += kProbeGroup) {
      const int64_t count = std::min(kProbeGroup, end - g);
      for (int64_t j = 0; j < count; ++j) {
        home[j] = ctr::HomeSlot(keys[g + j], t.slots.num_slots);
        __builtin_prefetch(ctr::PairAt(t.slots.pairs, home[j]));
      }
      for (int64_t j = 0; j < count; ++j) {
        const int64_t key = keys[g + j];
        const int64_t s = ctr::ProbeSlotFrom(t.slots.pairs, t.slots.num_slots, key, home[j]);
        const int64_t entry = s >= 0 ? ctr::PairAt(t.slots.pairs, s)[ctr::kEntry] : ctr::kEmptyEntry;
        const bool found = entry >= 0 && !ctr::IsPaddingKey(key, dense_padding);
        rows[g + j] = found ? entry : ctr::kNoRow;
        if (found && clock > 0) {
          int64_t* stats = ctr::StatsAt(t.slots, s);
          __atomic_store_n(&stats[ctr::kLastSeen], clock, __ATOMIC_RELAXED);
          __atomic_fetch_add(&stats[ctr::kCount], 1, __ATOMIC_RELAXED);
        }
      }
    }
  });
}

struct InsertRules {
  int64_t capacity;
  int64_t admit_after;
  bool dense_padding;
  ctr::Eviction eviction;
};

// Inserts of one call: rows for the keys FindRows left without one.
class Inserter {
 public:
  Inserter(const TableView& t, const InsertRules& rules) : t_(t), rules_(rules), h_(t.header) {}

  template <typename Key>
  void InsertMissing(const Key* keys, int64_t n, int64_t* rows) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t key = keys[i];
      if (rows[i] != ctr::kNoRow || ctr::IsPaddingKey(key, rules_.dense_padding)) continue;
      rows[i] = Insert(key);
    }
  }

  // Rows freed by eviction and handed to new keys in this call: their values
  // are the evicted keys' and must be reset.
  const std::vector<int64_t>& reused_rows() const { return reused_; }

 private:
  int64_t Insert(int64_t key) {
    const ctr::Slots& t = t_.slots;
    int64_t s = ctr::ProbeSlot(t.pairs, t.num_slots, key);
    int64_t entry = s >= 0 ? ctr::PairAt(t.pairs, s)[ctr::kEntry] : ctr::kEmptyEntry;
    if (entry >= 0) {  // inserted by an earlier key of this call
      Touch(s);
      return entry;
    }
    const bool admitted = ctr::AdmitsKey(entry, rules_.admit_after);
    const bool new_slot = entry == ctr::kEmptyEntry;
    const bool needs_row = admitted && !RowAvailable();
    if ((needs_row || (new_slot && !SlotAvailable())) && Evict(/*rows_only=*/needs_row)) {
      s = ctr::ProbeSlot(t.pairs, t.num_slots, key);  // eviction moved keys
    }
    if (s < 0 || (new_slot && !SlotAvailable()) || (admitted && !RowAvailable())) {
      ++h_[ctr::kDropped];
      return ctr::kNoRow;
    }
    int64_t* pair = ctr::PairAt(t.pairs, s);
    if (new_slot) {
      pair[ctr::kKey] = key;
      ctr::StatsAt(t, s)[ctr::kCount] = 0;
      ++h_[ctr::kOccupied];
    }
    pair[ctr::kEntry] = admitted ? TakeRow() : ctr::PendingEntry(ctr::TimesSeen(entry) + 1);
    Touch(s);
    return ctr::RowOfEntry(pair[ctr::kEntry]);
  }

  void Touch(int64_t s) const {
    int64_t* stats = ctr::StatsAt(t_.slots, s);
    stats[ctr::kLastSeen] = h_[ctr::kClock];
    ++stats[ctr::kCount];
  }

  bool RowAvailable() const { return h_[ctr::kFreeCount] > 0 || h_[ctr::kNextRow] < rules_.capacity; }
  bool SlotAvailable() const { return ctr::CanClaimSlot(h_[ctr::kOccupied], t_.slots.num_slots); }

  int64_t TakeRow() {
    if (h_[ctr::kFreeCount] > 0) {
      const int64_t row = t_.free_rows[--h_[ctr::kFreeCount]];
      reused_.push_back(row);
      return row;
    }
    return h_[ctr::kNextRow]++;
  }

  // Evicts up to capacity/16 keys with the lowest scores that this call has
  // not seen (with rows_only, only keys holding a row); false when none can go.
  bool Evict(bool rows_only) {
    if (rules_.eviction == ctr::Eviction::kNone) return false;
    const ctr::Slots& t = t_.slots;
    const int64_t clock = h_[ctr::kClock];
    std::vector<std::pair<ctr::EvictionScore, int64_t>> candidates;
    for (int64_t s = 0; s < t.num_slots; ++s) {
      if (ctr::Evictable(t, s, clock, rows_only)) {
        candidates.emplace_back(ctr::ScoreOf(t, s, rules_.eviction), ctr::PairAt(t.pairs, s)[ctr::kKey]);
      }
    }
    if (candidates.empty()) return false;
    const int64_t want = std::max<int64_t>(1, rules_.capacity / kEvictionBatchDivisor);
    const auto cut = candidates.begin() + std::min<int64_t>(want, candidates.size());
    std::nth_element(candidates.begin(), cut - 1, candidates.end());
    // Pushed highest score first, so new keys take the lowest-scored key's row
    // first: a deterministic order that tests can replay.
    std::sort(candidates.begin(), cut);
    for (auto it = cut; it != candidates.begin() && h_[ctr::kFreeCount] < rules_.capacity;) {
      --it;
      // Keys, not slots: each deletion may move the others' slots.
      const int64_t s = ctr::ProbeSlot(t.pairs, t.num_slots, it->second);
      const int64_t entry = ctr::PairAt(t.pairs, s)[ctr::kEntry];
      if (entry >= 0) t_.free_rows[h_[ctr::kFreeCount]++] = entry;
      ctr::DeleteSlot(t, s);
      --h_[ctr::kOccupied];
      ++h_[ctr::kEvicted];
    }
    return true;
  }

  const TableView& t_;
  const InsertRules& rules_;
  int64_t* h_;
  std::vector<int64_t> reused_;
};

ctr::Eviction ParseEviction(const std::string& name) {
  if (name == "lru") return ctr::Eviction::kLru;
  if (name == "lfu") return ctr::Eviction::kLfu;
  return ctr::Eviction::kNone;
}

}  // namespace

template <typename Key>
class HashTableFindOp : public tensorflow::OpKernel {
 public:
  explicit HashTableFindOp(tensorflow::OpKernelConstruction* c) : OpKernel(c) {
    std::string eviction;
    OP_REQUIRES_OK(c, c->GetAttr("capacity", &rules_.capacity));
    OP_REQUIRES_OK(c, c->GetAttr("admit_after", &rules_.admit_after));
    OP_REQUIRES_OK(c, c->GetAttr("dense_padding", &rules_.dense_padding));
    OP_REQUIRES_OK(c, c->GetAttr("eviction", &eviction));
    OP_REQUIRES_OK(c, c->GetAttr("insert", &insert_));
    rules_.eviction = ParseEviction(eviction);
  }

  void Compute(OpKernelContext* ctx) override {
    tensorflow::core::RefCountPtr<tensorflow::Var> var;
    OP_REQUIRES_OK(ctx, tensorflow::LookupResource(ctx, tensorflow::HandleFromInput(ctx, 0), &var));
    const Tensor& keys = ctx->input(1);
    Tensor* rows = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, keys.shape(), &rows));
    const int64_t n = keys.NumElements();
    const Key* key_data = keys.flat<Key>().data();
    int64_t* row_data = rows->flat<int64_t>().data();
    TableView table;
    if (!insert_) {
      tensorflow::tf_shared_lock lock(*var->mu());
      OP_REQUIRES_OK(ctx, ViewTable(var->tensor(), rules_.capacity, &table));
      FindRows(ctx, table, key_data, n, rules_.dense_padding, /*clock=*/0, row_data);
      OP_REQUIRES_OK(ctx, OutputReused(ctx, {}));
      return;
    }
    tensorflow::mutex_lock lock(*var->mu());
    OP_REQUIRES_OK(ctx, MakeTableExclusive(ctx, var.get()));
    OP_REQUIRES_OK(ctx, ViewTable(var->tensor(), rules_.capacity, &table));
    const int64_t clock = ++table.header[ctr::kClock];
    FindRows(ctx, table, key_data, n, rules_.dense_padding, clock, row_data);
    Inserter inserter(table, rules_);
    inserter.InsertMissing(key_data, n, row_data);
    OP_REQUIRES_OK(ctx, OutputReused(ctx, inserter.reused_rows()));
  }

 private:
  static absl::Status OutputReused(OpKernelContext* ctx, const std::vector<int64_t>& reused) {
    Tensor* out = nullptr;
    TF_RETURN_IF_ERROR(AllocateOutput(ctx, 1, {static_cast<int64_t>(reused.size())}, &out));
    std::copy(reused.begin(), reused.end(), out->flat<int64_t>().data());
    return absl::OkStatus();
  }

  InsertRules rules_{};
  bool insert_ = false;
};

#define CTR_REGISTER_HASH_TABLE_FIND(Key)                                                         \
  REGISTER_KERNEL_BUILDER(                                                                        \
      Name("CtrHashTableFind").Device(tensorflow::DEVICE_CPU).TypeConstraint<Key>("Tkey"), \
      HashTableFindOp<Key>)
CTR_REGISTER_HASH_TABLE_FIND(int32_t);
CTR_REGISTER_HASH_TABLE_FIND(int64_t);
#undef CTR_REGISTER_HASH_TABLE_FIND

}  // namespace tf_ctr

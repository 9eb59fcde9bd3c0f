// A memo of a vocabulary table's finds (CtrVocabEmbedding): key -> the id the
// table gave it, or "not in the table". TF's StaticHashTable finds a short
// string key in 15-40 ns of CPU, by machine (an out-of-line tstring compare
// per probe, and a hash map sized for any key type); a served model looks
// the same few thousand keys up on every call, so a flat table of 64-bit
// hashes with the key bytes in one arena answers almost every key with a
// hash, one probe and a compare (10-13 ns). It is only correct for a table
// that can never change again, which the kernel checks; the memo never
// forgets a key, grows by doubling, and stops taking keys at its limit
// (those are found in the table each time). Not thread-safe: the kernel
// holds a lock. Host only.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "cc/core/fingerprint.h"
#include "cc/core/mix.h"

namespace ctr {

inline uint64_t MemoHash(std::string_view key) {
  return fp::Fingerprint64(reinterpret_cast<const uint8_t*>(key.data()), key.size());
}

inline uint64_t MemoHash(int64_t key) { return MixKey(static_cast<uint64_t>(key)); }

// Byte equality without a call for the short keys vocabularies hold: two
// overlapping loads from each end cover 4..16 bytes.
inline bool SameBytes(const char* a, const char* b, uint64_t n) {
  auto load8 = [](const char* p) { uint64_t v; std::memcpy(&v, p, 8); return v; };
  auto load4 = [](const char* p) { uint32_t v; std::memcpy(&v, p, 4); return v; };
  if (n > 16) return std::memcmp(a, b, n) == 0;
  if (n >= 8) return load8(a) == load8(b) && load8(a + n - 8) == load8(b + n - 8);
  if (n >= 4) return load4(a) == load4(b) && load4(a + n - 4) == load4(b + n - 4);
  for (uint64_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return false;
  return true;
}

// What the memo knows of a key.
enum class Memo { kUnknown, kInTable, kMissing };

template <typename Key>  // std::string_view or int64_t
class VocabMemo {
  static_assert(std::is_same_v<Key, std::string_view> || std::is_same_v<Key, int64_t>);

 public:
  explicit VocabMemo(int64_t max_keys) : max_keys_(max_keys) {}

  int64_t size() const { return keys_; }
  bool full() const { return keys_ >= max_keys_; }

  void Prefetch(uint64_t hash) const {
    if (!slots_.empty()) __builtin_prefetch(&slots_[Home(hash)]);
  }

  Memo Find(Key key, uint64_t hash, int64_t* id) const {
    if (slots_.empty()) return Memo::kUnknown;
    const uint64_t mask = slots_.size() - 1;
    for (uint64_t s = Home(hash);; s = (s + 1) & mask) {
      const Slot& slot = slots_[s];
      if (slot.tag == 0) return Memo::kUnknown;
      if ((slot.tag & kHashBits) == (hash & kHashBits) && Equal(slot, key)) {
        *id = slot.id;
        return slot.tag & kInTable ? Memo::kInTable : Memo::kMissing;
      }
    }
  }

  // Remembers what the table said of `key` (id ignored when it lacks it);
  // false when the memo is full or the key too long to keep.
  bool Insert(Key key, uint64_t hash, bool in_table, int64_t id) {
    if (full()) return false;
    uint64_t ref = 0;
    if constexpr (std::is_same_v<Key, int64_t>) {
      ref = static_cast<uint64_t>(key);
    } else {
      if (key.size() >= (uint64_t{1} << kLengthBits) || arena_.size() >= (uint64_t{1} << (64 - kLengthBits)))
        return false;
      ref = (static_cast<uint64_t>(arena_.size()) << kLengthBits) | key.size();
    }
    if (2 * (keys_ + 1) > static_cast<int64_t>(slots_.size())) Grow();
    int64_t known = 0;
    if (Find(key, hash, &known) != Memo::kUnknown) return true;
    if constexpr (std::is_same_v<Key, std::string_view>) arena_.append(key.data(), key.size());
    Place(Slot{(hash & kHashBits) | kUsed | (in_table ? kInTable : 0), id, ref});
    ++keys_;
    return true;
  }

 private:
  // tag: the hash's high bits, kUsed (0 is an empty slot), kInTable.
  struct Slot {
    uint64_t tag = 0;
    int64_t id = 0;
    uint64_t ref = 0;  // the key itself, or its arena offset << kLengthBits | length
  };
  static constexpr uint64_t kUsed = 1, kInTable = 2, kHashBits = ~uint64_t{3};
  static constexpr int kLengthBits = 24;

  bool Equal(const Slot& slot, Key key) const {
    if constexpr (std::is_same_v<Key, int64_t>) {
      return static_cast<int64_t>(slot.ref) == key;
    } else {
      const uint64_t length = slot.ref & ((uint64_t{1} << kLengthBits) - 1);
      return length == key.size() && SameBytes(arena_.data() + (slot.ref >> kLengthBits), key.data(), length);
    }
  }

  // A slot's home comes from the hash bits its tag keeps, so growing needs
  // no rehashing.
  uint64_t Home(uint64_t hash) const { return (hash >> 2) & (slots_.size() - 1); }

  void Place(const Slot& slot) {
    const uint64_t mask = slots_.size() - 1;
    uint64_t s = Home(slot.tag);
    while (slots_[s].tag != 0) s = (s + 1) & mask;
    slots_[s] = slot;
  }

  void Grow() {
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(old.empty() ? kFirstSlots : 2 * old.size(), Slot{});
    for (const Slot& slot : old)
      if (slot.tag != 0) Place(slot);
  }

  static constexpr size_t kFirstSlots = 1024;
  int64_t max_keys_;
  int64_t keys_ = 0;
  std::vector<Slot> slots_;
  std::string arena_;
};

}  // namespace ctr

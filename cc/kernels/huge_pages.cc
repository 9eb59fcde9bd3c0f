#include "cc/kernels/huge_pages.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <utility>

#ifdef __linux__
#include <sys/mman.h>
#endif

namespace tf_ctr {
namespace {

constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
#ifndef MADV_COLLAPSE
constexpr int MADV_COLLAPSE = 25;  // Linux 6.1; older headers lack the name
#endif
// Buffers already advised, so a table costs one attempt, not one per call,
// even where the collapse fails. A new buffer at a freed one's address is
// skipped (only its speed is lost); the record is cleared when it fills.
constexpr size_t kMaxRemembered = 4096;

bool Enabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("TF_CTR_OPS_HUGE_PAGES");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  return enabled;
}

// Whether [begin, begin + bytes) is asked for the first time.
bool FirstRequest(uintptr_t begin, size_t bytes) {
  static std::mutex mu;
  static std::set<std::pair<uintptr_t, size_t>>* seen = new std::set<std::pair<uintptr_t, size_t>>();
  std::lock_guard<std::mutex> lock(mu);
  if (seen->size() >= kMaxRemembered) seen->clear();
  return seen->insert({begin, bytes}).second;
}

}  // namespace

void AdviseHugePages(const void* data, size_t bytes) {
#ifdef __linux__
  if (bytes < kMinHugePageBytes || !Enabled()) return;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t first = (begin + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t last = (begin + bytes) & ~(kHugePage - 1);
  if (last <= first || !FirstRequest(begin, bytes)) return;
  void* range = reinterpret_cast<void*>(first);
  if (madvise(range, last - first, MADV_HUGEPAGE) == 0) madvise(range, last - first, MADV_COLLAPSE);
#else
  (void)data;
  (void)bytes;
#endif
}

}  // namespace tf_ctr

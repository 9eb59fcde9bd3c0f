#include "cc/kernels/huge_pages.h"

#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#ifdef __linux__
#include <sys/mman.h>
#endif

namespace tf_ctr {
namespace {

#ifdef __linux__
constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
#ifndef MADV_COLLAPSE
constexpr int MADV_COLLAPSE = 25;  // Linux 6.1; older headers lack the name
#endif
// One collapse call's share of a range: the range's pages are locked a
// piece at a time, and a range freed meanwhile stops at the next piece.
constexpr uintptr_t kCollapseStep = 16 * kHugePage;
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

// The ranges waiting for their collapse, and the one thread that collapses
// them. Never destroyed: the detached thread may still use them while the
// process exits.
struct Collapser {
  std::mutex mu;
  std::condition_variable ready;
  std::set<std::pair<uintptr_t, size_t>> seen;
  std::deque<std::pair<uintptr_t, uintptr_t>> ranges;  // [first, last) of whole huge pages
  bool started = false;

  // Whether [begin, begin + bytes) is asked for the first time.
  bool FirstRequest(uintptr_t begin, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu);
    if (seen.size() >= kMaxRemembered) seen.clear();
    return seen.insert({begin, bytes}).second;
  }

  void Enqueue(uintptr_t first, uintptr_t last) {
    {
      std::lock_guard<std::mutex> lock(mu);
      ranges.emplace_back(first, last);
      if (!started) {
        started = true;
        std::thread([this] { Run(); }).detach();
      }
    }
    ready.notify_one();
  }

  void Run() {
    for (;;) {
      std::pair<uintptr_t, uintptr_t> range;
      {
        std::unique_lock<std::mutex> lock(mu);
        ready.wait(lock, [this] { return !ranges.empty(); });
        range = ranges.front();
        ranges.pop_front();
      }
      for (uintptr_t at = range.first; at < range.second; at += kCollapseStep) {
        const uintptr_t size = range.second - at < kCollapseStep ? range.second - at : kCollapseStep;
        // ENOMEM: the range was freed (or never mapped); EINVAL: a kernel
        // without MADV_COLLAPSE. Either way the rest would fail the same.
        if (madvise(reinterpret_cast<void*>(at), size, MADV_COLLAPSE) != 0 && (errno == ENOMEM || errno == EINVAL))
          break;
      }
    }
  }
};

Collapser& TheCollapser() {
  static Collapser* collapser = new Collapser();
  return *collapser;
}
#endif

}  // namespace

void AdviseHugePages(const void* data, size_t bytes) {
#ifdef __linux__
  if (bytes < kMinHugePageBytes || !Enabled()) return;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t first = (begin + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t last = (begin + bytes) & ~(kHugePage - 1);
  Collapser& collapser = TheCollapser();
  if (last <= first || !collapser.FirstRequest(begin, bytes)) return;
  // Cheap and at once: later faults in the range, and the kernel's own
  // background scan, use huge pages from now on.
  if (madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE) != 0) return;
  // The pages already there are copied into huge ones off the caller's
  // thread: a synchronous collapse took 0.2 s for 64 MiB (1.4 s for 256 MiB)
  // on a busy 2-core machine, a first call no server can wait for.
  collapser.Enqueue(first, last);
#else
  (void)data;
  (void)bytes;
#endif
}

}  // namespace tf_ctr

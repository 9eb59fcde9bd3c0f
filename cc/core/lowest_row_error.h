// The one rule for errors found by several CPU threads: the error of the
// lowest row wins, so what a user sees does not depend on scheduling. Every
// adapter (TF kernels, the Python core) keeps its errors in one of these.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

namespace ctr {

// E has `int64_t row` and `bool found() const`.
template <typename E>
class LowestRowError {
 public:
  void Offer(const E& e) {
    if (!e.found()) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.found() || e.row < error_.row) error_ = e;
  }
  // Read once the threads that offer have finished.
  bool found() const { return error_.found(); }
  const E& error() const { return error_; }

 private:
  std::mutex mu_;
  E error_;
};

// An error already described, for errors whose description needs data that
// does not outlive the thread that found them.
struct DescribedError {
  int64_t row = -1;
  std::string message;
  bool found() const { return row >= 0; }
};

}  // namespace ctr

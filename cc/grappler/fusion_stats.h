// Process-wide counters of what CtrFusionOptimizer did, read by the
// CtrFusionStats op so Python can tell whether online rewriting happened.
#pragma once

#include <atomic>
#include <cstdint>

namespace tf_ctr {
namespace grappler {

struct FusionStats {
  std::atomic<int64_t> graphs{0};    // graphs the optimizer ran on
  std::atomic<int64_t> rewrites{0};  // subgraphs replaced by fused ops
  std::atomic<int64_t> skips{0};     // candidate subgraphs left alone
};

FusionStats& GlobalFusionStats();

}  // namespace grappler
}  // namespace tf_ctr

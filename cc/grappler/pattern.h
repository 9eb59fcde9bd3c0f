// The interface every fusion pattern of CtrFusionOptimizer implements, and
// their registry. Adding a pattern means adding one file that defines a
// FusionPattern and registers it with REGISTER_CTR_FUSION_PATTERN; it reads
// and changes the graph through a RewriteContext (rewrite_context.h) and
// the shared node helpers (node_match.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cc/grappler/node_match.h"
#include "cc/grappler/rewrite_context.h"
#include "tensorflow/core/framework/node_def.pb.h"

namespace tf_ctr {
namespace grappler {

class FusionPattern {
 public:
  virtual ~FusionPattern() = default;
  virtual std::string name() const = 0;
  // Rewrites the subgraph anchored at `anchor` and returns true, or returns
  // false, recording through ctx->Skipped why a subgraph of the right shape
  // was left alone. Must not touch the graph when it returns false.
  virtual bool Rewrite(const tensorflow::NodeDef& anchor, RewriteContext* ctx) const = 0;
  // Patterns run in stages: a stage runs only once the earlier ones have
  // nothing left to rewrite. 0: the fusions of TF subgraphs; 1: combining
  // fused ops (grouping); 2: combining groups (a concatenation of them); 3:
  // choosing a fused op's form for the serving device.
  virtual int Stage() const { return 0; }
};

// A pattern named by the constant Name, with the Skip every pattern uses:
// records why the subgraph at `anchor` was left alone and returns false, so a
// check reads `if (...) return Skip(ctx, anchor, "why");`.
template <const char* Name>
class NamedPattern : public FusionPattern {
 public:
  std::string name() const override { return Name; }

 protected:
  static bool Skip(RewriteContext* ctx, const tensorflow::NodeDef& anchor, const std::string& reason) {
    ctx->Skipped(Name, anchor.name(), reason);
    return false;
  }
};

std::vector<std::unique_ptr<FusionPattern>>& RegisteredPatterns();

struct PatternRegistration {
  explicit PatternRegistration(FusionPattern* p) { RegisteredPatterns().emplace_back(p); }
};

#define REGISTER_CTR_FUSION_PATTERN(Class) \
  static ::tf_ctr::grappler::PatternRegistration ctr_fusion_pattern_##Class(new Class())

}  // namespace grappler
}  // namespace tf_ctr

#include "cc/grappler/pattern.h"

namespace tf_ctr {
namespace grappler {

std::vector<std::unique_ptr<FusionPattern>>& RegisteredPatterns() {
  static auto* patterns = new std::vector<std::unique_ptr<FusionPattern>>();
  return *patterns;
}

}  // namespace grappler
}  // namespace tf_ctr

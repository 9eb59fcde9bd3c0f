// Pattern: a concatenated string embedding that will be served on a CPU --
//
//   CtrConcatStringEmbedding(tables, CtrPackStrings(strings), dense)
//
// where the graph is to be served on a CPU (the optimizer's serving_device
// parameter) or the op is placed on one, becomes
//
//   CtrConcatStringTensorEmbedding(tables, strings, dense)
//
// under the same name. The packed buffer is the GPU path's one
// host-to-device copy; on a CPU it is only a copy of every string, made on
// one thread before the pooling can start, which the op reading the string
// tensors in place does without. Exact: the two ops pool with the same code
// and fail with the same errors. Without a serving device, graphs keep the
// pack, which serves on either.
#include <string>
#include <vector>

#include "cc/grappler/pattern.h"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/platform/logging.h"

namespace tf_ctr {
namespace grappler {
namespace {

using tensorflow::NodeDef;

constexpr char kName[] = "string_tensors";
constexpr char kFusedOp[] = "CtrConcatStringTensorEmbedding";

class StringTensorsPattern : public NamedPattern<kName> {
 public:
  int Stage() const override { return 3; }

  bool Rewrite(const NodeDef& anchor, RewriteContext* ctx) const override {
    if (!IsOp(&anchor, "CtrConcatStringEmbedding")) return false;
    const std::string placed = DeviceType(anchor.device());
    const std::string serving = placed.empty() ? ctx->serving_device() : placed;
    if (serving != "CPU") return false;  // the pack is what a GPU (or either device) needs
    const GraphIndex& g = ctx->index();
    const int n = static_cast<int>(IntAttr(anchor, "N", 0));
    const NodeDef* pack = g.Producer(anchor, n);
    for (int port = 0; port < 3; ++port) {
      int at = -1;
      if (g.Producer(anchor, n + port, &at) != pack || at != port)
        return Skip(ctx, anchor, "its strings do not come from the three outputs of one CtrPackStrings");
    }
    if (!IsOp(pack, "CtrPackStrings")) return Skip(ctx, anchor, "its strings do not come from a CtrPackStrings");
    if (g.DataConsumers(pack->name()) != 3 || g.ControlConsumers(pack->name()) != 0 || ctx->MustKeep(pack->name()))
      return Skip(ctx, anchor, "another node reads or waits on its CtrPackStrings");
    const std::string pack_placed = DeviceType(pack->device());
    if (!pack_placed.empty() && pack_placed != "CPU")
      return Skip(ctx, anchor, "its CtrPackStrings is placed on " + pack->device());
    Replace(ctx, anchor, *pack);
    return true;
  }

 private:
  static void Replace(RewriteContext* ctx, const NodeDef& concat_in, const NodeDef& pack_in) {
    const NodeDef concat = concat_in, pack = pack_in;  // copies: the graph changes under the index
    const int n = static_cast<int>(IntAttr(concat, "N", 0));
    const int m = static_cast<int>(IntAttr(concat, "M", 0));
    std::vector<std::string> strings, controls;
    for (const std::string& in : pack.input()) (in[0] == '^' ? controls : strings).push_back(in);
    NodeDef* op = ctx->Mutable(concat.name());
    op->set_op(kFusedOp);
    op->clear_input();
    for (int i = 0; i < n; ++i) op->add_input(concat.input(i));
    for (const std::string& s : strings) op->add_input(s);
    for (int j = 0; j < m; ++j) op->add_input(concat.input(n + 3 + j));
    for (int i = n + 3 + m; i < concat.input_size(); ++i) controls.push_back(concat.input(i));
    AddControlInputsOnce(controls, op);
    auto& attr = *op->mutable_attr();
    attr["K"].set_i(static_cast<int64_t>(strings.size()));
    auto columns = pack.attr().find("columns");
    if (columns != pack.attr().end()) attr["columns"] = columns->second;
    ctx->Remove(pack.name(), concat.name());
    MatchRecord record{kName, concat.name(), kFusedOp, {Describe(pack), Describe(concat)}};
    VLOG(1) << "CtrFusionOptimizer: " << concat.name() << " reads its " << strings.size()
            << " string tensor(s) in place of " << pack.name();
    ctx->Matched(record);
  }
};

REGISTER_CTR_FUSION_PATTERN(StringTensorsPattern);

}  // namespace
}  // namespace grappler
}  // namespace tf_ctr

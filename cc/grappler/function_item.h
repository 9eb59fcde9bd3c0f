// A library function's body as a Grappler item, and the optimized body back
// as a FunctionDef, for the offline driver.
//
// Grappler's own MakeGrapplerFunctionItem instantiates the function into a
// Graph and writes that back as a GraphDef, and MakeFunctionDef reverses it;
// on a 1,000-feature model's body the round trip took 0.6 s of a 2 s rewrite,
// mostly building and freeing three copies of every node. This conversion
// rewrites the FunctionDef's input names in place of that, and produces the
// same item: `_Arg` nodes named after the arguments and carrying their
// `arg_attr`, `_Retval` nodes, default attrs filled in, nodes in topological
// order, the inputs as feeds, the outputs as fetches, the control outputs as
// kept ops and the reachable library.
//
// It takes the functions a TF2 concrete function is made of: typed by its
// signature, with no attr placeholders and no list arguments. For any other
// it returns Unimplemented and the driver uses Grappler's own conversion.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tensorflow/core/framework/function.h"
#include "tensorflow/core/framework/function.pb.h"
#include "tensorflow/core/framework/graph.pb.h"
#include "tensorflow/core/grappler/grappler_item.h"

namespace tf_ctr {
namespace grappler {

// The names of the `_Retval` node of each output, in signature order.
struct FunctionBodyNames {
  std::vector<std::string> retvals;
};

absl::Status MakeFunctionBodyItem(const tensorflow::FunctionDef& function,
                                  const tensorflow::FunctionLibraryDefinition& library, int producer,
                                  tensorflow::grappler::GrapplerItem* item, FunctionBodyNames* names);

// `function` with its body replaced by `body` (an optimized body of the item
// above): the signature, attrs and argument attrs are kept, the outputs are
// re-read from the `_Retval` nodes. Nodes are moved out of `body`.
absl::Status FunctionWithBody(const tensorflow::FunctionDef& function, const FunctionBodyNames& names,
                              const tensorflow::FunctionLibraryDefinition& library, tensorflow::GraphDef* body,
                              tensorflow::FunctionDef* out);

}  // namespace grappler
}  // namespace tf_ctr

// A Dense layer over concatenated one-hot / multi-hot / count encodings and
// dense columns (Keras' FeatureSpace with output_mode="concat", and any
// CategoryEncoding or lookup with a multi_hot/one_hot/count output_mode
// concatenated before a Dense), without the encodings.
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace {

using shape_inference::DimensionHandle;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// [B, units]: B from any ids or dense input, units from the kernel.
absl::Status MultiHotDenseShape(InferenceContext* c) {
  std::vector<DataType> id_types;
  int m;
  TF_RETURN_IF_ERROR(c->GetAttr("Tids", &id_types));
  TF_RETURN_IF_ERROR(c->GetAttr("M", &m));
  const int n = static_cast<int>(id_types.size());
  DimensionHandle rows = c->UnknownDim();
  ShapeHandle shape, kernel;
  for (int i = 0; i < n + m; ++i) {
    TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 2, &shape));
    TF_RETURN_IF_ERROR(c->Merge(rows, c->Dim(shape, 0), &rows));
  }
  TF_RETURN_IF_ERROR(c->WithRank(c->input(n + m), 2, &kernel));
  c->set_output(0, c->Matrix(rows, c->Dim(kernel, 1)));
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("CtrMultiHotDense")
    .Input("ids: Tids")
    .Input("dense: M * T")
    .Input("kernel: T")
    .Output("output: T")
    .Attr("Tids: list({int32, int64}) >= 1")
    .Attr("M: int >= 0 = 0")
    .Attr("T: {float, double}")
    .Attr("depths: list(int)")
    .Attr("binary_output: list(bool)")
    .Attr("drop_negative: list(bool) = []")
    .Attr("column_depths: list(int) = []")
    .Attr("layout: list(int) = []")
    .SetShapeFn(MultiHotDenseShape)
    .Doc(R"doc(
MatMul(ConcatV2(blocks, axis=1), kernel) where N of the blocks are
encodings DenseBincount(ids[i], size=depths[i], binary_output[i]) of [B, L_i]
id matrices and M are dense [B, w_j] matrices, without building the
encodings. Each encoded block adds, per row, the kernel rows its distinct ids
name (offset by the block's first column), times their counts unless
binary_output[i]; a dense block adds dense[j] times its kernel rows.
The output is [B, units], kernel [total width, units].

Ids >= depths[i] count for nothing, as DenseBincount drops them. A negative
id is an InvalidArgument naming the block, the row and the id, as
DenseBincount rejects it; with drop_negative[i] it counts for nothing instead,
as OneHot gives it a row of zeros (a one-hot block, OneHot(ids[i][:, 0], depth)).
The dense blocks are multiplied by their kernel rows as a matrix product,
then each row's encoded kernel rows are added in increasing column order; the
sums agree with the MatMul's to rounding. The encodings' zero columns are
never read: a kernel row holding inf or NaN that no id names leaves the
output finite, where the MatMul multiplies it by 0.
drop_negative: per ids input, empty for all false.
column_depths: per ids input, empty for all 0. d > 0: block i is the one-hot
  encodings of its S id columns side by side, each of depth d (OneHot of
  [B, S] ids reshaped to [B, S * d], as TF1's input_layer flattens a
  bucketized column): column s's id k in [0, d) names kernel row s * d + k,
  any other id none; depths[i] must be S * d.
layout: the order of the column blocks: i < N is encoded block i, N + j dense
  block j; empty: the encoded blocks, then the dense ones.
)doc");

}  // namespace tensorflow

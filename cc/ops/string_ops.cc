// StringEmbedding: strings of delimited ids pooled straight from packed bytes,
// replacing StringSplit(V2) + StringToNumber / StringToHashBucketFast +
// SparseTensor assembly + the embedding lookup.
#include <vector>

#include "cc/ops/pooled_shape.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tensorflow {
namespace {

using shape_inference::DimensionHandle;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

// The rows of a splits vector; a known empty one (no offset at all) is an
// error here, as it is when the kernel runs.
absl::Status RowsFromSplits(InferenceContext* c, int input, const char* name, DimensionHandle* rows) {
  const DimensionHandle n = c->Dim(c->input(input), 0);
  *rows = c->UnknownDim();
  if (!c->ValueKnown(n)) return absl::OkStatus();
  if (c->Value(n) == 0) return errors::InvalidArgument(name, " must hold at least one offset, got shape [0]");
  return c->Subtract(n, 1, rows);
}

// Columns of one [B, C] matrix: K * B strings.
absl::Status PackColumnsShape(InferenceContext* c, int64_t num_columns) {
  ShapeHandle in;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &in));
  DimensionHandle strings, splits;
  TF_RETURN_IF_ERROR(c->Multiply(c->Dim(in, 0), num_columns, &strings));
  TF_RETURN_IF_ERROR(c->Add(strings, 1, &splits));
  c->set_output(0, c->Vector(c->UnknownDim()));
  c->set_output(1, c->Vector(splits));
  c->set_output(2, c->Vector(num_columns + 1));
  return absl::OkStatus();
}

// Every input's strings in row-major order (a scalar is one string, [B, 1]
// is B); row_splits has one entry per string of all inputs, plus one.
absl::Status PackShape(InferenceContext* c) {
  std::vector<int64_t> columns;
  TF_RETURN_IF_ERROR(c->GetAttr("columns", &columns));
  if (!columns.empty()) {
    if (c->num_inputs() != 1)
      return tensorflow::errors::InvalidArgument("CtrPackStrings with columns takes one [B, C] input, got ",
                                                 c->num_inputs());
    return PackColumnsShape(c, static_cast<int64_t>(columns.size()));
  }
  DimensionHandle strings = c->MakeDim(0);
  for (int i = 0; i < c->num_inputs(); ++i) {
    const DimensionHandle n = c->NumElements(c->input(i));
    TF_RETURN_IF_ERROR(c->Add(strings, n, &strings));
  }
  DimensionHandle splits;
  TF_RETURN_IF_ERROR(c->Add(strings, 1, &splits));
  c->set_output(0, c->Vector(c->UnknownDim()));
  c->set_output(1, c->Vector(splits));
  c->set_output(2, c->Vector(c->num_inputs() + 1));
  return absl::OkStatus();
}

absl::Status StringEmbeddingShape(InferenceContext* c) {
  ShapeHandle params, unused;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &params));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &unused));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &unused));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 1, &unused));
  bool bagged;
  TF_RETURN_IF_ERROR(c->GetAttr("bagged", &bagged));
  DimensionHandle rows;
  TF_RETURN_IF_ERROR(RowsFromSplits(c, bagged ? 3 : 2, bagged ? "bag_splits" : "row_splits", &rows));
  c->set_output(0, c->Matrix(rows, c->Dim(params, 1)));
  return absl::OkStatus();
}

absl::Status StringGradShape(InferenceContext* c) {
  ShapeHandle params;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &params));
  c->set_output(0, c->Matrix(c->UnknownDim(), c->Dim(params, 1)));
  c->set_output(1, c->Vector(c->UnknownDim()));
  return absl::OkStatus();
}

absl::Status MultiShape(InferenceContext* c) {
  int n;
  TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
  DimensionHandle batch = c->UnknownDim();
  DimensionHandle splits = c->Dim(c->input(n + 1), 0);
  if (c->ValueKnown(splits) && c->Value(splits) > 0)
    batch = c->MakeDim((c->Value(splits) - 1) / n);
  for (int i = 0; i < n; ++i) {
    ShapeHandle params;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 2, &params));
    c->set_output(i, c->Matrix(batch, c->Dim(params, 1)));
  }
  return absl::OkStatus();
}

// [R, sum of the D_i and dense widths]: R is known from a dense input, or
// only at run time (trimmed features).
// [R, sum of the tables' and dense inputs' widths] for the concatenated ops,
// whose dense inputs start at input first_dense.
absl::Status ConcatOutputShape(InferenceContext* c, int first_dense) {
  int n, m;
  TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
  TF_RETURN_IF_ERROR(c->GetAttr("M", &m));
  DimensionHandle width = c->MakeDim(0), rows = c->UnknownDim();
  for (int i = 0; i < n; ++i) {
    ShapeHandle params;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 2, &params));
    TF_RETURN_IF_ERROR(c->Add(width, c->Dim(params, 1), &width));
  }
  for (int j = 0; j < m; ++j) {
    ShapeHandle dense;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(first_dense + j), 2, &dense));
    TF_RETURN_IF_ERROR(c->Add(width, c->Dim(dense, 1), &width));
    TF_RETURN_IF_ERROR(c->Merge(rows, c->Dim(dense, 0), &rows));
  }
  c->set_output(0, c->Matrix(rows, width));
  return absl::OkStatus();
}

absl::Status ConcatShape(InferenceContext* c) {
  int n;
  TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
  ShapeHandle unused;
  for (int i = n; i < n + 3; ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &unused));
  return ConcatOutputShape(c, n + 3);
}

absl::Status ConcatTensorShape(InferenceContext* c) {
  int n, k;
  TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
  TF_RETURN_IF_ERROR(c->GetAttr("K", &k));
  return ConcatOutputShape(c, n + k);
}

constexpr char kStringAttrsDoc[] = R"doc(
id_mode: "hash": row = to_hash_bucket_fast(token, V). "index": row =
  to_number(token, int64), which must parse and lie in [0, V). "mod": the parsed
  number floor-mod V. Rejected tokens are InvalidArgument errors naming the row
  and the token.
delimiter: the separator (tf.strings.split semantics: the full string, left to
  right); empty: each string is one token. At most 16 bytes.
skip_empty: drop empty tokens (tf.compat.v1.string_split); else keep them
  (tf.strings.split), so an empty string is one empty token.
combiner: "sum", "mean" or "sqrtn" over the tokens of a bag (weights 1).
max_norm: clip each looked-up row to this L2 norm first; <= 0 disables.
bagged: false: each string is a bag; true: bag_splits group the strings.
num_buckets: hash mode only: the bucket count of the hash (0: V); a bucket
  outside the table is an error, as the Gather it replaces says.
hash_key: hash mode only: empty (to_hash_bucket_fast), or two integers that
  make the hash to_hash_bucket_strong(token, V, key) (SipHash-2-4).
trim_empty_tail: output only the rows up to the last bag that has a token,
  as tf.nn.embedding_lookup_sparse does (its row count is the last row id + 1).
invalid_ids: index mode: "error" rejects a negative id as out of range;
  "skip_negative" drops it, as tf.nn.safe_embedding_lookup_sparse prunes ids
  < 0 (it counts toward no combiner).
default_id: the row of a bag left without tokens (safe_embedding_lookup_sparse's
  default_id); -1 gives zeros.
)doc";

}  // namespace

REGISTER_OP("CtrPackStrings")
    .Input("strings: N * string")
    .Output("bytes: uint8")
    .Output("row_splits: int64")
    .Output("input_splits: int64")
    .Attr("N: int >= 1 = 1")
    .Attr("equal_sizes: bool = false")
    .Attr("columns: list(int) = []")
    .SetShapeFn(PackShape)
    .Doc(R"doc(
Packs tensors of strings, each in row-major order (a scalar is one string, a
[B, 1] column B strings), into one contiguous uint8
buffer and int64 row_splits [B+1] of byte offsets, B being the strings of all
N inputs in order, with no allocation per string. This buffer is the single
host-to-device copy of the GPU string path; N > 1 packs the features of a
grouped op without first concatenating them as strings. input_splits [K+1]
(host memory) says which strings came from where: input (or column) k's are
[input_splits[k], input_splits[k+1]).

equal_sizes: every input must hold as many strings as the first (the features
  of one batch, which a grouped op splits into N equal parts); otherwise
  InvalidArgument naming the input and both sizes.
columns: when not empty, N is 1 and the input is a [B, C] matrix (one column
  per feature, as models take their categorical fields); the strings packed
  are column columns[0] (rows 0..B-1), then columns[1], and so on: what
  packing the slices x[:, c] would give, without slicing (copying) them
  first. A column outside [0, C) is InvalidArgument.
)doc");

#define CTR_STRING_ATTRS                                              \
  Attr("T: {float, half, bfloat16}")                                  \
      .Attr("combiner: {'sum', 'mean', 'sqrtn'} = 'mean'")            \
      .Attr("id_mode: {'hash', 'index', 'mod'} = 'hash'")             \
      .Attr("delimiter: string = ','")                                \
      .Attr("skip_empty: bool = true")                                \
      .Attr("max_norm: float = -1.0")                                 \
      .Attr("bagged: bool = false")                                   \
      .Attr("num_buckets: int = 0")                                   \
      .Attr("hash_key: list(int) = []")                               \
      .Attr("trim_empty_tail: bool = false")                          \
      .Attr("invalid_ids: {'error', 'skip_negative'} = 'error'")      \
      .Attr("default_id: int = -1")

REGISTER_OP("CtrStringEmbedding")
    .Input("params: T")
    .Input("bytes: uint8")
    .Input("row_splits: int64")
    .Input("bag_splits: int64")
    .Output("output: T")
    .CTR_STRING_ATTRS
    .CTR_GRAD_FORM_ATTRS
    .SetShapeFn(StringEmbeddingShape)
    .Doc(std::string(R"doc(
Pools the tokens of packed strings into rows of `params` [V, D]. With
bagged=false each string is a bag and the output is [B, D] for row_splits
[B+1]; with bagged=true bag r holds strings [bag_splits[r], bag_splits[r+1])
(string keys grouped by a RaggedTensor). row_splits are byte offsets into
`bytes`; they must be non-decreasing and inside the buffer.
)doc") + kStringAttrsDoc + ctr_shapes::kGradFormAttrsDoc);

REGISTER_OP("CtrStringEmbeddingGrad")
    .Input("grad: T")
    .Input("params: T")
    .Input("bytes: uint8")
    .Input("row_splits: int64")
    .Input("bag_splits: int64")
    .Output("values: T")
    .Output("indices: int64")
    .CTR_STRING_ATTRS
    .Attr("empty_grad_row: int = -1")
    .SetShapeFn(StringGradShape)
    .Doc(std::string(R"doc(
Gradient of CtrStringEmbedding with respect to params, as IndexedSlices rows:
one per token, computed from the packed bytes without re-splitting in Python.
empty_grad_row: without default_id, a bag with no token gets one zero row
  naming this row (-1: none; a row past the table: none), as TF's safe lookup
  fills such a bag with that id and zeroes its output.
)doc") + kStringAttrsDoc);

#undef CTR_STRING_ATTRS

// The grouped ops' per-feature attributes.
#define CTR_MULTI_STRING_ATTRS                   \
  Attr("N: int >= 1")                            \
      .Attr("T: {float, half, bfloat16}")        \
      .Attr("combiners: list(string)")           \
      .Attr("id_modes: list(string)")            \
      .Attr("delimiters: list(string)")          \
      .Attr("skip_empty: list(bool)")            \
      .Attr("max_norms: list(float)")            \
      .Attr("num_buckets: list(int) = []")       \
      .Attr("keyed_features: list(int) = []")    \
      .Attr("hash_keys: list(int) = []")         \
      .Attr("grad_indices: list(string) = []")   \
      .Attr("empty_grad_rows: list(int) = []")

REGISTER_OP("CtrMultiStringEmbedding")
    .Input("params: N * T")
    .Input("bytes: uint8")
    .Input("row_splits: int64")
    .Output("outputs: N * T")
    .CTR_MULTI_STRING_ATTRS
    .SetShapeFn(MultiShape)
    .Doc(std::string(R"doc(
The grouped StringEmbedding: N string features of one batch B, packed
feature-major into one buffer (row_splits [N*B+1]), pooled in one launch into
N outputs [B, D_i]. The per-feature attribute lists (combiners, id_modes,
delimiters, skip_empty, max_norms) have length N, each entry with the meaning
of the same attribute of CtrStringEmbedding; so has num_buckets, which may
also be empty (every feature hashes into its whole table). keyed_features
lists the features whose hash is keyed (CtrStringEmbedding's hash_key), in
increasing order, and hash_keys their keys, two integers each in that order;
every other feature hashes with to_hash_bucket_fast. grad_indices and
empty_grad_rows hold each feature's CtrStringEmbedding grad_indices and
empty_grad_row (empty: "per_id" and -1 for every one).
)doc"));

REGISTER_OP("CtrConcatStringEmbedding")
    .Input("params: N * T")
    .Input("bytes: uint8")
    .Input("row_splits: int64")
    .Input("input_splits: int64")
    .Input("dense: M * T")
    .Output("output: T")
    .CTR_MULTI_STRING_ATTRS
    .Attr("trim_empty_tail: list(bool) = []")
    .Attr("M: int >= 0 = 0")
    .Attr("layout: list(int) = []")
    .SetShapeFn(ConcatShape)
    .Doc(R"doc(
The grouped StringEmbedding with its N outputs concatenated along axis 1, as
the Concatenate before a CTR model's MLP takes them: one [R, D_1 + ... + D_N]
output written in place, with no copy of the N pooled outputs. Feature i's
strings are [input_splits[i], input_splits[i+1]) of row_splits (the third
output of CtrPackStrings), so features may hold different numbers of strings.
Each per-feature attribute list has the meaning of CtrMultiStringEmbedding's;
trim_empty_tail (empty: none) that of CtrStringEmbedding's.

R is each feature's row count: its strings, or with trim_empty_tail the bags
through its last one with a token. Features whose row counts differ are an
InvalidArgument naming them, where concatenating the separate outputs fails.

dense: M other [R, w_j] matrices of the concatenation (numeric features, say),
  copied into their columns.
layout: the order of the output's column blocks: i < N is feature i, N + j
  dense input j; empty: the features, then the dense inputs.
)doc");

REGISTER_OP("CtrConcatStringTensorEmbedding")
    .Input("params: N * T")
    .Input("strings: K * string")
    .Input("dense: M * T")
    .Output("output: T")
    .CTR_MULTI_STRING_ATTRS
    .Attr("K: int >= 1")
    .Attr("columns: list(int) = []")
    .Attr("trim_empty_tail: list(bool) = []")
    .Attr("M: int >= 0 = 0")
    .Attr("layout: list(int) = []")
    .SetShapeFn(ConcatTensorShape)
    .Doc(R"doc(
CtrConcatStringEmbedding on the string tensors themselves, for CPU serving:
the same output, bit for bit, and the same errors, with no CtrPackStrings
before it. The packed buffer is the GPU path's single host-to-device copy; on
a CPU it is a copy of every string that the pooling then reads again, so this
form reads each string where it is (a whole-string key is hashed in place)
and copies an id list only into a small buffer of the thread that pools it.
It has a CPU kernel only. CtrFusionOptimizer emits it where the rewritten
model is to be served on a CPU (its serving_device parameter, or a CPU
placement).

strings: K tensors of strings: one per feature (K = N, each row-major, as
  CtrPackStrings reads them), or with columns a single [B, C] matrix (K = 1)
  whose column columns[i] is feature i.
Every other input and attribute is CtrConcatStringEmbedding's.
)doc");

#undef CTR_MULTI_STRING_ATTRS

}  // namespace tensorflow

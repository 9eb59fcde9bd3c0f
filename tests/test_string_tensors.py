"""CtrConcatStringTensorEmbedding (the concatenated string embedding on the
string tensors themselves, for CPU serving) and the string_tensors pattern
that turns a pack and a concatenated op into it when the graph is to be
served on a CPU.

The op must be the packed op exactly: every output bit, every gradient, every
error message, on the same inputs.
"""

import re

import numpy as np
import pytest
import tensorflow as tf

from tf_ctr_ops import rewrite
from tf_ctr_ops.strings import _ops as string_ops
from test_rewrite import run_graph_def
from test_rewrite_concat import (STRINGS_1D, attr_lists, concat_matches, ctr_features, ctr_inputs, keys,
                                 numeric_lists)
from test_rewrite_dense import assert_identical, fused_ops
from test_rewrite_group import V, id_lists, tables


def packed_op(ts, strings, attrs, columns=(), **extra):
    data, splits, input_splits = string_ops.ctr_pack_strings(strings, columns=list(columns))
    return string_ops.ctr_concat_string_embedding(params=ts, bytes=data, row_splits=splits,
                                                  input_splits=input_splits, **attr_lists(attrs, **extra))


def tensor_op(ts, strings, attrs, columns=(), **extra):
    return string_ops.ctr_concat_string_tensor_embedding(params=ts, strings=strings, columns=list(columns),
                                                         **attr_lists(attrs, **extra))


def long_lists(rng, n):
    """Hex-key lists longer than a split chunk (32 bytes) and a word, with
    multi-byte delimiters: the local buffers' tails are read."""
    return ["::".join(f"{int(k):08x}" for k in rng.integers(0, 2**32, size=rng.integers(0, 9)))
            for _ in range(n)]


def features(rng, n):
    """(strings, attrs) of every kind the op takes: whole-string keys (some
    empty), hashed and numeric lists, mod ids, clipped rows, trimmed tails."""
    cats = keys(rng, n)
    for i in range(0, n, 7):
        cats[i] = ""
    return [
        (cats, dict(combiner="sum", id_mode="hash", delimiter="", skip_empty=True)),
        (keys(rng, n), dict(combiner="sum", id_mode="hash", delimiter="", skip_empty=False, num_buckets=V)),
        (numeric_lists(rng, n, min_len=1), dict(combiner="mean", id_mode="index", delimiter="|", skip_empty=False)),
        (id_lists(rng, n, sep=","), dict(combiner="sqrtn", id_mode="hash", delimiter=",", skip_empty=True,
                                         max_norm=0.5)),
        (long_lists(rng, n), dict(combiner="mean", id_mode="hash", delimiter="::", skip_empty=True)),
        ([s.replace("|", ";") for s in numeric_lists(rng, n)], dict(combiner="sum", id_mode="mod", delimiter=";",
                                                                     skip_empty=True)),
        (numeric_lists(rng, n, empty_tokens=True)[:-1] + ["3"],
         dict(combiner="sqrtn", id_mode="index", delimiter="|", skip_empty=True, trim_empty_tail=True)),
    ]


DIMS = (8, 4, 16, 8, 3, 5, 8)


@pytest.mark.parametrize("n", [0, 1, 2, 33, 1500])
def test_the_op_is_the_packed_op_bit_for_bit(rng, n):
    ts = tables(rng, dims=DIMS)
    feats = features(rng, n) if n else [([], a) for _, a in features(rng, 3)]
    if n == 0:
        feats[-1][1]["trim_empty_tail"] = True
    strings = [tf.constant(s, tf.string) for s, _ in feats]
    attrs = [a for _, a in feats]
    want = packed_op(ts, strings, attrs)
    got = tensor_op(ts, strings, attrs)
    assert got.shape == (n, sum(DIMS))
    assert_identical(got, want)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
def test_half_precision_tables(rng, dtype):
    ts = [tf.cast(t, dtype) for t in tables(rng, dims=DIMS)]
    feats = features(rng, 40)
    strings = [tf.constant(s, tf.string) for s, _ in feats]
    attrs = [a for _, a in feats]
    got = tensor_op(ts, strings, attrs)
    assert got.dtype == dtype
    assert_identical(got, packed_op(ts, strings, attrs))


def test_dense_inputs_and_layout(rng):
    ts = tables(rng, dims=(8, 4))
    feats = features(rng, 20)[:2]
    strings = [tf.constant(s, tf.string) for s, _ in feats]
    attrs = [a for _, a in feats]
    dense = [tf.constant(rng.normal(size=(20, 3)).astype(np.float32)),
             tf.constant(rng.normal(size=(20, 1)).astype(np.float32))]
    extra = dict(dense=dense, layout=[2, 0, 3, 1])
    got = tensor_op(ts, strings, attrs, **extra)
    assert got.shape == (20, 16)
    assert_identical(got, packed_op(ts, strings, attrs, **extra))
    np.testing.assert_array_equal(got[:, :3], dense[0])


def test_columns_of_one_matrix(rng):
    ts = tables(rng, dims=(8, 4, 8))
    cats = [keys(rng, 30), keys(rng, 30), id_lists(rng, 30, sep=",")]
    matrix = tf.constant(np.array(cats, dtype=object).T)
    attrs = [dict(combiner="sum", id_mode="hash", delimiter="", skip_empty=True)] * 2 + [
        dict(combiner="mean", id_mode="hash", delimiter=",", skip_empty=True)]
    got = tensor_op(ts, [matrix], attrs, columns=[2, 0, 1])
    assert_identical(got, packed_op(ts, [matrix], attrs, columns=[2, 0, 1]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="column 3 is outside the input's 3 columns"):
        tensor_op(ts, [matrix], attrs, columns=[0, 1, 3])


@pytest.mark.parametrize("where", ["key", "list", "trimmed tail"])
def test_bad_tokens_fail_with_the_packed_ops_message(rng, where):
    ts = tables(rng, dims=DIMS)
    feats = features(rng, 50)
    f, row, token = {"key": (1, 7, None), "list": (2, 31, "x7"), "trimmed tail": (6, 50, "12x")}[where]
    strings = [list(s) for s, _ in feats]
    if where == "key":
        attrs_f = dict(feats[f][1], num_buckets=V + 5)  # a bucket past the table
        feats[f] = (feats[f][0], attrs_f)
        strings[f] = [f"k{i}" for i in range(50)]
    elif where == "trimmed tail":
        strings[f] = strings[f] + [token]  # past the last row with an id: no output row
    else:
        strings[f][row] = "1|" + token
    tensors = [tf.constant(s, tf.string) for s in strings]
    attrs = [a for _, a in feats]
    with pytest.raises(tf.errors.InvalidArgumentError) as packed_error:
        packed_op(ts, tensors, attrs)
    with pytest.raises(tf.errors.InvalidArgumentError) as tensor_error:
        tensor_op(ts, tensors, attrs)
    message = op_message(tensor_error.value)
    assert message == op_message(packed_error.value)
    assert message.startswith(f"feature {f}: token '")
    if token:
        assert f"token '{token}' in row {row}" in message


def op_message(error):
    """The kernel's own message, without TF's op name around it."""
    return re.sub(r" \[Op:\w+\].*$", "", re.sub(r"^\{\{[^}]*\}\}\s*", "", error.message), flags=re.S)


def test_row_counts_that_differ_fail(rng):
    ts = tables(rng, dims=(8, 4))
    attrs = [dict(combiner="sum", id_mode="hash", delimiter="", skip_empty=True)] * 2
    strings = [tf.constant(keys(rng, 5)), tf.constant(keys(rng, 6))]
    with pytest.raises(tf.errors.InvalidArgumentError, match="feature 1 has 6 rows where feature 0 has 5"):
        tensor_op(ts, strings, attrs)


def test_bad_input_splits_are_named_as_such(rng):
    # The message read "input_splits: row_splits must be non-decreasing ... (strings)".
    ts = tables(rng, dims=(8, 4))
    attrs = [dict(combiner="sum", id_mode="hash", delimiter="", skip_empty=True)] * 2
    data, splits, _ = string_ops.ctr_pack_strings([tf.constant(keys(rng, 3))] * 2)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"input_splits must be non-decreasing: input_splits\[2\] = 1 < input_splits\[1\] = 3"):
        string_ops.ctr_concat_string_embedding(params=ts, bytes=data, row_splits=splits,
                                               input_splits=tf.constant([0, 3, 1], tf.int64),
                                               **attr_lists(attrs))


def test_a_string_count_that_is_not_n_fails_at_construction(rng):
    ts = tables(rng, dims=(8, 4))
    attrs = [dict(combiner="sum", id_mode="hash", delimiter="", skip_empty=True)] * 2
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError, TypeError)):
        tensor_op(ts, [tf.constant(keys(rng, 5))], attrs)


def test_gradient_is_the_packed_ops(rng):
    ts = [tf.Variable(t) for t in tables(rng, dims=DIMS)]
    feats = features(rng, 60)
    strings = [tf.constant(s, tf.string) for s, _ in feats]
    attrs = [a for _, a in feats]
    upstream = tf.constant(rng.normal(size=(60, sum(DIMS))).astype(np.float32))
    grads = {}
    for name, op in (("packed", packed_op), ("tensor", tensor_op)):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(op(ts, strings, attrs) * upstream)
        grads[name] = [tf.convert_to_tensor(g) for g in tape.gradient(loss, ts)]
    for want, got in zip(grads["packed"], grads["tensor"]):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert any(np.abs(g.numpy()).sum() > 0 for g in grads["tensor"])


def rewritten(f, serving_device, n_inputs=4):
    cf = tf.function(f).get_concrete_function(*[STRINGS_1D] * n_inputs)
    graph, report = rewrite.optimize_concrete_function(cf, serving_device=serving_device)
    return cf, graph, report


def test_cpu_serving_reads_the_string_tensors_in_place(rng):
    f = ctr_features(tables(rng, dims=(8, 4, 16, 8)))
    cf, graph, report = rewritten(f, "cpu")
    assert fused_ops(graph) == {"CtrConcatStringTensorEmbedding": 1}
    assert len(concat_matches(report)) == 1 and report["skip"] == []
    [match] = [m for m in report["match"] if m["pattern"] == "string_tensors"]
    assert match["fused_op"] == "CtrConcatStringTensorEmbedding"
    assert any("CtrPackStrings" in r for r in match["replaced"])
    for n in (1, 31, 500):
        args = ctr_inputs(rng, n, extra_tail=["", "||"])
        [got] = run_graph_def(cf, graph, *args)
        assert_identical(got, f(*args))


@pytest.mark.parametrize("serving_device", [None, "gpu"])
def test_other_serving_devices_keep_the_pack(rng, serving_device):
    f = ctr_features(tables(rng, dims=(8, 4, 16, 8)))
    cf, graph, report = rewritten(f, serving_device)
    assert fused_ops(graph) == {"CtrPackStrings": 1, "CtrConcatStringEmbedding": 1}
    assert not [m for m in report["match"] if m["pattern"] == "string_tensors"]


def test_a_cpu_placement_reads_in_place_without_a_serving_device(rng):
    t = tables(rng, dims=(8, 4, 16, 8))

    def f(*args):
        with tf.device("/device:CPU:0"):
            return ctr_features(t)(*args)

    cf, graph, report = rewritten(f, None)
    assert fused_ops(graph) == {"CtrConcatStringTensorEmbedding": 1}
    args = ctr_inputs(rng, 40)
    [got] = run_graph_def(cf, graph, *args)
    assert_identical(got, f(*args))


def test_an_unknown_serving_device_is_refused():
    with pytest.raises(ValueError, match="serving_device must be one of"):
        rewrite.session_config(serving_device="tpu")


def test_online_cpu_serving(rng):
    f = ctr_features(tables(rng, dims=(8, 4, 16, 8)))
    args = ctr_inputs(rng, 64)
    with rewrite.enable(serving_device="cpu"):
        fn = tf.function(f)
        got = fn(*args)
    assert_identical(got, f(*args))

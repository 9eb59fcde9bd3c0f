"""CtrConcatStringEmbedding and the concat_strings pattern: string features
concatenated along axis 1 (the MLP's input) become one pack and one op that
writes the concatenation in place -- TF1 string_split features, whose row
counts are trimmed at run time, included.
"""

import numpy as np
import pytest
import tensorflow as tf

import tf_ctr_ops
from tf_ctr_ops.strings import _ops as string_ops
from test_rewrite import CPU_PASS, offline, read_csv, run_graph_def, run_online
from test_rewrite_dense import assert_identical, fused_ops, random_strings
from test_rewrite_group import V, id_lists, ragged_sum, tables

STRINGS_1D = tf.TensorSpec([None], tf.string)
NO_BAGS = tf.zeros([0], tf.int64)


def keys(rng, n):
    """n random strings (random_strings always starts with three)."""
    return random_strings(rng, max(n, 3))[:n]


def concat_matches(report):
    return [m for m in report["match"] if m["pattern"] == "concat_strings"]


def assert_both_fail(f, cf, graph, args, match):
    """The original function fails on args with an InvalidArgument, and so
    does the rewritten graph, its message matching `match`."""
    with pytest.raises(tf.errors.InvalidArgumentError):
        f(*args)
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        run_graph_def(cf, graph, *args)


def numeric_lists(rng, n, sep="|", min_len=0, max_len=4, empty_tokens=False):
    """Id lists like "3|17"; some rows empty (unless min_len), some with empty
    tokens ("3||4")."""
    out = []
    for _ in range(n):
        ids = [str(i) for i in rng.integers(0, V, size=rng.integers(min_len, max_len + 1))]
        if empty_tokens and ids and rng.random() < 0.3:
            ids.insert(int(rng.integers(0, len(ids) + 1)), "")
        out.append(sep.join(ids))
    return out


# Features: (strings, attrs of the single op); the reference pools each on its
# own and concatenates.
def feature_set(rng, n):
    return [
        (keys(rng, n), dict(combiner="sum", id_mode="hash", delimiter="", skip_empty=False, num_buckets=V)),
        (numeric_lists(rng, n, min_len=1), dict(combiner="mean", id_mode="index", delimiter="|", skip_empty=False)),
        (id_lists(rng, n, sep=","), dict(combiner="sqrtn", id_mode="hash", delimiter=",", skip_empty=True)),
        (numeric_lists(rng, n, empty_tokens=True), dict(combiner="sqrtn", id_mode="index", delimiter="|",
                                                        skip_empty=True, trim_empty_tail=True)),
    ]


def single(table, strings, **attrs):
    data, splits, _ = string_ops.ctr_pack_strings([tf.constant(strings, tf.string)])
    return string_ops.ctr_string_embedding(table, data, splits, NO_BAGS, **attrs)


def attr_lists(attrs, **extra):
    """The concatenated ops' attribute lists from per-feature attrs (and
    their other inputs and attributes in `extra`)."""
    lists = dict(combiners=[a["combiner"] for a in attrs], id_modes=[a["id_mode"] for a in attrs],
                 delimiters=[a["delimiter"] for a in attrs], skip_empty=[a["skip_empty"] for a in attrs],
                 max_norms=[a.get("max_norm", -1.0) for a in attrs],
                 num_buckets=[a.get("num_buckets", 0) for a in attrs],
                 trim_empty_tail=[a.get("trim_empty_tail", False) for a in attrs])
    lists.update(extra)
    lists.setdefault("dense", [])
    return lists


def concat_op(ts, features, attrs, **extra):
    data, splits, input_splits = string_ops.ctr_pack_strings([tf.constant(s, tf.string) for s in features])
    return string_ops.ctr_concat_string_embedding(params=ts, bytes=data, row_splits=splits,
                                                  input_splits=input_splits, **attr_lists(attrs, **extra))


@pytest.mark.parametrize("dtype", [tf.float32, tf.float16, tf.bfloat16])
@pytest.mark.parametrize("batch", [1, 37, 700])
def test_concat_op_equals_the_concatenated_single_ops(rng, dtype, batch):
    features = feature_set(rng, batch)
    features[3][0][-1] = "5"  # the trimmed feature keeps every row
    ts = [tf.cast(t, dtype) for t in tables(rng, dims=(8, 4, 3, 16))]
    got = concat_op(ts, [s for s, _ in features], [a for _, a in features])
    want = tf.concat([single(t, s, **a) for t, (s, a) in zip(ts, features)], axis=1)
    assert got.dtype == dtype and got.shape == (batch, 8 + 4 + 3 + 16)
    np.testing.assert_array_equal(tf.cast(got, tf.float32).numpy(), tf.cast(want, tf.float32).numpy())


def tf1_sqrtn(table, strings, sep="|"):
    """What tf.compat.v1.string_split + embedding_lookup_sparse compute (rows:
    the last row with an id, + 1)."""
    sp = tf.compat.v1.string_split(tf.constant(strings, tf.string), sep)
    ids = tf.SparseTensor(sp.indices, tf.strings.to_number(sp.values, tf.int64), sp.dense_shape)
    return tf.nn.embedding_lookup_sparse(table, ids, None, combiner="sqrtn")


def test_trimmed_feature_longer_than_the_batch_with_an_empty_tail(rng):
    """A TF1 feature whose strings past the batch hold no token concatenates
    in TF (its output is trimmed to the batch); so it does here."""
    t = tables(rng, dims=(8, 4))
    a = numeric_lists(rng, 6, min_len=1)
    b = numeric_lists(rng, 6)[:5] + ["7", "", "||", ""]  # 9 strings, a token through row 5
    attrs = [dict(combiner="sum", id_mode="index", delimiter="|", skip_empty=False),
             dict(combiner="sqrtn", id_mode="index", delimiter="|", skip_empty=True, trim_empty_tail=True)]
    got = concat_op(t, [a, b], attrs)
    a_native = tf.reduce_sum(tf.nn.embedding_lookup(
        t[0], tf.strings.to_number(tf.strings.split(tf.constant(a), "|"), tf.int64)), axis=1)
    want = tf.concat([a_native, tf1_sqrtn(t[1], b)], axis=1)
    assert got.shape == (6, 12)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("case", ["trimmed_longer", "trimmed_shorter", "untrimmed"])
def test_row_counts_that_differ_fail_as_the_concat_does(rng, case):
    t = tables(rng, dims=(8, 4))
    a = numeric_lists(rng, 6, min_len=1)
    trim = case != "untrimmed"
    b = {"trimmed_longer": numeric_lists(rng, 6) + ["", "3"],  # a token in row 7: 8 rows
         "trimmed_shorter": ["1", "2", "", "", "", ""],  # 2 rows
         "untrimmed": ["1"] * 7}[case]
    attrs = [dict(combiner="sum", id_mode="index", delimiter="|", skip_empty=False),
             dict(combiner="sqrtn", id_mode="index", delimiter="|", skip_empty=True, trim_empty_tail=trim)]
    rows = {"trimmed_longer": 8, "trimmed_shorter": 2, "untrimmed": 7}[case]
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.concat([single(t[0], a, **attrs[0]), single(t[1], b, **attrs[1])], axis=1)
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"feature 1 has {rows} rows where feature 0 has 6"):
        concat_op(t, [a, b], attrs)


def test_bad_tokens_name_the_feature_and_row(rng):
    t = tables(rng, dims=(8, 4))
    attrs = [dict(combiner="sum", id_mode="hash", delimiter="", skip_empty=False),
             dict(combiner="sqrtn", id_mode="index", delimiter="|", skip_empty=True, trim_empty_tail=True)]
    with pytest.raises(tf.errors.InvalidArgumentError, match="feature 1: token 'x7' in row 2 is not an int64"):
        concat_op(t, [["a", "b", "c", "d"], ["1", "2", "3|x7", "4"]], attrs)
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"feature 1: token '{V}' in row 0 is id {V}, out of range"):
        concat_op(t, [["a", "b", "c"], [str(V), "2", "3"]], attrs)
    # Past the other features' rows, in the trimmed tail: still the token's error.
    with pytest.raises(tf.errors.InvalidArgumentError, match="feature 1: token 'y' in row 4"):
        concat_op(t, [["a", "b", "c"], ["1", "2", "3", "", "y", ""]], attrs)
    # The lowest bad row wins, as in the single op.
    with pytest.raises(tf.errors.InvalidArgumentError, match="feature 1: token 'z' in row 1"):
        concat_op(t, [["a", "b", "c"], ["1", "z", "3", "", "y", ""]], attrs)


def test_empty_batch_and_empty_features(rng):
    t = tables(rng, dims=(8, 4))
    attrs = [dict(combiner="sum", id_mode="hash", delimiter="", skip_empty=False),
             dict(combiner="sqrtn", id_mode="index", delimiter="|", skip_empty=True, trim_empty_tail=True)]
    assert concat_op(t, [[], []], attrs).shape == (0, 12)
    # Every trimmed string empty: no rows, and none to concatenate with either.
    assert concat_op(t, [[], ["", "|"]], attrs).shape == (0, 12)
    with pytest.raises(tf.errors.InvalidArgumentError, match="feature 1 has 0 rows where feature 0 has 2"):
        concat_op(t, [["a", "b"], ["", ""]], attrs)


def test_input_splits_are_validated(rng):
    t = tables(rng, dims=(8, 4))
    data, splits, _ = string_ops.ctr_pack_strings([tf.constant(["a", "b"]), tf.constant(["c", "d"])])
    lists = dict(combiners=["sum"] * 2, id_modes=["hash"] * 2, delimiters=[""] * 2, skip_empty=[False] * 2,
                 max_norms=[-1.0] * 2)
    for bad, why in [([0, 2], "N \\+ 1 = 3"), ([0, 3, 2], "non-decreasing"), ([0, 2, 5], "does not match"),
                     ([1, 2, 4], "must be 0")]:
        with pytest.raises(tf.errors.InvalidArgumentError, match=why):
            string_ops.ctr_concat_string_embedding(params=t, bytes=data, row_splits=splits,
                                                   input_splits=tf.constant(bad, tf.int64), dense=[], **lists)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="trim_empty_tail must be empty or"):
        string_ops.ctr_concat_string_embedding(params=t, bytes=data, row_splits=splits,
                                               input_splits=tf.constant([0, 2, 4], tf.int64), dense=[],
                                               trim_empty_tail=[True], **lists)


def test_pack_input_splits():
    _, _, input_splits = string_ops.ctr_pack_strings([tf.constant(["ab", ""]), tf.constant("c"),
                                                      tf.constant([], tf.string), tf.constant([["x"], ["y"]])])
    assert input_splits.numpy().tolist() == [0, 2, 3, 3, 5]
    m = tf.constant([["a", "b", "c"], ["d", "e", "f"]])
    data, splits, input_splits = string_ops.ctr_pack_strings([m], columns=[2, 0])
    assert bytes(data.numpy()) == b"cfad" and input_splits.numpy().tolist() == [0, 2, 4]
    spec = tf.function(lambda x, y: string_ops.ctr_pack_strings([x, y])).get_concrete_function(
        tf.TensorSpec([None], tf.string), tf.TensorSpec([None, 1], tf.string))
    assert spec.structured_outputs[2].shape == [3]


def test_multi_string_embedding_concat_and_its_gradient(rng):
    features = feature_set(rng, 40)
    features[3][0][-1] = "9"
    strings = [tf.constant(s) for s, _ in features]
    attrs = [a for _, a in features]
    t = tables(rng, dims=(8, 4, 3, 16))
    kw = dict(delimiters=[a["delimiter"] or None for a in attrs], combiners=[a["combiner"] for a in attrs],
              id_modes=[a["id_mode"] for a in attrs], skip_empty=[a["skip_empty"] for a in attrs])
    weights = tf.constant(rng.normal(size=(40, 31)).astype(np.float32))

    def loss(concat):
        with tf.GradientTape() as tape:
            out = tf_ctr_ops.multi_string_embedding(strings, t, concat=concat, **kw)
            out = out if concat else tf.concat(out, axis=1)
            value = tf.reduce_sum(out * weights)
        return out, [tf.convert_to_tensor(g) for g in tape.gradient(value, t)]

    (got, got_grads), (want, want_grads) = loss(True), loss(False)
    assert_identical(got, want)
    for g, w in zip(got_grads, want_grads):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_gradient_of_a_trimmed_feature_longer_than_the_batch(rng):
    t = tables(rng, dims=(8, 4))
    a, b = numeric_lists(rng, 5, min_len=1), numeric_lists(rng, 5)[:4] + ["6", "", "|"]
    attrs = [dict(combiner="mean", id_mode="index", delimiter="|", skip_empty=False),
             dict(combiner="sqrtn", id_mode="index", delimiter="|", skip_empty=True, trim_empty_tail=True)]
    weights = tf.constant(rng.normal(size=(5, 12)).astype(np.float32))
    with tf.GradientTape() as tape:
        got = tf.reduce_sum(concat_op(t, [a, b], attrs) * weights)
    got_grads = tape.gradient(got, t)
    with tf.GradientTape() as tape:
        want = tf.reduce_sum(tf.concat([single(t[0], a, **attrs[0]), single(t[1], b, **attrs[1])], 1) * weights)
    want_grads = tape.gradient(want, t)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    for g, w in zip(got_grads, want_grads):
        np.testing.assert_allclose(tf.convert_to_tensor(g), tf.convert_to_tensor(w), rtol=1e-6, atol=1e-6)


# --- the pattern ---------------------------------------------------------

def hashed_ids(table, s):
    return tf.nn.embedding_lookup(table, tf.strings.to_hash_bucket_fast(s, table.shape[0]))


def tf1_lookup(table, s, sep="|", combiner="sqrtn"):
    sp = tf.compat.v1.string_split(s, sep)
    ids = tf.SparseTensor(sp.indices, tf.strings.to_number(sp.values, tf.int64), sp.dense_shape)
    return tf.nn.embedding_lookup_sparse(table, ids, None, combiner=combiner)


def ctr_features(t):
    """Two hashed categories, a ragged id list and a TF1 id list, joined for
    the MLP as CTR models do."""
    return lambda a, b, c, d: tf.concat([hashed_ids(t[0], a), hashed_ids(t[1], b), ragged_sum(t[2], c),
                                         tf1_lookup(t[3], d)], axis=1)


def ctr_inputs(rng, n, extra_tail=()):
    return [tf.constant(keys(rng, n)), tf.constant(keys(rng, n)),
            tf.constant(id_lists(rng, n)), tf.constant(numeric_lists(rng, n)[:-1] + ["3"] + list(extra_tail))]


def test_concatenated_features_become_one_op(rng):
    t = tables(rng, dims=(8, 4, 16, 8))
    f = ctr_features(t)
    cf, graph, report, counts = offline(f, *[STRINGS_1D] * 4)
    [match] = concat_matches(report)
    assert match["fused_op"] == "CtrConcatStringEmbedding"
    assert fused_ops(graph) == {"CtrPackStrings": 1, "CtrConcatStringEmbedding": 1}
    assert "ConcatV2" not in counts and report["skip"] == []
    [op] = [n for n in graph.node if n.op == "CtrConcatStringEmbedding"]
    assert list(op.attr["trim_empty_tail"].list.b) == [False, False, False, True]
    assert [s.decode() for s in op.attr["id_modes"].list.s] == ["hash", "hash", "hash", "index"]
    for n in (1, 31, 500):
        args = ctr_inputs(rng, n)
        [got] = run_graph_def(cf, graph, *args)
        assert_identical(got, f(*args))


def test_a_trimmed_feature_with_more_strings_still_concatenates(rng):
    """TF1 string_split trims the empty tail: the original graph succeeds, and
    so must the rewritten one (the op finds each feature's strings by the
    pack's input_splits, not by equal shares)."""
    t = tables(rng, dims=(8, 4, 16, 8))
    f = ctr_features(t)
    cf, graph, report, counts = offline(f, *[STRINGS_1D] * 4)
    assert len(concat_matches(report)) == 1
    args = ctr_inputs(rng, 20, extra_tail=["", "||", ""])
    [got] = run_graph_def(cf, graph, *args)
    assert_identical(got, f(*args))
    bad = ctr_inputs(rng, 20, extra_tail=["", "4"])  # a token past the batch: 22 rows
    assert_both_fail(f, cf, graph, bad, "feature 3 has 22 rows where feature 0 has 20")


def test_features_of_different_batches_fail_as_the_concat_does(rng):
    t = tables(rng, dims=(8, 4, 16, 8))
    f = ctr_features(t)
    cf, graph, report, counts = offline(f, *[STRINGS_1D] * 4)
    args = ctr_inputs(rng, 10)
    args[1] = tf.constant(keys(rng, 11))
    assert_both_fail(f, cf, graph, args, "feature 1 has 11 rows where feature 0 has 10")


def test_a_grouped_op_joins_the_concatenation(rng):
    """Features grouped first (their stack proves one batch), then stacked by
    one op whose [B, 16] output is reshaped to [B, 2, 8]; the concatenation
    after it copies that in as a dense input next to the TF1 feature."""
    t = tables(rng, dims=(8, 8, 4))

    def f(a, b, c):
        both = tf.stack([hashed_ids(t[0], a), hashed_ids(t[1], b)], axis=1)  # [B, 2, 8]
        return tf.concat([tf.reshape(both, [-1, 16]), tf1_lookup(t[2], c)], axis=1)

    cf, graph, report, counts = offline(f, *[STRINGS_1D] * 3)
    assert fused_ops(graph) == {"CtrPackStrings": 2, "CtrConcatStringEmbedding": 2}
    assert "Pack" not in counts and "ConcatV2" not in counts
    args = [tf.constant(keys(rng, 12)), tf.constant(keys(rng, 12)),
            tf.constant(numeric_lists(rng, 11) + ["1"])]
    [got] = run_graph_def(cf, graph, *args)
    assert_identical(got, f(*args))


def test_concat_of_grouped_outputs(rng):
    """A CtrMultiStringEmbedding whose outputs this concatenation alone reads
    (as tf_ctr_ops.multi_string_embedding returns them) becomes its columns."""
    t = tables(rng, dims=(8, 4, 16))
    f = lambda a, b, c: tf.concat(tf_ctr_ops.multi_string_embedding(  # noqa: E731
        [a, b, c], t, delimiters=[None, None, "|"], combiners="sum", skip_empty=False)[::-1], axis=1)
    cf, graph, report, counts = offline(f, *[STRINGS_1D] * 3)
    assert fused_ops(graph) == {"CtrPackStrings": 1, "CtrConcatStringEmbedding": 1}
    [op] = [n for n in graph.node if n.op == "CtrConcatStringEmbedding"]
    assert [d.decode() for d in op.attr["delimiters"].list.s] == ["|", "", ""]  # the concatenation's order
    args = [tf.constant(keys(rng, 9)), tf.constant(keys(rng, 9)), tf.constant(id_lists(rng, 9))]
    [got] = run_graph_def(cf, graph, *args)
    assert_identical(got, f(*args))


@pytest.mark.parametrize("case", ["dense_input", "output_read_elsewhere", "dense_first"])
def test_other_inputs_are_copied_in(rng, case):
    """A dense input (numeric features) is copied into its columns as it is;
    the features are pooled into theirs."""
    t = tables(rng, dims=(8, 8))

    def f(a, b, x):
        ea, eb = hashed_ids(t[0], a), hashed_ids(t[1], b)
        if case == "dense_input":
            return tf.concat([ea, x, eb], axis=1)
        if case == "dense_first":
            return tf.concat([x, ea, eb], axis=-1)
        return tf.concat([ea, eb], axis=1), ea * 2.0

    cf, graph, report, counts = offline(f, STRINGS_1D, STRINGS_1D, tf.TensorSpec([None, 3], tf.float32))
    if case == "output_read_elsewhere":
        # Grouped first (the concat proves one batch), the group goes whole or
        # not at all: with one output read elsewhere it stays, concat and all.
        assert fused_ops(graph) == {"CtrPackStrings": 1, "CtrMultiStringEmbedding": 1} and "ConcatV2" in counts
        reasons = [s["reason"] for s in report["skip"] if s["pattern"] == "concat_strings"]
        assert any("is read by another node" in r for r in reasons), reasons
    else:
        assert "ConcatV2" not in counts
        [op] = [n for n in graph.node if n.op == "CtrConcatStringEmbedding"]
        assert (op.attr["N"].i, op.attr["M"].i) == (2, 1)
        assert list(op.attr["layout"].list.i) == {"dense_input": [0, 2, 1], "dense_first": [2, 0, 1]}[case]
    for n in (0, 7):
        args = [tf.constant(keys(rng, n), tf.string), tf.constant(keys(rng, n), tf.string),
                tf.constant(rng.normal(size=(n, 3)).astype(np.float32))]
        for g, w in zip(tf.nest.flatten(run_graph_def(cf, graph, *args)), tf.nest.flatten(f(*args))):
            assert_identical(g, w)
    if case != "output_read_elsewhere":
        bad = [tf.constant(keys(rng, 7)), tf.constant(keys(rng, 7)), tf.zeros([6, 3])]
        assert_both_fail(f, cf, graph, bad, "dense input 0 has 6 rows where feature 0 has 7")


def test_concatenation_along_the_batch_axis_is_left_alone(rng):
    t = tables(rng, dims=(8, 8))
    f = lambda a, b: tf.concat([hashed_ids(t[0], a), hashed_ids(t[1], b)], axis=0)  # noqa: E731
    cf, graph, report, counts = offline(f, STRINGS_1D, STRINGS_1D)
    assert "CtrConcatStringEmbedding" not in counts and "ConcatV2" in counts
    reasons = [s["reason"] for s in report["skip"] if s["pattern"] == "concat_strings"]
    assert any("does not concatenate along axis 1" in r for r in reasons), reasons
    args = [tf.constant(keys(rng, 7)), tf.constant(keys(rng, 5))]
    [got] = run_graph_def(cf, graph, *args)
    assert_identical(got, f(*args))


def test_dense_inputs_of_the_op(rng):
    t = tables(rng, dims=(8, 4))
    attrs = [dict(combiner="sum", id_mode="hash", delimiter="", skip_empty=False),
             dict(combiner="sqrtn", id_mode="index", delimiter="|", skip_empty=True, trim_empty_tail=True)]
    a, b = keys(rng, 5), numeric_lists(rng, 4) + ["1", "", "|"]
    x = tf.constant(rng.normal(size=(5, 3)).astype(np.float32))
    y = tf.constant(rng.normal(size=(5, 2)).astype(np.float32))
    got = concat_op(t, [a, b], attrs, dense=[x, y], layout=[3, 0, 2, 1])
    want = tf.concat([y, single(t[0], a, **attrs[0]), x, single(t[1], b, **attrs[1])], axis=1)
    assert_identical(got, want)
    with pytest.raises(tf.errors.InvalidArgumentError, match="dense input 1 has 4 rows where feature 0 has 5"):
        concat_op(t, [a, b], attrs, dense=[x, y[:4]])
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="rank|must be a matrix"):
        concat_op(t, [a, b], attrs, dense=[tf.zeros([5])])
    for layout in ([0, 1], [0, 1, 2, 2], [0, 1, 2, 4]):
        with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="layout must list each"):
            concat_op(t, [a, b], attrs, dense=[x], layout=layout)
    # Gradients: the tables' through the pooling, the dense inputs' their columns.
    weights = tf.constant(rng.normal(size=(5, 17)).astype(np.float32))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([x, y])
        got = tf.reduce_sum(concat_op(t, [a, b], attrs, dense=[x, y], layout=[3, 0, 2, 1]) * weights)
        want = tf.reduce_sum(tf.concat([y, single(t[0], a, **attrs[0]), x, single(t[1], b, **attrs[1])], 1) * weights)
    for g, w in zip(tape.gradient(got, t + [x, y]), tape.gradient(want, t + [x, y])):
        np.testing.assert_allclose(tf.convert_to_tensor(g), tf.convert_to_tensor(w), rtol=1e-6, atol=1e-6)


def test_online_concatenation_on_real_samples(rng):
    """Criteo hex categories (C19 and C26 have empty values) with MovieLens
    genres split TF1-style by '|' (hashed), one table each."""
    criteo = read_csv("criteo_sample.txt")
    genres = [r["genres"] for r in read_csv("movielens_sample.txt")]
    n = min(len(criteo), len(genres))
    cols = ("C1", "C3", "C19", "C26")
    t = tables(rng, dims=(8, 4, 8, 2, 16))

    def tf1_hashed(table, s):
        sp = tf.compat.v1.string_split(s, "|")
        ids = tf.SparseTensor(sp.indices, tf.strings.to_hash_bucket_fast(sp.values, table.shape[0]), sp.dense_shape)
        return tf.nn.embedding_lookup_sparse(table, ids, None, combiner="mean")

    f = lambda *s: tf.concat([hashed_ids(tab, x) for tab, x in zip(t, s[:4])] + [tf1_hashed(t[4], s[4])],  # noqa
                             axis=1)
    args = [tf.constant([r[c] for r in criteo[:n]]) for c in cols] + [tf.constant(genres[:n])]
    got, stats = run_online(f, *args)
    # 4 hashes, the TF1 lookup and its split, the 4 hashes grouped, then the
    # concatenation (and, placed on a CPU, its string_tensors pass).
    assert stats["rewrites"] == len(cols) + 2 + 1 + 1 + CPU_PASS
    np.testing.assert_allclose(got, f(*args), rtol=1e-6, atol=1e-6)


def test_a_single_read_elsewhere_is_copied_in(rng):
    """A single feature whose output something else reads too stays its own
    op and is copied in; the TF1 feature next to it (never grouped) is pooled."""
    t = tables(rng, dims=(8, 4))

    def f(a, d):
        ea = hashed_ids(t[0], a)
        return tf.concat([ea, tf1_lookup(t[1], d)], axis=1), ea * 2.0

    cf, graph, report, counts = offline(f, STRINGS_1D, STRINGS_1D)
    [op] = [n for n in graph.node if n.op == "CtrConcatStringEmbedding"]
    assert (op.attr["N"].i, op.attr["M"].i) == (1, 1) and list(op.attr["layout"].list.i) == [1, 0]
    assert counts.get("CtrStringEmbedding") == 1 and "ConcatV2" not in counts
    args = [tf.constant(keys(rng, 9)), tf.constant(numeric_lists(rng, 8) + ["2"])]
    for g, w in zip(run_graph_def(cf, graph, *args), f(*args)):
        assert_identical(g, w)


# ---------------------------------------------------------------------------
# Stacks: FM-family models gather their fields into [B, F, D] with
# tf.stack / keras.ops.stack(axis=1); that is the concatenation reshaped.


def stacked_features(t, axis=1):
    return lambda a, b, c, d: tf.stack([hashed_ids(t[0], a), hashed_ids(t[1], b), ragged_sum(t[2], c),
                                        tf1_lookup(t[3], d)], axis=axis)


@pytest.mark.parametrize("axis", [1, -2])
def test_stacked_features_become_one_op_and_a_reshape(rng, axis):
    t = tables(rng, dims=(8, 8, 8, 8))
    f = stacked_features(t, axis)
    cf, graph, report, counts = offline(f, *[STRINGS_1D] * 4)
    [match] = concat_matches(report)
    assert match["fused_op"] == "CtrConcatStringEmbedding" and report["skip"] == []
    assert fused_ops(graph) == {"CtrPackStrings": 1, "CtrConcatStringEmbedding": 1}
    assert "Pack" not in counts and counts.get("Reshape") == 1
    for n in (1, 31, 500):
        args = ctr_inputs(rng, n)
        [got] = run_graph_def(cf, graph, *args)
        assert got.shape == (n, 4, 8)
        assert_identical(got, f(*args))
    bad = ctr_inputs(rng, 20, extra_tail=["", "4"])  # the TF1 feature has 22 rows
    assert_both_fail(f, cf, graph, bad, "feature 3 has 22 rows where feature 0 has 20")


def test_stack_with_a_dense_input_and_an_empty_batch(rng):
    t = tables(rng, dims=(8, 8))
    f = lambda a, b, x: tf.stack([hashed_ids(t[0], a), x, hashed_ids(t[1], b)], axis=1)  # noqa: E731
    cf, graph, report, counts = offline(f, STRINGS_1D, STRINGS_1D, tf.TensorSpec([None, 8], tf.float32))
    assert "Pack" not in counts
    [op] = [n for n in graph.node if n.op == "CtrConcatStringEmbedding"]
    assert (op.attr["N"].i, op.attr["M"].i) == (2, 1) and list(op.attr["layout"].list.i) == [0, 2, 1]
    for n in (0, 7):
        args = [tf.constant(keys(rng, n), tf.string), tf.constant(keys(rng, n), tf.string),
                tf.constant(rng.normal(size=(n, 8)).astype(np.float32))]
        [got] = run_graph_def(cf, graph, *args)
        assert got.shape == (n, 3, 8)
        assert_identical(got, f(*args))


@pytest.mark.parametrize("case", ["axis0", "last_axis", "unknown_width"])
def test_stacks_it_cannot_reproduce_are_left_alone(rng, case):
    """A stack along another axis is no concatenation of rows; a stack with an
    input of unknown width cannot be reshaped back (a Pack fails where widths
    differ, a Reshape to a guessed width need not)."""
    t = tables(rng, dims=(8, 8))

    def f(a, b, x):
        ea, eb = hashed_ids(t[0], a), hashed_ids(t[1], b)
        if case == "axis0":
            return tf.stack([ea, eb], axis=0)
        if case == "last_axis":
            return tf.stack([ea, eb], axis=-1)
        return tf.stack([ea, x], axis=1)

    cf, graph, report, counts = offline(f, STRINGS_1D, STRINGS_1D, tf.TensorSpec([None, None], tf.float32))
    assert "CtrConcatStringEmbedding" not in counts and "Pack" in counts
    reasons = [s["reason"] for s in report["skip"] if s["pattern"] == "concat_strings"]
    want = "no static width" if case == "unknown_width" else "does not stack along axis 1"
    assert any(want in r for r in reasons), reasons
    args = [tf.constant(keys(rng, 7)), tf.constant(keys(rng, 7)), tf.constant(rng.normal(size=(7, 8)), tf.float32)]
    [got] = run_graph_def(cf, graph, *args)
    assert_identical(got, f(*args))


def test_stack_of_real_fields_as_deepfm_builds_it(rng):
    """Criteo hex categories (C19 and C26 have empty values), each hashed and
    looked up as Keras' Hashing + Embedding do, stacked into [B, F, D] and
    read by an FM term."""
    criteo = read_csv("criteo_sample.txt")
    cols = ("C1", "C3", "C19", "C26")
    t = tables(rng, dims=(4, 4, 4, 4))

    def f(*s):
        fields = tf.stack([hashed_ids(tab, x) for tab, x in zip(t, s)], axis=1)  # [B, 4, 4]
        return 0.5 * tf.reduce_sum(tf.square(tf.reduce_sum(fields, 1)) - tf.reduce_sum(tf.square(fields), 1), 1)

    cf, graph, report, counts = offline(f, *[STRINGS_1D] * len(cols))
    assert fused_ops(graph) == {"CtrPackStrings": 1, "CtrConcatStringEmbedding": 1} and "Pack" not in counts
    args = [tf.constant([r[c] for r in criteo]) for c in cols]
    [got] = run_graph_def(cf, graph, *args)
    np.testing.assert_allclose(got, f(*args), rtol=1e-5, atol=1e-5)
    # Online, each field's gather is a stateful op the function keeps: fused,
    # it stays as an Identity of the grouped output, which the stack still
    # takes over (the Identity becomes a NoOp).
    got, stats = run_online(f, *args)
    assert stats["rewrites"] == len(cols) + 2 + CPU_PASS  # the hashes, the group, the stack (on a CPU, read in place)
    np.testing.assert_allclose(got, f(*args), rtol=1e-5, atol=1e-5)


def test_a_fed_embedding_is_not_taken_over(rng):
    """A TF1 session may feed an intermediate tensor: an embedding the caller
    replaces keeps its node, and the concatenation reads the fed value."""
    vocab = 64
    tabs = [rng.normal(size=(vocab, 4)).astype(np.float32) for _ in range(2)]
    with tf.Graph().as_default() as g:
        a = tf.compat.v1.placeholder(tf.string, [None])
        b = tf.compat.v1.placeholder(tf.string, [None])
        ea = tf.identity(tf.nn.embedding_lookup(tf.constant(tabs[0]), tf.strings.to_hash_bucket_fast(a, vocab)))
        eb = tf.nn.embedding_lookup(tf.constant(tabs[1]), tf.strings.to_hash_bucket_fast(b, vocab))
        out = tf.concat([ea, eb], axis=1)
        fed = np.full((3, 4), 7.0, np.float32)
        feeds = {a: [b"x", b"y", b""], b: [b"p", b"", b"q"], ea: fed}
        with tf.compat.v1.Session(graph=g) as sess:
            want = sess.run(out, feeds)
        with tf.compat.v1.Session(graph=g, config=tf_ctr_ops.rewrite.session_config()) as sess:
            got = sess.run(out, feeds)
    np.testing.assert_array_equal(got[:, :4], fed)
    np.testing.assert_array_equal(got, want)


def test_a_stack_of_one_field_becomes_one_op_and_a_reshape(rng):
    """tf.stack([e], axis=1): the [B, 1, D] of a model with one categorical
    field, the op's [B, D] reshaped as a stack of any width is."""
    t = tables(rng, dims=(8, 8, 8, 8))
    f = lambda d: tf.stack([tf1_lookup(t[3], d)], axis=1)  # noqa: E731
    cf, graph, report, counts = offline(f, STRINGS_1D)
    [match] = concat_matches(report)
    assert match["fused_op"] == "CtrConcatStringEmbedding" and report["skip"] == []
    assert "Pack" not in counts and counts.get("Reshape") == 1
    for n in (0, 1, 31):
        args = ctr_inputs(rng, n)[3:] if n else [tf.constant([], tf.string)]
        [got] = run_graph_def(cf, graph, *args)
        assert got.shape == (args[0].shape[0], 1, 8)
        assert_identical(got, f(*args))
    bad = [tf.constant(["1|2", "x"])]
    assert_both_fail(f, cf, graph, bad, "token 'x' in row 1")


class _VariableFields(tf.Module):
    """Two hashed string fields of tf.Variable tables, gathered and joined
    as a tf.Module written by hand does it."""

    def __init__(self, join):
        self.a = tf.Variable(tf.random.stateless_normal([50, 4], seed=[1, 1]))
        self.b = tf.Variable(tf.random.stateless_normal([50, 4], seed=[1, 2]))
        self.join = join

    @tf.function(input_signature=[STRINGS_1D, STRINGS_1D])
    def serve(self, x, y):
        fields = [tf.nn.embedding_lookup(self.a, tf.strings.to_hash_bucket_fast(x, 50)),
                  tf.gather(self.b, tf.strings.to_hash_bucket_fast(y, 50))]
        return {"c": tf.concat(fields, 1) if self.join == "concat" else tf.stack(fields, 1)}


@pytest.mark.saved_model
@pytest.mark.parametrize("join", ["concat", "stack"])
def test_offline_a_join_of_variable_gathers_is_taken_over_past_the_functions_control_outputs(rng, tmp_path, join):
    # A stateful ResourceGather gets a control output (a NoOp waiting on it)
    # in its function; fused, it lives on as an Identity that NoOp waits on,
    # which the join took for another reader: "is read by another node".
    from conftest import serve_in_fresh_process
    from tf_ctr_ops import rewrite

    module = _VariableFields(join)
    src, dst = tmp_path / "src", tmp_path / "dst"
    tf.saved_model.save(module, str(src), signatures={"serving_default": module.serve})
    report = rewrite.optimize_saved_model(src, dst, runs=1)
    sig = report.signatures["serving_default"]
    assert report.ok and report.verified and sig.outputs_match
    assert [m["pattern"] for m in sig.matches][-1] == "concat_strings", (sig.matches, sig.skips)
    assert sig.op_counts_after.get("CtrConcatStringEmbedding") == 1, sig.op_counts_after
    feeds = {"x": np.array(random_strings(rng, 30), object), "y": np.array(random_strings(rng, 30), object)}
    want = module.serve(**{k: tf.constant(v) for k, v in feeds.items()})["c"].numpy()
    np.testing.assert_array_equal(serve_in_fresh_process(dst, "serving_default", feeds, tmp_path)["c"], want)

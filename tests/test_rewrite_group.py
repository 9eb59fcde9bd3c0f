"""group_strings: string features of one batch, each fused into its own
CtrPackStrings + CtrStringEmbedding, become one CtrPackStrings (N inputs,
equal_sizes) + one CtrMultiStringEmbedding -- only where Grappler's shape
inference proves the features share a batch size.
"""

import numpy as np
import pytest
import tensorflow as tf

import tf_ctr_ops
from tf_ctr_ops import rewrite
from tf_ctr_ops.strings import _ops as string_ops
from test_rewrite import CPU_PASS, offline, read_csv, run_graph_def, run_online
from test_rewrite_dense import assert_identical, assert_model_close, fused_ops, keras_hash_model, random_strings

V, D = 64, 8
STRINGS_1D = tf.TensorSpec([None], tf.string)
STRINGS_2D = tf.TensorSpec([None, 1], tf.string)


def tables(rng, dims=(8, 4, 16), rows=V):
    return [tf.Variable(rng.normal(size=(rows, d)).astype(np.float32)) for d in dims]


def hashed(table, s, buckets=V):
    return tf.nn.embedding_lookup(table, tf.strings.to_hash_bucket_fast(s, buckets))


def flat(x):
    """[B, ..., D] -> [B, D] as keras.layers.Flatten writes it: the batch dim
    that Grappler's shape inference follows into the Concatenate."""
    return tf.reshape(x, tf.stack([tf.shape(x)[0], x.shape[-1]]))


def hashed_flat(table, s, buckets=V):
    return flat(hashed(table, s, buckets))


def ragged_sum(table, s, sep="|"):
    ids = tf.strings.to_hash_bucket_fast(tf.strings.split(s, sep), table.shape[0])
    return tf.reduce_sum(tf.nn.embedding_lookup(table, ids), axis=1)


def id_lists(rng, n, sep="|"):
    return [sep.join(str(t) for t in rng.integers(0, 1000, size=rng.integers(0, 5))) for _ in range(n)]


def group_matches(report):
    return [m for m in report["match"] if m["pattern"] == "group_strings"]


def no_control_before_data(graph_def):
    for node in graph_def.node:
        seen_control = False
        for i in node.input:
            if i.startswith("^"):
                seen_control = True
            else:
                assert not seen_control, f"{node.name}: data input {i} after a control input"


def three_features(t):
    """Two hashed features and one id list, flattened and concatenated for an
    MLP: the concat proves one batch."""
    return lambda a, b, c: tf.concat([hashed_flat(t[0], a), hashed_flat(t[1], b), ragged_sum(t[2], c)], axis=1)


def test_concatenated_features_become_one_grouped_op(rng):
    t = tables(rng)
    f = three_features(t)
    cf, graph, report, counts = offline(f, STRINGS_1D, STRINGS_1D, STRINGS_1D)
    [group] = group_matches(report)
    assert group["fused_op"] == "CtrMultiStringEmbedding"
    assert fused_ops(graph) == {"CtrPackStrings": 1, "CtrMultiStringEmbedding": 1}
    replaced_ops = sorted(r.rsplit(" (", 1)[1].rstrip(")") for r in group["replaced"])
    assert replaced_ops == ["CtrPackStrings"] * 3 + ["CtrStringEmbedding"] * 3
    [pack] = [n for n in graph.node if n.op == "CtrPackStrings"]
    assert pack.attr["N"].i == 3 and pack.attr["equal_sizes"].b
    [multi] = [n for n in graph.node if n.op == "CtrMultiStringEmbedding"]
    assert list(multi.attr["delimiters"].list.s) == [b"", b"", b"|"]
    assert [i for i in multi.input if not i.startswith("^")][-2:] == [pack.name, pack.name + ":1"]
    no_control_before_data(graph)
    for batch in (40, 1, 0):
        args = [tf.constant(random_strings(rng, max(batch, 3))[:batch], tf.string),
                tf.constant(random_strings(rng, max(batch, 3))[-batch:] if batch else [], tf.string),
                tf.constant(id_lists(rng, batch), tf.string)]
        [got] = run_graph_def(cf, graph, *args)
        assert_identical(got, f(*args))


def test_group_order_is_the_graph_order_and_deterministic(rng):
    t = tables(rng)
    f = three_features(t)
    graphs = [offline(f, STRINGS_1D, STRINGS_1D, STRINGS_1D)[1] for _ in range(2)]
    multis = [[n for n in g.node if n.op == "CtrMultiStringEmbedding"][0] for g in graphs]
    assert multis[0] == multis[1]


def test_online_grouping(rng):
    t = tables(rng)
    f = three_features(t)
    args = [tf.constant(random_strings(rng, 30)), tf.constant(random_strings(rng, 30)),
            tf.constant(id_lists(rng, 30))]
    got, stats = run_online(f, *args)
    # 2 hash_gather + ragged_reduce_lookup + group_strings, and the group then
    # joins the concatenation (concat_strings), online as offline (and, placed
    # on a CPU, string_tensors).
    assert stats["rewrites"] == 5 + CPU_PASS
    assert_identical(got, f(*args))


def test_concat_of_unflattened_features_groups(rng):
    """tf.concat([lookup(a), lookup(b)], axis=-1) on [B] strings: the concat
    fails unless the batches agree, so it proves them equal."""
    t = tables(rng, dims=(8, 4))
    f = lambda a, b: tf.concat([hashed(t[0], a), hashed(t[1], b)], axis=-1)  # noqa: E731
    cf, graph, report, counts = offline(f, STRINGS_1D, STRINGS_1D)
    assert len(group_matches(report)) == 1
    a, b = tf.constant(random_strings(rng, 17)), tf.constant(random_strings(rng, 17))
    [got] = run_graph_def(cf, graph, a, b)
    assert_identical(got, f(a, b))


def test_columns_of_one_input_and_a_stack_group(rng):
    """Features sliced out of one [B, N] input (x[:, i:i+1], as a Keras model
    with one categorical input writes it) share its batch; so do features
    stacked along axis 1 (keras.ops.stack before an FM)."""
    t = tables(rng, dims=(8, 8, 8))
    sliced = lambda x: [hashed_flat(t[i], x[:, i:i + 1]) for i in range(3)]  # noqa: E731
    stacked = lambda a, b, c: tf.stack([hashed(t[0], a), hashed(t[1], b), hashed(t[2], c)], axis=1)  # noqa: E731
    for f, specs in ((lambda x: tf.add_n(sliced(x)), [tf.TensorSpec([None, 3], tf.string)]),
                     (stacked, [STRINGS_1D] * 3)):
        cf, graph, report, counts = offline(f, *specs)
        assert len(group_matches(report)) == 1, report
        args = ([tf.constant(np.array(random_strings(rng, 33)).reshape(11, 3))] if len(specs) == 1 else
                [tf.constant(random_strings(rng, 11)) for _ in range(3)])
        [got] = run_graph_def(cf, graph, *args)
        assert_identical(got, f(*args))


def column_pack(graph):
    [pack] = [n for n in graph.node if n.op == "CtrPackStrings"]
    return pack


@pytest.mark.parametrize("form", ["shrink", "range_flattened", "range_squeezed"])
def test_columns_of_one_matrix_are_packed_from_the_matrix(rng, form):
    """x[:, c] (or x[:, c:c+1] flattened or squeezed) of one [B, C] input:
    the group's pack reads the columns from x, in feature order, and the
    slices that copied them go."""
    t = tables(rng, dims=(8, 4, 8))
    column = {"shrink": lambda x, c: x[:, c],
              "range_flattened": lambda x, c: tf.reshape(x[:, c:c + 1], [-1]),
              "range_squeezed": lambda x, c: tf.squeeze(x[:, c:c + 1], axis=1)}[form]
    order = (2, 0, 3)  # not the matrix's order; column 1 unused
    f = lambda x: tf.concat([hashed(tab, column(x, c)) for tab, c in zip(t, order)], axis=1)  # noqa: E731
    cf, graph, report, counts = offline(f, tf.TensorSpec([None, 4], tf.string))
    [group] = group_matches(report)
    pack = column_pack(graph)
    assert list(pack.attr["columns"].list.i) == list(order) and pack.attr["N"].i == 1
    assert [i for i in pack.input if not i.startswith("^")] == [cf.inputs[0].op.name + "/ctr_feed_shape"]  # x, checked
    assert [n.op for n in graph.node if n.op == "StridedSlice"] == []
    assert sum(r.endswith("(StridedSlice)") for r in group["replaced"]) == 3
    for batch in (13, 1, 0):
        x = tf.constant(np.array(random_strings(rng, 4 * max(batch, 1)), object)[:4 * batch].reshape(batch, 4))
        [got] = run_graph_def(cf, graph, x)
        assert_identical(got, f(x))


def any_shape_inputs(graph_def):
    """The graph with its placeholders' shapes unknown: a model server feeds
    tensors by name, never held to the signature's shape."""
    graph_def = type(graph_def).FromString(graph_def.SerializeToString())
    for node in graph_def.node:
        if node.op == "Placeholder":
            node.attr["shape"].shape.Clear()
            node.attr["shape"].shape.unknown_rank = True
            node.attr.pop("_output_shapes", None)
    return graph_def


@pytest.mark.parametrize("form", ["shrink", "range_flattened", "negative_column"])
def test_a_feed_of_another_rank_than_the_signature_is_an_error_not_another_result(rng, form):
    """A model server feeds tensors by name, unchecked: fed [B, 2, K] for a
    [None, 2] input, the original computes something of another shape
    (reshape(x[:, c:c+1], [-1]) flattens it to B * K strings), which the
    fused ops, built on the declared shape, would not. The rewritten graph
    holds its inputs to the shapes the rewrite assumed."""
    t = tables(rng, dims=(8, 4))
    column = {"shrink": lambda x, c: x[:, c], "range_flattened": lambda x, c: tf.reshape(x[:, c:c + 1], [-1]),
              "negative_column": lambda x, c: x[:, c - 2]}[form]
    f = lambda x: tf.concat([hashed(tab, column(x, c)) for tab, c in zip(t, (1, 0))], -1)  # noqa: E731
    cf, graph, report, counts = offline(f, tf.TensorSpec([None, 2], tf.string))
    [group] = group_matches(report)
    [guard] = [n for n in graph.node if n.op == "EnsureShape" and n.input == [cf.inputs[0].op.name]]
    x = tf.constant(np.array(random_strings(rng, 12), object).reshape(3, 2, 2))
    run_graph_def(cf, any_shape_inputs(cf.graph.as_graph_def()), x)  # the original computes
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"is not compatible with expected shape \[\?,2\]"):
        run_graph_def(cf, any_shape_inputs(graph), x)
    x = tf.constant(np.array(random_strings(rng, 10), object).reshape(5, 2))
    [got] = run_graph_def(cf, any_shape_inputs(graph), x)
    assert_identical(got, f(x))


def test_a_column_read_elsewhere_keeps_its_slice(rng):
    t = tables(rng, dims=(8, 8))
    f = lambda x: (tf.concat([hashed(t[0], x[:, 0]), hashed(t[1], x[:, 1])], axis=1),  # noqa: E731
                   tf.strings.length(x[:, 1]))
    cf, graph, report, counts = offline(f, tf.TensorSpec([None, 2], tf.string))
    assert list(column_pack(graph).attr["columns"].list.i) == [0, 1]
    assert len([n for n in graph.node if n.op == "StridedSlice"]) == 1
    x = tf.constant(np.array(random_strings(rng, 14), object).reshape(7, 2))
    for g, w in zip(run_graph_def(cf, graph, x), f(x)):
        assert_identical(g, w)


@pytest.mark.parametrize("case", ["two_matrices", "strided_rows", "negative_column"])
def test_columns_that_are_not_whole_columns_of_one_matrix_pack_the_features(rng, case):
    t = tables(rng, dims=(8, 8))
    if case == "two_matrices":
        f = lambda x, y: tf.concat([hashed(t[0], x[:, 0]), hashed(t[1], y[:, 0])], axis=1)  # noqa: E731
        specs = [tf.TensorSpec([None, 2], tf.string)] * 2
    elif case == "strided_rows":  # every other row: not a whole column (and proves no batch with the other)
        f = lambda x: tf.concat([hashed(t[0], x[::2, 0]), hashed(t[1], x[::2, 1])], axis=1)  # noqa: E731
        specs = [tf.TensorSpec([None, 2], tf.string)]
    else:
        f = lambda x: tf.concat([hashed(t[0], x[:, -1]), hashed(t[1], x[:, 0])], axis=1)  # noqa: E731
        specs = [tf.TensorSpec([None, 2], tf.string)]
    cf, graph, report, counts = offline(f, *specs)
    for pack in (n for n in graph.node if n.op == "CtrPackStrings"):
        assert list(pack.attr["columns"].list.i) == []
    args = [tf.constant(np.array(random_strings(rng, 12), object).reshape(6, 2)) for _ in specs]
    [got] = run_graph_def(cf, graph, *args)
    assert_identical(got, f(*args))


def test_slices_that_cut_the_batch_axis_prove_nothing(rng):
    t = tables(rng, dims=(8, 8))
    f = lambda x: (hashed(t[0], x[:2, 0]), hashed(t[1], x[1:, 1]))  # noqa: E731
    cf, graph, report, counts = offline(f, tf.TensorSpec([None, 2], tf.string))
    assert group_matches(report) == []
    x = tf.constant(np.array(random_strings(rng, 10)).reshape(5, 2))
    for g, w in zip(run_graph_def(cf, graph, x), f(x)):
        assert_identical(g, w)


def test_concat_along_the_batch_axis_proves_nothing(rng):
    t = tables(rng, dims=(8, 8))
    f = lambda a, b: tf.concat([hashed(t[0], a), hashed(t[1], b)], axis=0)  # noqa: E731
    cf, graph, report, counts = offline(f, STRINGS_1D, STRINGS_1D)
    assert group_matches(report) == []
    a, b = tf.constant(random_strings(rng, 5)), tf.constant(random_strings(rng, 9))
    [got] = run_graph_def(cf, graph, a, b)
    assert_identical(got, f(a, b))


def test_same_known_batch_groups_without_a_concat(rng):
    t = tables(rng, dims=(8, 8))
    f = lambda a, b: (hashed(t[0], a), hashed(t[1], b))  # noqa: E731
    spec = tf.TensorSpec([12], tf.string)
    cf, graph, report, counts = offline(f, spec, spec)
    assert len(group_matches(report)) == 1
    a, b = tf.constant(random_strings(rng, 12)), tf.constant(random_strings(rng, 12))
    for g, w in zip(run_graph_def(cf, graph, a, b), f(a, b)):
        assert_identical(g, w)


@pytest.mark.parametrize("specs", [(STRINGS_1D, STRINGS_1D), (tf.TensorSpec([12], tf.string),
                                                              tf.TensorSpec([13], tf.string))],
                         ids=["unrelated_unknown", "different_known"])
def test_unproven_batch_is_not_grouped(rng, specs):
    """Nothing ties the two batches together: each feature keeps its own op."""
    t = tables(rng, dims=(8, 8))
    f = lambda a, b: (hashed(t[0], a), hashed(t[1], b))  # noqa: E731
    cf, graph, report, counts = offline(f, *specs)
    assert group_matches(report) == []
    assert fused_ops(graph) == {"CtrPackStrings": 2, "CtrStringEmbedding": 2}
    skips = [s for s in report["skip"] if s["pattern"] == "group_strings"]
    assert len(skips) == 2 and all("batch size" in s["reason"] for s in skips)
    a = tf.constant(random_strings(rng, specs[0].shape[0] or 7))
    b = tf.constant(random_strings(rng, specs[1].shape[0] or 9))
    for g, w in zip(run_graph_def(cf, graph, a, b), f(a, b)):
        assert_identical(g, w)


def test_mismatched_batches_still_fail(rng):
    """The original graph fails at the concat; the grouped one must fail too
    (the pack checks the sizes), not pool the wrong rows."""
    t = tables(rng, dims=(8, 8))
    f = lambda a, b: tf.concat([hashed_flat(t[0], a), hashed_flat(t[1], b)], axis=1)  # noqa: E731
    cf, graph, report, counts = offline(f, STRINGS_1D, STRINGS_1D)
    assert len(group_matches(report)) == 1
    a, b = tf.constant(random_strings(rng, 3)), tf.constant(random_strings(rng, 5))  # 8 strings: splits evenly
    with pytest.raises(tf.errors.InvalidArgumentError):
        f(a, b)
    with pytest.raises(tf.errors.InvalidArgumentError, match="share one batch size, but feature 1 holds 5 strings where feature 0 holds 3"):
        run_graph_def(cf, graph, a, b)


def test_bucket_counts_carry_into_the_group(rng):
    """Each feature keeps its hash's bucket count (fewer than its rows here)."""
    t = tables(rng, dims=(8, 8, 8))
    f = lambda a, b, c: tf.concat([hashed_flat(t[0], a), hashed_flat(t[1], b, buckets=V // 2),  # noqa: E731
                                   hashed_flat(t[2], c)], axis=1)
    cf, graph, report, counts = offline(f, STRINGS_1D, STRINGS_1D, STRINGS_1D)
    assert len(group_matches(report)) == 1
    assert fused_ops(graph) == {"CtrPackStrings": 1, "CtrMultiStringEmbedding": 1}
    [multi] = [n for n in graph.node if n.op == "CtrMultiStringEmbedding"]
    assert list(multi.attr["num_buckets"].list.i) == [V, V // 2, V]
    args = [tf.constant(random_strings(rng, 20)) for _ in range(3)]
    [got] = run_graph_def(cf, graph, *args)
    assert_identical(got, f(*args))


def test_more_buckets_than_rows_fails_in_the_group_as_the_gather_does(rng):
    t = tables(rng, dims=(8, 8))
    f = lambda a, b: tf.concat([hashed_flat(t[0], a), hashed_flat(t[1], b, buckets=4 * V)], axis=1)  # noqa: E731
    cf, graph, report, counts = offline(f, STRINGS_1D, STRINGS_1D)
    assert len(group_matches(report)) == 1
    strings = tf.constant([str(i) for i in range(200)])  # some hash past row 64 of 256 buckets
    with pytest.raises(tf.errors.InvalidArgumentError):
        f(strings, strings)
    with pytest.raises(tf.errors.InvalidArgumentError):
        run_graph_def(cf, graph, strings, strings)


def test_fetched_feature_output_keeps_its_name(rng):
    t = tables(rng, dims=(8, 8))

    def f(a, b):
        ea, eb = hashed_flat(t[0], a), hashed_flat(t[1], b)
        return tf.concat([ea, eb], axis=1), ea

    cf, graph, report, counts = offline(f, STRINGS_1D, STRINGS_1D)
    assert len(group_matches(report)) == 1
    a, b = tf.constant(random_strings(rng, 10)), tf.constant(random_strings(rng, 10))
    for g, w in zip(run_graph_def(cf, graph, a, b), f(a, b)):
        assert_identical(g, w)


def test_explicit_string_embeddings_are_grouped(rng):
    """Users' own tf_ctr_ops.string_embedding calls of one batch group too
    (stacked: the stack proves one batch)."""
    t = tables(rng, dims=(8, 8))
    f = lambda a, b: tf.stack([  # noqa: E731
        tf_ctr_ops.string_embedding(a, t[0], delimiter="|", combiner="mean"),
        tf_ctr_ops.string_embedding(b, t[1], delimiter=",", combiner="sqrtn", skip_empty=False)], axis=1)
    cf, graph, report, counts = offline(f, STRINGS_2D, STRINGS_2D)
    assert len(group_matches(report)) == 1
    a = tf.reshape(tf.constant(id_lists(rng, 25)), [-1, 1])
    b = tf.reshape(tf.constant(id_lists(rng, 25, sep=",")), [-1, 1])
    [got] = run_graph_def(cf, graph, a, b)
    np.testing.assert_allclose(got, f(a, b), rtol=1e-6, atol=1e-6)


def test_training_gradients_match_tf(rng):
    """Under a GradientTape the gradients read each feature's packed strings,
    so nothing is grouped; the step gives the same gradients as eager."""
    t = tables(rng, dims=(8, 4))

    def step(a, b):
        with tf.GradientTape() as tape:
            out = tf.concat([tf_ctr_ops.string_embedding(a, t[0], delimiter="|", combiner="sum"),
                             tf_ctr_ops.string_embedding(b, t[1], delimiter="|", combiner="mean")], axis=1)
            loss = tf.reduce_sum(out * out)
        return [tf.convert_to_tensor(g) for g in tape.gradient(loss, t)]

    a, b = tf.constant(id_lists(rng, 20)), tf.constant(id_lists(rng, 20))
    want = step(a, b)
    got, stats = run_online(step, a, b)
    assert stats["rewrites"] == 0
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_keras_model_training_gradients_match_tf(rng):
    model = keras_hash_model()
    inputs = {n: tf.reshape(tf.constant(random_strings(rng)), [-1, 1]) for n in ("site", "app")}

    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x))
        return [tf.convert_to_tensor(g) for g in tape.gradient(loss, model.trainable_variables)]

    want = step(inputs)
    got, stats = run_online(step, inputs)
    assert stats["rewrites"] == 0  # the backward pass reads the hashed ids: no feature is fused, none grouped
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.saved_model
def test_keras_saved_model_is_concatenated(tmp_path, rng):
    model = keras_hash_model()
    src, dst = tmp_path / "src", tmp_path / "dst"
    model.export(str(src), verbose=False)
    samples = {n: np.array(random_strings(rng), object).reshape(-1, 1) for n in ("site", "app")}
    report = rewrite.optimize_saved_model(src, dst, sample_inputs={"serving_default": samples}, runs=2)
    assert report.ok and report.verified
    sig = report.signatures["serving_default"]
    assert [m["pattern"] for m in sig.matches] == ["hash_gather", "hash_gather", "group_strings", "concat_strings"]
    assert {k: v for k, v in sig.op_counts_after.items() if k.startswith("Ctr")} == {
        "CtrPackStrings": 1, "CtrConcatStringEmbedding": 1}
    assert sig.max_abs_diff == 0


def test_criteo_categories_grouped_online(rng):
    """Criteo hex categories (C19 and C26 have empty values), one table each."""
    rows = read_csv("criteo_sample.txt")
    cols = ("C1", "C3", "C19", "C26")
    t = tables(rng, dims=(8, 4, 8, 2))
    f = lambda *s: tf.concat([hashed_flat(tab, x) for tab, x in zip(t, s)], axis=1)  # noqa: E731
    args = [tf.constant([r[c] for r in rows]) for c in cols]
    got, stats = run_online(f, *args)
    assert stats["rewrites"] == len(cols) + 2 + CPU_PASS  # the hashes, the group, the concatenation
    assert_identical(got, f(*args))


def test_pack_equal_sizes_op():
    a, b = tf.constant(["x", "yz"]), tf.constant(["", "w"])
    data, splits, _ = string_ops.ctr_pack_strings([a, b], equal_sizes=True)
    assert bytes(data.numpy()) == b"xyzw" and splits.numpy().tolist() == [0, 1, 3, 3, 4]
    with pytest.raises(tf.errors.InvalidArgumentError, match="feature 1 holds 1 strings where feature 0 holds 2"):
        string_ops.ctr_pack_strings([a, tf.constant(["w"])], equal_sizes=True)
    data, splits, _ = string_ops.ctr_pack_strings([a, tf.constant(["w"])])  # sizes may differ by default
    assert splits.numpy().tolist() == [0, 1, 3, 4]


def test_group_pack_reads_column_inputs_unflattened(rng):
    """[B, 1] inputs (keras.Input((1,), dtype="string")): each single pack
    read them through a Reshape to [-1]; the group's pack flattens in
    row-major order itself, so those Reshapes go, unless something else reads
    one."""
    t = tables(rng, dims=(8, 4, 8))
    def f(a, b, c):
        c = tf.reshape(c, [-1])  # also read by the length below
        return tf.concat([hashed_flat(t[0], a), hashed_flat(t[1], b), hashed(t[2], c),
                          tf.cast(tf.strings.length(c)[:, None], tf.float32)], axis=1)

    cf, graph, report, counts = offline(f, STRINGS_2D, STRINGS_2D, STRINGS_2D)
    [group] = group_matches(report)
    pack = column_pack(graph)
    args = [i.op.name for i in cf.inputs[:3]]
    data_inputs = [i for i in pack.input if not i.startswith("^")]
    assert data_inputs[:2] == [a + "/ctr_feed_shape" for a in args[:2]], data_inputs  # the inputs, shape-checked
    reshape = {n.name: n for n in graph.node}[data_inputs[2].split(":")[0]]
    assert reshape.op == "Reshape"  # c's Reshape has another reader: it stays
    assert sum(r.endswith("(Reshape)") for r in group["replaced"]) == 2
    for batch in (11, 1, 0):
        xs = [tf.reshape(tf.constant(random_strings(rng, max(batch, 3))[:batch], tf.string), [-1, 1])
              for _ in range(3)]
        [got] = run_graph_def(cf, graph, *xs)
        assert_identical(got, f(*xs))


def test_pack_any_rank_op():
    m = tf.constant([["a", "bb", ""], ["dddd", "e", "ff"]])
    data, splits, _ = string_ops.ctr_pack_strings([m, tf.constant("z")])
    want_data, want_splits, _ = string_ops.ctr_pack_strings([tf.reshape(m, [-1]), tf.constant(["z"])])
    assert bytes(data.numpy()) == bytes(want_data.numpy()) == b"abbddddeffz"
    assert splits.numpy().tolist() == want_splits.numpy().tolist() == [0, 1, 3, 3, 7, 8, 10, 11]
    with pytest.raises(tf.errors.InvalidArgumentError, match="feature 1 holds 3 strings where feature 0 holds 6"):
        string_ops.ctr_pack_strings([m, m[0]], equal_sizes=True)
    fn = tf.function(lambda a, b: string_ops.ctr_pack_strings([a, b], equal_sizes=True))
    out = fn.get_concrete_function(tf.TensorSpec([7, 1], tf.string), tf.TensorSpec([2, 3], tf.string)).structured_outputs
    assert out[1].shape == [14]


def test_pack_columns_op():
    m = tf.constant([["a", "bb", ""], ["dddd", "e", "f" * 24]])
    data, splits, _ = string_ops.ctr_pack_strings([m], columns=[2, 0, 2])
    want_data, want_splits, _ = string_ops.ctr_pack_strings([m[:, 2], m[:, 0], m[:, 2]])
    assert bytes(data.numpy()) == bytes(want_data.numpy()) == b"f" * 24 + b"adddd" + b"f" * 24
    assert splits.numpy().tolist() == want_splits.numpy().tolist()
    data, splits, _ = string_ops.ctr_pack_strings([tf.zeros([0, 3], tf.string)], columns=[1, 2])
    assert data.shape == [0] and splits.numpy().tolist() == [0]
    for columns in ([3], [-1]):
        with pytest.raises(tf.errors.InvalidArgumentError, match=f"column {columns[0]} is outside the input's 3 columns"):
            string_ops.ctr_pack_strings([m], columns=columns)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="one \\[B, C\\]"):
        string_ops.ctr_pack_strings([m[:, 0]], columns=[0])
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="with columns takes one \\[B, C\\].*got 2"):
        string_ops.ctr_pack_strings([m, m], columns=[0])
    spec = tf.function(lambda x: string_ops.ctr_pack_strings([x], columns=[1, 2])).get_concrete_function(
        tf.TensorSpec([7, 3], tf.string))
    assert spec.structured_outputs[1].shape == [15]


def test_multi_op_bucket_counts_forward_and_gradient(rng):
    """CtrMultiStringEmbedding's num_buckets: each feature as its own hash."""
    t = tables(rng, dims=(8, 4))
    s = [tf.constant(random_strings(rng, 12)), tf.constant(random_strings(rng, 12))]
    with tf.GradientTape() as tape:
        data, splits, _ = string_ops.ctr_pack_strings(s, equal_sizes=True)
        got = string_ops.ctr_multi_string_embedding(
            params=t, bytes=data, row_splits=splits, combiners=["sum", "sum"], id_modes=["hash", "hash"],
            delimiters=["", ""], skip_empty=[False, False], max_norms=[-1.0, -1.0], num_buckets=[V // 2, 0])
        loss = sum(tf.reduce_sum(o * o) for o in got)
    got_grads = tape.gradient(loss, t)
    with tf.GradientTape() as tape:
        want = [hashed(t[0], s[0], V // 2), hashed(t[1], s[1])]
        loss = sum(tf.reduce_sum(o * o) for o in want)
    want_grads = tape.gradient(loss, t)
    for g, w in zip(got, want):
        assert_identical(g, w)
    for g, w in zip(got_grads, want_grads):
        np.testing.assert_allclose(tf.convert_to_tensor(g), tf.convert_to_tensor(w), rtol=1e-6, atol=1e-6)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="num_buckets"):
        string_ops.ctr_multi_string_embedding(
            params=t, bytes=data, row_splits=splits, combiners=["sum", "sum"], id_modes=["hash", "hash"],
            delimiters=["", ""], skip_empty=[False, False], max_norms=[-1.0, -1.0], num_buckets=[V])


@pytest.mark.parametrize("dtype", [tf.float32, tf.float16, tf.bfloat16])
@pytest.mark.parametrize("skip_empty", [False, True])
def test_multi_op_whole_strings_equal_single_ops(rng, dtype, skip_empty):
    """The grouped CPU kernel copies whole-string rows directly: it must give
    what CtrStringEmbedding gives, in every mode and combiner."""
    V2 = 50
    t = [tf.constant(rng.normal(size=(V2, d)), dtype) for d in (8, 4, 3)]
    s = [tf.constant(random_strings(rng, 40)),
         tf.constant([str(i) if i % 7 else "" for i in rng.integers(0, V2, size=40)]),
         tf.constant([str(i) if i % 5 else "" for i in rng.integers(-3 * V2, 3 * V2, size=40)])]
    modes, combiners = ["hash", "index", "mod"], ["sum", "mean", "sqrtn"]
    if not skip_empty:  # an empty string is then one empty token, which index and mod reject
        s[1] = tf.where(s[1] == "", "0", s[1])
        s[2] = tf.where(s[2] == "", "0", s[2])
    data, splits, _ = string_ops.ctr_pack_strings(s, equal_sizes=True)
    got = string_ops.ctr_multi_string_embedding(
        params=t, bytes=data, row_splits=splits, combiners=combiners, id_modes=modes, delimiters=[""] * 3,
        skip_empty=[skip_empty] * 3, max_norms=[-1.0] * 3)
    for i in range(3):
        d, sp, _ = string_ops.ctr_pack_strings([s[i]])
        want = string_ops.ctr_string_embedding(params=t[i], bytes=d, row_splits=sp, bag_splits=tf.zeros([0], tf.int64),
                                               combiner=combiners[i], id_mode=modes[i], delimiter="",
                                               skip_empty=skip_empty)
        assert_identical(got[i], want)


def test_multi_op_whole_string_errors_name_feature_row_and_token(rng):
    t = [tf.constant(rng.normal(size=(10, 4)), tf.float32)] * 2
    s = [tf.constant(["1", "2", "3", "4"]), tf.constant(["1", "x7", "12", "y"])]
    data, splits, _ = string_ops.ctr_pack_strings(s, equal_sizes=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"feature 1: token 'x7' in row 1 is not an int64"):
        string_ops.ctr_multi_string_embedding(params=t, bytes=data, row_splits=splits, combiners=["sum"] * 2,
                                              id_modes=["index"] * 2, delimiters=[""] * 2, skip_empty=[True] * 2,
                                              max_norms=[-1.0] * 2)
    s = [tf.constant(["1", "2", "3", "4"]), tf.constant(["1", "7", "12", "3"])]
    data, splits, _ = string_ops.ctr_pack_strings(s, equal_sizes=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"feature 1: token '12' in row 2 is id 12, out of range"):
        string_ops.ctr_multi_string_embedding(params=t, bytes=data, row_splits=splits, combiners=["sum"] * 2,
                                              id_modes=["index"] * 2, delimiters=[""] * 2, skip_empty=[True] * 2,
                                              max_norms=[-1.0] * 2)


@pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")), reason="online graphs are placed on a GPU here")
@pytest.mark.parametrize("form", ["two_branches", "one_outside"])
def test_features_under_a_cond_are_not_grouped(tmp_path, form):
    # TF lowers a cond to Switch/Merge before our pass. Grouped across the
    # branches, one input of the grouped op was always dead and the op never
    # ran: the output was silently empty, the always-needed feature's too.
    t = tf.Variable(tf.random.stateless_normal([10, 4], seed=[1, 9]))
    u = tf.Variable(tf.random.stateless_normal([10, 4], seed=[2, 9]))

    def lookup(table, s):
        return tf.nn.embedding_lookup(table, tf.strings.to_hash_bucket_fast(s, 10))

    def model(x, flag):
        if form == "two_branches":
            return tf.cond(flag, lambda: lookup(t, x[:, 0]), lambda: lookup(u, x[:, 0]))
        first = lookup(t, x[:, 0])
        return first + tf.cond(flag, lambda: lookup(u, x[:, 1]), lambda: tf.zeros_like(first))

    spec = [tf.TensorSpec([None, 2], tf.string), tf.TensorSpec([], tf.bool)]
    x = tf.constant([["a", "c"], ["b", "d"]])
    report_file = str(tmp_path / "report.jsonl")
    with rewrite.enable(serving_device="cpu", report_file=report_file):
        fused = tf.function(model, input_signature=spec)
        got = {flag: fused(x, tf.constant(flag)).numpy() for flag in (True, False)}
    plain = tf.function(model, input_signature=spec)
    for flag in (True, False):
        np.testing.assert_array_equal(got[flag], plain(x, tf.constant(flag)).numpy())
    report = rewrite.read_report(report_file)
    assert "CtrMultiStringEmbedding" not in {m["fused_op"] for m in report["match"]}, report
    assert any(s["pattern"] == "group_strings" and "control flow" in s["reason"] for s in report["skip"]), report


@pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")), reason="online graphs are placed on a GPU here")
def test_a_concat_in_a_loop_that_never_runs_proves_no_batch_size():
    # Inference merged the two features' batch sizes through a ConcatV2 in a
    # loop body: grouped, a batch of 3 and one of 1 (which the original
    # broadcasts) failed in the grouped pack.
    t = tf.Variable(tf.random.stateless_normal([30, 4], seed=[1, 9]))
    u = tf.Variable(tf.random.stateless_normal([30, 4], seed=[2, 9]))

    def model(a, b, n):
        ea = tf.nn.embedding_lookup(t, tf.strings.to_hash_bucket_fast(a, 30))
        eb = tf.nn.embedding_lookup(u, tf.strings.to_hash_bucket_fast(b, 30))
        _, extra = tf.while_loop(lambda i, acc: i < n,
                                 lambda i, acc: (i + 1, acc + tf.reduce_sum(tf.concat([ea, eb], 1))), (0, 0.0))
        return tf.reduce_sum(ea + eb, axis=1) + extra

    spec = [tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.string), tf.TensorSpec([], tf.int32)]
    args = (tf.constant(["a", "b", "c"]), tf.constant(["u"]), tf.constant(0))
    with rewrite.enable(serving_device="cpu"):
        got = tf.function(model, input_signature=spec)(*args).numpy()
    np.testing.assert_allclose(got, tf.function(model, input_signature=spec)(*args).numpy(), rtol=1e-6)

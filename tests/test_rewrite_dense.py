"""CtrFusionOptimizer on dense (one id per row) hash features and ragged pooling.

Single-valued hash features -- tf.nn.embedding_lookup(table,
tf.strings.to_hash_bucket_fast(s, n)) and Keras 3 Hashing + Embedding -- become
CtrPackStrings + CtrStringEmbedding with an empty delimiter (the whole string
is one token), and must give bit-identical rows; hashed integer keys
(AsString first) become a hash-mode CtrEmbeddingLookup with one key per row.

Ragged pooling -- reduce_sum(tf.nn.embedding_lookup(table, ragged ids),
axis=1) -- becomes CtrEmbeddingLookup on the row splits, or CtrStringEmbedding
when the ids are tf.strings.split tokens converted by to_number or
to_hash_bucket_fast.
"""

import numpy as np
import pytest
import tensorflow as tf

import tf_ctr_ops  # noqa: F401  (registers the ops and the optimizer)
from tf_ctr_ops import rewrite
from tf_ctr_ops.strings import _ops as string_ops
from test_rewrite import CPU_PASS, delta, offline, read_csv, run_graph_def, run_online

V, D = 64, 8
STRINGS_1D = tf.TensorSpec([None], tf.string)
STRINGS_2D = tf.TensorSpec([None, 1], tf.string)


def random_strings(rng, n=48):
    """Random byte strings, with empty ones, delimiters and non-ASCII bytes in them."""
    alphabet = list("abcdef0123456789,|: ") + ["\u00e9", "\x00"]
    out = ["".join(rng.choice(alphabet, size=rng.integers(0, 12))) for _ in range(n)]
    out[:3] = ["", ",", " "]
    return out


def hashed_lookup(table, buckets=V):
    return lambda s: tf.nn.embedding_lookup(table, tf.strings.to_hash_bucket_fast(s, buckets))


def assert_identical(got, want):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def assert_model_close(got, want):
    # The Dense layers after the lookups are fused by Grappler online
    # (_FusedMatMul), which rounds differently from eager by an ulp.
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-7)


def fused_ops(graph_def):
    return {k: v for k, v in rewrite.op_counts(graph_def, library=True).items() if k.startswith("Ctr")}


@pytest.fixture
def table(rng):
    return tf.Variable(rng.normal(size=(V, D)).astype(np.float32))


# ---------------------------------------------------------------------------
# The op: an empty delimiter makes each whole string one token


def whole_string_embedding(table, strings, skip_empty=False, combiner="sum", buckets=0):
    data, splits = tf_ctr_ops.pack_strings(strings)
    return string_ops.ctr_string_embedding(params=table, bytes=data, row_splits=splits,
                                           bag_splits=tf.zeros([0], tf.int64), delimiter="", combiner=combiner,
                                           id_mode="hash", skip_empty=skip_empty, num_buckets=buckets)


def test_empty_delimiter_is_one_token_per_string(rng, table):
    strings = tf.constant(random_strings(rng))
    want = tf.gather(table, tf.strings.to_hash_bucket_fast(strings, V))
    assert_identical(whole_string_embedding(table, strings), want)
    for combiner in ("mean", "sqrtn"):  # one token: every combiner is the row itself
        np.testing.assert_allclose(whole_string_embedding(table, strings, combiner=combiner), want, rtol=1e-6)
    # skip_empty drops the empty token: an empty string pools nothing.
    got = whole_string_embedding(table, strings, skip_empty=True).numpy()
    empty = strings.numpy() == b""
    assert empty.any() and not got[empty].any()
    assert_identical(got[~empty], want.numpy()[~empty])


def test_empty_delimiter_with_fewer_buckets_and_batch_zero(rng):
    big = tf.Variable(rng.normal(size=(V + 10, D)).astype(np.float32))
    strings = tf.constant(random_strings(rng))
    assert_identical(whole_string_embedding(big, strings, buckets=V),
                     tf.gather(big, tf.strings.to_hash_bucket_fast(strings, V)))
    assert whole_string_embedding(big, tf.constant([], tf.string)).shape == (0, D)


def test_empty_delimiter_gradient(rng, table):
    strings = tf.constant(random_strings(rng) * 2)  # repeats: rows hit more than once
    upstream = tf.constant(rng.normal(size=(strings.shape[0], D)).astype(np.float32))
    with tf.GradientTape() as tape:
        got = tf.reduce_sum(whole_string_embedding(table, strings) * upstream)
    with tf.GradientTape() as tape2:
        want = tf.reduce_sum(tf.gather(table, tf.strings.to_hash_bucket_fast(strings, V)) * upstream)
    g, w = tape.gradient(got, table), tape2.gradient(want, table)
    np.testing.assert_allclose(tf.convert_to_tensor(g), tf.convert_to_tensor(w), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------
# Online: tf.nn.embedding_lookup over hashed strings


@pytest.mark.parametrize("spec", ["[B]", "[B, 1]"])
@pytest.mark.parametrize("kind", ["variable", "constant"])
def test_online_hashed_string_lookup(rng, table, spec, kind):
    params = table if kind == "variable" else tf.constant(table.numpy())
    strings = tf.constant(random_strings(rng))
    if spec == "[B, 1]":
        strings = tf.reshape(strings, [-1, 1])
    f = hashed_lookup(params)
    want = f(strings)
    sig = STRINGS_1D if spec == "[B]" else STRINGS_2D
    before = rewrite.fusion_stats()
    with rewrite.enable():
        got = tf.function(f, input_signature=[sig])(strings)
    assert delta(before, rewrite.fusion_stats())["rewrites"] == 1
    assert got.shape == want.shape
    assert_identical(got, want)


def test_offline_hashed_string_lookup_graph(table):
    cf, graph, report, counts = offline(hashed_lookup(table), STRINGS_2D)
    [match] = report["match"]
    assert match["pattern"] == "hash_gather" and match["fused_op"] == "CtrStringEmbedding"
    assert fused_ops(graph) == {"CtrPackStrings": 1, "CtrStringEmbedding": 1}
    assert not {"StringToHashBucketFast", "ResourceGather"} & set(counts), counts
    [node] = [n for n in graph.node if n.op == "CtrStringEmbedding"]
    assert node.attr["delimiter"].s == b"" and not node.attr["skip_empty"].b
    assert node.attr["combiner"].s == b"sum" and node.attr["num_buckets"].i == V
    strings = tf.constant([["a"], [""], ["b,c"]])
    [got] = run_graph_def(cf, graph, strings)
    assert got.shape == (3, 1, D)
    assert_identical(got, hashed_lookup(table)(strings))


def test_online_criteo_hex_categories(table):
    rows = read_csv("criteo_sample.txt")
    for col in ("C1", "C3", "C19", "C26"):  # C19 and C26 have empty values
        strings = tf.constant([r[col] for r in rows])
        f = hashed_lookup(table)
        got, stats = run_online(f, strings)
        assert stats["rewrites"] == 1
        assert_identical(got, f(strings))
    assert any(r["C26"] == "" for r in rows)


def test_fewer_buckets_than_rows_is_rewritten(rng):
    big = tf.Variable(rng.normal(size=(V, D)).astype(np.float32))
    strings = tf.constant(random_strings(rng))
    f = hashed_lookup(big, buckets=V // 2)
    got, stats = run_online(f, strings)
    assert stats["rewrites"] == 1
    assert_identical(got, f(strings))


def test_more_buckets_than_rows_fails_as_the_gather_does(rng):
    small = tf.Variable(rng.normal(size=(4, D)).astype(np.float32))
    strings = tf.constant(random_strings(rng))
    f = hashed_lookup(small, buckets=1000)
    with pytest.raises(tf.errors.InvalidArgumentError):
        f(strings)
    before = rewrite.fusion_stats()
    with pytest.raises(tf.errors.InvalidArgumentError):
        with rewrite.enable():
            tf.function(f)(strings)
    assert delta(before, rewrite.fusion_stats())["rewrites"] == 1


def test_hashed_int_keys_become_hash_mode_lookup(rng, table):
    keys = rng.integers(-10**12, 10**12, size=(40, 1))
    f = lambda k: tf.nn.embedding_lookup(table, tf.strings.to_hash_bucket_fast(tf.strings.as_string(k), V))  # noqa
    for dtype in (tf.int64, tf.int32):
        k = tf.constant(keys % (2**31 - 1) if dtype == tf.int32 else keys, dtype)
        cf, graph, report, counts = offline(f, tf.TensorSpec([None, 1], dtype))
        assert [m["fused_op"] for m in report["match"]] == ["CtrEmbeddingLookup"]
        assert not {"AsString", "StringToHashBucketFast", "ResourceGather"} & set(counts)
        [got] = run_graph_def(cf, graph, k)
        assert_identical(got, f(k))
        got, stats = run_online(f, k[:, 0])
        assert stats["rewrites"] == 1
        assert_identical(got, f(k[:, 0]))


# ---------------------------------------------------------------------------
# Left alone, with a reason, and still exact


def test_not_rewritten_hash_has_another_consumer(rng, table):
    def f(s):
        ids = tf.strings.to_hash_bucket_fast(s, V)
        return tf.nn.embedding_lookup(table, ids), ids

    cf, graph, report, counts = offline(f, STRINGS_1D)
    assert report["match"] == [] and not fused_ops(graph)
    assert any("has another consumer" in s["reason"] for s in report["skip"]), report["skip"]
    strings = tf.constant(random_strings(rng))
    for g, w in zip(run_graph_def(cf, graph, strings), f(strings)):
        assert_identical(g, w)


@pytest.mark.parametrize("case", ["float64 table", "ids of unknown rank", "rank-3 table", "axis 1"])
def test_not_rewritten_with_reason(rng, case):
    spec, table = STRINGS_1D, tf.Variable(rng.normal(size=(V, D)).astype(np.float32))
    f = hashed_lookup(table)
    if case == "float64 table":
        table = tf.Variable(rng.normal(size=(V, D)))
        f, reason = hashed_lookup(table), "DT_DOUBLE"
    elif case == "ids of unknown rank":
        spec, reason = tf.TensorSpec(None, tf.string), "rank unknown"
    elif case == "rank-3 table":
        table = tf.Variable(rng.normal(size=(V, 2, 4)).astype(np.float32))
        f, reason = hashed_lookup(table), "not a matrix"
    else:
        params = tf.constant(rng.normal(size=(D, V)).astype(np.float32))
        f = lambda s: tf.gather(params, tf.strings.to_hash_bucket_fast(s, V), axis=1)  # noqa: E731
        reason = "axis"
    cf, graph, report, counts = offline(f, spec)
    assert report["match"] == [] and not fused_ops(graph)
    assert any(reason in s["reason"] for s in report["skip"]), report["skip"]
    strings = tf.constant(random_strings(rng, 12))
    if case == "ids of unknown rank":
        strings = tf.reshape(strings, [6, 2])
    [got] = run_graph_def(cf, graph, strings)
    assert_identical(got, f(strings))


def test_negative_index_wrap_that_broadcasts_is_left_alone(rng, table):
    """Keras' wrap select(h < 0, h + n, h) is h only for a scalar n; here it broadcasts."""
    shift = tf.zeros([2, 1], tf.int64)

    def f(s):
        h = tf.strings.to_hash_bucket_fast(s, V)
        return tf.gather(table, tf.where(h < 0, h + shift, h))

    cf, graph, report, counts = offline(f, STRINGS_1D)
    assert report["match"] == [] and not fused_ops(graph)
    assert any("broadcast" in s["reason"] for s in report["skip"]), report["skip"]
    strings = tf.constant(random_strings(rng, 12))
    [got] = run_graph_def(cf, graph, strings)
    assert got.shape == (2, 12, D)
    assert_identical(got, f(strings))


def test_online_training_gradients_match(rng, table):
    """Under a GradientTape the gather's gradient reads the hashed ids, so the
    forward is left alone; the step must still give TF's own gradients."""
    strings = tf.constant(random_strings(rng))
    upstream = tf.constant(rng.normal(size=(strings.shape[0], D)).astype(np.float32))

    def step(s):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(hashed_lookup(table)(s) * upstream)
        return loss, tf.convert_to_tensor(tape.gradient(loss, table))

    want = step(strings)
    got, stats = run_online(step, strings)
    assert stats["rewrites"] == 0 and stats["skips"] > 0
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------
# Keras 3: Hashing + Embedding


def keras_hash_model(num_bins=V, dim=D, seed=0, int_keys=False):
    import keras

    keras.utils.set_random_seed(seed)
    names = ["site", "app"]
    inputs = [keras.Input((1,), dtype="int64" if int_keys else "string", name=n) for n in names]
    embedded = [keras.layers.Flatten()(keras.layers.Embedding(num_bins, dim, name=f"{n}_emb")(
        keras.layers.Hashing(num_bins, name=f"{n}_hash")(x))) for n, x in zip(names, inputs)]
    x = keras.layers.Concatenate()(embedded)
    y = keras.layers.Dense(1, activation="sigmoid", name="ctr")(keras.layers.Dense(8, activation="relu")(x))
    return keras.Model(inputs, y)


def test_keras_hashing_embedding_online(rng):
    model = keras_hash_model()
    inputs = {n: tf.reshape(tf.constant(random_strings(rng)), [-1, 1]) for n in ("site", "app")}
    want = model(inputs)
    got, stats = run_online(lambda x: model(x), inputs)
    # Two hash_gather (each with its Flatten, whose Shape(x)[0] Grappler folds
    # to the call's batch online), group_strings, then concat_strings (and,
    # placed on a CPU, string_tensors).
    assert stats["rewrites"] == 4 + CPU_PASS
    assert_model_close(got, want)


@pytest.mark.saved_model
def test_keras_hashing_embedding_saved_model(tmp_path, rng):
    model = keras_hash_model()
    src, dst = tmp_path / "src", tmp_path / "dst"
    model.export(str(src), verbose=False)
    samples = {n: np.array(random_strings(rng), object).reshape(-1, 1) for n in ("site", "app")}
    report = rewrite.optimize_saved_model(src, dst, sample_inputs={"serving_default": samples,
                                                                   "serve": samples}, runs=2)
    assert report.ok and report.verified
    sig = report.signatures["serving_default"]
    assert [m["pattern"] for m in sig.matches] == ["hash_gather"] * 2 + ["group_strings", "concat_strings"]
    assert sig.op_counts_after.get("CtrConcatStringEmbedding") == 1 and "CtrStringEmbedding" not in sig.op_counts_after
    assert "ConcatV2" not in sig.op_counts_after
    assert not {"StringToHashBucketFast", "GatherV2"} & set(sig.op_counts_after), sig.op_counts_after
    assert sig.max_abs_diff == 0
    loaded = tf.saved_model.load(str(dst))
    feeds = {k: tf.constant(v) for k, v in samples.items()}
    assert_identical(loaded.signatures["serving_default"](**feeds)["output_0"],
                     tf.saved_model.load(str(src)).signatures["serving_default"](**feeds)["output_0"])


def keras_deepfm_model(int_keys=False, num_bins=V, dim=D):
    """DeepFM as Keras users write it: each field's one Hashing layer read by
    its first-order Embedding(N, 1) and its Embedding(N, D)."""
    import keras

    keras.utils.set_random_seed(1)
    names = ["site", "app"]
    inputs = [keras.Input((1,), dtype="int64" if int_keys else "string", name=n) for n in names]
    hashed = [keras.layers.Hashing(num_bins, name=f"{n}_hash")(x) for n, x in zip(names, inputs)]
    first = [keras.layers.Flatten()(keras.layers.Embedding(num_bins, 1, name=f"{n}_w")(h)) for n, h in zip(names, hashed)]
    second = [keras.layers.Flatten()(keras.layers.Embedding(num_bins, dim, name=f"{n}_v")(h))
              for n, h in zip(names, hashed)]
    linear = keras.layers.Add()(first)
    fm = keras.layers.Dot(axes=1)(second)
    deep = keras.layers.Dense(1)(keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()(second)))
    return keras.Model(inputs, keras.layers.Activation("sigmoid")(keras.layers.Add()([linear, fm, deep])))


@pytest.mark.saved_model
@pytest.mark.parametrize("int_keys", [False, True])
def test_one_hash_read_by_two_embeddings_fuses_both(tmp_path, rng, int_keys):
    # Each hash had two gathers reading it: "has another consumer", nothing fused.
    model = keras_deepfm_model(int_keys)
    src, dst = tmp_path / "src", tmp_path / "dst"
    model.export(str(src), verbose=False)
    if int_keys:
        samples = {n: rng.integers(-10**12, 10**12, size=(40, 1)) for n in ("site", "app")}
    else:
        samples = {n: np.array(random_strings(rng, 40), object).reshape(-1, 1) for n in ("site", "app")}
    report = rewrite.optimize_saved_model(src, dst, signature_keys=["serving_default"],
                                          sample_inputs={"serving_default": samples}, runs=2)
    assert report.ok and report.verified
    sig = report.signatures["serving_default"]
    assert [m["pattern"] for m in sig.matches].count("hash_gather") == 4, sig.matches
    hashes = {"StringToHashBucketFast", "_TensorToHashBucketFast", "AsString"}
    assert not (hashes | {"GatherV2", "ResourceGather"}) & set(sig.op_counts_after), sig.op_counts_after
    # Each hash is absorbed once, by the field's last gather.
    absorbed = [r for m in sig.matches for r in m["replaced"]
                if r.rsplit(" (", 1)[1].rstrip(")") in ("StringToHashBucketFast", "_TensorToHashBucketFast")]
    assert len(absorbed) == 2, absorbed
    assert sig.max_abs_diff == 0
    feeds = {k: tf.constant(v) for k, v in samples.items()}
    assert_identical(tf.saved_model.load(str(dst)).signatures["serving_default"](**feeds)["output_0"],
                     tf.saved_model.load(str(src)).signatures["serving_default"](**feeds)["output_0"])


def flatten_ops(graph_def):
    counts = rewrite.op_counts(graph_def, library=True)
    return {op: counts[op] for op in ("ExpandDims", "Shape", "StridedSlice", "Pack") if op in counts}


STRINGS_COLUMN = tf.TensorSpec([None, 1], tf.string)


def keras_flatten(x):
    """keras.layers.Flatten on [B, 1, D]: Reshape(x, Pack(Shape(x)[0], D))."""
    return tf.reshape(x, tf.stack([tf.shape(x)[0], x.shape[-1]]))


@pytest.mark.parametrize("int_keys", [False, True])
def test_keras_flatten_goes_with_the_gather(rng, int_keys):
    """[B, 1] keys give [B, 1, D] rows that Flatten turns back into [B, D]:
    the fused op's own output. The Flatten is absorbed, no ExpandDims added."""
    t = [tf.Variable(rng.normal(size=(V, D)).astype(np.float32)) for _ in range(2)]

    def keys(k):
        return tf.strings.as_string(k) if int_keys else k

    def f(a, b):
        rows = [tf.nn.embedding_lookup(t[i], tf.strings.to_hash_bucket_fast(keys(x), V)) for i, x in enumerate((a, b))]
        return tf.concat([keras_flatten(r) for r in rows], axis=1)

    spec = tf.TensorSpec([None, 1], tf.int64) if int_keys else STRINGS_COLUMN
    cf, graph, report, counts = offline(f, spec, spec)
    assert flatten_ops(graph) == {}, counts
    hash_gathers = [m for m in report["match"] if m["pattern"] == "hash_gather"]
    assert len(hash_gathers) == 2
    for m in hash_gathers:
        assert {r.rsplit(" (", 1)[1].rstrip(")") for r in m["replaced"]} >= {"Shape", "StridedSlice", "Pack", "Reshape"}
    for batch in (17, 1, 0):
        if int_keys:
            args = [tf.constant(rng.integers(-10**9, 10**9, size=(batch, 1))) for _ in range(2)]
        else:
            args = [tf.reshape(tf.constant(random_strings(rng, max(batch, 3))[:batch], tf.string), [-1, 1])
                    for _ in range(2)]
        [got] = run_graph_def(cf, graph, *args)
        assert got.shape == (batch, 2 * D)
        assert_identical(got, f(*args))


def test_flatten_with_another_reader_of_the_rows_stays(rng, table):
    """The [B, 1, D] rows also feed a sum: they must still exist, so the fused
    op's output gets its middle axis back and the Flatten stays."""
    def f(s):
        rows = tf.nn.embedding_lookup(table, tf.strings.to_hash_bucket_fast(s, V))
        return tf.concat([keras_flatten(rows), tf.reduce_sum(rows, axis=1)], axis=1)

    cf, graph, report, counts = offline(f, STRINGS_COLUMN)
    assert counts.get("CtrStringEmbedding") == 1 and flatten_ops(graph).get("ExpandDims") == 1
    args = tf.reshape(tf.constant(random_strings(rng)), [-1, 1])
    [got] = run_graph_def(cf, graph, args)
    assert_identical(got, f(args))


def test_flatten_to_minus_one_stays(rng, table):
    """Reshape to [B, -1] fails on an empty batch where the fused [B, D] would
    not: it is not the fused output, so it stays (after an ExpandDims)."""
    def f(s):
        rows = tf.nn.embedding_lookup(table, tf.strings.to_hash_bucket_fast(s, V))
        return tf.reshape(rows, tf.stack([tf.shape(rows)[0], -1]))

    cf, graph, report, counts = offline(f, STRINGS_COLUMN)
    assert counts.get("CtrStringEmbedding") == 1 and flatten_ops(graph).get("ExpandDims") == 1
    args = tf.reshape(tf.constant(random_strings(rng)), [-1, 1])
    [got] = run_graph_def(cf, graph, args)
    assert_identical(got, f(args))


@pytest.mark.parametrize("shape,absorbed", [((-1, D), True), ((4, D), False)])
def test_flatten_to_a_constant_shape(rng, table, shape, absorbed):
    """Reshape(rows, [-1, D]) (or Keras' Flatten once Grappler folds the
    batch of a specialized function) is the fused output; a constant batch
    that the rows' batch is not known to be stays a Reshape, which fails on
    other batches as before."""
    def f(s):
        return tf.reshape(tf.nn.embedding_lookup(table, tf.strings.to_hash_bucket_fast(s, V)), shape)

    cf, graph, report, counts = offline(f, STRINGS_COLUMN)
    assert counts.get("CtrStringEmbedding") == 1
    # One Reshape flattens the [B, 1] keys for the fused op; the rows' stays unless absorbed.
    assert counts.get("Reshape") == (1 if absorbed else 2), counts
    assert ("ExpandDims" in flatten_ops(graph)) != absorbed, counts
    for batch in ((17, 4, 1, 0) if absorbed else (4,)):
        args = tf.reshape(tf.constant(random_strings(rng, max(batch, 3))[:batch], tf.string), [-1, 1])
        [got] = run_graph_def(cf, graph, args)
        assert_identical(got, f(args))
    if not absorbed:
        args = tf.reshape(tf.constant(random_strings(rng, 3)), [-1, 1])
        with pytest.raises(tf.errors.InvalidArgumentError):
            f(args)
        with pytest.raises(tf.errors.InvalidArgumentError):
            run_graph_def(cf, graph, args)


@pytest.mark.parametrize("axis", [1, -2])
@pytest.mark.parametrize("int_keys", [False, True])
def test_squeeze_of_the_middle_axis_goes_with_the_gather(rng, int_keys, axis):
    """keras.ops.squeeze(Embedding(keys [B, 1]), axis=1): the Squeeze turns the
    [B, 1, D] rows back into the fused op's [B, D], so it is absorbed, and no
    ExpandDims is added to undo."""
    t = tf.Variable(rng.normal(size=(V, D)).astype(np.float32))

    def f(k):
        k = tf.strings.as_string(k) if int_keys else k
        return tf.squeeze(tf.gather(t, tf.strings.to_hash_bucket_fast(k, V)), axis=axis)

    spec = tf.TensorSpec([None, 1], tf.int64) if int_keys else STRINGS_COLUMN
    cf, graph, report, counts = offline(f, spec)
    assert "Squeeze" not in counts and "ExpandDims" not in counts, counts
    [m] = [m for m in report["match"] if m["pattern"] == "hash_gather"]
    assert any(r.endswith("(Squeeze)") for r in m["replaced"])
    for batch in (9, 1, 0):
        if int_keys:
            arg = tf.constant(rng.integers(-10**9, 10**9, size=(batch, 1)))
        else:
            arg = tf.reshape(tf.constant(random_strings(rng, max(batch, 3))[:batch], tf.string), [-1, 1])
        [got] = run_graph_def(cf, graph, arg)
        assert got.shape == (batch, D)
        assert_identical(got, f(arg))


@pytest.mark.parametrize("case", ["all_unit_axes", "batch_axis", "another_reader"])
def test_other_squeezes_stay(rng, table, case):
    """A Squeeze of every unit axis (of D too, were it 1) or of the batch axis
    (which fails unless B is 1) is not the fused output; nor can the rows go
    while something else reads them."""
    def f(s):
        rows = tf.nn.embedding_lookup(table, tf.strings.to_hash_bucket_fast(s, V))
        if case == "all_unit_axes":
            return tf.squeeze(rows)
        if case == "batch_axis":
            return tf.squeeze(rows, axis=0)
        return tf.concat([tf.squeeze(rows, axis=1), tf.reduce_sum(rows, axis=1)], axis=1)

    cf, graph, report, counts = offline(f, STRINGS_COLUMN)
    assert counts.get("CtrStringEmbedding") == 1 and counts.get("Squeeze") == 1 and counts.get("ExpandDims") == 1
    args = tf.reshape(tf.constant(random_strings(rng)[:1 if case == "batch_axis" else None]), [-1, 1])
    [got] = run_graph_def(cf, graph, args)
    assert_identical(got, f(args))
    if case == "batch_axis":  # as the original, a batch of 3 fails
        with pytest.raises(tf.errors.InvalidArgumentError):
            run_graph_def(cf, graph, tf.reshape(tf.constant(random_strings(rng, 3)), [-1, 1]))


def test_keras_hashing_of_int_keys(rng):
    model = keras_hash_model(int_keys=True)
    inputs = {n: tf.constant(rng.integers(0, 10**9, size=(20, 1))) for n in ("site", "app")}
    want = model(inputs)
    got, stats = run_online(lambda x: model(x), inputs)
    assert stats["rewrites"] == 2
    assert_model_close(got, want)


# ---------------------------------------------------------------------------
# Ragged: reduce_sum(tf.nn.embedding_lookup(table, ragged ids), axis=1)

RAGGED_IDS = tf.RaggedTensorSpec([None, None], tf.int64)


def ragged_sum(table):
    return lambda r: tf.reduce_sum(tf.nn.embedding_lookup(table, r), axis=1)


def random_ragged(rng, rows=40, max_len=6, vocab=V, dtype=np.int64):
    lengths = rng.integers(0, max_len + 1, size=rows)
    lengths[-1] = 0  # an empty last row: the row count comes from the splits
    return tf.RaggedTensor.from_row_lengths(rng.integers(0, vocab, size=lengths.sum()).astype(dtype), lengths)


def split_ids(table, convert, sep=","):
    def f(s):
        tokens = tf.strings.split(s, sep)
        ids = tf.strings.to_number(tokens, tf.int64) if convert == "number" else tf.strings.to_hash_bucket_fast(tokens, V)
        return tf.reduce_sum(tf.nn.embedding_lookup(table, ids), axis=1)

    return f


def random_id_strings(rng, rows=40, sep=","):
    out = [sep.join(str(v) for v in rng.integers(0, V, size=rng.integers(1, 6))) for _ in range(rows)]
    return out


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
@pytest.mark.parametrize("kind", ["variable", "constant"])
def test_online_ragged_sum(rng, table, kind, dtype):
    params = table if kind == "variable" else tf.constant(table.numpy())
    ids = random_ragged(rng, dtype=dtype)
    f = ragged_sum(params)
    got, stats = run_online(f, ids)
    assert stats["rewrites"] == 1
    np.testing.assert_allclose(got, f(ids), rtol=1e-6, atol=1e-6)
    assert got.shape[0] == ids.nrows()


def test_offline_ragged_sum_is_one_fused_op(rng, table):
    cf, graph, report, counts = offline(ragged_sum(table), RAGGED_IDS)
    [match] = report["match"]
    assert match["pattern"] == "ragged_reduce_lookup" and match["fused_op"] == "CtrEmbeddingLookup"
    assert fused_ops(graph) == {"CtrEmbeddingLookup": 1}
    # The segment-id subgraph died with the reduction.
    assert not {"UnsortedSegmentSum", "ResourceGather", "Tile", "Where"} & set(counts), counts
    [node] = [n for n in graph.node if n.op == "CtrEmbeddingLookup"]
    assert node.attr["segment_kind"].s == b"row_splits" and node.attr["combiner"].s == b"sum"
    for ids in (random_ragged(rng), tf.ragged.constant([[], [], []], tf.int64), tf.ragged.constant([[1, 2, 3]], tf.int64)):
        [got] = run_graph_def(cf, graph, ids)
        np.testing.assert_allclose(got, ragged_sum(table)(ids), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("convert", ["number", "hash"])
def test_ragged_sum_of_split_strings(rng, table, convert):
    f = split_ids(table, convert)
    strings = random_id_strings(rng) + ["7", "1,,2" if convert == "hash" else "3,4"]
    s = tf.constant(strings)
    got, stats = run_online(f, s)
    assert stats["rewrites"] == 1
    np.testing.assert_allclose(got, f(s), rtol=1e-6, atol=1e-6)
    cf, graph, report, counts = offline(f, STRINGS_1D)
    assert [m["fused_op"] for m in report["match"]] == ["CtrStringEmbedding"]
    assert fused_ops(graph) == {"CtrPackStrings": 1, "CtrStringEmbedding": 1}
    assert not {"StringSplitV2", "StringToNumber", "StringToHashBucketFast", "UnsortedSegmentSum",
                "DenseBincount"} & set(counts), counts
    [node] = [n for n in graph.node if n.op == "CtrStringEmbedding"]
    assert node.attr["delimiter"].s == b"," and not node.attr["skip_empty"].b
    [got] = run_graph_def(cf, graph, s)
    np.testing.assert_allclose(got, f(s), rtol=1e-6, atol=1e-6)
    if convert == "hash":  # empty strings and empty tokens are hashed like any other
        edge = tf.constant(["", ",", "a,,b"])
        [got] = run_graph_def(cf, graph, edge)
        np.testing.assert_allclose(got, f(edge), rtol=1e-6, atol=1e-6)


@pytest.mark.saved_model
def test_keras_hashing_of_split_tokens_through_map_flat_values_is_one_string_embedding(tmp_path, rng):
    # Keras 3's Embedding takes no ragged ids, so users map a Hashing and an
    # Embedding over the split's flat values: the Embedding's wrap of the
    # hashed ids (never negative) goes with the split, hash and pooling.
    import keras

    class TagPool(keras.layers.Layer):
        def __init__(self):
            super().__init__()
            self.hash, self.emb = keras.layers.Hashing(V), keras.layers.Embedding(V, D)

        def call(self, s):
            ids = tf.ragged.map_flat_values(self.hash, tf.strings.split(s, " "))
            return tf.reduce_mean(tf.ragged.map_flat_values(self.emb, ids), axis=1)

    keras.utils.set_random_seed(8)
    s = keras.Input((), dtype="string", name="tags")
    src, dst = tmp_path / "src", tmp_path / "dst"
    keras.Model(s, keras.layers.Dense(1)(TagPool()(s))).export(str(src), verbose=False)
    sig = rewrite.optimize_saved_model(src, dst, runs=1, signature_keys=["serving_default"]).signatures[
        "serving_default"]
    assert [m["fused_op"] for m in sig.matches] == ["CtrStringEmbedding"], sig.matches
    assert not {"StringToHashBucketFast", "StringSplitV2", "SelectV2", "GatherV2"} & set(sig.op_counts_after)
    assert sig.outputs_match
    native = tf.saved_model.load(str(src)).signatures["serving_default"]
    fused = tf.saved_model.load(str(dst)).signatures["serving_default"]
    for tags in (random_strings(rng, 30), ["", " ", "a  b", "x"], []):
        t = tf.constant(np.array([" ".join(w.split(",")) for w in tags], object).reshape(-1))
        assert_model_close(fused(tags=t)["output_0"], native(tags=t)["output_0"])


def test_ragged_sum_of_movielens_genres(table):
    genres = tf.constant([r["genres"] for r in read_csv("movielens_sample.txt")])
    f = split_ids(table, "hash", sep="|")
    got, stats = run_online(f, genres)
    assert stats["rewrites"] == 1
    np.testing.assert_allclose(got, f(genres), rtol=1e-6, atol=1e-6)


def test_ragged_index_errors_stay_errors(table):
    f = split_ids(table, "number")
    for bad in (["1,x"], ["1", str(V)]):
        with pytest.raises(tf.errors.InvalidArgumentError):
            f(tf.constant(bad))
        with pytest.raises(tf.errors.InvalidArgumentError):
            with rewrite.enable():
                tf.function(f)(tf.constant(bad))


def ragged_mean(params):
    return lambda r: tf.reduce_mean(tf.nn.embedding_lookup(params, r), axis=1)


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_ragged_mean_keeps_nan_rows(rng, table, dtype):
    """TF's mean of an empty ragged row is 0 / 0 = NaN: the fused sum is divided
    by the row lengths of the splits, so the rewritten graph gives NaN too."""
    f = ragged_mean(table)
    spec = tf.RaggedTensorSpec([None, None], tf.as_dtype(dtype), ragged_rank=1, row_splits_dtype=tf.int64)
    cf, graph, report, counts = offline(f, spec)
    [match] = report["match"]
    assert match["pattern"] == "ragged_reduce_lookup" and match["fused_op"] == "CtrEmbeddingLookup"
    assert fused_ops(graph) == {"CtrEmbeddingLookup": 1}
    assert not {"UnsortedSegmentSum", "ResourceGather", "Fill"} & set(counts), counts
    for ids in (random_ragged(rng, dtype=dtype), tf.ragged.constant([[], []], tf.as_dtype(dtype)),
                tf.ragged.constant([[3]], tf.as_dtype(dtype))):
        [got] = run_graph_def(cf, graph, ids)
        want = f(ids).numpy()
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    ids = random_ragged(rng, dtype=dtype)
    got, stats = run_online(f, ids)
    assert stats["rewrites"] == 1
    assert np.isnan(got.numpy()[-1]).all()
    np.testing.assert_allclose(got, f(ids), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("convert", ["number", "hash"])
def test_ragged_mean_of_split_strings_is_the_fused_mean(rng, table, convert):
    """tf.strings.split gives every string a token (an empty one for ""), so no
    row is empty and the division becomes the fused mean."""
    def f(s):
        tokens = tf.strings.split(s, "|")
        ids = tf.strings.to_number(tokens, tf.int64) if convert == "number" else tf.strings.to_hash_bucket_fast(tokens, V)
        return tf.reduce_mean(tf.nn.embedding_lookup(table, ids), axis=1)

    strings = [s.replace(",", "|") for s in random_id_strings(rng)]
    if convert == "hash":
        strings += ["", "a||b"]
    s = tf.constant(strings)
    cf, graph, report, counts = offline(f, STRINGS_1D)
    assert [m["fused_op"] for m in report["match"]] == ["CtrStringEmbedding"]
    assert fused_ops(graph) == {"CtrPackStrings": 1, "CtrStringEmbedding": 1}
    assert not {"RealDiv", "UnsortedSegmentSum", "StringSplitV2"} & set(counts), counts
    [node] = [n for n in graph.node if n.op == "CtrStringEmbedding"]
    assert node.attr["combiner"].s == b"mean"
    [got] = run_graph_def(cf, graph, s)
    np.testing.assert_allclose(got, f(s), rtol=1e-6, atol=1e-6)
    got, stats = run_online(f, s)
    assert stats["rewrites"] == 1
    np.testing.assert_allclose(got, f(s), rtol=1e-6, atol=1e-6)


def test_ragged_mean_not_rewritten_when_the_count_has_another_consumer(rng, table):
    def f(r):
        rows = tf.nn.embedding_lookup(table, r)
        return tf.reduce_mean(rows, axis=1), tf.reduce_sum(tf.ones_like(rows), axis=1)

    cf, graph, report, counts = offline(f, RAGGED_IDS)
    ids = random_ragged(rng)
    got = run_graph_def(cf, graph, ids)
    want = f(ids)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6, atol=1e-6)


def test_ragged_mean_gradient_online(rng, table):
    lengths = rng.integers(1, 6, size=30)  # no empty row: the gradient is finite
    ids = tf.RaggedTensor.from_row_lengths(rng.integers(0, V, size=lengths.sum()), lengths)
    upstream = tf.constant(rng.normal(size=(30, D)).astype(np.float32))
    f = ragged_mean(table)

    def grad(r):
        with tf.GradientTape() as tape:
            value = tf.reduce_sum(f(r) * upstream)
        return value, tf.convert_to_tensor(tape.gradient(value, table))

    want = grad(ids)
    with rewrite.enable():
        got = tf.function(grad)(ids)
    assert np.isfinite(got[1].numpy()).all()
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)


def test_ragged_not_rewritten_when_rows_have_another_consumer(rng, table):
    def f(r):
        rows = tf.nn.embedding_lookup(table, r)
        return tf.reduce_sum(rows, axis=1), rows.flat_values

    cf, graph, report, counts = offline(f, RAGGED_IDS)
    assert report["match"] == [] and not fused_ops(graph)
    assert any("another consumer" in s["reason"] for s in report["skip"]), report["skip"]
    ids = random_ragged(rng)
    for g, w in zip(run_graph_def(cf, graph, ids), f(ids)):
        np.testing.assert_array_equal(g, w)


def test_unsorted_segment_sum_of_other_segments_is_left_alone(rng, table):
    """Same ops, but segment ids that are not the ragged rows: no rewrite."""
    def f(r, seg):
        rows = tf.nn.embedding_lookup(table, r.values)
        return tf.math.unsorted_segment_sum(rows, seg, r.nrows(out_type=tf.int32))

    cf, graph, report, counts = offline(f, RAGGED_IDS, tf.TensorSpec([None], tf.int64))
    assert report["match"] == [] and not fused_ops(graph)
    ids = random_ragged(rng)
    seg = tf.constant(rng.integers(0, ids.nrows().numpy(), size=ids.values.shape[0]))
    [got] = run_graph_def(cf, graph, ids, seg)
    np.testing.assert_array_equal(got, f(ids, seg))


def test_keras_training_step_online_gradients_match(rng):
    model = keras_hash_model()
    inputs = {n: tf.reshape(tf.constant(random_strings(rng)), [-1, 1]) for n in ("site", "app")}

    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x))
        return [tf.convert_to_tensor(g) for g in tape.gradient(loss, model.trainable_variables)]

    want = step(inputs)
    got, stats = run_online(step, inputs)
    assert stats["rewrites"] == 0 and stats["skips"] > 0  # the backward pass reads the hashed ids
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------
# Padded ids: mean or sum of the gathered rows over a fixed-length id axis
# (Keras' Embedding + GlobalAveragePooling1D, reduce_mean/sum(..., axis=1))

L = 5


def padded_ids(rng, rows=30, length=L, dtype=np.int64, vocab=V):
    ids = rng.integers(0, vocab, size=(rows, length)).astype(dtype)
    ids[::3, -2:] = 0  # padding, as Keras pads sequences
    return tf.constant(ids)


def padded_pool(table, reduce=tf.reduce_mean, axis=1, keepdims=False):
    return lambda ids: reduce(tf.nn.embedding_lookup(table, ids), axis=axis, keepdims=keepdims)


@pytest.mark.parametrize("reduce", [tf.reduce_mean, tf.reduce_sum], ids=["mean", "sum"])
@pytest.mark.parametrize("dtype", [tf.int64, tf.int32])
@pytest.mark.parametrize("axis", [1, -2, [1]])
def test_offline_padded_pool_is_one_fused_op(rng, table, reduce, dtype, axis):
    f = padded_pool(table, reduce, axis)
    cf, graph, report, counts = offline(f, tf.TensorSpec([None, L], dtype))
    [match] = report["match"]
    assert match["pattern"] == "dense_reduce_lookup" and match["fused_op"] == "CtrEmbeddingLookup"
    assert fused_ops(graph) == {"CtrEmbeddingLookup": 1}
    assert not {"Mean", "Sum", "ResourceGather", "GatherV2"} & set(counts), counts
    [node] = [n for n in graph.node if n.op == "CtrEmbeddingLookup"]
    assert node.attr["segment_kind"].s == b"row_splits"
    assert node.attr["combiner"].s == (b"mean" if reduce is tf.reduce_mean else b"sum")
    for ids in (padded_ids(rng, dtype=dtype.as_numpy_dtype), tf.zeros([0, L], dtype),
                padded_ids(rng, rows=2000, dtype=dtype.as_numpy_dtype)):
        [got] = run_graph_def(cf, graph, ids)
        np.testing.assert_allclose(got, f(ids), rtol=1e-6, atol=1e-6)
        assert got.shape == (ids.shape[0], D)


def test_online_padded_pool_and_constant_table(rng, table):
    for params in (table, tf.constant(table.numpy())):
        f = padded_pool(params)
        ids = padded_ids(rng)
        got, stats = run_online(f, ids)
        assert stats["rewrites"] == 1
        np.testing.assert_allclose(got, f(ids), rtol=1e-6, atol=1e-6)


def test_padded_pool_bad_ids_stay_errors(rng, table):
    """Ids outside the table fail as the gather fails, naming the value."""
    cf, graph, _, counts = offline(padded_pool(table), tf.TensorSpec([None, L], tf.int64))
    assert counts.get("CtrEmbeddingLookup") == 1
    for bad in (V, -1, 2**40):
        ids = padded_ids(rng).numpy()
        ids[7, 2] = bad
        with pytest.raises(tf.errors.InvalidArgumentError, match=str(bad)):
            run_graph_def(cf, graph, tf.constant(ids))
        with pytest.raises(tf.errors.InvalidArgumentError):
            padded_pool(table)(tf.constant(ids))


def test_padded_pool_of_hashed_int_keys_is_hash_mode(rng, table):
    f = lambda k: tf.reduce_mean(tf.nn.embedding_lookup(table, tf.strings.to_hash_bucket_fast(tf.strings.as_string(k), V)), axis=1)  # noqa: E731,E501
    cf, graph, report, counts = offline(f, tf.TensorSpec([None, L], tf.int64))
    assert [m["pattern"] for m in report["match"]] == ["dense_reduce_lookup"]
    assert not {"AsString", "StringToHashBucketFast"} & set(counts), counts
    keys = tf.constant(rng.integers(-10**12, 10**12, size=(40, L)))
    [got] = run_graph_def(cf, graph, keys)
    np.testing.assert_allclose(got, f(keys), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("case, reason", [
    ("keepdims", "keeps the reduced axis"),
    ("axis0", "does not reduce the id axis"),
    ("both_axes", "does not reduce the id axis"),
    ("unknown_length", "not a known constant"),
    ("empty_axis", "id axis is empty"),
    ("half", "not float32"),
    ("mixed_precision", "cast from DT_FLOAT to DT_HALF before the reduction"),
    ("mixed_precision_keras_mean", "cast from DT_FLOAT to DT_HALF before the reduction"),
    ("mixed_precision_masked", "cast from DT_FLOAT to DT_HALF before the reduction"),
    ("mean_of_weighted", "a mean of weighted rows divides by the id axis' length"),
    ("multiplied_by_a_row", "multiplied by something other than weights [B, L]"),
    ("squared", "sums a product of gathered rows"),
    ("rows_read_twice", "has another consumer"),
])
def test_padded_pool_left_alone_with_reason(rng, case, reason):
    dtype = np.float16 if case == "half" else np.float32
    params = tf.Variable(rng.normal(size=(V, D)).astype(dtype))
    length = {"unknown_length": None, "empty_axis": 0}.get(case, L)

    def f(ids):
        rows = tf.nn.embedding_lookup(params, ids)
        if case == "keepdims":
            return tf.reduce_mean(rows, axis=1, keepdims=True)
        if case == "axis0":
            return tf.reduce_mean(rows, axis=0)
        if case == "both_axes":
            return tf.reduce_mean(rows, axis=[0, 1])
        if case == "rows_read_twice":
            return tf.reduce_mean(rows, axis=1) + tf.reduce_max(rows, axis=1)
        if case == "mixed_precision":  # a Keras mixed_float16 Embedding casts its rows
            return tf.reduce_mean(tf.cast(rows, tf.float16), axis=1)
        if case == "mixed_precision_keras_mean":  # and keras.ops.mean reduces half rows in float32
            return tf.cast(tf.reduce_mean(tf.cast(tf.cast(rows, tf.float16), tf.float32), axis=1), tf.float16)
        if case == "mean_of_weighted":
            return tf.reduce_mean(rows * tf.expand_dims(tf.cast(tf.not_equal(ids, 0), rows.dtype), -1), axis=1)
        if case == "multiplied_by_a_row":
            return tf.reduce_sum(rows * tf.ones([D], rows.dtype), axis=1)
        if case == "squared":  # tf.clip_by_norm's norm, as embedding_lookup(max_norm=...) computes it
            return tf.reduce_sum(rows * rows, axis=1)
        if case == "mixed_precision_masked":  # the masked mean selects a half 0 for the masked rows
            mask = tf.expand_dims(tf.not_equal(ids, 0), -1)
            return tf.reduce_sum(tf.where(mask, tf.cast(rows, tf.float16), tf.constant(0, tf.float16)), axis=1)
        return tf.reduce_mean(rows, axis=1)

    cf, graph, report, counts = offline(f, tf.TensorSpec([None, length], tf.int64))
    assert "CtrEmbeddingLookup" not in counts
    assert any(s["pattern"] == "dense_reduce_lookup" and reason in s["reason"] for s in report["skip"]), report["skip"]
    ids = tf.constant(rng.integers(0, V, size=(6, 0 if case == "empty_axis" else L)))
    [got] = run_graph_def(cf, graph, ids)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(f(ids)))


def keras_sequence_model(mask_zero=False):
    import keras

    keras.utils.set_random_seed(3)
    ids = keras.Input(shape=(L,), dtype="int32", name="history")
    rows = keras.layers.Embedding(V, D, mask_zero=mask_zero, name="history_embedding")(ids)
    pooled = keras.layers.GlobalAveragePooling1D()(rows)
    return keras.Model(ids, keras.layers.Dense(1, name="head")(pooled))


def masked_ids(rng, rows=30, dtype=np.int32):
    """Padded ids with rows of padding only (a masked mean of nothing: NaN)."""
    ids = padded_ids(rng, rows=rows, dtype=dtype).numpy()
    ids[1::4] = 0
    return tf.constant(ids)


def masked_sum(params, mask_of=None):
    """The masked pooling Keras' GlobalAveragePooling1D does, written in TF."""
    def f(ids):
        rows = tf.nn.embedding_lookup(params, ids)
        mask = tf.not_equal(ids if mask_of is None else mask_of(ids), 0)
        return tf.reduce_sum(tf.where(tf.expand_dims(mask, -1), rows, 0.0), axis=1)
    return f


@pytest.mark.parametrize("dtype", [tf.int32, tf.int64])
def test_masked_sum_is_the_fused_sum_of_unmasked_rows(rng, dtype):
    params = tf.Variable(rng.normal(size=(V, D)).astype(np.float32))
    params[0].assign(np.full(D, np.inf, np.float32))  # the padding row: selected away, never 0 * inf
    f = masked_sum(params)
    cf, graph, report, counts = offline(f, tf.TensorSpec([None, L], dtype))
    assert [m["pattern"] for m in report["match"]] == ["dense_reduce_lookup"], report
    assert fused_ops(graph) == {"CtrEmbeddingLookup": 1}
    assert not {"Sum", "SelectV2", "ResourceGather", "GatherV2"} & set(counts), counts
    [node] = [n for n in graph.node if n.op == "CtrEmbeddingLookup"]
    assert node.attr["has_weights"].b and node.attr["prune_weights"].b and node.attr["combiner"].s == b"sum"
    for ids in (masked_ids(rng, dtype=dtype.as_numpy_dtype), tf.zeros([0, L], dtype),
                masked_ids(rng, rows=2000, dtype=dtype.as_numpy_dtype)):
        [got] = run_graph_def(cf, graph, ids)
        np.testing.assert_allclose(got, f(ids), rtol=1e-6, atol=1e-6)
    bad = masked_ids(rng).numpy()
    bad[3, 1] = V
    with pytest.raises(tf.errors.InvalidArgumentError, match=str(V)):
        run_graph_def(cf, graph, tf.constant(bad))
    with pytest.raises(tf.errors.InvalidArgumentError):
        f(tf.constant(bad))


@pytest.mark.parametrize("weights", ["mask", "bool_mask_cast_after", "float_of_ids", "mask_first", "ellipsis",
                                     "slices", "reshape"])
@pytest.mark.parametrize("dtype", [tf.int32, tf.int64])
def test_weighted_sum_written_by_hand_is_the_fused_weighted_sum(rng, weights, dtype):
    # DIN-style pooling: reduce_sum(rows * expand_dims(w, -1), 1) with w [B, L]
    # one per id; the weights go into the fused op as its weights (not
    # pruned: 0 * inf is NaN, as the Mul makes it).
    params = tf.Variable(rng.normal(size=(V, D)).astype(np.float32))
    params[0].assign(np.full(D, np.inf, np.float32))

    def f(ids):
        rows = tf.nn.embedding_lookup(params, ids)
        if weights in ("mask", "mask_first"):
            w = tf.expand_dims(tf.cast(tf.not_equal(ids, 0), tf.float32), -1)
        elif weights == "bool_mask_cast_after":
            w = tf.cast(tf.expand_dims(tf.not_equal(ids, 0), -1), tf.float32)
        elif weights == "ellipsis":  # DeepFM's feat_value[..., None]
            w = tf.cast(ids % 3, tf.float32)[..., None]
        elif weights == "slices":
            w = tf.cast(ids % 3, tf.float32)[:, :, tf.newaxis]
        elif weights == "reshape":  # DeepFM's tf.reshape(feat_value, [-1, F, 1])
            w = tf.reshape(tf.cast(ids % 3, tf.float32), [-1, L, 1])
        else:
            w = tf.expand_dims(tf.cast(ids % 3, tf.float32) - 0.5, -1)
        pooled = tf.reduce_sum(w * rows if weights == "mask_first" else rows * w, axis=1)
        return pooled / (tf.reduce_sum(w, axis=1) + 1e-8)

    cf, graph, report, counts = offline(f, tf.TensorSpec([None, L], dtype))
    assert [m["pattern"] for m in report["match"]] == ["dense_reduce_lookup"], report
    assert fused_ops(graph) == {"CtrEmbeddingLookup": 1}
    assert not {"Mul", "ResourceGather", "GatherV2"} & set(counts), counts
    [node] = [n for n in graph.node if n.op == "CtrEmbeddingLookup"]
    assert node.attr["has_weights"].b and not node.attr["prune_weights"].b and node.attr["combiner"].s == b"sum"
    for ids in (masked_ids(rng, dtype=dtype.as_numpy_dtype), tf.zeros([0, L], dtype),
                masked_ids(rng, rows=2000, dtype=dtype.as_numpy_dtype)):
        [got] = run_graph_def(cf, graph, ids)
        want = f(ids).numpy()
        assert ids.shape[0] == 0 or np.isnan(want).any() == (weights not in ("float_of_ids",))  # 0 * inf
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("weights_shape", [[None, L], [1, L], [L], [None, 1], []])
def test_weights_of_a_separate_input_broadcast_as_the_mul_broadcasts_them(rng, weights_shape):
    # DeepFM's feat_index / feat_value: the weights are another input, whose
    # batch nothing ties to the ids'. The fused op reads ids and weights
    # broadcast to their common shape, as the Mul of rows and weights
    # broadcasts them, failing where it fails.
    params = tf.Variable(rng.normal(size=(V, D)).astype(np.float32))

    def f(ids, w):
        return tf.reduce_sum(tf.nn.embedding_lookup(params, ids) * w[..., None], axis=1)

    cf, graph, report, counts = offline(f, tf.TensorSpec([None, L], tf.int64), tf.TensorSpec(weights_shape, tf.float32))
    assert [m["pattern"] for m in report["match"]] == ["dense_reduce_lookup"], report
    assert "BroadcastTo" in counts and not {"Mul", "ResourceGather"} & set(counts), counts

    def weights(batch):
        shape = [batch if d is None else d for d in weights_shape]
        return tf.constant(rng.uniform(-2, 2, size=shape).astype(np.float32))

    for batch in (0, 1, 37):
        ids, w = padded_ids(rng, rows=batch), weights(batch)
        [got] = run_graph_def(cf, graph, ids, w)
        np.testing.assert_allclose(got, f(ids, w), rtol=1e-6, atol=1e-6)
    if weights_shape == [None, L]:
        # A single row of ids broadcast over the weights' batch, as the Mul does.
        ids, w = padded_ids(rng, rows=1), weights(6)
        [got] = run_graph_def(cf, graph, ids, w)
        assert got.shape == (6, D)
        np.testing.assert_allclose(got, f(ids, w), rtol=1e-6, atol=1e-6)
        # Batches that do not broadcast fail in both.
        ids, w = padded_ids(rng, rows=3), weights(2)
        with pytest.raises(tf.errors.InvalidArgumentError):
            f(ids, w)
        with pytest.raises(tf.errors.InvalidArgumentError):
            run_graph_def(cf, graph, ids, w)


def test_weights_reshaped_without_known_columns_are_left_alone(rng):
    # Reshape(w, [-1, L, 1]) keeps each weight beside its id only where w has
    # L columns; else it moves weights between rows.
    params = tf.Variable(rng.normal(size=(V, D)).astype(np.float32))

    def f(ids, w):
        return tf.reduce_sum(tf.nn.embedding_lookup(params, ids) * tf.reshape(w, [-1, L, 1]), axis=1)

    cf, graph, report, counts = offline(f, tf.TensorSpec([None, L], tf.int64), tf.TensorSpec([None, None]))
    assert report["match"] == [], report
    assert any("is not known to keep each weight beside its id" in s["reason"] for s in report["skip"]), report
    ids, w = padded_ids(rng, rows=2), tf.constant(rng.normal(size=(5, 2)).astype(np.float32))
    [got] = run_graph_def(cf, graph, ids, w)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(f(ids, w)))


def test_one_id_per_row_over_longer_weights_is_left_alone(rng):
    params = tf.Variable(rng.normal(size=(V, D)).astype(np.float32))

    def f(ids, w):
        return tf.reduce_sum(tf.nn.embedding_lookup(params, ids) * w[..., None], axis=1)

    cf, graph, report, counts = offline(f, tf.TensorSpec([None, 1], tf.int64), tf.TensorSpec([None, None], tf.float32))
    assert report["match"] == [], report
    assert any("broadcast over weights of another length" in s["reason"] for s in report["skip"]), report["skip"]
    ids, w = padded_ids(rng, rows=4, length=1), tf.constant(rng.normal(size=(4, 7)).astype(np.float32))
    [got] = run_graph_def(cf, graph, ids, w)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(f(ids, w)))


@pytest.mark.saved_model
@pytest.mark.parametrize("int_keys", [False, True])
@pytest.mark.parametrize("serving_device", ["cpu", None])
def test_keras_hashed_sequence_fuses_hash_wrap_and_pooling(tmp_path, rng, int_keys, serving_device):
    # Hashing + Embedding + GlobalAveragePooling1D on [B, L] keys: the hash
    # (never negative, so Keras 3's wrap passes it through) goes into the
    # pooled lookup, integer keys anywhere, string keys on a CPU server (the
    # only device where the fused op hashes strings).
    import keras

    keras.utils.set_random_seed(4)
    x = keras.Input((L,), dtype="int64" if int_keys else "string", name="history")
    pooled = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(V, D)(keras.layers.Hashing(V)(x)))
    src, dst = tmp_path / "src", tmp_path / "dst"
    keras.Model(x, keras.layers.Dense(1)(pooled)).export(str(src), verbose=False)
    sig = rewrite.optimize_saved_model(src, dst, runs=1, serving_device=serving_device,
                                       signature_keys=["serving_default"]).signatures["serving_default"]
    assert sig.outputs_match and [m["pattern"] for m in sig.matches] == ["dense_reduce_lookup"], sig.matches
    hashed = int_keys or serving_device == "cpu"
    left = {"StringToHashBucketFast", "SelectV2", "Less"} & set(sig.op_counts_after)
    assert not left if hashed else left, sig.op_counts_after
    native = tf.saved_model.load(str(src)).signatures["serving_default"]
    fused = tf.saved_model.load(str(dst)).signatures["serving_default"]
    for batch in (0, 1, 40):
        keys = (rng.integers(-10**12, 10**12, size=(batch, L)) if int_keys else
                np.array(random_strings(rng, max(batch * L, 1))[:batch * L] or [], object).reshape(batch, L))
        assert_model_close(fused(history=tf.constant(keys))["output_0"], native(history=tf.constant(keys))["output_0"])


def test_mask_of_other_ids_is_left_alone_with_reason(rng, table):
    f = masked_sum(table, mask_of=lambda ids: ids - 1)
    cf, graph, report, counts = offline(f, tf.TensorSpec([None, L], tf.int64))
    assert "CtrEmbeddingLookup" not in counts
    assert any(s["pattern"] == "dense_reduce_lookup" and "the mask does not compare the gathered ids with 0"
               in s["reason"] for s in report["skip"]), report["skip"]
    ids = masked_ids(rng, dtype=np.int64)
    [got] = run_graph_def(cf, graph, ids)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(f(ids)))


@pytest.mark.saved_model
@pytest.mark.parametrize("mask_zero", [False, True])
def test_keras_embedding_global_average_pooling_saved_model(tmp_path, rng, mask_zero):
    """Keras' Embedding + GlobalAveragePooling1D, exported, rewritten, loaded
    in a fresh process by the rewrite's own check, and served here. With
    mask_zero=True the pooling sums the unmasked rows (the fused op, the mask
    as pruned weights) and divides by their count (kept): rows of padding
    only stay NaN, as Keras gives them."""
    model = keras_sequence_model(mask_zero=mask_zero)
    src, dst = tmp_path / "src", tmp_path / "dst"
    model.export(str(src), verbose=False)
    samples = {"history": padded_ids(rng, dtype=np.int32).numpy()}
    report = rewrite.optimize_saved_model(src, dst, sample_inputs={"serving_default": samples, "serve": samples})
    assert report.ok and report.verified
    sig = report.signatures["serving_default"]
    assert [m["pattern"] for m in sig.matches] == ["dense_reduce_lookup"], sig.matches
    assert not {"Mean", "ResourceGather", "GatherV2"} & set(sig.op_counts_after), sig.op_counts_after
    feeds = {"history": masked_ids(rng, rows=64) if mask_zero else padded_ids(rng, rows=64, dtype=np.int32)}
    got = tf.saved_model.load(str(dst)).signatures["serving_default"](**feeds)["output_0"]
    want = tf.saved_model.load(str(src)).signatures["serving_default"](**feeds)["output_0"]
    assert np.isnan(want.numpy()[1::4]).all() == mask_zero
    assert_model_close(got, want)  # NaN where NaN


@pytest.mark.parametrize("mask_zero", [False, True])
def test_keras_sequence_training_step_online_gradients_match(rng, mask_zero):
    """Training online: Grappler folds the shape the mean's gradient reads
    into a constant of the call's batch, and the gather's gradient reads the
    table and the ids, so nothing but the mean reads the rows: the forward
    pass is fused, and the gradients stay TF's. (Where the rows' shape is
    read, the form stays: test_padded_pool_left_alone_with_reason.)"""
    model = keras_sequence_model(mask_zero=mask_zero)
    ids = padded_ids(rng, dtype=np.int32)

    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x))
        return [tf.convert_to_tensor(g) for g in tape.gradient(loss, model.trainable_variables)]

    want = step(ids)
    got, stats = run_online(step, ids)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    assert stats["rewrites"] == 1, stats


@pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")), reason="online graphs are placed on a GPU here")
def test_online_masked_mean_of_a_captured_vocabulary_says_why_it_stays(tmp_path):
    """StringLookup(mask_token="") + Embedding(mask_zero=True) + GAP: online
    the captured table hides the shape of its ids, so the masked mean cannot
    be proved a [B, L] pooling; the report says so (offline it fuses:
    test_keras_embedding_global_average_pooling_saved_model)."""
    import keras

    keras.utils.set_random_seed(0)
    keys = keras.Input((3,), dtype="string")
    ids = keras.layers.StringLookup(vocabulary=["a", "b", "c", "d"], mask_token="")(keys)
    pooled = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(6, 4, mask_zero=True)(ids))
    model = keras.Model(keys, pooled)
    x = tf.constant([["a", "b", ""], ["", "", ""], ["zz", "c", "d"]])
    want = model(x).numpy()
    report = tmp_path / "r.jsonl"
    with rewrite.enable(serving_device="cpu", report_file=str(report)):
        got = tf.function(lambda k: model(k))(x).numpy()
    np.testing.assert_array_equal(got, want)  # the all-masked row is NaN in both
    skips = [r for r in rewrite.read_report(report)["skip"] if r["pattern"] == "dense_reduce_lookup"]
    assert skips and all("whose shape the table does not show (a table a function captures online" in r["reason"]
                         for r in skips), skips


@pytest.mark.parametrize("dtype, big", [(tf.float16, 2048.0), (tf.bfloat16, 256.0)])
@pytest.mark.parametrize("source", ["ragged", "split"])
def test_ragged_reduce_of_a_half_table_stays_in_half_precision(dtype, big, source):
    """UnsortedSegmentSum adds half rows in half precision: big + 1 + 1 + 1 is
    big again there, big + 3 or more in float32. The fused ops accumulate in
    float32, so the pattern leaves half tables alone and TF's sum stays."""
    table = tf.Variable(tf.constant([[big], [1.0]], dtype))
    if source == "ragged":
        f, spec = (lambda r: tf.reduce_sum(tf.nn.embedding_lookup(table, r), axis=1)), RAGGED_IDS
        x = tf.ragged.constant([[0, 1, 1, 1], [1], [0]], tf.int64)
    else:
        f, spec = split_ids(table, "number"), STRINGS_1D
        x = tf.constant(["0,1,1,1", "1", "0"])
    want = f(x).numpy().astype(np.float32)
    assert want[0, 0] == big  # the half-precision sum this test is about
    cf, graph, report, counts = offline(f, spec)
    assert not report["match"] and not fused_ops(graph), report["match"]
    assert any("is not float32" in s["reason"] for s in report["skip"]), report["skip"]
    [got] = run_graph_def(cf, graph, x)
    np.testing.assert_array_equal(np.asarray(got).astype(np.float32), want)


@pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")), reason="online graphs are placed on a GPU here")
def test_online_lookups_of_a_table_of_vector_keys_keep_their_shape():
    # A captured table shows no key shape: a DenseHashTable of vector keys
    # finds [B] ids for [B, 2] keys. Read as the keys' shape, the gather and
    # reduce over the rows' values became a pooled lookup of 2 ids a row.
    table = tf.lookup.experimental.DenseHashTable(tf.int64, tf.int64, default_value=0, empty_key=[-1, -1],
                                                  deleted_key=[-2, -2])
    table.insert(tf.constant([[1, 2], [3, 4], [5, 6]], tf.int64), tf.constant([1, 2, 3], tf.int64))
    params = tf.Variable(np.arange(40, dtype=np.float32).reshape(10, 4))

    def model(keys):
        return tf.reduce_sum(tf.gather(params, tf.maximum(table.lookup(keys), 0)), axis=1)

    for keys in (tf.constant([[1, 2], [3, 4], [9, 9]], tf.int64), tf.constant([[1, 2], [3, 4], [9, 9], [5, 6]], tf.int64)):
        with rewrite.enable(serving_device="cpu"):
            got = tf.function(model)(keys).numpy()
        np.testing.assert_array_equal(got, tf.function(model)(keys).numpy())


@pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")), reason="online graphs are placed on a GPU here")
def test_online_gather_of_a_table_of_vector_keys_stays_native_with_vocab_lookup_disabled():
    # Online, the table is a captured resource whose key shape the rewrite
    # cannot see: the fused gather fails on vector keys, naming the way out.
    table = tf.lookup.experimental.DenseHashTable(tf.int64, tf.int64, default_value=0, empty_key=[-1, -1],
                                                  deleted_key=[-2, -2])
    table.insert(tf.constant([[1, 2], [3, 4]], tf.int64), tf.constant([1, 2], tf.int64))
    params = tf.Variable(np.arange(40, dtype=np.float32).reshape(10, 4))

    def model(keys):
        return tf.gather(params, table.lookup(keys))

    keys = tf.constant([[1, 2], [3, 4], [9, 9]], tf.int64)
    want = tf.function(model)(keys).numpy()
    with rewrite.enable(serving_device="cpu"):
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"disabled_patterns=\['vocab_lookup'\]"):
            tf.function(model)(keys)
    with rewrite.enable(serving_device="cpu", disabled_patterns=["vocab_lookup"]):
        np.testing.assert_array_equal(tf.function(model)(keys).numpy(), want)


def test_one_hash_or_lookup_read_by_two_embeddings_fuses_online(tmp_path):
    # Online, Grappler merges the Keras wraps of two tables of one row count
    # before the rewrite runs: one wrap read by both gathers, which refused
    # both ("has another consumer").
    import collections

    import keras

    hashing, lookup = keras.layers.Hashing(50), keras.layers.StringLookup(vocabulary=["a", "b", "c"])
    tables = [keras.layers.Embedding(50, d) for d in (1, 8)]
    vocab_tables = [keras.layers.Embedding(lookup.vocabulary_size(), d) for d in (1, 8)]

    def f(s):
        h, i = hashing(s), lookup(s)
        return [keras.layers.Flatten()(e(x)) for e, x in [(tables[0], h), (tables[1], h),
                                                          (vocab_tables[0], i), (vocab_tables[1], i)]]

    x = tf.constant([["a"], ["zz"], [""], ["c"]])
    want = tf.function(f)(x)
    report_file = str(tmp_path / "online.jsonl")
    with rewrite.enable(report_file=report_file, serving_device="cpu"):
        got = tf.function(f)(x)
    for g, w in zip(got, want):
        assert_identical(g, w)
    counts = collections.Counter(m["pattern"] for m in rewrite.read_report(report_file)["match"])
    assert counts["hash_gather"] == 2 and counts["vocab_lookup"] == 2, counts


def keras_field_matrix_model(int_keys, flatten):
    """All fields in one [B, 3] tensor, one Hashing layer and one Embedding:
    [B, 3, D] rows, flattened into the MLP or kept as the FM's field stack."""
    import keras

    keras.utils.set_random_seed(3)
    x = keras.Input((3,), dtype="int64" if int_keys else "string", name="fields")
    rows = keras.layers.Embedding(V, D)(keras.layers.Hashing(V)(x))
    if flatten:
        features = keras.layers.Flatten()(rows)
    else:  # FM: 0.5 * ((sum_i v_i)^2 - sum_i v_i^2)
        features = 0.5 * (keras.ops.square(keras.ops.sum(rows, axis=1)) - keras.ops.sum(keras.ops.square(rows), axis=1))
    return keras.Model(x, keras.layers.Dense(1)(features))


def assert_field_matrix_model_fuses(tmp_path, rng, model, int_keys, hash_gathers):
    """Exports a model of one [B, 3] "fields" input, rewrites it with
    verification, checks that `hash_gathers` gathers fused with no hash or
    gather left, and serves both at batches of 0, 1 and 17."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    model.export(str(src), verbose=False)

    def fields(batch):
        if int_keys:
            return rng.integers(-10**12, 10**12, size=(batch, 3))
        return np.array(random_strings(rng, max(3 * batch, 3))[:3 * batch], object).reshape(batch, 3)

    report = rewrite.optimize_saved_model(src, dst, signature_keys=["serving_default"],
                                          sample_inputs={"serving_default": {"fields": fields(30)}}, runs=2)
    sig = report.signatures["serving_default"]
    assert report.ok and report.verified and sig.max_abs_diff == 0
    assert [m["pattern"] for m in sig.matches].count("hash_gather") == hash_gathers, sig.matches
    hashes = {"StringToHashBucketFast", "_TensorToHashBucketFast", "AsString"}
    assert not (hashes | {"GatherV2", "ResourceGather"}) & set(sig.op_counts_after), sig.op_counts_after
    native = tf.saved_model.load(str(src)).signatures["serving_default"]
    fused = tf.saved_model.load(str(dst)).signatures["serving_default"]
    for batch in (0, 1, 17):
        feeds = {"fields": tf.constant(fields(batch))}
        assert_identical(fused(**feeds)["output_0"], native(**feeds)["output_0"])


@pytest.mark.saved_model
@pytest.mark.parametrize("int_keys", [False, True])
@pytest.mark.parametrize("flatten", [True, False])
def test_fields_hashed_in_one_matrix_fuse(tmp_path, rng, int_keys, flatten):
    # Hashing on [B, F] keys: "ids are [B, N] with N not known to be 1", nothing fused.
    assert_field_matrix_model_fuses(tmp_path, rng, keras_field_matrix_model(int_keys, flatten), int_keys,
                                    hash_gathers=1)


def test_a_hash_of_a_key_matrix_fuses_in_a_function(rng):
    t = tf.Variable(rng.normal(size=(V, D)).astype(np.float32))

    def f(keys):
        return tf.nn.embedding_lookup(t, tf.strings.to_hash_bucket_fast(keys, V))

    cf, graph, report, counts = offline(f, tf.TensorSpec([None, None], tf.string))
    assert [m["pattern"] for m in report["match"]] == ["hash_gather"], report
    for shape in [(5, 3), (1, 1), (0, 4), (4, 0)]:
        keys = tf.reshape(tf.constant(random_strings(rng, max(shape[0] * shape[1], 3))[:shape[0] * shape[1]],
                                      tf.string), shape)
        [got] = run_graph_def(cf, graph, keys)
        assert got.shape == shape + (D,)
        assert_identical(got, f(keys))


# ---------------------------------------------------------------------------
# Bucketized numeric features: Discretization / Bucketize + Embedding

BINS = [-10.0, 0.0, 0.5, 18.0, 30.0]


DISCRETIZED = [(dtype, shape, flatten) for dtype in ("float32", "int64")
               for shape, flatten in [((), False), ((1,), True), ((1,), False), ((3,), True), ((3,), False)]]


def discretized_rows(keras, x, shape, flatten):
    rows = keras.layers.Embedding(len(BINS) + 1, D)(keras.layers.Discretization(bin_boundaries=BINS)(x))
    if len(shape) == 1 and flatten:
        return keras.layers.Flatten()(rows)
    if len(shape) == 1:
        return keras.ops.sum(rows, axis=1) * keras.ops.max(rows, axis=1)  # rows read as [B, N, D]
    return rows


def keras_discretized_model():
    """One input and one output per DISCRETIZED case, each its own Dense: one
    SavedModel (and one verification process) for all of them."""
    import keras

    keras.utils.set_random_seed(4)
    inputs = [keras.Input(shape, dtype=dtype, name=f"age{i}") for i, (dtype, shape, _) in enumerate(DISCRETIZED)]
    outputs = [keras.layers.Dense(1)(discretized_rows(keras, x, shape, flatten))
               for x, (_, shape, flatten) in zip(inputs, DISCRETIZED)]
    return keras.Model(inputs, outputs)


@pytest.mark.saved_model
def test_discretized_features_fuse(tmp_path, rng):
    # Discretization + Embedding: Bucketize, a Cast and a gather, which nothing
    # fused; scalar and [N] features, flattened or read as [B, N, D], float and int.
    src, dst = tmp_path / "src", tmp_path / "dst"
    keras_discretized_model().export(str(src), verbose=False)

    def ages(batch):
        values = {}
        for i, (dtype, shape, _) in enumerate(DISCRETIZED):
            v = rng.choice(np.array(BINS + [-50.0, 0.25, 17.9, 99.0, 1e9]), size=(batch,) + shape)
            values[f"age{i}"] = v.astype(np.int64) if dtype == "int64" else v.astype(np.float32)
        return values

    report = rewrite.optimize_saved_model(src, dst, signature_keys=["serving_default"], serving_device="cpu",
                                          sample_inputs={"serving_default": ages(40)}, runs=2)
    sig = report.signatures["serving_default"]
    assert report.ok and report.verified and sig.max_abs_diff == 0
    assert [m["pattern"] for m in sig.matches] == ["bucketize_gather"] * len(DISCRETIZED), sig.matches
    assert not {"Bucketize", "GatherV2", "ResourceGather"} & set(sig.op_counts_after), sig.op_counts_after
    native = tf.saved_model.load(str(src)).signatures["serving_default"]
    fused = tf.saved_model.load(str(dst)).signatures["serving_default"]
    for batch in (0, 1, 23):
        feeds = {k: tf.constant(v) for k, v in ages(batch).items()}
        got, want = fused(**feeds), native(**feeds)
        assert sorted(got) == sorted(want) and len(want) == len(DISCRETIZED)
        for key in want:
            assert_identical(got[key], want[key])


def test_raw_bucketize_gather_fuses_on_a_cpu_server_only(rng):
    t = tf.Variable(rng.normal(size=(len(BINS) + 1, D)).astype(np.float32))

    def f(x):
        return tf.gather(t, tf.raw_ops.Bucketize(input=x, boundaries=BINS))

    cf = tf.function(f).get_concrete_function(tf.TensorSpec([None, None], tf.float32))
    graph, report = rewrite.optimize_concrete_function(cf, serving_device="cpu")
    assert [m["pattern"] for m in report["match"]] == ["bucketize_gather"], report
    for shape in [(5, 3), (1, 1), (0, 2), (3, 0)]:
        x = tf.constant(rng.uniform(-20, 40, size=shape).astype(np.float32))
        [got] = run_graph_def(cf, graph, x)
        assert got.shape == shape + (D,)
        assert_identical(got, f(x))
    _, report = rewrite.optimize_concrete_function(cf, serving_device="gpu")
    assert report["match"] == [] and any("serving_device='cpu'" in s["reason"] for s in report["skip"]), report


@pytest.mark.parametrize("pooling", ["sum and mean", "weighted sum", "length unknown"])
def test_hashed_rows_no_pooled_pattern_takes_fuse_as_gathers(rng, pooling):
    # The gather of a [B, L] hash waited for dense_reduce_lookup, which
    # refuses these: nothing fused.
    t = tf.Variable(rng.normal(size=(V, D)).astype(np.float32))
    length = None if pooling == "length unknown" else 5

    def f(keys):
        rows = tf.nn.embedding_lookup(t, tf.strings.to_hash_bucket_fast(keys, V))
        if pooling == "weighted sum":
            return tf.reduce_sum(rows * tf.range(1.0, 6.0)[None, :, None], axis=1)
        return tf.reduce_sum(rows, axis=1) + tf.reduce_mean(rows, axis=1)

    cf, graph, report, counts = offline(f, tf.TensorSpec([None, length], tf.string))
    assert [m["pattern"] for m in report["match"]] == ["hash_gather"], report
    keys = tf.reshape(tf.constant(random_strings(rng, 20)), [4, 5])
    [got] = run_graph_def(cf, graph, keys)
    assert_identical(got, f(keys))


def keras_hash_then_slice_model(int_keys):
    """One Hashing layer over all fields, then a slice per field into its own Embedding."""
    import keras

    keras.utils.set_random_seed(5)
    x = keras.Input((3,), dtype="int64" if int_keys else "string", name="fields")
    hashed = keras.layers.Hashing(V)(x)
    rows = [keras.layers.Flatten()(keras.layers.Embedding(V, D)(hashed[:, f:f + 1])) for f in range(3)]
    return keras.Model(x, keras.layers.Dense(1)(keras.layers.Concatenate()(rows)))


@pytest.mark.saved_model
@pytest.mark.parametrize("int_keys", [False, True])
def test_fields_sliced_after_one_hash_fuse(tmp_path, rng, int_keys):
    # Hashing over [B, F], then h[:, f:f + 1] per field: nothing fused.
    assert_field_matrix_model_fuses(tmp_path, rng, keras_hash_then_slice_model(int_keys), int_keys, hash_gathers=3)


def test_a_slice_of_a_hashed_matrix_fuses_in_a_function(rng):
    t = tf.Variable(rng.normal(size=(V, D)).astype(np.float32))

    def f(keys):
        h = tf.strings.to_hash_bucket_fast(keys, V)
        return [tf.nn.embedding_lookup(t, h[:, 1]), tf.nn.embedding_lookup(t, h[:, ::2])]

    cf, graph, report, counts = offline(f, tf.TensorSpec([None, 4], tf.string))
    assert [m["pattern"] for m in report["match"]] == ["hash_gather"] * 2, report
    assert "StringToHashBucketFast" not in counts, counts
    for batch in (6, 1, 0):
        keys = tf.reshape(tf.constant(random_strings(rng, max(4 * batch, 3))[:4 * batch], tf.string), [batch, 4])
        got = run_graph_def(cf, graph, keys)
        for g, w in zip(got, f(keys)):
            assert_identical(g, w)

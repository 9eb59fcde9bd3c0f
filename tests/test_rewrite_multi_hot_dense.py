"""The multi_hot_dense pattern: a Dense layer over encodings of ids
(DenseBincount: Keras' CategoryEncoding, lookups and HashedCrossing with a
one_hot / multi_hot / count output_mode), concatenated with dense columns or
alone, becomes one CtrMultiHotDense, served on the CPU. Keras' FeatureSpace
(output_mode="concat") builds exactly this. Every rewritten SavedModel is
served in a fresh process by the rewrite's verification and compared here
again; the pattern also runs on concrete functions in this process (the
sanitizer stage's tests)."""

import numpy as np
import pytest
import tensorflow as tf

import tf_ctr_ops  # noqa: F401
from tf_ctr_ops import rewrite
from real_models import save_tf1_examples_model
from test_rewrite_multi_hot import _rewritten_in_process

SEXES, THALS = ["f", "m"], ["fixed", "normal", "reversible"]


def export_feature_space(path, rng):
    """keras-io's "structured data classification with FeatureSpace", with
    crosses: string, integer and discretized features one-hot encoded, a
    normalized float, two crosses, all concatenated into the Dense layers."""
    import keras
    from keras.utils import FeatureSpace

    keras.utils.set_random_seed(3)
    n = 256
    data = {"sex": rng.choice(SEXES, n), "thal": rng.choice(THALS, n), "cp": rng.integers(0, 4, n),
            "age": rng.normal(50, 9, n).astype("float32"), "chol": rng.normal(240, 40, n).astype("float32")}
    fs = FeatureSpace(
        features={"sex": FeatureSpace.string_categorical(num_oov_indices=1),
                  "thal": FeatureSpace.string_categorical(num_oov_indices=1),
                  "cp": FeatureSpace.integer_categorical(num_oov_indices=1),
                  "age": FeatureSpace.float_discretized(num_bins=8),
                  "chol": FeatureSpace.float_normalized()},
        crosses=[FeatureSpace.cross(feature_names=("sex", "age"), crossing_dim=32),
                 FeatureSpace.cross(feature_names=("thal", "cp"), crossing_dim=16)],
        output_mode="concat")
    fs.adapt(tf.data.Dataset.from_tensor_slices(data).batch(64))
    encoded = keras.Input(shape=(fs.get_encoded_features().shape[-1],))
    hidden = keras.layers.Dense(16, activation="relu")(encoded)
    trained = keras.Model(encoded, keras.layers.Dense(1, activation="sigmoid")(hidden))
    inputs = fs.get_inputs()
    keras.Model(inputs, trained(fs.get_encoded_features())).export(path, verbose=False)


def feature_space_inputs(rng, batch):
    return {"sex": np.array(SEXES + ["x"], object)[rng.integers(0, 3, (batch, 1))],
            "thal": np.array(THALS + ["?"], object)[rng.integers(0, 4, (batch, 1))],
            "cp": rng.integers(-1, 6, (batch, 1)).astype(np.int32),
            "age": rng.normal(50, 15, (batch, 1)).astype(np.float32),
            "chol": rng.normal(240, 60, (batch, 1)).astype(np.float32)}


def rewrite_saved_model(src, dst, encoder, encoders):
    """Rewrites the SavedModel at src for a CPU server; checks that one
    CtrMultiHotDense took `encoders` nodes of op `encoder` and that the
    rewrite's own fresh-process verification compared equal. Returns the
    native and rewritten serving signatures."""
    report = rewrite.optimize_saved_model(src, dst, runs=1, serving_device="cpu")
    sig = report.signatures["serving_default"]
    fused = [m for m in sig.matches if m["fused_op"] == "CtrMultiHotDense"]
    assert len(fused) == 1, (sig.matches, sig.skips)
    replaced = " ".join(fused[0]["replaced"])
    assert replaced.count(f"({encoder})") == encoders and "(MatMul)" in replaced, replaced
    assert sig.outputs_match  # served in a fresh process by the rewrite's verification
    return (tf.saved_model.load(str(src)).signatures["serving_default"],
            tf.saved_model.load(str(dst)).signatures["serving_default"])


@pytest.mark.saved_model
def test_feature_space_model_fuses_and_serves_the_same(tmp_path, rng):
    src, dst = tmp_path / "src", tmp_path / "dst"
    export_feature_space(str(src), rng)
    native, rewritten = rewrite_saved_model(src, dst, "DenseBincount", 6)
    counts = rewrite.op_counts(rewritten.graph.as_graph_def(), library=True)
    assert "DenseBincount" not in counts and "ConcatV2" not in counts and counts.get("CtrMultiHotDense") == 1, counts
    for batch in (0, 1, 300):
        feeds = {k: tf.constant(v) for k, v in feature_space_inputs(rng, batch).items()}
        want, got = native(**feeds), rewritten(**feeds)
        for key in want:
            assert got[key].shape == want[key].shape
            np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6)


def export_one_hot_layers(path):
    """One-hot output modes concatenated into a Dense: CategoryEncoding,
    StringLookup and HashedCrossing (Keras encodes them with tf.one_hot)."""
    import keras

    keras.utils.set_random_seed(4)
    a = keras.Input(shape=(1,), dtype="int64", name="a")
    s = keras.Input(shape=(1,), dtype="string", name="s")
    x = keras.Input(shape=(2,), name="x")
    parts = [keras.layers.CategoryEncoding(num_tokens=6, output_mode="one_hot")(a), x,
             keras.layers.StringLookup(vocabulary=["p", "q", "r"], output_mode="one_hot")(s),
             keras.layers.HashedCrossing(num_bins=8, output_mode="one_hot")((a, s))]
    out = keras.layers.Dense(3)(keras.layers.Concatenate()(parts))
    keras.Model([a, s, x], out).export(path, verbose=False)


@pytest.mark.saved_model
def test_keras_one_hot_layers_fuse_and_serve_the_same(tmp_path, rng):
    src, dst = tmp_path / "src", tmp_path / "dst"
    export_one_hot_layers(str(src))
    native, rewritten = rewrite_saved_model(src, dst, "OneHot", 3)
    for batch in (0, 1, 200):
        feeds = {"a": tf.constant(rng.integers(-2, 8, (batch, 1)), tf.int64),  # -2, -1, 6, 7: rows of zeros
                 "s": tf.constant(np.array(["p", "q", "r", "zz"], object)[rng.integers(0, 4, (batch, 1))]),
                 "x": tf.constant(rng.normal(size=(batch, 2)), tf.float32)}
        want, got = native(**feeds), rewritten(**feeds)
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6)


@pytest.mark.saved_model
def test_keras_count_and_one_hot_lookups_concatenated_fuse_and_serve_the_same(tmp_path, rng):
    """IntegerLookup(output_mode="count") and ("one_hot") give int64
    encodings: their Concatenate is cast to float32 as a whole by the Dense."""
    import keras

    keras.utils.set_random_seed(5)
    vocabulary = [3, 7, 11, 19]
    x = keras.Input((4,), dtype="int64", name="x")
    y = keras.Input((), dtype="int64", name="y")
    parts = [keras.layers.IntegerLookup(vocabulary=vocabulary, output_mode="count")(x),
             keras.layers.IntegerLookup(vocabulary=vocabulary, output_mode="one_hot")(y)]
    src, dst = tmp_path / "src", tmp_path / "dst"
    keras.Model([x, y], keras.layers.Dense(3)(keras.layers.Concatenate()(parts))).export(str(src), verbose=False)
    native, rewritten = rewrite_saved_model(src, dst, "DenseBincount", 1)
    keys = np.array(vocabulary + [0, -5, 2**40])  # out of the vocabulary: the OOV id
    for batch in (0, 1, 100):
        feeds = {"x": tf.constant(keys[rng.integers(0, keys.size, (batch, 4))], tf.int64),
                 "y": tf.constant(keys[rng.integers(0, keys.size, batch)], tf.int64)}
        want, got = native(**feeds), rewritten(**feeds)
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6)


def test_in_process_one_hot_of_a_column_fuses(rng):
    m = Model(rng, width=5 + 2 + 8)

    def f(a, b, x):  # a's ids 5, 6 are past the depth: zeros in both
        return tf.matmul(tf.concat([tf.one_hot(a[:, 0], 5), x, bincount(b, 8)], axis=1), m.kernel)

    fused, report, counts = _rewritten_in_process(f, SPEC)
    assert [x["fused_op"] for x in report["match"]] == ["CtrMultiHotDense"], report
    assert "OneHot" not in counts, counts
    for batch in (0, 7):
        a, b, x = feeds(rng, batch)
        a = a - 1  # some -1: a row of zeros, not an error
        np.testing.assert_allclose(fused(a, b, x)[0], f(a, b, x), rtol=1e-5, atol=1e-6)


SPEC = [tf.TensorSpec([None, 1], tf.int64), tf.TensorSpec([None, 3], tf.int32), tf.TensorSpec([None, 2], tf.float32)]


def bincount(ids, depth, binary=True, weights=None):
    return tf.math.bincount(ids, weights=weights, minlength=depth, maxlength=depth, binary_output=binary, axis=-1,
                            dtype=tf.float32)


class Model(tf.Module):
    def __init__(self, rng, width=5 + 2 + 8):
        super().__init__()
        self.kernel = tf.Variable(rng.normal(size=(width, 4)).astype(np.float32))


def feeds(rng, batch):
    return (tf.constant(rng.integers(0, 7, (batch, 1)), tf.int64), tf.constant(rng.integers(0, 8, (batch, 3)), tf.int32),
            tf.constant(rng.normal(size=(batch, 2)), tf.float32))


@pytest.mark.parametrize("binary", [True, False])
def test_in_process_concatenated_encodings_fuse(rng, binary):
    m = Model(rng)

    def f(a, b, x):  # ids 5, 6 of `a` are past its depth: dropped by both
        return tf.nn.relu(tf.matmul(tf.concat([bincount(a, 5), x, bincount(b, 8, binary)], axis=1), m.kernel))

    fused, report, counts = _rewritten_in_process(f, SPEC)
    assert [x["fused_op"] for x in report["match"]] == ["CtrMultiHotDense"], report
    assert "DenseBincount" not in counts and "ConcatV2" not in counts, counts
    for batch in (0, 1, 50):
        args = feeds(rng, batch)
        np.testing.assert_allclose(fused(*args)[0], f(*args), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("readers", [2, 3])
def test_in_process_concatenation_read_by_several_dense_layers_fuses_each(rng, readers):
    # Wide & Deep: a linear head and the deep tower's first Dense over one
    # Concatenate. Each product fuses on its own; the encodings and the
    # concatenation go with the last.
    kernels = [Model(rng).kernel for _ in range(readers)]

    def f(a, b, x):
        joined = tf.concat([bincount(a, 5), x, bincount(b, 8)], axis=1)
        return tf.add_n([tf.nn.relu(tf.matmul(joined, k)) for k in kernels])

    fused, report, counts = _rewritten_in_process(f, SPEC)
    assert [x["fused_op"] for x in report["match"]] == ["CtrMultiHotDense"] * readers, report
    assert not {"DenseBincount", "ConcatV2", "MatMul"} & set(counts), counts
    for batch in (0, 1, 50):
        args = feeds(rng, batch)
        np.testing.assert_allclose(fused(*args)[0], f(*args), rtol=1e-5, atol=1e-6)


def test_in_process_concatenation_also_read_by_other_ops_stays(rng):
    # A reader that is no Dense product would keep the encodings for good.
    m = Model(rng)

    def f(a, b, x):
        joined = tf.concat([bincount(a, 5), x, bincount(b, 8)], axis=1)
        return tf.matmul(joined, m.kernel), tf.matmul(joined, m.kernel, transpose_b=False) + tf.reduce_sum(joined)

    fused, report, counts = _rewritten_in_process(f, SPEC)
    assert not report["match"], report["match"]
    assert any("has another consumer" in s["reason"] for s in report["skip"] if s["pattern"] == "multi_hot_dense")
    args = feeds(rng, 7)
    for got, want in zip(fused(*args), f(*args)):
        np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.saved_model
def test_keras_wide_and_deep_over_one_concatenation_fuses_both_heads(tmp_path, rng):
    import keras

    keras.utils.set_random_seed(6)
    device = keras.Input((1,), dtype="string", name="device")
    cats = keras.Input((5,), dtype="string", name="cats")
    num = keras.Input((4,), name="num")
    joined = keras.layers.Concatenate()([
        keras.layers.StringLookup(vocabulary=["ios", "android", "web"], output_mode="one_hot")(device),
        keras.layers.StringLookup(vocabulary=[f"c{k}" for k in range(300)], output_mode="multi_hot")(cats), num])
    wide = keras.layers.Dense(1)(joined)
    deep = keras.layers.Dense(1)(keras.layers.Dense(16, activation="relu")(joined))
    src, dst = tmp_path / "src", tmp_path / "dst"
    keras.Model([device, cats, num], keras.layers.Activation("sigmoid")(wide + deep)).export(str(src), verbose=False)
    sig = rewrite.optimize_saved_model(src, dst, runs=1, serving_device="cpu").signatures["serving_default"]
    assert [m["fused_op"] for m in sig.matches].count("CtrMultiHotDense") == 2, sig.matches
    assert not {"DenseBincount", "OneHot", "ConcatV2"} & set(sig.op_counts_after), sig.op_counts_after
    assert sig.op_counts_after["MatMul"] == sig.op_counts_before["MatMul"] - 2 == 1  # the deep tower's second Dense
    assert sig.outputs_match
    native = tf.saved_model.load(str(src)).signatures["serving_default"]
    rewritten = tf.saved_model.load(str(dst)).signatures["serving_default"]
    words = np.array(["ios", "android", "web", "other", ""], object)
    tags = np.array([f"c{k}" for k in range(0, 320, 7)] + [""], object)
    for batch in (0, 1, 64):
        feeds = {"device": tf.constant(words[rng.integers(0, 5, (batch, 1))]),
                 "cats": tf.constant(tags[rng.integers(0, len(tags), (batch, 5))]),
                 "num": tf.constant(rng.normal(size=(batch, 4)), tf.float32)}
        want, got = native(**feeds), rewritten(**feeds)
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6)


def int_encodings(a, b, binary, *others):
    """A count (or multi-hot) encoding of b and a one-hot of a's column, both
    int64, concatenated (with `others`) to be cast, as Keras' Dense casts a
    Concatenate of integer lookups with those output modes."""
    counts = tf.math.bincount(b, minlength=8, maxlength=8, binary_output=binary, axis=-1, dtype=tf.int64)
    return tf.concat([counts, tf.one_hot(a[:, 0], 5, dtype=tf.int64), *others], axis=1)


@pytest.mark.parametrize("binary", [True, False])
def test_in_process_cast_concatenation_of_int_encodings_fuses(rng, binary):
    m = Model(rng, width=8 + 5)

    def f(a, b, x):
        return tf.matmul(tf.cast(int_encodings(a, b, binary), tf.float32), m.kernel)

    fused, report, counts = _rewritten_in_process(f, SPEC)
    assert [x["fused_op"] for x in report["match"]] == ["CtrMultiHotDense"], report
    assert not {"DenseBincount", "OneHot", "ConcatV2"} & set(counts), counts
    for batch in (0, 1, 50):
        a, b, x = feeds(rng, batch)
        a = a - 1  # -1: a one-hot row of zeros; 5: past the depth, zeros too
        np.testing.assert_allclose(fused(a, b, x)[0], f(a, b, x), rtol=1e-5, atol=1e-6)


def test_in_process_cast_concatenation_with_a_dense_block_stays(rng):
    m = Model(rng, width=8 + 5 + 2)

    def f(a, b, x):
        return tf.matmul(tf.cast(int_encodings(a, b, True, tf.cast(x * 10, tf.int64)), tf.float32), m.kernel)

    fused, report, counts = _rewritten_in_process(f, SPEC)
    assert not report["match"], report
    reasons = [r["reason"] for r in report["skip"] if r["pattern"] == "multi_hot_dense"]
    assert reasons == ["the concatenation cast to the kernel's type joins blocks that are not encodings"], report
    args = feeds(rng, 9)
    np.testing.assert_array_equal(fused(*args)[0], f(*args))


def test_in_process_weighted_encoding_stays_a_dense_block(rng):
    m = Model(rng, width=30 + 2 + 8)

    def f(a, b, x):
        weighted = bincount(b, 8, binary=False, weights=tf.cast(b, tf.float32) * 0.5)
        return tf.matmul(tf.concat([bincount(a, 30), x, weighted], axis=1), m.kernel)

    fused, report, counts = _rewritten_in_process(f, SPEC)
    assert [x["fused_op"] for x in report["match"]] == ["CtrMultiHotDense"], report
    assert counts.get("DenseBincount") == 1, counts  # the weighted one, computed as before
    args = feeds(rng, 20)
    np.testing.assert_allclose(fused(*args)[0], f(*args), rtol=1e-5, atol=1e-6)


def test_in_process_negative_ids_fail_alike(rng):
    m = Model(rng)
    f = lambda a, b, x: tf.matmul(tf.concat([bincount(a, 5), x, bincount(b, 8)], axis=1), m.kernel)  # noqa: E731
    fused, report, _ = _rewritten_in_process(f, SPEC)
    assert report["match"], report
    a, b, x = feeds(rng, 4)
    b = tf.tensor_scatter_nd_update(b, [[2, 1]], [-3])
    with pytest.raises(tf.errors.InvalidArgumentError, match="non-negative"):
        f(a, b, x)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"id -3 in row 2 of block 2 \(an encoding\) is negative"):
        fused(a, b, x)


def test_left_alone_with_reasons(rng):
    m, wide = Model(rng), Model(rng, width=5 + 40 + 8)
    concat = lambda a, b, x, **kw: tf.concat([bincount(a, 5, **kw), x, bincount(b, 8, **kw)], axis=1)  # noqa: E731
    ones = lambda a: tf.ones(tf.shape(a), tf.float32)  # noqa: E731
    cases = {
        "CPU kernel only": (lambda a, b, x: tf.matmul(concat(a, b, x), m.kernel), None),
        "another consumer": (lambda a, b, x: (lambda c: (tf.matmul(c, m.kernel), c * 2.0))(concat(a, b, x)), "cpu"),
        "transposes": (lambda a, b, x: tf.matmul(concat(a, b, x), tf.transpose(m.kernel), transpose_b=True), "cpu"),
        "weighted": (lambda a, b, x: tf.matmul(tf.concat(
            [bincount(a, 5, binary=False, weights=ones(a)), x, bincount(b, 8, binary=False, weights=ones(b))], 1),
            m.kernel), "cpu"),
        # 13 encoded columns beside 40 dense ones: the MatMul stays.
        "MatMul multiplies the other": (lambda a, b, x: tf.matmul(tf.concat(
            [bincount(a, 5), tf.tile(x, [1, 20]), bincount(b, 8)], 1), wide.kernel), "cpu"),
        "run time": (lambda a, b, x: tf.matmul(tf.concat([tf.math.bincount(
            a, minlength=tf.size(a, out_type=tf.int64) * 0 + 5, maxlength=5, axis=-1, binary_output=True,
            dtype=tf.float32), x, tf.ones([tf.shape(x)[0], 8])], 1), m.kernel), "cpu"),
    }
    for reason, (fn, device) in cases.items():
        _, report, _ = _rewritten_in_process(fn, SPEC, serving_device=device)
        assert not report["match"], (reason, report["match"])
        reasons = [s["reason"] for s in report["skip"] if s["pattern"] == "multi_hot_dense"]
        assert reasons and any(reason in r for r in reasons), (reason, report["skip"])


def test_dense_columns_too_wide_to_count_twice_stay(rng):
    # 2 x 2**62 columns overflow int64: the count saturates (a wrapped
    # negative sum would have fused a MatMul of mostly dense columns).
    dense = 2**62 + 1
    fn = lambda ids, x, k: tf.matmul(tf.concat([tf.one_hot(ids, 5), x], 1), k)  # noqa: E731
    specs = (tf.TensorSpec([None], tf.int64), tf.TensorSpec([None, dense]), tf.TensorSpec([None, 4]))
    _, report, _ = _rewritten_in_process(fn, specs)
    assert not report["match"], report["match"]
    assert [s["reason"] for s in report["skip"] if s["pattern"] == "multi_hot_dense"] == [
        f"the encodings are 5 of the {dense + 5} columns: TF's MatMul multiplies the other {dense} faster than the "
        "fused op would"]


def test_in_process_training_graph_is_left_alone(rng):
    m = Model(rng)

    def step(a, b, x):
        with tf.GradientTape() as tape:
            out = tf.matmul(tf.concat([bincount(a, 5), x, bincount(b, 8)], axis=1), m.kernel)
            loss = tf.reduce_sum(out)
        return loss, tape.gradient(loss, m.kernel)

    fused, report, _ = _rewritten_in_process(step, SPEC)
    assert not [x for x in report["match"] if x["fused_op"] == "CtrMultiHotDense"], report
    args = feeds(rng, 6)
    for got, want in zip(fused(*args), step(*args)):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_in_process_on_real_criteo_sample(rng):
    """Criteo's hex categories (C19 has empty values) one-hot and multi-hot
    encoded through vocabulary tables of the first half of the sample (the
    rest has unseen keys: the OOV id), with its log counts beside them."""
    from test_rewrite import read_csv

    rows = read_csv("criteo_sample.txt")
    cols = ("C1", "C2", "C19")
    vocabs = [sorted({r[c] for r in rows[:len(rows) // 2]}) for c in cols]
    tables = [tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(v, tf.range(len(v), dtype=tf.int64)),
                                        len(v)) for v in vocabs]
    depths = [len(v) + 1 for v in vocabs]
    kernel = tf.Variable(rng.normal(size=(sum(depths) + 3, 8)).astype(np.float32))

    def f(c1, c2, c19, counts):
        ids = [t.lookup(k) for t, k in zip(tables, (c1, c2, c19))]
        blocks = [tf.one_hot(ids[0][:, 0], depths[0]), bincount(ids[1], depths[1]), counts,
                  bincount(ids[2], depths[2], binary=False)]
        return tf.nn.relu(tf.matmul(tf.concat(blocks, axis=1), kernel))

    spec = [tf.TensorSpec([None, 1], tf.string)] * 3 + [tf.TensorSpec([None, 3], tf.float32)]
    fused, report, counts = _rewritten_in_process(f, spec)
    assert [x["fused_op"] for x in report["match"]] == ["CtrMultiHotDense"], report
    assert "DenseBincount" not in counts and "OneHot" not in counts, counts
    keys = [tf.constant([[r[c]] for r in rows]) for c in cols]
    log_counts = tf.constant([[np.log1p(max(float(r[c] or 0), 0.0)) for c in ("I1", "I2", "I3")] for r in rows],
                             tf.float32)
    np.testing.assert_allclose(fused(*keys, log_counts)[0], f(*keys, log_counts), rtol=1e-5, atol=1e-5)


def test_in_process_reshaped_one_hot_columns_fuse(rng):
    """TF1's input_layer flattens a bucketized column's [B, S, d] one-hot to
    [B, S * d] before the concatenation: S one-hot blocks side by side."""
    kernel = tf.Variable(rng.normal(size=(2 * 4 + 3 + 1, 5)).astype(np.float32))

    def f(xy, age, price):
        buckets = tf.cast(tf.raw_ops.Bucketize(input=xy, boundaries=[0.0, 1.0, 2.0]), tf.int64)  # [B, 2], ids 0..3
        hot = tf.one_hot(buckets, 4)
        flat = tf.reshape(hot, tf.stack([tf.shape(hot)[0], 8]))
        age_hot = tf.reshape(tf.one_hot(age, 3), [-1, 3])  # [B, 1] ids, some out of range: zeros
        return tf.matmul(tf.concat([flat, age_hot, price], axis=1), kernel)

    spec = [tf.TensorSpec([None, 2], tf.float32), tf.TensorSpec([None, 1], tf.int32),
            tf.TensorSpec([None, 1], tf.float32)]
    fused, report, counts = _rewritten_in_process(f, spec)
    assert [x["fused_op"] for x in report["match"]] == ["CtrMultiHotDense"], report
    assert "OneHot" not in counts and "Reshape" not in counts, counts
    for batch in (0, 1, 40):
        args = (tf.constant(rng.normal(1, 1.5, size=(batch, 2)), tf.float32),
                tf.constant(rng.integers(-1, 5, size=(batch, 1)), tf.int32),
                tf.constant(rng.normal(size=(batch, 1)), tf.float32))
        np.testing.assert_allclose(fused(*args)[0], f(*args), rtol=1e-5, atol=1e-6)


def save_tf1_dnn_model(path):
    """An Estimator-style TF1 DNN input: numeric and bucketized columns (one
    of shape 2) through input_layer into a hidden layer, saved by Builder."""
    fc = tf.compat.v1.feature_column

    def outputs_of(serialized):
        columns = [fc.numeric_column("price"), fc.bucketized_column(fc.numeric_column("age"), [18.0, 30.0, 50.0]),
                   fc.bucketized_column(fc.numeric_column("xy", shape=(2,)), [0.0, 1.0])]
        net = fc.input_layer(tf.compat.v1.io.parse_example(serialized, fc.make_parse_example_spec(columns)), columns)
        w = tf.compat.v1.get_variable("hidden_w", [net.shape[1], 4])
        return {"hidden": tf.nn.relu(tf.matmul(net, w))}

    save_tf1_examples_model(path, outputs_of, seed=5)


def tf1_examples(rng, n):
    out = []
    for _ in range(n):
        f = {"price": tf.train.Feature(float_list=tf.train.FloatList(value=[float(rng.normal())])),
             "age": tf.train.Feature(float_list=tf.train.FloatList(value=[float(rng.integers(10, 70))])),
             "xy": tf.train.Feature(float_list=tf.train.FloatList(value=rng.normal(0.5, 1, 2).tolist()))}
        out.append(tf.train.Example(features=tf.train.Features(feature=f)).SerializeToString())
    return np.array(out, dtype=object)


@pytest.mark.saved_model
def test_tf1_input_layer_bucketized_columns_fuse_and_serve_the_same(tmp_path, rng):
    src, dst = tmp_path / "src", tmp_path / "dst"
    save_tf1_dnn_model(str(src))
    native, rewritten = rewrite_saved_model(src, dst, "OneHot", 2)
    for batch in (0, 1, 64):
        examples = tf.constant(tf1_examples(rng, batch))
        np.testing.assert_allclose(rewritten(examples=examples)["hidden"], native(examples=examples)["hidden"],
                                   rtol=1e-5, atol=1e-6)


def _online(model, feeds, tmp_path):
    """The model called in a tf.function under rewrite.enable(): its outputs
    and the optimizer's report."""
    report_file = str(tmp_path / "online.jsonl")
    with rewrite.enable(report_file=report_file):
        got = tf.function(lambda d: model(d))(feeds)
    return [t.numpy() for t in tf.nest.flatten(got)], rewrite.read_report(report_file)


def _onednn_enabled():
    """Whether TF runs its oneDNN graph passes (by default only on CPUs with
    AVX-512, or with TF_ENABLE_ONEDNN_OPTS=1): only then does its remapper
    fuse a GeluExact into _FusedMatMul."""
    from tensorflow.python.util import _pywrap_util_port
    return _pywrap_util_port.IsMklEnabled()


@pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")), reason="the fused ops are CPU only; online "
                    "graphs are placed on a GPU here")
@pytest.mark.parametrize("activation", [None, "relu", "tanh", "leaky_relu", "gelu"])
def test_online_dense_layers_fuse_after_tfs_remapper(tmp_path, rng, activation):
    # Online, TF's remapper has made MatMul + BiasAdd (+ activation) one
    # _FusedMatMul before our pass, and its dependency optimizer has moved
    # the vocabulary check's wait from Keras' Identity to the size math: the
    # encodings fuse all the same, the bias and activation written back as
    # TF ops. GeluExact has no TF op of its own: left alone, with the reason
    # (where oneDNN is off, the remapper leaves Gelu out, and it fuses).
    import keras

    ids = keras.Input(shape=(3,), dtype="int64", name="ids")
    price = keras.Input(shape=(1,), dtype="float32", name="price")
    tags = keras.Input(shape=(3,), dtype="string", name="tags")
    vocab = [f"t{i}" for i in range(20)]
    hot = keras.layers.CategoryEncoding(num_tokens=50, output_mode="multi_hot")(ids)
    tagged = keras.layers.StringLookup(vocabulary=vocab, mask_token=None, num_oov_indices=0,
                                       output_mode="multi_hot")(tags)
    model = keras.Model([ids, price, tags], [
        keras.layers.Dense(8, activation=activation)(keras.layers.Concatenate()([hot, price])),
        keras.layers.Dense(4, activation=activation)(tagged)])
    feeds = {"ids": tf.constant(rng.integers(0, 50, (16, 3))),
             "price": tf.constant(rng.normal(size=(16, 1)).astype(np.float32)),
             "tags": tf.constant(np.array(vocab, object)[rng.integers(0, 20, (16, 3))])}
    got, report = _online(model, feeds, tmp_path)
    for g, w in zip(got, model(feeds)):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-5, atol=1e-6)
    fused = sorted(m["fused_op"] for m in report["match"])
    if activation == "gelu" and _onednn_enabled():
        assert fused == [] and report["skip"] and all("GeluExact" in s["reason"] for s in report["skip"]), report
        return
    assert fused == ["CtrMultiHotDense", "CtrVocabMultiHot"] and not report["skip"], report
    missing = dict(feeds, tags=tf.constant([["t1", "zz", "t2"]] * 16))
    with rewrite.enable():
        with pytest.raises(tf.errors.InvalidArgumentError, match="zz"):
            tf.function(lambda d: model(d))(missing)


@pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")), reason="the fused ops are CPU only; online "
                    "graphs are placed on a GPU here")
def test_online_multi_hot_layers_of_one_size_fuse_though_tf_shares_their_constants(tmp_path, rng):
    # Online, TF's common-subexpression pass merges the equal size constants
    # (`bincount/maxlength`) of same-sized multi-hot layers into one node
    # read by both encodings: a constant stays where others read it and does
    # not keep either layer from fusing.
    import keras

    inputs, dense = [], []
    vocabs = {name: [f"{name}{i}" for i in range(20)] for name in ("a", "b", "c")}
    for name, vocab in vocabs.items():
        x = keras.Input(shape=(3,), dtype="string", name=name)
        inputs.append(x)
        hot = keras.layers.StringLookup(vocabulary=vocab, output_mode="multi_hot")(x)
        dense.append(keras.layers.Dense(4)(hot))
    model = keras.Model(inputs, dense)
    feeds = {name: tf.constant(np.array(vocab + [""], object)[rng.integers(0, 21, (16, 3))])
             for name, vocab in vocabs.items()}
    got, report = _online(model, feeds, tmp_path)
    for g, w in zip(got, model(feeds)):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-5, atol=1e-6)
    assert [m["fused_op"] for m in report["match"]] == ["CtrVocabMultiHot"] * 3, report
    assert not [s for s in report["skip"] if s["pattern"] == "vocab_multi_hot"], report

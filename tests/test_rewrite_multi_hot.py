"""The vocab_multi_hot pattern: a Dense layer over a multi-hot or count
encoding of a vocabulary lookup (Keras' StringLookup / IntegerLookup with
output_mode="multi_hot" / "count", CategoryEncoding after a lookup) becomes
one CtrVocabMultiHot, served on the CPU. Every rewritten SavedModel is served
in a fresh process and compared with the original; the same pattern also
runs on concrete functions in this process (the sanitizer stage's tests)."""

import numpy as np
import pytest
import tensorflow as tf

import tf_ctr_ops  # noqa: F401
from tf_ctr_ops import rewrite

TAGS = [f"t{i}" for i in range(25)]
NUMBERS = [3, 5, 7, 11, 13, 17]


def export(path, num_oov):
    """Four encodings, each into its own Dense: StringLookup multi_hot and
    count, IntegerLookup multi_hot, and StringLookup + CategoryEncoding
    (multi_hot); the Dense outputs are concatenated before the last layer."""
    import keras

    keras.utils.set_random_seed(2)
    tags = keras.Input(shape=(4,), dtype="string", name="tags")
    numbers = keras.Input(shape=(3,), dtype="int64", name="numbers")
    lookup = dict(mask_token=None, num_oov_indices=num_oov)
    parts = [
        keras.layers.Dense(5)(keras.layers.StringLookup(vocabulary=TAGS, output_mode="multi_hot", **lookup)(tags)),
        keras.layers.Dense(3)(keras.layers.StringLookup(vocabulary=TAGS, output_mode="count", **lookup)(tags)),
        keras.layers.Dense(4)(keras.layers.IntegerLookup(vocabulary=NUMBERS, output_mode="multi_hot",
                                                         **lookup)(numbers)),
    ]
    ids = keras.layers.StringLookup(vocabulary=TAGS, **lookup)(tags)
    hot = keras.layers.CategoryEncoding(num_tokens=len(TAGS) + num_oov, output_mode="multi_hot")(ids)
    parts.append(keras.layers.Dense(2, activation="relu")(hot))
    out = keras.layers.Dense(1)(keras.layers.Concatenate()(parts))
    keras.Model([tags, numbers], out).export(path, verbose=False)


def inputs(rng, batch, oov=False):
    words = np.array(TAGS + (["never-seen"] if oov else []), object)
    numbers = np.array(NUMBERS + ([99] if oov else []), np.int64)
    return {"tags": words[rng.integers(0, len(words), size=(batch, 4))],
            "numbers": numbers[rng.integers(0, len(numbers), size=(batch, 3))]}


def _signature(path):
    fn = tf.saved_model.load(str(path)).signatures["serving_default"]
    return lambda feeds: fn(**{k: tf.constant(v) for k, v in feeds.items()})["output_0"].numpy()


@pytest.mark.saved_model
@pytest.mark.parametrize("num_oov", [0, 1])
def test_keras_encodings_into_dense_fuse_and_serve_the_same(tmp_path, rng, num_oov):
    src, dst = tmp_path / "src", tmp_path / "dst"
    export(str(src), num_oov)
    report = rewrite.optimize_saved_model(src, dst, runs=1, serving_device="cpu")
    sig = report.signatures["serving_default"]
    fused = [m for m in sig.matches if m["fused_op"] == "CtrVocabMultiHot"]
    assert len(fused) == 4, (sig.matches, sig.skips)
    replaced = " ".join(" ".join(m["replaced"]) for m in fused)
    assert "DenseBincount" in replaced and "LookupTableFindV2" in replaced
    assert ("Assert" in replaced) == (num_oov == 0)
    assert sig.outputs_match  # served in a fresh process by the rewrite's verification
    native, rewritten = _signature(src), _signature(dst)
    for batch in (0, 1, 23, 300):
        feeds = inputs(rng, batch, oov=num_oov > 0)
        np.testing.assert_allclose(rewritten(feeds), native(feeds), rtol=1e-5, atol=1e-6)
    if num_oov == 0:
        feeds = inputs(rng, 5)
        feeds["tags"][3, 2] = "never-seen"
        with pytest.raises(tf.errors.InvalidArgumentError, match="never-seen"):
            native(feeds)
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"key 'never-seen' in row 3 is not in the vocabulary"):
            rewritten(feeds)


class Encodings(tf.Module):
    """tf.lookup + tf.math.bincount + tf.matmul, as hand-written models do it."""

    def __init__(self, rng, values=None, depth=None):
        super().__init__()
        values = tf.range(len(TAGS), dtype=tf.int64) if values is None else tf.constant(values, tf.int64)
        init = tf.lookup.KeyValueTensorInitializer(tf.constant(TAGS), values)
        self.table = tf.lookup.StaticHashTable(init, len(TAGS))
        self.depth = len(TAGS) + 1 if depth is None else depth
        self.kernel = tf.Variable(rng.normal(size=(self.depth, 6)).astype(np.float32))

    def hot(self, keys, binary=True, weights=None, ids_dtype=tf.int64, through=None):
        ids = self.table.lookup(keys)
        if through is not None:  # Keras' CategoryEncoding: its float32 autocast, then int32
            ids = tf.cast(ids, through)
        ids = tf.cast(ids, ids_dtype)
        return tf.math.bincount(ids, weights=weights, minlength=self.depth, maxlength=self.depth,
                                binary_output=binary, axis=-1, dtype=tf.float32)

    def keys(self, rng, batch, width=5):
        return tf.constant(np.array(TAGS + ["never-seen"], object)[rng.integers(0, len(TAGS) + 1,
                                                                                size=(batch, width))])


SPEC = [tf.TensorSpec([None, None], tf.string)]


def _rewritten_in_process(fn, specs, serving_device="cpu"):
    from test_rewrite import run_graph_def

    cf = tf.function(fn).get_concrete_function(*specs)
    graph, report = rewrite.optimize_concrete_function(cf, serving_device=serving_device)
    return (lambda *args: run_graph_def(cf, graph, *args)), report, rewrite.op_counts(graph, library=True)


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("ids_dtype", [tf.int64, tf.int32])
def test_in_process_bincount_matmul_fuses(rng, binary, ids_dtype):
    e = Encodings(rng)
    f = lambda k: tf.nn.relu(tf.matmul(e.hot(k, binary, ids_dtype=ids_dtype), e.kernel) + 1.0)  # noqa: E731
    fused, report, counts = _rewritten_in_process(f, SPEC)
    assert [m["fused_op"] for m in report["match"]] == ["CtrVocabMultiHot"], report
    assert "DenseBincount" not in counts and "LookupTableFindV2" not in counts, counts
    for batch, width in ((0, 5), (1, 5), (64, 5), (7, 0)):
        keys = e.keys(rng, batch, width)
        [got] = fused(keys)
        np.testing.assert_allclose(got.numpy(), f(keys).numpy(), rtol=1e-6, atol=1e-6)


def test_in_process_ids_truncated_to_int32_as_the_cast_does(rng):
    # Ids of 2**32 + i: the int32 Cast makes them i, which the bincount counts.
    e = Encodings(rng, values=np.arange(len(TAGS)) + 2**32)
    f = lambda k: tf.matmul(e.hot(k, ids_dtype=tf.int32), e.kernel)  # noqa: E731
    fused, report, _ = _rewritten_in_process(f, SPEC)
    assert [m["fused_op"] for m in report["match"]] == ["CtrVocabMultiHot"], report
    keys = tf.constant([["t1", "t2", "t1"], ["t24", "t0", "t3"]])
    [got] = fused(keys)
    np.testing.assert_allclose(got.numpy(), f(keys).numpy(), rtol=1e-6, atol=1e-6)
    assert np.abs(got.numpy()).sum() > 0


@pytest.mark.parametrize("through", [tf.float32, tf.float64])
def test_in_process_ids_through_floats_convert_as_the_casts_do(rng, through):
    # Ids past 2**24 round in float32; past 2**31 the int32 cast gives its lowest value.
    e = Encodings(rng, values=np.arange(len(TAGS)) + np.where(np.arange(len(TAGS)) == 7, 3 * 2**30, 0))
    f = lambda k: tf.matmul(e.hot(k, ids_dtype=tf.int32, through=through), e.kernel)  # noqa: E731
    fused, report, _ = _rewritten_in_process(f, SPEC)
    assert [m["fused_op"] for m in report["match"]] == ["CtrVocabMultiHot"], report
    keys = e.keys(rng, 40)
    [got] = fused(tf.where(keys == "t7", "t8", keys))
    np.testing.assert_allclose(got.numpy(), f(tf.where(keys == "t7", "t8", keys)).numpy(), rtol=1e-6, atol=1e-6)
    bad = tf.constant([["t1", "t2"], ["t3", "t7"]])
    with pytest.raises(tf.errors.InvalidArgumentError, match="non-negative"):
        f(bad)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"id -2147483648 of key 't7' in row 1 is negative"):
        fused(bad)


def test_in_process_negative_ids_fail_alike(rng):
    e = Encodings(rng, values=np.arange(len(TAGS)) - 3)
    f = lambda k: tf.matmul(e.hot(k), e.kernel)  # noqa: E731
    fused, _, _ = _rewritten_in_process(f, SPEC)
    keys = tf.constant([["t5", "t6"], ["t7", "t1"]])  # t1's id is -2
    with pytest.raises(tf.errors.InvalidArgumentError, match="non-negative"):
        f(keys)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"id -2 of key 't1' in row 1 is negative"):
        fused(keys)


def test_left_alone_with_reasons(rng):
    e = Encodings(rng)
    cases = {
        # Not served on the CPU: the table lives on the host.
        "serving_device='cpu'": (lambda k: tf.matmul(e.hot(k), e.kernel), None),
        # The encoding is an output too (a training graph's MatMul gradient reads it the same way).
        "another consumer": (lambda k: (lambda h: (tf.matmul(h, e.kernel), h + 0.0))(e.hot(k)), "cpu"),
        "weighted": (lambda k: tf.matmul(e.hot(k, binary=False, weights=tf.ones(tf.shape(k))), e.kernel), "cpu"),
        "transposes": (lambda k: tf.matmul(e.hot(k), tf.transpose(e.kernel), transpose_b=True), "cpu"),
    }
    for reason, (fn, device) in cases.items():
        _, report, counts = _rewritten_in_process(fn, SPEC, serving_device=device)
        assert not report["match"], (reason, report["match"])
        reasons = [s["reason"] for s in report["skip"] if s["pattern"] == "vocab_multi_hot"]
        assert reasons and any(reason in r for r in reasons), (reason, report["skip"])


def test_in_process_encoding_that_waits_on_another_op_is_left_alone(rng):
    e = Encodings(rng)

    def f(k):
        ids = e.table.lookup(k)
        with tf.control_dependencies([tf.debugging.assert_less(tf.size(k), 10**6)]):
            ids = tf.cast(ids, tf.int32)
        hot = tf.math.bincount(ids, minlength=e.depth, maxlength=e.depth, binary_output=True, axis=-1,
                               dtype=tf.float32)
        return tf.matmul(hot, e.kernel)

    # vocab_multi_hot leaves it (the Cast waits on the assert); the bincount
    # alone still fuses (multi_hot_dense), with the find and the Cast as they are.
    fused, report, counts = _rewritten_in_process(f, SPEC)
    assert [m["pattern"] for m in report["match"]] == ["multi_hot_dense"], report["match"]
    assert counts.get("LookupTableFindV2") == 1 and "DenseBincount" not in counts, counts
    keys = e.keys(rng, 9)
    [got] = fused(keys)
    np.testing.assert_allclose(got.numpy(), f(keys).numpy(), rtol=1e-6, atol=1e-6)


def test_in_process_depth_other_than_the_kernels_is_left_alone(rng):
    e = Encodings(rng)
    k2 = tf.Variable(rng.normal(size=(e.depth, 2)).astype(np.float32))

    def f(k):  # the bincount's size is computed at run time from the ids
        ids = e.table.lookup(k)
        hot = tf.math.bincount(ids, minlength=tf.size(k, out_type=tf.int64) * 0 + e.depth, axis=-1,
                               binary_output=True, dtype=tf.float32)
        return tf.matmul(hot, k2)

    _, report, _ = _rewritten_in_process(f, SPEC)
    assert not report["match"], report["match"]
    reasons = [s["reason"] for s in report["skip"] if s["pattern"] == "vocab_multi_hot"]
    assert any("depth" in r for r in reasons), report["skip"]

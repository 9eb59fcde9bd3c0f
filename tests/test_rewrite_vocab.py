"""The vocab_lookup pattern on Keras models written as keras-io writes them:
StringLookup / IntegerLookup + Embedding become CtrVocabEmbedding, served on
the CPU. Every rewritten SavedModel is served in a fresh process and compared
with the original by the rewrite's own verification (which these tests
require to pass), and loaded here and compared again on the tests' inputs,
including keys out of the vocabulary; the same patterns also run on concrete
functions in this process (the sanitizer stage's tests)."""

import re

import numpy as np
import pytest
import tensorflow as tf

import tf_ctr_ops  # noqa: F401
from tf_ctr_ops import rewrite
from test_rewrite import CPU_PLACED

WORDS = [f"w{i}" for i in range(30)]
NUMBERS = [3, 5, 7, 11, 13]


def export(path, num_oov, pooled=False, mask=False):
    """A StringLookup (num_oov OOV slots) + Embedding + Flatten, an
    IntegerLookup + Embedding, and, when pooled, a [B, 4] StringLookup +
    Embedding + GlobalAveragePooling1D; with mask, each lookup has a
    mask_token ("" and 0)."""
    import keras

    keras.utils.set_random_seed(1)
    word = keras.Input(shape=(1,), dtype="string", name="word")
    number = keras.Input(shape=(1,), dtype="int64", name="number")
    inputs, parts = [word, number], []
    extra = num_oov + mask

    def strings():
        return keras.layers.StringLookup(vocabulary=WORDS, mask_token="" if mask else None, num_oov_indices=num_oov)

    parts.append(keras.layers.Flatten()(keras.layers.Embedding(len(WORDS) + extra, 4)(strings()(word))))
    nums = keras.layers.IntegerLookup(vocabulary=NUMBERS, mask_token=0 if mask else None,
                                      num_oov_indices=num_oov)(number)
    parts.append(keras.ops.squeeze(keras.layers.Embedding(len(NUMBERS) + extra, 4)(nums), axis=1))
    if pooled:
        tags = keras.Input(shape=(4,), dtype="string", name="tags")
        inputs.append(tags)
        parts.append(keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(len(WORDS) + extra, 4)(
            strings()(tags))))
    out = keras.layers.Dense(1)(keras.layers.Concatenate()(parts))
    keras.Model(inputs, out).export(path, verbose=False)


def inputs(rng, batch, oov=False, pooled=False, mask=False):
    words = np.array(WORDS + (["never-seen"] if oov else []) + ([""] if mask else []), object)
    numbers = np.array(NUMBERS + ([99, -4] if oov else []) + ([0] if mask else []), np.int64)
    feeds = {"word": words[rng.integers(0, len(words), size=(batch, 1))],
             "number": numbers[rng.integers(0, len(numbers), size=(batch, 1))]}
    if pooled:
        feeds["tags"] = words[rng.integers(0, len(words), size=(batch, 4))]
    return feeds


def serve(path, feeds):
    fn = tf.saved_model.load(str(path)).signatures["serving_default"]
    return {k: v.numpy() for k, v in fn(**{k: tf.constant(v) for k, v in feeds.items()}).items()}


def _signature(path):
    """output_0 of the SavedModel's serving_default on feeds, loaded once."""
    fn = tf.saved_model.load(str(path)).signatures["serving_default"]
    return lambda feeds: fn(**{k: tf.constant(v) for k, v in feeds.items()})["output_0"].numpy()


def rewritten(tmp_path, num_oov, pooled=False, serving_device="cpu", mask=False):
    src, dst = tmp_path / "src", tmp_path / "dst"
    export(str(src), num_oov, pooled, mask)
    report = rewrite.optimize_saved_model(src, dst, runs=1, serving_device=serving_device)
    return src, dst, report.signatures["serving_default"]


@pytest.mark.saved_model
@pytest.mark.parametrize("num_oov, mask", [(0, False), (1, False), (2, False), (0, True), (1, True), (3, True)])
def test_lookups_and_embeddings_fuse_and_serve_the_same(tmp_path, rng, num_oov, mask):
    # num_oov > 1 hashes the keys a table lacks into its slots
    # (to_hash_bucket_fast of a string, floormod of an integer) and a
    # mask_token gets id 0: the fused op does both, as Keras' Selects did.
    src, dst, sig = rewritten(tmp_path, num_oov, pooled=True, mask=mask)
    # The tags' lookup goes into their pooling (dense_reduce_lookup).
    fused = [m for m in sig.matches if m["fused_op"] in ("CtrVocabEmbedding", "CtrVocabEmbeddingLookup")]
    assert [m["fused_op"] for m in fused].count("CtrVocabEmbeddingLookup") == 1, sig.matches
    assert len(fused) == 3, sig.matches
    replaced = " ".join(" ".join(m["replaced"]) for m in fused)
    assert ("Assert" in replaced) == (num_oov == 0)
    assert ("FloorMod" in replaced and "StringToHashBucketFast" in replaced) == (num_oov > 1)
    # Each Embedding's negative-index wrap is a SelectV2, and each rule one more.
    assert replaced.count("(SelectV2)") == 3 * (1 + mask + (num_oov > 1)), replaced
    # The word's and the number's lookups are then grouped with the pooled tags.
    assert [m["fused_op"] for m in sig.matches].count("CtrConcatVocabEmbedding") == 1, sig.matches
    assert not any("LookupTableFindV2" in s["reason"] or "StringToHashBucketFast" in s["reason"]
                   for s in sig.skips), sig.skips
    assert sig.outputs_match
    native, fused = _signature(src), _signature(dst)
    for batch in (0, 1, 17, 300):  # the verification served it in a fresh process; here the tests' inputs
        feeds = inputs(rng, batch, oov=num_oov > 0, pooled=True, mask=mask)
        np.testing.assert_allclose(fused(feeds), native(feeds), rtol=1e-6, atol=1e-6)


@pytest.mark.saved_model
@pytest.mark.parametrize("num_oov", [0, 1, 2])
def test_masked_sequence_features_fuse_find_and_pooling_offline(tmp_path, rng, num_oov):
    # A user's history features: StringLookup / IntegerLookup with a
    # mask_token, Embedding(mask_zero=True) and GlobalAveragePooling1D. Each
    # becomes one CtrVocabEmbeddingLookup; rows of padding only stay NaN.
    import keras

    keras.utils.set_random_seed(3)
    words = keras.Input(shape=(6,), dtype="string", name="words")
    numbers = keras.Input(shape=(6,), dtype="int64", name="numbers")
    pooled = []
    for x, lookup in ((words, keras.layers.StringLookup(vocabulary=WORDS, mask_token="", num_oov_indices=num_oov)),
                      (numbers, keras.layers.IntegerLookup(vocabulary=NUMBERS, mask_token=0,
                                                           num_oov_indices=num_oov))):
        rows = keras.layers.Embedding(lookup.vocabulary_size(), 4, mask_zero=True)(lookup(x))
        pooled.append(keras.layers.GlobalAveragePooling1D()(rows))
    src, dst = tmp_path / "src", tmp_path / "dst"
    keras.Model([words, numbers], keras.layers.Concatenate()(pooled)).export(str(src), verbose=False)
    sig = rewrite.optimize_saved_model(src, dst, runs=1, serving_device="cpu").signatures["serving_default"]
    assert [m["fused_op"] for m in sig.matches].count("CtrVocabEmbeddingLookup") == 2, sig.matches
    assert not any("LookupTableFindV2" in s["node"] for s in sig.skips), sig.skips
    assert sig.outputs_match
    native, fused = _signature(src), _signature(dst)
    word_pool = np.array(WORDS + [""] * 3 + (["never-seen"] if num_oov else []), object)
    number_pool = np.array(NUMBERS + [0] * 3 + ([99, -4] if num_oov else []), np.int64)
    for batch in (0, 1, 33):
        feeds = {"words": word_pool[rng.integers(0, len(word_pool), size=(batch, 6))],
                 "numbers": number_pool[rng.integers(0, len(number_pool), size=(batch, 6))]}
        if batch:
            feeds["words"][0], feeds["numbers"][0] = "", 0  # padding only: 0 / 0
        want = native(feeds)
        assert batch == 0 or np.isnan(want[0]).all()
        np.testing.assert_allclose(fused(feeds), want, rtol=1e-6, atol=1e-6)
    if num_oov == 0:
        feeds = {"words": np.array([["w1", "never-seen", "", "", "", ""]], object),
                 "numbers": np.array([[NUMBERS[0]] * 6], np.int64)}
        with pytest.raises(tf.errors.InvalidArgumentError, match="never-seen"):
            native(feeds)
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"key 'never-seen' in row 0 is not in the vocab"):
            fused(feeds)


@pytest.mark.saved_model
def test_a_masked_lookup_without_oov_still_fails_on_a_missing_key(tmp_path, rng):
    src, dst, sig = rewritten(tmp_path, num_oov=0, mask=True)
    assert [m["fused_op"] for m in sig.matches] == ["CtrVocabEmbedding"] * 2 + ["CtrConcatVocabEmbedding"]
    feeds = inputs(rng, 4, mask=True)
    feeds["word"][:, 0] = ["", "w1", "", "never-seen"]
    with pytest.raises(tf.errors.InvalidArgumentError, match="never-seen"):
        serve(src, feeds)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"key 'never-seen' in row 3 is not in the vocabulary"):
        serve(dst, feeds)
    feeds["word"][3, 0] = ""
    np.testing.assert_allclose(serve(dst, feeds)["output_0"], serve(src, feeds)["output_0"], rtol=1e-6, atol=1e-6)


@pytest.mark.saved_model
def test_out_of_vocabulary_key_still_fails_and_names_it(tmp_path, rng):
    src, dst, sig = rewritten(tmp_path, num_oov=0)
    # Both lookups, then the Concatenate that joins them (concat_vocab).
    assert [m["fused_op"] for m in sig.matches] == ["CtrVocabEmbedding"] * 2 + ["CtrConcatVocabEmbedding"]
    feeds = inputs(rng, 4)
    feeds["word"][2, 0] = "never-seen"
    with pytest.raises(tf.errors.InvalidArgumentError, match="never-seen"):
        serve(src, feeds)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"key 'never-seen' in row 2 is not in the vocabulary"):
        serve(dst, feeds)


class TakeFromTable(tf.Module):
    """tf.lookup + keras.ops.take, with ids the table makes negative, and the
    same gather behind a wrap that adds `shift` instead of the row count."""

    def __init__(self, shift=None):
        super().__init__()
        keys = tf.constant(WORDS)
        values = tf.range(len(WORDS), dtype=tf.int64) - 10  # ids -10..19
        self.table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(keys, values), -1)
        self.params = tf.Variable(np.random.default_rng(3).normal(size=(len(WORDS), 4)).astype(np.float32))
        self.shift = shift

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def serve(self, keys):
        import keras

        ids = self.table.lookup(keys)
        if self.shift is not None:
            return tf.gather(self.params, tf.where(ids < 0, ids + self.shift, ids))
        return keras.ops.take(self.params, ids, axis=0)


@pytest.mark.saved_model
@pytest.mark.parametrize("shift", [None, 5])
def test_negative_ids_wrap_only_by_the_row_count(tmp_path, rng, shift):
    src, dst = tmp_path / "src", tmp_path / "dst"
    module = TakeFromTable(shift)
    tf.saved_model.save(module, str(src), signatures={"serving_default": module.serve})
    # Ids -10..19 and -1; a wrap by 5 leaves the gather in range only from -5 up.
    words = np.array((WORDS if shift is None else WORDS[5:]) + ["never-seen"], object)
    keys = words[rng.integers(0, len(words), size=64)]
    report = rewrite.optimize_saved_model(src, dst, runs=1, serving_device="cpu",
                                          sample_inputs={"serving_default": {"keys": keys}})
    sig = report.signatures["serving_default"]
    assert sig.outputs_match
    if shift is None:
        assert [m["fused_op"] for m in sig.matches] == ["CtrVocabEmbedding"], sig.skips
    else:
        assert not sig.matches
        assert any("row count" in s["reason"] for s in sig.skips), sig.skips
    # Verified on these keys in a fresh process; checked here once more.
    np.testing.assert_array_equal(serve(dst, {"keys": keys})["output_0"], serve(src, {"keys": keys})["output_0"])


def _mutable_table_model(path, kind):
    """A TF2 module serving from a tf.lookup.experimental MutableHashTable or
    DenseHashTable (key -> row, -1 for unknown keys, as TFRA-style key tables
    are written): a gather of each example's first key's row, and a mean over
    its -1-padded keys with tf.nn.safe_embedding_lookup_sparse."""
    m = tf.Module()
    if kind == "mutable":
        m.table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, default_value=-1)
    else:
        m.table = tf.lookup.experimental.DenseHashTable(tf.int64, tf.int64, default_value=-1, empty_key=-2,
                                                        deleted_key=-3)
    m.table.insert(tf.constant([10, 20, 30, 10**12], tf.int64), tf.constant([0, 1, 2, 3], tf.int64))
    m.values = tf.Variable(tf.random.stateless_normal([4, 4], seed=[1, 2]))

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int64)])
    def serve(keys):
        bags = tf.RaggedTensor.from_tensor(keys, padding=-1)
        rows = bags.with_flat_values(m.table.lookup(bags.flat_values))
        pooled = tf.nn.safe_embedding_lookup_sparse(m.values, rows.to_sparse(), None, combiner="mean")
        first = tf.gather(m.values, m.table.lookup(keys[:, 0]))
        return {"pooled": pooled, "first": first}

    m.serve = serve
    tf.saved_model.save(m, str(path), signatures={"serving_default": serve})


@pytest.mark.saved_model
@pytest.mark.parametrize("kind", ["mutable", "dense"])
def test_mutable_hash_table_lookups_fuse_and_serve_the_same(tmp_path, kind):
    src, dst = tmp_path / "src", tmp_path / "dst"
    _mutable_table_model(src, kind)
    feeds = {"keys": np.array([[10, 20, -1], [30, 10**12, 20], [30, -1, -1]], np.int64)}
    report = rewrite.optimize_saved_model(src, dst, runs=1, serving_device="cpu",
                                          sample_inputs={"serving_default": feeds})
    sig = report.signatures["serving_default"]
    fused = [m["fused_op"] for m in sig.matches]
    # The gather takes the table's own find into one op; the pooled lookup keeps the find.
    assert fused.count("CtrVocabEmbedding") == 1 and "CtrEmbeddingLookup" in fused, sig.matches
    assert report.ok and sig.outputs_match  # on these feeds, in a fresh process
    got, want = serve(dst, feeds), serve(src, feeds)
    for k in ("pooled", "first"):
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6)


@pytest.mark.saved_model
@pytest.mark.parametrize("reduce", [tf.reduce_mean, tf.reduce_sum])
def test_a_pooling_of_a_mutable_tables_rows_says_truly_why_it_stays(tmp_path, reduce):
    # A loaded SavedModel shows no shape for a MutableHashTable's find (a
    # StaticHashTable's it does), and a table of vector keys (DenseHashTable)
    # finds one id per key vector: the pooling cannot take the keys' shape
    # as the ids'. The gather fuses with its find; the reason the pooling
    # stays no longer tells the user to rewrite offline, as they were
    # doing (hunt 132).
    m = tf.Module()
    m.table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, default_value=0)
    m.table.insert(tf.constant([10, 20, 30], tf.int64), tf.constant([1, 2, 3], tf.int64))
    m.values = tf.Variable(tf.random.stateless_normal([5, 4], seed=[3, 4]))
    m.serve = tf.function(lambda keys: {"y": reduce(tf.gather(m.values, m.table.lookup(keys)), axis=1)},
                          input_signature=[tf.TensorSpec([None, 3], tf.int64)])
    src, dst = tmp_path / "src", tmp_path / "dst"
    tf.saved_model.save(m, str(src), signatures={"serving_default": m.serve})
    feeds = {"keys": np.array([[10, 20, 99], [30, 30, 10], [7, 8, 9]], np.int64)}
    report = rewrite.optimize_saved_model(src, dst, runs=1, serving_device="cpu",
                                          sample_inputs={"serving_default": feeds})
    sig = report.signatures["serving_default"]
    assert [(m["pattern"], m["fused_op"]) for m in sig.matches] == [("vocab_lookup", "CtrVocabEmbedding")]
    assert report.ok and sig.outputs_match  # on these feeds, in a fresh process
    np.testing.assert_allclose(serve(dst, feeds)["y"], serve(src, feeds)["y"], rtol=1e-6, atol=1e-6)
    # Without vocab_lookup, the pooling's reason is the one the user read.
    report = rewrite.optimize_saved_model(src, tmp_path / "dst2", runs=1, serving_device="cpu",
                                          sample_inputs={"serving_default": feeds},
                                          disabled_patterns=["vocab_lookup"])
    [reason] = [s["reason"] for s in report.signatures["serving_default"].skips
                if s["pattern"] == "dense_reduce_lookup"]
    assert "offline, a SavedModel shows a StaticHashTable's, not a MutableHashTable's" in reason, reason
    assert "rewriting the SavedModel offline" not in reason
    # The find left native is not called a vocabulary's: it may be a mutable table's (hunt 163).
    [find] = [s["reason"] for s in report.signatures["serving_default"].skips if s.get("op") == "LookupTableFindV2"]
    assert "MutableHashTable's" in find, find


@pytest.mark.saved_model
def test_a_signature_that_writes_the_table_another_reads_leaves_a_written_model_and_a_report(tmp_path):
    # Timing calls each signature again and again on one loaded copy of the
    # model: "record", called again, inserts ids that "serve" then cannot
    # gather, which one call each (the reference, the verification) never does. The
    # model was verified and written by then; the command must not fail
    # after writing DST, and the report says why there is no latency (hunt 163).
    m = tf.Module()
    m.table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, default_value=0)
    m.values = tf.Variable(tf.random.stateless_normal([10, 4], seed=[1, 2]))
    m.calls = tf.Variable(tf.constant(0, tf.int64))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)] * 3)
    def record(q, k, v):
        y = tf.gather(m.values, m.table.lookup(q))
        m.table.insert(k, v * m.calls.assign_add(1))
        return {"y": y}

    m.record = record
    m.serve = tf.function(lambda q: {"y": tf.gather(m.values, m.table.lookup(q))},
                          input_signature=[tf.TensorSpec([None], tf.int64)])
    src, dst = tmp_path / "src", tmp_path / "dst"
    tf.saved_model.save(m, str(src), signatures={"record": m.record, "serve": m.serve})
    feeds = {"record": {"q": np.array([1, 2], np.int64), "k": np.array([5, 6], np.int64),
                        "v": np.array([3, 4], np.int64)},
             "serve": {"q": np.array([5, 6, 7], np.int64)}}
    report = rewrite.optimize_saved_model(src, dst, runs=3, serving_device="cpu", sample_inputs=feeds)
    assert report.ok and (dst / "saved_model.pb").exists()
    timed = {k: (s.latency_ms_before, s.latency_note) for k, s in report.signatures.items()}
    assert timed["record"][0] is not None, timed
    assert timed["serve"][0] is None and "indices" in timed["serve"][1], timed
    assert "after the other signatures' calls, the original and the rewritten model failed" in timed["serve"][1]
    assert f"latency {timed['serve'][1]}" in report.summary()


@pytest.mark.saved_model
def test_a_lone_signature_that_fails_when_called_again_gets_a_note_naming_no_other_signature(tmp_path):
    m = tf.Module()
    m.calls = tf.Variable(tf.constant(0, tf.int64))
    m.values = tf.Variable(tf.ones([10, 2]))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def once(q):
        calls = m.calls.assign_add(1)
        with tf.control_dependencies([tf.debugging.assert_less(calls, tf.constant(2, tf.int64), message="again")]):
            return {"y": tf.gather(m.values, q)}

    src, dst = tmp_path / "src", tmp_path / "dst"
    tf.saved_model.save(m, str(src), signatures={"serving_default": once})
    report = rewrite.optimize_saved_model(src, dst, runs=3, serving_device="cpu",
                                          sample_inputs={"serving_default": {"q": np.array([1, 2], np.int64)}})
    assert report.ok and (dst / "saved_model.pb").exists()
    note = report.signatures["serving_default"].latency_note
    assert note.startswith("not timed: called again, the original and the rewritten model failed (") and "again" in note


@pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")), reason="online graphs are placed on a GPU here")
def test_a_pooling_of_a_vector_key_tables_find_stays_tfs_online():
    # A DenseHashTable of [2] keys finds one id per key pair: pooling its
    # [B, 2] keys' rows over axis 1 would read them as [B, L] ids, which the
    # fused op refuses when it runs (hunt 133), where TF pools each row.
    values = tf.Variable(tf.random.stateless_normal([6, 4], seed=[1, 2]))
    table = tf.lookup.experimental.DenseHashTable(tf.int64, tf.int64, default_value=0, empty_key=[-1, -1],
                                                  deleted_key=[-2, -2])
    table.insert(tf.constant([[1, 2], [3, 4]], tf.int64), tf.constant([1, 2], tf.int64))
    keys = tf.constant([[1, 2], [3, 4], [5, 6]], tf.int64)

    def pooled(k):
        return tf.reduce_mean(tf.gather(values, table.lookup(k)), axis=1)

    want = pooled(keys).numpy()
    with rewrite.enable(serving_device="cpu", disabled_patterns=["vocab_lookup"]):
        got = tf.function(pooled)(keys).numpy()
    np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------------------
# concat_vocab: the fused lookups a Concatenate joins become one
# CtrConcatVocabEmbedding, around the other inputs (a numeric column, a
# multi-hot lookup's Dense, whose Assert Keras chains between the features').


def _export_concatenated(path, num_oov):
    import keras

    keras.utils.set_random_seed(3)
    words = [keras.Input(shape=(1,), dtype="string", name=f"word{i}") for i in range(3)]
    number = keras.Input(shape=(1,), dtype="int64", name="number")
    tags = keras.Input(shape=(2,), dtype="string", name="tags")
    price = keras.Input(shape=(1,), dtype="float32", name="price")
    parts = []
    for i, x in enumerate(words):
        ids = keras.layers.StringLookup(vocabulary=WORDS, mask_token=None, num_oov_indices=num_oov)(x)
        parts.append(keras.layers.Flatten()(keras.layers.Embedding(len(WORDS) + num_oov, 2 + i)(ids)))
        if i == 1:  # the multi-hot lookup between the features
            hot = keras.layers.StringLookup(vocabulary=WORDS, mask_token=None, num_oov_indices=num_oov,
                                            output_mode="multi_hot")(tags)
            parts.append(keras.layers.Dense(3)(hot))
    nums = keras.layers.IntegerLookup(vocabulary=NUMBERS, mask_token=None, num_oov_indices=num_oov)(number)
    parts.append(keras.layers.Flatten()(keras.layers.Embedding(len(NUMBERS) + num_oov, 4)(nums)))
    parts.append(price)
    out = keras.layers.Dense(1)(keras.layers.Concatenate()(parts))
    keras.Model(words + [number, tags, price], out).export(path, verbose=False)


def _concatenated_inputs(rng, batch):
    words = np.array(WORDS, object)
    feeds = {f"word{i}": words[rng.integers(0, len(words), size=(batch, 1))] for i in range(3)}
    feeds["number"] = np.array(NUMBERS, np.int64)[rng.integers(0, len(NUMBERS), size=(batch, 1))]
    feeds["tags"] = np.array(WORDS, object)[rng.integers(0, len(WORDS), size=(batch, 2))]
    feeds["price"] = rng.normal(size=(batch, 1)).astype(np.float32)
    return feeds


@pytest.mark.saved_model
def test_concatenated_lookups_become_one_op_and_serve_the_same(tmp_path, rng):
    # num_oov=0: Keras' checks, which it chains, are in the graph (one OOV
    # slot gives the plain lookups, which the tests above concatenate too).
    src, dst = tmp_path / "src", tmp_path / "dst"
    _export_concatenated(str(src), num_oov=0)
    sig = rewrite.optimize_saved_model(src, dst, runs=1, serving_device="cpu").signatures["serving_default"]
    (concat,) = [m for m in sig.matches if m["fused_op"] == "CtrConcatVocabEmbedding"]
    assert sum("CtrVocabEmbedding" in r for r in concat["replaced"]) == 4, concat
    assert sig.outputs_match
    native, fused = _signature(src), _signature(dst)
    for batch in (0, 1, 23, 300):
        feeds = _concatenated_inputs(rng, batch)
        np.testing.assert_allclose(fused(feeds), native(feeds), rtol=1e-6, atol=1e-6)
    feeds = _concatenated_inputs(rng, 4)  # Keras' vocabulary check still fails, naming the key
    feeds["word2"][3, 0] = "never-seen"
    with pytest.raises(tf.errors.InvalidArgumentError, match="never-seen"):
        fused(feeds)


@pytest.mark.saved_model
def test_stacked_lookups_become_one_op_reshaped(tmp_path, rng):
    """FM-style: the fields' [B, D] embeddings stacked into [B, F, D], a
    second-order interaction over them, an MLP."""
    import keras

    keras.utils.set_random_seed(4)
    words = [keras.Input(shape=(1,), dtype="string", name=f"word{i}") for i in range(3)]
    rows = [keras.layers.Flatten()(keras.layers.Embedding(len(WORDS), 4)(
        keras.layers.StringLookup(vocabulary=WORDS, mask_token=None, num_oov_indices=0)(x))) for x in words]
    fields = keras.ops.stack(rows, axis=1)  # [B, 3, 4]
    square_of_sum = keras.ops.square(keras.ops.sum(fields, axis=1))
    sum_of_square = keras.ops.sum(keras.ops.square(fields), axis=1)
    out = keras.layers.Dense(1)(keras.layers.Concatenate()([square_of_sum - sum_of_square,
                                                            keras.layers.Flatten()(fields)]))
    src, dst = tmp_path / "src", tmp_path / "dst"
    keras.Model(words, out).export(str(src), verbose=False)
    sig = rewrite.optimize_saved_model(src, dst, runs=1, serving_device="cpu").signatures["serving_default"]
    assert [m["fused_op"] for m in sig.matches].count("CtrConcatVocabEmbedding") == 1, sig.matches
    assert sig.outputs_match
    native, fused = _signature(src), _signature(dst)
    for batch in (0, 1, 19):
        feeds = {f"word{i}": np.array(WORDS, object)[rng.integers(0, len(WORDS), size=(batch, 1))] for i in range(3)}
        np.testing.assert_allclose(fused(feeds), native(feeds), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------
# The same patterns on a concrete function, rewritten and run in this process
# (no SavedModel: the sanitizer stage runs these).


class InProcessTables:
    """Two string tables and an int64 one (default -1, as tf.lookup users
    write them), each gathered from its own variable."""

    def __init__(self, rng, widths=(2, 3, 4)):
        words = tf.lookup.KeyValueTensorInitializer(tf.constant(WORDS), tf.range(len(WORDS), dtype=tf.int64))
        numbers = tf.lookup.KeyValueTensorInitializer(tf.constant(NUMBERS, tf.int64),
                                                      tf.range(len(NUMBERS), dtype=tf.int64))
        self.tables = [tf.lookup.StaticHashTable(words, -1), tf.lookup.StaticHashTable(words, -1),
                       tf.lookup.StaticHashTable(numbers, -1)]
        rows = (len(WORDS), len(WORDS), len(NUMBERS))
        self.params = [tf.Variable(rng.normal(size=(n, d)).astype(np.float32)) for n, d in zip(rows, widths)]
        self.specs = [tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.string),
                      tf.TensorSpec([None], tf.int64)]

    def rows(self, keys):
        return [tf.gather(p, t.lookup(k)) for p, t, k in zip(self.params, self.tables, keys)]

    def keys(self, rng, batch):
        words = np.array(WORDS, object)
        return [tf.constant(words[rng.integers(0, len(WORDS), batch)]),
                tf.constant(words[rng.integers(0, len(WORDS), batch)]),
                tf.constant(np.array(NUMBERS, np.int64)[rng.integers(0, len(NUMBERS), batch)])]


def _rewritten_in_process(fn, specs):
    from test_rewrite import run_graph_def

    cf = tf.function(fn).get_concrete_function(*specs)
    graph, report = rewrite.optimize_concrete_function(cf, serving_device="cpu")
    return (lambda *args: run_graph_def(cf, graph, *args)), report, rewrite.op_counts(graph, library=True)


def test_left_native_unless_served_on_the_cpu(rng):
    t = InProcessTables(rng)
    cf = tf.function(lambda a, b, c: t.rows([a, b, c])).get_concrete_function(*t.specs)
    for device in (None, "gpu"):
        _, report = rewrite.optimize_concrete_function(cf, serving_device=device)
        assert not report["match"], report["match"]
        reasons = [s["reason"] for s in report["skip"] if s["pattern"] == "vocab_lookup"]
        assert len(reasons) == 3 and all("serving_device='cpu'" in r for r in reasons), report["skip"]


def test_in_process_concatenated_lookups_fuse_and_fail_alike(rng):
    t = InProcessTables(rng)

    def f(a, b, c, price):
        first, second, third = t.rows([a, b, c])
        return tf.concat([first, price, second, third], axis=1)

    fused, report, counts = _rewritten_in_process(f, [*t.specs, tf.TensorSpec([None, 1], tf.float32)])
    assert [m["fused_op"] for m in report["match"]] == ["CtrVocabEmbedding"] * 3 + ["CtrConcatVocabEmbedding"]
    assert counts.get("CtrConcatVocabEmbedding") == 1 and "LookupTableFindV2" not in counts, counts
    for batch in (0, 1, 37):
        args = [*t.keys(rng, batch), tf.constant(rng.normal(size=(batch, 1)).astype(np.float32))]
        [got] = fused(*args)
        np.testing.assert_array_equal(got.numpy(), f(*args).numpy())
    args = [*t.keys(rng, 5), tf.zeros([5, 1])]
    args[2] = tf.constant([3, 5, 8, 7, 3], tf.int64)  # 8 is not in the table: its -1 is out of range
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"-1 is not in \[0, 5\)"):
        f(*args)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"id -1 of key 8 in row 2 is out of range \[0, 5\)"):
        fused(*args)


def test_in_process_stacked_lookups_fuse(rng):
    t = InProcessTables(rng, widths=(4, 4, 4))

    def f(a, b, c):
        fields = tf.stack(t.rows([a, b, c]), axis=1)  # [B, 3, 4]
        return tf.reduce_sum(fields, axis=1) ** 2 - tf.reduce_sum(fields ** 2, axis=1)

    fused, report, counts = _rewritten_in_process(f, t.specs)
    assert counts.get("CtrConcatVocabEmbedding") == 1 and "Pack" not in counts, counts
    for batch in (0, 19):
        args = t.keys(rng, batch)
        [got] = fused(*args)
        np.testing.assert_allclose(got.numpy(), f(*args).numpy(), rtol=1e-6, atol=1e-6)


def test_a_table_of_vector_values_is_left_native():
    # A MutableHashTable of vector values finds a vector per key, and gathering
    # by it is valid TF; the fused op's shapes take one id per key.
    emb = tf.constant(np.arange(40, dtype=np.float32).reshape(10, 4))
    table = tf.lookup.experimental.MutableHashTable(tf.string, tf.int64, default_value=[0, 0])
    table.insert(tf.constant(["a", "b"]), tf.constant([[1, 2], [3, 4]], tf.int64))

    def f(keys):
        return tf.gather(emb, table.lookup(keys))

    fused, report, counts = _rewritten_in_process(f, [tf.TensorSpec([None], tf.string)])
    assert not [k for k in counts if k.startswith("Ctr")], counts
    assert any("not known to be a scalar" in s["reason"] for s in report["skip"]
               if s["pattern"] == "vocab_lookup"), report["skip"]
    keys = tf.constant(["a", "b", "zz"])
    [got] = fused(keys)
    np.testing.assert_array_equal(got.numpy(), f(keys).numpy())


def _masked_pooling_model(num_oov=1):
    import keras

    lookup = keras.layers.StringLookup(vocabulary=["a", "b", "c", "d"], mask_token="", num_oov_indices=num_oov)
    x = keras.Input((3,), dtype="string")
    return keras.Model(x, keras.layers.GlobalAveragePooling1D()(
        keras.layers.Embedding(lookup.vocabulary_size(), 4, mask_zero=True)(lookup(x))))


@pytest.mark.parametrize("num_oov", [0, 1, 2])
def test_masked_lookup_pooling_fuses_the_find(rng, num_oov):
    # StringLookup(mask_token="") + Embedding(mask_zero=True) + the masked
    # mean: one CtrVocabEmbeddingLookup does the find, Keras' mask and OOV
    # rules, the wrap and the pooling, dropping the masked ids; the mask's
    # count reads the fused op's ids, so a row of padding only is 0 / 0.
    model = _masked_pooling_model(num_oov)
    f = lambda keys: model(keys)  # noqa: E731
    fused, report, counts = _rewritten_in_process(f, [tf.TensorSpec([None, 3], tf.string)])
    assert [m["fused_op"] for m in report["match"]] == ["CtrVocabEmbeddingLookup"], report["match"]
    assert "LookupTableFindV2" not in counts and "GatherV2" not in counts, counts
    keys = tf.constant([["a", "", ""], ["zz", "d", "b"], ["", "", ""], ["c", "c", ""]] if num_oov else
                       [["a", "", ""], ["b", "d", "b"], ["", "", ""], ["c", "c", ""]])
    [got] = fused(keys)
    want = f(keys).numpy()
    assert np.isnan(want[2]).all()
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-6)
    for batch in (0, 1, 300):
        keys = tf.constant(rng.choice(["a", "b", "c", "d", ""] + ["zz"] * (num_oov > 0), size=(batch, 3)))
        np.testing.assert_allclose(fused(keys)[0].numpy(), f(keys).numpy(), rtol=1e-6, atol=1e-6)
    if num_oov == 0:
        bad = tf.constant([["a", "", ""], ["b", "zz", ""]])
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"key 'zz' in row 1 is not in the vocabulary"):
            fused(bad)


def test_masked_lookup_find_left_out_of_the_pooling_says_why(rng):
    # Not served on the CPU: the pooling fuses, the find stays, and the
    # report says why with the pooling's own record.
    model = _masked_pooling_model()
    cf = tf.function(lambda keys: model(keys)).get_concrete_function(tf.TensorSpec([None, 3], tf.string))
    _, report = rewrite.optimize_concrete_function(cf, serving_device="gpu")
    assert [m["fused_op"] for m in report["match"]] == ["CtrEmbeddingLookup"], report["match"]
    finds = [s for s in report["skip"] if s["node"].endswith("LookupTableFindV2")]
    assert len(finds) == 1 and finds[0]["pattern"] == "dense_reduce_lookup", report["skip"]
    assert "the pooling fused without the find" in finds[0]["reason"], finds
    assert "serving_device='cpu'" in finds[0]["reason"], finds


def test_unmasked_lookup_find_is_not_called_masked():
    import keras

    lookup = keras.layers.StringLookup(vocabulary=["a", "b"], mask_token=None)
    cf = tf.function(lambda keys: tf.cast(lookup(keys), tf.float32) * 2.0).get_concrete_function(
        tf.TensorSpec([None], tf.string))
    _, report = rewrite.optimize_concrete_function(cf, serving_device="cpu")
    finds = [s["reason"] for s in report["skip"] if s["node"].endswith("LookupTableFindV2")]
    assert len(finds) == 1 and "mask_token" not in finds[0], report["skip"]


@pytest.mark.skipif(not CPU_PLACED, reason="online graphs are placed on a GPU here; the fused find is CPU only")
def test_online_keras_lookups_fuse_after_grappler_reorders_the_check(rng, tmp_path):
    # Online, TF's own passes run first: constant sharing and canonicalization
    # put the check's constant first (Equal(0, Size)), and automatic control
    # dependencies chain the two Asserts. The check must still be recognized.
    import keras

    inputs = [keras.Input((1,), dtype="string", name=f"s{f}") for f in range(2)]
    parts = [keras.layers.Flatten()(keras.layers.Embedding(len(WORDS), 4)(
        keras.layers.StringLookup(vocabulary=WORDS, mask_token=None, num_oov_indices=0)(x))) for x in inputs]
    model = keras.Model(inputs, keras.layers.Concatenate()(parts))
    words = np.array(WORDS, object)
    feeds = [tf.constant(words[rng.integers(0, len(WORDS), (9, 1))]) for _ in inputs]
    report_file = str(tmp_path / "report.jsonl")
    with rewrite.enable(report_file=report_file):
        fused = tf.function(lambda a, b: model([a, b]))
        got = fused(*feeds)
        missing = [feeds[0], tf.constant([["zz"]] * 9)]
        with pytest.raises(tf.errors.InvalidArgumentError, match="zz"):
            fused(*missing)
    np.testing.assert_array_equal(got.numpy(), model(feeds).numpy())
    report = rewrite.read_report(report_file)
    assert {m["fused_op"] for m in report["match"]} >= {"CtrVocabEmbedding"}, report["skip"]
    assert not [s for s in report["skip"] if s["pattern"] == "vocab_lookup"], report["skip"]
    # A captured table gives inference no shapes: the rewrite reads them from
    # the keys (through the find, Keras' index wrap and the gather), so the
    # Flatten goes and the concatenation is one op.
    assert [m["fused_op"] for m in report["match"]].count("CtrConcatVocabEmbedding") == 1, report


@pytest.mark.skipif(not CPU_PLACED, reason="online graphs are placed on a GPU here; the fused find is CPU only")
def test_online_keras_masks_and_oov_slots_fuse_after_grappler(rng, tmp_path):
    # TF's own passes run first online (constant folding, canonicalization):
    # the mask's and the slots' Selects must still be recognized, and the
    # fused op must give Keras' ids, a masked key's and a hashed one's.
    import keras

    word, number = keras.Input((1,), dtype="string"), keras.Input((1,), dtype="int64")
    ids = [keras.layers.StringLookup(vocabulary=WORDS, mask_token="", num_oov_indices=3)(word),
           keras.layers.IntegerLookup(vocabulary=NUMBERS, mask_token=0, num_oov_indices=2)(number)]
    sizes = [len(WORDS) + 4, len(NUMBERS) + 3]
    model = keras.Model([word, number], keras.layers.Concatenate()(
        [keras.layers.Flatten()(keras.layers.Embedding(n, 3)(i)) for n, i in zip(sizes, ids)]))
    words = np.array(WORDS + ["", "zz", "never-seen", "w1 "], object)
    numbers = np.array(NUMBERS + [0, -9, 99, 2**40], np.int64)
    feeds = [tf.constant(words[rng.integers(0, len(words), (64, 1))]),
             tf.constant(numbers[rng.integers(0, len(numbers), (64, 1))])]
    report_file = str(tmp_path / "report.jsonl")
    with rewrite.enable(report_file=report_file):
        got = tf.function(lambda a, b: model([a, b]))(*feeds)
    np.testing.assert_array_equal(got.numpy(), model(feeds).numpy())
    report = rewrite.read_report(report_file)
    assert [m["fused_op"] for m in report["match"]] == ["CtrVocabEmbedding"] * 2 + ["CtrConcatVocabEmbedding"], report
    assert not [s for s in report["skip"] if s["pattern"] == "vocab_lookup"], report["skip"]


@pytest.mark.skipif(not CPU_PLACED, reason="online graphs are placed on a GPU here; the fused find is CPU only")
def test_ragged_pooling_of_a_fused_vocabulary_lookup_says_why_it_stays(tmp_path):
    """Split strings looked up by a StringLookup, embedded and averaged as a
    RaggedTensor: vocab_lookup takes the find and the gather, and the ragged
    mean over its rows stays TF's, with the reason in the report."""
    import keras

    keras.utils.set_random_seed(1)
    lookup, embedding = keras.layers.StringLookup(vocabulary=["a", "b", "c"]), keras.layers.Embedding(4, 4)

    def f(s):
        ids = tf.ragged.map_flat_values(lookup, tf.strings.split(s, ","))
        return tf.reduce_mean(tf.ragged.map_flat_values(embedding, ids), axis=1)

    x = tf.constant(["a,b", "", "zz,c,a", "c"])
    want = tf.function(f)(x).numpy()
    report = tmp_path / "r.jsonl"
    with rewrite.enable(serving_device="cpu", report_file=str(report)):
        got = tf.function(f)(x).numpy()
    np.testing.assert_array_equal(got, want)  # the empty row's mean is NaN in both
    found = rewrite.read_report(report)
    assert [m["pattern"] for m in found["match"]] == ["vocab_lookup"], found
    reasons = [s["reason"] for s in found["skip"] if s["pattern"] == "ragged_reduce_lookup"]
    assert reasons and all("fused vocabulary lookup" in r for r in reasons), found["skip"]


def test_a_pooling_of_fused_vocabulary_rows_of_unknown_length_says_why_it_stays(rng):
    """StringLookup + Embedding + reduce_mean over [B, None] keys: L is
    unknown, so dense_reduce_lookup cannot take the pooling; vocab_lookup
    takes the find and the gather, and the Mean left on its rows is reported
    with the reason rather than not at all."""
    import keras

    keras.utils.set_random_seed(2)
    lookup, embedding = keras.layers.StringLookup(vocabulary=["a", "b", "c"]), keras.layers.Embedding(4, 3)
    embedding.build((None,))
    run, report, counts = _rewritten_in_process(lambda x: tf.reduce_mean(embedding(lookup(x)), axis=1),
                                                [tf.TensorSpec([None, None], tf.string)])
    x = tf.constant(rng.choice(["a", "b", "c", "zz"], size=(6, 5)))
    np.testing.assert_array_equal(run(x)[0], tf.reduce_mean(embedding(lookup(x)), axis=1))
    assert [m["pattern"] for m in report["match"]] == ["vocab_lookup"], report["match"]
    assert counts.get("Mean") == 1, counts
    reasons = [s["reason"] for s in report["skip"] if s["op"] == "Mean"]
    assert len(reasons) == 1 and "vocab_lookup fused the gather with what produced its ids, alone" in reasons[0], \
        report["skip"]


def _keys_and_embedding(keys):
    """A StringLookup ("vocabulary") or Hashing ("hashed") layer of 4 ids, the
    pattern that fuses its find or hash with a gather, and an Embedding of them."""
    import keras

    if keys == "vocabulary":
        ids, pattern = keras.layers.StringLookup(vocabulary=["a", "b", "c"]), "vocab_lookup"
    else:
        ids, pattern = keras.layers.Hashing(num_bins=4), "hash_gather"
    embedding = keras.layers.Embedding(4, 3)
    embedding.build((None,))
    return ids, pattern, embedding


@pytest.mark.parametrize("keys", ["vocabulary", "hashed"])
def test_switching_dense_reduce_lookup_off_leaves_the_gather_to_the_gather_patterns(rng, keys):
    """StringLookup (or Hashing) + Embedding + reduce_mean over [B, 5] keys:
    vocab_lookup and hash_gather leave the gather to dense_reduce_lookup,
    which takes the pooling too; with that one off they take the gather
    themselves, and the Mean left says it is off (hunt 168)."""
    import keras

    keras.utils.set_random_seed(3)
    ids, pattern, embedding = _keys_and_embedding(keys)
    f = lambda x: tf.reduce_mean(embedding(ids(x)), axis=1)  # noqa: E731
    cf = tf.function(f).get_concrete_function(tf.TensorSpec([None, 5], tf.string))
    _, on = rewrite.optimize_concrete_function(cf, serving_device="cpu")
    assert [m["pattern"] for m in on["match"]] == ["dense_reduce_lookup"], on["match"]

    from test_rewrite import run_graph_def

    graph, off = rewrite.optimize_concrete_function(cf, serving_device="cpu", disabled_patterns=["dense_reduce_lookup"])
    assert [m["pattern"] for m in off["match"]] == [pattern], off["match"]
    x = tf.constant(rng.choice(["a", "b", "c", "zz"], size=(6, 5)))
    np.testing.assert_array_equal(run_graph_def(cf, graph, x)[0], f(x))
    # The Mean reads the fused gather's rows (hashed keys': reshaped to [B, L, D]),
    # and says so (hunt 172: the hashed keys' said nothing).
    reasons = [s["reason"] for s in off["skip"] if s["op"] == "Mean"]
    assert reasons == ["Mean of the rows of " + reasons[0].split("Mean of the rows of ")[1]], off["skip"]
    assert reasons[0].endswith("(dense_reduce_lookup, the pattern that fuses Mean poolings with the gather before "
                               "them, is disabled)"), reasons
    assert not [s for s in off["skip"] if "no pattern takes" in s["reason"]], off["skip"]


@pytest.mark.parametrize("keys", ["vocabulary", "hashed"])
def test_a_sum_over_the_embedding_axis_leaves_the_gather_to_the_gather_patterns(rng, keys):
    """reduce_sum(embedding(ids(x)), axis=2) pools no bags: dense_reduce_lookup
    declines it, and vocab_lookup / hash_gather took it for one and left the
    find and the gather native, fusing them only with dense_reduce_lookup
    switched off (hunt 172)."""
    import keras

    from test_rewrite import run_graph_def

    keras.utils.set_random_seed(4)
    ids, pattern, embedding = _keys_and_embedding(keys)
    for f in (lambda x: tf.reduce_sum(embedding(ids(x)), axis=2),
              lambda x: tf.reduce_mean(embedding(ids(x)), axis=1, keepdims=True)):
        cf = tf.function(f).get_concrete_function(tf.TensorSpec([None, 5], tf.string))
        graph, report = rewrite.optimize_concrete_function(cf, serving_device="cpu")
        assert [m["pattern"] for m in report["match"]] == [pattern], report["match"]
        x = tf.constant(rng.choice(["a", "b", "c", "zz"], size=(6, 5)))
        np.testing.assert_array_equal(run_graph_def(cf, graph, x)[0], f(x))


def test_the_reason_a_pooling_of_fused_rows_stays_states_no_cause_it_cannot_see(rng):
    """DeepFM's second-order term over StringLookup keys of a known length
    sums the rows and their squares: dense_reduce_lookup declines (the rows
    have another reader), and the Sums' reason claimed a form they have."""
    import keras

    from test_rewrite import run_graph_def

    keras.utils.set_random_seed(5)
    lookup, embedding = keras.layers.StringLookup(vocabulary=["a", "b", "c"]), keras.layers.Embedding(4, 3)
    embedding.build((None,))

    def fm(x):
        rows = embedding(lookup(x))
        return 0.5 * tf.reduce_sum(tf.square(tf.reduce_sum(rows, axis=1)) - tf.reduce_sum(tf.square(rows), axis=1),
                                   axis=1)

    cf = tf.function(fm).get_concrete_function(tf.TensorSpec([None, 6], tf.string))
    graph, report = rewrite.optimize_concrete_function(cf, serving_device="cpu")
    x = tf.constant(rng.choice(["a", "b", "c", "zz"], size=(5, 6)))
    np.testing.assert_allclose(run_graph_def(cf, graph, x)[0], fm(x), rtol=1e-6)
    reasons = [s["reason"] for s in report["skip"] if s["pattern"] == "-" and s["op"] == "Sum"]
    assert reasons, report["skip"]
    for reason in reasons:
        assert "vocab_lookup fused the gather with what produced its ids, alone" in reason, reason
        assert "with the rows read by nothing else" in reason, reason
        assert "a pooling fuses with a find only in dense_reduce_lookup's form" not in reason, reason


SPLIT_DEVICES_SCRIPT = r'''
import json, sys
import re

import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
from tf_ctr_ops import rewrite
rng = np.random.default_rng(0)
table_device, embedding_device = sys.argv[1], sys.argv[2]
with tf.device(table_device):
    lookup = keras.layers.StringLookup(vocabulary=[f"v{i}" for i in range(50)])
with tf.device(embedding_device):
    table = tf.Variable(rng.normal(size=(51, 4)).astype(np.float32))
w = tf.Variable(np.zeros((4, 1), np.float32))
strings = tf.constant([f"v{i}" for i in rng.integers(0, 60, 32)])
y = tf.constant(rng.random(32).astype(np.float32))

def train(steps=3):
    w.assign(tf.zeros_like(w))
    @tf.function
    def step():
        with tf.GradientTape() as tape:
            e = tf.gather(table, lookup(strings))
            loss = tf.reduce_mean((tf.squeeze(tf.matmul(e, w), 1) - y) ** 2)
        w.assign_sub(0.1 * tape.gradient(loss, w))
        return loss
    return [float(step()) for _ in range(steps)]

native = train()
with rewrite.enable(report_file=sys.argv[3], serving_device="cpu"):
    fused = train()
report = rewrite.read_report(sys.argv[3])
print(json.dumps({"native": native, "fused": fused, "matches": [m["pattern"] for m in report["match"]],
                  "skips": [s["reason"] for s in report["skip"] if s["pattern"] == "vocab_lookup"]}))
'''


@pytest.mark.parametrize("devices", [("/cpu:0", "/cpu:1"), ("/cpu:1", "/cpu:1")])
def test_a_table_on_another_device_than_its_embedding_is_left_native(tmp_path, devices):
    """A function placed on two devices (a lookup table on one, the embedding
    it indexes on another, as a strategy's replicas place them): the fused op
    would read the table where it cannot, and training failed. The lookup
    stays TF's, says why, and trains as natively; on one device it fuses."""
    import json
    import subprocess
    import sys

    from conftest import fresh_process_env

    proc = subprocess.run([sys.executable, "-c", SPLIT_DEVICES_SCRIPT, *devices, str(tmp_path / "report.jsonl")],
                          env=fresh_process_env(), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(out["fused"], out["native"], rtol=1e-6)
    if devices[0] == devices[1]:
        assert "vocab_lookup" in out["matches"], out
    else:
        assert "vocab_lookup" not in out["matches"], out
        assert any("the lookup table is read on" in r and "CPU:0" in r and "CPU:1" in r for r in out["skips"]), out


def export_deepfm(path, num_oov, mask):
    """DeepFM's fields as Keras users write them: one StringLookup (and one
    IntegerLookup) read by the field's first-order Embedding(N, 1) and its
    Embedding(N, 4)."""
    import keras

    keras.utils.set_random_seed(2)
    word = keras.Input(shape=(1,), dtype="string", name="word")
    number = keras.Input(shape=(1,), dtype="int64", name="number")
    extra = num_oov + mask
    ids = [keras.layers.StringLookup(vocabulary=WORDS, mask_token="" if mask else None, num_oov_indices=num_oov)(word),
           keras.layers.IntegerLookup(vocabulary=NUMBERS, mask_token=0 if mask else None,
                                      num_oov_indices=num_oov)(number)]
    rows = [len(WORDS) + extra, len(NUMBERS) + extra]
    first = [keras.layers.Flatten()(keras.layers.Embedding(n, 1)(i)) for n, i in zip(rows, ids)]
    factors = [keras.layers.Flatten()(keras.layers.Embedding(n, 4)(i)) for n, i in zip(rows, ids)]
    out = keras.layers.Add()([*first, keras.layers.Dot(axes=1)(factors),
                              keras.layers.Dense(1)(keras.layers.Concatenate()(factors))])
    keras.Model([word, number], out).export(path, verbose=False)


@pytest.mark.saved_model
@pytest.mark.parametrize("num_oov, mask", [(0, False), (1, False), (2, True)])
def test_one_lookup_read_by_two_embeddings_fuses_both(tmp_path, rng, num_oov, mask):
    # Each lookup's ids had two gathers reading them: "has another consumer", nothing fused.
    src, dst = tmp_path / "src", tmp_path / "dst"
    export_deepfm(str(src), num_oov, mask)
    report = rewrite.optimize_saved_model(src, dst, runs=1, serving_device="cpu")
    sig = report.signatures["serving_default"]
    assert report.ok and sig.outputs_match
    assert [m["pattern"] for m in sig.matches].count("vocab_lookup") == 4, sig.matches
    assert not {"LookupTableFindV2", "GatherV2", "ResourceGather"} & set(sig.op_counts_after), sig.op_counts_after
    # Each find is absorbed once, by its ids' last gather.
    finds = [r for m in sig.matches for r in m["replaced"] if r.endswith("(LookupTableFindV2)")]
    assert len(finds) == 2, finds
    native, fused = _signature(src), _signature(dst)
    for batch in (0, 1, 33):
        feeds = inputs(rng, batch, oov=num_oov > 0, mask=mask)
        np.testing.assert_allclose(fused(feeds), native(feeds), rtol=1e-6, atol=1e-6)
    if num_oov == 0:  # the fused ops still refuse a key outside the vocabulary
        feeds = inputs(rng, 3)
        feeds["word"][1, 0] = "never-seen"
        with pytest.raises(tf.errors.InvalidArgumentError, match="never-seen"):
            serve(dst, feeds)


@pytest.mark.saved_model
def test_a_lookup_left_out_of_the_concatenation_names_its_other_reader(tmp_path, rng):
    # Keras' Concatenate of a masked Embedding and an unmasked one reads the
    # unmasked rows' Shape (ones_like, its mask): the reason named no reader.
    import keras

    word = keras.Input(shape=(), dtype="string", name="word")
    tag = keras.Input(shape=(), dtype="string", name="tag")
    masked = keras.layers.Embedding(len(WORDS) + 2, 4, mask_zero=True)(
        keras.layers.StringLookup(vocabulary=WORDS, mask_token="")(tag))
    plain = [keras.layers.Embedding(len(WORDS) + 1, 4)(keras.layers.StringLookup(vocabulary=WORDS)(word))
             for _ in range(2)]
    src, dst = tmp_path / "src", tmp_path / "dst"
    keras.Model([word, tag], keras.layers.Dense(1)(keras.layers.Concatenate()([*plain, masked]))).export(
        str(src), verbose=False)
    sig = rewrite.optimize_saved_model(src, dst, runs=1, serving_device="cpu").signatures["serving_default"]
    assert sig.outputs_match
    reasons = [s["reason"] for s in sig.skips if s["pattern"] == "concat_vocab"]
    assert any(re.search(r"or its rows \(a gradient\): \S*ones_like\S* \(Shape\)", r) for r in reasons), sig.skips


@pytest.mark.parametrize("failed, says", [
    (("the rewritten model",), "the rewritten model failed where the original ran"),
    (("the original",), "the original failed where the rewritten model ran"),
    (("the original", "the rewritten model"), "the original and the rewritten model failed")])
def test_a_latency_note_says_which_copy_failed_and_which_ran(failed, says):
    error = tf.errors.InvalidArgumentError(None, None, "assertion failed: again")
    note = rewrite._latency_failure_note({which: error for which in failed}, others=False)
    assert note.startswith(f"not timed: called again, {says} (") and "again" in note, note

"""CtrVocabEmbeddingLookup (tco.vocab_embedding_lookup_sparse) against the TF
composition it replaces: tf.nn.safe_embedding_lookup_sparse over the ids a
vocabulary table finds, with IdTableWithHashBuckets' out-of-vocabulary
buckets where asked (what the vocabulary feature columns build), forward and
gradient."""

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.ops import lookup_ops

import tf_ctr_ops as tco
from conftest import random_sparse

VOCAB = [f"w{i}" for i in range(30)]
INT_VOCAB = np.arange(0, 300, 10, dtype=np.int64)


def table_of(keys, default=-1):
    init = tf.lookup.KeyValueTensorInitializer(keys, tf.range(len(keys), dtype=tf.int64))
    return tf.lookup.StaticHashTable(init, default)


def native(table, sp_keys, params, sp_weights=None, combiner="mean", oov=0, default_id=None, max_norm=None):
    finder = lookup_ops.IdTableWithHashBuckets(table, oov) if oov else table
    ids = finder.lookup(sp_keys)
    return tf.nn.safe_embedding_lookup_sparse(params, ids, sp_weights, combiner=combiner, default_id=default_id,
                                              max_norm=max_norm)


def sparse_keys(rng, batch, vocab, width=4, missing=0.2, empty_rows=0.2, unknown="never-seen"):
    """[batch, width] keys: rows left empty, keys out of the vocabulary."""
    dtype = tf.string if isinstance(unknown, str) else tf.int64
    def key(r):
        return unknown if r.random() < missing else vocab[r.integers(0, len(vocab))]

    return random_sparse(rng, batch, width, key, dtype, empty_rows)


def weights_like(rng, keys, low=-0.5):
    n = int(keys.values.shape[0])
    return tf.SparseTensor(keys.indices, tf.constant(rng.uniform(low, 2.0, n), tf.float32), keys.dense_shape)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("oov", [0, 1, 3])
@pytest.mark.parametrize("key_type", ["string", "int64"])
def test_matches_safe_lookup_of_the_found_ids(rng, combiner, oov, key_type):
    vocab, unknown = (VOCAB, "never-seen") if key_type == "string" else (INT_VOCAB, 12345)
    table = table_of(tf.constant(vocab))
    params = tf.constant(rng.normal(size=(len(vocab) + oov, 5)), tf.float32)
    keys = sparse_keys(rng, 40, vocab, unknown=unknown)
    got = tco.vocab_embedding_lookup_sparse(table, keys, params, combiner=combiner, num_oov_buckets=oov)
    np.testing.assert_allclose(got.numpy(), native(table, keys, params, combiner=combiner, oov=oov).numpy(),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_weights_default_id_and_max_norm(rng, combiner):
    table = table_of(tf.constant(VOCAB))
    params = tf.constant(rng.normal(size=(len(VOCAB) + 2, 6)) * 3, tf.float32)
    keys = sparse_keys(rng, 50, VOCAB)
    weights = weights_like(rng, keys)  # some not > 0: dropped, as the safe lookup drops them
    got = tco.vocab_embedding_lookup_sparse(table, keys, params, weights, combiner=combiner, num_oov_buckets=2,
                                            default_id=3, max_norm=1.5)
    want = native(table, keys, params, weights, combiner=combiner, oov=2, default_id=3, max_norm=1.5)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("weighted", [False, True])
def test_gradients_match(rng, weighted):
    table = table_of(tf.constant(VOCAB))
    params = tf.Variable(rng.normal(size=(len(VOCAB) + 1, 4)), dtype=tf.float32)
    keys = sparse_keys(rng, 30, VOCAB)
    w = tf.Variable(rng.uniform(0.1, 2.0, int(keys.values.shape[0])), dtype=tf.float32)
    upstream = tf.constant(rng.normal(size=(30, 4)), tf.float32)

    def grads(fn):
        with tf.GradientTape() as tape:
            sp_weights = tf.SparseTensor(keys.indices, w, keys.dense_shape) if weighted else None
            loss = tf.reduce_sum(fn(table, keys, params, sp_weights, combiner="sqrtn", oov=1) * upstream)
        g_params, g_w = tape.gradient(loss, [params, w])
        assert isinstance(g_params, tf.IndexedSlices)
        return tf.convert_to_tensor(g_params).numpy(), None if g_w is None else tf.convert_to_tensor(g_w).numpy()

    def fused(table, keys, params, sp_weights, combiner, oov):
        return tco.vocab_embedding_lookup_sparse(table, keys, params, sp_weights, combiner=combiner,
                                                 num_oov_buckets=oov)

    got, want = grads(fused), grads(native)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    if weighted:
        np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)
    else:
        assert got[1] is None and want[1] is None


@pytest.mark.parametrize("default_id", [None, 2])
def test_gradient_has_tfs_rows_so_a_sparse_optimizer_updates_as_tf(rng, default_id):
    # TF's safe lookup fills an empty bag with id 0, whose zero row its
    # gradient lists (without a default_id): a momentum update then moves
    # row 0. The op's gradient had one row per id found, not TF's.
    table = table_of(tf.constant(VOCAB))
    keys = sparse_keys(rng, 12, VOCAB, empty_rows=0.4)
    params = {}
    for name, fn in (("fused", lambda p: tco.vocab_embedding_lookup_sparse(table, keys, p, default_id=default_id)),
                     ("native", lambda p: native(table, keys, p, default_id=default_id))):
        var = tf.Variable(np.ones((len(VOCAB), 3), np.float32))
        optimizer = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9)
        for step in range(3):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(fn(var) * (step + 1.0))
            grad = tape.gradient(loss, var)
            optimizer.apply_gradients([(grad, var)])
        params[name] = (var.numpy(), np.sort(grad.indices.numpy()))
    np.testing.assert_array_equal(params["fused"][1], params["native"][1])
    np.testing.assert_allclose(params["fused"][0], params["native"][0], rtol=1e-6)


def test_ragged_keys_and_empty_strings(rng):
    table = table_of(tf.constant(VOCAB + [""]))  # the empty string is a word of this vocabulary
    params = tf.constant(rng.normal(size=(len(VOCAB) + 3, 3)), tf.float32)
    keys = tf.ragged.constant([["w1", "", "zz"], [], ["", ""], ["w29"]])
    got = tco.vocab_embedding_lookup_sparse(table, keys, params, num_oov_buckets=2)
    want = native(table, keys.to_sparse(), params, oov=2)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)


@pytest.mark.parametrize("batch", [0, 1, 5000])
def test_batch_sizes(rng, batch):
    table = table_of(tf.constant(VOCAB))
    params = tf.constant(rng.normal(size=(len(VOCAB) + 1, 8)), tf.float32)
    keys = sparse_keys(rng, batch, VOCAB)
    got = tco.vocab_embedding_lookup_sparse(table, keys, params, num_oov_buckets=1)
    assert got.shape == (batch, 8)
    np.testing.assert_allclose(got.numpy(), native(table, keys, params, oov=1).numpy(), rtol=1e-5, atol=1e-6)


def test_keys_out_of_order_are_pooled_per_row(rng):
    table = table_of(tf.constant(VOCAB))
    params = tf.constant(rng.normal(size=(len(VOCAB), 3)), tf.float32)
    keys = tf.SparseTensor([[2, 0], [0, 0], [2, 1], [0, 1]], ["w1", "w2", "w3", "w4"], [3, 2])
    got = tco.vocab_embedding_lookup_sparse(table, keys, params)
    want = native(table, tf.sparse.reorder(keys), params)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)


@pytest.mark.parametrize("dtype", [tf.float64, tf.float16, tf.bfloat16])
def test_table_dtypes(rng, dtype):
    table = table_of(tf.constant(VOCAB))
    params = tf.constant(rng.normal(size=(len(VOCAB) + 1, 4)), dtype)
    keys = sparse_keys(rng, 20, VOCAB)
    got = tco.vocab_embedding_lookup_sparse(table, keys, params, num_oov_buckets=1)
    want = native(table, keys, tf.cast(params, tf.float32), oov=1)
    assert got.dtype == dtype
    tol = 1e-6 if dtype == tf.float64 else 2e-2
    np.testing.assert_allclose(tf.cast(got, tf.float32).numpy(), want.numpy(), rtol=tol, atol=tol)


def test_in_a_tf_function_with_int32_segments(rng):
    table = table_of(tf.constant(VOCAB))
    params = tf.constant(rng.normal(size=(len(VOCAB), 3)), tf.float32)

    @tf.function(input_signature=[tf.SparseTensorSpec([None, None], tf.string)])
    def serve(keys):
        return tco.vocab_embedding_lookup_sparse(table, keys, params)

    keys = sparse_keys(rng, 12, VOCAB)
    np.testing.assert_allclose(serve(keys).numpy(), native(table, keys, params).numpy(), rtol=1e-6)
    # The raw op with int32 row ids, as a graph may feed them.
    out, ids = tco.vocab._ops.ctr_vocab_embedding_lookup(
        mask_keys=[], mask_ids=[], table_handle=table.resource_handle, default_value=tf.constant(-1, tf.int64), params=params,
        keys=keys.values, segments=tf.cast(keys.indices[:, 0], tf.int32), num_rows=tf.constant(12, tf.int64),
        weights=tf.zeros([0]), segment_kind="row_ids", invalid_ids="skip_negative")
    np.testing.assert_allclose(out.numpy(), native(table, keys, params).numpy(), rtol=1e-6)
    np.testing.assert_array_equal(ids.numpy(), table.lookup(keys.values).numpy())


def test_id_out_of_range_names_the_key_its_id_and_row(rng):
    table = table_of(tf.constant(VOCAB))
    params = tf.zeros([len(VOCAB), 2])  # no row for the bucket
    keys = tf.SparseTensor([[0, 0], [3, 0], [3, 1]], ["w0", "w2", "nope"], [4, 2])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"id 30 of key 'nope' in row 3 is out of range \[0, 30\)"):
        tco.vocab_embedding_lookup_sparse(table, keys, params, num_oov_buckets=1)


def test_table_values_past_the_params_are_an_error(rng):
    init = tf.lookup.KeyValueTensorInitializer(["a", "b"], tf.constant([0, 7], tf.int64))
    table = tf.lookup.StaticHashTable(init, -1)
    keys = tf.SparseTensor([[0, 0], [1, 0]], ["a", "b"], [2, 1])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"id 7 of key 'b' in row 1"):
        tco.vocab_embedding_lookup_sparse(table, keys, tf.zeros([3, 2]))


def test_bad_arguments():
    table = table_of(tf.constant(VOCAB))
    keys = tf.SparseTensor([[0, 0]], tf.constant([5], tf.int64), [1, 1])
    with pytest.raises(TypeError, match="key dtype"):
        tco.vocab_embedding_lookup_sparse(table, keys, tf.zeros([30, 2]))
    with pytest.raises(ValueError, match="num_oov_buckets must be >= 0"):
        tco.vocab_embedding_lookup_sparse(table, keys, tf.zeros([30, 2]), num_oov_buckets=-1)
    with pytest.raises(TypeError, match="SparseTensor or a RaggedTensor"):
        tco.vocab_embedding_lookup_sparse(table, tf.constant([["w1"]]), tf.zeros([30, 2]))
    with pytest.raises(ValueError, match="combiner"):
        tco.vocab_embedding_lookup_sparse(table, tf.SparseTensor([[0, 0]], ["w1"], [1, 1]), tf.zeros([30, 2]),
                                          combiner="max")


def test_bad_segments_are_an_error_not_a_crash():
    table = table_of(tf.constant(VOCAB))
    with pytest.raises(tf.errors.InvalidArgumentError, match="sorted|out of range|one value per id"):
        tco.vocab._ops.ctr_vocab_embedding_lookup(
            mask_keys=[], mask_ids=[], table_handle=table.resource_handle, default_value=tf.constant(-1, tf.int64), params=tf.zeros([30, 2]),
            keys=tf.constant(["w1", "w2"]), segments=tf.constant([5, 1], tf.int64), num_rows=tf.constant(2, tf.int64),
            weights=tf.zeros([0]), segment_kind="row_ids")
    with pytest.raises(tf.errors.InvalidArgumentError, match="row_splits"):
        tco.vocab._ops.ctr_vocab_embedding_lookup(
            mask_keys=[], mask_ids=[], table_handle=table.resource_handle, default_value=tf.constant(-1, tf.int64), params=tf.zeros([30, 2]),
            keys=tf.constant(["w1", "w2"]), segments=tf.constant([0, 3], tf.int64),
            num_rows=tf.constant(-1, tf.int64), weights=tf.zeros([0]), segment_kind="row_splits")
    # A missing key's error names its row, read off the segments: bad ones are the error, not a row of them.
    with pytest.raises(tf.errors.InvalidArgumentError, match="row_splits"):
        tco.vocab._ops.ctr_vocab_embedding_lookup(
            mask_keys=[], mask_ids=[], table_handle=table.resource_handle, default_value=tf.constant(-1, tf.int64),
            params=tf.zeros([30, 2]), keys=tf.constant(["w1", "nope", "w2", "w3"]),
            segments=tf.constant([5, -2, 3, 1, 0], tf.int64), num_rows=tf.constant(-1, tf.int64),
            weights=tf.zeros([0]), segment_kind="row_splits", missing_key="error", missing_id=-1)


def test_static_vocabulary_table_is_the_same_lookup(rng):
    # TF2's StaticVocabularyTable assigns its buckets as IdTableWithHashBuckets does.
    vocab = tf.constant(VOCAB)
    oov_table = tf.lookup.StaticVocabularyTable(
        tf.lookup.KeyValueTensorInitializer(vocab, tf.range(30, dtype=tf.int64)), num_oov_buckets=4)
    params = tf.constant(rng.normal(size=(34, 3)), tf.float32)
    keys = sparse_keys(rng, 25, VOCAB, missing=0.5)
    want = tf.nn.safe_embedding_lookup_sparse(params, oov_table.lookup(keys))
    got = tco.vocab_embedding_lookup_sparse(table_of(vocab), keys, params, num_oov_buckets=4)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)


# ---------------------------------------------------------------------------
# CtrVocabIndicator (tco.vocab_indicator): an indicator column's counts.


def native_indicator(table, sp_keys, depth, oov=0, dtype=tf.float32):
    """indicator_column's composition: find, SparseToDense(-1), OneHot, Sum."""
    finder = lookup_ops.IdTableWithHashBuckets(table, oov) if oov else table
    ids = tf.sparse.to_dense(finder.lookup(sp_keys), default_value=-1)
    return tf.reduce_sum(tf.one_hot(ids, depth, 1.0, 0.0, dtype=dtype), axis=-2)


@pytest.mark.parametrize("oov", [0, 2])
@pytest.mark.parametrize("key_type", ["string", "int64"])
@pytest.mark.parametrize("batch", [0, 1, 40, 3000])
def test_indicator_matches_one_hot_sum(rng, oov, key_type, batch):
    vocab, unknown = (VOCAB, "never-seen") if key_type == "string" else (INT_VOCAB, 12345)
    table = table_of(tf.constant(vocab))
    keys = sparse_keys(rng, batch, vocab, unknown=unknown)
    depth = len(vocab) + oov
    got = tco.vocab_indicator(table, keys, depth, num_oov_buckets=oov)
    np.testing.assert_array_equal(got.numpy(), native_indicator(table, keys, depth, oov).numpy())


@pytest.mark.parametrize("depth", [0, 5, 40])
def test_indicator_ids_past_the_depth_count_for_nothing(rng, depth):
    table = table_of(tf.constant(VOCAB))
    keys = sparse_keys(rng, 20, VOCAB)
    got = tco.vocab_indicator(table, keys, depth, num_oov_buckets=3, dtype=tf.float64)
    assert got.dtype == tf.float64 and got.shape == (20, depth)
    np.testing.assert_array_equal(got.numpy(), native_indicator(table, keys, depth, 3, tf.float64).numpy())


def test_indicator_repeated_keys_count_twice():
    table = table_of(tf.constant(VOCAB))
    keys = tf.SparseTensor([[0, 0], [0, 1], [0, 2], [2, 0]], ["w3", "w3", "zz", "w1"], [3, 4])
    got = tco.vocab_indicator(table, keys, 5).numpy()
    assert got[0, 3] == 2 and got[0].sum() == 2 and got[1].sum() == 0 and got[2, 1] == 1


@pytest.mark.parametrize("indices, message", [
    ([[0, 1], [0, 0]], r"indices\[1\] = \[0,0\] is out of order"),
    ([[0, 0], [0, 0]], r"indices\[1\] = \[0,0\] is repeated"),
    ([[0, 0], [2, 0]], r"indices\[1\] = \[2,0\] is out of bounds: need 0 <= index < \[2,3\]"),
    ([[0, 0], [1, -1]], r"indices\[1\] = \[1,-1\] is out of bounds"),
])
def test_indicator_rejects_indices_sparse_to_dense_rejects(indices, message):
    table = table_of(tf.constant(VOCAB))
    keys = tf.SparseTensor(indices, ["w1", "w2"], [2, 3])
    with pytest.raises(tf.errors.InvalidArgumentError):
        native_indicator(table, keys, 30)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        tco.vocab_indicator(table, keys, 30)


def test_indicator_bad_arguments():
    table = table_of(tf.constant(VOCAB))
    keys = tf.SparseTensor([[0, 0]], ["w1"], [1, 1])
    with pytest.raises(TypeError, match="SparseTensor"):
        tco.vocab_indicator(table, tf.ragged.constant([["w1"]]), 3)
    with pytest.raises(ValueError, match=">= 0"):
        tco.vocab_indicator(table, keys, -1)
    with pytest.raises(TypeError, match="key dtype"):
        tco.vocab_indicator(table, tf.SparseTensor([[0, 0]], tf.constant([1], tf.int64), [1, 1]), 3)
    op = tco.vocab._ops.ctr_vocab_indicator
    args = dict(table_handle=table.resource_handle, default_value=tf.constant(-1, tf.int64), depth=3, T=tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="indices must be"):
        op(keys=tf.constant(["w1", "w2"]), indices=tf.zeros([1, 2], tf.int64), dense_shape=tf.constant([1, 1], tf.int64),
           **args)
    with pytest.raises(tf.errors.InvalidArgumentError, match="must not be negative"):
        op(keys=tf.constant(["w1"]), indices=tf.zeros([1, 2], tf.int64), dense_shape=tf.constant([-1, 1], tf.int64),
           **args)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="dense_shape|rank"):
        op(keys=tf.constant(["w1"]), indices=tf.zeros([1, 2], tf.int64), dense_shape=tf.constant([1, 1, 1], tf.int64),
           **args)


def test_indicator_has_no_gradient_to_anything():
    table = table_of(tf.constant(VOCAB))
    keys = tf.SparseTensor([[0, 0]], ["w1"], [1, 1])
    x = tf.Variable(2.0)
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(tco.vocab_indicator(table, keys, 3) * x)
    assert float(tape.gradient(y, x)) == 1.0  # the count of w1, as a constant


# The Keras form (the rewrite's StringLookup / IntegerLookup + Embedding +
# GlobalAveragePooling1D over [B, L] keys): Keras' mask and OOV-slot rules,
# its num_oov_indices=0 check, Keras 3's negative-index wrap and
# Embedding(mask_zero=True)'s masked sum, against that composition.

def keras_ids(table, keys, mask=None, slots=0, start=1, oov_id=-1):
    ids = table.lookup(keys)
    if mask is not None:
        ids = tf.where(tf.equal(keys, mask), tf.constant(0, tf.int64), ids)
    if slots:
        slot = (tf.strings.to_hash_bucket_fast(keys, slots) if keys.dtype == tf.string
                else tf.math.floormod(keys, slots))
        ids = tf.where(tf.equal(ids, oov_id), slot + start, ids)
    return ids


def keras_pooling(params, ids, combiner, drop_zero):
    rows = tf.gather(params, tf.where(ids < 0, ids + tf.shape(params, out_type=tf.int64)[0], ids))
    if drop_zero:
        rows = tf.where(tf.expand_dims(ids != 0, -1), rows, tf.zeros_like(rows))
        return tf.reduce_sum(rows, axis=1)
    return tf.reduce_mean(rows, axis=1) if combiner == "mean" else tf.reduce_sum(rows, axis=1)


def fused_keras_pooling(table, keys, params, combiner, drop_zero, mask=None, slots=0, start=1, oov_id=-1,
                        missing_error=False, segment_type=tf.int64, default=-1):
    length = keys.shape[1]
    flat = tf.reshape(keys, [-1])
    splits = tf.range(0, tf.size(flat, out_type=segment_type) + 1, length)
    masks = [] if mask is None else [tf.constant(mask, keys.dtype)]
    return tco.ops._ops.ctr_vocab_embedding_lookup(
        table_handle=table.resource_handle, default_value=tf.constant(default, tf.int64), params=params, keys=flat,
        segments=splits, num_rows=tf.constant(-1, tf.int64), weights=tf.zeros([0]), mask_keys=masks,
        mask_ids=[tf.constant(0, tf.int64)] * len(masks), combiner="sum" if drop_zero else combiner,
        segment_kind="row_splits", missing_key="error" if missing_error else "default", missing_id=-1,
        oov_slots=slots, oov_id=oov_id, oov_start=start, wrap_negative_ids=True, drop_zero_ids=drop_zero)


@pytest.mark.parametrize("key_type", ["string", "int64"])
@pytest.mark.parametrize("masked, slots", [(False, 0), (True, 0), (False, 3), (True, 2)])
@pytest.mark.parametrize("combiner", ["sum", "mean"])
def test_keras_rules_and_masked_pooling_match_keras(rng, key_type, masked, slots, combiner):
    vocab, unknown, pad = (VOCAB, "never-seen", "") if key_type == "string" else (INT_VOCAB, 12345, 0)
    vocab = np.array([k for k in vocab if k != pad], dtype=object if key_type == "string" else np.int64)
    start = 1 + masked  # Keras' ids: mask 0, then the OOV slots, then the vocabulary
    first = start + max(slots, 1)
    init = tf.lookup.KeyValueTensorInitializer(tf.constant(vocab), tf.range(first, first + len(vocab),
                                                                            dtype=tf.int64))
    table = tf.lookup.StaticHashTable(init, -1 if slots else start)
    params = tf.Variable(rng.normal(size=(first + len(vocab), 3)).astype(np.float32))
    pool = np.array(list(vocab) + [unknown] + [pad] * 2, dtype=object if key_type == "string" else np.int64)
    for batch in (0, 1, 37):
        keys = tf.constant(pool[rng.integers(0, len(pool), size=(batch, 5))])
        mask = pad if masked else None
        oov_id = -1 if slots else start
        with tf.GradientTape(persistent=True) as tape:
            got, ids = fused_keras_pooling(table, keys, params, combiner, masked, mask, slots, start, oov_id,
                                           default=-1 if slots else start)
            want_ids = keras_ids(table, keys, mask, slots, start, oov_id)
            want = keras_pooling(params, want_ids, combiner, masked)
            loss_got, loss_want = tf.reduce_sum(got * got), tf.reduce_sum(want * want)
        np.testing.assert_array_equal(tf.reshape(ids, [batch, 5]).numpy(), want_ids.numpy())
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
        g_got, g_want = tape.gradient(loss_got, params), tape.gradient(loss_want, params)
        np.testing.assert_allclose(tf.convert_to_tensor(g_got).numpy(), tf.convert_to_tensor(g_want).numpy(),
                                   rtol=1e-5, atol=1e-6)


def test_masked_ids_are_dropped_not_added_as_zero_times_a_row(rng):
    # The Select keeps a row of inf out of the masked sum; so must the fused op.
    table = table_of(tf.constant(VOCAB))
    params = tf.Variable(np.concatenate([np.full((1, 2), np.inf), rng.normal(size=(len(VOCAB), 2))]), dtype=tf.float32)
    init = tf.lookup.KeyValueTensorInitializer(tf.constant(VOCAB), tf.range(1, len(VOCAB) + 1, dtype=tf.int64))
    table = tf.lookup.StaticHashTable(init, 0)
    keys = tf.constant([["w1", "", "w2"], ["", "", ""]])
    got, _ = fused_keras_pooling(table, keys, params, "sum", True, mask="", oov_id=0, default=0)
    want = keras_pooling(params, keras_ids(table, keys, mask=""), "sum", True)
    assert np.isfinite(got.numpy()).all()
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)


def test_keras_missing_key_names_its_bag_and_wrap_errors_name_the_id(rng):
    init = tf.lookup.KeyValueTensorInitializer(tf.constant(VOCAB), tf.range(0, len(VOCAB), dtype=tf.int64))
    table = tf.lookup.StaticHashTable(init, -1)
    params = tf.constant(rng.normal(size=(len(VOCAB), 2)), tf.float32)
    keys = tf.constant([["w1", "w2"], ["w3", "nope"]])
    for segment_type in (tf.int32, tf.int64):
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"key 'nope' in row 1 is not in the vocabulary"):
            fused_keras_pooling(table, keys, params, "sum", False, missing_error=True, segment_type=segment_type)
    # Without the check the default -1 wraps to the last row, as Keras 3's
    # take() does, in the gradient too.
    table_var = tf.Variable(params)
    with tf.GradientTape(persistent=True) as tape:
        got, ids = fused_keras_pooling(table, keys, table_var, "sum", False)
        want = keras_pooling(table_var, keras_ids(table, keys), "sum", False)
        loss_got, loss_want = tf.reduce_sum(got * got), tf.reduce_sum(want * want)
    assert ids.numpy().tolist() == [1, 2, 3, -1]
    np.testing.assert_allclose(got.numpy()[1], (params[3] + params[len(VOCAB) - 1]).numpy(), rtol=1e-6)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)
    grads = [tf.convert_to_tensor(tape.gradient(loss, table_var)).numpy() for loss in (loss_got, loss_want)]
    assert np.abs(grads[1][len(VOCAB) - 1]).sum() > 0
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-6)
    # A table value below -V stays out of range after the wrap: an error naming the key and the wrapped id.
    init = tf.lookup.KeyValueTensorInitializer(tf.constant(["a", "b"]), tf.constant([0, -100], tf.int64))
    bad = tf.lookup.StaticHashTable(init, -1)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"id -70 of key 'b' in row 1 is out of range \[0, 30\)"):
        fused_keras_pooling(bad, tf.constant([["a"], ["b"]]), params, "sum", False)


def test_drop_zero_ids_refuses_weights():
    table = table_of(tf.constant(VOCAB))
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="drop_zero_ids needs has_weights false"):
        tco.ops._ops.ctr_vocab_embedding_lookup(
            table_handle=table.resource_handle, default_value=tf.constant(-1, tf.int64),
            params=tf.zeros([30, 2]), keys=tf.constant(["w1"]), segments=tf.constant([0, 1], tf.int64),
            num_rows=tf.constant(-1, tf.int64), weights=tf.ones([1]), mask_keys=[], mask_ids=[],
            segment_kind="row_splits", has_weights=True, drop_zero_ids=True)

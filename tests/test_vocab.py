"""CtrVocabEmbedding against the TF composition it replaces,
tf.gather(params, table.lookup(keys)) (with Keras' vocabulary check and
negative-index wrap where asked), forward and gradient."""

import numpy as np
import pytest
import tensorflow as tf

import tf_ctr_ops as tco

VOCAB = [f"w{i}" for i in range(40)]


def string_table(default=-1, values=None):
    values = np.arange(len(VOCAB)) if values is None else values
    init = tf.lookup.KeyValueTensorInitializer(VOCAB, tf.constant(values, tf.int64))
    return tf.lookup.StaticHashTable(init, default)


def int_table(default=-1):
    keys = tf.constant(np.arange(0, 400, 10), tf.int64)
    init = tf.lookup.KeyValueTensorInitializer(keys, tf.range(40, dtype=tf.int64))
    return tf.lookup.StaticHashTable(init, default)


def native(table, keys, params, wrap=False):
    ids = table.lookup(keys)
    if wrap:
        ids = tf.where(ids < 0, ids + tf.shape(params, out_type=tf.int64)[0], ids)
    return tf.gather(params, ids)


def string_keys(rng, shape, oov=0.0):
    keys = np.array(VOCAB, object)[rng.integers(0, len(VOCAB), size=shape)]
    keys[rng.random(shape) < oov] = "not-a-word"
    return keys


@pytest.mark.parametrize("shape", [(0,), (7,), (6, 1), (5, 3), (2, 3, 2), ()])
@pytest.mark.parametrize("dtype", [tf.float32, tf.float64, tf.float16, tf.bfloat16])
def test_matches_gather_of_lookup(rng, shape, dtype):
    table = string_table(default=0)
    params = tf.constant(rng.normal(size=(40, 6)), dtype)
    keys = tf.constant(string_keys(rng, shape, oov=0.3) if shape else np.array("w3", object))
    got = tco.vocab_embedding(table, keys, params)
    assert got.shape == tuple(shape) + (6,)
    want = native(table, keys, params)
    np.testing.assert_array_equal(got.numpy().astype(np.float32), want.numpy().astype(np.float32))


def test_integer_keys_in_any_table_type(rng):
    params = tf.constant(rng.normal(size=(40, 3, 2)), tf.float32)  # rows of any rank
    keys = tf.constant(rng.integers(-20, 420, size=(50, 2)), tf.int64)
    dense = tf.lookup.experimental.DenseHashTable(tf.int64, tf.int64, default_value=39, empty_key=-1000,
                                                  deleted_key=-1001)
    dense.insert(tf.constant(np.arange(0, 400, 10), tf.int64), tf.range(40, dtype=tf.int64))
    np.testing.assert_array_equal(tco.vocab_embedding(int_table(39), keys, params), native(int_table(39), keys, params))
    flat = tf.reshape(keys, [-1])  # a DenseHashTable finds vectors of keys
    np.testing.assert_array_equal(tco.vocab_embedding(dense, flat, params), native(dense, flat, params))


def test_large_batch(rng):
    table = string_table(default=5)
    params = tf.constant(rng.normal(size=(40, 16)), tf.float32)
    keys = tf.constant(string_keys(rng, (200_000,), oov=0.1))
    np.testing.assert_array_equal(tco.vocab_embedding(table, keys, params), native(table, keys, params))


def test_missing_key_error_names_the_key_and_its_row(rng):
    table = string_table()
    params = tf.constant(rng.normal(size=(40, 4)), tf.float32)
    keys = tf.constant(np.array([["w1"], ["w2"], [""], ["zz"]], object))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"key '' in row 2 is not in the vocabulary"):
        tco.vocab_embedding(table, keys, params, missing_key="error")
    ok = tf.constant(np.array([["w1"], ["w39"]], object))
    got = tco.vocab_embedding(table, ok, params, missing_key="error")
    np.testing.assert_array_equal(got, native(table, ok, params))


def test_missing_key_error_needs_a_constant_default():
    with pytest.raises(ValueError, match="missing_key"):
        tco.vocab_embedding(string_table(), ["w1"], tf.zeros([40, 2]), missing_key="maybe")


def test_out_of_range_id_is_an_error_naming_key_id_and_row(rng):
    params = tf.constant(rng.normal(size=(40, 4)), tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"id -1 of key 'zz' in row 1 is out of range \[0, 40\)"):
        tco.vocab_embedding(string_table(), tf.constant(["w0", "zz"]), params)
    small = tf.constant(rng.normal(size=(10, 4)), tf.float32)  # ids up to 39 into 10 rows
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"id 12 of key 'w12' in row 0 is out of range \[0, 10\)"):
        tco.vocab_embedding(string_table(), tf.constant(["w12", "w1"]), small)


def test_negative_ids_wrap_as_keras_take(rng):
    values = np.arange(len(VOCAB)) - 20  # ids -20..19
    table = string_table(default=-40, values=values)
    params = tf.constant(rng.normal(size=(40, 4)), tf.float32)
    keys = tf.constant(string_keys(rng, (64,), oov=0.2))
    got = tco.vocab_embedding(table, keys, params, wrap_negative_ids=True)
    np.testing.assert_array_equal(got, native(table, keys, params, wrap=True))
    with pytest.raises(tf.errors.InvalidArgumentError, match="out of range"):
        tco.vocab_embedding(string_table(default=-41, values=values), tf.constant(["zz"]), params,
                            wrap_negative_ids=True)


def test_key_dtype_must_match_the_table():
    with pytest.raises(TypeError, match="key dtype"):
        tco.vocab_embedding(string_table(), tf.constant([1], tf.int64), tf.zeros([40, 2]))


def test_gradient_is_indexed_slices_of_the_rows_read(rng):
    table = string_table(default=3)
    var = tf.Variable(rng.normal(size=(40, 5)).astype(np.float32))
    keys = tf.constant(string_keys(rng, (30, 2), oov=0.2))  # repeated keys and OOV: rows add up
    upstream = tf.constant(rng.normal(size=(30, 2, 5)), tf.float32)
    grads = []
    for fn in (tco.vocab_embedding, native):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(fn(table, keys, var) * upstream)
        grads.append(tape.gradient(loss, var))
    assert isinstance(grads[0], tf.IndexedSlices)
    np.testing.assert_allclose(tf.convert_to_tensor(grads[0]), tf.convert_to_tensor(grads[1]), rtol=1e-6, atol=1e-6)


def test_in_a_tf_function_and_empty_batch(rng):
    table = string_table(default=0)
    params = tf.constant(rng.normal(size=(40, 4)), tf.float32)

    @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.string)])
    def serve(keys):
        return tco.vocab_embedding(table, keys, params, missing_key="default")

    for n in (0, 1, 9):
        keys = tf.constant(string_keys(rng, (n, 1), oov=0.5).reshape(n, 1))
        np.testing.assert_array_equal(serve(keys), native(table, keys, params))

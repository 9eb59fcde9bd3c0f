"""CtrVocabMultiHot against the TF composition it replaces: a Dense layer's
MatMul over the multi-hot (or count) encoding of a vocabulary lookup's ids,
tf.matmul(tf.math.bincount(table.lookup(keys), depth, binary_output, axis=-1),
kernel), forward and gradient."""

import numpy as np
import pytest
import tensorflow as tf

import tf_ctr_ops as tco

VOCAB = [f"w{i}" for i in range(40)]


def string_table(values=None, default=-1):
    values = np.arange(len(VOCAB)) if values is None else values
    init = tf.lookup.KeyValueTensorInitializer(VOCAB, tf.constant(values, tf.int64))
    return tf.lookup.StaticHashTable(init, default)


def int_table(default=-1):
    keys = tf.constant(np.arange(0, 400, 10), tf.int64)
    return tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(keys, tf.range(40, dtype=tf.int64)), default)


def native(table, keys, kernel, binary=True):
    depth = tf.shape(kernel, out_type=tf.int64)[0]
    hot = tf.math.bincount(table.lookup(keys), minlength=depth, maxlength=depth, binary_output=binary, axis=-1,
                           dtype=kernel.dtype)
    return tf.matmul(hot, kernel)


def string_keys(rng, shape, oov=0.0):
    keys = np.array(VOCAB, object)[rng.integers(0, len(VOCAB), size=shape)]
    keys[rng.random(shape) < oov] = "not-a-word"
    return keys


@pytest.mark.parametrize("shape", [(0, 3), (7, 1), (5, 3), (4, 0), (9, 12)])
@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
def test_matches_matmul_of_bincount(rng, shape, binary, dtype):
    table = string_table(default=40)  # OOV keys: id 40, the kernel's OOV row
    kernel = tf.constant(rng.normal(size=(41, 6)), dtype)
    keys = tf.constant(string_keys(rng, shape, oov=0.2))
    got = tco.vocab_multi_hot(table, keys, kernel, binary_output=binary)
    assert got.shape == (shape[0], 6) and got.dtype == dtype
    np.testing.assert_allclose(got, native(table, keys, kernel, binary), rtol=1e-6, atol=1e-6)


def test_repeated_ids_count_once_or_by_their_count():
    table = string_table()
    kernel = tf.constant(np.arange(40 * 2, dtype=np.float32).reshape(40, 2))
    keys = tf.constant([["w3", "w3", "w1", "w3"], ["w0", "w0", "w0", "w0"]])
    np.testing.assert_array_equal(tco.vocab_multi_hot(table, keys, kernel), [[8, 10], [0, 1]])
    np.testing.assert_array_equal(tco.vocab_multi_hot(table, keys, kernel, binary_output=False), [[20, 24], [0, 4]])


def test_ids_past_the_kernel_count_for_nothing(rng):
    # A table whose ids run past the kernel's rows: the bincount drops them.
    table = string_table(values=np.arange(len(VOCAB)) * 3)
    kernel = tf.constant(rng.normal(size=(50, 4)), tf.float32)
    keys = tf.constant(string_keys(rng, (30, 5)))
    for binary in (True, False):
        np.testing.assert_allclose(tco.vocab_multi_hot(table, keys, kernel, binary_output=binary),
                                   native(table, keys, kernel, binary), rtol=1e-6, atol=1e-6)


def test_integer_keys_and_large_batch(rng):
    table = int_table(default=39)
    kernel = tf.constant(rng.normal(size=(40, 8)), tf.float32)
    keys = tf.constant(rng.integers(-20, 420, size=(100_000, 4)), tf.int64)
    np.testing.assert_allclose(tco.vocab_multi_hot(table, keys, kernel), native(table, keys, kernel),
                               rtol=1e-6, atol=1e-6)


def test_negative_id_is_an_error_naming_key_id_and_row(rng):
    table = string_table()  # a missing key's default, -1
    kernel = tf.constant(rng.normal(size=(40, 4)), tf.float32)
    keys = tf.constant([["w1", "w2"], ["w3", "oops"]])
    with pytest.raises(tf.errors.InvalidArgumentError, match="non-negative"):
        native(table, keys, kernel)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"id -1 of key 'oops' in row 1 is negative"):
        tco.vocab_multi_hot(table, keys, kernel)


def test_missing_key_error_names_the_key_and_its_row(rng):
    table = string_table()
    kernel = tf.constant(rng.normal(size=(40, 4)), tf.float32)
    keys = tf.constant([["w1", "w2"], ["w3", "w4"], ["zz", "w0"]])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"key 'zz' in row 2 is not in the vocabulary"):
        tco.vocab_multi_hot(table, keys, kernel, missing_key="error")
    ok = keys[:2]
    np.testing.assert_allclose(tco.vocab_multi_hot(table, ok, kernel, missing_key="error"),
                               native(table, ok, kernel), rtol=1e-6)


def test_bad_arguments_are_clear_errors(rng):
    kernel = tf.constant(rng.normal(size=(40, 4)), tf.float32)
    with pytest.raises(TypeError, match="key dtype"):
        tco.vocab_multi_hot(string_table(), tf.constant([[1]], tf.int64), kernel)
    with pytest.raises(ValueError, match=r"\[B, L\] matrix"):
        tco.vocab_multi_hot(string_table(), tf.constant(["w1"]), kernel)
    with pytest.raises(ValueError, match="missing_key"):
        tco.vocab_multi_hot(string_table(), tf.constant([["w1"]]), kernel, missing_key="skip")
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="rank|matrix"):
        tco.vocab_multi_hot(string_table(), tf.constant([["w1"]]), tf.zeros([40]))


@pytest.mark.parametrize("binary", [True, False])
def test_gradient_is_matmuls(rng, binary):
    table = string_table(default=40)
    kernel = tf.Variable(rng.normal(size=(41, 3)).astype(np.float32))
    keys = tf.constant(string_keys(rng, (11, 4), oov=0.2))
    upstream = tf.constant(rng.normal(size=(11, 3)).astype(np.float32))
    grads = []
    for fn in (lambda: tco.vocab_multi_hot(table, keys, kernel, binary_output=binary),
               lambda: native(table, keys, kernel, binary)):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(fn() * upstream)
        grads.append(tf.convert_to_tensor(tape.gradient(loss, kernel)).numpy())
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-6, atol=1e-6)


def test_in_a_tf_function_with_unknown_batch(rng):
    table = string_table(default=40)
    kernel = tf.constant(rng.normal(size=(41, 5)), tf.float32)
    fn = tf.function(lambda k: tco.vocab_multi_hot(table, k, kernel),
                     input_signature=[tf.TensorSpec([None, None], tf.string)])
    for shape in ((0, 2), (3, 3), (1, 7)):
        keys = tf.constant(string_keys(rng, shape, oov=0.3))
        np.testing.assert_allclose(fn(keys), native(table, keys, kernel), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.int32])
def test_half_or_integer_kernels_and_indicators_are_type_errors(dtype):
    # TF's raw "Value for attr 'T' of half is not in the list of allowed values".
    kernel = tf.zeros([40, 4], dtype)
    with pytest.raises(TypeError, match=f"kernel must be float32 or float64, got {dtype.name}"):
        tco.vocab_multi_hot(string_table(), tf.constant([["w1"]]), kernel)
    with pytest.raises(TypeError, match=f"kernel must be float32 or float64, got {dtype.name}"):
        tco.multi_hot_dense([(tf.constant([[1]]), 40)], kernel)
    keys = tf.SparseTensor([[0, 0]], tf.constant(["w1"]), [1, 1])
    with pytest.raises(TypeError, match=f"dtype must be float32 or float64, got {dtype.name}"):
        tco.vocab_indicator(string_table(), keys, 40, dtype=dtype)
    assert tco.vocab_indicator(string_table(), keys, 40, dtype=tf.float64).dtype == tf.float64

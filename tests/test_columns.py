"""The feature-column ops against the TF compositions they replace, forward
and gradient, their ids bit for bit:

- CtrCrossEmbeddingLookup (tco.cross_embedding_lookup):
  tf.nn.safe_embedding_lookup_sparse over the ids of tf.sparse.cross_hashed
  (a crossed_column under a linear model or an embedding column);
- CtrBucketizeEmbeddingLookup (tco.bucketized_embedding_lookup): the same
  over the SparseTensor of Bucketize's ids a bucketized_column builds."""

import csv

import numpy as np
import pytest
import tensorflow as tf

import tf_ctr_ops as tco
from tf_ctr_ops import columns as cross
from conftest import data_file, random_sparse

WORDS = ["", "a", "bb", "ccc", "a much longer feature value, past sixteen bytes", "é"]


def native(params, inputs, buckets, hash_key=None, combiner="mean", default_id=None, max_norm=None):
    ids = tf.sparse.cross_hashed(inputs, buckets, hash_key=hash_key)
    return tf.nn.safe_embedding_lookup_sparse(params, ids, None, combiner=combiner, default_id=default_id,
                                              max_norm=max_norm)


def crossed_ids(inputs, buckets, hash_key=None):
    """The fused op's ids and row splits, through its raw wrapper."""
    sparse = [i for i in inputs if isinstance(i, tf.SparseTensor)]
    dense = [i for i in inputs if not isinstance(i, tf.SparseTensor)]
    _, ids, splits, shape = cross._ops.ctr_cross_embedding_lookup(
        params=tf.zeros([buckets, 1]), indices=[s.indices for s in sparse],
        values=[cross._crossable(s.values) for s in sparse], shapes=[s.dense_shape for s in sparse],
        dense_inputs=[cross._crossable(d) for d in dense], num_buckets=buckets,
        hash_key=cross.DEFAULT_HASH_KEY if hash_key is None else hash_key)
    return ids, splits, shape


def assert_same_params_gradient(rng, params, fused, native):
    """The fused lookup's gradient reaches `params` as IndexedSlices equal to the native composition's."""
    out_shape = fused().shape
    upstream = tf.constant(rng.normal(size=out_shape), tf.float32)
    grads = []
    for fn in (fused, native):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(fn() * upstream)
        g = tape.gradient(loss, params)
        assert isinstance(g, tf.IndexedSlices)
        grads.append(g)
    # The same rows in the same order (an optimizer such as Adagrad updates
    # each row it is given), in the same dtype, and the same values.
    assert grads[0].indices.dtype == grads[1].indices.dtype
    np.testing.assert_array_equal(grads[0].indices.numpy(), grads[1].indices.numpy())
    np.testing.assert_allclose(grads[0].values.numpy(), grads[1].values.numpy(), rtol=1e-5, atol=1e-6)


def sparse_features(rng, batch, width, make, empty_rows=0.2):
    """[batch, width] features in row-major order, some rows left empty."""
    return random_sparse(rng, batch, width, make, empty_rows=empty_rows)


def strings(rng):
    return WORDS[rng.integers(0, len(WORDS))] if rng.random() < 0.5 else f"v{rng.integers(0, 1000)}"


def ints(rng):
    return int(rng.integers(-(2**62), 2**62)) if rng.random() < 0.3 else int(rng.integers(-5, 50))


def mixed_inputs(rng, batch):
    return [sparse_features(rng, batch, 3, strings), sparse_features(rng, batch, 2, ints),
            tf.constant(rng.integers(-3, 9, size=(batch, 2)), tf.int64),
            tf.constant(np.array([strings(rng) for _ in range(batch)], object).reshape(batch, 1), tf.string)]


@pytest.mark.parametrize("batch", [0, 1, 7, 300])
@pytest.mark.parametrize("hash_key", [None, 7, 2**63 + 5])
def test_ids_are_sparse_cross_hashed_bit_for_bit(rng, batch, hash_key):
    inputs = mixed_inputs(rng, batch)
    buckets = 1_000_003
    key = None if hash_key is None else (hash_key - 2**64 if hash_key >= 2**63 else hash_key)
    want = tf.sparse.cross_hashed(inputs, buckets, hash_key=key)
    ids, splits, shape = crossed_ids(inputs, buckets, key)
    np.testing.assert_array_equal(ids.numpy(), want.values.numpy())
    np.testing.assert_array_equal(shape.numpy(), want.dense_shape.numpy())
    rows = np.repeat(np.arange(batch), np.diff(splits.numpy()))
    np.testing.assert_array_equal(rows, want.indices.numpy()[:, 0])


@pytest.mark.parametrize("make", [
    lambda rng: tf.constant(rng.uniform(-3, 9, size=(6, 2)), tf.float32),
    lambda rng: tf.constant(rng.uniform(-3, 9, size=(6, 1)), tf.float64),
    lambda rng: tf.constant(rng.random((6, 2)) < 0.5),
    lambda rng: tf.sparse.from_dense(tf.constant(rng.uniform(0.5, 4, size=(6, 3)), tf.float32)),
], ids=["float32", "float64", "bool", "sparse-float"])
def test_float_and_bool_features_cross_as_int64_as_in_cross_hashed(rng, make):
    # cross_hashed casts every non-string input to int64 (1.5 crosses as 1);
    # these were a TypeError.
    inputs = [sparse_features(rng, 6, 3, strings), make(rng)]
    params = tf.constant(rng.normal(size=(97, 3)), tf.float32)
    want = tf.nn.safe_embedding_lookup_sparse(params, tf.sparse.cross_hashed(inputs, 97), None, combiner="sum")
    got = tco.cross_embedding_lookup(params, inputs, 97, combiner="sum")
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-6)


def test_bad_shapes_fail_with_sparse_crosss_words():
    # TF's sparse_cross_op_test matches these; a ValueError of our own
    # words came first for the first two.
    a = tf.SparseTensor([[0, 0], [1, 0]], ["x", "y"], [2, 1])
    params = tf.zeros([10, 2])
    with pytest.raises(tf.errors.InvalidArgumentError, match="Expected D2 of index to be 2"):
        tco.cross_embedding_lookup(params, [a, tf.SparseTensor([[0], [1]], [0, 1], [3])], 10)
    with pytest.raises(tf.errors.InvalidArgumentError, match="Dense inputs should be a matrix"):
        tco.cross_embedding_lookup(params, [a, tf.constant([1, 2], tf.int64)], 10)
    with pytest.raises(tf.errors.InvalidArgumentError, match="Expected batch size 2 got 3"):
        tco.cross_embedding_lookup(params, [a, tf.constant([[1], [2], [3]], tf.int64)], 10)
    with pytest.raises(tf.errors.InvalidArgumentError, match="Expected batch size 2 got 7"):
        tco.cross_embedding_lookup(params, [a, tf.SparseTensor([[0, 0]], ["z"], [7, 1])], 10)


def test_hash_key_zero_is_tfs_default_key_as_in_cross_hashed(rng):
    inputs = mixed_inputs(rng, 9)
    params = tf.constant(rng.normal(size=(101, 3)), tf.float32)
    want = tf.nn.safe_embedding_lookup_sparse(params, tf.sparse.cross_hashed(inputs, 101, hash_key=0), None)
    got = tco.cross_embedding_lookup(params, inputs, 101, hash_key=0)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-6)


def test_hash_keys_outside_int64_are_overflow_errors_as_in_cross_hashed(rng):
    inputs = mixed_inputs(rng, 9)
    params = tf.constant(rng.normal(size=(101, 3)), tf.float32)
    for key in (2**63, 2**64 + 3, -(2**63) - 1):
        with pytest.raises(OverflowError):
            tf.sparse.cross_hashed(inputs, 101, hash_key=key)
        with pytest.raises(OverflowError, match="hash_key must fit in int64"):
            tco.cross_embedding_lookup(params, inputs, 101, hash_key=key)
    for key in (-(2**63), -5, 2**63 - 1):
        np.testing.assert_allclose(tco.cross_embedding_lookup(params, inputs, 101, hash_key=key).numpy(),
                                   native(params, inputs, 101, hash_key=key).numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("kinds", ["strings", "ints", "mixed"])
def test_matches_safe_lookup_of_the_crossed_ids(rng, combiner, kinds):
    batch, buckets = 200, 97
    if kinds == "strings":
        inputs = [sparse_features(rng, batch, 3, strings), sparse_features(rng, batch, 2, strings)]
    elif kinds == "ints":
        inputs = [sparse_features(rng, batch, 2, ints), tf.constant(rng.integers(0, 5, (batch, 1)), tf.int32)]
    else:
        inputs = mixed_inputs(rng, batch)
    params = tf.constant(rng.normal(size=(buckets, 6)), tf.float32)
    got = tco.cross_embedding_lookup(params, inputs, buckets, combiner=combiner)
    want = native(params, inputs, buckets, combiner=combiner)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [tf.float64, tf.float16, tf.bfloat16])
def test_default_id_max_norm_and_dtypes(rng, dtype):
    batch, buckets = 60, 50
    inputs = [sparse_features(rng, batch, 2, strings, empty_rows=0.4), sparse_features(rng, batch, 3, ints)]
    params = tf.constant(rng.normal(size=(buckets, 4)) * 3, dtype)
    got = tco.cross_embedding_lookup(params, inputs, buckets, combiner="sqrtn", default_id=4, max_norm=1.5)
    want = native(tf.cast(params, tf.float32), inputs, buckets, combiner="sqrtn", default_id=4, max_norm=1.5)
    assert got.dtype == dtype
    tol = 1e-6 if dtype == tf.float64 else 2e-2
    np.testing.assert_allclose(tf.cast(got, tf.float32).numpy(), want.numpy(), rtol=tol, atol=tol)


@pytest.mark.parametrize("default_id", [50, 77])
def test_a_default_id_past_the_buckets_fails_only_on_an_empty_row(rng, default_id):
    batch, buckets = 20, 50
    params = tf.constant(rng.normal(size=(buckets, 4)), tf.float32)
    full = [sparse_features(rng, batch, 2, strings, empty_rows=0.0),
            sparse_features(rng, batch, 3, ints, empty_rows=0.0)]
    np.testing.assert_allclose(tco.cross_embedding_lookup(params, full, buckets, default_id=default_id).numpy(),
                               native(params, full, buckets, default_id=default_id).numpy(), rtol=1e-5, atol=1e-6)
    gaps = [sparse_features(rng, batch, 2, strings, empty_rows=0.4), full[1]]
    with pytest.raises(tf.errors.InvalidArgumentError):
        native(params, gaps, buckets, default_id=default_id)
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"default_id {default_id} for empty row \\d+ is out"):
        tco.cross_embedding_lookup(params, gaps, buckets, default_id=default_id)


def test_rows_missing_a_feature_pool_to_zeros(rng):
    a = tf.SparseTensor([[0, 0], [2, 0]], ["x", "y"], [3, 1])
    b = tf.SparseTensor([[0, 0], [1, 0], [1, 1]], tf.constant([1, 2, 3], tf.int64), [3, 2])
    params = tf.constant(rng.normal(size=(10, 3)), tf.float32)
    got = tco.cross_embedding_lookup(params, [a, b], 10, combiner="sum").numpy()
    np.testing.assert_array_equal(got[1:], np.zeros((2, 3), np.float32))  # row 1 lacks a, row 2 lacks b
    np.testing.assert_allclose(got, native(params, [a, b], 10, combiner="sum").numpy(), rtol=1e-6)


def test_entries_out_of_row_order_are_skipped_as_sparse_cross_skips_them(rng):
    # SparseCross walks each input's rows in order: an entry of an earlier row
    # after a later one is in no row, and neither is a row past the batch.
    a = tf.SparseTensor([[0, 0], [2, 0], [1, 0], [5, 0]], ["p", "q", "r", "s"], [3, 1])
    b = tf.constant([["u"], ["v"], ["w"]])
    ids, splits, _ = crossed_ids([a, b], 100)
    want = tf.sparse.cross_hashed([a, b], 100)
    np.testing.assert_array_equal(ids.numpy(), want.values.numpy())
    np.testing.assert_array_equal(splits.numpy(), [0, 1, 1, 2])


def test_gradients_match(rng):
    batch, buckets = 80, 40
    inputs = [sparse_features(rng, batch, 3, strings), sparse_features(rng, batch, 2, ints)]
    params = tf.Variable(rng.normal(size=(buckets, 5)), dtype=tf.float32)
    assert_same_params_gradient(
        rng, params, lambda: tco.cross_embedding_lookup(params, inputs, buckets, combiner="sqrtn", max_norm=2.0),
        lambda: native(params, inputs, buckets, combiner="sqrtn", max_norm=2.0))


def test_trains_in_a_tf_function_with_keras_optimizer(rng):
    batch, buckets = 32, 20
    inputs = [sparse_features(rng, batch, 2, strings, empty_rows=0), sparse_features(rng, batch, 2, ints, 0)]
    params = tf.Variable(tf.zeros([buckets, 1]))
    opt = tf.keras.optimizers.SGD(0.5)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((tco.cross_embedding_lookup(params, inputs, buckets, combiner="sum") - 1.0) ** 2)
        opt.apply_gradients([(tape.gradient(loss, params), params)])
        return loss

    first = float(step())
    for _ in range(20):
        last = float(step())
    assert last < first / 10


def test_large_batch(rng):
    batch, buckets = 20_000, 1000
    inputs = [sparse_features(rng, batch, 3, strings, 0.05), tf.constant(rng.integers(0, 7, (batch, 1)))]
    params = tf.constant(rng.normal(size=(buckets, 8)), tf.float32)
    got = tco.cross_embedding_lookup(params, inputs, buckets)
    np.testing.assert_allclose(got.numpy(), native(params, inputs, buckets).numpy(), rtol=1e-5, atol=1e-6)


def test_real_avazu_crosses(rng):
    """Site x app x device model crosses of real Avazu rows, as a wide model takes them."""
    with open(data_file("avazu_sample.txt"), newline="") as f:
        rows = list(csv.DictReader(f))[:2000]
    buckets = 10_000
    site = tf.constant([[r["site_id"]] for r in rows])
    app = tf.constant([[r["app_id"]] for r in rows])
    model = tf.constant([[r["device_model"]] for r in rows])
    hour = tf.constant([[int(r["hour"]) % 100] for r in rows], tf.int64)
    inputs = [tf.sparse.from_dense(site), app, model, hour]
    params = tf.constant(rng.normal(size=(buckets, 8)), tf.float32)
    got = tco.cross_embedding_lookup(params, inputs, buckets, combiner="sum")
    np.testing.assert_allclose(got.numpy(), native(params, inputs, buckets, combiner="sum").numpy(),
                               rtol=1e-5, atol=1e-6)
    ids, _, _ = crossed_ids(inputs, buckets)
    np.testing.assert_array_equal(ids.numpy(), tf.sparse.cross_hashed(inputs, buckets).values.numpy())


def test_id_past_the_table_names_the_id_and_row(rng):
    a = tf.SparseTensor([[0, 0], [1, 0]], ["x", "y"], [2, 1])
    params = tf.zeros([3, 2])
    want = tf.sparse.cross_hashed([a], 1000).values.numpy()
    bad_row = int(np.argmax(want >= 3))
    assert want[bad_row] >= 3
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"crossed id {want[bad_row]} in row {bad_row} is out"):
        tco.cross_embedding_lookup(params, [a], 1000)


@pytest.mark.parametrize("case, message", [
    ("batch", "sparse input 1 has batch size 3, expected 2"),
    ("dense_batch", "dense input 0 has batch size 5, expected 2"),
    ("values", "values of sparse input 0 must be"),
    ("indices", "indices of sparse input 0 must be"),
    ("shape", "dense_shape of sparse input 0 must be"),
    ("negative", "batch size"),
])
def test_bad_inputs_are_errors_not_crashes(case, message):
    idx = tf.constant([[0, 0], [1, 0]], tf.int64)
    vals = tf.constant(["x", "y"])
    shape = tf.constant([2, 1], tf.int64)
    other = (tf.constant([[0, 0]], tf.int64), tf.constant(["z"]), tf.constant([2, 1], tf.int64))
    dense = []
    if case == "batch":
        other = (other[0], other[1], tf.constant([3, 1], tf.int64))
    elif case == "dense_batch":
        dense = [tf.constant([["d"]] * 5)]
    elif case == "values":
        vals = tf.constant(["x"])
    elif case == "indices":
        idx = tf.constant([[0], [1]], tf.int64)
    elif case == "shape":
        shape = tf.constant([2, 1, 1], tf.int64)
    elif case == "negative":
        shape = tf.constant([-4, 1], tf.int64)
        other = (other[0], other[1], tf.constant([-4, 1], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        cross._ops.ctr_cross_embedding_lookup(
            params=tf.zeros([10, 2]), indices=[idx, other[0]], values=[vals, other[1]], shapes=[shape, other[2]],
            dense_inputs=dense, num_buckets=10, hash_key=1)


def test_ragged_features_are_refused_as_cross_hashed_refuses_them():
    # Converted as a dense tensor, a RaggedTensor met "object of type
    # 'RaggedTensor' has no len()".
    features = [tf.ragged.constant([["a"], []]), tf.constant([["x"], ["y"]])]
    with pytest.raises(TypeError):
        tf.sparse.cross_hashed(features, 10)
    with pytest.raises(TypeError, match="input 0 is a RaggedTensor"):
        tco.cross_embedding_lookup(tf.ones([10, 2]), features, 10)


def test_too_many_crosses_is_an_error_not_a_crash():
    # One row with 2^21 features in each of three inputs: 2^63 crosses.
    n = 1 << 21
    idx = tf.stack([tf.zeros([n], tf.int64), tf.range(n, dtype=tf.int64)], axis=1)
    vals = tf.zeros([n], tf.int64)
    shape = tf.constant([1, n], tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match="row 0 has more crosses than fit in int64"):
        cross._ops.ctr_cross_embedding_lookup(
            params=tf.zeros([10, 2]), indices=[idx] * 3, values=[vals] * 3, shapes=[shape] * 3, dense_inputs=[],
            num_buckets=10, hash_key=1)


def test_bad_arguments(rng):
    params = tf.zeros([10, 2])
    a = tf.SparseTensor([[0, 0]], ["x"], [1, 1])
    with pytest.raises(ValueError, match="num_buckets"):
        tco.cross_embedding_lookup(params, [a], 0)
    with pytest.raises(TypeError, match="non-empty list"):
        tco.cross_embedding_lookup(params, [], 10)
    with pytest.raises(ValueError, match="combiner"):
        tco.cross_embedding_lookup(params, [a], 10, combiner="max")


# ---------------------------------------------------------------------------
# Bucketized columns

BOUNDARIES = [-10.0, 0.0, 0.5, 18.0, 30.0, 1e6]


def bucketized_ids(values, boundaries):
    """A bucketized_column's sparse ids, as feature columns build them."""
    buckets = tf.raw_ops.Bucketize(input=values, boundaries=boundaries)
    batch, width = tf.shape(buckets)[0], tf.shape(buckets)[1]
    rows = tf.reshape(tf.tile(tf.range(batch)[:, None], [1, width]), [-1])
    cols = tf.tile(tf.range(width), [batch])
    ids = tf.reshape(buckets, [-1]) + (len(boundaries) + 1) * cols
    # int32 ids, Bucketize's, as the column keeps them (its gradient names rows so)
    return tf.SparseTensor(tf.cast(tf.stack([rows, cols], 1), tf.int64), ids, tf.cast(tf.stack([batch, width]), tf.int64))


def native_bucketized(params, values, boundaries, combiner="mean", default_id=None, max_norm=None):
    return tf.nn.safe_embedding_lookup_sparse(params, bucketized_ids(values, boundaries), None, combiner=combiner,
                                              default_id=default_id, max_norm=max_norm)


def edge_values(rng, batch, width, dtype):
    """Values on, between and beyond the boundaries; NaN and infinities for floats."""
    picks = np.array(BOUNDARIES + [-1e9, -10.5, 0.25, 17.9999, 29.0, 2e6, 1e6 + 1])
    values = rng.choice(picks, size=(batch, width))
    if dtype in (tf.float32, tf.float64):
        values = np.where(rng.random((batch, width)) < 0.1, rng.choice([np.nan, np.inf, -np.inf], (batch, width)),
                          values)
        return tf.constant(values, dtype)
    ints = np.where(rng.random((batch, width)) < 0.2, rng.integers(-(2**40), 2**40, (batch, width)), values)
    if dtype == tf.int32:
        ints = np.clip(ints, -(2**31), 2**31 - 1)
    return tf.constant(ints.astype(np.int64), dtype)


def bucketize_raw(params, values, boundaries, stride=None):
    return cross._ops.ctr_bucketize_embedding_lookup(
        params=params, input=values, boundaries=boundaries,
        column_stride=len(boundaries) + 1 if stride is None else stride)


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64, tf.int32, tf.int64])
@pytest.mark.parametrize("width", [1, 3])
def test_bucketized_ids_are_bucketize_bit_for_bit(rng, dtype, width):
    values = edge_values(rng, 200, width, dtype)
    want = bucketized_ids(values, BOUNDARIES)
    _, ids, splits, shape = bucketize_raw(tf.zeros([width * 7, 1]), values, BOUNDARIES)
    np.testing.assert_array_equal(ids.numpy(), want.values.numpy())
    np.testing.assert_array_equal(shape.numpy(), want.dense_shape.numpy())
    np.testing.assert_array_equal(splits.numpy(), np.arange(201) * width)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("batch", [0, 1, 50, 20_000])
def test_bucketized_matches_the_columns_safe_lookup(rng, combiner, batch):
    values = edge_values(rng, batch, 2, tf.float32)
    params = tf.constant(rng.normal(size=(14, 5)), tf.float32)
    got = tco.bucketized_embedding_lookup(params, values, BOUNDARIES, combiner=combiner)
    want = native_bucketized(params, values, BOUNDARIES, combiner=combiner)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [tf.float64, tf.float16, tf.bfloat16])
def test_bucketized_max_norm_and_table_dtypes(rng, dtype):
    values = tf.constant(rng.uniform(-20, 40, (30,)), tf.float64)  # [B]: one value a row
    params = tf.constant(rng.normal(size=(7, 4)) * 3, dtype)
    got = tco.bucketized_embedding_lookup(params, values, BOUNDARIES, combiner="sum", max_norm=1.0)
    want = native_bucketized(tf.cast(params, tf.float32), values[:, None], BOUNDARIES, combiner="sum", max_norm=1.0)
    tol = 1e-6 if dtype == tf.float64 else 2e-2
    np.testing.assert_allclose(tf.cast(got, tf.float32).numpy(), want.numpy(), rtol=tol, atol=tol)


def test_bucketized_no_values_is_an_empty_bag(rng):
    params = tf.constant(rng.normal(size=(7, 3)), tf.float32)
    values = tf.zeros([4, 0])
    np.testing.assert_array_equal(tco.bucketized_embedding_lookup(params, values, BOUNDARIES).numpy(),
                                  np.zeros((4, 3), np.float32))
    got = tco.bucketized_embedding_lookup(params, values, BOUNDARIES, default_id=2)
    np.testing.assert_allclose(got.numpy(), native_bucketized(params, values, BOUNDARIES, default_id=2).numpy())


def test_bucketized_gradients_match(rng):
    values = edge_values(rng, 40, 2, tf.float32)
    params = tf.Variable(rng.normal(size=(14, 3)), dtype=tf.float32)
    assert_same_params_gradient(
        rng, params, lambda: tco.bucketized_embedding_lookup(params, values, BOUNDARIES, combiner="sqrtn"),
        lambda: native_bucketized(params, values, BOUNDARIES, combiner="sqrtn"))


def test_real_criteo_counts_bucketized(rng):
    """Criteo's integer features I1..I13 (missing ones as 0) in log-scale buckets, as a linear model takes them."""
    with open(data_file("criteo_sample.txt"), newline="") as f:
        rows = list(csv.DictReader(f))
    values = tf.constant([[float(r[f"I{i}"] or 0) for i in range(1, 14)] for r in rows], tf.float32)
    boundaries = [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 64.0, 256.0, 1024.0, 8192.0]
    params = tf.constant(rng.normal(size=(13 * 11, 1)), tf.float32)
    got = tco.bucketized_embedding_lookup(params, values, boundaries, combiner="sum")
    np.testing.assert_allclose(got.numpy(), native_bucketized(params, values, boundaries, combiner="sum").numpy(),
                               rtol=1e-5, atol=1e-5)


def test_bucketized_id_past_the_table_names_the_id_and_row():
    values = tf.constant([[-50.0], [5e6]])  # buckets 0 and 6
    with pytest.raises(tf.errors.InvalidArgumentError, match="bucketized id 6 in row 1 is out of range"):
        tco.bucketized_embedding_lookup(tf.zeros([5, 2]), values, BOUNDARIES)


def test_bucketized_bad_arguments():
    params = tf.zeros([7, 2])
    with pytest.raises(tf.errors.InvalidArgumentError, match="Expected sorted boundaries"):
        bucketize_raw(params, tf.zeros([2, 1]), [3.0, 1.0])
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="must be"):
        bucketize_raw(params, tf.zeros([2, 1, 1]), BOUNDARIES)
    # bucketized_column's class, with the words TF's Bucketize tests match.
    with pytest.raises(ValueError, match="Expected sorted boundaries"):
        tco.bucketized_embedding_lookup(params, tf.zeros([2, 1]), [3.0, 1.0])
    with pytest.raises(TypeError, match="Expected list"):  # was "'int' object is not iterable"
        tco.bucketized_embedding_lookup(params, tf.zeros([2, 1]), 0)
    with pytest.raises(TypeError, match="int32, int64, float32 or float64"):
        tco.bucketized_embedding_lookup(params, tf.constant([["a"]]), BOUNDARIES)
    with pytest.raises(ValueError, match=r"\[B\] or \[B, S\]"):
        tco.bucketized_embedding_lookup(params, tf.zeros([2, 1, 1]), BOUNDARIES)


def test_bucketized_values_of_a_rank_known_only_at_run_time(rng):
    # A [B] input was made [B, 1] only when its rank was static: a served
    # signature of unknown shape got "input must be a matrix".
    params = tf.constant(rng.normal(size=(3 * (len(BOUNDARIES) + 1), 3)).astype(np.float32))
    lookup = tf.function(lambda v: tco.bucketized_embedding_lookup(params, v, BOUNDARIES),
                         input_signature=[tf.TensorSpec(None, tf.float32)])
    vector = tf.constant(rng.normal(size=9).astype(np.float32) * 10)
    want = tco.bucketized_embedding_lookup(params, vector[:, tf.newaxis], BOUNDARIES)
    np.testing.assert_array_equal(lookup(vector).numpy(), want.numpy())
    matrix = tf.constant(rng.normal(size=(4, 3)).astype(np.float32) * 10)
    np.testing.assert_array_equal(lookup(matrix).numpy(),
                                  tco.bucketized_embedding_lookup(params, matrix, BOUNDARIES).numpy())
    for bad in (tf.zeros([2, 1, 1]), tf.constant(1.0)):
        with pytest.raises(tf.errors.InvalidArgumentError, match="must be a matrix"):
            lookup(bad)


@pytest.mark.parametrize("hash_key", [[1, 2], 1.5, "7"])
def test_a_hash_key_other_than_one_integer_is_named(hash_key):
    # [1, 2] (hash_embedding's two-integer form) failed in int() with "int()
    # argument must be ... not 'list'".
    inputs = [tf.constant([["a"]]), tf.constant([["b"]])]
    with pytest.raises(TypeError, match="hash_key must be None or one integer"):
        tco.cross_embedding_lookup(tf.ones([10, 4]), inputs, 10, hash_key=hash_key)
    assert tco.cross_embedding_lookup(tf.ones([10, 4]), inputs, 10, hash_key=np.int64(7)).shape == (1, 4)

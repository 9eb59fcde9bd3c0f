"""Tests of the Keras layers: TF-native equivalence, training, saving and export."""

import doctest
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_ctr_ops
from conftest import fresh_process_env
from tf_ctr_ops import layers as tco_layers
from tf_ctr_ops.layers import HashEmbedding, SparseEmbedding

COMBINERS = ["sum", "mean", "sqrtn"]
CONTAINERS = ["ragged", "sparse", "dense"]
TOL = dict(rtol=1e-5, atol=1e-5)


def normal_init(seed=0):
    # Unit-scale rows, so that the tolerances above are meaningful.
    return keras.initializers.RandomNormal(stddev=1.0, seed=seed)


def random_bags(rng, batch, max_len, low, high, empty_frac=0.25):
    """A RaggedTensor [batch, (n)] of int64 ids in [low, high); bag 0 and some others empty."""
    lengths = rng.integers(1, max_len + 1, size=batch)
    lengths[rng.random(batch) < empty_frac] = 0
    lengths[0] = 0
    lengths[1] = max_len
    values = rng.integers(low, high, size=int(lengths.sum()), dtype=np.int64)
    return tf.RaggedTensor.from_row_lengths(tf.constant(values), tf.constant(lengths, tf.int64))


def random_weights(rng, ids):
    n = int(ids.flat_values.shape[0])
    return ids.with_flat_values(tf.constant(rng.uniform(0.1, 2.0, size=n), tf.float32))


def as_container(ragged, kind, pad):
    """The same bags as a RaggedTensor, a SparseTensor, or a dense tensor padded with `pad`."""
    if ragged is None or kind == "ragged":
        return ragged
    if kind == "sparse":
        return ragged.to_sparse()
    return ragged.to_tensor(default_value=pad)


def tf_reference(table, rows, weights, combiner, max_norm=None):
    """The TF-native composition: safe_embedding_lookup_sparse over ragged table rows."""
    sp_weights = None if weights is None else weights.to_sparse()
    return tf.nn.safe_embedding_lookup_sparse(table, rows.to_sparse(), sp_weights, combiner=combiner,
                                              max_norm=max_norm)


def hashed(keys, num_buckets):
    """Bucket of each key, as keras.layers.Hashing computes it for ints (and strings)."""
    def bucket(k):
        return tf.strings.to_hash_bucket_fast(k if k.dtype == tf.string else tf.strings.as_string(k),
                                              num_buckets)
    return tf.ragged.map_flat_values(bucket, keys)


def call(layer, ids, weights, container, pad=-1):
    return layer(as_container(ids, container, pad), weights=as_container(weights, container, 0.0))


def strings_module():
    return pytest.importorskip(
        "tf_ctr_ops.strings",
        reason="tf_ctr_ops.strings (the packed-string path that hashes string keys) is not part "
               "of this build yet; HashEmbedding hands string keys to it unchanged")


# ---------------------------------------------------------------------------
# Forward: same values as the TF-native compositions


@pytest.mark.parametrize("container", CONTAINERS)
@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("weighted", [False, True])
def test_sparse_embedding_matches_tf(rng, container, combiner, weighted):
    ids = random_bags(rng, 24, 6, 0, 40)
    w = random_weights(rng, ids) if weighted else None
    layer = SparseEmbedding(40, 8, combiner=combiner, embeddings_initializer=normal_init())
    got = call(layer, ids, w, container)
    want = tf_reference(layer.embeddings.value, ids, w, combiner)
    assert got.shape == (24, 8) and got.dtype == tf.float32
    np.testing.assert_allclose(got.numpy(), want.numpy(), **TOL)
    assert not np.any(got.numpy()[0]), "an empty bag must give a zero row"


@pytest.mark.parametrize("container", CONTAINERS)
@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("weighted", [False, True])
def test_hash_embedding_int_keys_match_tf(rng, container, combiner, weighted):
    keys = random_bags(rng, 24, 6, -(2**40), 2**40)
    # Extremes and small keys; no -1, which is padding in the dense container.
    keys = tf.concat([keys, tf.ragged.constant([[np.iinfo(np.int64).min, np.iinfo(np.int64).max, 0, 7]],
                                               tf.int64)], axis=0)
    w = random_weights(rng, keys) if weighted else None
    layer = HashEmbedding(37, 8, combiner=combiner, embeddings_initializer=normal_init(1))
    got = call(layer, keys, w, container)
    want = tf_reference(layer.embeddings.value, hashed(keys, 37), w, combiner)
    assert got.shape == (25, 8) and got.dtype == tf.float32
    np.testing.assert_allclose(got.numpy(), want.numpy(), **TOL)


@pytest.mark.parametrize("cls", [SparseEmbedding, HashEmbedding])
@pytest.mark.parametrize("container", ["ragged", "dense"])
def test_max_norm_matches_tf(rng, cls, container):
    ids = random_bags(rng, 20, 5, 0, 30)
    w = random_weights(rng, ids)
    layer = cls(30, 6, combiner="sum", max_norm=0.7, embeddings_initializer=normal_init(2))
    rows = ids if cls is SparseEmbedding else hashed(ids, 30)
    got = call(layer, ids, w, container)
    want = tf_reference(layer.embeddings.value, rows, w, "sum", max_norm=0.7)
    np.testing.assert_allclose(got.numpy(), want.numpy(), **TOL)
    unclipped = tf_reference(layer.embeddings.value, rows, w, "sum")
    assert not np.allclose(got.numpy(), unclipped.numpy()), "max_norm had no effect"


@pytest.mark.parametrize("kind", ["int32", "numpy"])
def test_int32_and_numpy_ids(rng, kind):
    ids = random_bags(rng, 10, 4, 0, 20)
    dense = ids.to_tensor(-1).numpy()
    layer = SparseEmbedding(20, 4, embeddings_initializer=normal_init())
    hlayer = HashEmbedding(20, 4, embeddings_initializer=normal_init())
    x = tf.constant(dense, tf.int32) if kind == "int32" else dense
    np.testing.assert_allclose(layer(x).numpy(), tf_reference(layer.embeddings.value, ids, None, "mean"),
                               **TOL)
    np.testing.assert_allclose(hlayer(x).numpy(),
                               tf_reference(hlayer.embeddings.value, hashed(ids, 20), None, "mean"), **TOL)


def test_hash_embedding_minus_one_is_a_key_except_in_dense_inputs():
    layer = HashEmbedding(16, 4, combiner="sum", embeddings_initializer=normal_init())
    keys = tf.ragged.constant([[-1, 5], [-1]], tf.int64)
    got_ragged = layer(keys).numpy()
    table = layer.embeddings.value
    np.testing.assert_allclose(got_ragged, tf_reference(table, hashed(keys, 16), None, "sum"), **TOL)
    got_dense = layer(keys.to_tensor(-1)).numpy()  # [[-1, 5], [-1, -1]]: -1 is padding
    np.testing.assert_allclose(got_dense[0], tf.gather(table, hashed(tf.constant([5], tf.int64), 16))[0],
                               **TOL)
    np.testing.assert_array_equal(got_dense[1], np.zeros(4, np.float32))


def test_out_of_range_id_is_an_error_naming_row_and_id():
    layer = SparseEmbedding(10, 4)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"id 10 in row 1"):
        layer(tf.ragged.constant([[1], [2, 10]], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"id -2 in row 0"):
        layer(tf.constant([[-2, -1]], tf.int64))


def test_invalid_constructor_arguments():
    with pytest.raises(ValueError, match="combiner"):
        SparseEmbedding(10, 4, combiner="max")
    with pytest.raises(ValueError, match="input_dim"):
        SparseEmbedding(0, 4)
    with pytest.raises(ValueError, match="num_buckets"):
        HashEmbedding(-3, 4)
    with pytest.raises(ValueError, match="output_dim"):
        SparseEmbedding(10, 2.5)
    with pytest.raises(ValueError, match="max_norm"):
        HashEmbedding(10, 4, max_norm=0.0)


# ---------------------------------------------------------------------------
# String keys: through the same HashEmbedding code path, via tf_ctr_ops.strings


def random_words(rng, batch, max_len):
    words = np.array([f"w{i}" for i in range(50)] + ["", "é字", "a b", "x" * 40])
    lengths = rng.integers(0, max_len + 1, size=batch)
    lengths[1] = max_len
    return tf.RaggedTensor.from_row_lengths(
        tf.constant(rng.choice(words, size=int(lengths.sum()))), tf.constant(lengths, tf.int64))


@pytest.mark.parametrize("container", CONTAINERS)
@pytest.mark.parametrize("combiner", COMBINERS)
def test_hash_embedding_string_keys_match_tf(rng, container, combiner):
    strings_module()
    keys = random_words(rng, 20, 5)
    if container == "dense":  # "" is the dense padding of string keys
        keys = tf.ragged.boolean_mask(keys, keys != "")
    w = random_weights(rng, keys)
    layer = HashEmbedding(31, 8, combiner=combiner, embeddings_initializer=normal_init())
    got = call(layer, keys, w, container, pad="")
    want = tf_reference(layer.embeddings.value, hashed(keys, 31), w, combiner)
    np.testing.assert_allclose(got.numpy(), want.numpy(), **TOL)


@pytest.mark.parametrize("width", [1, 4])  # [B, 1]: one key per field, as in criteo_deepfm.py
@pytest.mark.parametrize("combiner", COMBINERS)
def test_hash_embedding_dense_string_keys_unweighted(rng, width, combiner):
    # Unweighted dense string keys take their own path (no ragged mask): the
    # "" padding is dropped inside the kernel. Forward, gradient and max_norm.
    strings_module()
    keys = random_words(rng, 30, width)
    keys = tf.ragged.boolean_mask(keys, keys != "")
    dense = keys.to_tensor(default_value="", shape=[30, width])
    assert int(tf.reduce_sum(tf.cast(dense == "", tf.int32))) > 0, "the test needs padding"
    for max_norm in (None, 0.8):
        layer = HashEmbedding(29, 6, combiner=combiner, max_norm=max_norm, embeddings_initializer=normal_init(4))
        layer.build()
        upstream = tf.constant(rng.normal(size=(30, 6)), tf.float32)
        with tf.GradientTape() as tape:
            got = layer(dense)
            loss = tf.reduce_sum(got * upstream)
        grad = tape.gradient(loss, layer.embeddings)
        with tf.GradientTape() as tape:
            want = tf_reference(layer.embeddings.value, hashed(keys, 29), None, combiner, max_norm=max_norm)
            want_loss = tf.reduce_sum(want * upstream)
        want_grad = tape.gradient(want_loss, layer.embeddings.value)
        assert got.shape == (30, 6)
        np.testing.assert_allclose(got.numpy(), want.numpy(), **TOL)
        assert isinstance(grad, tf.IndexedSlices), type(grad)
        np.testing.assert_allclose(tf.convert_to_tensor(grad).numpy(), tf.convert_to_tensor(want_grad).numpy(),
                                   **TOL)
    assert layer(tf.zeros([0, width], tf.string)).shape == (0, 6)
    assert not np.any(layer(tf.fill([3, width], "")).numpy()), "all-padding rows must be zeros"


def test_hash_embedding_int_key_equals_its_decimal_string(rng):
    strings_module()
    keys = random_bags(rng, 16, 4, -(10**12), 10**12)
    layer = HashEmbedding(64, 8, embeddings_initializer=normal_init())
    np.testing.assert_allclose(layer(keys).numpy(),
                               layer(tf.ragged.map_flat_values(tf.strings.as_string, keys)).numpy(), **TOL)


# ---------------------------------------------------------------------------
# Gradients and dtypes


@pytest.mark.parametrize("cls", [SparseEmbedding, HashEmbedding])
@pytest.mark.parametrize("container", CONTAINERS)
def test_table_gradient_is_indexed_slices_matching_tf(rng, cls, container):
    ids = random_bags(rng, 16, 5, 0, 30)
    w = random_weights(rng, ids)
    layer = cls(30, 4, combiner="sqrtn", embeddings_initializer=normal_init())
    layer.build()
    rows = ids if cls is SparseEmbedding else hashed(ids, 30)
    upstream = tf.constant(rng.normal(size=(16, 4)), tf.float32)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(call(layer, ids, w, container) * upstream)
    grad = tape.gradient(loss, layer.embeddings)
    assert isinstance(grad, tf.IndexedSlices), type(grad)
    assert set(grad.indices.numpy().tolist()) <= set(rows.flat_values.numpy().tolist())
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf_reference(layer.embeddings.value, rows, w, "sqrtn") * upstream)
    want = tape.gradient(loss, layer.embeddings.value)
    np.testing.assert_allclose(tf.convert_to_tensor(grad).numpy(), tf.convert_to_tensor(want).numpy(), **TOL)


@pytest.mark.parametrize("policy,out_dtype,table_dtype,tol", [
    ("mixed_float16", "float16", "float32", 2e-3),
    ("mixed_bfloat16", "bfloat16", "float32", 1e-2),
    ("bfloat16", "bfloat16", "bfloat16", 6e-2),
])
@pytest.mark.parametrize("cls", [SparseEmbedding, HashEmbedding])
def test_dtype_policies(rng, policy, out_dtype, table_dtype, tol, cls):
    ids = random_bags(rng, 16, 5, 0, 30)
    layer = cls(30, 8, combiner="sum", dtype=policy, embeddings_initializer=normal_init())
    out = layer(ids)
    assert layer.embeddings.dtype == table_dtype
    assert out.dtype == out_dtype == layer.compute_dtype
    rows = ids if cls is SparseEmbedding else hashed(ids, 30)
    table = tf.cast(layer.embeddings.value, tf.float32)
    want = tf_reference(table, rows, None, "sum")
    np.testing.assert_allclose(tf.cast(out, tf.float32).numpy(), want.numpy(), rtol=tol, atol=tol)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.cast(layer(ids), tf.float32))
    grad = tape.gradient(loss, layer.embeddings)
    assert isinstance(grad, tf.IndexedSlices) and grad.values.dtype == table_dtype


# Rows that cancel: their float32 sum, 2^-12, is a float16, but the first
# row rounds to 1 in float16, where the sum is 0.
_CANCELLING_ROWS = np.array([[1 + 2.0 ** -12], [-1.0]], np.float32)


def _cancelling_layer(kind, policy):
    if kind == "sparse":
        return SparseEmbedding(2, 1, combiner="sum", dtype=policy), tf.ragged.constant([[0, 1]], tf.int64)
    if kind == "string":
        return tco_layers.StringEmbedding(2, 1, combiner="sum", id_mode="index", delimiter=",", dtype=policy), \
            tf.constant(["0,1"])
    if kind == "multi_string":
        return tco_layers.MultiStringEmbedding([2], [1], combiners="sum", id_modes="index", delimiters=",",
                                                dtype=policy), \
            [tf.constant(["0,1"])]
    layer = tco_layers.HashTableEmbedding(1, capacity=2, combiner="sum", dtype=policy)
    keys = tf.constant([[10, 20]], tf.int64)
    layer(keys, training=True)  # rows 0 and 1, in the keys' order
    return layer, keys


@pytest.mark.parametrize("kind", ["sparse", "string", "multi_string", "hash_table"])
@pytest.mark.parametrize("in_float32_model", [False, True])
def test_mixed_layers_pool_their_float32_rows_wherever_they_are_called(kind, in_float32_model):
    # Keras autocast the table to float16 in a layer's own call (a layer
    # called alone, or a mixed layer in a float32 model, as a `.keras` file of
    # a mixed model loads in a fresh process): the rows were rounded before
    # pooling, and the whole table cast every call.
    layer, ids = _cancelling_layer(kind, "mixed_float16")
    if kind != "hash_table":
        layer(ids)  # builds
    table = layer.embeddings if kind != "multi_string" else layer.embeddings_0
    table.assign(_CANCELLING_ROWS)
    if in_float32_model:
        assert keras.config.dtype_policy().name == "float32"
        inputs = [keras.Input(shape=x.shape[1:], dtype=x.dtype, ragged=isinstance(x, tf.RaggedTensor))
                  for x in (ids if isinstance(ids, list) else [ids])]
        model = keras.Model(inputs, layer(inputs if isinstance(ids, list) else inputs[0]))
        out = model(ids)
    else:
        out = layer(ids)
    out = out[0] if isinstance(out, list) else out
    assert out.dtype == tf.float16
    assert float(out[0, 0]) == 2.0 ** -12


# ---------------------------------------------------------------------------
# Keras models: functional inputs, training, saving, export

N_ITEMS, N_BUCKETS, N_USERS = 300, 256, 120


def ctr_model(seed=0):
    items = keras.Input(shape=(None,), dtype="int64", ragged=True, name="items")
    users = keras.Input(shape=(None,), dtype="int64", ragged=True, name="users")
    x = keras.layers.Concatenate()([
        SparseEmbedding(N_ITEMS, 8, combiner="mean", name="item_emb",
                        embeddings_initializer=keras.initializers.RandomUniform(-0.05, 0.05, seed=seed),
                        embeddings_regularizer=keras.regularizers.L2(1e-6),
                        embeddings_constraint=keras.constraints.MaxNorm(5.0))(items),
        HashEmbedding(N_BUCKETS, 8, combiner="sum", max_norm=4.0, name="user_emb",
                      embeddings_initializer=keras.initializers.RandomUniform(-0.05, 0.05, seed=seed + 1))(users),
    ])
    out = keras.layers.Dense(1, activation="sigmoid", name="ctr",
                             kernel_initializer=keras.initializers.GlorotUniform(seed=seed + 2))(x)
    return keras.Model({"items": items, "users": users}, out)


def ctr_data(rng, n):
    """Clicks decided by hidden per-item and per-user scores, which the model must learn."""
    item_score = rng.normal(size=N_ITEMS) * 2.0
    user_keys = rng.integers(10**9, 10**12, size=N_USERS, dtype=np.int64)
    user_score = rng.normal(size=N_USERS) * 2.0
    items = random_bags(rng, n, 6, 0, N_ITEMS, empty_frac=0.05)
    users = rng.integers(0, N_USERS, size=n)
    item_mean = tf.math.divide_no_nan(
        tf.reduce_sum(tf.gather(item_score, items), axis=1),
        tf.cast(items.row_lengths(), tf.float64)).numpy()
    labels = (item_mean + user_score[users] > 0).astype(np.float32)[:, None]
    x = {"items": items,
         "users": tf.RaggedTensor.from_row_lengths(tf.constant(user_keys[users]), tf.ones([n], tf.int64))}
    return x, labels


@pytest.fixture(scope="module")
def trained_ctr():
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(7)
    x, y = ctr_data(rng, 2048)
    model = ctr_model()
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="binary_crossentropy", metrics=["accuracy"])
    before = model.evaluate(x, y, batch_size=512, verbose=0, return_dict=True)
    model.fit(x, y, epochs=4, batch_size=128, verbose=0)
    after = model.evaluate(x, y, batch_size=512, verbose=0, return_dict=True)
    return model, x, before, after


def test_fit_learns_synthetic_ctr_task(trained_ctr):
    _, _, before, after = trained_ctr
    assert before["loss"] > 0.6, before
    assert after["loss"] < 0.5 * before["loss"], (before, after)
    assert after["accuracy"] > 0.85, after


def test_fit_under_mixed_float16_policy():
    keras.utils.set_random_seed(1)
    x, y = ctr_data(np.random.default_rng(8), 1024)
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        model = ctr_model()
    finally:
        keras.config.set_dtype_policy(previous)
    for name in ("item_emb", "user_emb"):
        assert model.get_layer(name).embeddings.dtype == "float32"
        assert model.get_layer(name).output.dtype == "float16"
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="binary_crossentropy")
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    before = model.evaluate(x, y, batch_size=512, verbose=0)
    model.fit(x, y, epochs=3, batch_size=128, verbose=0)
    after = model.evaluate(x, y, batch_size=512, verbose=0)
    assert after < 0.6 * before, (before, after)


def test_a_functional_model_of_dense_ids_of_another_rank_is_refused_at_construction():
    # Keras built such a model ((None, 4) out of any input rank), and its
    # first call failed.
    layers = [lambda: SparseEmbedding(10, 4), lambda: HashEmbedding(10, 4),
              lambda: tco_layers.HashTableEmbedding(4, capacity=16)]
    for make in layers:
        with pytest.raises(ValueError, match=r"'.*': dense ids must be \[B\] or \[B, N\].*got shape \(None, 3, 2\)"):
            make()(keras.Input(shape=(3, 2), dtype="int64"))
        for shape in [(), (3,)]:
            assert make()(keras.Input(shape=shape, dtype="int64")).shape == (None, 4)
        assert make()(keras.Input(shape=(3,), dtype="int64", sparse=True)).shape == (None, 4)
        # Called eagerly, the layer names the same two forms.
        with pytest.raises(ValueError, match=r"dense ids must be \[B\] or \[B, N\] \(ids padded with -1, or '' for strings\), got shape \(2, 2, 2\)"):
            make()(tf.zeros([2, 2, 2], tf.int64))
        # Weights alike, in their own words: the padding is the ids'.
        with pytest.raises(ValueError, match=r"'.*': dense weights must be \[B\] or \[B, N\] \(one weight per id, "
                                             r"in the ids' layout\), got shape \(None, 3, 2\)"):
            make()(keras.Input(shape=(3,), dtype="int64"), weights=keras.Input(shape=(3, 2)))
        assert make()(keras.Input(shape=(3,), dtype="int64"), weights=keras.Input(shape=(3,))).shape == (None, 4)
        with pytest.raises(ValueError, match=r"dense weights must be \[B\] or \[B, N\] \(one weight per id"):
            make()(tf.zeros([2, 3], tf.int64), weights=tf.ones([2, 3, 1]))


@pytest.mark.parametrize("make", [lambda: SparseEmbedding(10, 4), lambda: HashEmbedding(10, 4),
                                  lambda: tco_layers.StringEmbedding(10, 4)])
def test_a_functional_model_of_a_list_of_features_into_a_one_feature_layer_says_so(make):
    # Keras' "Cannot convert '4' to a shape" came instead.
    dtype = "string" if isinstance(make(), tco_layers.StringEmbedding) else "int64"
    with pytest.raises(TypeError, match="got a list of 2: call the layer once per feature"):
        make()([keras.Input(shape=(), dtype=dtype), keras.Input(shape=(), dtype=dtype)])


def test_a_hash_table_layer_refuses_keys_of_the_other_kind_when_the_model_is_built():
    # Keras built such a model, and its first call failed.
    with pytest.raises(TypeError, match="HashTableEmbedding 'ints': string keys need a table with key_dtype=tf.string"):
        tco_layers.HashTableEmbedding(4, capacity=16, name="ints")(keras.Input(shape=(3,), dtype="string"))
    with pytest.raises(TypeError, match="'strings': a table with key_dtype=tf.string takes string keys, got int64"):
        tco_layers.HashTableEmbedding(4, capacity=16, key_dtype="string", name="strings")(
            keras.Input(shape=(3,), dtype="int64"))
    for dtype, key_dtype in (("int32", "int64"), ("int64", "int64"), ("string", "string")):
        assert tco_layers.HashTableEmbedding(4, capacity=16, key_dtype=key_dtype)(
            keras.Input(shape=(3,), dtype=dtype)).shape == (None, 4)
    with pytest.raises(ValueError, match="': dense ids must be"):  # slots: each one's rank
        tco_layers.HashTableEmbedding(4, capacity=16)([keras.Input(shape=(2,), dtype="int64"),
                                                       keras.Input(shape=(2, 2), dtype="int64")])


def test_functional_models_take_ragged_sparse_and_dense_inputs(rng):
    width = 5
    ids = random_bags(rng, 12, width, 0, 40)
    w = random_weights(rng, ids)
    layer = SparseEmbedding(40, 4, combiner="sqrtn", embeddings_initializer=normal_init())
    kinds = {
        "ragged": dict(shape=(None,), ragged=True),
        "sparse": dict(shape=(width,), sparse=True),
        "dense": dict(shape=(width,)),
    }
    outs = {}
    for kind, spec in kinds.items():
        i = keras.Input(dtype="int64", name="ids", **spec)
        wi = keras.Input(dtype="float32", name="w", **spec)
        model = keras.Model({"ids": i, "w": wi}, layer(i, weights=wi))
        assert model.output.shape == (None, 4)
        outs[kind] = model.predict({"ids": as_container(ids, kind, -1), "w": as_container(w, kind, 0.0)},
                                   batch_size=12, verbose=0)
    want = tf_reference(layer.embeddings.value, ids, w, "sqrtn").numpy()
    for kind, out in outs.items():
        np.testing.assert_allclose(out, want, err_msg=kind, **TOL)


@pytest.mark.parametrize("cls", [SparseEmbedding, HashEmbedding])
def test_get_config_round_trip(rng, cls):
    layer = cls(40, 8, combiner="sqrtn", max_norm=1.5, name="feat", dtype="mixed_bfloat16",
                embeddings_initializer=keras.initializers.RandomNormal(stddev=0.3, seed=3),
                embeddings_regularizer=keras.regularizers.L2(1e-3),
                embeddings_constraint=keras.constraints.MaxNorm(2.0))
    config = layer.get_config()
    json.dumps(config)  # plain JSON, as .keras files store it
    rows_arg = "input_dim" if cls is SparseEmbedding else "num_buckets"
    assert config[rows_arg] == 40 and config["output_dim"] == 8 and config["combiner"] == "sqrtn"
    assert config["max_norm"] == 1.5

    clone = cls.from_config(config)
    assert clone.get_config() == config
    assert getattr(clone, rows_arg) == 40
    assert isinstance(clone.embeddings_initializer, keras.initializers.RandomNormal)
    assert clone.embeddings_initializer.stddev == 0.3 and clone.embeddings_initializer.seed == 3
    assert isinstance(clone.embeddings_regularizer, keras.regularizers.L2)
    assert clone.embeddings_regularizer.l2 == pytest.approx(1e-3)
    assert isinstance(clone.embeddings_constraint, keras.constraints.MaxNorm)
    assert clone.embeddings_constraint.max_value == 2.0
    assert clone.dtype_policy.name == "mixed_bfloat16"

    # Through the registry, as load_model finds it.
    assert keras.saving.get_registered_name(cls) == f"tf_ctr_ops>{cls.__name__}"
    restored = keras.layers.deserialize(keras.layers.serialize(layer))
    assert type(restored) is cls and restored.get_config() == config

    ids = random_bags(rng, 8, 4, 0, 40)
    layer(ids)
    restored(ids)
    restored.set_weights(layer.get_weights())
    np.testing.assert_array_equal(layer(ids).numpy(), restored(ids).numpy())
    # The regularizer was restored and is applied.
    table = layer.embeddings.value.numpy()
    assert len(restored.losses) == 1
    np.testing.assert_allclose(float(restored.losses[0]), 1e-3 * np.sum(table**2), rtol=1e-4)


def test_save_and_load_model_gives_identical_predictions(trained_ctr, tmp_path):
    model, x, _, _ = trained_ctr
    path = tmp_path / "ctr.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded.get_layer("item_emb"), SparseEmbedding)
    assert isinstance(loaded.get_layer("user_emb"), HashEmbedding)
    for name in ("item_emb", "user_emb"):
        assert loaded.get_layer(name).get_config() == model.get_layer(name).get_config()
    np.testing.assert_array_equal(loaded.predict(x, batch_size=512, verbose=0),
                                  model.predict(x, batch_size=512, verbose=0))


SERVE_SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path

    import numpy as np
    import tf_ctr_ops  # loads the op library: the exported graphs use its ops
    import keras
    import tensorflow as tf

    d = Path(sys.argv[1])
    a = {k: np.load(d / f"{k}.npy") for k in
         ("items_dense", "users_dense", "items_values", "items_splits", "users_values", "users_splits")}
    dense = tf.saved_model.load(str(d / "export_dense"))
    np.save(d / "out_dense.npy", dense.serve({"items": a["items_dense"], "users": a["users_dense"]}).numpy())
    ragged = {k: tf.RaggedTensor.from_row_splits(a[k + "_values"], a[k + "_splits"]) for k in ("items", "users")}
    exported = tf.saved_model.load(str(d / "export_ragged"))
    np.save(d / "out_ragged.npy", exported.serve(ragged).numpy())
    model = keras.models.load_model(d / "model.keras")
    np.save(d / "out_keras.npy", model.predict(ragged, verbose=0))
""")


def test_export_serves_identically_in_a_fresh_process(trained_ctr, tmp_path):
    model, x, _, _ = trained_ctr
    x = {k: v[:200] for k, v in x.items()}
    want = model.predict(x, batch_size=200, verbose=0)

    # Keras' own export: ragged inputs become dense (None, None) specs, fed -1-padded ids.
    model.export(str(tmp_path / "export_dense"), verbose=False)
    # A ragged endpoint, through ExportArchive and a tf.function with a ragged signature.
    spec = tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1, row_splits_dtype=tf.int64)
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("serve", tf.function(lambda inputs: model(inputs, training=False),
                                              input_signature=[{"items": spec, "users": spec}]))
    archive.write_out(str(tmp_path / "export_ragged"), verbose=False)
    model.save(tmp_path / "model.keras")
    for k, v in x.items():
        np.save(tmp_path / f"{k}_dense.npy", v.to_tensor(-1).numpy())
        np.save(tmp_path / f"{k}_values.npy", v.values.numpy())
        np.save(tmp_path / f"{k}_splits.npy", v.row_splits.numpy())

    proc = subprocess.run([sys.executable, "-c", SERVE_SCRIPT, str(tmp_path)], env=fresh_process_env(),
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for name in ("dense", "ragged", "keras"):
        np.testing.assert_array_equal(np.load(tmp_path / f"out_{name}.npy"), want, err_msg=name)


def test_docstring_examples_run():
    result = doctest.testmod(tco_layers, extraglobs={"tf": tf, "keras": keras}, verbose=False,
                             optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 6 and result.failed == 0, result


def _one_feature_model(kind):
    """A model of one fused layer ("dense": none) and a Dense head."""
    if kind == "multi_string":
        x = keras.Input(shape=(), dtype="string")
        features = tco_layers.MultiStringEmbedding([100], 4, concat=True)([x])
    else:
        layer, dtype = {
            "sparse": (tco_layers.SparseEmbedding(100, 4), "int64"),
            "hash": (tco_layers.HashEmbedding(100, 4), "int64"),
            "string": (tco_layers.StringEmbedding(100, 4), "string"),
            "hash_table": (tco_layers.HashTableEmbedding(4, capacity=100), "int64"),
            "dense": (None, "float32"),
        }[kind]
        x = keras.Input(shape=(3,) if dtype != "string" else (), dtype=dtype)
        features = x if layer is None else layer(x)
    return keras.Model(x, keras.layers.Dense(1)(features))


@pytest.mark.parametrize("kind", ["sparse", "hash", "string", "hash_table", "multi_string", "dense"])
def test_jit_compile_auto_never_picks_xla_for_the_fused_layers(kind):
    # The fused ops have no XLA kernels. Keras resolves jit_compile="auto" to
    # XLA on a machine with a GPU unless a layer says it cannot be compiled;
    # the Dense-only model shows that this machine is taken for a GPU one.
    from unittest import mock

    model = _one_feature_model(kind)
    gpu = tf.config.PhysicalDevice(name="/physical_device:GPU:0", device_type="GPU")
    listed = tf.config.list_physical_devices
    with mock.patch.object(tf.config, "list_physical_devices",
                           lambda kind=None: listed(kind) + ([gpu] if kind in (None, "GPU") else [])):
        model.compile("adam", "mse")
        assert model.jit_compile is (kind == "dense")


def test_sparse_string_keys_need_not_fill_their_rows_first_columns():
    # tf.sparse.from_dense of ""-padded keys leaves a row's one key in column
    # 1: read as ragged from_sparse, that was "not right-ragged".
    keys = tf.sparse.from_dense(tf.constant([["a", "b"], ["", "c"]]))
    layer = HashEmbedding(10, 4)
    got = layer(keys)
    table = tf.convert_to_tensor(layer.embeddings)
    ids = tf.SparseTensor(keys.indices, tf.strings.to_hash_bucket_fast(keys.values, 10), keys.dense_shape)
    np.testing.assert_allclose(got.numpy(), tf.nn.safe_embedding_lookup_sparse(table, ids).numpy(), rtol=1e-6)


@pytest.mark.parametrize("layer", [lambda: HashEmbedding(10, 4), lambda: SparseEmbedding(10, 4)])
def test_a_list_of_features_is_an_error_not_one_stacked_feature(layer):
    # Stacked, two [3] features were 2 bags of 3 ids: a [2, 4] output.
    with pytest.raises(TypeError, match="a list of 2"):
        layer()([tf.constant([1, 2, 3], tf.int64), tf.constant([4, 5, 6], tf.int64)])
    assert layer()(np.array([[1, 2], [3, -1]])).shape == (2, 4)


# --- Keras' scratch calls: subclassed models, wrapper layers, Sequential ------

def _layer_and_feature(kind, rng):
    """(a fresh layer, a batch of its inputs) of each of the layers."""
    ids = rng.integers(0, 50, size=(16, 3)).astype(np.int64)
    strings = tf.constant([b",".join(b"%d" % i for i in row) for row in ids])
    return {
        "sparse": lambda: (SparseEmbedding(50, 4, name="emb"), ids),
        "hash": lambda: (HashEmbedding(64, 4, name="emb"), ids),
        "hash_table": lambda: (tco_layers.HashTableEmbedding(4, capacity=64, name="emb"), ids),
        "string": lambda: (tco_layers.StringEmbedding(64, 4, name="emb"), strings),
    }[kind]()


@keras.saving.register_keras_serializable(package="test_layers")
class SubclassedCtrModel(keras.Model):
    def __init__(self, kind, **kwargs):
        super().__init__(**kwargs)
        self.kind = kind
        self.emb, _ = _layer_and_feature(kind, np.random.default_rng(0))
        self.head = keras.layers.Dense(1)

    def call(self, x, training=None):
        if isinstance(self.emb, tco_layers.HashTableEmbedding):
            return self.head(self.emb(x, training=training))
        return self.head(self.emb(x))

    def get_config(self):
        return {"kind": self.kind, **super().get_config()}


@keras.saving.register_keras_serializable(package="test_layers")
class CtrBlock(keras.layers.Layer):
    """A user's layer owning one of ours: Keras builds it by a scratch call."""

    def __init__(self, kind, **kwargs):
        super().__init__(**kwargs)
        self.kind = kind
        self.emb, _ = _layer_and_feature(kind, np.random.default_rng(0))
        self.proj = keras.layers.Dense(2)

    def call(self, x, training=None):
        return self.proj(self.emb(x))

    def get_config(self):
        return {"kind": self.kind, **super().get_config()}


@pytest.mark.parametrize("kind", ["sparse", "hash", "hash_table", "string"])
def test_subclassed_model_reloads_every_weight(tmp_path, rng, kind):
    """Keras rebuilds a loaded subclassed model by calling it on float32
    placeholders; our layers raised there (float ids, uninitialized table),
    so every other layer's weights came back at their initial values with
    only a warning."""
    _, x = _layer_and_feature(kind, rng)
    model = SubclassedCtrModel(kind)
    model.compile("adam", "mse")
    model.fit(x, rng.random((len(x), 1)).astype(np.float32), epochs=2, verbose=0)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))
    np.testing.assert_array_equal(loaded.head.kernel.numpy(), model.head.kernel.numpy())


@pytest.mark.parametrize("kind", ["sparse", "hash_table", "string"])
def test_a_users_layer_holding_ours_saves_and_loads(tmp_path, rng, kind):
    _, x = _layer_and_feature(kind, rng)
    inputs = keras.Input(shape=x.shape[1:], dtype="string" if kind == "string" else "int64")
    model = keras.Model(inputs, keras.layers.Dense(1)(CtrBlock(kind)(inputs)))
    model.compile("adam", "mse")
    model.fit(x, np.ones((len(x), 1), np.float32), verbose=0)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))


def test_sequential_without_an_input_casts_float_ids_as_keras_embedding_does(rng):
    # Sequential gives its input layer the first layer's float32 dtype.
    ids = rng.integers(0, 50, size=(16, 3)).astype(np.int64)
    model = keras.Sequential([SparseEmbedding(50, 4, combiner="sum"), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    model.fit(ids, np.ones((16, 1), np.float32), verbose=0)
    table = model.layers[0].embeddings.numpy()
    want = model.layers[1](tf.constant(table[ids].sum(axis=1))).numpy()
    np.testing.assert_allclose(model.predict(ids, verbose=0), want, rtol=1e-6)


@pytest.mark.parametrize("kind", ["hash", "hash_table"])
def test_float_keys_are_a_clear_error_naming_the_fix(rng, kind):
    layer, x = _layer_and_feature(kind, rng)
    model = keras.Sequential([layer, keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    with pytest.raises(TypeError, match=r"got float32 keys.*keras.Input\(shape=\.\.\., dtype=\"int64\"\)"):
        model.fit(x, np.ones((len(x), 1), np.float32), verbose=0)


def test_string_ids_to_sparse_embedding_name_the_layers_that_take_them():
    # The kernel's message spoke of an id_mode the layer has no argument for.
    message = r"SparseEmbedding .* takes integer ids, got strings: hash string keys with HashEmbedding"
    with pytest.raises(TypeError, match=message):
        SparseEmbedding(10, 4)(tf.constant([["1"]]))
    with pytest.raises(TypeError, match=message):  # when the model is built, not at its first call
        SparseEmbedding(10, 4)(keras.Input(shape=(None,), dtype="string"))
    assert tco_layers.HashEmbedding(10, 4)(tf.constant([["1"]])).shape == (1, 4)


@pytest.mark.parametrize("call, message", [
    (lambda: SparseEmbedding(10, 2)(tf.constant([[1, 2]]), weights=tf.ragged.constant([[1.0, 2.0]])),
     "weights must be a dense tensor \\[B, N\\] like ids, got a RaggedTensor"),
    (lambda: tco_layers.HashTableEmbedding(2, 8)(tf.constant([[1, 2]], tf.int64),
                                                 weights=tf.sparse.from_dense([[1.0, 2.0]])),
     "weights must be a dense tensor \\[B, N\\] like ids, got a SparseTensor"),
    (lambda: tco_layers.StringEmbedding(10, 2)(tf.ragged.constant([["1,2"], []])),
     "strings must be a dense string tensor .* got a RaggedTensor"),
    (lambda: tf_ctr_ops.string_embedding(tf.ragged.constant([["1,2"], []]), tf.zeros([10, 2])),
     "strings must be a dense string tensor .* got a RaggedTensor"),
], ids=["dense_ids_ragged_weights", "dense_keys_sparse_weights", "layer_ragged_strings", "op_ragged_strings"])
def test_a_container_of_another_kind_is_named(call, message):
    # These were raw TypeErrors ("object of type 'RaggedTensor' has no len()").
    with pytest.raises(TypeError, match=message):
        call()


@pytest.mark.parametrize("layer", [
    lambda: tco_layers.HashEmbedding(50, 4, name="emb"),
    lambda: tco_layers.SparseEmbedding(50, 4, name="emb"),
    lambda: tco_layers.HashTableEmbedding(4, capacity=64, name="emb"),
])
def test_a_single_valued_feature_is_one_id_per_row(rng, layer):
    """`Input(shape=())` ids, as Keras' Hashing + Embedding take them: each
    row's one id, as the same ids given as [B, 1]."""
    ids = rng.integers(0, 50, 8).astype(np.int64)
    weights = rng.uniform(0.5, 2.0, 8).astype(np.float32)
    inputs = keras.Input(shape=(), dtype="int64")
    emb = layer()
    model = keras.Model(inputs, emb(inputs))
    want = emb(ids[:, None], training=True)
    np.testing.assert_array_equal(model.predict(ids, verbose=0), want)
    np.testing.assert_array_equal(emb(ids, weights), emb(ids[:, None], weights[:, None]))


@pytest.mark.parametrize("layer", [
    lambda: tco_layers.SparseEmbedding(4, 1, combiner="sum"),
    lambda: tco_layers.HashEmbedding(4, 1, combiner="sum"),
    lambda: tco_layers.HashTableEmbedding(1, capacity=16, combiner="sum"),
])
def test_weights_must_line_up_with_the_ids(layer):
    """As Keras' Embedding(ids) * weights[..., None] demands: one weight per
    id in the same layout, not merely as many values."""
    emb = layer()
    ids = tf.ragged.constant([[1, 2], [3]], tf.int64)
    emb(ids, tf.ragged.constant([[1.0, 1.0], [2.0]]))
    for weights in (tf.ragged.constant([[1.0], [1.0, 2.0]]), tf.ragged.constant([[1.0], [1.0], [2.0]])):
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match="one weight per id: the ids' and their row splits differ"):
            emb(ids, weights)
    # In a function, where the message is the Assert's data, it names where
    # and what differs (it was the sentence alone).
    in_function = tf.function(lambda i, w: emb(i, w))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"their row splits differ at flat position\] "
                                                             r"\[1\] \[\(ids\\?':\] \[2\] \[weights\\?':\] \[1\]"):
        in_function(ids, tf.ragged.constant([[1.0], [1.0, 2.0]]))
    sparse = ids.to_sparse()
    moved = tf.SparseTensor(tf.constant([[0, 0], [1, 0], [1, 1]], tf.int64), tf.ones([3]), sparse.dense_shape)
    with pytest.raises(tf.errors.InvalidArgumentError, match="the ids' and their indices differ"):
        emb(sparse, moved)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        emb(tf.constant([[1, 2]], tf.int64), tf.ones([1, 3]))


@pytest.mark.parametrize("layer", [
    lambda: tco_layers.SparseEmbedding(100, 4),
    lambda: tco_layers.HashEmbedding(100, 4),
    lambda: tco_layers.HashTableEmbedding(4, capacity=64),
])
def test_ragged_ids_and_weights_through_keras_layers_build_and_run(layer):
    """Keras marks the outputs of Hashing, Rescaling and the like neither
    ragged nor sparse, whatever they carry: a build-time check of the ids'
    and weights' containers refused these working models."""
    ids = keras.Input(shape=(None,), dtype="int64", ragged=True)
    weights = keras.Input(shape=(None,), ragged=True)
    emb = layer()
    hashed_ids = keras.Model([ids, weights], emb(keras.layers.Hashing(100)(ids), weights=weights))
    scaled_weights = keras.Model([ids, weights], emb(ids, weights=keras.layers.Rescaling(0.5)(weights)))
    x = tf.ragged.constant([[1, 2, 3], [4]], tf.int64)
    w = tf.ragged.constant([[1.0, 2.0, 4.0], [2.0]])
    np.testing.assert_allclose(hashed_ids([x, w]), emb(keras.layers.Hashing(100)(x), weights=w), rtol=1e-6)
    np.testing.assert_allclose(scaled_weights([x, w]), emb(x, weights=w * 0.5), rtol=1e-6)



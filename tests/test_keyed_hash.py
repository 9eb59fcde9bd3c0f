"""Keyed hashing: tf.strings.to_hash_bucket_strong (SipHash-2-4 with a key),
the hash of keras.layers.Hashing(salt=...), in the fused ops, their gradients,
the layer and the rewrite, against TF's own op."""

import numpy as np
import pytest
import tensorflow as tf

import tf_ctr_ops as tco
from tf_ctr_ops import _core, rewrite
from test_rewrite import CPU_PASS, run_online
from test_rewrite_dense import assert_identical, assert_model_close, random_strings

# Keys as Keras writes them ([salt, salt]) and as TF's attr takes them: int64,
# whose negative values are the uint64 words above 2**63.
KEYS = [[0, 0], [133, 137], [2**63 - 1, -2**63], [-1, 1]]
COMBINERS = ["sum", "mean", "sqrtn"]


def strong(strings, buckets, key):
    return tf.strings.to_hash_bucket_strong(strings, buckets, key=key)


def table(rng, rows=97, dim=6):
    return tf.constant(rng.normal(size=(rows, dim)).astype(np.float32))


def densify(g):
    return tf.convert_to_tensor(g).numpy()


# ---------------------------------------------------------------------------
# The core hash


def test_siphash_matches_the_reference_test_vector():
    # SipHash-2-4's paper (Aumasson, Bernstein), appendix A: key 00..0f,
    # message 00..0e, hash a129ca6149be45e5. 2**64 - 1 buckets (a multiple of
    # neither) leave the hash itself as the bucket.
    k0, k1 = (int.from_bytes(bytes(range(i, i + 8)), "little") for i in (0, 8))
    key = [k - 2**64 if k >= 2**63 else k for k in (k0, k1)]
    [bucket] = _core.hash_buckets([bytes(range(15))], 2**63 - 1, key)
    assert bucket == 0xA129CA6149BE45E5 % (2**63 - 1)


@pytest.mark.parametrize("key", KEYS)
def test_core_hash_matches_to_hash_bucket_strong_on_every_length(rng, key):
    alphabet = np.frombuffer(bytes(range(256)), np.uint8)
    strings = [bytes(rng.choice(alphabet, size=n)) for n in list(range(0, 70)) * 2 + [255, 256, 1000]]
    for buckets in (1, 7, 1_000_003, 2**62):
        np.testing.assert_array_equal(_core.hash_buckets(strings, buckets, key), strong(strings, buckets, key).numpy())


@pytest.mark.parametrize("key", KEYS)
def test_core_int_keys_hash_as_their_decimal_string(key):
    keys = np.array([0, 1, -1, 9, 10, -10, 2**31 - 1, -2**31, 2**63 - 1, -2**63, 1234567890123], np.int64)
    want = strong(tf.strings.as_string(keys), 2**31 - 1, key).numpy()
    np.testing.assert_array_equal(_core.hash_int_keys(keys, 2**31 - 1, key), want)


def test_core_rejects_a_key_of_other_than_two_integers():
    with pytest.raises(ValueError, match="hash_key must be empty or hold 2 integers, got 3"):
        _core.hash_buckets([b"a"], 10, [1, 2, 3])


def test_a_key_of_one_integer_in_a_list_fails_in_to_hash_bucket_strongs_words():
    # TF's string_to_hash_bucket_op_test matches "Key must have 2 elements".
    params = tf.zeros([10, 2])
    for lookup in (lambda k: tco.hash_embedding(params, tf.ragged.constant([["a"]]), hash_key=k),
                   lambda k: tco.string_embedding(["a"], params, hash_key=k)):
        with pytest.raises(ValueError, match="Key must have 2 elements"):
            lookup([98765])


# ---------------------------------------------------------------------------
# string_embedding


def composition(strings, params, key, delimiter=",", combiner="mean", skip_empty=True):
    tokens = tf.strings.split(tf.constant(strings, tf.string), delimiter)
    if skip_empty:
        tokens = tf.ragged.boolean_mask(tokens, tf.not_equal(tokens, ""))
    ids = tokens.with_flat_values(strong(tokens.flat_values, params.shape[0], key))
    sp = ids.to_sparse()
    sp = tf.SparseTensor(sp.indices, sp.values, [len(strings), sp.dense_shape[1]])
    return tf.nn.safe_embedding_lookup_sparse(params, sp, None, combiner=combiner)


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("skip_empty", [True, False])
def test_string_embedding_with_a_key_is_the_strong_hash_composition(rng, key, combiner, skip_empty):
    params = table(rng)
    strings = random_strings(rng, 200) + ["a,,b,", "", "é,\x00"]
    got = tco.string_embedding(strings, params, combiner=combiner, skip_empty=skip_empty, hash_key=key)
    want = composition(strings, params, key, combiner=combiner, skip_empty=skip_empty)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    # The key matters: the fast hash pools other rows.
    fast = tco.string_embedding(strings, params, combiner=combiner, skip_empty=skip_empty)
    assert not np.allclose(got.numpy(), fast.numpy())


def test_one_integer_is_keras_salt_pair(rng):
    params = table(rng)
    strings = random_strings(rng, 50)
    assert_identical(tco.string_embedding(strings, params, hash_key=133),
                     tco.string_embedding(strings, params, hash_key=[133, 133]))


def test_string_embedding_with_a_key_on_an_empty_batch(rng):
    params = table(rng)
    got = tco.string_embedding(tf.zeros([0], tf.string), params, hash_key=[1, 2])
    assert got.shape == (0, 6)


def test_string_embedding_gradient_with_a_key_is_tfs(rng):
    params = tf.Variable(table(rng, rows=31))
    strings = random_strings(rng, 80)
    key = [133, 137]
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tco.string_embedding(strings, params, combiner="sqrtn", hash_key=key) ** 2)
    got = tape.gradient(loss, params)
    assert isinstance(got, tf.IndexedSlices)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(composition(strings, params, key, combiner="sqrtn") ** 2)
    np.testing.assert_allclose(densify(got), densify(tape.gradient(loss, params)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bad", [[1], [1, 2, 3], "ab", [2**64, 0]])
def test_a_bad_key_is_a_clear_error(rng, bad):
    with pytest.raises(ValueError, match="hash_key must be"):
        tco.string_embedding(["1"], table(rng), hash_key=bad)


def test_the_op_rejects_a_key_of_one_integer(rng):
    from tf_ctr_ops.strings import _ops

    data, splits, _ = _ops.ctr_pack_strings([tf.constant(["a"])])
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="hash_key must be empty or hold 2"):
        _ops.ctr_string_embedding(params=table(rng), bytes=data, row_splits=splits,
                                  bag_splits=tf.zeros([0], tf.int64), hash_key=[5])


# ---------------------------------------------------------------------------
# multi_string_embedding: keyed and unkeyed features in one op


@pytest.mark.parametrize("concat", [False, True])
def test_grouped_features_keep_each_ones_key(rng, concat):
    tables = [tf.Variable(table(rng, rows=r, dim=d)) for r, d in ((53, 4), (97, 3), (11, 5))]
    features = [tf.constant(random_strings(rng, 60)) for _ in tables]
    keys = [[7, 7], None, [-1, 3]]
    with tf.GradientTape() as tape:
        got = tco.multi_string_embedding(features, tables, hash_keys=keys, concat=concat)
        loss = tf.reduce_sum((tf.concat(got, 1) if not concat else got) ** 2)
    got_grads = tape.gradient(loss, tables)
    with tf.GradientTape() as tape:
        want = [composition(f.numpy().tolist(), t, k) if k else
                tco.string_embedding(f, t) for f, t, k in zip(features, tables, keys)]
        loss = tf.reduce_sum(tf.concat(want, 1) ** 2)
    want_grads = tape.gradient(loss, tables)
    np.testing.assert_allclose(tf.concat(got, 1) if not concat else got, tf.concat(want, 1), rtol=1e-5, atol=1e-6)
    for g, w in zip(got_grads, want_grads):
        np.testing.assert_allclose(densify(g), densify(w), rtol=1e-5, atol=1e-6)


def test_grouped_hash_keys_must_name_every_feature(rng):
    with pytest.raises(ValueError, match="hash_keys must be None or a list of 2"):
        tco.multi_string_embedding([tf.constant(["a"])] * 2, [table(rng)] * 2, hash_keys=[[1, 2]])


# ---------------------------------------------------------------------------
# hash_embedding: integer and string keys in every container


def keyed_reference(params, keys, key, combiner, weights=None):
    values = keys.flat_values
    strings = values if values.dtype == tf.string else tf.strings.as_string(values)
    ids = keys.with_flat_values(strong(strings, params.shape[0], key))
    w = None if weights is None else weights.to_sparse()
    return tf.nn.safe_embedding_lookup_sparse(params, ids.to_sparse(), w, combiner=combiner)


@pytest.mark.parametrize("key_dtype", [tf.int32, tf.int64, tf.string])
@pytest.mark.parametrize("combiner", COMBINERS)
def test_hash_embedding_with_a_key_matches_the_strong_hash(rng, key_dtype, combiner):
    params = table(rng, rows=1009, dim=8)
    lengths = rng.integers(0, 6, size=60)
    raw = rng.integers(-2**31, 2**31 - 1, size=lengths.sum())
    values = tf.constant(raw.astype(str).astype(object)) if key_dtype == tf.string else tf.constant(raw, key_dtype)
    rt = tf.RaggedTensor.from_row_lengths(values, lengths)
    w = tf.RaggedTensor.from_row_lengths(rng.uniform(0.1, 2, size=lengths.sum()).astype(np.float32), lengths)
    key = [133, 137]
    for keys, weights in ((rt, None), (rt, w), (rt.to_sparse(), None)):
        got = tco.hash_embedding(params, keys, weights, combiner=combiner, hash_key=key)
        np.testing.assert_allclose(got.numpy(), keyed_reference(params, rt, key, combiner,
                                                                weights if weights is not None else None).numpy(),
                                   rtol=1e-5, atol=1e-6)


def test_dense_padded_int_keys_with_a_key(rng):
    params = table(rng, rows=101)
    keys = tf.constant([[5, 17, -1], [-1, -1, -1], [123456789, -1, -1]], tf.int64)
    rt = tf.ragged.constant([[5, 17], [], [123456789]], tf.int64)
    assert_identical(tco.hash_embedding(params, keys, combiner="sum", hash_key=9),
                     keyed_reference(params, rt, [9, 9], "sum"))


def test_hash_embedding_gradient_with_a_key(rng):
    params = tf.Variable(table(rng, rows=101, dim=4))
    rt = tf.ragged.constant([[5, 17, 5], [], [123456789]], tf.int64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tco.hash_embedding(params, rt, combiner="sum", hash_key=[3, 4]) ** 2)
    got = tape.gradient(loss, params)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(keyed_reference(params, rt, [3, 4], "sum") ** 2)
    np.testing.assert_allclose(densify(got), densify(tape.gradient(loss, params)), rtol=1e-6)


def test_hash_embedding_layer_salt_is_kerass(rng):
    import keras

    layer = tco.layers.HashEmbedding(num_buckets=64, output_dim=4, combiner="sum", salt=133)
    keys = tf.constant([[11], [12], [-7]], tf.int64)
    got = layer(keys)
    rows = keras.layers.Hashing(64, salt=133)(keys)
    assert_identical(got, tf.gather(layer.embeddings, rows[:, 0]))
    clone = tco.layers.HashEmbedding.from_config(layer.get_config())
    assert clone.salt == [133, 133]
    assert tco.layers.HashEmbedding(num_buckets=64, output_dim=4).get_config()["salt"] is None


# ---------------------------------------------------------------------------
# The rewrite: keras.layers.Hashing(salt=...) models


def keras_salted_model(int_keys=False, salts=(133, None), bins=64, dim=8):
    import keras

    keras.utils.set_random_seed(0)
    names = ["site", "app"]
    inputs = [keras.Input((1,), dtype="int64" if int_keys else "string", name=n) for n in names]
    embedded = [keras.layers.Flatten()(keras.layers.Embedding(bins, dim, name=f"{n}_emb")(
        keras.layers.Hashing(bins, salt=s, name=f"{n}_hash")(x))) for n, x, s in zip(names, inputs, salts)]
    x = keras.layers.Concatenate()(embedded)
    return keras.Model(inputs, keras.layers.Dense(1, name="ctr")(x))


def salted_inputs(rng, int_keys, n=48):
    if int_keys:
        return {k: tf.constant(rng.integers(-10**6, 10**6, size=(n, 1)), tf.int64) for k in ("site", "app")}
    return {k: tf.reshape(tf.constant(random_strings(rng, n)), [-1, 1]) for k in ("site", "app")}


@pytest.mark.parametrize("salts", [(133, None), ([1, 2], 7)])
def test_salted_hashing_layers_fuse_and_group_online(rng, salts):
    model = keras_salted_model(salts=salts)
    inputs = salted_inputs(rng, False)
    want = model(inputs)
    got, stats = run_online(lambda x: model(x), inputs)
    assert stats["rewrites"] == 4 + CPU_PASS  # two hash_gather, group_strings, concat_strings
    assert_model_close(got, want)


def test_salted_hashing_of_int_keys_fuses_online(rng):
    model = keras_salted_model(int_keys=True)
    inputs = salted_inputs(rng, True)
    want = model(inputs)
    got, stats = run_online(lambda x: model(x), inputs)
    assert stats["rewrites"] >= 2
    assert_model_close(got, want)


def test_salted_split_tokens_fuse_as_one_op(rng):
    params = tf.Variable(table(rng, rows=50, dim=4))

    def f(s):
        ids = strong(tf.strings.split(s, "|"), 50, [5, 6])
        return tf.reduce_sum(tf.nn.embedding_lookup(params, ids), axis=1)

    strings = tf.constant(["1|2|3", "", "x|y", "é|\x00|z|z"])
    got, stats = run_online(f, strings)
    assert stats["rewrites"] >= 1
    assert_identical(got, f(strings))


@pytest.mark.saved_model
@pytest.mark.parametrize("int_keys", [False, True])
def test_salted_keras_saved_model_rewrites_verifies_and_serves(tmp_path, rng, int_keys):
    model = keras_salted_model(int_keys=int_keys)
    src, dst = tmp_path / "src", tmp_path / "dst"
    model.export(str(src), verbose=False)
    samples = {k: v.numpy() for k, v in salted_inputs(rng, int_keys).items()}
    report = rewrite.optimize_saved_model(src, dst, sample_inputs={"serving_default": samples, "serve": samples})
    assert report.ok and report.verified
    sig = report.signatures["serving_default"]
    assert sig.max_abs_diff == 0
    assert "StringToHashBucketStrong" not in sig.op_counts_after, sig.op_counts_after
    feeds = {k: tf.constant(v) for k, v in salted_inputs(rng, int_keys, 7).items()}
    assert_identical(tf.saved_model.load(str(dst)).signatures["serving_default"](**feeds)["output_0"],
                     tf.saved_model.load(str(src)).signatures["serving_default"](**feeds)["output_0"])

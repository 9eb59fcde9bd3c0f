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


def test_shards_in_the_div_layout_read_as_the_other_lookups_read_them(rng):
    # A list of shards was packed into one [3, ...] tensor ("Shapes of all
    # inputs must match"), where the other lookups take TF's "div" layout.
    table = string_table(default=3)
    shards = [tf.Variable(rng.normal(size=(n, 4)).astype(np.float32)) for n in (14, 13, 13)]
    keys = tf.constant(string_keys(rng, (25, 2), oov=0.2))
    with tf.GradientTape() as tape:
        got = tco.vocab_embedding(table, keys, shards)
        loss = tf.reduce_sum(got * got)
    whole = tf.Variable(tf.concat(shards, 0))
    with tf.GradientTape() as native_tape:
        want = native(table, keys, whole)
        native_loss = tf.reduce_sum(want * want)
    np.testing.assert_array_equal(got, want)
    grads, whole_grad = tape.gradient(loss, shards), tf.convert_to_tensor(native_tape.gradient(native_loss, whole))
    np.testing.assert_allclose(tf.concat([tf.convert_to_tensor(g) for g in grads], 0), whole_grad, rtol=1e-6)
    with pytest.raises(ValueError, match="'div' layout"):
        tco.vocab_embedding(table, keys, shards[::-1][:2] + [tf.zeros([20, 4])])


def test_in_a_tf_function_and_empty_batch(rng):
    table = string_table(default=0)
    params = tf.constant(rng.normal(size=(40, 4)), tf.float32)

    @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.string)])
    def serve(keys):
        return tco.vocab_embedding(table, keys, params, missing_key="default")

    for n in (0, 1, 9):
        keys = tf.constant(string_keys(rng, (n, 1), oov=0.5).reshape(n, 1))
        np.testing.assert_array_equal(serve(keys), native(table, keys, params))


# ---------------------------------------------------------------------------
# Keras' mask_token and num_oov_indices > 1 rules, against the ops Keras runs
# for them (keras/src/layers/preprocessing/index_lookup.py's _lookup_dense).

def keras_rules_native(table, keys, params, mask_key, mask_id, oov_slots, oov_start):
    ids = table.lookup(keys)
    if mask_key is not None:
        ids = tf.where(tf.equal(keys, mask_key), tf.constant(mask_id, tf.int64), ids)
    if oov_slots:
        slot = (tf.strings.to_hash_bucket_fast(keys, oov_slots) if keys.dtype == tf.string
                else tf.math.floormod(keys, oov_slots))
        ids = tf.where(tf.equal(ids, table.default_value), slot + oov_start, ids)
    return tf.gather(params, ids)


def keyed_case(rng, key_dtype, shape):
    """A Keras-like table (mask 0, OOV slots from 1, the vocabulary from 4)
    and keys with out-of-vocabulary ones, masks and, for integers, negatives."""
    if key_dtype == tf.string:
        table = string_table(default=1, values=np.arange(len(VOCAB)) + 4)
        pool = np.array(VOCAB + ["", "not-a-word", "zz", "w3 "], object)
    else:
        init = tf.lookup.KeyValueTensorInitializer(tf.constant(np.arange(0, 400, 10), tf.int64),
                                                   tf.range(4, 44, dtype=tf.int64))
        table = tf.lookup.StaticHashTable(init, 1)
        pool = np.concatenate([np.arange(0, 400, 10), [-1, -7, -13, 5, 401, 2**63 - 1, -(2**63)]]).astype(np.int64)
    keys = pool[rng.integers(0, len(pool), size=shape)] if shape else pool[3]
    return table, tf.constant(keys, key_dtype)


@pytest.mark.parametrize("key_dtype", [tf.string, tf.int64])
@pytest.mark.parametrize("mask", ["none", "outside", "in_vocabulary"])
@pytest.mark.parametrize("oov_slots", [0, 1, 3])
@pytest.mark.parametrize("shape", [(0,), (50,), (9, 4), ()])
def test_keras_mask_and_oov_slots_match_keras_ops(rng, key_dtype, mask, oov_slots, shape):
    table, keys = keyed_case(rng, key_dtype, shape)
    mask_key = {"none": None, "outside": "" if key_dtype == tf.string else -7,
                "in_vocabulary": "w3" if key_dtype == tf.string else 30}[mask]
    params = tf.constant(rng.normal(size=(44, 3)), tf.float32)
    args = dict(mask_key=mask_key, mask_id=0, oov_slots=oov_slots, oov_start=1)
    got = tco.vocab_embedding(table, keys, params, **args)
    np.testing.assert_array_equal(got, keras_rules_native(table, keys, params, **args))


def test_keras_rules_gradient_is_indexed_slices_of_the_rows_read(rng):
    table, keys = keyed_case(rng, tf.string, (40, 3))
    var = tf.Variable(rng.normal(size=(44, 2)).astype(np.float32))
    upstream = tf.constant(rng.normal(size=(40, 3, 2)), tf.float32)
    args = dict(mask_key="", mask_id=0, oov_slots=3, oov_start=1)
    grads = []
    for fn in (tco.vocab_embedding, keras_rules_native):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(fn(table, keys, var, **args) * upstream)
        grads.append(tape.gradient(loss, var))
    assert isinstance(grads[0], tf.IndexedSlices)
    np.testing.assert_allclose(tf.convert_to_tensor(grads[0]), tf.convert_to_tensor(grads[1]), rtol=1e-6, atol=1e-6)


def test_keras_mask_then_missing_key_check(rng):
    # mask_token with num_oov_indices=0: the mask key is no missing key, any
    # other key the table lacks still is, named with its row.
    table = string_table(default=-1, values=np.arange(len(VOCAB)) + 1)
    params = tf.constant(rng.normal(size=(41, 2)), tf.float32)
    keys = tf.constant([["w0", ""], ["", "w39"]])
    got = tco.vocab_embedding(table, keys, params, missing_key="error", mask_key="")
    np.testing.assert_array_equal(got, keras_rules_native(table, keys, params, "", 0, 0, 0))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"key 'zz' in row 1 is not in the vocabulary"):
        tco.vocab_embedding(table, tf.constant([["w0", ""], ["", "zz"]]), params, missing_key="error", mask_key="")


def test_keras_rules_arguments_are_checked():
    with pytest.raises(TypeError, match="mask_key must be a scalar string key"):
        tco.vocab_embedding(string_table(), tf.constant(["w1"]), tf.zeros([40, 2]), mask_key=0)
    with pytest.raises(TypeError, match="mask_key must be a scalar int64 key"):
        tco.vocab_embedding(int_table(), tf.constant([10], tf.int64), tf.zeros([40, 2]), mask_key=[10, 20])
    with pytest.raises(ValueError, match="oov_slots must be >= 0"):
        tco.vocab_embedding(string_table(), tf.constant(["w1"]), tf.zeros([40, 2]), oov_slots=-1)
    # The op itself, as a graph gives it a mask of another shape.
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="must be rank 0|must be scalars"):
        tco.vocab._ops.ctr_vocab_embedding(table_handle=int_table().resource_handle, keys=tf.constant([10], tf.int64),
                                           default_value=tf.constant(-1, tf.int64), params=tf.zeros([40, 2]),
                                           mask_keys=[tf.constant([10], tf.int64)],
                                           mask_ids=[tf.constant(0, tf.int64)])


# ---------------------------------------------------------------------------
# The memo of an initialized table's finds (cc/core/vocab_memo.h): every call
# after the first answers from it, so each test calls the op again and again.

_ops = tco.vocab._ops


def raw_rows(table, keys, params, default):
    """The op's `rows` output, with the default value given per call."""
    _, rows = _ops.ctr_vocab_embedding(table_handle=table.resource_handle, keys=keys,
                                       default_value=tf.constant(default, tf.int64), params=params,
                                       mask_keys=[], mask_ids=[])
    return rows.numpy()


def test_memoized_finds_match_the_table_call_after_call(rng):
    table = string_table(default=7)
    params = tf.constant(rng.normal(size=(40, 3)), tf.float32)
    serve = tf.function(lambda keys: tco.vocab_embedding(table, keys, params))
    for n in (5, 300, 0, 1, 2000):  # new keys, out-of-vocabulary ones included, join the memo as they come
        keys = tf.constant(string_keys(rng, (n,), oov=0.3))
        np.testing.assert_array_equal(serve(keys), native(table, keys, params))
    long_keys = tf.constant(["w1" * 40, "w" + "x" * 20, "w2", "w" * 9, ""])  # memcmp, both loads, the byte loop
    for _ in range(3):
        np.testing.assert_array_equal(serve(long_keys), native(table, long_keys, params))


def test_memoized_missing_keys_take_each_calls_default(rng):
    table = string_table()
    params = tf.zeros([40, 2])
    keys = tf.constant(["w3", "nope", "w0", "nope"])
    for default in (5, 9, 5):
        np.testing.assert_array_equal(raw_rows(table, keys, params, default), [3, default, 0, default])


@pytest.mark.parametrize("sentinel", [np.iinfo(np.int64).min, np.iinfo(np.int64).min + 1])
def test_keys_whose_ids_are_the_memos_sentinels_are_not_taken_for_missing(sentinel):
    # The memo asks the table with these two values as defaults to tell a
    # missing key from one it has; a key mapped to either must keep its id.
    values = np.arange(len(VOCAB))
    values[4] = sentinel
    table = string_table(default=1, values=values)
    for _ in range(3):
        with pytest.raises(tf.errors.InvalidArgumentError, match=rf"id {sentinel} of key 'w4' in row 1 "):
            tco.vocab_embedding(table, tf.constant(["w0", "w4"]), tf.zeros([40, 2]))
        np.testing.assert_array_equal(raw_rows(table, tf.constant(["w5", "gone"]), tf.zeros([40, 2]), 3), [5, 3])


def test_memoized_integer_keys(rng):
    table = int_table(default=39)
    params = tf.constant(rng.normal(size=(40, 2)), tf.float32)
    for _ in range(3):
        keys = tf.constant(rng.integers(-20, 420, size=(500,)), tf.int64)  # most are missing
        np.testing.assert_array_equal(tco.vocab_embedding(table, keys, params), native(table, keys, params))


def test_one_kernel_serving_two_tables_keeps_them_apart(rng):
    # Eager execution reuses one kernel for every call with the same attrs,
    # whatever table handle each call feeds it.
    first, second = string_table(default=0), string_table(default=0, values=np.arange(len(VOCAB))[::-1].copy())
    params = tf.constant(rng.normal(size=(40, 2)), tf.float32)
    keys = tf.constant(string_keys(rng, (50,), oov=0.1))
    for table in (first, second, first, second):
        np.testing.assert_array_equal(tco.vocab_embedding(table, keys, params), native(table, keys, params))


def test_tables_that_change_are_asked_every_time():
    table = tf.lookup.experimental.MutableHashTable(tf.string, tf.int64, default_value=0)
    params = tf.reshape(tf.range(40, dtype=tf.float32), [40, 1])
    table.insert(tf.constant(["a", "b"]), tf.constant([1, 2], tf.int64))
    assert tco.vocab_embedding(table, tf.constant(["a", "b"]), params).numpy().ravel().tolist() == [1, 2]
    table.insert(tf.constant(["a"]), tf.constant([7], tf.int64))
    table.remove(tf.constant(["b"]))
    assert tco.vocab_embedding(table, tf.constant(["a", "b"]), params).numpy().ravel().tolist() == [7, 0]


def test_memo_under_concurrent_calls(rng):
    import concurrent.futures

    table = string_table(default=2)
    params = tf.constant(rng.normal(size=(40, 4)), tf.float32)
    serve = tf.function(lambda keys: tco.vocab_embedding(table, keys, params))
    batches = [tf.constant(string_keys(np.random.default_rng(i), (400,), oov=0.2)) for i in range(16)]
    serve(batches[0][:1])

    def check(keys):
        for _ in range(5):
            np.testing.assert_array_equal(serve(keys), native(table, keys, params))

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for f in [pool.submit(check, keys) for keys in batches]:
            f.result()


# ---------------------------------------------------------------------------
# CtrConcatVocabEmbedding: the vocabulary embeddings of a Concatenate, written
# in place (what the concat_vocab rewrite pattern makes of them).


def concat_vocab(tables, keys, params, dense, layout, missing=None, wrap=(False, False, True), **rules):
    n = len(tables)
    missing = missing or ["default"] * n
    rules = {"mask_keys": [], "mask_ids": [], **rules}
    return _ops.ctr_concat_vocab_embedding(
        table_handles=[t.resource_handle for t in tables], keys=keys,
        default_values=[tf.constant(t.default_value, tf.int64) for t in tables], params=params, dense=dense,
        missing_keys=missing, missing_ids=[int(t.default_value) for t in tables], wrap_negative_ids=list(wrap),
        layout=layout, **rules)


def concat_case(rng, batch):
    tables = [string_table(default=0), int_table(default=39), string_table(default=-3, values=np.arange(40) - 20)]
    params = [tf.Variable(rng.normal(size=(40, d)).astype(np.float32)) for d in (3, 2, 4)]
    keys = [tf.constant(string_keys(rng, (batch,), oov=0.2)), tf.constant(rng.integers(-10, 410, size=(batch,))),
            tf.constant(string_keys(rng, (batch,), oov=0.2))]
    dense = [tf.Variable(rng.normal(size=(batch, w)).astype(np.float32)) for w in (1, 5)]
    return tables, params, keys, dense


def assert_same_outputs_and_gradients(fused, composed, variables, upstream):
    """fused() and composed() agree, forward and in the gradients of
    sum(output * upstream) for `variables`."""
    results = []
    for fn in (fused, composed):
        with tf.GradientTape() as tape:
            out = fn()
            loss = tf.reduce_sum(out * upstream)
        results.append((out, [tf.convert_to_tensor(g) for g in tape.gradient(loss, variables)]))
    (got, got_grads), (want, want_grads) = results
    np.testing.assert_array_equal(got, want)
    for g, w in zip(got_grads, want_grads):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("batch", [0, 1, 37, 3000])
def test_concat_op_matches_the_concatenation_of_single_lookups(rng, batch):
    tables, params, keys, dense = concat_case(rng, batch)
    layout = [3, 0, 1, 4, 2]  # dense 0, features 0 and 1, dense 1, feature 2
    upstream = tf.constant(rng.normal(size=(batch, 1 + 3 + 2 + 5 + 4)), tf.float32)

    def composed():
        feats = [native(t, k, p, wrap=(i == 2)) for i, (t, k, p) in enumerate(zip(tables, keys, params))]
        return tf.concat([dense[0], feats[0], feats[1], dense[1], feats[2]], axis=1)

    assert_same_outputs_and_gradients(lambda: concat_vocab(tables, keys, params, dense, layout), composed,
                                      params + dense, upstream)


def test_concat_op_fails_where_the_concatenation_or_a_lookup_fails(rng):
    tables, params, keys, dense = concat_case(rng, 6)
    with pytest.raises(tf.errors.InvalidArgumentError, match="dense input 1 must be a \\[6, w\\] matrix"):
        concat_vocab(tables, keys, params, [dense[0], tf.zeros([5, 2])], [])
    with pytest.raises(tf.errors.InvalidArgumentError, match="feature 1 must have a \\[6\\] key vector"):
        concat_vocab(tables, [keys[0], keys[1][:4], keys[2]], params, dense, [])
    bad = tf.constant(["w1", "w2", "nope", "w3", "nope", "w4"])  # the table's default, -3, marks a missing key
    with pytest.raises(tf.errors.InvalidArgumentError, match="key 'nope' in row 2 is not in the vocabulary"):
        concat_vocab(tables, [keys[0], keys[1], bad], params, dense, [],
                     missing=["default", "default", "error"])
    with pytest.raises(tf.errors.InvalidArgumentError, match="layout"):
        concat_vocab(tables, keys, params, dense, [0, 0, 1, 2, 3])


@pytest.mark.parametrize("batch", [0, 1, 300])
def test_concat_op_takes_each_features_keras_rules(rng, batch):
    # Feature 0: a string mask and 3 OOV slots; feature 1: none; feature 2: an
    # integer mask and 2 slots; feature 3: 2 slots, no mask. Each must equal
    # its single op, forward and gradient.
    strings, ints = keyed_case(rng, tf.string, (batch,)), keyed_case(rng, tf.int64, (batch,))
    tables = [strings[0], string_table(default=0), ints[0], strings[0]]
    keys = [strings[1], tf.constant(string_keys(rng, (batch,), oov=0.2)), ints[1], tf.reverse(strings[1], [0])]
    params = [tf.Variable(rng.normal(size=(44, d)).astype(np.float32)) for d in (3, 2, 4, 1)]
    singles = [dict(mask_key="", mask_id=0, oov_slots=3, oov_start=1), {},
               dict(mask_key=tf.constant(-7, tf.int64), mask_id=0, oov_slots=2, oov_start=1),
               dict(oov_slots=2, oov_start=2)]
    rules = dict(mask_keys=[tf.constant(""), tf.constant(-7, tf.int64)], mask_ids=[tf.constant(0, tf.int64)] * 2,
                 masked_features=[0, 2], oov_slots=[3, 0, 2, 2], oov_ids=[1, -1, 1, 1], oov_starts=[1, 0, 1, 2])
    upstream = tf.constant(rng.normal(size=(batch, 10)), tf.float32)
    assert_same_outputs_and_gradients(
        lambda: concat_vocab(tables, keys, params, [], [], wrap=[False] * 4, **rules),
        lambda: tf.concat([tco.vocab_embedding(t, k, p, **r) for t, k, p, r in zip(tables, keys, params, singles)],
                          axis=1),
        params, upstream)


def test_concat_op_checks_its_keras_rules(rng):
    tables, params, keys, dense = concat_case(rng, 4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="masked_features must be increasing"):
        concat_vocab(tables, keys, params, dense, [], mask_keys=[tf.constant(3, tf.int64)],
                     mask_ids=[tf.constant(0, tf.int64)], masked_features=[0])  # feature 0 has string keys
    with pytest.raises(tf.errors.InvalidArgumentError, match="must have N = 3 entries each, or none"):
        concat_vocab(tables, keys, params, dense, [], oov_slots=[2], oov_ids=[0], oov_starts=[0])


@pytest.mark.parametrize("dtype", [tf.float64, tf.float16, tf.bfloat16])
def test_concat_op_in_every_table_dtype(rng, dtype):
    tables, params, keys, dense = concat_case(rng, 9)
    params = [tf.cast(p, dtype) for p in params]
    dense = [tf.cast(d, dtype) for d in dense]
    got = concat_vocab(tables, keys, params, dense, [])
    feats = [native(t, k, p, wrap=(i == 2)) for i, (t, k, p) in enumerate(zip(tables, keys, params))]
    want = tf.concat(feats + dense, axis=1)
    assert got.dtype == dtype
    np.testing.assert_array_equal(tf.cast(got, tf.float32), tf.cast(want, tf.float32))


def _byte_keys():
    from hypothesis import strategies as st

    return st.binary(min_size=0, max_size=40)


def test_memo_on_random_byte_keys():
    """Any bytes (empty, NUL, every length the compare branches on), keys
    seen first in any call, the memo's growth past its first slots."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=40, deadline=None)
    @given(vocab=st.lists(_byte_keys(), min_size=1, max_size=1500, unique=True),
           calls=st.lists(st.lists(st.one_of(st.integers(0, 10**6), _byte_keys()), max_size=60), min_size=1,
                          max_size=4))
    def check(vocab, calls):
        init = tf.lookup.KeyValueTensorInitializer(tf.constant(vocab, tf.string),
                                                   tf.range(len(vocab), dtype=tf.int64))
        table = tf.lookup.StaticHashTable(init, len(vocab))  # missing keys read the last row
        params = tf.reshape(tf.range(len(vocab) + 1, dtype=tf.float32), [-1, 1])
        for call in [list(range(len(vocab)))] + calls:  # the whole vocabulary first: the memo grows
            keys = [vocab[k % len(vocab)] if isinstance(k, int) else k for k in call]
            keys = tf.constant(keys, tf.string) if keys else tf.zeros([0], tf.string)
            np.testing.assert_array_equal(tco.vocab_embedding(table, keys, params), native(table, keys, params))

    check()


def test_a_table_of_vector_values_is_an_error_not_a_heap_corruption():
    # A MutableHashTable of int64 vectors passes TF's own find checks with a
    # vector default; its find writes a vector per key, past ids shaped as
    # the keys (the process died in free()). Every fused find refuses it.
    from tf_ctr_ops.vocab import _ops

    table = tf.lookup.experimental.MutableHashTable(tf.string, tf.int64, default_value=[-1, -1])
    table.insert(tf.constant(["a", "b"]), tf.constant([[0, 1], [1, 0]], tf.int64))
    handle, default = table.resource_handle, tf.constant([-1, -1], tf.int64)
    keys = tf.constant([["a", "b"], ["c", "a"]])
    params = tf.random.normal([4, 3])
    calls = {
        "CtrVocabEmbedding": lambda: _ops.ctr_vocab_embedding(
            table_handle=handle, keys=keys[:, 0], default_value=default, params=params, mask_keys=[], mask_ids=[]),
        "CtrVocabMultiHot": lambda: _ops.ctr_vocab_multi_hot(
            table_handle=handle, keys=keys, default_value=default, kernel=params),
        "CtrConcatVocabEmbedding": lambda: _ops.ctr_concat_vocab_embedding(
            table_handles=[handle], keys=[keys[:, 0]], default_values=[default], params=[params], dense=[],
            mask_keys=[], mask_ids=[], missing_keys=["default"], missing_ids=[-1], wrap_negative_ids=[False]),
        "CtrVocabIndicator": lambda: _ops.ctr_vocab_indicator(
            table_handle=handle, default_value=default, keys=tf.constant(["a", "c"]),
            indices=tf.constant([[0, 0], [1, 0]], tf.int64), dense_shape=tf.constant([2, 1], tf.int64), depth=4, T=tf.float32),
    }
    for op, call in calls.items():
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"int64 scalar row ids, got int64 of shape \[2\]"):
            call()


@pytest.mark.parametrize("mutable", [False, True])
def test_a_default_of_one_value_per_key_is_an_error_not_an_abort(mutable):
    # TF's own find checks accept a default shaped as the keys (one per key);
    # the fused finds read one default, and a CHECK failure killed the
    # process (StaticHashTable; MutableHashTable with OOV buckets).
    from tf_ctr_ops.vocab import _ops

    if mutable:
        table = tf.lookup.experimental.MutableHashTable(tf.string, tf.int64, default_value=-1)
        table.insert(tf.constant(["a"]), tf.constant([1], tf.int64))
    else:
        table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
            tf.constant(["a", "b"]), tf.constant([1, 2], tf.int64)), default_value=-1)
    handle, keys, default = table.resource_handle, tf.constant(["a", "zz"]), tf.constant([0, 1], tf.int64)
    params = tf.ones([5, 2])
    lookup = lambda buckets: _ops.ctr_vocab_embedding_lookup(  # noqa: E731
        handle, default, params, keys, tf.constant([0, 2], tf.int64), tf.constant(-1, tf.int64), tf.zeros([0]),
        mask_keys=[], mask_ids=[], segment_kind="row_splits", num_oov_buckets=buckets)
    calls = [lambda: lookup(2)]
    if not mutable:
        calls += [
            lambda: _ops.ctr_vocab_embedding(handle, keys, default, params, [], []),
            lambda: lookup(0),
            lambda: _ops.ctr_vocab_multi_hot(handle, tf.reshape(keys, [1, 2]), tf.reshape(default, [1, 2]),
                                             tf.ones([5, 2])),
            lambda: _ops.ctr_concat_vocab_embedding([handle], [keys], [default], [params], [], [], [],
                                                    missing_keys=["default"], missing_ids=[-1],
                                                    wrap_negative_ids=[False]),
            lambda: _ops.ctr_vocab_indicator(handle, default, keys, tf.constant([[0, 0], [0, 1]], tf.int64),
                                             tf.constant([1, 2], tf.int64), depth=4, T=tf.float32),
        ]
    for call in calls:
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"default_value must be a scalar, got shape \[1?,?2\]"):
            call()


def test_a_table_of_vector_keys_is_an_error_not_an_abort():
    # A DenseHashTable with a vector empty_key finds one id per key vector;
    # the fused finds wrote one per key and TF's CHECK killed the process.
    from tf_ctr_ops.vocab import _ops

    table = tf.lookup.experimental.DenseHashTable(tf.int64, tf.int64, default_value=0, empty_key=[-1, -1],
                                                  deleted_key=[-2, -2])
    table.insert(tf.constant([[1, 2], [3, 4]], tf.int64), tf.constant([1, 2], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"keys must be scalars, got keys of shape \[2\]"):
        _ops.ctr_vocab_embedding(table.resource_handle, tf.constant([[1, 2], [3, 4], [9, 9]], tf.int64),
                                 tf.constant(0, tf.int64), tf.ones([5, 2]), [], [])


def test_concat_vocab_with_scalar_first_keys_names_their_shape():
    # It said "feature 0 must have a [-1] key vector, as feature 0 has".
    table = string_table()
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"feature 0 must have a \[B\] key vector, got keys \[\]"):
        concat_vocab([table, table], [tf.constant("w1"), tf.constant(["w2"])], [tf.ones([40, 3]), tf.ones([40, 2])],
                     [], [0, 1], wrap=(False, False))


def test_a_static_vocabulary_table_is_refused_with_the_way_round():
    init = tf.lookup.KeyValueTensorInitializer(tf.constant(["w1", "w2"]), tf.constant([0, 1], tf.int64))
    table = tf.lookup.StaticVocabularyTable(init, num_oov_buckets=2)
    with pytest.raises(TypeError, match="got StaticVocabularyTable .*StaticHashTable of the vocabulary with "
                       "default_value=-1, and num_oov_buckets"):
        tco.vocab_embedding(table, tf.constant(["w1"]), tf.ones([4, 2]))

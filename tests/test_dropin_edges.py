"""Edges of the drop-ins' contract, each against the TF function (or the TF
composition) it replaces: tables of unknown rank, lists of shards for the
computed-id lookups, the gradient's IndexedSlices dtypes, and max_norm
given as a tensor."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.distribute import sharded_variable

import tf_ctr_ops as tco

P = np.arange(21, dtype=np.float32).reshape(7, 3) / 10
UNKNOWN = [tf.TensorSpec(None, tf.float32)]


def close(a, b):
    a, b = tf.convert_to_tensor(a), tf.convert_to_tensor(b)
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


def vocab_table():
    init = tf.lookup.KeyValueTensorInitializer(tf.constant(["a", "b", "c"]), tf.constant([1, 2, 5], tf.int64))
    return tf.lookup.StaticHashTable(init, -1)


# --- tables of unknown rank -------------------------------------------------

def rank3_ids():
    return tf.SparseTensor([[0, 0, 0], [0, 1, 0], [1, 0, 1]], tf.constant([1, 4, 2], tf.int64), [2, 2, 2])


@pytest.mark.parametrize("table", ["function_arg", "variable"])
def test_safe_lookup_rank3_ids_unknown_rank_table(table):
    def run(fn):
        if table == "variable":
            return fn(tf.Variable(P, shape=tf.TensorShape(None)), rank3_ids(), None)
        return tf.function(lambda p: fn(p, rank3_ids(), None), input_signature=UNKNOWN)(tf.constant(P))

    close(run(tco.safe_embedding_lookup_sparse), run(tf.nn.safe_embedding_lookup_sparse))


@pytest.mark.parametrize("index", [[0, 0, 3], [0, 1, 9], [1, 0, 5], [0, 0, 1]])
def test_safe_lookup_rank3_index_past_the_last_dim_carries_as_sparse_reshape_does(index):
    # TF reshapes the ids to [bags, dense_shape[-1]]: a last index past it
    # lands in a later bag, or past the last bag (an InvalidArgumentError).
    ids = tf.SparseTensor([index, [1, 1, 0]], tf.constant([1, 2], tf.int64), [2, 2, 2])
    try:
        want = tf.nn.safe_embedding_lookup_sparse(P, ids, None)
    except tf.errors.InvalidArgumentError:
        with pytest.raises(tf.errors.InvalidArgumentError):
            tco.safe_embedding_lookup_sparse(P, ids, None)
        return
    close(tco.safe_embedding_lookup_sparse(P, ids, None), want)


@pytest.mark.parametrize("dense_shape", [[3, 2, 0], [0, 2, 2]])
def test_safe_lookup_rank3_entries_in_a_shape_of_no_elements_are_an_error_as_in_tf(dense_shape):
    # With dense_shape[-1] == 0 every entry was pooled into bag 0.
    ids = tf.SparseTensor([[1, 1, 0], [2, 0, 0]], tf.constant([3, 2], tf.int64), dense_shape)
    for lookup in (tf.nn.safe_embedding_lookup_sparse, tco.safe_embedding_lookup_sparse):
        with pytest.raises(tf.errors.InvalidArgumentError):
            lookup(P, ids, None, combiner="sum")
    empty = tf.SparseTensor(tf.zeros([0, 3], tf.int64), tf.zeros([0], tf.int64), dense_shape)
    close(tco.safe_embedding_lookup_sparse(P, empty, None), tf.nn.safe_embedding_lookup_sparse(P, empty, None))


def test_safe_lookup_rank3_ids_v1_placeholder():
    with tf.Graph().as_default():
        ph, ids = tf.compat.v1.placeholder(tf.float32, None), rank3_ids()
        ours = tco.safe_embedding_lookup_sparse(ph, ids, None)
        ref = tf.compat.v1.nn.safe_embedding_lookup_sparse(ph, ids, None)
        with tf.compat.v1.Session() as sess:
            a, b = sess.run([ours, ref], {ph: P})
    np.testing.assert_allclose(a, b, rtol=1e-6)


def _sparse(ids, dtype=tf.int64):
    return tf.SparseTensor([[0, 0], [0, 1], [1, 0]], tf.cast(ids, dtype), [2, 2])


# (ours, the TF composition it replaces) over a table `p`
COMPOSITIONS = {
    "cross": (lambda p: tco.cross_embedding_lookup(p, [tf.constant([[1], [2]])], 7),
              lambda p: tf.nn.safe_embedding_lookup_sparse(p, tf.sparse.cross_hashed([tf.constant([[1], [2]])], 7),
                                                           None)),
    "bucketized": (lambda p: tco.bucketized_embedding_lookup(p, tf.constant([[0.5], [2.0]]), [1.0]),
                   lambda p: tf.nn.safe_embedding_lookup_sparse(
                       p, tf.SparseTensor([[0, 0], [1, 0]], tf.constant([0, 1], tf.int64), [2, 1]), None)),
    "sparse_embedding": (lambda p: tco.sparse_embedding(p, _sparse([1, 2, 3])),
                         lambda p: tf.nn.embedding_lookup_sparse(p, _sparse([1, 2, 3]), None)),
    "hash_embedding": (lambda p: tco.hash_embedding(p, _sparse([11, 12, 13])),
                       lambda p: tf.nn.embedding_lookup_sparse(
                           p, _sparse(tf.strings.to_hash_bucket_fast(tf.strings.as_string([11, 12, 13]), 7)), None)),
}


@pytest.mark.parametrize("op", sorted(COMPOSITIONS))
def test_batch_dim_on_unknown_rank_table(op):
    ours, ref = (tf.function(f, input_signature=UNKNOWN) for f in COMPOSITIONS[op])
    close(ours(tf.constant(P)), ref(tf.constant(P)))


def test_vocab_lookup_sparse_unknown_rank_table():
    table = vocab_table()
    keys = tf.SparseTensor([[0, 0], [0, 1], [1, 0]], tf.constant(["a", "c", "b"]), [2, 2])
    ours = tf.function(lambda p: tco.vocab_embedding_lookup_sparse(table, keys, p), input_signature=UNKNOWN)
    ref = tf.function(lambda p: tf.nn.safe_embedding_lookup_sparse(p, table.lookup(keys), None),
                      input_signature=UNKNOWN)
    close(ours(tf.constant(P)), ref(tf.constant(P)))


# --- lists of shards for the computed-id lookups -----------------------------

TABLE = np.arange(16, dtype=np.float32).reshape(8, 2)


@pytest.mark.parametrize("op", ["cross", "bucketized"])
@pytest.mark.parametrize("num_shards", [2, 3])
def test_computed_ids_read_shard_list_as_div(op, num_shards):
    shards = [tf.constant(s) for s in np.array_split(TABLE, num_shards)]
    ours, ref = COMPOSITIONS[op]
    close(ours(shards), ref(shards))


def test_vocab_lookup_sparse_reads_shard_list_as_div():
    table = vocab_table()
    keys = tf.SparseTensor([[0, 0], [0, 1], [1, 0]], tf.constant(["a", "c", "b"]), [2, 2])
    shards = [tf.constant(s) for s in np.array_split(TABLE, 3)]
    close(tco.vocab_embedding_lookup_sparse(table, keys, shards),
          tf.nn.safe_embedding_lookup_sparse(shards, table.lookup(keys), None))


def test_shard_list_gradient_reaches_each_shard():
    shards = [tf.Variable(s) for s in np.array_split(TABLE, 2)]
    grads = []
    for fn in COMPOSITIONS["cross"]:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(fn(shards))
        grads.append([tf.convert_to_tensor(g) for g in tape.gradient(loss, shards)])
    for ours, ref in zip(*grads):
        close(ours, ref)


# --- the gradient's IndexedSlices dtypes -------------------------------------


def _dropins():
    table = vocab_table()
    keys = tf.SparseTensor([[0, 0], [0, 1], [1, 0]], tf.constant(["a", "c", "a"]), [2, 2])
    return {
        "embedding_lookup_sparse": (lambda v, ids: tco.embedding_lookup_sparse(v, ids, None),
                                    lambda v, ids: tf.nn.embedding_lookup_sparse(v, ids, None)),
        "safe_embedding_lookup_sparse": (lambda v, ids: tco.safe_embedding_lookup_sparse(v, ids, None),
                                         lambda v, ids: tf.nn.safe_embedding_lookup_sparse(v, ids, None)),
        "cross": (lambda v, ids: COMPOSITIONS["cross"][0](v), lambda v, ids: COMPOSITIONS["cross"][1](v)),
        "vocab": (lambda v, ids: tco.vocab_embedding_lookup_sparse(table, keys, v),
                  lambda v, ids: tf.nn.safe_embedding_lookup_sparse(v, table.lookup(keys), None)),
    }


@pytest.mark.parametrize("op", sorted(_dropins()))
@pytest.mark.parametrize("id_dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("table", ["variable", "tensor"])
def test_gradient_dtypes_match_tf(op, id_dtype, table):
    v = tf.Variable(P) if table == "variable" else tf.constant(P)
    ids = _sparse([1, 5, 1], id_dtype)
    specs = []
    for fn in _dropins()[op]:
        @tf.function
        def grad(fn=fn):
            with tf.GradientTape() as tape:
                tape.watch(v)
                loss = tf.reduce_sum(fn(v, ids))
            g = tape.gradient(loss, v)
            return g.indices, g.dense_shape

        specs.append(tuple(t.dtype for t in grad()))
    assert specs[0] == specs[1]


def test_gradient_of_cond_mixing_dropin_and_tf_lookup():
    v = tf.Variable(np.ones((7, 3), np.float32))
    ids = _sparse([1, 5, 1], tf.int32)

    def grad(lookup):
        @tf.function
        def f(pred):
            with tf.GradientTape() as tape:
                out = tf.cond(pred, lambda: lookup(v, ids, None), lambda: tf.gather(v, [0, 1]))
                loss = tf.reduce_sum(out)
            return tf.convert_to_tensor(tape.gradient(loss, v))
        return f(tf.constant(True))

    close(grad(tco.embedding_lookup_sparse), grad(tf.nn.embedding_lookup_sparse))


# --- max_norm as a tensor ----------------------------------------------------

MAX_NORM_OPS = [(tco.embedding_lookup_sparse, tf.nn.embedding_lookup_sparse),
                (tco.safe_embedding_lookup_sparse, tf.nn.safe_embedding_lookup_sparse),
                (tco.compat.v1.embedding_lookup_sparse, tf.compat.v1.nn.embedding_lookup_sparse),
                (tco.compat.v1.safe_embedding_lookup_sparse, tf.compat.v1.nn.safe_embedding_lookup_sparse)]


@pytest.mark.parametrize("ours,ref", MAX_NORM_OPS)
@pytest.mark.parametrize("given", ["function_arg", "variable", "constant"])
def test_max_norm_tensor(ours, ref, given):
    ids = _sparse([1, 5, 2])
    v = tf.Variable(0.5)

    def run(fn):
        if given == "function_arg":
            return tf.function(lambda mn: fn(P, ids, None, max_norm=mn))(tf.constant(0.5))
        if given == "variable":
            return tf.function(lambda: fn(P, ids, None, max_norm=v))()
        return tf.function(lambda: fn(P, ids, None, max_norm=tf.constant(0.5)))()

    close(run(ours), run(ref))


@pytest.mark.parametrize("ours,ref", MAX_NORM_OPS)
@pytest.mark.parametrize("max_norm", [np.array([0.5]), [0.5], tf.constant([[0.5]])], ids=["array1", "list1", "1x1"])
def test_max_norm_of_one_value_in_any_shape_is_that_value(ours, ref, max_norm):
    """TF's clip broadcasts max_norm, so one value of shape [1] works there
    (it was a raw TypeError here)."""
    ids = _sparse([1, 5, 2])
    close(ours(P, ids, None, max_norm=max_norm), ref(P, ids, None, max_norm=max_norm))


@pytest.mark.parametrize("max_norm", [[0.5, 1.0], "big", [[[0.5]]]])
def test_max_norm_of_no_single_number_is_a_clear_error(max_norm):
    with pytest.raises(ValueError, match="max_norm must be a"):
        tco.embedding_lookup_sparse(P, _sparse([1, 5, 2]), None, max_norm=max_norm)


def test_max_norm_constant_tensor_stays_fused():
    ids = _sparse([1, 5, 2])
    graph = tf.function(lambda: tco.embedding_lookup_sparse(P, ids, None, max_norm=tf.constant(0.5))
                        ).get_concrete_function().graph
    assert any(op.type == "CtrEmbeddingLookup" for op in graph.get_operations())


def test_max_norm_variable_read_eagerly_stays_fused_everywhere():
    """An eager variable's value is known at the call: the fused ops take it
    (a regression refused it in every op but the sparse drop-ins, which fell
    back to TF's own function)."""
    ids = tf.ragged.constant([[1, 5], [2], []], tf.int64)
    v = tf.Variable(0.5)
    close(tco.sparse_embedding(P, ids, max_norm=v), tco.sparse_embedding(P, ids, max_norm=0.5))
    close(tco.hash_embedding(P, ids, max_norm=v), tco.hash_embedding(P, ids, max_norm=0.5))
    close(tco.bucketized_embedding_lookup(P, [[0.5], [3.0]], [1.0, 2.0], max_norm=v),
          tco.bucketized_embedding_lookup(P, [[0.5], [3.0]], [1.0, 2.0], max_norm=0.5))
    close(tco.embedding_lookup_sparse(P, ids.to_sparse(), None, max_norm=v),
          tf.nn.embedding_lookup_sparse(P, ids.to_sparse(), None, max_norm=0.5))


def _table_gradients():
    """(name, IndexedSlices) of the table gradient of each kind of lookup."""
    var = tf.Variable(P)
    ragged = tf.ragged.constant([[1, 5], [2]], tf.int64)
    table = tco.HashTable(dim=3, capacity=8)
    table.find([1, 2, 5], insert=True)
    lookups = {
        "sparse_embedding": (var, lambda: tco.sparse_embedding(var, ragged)),
        "hash_embedding int": (var, lambda: tco.hash_embedding(var, ragged)),
        "hash_embedding string": (var, lambda: tco.hash_embedding(var, tf.ragged.constant([["a", "b"], ["c"]]))),
        "string_embedding": (var, lambda: tco.string_embedding(tf.constant(["1,5", "2"]), var, id_mode="index")),
        "embedding_lookup_sparse": (var, lambda: tco.embedding_lookup_sparse(var, ragged.to_sparse(), None)),
        "hash_table read": (table.values, lambda: tco.hash_table_embedding(table, ragged)),
        "hash_table insert": (table.values, lambda: tco.hash_table_embedding(table, ragged, insert=True)),
    }
    for name, (variable, lookup) in lookups.items():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(lookup())
        yield name, tape.gradient(loss, variable)


def test_every_table_gradient_has_gathers_int32_dense_shape():
    """One IndexedSlices type for a table whatever looks it up: a tf.cond of
    two of these lookups of one table has a gradient."""
    for name, grad in _table_gradients():
        assert isinstance(grad, tf.IndexedSlices), name
        assert grad.dense_shape.dtype == tf.int32, name


def test_a_cond_of_a_hash_table_read_and_insert_has_a_gradient():
    table = tco.HashTable(dim=3, capacity=8)
    keys = tf.ragged.constant([[1, 5], [2]], tf.int64)
    table.find([1, 2], insert=True)

    @tf.function
    def step(train):
        with tf.GradientTape() as tape:
            out = tf.cond(train, lambda: tco.hash_table_embedding(table, keys, insert=True),
                          lambda: tco.hash_table_embedding(table, keys))
            loss = tf.reduce_sum(out)
        return tf.convert_to_tensor(tape.gradient(loss, table.values))

    np.testing.assert_allclose(step(tf.constant(False)).numpy()[[0, 1]], 1.0)
    assert int(table.size()) == 2
    step(tf.constant(True))
    assert int(table.size()) == 3


def test_slots_take_a_max_norm_tensor_as_the_single_lookup_does():
    table = tco.HashTable(dim=3, capacity=8)
    keys = tf.ragged.constant([[1, 5], [2]], tf.int64)
    table.find([1, 2, 5], insert=True)
    got = tf.function(lambda: tco.multi_hash_table_embedding(table, [keys, keys], max_norms=[tf.constant(0.1), None]))()
    close(got[0], tco.hash_table_embedding(table, keys, max_norm=0.1))
    close(got[1], tco.hash_table_embedding(table, keys))


def test_max_norm_keras_variable_read_eagerly():
    import keras

    ids = tf.ragged.constant([[1, 5], [2], []], tf.int64)
    v = keras.Variable(0.5)
    close(tco.sparse_embedding(P, ids, max_norm=v), tco.sparse_embedding(P, ids, max_norm=0.5))
    table = tco.HashTable(dim=3, capacity=8)
    table.find([1, 2, 5], insert=True)
    close(tco.hash_table_embedding(table, ids, max_norm=v), tco.hash_table_embedding(table, ids, max_norm=0.5))


# --- default_id ---------------------------------------------------------------

def test_a_default_id_given_as_an_int64_scalar_tensor_is_taken_as_tf_takes_it():
    # TF's safe lookup takes an eager int64 tensor (a variable, a 0-d array);
    # the drop-ins refused them. Floats and strings are TF's TypeError, and
    # the drop-ins'.
    params = tf.constant(np.arange(20, dtype=np.float32).reshape(5, 4))
    sp = tf.sparse.SparseTensor([[0, 0], [2, 0]], tf.constant([1, 3], tf.int64), [3, 2])  # row 1 empty
    ragged = tf.RaggedTensor.from_row_lengths(tf.constant([1, 3], tf.int64), [1, 0, 1])
    for ids in (sp, ragged):
        want = tf.nn.safe_embedding_lookup_sparse(params, ids, default_id=tf.constant(4, tf.int64))
        np.testing.assert_array_equal(want.numpy()[1], [16, 17, 18, 19])
        for default_id in (tf.constant(4, tf.int64), tf.constant(4, tf.int32), np.int64(4), np.array(4),
                           tf.Variable(4, dtype=tf.int64), keras.Variable(4, dtype="int64")):
            np.testing.assert_array_equal(tco.safe_embedding_lookup_sparse(params, ids, default_id=default_id), want)
        np.testing.assert_array_equal(
            tco.compat.v1.safe_embedding_lookup_sparse([params], ids, default_id=tf.constant(4, tf.int64)), want)
        in_function = tf.function(lambda: tco.safe_embedding_lookup_sparse(params, ids,
                                                                           default_id=tf.constant(4, tf.int64)))
        np.testing.assert_array_equal(in_function(), want)
        for default_id in (4.0, "4"):
            with pytest.raises(TypeError):
                tf.nn.safe_embedding_lookup_sparse(params, ids, default_id=default_id)
            with pytest.raises(TypeError, match="default_id must be an integer row or None"):
                tco.safe_embedding_lookup_sparse(params, ids, default_id=default_id)
    run_time = tf.function(lambda d: tco.safe_embedding_lookup_sparse(params, sp, default_id=d))
    with pytest.raises(TypeError, match="a tensor or variable of known value"):
        run_time(tf.constant(4, tf.int64))


@pytest.mark.parametrize("default_id", [2**63, -2**63 - 1])
def test_a_default_id_past_int64_is_refused_at_construction(default_id):
    # It was a raw OverflowError. (Other negative or too-large rows fail at
    # run time as TF's do: test_dropin_contract.)
    params = tf.constant(np.arange(40, dtype=np.float32).reshape(10, 4))
    sp = tf.ragged.constant([[1], [], [3]], tf.int64).to_sparse()
    calls = [
        lambda: tco.safe_embedding_lookup_sparse(params, sp, default_id=default_id),
        lambda: tco.compat.v1.safe_embedding_lookup_sparse([params, params], sp, default_id=default_id),
        lambda: tco.string_embedding(["1", "", "3"], params, id_mode="index", default_id=default_id),
        lambda: tco.vocab_embedding_lookup_sparse(vocab_table(), tf.SparseTensor([[0, 0]], ["a"], [2, 1]), params,
                                                  default_id=default_id),
        lambda: tco.cross_embedding_lookup(params, [tf.constant([["a"], ["b"]])], 10, default_id=default_id),
        lambda: tco.bucketized_embedding_lookup(params, tf.constant([[0.5], [2.0]]), [1.0], default_id=default_id),
    ]
    for call in calls:
        with pytest.raises(ValueError, match=f"an int64\\), got {default_id}$"):
            call()


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_entries_the_safe_lookup_drops_never_have_their_index_checked(combiner):
    """TF's safe lookup drops negative ids (and, but for "sum", weights <= 0)
    before SparseFillEmptyRows checks the indices: an entry it drops may sit
    at any index; one it keeps may not."""
    params = tf.constant(np.arange(30, dtype=np.float32).reshape(10, 3))
    cases = [([[-1, 0], [0, 0]], [1, 2], [-0.5, 1.5]),   # pruned by its weight (not for "sum")
             ([[7, 0], [1, 1]], [-4, 2], [1.0, 1.0]),    # dropped by its id, past the batch
             ([[0, 0], [1, 1], [-3, 0]], [3, 2, -1], None)]
    for indices, ids, weights in cases:
        sp = tf.SparseTensor(indices, tf.constant(ids, tf.int64), [2, 2])
        w = None if weights is None else tf.SparseTensor(indices, tf.constant(weights), [2, 2])
        try:
            want = tf.nn.safe_embedding_lookup_sparse(params, sp, w, combiner=combiner).numpy()
        except tf.errors.InvalidArgumentError:
            with pytest.raises(tf.errors.InvalidArgumentError):
                tco.safe_embedding_lookup_sparse(params, sp, w, combiner=combiner)
            continue
        np.testing.assert_allclose(tco.safe_embedding_lookup_sparse(params, sp, w, combiner=combiner).numpy(), want,
                                   rtol=1e-6)
    kept_outside = tf.SparseTensor([[5, 0]], tf.constant([1], tf.int64), [2, 2])
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.nn.safe_embedding_lookup_sparse(params, kept_outside, combiner=combiner)
    with pytest.raises(tf.errors.InvalidArgumentError):
        tco.safe_embedding_lookup_sparse(params, kept_outside, combiner=combiner)


@pytest.mark.parametrize("values", [["a", "b"], [7, 9]])
def test_sparse_keys_outside_the_batch_are_an_invalid_argument(values):
    """As the TF composition (to_hash_bucket_fast + the safe lookup) fails,
    eagerly and in a graph, for string keys as for integer ones."""
    params = tf.ones([10, 3])
    for indices in ([[0, 0], [5, 0]], [[-2, 0], [0, 1]]):
        keys = tf.SparseTensor(indices, tf.constant(values), [2, 2])
        for fn in (tco.hash_embedding, tf.function(tco.hash_embedding)):
            with pytest.raises(tf.errors.InvalidArgumentError):
                fn(params, keys)


# --- ids containers -------------------------------------------------------------

def test_dense_ids_are_a_type_error_naming_both_containers_the_drop_ins_take():
    # TF raises a TypeError for dense ids; the drop-ins also take ragged ids,
    # so their message names both (it said "must be SparseTensor" alone).
    ids = tf.constant([[1, 2]], tf.int64)
    with pytest.raises(TypeError):
        tf.nn.embedding_lookup_sparse(P, ids, None)
    for lookup in (lambda: tco.embedding_lookup_sparse(P, ids, None),
                   lambda: tco.safe_embedding_lookup_sparse(P, ids),
                   lambda: tco.compat.v1.embedding_lookup_sparse([P], ids, None)):
        with pytest.raises(TypeError, match="a SparseTensor or a RaggedTensor, got EagerTensor"):
            lookup()


# --- integer tables ---------------------------------------------------------------

@pytest.mark.parametrize("dtype", [tf.int32, tf.int64])
def test_integer_tables_are_computed_as_tf_computes_them(dtype):
    # TF pools integer tables (Gather and SparseSegmentSum take them); the
    # fused kernels pool floats, so the drop-ins hand such a call to TF.
    table = tf.reshape(tf.range(24, dtype=dtype), [8, 3])
    ids = tf.SparseTensor([[0, 0], [0, 1], [2, 0]], tf.constant([1, 3, 5], tf.int64), [3, 2])
    cases = [(tco.embedding_lookup_sparse, tf.nn.embedding_lookup_sparse, (table, ids, None), {"combiner": "sum"}),
             (tco.safe_embedding_lookup_sparse, tf.nn.safe_embedding_lookup_sparse, (table, ids), {"combiner": "sum"}),
             (tco.compat.v1.embedding_lookup_sparse, tf.compat.v1.nn.embedding_lookup_sparse, ([table], ids, None),
              {"combiner": "sum"}),
             (tco.compat.v1.safe_embedding_lookup_sparse, tf.compat.v1.nn.safe_embedding_lookup_sparse,
              ([table], ids), {"combiner": "sum"})]
    for ours, ref, args, kwargs in cases:
        got, want = ours(*args, **kwargs), ref(*args, **kwargs)
        assert got.dtype == want.dtype == dtype
        np.testing.assert_array_equal(got, want)
        assert not [op for op in tf.function(lambda: ours(*args, **kwargs)).get_concrete_function().graph
                    .get_operations() if op.type.startswith("Ctr")]
    # Nested Python lists convert to int32, as TF converts them.
    nested = table.numpy().tolist()
    for params in ([nested], nested):
        np.testing.assert_array_equal(tco.embedding_lookup_sparse(params, ids, None, combiner="sum"),
                                      tf.nn.embedding_lookup_sparse(params, ids, None, combiner="sum"))
    weights = tf.SparseTensor(ids.indices, tf.constant([2, 1, 4], dtype), ids.dense_shape)
    np.testing.assert_array_equal(tco.embedding_lookup_sparse(table, ids, weights, combiner="mean"),
                                  tf.nn.embedding_lookup_sparse(table, ids, weights, combiner="mean"))


# --- one id and no weight: TF's safe lookup prunes with a broadcast mask ----

def _sparse_2x3(values, indices, dtype):
    indices = tf.reshape(tf.constant(indices, tf.int64), [-1, 2])
    return tf.SparseTensor(indices, tf.constant(values, dtype), [2, 3])


UNKNOWN_SPARSE = [tf.SparseTensorSpec([None, None], tf.int64), tf.SparseTensorSpec([None, None], tf.float32)]


@pytest.mark.parametrize("table", ["variable", "shard list", "sharded variable"])
@pytest.mark.parametrize("default_id", [None, 2])
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("ids, weights", [(([], []), ([1.0], [0, 0])), (([3], [1, 0]), ([], []))],
                         ids=["no id, one weight", "one id, no weight"])
def test_safe_lookup_one_id_and_no_weight_pools_empty_bags_as_tf(ids, weights, combiner, default_id, table):
    # logical_and(ids >= 0, ones_like(weights)) broadcasts one value against
    # none: TF prunes every entry, and fills the empty bags, where shapes are
    # known only when the graph runs (a served model's parsed features).
    shards = [tf.Variable(P[:4]), tf.Variable(P[4:])]
    params = {"variable": tf.Variable(P), "shard list": shards,
              "sharded variable": sharded_variable.ShardedVariable(shards)}[table]
    sp_ids, sp_weights = _sparse_2x3(*ids, tf.int64), _sparse_2x3(*weights, tf.float32)

    def run(fn):
        @tf.function(input_signature=UNKNOWN_SPARSE)
        def step(i, w):
            with tf.GradientTape() as tape:
                out = fn(params, i, w, combiner=combiner, default_id=default_id)
            grads = tape.gradient(out, params.variables if table == "sharded variable" else params)
            return out, [tf.convert_to_tensor(g) for g in tf.nest.flatten(grads)]
        return step(sp_ids, sp_weights)

    got, want = run(tco.safe_embedding_lookup_sparse), run(tf.nn.safe_embedding_lookup_sparse)
    close(got[0], want[0])
    for g, w in zip(got[1], want[1], strict=True):
        close(g, w)


def test_safe_lookup_other_count_mismatches_fail_as_in_tf():
    table = tf.constant(P)
    sp_ids, sp_weights = _sparse_2x3([3, 4], [0, 0, 1, 0], tf.int64), _sparse_2x3([2.0], [0, 0], tf.float32)
    for fn in (tco.safe_embedding_lookup_sparse, tf.nn.safe_embedding_lookup_sparse):
        with pytest.raises(tf.errors.InvalidArgumentError):
            tf.function(lambda i, w, fn=fn: fn(table, i, w), input_signature=UNKNOWN_SPARSE)(sp_ids, sp_weights)

"""The read-only hash-table embedding as one op (CtrHashTableEmbedding: the
find and the pooling of its rows in one pass) against TF-native references:
the rows the table gives (`HashTable.find`) pooled by
tf.nn.safe_embedding_lookup_sparse, forward and gradients, and against the
two-op path it replaces (CtrHashTableFind + CtrResourceEmbeddingLookup)."""

import threading

import numpy as np
import pytest
import tensorflow as tf

import tf_ctr_ops as tco
from tf_ctr_ops import hash_table as hash_table_module
from tf_ctr_ops.hash_table import HashTable, hash_table_embedding
from test_hash_table import assert_pooled_and_values_gradient_close

KEYS = np.concatenate([np.arange(-20, 40), [np.iinfo(np.int64).max, np.iinfo(np.int64).min]]).astype(np.int64)


def _ops_of(fn, *args):
    graph = tf.function(fn).get_concrete_function(*args).graph
    return {op.type for op in graph.get_operations() if op.type.startswith("Ctr")}


def _filled_table(rng, dim=6, capacity=64, dtype=tf.float32):
    # Seeded: a test's tolerances hold for the values it drew, run after run.
    initializer = tf.keras.initializers.TruncatedNormal(stddev=0.5, seed=int(rng.integers(1 << 30)))
    table = HashTable(dim=dim, capacity=capacity, dtype=dtype, initializer=initializer)
    table.find(rng.permutation(KEYS)[:40], insert=True)  # the rest stay unknown
    return table


def _random_ragged(rng, batch, max_len, dtype=tf.int64):
    lengths = rng.integers(0, max_len + 1, batch)
    flat = rng.choice(KEYS, int(lengths.sum()))
    return tf.RaggedTensor.from_row_lengths(tf.constant(flat, dtype), tf.constant(lengths, tf.int64))


def _reference(table, keys, weights, combiner, max_norm):
    """safe_embedding_lookup_sparse of the rows the table gives the keys
    (keys without a row pruned, as the lookup leaves them out)."""
    rows = table.find(tf.cast(keys.flat_values, tf.int64))
    sp_ids = keys.with_flat_values(rows).to_sparse()
    keep = sp_ids.values >= 0
    sp_ids = tf.sparse.retain(sp_ids, keep)
    sp_weights = None if weights is None else tf.sparse.retain(weights.to_sparse(), keep)
    return tf.nn.safe_embedding_lookup_sparse(table.values, sp_ids, sp_weights, combiner=combiner, max_norm=max_norm)


def _two_op_path(monkeypatch, fn):
    """fn() built with the find and the pooling as two ops, as before the fused read."""
    with monkeypatch.context() as m:
        m.setattr(hash_table_module, "_find_pools_in_one_op", lambda table: False)
        return fn()


def test_a_read_on_the_cpu_is_one_op_and_an_insert_is_not(rng):
    table = _filled_table(rng)
    keys = _random_ragged(rng, 4, 3)
    assert _ops_of(lambda k: hash_table_embedding(table, k), keys) == {"CtrHashTableEmbedding"}
    inserting = _ops_of(lambda k: hash_table_embedding(table, k, insert=True), keys)
    assert "CtrHashTableFind" in inserting and "CtrHashTableEmbedding" not in inserting


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("max_norm", [None, 0.5])
@pytest.mark.parametrize("key_dtype", [tf.int32, tf.int64])
def test_forward_and_gradients_match_safe_embedding_lookup_sparse(rng, combiner, weighted, max_norm, key_dtype):
    table = _filled_table(rng)
    keys = _random_ragged(rng, 40, 5, key_dtype)
    if key_dtype == tf.int32:  # int32 keys are the int64 keys they widen to
        keys = tf.RaggedTensor.from_row_splits(tf.constant(rng.integers(-20, 40, keys.flat_values.shape[0]),
                                                           tf.int32), keys.row_splits)
    n = int(keys.flat_values.shape[0])
    # Weights <= 0 too: pruned but for "sum", as safe_embedding_lookup_sparse prunes them.
    weights = keys.with_flat_values(tf.constant(rng.uniform(-0.5, 2, n), tf.float32)) if weighted else None
    with tf.GradientTape(persistent=True) as tape:
        if weighted:
            tape.watch(weights.flat_values)
        got = hash_table_embedding(table, keys, weights, combiner=combiner, max_norm=max_norm)
        want = _reference(table, keys, weights, combiner, max_norm)
    upstream = assert_pooled_and_values_gradient_close(tape, got, want, table.values, rng)
    if weighted:
        w_got = tape.gradient(got, weights.flat_values, output_gradients=upstream)
        w_want = tape.gradient(want, weights.flat_values, output_gradients=upstream)
        # The reference's weights of keys without a row were retained away: no
        # gradient. A weight's gradient is a difference of dot products of
        # terms near 1 (sqrtn, mean), so float32 leaves it about 1e-5 off zero.
        np.testing.assert_allclose(w_got.numpy(), 0.0 if w_want is None else w_want.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float64])
@pytest.mark.parametrize("container", ["ragged", "sparse", "dense"])
def test_every_dtype_and_container_equals_the_two_op_path(rng, monkeypatch, dtype, container):
    table = _filled_table(rng, dtype=dtype)
    ragged = _random_ragged(rng, 30, 4)
    keys = {"ragged": ragged, "sparse": ragged.to_sparse(),
            "dense": ragged.to_tensor(default_value=-1)}[container]
    fused = hash_table_embedding(table, keys, combiner="sqrtn", max_norm=0.7)
    two_op = _two_op_path(monkeypatch, lambda: hash_table_embedding(table, keys, combiner="sqrtn", max_norm=0.7))
    assert fused.dtype == dtype and fused.shape == two_op.shape
    np.testing.assert_array_equal(fused.numpy(), two_op.numpy())


def test_string_keys_and_dense_padding_read_as_the_two_op_path(rng, monkeypatch):
    table = HashTable(dim=3, capacity=16, key_dtype=tf.string)
    hash_table_embedding(table, tf.ragged.constant([["a", "b"], ["", "c"]]), insert=True)
    for keys in (tf.constant([["a", ""], ["", ""], ["zz", "c"]]), tf.ragged.constant([["", "b"], [], ["c", "q"]])):
        fused = hash_table_embedding(table, keys)
        two_op = _two_op_path(monkeypatch, lambda: hash_table_embedding(table, keys))
        np.testing.assert_array_equal(fused.numpy(), two_op.numpy())
    # Dense "" is padding; in a ragged batch "" is a key, inserted above.
    dense = hash_table_embedding(table, tf.constant([["", ""]])).numpy()
    np.testing.assert_array_equal(dense, np.zeros([1, 3]))
    assert np.any(hash_table_embedding(table, tf.ragged.constant([[""]])).numpy() != 0)


def test_batch_of_zero_empty_bags_and_a_large_batch(rng):
    table = _filled_table(rng, dim=16, capacity=4096)
    table.find(np.arange(10_000, 14_000), insert=True)
    empty = tf.RaggedTensor.from_row_splits(tf.zeros([0], tf.int64), tf.zeros([1], tf.int64))
    assert hash_table_embedding(table, empty).shape == (0, 16)
    assert hash_table_embedding(table, np.zeros([0, 3], np.int64)).shape == (0, 16)
    np.testing.assert_array_equal(hash_table_embedding(table, tf.ragged.constant([[], []], tf.int64)).numpy(), 0.0)
    lengths = rng.integers(0, 40, 20_000)
    flat = rng.integers(9_000, 15_000, int(lengths.sum()))  # some keys unknown
    keys = tf.RaggedTensor.from_row_lengths(tf.constant(flat, tf.int64), tf.constant(lengths, tf.int64))
    np.testing.assert_allclose(hash_table_embedding(table, keys, combiner="mean").numpy(),
                               _reference(table, keys, None, "mean", None).numpy(), rtol=1e-5, atol=1e-6)


def test_a_row_outside_the_values_is_an_error_naming_the_key_and_bag():
    table = HashTable(dim=2, capacity=8)
    table.find([5, 6], insert=True)
    corrupt = table.table.numpy()
    pairs = corrupt[2:2 + table.num_slots * 2 // 4].reshape(-1, 2)  # (key, entry) of each slot
    slot = int(np.flatnonzero((pairs[:, 0] == 6) & (pairs[:, 1] >= 0))[0])
    pairs[slot, 1] = 1_000_000
    corrupt[2:2 + table.num_slots * 2 // 4] = pairs.reshape(-1, 4)
    table.table.assign(corrupt)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"key 6 in row 1 has table row 1000000, out of range \[0, 8\) of the values"):
        hash_table_embedding(table, tf.ragged.constant([[5], [6]], tf.int64))


def test_malformed_bags_are_the_lookups_errors(rng):
    table = _filled_table(rng)
    keys = tf.constant([1, 2, 3], tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match="row_splits"):
        hash_table_embedding(table, tf.RaggedTensor.from_row_splits(keys, tf.constant([0, 3, 2], tf.int64),
                                                                    validate=False))
    weights = tf.RaggedTensor.from_row_splits(tf.constant([1.0, 2.0]), tf.constant([0, 2], tf.int64))
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        hash_table_embedding(table, tf.RaggedTensor.from_row_splits(keys, tf.constant([0, 3], tf.int64)), weights)


def test_under_a_strategy_the_read_stays_two_ops(rng):
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        table = HashTable(dim=2, capacity=16)
    table.find([1, 2], insert=True)
    keys = tf.ragged.constant([[1, 3], [2]], tf.int64)

    @tf.function
    def read(k):
        return strategy.run(lambda k: hash_table_embedding(table, k), (k,))

    ops = {op.type for op in read.get_concrete_function(keys).graph.get_operations() if op.type.startswith("Ctr")}
    assert "CtrHashTableFind" in ops and "CtrHashTableEmbedding" not in ops
    np.testing.assert_allclose(read(keys).numpy(), hash_table_embedding(table, keys).numpy(), rtol=1e-6)


def test_reads_and_inserts_from_many_threads_neither_deadlock_nor_tear(rng):
    """Each read holds the table's lock, then the values'; inserts and sparse
    updates never take them the other way round."""
    table = HashTable(dim=4, capacity=20_000, initializer=tf.keras.initializers.Ones())
    errors = []
    stop = threading.Event()

    def insert(seed):
        r = np.random.default_rng(seed)
        try:
            for _ in range(30):
                keys = tf.ragged.constant([r.integers(0, 30_000, 50).tolist()], tf.int64)
                with tf.GradientTape() as tape:
                    loss = tf.reduce_sum(hash_table_embedding(table, keys, combiner="sum", insert=True))
                tf.keras.optimizers.SGD(0.0).apply_gradients([(tape.gradient(loss, table.values), table.values)])
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    def read(seed):
        r = np.random.default_rng(seed)
        try:
            while not stop.is_set():
                keys = tf.ragged.constant([r.integers(0, 30_000, 40).tolist() for _ in range(8)], tf.int64)
                out = hash_table_embedding(table, keys, combiner="mean").numpy()
                # Every value is 1 (SGD at rate 0 changes nothing): a found bag pools to ones, an empty one to zeros.
                assert np.all((out == 1.0) | (out == 0.0)), out
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    readers = [threading.Thread(target=read, args=(s,)) for s in range(3)]
    writers = [threading.Thread(target=insert, args=(s,)) for s in range(10, 14)]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join(timeout=120)
    stop.set()
    for t in readers:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in readers + writers), "a read or an insert never finished"
    assert not errors, errors[0]


def test_a_served_saved_model_reads_with_the_one_op(rng, tmp_path):
    from conftest import serve_in_fresh_process

    module = tf.Module()
    module.table = HashTable(dim=3, capacity=32)
    module.table.find([4, 8, 15, 16], insert=True)
    module.serve = tf.function(lambda k: {"y": tco.hash_table_embedding(module.table, k, combiner="sum")},
                               input_signature=[tf.TensorSpec([None, 2], tf.int64)])
    tf.saved_model.save(module, str(tmp_path / "m"), signatures={"serving_default": module.serve})
    keys = np.array([[4, -1], [15, 99], [-1, -1]], np.int64)
    loaded_ops = {n.op for f in tf.saved_model.load(str(tmp_path / "m")).signatures["serving_default"]
                  .graph.as_graph_def().library.function for n in f.node_def}
    assert "CtrHashTableEmbedding" in loaded_ops
    got = serve_in_fresh_process(str(tmp_path / "m"), "serving_default", {"k": keys}, tmp_path)
    np.testing.assert_allclose(got["y"], module.serve(tf.constant(keys))["y"].numpy(), rtol=1e-6)


@pytest.mark.parametrize("weighted", [False, True])
def test_slots_read_each_pooling_group_in_one_op_and_match_one_call_per_feature(rng, weighted):
    a, b = _filled_table(rng), _filled_table(rng)
    features = [_random_ragged(rng, 12, 3) for _ in range(5)]
    features[3] = features[3].to_tensor(default_value=-1)  # dense: -1 is padding
    features[4] = features[4].to_sparse()
    weights = None
    if weighted:
        weights = [f.with_flat_values(tf.constant(rng.uniform(-0.5, 2, f.flat_values.shape[0]), tf.float32))
                   if isinstance(f, tf.RaggedTensor) else None for f in features]
    tables, combiners = [a, b, a, a, b], ["mean", "sum", "mean", "sqrtn", "sum"]
    got = tco.multi_hash_table_embedding(tables, features, weights, combiners=combiners)
    for i, g in enumerate(got):
        want = hash_table_embedding(tables[i], features[i], None if weights is None else weights[i],
                                    combiner=combiners[i])
        np.testing.assert_allclose(g.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    specs = [tf.RaggedTensorSpec([None, None], tf.int64, 1, tf.int64)] * 3 + [tf.TensorSpec([None, None], tf.int64),
                                                                             tf.SparseTensorSpec([None, None], tf.int64)]
    graph = tf.function(lambda *f: tco.multi_hash_table_embedding(tables, list(f), combiners=combiners)
                        ).get_concrete_function(*specs).graph
    types = [op.type for op in graph.get_operations()]
    # (a, mean), (a, sqrtn), (b, sum): three groups, no separate find.
    assert types.count("CtrHashTableEmbedding") == 3 and "CtrHashTableFind" not in types


def test_slots_read_still_refuses_mismatched_batches(rng):
    table = _filled_table(rng)
    with pytest.raises(tf.errors.InvalidArgumentError, match="feature 1 has another batch size"):
        tco.multi_hash_table_embedding(table, [tf.constant([[1]], tf.int64), tf.constant([[1], [2]], tf.int64)])


def test_one_variable_as_table_and_values_is_refused_not_a_deadlock(tmp_path):
    """Binding the values takes their lock exclusively while the table's is
    held shared: one variable for both would wait forever. Run in a child
    process, so that a regression fails the test instead of hanging the run."""
    import subprocess
    import sys

    from conftest import fresh_process_env

    code = (
        "import tensorflow as tf\n"
        "from tf_ctr_ops._loader import load_op_library\n"
        "from tf_ctr_ops.table_layout import empty_table_array\n"
        "t = tf.Variable(empty_table_array(8, 4))\n"
        "try:\n"
        "    load_op_library().ctr_hash_table_embedding(\n"
        "        table=t.handle, values=t.handle, keys=tf.constant([5], tf.int64),\n"
        "        segments=tf.constant([0, 1], tf.int64), num_rows=tf.constant(-1, tf.int64), weights=tf.zeros([0]),\n"
        "        T=tf.float32, capacity=4, segment_kind='row_splits')\n"
        "except tf.errors.InvalidArgumentError as e:\n"
        "    print('REFUSED', e.message)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=fresh_process_env(), capture_output=True,
                          text=True, timeout=240)
    assert "REFUSED" in proc.stdout and "table and values are one variable" in proc.stdout, \
        proc.stdout + proc.stderr[-2000:]


@pytest.mark.parametrize("kind", ["int", "string", "layer"])
def test_a_table_loaded_from_a_saved_model_reads_as_the_saved_one(rng, tmp_path, kind):
    # tf.saved_model.load restores the table's variables, not its Python
    # attributes: a loaded table is read through what its variables tell.
    if kind == "string":
        table = HashTable(dim=4, capacity=40, key_dtype=tf.string)
        table.find(tf.constant([b"a", b"bb", b"c"]), insert=True)
        keys = tf.ragged.constant([[b"a", b"zz"], [], [b"bb", b"c", b"a"]])
    else:
        keys = _random_ragged(rng, 9, 4)
        if kind == "int":
            table = _filled_table(rng)
        else:
            table = tco.layers.HashTableEmbedding(output_dim=5, capacity=64)
            table(keys.to_tensor(default_value=-1), training=True)
    module = tf.Module()
    module.table = table
    tf.saved_model.save(module, str(tmp_path / "m"))
    loaded = tf.saved_model.load(str(tmp_path / "m")).table

    expected = hash_table_embedding(table, keys, combiner="sqrtn").numpy()
    np.testing.assert_array_equal(hash_table_embedding(loaded, keys, combiner="sqrtn").numpy(), expected)
    traced = tf.function(lambda k: hash_table_embedding(loaded, k, combiner="sqrtn"))
    np.testing.assert_array_equal(traced(keys).numpy(), expected)
    one, two = tco.multi_hash_table_embedding([loaded, loaded], [keys, keys], combiners="sqrtn")
    np.testing.assert_array_equal(one.numpy(), expected)
    np.testing.assert_array_equal(two.numpy(), expected)
    with pytest.raises(ValueError, match=r"restored by tf.saved_model.load.*restore_resized"):
        hash_table_embedding(loaded, keys, insert=True)


def test_a_loaded_string_table_refuses_int_keys(tmp_path):
    module = tf.Module()
    module.table = HashTable(dim=2, capacity=8, key_dtype=tf.string)
    tf.saved_model.save(module, str(tmp_path / "m"))
    loaded = tf.saved_model.load(str(tmp_path / "m")).table
    with pytest.raises(TypeError, match="key_dtype=tf.string takes string keys"):
        hash_table_embedding(loaded, tf.constant([[1]], tf.int64))

"""Key-to-row hash-table embedding (tf_ctr_ops.HashTable, hash_table_embedding) against TF's MutableHashTable + safe_embedding_lookup_sparse
on the same key-to-row assignment: forward, gradients, edge cases, capacity,
admission, concurrency, checkpoints and SavedModels served in a fresh process."""

import threading

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_ctr_ops as tco
from tf_ctr_ops.hash_table import HashTable, default_num_slots, hash_table_embedding, optimizer_slots, table_shape
from conftest import serve_in_fresh_process


class ReferenceTable:
    """TF-native key -> row assignment: a MutableHashTable, rows handed out in
    order of first appearance (what the fused table promises)."""

    def __init__(self, capacity):
        self.table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, default_value=-1)
        self.capacity = capacity
        self.size = 0

    def rows(self, keys, insert):
        keys = np.asarray(keys, np.int64).reshape(-1)
        if insert:
            found = self.table.lookup(tf.constant(keys)).numpy()
            new, seen = [], set()
            for k, row in zip(keys.tolist(), found):
                if row < 0 and k not in seen and self.size + len(new) < self.capacity:
                    new.append(k)
                    seen.add(k)
            if new:
                self.table.insert(tf.constant(new, tf.int64),
                                  tf.range(self.size, self.size + len(new), dtype=tf.int64))
                self.size += len(new)
        return self.table.lookup(tf.constant(keys)).numpy()


def reference_pooled(values, keys, rows, combiner, weights=None, max_norm=None):
    """safe_embedding_lookup_sparse over the rows of a ragged batch (rows < 0 pruned)."""
    ids = keys.with_flat_values(tf.constant(rows, tf.int64)).to_sparse()
    sp_w = None if weights is None else weights.to_sparse()
    return tf.nn.safe_embedding_lookup_sparse(values, ids, sp_w, combiner=combiner, max_norm=max_norm)


def assert_pooled_and_values_gradient_close(tape, got, want, values, rng):
    """got == want, and so are their gradients with respect to `values` (got's
    as IndexedSlices) for a random upstream gradient, which is returned."""
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    upstream = tf.constant(rng.normal(size=got.shape), tf.float32)
    g_got = tape.gradient(got, values, output_gradients=upstream)
    g_want = tape.gradient(want, values, output_gradients=upstream)
    assert isinstance(g_got, tf.IndexedSlices)
    np.testing.assert_allclose(tf.convert_to_tensor(g_got).numpy(), tf.convert_to_tensor(g_want).numpy(),
                               rtol=1e-5, atol=1e-6)
    return upstream


def random_keys(rng, batch, max_len, key_space):
    lengths = rng.integers(0, max_len + 1, size=batch)
    flat = rng.choice(key_space, size=int(lengths.sum()))
    return tf.RaggedTensor.from_row_lengths(tf.constant(flat, tf.int64), tf.constant(lengths, tf.int64))


KEY_SPACE = np.concatenate([np.arange(-50, 50), np.iinfo(np.int64).max - np.arange(20),
                            np.iinfo(np.int64).min + np.arange(20), 10**12 + np.arange(100)]).astype(np.int64)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("weighted", [False, True])
def test_training_steps_match_mutable_hash_table(rng, combiner, weighted):
    table = HashTable(dim=8, capacity=1000)
    ref = ReferenceTable(1000)
    for step in range(4):
        keys = random_keys(rng, 64, 6, KEY_SPACE)
        # Weights <= 0 too: safe_embedding_lookup_sparse prunes them but for "sum".
        flat_weights = rng.uniform(-1, 2, keys.flat_values.shape[0]) * (np.arange(keys.flat_values.shape[0]) % 5 > 0)
        weights = keys.with_flat_values(tf.constant(flat_weights, tf.float32)) if weighted else None
        with tf.GradientTape(persistent=True) as tape:
            got = hash_table_embedding(table, keys, weights, combiner=combiner, insert=True)
            rows = ref.rows(keys.flat_values, insert=True)
            want = reference_pooled(table.values, keys, rows, combiner, weights)
        assert_pooled_and_values_gradient_close(tape, got, want, table.values, rng)
    assert int(table.size()) == ref.size


def test_rows_are_first_appearance_order_and_keys_never_share():
    table = HashTable(dim=2, capacity=100)
    keys = [5, -3, 5, 2**62, -3, 0, 7]
    np.testing.assert_array_equal(table.find(keys, insert=True).numpy(), [0, 1, 0, 2, 1, 3, 4])
    got_keys, _ = table.export()
    np.testing.assert_array_equal(got_keys.numpy(), [5, -3, 2**62, 0, 7])


def test_serving_reads_only_and_drops_unknown_keys(rng):
    table = HashTable(dim=4, capacity=50)
    table.find([1, 2, 3], insert=True)
    before = table.table.numpy().copy()
    keys = tf.ragged.constant([[1, 99], [99], [], [3, 3, 2]], dtype=tf.int64)
    got = hash_table_embedding(table, keys, combiner="mean")
    np.testing.assert_array_equal(table.table.numpy(), before)
    rows = table.find(keys.flat_values).numpy()
    np.testing.assert_array_equal(rows, [0, -1, -1, 2, 2, 1])
    want = reference_pooled(table.values, keys, rows, "mean")
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)
    np.testing.assert_array_equal(got.numpy()[1:3], 0.0)


def test_containers_and_key_dtypes_agree(rng):
    table = HashTable(dim=4, capacity=100)
    dense = np.array([[3, 1, -1], [-1, -1, -1], [7, 3, 3]], np.int64)
    ragged = tf.ragged.constant([[3, 1], [], [7, 3, 3]], dtype=tf.int64)
    want = hash_table_embedding(table, ragged, insert=True).numpy()
    assert int(table.size()) == 3  # -1 is padding only in dense keys; here none was inserted
    for keys in (dense, dense.astype(np.int32), ragged.to_sparse(), tf.cast(ragged, tf.int32)):
        np.testing.assert_allclose(hash_table_embedding(table, keys).numpy(), want, rtol=1e-6)
    hash_table_embedding(table, dense, insert=True)
    assert int(table.size()) == 3, "dense padding must never be inserted"


def test_minus_one_is_a_key_in_ragged_and_sparse_inputs():
    table = HashTable(dim=2, capacity=10)
    hash_table_embedding(table, tf.ragged.constant([[-1, 4]], dtype=tf.int64), insert=True)
    assert int(table.size()) == 2


def test_batch_of_zero_and_all_empty_bags():
    table = HashTable(dim=3, capacity=10)
    empty = tf.RaggedTensor.from_row_splits(tf.zeros([0], tf.int64), tf.zeros([1], tf.int64))
    assert hash_table_embedding(table, empty, insert=True).shape == (0, 3)
    assert hash_table_embedding(table, np.zeros([0, 4], np.int64)).shape == (0, 3)
    out = hash_table_embedding(table, np.full([2, 3], -1, np.int64), insert=True)
    np.testing.assert_array_equal(out.numpy(), np.zeros([2, 3]))
    assert int(table.size()) == 0


@pytest.mark.parametrize("key_dtype", [tf.int64, tf.string])
def test_empty_python_keys_take_the_tables_key_dtype(key_dtype):
    # As MutableHashTable.lookup([]) does: [] alone converts to float32.
    table = HashTable(dim=3, capacity=10, key_dtype=key_dtype)
    rows = table.find([])
    assert rows.dtype == tf.int64 and rows.shape == (0,)
    assert table.find(np.zeros([2, 0])).shape == (2, 0)
    np.testing.assert_array_equal(hash_table_embedding(table, [[], []]).numpy(), np.zeros([2, 3]))
    (pooled,) = tco.multi_hash_table_embedding(table, [[[]]])
    assert pooled.shape == (1, 3)
    with pytest.raises(TypeError, match="got float"):
        table.find([1.5])
    padding = '""' if key_dtype == tf.string else "-1"
    with pytest.raises(ValueError, match=f"padded with {padding}, got shape"):
        hash_table_embedding(table, [])


def test_large_batch_matches_reference(rng):
    table = HashTable(dim=16, capacity=200_000)
    ref = ReferenceTable(200_000)
    keys = random_keys(rng, 20_000, 10, rng.integers(-2**40, 2**40, size=150_000))
    got = hash_table_embedding(table, keys, combiner="sqrtn", insert=True)
    rows = ref.rows(keys.flat_values, insert=True)
    np.testing.assert_array_equal(table.find(keys.flat_values).numpy(), rows)
    np.testing.assert_allclose(got.numpy(), reference_pooled(table.values, keys, rows, "sqrtn").numpy(),
                               rtol=1e-5, atol=1e-6)


def test_string_keys_get_rows_of_their_own():
    table = HashTable(dim=4, capacity=10, key_dtype=tf.string)
    keys = tf.ragged.constant([["user_1", "user_2"], ["user_1"], []])
    hash_table_embedding(table, keys, insert=True)
    assert int(table.size()) == 2
    dense = tf.constant([["user_2", ""], ["", ""]])
    out = hash_table_embedding(table, dense, insert=True)
    assert int(table.size()) == 2, "the empty string pads dense string keys"
    rows = table.find(["user_2"]).numpy()
    np.testing.assert_allclose(out.numpy()[0], table.values.numpy()[rows[0]])


def test_capacity_overflow_drops_new_keys_and_counts_them():
    table = HashTable(dim=2, capacity=3)
    rows = table.find([10, 11, 12, 13, 10, 14], insert=True).numpy()
    np.testing.assert_array_equal(rows, [0, 1, 2, -1, 0, -1])
    stats = {k: v.numpy() for k, v in table.statistics().items()}
    assert stats["size"] == 3 and stats["dropped"] == 2 and stats["load_factor"] == 1.0


def test_admission_filter_gives_a_row_on_the_nth_sighting():
    table = HashTable(dim=2, capacity=10, admit_after=3)
    np.testing.assert_array_equal(table.find([7, 8], insert=True).numpy(), [-1, -1])
    np.testing.assert_array_equal(table.find([7], insert=True).numpy(), [-1])
    np.testing.assert_array_equal(table.find([7, 8, 7], insert=True).numpy(), [0, -1, 0])
    np.testing.assert_array_equal(table.find([8, 7]).numpy(), [-1, 0])  # reads never count
    assert int(table.size()) == 1
    assert int(table.statistics()["occupied"]) == 2


def test_pending_keys_stop_at_three_quarters_of_the_slots():
    table = HashTable(dim=2, capacity=2, admit_after=2, num_slots=8)
    table.find(np.arange(100, 120), insert=True)
    stats = {k: int(v) for k, v in table.statistics().items() if k != "load_factor"}
    assert stats["occupied"] == 6 and stats["dropped"] == 14 and stats["size"] == 0


def test_keys_waiting_for_admission_never_fill_a_tables_last_empty_slot():
    """Capacity 1 has 2 slots by default: a second waiting key claimed the
    other, and every later probe for a key the table lacked met no empty
    slot (an error calling the table corrupt)."""
    table = HashTable(dim=2, capacity=1, admit_after=2)
    assert table.num_slots == 2
    table.find([5], insert=True)
    table.find([6], insert=True)
    stats = {k: int(v) for k, v in table.statistics().items() if k != "load_factor"}
    assert stats["occupied"] == 1 and stats["dropped"] == 1 and stats["size"] == 0
    np.testing.assert_array_equal(table.find([7, 6]).numpy(), [-1, -1])
    np.testing.assert_array_equal(hash_table_embedding(table, tf.ragged.constant([[7]], tf.int64)).numpy(), 0.0)
    np.testing.assert_array_equal(table.find([5], insert=True).numpy(), [0])  # its second sighting: admitted


def test_tf_function_and_graph_mode_insert():
    table = HashTable(dim=4, capacity=100)

    @tf.function
    def step(keys):
        return hash_table_embedding(table, keys, combiner="sum", insert=True)

    step(tf.ragged.constant([[1, 2]], dtype=tf.int64))
    step(tf.ragged.constant([[2, 3]], dtype=tf.int64))
    assert int(table.size()) == 3


def test_reads_taken_before_an_insert_are_not_changed():
    table = HashTable(dim=2, capacity=10)
    snapshot = tf.convert_to_tensor(table.table)
    table.find([1, 2], insert=True)
    assert int(snapshot[0, 0]) == 0 and int(table.size()) == 2


def test_concurrent_inserts_and_reads_keep_one_row_per_key():
    table = HashTable(dim=2, capacity=50_000)
    key_sets = [np.arange(i * 3000, i * 3000 + 6000, dtype=np.int64) for i in range(8)]  # overlapping
    errors, read_rows = [], []

    def insert(keys):
        try:
            for chunk in np.array_split(keys, 6):
                table.find(chunk, insert=True)
                read_rows.append((chunk, table.find(chunk).numpy()))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=insert, args=(k,)) for k in key_sets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    all_keys = np.unique(np.concatenate(key_sets))
    rows = table.find(all_keys).numpy()
    assert int(table.size()) == all_keys.size
    np.testing.assert_array_equal(np.sort(rows), np.arange(all_keys.size))
    lookup = dict(zip(all_keys.tolist(), rows.tolist()))
    for chunk, got in read_rows:  # a key, once inserted, never moved
        np.testing.assert_array_equal(got, [lookup[k] for k in chunk.tolist()])


def test_insert_rows_loads_a_table_into_another_capacity(rng):
    small = HashTable(dim=4, capacity=20)
    small.find(rng.choice(1000, 15, replace=False), insert=True)
    keys, values = small.export()
    big = HashTable(dim=4, capacity=5000)
    assert int(big.insert_rows(keys, values)) == 15
    np.testing.assert_allclose(tf.gather(big.values, big.find(keys)).numpy(), values.numpy())
    tiny = HashTable(dim=4, capacity=5)
    assert int(tiny.insert_rows(keys, values)) == 5


def test_insert_rows_counts_keys_and_takes_a_repeated_keys_first_row():
    table = HashTable(dim=2, capacity=4, initializer=tf.keras.initializers.Zeros())
    assert int(table.insert_rows([1, 2, 1], [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])) == 2
    keys, values = table.export()
    assert dict(zip(keys.numpy().tolist(), values.numpy().tolist())) == {1: [1.0, 1.0], 2: [2.0, 2.0]}


@pytest.mark.parametrize("values", [np.ones([2, 5], np.float32), np.ones([2, 1], np.float32),
                                    np.ones([3, 2], np.float32)])
def test_insert_rows_refuses_rows_that_do_not_fit(values):
    table = HashTable(dim=2, capacity=4)
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="row"):
        table.insert_rows([1, 2], values)
    assert int(table.size()) == 0


def test_insert_rows_names_the_counts_of_keys_and_rows_that_differ():
    table = HashTable(dim=2, capacity=4)
    with pytest.raises(ValueError, match="values must hold one row per key: 2 keys, 3 rows"):
        table.insert_rows([1, 2], np.ones([3, 2], np.float32))
    assert int(table.size()) == 0


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="capacity"):
        HashTable(dim=2, capacity=-1)
    with pytest.raises(ValueError, match="power of two"):
        HashTable(dim=2, capacity=10, num_slots=24)
    with pytest.raises(ValueError, match="too small"):
        HashTable(dim=2, capacity=10, num_slots=8)
    with pytest.raises(ValueError, match="key_dtype"):
        HashTable(dim=2, capacity=10, key_dtype=tf.float32)
    with pytest.raises(ValueError, match="admit_after"):
        HashTable(dim=2, capacity=10, admit_after=0)
    for device in ("TPU:0", "bogus", 3):
        with pytest.raises(ValueError, match="table_device"):
            HashTable(dim=2, capacity=10, table_device=device)
    table = HashTable(dim=2, capacity=10)
    with pytest.raises(TypeError, match="int32, int64 or string"):
        table.find(tf.constant([1.5]))
    with pytest.raises(TypeError, match="list of key containers .* use hash_table_embedding"):
        tco.multi_hash_table_embedding(table, tf.constant([[1, 2]], tf.int64), insert=True)
    with pytest.raises(TypeError, match="key_dtype=tf.string"):
        table.find(["a"])
    with pytest.raises(TypeError, match="string keys"):
        HashTable(dim=2, capacity=10, key_dtype=tf.string).find([1])
    keys = tf.ragged.constant([[1, 2]], dtype=tf.int64)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        hash_table_embedding(table, keys, tf.ragged.constant([[1.0]]), insert=True)


@pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")), reason="tests the fallback of a machine without a GPU")
def test_a_gpu_table_on_a_machine_without_one_lives_on_the_cpu():
    # Soft placement puts the table on the CPU, whose kernels then find and
    # insert, and pool in one op: the same rows and embeddings as a CPU table.
    on_gpu = HashTable(dim=3, capacity=8, table_device="/gpu:0", initializer=tf.keras.initializers.Ones())
    on_cpu = HashTable(dim=3, capacity=8, initializer=tf.keras.initializers.Ones())
    assert on_gpu.table_device == "/device:GPU:0" and on_cpu.table_device == "/device:CPU:0"
    assert "CPU" in on_gpu.table.device
    keys = tf.ragged.constant([[5, 7, 5], [], [9]], dtype=tf.int64)
    for insert in (True, False):
        np.testing.assert_array_equal(hash_table_embedding(on_gpu, keys, insert=insert),
                                      hash_table_embedding(on_cpu, keys, insert=insert))
    np.testing.assert_array_equal(on_gpu.find(tf.constant([9, 7, 5, 4], tf.int64)), [2, 1, 0, -1])


@pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")), reason="tests the fallback of a machine without a GPU")
def test_a_gpu_table_that_evicts_is_accepted_and_evicts_as_the_cpu_one():
    tables = [HashTable(dim=2, capacity=4, eviction="lru", table_device=device) for device in ("/GPU:0", "/CPU:0")]
    for step in range(4):
        keys = tf.constant([[10 * step + k for k in range(3)]], tf.int64)
        got, want = (hash_table_embedding(t, keys, insert=True) for t in tables)
        np.testing.assert_array_equal(got.shape, want.shape)
    stats = [t.statistics() for t in tables]
    assert int(stats[0]["evicted"]) > 0
    for name in stats[1]:
        assert float(stats[0][name]) == float(stats[1][name]), name
    np.testing.assert_array_equal(tables[0].table.numpy(), tables[1].table.numpy())


def _malformed_bags():
    """Keys whose bags the pooling refuses, with the error naming the entry."""
    k = tf.constant([7, 8], tf.int64)
    return [
        (tf.SparseTensor([[0, 0], [5, 0]], k, [2, 3]), None, r"row id 5 of entry 1 is out of range \[0, 2\)"),
        (tf.SparseTensor([[0, 0], [-1, 0]], k, [2, 3]), None, r"row id -1 of entry 1 is out of range"),
        (tf.SparseTensor([[1, 0], [0, 0]], k, [2, 3]), None, "row ids must be sorted: entry 1 has row 0"),
        (tf.RaggedTensor.from_row_splits(k, tf.constant([0, 2, 1], tf.int64), validate=False), None,
         r"row_splits must be non-decreasing: row_splits\[2\]"),
        (tf.RaggedTensor.from_row_splits(k, tf.constant([0, 1, 3], tf.int64), validate=False), None,
         r"row_splits\[-1\] = 3 does not match the number of ids 2"),
        (tf.ragged.constant([[7], [8]], tf.int64), tf.RaggedTensor.from_row_splits([1.0], [0, 1, 1], validate=False),
         "weights must have one value per id"),
    ]


@pytest.mark.parametrize("case", range(len(_malformed_bags())))
@pytest.mark.parametrize("slots", [False, True])
def test_malformed_bags_are_refused_before_anything_is_inserted(case, slots):
    # The inserting find ran before the pooling checked the bags: input it
    # then refused had already taken rows (and advanced the LRU clock).
    keys, weights, message = _malformed_bags()[case]
    table = HashTable(dim=2, capacity=10, eviction="lru")
    before = table.table.numpy()
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        if slots:
            tco.multi_hash_table_embedding(table, [keys], None if weights is None else [weights], insert=True)
        else:
            hash_table_embedding(table, keys, weights, insert=True)
    np.testing.assert_array_equal(table.table.numpy(), before)
    assert int(table.size()) == 0


@pytest.mark.parametrize("case", ["bad_bags_of_another_table", "batch_sizes_differ"])
def test_slots_change_no_table_when_any_feature_is_refused(case):
    # In a graph each table's find waited only on its own features' checks:
    # the other table inserted its keys, and features of another batch size
    # were all inserted before the batch check failed.
    tables = [HashTable(dim=2, capacity=10) for _ in range(2)]
    if case == "bad_bags_of_another_table":
        features = [tf.SparseTensor([[1, 0], [0, 0]], tf.constant([7, 8], tf.int64), [2, 3]),
                    tf.ragged.constant([[1, 2], [3]], tf.int64)]
        message = "row ids must be sorted"
    else:
        features = [tf.ragged.constant([[1, 2], [3]], tf.int64), tf.ragged.constant([[4], [5], [6]], tf.int64)]
        message = "another batch size"
    spec = [tf.SparseTensorSpec([None, None], tf.int64) if isinstance(f, tf.SparseTensor)
            else tf.RaggedTensorSpec([None, None], tf.int64, 1) for f in features]
    for shared in (False, True):
        step = tf.function(lambda a, b: tco.multi_hash_table_embedding(tables[0] if shared else tables, [a, b],
                                                                       insert=True), input_signature=spec)
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            step(*features)
        assert [int(t.size()) for t in tables] == [0, 0]


def test_a_slots_row_outside_its_batch_is_not_another_features_row():
    # Slots pool all features' bags in one op, feature f's row b as bag
    # f * B + b: feature 1's row -1 was feature 0's last row there, and was
    # pooled into it without an error.
    table = HashTable(dim=2, capacity=10, initializer=lambda shape, dtype: tf.ones(shape, dtype))
    first = tf.SparseTensor([[0, 0], [1, 0]], tf.constant([7, 8], tf.int64), [2, 3])
    second = tf.SparseTensor([[-1, 0]], tf.constant([9], tf.int64), [2, 3])
    tco.multi_hash_table_embedding(table, [first, tf.constant([[9]] * 2, tf.int64)], insert=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"row id -1 of entry 0 is out of range \[0, 2\)"):
        tco.multi_hash_table_embedding(table, [first, second], combiners="sum")


def test_a_corrupt_table_variable_is_an_invalid_argument():
    from tf_ctr_ops.hash_table import _find
    bad = tf.Variable(tf.zeros([6, 4], tf.int64))  # 2 header + 1 free-list row leave 3 slots
    with pytest.raises(tf.errors.InvalidArgumentError, match="power of two"):
        _find(bad, tf.constant([1], tf.int64), capacity=1, insert=False, admit_after=1)
    small = tf.Variable(tf.zeros(table_shape(4, 8), tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError):
        _find(small, tf.constant([1], tf.int64), capacity=8, insert=True, admit_after=1)
    # The free list's row count of the largest capacity: it overflowed into
    # a negative number in the message.
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"\[2 \+ S \+ 2305843009213693952, 4\]"):
        _find(small, tf.constant([1], tf.int64), capacity=2**63 - 1, insert=False, admit_after=1)
    # A values variable of another dtype is named as the values, not the table.
    from tf_ctr_ops.hash_table import _ops as hash_ops
    good = HashTable(dim=2, capacity=8)
    with pytest.raises(tf.errors.InvalidArgumentError, match="the values variable holds int64"):
        hash_ops.ctr_hash_table_embedding(
            table=good.table.handle, values=tf.Variable(tf.zeros([8, 2], tf.int64)).handle,
            keys=tf.constant([1], tf.int64), segments=tf.constant([0, 1], tf.int64),
            num_rows=tf.constant(-1, tf.int64), weights=tf.zeros([0]), T=tf.float32, capacity=8,
            segment_kind="row_splits")
    table = HashTable(dim=2, capacity=8, eviction="lru")
    # The last: a clock that could not advance without overflowing.
    for header in ([9, 0, 0, 0, 0, 0], [2, 0, 0, 0, 3, 0], [0, -1, 0, 0, 0, 0], [0, 0, 0, 0, 0, -5],
                   [0, 0, 0, 0, 0, 2**63 - 1]):
        corrupt = table.table.numpy()
        corrupt[0, :] = header[:4]
        corrupt[1, :2] = header[4:]
        table.table.assign(corrupt)
        for insert in (False, True):
            with pytest.raises(tf.errors.InvalidArgumentError, match="corrupt hash table header"):
                table.find([1, 2], insert=insert)


def _slots_holding(entry, key_base, capacity=8, empty_slot=None, **kwargs):
    """A table whose every slot (but empty_slot) holds a key (key_base + slot)
    with `entry`, and whose rows were all handed out: a variable assigned
    something else."""
    table = HashTable(dim=2, capacity=capacity, **kwargs)
    data = table.table.numpy()
    pairs = data[2:2 + table.num_slots // 2].reshape(-1, 2)  # (key, entry) of each slot
    pairs[:, 0] = key_base + np.arange(table.num_slots)
    pairs[:, 1] = entry
    if empty_slot is not None:
        pairs[empty_slot] = (0, -1)
    data[2:2 + table.num_slots // 2] = pairs.reshape(-1, 4)
    data[0, 0], data[0, 1] = capacity, table.num_slots  # rows handed out, slots occupied
    table.table.assign(data)
    return table


def test_an_eviction_never_hands_out_a_corrupt_slots_row():
    # Evicted keys' rows went onto the free stack unchecked, and new keys got
    # rows past the values (10**12 here) with no error.
    from tf_ctr_ops import _core
    # One empty slot ends the probes (a table without one is refused by the
    # find, before any eviction); the header says every slot is taken.
    table = _slots_holding(10**12, 1000, eviction="lru", empty_slot=5)
    message = r"corrupt hash table: an evicted key held row 1000000000000, out of range \[0, 8\)"
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        table.find([1, 2, 3], insert=True)
    with pytest.raises(ValueError, match=message):
        _core.hash_table_find(_slots_holding(10**12, 1000, eviction="lru", empty_slot=5).table.numpy(),
                              np.array([1, 2, 3]), 8, insert=True, eviction="lru")


@pytest.mark.parametrize("insert", [False, True])
def test_a_zeroed_table_is_an_error_naming_the_key_not_a_scan_per_key(insert):
    # Zeros make every slot hold key 0 with row 0: no probe of another key
    # ends, and each one scanned every slot, then read as absent (a training
    # call dropped every key, silently, at O(slots) a key).
    from tf_ctr_ops import _core
    table = HashTable(dim=2, capacity=1 << 14)
    table.table.assign(tf.zeros_like(table.table))
    message = f"corrupt hash table: key [78]'s probe met no empty slot among its {table.num_slots} slots"
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        table.find(tf.constant([0, 7] + [8] * 5000, tf.int64), insert=insert)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        hash_table_embedding(table, tf.ragged.constant([[0], [7, 0]], tf.int64), insert=insert)
    with pytest.raises(ValueError, match=message):
        _core.hash_table_find(table.table.numpy(), np.array([7]), table.capacity, insert=insert)
    assert int(table.statistics()["dropped"]) == 0


def test_a_row_past_the_capacity_is_an_error_not_a_row():
    # find() handed out the corrupt row as it was (the pooling ops check rows;
    # find's caller gets them raw).
    from tf_ctr_ops import _core
    table = HashTable(dim=2, capacity=8)
    table.find([5], insert=True)
    data = table.table.numpy()
    pairs = data[2:2 + table.num_slots // 2].reshape(-1, 2)
    pairs[pairs[:, 0] == 5, 1] = 1000
    data[2:2 + table.num_slots // 2] = pairs.reshape(-1, 4)
    table.table.assign(data)
    message = "corrupt hash table: key 5 has row 1000, past its capacity 8"
    for insert in (False, True):
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            table.find([4, 5], insert=insert)
        with pytest.raises(ValueError, match=message):
            _core.hash_table_find(data.copy(), np.array([5]), 8, insert=insert)


def test_counters_assigned_their_largest_value_stay_there():
    # dropped, evicted and a key's use count were incremented unchecked:
    # signed overflow (undefined; the sanitizer stage halts on it).
    from tf_ctr_ops.table_layout import DROPPED, EVICTED, HEADER_ROWS
    big = 2**63 - 1

    def assigned(table, cell, value):
        data = table.table.numpy()
        data.reshape(-1)[cell] = value
        table.table.assign(data)

    full = HashTable(dim=2, capacity=8, num_slots=16)
    full.find(list(range(100, 108)), insert=True)
    assigned(full, DROPPED, big)
    assert full.find([999], insert=True).numpy()[0] == -1
    assert int(full.statistics()["dropped"]) == big
    evicting = HashTable(dim=2, capacity=8, num_slots=16, eviction="lru")
    evicting.find(list(range(100, 108)), insert=True)
    assigned(evicting, EVICTED, big)
    assert evicting.find([999], insert=True).numpy()[0] >= 0
    assert int(evicting.statistics()["evicted"]) == big
    waiting = HashTable(dim=2, capacity=8, num_slots=16, admit_after=3)
    waiting.find([5], insert=True)
    data = waiting.table.numpy()
    pairs = data[HEADER_ROWS:HEADER_ROWS + 8].reshape(-1)  # pairs, read flat
    slot = int(np.flatnonzero(pairs[0::2] == 5)[0])
    stats = data[HEADER_ROWS + 8:HEADER_ROWS + 16].reshape(-1)
    stats[2 * slot + 1] = big  # the waiting key's use count
    data[HEADER_ROWS + 8:HEADER_ROWS + 16] = stats.reshape(-1, 4)
    waiting.table.assign(data)
    waiting.find([5], insert=True)
    assert waiting.table.numpy()[HEADER_ROWS + 8:HEADER_ROWS + 16].reshape(-1)[2 * slot + 1] == big


def test_a_waiting_key_seen_2_63_times_is_admitted_not_wrapped_into_a_row():
    # -(INT64_MIN) - 1 overflowed: the key got row INT64_MAX.
    table = _slots_holding(-2**63, 77, admit_after=3)
    data = table.table.numpy()
    data[0, 0] = 0  # no row handed out yet
    table.table.assign(data)
    rows = table.find([77], insert=True).numpy()
    assert 0 <= rows[0] < 8, rows
    np.testing.assert_array_equal(table.find([77]).numpy(), rows)


def _free_stack_table(free_rows, capacity=8):
    """A table holding no key whose rows were all handed out, free_rows (bottom
    first) back on its free stack, as evictions leave them."""
    table = HashTable(dim=2, capacity=capacity)
    data = table.table.numpy()
    data[0, 0], data[1, 0] = capacity, len(free_rows)  # next_row, free count
    stack = data[-((capacity + 3) // 4):]  # the free-list rows end the table
    stack.reshape(-1)[:len(free_rows)] = free_rows
    table.table.assign(data)
    return table


def test_free_rows_outside_the_values_are_refused_before_any_key_gets_one():
    good = _free_stack_table([5, 6])
    np.testing.assert_array_equal(good.find([11, 12, 13], insert=True).numpy(), [6, 5, -1])
    bad = _free_stack_table([5, 10**9])
    before = bad.table.numpy()
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"free row 1000000000 at stack position 1 is out of "
                                                             r"range \[0, 8\)"):
        bad.find([11, 12], insert=True)
    after = bad.table.numpy()
    np.testing.assert_array_equal(after[0], before[0])  # rows handed out, slots occupied: unchanged
    assert after[1, 0] == before[1, 0]
    np.testing.assert_array_equal(bad.find([11, 12]).numpy(), [-1, -1])
    from tf_ctr_ops import _core
    with pytest.raises(ValueError, match="free row -3 at stack position 0"):
        _core.hash_table_find(_free_stack_table([-3]).table.numpy(), np.array([1], np.int64), 8, insert=True)
    # Only the rows a call can reach are read: one new key takes the top one.
    deep = _free_stack_table([10**9, 5])
    np.testing.assert_array_equal(deep.find([11], insert=True).numpy(), [5])
    with pytest.raises(tf.errors.InvalidArgumentError, match="free row 1000000000"):
        deep.find([12], insert=True)


def test_default_slots_keep_rows_under_half_load():
    for capacity in (1, 2, 3, 1000, 1 << 20):
        slots = default_num_slots(capacity)
        assert slots & (slots - 1) == 0 and slots >= 2 * capacity


def test_checkpoint_round_trip(tmp_path):
    table = HashTable(dim=4, capacity=100)
    table.find([4, 8, 15, 16], insert=True)
    path = tf.train.Checkpoint(table=table).save(str(tmp_path / "ckpt"))
    restored = HashTable(dim=4, capacity=100)
    tf.train.Checkpoint(table=restored).restore(path).assert_consumed()
    np.testing.assert_array_equal(restored.find([16, 4, 23]).numpy(), [3, 0, -1])
    np.testing.assert_array_equal(restored.values.numpy(), table.values.numpy())


@pytest.mark.saved_model
def test_saved_model_serves_in_a_fresh_process(tmp_path):
    table = HashTable(dim=4, capacity=100)
    train_keys = np.array([[4, 8, -1], [15, 16, 23]], np.int64)
    hash_table_embedding(table, train_keys, insert=True)
    module = tf.Module()
    module.table = table

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int64)])
    def serve(keys):
        return {"embedding": hash_table_embedding(table, keys, combiner="sum")}

    module.serve = serve
    tf.saved_model.save(module, str(tmp_path / "model"), signatures={"serving_default": serve})
    request = np.array([[8, 99, -1], [23, 4, 4]], np.int64)
    want = serve(tf.constant(request))["embedding"].numpy()
    got = serve_in_fresh_process(tmp_path / "model", "serving_default", {"keys": request}, tmp_path)
    np.testing.assert_allclose(got["embedding"], want, rtol=1e-6)
    assert want[0].any() and want[1].any()


def test_package_exports():
    assert tco.HashTable is HashTable and tco.hash_table_embedding is hash_table_embedding


class EvictionReference:
    """The documented insert and eviction rules, replayed in Python (admit_after=1)."""

    def __init__(self, capacity, policy):
        self.capacity, self.policy = capacity, policy
        self.keys = {}  # key -> [row, last_seen, count]
        self.next_row, self.free, self.clock, self.evicted, self.dropped = 0, [], 0, 0, 0

    def _score(self, entry):
        row, last_seen, count = entry
        return (last_seen, count, row) if self.policy == "lru" else (count, last_seen, row)

    def _evict(self):
        candidates = sorted((self._score(e), k) for k, e in self.keys.items() if e[1] < self.clock)
        victims = candidates[:max(1, self.capacity // 16)]
        for _, k in reversed(victims):
            self.free.append(self.keys.pop(k)[0])
            self.evicted += 1
        return bool(victims)

    def call(self, keys):
        self.clock += 1
        for k in keys:  # every key found before the inserts is stamped, once per occurrence
            if k in self.keys:
                self.keys[k][1] = self.clock
                self.keys[k][2] += 1
        rows = [self.keys[k][0] if k in self.keys else None for k in keys]
        for i, k in enumerate(keys):
            if rows[i] is not None:
                continue
            if k in self.keys:
                e = self.keys[k]
                e[1], e[2] = self.clock, e[2] + 1
                rows[i] = e[0]
                continue
            if not self.free and self.next_row == self.capacity:
                self._evict()
            if not self.free and self.next_row == self.capacity:
                self.dropped += 1
                rows[i] = -1
                continue
            if self.free:
                row = self.free.pop()
            else:
                row, self.next_row = self.next_row, self.next_row + 1
            self.keys[k] = [row, self.clock, 1]
            rows[i] = row
        return rows


@pytest.mark.parametrize("policy", ["lru", "lfu"])
@pytest.mark.parametrize("capacity", [5, 64])
def test_eviction_replays_the_documented_policy(rng, policy, capacity):
    table = HashTable(dim=2, capacity=capacity, eviction=policy)
    ref = EvictionReference(capacity, policy)
    hot = rng.integers(-10**15, 10**15, size=capacity // 2 + 1)
    for step in range(40):
        keys = np.concatenate([rng.choice(hot, size=3), rng.integers(-10**15, 10**15, size=rng.integers(0, 9))])
        keys = keys[rng.permutation(keys.size)].astype(np.int64)
        got = table.find(keys, insert=True).numpy()
        np.testing.assert_array_equal(got, ref.call(keys.tolist()), err_msg=f"step {step}")
    stats = {k: v.numpy() for k, v in table.statistics().items()}
    assert stats["evicted"] == ref.evicted > 0 and stats["dropped"] == ref.dropped
    assert stats["size"] == len(ref.keys) == stats["occupied"]
    left = np.array(sorted(ref.keys), np.int64)
    np.testing.assert_array_equal(table.find(left).numpy(), [ref.keys[k][0] for k in left.tolist()])
    keys, _ = table.export()
    np.testing.assert_array_equal(np.sort(keys.numpy()), left)


def test_eviction_never_takes_a_key_of_the_running_call():
    table = HashTable(dim=2, capacity=4, eviction="lru")
    rows = table.find([1, 2, 3, 4, 5, 6], insert=True).numpy()
    np.testing.assert_array_equal(rows, [0, 1, 2, 3, -1, -1])  # all four rows are this call's
    assert int(table.statistics()["dropped"]) == 2 and int(table.statistics()["evicted"]) == 0


@pytest.mark.parametrize("policy", ["lru", "lfu"])
@pytest.mark.parametrize("order", [[5, 6, 100], [100, 5, 6]])
def test_eviction_never_takes_a_waiting_key_of_the_running_call(policy, order):
    # Key 100 waits from an earlier call; its second sighting here admits it.
    # The new keys before it evicted it for their slots (it was not stamped
    # until the inserter reached it), and it then took a trained key's row.
    table = HashTable(dim=2, capacity=4, admit_after=2, eviction=policy)
    table.find([100], insert=True)
    table.find([1, 1, 2, 2, 3, 3, 4, 4], insert=True)
    rows = table.find(order, insert=True).numpy()
    row_of_100 = rows[order.index(100)]
    assert row_of_100 >= 0, rows
    np.testing.assert_array_equal(table.find([100]).numpy(), [row_of_100])
    held = table.find([1, 2, 3, 4]).numpy()
    assert sorted(held[held >= 0].tolist() + [row_of_100]) == [0, 1, 2, 3]
    stats = table.statistics()
    assert int(stats["size"]) == 4 and int(stats["evicted"]) == 1


def test_lfu_keeps_frequent_keys_and_lru_keeps_recent_ones():
    for policy, survivor in (("lfu", 1), ("lru", 2)):
        table = HashTable(dim=2, capacity=2, eviction=policy)
        for _ in range(5):
            table.find([1], insert=True)  # key 1: often, long ago
        table.find([2], insert=True)      # key 2: once, recently
        table.find([3], insert=True)      # evicts one of them
        got = table.find([1, 2]).numpy()
        assert (got >= 0).tolist() == [survivor == 1, survivor == 2], policy


def test_evicted_rows_are_reset_for_their_new_keys():
    table = HashTable(dim=3, capacity=16, eviction="lru", initializer=tf.keras.initializers.Constant(0.5))
    table.find(np.arange(16), insert=True)
    table.values.assign(tf.fill([16, 3], 7.0))
    out = hash_table_embedding(table, tf.ragged.constant([[100], [101]], dtype=tf.int64), insert=True)
    np.testing.assert_allclose(out.numpy(), 0.5)  # the new keys read reset rows, not the evicted keys' 7.0
    values = table.values.numpy()
    reused = table.find([100, 101]).numpy()
    np.testing.assert_allclose(values[reused], 0.5)
    assert (values == 7.0).all(axis=1).sum() == 14


def test_pending_keys_are_evicted_for_slots():
    table = HashTable(dim=2, capacity=2, admit_after=3, eviction="lru", num_slots=8)
    for start in range(0, 60, 6):
        table.find(np.arange(start, start + 6), insert=True)
    stats = {k: int(v) for k, v in table.statistics().items() if k != "load_factor"}
    assert stats["occupied"] <= 6 and stats["evicted"] > 0
    # key 54 waits (seen once); here its 2nd sighting waits and its 3rd gets the first row
    np.testing.assert_array_equal(table.find([54, 54], insert=True).numpy(), [-1, 0])


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_pending_keys_are_evicted_once_every_row_is_free(policy):
    # Evicting the rows' keys for a stream of one-off keys frees every row;
    # the one-off keys, awaiting admission, must go next, or the table drops
    # every new key forever.
    capacity = 16
    table = HashTable(dim=2, capacity=capacity, admit_after=2, eviction=policy)
    hot = np.arange(capacity)
    for _ in range(2):
        table.find(hot, insert=True)
    for key in range(1000, 1140):
        table.find([key], insert=True)
    for _ in range(2):
        for key in hot:
            table.find([key], insert=True)
    assert (table.find(hot).numpy() >= 0).all(), table.statistics()
    assert int(table.statistics()["size"]) == capacity


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_keys_waiting_for_admission_are_evicted_for_slots_before_trained_rows(policy):
    # One-off keys (never admitted) fill the slots while most rows are free:
    # freeing slots evicted the least recently used keys, the trained ones.
    table = HashTable(dim=1, capacity=64, admit_after=2, eviction=policy)
    trained = np.arange(1, 11, dtype=np.int64)
    for _ in range(3):
        table.find(trained, insert=True)
    rows = table.find(trained).numpy()
    for i in range(20):
        table.find(np.arange(1000 + 8 * i, 1008 + 8 * i, dtype=np.int64), insert=True)
    np.testing.assert_array_equal(table.find(trained).numpy(), rows)
    stats = table.statistics()
    assert int(stats["evicted"]) > 0 and int(stats["size"]) == len(trained)


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_one_call_of_more_one_off_keys_than_slots_never_evicts_trained_rows(policy):
    # The call's own one-off keys wait with its clock, so none of them can
    # go: freeing a slot for the next took a trained key while rows were
    # free. The keys that find no slot are dropped instead.
    table = HashTable(dim=2, capacity=16, admit_after=2, eviction=policy)  # 32 slots, 24 claimed at most
    trained = np.arange(8, dtype=np.int64)
    for _ in range(2):
        table.find(trained, insert=True)
    rows = table.find(trained).numpy()
    table.find(np.arange(100, 120, dtype=np.int64), insert=True)
    np.testing.assert_array_equal(table.find(trained).numpy(), rows)
    stats = {k: int(v) for k, v in table.statistics().items() if k != "load_factor"}
    assert stats["size"] == 8 and stats["evicted"] == 0 and stats["dropped"] == 4, stats


def test_a_step_whose_first_find_is_in_a_branch_that_does_not_run_still_advances_the_clock():
    # The first find traced started the step; in a branch that did not run,
    # the clock stood still, every key counted as read by the running step,
    # and a full table dropped new keys instead of evicting.
    table = HashTable(dim=2, capacity=16, eviction="lru")
    table.find(np.arange(16, dtype=np.int64), insert=True)

    @tf.function
    def step(pred, a, b):
        return tf.cond(pred, lambda: tco.hash_table_embedding(table, a, insert=True),
                       lambda: tco.hash_table_embedding(table, b, insert=True))

    for key in (100, 101):
        step(tf.constant(False), tf.constant([[1]], tf.int64), tf.constant([[key]], tf.int64))
        assert table.find([key]).numpy()[0] >= 0, table.statistics()
    stats = table.statistics()
    assert int(stats["evicted"]) > 0 and int(stats["dropped"]) == 0, stats


@pytest.mark.parametrize("make_optimizer, slot_after", [
    (lambda: keras.optimizers.SGD(learning_rate=0.5, momentum=0.9), lambda g: -0.5 * g),
    (lambda: keras.optimizers.Adagrad(learning_rate=0.5, initial_accumulator_value=0.25), lambda g: 0.25 + g * g),
])
def test_eviction_resets_the_optimizer_slots_of_reused_rows(make_optimizer, slot_after):
    table = HashTable(dim=2, capacity=16, eviction="lru")
    optimizer = make_optimizer()
    optimizer.build([table.values])
    table.reset_slots_of(optimizer)
    table.find(np.arange(16), insert=True)
    (slot, _), = optimizer_slots(optimizer, table.values)
    slot.assign(np.full([16, 2], 100.0, np.float32))
    keys = tf.ragged.constant([[500]], dtype=tf.int64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(hash_table_embedding(table, keys, combiner="sum", insert=True) * [[3.0, -1.0]])
    grad = tape.gradient(loss, table.values)
    optimizer.apply_gradients([(grad, table.values)])
    row = int(table.find([500])[0])
    np.testing.assert_allclose(slot.numpy()[row], slot_after(np.array([3.0, -1.0])), rtol=1e-5)
    others = np.delete(slot.numpy(), row, axis=0)
    assert (np.abs(others) > 50).all(), "only the reused row's slots restart"


@pytest.mark.parametrize("initializer, bound", [
    (None, 2.0 / np.sqrt(4)),  # HashTable's default: truncated normal, stddev 1/sqrt(dim), cut at 2 stddev
    (keras.initializers.GlorotUniform(seed=3), np.sqrt(6.0 / (64 + 4))),  # the fans of the whole [64, 4] table
    (keras.initializers.RandomUniform(-0.05, 0.05), 0.05),
    ("glorot_uniform", np.sqrt(6.0 / (64 + 4))),  # a name, as the Keras layer takes it
    ({"class_name": "RandomUniform", "config": {"minval": -0.05, "maxval": 0.05}}, 0.05),
])
def test_rows_given_to_new_keys_restart_from_fresh_draws_of_the_initializer(initializer, bound):
    # Keras initializers are seeded once: called per eviction they gave every
    # reused row the same vector (new keys started alike), and Glorot drew
    # with the fans of the few reused rows, not of the table.
    table = HashTable(dim=4, capacity=64, eviction="lru", initializer=initializer)
    table.find(np.arange(64), insert=True)
    fresh = []
    step = tf.function(lambda k: table.find(k, insert=True))
    for key in range(1000, 1040):
        row = int(step(tf.constant([key], tf.int64))[0])
        fresh.append(table.values.numpy()[row].copy())
    fresh = np.array(fresh)
    assert len({tuple(v) for v in fresh}) == len(fresh), "every reused row gets values of its own"
    assert np.abs(fresh).max() <= bound * (1 + 1e-6)
    assert fresh.std() > bound / 4, "spread as the initializer spreads them"


@pytest.mark.parametrize("initializer", ["orthogonal", "identity"])
def test_eviction_with_an_initializer_of_static_shapes_trains_in_a_function(initializer):
    # Called on the reused rows' run-time shape, Orthogonal failed to trace:
    # any inserting call in a tf.function (model.fit) raised a TypeError.
    init = keras.initializers.get(initializer)
    table = HashTable(dim=4, capacity=8, eviction="lru", initializer=init)
    initial = table.values.numpy().copy()
    step = tf.function(lambda k: table.find(k, insert=True))
    step(tf.constant(np.arange(8), tf.int64))
    table.values.assign(np.full([8, 4], 9.0, np.float32))
    rows = step(tf.constant([100, 101], tf.int64)).numpy()
    np.testing.assert_allclose(table.values.numpy()[rows], initial[rows], rtol=1e-6)


def test_eviction_resets_only_its_own_tables_slots_when_tables_share_a_name():
    # Two default HashTables both have `hash_table/values` (eager names are
    # not uniquified), so their slots share a name too: an eviction in one
    # reset the other's momentum rows as well.
    tables = [HashTable(dim=2, capacity=2, eviction="lru", initializer=tf.zeros_initializer()) for _ in range(2)]
    optimizer = keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)
    optimizer.build([t.values for t in tables])
    for table in tables:
        table.reset_slots_of(optimizer)
    slots = [optimizer_slots(optimizer, t.values) for t in tables]
    assert [len(s) for s in slots] == [1, 1] and slots[0][0][0] is not slots[1][0][0]
    for t in tables:
        t.find([1, 2], insert=True)
    for (slot, _), value in zip([s[0] for s in slots], (5.0, 7.0)):
        slot.assign(np.full([2, 2], value, np.float32))
    hash_table_embedding(tables[0], tf.constant([[3]], tf.int64), combiner="sum", insert=True)  # evicts a row
    assert int(tables[0].statistics()["evicted"]) > 0 and int(tables[1].statistics()["evicted"]) == 0
    assert (slots[0][0][0].numpy() == 0).any(), "the reused row's momentum restarts"
    np.testing.assert_array_equal(slots[1][0][0].numpy(), np.full([2, 2], 7.0), "the other table's slots stay")


def test_eviction_resets_only_its_own_slots_when_another_name_extends_its_prefix():
    # Keras names slots `{path with _}_{kind}`: the slots of layer
    # `user_embeddings_v2` also start with layer `user`'s prefix.
    from tf_ctr_ops.layers import HashTableEmbedding

    user = HashTableEmbedding(2, capacity=16, eviction="lru", combiner="sum", name="user")
    other = HashTableEmbedding(2, capacity=16, combiner="sum", name="user_embeddings_v2")
    optimizer = keras.optimizers.Adam(0.1)
    keys = tf.constant([list(range(16))], tf.int64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(user(keys, training=True)) + tf.reduce_sum(other(keys, training=True))
    variables = [user.embeddings, other.embeddings]
    optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
    user.reset_slots_of(optimizer)
    names = sorted(slot.name for slot, _ in optimizer_slots(optimizer, user.embeddings))
    assert names == ["user_embeddings_momentum", "user_embeddings_velocity"], names
    others = [v for v in optimizer.variables if v.name.startswith("user_embeddings_v2_")]
    before = [v.numpy().copy() for v in others]
    user(tf.constant([[100]], tf.int64), training=True)  # evicts a key of `user`: its row restarts
    assert int(user.statistics()["evicted"]) > 0
    for v, was in zip(others, before):
        np.testing.assert_array_equal(v.numpy(), was)


def test_an_ema_average_of_a_reused_row_restarts_at_the_row():
    # Keras' use_ema keeps an average per variable, which fit writes into
    # the variable at the end: it must restart where the row does, not at 0.
    from tf_ctr_ops.layers import HashTableEmbedding

    layer = HashTableEmbedding(2, capacity=16, eviction="lru", combiner="sum",
                               embeddings_initializer=keras.initializers.Constant(1.0))
    optimizer = keras.optimizers.SGD(1e-3, use_ema=True, ema_momentum=0.99)

    def step(keys):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(tf.constant([keys], tf.int64), training=True))
        optimizer.apply_gradients([(tape.gradient(loss, layer.embeddings), layer.embeddings)])

    step(list(range(16)))
    layer.reset_slots_of(optimizer)
    assert [initial for _, initial in optimizer_slots(optimizer, layer.embeddings)] == ["fresh row"]
    step([100])  # evicts key 0: its row goes to key 100, fresh at 1.0
    [row] = tco.hash_table.find_rows(layer, tf.constant([100], tf.int64)).numpy()
    [average] = [v for v in optimizer.variables if v.name.endswith("_average")]
    np.testing.assert_allclose(average.numpy()[row], layer.embeddings.numpy()[row], atol=1e-3)


@pytest.mark.parametrize("initializer", [keras.initializers.Identity(), keras.initializers.Orthogonal(seed=1)])
@pytest.mark.parametrize("in_function", [False, True])
def test_static_shape_initializers_reset_rows_from_the_whole_table(initializer, in_function):
    table = HashTable(dim=4, capacity=16, eviction="lru", initializer=initializer)
    insert = lambda keys: hash_table_embedding(table, keys, combiner="sum", insert=True)  # noqa: E731
    if in_function:
        insert = tf.function(insert)
    insert(tf.constant([list(range(16))], tf.int64))
    for key in (100, 101, 102):
        insert(tf.constant([[key]], tf.int64))  # each evicts one key: rows 0, 1, 2 go to new keys
    rows = table.find([100, 101, 102]).numpy()
    np.testing.assert_allclose(table.values.numpy()[rows], initializer([16, 4]).numpy()[rows], atol=1e-6)


_MATRIX = np.arange(64, dtype=np.float32).reshape(16, 4)


@pytest.mark.parametrize("initializer, want", [
    # One that ignores the shape asked for: in a graph its static [16, 4] passed for the [n, 4] asked for.
    (lambda shape, dtype=None: tf.constant(_MATRIX, dtype), lambda rows: _MATRIX[rows]),
    # NumPy float64, which creation casts: the reset refused it (a float64 gather into float32 values).
    (lambda shape, dtype=None: np.full([int(d) for d in shape], 0.25), lambda rows: 0.25),
])
@pytest.mark.parametrize("in_function", [False, True])
def test_user_initializers_reset_evicted_rows_as_they_initialize_the_table(initializer, want, in_function):
    table = HashTable(dim=4, capacity=16, eviction="lru", initializer=initializer)
    assert table.values.dtype == tf.float32
    insert = lambda keys: table.find(keys, insert=True)  # noqa: E731
    if in_function:
        insert = tf.function(insert, input_signature=[tf.TensorSpec([None], tf.int64)])
    insert(tf.range(16, dtype=tf.int64))
    table.values.assign(tf.fill([16, 4], 9.0))
    insert(tf.constant([1000, 1001], tf.int64))
    rows = table.find([1000, 1001]).numpy()
    np.testing.assert_array_equal(table.values.numpy()[rows], np.broadcast_to(want(rows), [2, 4]))


def test_bad_pooling_arguments_are_refused_before_any_insert():
    table = HashTable(dim=3, capacity=20)
    keys = tf.ragged.constant([[101, 102], [103]], dtype=tf.int64)
    for kwargs in (dict(combiner="max"), dict(max_norm=-1.0)):
        with pytest.raises(ValueError):
            hash_table_embedding(table, keys, insert=True, **kwargs)
    with pytest.raises(ValueError, match="max_norm"):
        tco.multi_hash_table_embedding(table, [keys, keys], max_norms=[1.0, -2.0], insert=True)
    assert int(table.size()) == 0


def test_eviction_under_a_strategy_is_refused_before_any_insert():
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
        table = HashTable(dim=2, capacity=16, eviction="lru")
        with pytest.raises(NotImplementedError, match="eviction"):
            hash_table_embedding(table, tf.ragged.constant([[1, 2, 3]], dtype=tf.int64), insert=True)
    assert int(table.size()) == 0


@pytest.mark.parametrize("eviction, admit_after", [("none", 1), ("lru", 1), ("lfu", 2)])
def test_core_module_builds_the_same_table_as_the_op(rng, eviction, admit_after):
    """_core.hash_table_find (what the GPU tests build their tables with) runs
    the op's loops: same rows, same reused rows, the same table bit for bit."""
    from tf_ctr_ops import _core

    table = HashTable(dim=2, capacity=40, eviction=None if eviction == "none" else eviction,
                      admit_after=admit_after)
    mirror = table.table.numpy().copy()
    for step in range(25):
        keys = rng.integers(-60, 60, size=rng.integers(0, 20)).astype(np.int64)
        rows, reused = _find_op(table, keys)
        core_rows, core_reused = _core.hash_table_find(mirror, keys, 40, insert=True, admit_after=admit_after,
                                                       eviction=eviction)
        np.testing.assert_array_equal(core_rows, rows, err_msg=f"step {step}")
        np.testing.assert_array_equal(core_reused, reused)
        np.testing.assert_array_equal(mirror, table.table.numpy())
    probe = rng.integers(-70, 70, size=50)
    np.testing.assert_array_equal(_core.hash_table_find(mirror, probe, 40)[0], table.find(probe).numpy())
    with pytest.raises(ValueError, match="corrupt"):
        bad = mirror.copy()
        bad[1, 0] = 10**6  # the free-stack count
        _core.hash_table_find(bad, probe, 40, insert=True)


def _find_op(table, keys):
    from tf_ctr_ops.hash_table import _find
    rows, reused = _find(table.table, tf.constant(keys, tf.int64), table.capacity, insert=True,
                         admit_after=table.admit_after, eviction=table.eviction)
    return rows.numpy(), reused.numpy()


@pytest.mark.parametrize("how", ["checkpoint", "restore_resized"])
def test_restore_into_a_table_of_another_capacity(rng, tmp_path, how):
    saved = HashTable(dim=3, capacity=100, eviction="lru")
    keys = rng.choice(10**9, 60, replace=False).astype(np.int64)
    saved.find(keys, insert=True)
    saved.values.assign(rng.normal(size=(100, 3)).astype(np.float32))
    path = tf.train.Checkpoint(emb=saved).save(str(tmp_path / "ckpt"))
    want = saved.values.numpy()[saved.find(keys).numpy()]
    for capacity, num_slots, fits in ((100, None, 60), (100, 1024, 60), (1000, None, 60), (25, None, 25)):
        resized = HashTable(dim=3, capacity=capacity, num_slots=num_slots)
        if how == "checkpoint":
            tf.train.Checkpoint(emb=resized).restore(path).assert_consumed()
        else:
            assert int(resized.restore_resized(path, "emb")) == fits
        rows = resized.find(keys).numpy()
        kept = rows >= 0
        # Rows go in the saved row order: the keys inserted first keep theirs.
        np.testing.assert_array_equal(kept, np.arange(60) < fits)
        np.testing.assert_array_equal(resized.values.numpy()[rows[kept]], want[kept])
        stats = resized.statistics()
        assert (int(stats["size"]), int(stats["dropped"])) == (fits, 60 - fits)


def test_restore_resized_reads_a_layers_table_and_names_a_missing_one(rng, tmp_path):
    from tf_ctr_ops.hash_table import find_rows
    from tf_ctr_ops.layers import HashTableEmbedding
    layer = HashTableEmbedding(3, capacity=50, name="emb")
    keys = rng.choice(10**9, 30, replace=False).astype(np.int64)
    layer(keys[:, None], training=True)
    path = tf.train.Checkpoint(emb=layer).save(str(tmp_path / "ckpt"))
    resized = HashTable(dim=3, capacity=20)
    assert int(resized.restore_resized(path, "emb")) == 20
    rows = resized.find(keys[:20]).numpy()
    want = layer.embeddings.numpy()[find_rows(layer, tf.constant(keys[:20])).numpy()]
    np.testing.assert_array_equal(resized.values.numpy()[rows], want)
    with pytest.raises(ValueError, match="no hash table named 'other'"):
        resized.restore_resized(path, "other")
    with pytest.raises(ValueError, match="holds 'emb' with rows of width 3, this table's rows are 4 wide"):
        HashTable(dim=4, capacity=20).restore_resized(path, "emb")
    # A table of another dtype: both named, not a tensor conversion error that prints the rows.
    with pytest.raises(ValueError, match="holds 'emb' with rows of float32, this table's rows are float64"):
        HashTable(dim=3, capacity=20, dtype=tf.float64).restore_resized(path, "emb")


def test_checkpoint_restore_of_another_dim_names_both(rng, tmp_path):
    saved = HashTable(dim=3, capacity=10)
    saved.find([5, 6], insert=True)
    path = tf.train.Checkpoint(emb=saved).save(str(tmp_path / "ckpt"))
    with pytest.raises(ValueError, match="rows of width 3, this one 4"):
        tf.train.Checkpoint(emb=HashTable(dim=4, capacity=20)).restore(path)


@pytest.mark.parametrize("capacity", [10, 20])
def test_a_refused_restore_leaves_the_table_as_it_was(tmp_path, capacity):
    # Of the same capacity, the saved `table` has this one's shape, and
    # TF would assign it before the other dim of `values` is seen.
    saved = HashTable(dim=3, capacity=10)
    saved.find([11, 22, 33], insert=True)
    path = tf.train.Checkpoint(emb=saved).save(str(tmp_path / "ckpt"))
    table = HashTable(dim=4, capacity=capacity)
    table.find([99], insert=True)
    before = table.table.numpy(), table.values.numpy()
    with pytest.raises(ValueError, match="rows of width 3, this one 4"):
        tf.train.Checkpoint(emb=table).restore(path)
    np.testing.assert_array_equal(table.table.numpy(), before[0])
    np.testing.assert_array_equal(table.values.numpy(), before[1])
    np.testing.assert_array_equal(table.find([11, 99]).numpy(), [-1, 0])


def test_a_checkpoint_whose_rows_pass_its_values_restores_nothing(tmp_path):
    # Another capacity with the same slot count: the saved table has this
    # one's shape and was assigned as it was; its keys' rows then failed to
    # read (a raw GatherV2 error), and the table stayed the checkpoint's, unusable.
    saved = HashTable(dim=2, capacity=100, num_slots=256)
    saved.find(list(range(100)), insert=True)
    data = saved.table.numpy()
    pairs = data[2:2 + 128].reshape(-1, 2)
    pairs[pairs[:, 0] == 42, 1] = 10**12
    data[2:2 + 128] = pairs.reshape(-1, 4)
    saved.table.assign(data)
    path = tf.train.Checkpoint(emb=saved).save(str(tmp_path / "ckpt"))
    table = HashTable(dim=2, capacity=97, num_slots=256)
    table.find([5, 6], insert=True)
    before = table.table.numpy(), table.values.numpy()
    with pytest.raises(ValueError, match="could not be restored into this one .*as it was before the restore"):
        tf.train.Checkpoint(emb=table).restore(path)
    np.testing.assert_array_equal(table.table.numpy(), before[0])
    np.testing.assert_array_equal(table.values.numpy(), before[1])
    np.testing.assert_array_equal(table.find([5, 6, 42]).numpy(), [0, 1, -1])


def test_a_deleted_table_frees_its_variables_at_once(tmp_path):
    # Its variables held themselves (their restore hook), so only the cycle
    # collector freed them: tables of hundreds of MB piled up between runs.
    import gc
    import weakref

    gc.disable()
    try:
        table = HashTable(dim=4, capacity=100)
        hash_table_embedding(table, tf.constant([[1, 2]], tf.int64), insert=True)
        tf.train.Checkpoint(t=table).write(str(tmp_path / "ckpt"))
        refs = [weakref.ref(table.values), weakref.ref(table.table)]
        del table
        assert [r() for r in refs] == [None, None]
    finally:
        gc.enable()


def test_a_checkpoint_of_one_of_the_two_variables_restores_it(tmp_path):
    saved = HashTable(dim=4, capacity=8)
    saved.find([1, 2, 3], insert=True)
    other = HashTable(dim=4, capacity=8)
    other.find([7, 8], insert=True)
    values_only = tf.train.Checkpoint(v=saved.values).save(str(tmp_path / "values" / "ckpt"))
    table_only = tf.train.Checkpoint(t=saved.table).save(str(tmp_path / "table" / "ckpt"))
    whole = tf.train.Checkpoint(emb=other).save(str(tmp_path / "whole" / "ckpt"))
    table = HashTable(dim=4, capacity=8)
    tf.train.Checkpoint(v=table.values).restore(values_only).assert_consumed()
    np.testing.assert_array_equal(table.values.numpy(), saved.values.numpy())
    tf.train.Checkpoint(t=table.table).restore(table_only).assert_consumed()
    np.testing.assert_array_equal(table.find([1, 2, 3]).numpy(), [0, 1, 2])
    # A part restored alone is not paired with a later restore's other part.
    tf.train.Checkpoint(v=table.values).restore(values_only)
    tf.train.Checkpoint(emb=table).restore(whole).assert_consumed()
    np.testing.assert_array_equal(table.values.numpy(), other.values.numpy())
    np.testing.assert_array_equal(table.find([7, 8, 1]).numpy(), [0, 1, -1])


def test_restoring_another_capacity_gives_the_unsaved_rows_fresh_values(tmp_path):
    saved = HashTable(dim=2, capacity=40, initializer=tf.zeros_initializer())
    saved.find([1, 2, 3], insert=True)
    path = tf.train.Checkpoint(emb=saved).save(str(tmp_path / "ckpt"))
    table = HashTable(dim=2, capacity=20, initializer=tf.zeros_initializer())
    table.find(np.arange(100, 110), insert=True)
    table.values.assign(np.full([20, 2], 42.0, np.float32))  # trained rows of keys the restore drops
    tf.train.Checkpoint(emb=table).restore(path)
    np.testing.assert_array_equal(table.find([1, 2, 3, 100]).numpy(), [0, 1, 2, -1])
    np.testing.assert_array_equal(table.values.numpy(), 0.0)
    [row] = table.find([999], insert=True).numpy()
    assert row == 3


@pytest.mark.parametrize("in_function", [False, True])
def test_a_table_without_eviction_restored_from_an_evicting_ones_checkpoint_gives_freed_rows_fresh_values(
        tmp_path, in_function):
    """Eviction left rows on the saved free stack, which the restored table
    hands to new keys: fresh from its initializer, not the evicted keys'."""
    saved = HashTable(dim=2, capacity=64, eviction="lru", initializer=tf.keras.initializers.Constant(0.5))
    saved.find(np.arange(64), insert=True)
    saved.values.assign(tf.fill([64, 2], 9.0))
    saved.find([1000], insert=True)  # evicts a round of 64 / 16 rows: one goes to 1000, three stay free
    path = tf.train.Checkpoint(t=saved).save(str(tmp_path / "ckpt"))
    table = HashTable(dim=2, capacity=64, initializer=tf.keras.initializers.Constant(0.5))
    lookup = lambda k: hash_table_embedding(table, k, insert=True)  # noqa: E731
    lookup = tf.function(lookup) if in_function else lookup
    lookup(tf.ragged.constant([[5]], tf.int64))  # traced before the restore, as a resumed fit's step may be
    tf.train.Checkpoint(t=table).restore(path)
    trained = saved.values.numpy()
    out = lookup(tf.ragged.constant([[4000], [4001], [7]], tf.int64)).numpy()
    np.testing.assert_array_equal(out, [[0.5, 0.5], [0.5, 0.5], [9.0, 9.0]])
    rows = table.find([4000, 4001]).numpy()
    assert (rows >= 0).all() and (trained[rows] == 9.0).all()  # rows the evicted keys had trained
    kept = np.setdiff1d(np.arange(64), table.find(np.arange(4003)).numpy())
    np.testing.assert_array_equal(table.values.numpy()[kept], 0.5)  # the stack's third row, still free
    taken = np.setdiff1d(np.arange(64), np.concatenate([kept, rows]))
    np.testing.assert_array_equal(table.values.numpy()[taken], trained[taken])


def _evicting_tables_checkpoint(tmp_path):
    """A checkpoint of a full LRU table of 64 rows of 9.0 that evicted a
    round of 4 rows for key 1000, three of them left free."""
    saved = HashTable(dim=2, capacity=64, eviction="lru")
    saved.find(np.arange(64), insert=True)
    saved.values.assign(tf.fill([64, 2], 9.0))
    saved.find([1000], insert=True)
    return tf.train.Checkpoint(t=saved).save(str(tmp_path / "ckpt"))


def test_freed_rows_restored_into_a_table_whose_initializer_gives_its_whole_matrix_take_their_rows(tmp_path):
    # The initializer ignores the shape asked for: its rows are read as a static-shape initializer's.
    pretrained = np.arange(128, dtype=np.float32).reshape(64, 2)
    table = HashTable(dim=2, capacity=64, initializer=lambda shape, dtype: tf.constant(pretrained, dtype))
    tf.train.Checkpoint(t=table).restore(_evicting_tables_checkpoint(tmp_path))
    [row] = table.find([4000], insert=True).numpy()
    np.testing.assert_array_equal(table.values.numpy()[row], pretrained[row])


def test_a_restore_whose_freed_rows_cannot_be_reset_leaves_the_table_as_it_was(tmp_path):
    calls = []

    def once(shape, dtype):  # gives the table its values, then refuses
        calls.append(shape)
        if len(calls) > 1:
            raise ValueError("no more values")
        return tf.fill(shape, tf.constant(0.25, dtype))

    table = HashTable(dim=2, capacity=64, initializer=once)
    table.find([1, 2], insert=True)
    before = table.table.numpy(), table.values.numpy()
    with pytest.raises(ValueError, match="could not be given fresh values from its initializer.*no more values"):
        tf.train.Checkpoint(t=table).restore(_evicting_tables_checkpoint(tmp_path))
    np.testing.assert_array_equal(table.table.numpy(), before[0])
    np.testing.assert_array_equal(table.values.numpy(), before[1])


@pytest.mark.parametrize("how", ["checkpoint", "restore_resized"])
@pytest.mark.parametrize("capacity", [10, 20])
def test_a_checkpoint_of_the_other_key_dtype_is_refused(tmp_path, how, capacity):
    # String keys are stored as int64 fingerprints: without the check the
    # restore would succeed and no key would ever be found.
    for saved_dtype, keys, other in ((tf.string, ["a", "b"], tf.int64), (tf.int64, [5, 6], tf.string)):
        saved = HashTable(dim=3, capacity=10, key_dtype=saved_dtype)
        saved.find(keys, insert=True)
        path = tf.train.Checkpoint(emb=saved).save(str(tmp_path / saved_dtype.name / "ckpt"))
        table = HashTable(dim=3, capacity=capacity, key_dtype=other)
        match = f"holds {saved_dtype.name} keys, this one takes {other.name} keys"
        with pytest.raises(ValueError, match=match):
            if how == "checkpoint":
                tf.train.Checkpoint(emb=table).restore(path)
            else:
                table.restore_resized(path, "emb")
        assert int(table.size()) == 0
        same = HashTable(dim=3, capacity=capacity, key_dtype=saved_dtype)
        if how == "checkpoint":
            tf.train.Checkpoint(emb=same).restore(path).assert_consumed()
        else:
            same.restore_resized(path, "emb")
        np.testing.assert_array_equal(same.find(keys).numpy() >= 0, True)


def test_a_checkpoint_from_before_the_key_kind_restores_and_gets_it(tmp_path):
    from tf_ctr_ops.hash_table import KEY_KIND, UNKNOWN_KEYS

    saved = HashTable(dim=3, capacity=10, key_dtype=tf.string)
    saved.find(["a", "b"], insert=True)
    old = saved.table.numpy()
    old.reshape(-1)[KEY_KIND] = UNKNOWN_KEYS  # as tables were written before the header had the cell
    saved.table.assign(old)
    path = tf.train.Checkpoint(emb=saved).save(str(tmp_path / "old" / "ckpt"))
    table = HashTable(dim=3, capacity=10, key_dtype=tf.string)
    tf.train.Checkpoint(emb=table).restore(path).assert_consumed()
    np.testing.assert_array_equal(table.find(["a", "b"]).numpy(), [0, 1])
    # Its own checkpoints carry the kind again, and are checked.
    again = tf.train.Checkpoint(emb=table).save(str(tmp_path / "again" / "ckpt"))
    with pytest.raises(ValueError, match="holds string keys"):
        tf.train.Checkpoint(emb=HashTable(dim=3, capacity=10)).restore(again)


def test_checkpoint_of_another_capacity_under_a_strategy_is_refused(tmp_path):
    saved = HashTable(dim=3, capacity=100)
    saved.find([1, 2, 3], insert=True)
    path = tf.train.Checkpoint(emb=saved).save(str(tmp_path / "ckpt"))
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        mirrored = HashTable(dim=3, capacity=200)
    with pytest.raises(ValueError, match="incompatible tensor"):  # TF's own shape check
        tf.train.Checkpoint(emb=mirrored).restore(path)


def test_a_mirrored_strategy_shares_one_table_and_refuses_eviction():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        table = HashTable(dim=2, capacity=8)
        evicting = HashTable(dim=2, capacity=8, eviction="lru")
    assert type(table.table).__name__ == "ResourceVariable"  # one copy, not a MirroredVariable
    assert "Mirrored" in type(table.values).__name__
    keys = tf.ragged.constant([[3, 4]], dtype=tf.int64)
    strategy.run(tf.function(lambda: hash_table_embedding(table, keys, insert=True)))
    assert int(table.size()) == 2
    with pytest.raises(NotImplementedError, match="eviction"):
        strategy.run(tf.function(lambda: hash_table_embedding(evicting, keys, insert=True)))


def test_a_strategy_without_a_table_rule_is_refused():
    # CentralStorageStrategy keeps variables on one device and mirrors
    # nothing: no rule here says where its replicas' inserts go.
    with tf.distribute.experimental.CentralStorageStrategy(["/cpu:0"]).scope():
        with pytest.raises(NotImplementedError, match="not yet under CentralStorageStrategy"):
            HashTable(dim=2, capacity=8)


# ---------------------------------------------------------------------------
# Slots: multi_hash_table_embedding


def _twin_tables(n=2, capacity=200, key_dtype=tf.int64):
    init = lambda shape, dtype: tf.random.stateless_normal(shape, [3, 4], dtype=dtype)  # noqa: E731
    return [HashTable(dim=5, capacity=capacity, key_dtype=key_dtype, initializer=init) for _ in range(n)]


def _slot_features(rng, batch):
    """A ragged, a dense -1-padded and a sparse feature of one batch (-1 is a key in the first)."""
    ragged = random_keys(rng, batch, 4, KEY_SPACE)
    dense = rng.choice(KEY_SPACE[:60], size=(batch, 3))
    dense[rng.random(dense.shape) < 0.3] = -1
    sparse = random_keys(rng, batch, 3, KEY_SPACE[40:]).to_sparse()
    return [ragged, tf.constant(dense), sparse]


def _weights_like(rng, keys):
    if isinstance(keys, tf.RaggedTensor):
        return keys.with_flat_values(tf.constant(rng.uniform(0.5, 2, keys.flat_values.shape[0]), tf.float32))
    if isinstance(keys, tf.SparseTensor):
        return tf.SparseTensor(keys.indices, tf.constant(rng.uniform(0.5, 2, keys.values.shape[0]), tf.float32),
                               keys.dense_shape)
    return tf.constant(rng.uniform(0.5, 2, keys.shape), tf.float32)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("batch", [0, 7, 300])
def test_slots_match_one_call_per_feature(rng, weighted, batch):
    ours, theirs = _twin_tables()
    features = _slot_features(rng, batch)
    weights = [_weights_like(rng, f) if weighted and i != 1 else None for i, f in enumerate(features)]
    combiners = ["mean", "sqrtn", "mean"]
    for step in range(2):  # the second step finds the rows the first inserted
        with tf.GradientTape(persistent=True) as tape:
            got = tco.multi_hash_table_embedding(ours, features, weights, combiners=combiners, max_norms=2.0,
                                                 insert=True)
            want = [hash_table_embedding(theirs, f, w, combiner=c, max_norm=2.0, insert=True)
                    for f, w, c in zip(features, weights, combiners)]
            loss_got = sum(tf.reduce_sum(g * (k + 1)) for k, g in enumerate(got))
            loss_want = sum(tf.reduce_sum(w * (k + 1)) for k, w in enumerate(want))
        for g, w in zip(got, want):
            assert g.shape.as_list() == [batch, 5]
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(ours.export()[0], theirs.export()[0])  # the same rows for the same keys
        np.testing.assert_allclose(tf.convert_to_tensor(tape.gradient(loss_got, ours.values)),
                                   tf.convert_to_tensor(tape.gradient(loss_want, theirs.values)), rtol=1e-5, atol=1e-6)


def test_an_unweighted_slot_pooled_beside_a_weighted_one_is_bit_equal_to_its_own_call(rng):
    # Given weights of 1 to pool with the weighted feature, it took the
    # weighted pooling's order and divisor: off by a rounding.
    keys = tf.ragged.constant([rng.integers(0, 40, size=int(n)).tolist() for n in rng.integers(1, 12, size=200)],
                              tf.int64)
    weights = tf.ones_like(keys, tf.float32)
    for insert in (True, False):
        ours, theirs = _twin_tables()
        got = tco.multi_hash_table_embedding(ours, [keys, keys], [None, weights], combiners="mean", insert=True)
        want = [hash_table_embedding(theirs, keys, w, combiner="mean", insert=True) for w in (None, weights)]
        if not insert:  # the read path: found rows
            got = tco.multi_hash_table_embedding(ours, [keys, keys], [None, weights], combiners="mean")
            want = [hash_table_embedding(theirs, keys, w, combiner="mean") for w in (None, weights)]
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


def test_slots_take_int32_and_int64_features_together():
    # The slots' keys are found by one op: features of both int types were
    # concatenated as they came (a ConcatV2 type error).
    keys = [tf.constant([[1, 2], [3, -1]], tf.int32), tf.ragged.constant([[2, 7], []], tf.int64)]
    tables = _twin_tables(2)
    got = tco.multi_hash_table_embedding(tables[0], keys, insert=True)
    want = [hash_table_embedding(tables[1], k, insert=True) for k in keys]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.numpy(), w.numpy())


def test_slots_of_one_table_are_one_find_and_one_lookup(rng):
    table = _twin_tables(1)[0]
    spec = tf.TensorSpec([None, 2], tf.int64)
    graph = tf.function(lambda a, b, c, d: tco.multi_hash_table_embedding(table, [a, b, c, d], insert=True)
                        ).get_concrete_function(spec, spec, spec, spec).graph
    types = [op.type for op in graph.get_operations()]
    assert types.count("CtrHashTableFind") == 1
    assert types.count("CtrResourceEmbeddingLookup") == 1


def test_slots_over_several_tables_and_string_keys(rng):
    a, b = _twin_tables(2, key_dtype=tf.string)
    ref_a, ref_b = _twin_tables(2, key_dtype=tf.string)
    words = np.array([f"w{i}" for i in range(30)])
    features = [tf.ragged.constant([list(rng.choice(words, k)) for k in rng.integers(0, 4, 6)], dtype=tf.string)
                for _ in range(4)]
    got = tco.multi_hash_table_embedding([a, b, a, b], features, combiners="sum", insert=True)
    want = [hash_table_embedding(t, f, combiner="sum", insert=True)
            for t, f in zip([ref_a, ref_b, ref_a, ref_b], features)]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)
    np.testing.assert_array_equal(a.export()[0], ref_a.export()[0])
    np.testing.assert_array_equal(b.export()[0], ref_b.export()[0])


def test_slots_reject_mismatched_batches_and_arguments(rng):
    table = _twin_tables(1)[0]
    with pytest.raises(tf.errors.InvalidArgumentError, match="feature 1 has another batch size"):
        tco.multi_hash_table_embedding(table, [tf.constant([[1]], tf.int64), tf.constant([[1], [2]], tf.int64)])
    sparse = tf.SparseTensor([[3, 0]], tf.constant([1], tf.int64), [2, 1])  # a row outside its batch
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"row id 3 of entry 0 is out of range \[0, 2\)"):
        tco.multi_hash_table_embedding(table, [tf.constant([[1], [2]], tf.int64), sparse])
    with pytest.raises(ValueError, match="tables must be one value or a list of 2"):
        tco.multi_hash_table_embedding([table] * 3, [tf.constant([[1]], tf.int64)] * 2)
    with pytest.raises(ValueError, match="non-empty"):
        tco.multi_hash_table_embedding(table, [])


_OP_WITH_EIGHT_THREADS = r"""
import sys
import numpy as np
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(8)  # the op inserts in parallel from 4 threads up
sys.path.insert(0, sys.argv[1])
from core_helpers import assert_same_table
from tf_ctr_ops import _core
from tf_ctr_ops.hash_table import HashTable, _find

rng = np.random.default_rng(7)
capacity = 100_000
table = HashTable(dim=2, capacity=capacity)
mirror = table.table.numpy().copy()
for step in range(4):
    keys = (rng.zipf(1.2, size=40_000) % 90_000).astype(np.int64) * 104729
    rows, reused = _find(table.table, tf.constant(keys), capacity, insert=True, admit_after=1, eviction="none")
    want_rows, want_reused = _core.hash_table_find(mirror, keys, capacity, insert=True, in_parallel=False)
    np.testing.assert_array_equal(rows.numpy(), want_rows)
    np.testing.assert_array_equal(reused.numpy(), want_reused)
    assert_same_table(table.table.numpy(), mirror, capacity, f"step {step}")
print("ok", mirror.reshape(-1)[0])
"""


def test_the_op_with_eight_threads_inserts_as_the_serial_rules_do(tmp_path):
    """The CPU op takes the parallel insert where its thread pool has 4 threads
    or more (this machine's default may have fewer): a fresh process with 8."""
    import os
    import subprocess
    import sys

    from conftest import fresh_process_env

    tests = os.path.dirname(os.path.abspath(__file__))
    # Run from elsewhere than the checkout's root, whose source tree would shadow the installed package.
    proc = subprocess.run([sys.executable, "-c", _OP_WITH_EIGHT_THREADS, tests], cwd=tmp_path,
                          env=fresh_process_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert int(proc.stdout.split()[-1]) > 10_000, "rows were handed out"

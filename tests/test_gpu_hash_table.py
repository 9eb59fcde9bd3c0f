"""The CUDA hash-table find and insert (cuda/hash_table_kernels.cu) against
the CPU loops of the same framework-free core, through tf_ctr_ops._core.

Tables are built on the host by _core.hash_table_find(insert=True) (the loops
the TF kernel runs), copied to the device, and read back row for row by
_core.gpu_hash_table_find; _core.gpu_hash_table_find_or_insert must give the
rows, reused rows, header, free stack and per-key stats the CPU's serial
insert gives (its parallel path may seat keys of one probe run in other
slots, so tables are compared key by key). TensorFlow is never imported. Skips, with the
reason, when _core is not built, was built without CUDA, or no GPU is
reachable through CuPy or PyTorch.
"""

import numpy as np
import pytest

from core_helpers import Buffer, assert_same_table, backend_or_skip, core_or_skip, load_table_layout
from core_helpers import upload as upload_to

core = core_or_skip()
backend = backend_or_skip()
layout = load_table_layout()
empty_table = layout.empty_table_array


def gpu_find(table, capacity, keys, dense_padding=False):
    keys = np.ascontiguousarray(keys, np.int64)
    table_buf, keys_buf = upload_to(backend, table), upload_to(backend, keys)
    rows = Buffer(backend, max(keys.size, 1) * 8)
    core.gpu_hash_table_find(table_buf.ptr, table.shape[0], capacity, keys_buf.ptr if keys.size else 0, keys.size,
                             dense_padding, rows.ptr if keys.size else 0)
    backend.synchronize()
    return rows.read(np.int64, (max(keys.size, 1),))[:keys.size]


def filled_table(rng, capacity, num_slots, n_keys, admit_after=1, eviction="none"):
    """A table that saw n_keys random keys in 7 inserting calls. With an
    admission filter every chunk but the last is inserted admit_after times, so
    the table holds both admitted keys and keys still waiting for a row."""
    table = empty_table(num_slots, capacity)
    keys = rng.integers(-2**62, 2**62, size=n_keys)
    chunks = np.array_split(keys, 7)
    for i, chunk in enumerate(chunks):
        for _ in range(admit_after if i < len(chunks) - 1 else 1):
            core.hash_table_find(table, chunk, capacity, insert=True, admit_after=admit_after, eviction=eviction)
    return table, keys


@pytest.mark.parametrize("capacity, num_slots", [(10, 16), (1000, 2048), (3000, 4096), (200_000, 1 << 19)])
def test_find_matches_the_cpu(rng, capacity, num_slots):
    table, keys = filled_table(rng, capacity, num_slots, capacity + capacity // 4)
    queries = np.concatenate([keys, rng.integers(-2**62, 2**62, size=capacity // 2 + 3), [-1, 0, 2**63 - 1]])
    queries = queries[rng.permutation(queries.size)]
    want, _ = core.hash_table_find(table, queries, capacity)
    np.testing.assert_array_equal(gpu_find(table, capacity, queries), want)


def test_dense_padding_and_empty_batches(rng):
    table = empty_table(16, 8)
    core.hash_table_find(table, np.array([-1, 5, 6], np.int64), 8, insert=True)
    np.testing.assert_array_equal(gpu_find(table, 8, [-1, 5, 6, 7]), [0, 1, 2, -1])
    np.testing.assert_array_equal(gpu_find(table, 8, [-1, 5, 6, 7], dense_padding=True), [-1, 1, 2, -1])
    assert gpu_find(table, 8, np.zeros(0, np.int64)).shape == (0,)


def test_tables_after_eviction_and_admission(rng):
    for eviction, admit_after in (("lru", 1), ("lfu", 2)):
        table, keys = filled_table(rng, 64, 128, 600, admit_after=admit_after, eviction=eviction)
        want, _ = core.hash_table_find(table, keys, 64)
        assert 0 < (want >= 0).sum() < keys.size
        np.testing.assert_array_equal(gpu_find(table, 64, keys), want)


def test_bad_tables_are_rejected_before_any_launch():
    with pytest.raises(ValueError, match="S a power of two"):
        core.gpu_hash_table_find(1, 7, 8, 1, 1, False, 1)  # 7 rows: 2 header + 2 free-list rows leave 3 slots
    with pytest.raises(ValueError, match="must not be 0"):
        core.gpu_hash_table_find(0, layout.table_shape(16, 8)[0], 8, 1, 1, False, 1)


def gpu_find_or_insert(table, capacity, keys, admit_after=1, dense_padding=False, new_step=True, eviction="none",
                       path=None):
    """The device insert on a copy of `table`: (rows, reused rows, the table
    after, whether it inserted in parallel). path: a list the path taken is
    appended to ("parallel", "serial" or "host")."""
    keys = np.ascontiguousarray(keys, np.int64)
    m = max(keys.size, 1)
    table_buf, keys_buf = upload_to(backend, table), upload_to(backend, keys)
    rows, reused = Buffer(backend, m * 8), Buffer(backend, m * 8)
    status = Buffer(backend, 8 * core.gpu_hash_table_status_cells)
    scratch = Buffer(backend, core.gpu_hash_table_insert_scratch_bytes(keys.size))
    count = core.gpu_hash_table_find_or_insert(
        table_buf.ptr, table.shape[0], capacity, keys_buf.ptr if keys.size else 0, keys.size,
        rows.ptr if keys.size else 0, reused.ptr if keys.size else 0, status.ptr, scratch.ptr,
        admit_after=admit_after, dense_padding=dense_padding, new_step=new_step, eviction=eviction)
    backend.synchronize()
    cells = status.read(np.int64, (core.gpu_hash_table_status_cells,))
    in_parallel = bool(cells[core.gpu_hash_table_parallel_cell])
    if path is not None:
        path.append("host" if cells[core.gpu_hash_table_on_host_cell] else "parallel" if in_parallel else "serial")
    return (rows.read(np.int64, (m,))[:keys.size], reused.read(np.int64, (m,))[:count],
            table_buf.read(np.int64, table.shape), in_parallel)


def assert_inserts_like_the_cpu(table, capacity, keys, admit_after=1, dense_padding=False, in_parallel=None,
                                eviction="none", path=None):
    """Inserts `keys` on the device and by the CPU's serial rules; returns the
    device's table after. in_parallel, unless None: which path the device must take."""
    got_rows, got_reused, got_table, took_parallel = gpu_find_or_insert(
        table, capacity, keys, admit_after, dense_padding, eviction=eviction, path=path)
    want_table = table.copy()
    want_rows, want_reused = core.hash_table_find(want_table, np.asarray(keys, np.int64), capacity, insert=True,
                                                  admit_after=admit_after, dense_padding=dense_padding,
                                                  eviction=eviction, in_parallel=False)
    np.testing.assert_array_equal(got_rows, want_rows)
    np.testing.assert_array_equal(got_reused, want_reused)
    assert_same_table(got_table, want_table, capacity)
    if not took_parallel:  # the serial kernel seats keys where the CPU does
        np.testing.assert_array_equal(got_table, want_table)
    if in_parallel is not None:
        assert took_parallel == in_parallel
    return got_table


@pytest.mark.parametrize("admit_after", [1, 3])
@pytest.mark.parametrize("capacity, num_slots", [(10, 16), (1000, 2048), (50_000, 1 << 17)])
def test_insert_matches_the_cpu_call_after_call(rng, capacity, num_slots, admit_after):
    # Calls mixing known keys, new ones and repeats (Zipf ranks over a key
    # space beyond the capacity, so the last calls overflow and drop keys).
    # Each key comes admit_after times in its call: with a single draw, too
    # few keys are seen often enough for admission to fill the capacity.
    table = empty_table(num_slots, capacity)
    space = rng.integers(-2**62, 2**62, size=2 * capacity + 5)
    for n in (0, 1, 7, 300, 5000, 20_000):
        keys = space[np.minimum(rng.zipf(1.3, n) - 1, space.size - 1)]
        keys = rng.permutation(np.repeat(keys, admit_after))
        table = assert_inserts_like_the_cpu(table, capacity, keys, admit_after)
    assert table.reshape(-1)[layout.DROPPED] > 0 or capacity > 20_000


def test_insert_with_dense_padding_and_edge_keys(rng):
    table = empty_table(64, 32)
    for keys in ([-1, 5, -1, 0, 2**63 - 1, -2**63, 5], [-1, -1], [7, -1, 8]):
        for dense_padding in (False, True):
            table = assert_inserts_like_the_cpu(table, 32, keys, dense_padding=dense_padding)


def test_insert_takes_rows_off_the_free_stack_first(rng):
    # A table that evicted keys on the CPU holds freed rows; an insert without
    # eviction hands them out first and reports them, as the CPU does.
    table, _ = filled_table(rng, 64, 128, 600, eviction="lru")
    if table.reshape(-1)[layout.FREE_COUNT] == 0:  # a new key into the full table frees capacity / 16 rows
        core.hash_table_find(table, np.array([2**62 + 1], np.int64), 64, insert=True, eviction="lru")
    freed = table.reshape(-1)[layout.FREE_COUNT]
    assert freed > 0
    new_keys = rng.integers(-2**62, 2**62, size=freed + 3)
    # Fewer new sightings than free rows insert in parallel; more, in a full table, serially.
    after = assert_inserts_like_the_cpu(table, 64, new_keys[:freed - 1], in_parallel=True)
    assert after.reshape(-1)[layout.FREE_COUNT] == 1
    table = assert_inserts_like_the_cpu(table, 64, new_keys, in_parallel=False)
    assert table.reshape(-1)[layout.FREE_COUNT] == 0


@pytest.mark.parametrize("capacity, num_slots, batch", [(200_000, 1 << 19, 150_000), (1_500_000, 1 << 22, 1 << 20)])
def test_a_batch_of_new_and_repeated_keys_inserts_in_parallel(rng, capacity, num_slots, batch):
    # A training step's shape: Zipf keys, most of them repeats, into a table
    # with room; then a second batch of half known, half new keys.
    table = empty_table(num_slots, capacity)
    space = rng.integers(-2**62, 2**62, size=capacity // 2)
    for call in range(2):
        keys = space[np.minimum(rng.zipf(1.2, batch) - 1, space.size - 1)]
        keys[rng.random(batch) < 0.3] = rng.integers(-2**62, 2**62, size=1)  # one hot key
        table = assert_inserts_like_the_cpu(table, capacity, keys, in_parallel=True)
    assert table.reshape(-1)[layout.NEXT_ROW] > 1000


def test_many_threads_on_few_colliding_keys_give_one_row_per_key(rng):
    # Thousands of threads on 48 keys in 128 slots: every claim races others of
    # the same key and of keys whose probe runs overlap.
    for trial in range(20):
        table = empty_table(128, 64)
        keys = rng.integers(0, 48, size=20_000)
        table = assert_inserts_like_the_cpu(table, 64, keys, in_parallel=True)
        _, first = np.unique(keys, return_index=True)
        np.testing.assert_array_equal(gpu_find(table, 64, keys[np.sort(first)]), np.arange(first.size))


def test_admission_and_a_full_table_insert_serially(rng):
    table = empty_table(256, 128)
    keys = rng.integers(0, 90, size=2000)
    table = assert_inserts_like_the_cpu(table, 128, keys, admit_after=2, in_parallel=False)
    # Keys still waiting from the admission filter keep later calls serial too.
    table = assert_inserts_like_the_cpu(table, 128, rng.integers(0, 90, size=50), in_parallel=False)
    full = empty_table(256, 128)
    assert_inserts_like_the_cpu(full, 128, rng.integers(0, 400, size=3000), in_parallel=False)


@pytest.mark.parametrize("eviction, admit_after", [("lru", 1), ("lfu", 1), ("lru", 2)])
@pytest.mark.parametrize("capacity, num_slots", [(16, 32), (1000, 2048), (20_000, 1 << 15)])
def test_a_table_that_evicts_inserts_like_the_cpu_call_after_call(rng, capacity, num_slots, eviction, admit_after):
    # Steps of Zipf keys over a key space 3x the capacity: the first calls
    # insert on the device, the ones that must evict on the host, by the CPU's
    # inserter, and the table must come out as the CPU's after every call.
    table = empty_table(num_slots, capacity)
    space = rng.integers(-2**62, 2**62, size=3 * capacity)
    path = []
    for n in (1, capacity // 2, capacity // 2, capacity, 2 * capacity, 7, 3 * capacity):
        keys = space[np.minimum(rng.zipf(1.2, n) - 1, space.size - 1)]
        keys = rng.permutation(np.concatenate([keys, rng.permutation(space)[:n // 3]]))
        keys = np.repeat(keys, admit_after)
        table = assert_inserts_like_the_cpu(table, capacity, keys, admit_after, eviction=eviction, path=path)
    flat = table.reshape(-1)
    assert flat[layout.EVICTED] > 0 and "host" in path and path[0] != "host", path


def test_an_evicting_call_on_a_corrupt_table_is_refused(rng):
    # A free stack past the rows it could take is refused on the device before
    # the host runs any insert (FirstBadFreeRow), as on the CPU.
    table, _ = filled_table(rng, 64, 128, 600, eviction="lru")
    if table.reshape(-1)[layout.FREE_COUNT] == 0:
        core.hash_table_find(table, np.array([2**62 + 1], np.int64), 64, insert=True, eviction="lru")
    bad = table.copy()
    free_stack = bad.reshape(-1)[layout.COLUMNS * (layout.HEADER_ROWS + 128):]
    free_stack[bad.reshape(-1)[layout.FREE_COUNT] - 1] = 10**9
    with pytest.raises(ValueError, match="corrupt"):
        gpu_find_or_insert(bad, 64, rng.integers(-2**62, 2**62, size=200), eviction="lru")


@pytest.mark.parametrize("corrupt", ["row past the capacity", "no empty slot"])
def test_an_inserting_find_refuses_slots_no_insert_leaves(corrupt):
    # The CPU's TableFault: the device flags the table bad and inserts nothing.
    table = empty_table(16, 8)
    core.hash_table_find(table, np.array([5], np.int64), 8, insert=True)
    pairs = table[layout.HEADER_ROWS:layout.HEADER_ROWS + 8].reshape(-1)  # (key, entry) of the 16 slots
    if corrupt == "no empty slot":
        pairs[:] = 0
    else:
        pairs[1::2][pairs[0::2] == 5] = 1000
    with pytest.raises(ValueError, match="corrupt hash table"):
        core.hash_table_find(table.copy(), np.array([5, 7], np.int64), 8, insert=True)
    with pytest.raises(ValueError, match="corrupt hash table header, free stack or slots"):
        gpu_find_or_insert(table, 8, [5, 7])


def test_a_call_that_continues_a_step_keeps_the_clock(rng):
    table = empty_table(16, 8)
    after = gpu_find_or_insert(table, 8, [1, 2], new_step=True)[2]
    assert after.reshape(-1)[layout.CLOCK] == 1
    again = gpu_find_or_insert(after, 8, [1, 3], new_step=False)[2]
    assert again.reshape(-1)[layout.CLOCK] == 1
    next_step = gpu_find_or_insert(again, 8, [1], new_step=True)[2]
    assert next_step.reshape(-1)[layout.CLOCK] == 2


def test_a_corrupt_header_inserts_nothing(rng):
    table = empty_table(16, 8)
    core.hash_table_find(table, np.array([4, 5], np.int64), 8, insert=True)
    for cell, value in ((layout.NEXT_ROW, 9), (layout.FREE_COUNT, 3), (layout.OCCUPIED, -1), (layout.CLOCK, -5)):
        bad = table.copy()
        bad.reshape(-1)[cell] = value
        keys = np.ascontiguousarray([4, 6, 7], np.int64)
        table_buf, keys_buf = upload_to(backend, bad), upload_to(backend, keys)
        rows, reused = Buffer(backend, 24), Buffer(backend, 24)
        status = Buffer(backend, 8 * core.gpu_hash_table_status_cells)
        scratch = Buffer(backend, core.gpu_hash_table_insert_scratch_bytes(3))
        with pytest.raises(ValueError, match="corrupt hash table header"):
            core.gpu_hash_table_find_or_insert(table_buf.ptr, bad.shape[0], 8, keys_buf.ptr, 3, rows.ptr, reused.ptr,
                                               status.ptr, scratch.ptr)
        np.testing.assert_array_equal(table_buf.read(np.int64, bad.shape), bad)


def test_insert_arguments_are_checked_before_any_launch():
    rows = layout.table_shape(16, 8)[0]
    with pytest.raises(ValueError, match="admit_after"):
        core.gpu_hash_table_find_or_insert(1, rows, 8, 1, 1, 1, 1, 1, 1, admit_after=0)
    with pytest.raises(ValueError, match="reused_ptr must not be 0"):
        core.gpu_hash_table_find_or_insert(1, rows, 8, 1, 1, 1, 0, 1, 1)
    with pytest.raises(ValueError, match="scratch_ptr must not be 0"):
        core.gpu_hash_table_find_or_insert(1, rows, 8, 1, 1, 1, 1, 1, 0)
    with pytest.raises(ValueError, match="S a power of two"):
        core.gpu_hash_table_find_or_insert(1, 7, 8, 1, 1, 1, 1, 1, 1)

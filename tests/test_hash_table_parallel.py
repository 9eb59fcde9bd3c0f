"""The parallel insert of the key-to-row hash table (cc/core/hash_table_parallel.h)
against the serial rules it must match, through tf_ctr_ops._core on CPU
threads: the same rows, reused rows, header, free stack and per-key stats as
inserting one key at a time in key order (in_parallel=False); only slots may
differ. The GPU insert runs the same per-key functions (tests/test_gpu_hash_table.py).
"""

import numpy as np
import pytest

from core_helpers import assert_same_table, load_core, load_table_layout

try:
    core = load_core()
except ImportError as e:
    pytest.skip(str(e), allow_module_level=True)
layout = load_table_layout()


def takes_parallel_path(table, keys, capacity, admit_after=1, dense_padding=False):
    """InsertsInParallel's rule, restated as the test's oracle: no admission
    filter, no key waiting from earlier calls, and a free slot (under 3/4 of
    them, never the last empty one) and row for every sighting the find misses."""
    h = table.reshape(-1)
    num_slots = table.shape[0] - layout.HEADER_ROWS - layout.free_list_rows(capacity)
    rows, _ = core.hash_table_find(table, keys, capacity, dense_padding=dense_padding)
    missing = int(((rows == -1) & ~(dense_padding & (keys == -1))).sum())
    held = h[layout.NEXT_ROW] - h[layout.FREE_COUNT]
    return (admit_after == 1 and h[layout.OCCUPIED] == held and h[layout.OCCUPIED] + missing <= num_slots - max(num_slots // 4, 1)
            and missing <= capacity - held)


def insert_both_ways(table, keys, capacity, threads, in_parallel=None, **kw):
    """Inserts keys into copies of `table` in parallel and serially; checks
    they agree and returns the serial table. in_parallel, unless None: whether
    the call must be one the parallel path takes."""
    keys = np.asarray(keys, np.int64)
    if in_parallel is not None:
        assert takes_parallel_path(table, keys, capacity, kw.get("admit_after", 1),
                                   kw.get("dense_padding", False)) == in_parallel
    got, want = table.copy(), table.copy()
    got_rows, got_reused = core.hash_table_find(got, keys, capacity, insert=True, threads=threads, **kw)
    want_rows, want_reused = core.hash_table_find(want, keys, capacity, insert=True, in_parallel=False, **kw)
    np.testing.assert_array_equal(got_rows, want_rows)
    np.testing.assert_array_equal(got_reused, want_reused)
    assert_same_table(got, want, capacity)
    if threads == 1:  # claims in key order land where the serial insert puts them
        np.testing.assert_array_equal(got, want)
    return want


def zipf_keys(rng, size, key_space):
    return (rng.zipf(1.3, size=size) % key_space).astype(np.int64) * 7919 - key_space


@pytest.mark.parametrize("threads", [1, 8])
@pytest.mark.parametrize("capacity, num_slots", [(16, 32), (3000, 4096), (100_000, 1 << 18)])
def test_calls_of_new_known_and_repeated_keys_insert_as_the_serial_rules_do(rng, threads, capacity, num_slots):
    # Zipf keys over a space beyond the capacity: early calls insert in
    # parallel, the last ones fill the table and go serial (drops).
    table = layout.empty_table_array(num_slots, capacity)
    paths = set()
    for call in range(8):
        keys = zipf_keys(rng, int(rng.integers(0, capacity // 2 + 600)), 3 * capacity)
        paths.add(takes_parallel_path(table, keys, capacity))
        table = insert_both_ways(table, keys, capacity, threads)
    if capacity == 16:
        assert table.reshape(-1)[layout.DROPPED] > 0 and paths == {False}
    else:
        assert True in paths


@pytest.mark.parametrize("threads", [1, 8])
def test_rows_off_the_free_stack_come_in_the_serial_order(rng, threads):
    capacity, num_slots = 512, 1024
    table = layout.empty_table_array(num_slots, capacity)
    core.hash_table_find(table, np.arange(capacity, dtype=np.int64), capacity, insert=True, eviction="lru")
    # A full table evicts capacity/16 rows at once onto the free stack.
    for key in range(3):
        core.hash_table_find(table, np.array([10**6 + key], np.int64), capacity, insert=True, eviction="lru")
    free = table.reshape(-1)[layout.FREE_COUNT]
    assert free > 20  # the first evicted capacity/16 rows, each later call used one
    # The table is full but for its free stack: the call inserts in parallel
    # only while its sightings fit there.
    new_keys = np.repeat(rng.integers(2**40, 2**41, size=free // 3), 3)
    rng.shuffle(new_keys)
    before = table.copy()
    table = insert_both_ways(table, new_keys, capacity, threads, in_parallel=True)
    _, reused = core.hash_table_find(before, new_keys, capacity, insert=True, threads=threads)
    assert reused.size == free // 3


@pytest.mark.parametrize("threads", [2, 8])
def test_many_threads_on_few_colliding_keys_give_one_row_per_key(rng, threads):
    # 3000 sightings of 400 new keys into a table 2000 keys already fill to a
    # quarter: each claim races others of the same key and of keys whose
    # probe runs overlap.
    capacity, num_slots = 6000, 8192
    for trial in range(20):
        table = layout.empty_table_array(num_slots, capacity)
        core.hash_table_find(table, rng.integers(2**40, 2**41, size=2000), capacity, insert=True)
        keys = rng.integers(0, 400, size=3000).astype(np.int64)
        table = insert_both_ways(table, keys, capacity, threads, in_parallel=True)
        rows, _ = core.hash_table_find(table, keys, capacity)
        firsts = np.sort(np.unique(keys, return_index=True)[1])
        np.testing.assert_array_equal(rows[firsts], 2000 + np.arange(firsts.size))


@pytest.mark.parametrize("threads", [1, 8])
def test_padding_and_edge_keys(rng, threads):
    keys = np.array([-1, 0, -1, 2**63 - 1, -2**63, -2**63 + 1, 0, 5, -1] * 40, np.int64)
    for dense_padding in (False, True):
        table = layout.empty_table_array(512, 360)
        table = insert_both_ways(table, keys, 360, threads, in_parallel=True, dense_padding=dense_padding)
        rows, _ = core.hash_table_find(table, keys, 360, dense_padding=dense_padding)
        assert (rows[keys == -1] == -1).all() == dense_padding


def test_keys_waiting_for_admission_insert_serially(rng):
    # admit_after > 1 (or a key still waiting from such a call) never takes the
    # parallel path: who waits depends on the order of sightings.
    table = layout.empty_table_array(2048, 1024)
    for admit_after in (2, 1, 1):
        keys = rng.integers(0, 1000, size=700).astype(np.int64)  # most seen once: they wait
        table = insert_both_ways(table, keys, 1024, 8, in_parallel=False, admit_after=admit_after)


def test_a_table_with_claim_like_entries_stays_in_bounds(rng):
    # A header that fits the table over slots holding garbage, entries that
    # look like claims among them: the parallel insert reads only the call's
    # keys and gives no row outside [-1, capacity).
    capacity, num_slots = 64, 128
    for trial in range(20):
        table = layout.empty_table_array(num_slots, capacity)
        slots = table[layout.HEADER_ROWS:layout.HEADER_ROWS + num_slots].reshape(-1)
        pairs = slots[:2 * num_slots].reshape(-1, 2)
        planted = rng.choice(num_slots, size=30, replace=False)
        pairs[planted, 0] = rng.integers(0, 40, size=30)
        pairs[planted, 1] = rng.choice([-2**63, -2**63 + 3, -2**63 + 10**6, 7, -5], size=30)
        keys = rng.integers(0, 40, size=500).astype(np.int64)
        rows, reused = core.hash_table_find(table, keys, capacity, insert=True, threads=4)
        assert ((rows >= -1) & (rows < capacity)).all()
        assert reused.size == 0


@pytest.mark.parametrize("eviction", ["lru", "lfu"])
def test_an_evicting_table_evicts_only_once_a_sighting_lacks_a_row(eviction):
    # RoomForAll (a slot and a row for every sighting the find misses) turns
    # the eviction policy off for a call, and a GPU table inserts on the device
    # where it holds: at its edge, the call that takes the last free row
    # evicts nothing, and the next new key evicts one (capacity / 16 < 1).
    capacity = 8
    table = layout.empty_table_array(16, capacity)
    core.hash_table_find(table, np.arange(7, dtype=np.int64), capacity, insert=True, eviction=eviction)
    rows, reused = core.hash_table_find(table, np.array([100, 100], np.int64), capacity, insert=True,
                                        eviction=eviction)
    h = table.reshape(-1)
    assert list(rows) == [7, 7] and reused.size == 0 and h[layout.EVICTED] == 0 and h[layout.NEXT_ROW] == capacity
    rows, reused = core.hash_table_find(table, np.array([101], np.int64), capacity, insert=True, eviction=eviction)
    assert h[layout.EVICTED] == 1 and list(reused) == list(rows) and 0 <= rows[0] < 7
    assert (core.hash_table_find(table, np.array([101, 100], np.int64), capacity)[0] >= 0).all()

"""The CUDA hash-table find (cuda/hash_table_kernels.cu) against the CPU find
of the same framework-free core, through tf_ctr_ops._core.

Tables are built on the host by _core.hash_table_find(insert=True) (the loops
the TF kernel runs), copied to the device, and read back row for row by
_core.gpu_hash_table_find. TensorFlow is never imported. Skips, with the
reason, when _core is not built, was built without CUDA, or no GPU is
reachable through CuPy or PyTorch.
"""

import numpy as np
import pytest

from core_helpers import Buffer, backend_or_skip, core_or_skip, load_table_layout
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
    with pytest.raises(ValueError, match="not a table"):
        core.gpu_hash_table_find(1, 7, 8, 1, 1, False, 1)  # 7 rows: 2 header + 2 free-list rows leave 3 slots
    with pytest.raises(ValueError, match="must not be 0"):
        core.gpu_hash_table_find(0, layout.table_shape(16, 8)[0], 8, 1, 1, False, 1)

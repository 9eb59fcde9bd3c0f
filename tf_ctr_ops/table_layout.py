"""The key-to-row hash table's tensor layout (cc/core/hash_table.h) in NumPy.

Framework-free, so that the GPU checks, which run without TensorFlow, build
tables exactly as `tf_ctr_ops.HashTable` does (tests/core_helpers.py loads
this file on its own).
"""

import numpy as np

HEADER_ROWS = 2
COLUMNS = 4  # key, entry, last_seen, count
NEXT_ROW, OCCUPIED, DROPPED, EVICTED, FREE_COUNT, CLOCK, KEY_KIND = range(7)  # header cells
EMPTY_ENTRY = -1
# KEY_KIND's values: what the keys are, so that a restore can refuse a
# checkpoint of the other kind. 0: unknown (tables written before the cell).
UNKNOWN_KEYS, INT_KEYS, STRING_KEYS = 0, 1, 2


def default_num_slots(capacity):
    """The slot count for `capacity` rows: a power of two, at most half full of rows."""
    return 1 << max(1, int(2 * max(capacity, 1) - 1).bit_length())


def free_list_rows(capacity):
    return -(-capacity // COLUMNS)


def free_rows(table, capacity):
    """The rows on a table array's free stack (freed by eviction, for new keys)."""
    table = np.asarray(table)
    count = int(table.reshape(-1)[FREE_COUNT])
    return table[-free_list_rows(capacity):].reshape(-1)[:max(count, 0)]


def table_shape(num_slots, capacity):
    return [HEADER_ROWS + num_slots + free_list_rows(capacity), COLUMNS]


def empty_table_array(num_slots, capacity, key_kind=UNKNOWN_KEYS):
    """The int64 table (table_shape) of a table with no keys."""
    table = np.zeros(table_shape(num_slots, capacity), np.int64)
    table.reshape(-1)[KEY_KIND] = key_kind
    slots = table[HEADER_ROWS:HEADER_ROWS + num_slots].reshape(-1)  # read flat: pairs, then stats
    slots[1:2 * num_slots:2] = EMPTY_ENTRY
    return table

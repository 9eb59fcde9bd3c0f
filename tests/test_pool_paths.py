"""The CPU pooling sums a bag's rows in the order of the TF kernels that
embedding_lookup_sparse pools with, so that it gives their bits: unweighted
bags (ids, string tokens, a hash table's rows) as SparseSegmentSum / Mean /
SqrtN group them (a first group of n mod 8 rows, then groups of 8), weighted
bags as the composition's segment_sum adds them (an Eigen reduction: in
order below 16 rows, then 4 interleaved sums over the columns of whole
8-float packets). Checked here on the framework-free core against a float32
reference of those orders, across row widths that exercise every column
chunk (16, 8, 4 and single columns) and packet remainder, and through the TF
ops against tf.nn itself."""

import numpy as np
import pytest
import tensorflow as tf

import tf_ctr_ops as tco
from tf_ctr_ops import _core

DIMS = [1, 3, 4, 5, 8, 12, 13, 16, 17, 24, 31, 32, 33, 64, 100, 128]


def _bags(rng, batch, vocab, max_len, negatives=False):
    lengths = rng.integers(0, max_len + 1, batch)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    ids = rng.integers(0, vocab, offsets[-1]).astype(np.int64)
    if negatives and ids.size:
        ids[rng.random(ids.size) < 0.2] = -1
    return ids, offsets


def _sparse_segment_sum(rows):
    """float32 sum of rows [n, D] in SparseSegmentReduction's groups."""
    n = len(rows)
    first = n if n <= 9 else {0: 8, 1: 9}.get(n % 8, n % 8)
    total = rows[0].copy()
    for r in rows[1:first]:
        total = total + r
    for g in range(first, n, 8):
        group = rows[g].copy()
        for r in rows[g + 1:g + 8]:
            group = group + r
        total = total + group
    return total


def _segment_sum(rows):
    """float32 sum of rows [n, D] in the order of TF's CPU segment_sum."""
    total = np.zeros(rows.shape[1], np.float32)
    for r in rows:
        total = total + r
    n, packed = len(rows), rows.shape[1] // 8 * 8
    if n >= 16 and packed:
        lanes = np.zeros((4, packed), np.float32)
        for j in range(n // 4 * 4):
            lanes[j % 4] = lanes[j % 4] + rows[j, :packed]
        laned = lanes[0]
        for lane in lanes[1:]:
            laned = laned + lane
        for r in rows[n // 4 * 4:]:
            laned = laned + r[:packed]
        total[:packed] = laned
    return total


def _tf_order_reference(params, ids, offsets, combiner, weights=None, default_id=-1):
    """What TF's kernels give, in float32: unweighted bags scaled by the
    reciprocal of a count below 10 and divided from 10; weighted ones
    divided (div_no_nan) by their weights' sum, or its root."""
    out = np.zeros((len(offsets) - 1, params.shape[1]), np.float32)
    for b in range(len(offsets) - 1):
        kept = [i for i in range(offsets[b], offsets[b + 1]) if ids[i] >= 0]
        rows, w = params[ids[kept]], None if weights is None else weights[kept]
        if not kept and default_id >= 0:
            rows, w = params[[default_id]], None if weights is None else np.ones(1, np.float32)
        if not len(rows):
            continue
        if w is None:
            n = np.float32(len(rows))
            total = _sparse_segment_sum(rows)
            divisor = {"sum": np.float32(1), "mean": n, "sqrtn": np.float32(np.sqrt(len(rows)))}[combiner]
            out[b] = total * (np.float32(1) / divisor) if n < 10 else total / divisor
        else:
            total = _segment_sum(rows * w[:, None])
            w_sum, sq_sum = np.float32(0), np.float32(0)
            for x in w:
                w_sum, sq_sum = w_sum + x, sq_sum + x * x
            divisor = {"sum": np.float32(1), "mean": w_sum, "sqrtn": np.sqrt(sq_sum)}[combiner]
            out[b] = total / divisor if divisor != 0 else 0
    return out


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("weighted", [False, True])
def test_bags_sum_in_the_order_of_tfs_kernels(dim, combiner, weighted):
    rng = np.random.default_rng(dim * 7 + len(combiner) + weighted)
    params = rng.normal(size=(300, dim)).astype(np.float32)
    # Bags up to 40 ids: several whole groups of 8, partial ones, empty bags,
    # and the 16 rows from which a weighted sum is laned.
    ids, offsets = _bags(rng, 97, 300, 40, negatives=True)
    weights = rng.uniform(0.1, 2.0, ids.size).astype(np.float32) if weighted else None
    for extra in ({}, {"default_id": 5}):
        got = _core.embedding_lookup(params, ids, offsets, weights=weights, combiner=combiner,
                                     invalid_ids="skip_negative", threads=2, **extra)
        want = _tf_order_reference(params, ids, offsets, combiner, weights, extra.get("default_id", -1))
        np.testing.assert_array_equal(got, want, err_msg=str(extra))


def test_unit_bags_stop_at_the_first_bad_id_in_the_lowest_row():
    rng = np.random.default_rng(3)
    params = rng.normal(size=(50, 8)).astype(np.float32)
    ids, offsets = _bags(rng, 400, 50, 12)
    ids[offsets[300] if offsets[300] < offsets[301] else offsets[301]] = 77  # a bad id late in the batch
    first_bag = int(np.searchsorted(offsets, np.flatnonzero(ids == 77)[0], side="right") - 1)
    for weights in (None, np.ones(ids.size, np.float32)):
        with pytest.raises(ValueError, match=f"id 77 in row {first_bag} "):
            _core.embedding_lookup(params, ids, offsets, weights=weights, threads=2)


@pytest.mark.parametrize("dtype", [tf.float32, tf.float16, tf.bfloat16])
def test_lookups_give_tfs_bits(dtype):
    """Against tf.nn.embedding_lookup_sparse itself: unweighted bags with
    every combiner, weighted ones with sum and mean (its sqrtn squares the
    weights with Pow, whose vectorized rounding is not a product's), bags of
    0 to 40 ids and a few of 100 to 300."""
    rng = np.random.default_rng(11)
    for dim in (5, 8, 12, 32, 40):
        params = tf.constant(rng.normal(size=(1000, dim)), dtype)
        lengths = np.concatenate([rng.integers(0, 41, 300), rng.integers(100, 301, 4)])
        sp = tf.RaggedTensor.from_row_lengths(rng.integers(0, 1000, lengths.sum()), lengths).to_sparse()
        weights = tf.SparseTensor(sp.indices, rng.uniform(0.1, 2.0, lengths.sum()).astype(np.float32),
                                  sp.dense_shape)
        for combiner, w in [("sum", None), ("mean", None), ("sqrtn", None), ("sum", weights), ("mean", weights)]:
            want = tf.nn.embedding_lookup_sparse(params, sp, w, combiner=combiner)
            got = tco.embedding_lookup_sparse(params, sp, w, combiner=combiner)
            np.testing.assert_array_equal(tf.cast(got, tf.float32).numpy(), tf.cast(want, tf.float32).numpy(),
                                          err_msg=f"D={dim} {combiner} weighted={w is not None}")


def test_hash_table_pooling_matches_the_lookup_of_its_rows():
    rng = np.random.default_rng(5)
    dim = 24
    values = rng.normal(size=(500, dim)).astype(np.float32)
    table = tco.HashTable(dim=dim, capacity=500, initializer=lambda shape, dtype: values)
    keys = rng.choice(np.int64(1) << 40, size=500, replace=False)
    table.find(tf.constant(keys), insert=True)  # key i gets row i
    ranks, offsets = _bags(rng, 200, 600, 25)  # ranks >= 500: keys the table lacks, left out
    known = np.concatenate([keys, rng.choice(np.int64(1) << 40, size=100) + (np.int64(1) << 41)])
    bag_keys = tf.RaggedTensor.from_row_splits(known[ranks], offsets)
    rows = tf.RaggedTensor.from_row_splits(np.where(ranks < 500, ranks, -1), offsets)
    for combiner in ("sum", "mean", "sqrtn"):
        got = tco.hash_table_embedding(table, bag_keys, combiner=combiner)
        want = _core.embedding_lookup(values, rows.flat_values.numpy(), offsets, combiner=combiner,
                                      invalid_ids="skip_negative")
        np.testing.assert_array_equal(got.numpy(), want)

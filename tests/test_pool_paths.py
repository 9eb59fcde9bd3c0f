"""The CPU pooling has two loops: bags of unit weight (no weights input: ids,
string tokens, a hash table's found rows) are pooled a bag at a time with
their column sums in registers, weighted bags by a stream of entries. Both
must give the same bits: the same block-of-8 sums in the same order (TF's
SparseSegmentSum order), so that a model's output does not depend on
whether it passes weights of 1. Checked here on the framework-free core and
through the TF ops, across row widths that exercise every column chunk
(16, 8, 4 and single columns)."""

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


def _reference(params, ids, offsets, combiner, default_id=-1):
    out = np.zeros((len(offsets) - 1, params.shape[1]), np.float64)
    for b in range(len(offsets) - 1):
        rows = [i for i in ids[offsets[b]:offsets[b + 1]] if i >= 0]
        if not rows and default_id >= 0:
            rows = [default_id]
        if not rows:
            continue
        s = params[rows].astype(np.float64).sum(0)
        n = len(rows)
        out[b] = s if combiner == "sum" else s / n if combiner == "mean" else s / np.sqrt(n)
    return out


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_unit_bags_pool_to_the_bits_of_unit_weights(dim, combiner):
    rng = np.random.default_rng(dim * 7 + len(combiner))
    params = rng.normal(size=(300, dim)).astype(np.float32)
    # Bags up to 40 ids: several whole blocks of 8, a partial one, empty bags.
    ids, offsets = _bags(rng, 97, 300, 40, negatives=True)
    ones = np.ones(ids.size, np.float32)
    for extra in ({}, {"default_id": 5}, {"max_norm": 1.5}):
        kw = dict(combiner=combiner, invalid_ids="skip_negative", threads=2, **extra)
        unit = _core.embedding_lookup(params, ids, offsets, **kw)
        weighted = _core.embedding_lookup(params, ids, offsets, weights=ones, **kw)
        np.testing.assert_array_equal(unit, weighted, err_msg=str(extra))
        if "max_norm" not in extra:
            want = _reference(params, ids, offsets, combiner, extra.get("default_id", -1))
            np.testing.assert_allclose(unit, want, rtol=2e-5, atol=2e-5)


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
def test_ops_give_the_same_bits_with_and_without_unit_weights(dtype):
    rng = np.random.default_rng(11)
    for dim in (8, 12, 32, 40):
        params = tf.constant(rng.normal(size=(1000, dim)), dtype)
        ids, offsets = _bags(rng, 300, 1000, 30)
        ragged = tf.RaggedTensor.from_row_splits(ids, offsets)
        ones = tf.RaggedTensor.from_row_splits(np.ones(ids.size, np.float32), offsets)
        for combiner in ("sum", "mean", "sqrtn"):
            unit = tco.sparse_embedding(params, ragged, combiner=combiner)
            weighted = tco.sparse_embedding(params, ragged, ones, combiner=combiner)
            np.testing.assert_array_equal(unit.numpy(), weighted.numpy(), err_msg=f"D={dim} {combiner}")


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
                                      invalid_ids="skip_negative", weights=np.ones(ranks.size, np.float32))
        np.testing.assert_array_equal(got.numpy(), want)

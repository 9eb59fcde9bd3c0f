"""Differential tests of the fused lookup against the tf.nn compositions it replaces."""

import numpy as np
import pytest
import tensorflow as tf

import tf_ctr_ops as tco
from tf_ctr_ops import ops as tco_ops
from tf_ctr_ops import _core

COMBINERS = ["sum", "mean", "sqrtn"]
TOL = {tf.float32: 1e-5, tf.float16: 2e-2, tf.bfloat16: 6e-2}


def random_sparse(rng, batch, max_len, vocab, id_dtype=tf.int64, empty_frac=0.2, width=None,
                  negative_frac=0.0):
    """A canonical-order SparseTensor [batch, width] of ids, some rows empty."""
    lengths = rng.integers(0, max_len + 1, size=batch)
    lengths[rng.random(batch) < empty_frac] = 0
    width = width or max(int(lengths.max(initial=0)), 1)
    lengths = np.minimum(lengths, width)
    idx = [(r, c) for r in range(batch) for c in range(lengths[r])]
    ids = rng.integers(0, vocab, size=len(idx))
    neg = rng.random(len(idx)) < negative_frac
    ids[neg] = -rng.integers(1, 5, size=int(neg.sum()))
    indices = np.array(idx, np.int64).reshape(-1, 2)
    return tf.SparseTensor(indices, tf.constant(ids, id_dtype), [batch, width])


def weights_like(rng, sp, positive=True):
    n = int(sp.values.shape[0])
    w = rng.uniform(0.1, 2.0, size=n) if positive else rng.uniform(-1.0, 2.0, size=n)
    return tf.SparseTensor(sp.indices, tf.constant(w, tf.float32), sp.dense_shape)


def table(rng, vocab, dim, dtype=tf.float32):
    return tf.constant(rng.normal(size=(vocab, dim)).astype(np.float32), dtype=dtype)


def assert_close(a, b, dtype=tf.float32):
    a, b = tf.convert_to_tensor(a), tf.convert_to_tensor(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    np.testing.assert_allclose(tf.cast(a, tf.float32).numpy(), tf.cast(b, tf.float32).numpy(),
                               rtol=TOL[dtype], atol=TOL[dtype])


# ---------------------------------------------------------------------------
# Forward, drop-in for tf.nn


@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("max_norm", [None, 0.8])
@pytest.mark.parametrize("id_dtype", [tf.int32, tf.int64])
def test_embedding_lookup_sparse_matches_tf(rng, combiner, weighted, max_norm, id_dtype):
    params = table(rng, 97, 16)
    sp = random_sparse(rng, 64, 9, 97, id_dtype)
    w = weights_like(rng, sp, positive=False) if weighted else None
    got = tco.embedding_lookup_sparse(params, sp, w, combiner=combiner, max_norm=max_norm)
    want = tf.nn.embedding_lookup_sparse(params, sp, w, combiner=combiner, max_norm=max_norm)
    assert_close(got, want)


@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("default_id", [None, 3])
@pytest.mark.parametrize("max_norm", [None, 1.5])
def test_safe_embedding_lookup_sparse_matches_tf(rng, combiner, weighted, default_id, max_norm):
    params = table(rng, 50, 8)
    sp = random_sparse(rng, 40, 6, 50, negative_frac=0.25)
    w = weights_like(rng, sp, positive=False) if weighted else None
    got = tco.safe_embedding_lookup_sparse(params, sp, w, combiner=combiner, default_id=default_id,
                                           max_norm=max_norm)
    want = tf.nn.safe_embedding_lookup_sparse(params, sp, w, combiner=combiner, default_id=default_id,
                                              max_norm=max_norm)
    assert_close(got, want)


@pytest.mark.parametrize("combiner", ["mean", "sqrtn"])
def test_combiner_edge_divisors_match_tf(rng, combiner):
    """The pooled row is written by one of three cases, chosen per bag: weights
    that cancel (or whose squares underflow) divide by zero, which gives zeros
    as TF's div_no_nan does; weights so large that the divisor overflows or its
    reciprocal is not a normal float take a true division; the rest a multiply."""
    params = table(rng, 20, 16)
    bags = [[(1, 1.0), (2, -1.0)],            # mean: weights sum to 0
            [(3, 1e-30), (4, 1e-30)],         # sqrtn: squares underflow to 0
            [(5, 3e38), (6, 3e38)],           # the sum or its squares overflow
            [(7, 1e38)],                      # 1 / 1e38 is subnormal
            [(8, 0.5), (9, 2.0), (10, 1.0)],  # ordinary
            []]
    indices = [(r, c) for r, bag in enumerate(bags) for c in range(len(bag))]
    ids = [i for bag in bags for i, _ in bag]
    weights = [w for bag in bags for _, w in bag]
    shape = [len(bags), 3]
    sp = tf.SparseTensor(np.array(indices, np.int64), tf.constant(ids, tf.int64), shape)
    w = tf.SparseTensor(np.array(indices, np.int64), tf.constant(weights, tf.float32), shape)
    got = tco.embedding_lookup_sparse(params, sp, w, combiner=combiner)
    want = tf.nn.embedding_lookup_sparse(params, sp, w, combiner=combiner)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("combiner", COMBINERS)
def test_half_params_match_tf(rng, dtype, weighted, combiner):
    params = table(rng, 40, 8, dtype)
    sp = random_sparse(rng, 30, 6, 40)
    w = weights_like(rng, sp) if weighted else None
    got = tco.embedding_lookup_sparse(params, sp, w, combiner=combiner)
    assert got.dtype == dtype
    want = tf.nn.embedding_lookup_sparse(params, sp, w, combiner=combiner)
    assert_close(got, want, dtype)
    # TF's safe variant converts the table to the weights' dtype, so it needs
    # weights of the params dtype; ours takes them in any float dtype.
    w = None if w is None else tf.SparseTensor(w.indices, tf.cast(w.values, dtype), w.dense_shape)
    got = tco.safe_embedding_lookup_sparse(params, sp, w, combiner=combiner)
    want = tf.nn.safe_embedding_lookup_sparse(params, sp, w, combiner=combiner)
    assert_close(got, want, dtype)


def test_rows_after_last_id_are_dropped_like_tf(rng):
    # tf.nn.embedding_lookup_sparse returns max(row)+1 rows, not dense_shape[0].
    params = table(rng, 10, 4)
    sp = tf.SparseTensor([[0, 0], [2, 1]], tf.constant([1, 2], tf.int64), [7, 3])
    got = tco.embedding_lookup_sparse(params, sp, None)
    want = tf.nn.embedding_lookup_sparse(params, sp, None)
    assert got.shape == (3, 4)
    assert_close(got, want)
    assert_close(tco.safe_embedding_lookup_sparse(params, sp), tf.nn.safe_embedding_lookup_sparse(params, sp))


@pytest.mark.parametrize("fn", ["plain", "safe"])
def test_all_empty_and_zero_batches(rng, fn):
    params = table(rng, 10, 4)
    for shape in ([5, 3], [0, 3]):
        sp = tf.SparseTensor(tf.zeros([0, 2], tf.int64), tf.zeros([0], tf.int64), shape)
        if fn == "plain":
            got, want = tco.embedding_lookup_sparse(params, sp, None), tf.nn.embedding_lookup_sparse(params, sp, None)
        else:
            got, want = tco.safe_embedding_lookup_sparse(params, sp), tf.nn.safe_embedding_lookup_sparse(params, sp)
        assert_close(got, want)


def test_duplicate_ids_in_a_row(rng):
    params = table(rng, 10, 4)
    sp = tf.SparseTensor([[0, 0], [0, 1], [0, 2], [1, 0]], tf.constant([3, 3, 3, 1], tf.int64), [2, 3])
    w = tf.SparseTensor(sp.indices, [1.0, 2.0, 0.5, 1.0], sp.dense_shape)
    for comb in COMBINERS:
        assert_close(tco.embedding_lookup_sparse(params, sp, w, combiner=comb),
                     tf.nn.embedding_lookup_sparse(params, sp, w, combiner=comb))


@pytest.mark.parametrize("combiner", COMBINERS)
def test_rank3_ids(rng, combiner):
    params = table(rng, 30, 5)
    dense = rng.integers(-1, 30, size=(4, 3, 5))
    dense[1] = -1
    idx = np.argwhere(dense >= -1)
    keep = rng.random(len(idx)) < 0.6
    idx = idx[keep]
    vals = dense[tuple(idx.T)]
    sp = tf.SparseTensor(idx.astype(np.int64), tf.constant(vals, tf.int64), [4, 3, 5])
    got = tco.safe_embedding_lookup_sparse(params, sp, combiner=combiner)
    want = tf.nn.safe_embedding_lookup_sparse(params, sp, combiner=combiner)
    assert got.shape == want.shape == (4, 3, 5)
    assert_close(got, want)
    pos = tf.SparseTensor(sp.indices, tf.abs(sp.values), sp.dense_shape)
    assert_close(tco.embedding_lookup_sparse(params, pos, None, combiner=combiner),
                 tf.nn.embedding_lookup_sparse(params, pos, None, combiner=combiner))


@pytest.mark.parametrize("as_variables", [False, True])
def test_partitioned_params(rng, as_variables):
    full = rng.normal(size=(11, 6)).astype(np.float32)
    parts = [full[0:4], full[4:8], full[8:11]]  # the 'div' layout of 11 rows in 3 parts
    parts = [tf.Variable(p) for p in parts] if as_variables else [tf.constant(p) for p in parts]
    sp = random_sparse(rng, 20, 5, 11)
    w = weights_like(rng, sp)
    for comb in COMBINERS:
        assert_close(tco.embedding_lookup_sparse(parts, sp, w, combiner=comb),
                     tf.nn.embedding_lookup_sparse(parts, sp, w, combiner=comb))
        assert_close(tco.safe_embedding_lookup_sparse(parts, sp, w, combiner=comb),
                     tf.nn.safe_embedding_lookup_sparse(parts, sp, w, combiner=comb))


def test_params_as_variable_and_ragged_ids(rng):
    params = tf.Variable(table(rng, 20, 4))
    rt = tf.ragged.constant([[1, 2, 3], [], [4], [5, 5]], tf.int64)
    for comb in COMBINERS:
        assert_close(tco.embedding_lookup_sparse(params, rt, None, combiner=comb),
                     tf.nn.embedding_lookup_sparse(params, rt, None, combiner=comb))


def test_large_batch(rng):
    params = table(rng, 5000, 16)
    lengths = rng.integers(0, 30, size=20000)
    rt = tf.RaggedTensor.from_row_lengths(rng.integers(0, 5000, size=lengths.sum()), lengths)
    sp = rt.to_sparse()
    assert_close(tco.embedding_lookup_sparse(params, sp, None, combiner="sqrtn"),
                 tf.nn.embedding_lookup_sparse(params, sp, None, combiner="sqrtn"))
    assert_close(tco.sparse_embedding(params, rt, combiner="sqrtn"),
                 tf.nn.safe_embedding_lookup_sparse(params, sp, combiner="sqrtn"))


def test_graph_holds_one_fused_op(rng):
    params = tf.Variable(table(rng, 20, 4))
    sp = random_sparse(rng, 8, 4, 20)

    @tf.function
    def f(indices, values, shape, weights):
        ids = tf.SparseTensor(indices, values, shape)
        w = tf.SparseTensor(indices, weights, shape)
        return (tco.embedding_lookup_sparse(params, ids, w),
                tco.safe_embedding_lookup_sparse(params, ids, w, default_id=0, max_norm=1.0))

    graph = f.get_concrete_function(sp.indices, sp.values, sp.dense_shape,
                                    tf.ones_like(sp.values, tf.float32)).graph
    types = [op.type for op in graph.get_operations()]
    assert types.count("CtrResourceEmbeddingLookup") == 2  # the variable is read in place
    banned = {"Unique", "GatherV2", "ResourceGather", "SparseSegmentSum", "SparseSegmentMean",
              "SparseSegmentSqrtN", "SegmentSum", "SparseFillEmptyRows", "SparseReshape"}
    assert not banned & set(types), banned & set(types)


# ---------------------------------------------------------------------------
# Gradients


def densify(g):
    return tf.convert_to_tensor(g)


@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("max_norm", [None, 0.7])
@pytest.mark.parametrize("safe", [False, True])
def test_gradients_match_tf(rng, combiner, max_norm, safe):
    params = tf.Variable(table(rng, 30, 6))
    sp = random_sparse(rng, 25, 6, 30, negative_frac=0.2 if safe else 0.0)
    wv = tf.Variable(rng.uniform(-0.5, 2.0, size=int(sp.values.shape[0])).astype(np.float32))
    upstream = tf.constant(rng.normal(size=(25, 6)).astype(np.float32))
    grads = []
    for impl in ((tco.safe_embedding_lookup_sparse, tf.nn.safe_embedding_lookup_sparse) if safe
                 else (tco.embedding_lookup_sparse, tf.nn.embedding_lookup_sparse)):
        with tf.GradientTape() as tape:
            w = tf.SparseTensor(sp.indices, wv, sp.dense_shape)
            out = impl(params, sp, w, combiner=combiner, max_norm=max_norm)
            loss = tf.reduce_sum(out * upstream[: tf.shape(out)[0]])
        grads.append(tape.gradient(loss, [params, wv]))
    (gp, gw), (rp, rw) = grads
    assert isinstance(gp, tf.IndexedSlices)
    assert_close(densify(gp), densify(rp))
    assert_close(gw, rw)


@pytest.mark.parametrize("combiner", COMBINERS)
def test_unweighted_gradient_and_default_id(rng, combiner):
    params = tf.Variable(table(rng, 15, 3))
    sp = random_sparse(rng, 12, 4, 15, empty_frac=0.4)
    grads = []
    for impl in (tco.safe_embedding_lookup_sparse, tf.nn.safe_embedding_lookup_sparse):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(impl(params, sp, None, combiner=combiner, default_id=2) ** 2)
        grads.append(densify(tape.gradient(loss, params)))
    assert_close(*grads)


def test_half_gradient(rng):
    params = tf.Variable(table(rng, 20, 4, tf.float16))
    sp = random_sparse(rng, 10, 4, 20)
    w = weights_like(rng, sp)
    grads = []
    for impl in (tco.embedding_lookup_sparse, tf.nn.embedding_lookup_sparse):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.cast(impl(params, sp, w), tf.float32) ** 2)
        grads.append(densify(tape.gradient(loss, params)))
    assert_close(*grads, dtype=tf.float16)


# ---------------------------------------------------------------------------
# sparse_embedding / hash_embedding


def reference_pool(params, ids_sparse, weights_sparse, combiner):
    return tf.nn.safe_embedding_lookup_sparse(params, ids_sparse, weights_sparse, combiner=combiner)


@pytest.mark.parametrize("container", ["ragged", "sparse", "dense"])
@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("id_dtype", [tf.int32, tf.int64])
def test_sparse_embedding_containers(rng, container, combiner, id_dtype):
    params = table(rng, 40, 8)
    dense = rng.integers(0, 40, size=(16, 5))
    dense[rng.random((16, 5)) < 0.3] = -1
    dense[3] = -1
    wdense = rng.uniform(0.1, 2, size=(16, 5)).astype(np.float32)
    mask = dense >= 0
    rt = tf.RaggedTensor.from_row_lengths(dense[mask], mask.sum(1))
    rw = tf.RaggedTensor.from_row_lengths(wdense[mask], mask.sum(1))
    sp, sw = rt.to_sparse(), rw.to_sparse()
    sp = tf.SparseTensor(sp.indices, sp.values, [16, 5])
    sw = tf.SparseTensor(sw.indices, sw.values, [16, 5])
    ids = {"ragged": tf.cast(rt, id_dtype), "sparse": tf.SparseTensor(sp.indices, tf.cast(sp.values, id_dtype), sp.dense_shape),
           "dense": tf.constant(dense, id_dtype)}[container]
    weights = {"ragged": rw, "sparse": sw, "dense": tf.constant(np.where(mask, wdense, 0))}[container]
    want_unweighted = reference_pool(params, sp, None, combiner)
    assert_close(tco.sparse_embedding(params, ids, combiner=combiner), want_unweighted)
    assert_close(tco.sparse_embedding(params, ids, weights, combiner=combiner),
                 reference_pool(params, sp, sw, combiner))


def test_sparse_embedding_rejects_out_of_range_ids_naming_row_and_id(rng):
    params = table(rng, 10, 4)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"id 10 in row 2 .*\[0, 10\)"):
        tco.sparse_embedding(params, tf.ragged.constant([[1], [], [3, 10]], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"id -7 in row 0"):
        tco.sparse_embedding(params, tf.constant([[-7, 1]], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"id 12 in row 1"):
        tco.embedding_lookup_sparse(params, tf.SparseTensor([[0, 0], [1, 0]], tf.constant([0, 12], tf.int64), [2, 1]), None)


def test_sparse_embedding_zero_batch(rng):
    params = table(rng, 10, 4)
    out = tco.sparse_embedding(params, tf.zeros([0, 3], tf.int64))
    assert out.shape == (0, 4)
    out = tco.sparse_embedding(params, tf.RaggedTensor.from_row_splits(tf.zeros([0], tf.int64), [0]))
    assert out.shape == (0, 4)


# ---------------------------------------------------------------------------
# Bags of one id: the CPU kernels copy the row forward and pass the upstream
# gradient on as the values backward. Weights of 1.0 take the general path,
# whose results these must equal bit for bit.


def lookup_and_grad(params, ids, weights=None, lookup=tco.sparse_embedding, **kw):
    with tf.GradientTape() as tape:
        tape.watch(params)
        out = lookup(params, ids, weights, **kw)
        upstream = tf.cast(tf.reshape(tf.range(tf.size(out), dtype=tf.float32) % 7 - 3, tf.shape(out)), out.dtype)
        loss = tf.reduce_sum(out * upstream)
    grad = tape.gradient(loss, params)
    return out, grad, upstream


def raw_ragged_lookup(params, rt, weights, **kw):
    """The fused op itself on a RaggedTensor's bags (for default_id, which
    the public functions leave to safe_embedding_lookup_sparse)."""
    w = None if weights is None else weights.values
    return tco_ops._lookup(params, rt.values, rt.row_splits, -1, w, segment_kind="row_splits", **kw)


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64, tf.float16, tf.bfloat16])
@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("id_dtype", [tf.int32, tf.int64])
def test_single_id_bags_copy_rows_and_pass_the_gradient_on(rng, dtype, combiner, id_dtype):
    params = table(rng, 300, 12, dtype)
    batch = 1000  # several chunks of the copy loop, and a partial last one
    ids = tf.constant(rng.integers(0, 300, size=(batch, 1)), id_dtype)
    out, grad, upstream = lookup_and_grad(params, ids, combiner=combiner)
    np.testing.assert_array_equal(tf.cast(out, tf.float64).numpy(),
                                  tf.cast(tf.gather(params, ids[:, 0]), tf.float64).numpy())
    assert isinstance(grad, tf.IndexedSlices)
    np.testing.assert_array_equal(grad.indices.numpy(), ids[:, 0].numpy())
    np.testing.assert_array_equal(tf.cast(grad.values, tf.float64).numpy(), tf.cast(upstream, tf.float64).numpy())
    ones = tf.ones(ids.shape, tf.float32)
    out_general, grad_general, _ = lookup_and_grad(params, ids, ones, combiner=combiner)
    np.testing.assert_array_equal(tf.cast(out, tf.float64).numpy(), tf.cast(out_general, tf.float64).numpy())
    np.testing.assert_array_equal(tf.cast(grad.values, tf.float64).numpy(),
                                  tf.cast(grad_general.values, tf.float64).numpy())
    np.testing.assert_array_equal(grad.indices.numpy(), grad_general.indices.numpy())


@pytest.mark.parametrize("combiner", COMBINERS)
def test_single_id_bags_mixed_with_other_bags_match_tf(rng, combiner):
    params = table(rng, 50, 8)
    # Mostly one id a bag, and an empty bag (the copy path takes both); a bag
    # of two and a padded -1 in the middle send their range down the general path.
    dense = rng.integers(0, 50, size=(600, 2))
    dense[:, 1] = -1
    dense[250, 1] = 7
    dense[400] = -1
    rt = tf.ragged.boolean_mask(tf.constant(dense, tf.int64), dense >= 0)
    # The raw op: per-id gradient rows, with the default row of empty bags.
    got, grad, upstream = lookup_and_grad(params, rt, lookup=raw_ragged_lookup, combiner=combiner, default_id=3)
    assert isinstance(grad, tf.IndexedSlices) and grad.indices.shape[0] == 601  # 598 + 2 + the default row
    with tf.GradientTape() as tape:
        tape.watch(params)
        want = tf.nn.safe_embedding_lookup_sparse(params, rt.to_sparse(), None, combiner=combiner, default_id=3)
        loss = tf.reduce_sum(want * upstream)
    want_grad = tape.gradient(loss, params)
    assert_close(got, want)
    assert_close(tf.convert_to_tensor(grad), tf.convert_to_tensor(want_grad))
    # Without the bag of two, every bag has one gradient row (the empty one
    # its default row's): the values are the upstream gradient.
    rt = tf.ragged.boolean_mask(tf.constant(dense[:, :1], tf.int64), dense[:, :1] >= 0)
    got, grad, upstream = lookup_and_grad(params, rt, lookup=raw_ragged_lookup, combiner=combiner, default_id=3)
    np.testing.assert_array_equal(grad.values.numpy(), upstream.numpy())
    want_indices = dense[:, 0].copy()
    want_indices[400] = 3
    np.testing.assert_array_equal(grad.indices.numpy(), want_indices)
    np.testing.assert_array_equal(got.numpy()[400], params.numpy()[3])


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64, tf.float16, tf.bfloat16])
@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("default_id", [None, 5])
def test_bags_of_zero_or_one_id_copy_the_row_default_or_zeros(rng, dtype, combiner, default_id):
    # A missing category (an empty bag) among single ids stays on the copy
    # path: its default row, or zeros, equal to what the general path
    # (weights of 1.0) pools, bit for bit, and to TF's safe lookup.
    params = table(rng, 300, 12, dtype)
    lengths = (rng.random(1000) < 0.9).astype(np.int64)
    lengths[:40] = 0  # a whole chunk of empty bags
    rt = tf.RaggedTensor.from_row_lengths(tf.constant(rng.integers(0, 300, lengths.sum()), tf.int64), lengths)
    kw = {"combiner": combiner, "default_id": -1 if default_id is None else default_id}
    out, grad, _ = lookup_and_grad(params, rt, lookup=raw_ragged_lookup, **kw)
    ones = tf.ones_like(rt, tf.float32)
    out_general, grad_general, _ = lookup_and_grad(params, rt, ones, lookup=raw_ragged_lookup, **kw)
    np.testing.assert_array_equal(tf.cast(out, tf.float64).numpy(), tf.cast(out_general, tf.float64).numpy())
    np.testing.assert_array_equal(tf.cast(tf.convert_to_tensor(grad), tf.float64).numpy(),
                                  tf.cast(tf.convert_to_tensor(grad_general), tf.float64).numpy())
    want = tf.nn.safe_embedding_lookup_sparse(params, rt.to_sparse(), None, combiner=combiner, default_id=default_id)
    np.testing.assert_array_equal(tf.cast(out, tf.float64).numpy(), tf.cast(want, tf.float64).numpy())
    empty = np.flatnonzero(lengths == 0)
    row = np.zeros(12) if default_id is None else tf.cast(params[default_id], tf.float64).numpy()
    np.testing.assert_array_equal(tf.cast(tf.gather(out, empty), tf.float64).numpy(), np.broadcast_to(row, (len(empty), 12)))


def test_single_id_bags_with_a_bad_id_name_its_row(rng):
    params = table(rng, 40, 4)
    ids = rng.integers(0, 40, size=(900, 1))
    ids[777, 0] = 41
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"id 41 in row 777 .*\[0, 40\)"):
        tco.sparse_embedding(params, tf.constant(ids, tf.int64))


@pytest.mark.parametrize("resource", [False, True])
def test_gradient_ops_reject_the_ids_their_forward_op_rejects(rng, resource):
    """Called directly (a hand-built graph), a gradient op fails on the id its
    forward op fails on, rather than leaving it out; a pruned entry's id is
    not checked, as in the forward op."""
    params = table(rng, 4, 3)
    params = tf.Variable(params) if resource else params
    grad_op = tco_ops._ops.ctr_resource_embedding_lookup_grad if resource else tco_ops._ops.ctr_embedding_lookup_grad
    forward = tco_ops._ops.ctr_resource_embedding_lookup if resource else tco_ops._ops.ctr_embedding_lookup
    operand = params.handle if resource else params
    forward_attrs = {"T": tf.float32} if resource else {}  # the gradient's T is its grad's

    def args(ids, weights=None, combiner="mean"):
        w = tf.zeros([0]) if weights is None else tf.constant(weights, tf.float32)
        return dict(params=operand, ids=tf.constant(ids, tf.int64), segments=tf.constant([0, 2, 3], tf.int64),
                    num_rows=tf.constant(-1, tf.int64), weights=w, segment_kind="row_splits", combiner=combiner,
                    has_weights=weights is not None, prune_weights=weights is not None)

    for ids in ([0, 1, 7], [0, -3, 2]):
        bad = ids[2] if ids[2] == 7 else -3
        row = 1 if bad == 7 else 0
        for fn, extra in ((forward, forward_attrs), (grad_op, {"grad": tf.ones([2, 3])})):
            with pytest.raises(tf.errors.InvalidArgumentError, match=rf"id {bad} in row {row} is out of range"):
                fn(**args(ids), **extra)
    # A default_id that is not a row fails where a bag is empty, in both
    # (the gradient left that bag's row out).
    empty_bag = dict(args([0, 1, 2]), segments=tf.constant([0, 3, 3], tf.int64))
    for default_id, fails in ((99, True), (-5, True), (3, False)):
        for fn, extra in ((forward, forward_attrs), (grad_op, {"grad": tf.ones([2, 3])})):
            if fails:
                with pytest.raises(tf.errors.InvalidArgumentError,
                                   match=rf"default_id {default_id} for empty row 1 is out of range \[0, 4\)"):
                    fn(**empty_bag, default_id=default_id, **extra)
            else:
                fn(**empty_bag, default_id=default_id, **extra)
    pruned = args([0, 1, 7], weights=[1.0, 2.0, -1.0])
    values, indices, _, _ = grad_op(grad=tf.ones([2, 3]), **pruned)
    np.testing.assert_array_equal(indices.numpy(), [0, 1])
    assert forward(**pruned, **forward_attrs).shape == (2, 3)


def test_string_gradient_rejects_the_tokens_its_forward_op_rejects(rng):
    params = table(rng, 4, 3)
    for strings, message in ((["0,1", "2,9"], r"token '9' in row 1 is id 9, out of range \[0, 4\)"),
                             (["3", "0,x"], r"token 'x' in row 1 is not an int64 number")):
        data, splits = tco.pack_strings(tf.constant(strings))
        kw = dict(params=params, bytes=data, row_splits=splits, bag_splits=tf.zeros([0], tf.int64), id_mode="index")
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            tco_ops._ops.ctr_string_embedding(**kw)
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            tco_ops._ops.ctr_string_embedding_grad(grad=tf.ones([2, 3]), **kw)


def test_single_string_key_bags_match_to_hash_bucket_fast(rng):
    params = table(rng, 64, 8)
    keys = tf.constant(rng.integers(0, 10**6, size=(500, 1)).astype(str).astype(object))
    got = tco.hash_embedding(params, keys)
    want = tf.gather(params, tf.strings.to_hash_bucket_fast(keys[:, 0], 64))
    np.testing.assert_array_equal(got.numpy(), want.numpy())


def hashed_reference(params, keys_ragged, combiner, weights=None):
    buckets = tf.strings.to_hash_bucket_fast(tf.strings.as_string(keys_ragged.flat_values), params.shape[0])
    ids = keys_ragged.with_flat_values(buckets)
    w = None if weights is None else weights.to_sparse()
    return tf.nn.safe_embedding_lookup_sparse(params, ids.to_sparse(), w, combiner=combiner)


@pytest.mark.parametrize("key_dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("combiner", COMBINERS)
def test_hash_embedding_int_keys_match_composition(rng, key_dtype, combiner):
    params = table(rng, 1009, 8)
    info = np.iinfo(key_dtype.as_numpy_dtype)
    lengths = rng.integers(0, 6, size=50)
    keys = rng.integers(info.min, info.max, size=lengths.sum(), dtype=key_dtype.as_numpy_dtype, endpoint=True)
    keys[:4] = [info.min, info.max, 0, -1][:4]
    rt = tf.RaggedTensor.from_row_lengths(tf.constant(keys, key_dtype), lengths)
    w = tf.RaggedTensor.from_row_lengths(rng.uniform(0.1, 2, size=lengths.sum()).astype(np.float32), lengths)
    assert_close(tco.hash_embedding(params, rt, combiner=combiner), hashed_reference(params, rt, combiner))
    assert_close(tco.hash_embedding(params, rt, w, combiner=combiner), hashed_reference(params, rt, combiner, w))
    assert_close(tco.hash_embedding(params, rt.to_sparse(), combiner=combiner), hashed_reference(params, rt, combiner))


def test_hash_embedding_gradient_is_indexed_slices(rng):
    params = tf.Variable(table(rng, 101, 4))
    rt = tf.ragged.constant([[5, 17, 5], [], [123456789]], tf.int64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tco.hash_embedding(params, rt, combiner="sum") ** 2)
    g = tape.gradient(loss, params)
    assert isinstance(g, tf.IndexedSlices)
    buckets = tf.strings.to_hash_bucket_fast(tf.strings.as_string(rt.flat_values), 101)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.safe_embedding_lookup_sparse(params, rt.with_flat_values(buckets).to_sparse(),
                                                                None, combiner="sum") ** 2)
    assert_close(densify(g), densify(tape.gradient(loss, params)))


def test_int_key_hash_matches_as_string_on_extremes():
    keys = np.array([0, 1, -1, 9, 10, -10, 2**31 - 1, -2**31, 2**63 - 1, -2**63, 1234567890123], np.int64)
    want = tf.strings.to_hash_bucket_fast(tf.strings.as_string(keys), 2**31 - 1).numpy()
    np.testing.assert_array_equal(_core.hash_int_keys(keys, 2**31 - 1), want)


def test_fingerprint_matches_tf_on_many_strings(rng):
    alphabet = np.frombuffer(bytes(range(256)), np.uint8)
    strings = [bytes(rng.choice(alphabet, size=n)) for n in list(range(0, 200)) * 3 + [1000, 4097]]
    for buckets in (1, 7, 1_000_003, 2**62):
        want = tf.strings.to_hash_bucket_fast(strings, buckets).numpy()
        np.testing.assert_array_equal(_core.hash_buckets(strings, buckets), want)


# ---------------------------------------------------------------------------
# The framework-free core agrees with the TF op


@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("id_mode", ["index", "hash"])
def test_core_module_matches_tf_op(rng, combiner, id_mode):
    params = rng.normal(size=(300, 12)).astype(np.float32)
    lengths = rng.integers(0, 8, size=64)
    keys = rng.integers(0, 300, size=lengths.sum())
    weights = rng.uniform(0.1, 2, size=lengths.sum()).astype(np.float32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    rt = tf.RaggedTensor.from_row_splits(keys, offsets)
    rw = tf.RaggedTensor.from_row_splits(weights, offsets)
    fn = tco.hash_embedding if id_mode == "hash" else tco.sparse_embedding
    want = fn(tf.constant(params), rt, rw, combiner=combiner, max_norm=1.2)
    got = _core.embedding_lookup(params, keys, offsets, weights, combiner=combiner, id_mode=id_mode,
                                 invalid_ids="skip_padding", max_norm=1.2)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-6, atol=1e-6)


def test_core_module_rejects_bad_ids():
    params = np.zeros((5, 2), np.float32)
    with pytest.raises(ValueError, match="id 9 in row 1"):
        _core.embedding_lookup(params, np.array([1, 9], np.int64), np.array([0, 1, 2], np.int64))


# ---------------------------------------------------------------------------
# Bad input: clear errors, never a crash


def test_bad_arguments_raise_clear_errors(rng):
    params = table(rng, 10, 4)
    sp = tf.SparseTensor([[0, 0]], tf.constant([1], tf.int64), [1, 1])
    with pytest.raises(ValueError, match="combiner"):
        tco.embedding_lookup_sparse(params, sp, None, combiner="max")
    with pytest.raises(ValueError, match="combiner"):
        tco.sparse_embedding(params, tf.constant([[1]]), combiner="median")
    with pytest.raises(TypeError):
        tco.embedding_lookup_sparse(params, tf.constant([[1]]), None)
    with pytest.raises(ValueError, match="Missing embedding_weights"):
        tco.safe_embedding_lookup_sparse([], sp)
    with pytest.raises(ValueError, match="dense ids"):
        tco.sparse_embedding(params, tf.constant([1, 2]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="at least one bucket"):
        tco.hash_embedding(tf.zeros([0, 4]), tf.constant([[1]], tf.int64))


def test_raw_op_rejects_malformed_inputs():
    from tf_ctr_ops.ops import _ops

    params = tf.zeros([10, 4])
    ids = tf.constant([1, 2, 3], tf.int64)
    w = tf.zeros([0])

    def call(**kw):
        args = dict(params=params, ids=ids, segments=tf.constant([0, 1, 3], tf.int64), num_rows=tf.constant(-1, tf.int64),
                    weights=w, segment_kind="row_splits")
        args.update(kw)
        return _ops.ctr_embedding_lookup(**args)

    cases = [
        (dict(segments=tf.constant([0, 2, 1, 3], tf.int64)), "non-decreasing"),
        (dict(segments=tf.constant([1, 3], tf.int64)), r"row_splits\[0\]"),
        (dict(segments=tf.constant([0, 5], tf.int64)), "does not match"),
        (dict(segments=tf.constant([0, 0, 1], tf.int64), segment_kind="row_ids"), None),
        (dict(segments=tf.constant([1, 0, 0], tf.int64), segment_kind="row_ids"), "must be sorted: entry 0 has row 1"),
        (dict(segments=tf.constant([0, 2, 1], tf.int64), segment_kind="row_ids", num_rows=tf.constant(3, tf.int64)), "sorted"),
        (dict(segments=tf.constant([0, 0, 1], tf.int64), segment_kind="row_ids", num_rows=tf.constant(1, tf.int64)), "out of range"),
        (dict(segments=tf.constant([0, -1, 1], tf.int64), segment_kind="row_ids"), "out of range|sorted"),
        (dict(weights=tf.ones([2]), has_weights=True), "one value per id"),
        (dict(default_id=10), None),  # no row is empty: TF never reads the default
        (dict(default_id=10, segments=tf.constant([0, 0, 3], tf.int64)), r"default_id 10 for empty row 0 is out"),
        (dict(default_id=-7, segments=tf.constant([0, 3, 3], tf.int64)), r"default_id -7 for empty row 1 is out"),
        (dict(params=tf.zeros([])), r"rank >= 1"),
        (dict(ids=tf.constant([[1]], tf.int64)), "vector"),
    ]
    for kw, pattern in cases:
        if pattern is None:
            assert call(**kw).shape == (2, 4)
            continue
        with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
            call(**kw)


# ---------------------------------------------------------------------------
# String keys (hash mode, CPU): what the rewrite folds a
# categorical_column_with_hash_bucket's StringToHashBucketFast into.


def random_string_keys(rng, batch, max_len=6):
    """Ragged [batch, (n)] string keys: empty rows, empty strings, NUL bytes, long keys."""
    alphabet = np.array(list("abcxyz019,|"))
    rows = []
    for _ in range(batch):
        n = 0 if rng.random() < 0.2 else int(rng.integers(1, max_len + 1))
        row = ["".join(rng.choice(alphabet, size=int(rng.integers(0, 24)))) for _ in range(n)]
        if n and rng.random() < 0.1:
            row[0] = "k\x00" + "v" * 40
        rows.append(row)
    return tf.ragged.constant(rows, dtype=tf.string, ragged_rank=1) if batch else \
        tf.RaggedTensor.from_row_splits(tf.constant([], tf.string), tf.constant([0], tf.int64))


def string_key_lookup(params, keys, weights, combiner, max_norm, num_buckets, segment_kind):
    segments = keys.row_splits if segment_kind == "row_splits" else keys.value_rowids()
    return tco.ops._ops.ctr_embedding_lookup(
        params=params, ids=keys.values, segments=segments, num_rows=tf.constant(keys.nrows(), tf.int64),
        weights=tf.zeros([0]) if weights is None else weights, combiner=combiner, segment_kind=segment_kind,
        id_mode="hash", num_buckets=num_buckets, max_norm=max_norm or -1.0, has_weights=weights is not None)


@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("max_norm", [None, 0.8])
@pytest.mark.parametrize("segment_kind", ["row_splits", "row_ids"])
@pytest.mark.parametrize("batch", [0, 1, 300])
def test_string_keys_hash_like_to_hash_bucket_fast(rng, combiner, weighted, max_norm, segment_kind, batch):
    params = table(rng, 61, 8)
    keys = random_string_keys(rng, batch)
    weights = tf.constant(rng.uniform(0.1, 2.0, size=int(keys.values.shape[0])), tf.float32) if weighted else None
    for num_buckets in (0, 40):  # 0: as many buckets as table rows
        buckets = tf.strings.to_hash_bucket_fast(keys.values, num_buckets or 61)
        sp_w = None if weights is None else keys.with_values(weights).to_sparse()

        def want_fn(p):
            if batch == 0:
                return tf.zeros([0, 8])
            return tf.nn.embedding_lookup_sparse(p, keys.with_values(buckets).to_sparse(), sp_w, combiner=combiner,
                                                 max_norm=max_norm)

        with tf.GradientTape(persistent=True) as tape:
            tape.watch(params)
            got = string_key_lookup(params, keys, weights, combiner, max_norm, num_buckets, segment_kind)
            want = want_fn(params)
            # embedding_lookup_sparse ends at the last nonempty bag; the rest pool to zeros.
            want = tf.pad(want, [[0, batch - want.shape[0]], [0, 0]])
            loss_got, loss_want = tf.reduce_sum(got * got), tf.reduce_sum(want * want)
        assert_close(got, want)
        if batch:
            assert_close(tf.convert_to_tensor(tape.gradient(loss_got, params)),
                         tf.convert_to_tensor(tape.gradient(loss_want, params)))


def test_weighted_string_keys_hash_in_a_graph(rng):
    # to_hash_bucket_fast takes its bucket count as an int: the table's
    # static row count, where a tensor of it only converts eagerly.
    params = table(rng, 6, 2)
    keys = tf.ragged.constant([["a", "b"], ["c"], []])
    weights = tf.ragged.constant([[1.0, 2.0], [0.5], []])
    want = tco.hash_embedding(params, keys, weights, combiner="sum")
    got = tf.function(lambda p, k, w: tco.hash_embedding(p, k, w, combiner="sum"))(params, keys, weights)
    assert_close(got, want)
    unknown = tf.function(lambda p, k, w: tco.hash_embedding(p, k, w, combiner="sum"),
                          input_signature=[tf.TensorSpec([None, 2]), tf.RaggedTensorSpec([None, None], tf.string),
                                           tf.RaggedTensorSpec([None, None], tf.float32)])
    with pytest.raises(ValueError, match="row count is known"):
        unknown(params, keys, weights)


def test_string_key_bucket_outside_the_table_names_row_and_key(rng):
    params = table(rng, 10, 4)
    keys = tf.ragged.constant([[], ["a"], ["b", "c", "d", "e", "f", "g"]])
    # 1000 buckets over 10 rows: some key lands outside, as a Gather after the hash would reject it.
    buckets = tf.strings.to_hash_bucket_fast(keys.values, 1000).numpy()
    bad = int(np.argmax(buckets >= 10))
    row = int(keys.value_rowids().numpy()[bad])
    key = keys.values.numpy()[bad].decode()
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=f'key "{key}" in row {row} hashes to bucket {buckets[bad]}, out of range \\[0, 10\\)'):
        string_key_lookup(params, keys, None, "sum", None, 1000, "row_splits")


def test_int_key_bucket_outside_the_table_names_key_and_bucket(rng):
    # The id a Gather after as_string + to_hash_bucket_fast rejects is the
    # bucket; the message names it beside the key it came from.
    params = table(rng, 10, 4)
    keys = tf.ragged.constant([[3], [1, 2, 5, 7, 8, 9, 11, 12]], tf.int64)
    buckets = tf.strings.to_hash_bucket_fast(tf.strings.as_string(keys.values), 1000).numpy()
    bad = int(np.argmax(buckets >= 10))
    row = int(keys.value_rowids().numpy()[bad])
    key = int(keys.values.numpy()[bad])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=f"key {key} in row {row} hashes to bucket {buckets[bad]}, out of range \\[0, 10\\)"):
        string_key_lookup(params, keys, None, "sum", None, 1000, "row_splits")


def test_string_keys_are_never_table_rows(rng):
    keys = tf.ragged.constant([["1"]])
    with pytest.raises(tf.errors.InvalidArgumentError, match='string ids are keys to hash: they need id_mode "hash"'):
        tco.ops._ops.ctr_embedding_lookup(params=table(rng, 4, 2), ids=keys.values, segments=keys.row_splits,
                                          num_rows=tf.constant(-1, tf.int64), weights=tf.zeros([0]),
                                          combiner="sum", segment_kind="row_splits", id_mode="index")


def _bags_of(ids):
    """A SparseTensor of the rows of the dense [B, L] id matrix `ids`."""
    sp = tf.sparse.from_dense(tf.constant(ids + 1, tf.int64))
    return tf.SparseTensor(sp.indices, sp.values - 1, sp.dense_shape)


def test_long_bags_round_no_worse_than_tf(rng):
    """Bags of 2,500 ids: each fused path is as close to the exact (float64)
    sum as TF's SparseSegmentSum, which sums blocks of 8 rows; summed in
    order they were about 3x further off."""
    vocab, dim, batch, length = 1000, 8, 64, 2500
    params = rng.standard_normal((vocab, dim)).astype(np.float32)
    ids = rng.integers(0, vocab, size=(batch, length))
    exact = params.astype(np.float64)[ids].sum(axis=1)
    sp, p = _bags_of(ids), tf.constant(params)
    strings = tf.constant([",".join(map(str, row)) for row in ids])
    ones = tf.SparseTensor(sp.indices, tf.ones_like(sp.values, tf.float32), sp.dense_shape)
    tf_error = np.abs(tf.nn.embedding_lookup_sparse(p, sp, None, combiner="sum").numpy() - exact).max()
    fused = {
        "lookup": tco.embedding_lookup_sparse(p, sp, None, combiner="sum"),
        "weighted": tco.embedding_lookup_sparse(p, sp, ones, combiner="sum"),
        "string": tco.string_embedding(strings, p, combiner="sum", id_mode="index"),
        "string, max_norm": tco.string_embedding(strings, p, combiner="sum", id_mode="index", max_norm=1e6),
    }
    for name, out in fused.items():
        error = np.abs(out.numpy() - exact).max()
        assert error <= 1.5 * tf_error, (name, error, tf_error)


@pytest.mark.parametrize("length", range(1, 10))
def test_bags_of_up_to_nine_ids_sum_as_tf_bit_for_bit(rng, length):
    """Up to 9 rows, TF's SparseSegmentSum adds them in order, and so do the
    fused paths."""
    params = tf.constant(rng.standard_normal((50, 16)).astype(np.float32) * 1e3)
    ids = rng.integers(0, 50, size=(32, length))
    sp = _bags_of(ids)
    want = tf.nn.embedding_lookup_sparse(params, sp, None, combiner="sum").numpy()
    np.testing.assert_array_equal(tco.embedding_lookup_sparse(params, sp, None, combiner="sum").numpy(), want)
    strings = tf.constant([",".join(map(str, row)) for row in ids])
    np.testing.assert_array_equal(tco.string_embedding(strings, params, combiner="sum", id_mode="index").numpy(), want)


@pytest.mark.parametrize("dtype", [tf.float32, tf.float16, tf.bfloat16])
@pytest.mark.parametrize("combiner", ["mean", "sqrtn"])
def test_mean_and_sqrtn_scale_bags_as_tf_bit_for_bit(rng, dtype, combiner):
    """TF's SparseSegmentMean / SqrtN multiply a bag of fewer than 10 ids by
    the reciprocal of its count and divide a longer one, and the two differ
    by a rounding, which a half output keeps where it falls on a boundary of
    the cast. float32 rows of multiples of 1/128, and half rows, sum exactly
    in float32 in any order, so what is compared is that last step alone, on
    bags of 0 to 40 ids."""
    values = rng.integers(-256, 257, size=(300, 16)) / 128.0 if dtype == tf.float32 else rng.normal(size=(300, 16))
    params = tf.cast(values, dtype)
    lengths = rng.integers(0, 41, 600)
    sp = tf.RaggedTensor.from_row_lengths(rng.integers(0, 300, lengths.sum()), lengths).to_sparse()
    want = tf.nn.embedding_lookup_sparse(params, sp, None, combiner=combiner)
    got = tco.embedding_lookup_sparse(params, sp, None, combiner=combiner)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(tf.cast(got, tf.float32).numpy(), tf.cast(want, tf.float32).numpy())
    strings = tf.constant([",".join(map(str, row)) for row in tf.RaggedTensor.from_sparse(sp).to_list()])
    pooled = tco.string_embedding(strings, params, combiner=combiner, id_mode="index")
    np.testing.assert_array_equal(tf.cast(pooled[: want.shape[0]], tf.float32).numpy(),
                                  tf.cast(want, tf.float32).numpy())


def test_sparse_embedding_takes_dense_ids_as_lists_and_arrays(rng):
    params = table(rng, 10, 3)
    ids = [[1, 2], [3, -1]]
    want = tco.sparse_embedding(params, tf.constant(ids, tf.int64))
    for given in (ids, np.array(ids), tuple(map(tuple, ids))):
        got = tco.sparse_embedding(params, given)
        assert got.shape == (2, 3)
        np.testing.assert_array_equal(got, want)
    fn = tf.function(lambda p: tco.sparse_embedding(p, np.array(ids)))
    np.testing.assert_array_equal(fn(params), want)


def _persistent_tape_cases():
    """(name, table variable, lookup as a function of the table) of every
    lookup family whose gradient reads its table."""
    sp = tf.SparseTensor([[0, 0], [0, 1], [2, 0]], tf.constant([1, 2, 3], tf.int64), [3, 2])
    ragged = tf.ragged.constant([[1, 2], [], [3]], tf.int64)
    vocab = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
        tf.constant(["a", "b", "c"]), tf.constant([4, 5, 6], tf.int64)), default_value=0)
    hashed = tco.HashTable(dim=4, capacity=64)
    return [
        ("embedding_lookup_sparse", lambda p: tco.embedding_lookup_sparse(p, sp, None)),
        ("safe_embedding_lookup_sparse", lambda p: tco.safe_embedding_lookup_sparse(p, sp)),
        ("safe_embedding_lookup_sparse/v1", lambda p: tco.compat.v1.safe_embedding_lookup_sparse([p], sp)),
        ("sparse_embedding/read", lambda p: tco.sparse_embedding(tf.identity(p.read_value()), ragged)),
        ("hash_embedding", lambda p: tco.hash_embedding(p, ragged, max_norm=1.0)),
        ("string_embedding", lambda p: tco.string_embedding(tf.constant(["1,2", "", "3"]), p, id_mode="index")),
        ("multi_string_embedding", lambda p: tco.multi_string_embedding(
            [tf.constant(["1,2", "3"]), tf.constant(["x", "y"])], [p, p], id_modes=["index", "hash"])[1]),
        ("vocab_embedding", lambda p: tco.vocab_embedding(vocab, tf.constant(["a", "c", "z"]), p)),
    ], hashed


def _plain_and_persistent_tape_grads(f, var):
    """d sum(f() * [1, 2, 3, 4]) / d var under a plain tape, then a persistent one."""
    grads = []
    for persistent in (False, True):
        with tf.GradientTape(persistent=persistent) as tape:
            loss = tf.reduce_sum(f() * tf.range(1.0, 5.0))
        grads.append(tape.gradient(loss, var))
    return grads


def test_a_persistent_tape_around_a_function_gets_indexed_slices_as_tf_gives():
    # A persistent tape differentiates a tf.function's side
    # outputs too: a gradient that read the table from inside the function
    # got a dense [V, D] zero gradient added, and the optimizer a dense
    # table (ResourceGather's, whose gradient reads no table, stays sparse).
    cases, hashed = _persistent_tape_cases()
    params = tf.Variable(np.random.default_rng(3).normal(size=(1000, 4)).astype(np.float32))
    for name, lookup in cases:
        f = tf.function(lambda: lookup(params))
        grads = _plain_and_persistent_tape_grads(f, params)
        for g in grads:
            assert isinstance(g, tf.IndexedSlices), (name, type(g).__name__)
            assert g.values.shape[0] < 10, (name, g.values.shape)
        np.testing.assert_allclose(tf.convert_to_tensor(grads[1]), tf.convert_to_tensor(grads[0]), rtol=1e-6,
                                   err_msg=name)
    keys = tf.ragged.constant([[7, 8], [8]], tf.int64)
    f = tf.function(lambda: tco.hash_table_embedding(hashed, keys, insert=True))
    grads = _plain_and_persistent_tape_grads(f, hashed.values)
    for g in grads:
        assert isinstance(g, tf.IndexedSlices), type(g).__name__
        assert g.values.shape[0] == 3, g.values.shape
    np.testing.assert_allclose(tf.convert_to_tensor(grads[1]), tf.convert_to_tensor(grads[0]), rtol=1e-6)


@pytest.mark.parametrize("persistent", [False, True])
def test_a_tape_around_a_loop_of_lookups_in_a_function_gets_their_gradient(persistent):
    # The gradient of a lookup in a while loop is built in the gradient
    # loop's body: reading the table from the function around the loop there
    # failed to build ("in list of internal_captures but not in
    # internal_capture_to_output"). TF's gathers differentiate there.
    cases, hashed = _persistent_tape_cases()
    cases.append(("hash_table_embedding", lambda p: tco.hash_table_embedding(
        hashed, tf.ragged.constant([[7, 8], [8]], tf.int64))))
    hashed.find([7, 8], insert=True)
    params = tf.Variable(np.random.default_rng(5).normal(size=(1000, 4)).astype(np.float32))
    if persistent:  # TF's own gather of a StaticHashTable's lookup fails there too (a table handle has no handle data)
        cases = [case for case in cases if case[0] != "vocab_embedding"]
    for name, lookup in cases:
        var = hashed.values if name == "hash_table_embedding" else params

        @tf.function
        def looped():
            with tf.GradientTape(persistent=persistent) as tape:
                total = tf.zeros([4])
                for i in tf.range(3):
                    total += tf.reduce_sum(lookup(params), 0) * tf.cast(i + 1, tf.float32)
                loss = tf.reduce_sum(total * tf.range(1.0, 5.0))
            return tf.convert_to_tensor(tape.gradient(loss, var))

        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.reduce_sum(lookup(params), 0) * tf.range(1.0, 5.0)) * 6.0
        expected = tf.convert_to_tensor(tape.gradient(loss, var))
        assert np.abs(expected.numpy()).sum() > 0, name
        np.testing.assert_allclose(looped(), expected, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
def test_a_persistent_tape_around_a_function_of_a_cast_table_gets_indexed_slices(dtype):
    # A mixed-precision model reads its float32 table through a cast in the
    # function: the gradient, which read the cast from inside it, was a dense
    # [V, D] tensor under a persistent tape. TF's stays IndexedSlices.
    cases, _ = _persistent_tape_cases()
    params = tf.Variable(np.random.default_rng(4).normal(size=(1000, 4)).astype(np.float32))
    for name, lookup in [case for case in cases if not case[0].endswith("/read")]:
        f = tf.function(lambda: tf.cast(lookup(tf.cast(params, dtype)), tf.float32))
        grads = _plain_and_persistent_tape_grads(f, params)
        for g in grads:
            assert isinstance(g, tf.IndexedSlices), (name, type(g).__name__)
            assert g.dtype == tf.float32 and g.values.shape[0] < 10, (name, g.dtype, g.values.shape)
        np.testing.assert_array_equal(tf.convert_to_tensor(grads[1]), tf.convert_to_tensor(grads[0]), err_msg=name)


def _unique_kept_reference(ids, bag_of, num_bags, weights, table_rows, fill):
    """First appearance of the kept ids in entry order, the fill numbered
    where the first bag with no kept entry begins (TF's safe lookup lists it
    there: sparse_fill_empty_rows)."""
    kept = (ids >= 0) & (ids < table_rows) & (True if weights is None else weights > 0)
    counts = np.bincount(bag_of[kept], minlength=num_bags) if num_bags else np.zeros(0, np.int64)
    empty = np.flatnonzero(counts == 0)
    fill_at = np.searchsorted(bag_of, empty[0]) if fill is not None and empty.size else None
    slot, idx, fill_idx = {}, np.full(ids.size, -1, np.int64), -1
    for e in range(ids.size + 1):
        if e == fill_at:
            fill_idx = slot.setdefault(fill, len(slot))
        if e < ids.size and kept[e]:
            idx[e] = slot.setdefault(int(ids[e]), len(slot))
    return np.array(list(slot), np.int64), idx, fill_idx


@pytest.mark.parametrize("kind", ["row_ids", "row_splits"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("fill", [None, 0, 5])
@pytest.mark.parametrize("n", [0, 1, 9, 4000])
def test_unique_kept_lists_the_ids_as_tf_lookups_do(rng, kind, weighted, fill, n):
    # The de-duplication of a lookup of a table in shards: tf.unique's order
    # over the kept entries, and the fill id where TF's safe lookup puts it.
    table_rows, num_bags = 50, max(n // 3, 1) + 2
    ids = rng.integers(-3, table_rows + 5, n).astype(np.int64)
    bag_of = np.sort(rng.integers(0, num_bags, n)).astype(np.int64)
    weights = (rng.uniform(-1, 1, n) * (rng.random(n) < 0.9)).astype(np.float32) if weighted else None
    want = _unique_kept_reference(ids, bag_of, num_bags, weights, table_rows, fill)
    segments = bag_of if kind == "row_ids" else np.searchsorted(bag_of, np.arange(num_bags + 1))
    bags = tco_ops._Bags(None, tf.constant(segments, tf.int64), num_bags if kind == "row_ids" else -1, kind)
    for base in (0, 1):  # 1: the pooling reads the fill's row before the gathered ones
        got = tco_ops._unique_kept(tf.constant(ids), None if weights is None else tf.constant(weights), bags,
                                   table_rows=table_rows, prune_weights=weighted, fill=fill, idx_base=base)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], np.where(want[1] >= 0, want[1] + base, -1))
        assert int(got[2]) == want[2]


def test_unique_kept_checks_its_bags():
    bags = tco_ops._Bags(None, tf.constant([1, 0], tf.int64), 2, "row_ids", None)
    with pytest.raises(tf.errors.InvalidArgumentError, match="sorted"):
        tco_ops._unique_kept(tf.constant([1, 2], tf.int64), None, bags, table_rows=5, prune_weights=False, fill=0)


def test_a_nan_max_norm_is_refused_by_the_raw_ops(rng):
    # The docs say <= 0 turns clipping off; NaN did too, silently, where TF's
    # clip_by_norm makes the rows NaN. (The Python functions refuse it first.)
    keys = tf.ragged.constant([[1, 2]], tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_norm must be a number .* got nan"):
        tco.ops._ops.ctr_embedding_lookup(params=table(rng, 4, 2), ids=keys.values, segments=keys.row_splits,
                                          num_rows=tf.constant(-1, tf.int64), weights=tf.zeros([0]),
                                          combiner="sum", segment_kind="row_splits", max_norm=float("nan"))
    data, splits = tco.pack_strings(tf.constant(["1,2"]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_norm must be a number .* got nan"):
        tco.strings._ops.ctr_string_embedding(params=table(rng, 4, 2), bytes=data, row_splits=splits,
                                              bag_splits=tf.zeros([0], tf.int64), id_mode="index",
                                              max_norm=float("nan"))


@pytest.mark.parametrize("dtype", [tf.int32, tf.bool, tf.complex64])
def test_tables_of_a_type_no_op_pools_are_a_type_error_as_in_the_drop_ins(dtype):
    # The drop-ins' TypeError; these were the op's attr error naming its NodeDef.
    t = tf.zeros([5, 2], dtype)
    ids = tf.ragged.constant([[1]], tf.int64)
    for lookup in (lambda: tco.sparse_embedding(t, ids), lambda: tco.sparse_embedding(tf.Variable(t), ids),
                   lambda: tco.hash_embedding(t, ids),
                   # TF's drop-in computes integer tables (tests/test_dropin_edges.py)
                   *([] if dtype.is_integer else [lambda: tco.safe_embedding_lookup_sparse(t, ids)]),
                   lambda: tco.bucketized_embedding_lookup(t, tf.constant([1.0]), [0.5]),
                   lambda: tco.cross_embedding_lookup(t, [tf.constant([[1]], tf.int64)] * 2, 5)):
        with pytest.raises(TypeError, match=f"embedding tables must be float16, bfloat16, float32 or float64, "
                                            f"got {dtype.name}"):
            lookup()


def test_dense_ids_of_unknown_rank_in_a_function_are_checked_when_it_runs():
    # A TensorSpec(None) was refused while tracing; [B, N] ids now run, and
    # other ranks fail at run time.
    table = tf.Variable(tf.reshape(tf.range(40.0), [10, 4]))
    ids = tf.constant([[1, 3, -1], [3, -1, -1]], tf.int64)
    keys = tf.constant([["a", "b"], ["c", ""]])
    cases = ((lambda x: tco.sparse_embedding(table, x), ids), (lambda x: tco.hash_embedding(table, x), ids),
             (lambda x: tco.hash_embedding(table, x), keys))
    for lookup, x in cases:
        in_function = tf.function(lookup, input_signature=[tf.TensorSpec(None, x.dtype)])
        np.testing.assert_array_equal(in_function(x), lookup(x))
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"is not compatible with expected shape \[\?,\?\]"):
            in_function(x[0])
    weighted = tf.function(lambda x, w: tco.sparse_embedding(table, x, w),
                           input_signature=[tf.TensorSpec(None, tf.int64), tf.TensorSpec(None)])
    w = tf.constant([[1.0, 2.0, 0.0], [0.5, 0.0, 0.0]])
    np.testing.assert_array_equal(weighted(ids, w), tco.sparse_embedding(table, ids, w))
    # The layers take [B] ids as [B, 1], whatever the rank known when tracing.
    for layer in (tco.layers.SparseEmbedding(10, 4), tco.layers.HashEmbedding(10, 4)):
        layer(ids)
        in_function = tf.function(layer, input_signature=[tf.TensorSpec(None, tf.int64)])
        for x in (ids, ids[:, 0], ids[:0, 0]):
            np.testing.assert_array_equal(in_function(x), layer(x))


def test_dense_weights_of_another_shape_than_the_ids_are_refused():
    # [3, 2] weights for [2, 3] ids were read in the ids' layout; TF's
    # Embedding(ids) * w[..., None] fails to broadcast them.
    table = tf.reshape(tf.range(40.0), [10, 4])
    ids, w = tf.constant([[1, 2, 3], [4, 5, 6]], tf.int64), tf.ones([3, 2])
    with pytest.raises(ValueError, match=r"dense weights must be \[B, N\] like ids, got shape \(3, 2\)"):
        tco.sparse_embedding(table, ids, w)
    in_function = tf.function(lambda i, w: tco.hash_embedding(table, i, w),
                              input_signature=[tf.TensorSpec([None, None], tf.int64), tf.TensorSpec([None, None])])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"dense weights must have the shape \[B, N\] of the ids"):
        in_function(ids, w)
    np.testing.assert_array_equal(in_function(ids, tf.ones([2, 3])), tco.hash_embedding(table, ids, tf.ones([2, 3])))



def test_dense_string_keys_check_their_weights_shape_too():
    # String keys went through a ragged mask without the check: [1, 4]
    # weights for [2, 2] keys were read as [2, 2].
    table = tf.reshape(tf.range(21.0), [7, 3])
    keys, w = tf.constant([["a", "bb"], ["c", ""]]), tf.constant([[1.0, 2.0, 3.0, 4.0]])
    with pytest.raises(ValueError, match=r"dense weights must be \[B, N\] like ids, got shape \(1, 4\)"):
        tco.hash_embedding(table, keys, w)
    for spec in ([None, None], None):
        in_function = tf.function(lambda k, w: tco.hash_embedding(table, k, w),
                                  input_signature=[tf.TensorSpec(spec, tf.string), tf.TensorSpec(spec)])
        for bad in (w, tf.transpose(w)):
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match=r"dense weights must have the shape \[B, N\] of the ids"):
                in_function(keys, bad)
        good = tf.constant([[1.0, 2.0], [0.5, 9.0]])
        np.testing.assert_array_equal(in_function(keys, good), tco.hash_embedding(table, keys, good))


def test_a_max_norm_below_float32s_least_normal_clips_rows_to_zeros_as_tf_does():
    # The float32 attr read 1e-40 (a denormal) and 1e-50 (0) as "no clipping".
    table = tf.reshape(tf.range(15.0), [5, 3])
    sp = tf.SparseTensor([[0, 0], [1, 0]], tf.constant([1, 4], tf.int64), [2, 1])
    for max_norm in (1e-40, 1e-50, 1e-30):
        want = tf.nn.embedding_lookup_sparse(table, sp, None, combiner="sum", max_norm=max_norm)
        for got in (tco.embedding_lookup_sparse(table, sp, None, combiner="sum", max_norm=max_norm),
                    tco.sparse_embedding(table, sp, combiner="sum", max_norm=max_norm)):
            np.testing.assert_allclose(got, want, atol=1e-30)
            assert np.abs(got.numpy()).max() < 1e-29


@pytest.mark.parametrize("dense_shape", [[-1, 1], [-3, 1]])
def test_a_negative_dense_shape_is_an_error_as_in_tf(dense_shape):
    # -1 rows passed as the op's "as many as the row ids say".
    table = tf.reshape(tf.range(15.0), [5, 3])
    make = lambda shape: tf.SparseTensor([[0, 0], [1, 0]], tf.constant([1, 2], tf.int64), shape)  # noqa: E731
    spec = tf.TensorSpec([2], tf.int64)
    for lookup in (lambda sp: tco.safe_embedding_lookup_sparse(table, sp), lambda sp: tco.sparse_embedding(table, sp)):
        in_function = tf.function(lambda shape: lookup(make(shape)), input_signature=[spec])
        with pytest.raises(tf.errors.InvalidArgumentError, match="dense_shape must be non-negative"):
            in_function(tf.constant(dense_shape, tf.int64))
        np.testing.assert_array_equal(in_function(tf.constant([2, 1], tf.int64)), lookup(make([2, 1])))
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.function(lambda shape: tf.nn.safe_embedding_lookup_sparse(table, make(shape)),
                    input_signature=[spec])(tf.constant(dense_shape, tf.int64))


def test_clear_errors_for_ids_of_the_wrong_kind():
    table = tf.reshape(tf.range(15.0), [5, 3])
    with pytest.raises(TypeError, match="sparse_embedding.s ids must hold integer ids, got strings: hash_embedding"):
        tco.sparse_embedding(table, tf.ragged.constant([["1"]]))
    with pytest.raises(TypeError, match="ids must be a dense \\[B, L\\] matrix .* got a RaggedTensor in block 0"):
        tco.multi_hot_dense([(tf.ragged.constant([[1, 2], []], tf.int64), 5)], tf.ones([5, 2]))
    init = tf.lookup.KeyValueTensorInitializer(["a", "b"], tf.constant([0, 1], tf.int64))
    vocab = tf.lookup.StaticHashTable(init, -1)
    with pytest.raises(TypeError, match="keys must be a dense tensor .* got a RaggedTensor"):
        tco.vocab_embedding(vocab, tf.ragged.constant([["a"], []]), table)
    with pytest.raises(TypeError, match="table must be a tf_ctr_ops.HashTable .*, got EagerTensor"):
        tco.hash_table_embedding(table, tf.ragged.constant([[1]], tf.int64))
    with pytest.raises(TypeError, match="tables\\[1\\] must be a tf_ctr_ops.HashTable .*, got ResourceVariable"):
        tco.multi_hash_table_embedding([tco.HashTable(dim=3, capacity=8), tf.Variable(table)],
                                       [tf.ragged.constant([[1]], tf.int64)] * 2)
    with pytest.raises(ValueError, match="HashTableEmbedding layer that is not built yet: call \\(or build\\) it"):
        tco.hash_table_embedding(tco.layers.HashTableEmbedding(8, 3), tf.ragged.constant([[1]], tf.int64))
    with pytest.raises(TypeError, match="keys must be a dense tensor \\[B, L\\], got a RaggedTensor: .*vocab_indicator"):
        tco.vocab_multi_hot(vocab, tf.ragged.constant([["a"], []]), table)
    string_ids = tf.ragged.constant([["1"], []])
    for drop_in, argument in [(tco.embedding_lookup_sparse, "sp_ids"), (tco.safe_embedding_lookup_sparse, "sparse_ids")]:
        for ids in (string_ids, string_ids.to_sparse()):
            with pytest.raises(TypeError, match=f"{argument} must hold integer ids, got strings: .*hash_embedding"):
                drop_in(table, ids, None)
    with pytest.raises(TypeError, match="^ids must be integers that int64 holds .*\\), got float32$"):
        tco.sparse_embedding(table, tf.ragged.constant([[1.0]]))
    with pytest.raises(TypeError, match="^keys must be strings or integers that int64 holds .*, got float32$"):
        tco.hash_embedding(table, tf.ragged.constant([[1.0]]))
    with pytest.raises(ValueError, match="dtype \\(of the values\\) must be a float type, got int32"):
        tco.HashTable(dim=2, capacity=8, dtype=tf.int32)

"""The drop-ins against TF 2.21's own functions, on the parts of the contract
issue #24 names: shard lists in both partition strategies, tables of any rank,
float64, ragged and unordered ids, gradient indices and when errors are raised.
(TF's own test file runs against them in tests/test_tf_contract.py.)"""

import numpy as np
import pytest
import tensorflow as tf

import tf_ctr_ops as tco
from tf_ctr_ops.ops import canonical_shard_sizes

COMBINERS = ["sum", "mean", "sqrtn"]
V1 = tco.compat.v1


def random_sparse(rng, batch, vocab, max_len=4, id_dtype=tf.int64, negative=False):
    lengths = rng.integers(0, max_len + 1, size=batch)
    idx = [(r, c) for r in range(batch) for c in range(lengths[r])]
    ids = rng.integers(-2 if negative else 0, vocab, size=len(idx))
    return tf.SparseTensor(np.array(idx, np.int64).reshape(-1, 2), tf.constant(ids, id_dtype),
                           [batch, max(max_len, 1)])


def weights_like(rng, sp, low=0.1):
    w = rng.uniform(low, 2.0, size=int(sp.values.shape[0])).astype(np.float32)
    return tf.SparseTensor(sp.indices, w, sp.dense_shape)


def shards_of(full, num_shards, strategy):
    """The shards TF's `strategy` reads `full` from (row r of full is id r)."""
    if strategy == "mod":
        return [full[p::num_shards] for p in range(num_shards)]
    sizes = canonical_shard_sizes(len(full), num_shards)
    return np.split(full, np.cumsum(sizes)[:-1])


def close(a, b, tol=1e-5):
    a, b = tf.convert_to_tensor(a), tf.convert_to_tensor(b)
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    np.testing.assert_allclose(tf.cast(a, tf.float64).numpy(), tf.cast(b, tf.float64).numpy(), rtol=tol, atol=tol)


# ---------------------------------------------------------------------------
# Shards


@pytest.mark.parametrize("strategy", ["mod", "div"])
@pytest.mark.parametrize("num_shards", [2, 5])
@pytest.mark.parametrize("safe", [False, True])
@pytest.mark.parametrize("id_dtype", [tf.int32, tf.int64])
def test_shard_lists_match_tf_row_for_row(rng, strategy, num_shards, safe, id_dtype):
    full = rng.normal(size=(13, 3)).astype(np.float32)
    shards = [tf.constant(s) for s in shards_of(full, num_shards, strategy)]
    sp = random_sparse(rng, 9, 13, id_dtype=id_dtype, negative=safe)
    w = weights_like(rng, sp, low=-0.5 if safe else 0.1)
    ours, theirs = ((V1.safe_embedding_lookup_sparse, tf.compat.v1.nn.safe_embedding_lookup_sparse) if safe
                    else (V1.embedding_lookup_sparse, tf.compat.v1.nn.embedding_lookup_sparse))
    for comb in COMBINERS:
        for weights in (None, w):
            close(ours(shards, sp, weights, combiner=comb, partition_strategy=strategy),
                  theirs(shards, sp, weights, combiner=comb, partition_strategy=strategy))


@pytest.mark.parametrize("safe", [False, True])
@pytest.mark.parametrize("id_dtype", [tf.int32, tf.int64])
def test_variable_shards_gradients_have_tfs_indices_dtype(rng, safe, id_dtype):
    """The ids' own dtype, as TF's gathers give it (int32 ids gave int64
    indices: a tf.cond of the drop-in and TF's lookup joins gradients of one dtype)."""
    full = rng.normal(size=(6, 2)).astype(np.float32)
    sp = tf.SparseTensor([[0, 0], [1, 0]], tf.constant([1, 4], id_dtype), [2, 1])
    ours, theirs = ((tco.safe_embedding_lookup_sparse, tf.nn.safe_embedding_lookup_sparse) if safe
                    else (tco.embedding_lookup_sparse, tf.nn.embedding_lookup_sparse))
    grads = []
    for lookup in (ours, theirs):
        shards = [tf.Variable(s) for s in shards_of(full, 2, "div")]
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(lookup(shards, sp, None))
        grads.append(tape.gradient(loss, shards))
    for got, want in zip(*grads):
        assert got.indices.dtype == want.indices.dtype == id_dtype
        close(tf.convert_to_tensor(got), tf.convert_to_tensor(want))


@pytest.mark.parametrize("strategy", ["mod", "div"])
def test_default_id_is_read_in_the_shards_layout(rng, strategy):
    full = rng.normal(size=(13, 2)).astype(np.float32)
    shards = [tf.constant(s) for s in shards_of(full, 5, strategy)]
    sp = tf.SparseTensor([[0, 0], [2, 0]], tf.constant([4, -1], tf.int64), [3, 1])  # rows 1, 2 empty
    for default_id in range(13):
        close(V1.safe_embedding_lookup_sparse(shards, sp, default_id=default_id, partition_strategy=strategy),
              full[[4, default_id, default_id]])

    @tf.function(input_signature=[tf.TensorSpec([None, 2])] * 5)
    def dynamic(*parts):
        return V1.safe_embedding_lookup_sparse(list(parts), sp, default_id=3, partition_strategy=strategy)

    if strategy == "mod":
        with pytest.raises(ValueError, match="default_id with 'mod' shards needs their sizes"):
            dynamic.get_concrete_function()
    else:
        close(dynamic(*shards), full[[4, 3, 3]])


def test_v1_defaults_are_tfs():
    full = np.arange(13 * 2, dtype=np.float32).reshape(13, 2)
    sp = tf.SparseTensor([[0, 0], [1, 0], [2, 0]], tf.constant([1, 7, 12], tf.int64), [3, 1])
    mod = [tf.constant(s) for s in shards_of(full, 5, "mod")]
    div = [tf.constant(s) for s in shards_of(full, 5, "div")]
    close(V1.embedding_lookup_sparse(mod, sp, None), full[[1, 7, 12]])  # v1 default: "mod"
    close(tco.embedding_lookup_sparse(div, sp, None), full[[1, 7, 12]])  # v2: "div"
    close(V1.safe_embedding_lookup_sparse(div, sp), full[[1, 7, 12]])  # v1 safe default: "div"
    close(tco.safe_embedding_lookup_sparse(div, sp), full[[1, 7, 12]])


def test_partitioned_variable_in_both_strategies(rng):
    full = rng.normal(size=(13, 4)).astype(np.float32)
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        sp = random_sparse(rng, 6, 13)
        with tf.compat.v1.variable_scope("pv"):
            pv = tf.compat.v1.get_variable(
                "table", shape=[13, 4], initializer=tf.constant(full),
                partitioner=tf.compat.v1.fixed_size_partitioner(5))
        outs = [(f(pv, sp, None, partition_strategy=s), g(pv, sp, None, partition_strategy=s))
                for s in ("mod", "div")
                for f, g in ((V1.embedding_lookup_sparse, tf.compat.v1.nn.embedding_lookup_sparse),
                             (V1.safe_embedding_lookup_sparse, tf.compat.v1.nn.safe_embedding_lookup_sparse))]
        sess.run(tf.compat.v1.global_variables_initializer())
        for ours, theirs in sess.run(outs):
            np.testing.assert_allclose(ours, theirs, rtol=1e-6)


def test_shard_sizes_off_tfs_layout_are_refused():
    sp = tf.SparseTensor([[0, 0]], tf.constant([3], tf.int64), [1, 1])
    shards = [tf.zeros([2, 2]), tf.zeros([3, 2])]  # TF's layout of 5 rows in 2 shards is [3, 2]
    for strategy in ("mod", "div"):
        with pytest.raises(ValueError, match=r"shard sizes \[2, 3\] do not follow the layout \[3, 2\]"):
            V1.embedding_lookup_sparse(shards, sp, None, partition_strategy=strategy)
        with pytest.raises(ValueError, match="do not follow the layout"):
            V1.safe_embedding_lookup_sparse(shards, sp, partition_strategy=strategy)

    @tf.function(input_signature=[tf.TensorSpec([None, 2]), tf.TensorSpec([None, 2])])
    def dynamic(a, b):
        return V1.embedding_lookup_sparse([a, b], sp, None, partition_strategy="mod")

    with pytest.raises(tf.errors.InvalidArgumentError, match="do not follow the layout"):
        dynamic(tf.zeros([2, 2]), tf.zeros([3, 2]))
    close(dynamic(tf.zeros([3, 2]), tf.ones([2, 2])), [[1.0, 1.0]])  # id 3 -> shard 1, row 1
    with pytest.raises(ValueError, match="Unrecognized partition strategy"):
        V1.embedding_lookup_sparse([tf.zeros([3, 2]), tf.zeros([2, 2])], sp, None, partition_strategy="hash")


@pytest.mark.parametrize("strategy", ["mod", "div"])
def test_ids_past_the_shards_are_errors_naming_the_id(strategy):
    shards = [tf.ones([3, 2]), tf.ones([3, 2]), tf.ones([3, 2]), tf.ones([2, 2]), tf.ones([2, 2])]
    for bad in (13, 15):  # 15 % 5 == 0 and 15 // 5 == 3: past shard 0, whose next rows are shard 1's
        sp = tf.SparseTensor([[0, 0], [1, 0]], tf.constant([1, bad], tf.int64), [2, 1])
        with pytest.raises(tf.errors.InvalidArgumentError, match=rf"id {bad} in row 1 is out of range \[0, 13\)"):
            V1.embedding_lookup_sparse(shards, sp, None, partition_strategy=strategy)
        with pytest.raises(tf.errors.InvalidArgumentError):
            tf.compat.v1.nn.embedding_lookup_sparse(shards, sp, None, partition_strategy=strategy)


# ---------------------------------------------------------------------------
# A default_id that is not a table row: TF fills empty rows with it and its
# gather fails, so it is an error only where a row is left empty.

DEFAULTS_NOT_ROWS = [9, 40, -5]


def safe_lookup_pair(params, sp, w, default_id, combiner="mean"):
    return (lambda: tco.safe_embedding_lookup_sparse(params, sp, w, combiner=combiner, default_id=default_id),
            lambda: tf.nn.safe_embedding_lookup_sparse(params, sp, w, combiner=combiner, default_id=default_id))


@pytest.mark.parametrize("default_id", DEFAULTS_NOT_ROWS)
@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("id_dtype", [tf.int32, tf.int64])
def test_a_default_id_past_the_table_is_unused_without_empty_rows(rng, default_id, combiner, id_dtype):
    params = tf.Variable(rng.normal(size=(9, 4)).astype(np.float32))
    ids = rng.integers(0, 9, size=(7, 3))
    sp = tf.sparse.from_dense(tf.constant(ids, id_dtype) + 1)
    sp = tf.SparseTensor(sp.indices, sp.values - 1, sp.dense_shape)  # every row full, ids in [0, 9)
    w = weights_like(rng, sp)
    ours, theirs = safe_lookup_pair(params, sp, w, default_id, combiner)
    with tf.GradientTape(persistent=True) as tape:
        got, want = ours(), theirs()
    close(got, want)
    g_got, g_want = tape.gradient(got, params), tape.gradient(want, params)
    np.testing.assert_array_equal(g_got.indices.numpy(), g_want.indices.numpy())
    np.testing.assert_allclose(g_got.values.numpy(), g_want.values.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("default_id", DEFAULTS_NOT_ROWS)
@pytest.mark.parametrize("emptied_by", ["no ids", "a negative id", "a pruned weight"])
@pytest.mark.parametrize("in_function", [False, True])
def test_a_default_id_past_the_table_fails_on_the_empty_row_as_tf(rng, default_id, emptied_by, in_function):
    params = tf.constant(rng.normal(size=(9, 4)).astype(np.float32))
    indices, values, weights = [[0, 0], [2, 0], [2, 1]], [3, 5, 8], [1.0, 1.0, 1.0]
    if emptied_by == "a negative id":
        indices, values, weights = indices + [[1, 0]], values + [-2], weights + [1.0]
    elif emptied_by == "a pruned weight":
        indices, values, weights = indices + [[1, 0]], values + [4], weights + [0.0]
    order = np.lexsort(np.array(indices).T[::-1])
    sp = tf.SparseTensor(np.array(indices, np.int64)[order], tf.constant(np.array(values)[order], tf.int64), [3, 2])
    w = tf.SparseTensor(sp.indices, tf.constant(np.array(weights, np.float32)[order]), sp.dense_shape)
    ours, theirs = safe_lookup_pair(params, sp, w, default_id)
    if in_function:
        ours, theirs = tf.function(ours), tf.function(theirs)
    with pytest.raises(tf.errors.InvalidArgumentError):
        theirs()
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"default_id {default_id} for empty row 1 is out of range \[0, 9\)"):
        ours()


@pytest.mark.parametrize("strategy", ["div", "mod"])
@pytest.mark.parametrize("default_id", [13, 20])
def test_a_default_id_past_the_shards_fails_only_on_an_empty_row(rng, strategy, default_id):
    full = rng.normal(size=(13, 3)).astype(np.float32)
    shards = [tf.constant(s) for s in shards_of(full, 4, strategy)]
    full_rows = tf.SparseTensor([[0, 0], [1, 0], [1, 1]], tf.constant([12, 0, 7], tf.int64), [2, 2])
    close(V1.safe_embedding_lookup_sparse(shards, full_rows, None, default_id=default_id, partition_strategy=strategy),
          tf.compat.v1.nn.safe_embedding_lookup_sparse(shards, full_rows, None, default_id=default_id,
                                                       partition_strategy=strategy))
    empty_row = tf.SparseTensor([[0, 0]], tf.constant([12], tf.int64), [2, 2])
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.compat.v1.nn.safe_embedding_lookup_sparse(shards, empty_row, None, default_id=default_id,
                                                     partition_strategy=strategy)
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"default_id {default_id} for empty row 1"):
        V1.safe_embedding_lookup_sparse(shards, empty_row, None, default_id=default_id, partition_strategy=strategy)


# ---------------------------------------------------------------------------
# Tables: rank, dtype


@pytest.mark.parametrize("shape", [(20,), (20, 3), (20, 2, 3), (20, 1, 2, 2)])
@pytest.mark.parametrize("safe", [False, True])
def test_tables_of_any_rank_match_tf(rng, shape, safe):
    params = tf.Variable(rng.normal(size=shape).astype(np.float32))
    sp = random_sparse(rng, 7, 20, negative=safe)
    w = weights_like(rng, sp)
    # TF's safe lookup needs a default_id for tables not [V, D] (its zeroing
    # `where` assumes rank 2); ours takes either (test_safe_lookup_zeroes_rows_of_any_shape).
    kw = dict(default_id=4) if safe else {}
    ours, theirs = ((tco.safe_embedding_lookup_sparse, tf.nn.safe_embedding_lookup_sparse) if safe
                    else (tco.embedding_lookup_sparse, tf.nn.embedding_lookup_sparse))
    for comb in COMBINERS:
        with tf.GradientTape(persistent=True) as tape:
            a = ours(params, sp, w, combiner=comb, max_norm=1.5, **kw)
            b = theirs(params, sp, w, combiner=comb, max_norm=1.5, **kw)
        close(a, b)
        assert a.shape.as_list() == b.shape.as_list()
        close(tf.convert_to_tensor(tape.gradient(a, params)), tf.convert_to_tensor(tape.gradient(b, params)))


def test_safe_lookup_zeroes_rows_of_any_shape(rng):
    params = tf.constant(rng.normal(size=(6, 2, 3)).astype(np.float32))
    sp = tf.SparseTensor([[0, 0], [0, 1], [2, 0]], tf.constant([1, 4, -1], tf.int64), [3, 2])
    out = tco.safe_embedding_lookup_sparse(params, sp, combiner="sum")
    close(out, tf.stack([params[1] + params[4], tf.zeros([2, 3]), tf.zeros([2, 3])]))
    close(tco.safe_embedding_lookup_sparse(params[:, 0, 0], sp, combiner="sum"),
          tf.stack([params[1, 0, 0] + params[4, 0, 0], 0.0, 0.0]))


def test_static_output_shape_is_tfs(rng):
    sp = random_sparse(rng, 5, 10)
    sp3 = tf.sparse.reshape(sp, [5, 2, 2])

    @tf.function
    def shapes(table):
        out = []
        for f, g in ((tco.embedding_lookup_sparse, tf.nn.embedding_lookup_sparse),
                     (tco.safe_embedding_lookup_sparse, tf.nn.safe_embedding_lookup_sparse)):
            out.append((f(table, sp, None, default_id=0).shape.as_list() if f is not tco.embedding_lookup_sparse
                        else f(table, sp, None).shape.as_list(),
                        g(table, sp, None, default_id=0).shape.as_list() if g is not tf.nn.embedding_lookup_sparse
                        else g(table, sp, None).shape.as_list()))
        out.append((tco.safe_embedding_lookup_sparse(table, sp3, default_id=0).shape.as_list(),
                    tf.nn.safe_embedding_lookup_sparse(table, sp3, default_id=0).shape.as_list()))
        for a, b in out:
            assert a == b, out
        return 0

    shapes(tf.zeros([10, 2, 5]))
    shapes(tf.zeros([10]))


@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("weighted", [False, True])
def test_float64_tables_are_pooled_in_double(rng, combiner, weighted):
    params = tf.Variable(rng.normal(size=(30, 5)) * 1e3 + 1.0)  # float64, beyond float32's digits
    sp = random_sparse(rng, 10, 30)
    w = weights_like(rng, sp) if weighted else None
    with tf.GradientTape(persistent=True) as tape:
        a = tco.embedding_lookup_sparse(params, sp, w, combiner=combiner)
        b = tf.nn.embedding_lookup_sparse(params, sp, w, combiner=combiner)
    assert a.dtype == tf.float64
    close(a, b, tol=1e-9 if combiner == "sum" else 1e-6)
    close(tf.convert_to_tensor(tape.gradient(a, params)), tf.convert_to_tensor(tape.gradient(b, params)), tol=1e-6)


def test_dtype_rules_and_errors_are_tfs(rng):
    parts = [np.ones([3, 2], np.float32), np.ones([3, 2], np.float64)]
    with tf.Graph().as_default():  # as in TF's own test: in eager mode TF fails later, at run time
        sp = random_sparse(rng, 4, 6)
        w = weights_like(rng, sp)
        for fn in (tco.safe_embedding_lookup_sparse, tf.nn.safe_embedding_lookup_sparse):
            with pytest.raises(TypeError):
                fn(parts, sp)  # shards of two dtypes
            with pytest.raises(ValueError):
                fn([tf.constant(p, tf.float64) for p in parts], sp, w)  # float64 tensors, float32 weights
            # numpy shards convert to the weights' dtype
            assert fn(parts, sp, w).dtype == tf.float32
    sp = random_sparse(rng, 4, 6)
    for fn in (tco.embedding_lookup_sparse, tf.nn.embedding_lookup_sparse):
        with pytest.raises(tf.errors.InvalidArgumentError, match="SparseSegmentMean"):  # TF's own, as TF computes it
            fn(tf.ones([6, 2], tf.int32), sp, None)
    with pytest.raises(TypeError, match="float16, bfloat16, float32 or float64"):
        tco.embedding_lookup_sparse(tf.ones([6, 2], tf.bool), sp, None)


# ---------------------------------------------------------------------------
# Ids: ragged, unordered


@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("default_id", [None, 2])
@pytest.mark.parametrize("weighted", [False, True])
def test_safe_lookup_takes_ragged_ids_like_tf(rng, combiner, default_id, weighted):
    params = tf.constant(rng.normal(size=(8, 3)).astype(np.float32))
    ids = tf.ragged.constant([[1, -1, 3], [], [-2], [5, 5, 0], [7]], tf.int64)
    w = tf.ragged.constant([[1.0, 2.0, 0.5], [], [1.0], [0.0, -1.0, 2.0], [3.0]]) if weighted else None
    for ours, theirs in ((tco.safe_embedding_lookup_sparse, tf.nn.safe_embedding_lookup_sparse),
                         (V1.safe_embedding_lookup_sparse, tf.compat.v1.nn.safe_embedding_lookup_sparse)):
        close(ours(params, ids, w, combiner=combiner, default_id=default_id),
              theirs(params, ids, w, combiner=combiner, default_id=default_id))


@pytest.mark.parametrize("rank", [2, 3])
def test_safe_lookup_takes_unordered_sparse_ids_like_tf(rng, rank):
    params = tf.Variable(rng.normal(size=(10, 3)).astype(np.float32))
    sp = random_sparse(rng, 12, 10, negative=True)
    if rank == 3:
        sp = tf.sparse.reshape(sp, [6, 2, 4])
    perm = rng.permutation(int(sp.values.shape[0]))
    shuffled = tf.SparseTensor(tf.gather(sp.indices, perm), tf.gather(sp.values, perm), sp.dense_shape)
    w = weights_like(rng, shuffled, low=-0.5)
    for comb in COMBINERS:
        with tf.GradientTape(persistent=True) as tape:
            a = tco.safe_embedding_lookup_sparse(params, shuffled, w, combiner=comb, default_id=1)
            b = tf.nn.safe_embedding_lookup_sparse(params, shuffled, w, combiner=comb, default_id=1)
        close(a, b)
        close(tf.convert_to_tensor(tape.gradient(a, params)), tf.convert_to_tensor(tape.gradient(b, params)))


def test_unordered_ids_stay_an_error_where_tf_rejects_them():
    sp = tf.SparseTensor([[1, 0], [0, 0]], tf.constant([1, 2], tf.int64), [2, 1])
    with pytest.raises(tf.errors.InvalidArgumentError, match="sorted"):
        tco.embedding_lookup_sparse(tf.ones([3, 2]), sp, None)
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.nn.embedding_lookup_sparse(tf.ones([3, 2]), sp, None)


# ---------------------------------------------------------------------------
# Gradient indices


@pytest.mark.parametrize("safe", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("in_function", [False, True])
def test_gradient_indices_are_tfs_unique_first_appearance(rng, safe, weighted, in_function):
    params = tf.Variable(rng.normal(size=(9, 4)).astype(np.float32))
    sp = random_sparse(rng, 12, 9, max_len=5)  # many repeated ids
    w = weights_like(rng, sp) if weighted else None
    ours, theirs = ((tco.safe_embedding_lookup_sparse, tf.nn.safe_embedding_lookup_sparse) if safe
                    else (tco.embedding_lookup_sparse, tf.nn.embedding_lookup_sparse))

    def grad(fn):
        with tf.GradientTape() as tape:
            out = fn(params, sp, w, combiner="sqrtn")
        g = tape.gradient(out, params)
        return g.indices, g.values

    if in_function:
        grad = tf.function(grad)
    (ia, va), (ib, vb) = grad(ours), grad(theirs)
    np.testing.assert_array_equal(ia.numpy(), ib.numpy())
    np.testing.assert_allclose(va.numpy(), vb.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [tf.float16, tf.float32, tf.float64])
def test_kernel_merged_gradient_rows_equal_the_python_merge(rng, dtype):
    """The CPU grad kernel merges rows itself; the GPU kernel leaves one row per
    id and the gradient function merges them with tf.unique: both the same."""
    from tf_ctr_ops import ops

    params = tf.Variable(tf.cast(rng.normal(size=(40, 2, 3)), dtype))
    sp = random_sparse(rng, 30, 40, max_len=8)
    w = weights_like(rng, sp)
    grads = {}
    for order in ("per_id", "first_appearance"):
        with tf.GradientTape() as tape:
            out = ops._lookup(ops.read_table(params), sp.values, sp.indices[:, 0], -1, w.values,
                              segment_kind="row_ids", combiner="sqrtn", default_id=3, grad_indices=order)
            loss = tf.reduce_sum(out * tf.cast(tf.range(tf.size(out)), dtype)[:, None, None][:tf.shape(out)[0]])
        grads[order] = tape.gradient(loss, params)
    python_values, python_indices = ops._merge_grad_rows(grads["per_id"].values, grads["per_id"].indices)
    np.testing.assert_array_equal(grads["first_appearance"].indices.numpy(), python_indices.numpy())
    tol = 1e-2 if dtype == tf.float16 else 1e-5
    close(grads["first_appearance"].values, python_values, tol=tol)
    assert len(set(python_indices.numpy())) == len(python_indices.numpy())


@pytest.mark.parametrize("safe", [False, True])
def test_merged_gradient_rows_of_a_large_table_are_tfs(rng, safe):
    """Thousands of distinct rows, consecutive and strided by powers of two
    (ids that cluster in a power-of-two table unless mixed), repeated within
    and across bags: the kernel's first-appearance numbering against TF's."""
    vocab = 1 << 20
    pool = np.concatenate([np.arange(3000), np.arange(1, 3000) * 4096, rng.integers(0, vocab, 3000)]) % vocab
    lengths = rng.integers(0, 40, 800)
    values = rng.choice(pool, size=int(lengths.sum())).astype(np.int64)
    rows = np.repeat(np.arange(len(lengths)), lengths)
    cols = np.concatenate([np.arange(n) for n in lengths])
    sp = tf.SparseTensor(np.stack([rows, cols], 1).astype(np.int64), values, [len(lengths), 40])
    params = tf.Variable(rng.normal(size=(vocab, 2)).astype(np.float32))

    def grad(fn):
        with tf.GradientTape() as tape:
            out = fn(params, sp, None, combiner="sqrtn")
            loss = tf.reduce_sum(out * tf.range(tf.size(out), dtype=tf.float32)[:, None][:tf.shape(out)[0]])
        return tape.gradient(loss, params)

    ours, theirs = ((grad(tco.safe_embedding_lookup_sparse), grad(tf.nn.safe_embedding_lookup_sparse)) if safe
                    else (grad(tco.embedding_lookup_sparse), grad(tf.nn.embedding_lookup_sparse)))
    assert ours.indices.shape[0] > 5000
    np.testing.assert_array_equal(ours.indices.numpy(), theirs.indices.numpy())
    np.testing.assert_allclose(ours.values.numpy(), theirs.values.numpy(), rtol=1e-5, atol=1e-5)


# TF's safe lookup without a default_id fills a bag left empty with id 0 and
# zeroes its output: its gradient lists row 0 (with zeros) where that id 0
# first appears, and a sparse optimizer update (momentum's) touches it.


def _ids_without_zero(rng, batch, vocab, ragged=False):
    lengths = rng.integers(0, 4, size=batch)
    lengths[[2, 5]] = 0
    ids = rng.integers(1, vocab, size=int(lengths.sum()))
    if ragged:
        return tf.RaggedTensor.from_row_lengths(tf.constant(ids, tf.int64), lengths)
    idx = [(r, c) for r in range(batch) for c in range(lengths[r])]
    return tf.SparseTensor(np.array(idx, np.int64).reshape(-1, 2), tf.constant(ids, tf.int64), [batch, 4])


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("max_norm", [None, 0.5])
@pytest.mark.parametrize("ragged", [False, True])
def test_safe_lookup_gradient_lists_row_0_for_empty_bags_as_tf(rng, weighted, combiner, max_norm, ragged):
    params = tf.Variable(rng.normal(size=(30, 3)).astype(np.float32))
    ids = _ids_without_zero(rng, 10, 30, ragged)
    w = None
    if weighted:
        w = (tf.RaggedTensor.from_row_splits(tf.random.uniform([tf.size(ids.values)], 0.1, 2.0), ids.row_splits)
             if ragged else weights_like(rng, ids))

    def grad(fn):
        with tf.GradientTape() as tape:
            out = fn(params, ids, w, combiner=combiner, max_norm=max_norm)
            loss = tf.reduce_sum(out * tf.range(tf.size(out), dtype=tf.float32)[:, None][:tf.shape(out)[0]])
        return tape.gradient(loss, params)

    ours, theirs = grad(tco.safe_embedding_lookup_sparse), grad(tf.nn.safe_embedding_lookup_sparse)
    assert 0 in theirs.indices.numpy()
    np.testing.assert_array_equal(ours.indices.numpy(), theirs.indices.numpy())
    np.testing.assert_allclose(ours.values.numpy(), theirs.values.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("strategy", ["mod", "div"])
def test_safe_lookup_gradient_of_shards_lists_id_0_for_empty_bags_as_tf(rng, strategy):
    full = rng.normal(size=(13, 3)).astype(np.float32)
    shards = [tf.Variable(s) for s in shards_of(full, 3, strategy)]
    sp = _ids_without_zero(rng, 10, 13)

    def grad(fn):
        with tf.GradientTape() as tape:
            out = fn(shards, sp, None, partition_strategy=strategy)
        return tape.gradient(out, shards)

    ours, theirs = grad(V1.safe_embedding_lookup_sparse), grad(tf.compat.v1.nn.safe_embedding_lookup_sparse)
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(a.indices.numpy(), b.indices.numpy())
        np.testing.assert_allclose(a.values.numpy(), b.values.numpy(), rtol=1e-5, atol=1e-6)


def test_momentum_training_through_the_safe_lookup_follows_tf(rng):
    """TF1 MomentumOptimizer updates only the rows a sparse gradient lists:
    row 0, listed for the empty bags, keeps moving with its momentum."""
    init = rng.normal(size=(20, 4)).astype(np.float32)
    batches = [_ids_without_zero(rng, 8, 20) for _ in range(3)]
    first = tf.SparseTensor([[0, 0], [1, 0]], tf.constant([0, 3], tf.int64), [8, 4])  # row 0 gets momentum

    def train(lookup):
        table = tf.Variable(init)
        opt = tf.compat.v1.train.MomentumOptimizer(0.1, momentum=0.9)
        for sp in [first] + batches:
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.square(lookup(table, sp, None) - 1.0))
            opt.apply_gradients([(tape.gradient(loss, table), table)])
        return table.numpy()

    theirs = train(tf.nn.safe_embedding_lookup_sparse)
    assert not np.allclose(theirs[0], init[0] - 0.1 * 2 * (init[0] - 1.0))  # row 0 moved after the first step
    np.testing.assert_allclose(train(tco.safe_embedding_lookup_sparse), theirs, rtol=1e-5, atol=1e-6)


def test_mod_shard_gradients_land_in_their_shards(rng):
    full = rng.normal(size=(13, 2)).astype(np.float32)
    shards = [tf.Variable(s) for s in shards_of(full, 5, "mod")]
    sp = random_sparse(rng, 8, 13)
    grads = []
    for fn in (V1.embedding_lookup_sparse, tf.compat.v1.nn.embedding_lookup_sparse):
        with tf.GradientTape() as tape:
            out = fn(shards, sp, None, combiner="mean")
        grads.append([tf.convert_to_tensor(g) for g in tape.gradient(out, shards)])
    for a, b in zip(*grads):
        close(a, b)


@pytest.mark.parametrize("strategy", ["mod", "div"])
@pytest.mark.parametrize("lookup,default_id", [("plain", None), ("safe", None), ("safe", 5)])
def test_shard_lists_are_gathered_shard_by_shard_as_tf(rng, strategy, lookup, default_id):
    """A list of variables is never read whole (a partitioned table on
    parameter servers would travel to the worker on every step): each shard
    gathers its own rows, and gets TF's IndexedSlices gradient, its rows
    listed in TF's order (a bag left empty lists the default or row 0 where
    TF's fill puts it)."""
    full = rng.normal(size=(13, 3)).astype(np.float32)
    shards = [tf.Variable(s) for s in shards_of(full, 3, strategy)]
    sp = random_sparse(rng, 12, 13, negative=lookup == "safe")
    if lookup == "safe":
        ours, theirs = V1.safe_embedding_lookup_sparse, tf.compat.v1.nn.safe_embedding_lookup_sparse
        kwargs = dict(default_id=default_id, partition_strategy=strategy)
    else:
        ours, theirs = V1.embedding_lookup_sparse, tf.compat.v1.nn.embedding_lookup_sparse
        kwargs = dict(partition_strategy=strategy)

    @tf.function
    def fused(sp):
        return ours(shards, sp, None, **kwargs)

    graph = fused.get_concrete_function(tf.SparseTensorSpec([None, None], tf.int64)).graph
    op_types = [op.type for op in graph.get_operations()]
    assert op_types.count("ResourceGather") == 3 and "ReadVariableOp" not in op_types, op_types

    def run(fn):
        with tf.GradientTape() as tape:
            out = fn()
            loss = tf.reduce_sum(out * tf.range(1, 1 + tf.size(out), dtype=tf.float32)[:, None][:tf.shape(out)[0]])
        return out, tape.gradient(loss, shards)

    (got, got_grads), (want, want_grads) = run(lambda: fused(sp)), run(lambda: theirs(shards, sp, None, **kwargs))
    close(got, want)
    for a, b in zip(got_grads, want_grads):
        assert isinstance(a, tf.IndexedSlices), type(a)
        np.testing.assert_array_equal(a.indices.numpy(), b.indices.numpy())
        np.testing.assert_allclose(a.values.numpy(), b.values.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("as_list", [False, True])
def test_captured_shards_keep_their_dtype_as_tf_finds_them(as_list):
    """Inside a tf.function, TF's conversion of a captured float16 tensor to
    the float64 weights' dtype returns it as it is: TF's safe lookup then
    pools in float16, and so do the drop-ins, on one table or a list."""
    full = np.arange(12, dtype=np.float32).reshape(4, 3)
    params = ([tf.constant(full[:2], tf.float16), tf.constant(full[2:], tf.float16)] if as_list
              else tf.constant(full, tf.float16))
    sp = tf.SparseTensor([[0, 0], [1, 0], [1, 1]], tf.constant([1, 3, 0], tf.int64), [2, 2])
    w = tf.SparseTensor(sp.indices, tf.constant([0.5, 2.0, 1.0], tf.float64), sp.dense_shape)
    ours = tf.function(lambda: tco.safe_embedding_lookup_sparse(params, sp, w))()
    theirs = tf.function(lambda: tf.nn.safe_embedding_lookup_sparse(params, sp, w))()
    close(ours, theirs, tol=1e-3)


@pytest.mark.parametrize("strategy", ["mod", "div"])
def test_tf1_partitioned_variable_is_gathered_beside_each_shard(rng, strategy):
    """In a TF1 graph (where a partitioner puts each shard on a parameter
    server), each shard's rows are gathered colocated with it, as TF's
    lookups gather them, and no shard is concatenated; the lookup and the
    shards' gradients are TF's."""
    full = rng.normal(size=(13, 4)).astype(np.float32)
    with tf.Graph().as_default() as graph, tf.compat.v1.Session() as sess:
        with tf.compat.v1.variable_scope("pv", use_resource=False):
            pv = tf.compat.v1.get_variable("table", shape=[13, 4], initializer=tf.constant(full),
                                           partitioner=tf.compat.v1.fixed_size_partitioner(3))
        sp = random_sparse(rng, 10, 13, negative=True)
        ours = V1.safe_embedding_lookup_sparse(pv, sp, partition_strategy=strategy, name="ours")
        theirs = tf.compat.v1.nn.safe_embedding_lookup_sparse(pv, sp, partition_strategy=strategy, name="theirs")
        ours_ops = [op for op in graph.get_operations() if op.name.startswith("ours/")]
        shard_names = {f"loc:@{v.op.name}".encode() for v in pv}
        gathers = [op for op in ours_ops if op.type == "GatherV2" and op.inputs[0].op.type == "Identity"]
        assert {g for op in gathers for g in op.colocation_groups()} == shard_names, gathers
        assert not [op for op in ours_ops if op.type == "ConcatV2" and
                    any(i.op.type == "Identity" and i.op.inputs[0].op.type == "VariableV2" for i in op.inputs)]
        weights = tf.constant(rng.uniform(size=(10, 1)).astype(np.float32))
        grads = [tf.gradients(tf.reduce_sum(out * weights), list(pv)) for out in (ours, theirs)]
        sess.run(tf.compat.v1.global_variables_initializer())
        (got, got_grads), (want, want_grads) = sess.run([(ours, grads[0]), (theirs, grads[1])])
    np.testing.assert_allclose(got, want, rtol=1e-6)
    for a, b in zip(got_grads, want_grads):
        np.testing.assert_array_equal(a.indices, b.indices)
        np.testing.assert_allclose(a.values, b.values, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------
# Arguments and early errors


def test_v2_signatures_take_allow_fast_lookup_and_name(rng):
    params = tf.constant(rng.normal(size=(6, 2)).astype(np.float32))
    sp = random_sparse(rng, 3, 6)
    for fast in (False, True):
        close(tco.embedding_lookup_sparse(params, sp, None, "sum", None, "lookup", fast),
              tf.nn.embedding_lookup_sparse(params, sp, None, "sum", None, "lookup", fast))
        close(tco.safe_embedding_lookup_sparse(params, sp, None, "sum", 1, None, "lookup", fast),
              tf.nn.safe_embedding_lookup_sparse(params, sp, None, "sum", 1, None, "lookup", fast))
    for fn in (tco.embedding_lookup_sparse, tf.nn.embedding_lookup_sparse):
        with pytest.raises(TypeError):
            fn(params, sp, None, partition_strategy="mod")


@pytest.mark.parametrize("v1", [False, True])
@pytest.mark.parametrize("table", ["one", "list", "partitioned"])
def test_the_output_is_named_as_tfs(v1, table):
    # TF1 graphs fetch embedding_lookup_sparse's output by the name given
    # (`foo:0`); ours was the fused op's inside the scope (a table in shards:
    # its concat's, foo/concat_1:0).
    names = []
    for module in ((tf.compat.v1.nn, tco.compat.v1) if v1 else (tf.nn, tco)):
        with tf.Graph().as_default():
            params = {"one": lambda: tf.ones([5, 2]), "list": lambda: [tf.ones([3, 2]), tf.ones([2, 2])],
                      "partitioned": lambda: tf.compat.v1.get_variable(
                          "t", [5, 2], partitioner=tf.compat.v1.fixed_size_partitioner(2))}[table]()
            ids = tf.compat.v1.sparse_placeholder(tf.int64, shape=[None, None])
            names.append(module.embedding_lookup_sparse(params, ids, None, name="foo").name)
    assert names == ["foo:0", "foo:0"]


def test_mismatched_weights_are_value_errors_at_construction():
    sp = tf.SparseTensor([[0, 0], [0, 1], [1, 0]], tf.constant([0, 1, 2], tf.int64), [2, 2])
    w = tf.SparseTensor([[0, 0], [0, 1]], [1.0, 2.0], [1, 2])
    rt, rw = tf.RaggedTensor.from_sparse(sp), tf.RaggedTensor.from_sparse(w)
    params = tf.ones([4, 2])
    for ours, theirs in ((tco.embedding_lookup_sparse, tf.nn.embedding_lookup_sparse),
                         (tco.safe_embedding_lookup_sparse, tf.nn.safe_embedding_lookup_sparse)):
        for ids, weights in ((sp, w), (rt, rw)):
            for fn in (ours, theirs):
                with pytest.raises(ValueError):
                    fn(params, ids, weights)
    for fn in (tco.embedding_lookup_sparse, tf.nn.embedding_lookup_sparse):
        with pytest.raises(TypeError):
            fn(params, sp, rw)  # weights of another container
        with pytest.raises(TypeError):
            fn(params, rt, w)


def _clipped_sums_and_table_grads(table, ids, safe):
    """(output, table gradient) of ours and TF's lookup of `ids` with
    max_norm=1, summed: the safe lookup, or TF1's embedding_lookup_sparse."""
    ours_fn = tco.safe_embedding_lookup_sparse if safe else tco.compat.v1.embedding_lookup_sparse
    tf_fn = tf.nn.safe_embedding_lookup_sparse if safe else tf.compat.v1.nn.embedding_lookup_sparse
    results = []
    for fn in (ours_fn, tf_fn):
        params = tf.Variable(table)
        with tf.GradientTape() as tape:
            out = fn(params, ids, None, combiner="sum", max_norm=1.0)
        results.append((out.numpy(), tf.convert_to_tensor(tape.gradient(out, params)).numpy()))
    return results


@pytest.mark.parametrize("row", [[-1.0], [0.6, 0.8]])
@pytest.mark.parametrize("safe", [True, False])
def test_max_norm_gradient_of_a_row_whose_norm_is_max_norm_is_tfs(row, safe):
    # tf.clip_by_norm's max(|x|, c) sends a tie's gradient through |x|: the
    # row is unchanged but its gradient is the clip's, not the identity.
    table = np.array([row, [0.1] * len(row)], np.float32)
    ids = tf.SparseTensor([[0, 0], [1, 0]], tf.constant([0, 1], tf.int64), [2, 1])
    (ours, ours_grad), (want, want_grad) = _clipped_sums_and_table_grads(table, ids, safe)
    np.testing.assert_allclose(ours, want, rtol=1e-6)
    np.testing.assert_allclose(ours_grad, want_grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("safe", [True, False])
def test_max_norm_gradient_of_a_row_whose_norm_overflows_float_is_tfs_zero(safe):
    """|x|^2 of a row of 1e20 overflows float32: the clip scales it to 0, and
    TF's gradient of that row is 0 too (it was NaN here: inf / inf)."""
    table = np.ones((3, 2), np.float32)
    table[1] = 1e20
    ids = tf.SparseTensor([[0, 0], [0, 1]], tf.constant([1, 2], tf.int64), [1, 2])
    (ours, ours_grad), (want, want_grad) = _clipped_sums_and_table_grads(table, ids, safe)
    np.testing.assert_allclose(ours, want, rtol=1e-6)
    assert np.isfinite(ours_grad).all(), ours_grad
    np.testing.assert_allclose(ours_grad, want_grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("v1", [False, True])
def test_safe_lookup_combiner_none_is_tfs_mean(rng, v1):
    table = tf.constant(rng.standard_normal((7, 3)).astype(np.float32))
    ids = tf.SparseTensor([[0, 0], [0, 1], [2, 0]], tf.constant([1, 2, 4], tf.int64), [3, 2])
    ours = (tco.compat.v1 if v1 else tco).safe_embedding_lookup_sparse(table, ids, None, combiner=None)
    want = (tf.compat.v1.nn if v1 else tf.nn).safe_embedding_lookup_sparse(table, ids, None, combiner=None)
    np.testing.assert_allclose(ours, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [tf.float32, tf.bool, tf.uint64])
def test_ids_that_do_not_widen_exactly_are_refused_as_tf_refuses_them(dtype):
    """TF's lookups refuse float, bool and unsigned ids; a cast would read
    row 1 for 1.7 and wrap NaN or 2**64 - 1 to negative ids the safe lookup drops."""
    table = tf.constant(np.arange(21, dtype=np.float32).reshape(7, 3))
    ids = tf.SparseTensor([[0, 0], [1, 0]], tf.cast(tf.constant([1, 0]), dtype), [2, 1])
    for fn in (tco.safe_embedding_lookup_sparse, tco.compat.v1.embedding_lookup_sparse):
        with pytest.raises(TypeError, match="ids must be integers that int64 holds"):
            fn(table, ids, None)
        with pytest.raises((TypeError, tf.errors.InvalidArgumentError)):
            (tf.nn.safe_embedding_lookup_sparse if fn is tco.safe_embedding_lookup_sparse
             else tf.compat.v1.nn.embedding_lookup_sparse)(table, ids, None)
    with pytest.raises(TypeError, match="ids must be integers that int64 holds"):
        tco.sparse_embedding(table, tf.ragged.constant([[1.5]], tf.float32))


@pytest.mark.parametrize("variable", [False, True])
def test_second_order_gradients_are_a_clear_error(rng, variable):
    # TF's composition is twice differentiable; ours raises, naming what is
    # missing, rather than TF's "gradient registry has no entry".
    params = rng.normal(size=(10, 3)).astype(np.float32)
    params = tf.Variable(params) if variable else tf.constant(params)
    ids = tf.ragged.constant([[1, 2], [3]], tf.int64).to_sparse()
    weights = tf.Variable([1.0, 2.0, 3.0])
    with tf.GradientTape() as outer:
        with tf.GradientTape() as inner:
            sp_weights = tf.SparseTensor(ids.indices, tf.convert_to_tensor(weights), ids.dense_shape)
            loss = tf.reduce_sum(tco.embedding_lookup_sparse(params, ids, sp_weights, combiner="mean") ** 2)
        penalty = tf.reduce_sum(inner.gradient(loss, weights) ** 2)
    with pytest.raises(NotImplementedError, match="second-order gradients"):
        outer.gradient(penalty, weights)


def _vocabulary_table():
    return tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(tf.constant(["a", "b"]), tf.constant([1, 2], tf.int64)), 0)


_FORWARD_MODE_CASES = {
    # name: (fused, TF-native), each of (vocabulary table, params)
    "vocab_embedding": (lambda t, p: tco.vocab_embedding(t, [["a"], ["b"], ["x"]], p),
                        lambda t, p: tf.gather(p, t.lookup(tf.constant([["a"], ["b"], ["x"]])))),
    "vocab_multi_hot": (lambda t, p: tco.vocab_multi_hot(t, [["a", "b"], ["x", "a"]], p),
                        lambda t, p: tf.matmul(tf.math.bincount(t.lookup(tf.constant([["a", "b"], ["x", "a"]])),
                                                                minlength=6, maxlength=6, binary_output=True,
                                                                axis=-1, dtype=p.dtype), p)),
    "multi_hot_dense": (lambda t, p: tco.multi_hot_dense([([[2], [0]], 6)], p),
                        lambda t, p: tf.matmul(tf.one_hot([2, 0], 6, dtype=p.dtype), p)),
}


@pytest.mark.parametrize("name", sorted(_FORWARD_MODE_CASES))
@pytest.mark.parametrize("in_function", [False, True])
def test_forward_mode_of_ops_linear_in_the_table_matches_tf(rng, name, in_function):
    # TF's generic JVP also asks for the gradient of the table handle, which
    # has none, and failed with a TypeError from inside TF.
    fused, native = _FORWARD_MODE_CASES[name]
    table, params = _vocabulary_table(), tf.Variable(rng.normal(size=(6, 3)).astype(np.float32))
    tangent = tf.constant(rng.normal(size=(6, 3)).astype(np.float32))

    def jvp(fn):
        with tf.autodiff.ForwardAccumulator(params, tangent) as acc:
            y = fn(table, params)
        return acc.jvp(y)

    if in_function:
        jvp = tf.function(jvp)
    expected = jvp(native)
    np.testing.assert_allclose(jvp(fused), expected, rtol=1e-6, atol=1e-6)
    assert np.abs(expected).sum() > 0


def test_forward_mode_of_a_pooled_lookup_is_a_clear_error(rng):
    params = tf.Variable(rng.normal(size=(6, 3)).astype(np.float32))
    with pytest.raises(NotImplementedError, match="forward-mode differentiation"):
        with tf.autodiff.ForwardAccumulator(params, tf.ones([6, 3])):
            tco.sparse_embedding(params, tf.ragged.constant([[1, 2], [3]], tf.int64))


def _gradient_form(g):
    """A table gradient as (form, indices, values): dense tensors have no indices."""
    if isinstance(g, tf.IndexedSlices):
        return "slices", np.asarray(g.indices), np.asarray(g.values)
    return "dense", None, np.asarray(g)


@pytest.mark.parametrize("fname", ["embedding_lookup_sparse", "safe_embedding_lookup_sparse"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("fast", [False, True])
def test_allow_fast_lookup_gives_a_tensor_table_the_gradient_form_tf_gives(rng, fname, weighted, fast):
    """With allow_fast_lookup TF skips Unique for a table that reaches it as a
    tensor: its gradient is then dense (unweighted) or one row per id
    (weighted), which optimizers and clip_by_global_norm see. The drop-ins
    give the same form and rows; a resource variable's stays unique rows."""
    params = rng.normal(size=(10, 3)).astype(np.float32)
    sp = tf.SparseTensor([[0, 0], [0, 1], [2, 0], [2, 1], [3, 0]], tf.constant([3, 5, 3, 9, 3], tf.int64), [5, 2])
    w = tf.SparseTensor(sp.indices, tf.constant([0.5, 2.0, 1.0, -1.0, 3.0]), sp.dense_shape) if weighted else None
    scale = np.arange(15, dtype=np.float32).reshape(5, 3)

    def gradient(module, table):
        with tf.GradientTape() as tape:
            tape.watch(table)
            out = getattr(module, fname)(table, sp, w, combiner="mean", allow_fast_lookup=fast)
            loss = tf.reduce_sum(out * scale[:out.shape[0]])
        return _gradient_form(tape.gradient(loss, table))

    want, got = gradient(tf.nn, tf.constant(params)), gradient(tco, tf.constant(params))
    assert got[0] == want[0] == ("dense" if fast and not weighted else "slices")
    if fast and weighted:  # TF's rows, in TF's order
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_allclose(got[2], want[2], rtol=1e-6)
    dense = [tf.convert_to_tensor(tf.IndexedSlices(v, i, [10, 3])) if f == "slices" else v for f, i, v in (want, got)]
    np.testing.assert_allclose(dense[1], dense[0], rtol=1e-6, atol=1e-6)
    variable = tf.Variable(params)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(getattr(tco, fname)(variable, sp, w, combiner="mean", allow_fast_lookup=fast))
    assert isinstance(tape.gradient(loss, variable), tf.IndexedSlices)


def test_allow_fast_lookup_trains_a_tf1_ref_variable_as_tf_does(rng):
    """A TF1 RefVariable reaches TF's lookup as a tensor: with
    allow_fast_lookup its unweighted gradient is dense, so Ftrl's l1 updates
    every row (zeroing the untouched ones), as it does with TF's lookup."""
    params = rng.normal(size=(6, 2)).astype(np.float32)
    results = []
    for lookup in (tf.compat.v1.nn.embedding_lookup_sparse, tco.compat.v1.embedding_lookup_sparse):
        with tf.Graph().as_default():
            table = tf.compat.v1.get_variable("t", initializer=params, use_resource=False)
            sp = tf.SparseTensor([[0, 0], [1, 0]], tf.constant([1, 3], tf.int64), [2, 1])
            loss = tf.reduce_sum(lookup(table, sp, None, combiner="sum", allow_fast_lookup=True))
            step = tf.compat.v1.train.FtrlOptimizer(0.1, l1_regularization_strength=0.01).minimize(loss)
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                for _ in range(2):
                    sess.run(step)
                results.append(sess.run(table))
    np.testing.assert_allclose(results[1], results[0], rtol=1e-5, atol=1e-6)

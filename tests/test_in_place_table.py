"""Fused lookups read a variable table in place (CtrResourceEmbeddingLookup).

A lookup that read its table variable with ReadVariableOp would make the
optimizer's next sparse update copy the whole table (docs/ops.md); these
tests pin down that variables take the in-place op, that it gives what the
tensor op gives (values and gradients, before and after sparse updates),
and that training with it matches TF's own lookups step for step.
"""

import threading

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_ctr_ops as tco
from tf_ctr_ops import layers as tco_layers
from tf_ctr_ops import ops as tco_ops

V, D = 40, 6


def _ops_in(fn, *specs):
    graph = tf.function(fn).get_concrete_function(*specs).graph
    return [op.type for op in graph.get_operations()]


def _bags(rng, batch=9, max_len=5, low=-1, high=V):
    lengths = rng.integers(0, max_len + 1, batch)
    values = rng.integers(low, high, int(lengths.sum()))
    return tf.RaggedTensor.from_row_lengths(tf.constant(values, tf.int64), tf.constant(lengths, tf.int64))


@pytest.mark.parametrize("wrap", ["tf", "keras"])
def test_variables_take_the_in_place_op(wrap):
    init = np.ones((V, D), np.float32)
    table = tf.Variable(init) if wrap == "tf" else keras.Variable(init)
    spec = tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1)
    types = _ops_in(lambda ids: tco.sparse_embedding(table, ids), spec)
    assert "CtrResourceEmbeddingLookup" in types and "CtrEmbeddingLookup" not in types
    assert "ReadVariableOp" not in types  # the table is never read densely
    # A tensor keeps the tensor op.
    types = _ops_in(lambda ids: tco.sparse_embedding(tf.constant(init), ids), spec)
    assert "CtrEmbeddingLookup" in types and "CtrResourceEmbeddingLookup" not in types


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64, tf.float16, tf.bfloat16])
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("id_dtype", [tf.int32, tf.int64])
def test_values_and_gradients_match_the_tensor_op(rng, dtype, combiner, id_dtype):
    init = rng.normal(size=(V, D)).astype(np.float32)
    var = tf.Variable(tf.cast(init, dtype))
    ids = _bags(rng)
    ids = ids.with_values(tf.cast(ids.values, id_dtype))
    weights = ids.with_values(tf.constant(rng.uniform(0.5, 2.0, ids.values.shape[0]), tf.float32))
    upstream = tf.constant(rng.normal(size=(ids.nrows(), D)), dtype)

    def run(table, source):
        with tf.GradientTape() as tape:
            tape.watch(source)
            out = tco.sparse_embedding(table, ids, weights, combiner=combiner, max_norm=1.5)
            loss = tf.reduce_sum(out * upstream)
        return out, tf.convert_to_tensor(tape.gradient(loss, source))

    const = tf.convert_to_tensor(var)
    out, grad = run(var, var)
    want_out, want_grad = run(const, const)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype in (tf.float32, tf.float64) else dict(rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(tf.cast(out, tf.float32), tf.cast(want_out, tf.float32), **tol)
    np.testing.assert_allclose(tf.cast(grad, tf.float32), tf.cast(want_grad, tf.float32), **tol)


class _LookupOwnTable(keras.layers.Layer):
    """A user's layer passing its own weight to a lookup, as layers that
    mix ours and TF's ops do."""

    def __init__(self, lookup, **kwargs):
        super().__init__(**kwargs)
        self.lookup = lookup

    def build(self, input_shape):
        self.table = self.add_weight(shape=(V, D), initializer="random_normal")

    def call(self, ids):
        return self.lookup(self.table, ids)


# TF's own lookups take a Keras variable's `value` (they read `.device`,
# which a Keras variable lacks); it is cast as the variable is in call().
AUTOCAST_LOOKUPS = {
    "embedding_lookup_sparse": (lambda t, ids: tco.embedding_lookup_sparse(t, ids.to_sparse(), None),
                                lambda t, ids: tf.nn.embedding_lookup_sparse(t.value, ids.to_sparse(), None)),
    "safe_embedding_lookup_sparse": (lambda t, ids: tco.safe_embedding_lookup_sparse(t, ids.to_sparse()),
                                     lambda t, ids: tf.nn.safe_embedding_lookup_sparse(t.value, ids.to_sparse())),
    "sparse_embedding": (lambda t, ids: tco.sparse_embedding(t, ids),
                         lambda t, ids: tf.nn.safe_embedding_lookup_sparse(t.value, ids.to_sparse())),
}


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("name", sorted(AUTOCAST_LOOKUPS))
def test_a_mixed_precision_layers_own_table_is_read_autocast(rng, policy, name):
    """Keras casts a mixed-precision layer's variables to its compute dtype
    in call(); a lookup of such a variable must give that dtype, as TF's
    lookup of the same variable does, and its gradient still reach the
    float32 variable's rows."""
    ours, theirs = AUTOCAST_LOOKUPS[name]
    ids = _bags(rng, low=0)
    layers = [_LookupOwnTable(ours, dtype=policy), _LookupOwnTable(theirs, dtype=policy)]
    for layer in layers:
        layer.build(None)
    layers[1].table.assign(layers[0].table)
    outs, grads = [], []
    for layer in layers:
        with tf.GradientTape() as tape:
            out = layer(ids)
            loss = tf.reduce_sum(tf.cast(out, tf.float32) ** 2)
        outs.append(out)
        grads.append(tape.gradient(loss, layer.trainable_variables[0]))
    assert outs[0].dtype == outs[1].dtype == layers[0].compute_dtype
    np.testing.assert_allclose(tf.cast(outs[0], tf.float32), tf.cast(outs[1], tf.float32), rtol=2e-2, atol=2e-2)
    assert grads[0] is not None and grads[0].dtype == tf.float32
    np.testing.assert_allclose(tf.convert_to_tensor(grads[0]), tf.convert_to_tensor(grads[1]), rtol=2e-2, atol=2e-2)


def test_reads_see_sparse_updates():
    # After scatter updates the variable is in copy-on-read mode; the op must
    # read the updated buffer, not a stale one.
    var = tf.Variable(np.zeros((V, D), np.float32))
    ids = tf.ragged.constant([[3], [3, 7], []], dtype=tf.int64)
    for step in range(1, 4):
        var.scatter_add(tf.IndexedSlices(tf.ones([2, D]), tf.constant([3, 7])))
        out = tco.sparse_embedding(var, ids, combiner="sum").numpy()
        np.testing.assert_array_equal(out[:, 0], [step, 2 * step, 0])


def test_sgd_training_matches_tf_lookups(rng):
    """Sparse SGD steps through the in-place op, against tf.nn.safe_embedding_lookup_sparse."""
    init = rng.normal(size=(V, D)).astype(np.float32)
    ours, theirs = tf.Variable(init), tf.Variable(init)
    opt_ours, opt_theirs = keras.optimizers.SGD(0.1), keras.optimizers.SGD(0.1)
    batches = [_bags(rng, low=0) for _ in range(5)]

    @tf.function
    def step(table, opt, ids, fused):
        with tf.GradientTape() as tape:
            if fused:
                out = tco.safe_embedding_lookup_sparse(table, ids.to_sparse(), combiner="sqrtn")
            else:
                out = tf.nn.safe_embedding_lookup_sparse(table, ids.to_sparse(), combiner="sqrtn")
            loss = tf.reduce_sum(tf.square(out - 1.0))
        grad = tape.gradient(loss, table)
        assert isinstance(grad, tf.IndexedSlices)
        opt.apply_gradients([(grad, table)])
        return loss

    for ids in batches:
        for _ in range(2):
            np.testing.assert_allclose(step(ours, opt_ours, ids, True), step(theirs, opt_theirs, ids, False),
                                       rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6)


def test_layer_under_adagrad_matches_keras_embedding(rng):
    """SparseEmbedding (one id per row, sum) trains as keras Embedding does, with Adagrad slots."""
    init = rng.normal(size=(V, D)).astype(np.float32)
    ids = tf.constant(rng.integers(0, V, (16, 1)))
    ours = tco_layers.SparseEmbedding(V, D, combiner="sum", embeddings_initializer=keras.initializers.Constant(init))
    theirs = keras.layers.Embedding(V, D, embeddings_initializer=keras.initializers.Constant(init))
    opts = keras.optimizers.Adagrad(0.5), keras.optimizers.Adagrad(0.5)
    for layer, opt, pool in ((ours, opts[0], False), (theirs, opts[1], True)):
        for _ in range(3):
            with tf.GradientTape() as tape:
                out = layer(ids)
                out = tf.reduce_sum(out, 1) if pool else out
                loss = tf.reduce_sum(tf.square(out - 0.5))
            opt.apply_gradients(zip(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables))
    np.testing.assert_allclose(ours.embeddings.numpy(), theirs.embeddings.numpy(), rtol=1e-5, atol=1e-6)


def test_uninitialized_variable_is_a_clear_error():
    with tf.Graph().as_default():
        var = tf.compat.v1.get_variable("t", [V, D], use_resource=True)
        out = tco.sparse_embedding(var, tf.ragged.constant([[1]], dtype=tf.int64))
        assert "CtrResourceEmbeddingLookup" in [op.type for op in tf.compat.v1.get_default_graph().get_operations()]
        with tf.compat.v1.Session() as sess:
            with pytest.raises(tf.errors.FailedPreconditionError, match="not initialized"):
                sess.run(out)


def test_raw_op_rejects_a_variable_of_another_dtype():
    var = tf.Variable(np.zeros((V, D), np.float64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="holds double, the op was built for float"):
        tco_ops._ops.ctr_resource_embedding_lookup(
            params=var.handle, T=tf.float32, ids=tf.constant([1], tf.int64), segments=tf.constant([0, 1], tf.int64),
            num_rows=tf.constant(-1, tf.int64), weights=tf.zeros([0]), segment_kind="row_splits")


def test_out_of_range_ids_name_row_and_id():
    var = tf.Variable(np.zeros((V, D), np.float32))
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"row 1.*\b{V + 2}\b|\b{V + 2}\b.*row 1"):
        tco.sparse_embedding(var, tf.ragged.constant([[1], [V + 2]], dtype=tf.int64))


def test_concurrent_lookups_and_scatter_updates():
    """Lookups run while an optimizer-style scatter updates the table.

    TF runs sparse updates of plain-data variables under the variable's
    shared lock (Hogwild), so a lookup, like ResourceGather, may see a row
    half updated: what must hold is that every read lies between the states
    before and after the updates, and that the table ends exact.
    """
    var = tf.Variable(np.zeros((V, D), np.float32))
    ids = tf.ragged.constant([list(range(V))], dtype=tf.int64)
    lookup = tf.function(lambda: tco.sparse_embedding(var, ids, combiner="sum"))
    update = tf.function(lambda: var.scatter_add(tf.IndexedSlices(tf.ones([V, D]), tf.range(V))))
    errors, steps = [], 50

    def read():
        try:
            for _ in range(steps):
                row = lookup().numpy()[0]
                if not np.all((row >= 0) & (row <= steps * V)):
                    errors.append(row)
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    readers = [threading.Thread(target=read) for _ in range(3)]
    for t in readers:
        t.start()
    for _ in range(steps):
        update()
    for t in readers:
        t.join()
    assert not errors, errors[:3]
    np.testing.assert_array_equal(lookup().numpy(), np.full((1, D), steps * V, np.float32))

"""Scenario "empty_grad" of tests/distribute_run.py: steps whose table
gradients have no rows on any replica: an all-padding batch of a
SparseEmbedding, and the first steps of a HashTableEmbedding that admits a key
on its third sighting. TF 2.21's collective all-gather of IndexedSlices
crashes the process on such gradients; the layers' gradients must not reach
it empty. And a step where only some replicas have no rows, under a TF1
momentum optimizer."""

import numpy as np


def run(strategy, out):
    """Trains both models under `strategy` (model.fit) and writes their float
    weights and the table's key -> vector map to out."""
    import keras

    from tf_ctr_ops import layers

    padding = np.full((8, 3), -1, np.int64)
    ids = np.array([[1, 2, -1], [3, -1, -1], [4, 5, 6], [7, -1, -1]] * 2, np.int64)
    fresh_keys = np.arange(100, 124, dtype=np.int64).reshape(8, 3)  # each key seen once
    labels = np.linspace(0.2, 1, 8, dtype=np.float32).reshape(8, 1)  # no zero-sum gradient for Adagrad to amplify
    results = {}
    for name, make, batches in (
            ("sparse", lambda: layers.SparseEmbedding(10, 4, combiner="mean"), (padding, ids, padding)),
            ("table", lambda: layers.HashTableEmbedding(4, 40, admit_after=3), (fresh_keys, ids, ids, ids))):
        keras.utils.set_random_seed(0)
        with strategy.scope():
            x = keras.Input(shape=(3,), dtype="int64")
            model = keras.Model(x, keras.layers.Dense(1, kernel_initializer="ones")(make()(x)))
            model.compile(keras.optimizers.Adagrad(0.5), "mse")
        for batch in batches:
            model.fit(batch, labels, batch_size=8, epochs=1, shuffle=False, verbose=0)
        # The table's bookkeeping (its clock, each key's last sighting) counts
        # every replica's call: what a key maps to is compared through export().
        for i, w in enumerate(model.get_weights()):
            if w.dtype.kind == "f":
                results[f"{name}{i}"] = w
        for layer in model.layers:
            if isinstance(layer, layers.HashTableEmbedding):
                keys, rows = (np.asarray(t) for t in layer.export())
                order = np.argsort(keys)
                results[f"{name}_keys"], results[f"{name}_rows"] = keys[order], rows[order]
    results["momentum_table"] = _momentum_beside_an_empty_replica(strategy)
    np.savez(out, **results)


def _momentum_beside_an_empty_replica(strategy):
    """A replica whose half of a batch has no id (all padding, or no example
    of an uneven last batch) beside one with rows: a TF1 sparse optimizer with
    momentum must not get a zero row 0 from it (row 0 has momentum here, so
    such a row would move it). Returns the trained table."""
    import tensorflow as tf

    import tf_ctr_ops as tco

    with strategy.scope():
        table = tf.Variable(np.random.default_rng(0).normal(size=(10, 3)).astype(np.float32))
        optimizer = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9)

    def replica_step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(tco.sparse_embedding(table, ids, combiner="sum") - 1.0))
        optimizer.apply_gradients([(tape.gradient(loss, table), table)])

    @tf.function
    def step(ids):
        strategy.run(replica_step, args=(ids,))

    for batch in (np.array([[0, 2], [3, -1], [4, 5], [6, 7]]), np.array([[1, 2], [3, 4], [-1, -1], [-1, -1]]),
                  np.array([[5, -1]])):
        if strategy.num_replicas_in_sync == 1:
            step(tf.constant(batch))
            continue
        for ids in strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices(batch).batch(len(batch))):
            step(ids)
    return table.numpy()

"""Scenario "subclassed" of tests/distribute_run.py: a HashTableEmbedding
inside a subclassed keras.Model trained by model.fit under MirroredStrategy,
against one replica. Keras builds such a model symbolically and creates its
variables afterwards, outside the layer's build: the key table must still be
one plain variable, not a copy per replica."""

import numpy as np

GLOBAL_BATCH = 16


def run(strategy, out):
    """Writes the table variable's type, its keys (sorted) and their vectors to out."""
    import keras

    from tf_ctr_ops import layers

    class Model(keras.Model):
        def __init__(self):
            super().__init__()
            self.table = layers.HashTableEmbedding(4, 64, combiner="sum", embeddings_initializer="zeros")
            self.head = keras.layers.Dense(1, kernel_initializer="ones")

        def call(self, x, training=False):
            return self.head(self.table(x, training=training))

    rng = np.random.default_rng(0)
    x = rng.integers(0, 40, size=(64, 3)).astype(np.int64)
    y = rng.uniform(size=(64, 1)).astype(np.float32)
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = Model()
        model.compile(keras.optimizers.SGD(0.1), "mse")
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0)
    keys, values = (np.asarray(t) for t in model.table.export())
    order = np.argsort(keys)
    variable = getattr(model.table.table, "value", model.table.table)
    np.savez(out, variable_type=type(variable).__name__, keys=keys[order], values=values[order])

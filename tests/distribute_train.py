"""Scenarios "layers" and "table" of tests/distribute_run.py: trains a small
CTR model built from tf_ctr_ops layers (model_kind "layers"), or one with a
HashTableEmbedding ("table").

Every run starts from the same weights and sees the same global batches in
the same order, so the trained weights must agree across strategies up to
float32 summation order. The embedding layers' table gradients are
IndexedSlices, which the strategies aggregate across replicas. Training is a
custom loop (strategy.run), the way tf.distribute documents it: Keras 3's
model.fit under a strategy averages the first batch across replicas to build
the model, which fails on any string input, ours or not.
Writes the final weights (and the per-epoch losses) to OUT.npz; under
MultiWorkerMirroredStrategy only the chief writes.
"""

import numpy as np
import tensorflow as tf

GLOBAL_BATCH, STEPS, DIM = 32, 8, 4


def data(seed=7):
    """(features, labels) of STEPS global batches."""
    rng = np.random.default_rng(seed)
    n = GLOBAL_BATCH * STEPS
    lengths = rng.integers(0, 5, size=n)
    item_ids = np.full((n, 4), -1, np.int64)  # dense, padded with -1
    for i, k in enumerate(lengths):
        item_ids[i, :k] = rng.integers(0, 50, size=k)
    users = rng.integers(0, 10**9, size=(n, 1)).astype(np.int64)
    genres = np.array(["|".join(f"g{g}" for g in rng.integers(0, 12, size=rng.integers(0, 3)))
                       for _ in range(n)], dtype=object).reshape(n, 1)
    labels = rng.integers(0, 2, size=(n, 1)).astype(np.float32)
    return {"item_ids": item_ids, "user": users, "genres": genres}, labels


def build_model():
    import keras

    from tf_ctr_ops import layers

    keras.utils.set_random_seed(3)
    item_ids = keras.Input((4,), dtype="int64", name="item_ids")
    user = keras.Input((1,), dtype="int64", name="user")
    genres = keras.Input((1,), dtype="string", name="genres")
    parts = [
        layers.SparseEmbedding(50, DIM, combiner="mean", name="items")(item_ids),
        layers.HashEmbedding(64, DIM, combiner="sum", name="users")(user),
        layers.StringEmbedding(32, DIM, delimiter="|", combiner="sqrtn", name="genres_emb")(
            keras.layers.Reshape(())(genres)),
    ]
    out = keras.layers.Dense(1, activation="sigmoid", name="ctr")(keras.layers.Concatenate()(parts))
    return keras.Model({"item_ids": item_ids, "user": user, "genres": genres}, out)


def build_table_model():
    """A HashTableEmbedding of raw user keys beside a SparseEmbedding. Its
    rows start at zero, so a key's vector does not depend on which row the
    replicas' inserts gave it: runs compare key -> vector (export())."""
    import keras

    from tf_ctr_ops import layers

    keras.utils.set_random_seed(3)
    item_ids = keras.Input((4,), dtype="int64", name="item_ids")
    user = keras.Input((1,), dtype="int64", name="user")
    parts = [
        layers.SparseEmbedding(50, DIM, combiner="mean", name="items")(item_ids),
        layers.HashTableEmbedding(DIM, capacity=GLOBAL_BATCH * STEPS, combiner="sum", embeddings_initializer="zeros",
                                  name="users")(user),
    ]
    out = keras.layers.Dense(1, activation="sigmoid", name="ctr")(keras.layers.Concatenate()(parts))
    return keras.Model({"item_ids": item_ids, "user": user}, out)



def train(strategy, mode, task, out, model_kind):
    """Trains under `strategy` (mode: single, mirrored or multiworker; task:
    this worker's index) and writes out (and, for the table, each worker's
    rows beside it)."""
    import keras

    x, y = data()
    if model_kind == "table":
        x = {"item_ids": x["item_ids"], "user": x["user"]}
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
    options = tf.data.Options()
    # Each worker reads every global batch and keeps its replicas' slices of
    # it, so the batches are the single-replica run's.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = strategy.experimental_distribute_dataset(dataset.with_options(options))
    with strategy.scope():
        model = build_table_model() if model_kind == "table" else build_model()
        optimizer = keras.optimizers.Adagrad(0.5)
        optimizer.build(model.trainable_variables)
    initial = {f"i{i}": np.asarray(w) for i, w in enumerate(model.get_weights())}

    def replica_step(features, labels):
        with tf.GradientTape() as tape:
            probs = model(features, training=True)
            per_example = keras.losses.binary_crossentropy(labels, probs)
            loss = tf.reduce_sum(per_example) / GLOBAL_BATCH  # the global batch's mean, summed over replicas
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def step(features, labels):
        losses = strategy.run(replica_step, args=(features, labels))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    history = {"loss": []}
    for _ in range(2):
        total = 0.0
        for features, labels in dataset:
            total += float(step(features, labels))
        history["loss"].append(total / STEPS)
    chief = task == 0
    if model_kind == "table":
        # Every worker writes the rows its own table copy gives the keys.
        from tf_ctr_ops import hash_table

        users = model.get_layer("users")
        keys = np.sort(np.asarray(users.export()[0]))
        rows = np.asarray(hash_table.find_rows(users, tf.constant(keys)))
        # A checkpoint of each worker's copy restores into a fresh model the
        # same rows and vectors.
        path = tf.train.Checkpoint(model=model).write(f"{out}.ckpt{task}/ckpt")
        with strategy.scope():
            restored = build_table_model()
        tf.train.Checkpoint(model=restored).read(path).assert_consumed()
        again = restored.get_layer("users")
        np.testing.assert_array_equal(np.asarray(hash_table.find_rows(again, tf.constant(keys))), rows)
        np.testing.assert_array_equal(np.asarray(again.export()[1]), np.asarray(users.export()[1]))
        np.save(f"{out}.rows{task}.npy", rows)
        if mode == "multiworker":  # a worker inserting outside its replicas would diverge
            try:
                with strategy.scope():
                    users(tf.constant([[12345]], tf.int64), training=True)
                raise SystemExit("an insert outside strategy.run was not refused")
            except RuntimeError as e:
                assert "inside strategy.run only" in str(e), e
    if chief and model_kind == "table":
        keys, values = (np.asarray(t) for t in users.export())
        order = np.argsort(keys)
        weights = {"w_items": model.get_layer("items").get_weights()[0], "w_ctr": model.get_layer("ctr").get_weights()[0],
                   "keys": keys[order], "user_vectors": values[order],
                   "table_size": int(users.statistics()["size"])}
        np.savez(out, loss=np.array(history["loss"]), replicas=strategy.num_replicas_in_sync, **weights)
    elif chief:
        weights = {f"w{i}": np.asarray(w) for i, w in enumerate(model.get_weights())}
        np.savez(out, loss=np.array(history["loss"]), replicas=strategy.num_replicas_in_sync, **weights,
                 **initial)

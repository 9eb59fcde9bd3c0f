"""The HashTableEmbedding Keras layer: trains with inserts (only touched rows
change), infers without, saves as .keras and exports a SavedModel served in a
fresh process."""

import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_ctr_ops.layers import HashTableEmbedding
from conftest import fresh_process_env, serve_in_fresh_process


def _keras_model(capacity=1000, admit_after=1):
    keys = keras.Input(shape=(None,), dtype="int64", name="keys")
    x = HashTableEmbedding(8, capacity=capacity, combiner="mean", admit_after=admit_after, name="ids")(keys)
    out = keras.layers.Dense(1, activation="sigmoid")(x)
    return keras.Model(keys, out)


def _click_data(rng, n=512):
    keys = rng.integers(0, 300, size=(n, 5)).astype(np.int64) * 1_000_003
    keys[rng.random(keys.shape) < 0.2] = -1
    labels = (keys[:, 0] % 2 == 0).astype(np.float32)
    return keys, labels


def test_keras_layer_trains_only_touched_rows_with_adam(rng):
    model = _keras_model()
    layer = model.get_layer("ids")
    keys, labels = _click_data(rng)
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="binary_crossentropy")
    before = layer.embeddings.numpy().copy()
    history = model.fit(keys, labels, batch_size=64, epochs=3, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    size = int(layer.statistics()["size"])
    assert size == np.unique(keys[keys != -1]).size
    after = layer.embeddings.numpy()
    assert not np.allclose(after[:size], before[:size])
    np.testing.assert_array_equal(after[size:], before[size:])  # rows no key owns are never updated
    frozen = int(layer.statistics()["size"])
    model.predict(np.array([[123456789, -1]], np.int64), verbose=0)
    assert int(layer.statistics()["size"]) == frozen, "inference must not insert"


_TF1_SERVE = """
import sys
import numpy as np
import tensorflow as tf
import tf_ctr_ops
tf.compat.v1.disable_eager_execution()
with tf.compat.v1.Session(graph=tf.Graph()) as sess:
    meta = tf.compat.v1.saved_model.loader.load(sess, ["serve"], sys.argv[1])
    sig = meta.signature_def["serving_default"]
    (name,) = sig.inputs
    (out,) = sig.outputs
    np.save(sys.argv[2] + "/served.npy", sess.run(sig.outputs[out].name,
                                                  {sig.inputs[name].name: np.load(sys.argv[2] + "/request.npy")}))
"""


def test_keras_layer_saves_and_exports(rng, tmp_path):
    model = _keras_model(admit_after=2)
    keys, labels = _click_data(rng, 256)
    model.compile(optimizer="adagrad", loss="binary_crossentropy")
    model.fit(keys, labels, batch_size=64, epochs=1, verbose=0)
    request = keys[:16]
    want = model.predict(request, verbose=0)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    np.testing.assert_allclose(loaded.predict(request, verbose=0), want, rtol=1e-5)
    assert loaded.get_layer("ids").get_config()["admit_after"] == 2
    model.export(str(tmp_path / "export"))
    got = serve_in_fresh_process(tmp_path / "export", "serve", {"keys": request}, tmp_path)
    np.testing.assert_allclose(next(iter(got.values())), want, rtol=1e-5)
    # TF1's loader is the C++ LoadSavedModel of the C API and TF Serving: it
    # restores the variables the functions were recorded to read.
    np.save(tmp_path / "request.npy", request)
    served = subprocess.run([sys.executable, "-c", _TF1_SERVE, str(tmp_path / "export"), str(tmp_path)],
                            cwd=tmp_path, env=fresh_process_env(), capture_output=True, text=True, timeout=300)
    assert served.returncode == 0, served.stdout + served.stderr
    np.testing.assert_allclose(np.load(tmp_path / "served.npy"), want, rtol=1e-5)


def test_checkpoint_restores_a_model_into_a_bigger_table(rng, tmp_path):
    import tensorflow as tf

    model = _keras_model(capacity=400)
    keys, labels = _click_data(rng, 256)
    model.compile(optimizer="adam", loss="binary_crossentropy")
    model.fit(keys, labels, batch_size=64, epochs=1, verbose=0)
    path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
    bigger = _keras_model(capacity=5000)
    tf.train.Checkpoint(model=bigger).restore(path).assert_existing_objects_matched()
    np.testing.assert_allclose(bigger.predict(keys, verbose=0), model.predict(keys, verbose=0), rtol=1e-6)
    assert int(bigger.get_layer("ids").statistics()["size"]) == int(model.get_layer("ids").statistics()["size"])
    bigger.compile(optimizer="adam", loss="binary_crossentropy")  # and trains on, inserting new keys
    bigger.fit(keys + 7, labels, batch_size=64, epochs=1, verbose=0)
    assert int(bigger.get_layer("ids").statistics()["size"]) > int(model.get_layer("ids").statistics()["size"])


@keras.saving.register_keras_serializable(package="tf_ctr_ops_tests")
class _Subclassed(keras.Model):
    def __init__(self, capacity, **kwargs):
        super().__init__(**kwargs)
        self.capacity = capacity
        self.ids = HashTableEmbedding(4, capacity, combiner="sum")

    def call(self, keys, training=None):
        return self.ids(keys, training=training)

    def get_config(self):
        return {"capacity": self.capacity}


@pytest.mark.parametrize("loaded", [False, True])
def test_checkpoint_restores_a_subclassed_model_into_a_bigger_table(tmp_path, loaded):
    # Keras builds a subclassed model's layers before their variables exist
    # (and a .keras load makes them after its symbolic build), so the
    # resizing restore was never taken over: "incompatible tensor".
    import tensorflow as tf

    keys = tf.reshape(tf.range(100, 140, dtype=tf.int64), [-1, 1])
    model = _Subclassed(64)
    model(keys, training=True)
    path = tf.train.Checkpoint(model=model).write(str(tmp_path / "ckpt"))
    bigger = _Subclassed(200)
    bigger(keys[:1])  # built as the docs ask, before the restore
    if loaded:
        bigger.save(tmp_path / "bigger.keras")
        bigger = keras.models.load_model(tmp_path / "bigger.keras")
    tf.train.Checkpoint(model=bigger).read(path).assert_consumed()
    np.testing.assert_array_equal(bigger(keys).numpy(), model(keys).numpy())
    assert int(bigger.ids.statistics()["size"]) == 40


def test_an_unbuilt_layer_saved_to_keras_loads(tmp_path):
    # Keras loads an unbuilt layer's (empty) variables too: the load read an
    # attribute only build set.
    model = keras.Sequential([HashTableEmbedding(4, 64), keras.layers.Dense(1)])  # no Input: not built
    model.save(tmp_path / "unbuilt.keras")
    loaded = keras.models.load_model(tmp_path / "unbuilt.keras")
    assert loaded.layers[0].capacity == 64 and not loaded.layers[0].built


def test_a_layer_refuses_a_checkpoint_of_the_other_key_dtype(tmp_path):
    import tensorflow as tf

    saved = HashTableEmbedding(4, capacity=10, key_dtype="string")
    saved(tf.constant([["a", "b"]]), training=True)
    path = tf.train.Checkpoint(layer=saved).save(str(tmp_path / "ckpt"))
    layer = HashTableEmbedding(4, capacity=20, key_dtype="int64")
    layer(tf.constant([[1, 2]], tf.int64))
    with pytest.raises(ValueError, match="holds string keys, this one takes int64 keys"):
        tf.train.Checkpoint(layer=layer).restore(path)
    assert layer.get_config()["key_dtype"] == "int64"


def test_a_refused_checkpoint_leaves_the_layer_as_it_was(tmp_path):
    # Of one capacity, TF would assign the saved embeddings before the
    # table's key kind is checked.
    import tensorflow as tf

    saved = HashTableEmbedding(2, capacity=16, key_dtype="string",
                               embeddings_initializer=keras.initializers.Constant(7.0))
    saved(tf.constant([["x"]]), training=True)
    path = tf.train.Checkpoint(layer=saved).save(str(tmp_path / "ckpt"))
    layer = HashTableEmbedding(2, capacity=16, embeddings_initializer=keras.initializers.Constant(1.0))
    keys = tf.constant([[5]], tf.int64)
    before = layer(keys, training=True).numpy()
    with pytest.raises(ValueError, match="holds string keys"):
        tf.train.Checkpoint(layer=layer).restore(path)
    np.testing.assert_array_equal(layer(keys).numpy(), before)
    np.testing.assert_array_equal(layer.embeddings.numpy(), 1.0)


def test_a_checkpoint_restored_before_the_layer_is_built_is_checked_too(tmp_path):
    # Restored before the build, Keras loads the weights in add_weight, before
    # the layer's restore hooks exist: an int64 table went into a string layer.
    import tensorflow as tf

    saved = HashTableEmbedding(4, capacity=10)
    saved(tf.constant([[11, 12]], tf.int64), training=True)
    path = tf.train.Checkpoint(layer=saved).save(str(tmp_path / "ckpt"))
    same = HashTableEmbedding(4, capacity=10)
    tf.train.Checkpoint(layer=same).restore(path)
    np.testing.assert_array_equal(same(tf.constant([[11, 12]], tf.int64)).numpy(),
                                  saved(tf.constant([[11, 12]], tf.int64)).numpy())
    other = HashTableEmbedding(4, capacity=10, key_dtype="string")
    tf.train.Checkpoint(layer=other).restore(path)
    with pytest.raises(ValueError, match="holds int64 keys, this one takes string keys"):
        other(tf.constant([["a"]]))


@pytest.mark.parametrize("how", ["checkpoint before the build", "checkpoint after the build", "weights.h5"])
def test_a_layer_without_eviction_gives_the_rows_an_evicting_layer_freed_fresh_values(tmp_path, how):
    """Each way an evicting layer's table reaches one that does not evict
    (a checkpoint restored before the build loads in add_weight, before the
    restore hooks exist; a weights file is assigned as it is): the rows its
    eviction freed start from the initializer, not from the evicted keys'."""
    import tensorflow as tf

    def model(eviction):
        keys = keras.Input(shape=(1,), dtype="int64")
        layer = HashTableEmbedding(2, capacity=64, eviction=eviction, name="e",
                                   embeddings_initializer=keras.initializers.Constant(0.5))
        return keras.Model(keys, layer(keys)), layer

    saved_model, saved = model("lru")
    saved(np.arange(64)[:, None], training=True)
    saved.embeddings.assign(tf.fill([64, 2], 9.0))
    saved(tf.constant([[1000]], tf.int64), training=True)  # evicts 64 / 16 rows: one to 1000, three stay free
    if how == "weights.h5":
        path = str(tmp_path / "m.weights.h5")
        saved_model.save_weights(path)
        target, layer = model("none")
        target.load_weights(path)
    else:
        path = tf.train.Checkpoint(layer=saved).save(str(tmp_path / "ckpt"))
        layer = HashTableEmbedding(2, capacity=64, embeddings_initializer=keras.initializers.Constant(0.5))
        if how == "checkpoint after the build":
            layer.build()
        tf.train.Checkpoint(layer=layer).restore(path)
    out = layer(tf.constant([[4000], [4001], [4002], [7]], tf.int64), training=True).numpy()
    np.testing.assert_array_equal(out, [[0.5, 0.5]] * 3 + [[9.0, 9.0]])


def test_a_weights_file_whose_freed_rows_cannot_be_reset_loads_nothing(tmp_path):
    import tensorflow as tf

    def model(eviction, initializer):
        keys = keras.Input(shape=(1,), dtype="int64")
        layer = HashTableEmbedding(2, capacity=64, eviction=eviction, name="e", embeddings_initializer=initializer)
        return keras.Model(keys, layer(keys)), layer

    saved_model, saved = model("lru", "zeros")
    saved(np.arange(64)[:, None], training=True)
    saved(tf.constant([[1000]], tf.int64), training=True)  # leaves three freed rows
    path = str(tmp_path / "m.weights.h5")
    saved_model.save_weights(path)
    calls = []

    def once(shape, dtype=None):  # gives the layer its values, then refuses
        calls.append(shape)
        if len(calls) > 1:
            raise ValueError("no more values")
        return tf.fill(shape, tf.constant(0.25, dtype))

    target, layer = model("none", once)
    before = layer.table.numpy(), layer.embeddings.numpy()
    with pytest.raises(ValueError, match="could not be given fresh values from its initializer.*no more values"):
        target.load_weights(path)
    np.testing.assert_array_equal(layer.table.numpy(), before[0])
    np.testing.assert_array_equal(layer.embeddings.numpy(), before[1])


@pytest.mark.parametrize("fmt", ["weights.h5", "keras"])
def test_keras_weight_files_of_the_other_key_kind_are_refused(tmp_path, fmt):
    # Keras assigns a weights file's arrays as they are: a string-key table
    # loaded into an int64-key layer without error, and found none of its keys.
    import tensorflow as tf

    def model(key_dtype):
        keys = keras.Input(shape=(2,), dtype=key_dtype)
        return keras.Model(keys, HashTableEmbedding(4, capacity=16, key_dtype=key_dtype, name="e")(keys))

    strings = model("string")
    strings.get_layer("e")(tf.constant([["a", "b"]]), training=True)
    ints = model("int64")
    ints.get_layer("e")(tf.constant([[1, 2]], tf.int64), training=True)
    path = str(tmp_path / f"m.{fmt}")
    (strings.save_weights if fmt == "weights.h5" else strings.save)(path)
    before = ints.get_layer("e").table.numpy()
    with pytest.raises(ValueError, match="holds string keys, this one takes int64 keys"):
        ints.load_weights(path)
    np.testing.assert_array_equal(ints.get_layer("e").table.numpy(), before)
    same = model("string")
    same.load_weights(path)
    np.testing.assert_array_equal(same.get_layer("e").table.numpy(), strings.get_layer("e").table.numpy())


def test_layer_config_errors():
    with pytest.raises(ValueError, match="capacity"):
        HashTableEmbedding(4, capacity=0)
    with pytest.raises(ValueError, match="combiner"):
        HashTableEmbedding(4, capacity=10, combiner="max")
    with pytest.raises(ValueError, match="table_device"):
        HashTableEmbedding(4, capacity=10, table_device="TPU:0")


def test_statistics_and_export_of_an_unbuilt_layer_say_to_build_it():
    layer = HashTableEmbedding(2, capacity=3)
    for method in (layer.statistics, layer.export):
        with pytest.raises(RuntimeError, match="call the layer .* first"):
            method()
    layer(tf.constant([[5]], tf.int64))
    assert int(layer.statistics()["size"]) == 0  # a call outside training inserts nothing
    assert layer.export()[0].shape == (0,)


def test_numpy_sizes_are_taken_as_ints():
    layer = HashTableEmbedding(np.int64(4), capacity=np.int32(10))
    config = layer.get_config()
    assert (config["output_dim"], config["capacity"]) == (4, 10)
    assert type(config["output_dim"]) is int and type(config["capacity"]) is int
    with pytest.raises(ValueError, match="output_dim"):
        HashTableEmbedding(np.float64(4.0), capacity=10)


def test_slots_weights_must_be_one_per_feature():
    layer = HashTableEmbedding(2, capacity=16)
    ids = np.array([[1, 2], [3, -1]], np.int64)
    with pytest.raises(ValueError, match="list of 2 .one per feature"):
        layer([ids, ids], weights=np.ones([2, 2], np.float32), training=True)
    assert int(layer.statistics()["size"]) == 0


def test_the_table_device_round_trips_through_the_config():
    layer = HashTableEmbedding(4, capacity=10, table_device="/gpu:0")
    config = layer.get_config()
    assert config["table_device"] == "/device:GPU:0"
    assert HashTableEmbedding.from_config(config).table_device == "/device:GPU:0"
    assert HashTableEmbedding(4, capacity=10).get_config()["table_device"] == "/device:CPU:0"


def test_keras_layer_evicts_while_training(rng):
    keys = keras.Input(shape=(None,), dtype="int64", name="keys")
    layer = HashTableEmbedding(4, capacity=64, eviction="lfu", embeddings_initializer="zeros", name="ids")
    model = keras.Model(keys, keras.layers.Dense(1, activation="sigmoid")(layer(keys)))
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy")
    layer.reset_slots_of(model.optimizer)
    data, labels = _click_data(rng, 512)  # 300 distinct keys into 64 rows
    model.fit(data, labels, batch_size=32, epochs=2, verbose=0)
    stats = {k: float(v) for k, v in layer.statistics().items()}
    assert stats["evicted"] > 0 and stats["size"] == 64
    kept, values = layer.export()
    assert np.unique(kept.numpy()).size == 64 and np.isfinite(values.numpy()).all()
    assert layer.get_config()["eviction"] == "lfu"


def test_slots_share_one_table_train_save_and_export(rng, tmp_path):
    """Two features (slots) through one layer: one table, the same rows as
    two calls of the layer, and .keras / SavedModel round trips."""
    user = keras.Input(shape=(None,), dtype="int64", name="user")
    item = keras.Input(shape=(None,), dtype="int64", name="item")
    layer = HashTableEmbedding(4, capacity=500, combiner="sum", name="ids")
    u, i = layer([user, item])
    assert u.shape == (None, 4) and i.shape == (None, 4)
    out = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Concatenate()([u, i]))
    model = keras.Model([user, item], out)
    keys, labels = _click_data(rng, 256)
    inputs = [keys[:, :3], keys[:, 3:] + 7]
    model.compile(optimizer="adagrad", loss="binary_crossentropy")
    model.fit(inputs, labels, batch_size=64, epochs=1, verbose=0)
    seen = np.concatenate([inputs[0].reshape(64 * 4, 3), inputs[1].reshape(64 * 4, 2)], 1)
    assert int(layer.statistics()["size"]) == np.unique(seen[seen != -1]).size
    # Inference: the slots read what one call per feature reads.
    request = [inputs[0][:16], inputs[1][:16]]
    np.testing.assert_allclose(layer(request[0]), model.get_layer("ids")(request)[0], rtol=1e-6)
    want = model.predict(request, verbose=0)
    model.save(tmp_path / "m.keras")
    np.testing.assert_allclose(keras.models.load_model(tmp_path / "m.keras").predict(request, verbose=0), want,
                               rtol=1e-5)
    model.export(str(tmp_path / "export"))
    got = serve_in_fresh_process(tmp_path / "export", "serve", {"user": request[0], "item": request[1]}, tmp_path)
    np.testing.assert_allclose(next(iter(got.values())), want, rtol=1e-5)


def test_a_frozen_layer_neither_inserts_nor_evicts_in_fit():
    # trainable=False froze the rows but fit still inserted new keys (and
    # evicted old ones, resetting their rows).
    ids = keras.Input(shape=(None,), dtype="int64")
    layer = HashTableEmbedding(4, capacity=4, eviction="lru")
    model = keras.Model(ids, keras.layers.Dense(1)(layer(ids)))
    layer(np.array([[1, 2, 3, 4]]), training=True)
    layer.trainable = False
    model.compile("sgd", "mse")
    before = [w.numpy().copy() for w in layer.weights]
    model.fit(np.array([[5, 6, 7, 8]] * 8), np.ones([8, 1]), batch_size=4, epochs=1, verbose=0)
    for w, b in zip(layer.weights, before):
        np.testing.assert_array_equal(w.numpy(), b)


@pytest.mark.parametrize("how", ["subclassed_fit", "first_call_in_a_function"])
def test_a_layer_first_built_while_a_function_traces_works(how):
    # The restore check read the table while a tf.function traced, before
    # its initializer had run: "slice index 6 of dimension 0 out of bounds".
    import tensorflow as tf

    class Model(keras.Model):
        def __init__(self):
            super().__init__()
            self.emb = HashTableEmbedding(4, capacity=16)
            self.out = keras.layers.Dense(1)

        def call(self, x, training=None):
            return self.out(self.emb(x, training=training))

    keys = np.array([[1, 2], [3, -1]] * 4)
    if how == "subclassed_fit":
        model = Model()
        model.compile("sgd", "mse")
        model.fit(keys, np.ones([8, 1]), batch_size=4, verbose=0)
        assert int(model.emb.statistics()["size"]) == 3
    else:
        layer = HashTableEmbedding(4, capacity=16)
        out = tf.function(lambda k: layer(k, training=True))(tf.constant(keys))
        assert out.shape == (8, 4) and int(layer.statistics()["size"]) == 3


def _shared_layer_step(how, initializer="zeros", new_keys=(1000,)):
    """One traced training step of a full evicting table read by a layer
    shared by two features. Returns (layer, rows of every key, the keys)."""
    import tensorflow as tf

    from tf_ctr_ops.hash_table import find_rows

    layer = HashTableEmbedding(1, capacity=16, eviction="lru", combiner="sum", embeddings_initializer=initializer)
    old = tf.constant(np.arange(16)[:, None], tf.int64)
    features = [old] + [tf.constant(start + np.arange(16)[:, None], tf.int64) for start in new_keys]
    layer(old, training=True)  # the table is full
    layer.embeddings.assign(tf.fill([16, 1], 3.0))
    optimizer = keras.optimizers.SGD(1.0)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            if how == "calls":
                outs = [layer(f, training=True) for f in features]
            elif how == "cond":  # the later calls in a tf.cond branch, a graph of its own
                outs = [layer(features[0], training=True)] + [
                    tf.cond(tf.constant(True), lambda f=f: layer(f, training=True), lambda: tf.zeros([16, 1]))
                    for f in features[1:]]
            else:
                outs = layer(features, training=True)
            loss = tf.add_n([tf.reduce_mean(o ** 2) for o in outs])
        optimizer.apply(tape.gradient(loss, [layer.embeddings]), [layer.embeddings])

    step()
    keys = tf.concat([tf.reshape(f, [-1]) for f in features], 0)
    return layer, find_rows(layer, keys).numpy(), keys


@pytest.mark.parametrize("how", ["calls", "cond"])
def test_a_layer_called_twice_in_one_step_never_evicts_what_its_first_call_read(how):
    # Each call was a step of its own: the second evicted the keys the first
    # had read and gave their rows to its new keys, so the first call's
    # gradient trained the new keys' rows. One traced step is one step, as
    # the slots form (one call on a list) makes it.
    layer, rows, _ = _shared_layer_step(how)
    slots_layer, slots_rows, _ = _shared_layer_step("slots")
    np.testing.assert_array_equal(rows, slots_rows)
    assert (rows[:16] >= 0).all() and (rows[16:] == -1).all()
    np.testing.assert_array_equal(layer.embeddings.numpy(), slots_layer.embeddings.numpy())
    np.testing.assert_allclose(layer.embeddings.numpy(), 3.0 - 2 * 3.0 / 16)


def test_each_call_of_a_step_draws_its_own_fresh_rows():
    # The calls of one step share its clock, which seeds the values of rows
    # handed to new keys: each call must still draw its own.
    import tensorflow as tf

    from tf_ctr_ops.hash_table import find_rows

    layer = HashTableEmbedding(4, capacity=16, eviction="lru", embeddings_initializer="uniform")
    layer(tf.constant(np.arange(16)[:, None], tf.int64), training=True)  # full, and a step behind

    @tf.function
    def step(a, b):
        return layer(a, training=True), layer(b, training=True)

    a, b = tf.constant([[100], [101]], tf.int64), tf.constant([[200], [201]], tf.int64)
    step(a, b)
    values = layer.embeddings.numpy()
    first, second = (values[find_rows(layer, tf.reshape(k, [-1])).numpy()] for k in (a, b))
    assert not np.isclose(first, second).any()


def _late_linked_adagrad_model():
    import tensorflow as tf

    keys = keras.Input(shape=(None,), dtype="int64")
    emb = HashTableEmbedding(2, capacity=16, eviction="lru", combiner="sum", name="emb")
    model = keras.Model(keys, keras.layers.Dense(1)(emb(keys)))
    model.compile(optimizer=keras.optimizers.Adagrad(0.1, initial_accumulator_value=0.1), loss="mse")
    y = np.ones((16, 1), np.float32)
    model.fit(tf.constant(np.arange(16).reshape(16, 1)), y, batch_size=16, verbose=0)  # traces the step; fills
    return model, emb, y


def _accumulator_of_the_reused_row(model, emb, y):
    import tensorflow as tf
    from tf_ctr_ops import hash_table

    (accumulator,) = [v for v in model.optimizer.variables if tuple(v.shape) == (16, 2)]
    accumulator.assign(np.full([16, 2], 100.0, np.float32))
    keys = np.arange(16).reshape(16, 1)
    keys[0, 0] = 100  # evicts key 0
    model.fit(tf.constant(keys), y, batch_size=16, verbose=0)
    assert int(emb.statistics()["evicted"]) == 1
    row = int(hash_table.find_rows(emb, tf.constant([100], tf.int64))[0])
    return accumulator.numpy()[row]


def test_an_optimizer_linked_after_the_first_fit_resets_slots_once_the_step_is_retraced():
    # The step the first fit traced resets the slots of the optimizer linked
    # then (none): as docs/hash_table.md says, a later link takes effect in a
    # retraced step, which make_train_function(force=True) or a new compile gives.
    model, emb, y = _late_linked_adagrad_model()
    emb.reset_slots_of(model.optimizer)
    model.make_train_function(force=True)
    assert (_accumulator_of_the_reused_row(model, emb, y) < 1).all()  # 0.1 + g**2: restarted

    model, emb, y = _late_linked_adagrad_model()
    model.compile(optimizer=keras.optimizers.Adagrad(0.1, initial_accumulator_value=0.1), loss="mse")
    model.fit(np.arange(16).reshape(16, 1), y, batch_size=16, verbose=0)  # builds the new optimizer's slots
    emb.reset_slots_of(model.optimizer)
    model.compile(optimizer=model.optimizer, loss="mse")  # fit retraces, reading the link
    assert (_accumulator_of_the_reused_row(model, emb, y) < 1).all()

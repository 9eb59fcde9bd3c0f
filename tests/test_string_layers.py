"""StringEmbedding / MultiStringEmbedding layers: equal to the TF composition,
trainable, serializable and exportable to a SavedModel served in a fresh process."""

import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_ctr_ops  # noqa: F401  (registers the layers)
from tf_ctr_ops.layers import MultiStringEmbedding, StringEmbedding
from conftest import fresh_process_env
from test_strings import composition


def id_strings(rng, n, vocab, delimiter=","):
    return [delimiter.join(str(v) for v in rng.integers(0, vocab, size=rng.integers(0, 6))) for _ in range(n)]


@pytest.mark.parametrize("id_mode", ["hash", "index", "mod"])
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_string_embedding_layer_matches_composition(rng, id_mode, combiner):
    layer = StringEmbedding(50, 4, delimiter="|", combiner=combiner, id_mode=id_mode)
    strings = tf.constant(id_strings(rng, 32, 50, "|"))
    got = layer(strings)
    want = composition(strings, tf.convert_to_tensor(layer.embeddings), delimiter="|", combiner=combiner,
                       id_mode=id_mode)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(layer(tf.reshape(strings, [-1, 1])).numpy(), got.numpy())


def test_multi_layer_equals_single_layers(rng):
    multi = MultiStringEmbedding([30, 100], [4, 6], delimiters=["|", ","], id_modes=["hash", "index"],
                                 combiners=["sum", "sqrtn"])
    feats = [tf.constant(id_strings(rng, 16, 30, "|")), tf.constant(id_strings(rng, 16, 100))]
    outs = multi(feats)
    for f, out, table, d, m, c in zip(feats, outs, multi.tables, ["|", ","], ["hash", "index"], ["sum", "sqrtn"]):
        want = composition(f, tf.convert_to_tensor(table), delimiter=d, id_mode=m, combiner=c)
        np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-6, atol=1e-6)


def test_multi_layer_concat_trains_saves_and_reloads(rng, tmp_path):
    """concat=True: one [B, 4 + 6] output equal to the concatenated list;
    trainable (sparse gradients reach both tables) and serializable."""
    kw = dict(delimiters=["|", ","], id_modes=["hash", "index"], combiners=["sum", "sqrtn"])
    multi = MultiStringEmbedding([30, 100], [4, 6], **kw)
    joined = MultiStringEmbedding([30, 100], [4, 6], concat=True, **kw)
    feats = [tf.constant(id_strings(rng, 16, 30, "|")), tf.constant(id_strings(rng, 16, 100))]
    multi(feats)
    joined(feats)
    for a, b in zip(joined.tables, multi.tables):
        a.assign(b)
    got = joined(feats)
    assert got.shape == (16, 10) and joined.compute_output_shape([(None,), (None,)]) == (None, 10)
    np.testing.assert_array_equal(got.numpy(), tf.concat(multi(feats), axis=1).numpy())
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(joined(feats) * tf.range(10, dtype=tf.float32))
    grads = tape.gradient(loss, joined.tables)
    with tf.GradientTape() as tape:
        want = tf.reduce_sum(tf.concat(multi(feats), axis=1) * tf.range(10, dtype=tf.float32))
    for g, w in zip(grads, tape.gradient(want, multi.tables)):
        assert isinstance(g, tf.IndexedSlices)
        np.testing.assert_allclose(tf.convert_to_tensor(g), tf.convert_to_tensor(w), rtol=1e-6, atol=1e-6)
    inputs = [keras.Input(shape=(), dtype="string", name=n) for n in ("a", "b")]
    model = keras.Model(inputs, joined(inputs))
    model.save(tmp_path / "m.keras")
    reloaded = keras.models.load_model(tmp_path / "m.keras")
    assert reloaded.layers[-1].get_config()["concat"] is True
    np.testing.assert_array_equal(reloaded(feats).numpy(), got.numpy())


def synthetic_genre_task(rng, n=2048):
    genres = np.array(["Action", "Comedy", "Drama", "Horror", "Romance", "SciFi"])
    good = {"Comedy", "Romance"}
    strings, labels = [], []
    for _ in range(n):
        picked = rng.choice(genres, size=rng.integers(1, 4), replace=False)
        strings.append("|".join(picked))
        labels.append(float(any(g in good for g in picked)))
    return np.array(strings, dtype=object), np.array(labels, np.float32)


def build_model():
    genres = keras.Input(shape=(), dtype="string", name="genres")
    history = keras.Input(shape=(), dtype="string", name="history")
    g = StringEmbedding(64, 8, delimiter="|", combiner="mean")(genres)
    h = MultiStringEmbedding([100], [4], id_modes="index")([history])[0]
    x = keras.layers.Concatenate()([g, h])
    out = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Dense(8, activation="relu")(x))
    return keras.Model([genres, history], out)


def test_fit_lowers_loss_with_sparse_gradients(rng):
    strings, labels = synthetic_genre_task(rng)
    history = np.array(id_strings(rng, len(strings), 100), dtype=object)
    model = build_model()
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="binary_crossentropy")
    x = {"genres": tf.constant(strings.astype(str)), "history": tf.constant(history.astype(str))}
    before = model.evaluate(x, labels, batch_size=512, verbose=0)
    model.fit(x, labels, epochs=4, batch_size=128, verbose=0)
    after = model.evaluate(x, labels, batch_size=512, verbose=0)
    assert after < 0.5 * before, (before, after)
    layer = model.layers[2] if isinstance(model.layers[2], StringEmbedding) else next(
        lyr for lyr in model.layers if isinstance(lyr, StringEmbedding))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model({"genres": x["genres"][:8], "history": x["history"][:8]}))
    grad = tape.gradient(loss, layer.embeddings)
    assert isinstance(grad, tf.IndexedSlices)


def test_keras_file_round_trip_and_fresh_process_export(rng, tmp_path):
    model = build_model()
    strings, _ = synthetic_genre_task(rng, 64)
    x = {"genres": tf.constant(strings.astype(str)), "history": tf.constant(id_strings(rng, 64, 100))}
    want = model(x).numpy()
    model.save(tmp_path / "m.keras")
    again = keras.models.load_model(tmp_path / "m.keras")
    np.testing.assert_array_equal(again(x).numpy(), want)
    cfg = StringEmbedding(10, 2, delimiter="::", id_mode="mod", skip_empty=False).get_config()
    assert StringEmbedding.from_config(cfg).get_config() == cfg

    model.export(str(tmp_path / "saved"))
    np.save(tmp_path / "genres.npy", strings.astype(str))
    np.save(tmp_path / "history.npy", x["history"].numpy().astype(str))
    np.save(tmp_path / "want.npy", want)
    script = textwrap.dedent(f"""
        import numpy as np, tensorflow as tf
        import tf_ctr_ops
        m = tf.saved_model.load({str(tmp_path / 'saved')!r})
        g = tf.constant(np.load({str(tmp_path / 'genres.npy')!r}))
        h = tf.constant(np.load({str(tmp_path / 'history.npy')!r}))
        out = m.serve([g, h]).numpy()
        np.testing.assert_allclose(out, np.load({str(tmp_path / "want.npy")!r}), rtol=1e-5, atol=1e-6)
        print("served", out.shape)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path,
                          env=fresh_process_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "served (64, 1)" in proc.stdout


def test_bad_layer_arguments():
    with pytest.raises(ValueError, match="delimiter"):
        StringEmbedding(10, 2, delimiter="")
    with pytest.raises(ValueError, match="id_mode"):
        StringEmbedding(10, 2, id_mode="parse")
    with pytest.raises(ValueError, match="one per feature"):
        MultiStringEmbedding([10, 20], [2, 2, 2])
    with pytest.raises(TypeError, match="`num_buckets` must be a list with one table size per feature, got int 10"):
        MultiStringEmbedding(10, 4)


@pytest.mark.parametrize("make", [lambda **kw: StringEmbedding(10, 4, **kw),
                                  lambda **kw: MultiStringEmbedding([10, 10], 4, **kw)])
def test_string_layers_refuse_float64_tables_when_built(make):
    """The string kernels have no float64 tables: refused by the layer's
    constructor, not by an op attribute at the first call."""
    with pytest.raises(ValueError, match="float32, float16 or bfloat16.*got float64"):
        make(dtype="float64")
    for dtype in ("float16", "bfloat16", "mixed_float16"):
        make(dtype=dtype)


@pytest.mark.parametrize("call", [
    lambda t: tf_ctr_ops.string_embedding(tf.constant(["1,2"]), t),
    lambda t: tf_ctr_ops.multi_string_embedding([tf.constant(["1,2"])], [t]),
    lambda t: tf_ctr_ops.multi_string_embedding([tf.constant(["1,2"])], [t], concat=True)])
def test_string_ops_name_the_table_dtypes_they_take(call):
    with pytest.raises(TypeError, match="float32, float16 or bfloat16, got float64"):
        call(tf.zeros([5, 2], tf.float64))


def test_multi_string_tables_are_in_a_tf_checkpoint(tmp_path):
    # Kept in a list, the tables were left out of tf.train.Checkpoint (the
    # checkpoint of custom training loops), and a restore kept fresh ones.
    s = tf.constant(["a,b", "c"])
    saved, restored = MultiStringEmbedding([10, 5], [4, 4]), MultiStringEmbedding([10, 5], [4, 4])
    want, _ = saved([s, s]), restored([s, s])
    path = tf.train.Checkpoint(layer=saved).write(str(tmp_path / "ckpt"))
    tf.train.Checkpoint(layer=restored).read(path).assert_consumed()
    for w, g in zip(want, restored([s, s])):
        np.testing.assert_array_equal(g.numpy(), w.numpy())
    assert [w.path for w in restored.weights] == [f"{restored.name}/embeddings_{i}" for i in range(2)]


def test_grouped_features_must_be_a_list_not_a_matrix():
    # A [B, N] matrix iterates row by row: with B == N it would pool example i
    # as feature i, silently.
    t0 = tf.constant(np.arange(20.).reshape(10, 2), tf.float32)
    t1 = tf.constant(np.arange(100, 110.).reshape(5, 2), tf.float32)
    matrix = tf.constant([["1", "2"], ["3", "4"]])
    with pytest.raises(TypeError, match=r"features must be a list .*tf.unstack"):
        tf_ctr_ops.multi_string_embedding(matrix, [t0, t1], id_modes="index")
    with pytest.raises(TypeError, match="tables must be a list"):
        tf_ctr_ops.multi_string_embedding([matrix[:, 0]], t0, id_modes="index")
    got = tf_ctr_ops.multi_string_embedding(tf.unstack(matrix, axis=1), [t0, t1], id_modes="index")
    np.testing.assert_array_equal(got[0], [[2, 3], [6, 7]])
    np.testing.assert_array_equal(got[1], [[104, 105], [108, 109]])


def test_grouped_layer_refuses_one_tensor_and_a_wrong_count_when_the_model_is_built():
    matrix = keras.Input(shape=(2,), dtype="string")
    with pytest.raises(TypeError, match=r"takes a list of 2 string tensors .*shape \(None, 2\)"):
        MultiStringEmbedding([10, 5], 2, id_modes="index")(matrix)
    one = keras.Input(shape=(), dtype="string")
    with pytest.raises(ValueError, match="expected 2 string features, got 1"):
        MultiStringEmbedding([10, 5], 2)([one])
    with pytest.raises(TypeError, match="takes a list of 2"):
        MultiStringEmbedding([10, 5], 2)(tf.constant([["1", "2"], ["3", "4"]]))


def test_grouped_tables_of_two_dtypes_name_them():
    tables = [tf.zeros([4, 2], tf.float32), tf.zeros([4, 2], tf.float16)]
    with pytest.raises(TypeError, match="table 0 is float32, table 1 is float16"):
        tf_ctr_ops.multi_string_embedding([tf.constant(["1"])] * 2, tables)


@pytest.mark.parametrize("make", [lambda d: StringEmbedding(10, 2, delimiter=d),
                                  lambda d: MultiStringEmbedding([10, 5], 2, delimiters=[d, None])],
                         ids=["single", "multi"])
def test_bytes_delimiters_save_and_load(tmp_path, make):
    strings = keras.Input(shape=(), dtype="string")
    layer = make(b"|")
    out = layer(strings) if isinstance(layer, StringEmbedding) else layer([strings, strings])
    model = keras.Model(strings, out)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    x = tf.constant(["1|2", "", "3"])
    for got, want in zip(tf.nest.flatten(loaded(x)), tf.nest.flatten(model(x))):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="must be UTF-8 text"):
        make(b"\xff")


def test_a_config_saved_with_keras_bytes_wrapper_loads():
    # What Keras wrote for a bytes delimiter before the layers kept text.
    config = StringEmbedding(10, 2, delimiter="|").get_config()
    config["delimiter"] = {"class_name": "__bytes__", "config": {"value": "|"}}
    assert StringEmbedding.from_config(config).delimiter == "|"


def test_string_gradient_of_a_table_of_int32_max_rows():
    # tf.shape's int32 output refuses the dim 2**31 - 1; TF's Gather gradient
    # reads it as int64 and casts, as the fused ops' gradients now do.
    table = tf.Variable(tf.zeros([2**31 - 1, 0]))
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(tf_ctr_ops.string_embedding(["1,2"], table, id_mode="index"))
    grad = tape.gradient(y, table)
    assert isinstance(grad, tf.IndexedSlices)
    assert list(grad.dense_shape.numpy()) == [2**31 - 1, 0]


def test_string_op_arguments_of_the_wrong_kind_are_clear(rng):
    params = tf.constant(rng.normal(size=(10, 2)).astype(np.float32))
    np.testing.assert_array_equal(tf_ctr_ops.string_embedding(["1|2"], params, delimiter=tf.constant("|")),
                                  tf_ctr_ops.string_embedding(["1|2"], params, delimiter="|"))
    with pytest.raises(TypeError, match="default_id must be an integer"):
        tf_ctr_ops.string_embedding(["1"], params, default_id=2.7)


def test_a_functional_model_of_inputs_of_another_shape_is_refused_at_construction():
    # Keras built such a model (its output shape ignores the input's rank),
    # and the first call failed.
    with pytest.raises(ValueError, match=r"takes a vector of strings \[B\] \(or \[B, 1\]\), got shape \(None, 2\)"):
        StringEmbedding(10, 2)(keras.Input(shape=(2,), dtype="string"))
    with pytest.raises(ValueError, match="takes a vector of strings"):
        MultiStringEmbedding([10, 10], [2, 3])([keras.Input(shape=(), dtype="string"),
                                                keras.Input(shape=(3, 1), dtype="string")])
    for shape in [(), (1,), (None,)]:  # [B], [B, 1], and [B, ?] checked at run time
        assert StringEmbedding(10, 2)(keras.Input(shape=shape, dtype="string")).shape == (None, 2)


def test_a_functional_model_of_ragged_or_sparse_strings_is_refused_at_construction():
    # Such a model was built, and its first call failed.
    for kind in ("ragged", "sparse"):
        x = keras.Input(shape=(None,), dtype="string", **{kind: True})
        with pytest.raises(TypeError, match=f"takes a dense vector of strings .* got a {kind} input"):
            StringEmbedding(10, 3)(x)
        with pytest.raises(TypeError, match=f"takes a dense vector of strings .* got a {kind} input"):
            MultiStringEmbedding([10], [3])([x])


def test_float_inputs_outside_keras_symbolic_pass_name_the_fix():
    # Exporting a subclassed model without an input_signature traces it on
    # float32: the error said only "strings must be a string tensor".
    for layer in (StringEmbedding(10, 2), MultiStringEmbedding([10], [2])):
        x = tf.constant([1.0, 2.0])
        with pytest.raises(TypeError, match=r"got float32 inputs: it takes strings.*dtype=\"string\".*tf\.string"):
            layer(x if isinstance(layer, StringEmbedding) else [x])


def test_concat_keeps_a_static_batch():
    # The concat op sees packed bytes: its output lost the features' batch.
    f = tf.function(lambda a, b, t: tf_ctr_ops.multi_string_embedding([a, b], [t, t], id_modes="hash", concat=True),
                    input_signature=[tf.TensorSpec([5], tf.string), tf.TensorSpec([None, 1], tf.string),
                                     tf.TensorSpec([10, 8])])
    assert f.get_concrete_function().structured_outputs.shape.as_list() == [5, 16]


def test_a_functional_model_of_non_string_inputs_is_refused_at_construction():
    for dtype in ("int64", "float32"):
        with pytest.raises(TypeError, match="takes string inputs, got .*dtype='string'"):
            keras.Model(*(lambda i: (i, StringEmbedding(10, 2)(i)))(keras.Input(shape=(), dtype=dtype)))
        inputs = [keras.Input(shape=(), dtype="string"), keras.Input(shape=(), dtype=dtype)]
        for concat in (False, True):
            with pytest.raises(TypeError, match="takes string inputs, got .*dtype='string'"):
                keras.Model(inputs, MultiStringEmbedding([10, 10], [2, 3], concat=concat)(inputs))

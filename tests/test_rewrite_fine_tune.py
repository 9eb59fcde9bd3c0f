"""Fine-tuning a rewritten SavedModel: the gradients of its fused ops have the
form of the TF subgraphs they replaced (hunt 127).

TF's sparse lookups (`embedding_lookup_sparse`, the safe lookup, feature
columns) gather through Unique, so their table gradient has one row per
distinct id, in order of first appearance; a gather has one row per id; a
segment reduction of the table itself is dense. A linear update (SGD) is the
same under every form, but Adagrad, Adam and Ftrl square or normalize each
row they are given: the fused op's gradient must list the rows as TF did, or
fine-tuning the rewritten model moves its tables away from the original's.
"""

import numpy as np
import pytest
import tensorflow as tf

import tf_ctr_ops  # noqa: F401  (the fused ops' kernels and gradients)
from tf_ctr_ops import rewrite

pytestmark = pytest.mark.saved_model

V, D, BUCKETS = 12, 3, 12
WORDS = ["a", "b", "c", "d", "e"]
TABLES = ["sparse", "weighted", "safe", "fast", "vocab", "cross", "hashed", "split", "safe_split", "joined_safe_split"]
OUTPUTS = ["sparse", "weighted", "safe", "fast", "vocab", "cross", "joined", "safe_split"]


class Lookups(tf.Module):
    """One table per lookup form; each output is a form TF users write."""

    def __init__(self):
        super().__init__()
        init = tf.random.stateless_uniform([V, D], seed=[1, 2], minval=-1.0, maxval=1.0)
        self.tables = {n: tf.Variable(init + i, name=n) for i, n in enumerate(TABLES)}
        keys = tf.constant(WORDS)
        self.vocab = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(keys, tf.range(5, dtype=tf.int64)),
                                               default_value=-1)

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.int64), tf.TensorSpec([None, 4], tf.float32),
                                  tf.TensorSpec([None, 4], tf.string), tf.TensorSpec([None], tf.string),
                                  tf.TensorSpec([None, 1], tf.string)])
    def serve(self, ids, weights, words, text, city):
        t = self.tables
        ragged = tf.RaggedTensor.from_tensor(ids, padding=-1)
        sp = ragged.to_sparse()
        sp_w = tf.RaggedTensor.from_tensor(weights, lengths=ragged.row_lengths()).to_sparse()
        # Ids with -1 padding and whole rows of it: the safe lookup drops them
        # and fills the empty rows with id 0, whose output it zeroes.
        padded = tf.sparse.from_dense(ids + 1)
        padded = tf.SparseTensor(padded.indices, padded.values - 1, padded.dense_shape)
        word_ids = self.vocab.lookup(tf.sparse.from_dense(words))
        tokens = tf.strings.split(text, "|")
        return {
            "sparse": tf.nn.embedding_lookup_sparse(t["sparse"], sp, None, combiner="sum"),
            "weighted": tf.nn.embedding_lookup_sparse(t["weighted"], sp, sp_w, combiner="sqrtn"),
            "safe": tf.nn.safe_embedding_lookup_sparse(t["safe"], padded, None, combiner="mean", max_norm=1.5),
            "fast": tf.nn.embedding_lookup_sparse(tf.identity(t["fast"]), sp, None, combiner="mean",
                                                  allow_fast_lookup=True),
            "vocab": tf.nn.safe_embedding_lookup_sparse(t["vocab"], word_ids, None, combiner="sum"),
            "cross": tf.nn.safe_embedding_lookup_sparse(
                t["cross"], tf.sparse.cross_hashed([tf.sparse.from_dense(words[:, :1]), city], BUCKETS), None,
                combiner="sum"),
            # A gather (one row per key), a split string's Unique-based lookup
            # and a safe one with empty rows, concatenated: one fused op of
            # three gradient forms.
            "joined": tf.concat([
                tf.nn.embedding_lookup(t["hashed"], tf.strings.to_hash_bucket_fast(text, BUCKETS)),
                tf.nn.embedding_lookup_sparse(t["split"], tf.strings.to_hash_bucket_fast(tokens, BUCKETS).to_sparse(),
                                              None, combiner="mean"),
                _safe_split_lookup(t["joined_safe_split"], text)], 1),
            "safe_split": _safe_split_lookup(t["safe_split"], text),
        }


def _safe_split_lookup(table, text):
    # TF1's split drops empty tokens: an empty string is an empty row.
    split = tf.compat.v1.string_split(text, "|")
    ids = tf.SparseTensor(split.indices, tf.strings.to_hash_bucket_fast(split.values, BUCKETS), split.dense_shape)
    return tf.nn.safe_embedding_lookup_sparse(table, ids, None, combiner="mean")


def _feeds(rng, batch):
    ids = rng.integers(0, V, size=(batch, 4))
    ids[rng.random((batch, 4)) < 0.3] = -1
    ids = -np.sort(-ids, axis=1)  # -1 padding at the end of each row
    ids[::5] = -1  # empty rows
    words = rng.choice(WORDS, size=(batch, 4))
    text = np.array(["|".join(rng.choice(WORDS, size=rng.integers(1, 5))) for _ in range(batch)], object)
    text[1::6] = ""  # a split of no token: the safe lookup's empty row
    return {"ids": tf.constant(ids, tf.int64), "weights": tf.constant(rng.random((batch, 4)) + 0.5, tf.float32),
            "words": tf.constant(words), "text": tf.constant(text),
            "city": tf.constant(rng.choice(["x", "y", "z"], size=(batch, 1)))}


def _gradients(path, feeds, out_weights):
    model = tf.saved_model.load(str(path))
    serve = model.signatures["serving_default"]
    with tf.GradientTape() as tape:
        outputs = serve(**feeds)
        loss = tf.add_n([tf.reduce_sum(outputs[k] * out_weights[k]) for k in sorted(outputs)])
    tables = {name: model.tables[name] for name in TABLES}
    return model, tables, dict(zip(tables, tape.gradient(loss, list(tables.values()))))


def _form(grad):
    if isinstance(grad, tf.IndexedSlices):
        return grad.indices.numpy().astype(np.int64), grad.values.numpy()
    return None, grad.numpy()


@pytest.fixture(scope="module")
def rewritten(tmp_path_factory):
    root = tmp_path_factory.mktemp("fine_tune")
    src, dst = root / "src", root / "dst"
    module = Lookups()
    tf.saved_model.save(module, str(src), signatures={"serving_default": module.serve})
    report = rewrite.optimize_saved_model(src, dst, runs=1, serving_device="cpu")
    return src, dst, report.signatures["serving_default"]


def test_every_form_fuses(rewritten):
    _, _, sig = rewritten
    assert sig.outputs_match
    fused = [m["fused_op"] for m in sig.matches]
    for op in ("CtrVocabEmbeddingLookup", "CtrCrossEmbeddingLookup", "CtrConcatStringTensorEmbedding",
               "CtrStringEmbedding"):
        assert op in fused, sig.matches
    after = sig.op_counts_after
    # (GatherV2s stay: the sparse bookkeeping of the inputs' padding.)
    assert not {"Unique", "SparseSegmentSum", "SparseSegmentMean", "SparseSegmentSqrtN", "ResourceGather"} & set(after), after


def test_gradients_have_the_original_form(rewritten, rng):
    src, dst, _ = rewritten
    feeds = _feeds(rng, 40)
    out_weights = {k: tf.constant(rng.standard_normal((40, 3 * D if k == "joined" else D)), tf.float32)
                   for k in OUTPUTS}
    _, _, native = _gradients(src, feeds, out_weights)
    _, _, fused = _gradients(dst, feeds, out_weights)
    assert set(native) == set(fused) and len(native) == len(TABLES)
    for name in native:
        want_indices, want_values = _form(native[name])
        got_indices, got_values = _form(fused[name])
        if want_indices is None:
            assert got_indices is None, name  # dense stays dense
        else:
            assert got_indices is not None, name
            np.testing.assert_array_equal(got_indices, want_indices, err_msg=name)
        np.testing.assert_allclose(got_values, want_values, rtol=1e-5, atol=1e-6, err_msg=name)
    # The forms themselves, so that a TF change to its graphs shows here.
    assert _form(native["fast"])[0] is None
    for name in ("sparse", "weighted", "safe", "vocab", "cross", "split", "safe_split", "joined_safe_split"):
        indices = _form(native[name])[0]
        assert len(np.unique(indices)) == len(indices), name
    for name in ("safe", "safe_split", "joined_safe_split"):
        assert 0 in _form(native[name])[0], name  # the empty rows' filled id
    hashed = _form(native["hashed"])[0]
    assert len(np.unique(hashed)) < len(hashed)


def _apply(optimizer, grads, variables):
    if optimizer.startswith("v1-"):  # TF1's sparse updates: a zero row still moves with momentum or Ftrl
        opt = {"v1-ftrl": lambda: tf.compat.v1.train.FtrlOptimizer(0.5),
               "v1-momentum": lambda: tf.compat.v1.train.MomentumOptimizer(0.5, 0.9)}[optimizer]()
    else:
        import keras

        opt = keras.optimizers.get({"class_name": optimizer, "config": {"learning_rate": 0.5}})
    for _ in range(2):
        opt.apply_gradients([(grads[k], variables[k]) for k in sorted(variables)])


@pytest.mark.parametrize("optimizer", ["adagrad", "adam", "ftrl", "v1-ftrl", "v1-momentum"])
def test_fine_tuning_moves_the_tables_as_the_original(rewritten, rng, optimizer):
    src, dst, _ = rewritten
    feeds = _feeds(rng, 25)
    out_weights = {k: tf.constant(rng.standard_normal((25, 3 * D if k == "joined" else D)), tf.float32)
                   for k in OUTPUTS}
    tables = []
    for path in (src, dst):
        model, variables, grads = _gradients(path, feeds, out_weights)
        _apply(optimizer, grads, variables)
        tables.append({k: v.numpy() for k, v in variables.items()})
    for name in tables[0]:
        np.testing.assert_allclose(tables[1][name], tables[0][name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_lone_safe_split_lists_its_empty_rows_filled_id(tmp_path):
    # One safe lookup of split strings stays a single CtrStringEmbedding (not
    # grouped): its gradient too names row 0 for the empty string's row.
    class Lone(tf.Module):
        def __init__(self):
            super().__init__()
            self.table = tf.Variable(tf.random.stateless_uniform([BUCKETS, D], seed=[3, 4]), name="table")

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def serve(self, text):
            return {"y": _safe_split_lookup(self.table, text)}

    module = Lone()
    src, dst = tmp_path / "src", tmp_path / "dst"
    tf.saved_model.save(module, str(src), signatures={"serving_default": module.serve})
    text = np.array(["a|b", "", "e|d|a", ""], object)
    report = rewrite.optimize_saved_model(src, dst, runs=1, serving_device="cpu",
                                          sample_inputs={"serving_default": {"text": text}})
    assert [m["fused_op"] for m in report.signatures["serving_default"].matches].count("CtrStringEmbedding") == 1
    grads = []
    for path in (src, dst):
        model = tf.saved_model.load(str(path))
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model.signatures["serving_default"](text=tf.constant(text))["y"])
        grads.append(tape.gradient(loss, model.table))
    np.testing.assert_array_equal(grads[1].indices.numpy(), grads[0].indices.numpy())
    np.testing.assert_allclose(grads[1].values.numpy(), grads[0].values.numpy(), rtol=1e-6, atol=1e-7)
    assert 0 in grads[0].indices.numpy()

"""The cross_lookup and bucketize_lookup patterns: hashed feature crosses and
bucketized columns feeding a fused sparse lookup (TF1 crossed_columns and
bucketized_columns under a linear model and an embedding column, as
census-style Wide & Deep models have them, TF2's safe_embedding_lookup_sparse
over tf.sparse.cross_hashed, and feature columns' own bucketized ids) become
CtrCrossEmbeddingLookup and CtrBucketizeEmbeddingLookup, served on the CPU.
The rewritten SavedModel is verified by the rewrite itself (which must have
compared), then loaded here and in a fresh process and compared again."""

import numpy as np
import pytest
import tensorflow as tf

import tf_ctr_ops  # noqa: F401
from test_rewrite_vocab_sparse import assert_serves_like_source, export_tf1_predict_model
from tf_ctr_ops import rewrite

EDUCATION = ["Bachelors", "Masters", "Doctorate", "HS-grad"]
AGE_BOUNDARIES = [18.0, 25.0, 30.0, 35.0, 40.0, 50.0, 65.0]


def save_census_model(path):
    """A TF1 census Wide & Deep as Estimators export it: base, bucketized and
    crossed columns (string x string, bucketized x string x string, a crossed
    integer column) in the linear part, and embeddings of a cross and of the
    bucketized column in the deep part, on serialized tf.Examples."""
    fc = tf.compat.v1.feature_column
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(5)
        serialized = tf.compat.v1.placeholder(tf.string, [None], name="examples")
        education = fc.categorical_column_with_vocabulary_list("education", EDUCATION)
        occupation = fc.categorical_column_with_hash_bucket("occupation", 100)
        age = fc.bucketized_column(fc.numeric_column("age"), AGE_BOUNDARIES)
        wide = [education, occupation, age,
                fc.crossed_column(["education", "occupation"], hash_bucket_size=1000),
                fc.crossed_column([age, "education", "occupation"], hash_bucket_size=1000),
                fc.crossed_column(["hours", "occupation"], hash_bucket_size=50)]
        deep = [fc.embedding_column(occupation, 4), fc.embedding_column(age, 2, combiner="sum"),
                fc.embedding_column(fc.crossed_column(["education", "occupation"], 300), 3, combiner="sqrtn")]
        spec = fc.make_parse_example_spec(wide + deep)
        spec["hours"] = tf.io.VarLenFeature(tf.int64)
        features = tf.compat.v1.io.parse_example(serialized, spec)
        linear = fc.linear_model(features, wide)
        net = fc.input_layer(features, deep)
        logits = tf.matmul(net, tf.compat.v1.get_variable("w", [net.shape[1], 1])) + linear
        export_tf1_predict_model(path, serialized, {"logits": logits, "linear": linear}, redraw_seed=1)


def examples(rng, n):
    """Census-like tf.Examples with missing features (rows with no crosses)
    and several occupations in some rows."""
    def strings(values):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v.encode() for v in values]))

    out = []
    for _ in range(n):
        f = {"age": tf.train.Feature(float_list=tf.train.FloatList(value=[float(rng.integers(15, 80))]))}
        if rng.random() < 0.9:
            f["education"] = strings([EDUCATION[rng.integers(0, 4)]])
        f["occupation"] = strings([f"job{rng.integers(0, 30)}" for _ in range(rng.integers(0, 3))])
        f["hours"] = tf.train.Feature(int64_list=tf.train.Int64List(value=list(rng.integers(1, 60, 1))))
        out.append(tf.train.Example(features=tf.train.Features(feature=f)).SerializeToString())
    return np.array(out, dtype=object)


@pytest.mark.saved_model
def test_census_crossed_and_bucketized_columns_become_one_op_each(tmp_path, rng):
    src, dst = tmp_path / "src", tmp_path / "dst"
    save_census_model(src)
    report = rewrite.optimize_saved_model(src, dst, runs=1, serving_device="cpu",
                                          sample_inputs={"serving_default": {"examples": examples(rng, 64)}})
    sig = report.signatures["serving_default"]
    assert report.tf1 and sig.outputs_match, sig
    counts = sig.op_counts_after
    assert counts.get("CtrCrossEmbeddingLookup") == 4 and "SparseCross" not in counts, counts
    fused = [m for m in sig.matches if m["pattern"] == "cross_lookup"]
    assert len(fused) == 4 and all(any("SparseCross" in r for r in m["replaced"]) for m in fused)
    assert counts.get("CtrBucketizeEmbeddingLookup") == 2, counts
    bucketized = [m for m in sig.matches if m["pattern"] == "bucketize_lookup"]
    assert len(bucketized) == 2 and all(any("Transpose" in r for r in m["replaced"]) for m in bucketized)

    # No batch of 0: the linear model's own SparseReshape to [0, -1] fails on it, natively and rewritten.
    assert_serves_like_source(src, dst, [{"examples": examples(rng, b)} for b in (1, 50)],
                              {"examples": examples(rng, 20)}, tmp_path, atol=1e-5)


class Crossed:
    """safe_embedding_lookup_sparse over tf.sparse.cross_hashed of sparse
    strings and dense integers; `also_ids` returns the crossed ids too,
    `weighted` weighs them."""

    def __init__(self, rng, combiner="sqrtn", buckets=64, also_ids=False, weighted=False):
        self.combiner, self.buckets, self.also_ids, self.weighted = combiner, buckets, also_ids, weighted
        self.params = tf.Variable(rng.normal(size=(buckets, 4)), dtype=tf.float32)

    def __call__(self, indices, values, shape, dense):
        ids = tf.sparse.cross_hashed([tf.SparseTensor(indices, values, shape), dense], self.buckets)
        weights = tf.SparseTensor(ids.indices, tf.ones_like(ids.values, tf.float32), ids.dense_shape) \
            if self.weighted else None
        pooled = tf.nn.safe_embedding_lookup_sparse(self.params, ids, weights, combiner=self.combiner)
        return (pooled, ids.values) if self.also_ids else pooled

    def feeds(self, rng, batch):
        indices, values = [], []
        for b in range(batch):
            for j in range(int(rng.integers(0, 3))):
                indices.append([b, j])
                values.append(f"s{rng.integers(0, 20)}")
        return {"indices": tf.constant(np.array(indices, np.int64).reshape(-1, 2)),
                "values": tf.constant(np.array(values, object).reshape(-1), tf.string),
                "shape": tf.constant([batch, 3], tf.int64),
                "dense": tf.constant(rng.integers(0, 9, (batch, 2)), tf.int64)}


CROSS_SPECS = [tf.TensorSpec([None, 2], tf.int64), tf.TensorSpec([None], tf.string), tf.TensorSpec([2], tf.int64),
               tf.TensorSpec([None, 2], tf.int64)]


def _rewritten(fn, specs=CROSS_SPECS, serving_device="cpu"):
    """fn optimized in this process: (run(*args), report, op counts)."""
    from test_rewrite import run_graph_def

    cf = tf.function(fn).get_concrete_function(*specs)
    graph, report = rewrite.optimize_concrete_function(cf, serving_device=serving_device)

    def run(*args):
        out = run_graph_def(cf, graph, *args)
        return out[0] if len(out) == 1 else out

    return run, report, rewrite.op_counts(graph, library=True)


def _run_crossed(run, feeds):
    return run(feeds["indices"], feeds["values"], feeds["shape"], feeds["dense"])


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_in_process_cross_fuses_and_matches(rng, combiner):
    crossed = Crossed(rng, combiner)
    run, report, counts = _rewritten(crossed)
    assert counts.get("CtrCrossEmbeddingLookup") == 1, counts
    for gone in ("SparseCross", "SparseReorder", "SparseFillEmptyRows", "Unique"):
        assert gone not in counts, (gone, counts)
    for batch in (0, 1, 30, 500):
        feeds = crossed.feeds(rng, batch)
        np.testing.assert_allclose(_run_crossed(run, feeds).numpy(), crossed(**feeds).numpy(), rtol=1e-5, atol=1e-6)


def test_in_process_id_past_the_table_fails_as_the_gather_does(rng):
    crossed = Crossed(rng, buckets=64)
    crossed.params = tf.Variable(tf.zeros([2, 4]))  # most crossed ids have no row
    run, _, counts = _rewritten(crossed)
    assert counts.get("CtrCrossEmbeddingLookup") == 1, counts
    feeds = crossed.feeds(rng, 10)
    with pytest.raises(tf.errors.InvalidArgumentError):
        crossed(**feeds)
    with pytest.raises(tf.errors.InvalidArgumentError, match="crossed id [0-9]+ in row [0-9]+ is out of range"):
        _run_crossed(run, feeds)


@pytest.mark.parametrize("case, reason", [
    ("also_ids", "is read by"),
    ("weighted", "weighted"),
])
def test_left_alone_with_the_reason(rng, case, reason):
    crossed = Crossed(rng, also_ids=case == "also_ids", weighted=case == "weighted")
    run, report, counts = _rewritten(crossed)
    assert "CtrCrossEmbeddingLookup" not in counts, counts
    assert any(s["pattern"] == "cross_lookup" and reason in s["reason"] for s in report["skip"]), report["skip"]
    feeds = crossed.feeds(rng, 10)
    got, want = _run_crossed(run, feeds), crossed(**feeds)
    for g, w in zip(tf.nest.flatten(got), tf.nest.flatten(want)):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("serving_device", ["gpu", None])
def test_not_fused_unless_served_on_the_cpu(rng, serving_device):
    _, report, counts = _rewritten(Crossed(rng), serving_device=serving_device)
    assert "CtrCrossEmbeddingLookup" not in counts and "SparseCross" in counts, counts
    assert any(s["pattern"] == "cross_lookup" and "runs on the CPU" in s["reason"] for s in report["skip"]), \
        report["skip"]


def column_bucket_ids(values, boundaries):
    """A bucketized_column's sparse ids, built by feature columns' own code."""
    from tensorflow.python.feature_column import feature_column_v2 as fc2

    column = fc2.bucketized_column(fc2.numeric_column("x", shape=(values.shape[1],)), boundaries)
    return column.get_sparse_tensors(fc2.FeatureTransformationCache({"x": values}), None).id_tensor


class Bucketized:
    """safe_embedding_lookup_sparse over a bucketized column's ids of [B, 2]
    values; `also_ids` returns the ids too."""

    key_dtype = tf.float32

    def __init__(self, rng, combiner="mean", also_ids=False, boundaries=(0.0, 1.5, 10.0)):
        self.combiner, self.also_ids, self.boundaries = combiner, also_ids, list(boundaries)
        self.params = tf.Variable(rng.normal(size=(2 * (len(boundaries) + 1), 3)), dtype=tf.float32)

    def __call__(self, values):
        ids = column_bucket_ids(values, self.boundaries)
        pooled = tf.nn.safe_embedding_lookup_sparse(self.params, ids, combiner=self.combiner)
        return (pooled, ids.values) if self.also_ids else pooled


def _rewritten_bucketized(fn, serving_device="cpu"):
    return _rewritten(fn, [tf.TensorSpec([None, 2], tf.float32)], serving_device)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_in_process_bucketized_column_fuses_and_matches(rng, combiner):
    bucketized = Bucketized(rng, combiner)
    run, report, counts = _rewritten_bucketized(bucketized)
    assert counts.get("CtrBucketizeEmbeddingLookup") == 1, counts
    for gone in ("Bucketize", "Transpose", "SparseReorder", "SparseFillEmptyRows", "Unique", "Range"):
        assert gone not in counts, (gone, counts)
    for batch in (0, 1, 40):
        values = tf.constant(rng.choice([-1.0, 0.0, 1.0, 1.5, 3.0, 10.0, 99.0, np.nan], (batch, 2)), tf.float32)
        np.testing.assert_allclose(run(values).numpy(), bucketized(values).numpy(), rtol=1e-5, atol=1e-6)


def test_bucket_ids_the_caller_reads_stay_beside_the_fused_op(rng):
    # The column's nodes that something else reads stay for it (a crossed
    # column of the same bucketized column, here the caller); the fused op
    # buckets the values again.
    bucketized = Bucketized(rng, also_ids=True)
    run, report, counts = _rewritten_bucketized(bucketized)
    assert counts.get("CtrBucketizeEmbeddingLookup") == 1 and counts.get("Bucketize") == 1, counts
    assert "SparseReorder" not in counts and "Transpose" not in counts, counts
    values = tf.constant(rng.uniform(-2, 12, (8, 2)), tf.float32)
    got, want = run(values), bucketized(values)
    np.testing.assert_allclose(got[0].numpy(), want[0].numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[1].numpy(), want[1].numpy())


def test_bucketized_ids_past_the_table_fail_as_the_gather_does(rng):
    bucketized = Bucketized(rng)
    bucketized.params = tf.Variable(tf.zeros([5, 3]))  # no rows for the second value's buckets
    run, _, counts = _rewritten_bucketized(bucketized)
    assert counts.get("CtrBucketizeEmbeddingLookup") == 1, counts
    values = tf.constant([[0.5, 0.5], [0.5, 20.0]], tf.float32)
    with pytest.raises(tf.errors.InvalidArgumentError):
        bucketized(values)
    with pytest.raises(tf.errors.InvalidArgumentError, match="bucketized id [0-9]+ in row 0 is out of range"):
        run(values)


@pytest.mark.parametrize("serving_device", ["gpu", None])
def test_bucketized_not_fused_unless_served_on_the_cpu(rng, serving_device):
    _, report, counts = _rewritten_bucketized(Bucketized(rng), serving_device)
    assert "CtrBucketizeEmbeddingLookup" not in counts and "Bucketize" in counts, counts
    assert any(s["pattern"] == "bucketize_lookup" and "runs on the CPU" in s["reason"] for s in report["skip"]), \
        report["skip"]


class KerasCross:
    """keras.layers.HashedCrossing of a string and an integer feature into an
    Embedding, as keras-io's structured-data models cross features; `rank` 2
    takes [B, 1] features and flattens the [B, 1, D] rows when `flatten`."""

    def __init__(self, num_bins=50, rows=50, rank=1, flatten=True, dim=4):
        import keras

        self.rank = rank
        shape = () if rank == 1 else (1,)
        a = keras.Input(shape=shape, dtype="string", name="a")
        b = keras.Input(shape=shape, dtype="int64", name="b")
        rows_out = keras.layers.Embedding(rows, dim)(keras.layers.HashedCrossing(num_bins=num_bins)((a, b)))
        if rank == 2 and flatten:
            rows_out = keras.layers.Flatten()(rows_out)
        self.model = keras.Model({"a": a, "b": b}, rows_out)
        self.specs = [tf.TensorSpec([None] + [1] * (rank - 1), tf.string),
                      tf.TensorSpec([None] + [1] * (rank - 1), tf.int64)]

    def __call__(self, a, b):
        return self.model({"a": a, "b": b})

    def feeds(self, rng, batch):
        shape = (batch,) if self.rank == 1 else (batch, 1)
        words = np.array(["", "red", "green", "blue", "a,b"], object)
        return (tf.constant(rng.choice(words, shape), tf.string),
                tf.constant(rng.integers(-5, 1 << 40, shape), tf.int64))


@pytest.mark.parametrize("rank", [1, 2])
def test_keras_hashed_crossing_embedding_fuses_and_matches(rng, rank):
    crossed = KerasCross(rank=rank)
    run, report, counts = _rewritten(crossed, crossed.specs)
    assert counts.get("CtrCrossEmbeddingLookup") == 1, counts
    for gone in ("SparseCross", "SparseToDense", "GatherV2", "ResourceGather", "SelectV2"):
        assert gone not in counts, (gone, counts)
    [m] = [m for m in report["match"] if m["pattern"] == "cross_gather"]
    assert any("SparseCross" in r for r in m["replaced"]), m
    # HashedCrossing fails on a batch of 0 natively (its Squeeze, or its
    # set_shape([B, 1]) of the [0, 0] ids); test_tf_dense_cross_gather_fuses serves one.
    for batch in (1, 7, 300):
        feeds = crossed.feeds(rng, batch)
        np.testing.assert_array_equal(run(*feeds).numpy(), crossed(*feeds).numpy())


@pytest.mark.parametrize("batch_in_signature", [None, 7])
def test_keras_hashed_crossing_of_rows_fuses_online(rng, tmp_path, batch_in_signature):
    # Online, no recorded shapes: the crossed ids' [B, 1] came from
    # SparseCross's run-time dense_shape, unknown to shape inference, and a
    # function traced for one batch has its Flatten folded to Reshape(rows,
    # [B, D]): both left the pattern skipped as "not flattened".
    crossed = KerasCross(rank=2)
    spec = tf.TensorSpec([batch_in_signature, 1], tf.string), tf.TensorSpec([batch_in_signature, 1], tf.int64)
    feeds = crossed.feeds(rng, 7)
    report_file = tmp_path / "report.jsonl"
    with rewrite.enable(report_file=str(report_file), serving_device="cpu"):
        got = tf.function(crossed, input_signature=spec)(*feeds)
    report = rewrite.read_report(str(report_file))
    assert [m["pattern"] for m in report["match"]] == ["cross_gather"], report
    np.testing.assert_array_equal(got.numpy(), crossed(*feeds).numpy())


def test_keras_hashed_crossing_past_the_table_fails_as_the_gather_does(rng):
    crossed = KerasCross(num_bins=1000, rows=3)
    run, _, counts = _rewritten(crossed, crossed.specs)
    assert counts.get("CtrCrossEmbeddingLookup") == 1, counts
    feeds = crossed.feeds(rng, 40)
    with pytest.raises(tf.errors.InvalidArgumentError):
        crossed(*feeds)
    with pytest.raises(tf.errors.InvalidArgumentError, match="crossed id [0-9]+ in row [0-9]+ is out of range"):
        run(*feeds)


def _dense_cross_gather(table, also_ids=False, sparse=False):
    """tf.nn.embedding_lookup over tf.sparse.to_dense(tf.sparse.cross_hashed(...))
    of [B, 1] features, flattened; `also_ids` returns the ids too, `sparse`
    crosses a SparseTensor in."""
    def f(a, b):
        first = tf.sparse.from_dense(a) if sparse else a
        ids = tf.sparse.to_dense(tf.sparse.cross_hashed([first, b], int(table.shape[0])))
        ids.set_shape([None, 1])  # as HashedCrossing does: the rows' [B, 1, D] shape is then known
        rows = tf.reshape(tf.nn.embedding_lookup(table, ids), [-1, int(table.shape[1])])
        return (rows, ids) if also_ids else rows
    return f


@pytest.mark.parametrize("case, reason", [
    ("not_flattened", "not flattened"),
    ("also_ids", "has another consumer"),
    ("sparse", "has sparse inputs"),
    ("gpu", "runs on the CPU"),
])
def test_keras_hashed_crossing_left_alone_with_the_reason(rng, case, reason):
    specs = [tf.TensorSpec([None, 1], tf.string), tf.TensorSpec([None, 1], tf.int64)]
    table = tf.Variable(rng.normal(size=(20, 3)), dtype=tf.float32)
    if case == "not_flattened":
        crossed = KerasCross(rank=2, flatten=False)
        fn, specs = crossed, crossed.specs
    else:
        fn = _dense_cross_gather(table, also_ids=case == "also_ids", sparse=case == "sparse")
    run, report, counts = _rewritten(fn, specs, serving_device="gpu" if case == "gpu" else "cpu")
    assert "CtrCrossEmbeddingLookup" not in counts, counts
    assert any(s["pattern"] == "cross_gather" and reason in s["reason"] for s in report["skip"]), report["skip"]
    feeds = (tf.constant([["x"], [""], ["y"]]), tf.constant([[1], [2], [-3]], tf.int64))
    for g, w in zip(tf.nest.flatten(run(*feeds)), tf.nest.flatten(fn(*feeds))):
        np.testing.assert_array_equal(g.numpy(), w.numpy())


def test_cross_of_an_int64_input_under_a_string_internal_type_is_left_alone(rng):
    # TF refuses such a SparseCross (public APIs never build one); fused, it
    # crossed the int64 values as ids and served.
    table = tf.Variable(rng.normal(size=(20, 3)), dtype=tf.float32)

    def fn(a, b):
        indices, values, shape = tf.raw_ops.SparseCross(
            indices=[], values=[], shapes=[], dense_inputs=[a, b], hashed_output=True, num_buckets=20,
            hash_key=956888297470, out_type=tf.int64, internal_type=tf.string)
        return tf.gather(table, tf.squeeze(tf.sparse.to_dense(tf.SparseTensor(indices, values, shape)), 1))

    run, report, counts = _rewritten(fn, [tf.TensorSpec([None, 1], tf.string), tf.TensorSpec([None, 1], tf.int64)])
    assert "CtrCrossEmbeddingLookup" not in counts, counts
    assert any(s["pattern"] == "cross_gather" and "internal type" in s["reason"] for s in report["skip"]), \
        report["skip"]
    feeds = (tf.constant([["x"], ["y"]]), tf.constant([[1], [2]], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="internal type"):
        tf.function(fn)(*feeds)
    with pytest.raises(tf.errors.InvalidArgumentError, match="internal type"):
        run(*feeds)


def test_tf_dense_cross_gather_fuses(rng):
    table = tf.Variable(rng.normal(size=(20, 3)), dtype=tf.float32)
    fn = _dense_cross_gather(table)
    run, report, counts = _rewritten(fn, [tf.TensorSpec([None, 1], tf.string), tf.TensorSpec([None, 1], tf.int64)])
    assert counts.get("CtrCrossEmbeddingLookup") == 1 and "SparseCross" not in counts, counts
    native = tf.function(fn)  # in a graph, set_shape does not check the [0, 0] ids of a batch of 0
    for batch in (0, 5, 64):
        feeds = (tf.constant(rng.choice(["p", "q", ""], (batch, 1)), tf.string),
                 tf.constant(rng.integers(0, 9, (batch, 1)), tf.int64))
        np.testing.assert_array_equal(run(*feeds).numpy(), native(*feeds).numpy())


@pytest.mark.saved_model
def test_keras_hashed_crossing_saved_model(tmp_path, rng):
    src, dst = tmp_path / "src", tmp_path / "dst"
    crossed = KerasCross()
    crossed.model.export(str(src), verbose=False)
    report = rewrite.optimize_saved_model(src, dst, runs=1, serving_device="cpu")
    sig = report.signatures["serving_default"]
    assert sig.outputs_match and sig.op_counts_after.get("CtrCrossEmbeddingLookup") == 1, sig
    assert [m["pattern"] for m in sig.matches] == ["cross_gather"], sig.matches

    def named(batch):
        a, b = crossed.feeds(rng, batch)
        return {"a": a.numpy(), "b": b.numpy()}

    assert_serves_like_source(src, dst, [named(b) for b in (1, 33)], named(9), tmp_path)

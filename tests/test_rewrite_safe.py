"""CtrFusionOptimizer on the max_norm clip and the full
safe_embedding_lookup_sparse chain (patterns max_norm_lookup, safe_lookup).

Each rewritten graph must compute what the TF-native graph computes; the
negative cases must stay unrewritten with a reason and still compute it.
"""

import textwrap

import numpy as np
import pytest
import tensorflow as tf

import tf_ctr_ops  # noqa: F401
from tf_ctr_ops import rewrite
from test_rewrite import COMBINERS, EXPECTED_REWRITES, D, V, offline, run_graph_def, run_online

SPARSE2 = tf.SparseTensorSpec([None, None], tf.int64)
SPARSE3 = tf.SparseTensorSpec([None, None, None], tf.int64)
WEIGHTS2 = tf.SparseTensorSpec([None, None], tf.float32)
WEIGHTS3 = tf.SparseTensorSpec([None, None, None], tf.float32)
CLIP_OPS = {"RealDiv", "Maximum", "Sqrt", "Square"}
SAFE_OPS = {"SparseFillEmptyRows", "Where", "Select", "SelectV2", "Tile", "ZerosLike", "Unique", "ResourceGather",
            "SparseSegmentSum", "SparseSegmentMean", "SparseSegmentSqrtN", "SegmentSum", "DivNoNan"}


def assert_close(got, want):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


@pytest.fixture
def big_table(rng):
    """Rows with norms on both sides of the clip (max_norm 1.0)."""
    t = rng.normal(size=(V, D)).astype(np.float32)
    t *= rng.uniform(0.05, 3.0, size=(V, 1)).astype(np.float32) / np.linalg.norm(t, axis=1, keepdims=True)
    t[5] = 0.0  # zero norm: no clip, no NaN
    return tf.Variable(t)


def random_ids(rng, rows=24, max_len=5, vocab=V, negatives=False, rank=2, shuffle=False):
    lengths = rng.integers(0, max_len + 1, size=rows)
    lengths[-1] = max(lengths[-1], 1)
    values = rng.integers(-3 if negatives else 0, vocab, size=lengths.sum()).astype(np.int64)
    sp = tf.RaggedTensor.from_row_lengths(values, lengths).to_sparse()
    indices, values, shape = sp.indices.numpy(), sp.values.numpy(), sp.dense_shape.numpy()
    if rank == 3:  # rows of the rank-2 form become [row // 4, row % 4]
        indices = np.stack([indices[:, 0] // 4, indices[:, 0] % 4, indices[:, 1]], axis=1)
        shape = np.array([-(-shape[0] // 4), 4, shape[1]], np.int64)
    if shuffle:  # valid, but not in canonical order: SparseFillEmptyRows sorts it for TF
        perm = rng.permutation(len(values))
        indices, values = indices[perm], values[perm]
    return tf.SparseTensor(indices, values, shape)


def weights_like(rng, sp, nonpositive=False):
    w = rng.uniform(0.2, 2.0, size=sp.values.shape).astype(np.float32)
    if nonpositive:
        w[rng.random(w.shape) < 0.3] = 0.0
        w[rng.random(w.shape) < 0.2] *= -1
    return tf.SparseTensor(sp.indices, w, sp.dense_shape)


def patterns(report):
    return [m["pattern"] for m in report["match"]]


# ---------------------------------------------------------------------------
# max_norm


@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_offline_max_norm_is_one_fused_op(rng, big_table, combiner, weighted):
    def f(sp, w):
        return tf.nn.embedding_lookup_sparse(big_table, sp, w if weighted else None, combiner=combiner, max_norm=1.0)

    cf, graph, report, counts = offline(f, SPARSE2, WEIGHTS2)
    assert patterns(report)[-1] == "max_norm_lookup", report
    assert counts.get("CtrEmbeddingLookup") == 1
    assert not (CLIP_OPS | {"Unique", "ResourceGather"}) & set(counts), counts
    [fused] = [n for n in graph.node if n.op == "CtrEmbeddingLookup"]
    assert fused.attr["max_norm"].f == 1.0 and fused.attr["has_weights"].b == weighted
    ids = random_ids(rng)
    w = weights_like(rng, ids)
    [got] = run_graph_def(cf, graph, ids, w)
    assert_close(got, f(ids, w))


def test_online_max_norm_forward_and_training_gradients(rng, big_table):
    ids = random_ids(rng)

    def f(sp):
        return tf.nn.embedding_lookup_sparse(big_table, sp, None, combiner="sqrtn", max_norm=1.0)

    got, stats = run_online(f, ids)
    assert stats["rewrites"] == EXPECTED_REWRITES["max_norm"]
    assert_close(got, f(ids))

    # Online training: the gradient reads the clip's intermediates, so that
    # graph keeps (part of) the TF form; either way the gradients must match.
    def loss_and_grad(sp):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(f(sp)))
        return loss, tf.convert_to_tensor(tape.gradient(loss, big_table))

    want_loss, want_grad = loss_and_grad(ids)
    (got_loss, got_grad), _ = run_online(loss_and_grad, ids)
    assert_close(got_loss, want_loss)
    assert_close(got_grad, want_grad)


def test_max_norm_nan_and_inf_rows_match_tf(rng):
    t = rng.normal(size=(V, D)).astype(np.float32)
    t[1, 2], t[2, 0] = np.nan, np.inf
    table = tf.constant(t)
    ids = tf.SparseTensor([[0, 0], [0, 1], [1, 0], [2, 0]], tf.constant([1, 3, 2, 4], tf.int64), [3, 2])
    f = lambda sp: tf.nn.embedding_lookup_sparse(table, sp, None, combiner="sum", max_norm=0.5)  # noqa: E731
    cf, graph, report, _ = offline(f, SPARSE2)
    assert "max_norm_lookup" in patterns(report)
    [got] = run_graph_def(cf, graph, ids)
    np.testing.assert_allclose(got.numpy(), f(ids).numpy(), rtol=1e-5, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("max_norm", [1e-39, 1e-45], ids=["denormal", "least_denormal"])
def test_max_norm_below_least_normal_float_clips_to_zeros_as_tf_does(rng, big_table, max_norm):
    # TF's clip of such a norm is zeros; the kernels, with denormals
    # flushed, would read the constant as 0, i.e. no clipping.
    f = lambda sp: tf.nn.embedding_lookup_sparse(big_table, sp, None, combiner="sum", max_norm=max_norm)  # noqa: E731
    cf, graph, report, _ = offline(f, SPARSE2)
    assert "max_norm_lookup" in patterns(report)
    [fused] = [n for n in graph.node if n.op == "CtrEmbeddingLookup"]
    assert fused.attr["max_norm"].f > 0
    ids = random_ids(rng)
    [got] = run_graph_def(cf, graph, ids)
    want = f(ids).numpy()
    assert not np.any(want)
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-30)


def manual_clip_lookup(table, case):
    """The pooled clip written out, with one thing off per case."""
    def f(sp):
        unique, idx = tf.unique(sp.values)
        rows = tf.gather(table, unique)
        clipped = tf.clip_by_norm(rows, 1.0, axes=[0] if case == "axis 0" else [1])
        pooled = tf.sparse.segment_mean(clipped, idx, sp.indices[:, 0])
        return (pooled, clipped) if case == "clipped rows fetched" else pooled

    return f


@pytest.mark.parametrize("case,reason", [
    ("clipped rows fetched", "has another consumer"),
    ("axis 0", "axis 1"),
    ("half table", "not float32"),
])
def test_max_norm_not_rewritten_with_reason(rng, big_table, case, reason):
    if case == "half table":
        half = tf.Variable(big_table.numpy().astype(np.float16))
        f = lambda sp: tf.nn.embedding_lookup_sparse(half, sp, None, max_norm=1.0)  # noqa: E731
    else:
        f = manual_clip_lookup(big_table, case)
    cf, graph, report, counts = offline(f, SPARSE2)
    assert "max_norm_lookup" not in patterns(report)
    assert any(s["pattern"] == "max_norm_lookup" and reason in s["reason"] for s in report["skip"]), report["skip"]
    assert "RealDiv" in counts
    ids = random_ids(rng)
    got = run_graph_def(cf, graph, ids)
    for g, w in zip(got, tf.nest.flatten(f(ids))):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-3 if case == "half table" else 1e-5, atol=1e-3)


# ---------------------------------------------------------------------------
# safe_embedding_lookup_sparse


@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("default_id", [None, 0, 7])
def test_offline_safe_lookup_is_one_fused_op(rng, big_table, combiner, weighted, default_id):
    def f(sp, w):
        return tf.nn.safe_embedding_lookup_sparse(big_table, sp, w if weighted else None, combiner=combiner,
                                                  default_id=default_id)

    cf, graph, report, counts = offline(f, SPARSE2, WEIGHTS2)
    assert patterns(report)[-1] == "safe_lookup", report
    assert counts.get("CtrEmbeddingLookup") == 1
    assert not SAFE_OPS & set(counts), counts
    [fused] = [n for n in graph.node if n.op == "CtrEmbeddingLookup"]
    assert fused.attr["invalid_ids"].s == b"skip_negative"
    assert fused.attr["default_id"].i == (-1 if default_id is None else default_id)
    assert fused.attr["prune_weights"].b == (weighted and combiner != "sum")
    for shuffle in (False, True):
        ids = random_ids(rng, negatives=True, shuffle=shuffle)
        w = weights_like(rng, ids, nonpositive=True)
        [got] = run_graph_def(cf, graph, ids, w)
        assert_close(got, f(ids, w))
    # Every row empty, and no rows at all.
    empty = tf.SparseTensor(tf.zeros([0, 2], tf.int64), tf.zeros([0], tf.int64), [3, 4])
    none = tf.SparseTensor(tf.zeros([0, 2], tf.int64), tf.zeros([0], tf.int64), [0, 4])
    for sp in (empty, none):
        w = tf.SparseTensor(sp.indices, tf.zeros([0]), sp.dense_shape)
        [got] = run_graph_def(cf, graph, sp, w)
        assert got.shape == f(sp, w).shape
        assert_close(got, f(sp, w))


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_offline_safe_lookup_rank3_with_max_norm(rng, big_table, weighted):
    def f(sp, w):
        return tf.nn.safe_embedding_lookup_sparse(big_table, sp, w if weighted else None, combiner="mean",
                                                  max_norm=1.0)

    cf, graph, report, counts = offline(f, SPARSE3, WEIGHTS3)
    assert {"max_norm_lookup", "safe_lookup"} <= set(patterns(report)), report
    assert counts.get("CtrEmbeddingLookup") == 1 and not (SAFE_OPS | CLIP_OPS) & set(counts), counts
    ids = random_ids(rng, negatives=True, rank=3, shuffle=True)
    w = weights_like(rng, ids, nonpositive=True)
    [got] = run_graph_def(cf, graph, ids, w)
    want = f(ids, w)
    assert got.shape == want.shape and got.shape.rank == 3
    assert_close(got, want)


def test_safe_lookup_errors_like_tf(rng, big_table):
    f = lambda sp: tf.nn.safe_embedding_lookup_sparse(big_table, sp, None)  # noqa: E731
    cf, graph, report, _ = offline(f, SPARSE2)
    assert "safe_lookup" in patterns(report)
    for bad in (tf.SparseTensor([[0, 0], [1, 0]], tf.constant([3, V + 2], tf.int64), [2, 2]),  # id out of range
                tf.SparseTensor([[0, 0], [5, 0]], tf.constant([3, 4], tf.int64), [2, 2])):  # row out of range
        with pytest.raises(tf.errors.InvalidArgumentError):
            f(bad)
        with pytest.raises(tf.errors.InvalidArgumentError):
            run_graph_def(cf, graph, bad)


def test_safe_lookup_on_criteo_categories(big_table):
    from test_rewrite import read_csv

    rows = read_csv("criteo_sample.txt")
    cats = tf.constant([[r[f"C{i}"] for i in range(1, 27)] for r in rows])
    assert bool(tf.reduce_any(cats == "")), "the sample should have absent categories"

    def f(cats):
        # Absent categories are id -1, which safe_embedding_lookup_sparse drops.
        ids = tf.where(cats == "", tf.constant(-1, tf.int64), tf.strings.to_hash_bucket_fast(cats, V))
        sp = tf.SparseTensor(tf.where(tf.ones_like(ids, tf.bool)), tf.reshape(ids, [-1]),
                             tf.shape(ids, out_type=tf.int64))
        return tf.nn.safe_embedding_lookup_sparse(big_table, sp, None, combiner="sqrtn", max_norm=1.0)

    cf, graph, report, counts = offline(f, tf.TensorSpec([None, 26], tf.string))
    assert {"max_norm_lookup", "safe_lookup"} <= set(patterns(report)), report
    assert counts["CtrEmbeddingLookup"] == 1 and counts["SelectV2"] == 1 and counts["Where"] == 1  # the model's own
    assert not (SAFE_OPS - {"SelectV2", "Where"} | CLIP_OPS) & set(counts), counts
    [got] = run_graph_def(cf, graph, cats)
    assert_close(got, f(cats))


def test_online_safe_lookup(rng, big_table):
    ids = random_ids(rng, negatives=True)
    w = weights_like(rng, ids, nonpositive=True)

    def f(sp, w):
        return tf.nn.safe_embedding_lookup_sparse(big_table, sp, w, combiner="sqrtn", default_id=3, max_norm=1.0)

    got, stats = run_online(f, ids, w)
    assert stats["rewrites"] == EXPECTED_REWRITES["safe_weighted_max_norm"]
    assert_close(got, f(ids, w))


def manual_safe_lookup(table, case):
    """safe_embedding_lookup_sparse written out (the pattern matches it), with
    one thing off per case."""
    def f(sp):
        shape = sp.dense_shape
        flat = tf.sparse.reshape(sp, tf.stack([tf.reduce_prod(shape[:-1]), shape[-1]]))
        keep = flat.values > 0 if case == "ids > 0" else flat.values >= 0
        kept = tf.sparse.retain(flat, keep)
        filled, empty = tf.sparse.fill_empty_rows(kept, 0)
        pooled = tf.nn.embedding_lookup_sparse(table, filled, None, combiner="mean")
        tiled = tf.tile(tf.reshape(empty, [-1, 1]), tf.stack([1, tf.shape(pooled)[1]]))
        fill = tf.ones_like(pooled) if case == "ones for empty rows" else tf.zeros_like(pooled)
        out = tf.where(tiled, fill, pooled)
        return (out, empty) if case == "empty rows fetched" else out

    return f


@pytest.mark.parametrize("case,reason", [
    ("as written", None),
    ("empty rows fetched", "has another consumer"),
    ("ids > 0", "ids >= 0"),
    ("ones for empty rows", "not zeroed"),
])
def test_safe_lookup_written_out(rng, big_table, case, reason):
    f = manual_safe_lookup(big_table, case)
    cf, graph, report, counts = offline(f, SPARSE2)
    if reason is None:  # the positive control: the written-out chain is recognized
        assert "safe_lookup" in patterns(report)
    else:
        assert "safe_lookup" not in patterns(report)
        assert any(s["pattern"] == "safe_lookup" and reason in s["reason"] for s in report["skip"]), report["skip"]
        assert "SparseFillEmptyRows" in counts
    ids = random_ids(rng, negatives=True)
    got = run_graph_def(cf, graph, ids)
    for g, w in zip(got, tf.nest.flatten(f(ids))):
        assert_close(g, w)


def test_safe_lookup_unsupported_cases_stay_exact(rng, big_table):
    t64 = tf.Variable(big_table.numpy().astype(np.float64))
    f64 = lambda sp: tf.nn.safe_embedding_lookup_sparse(t64, sp, None)  # noqa: E731
    cf, graph, report, counts = offline(f64, SPARSE2)
    assert report["match"] == [] and "CtrEmbeddingLookup" not in counts
    ids = random_ids(rng, negatives=True)
    [got] = run_graph_def(cf, graph, ids)
    np.testing.assert_array_equal(got.numpy(), f64(ids).numpy())

    # default_id outside the table: TF fails only when a row is empty, the fused op always.
    far = lambda sp: tf.nn.safe_embedding_lookup_sparse(big_table, sp, None, default_id=V + 5)  # noqa: E731
    cf, graph, report, counts = offline(far, SPARSE2)
    assert "safe_lookup" not in patterns(report)
    assert any("not a table row" in s["reason"] for s in report["skip"]), report["skip"]
    no_empty = tf.sparse.from_dense(tf.constant([[1, 2], [3, 0]], tf.int64))
    [got] = run_graph_def(cf, graph, no_empty)
    assert_close(got, far(no_empty))


# ---------------------------------------------------------------------------
# SavedModel


class SafeModule(tf.Module):
    def __init__(self, rng):
        super().__init__()
        self.table = tf.Variable(rng.normal(size=(V, D)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.int64, name="indices"),
                                  tf.TensorSpec([None], tf.int64, name="ids"),
                                  tf.TensorSpec([None], tf.float32, name="weights"),
                                  tf.TensorSpec([2], tf.int64, name="shape")])
    def serve(self, indices, ids, weights, shape):
        sp, w = tf.SparseTensor(indices, ids, shape), tf.SparseTensor(indices, weights, shape)
        return {"safe": tf.nn.safe_embedding_lookup_sparse(self.table, sp, w, combiner="mean", default_id=2,
                                                            max_norm=1.5),
                "clipped": tf.nn.embedding_lookup_sparse(self.table, sp, None, combiner="sum", max_norm=0.5)}


@pytest.mark.saved_model
def test_saved_model_safe_and_max_norm_served_in_fresh_process(tmp_path, rng):
    module = SafeModule(rng)
    src, dst = tmp_path / "src", tmp_path / "dst"
    tf.saved_model.save(module, str(src), signatures={"serving_default": module.serve})
    ids = random_ids(rng, negatives=False)
    w = weights_like(rng, ids, nonpositive=True)
    inputs = {"indices": ids.indices.numpy(), "ids": ids.values.numpy(), "weights": w.values.numpy(),
              "shape": ids.dense_shape.numpy()}
    report = rewrite.optimize_saved_model(src, dst, sample_inputs={"serving_default": inputs}, runs=2)
    sig = report.signatures["serving_default"]
    assert report.ok and sig.outputs_match and sig.max_abs_diff <= 1e-5
    assert {"max_norm_lookup", "safe_lookup"} <= {m["pattern"] for m in sig.matches}, sig.skips
    assert sig.op_counts_after.get("CtrEmbeddingLookup") == 2
    assert not (SAFE_OPS | CLIP_OPS) & set(sig.op_counts_after), sig.op_counts_after

    # outputs_match: the verification served dst on these inputs in a fresh
    # process; loaded here, it must agree with the module as well.
    got = tf.saved_model.load(str(dst)).signatures["serving_default"](**{k: tf.constant(v) for k, v in inputs.items()})
    want = module.serve(**{k: tf.constant(v) for k, v in inputs.items()})
    for k in want:
        assert_close(got[k], want[k])


# ---------------------------------------------------------------------------
# Partitioned tables (offline only: the merged table is a new variable)

PART_SIZES = (4, 3, 3)  # uneven: 10 rows in 3 partitions, as both 'mod' and 'div' lay them out
PART_SIGNATURE = [tf.TensorSpec([None, 2], tf.int64, name="indices"), tf.TensorSpec([None], tf.int64, name="ids"),
                  tf.TensorSpec([2], tf.int64, name="shape")]


class PartitionedModule(tf.Module):
    def __init__(self, rng, strategy, sizes=PART_SIZES, constant=False):
        super().__init__()
        values = [rng.normal(size=(n, D)).astype(np.float32) for n in sizes]
        self.parts = [tf.constant(v) for v in values] if constant else [tf.Variable(v) for v in values]
        self.strategy = strategy

    @tf.function(input_signature=PART_SIGNATURE)
    def serve(self, indices, ids, shape):
        sp = tf.SparseTensor(indices, ids, shape)
        return {"pooled": tf.compat.v1.nn.embedding_lookup_sparse(self.parts, sp, None, combiner="sqrtn",
                                                                   partition_strategy=self.strategy),
                "rows": tf.compat.v1.nn.embedding_lookup(self.parts, tf.reshape(ids, [-1, 1]),
                                                         partition_strategy=self.strategy)}


def partitioned_inputs(rng, vocab):
    ids = random_ids(rng, vocab=vocab)
    return {"indices": ids.indices.numpy(), "ids": ids.values.numpy(), "shape": ids.dense_shape.numpy()}


def save_and_optimize(tmp_path, module, inputs, merge_partitions=True):
    src, dst = tmp_path / "src", tmp_path / "dst"
    tf.saved_model.save(module, str(src), signatures={"serving_default": module.serve})
    report = rewrite.optimize_saved_model(src, dst, sample_inputs={"serving_default": inputs}, runs=2,
                                          merge_partitions=merge_partitions)
    return report, report.signatures["serving_default"], dst


@pytest.mark.saved_model
@pytest.mark.parametrize("strategy", ["mod", "div"])
def test_partitioned_table_merged_offline_and_served_in_fresh_process(tmp_path, rng, strategy):
    module = PartitionedModule(rng, strategy)
    inputs = partitioned_inputs(rng, sum(PART_SIZES))
    report, sig, dst = save_and_optimize(tmp_path, module, inputs)
    assert report.ok and sig.outputs_match and sig.max_abs_diff == 0
    merges = [m for m in sig.matches if m["pattern"] == "partitioned_table"]
    assert len(merges) == 2 and {m["strategy"] for m in merges} == {strategy}, sig.matches
    assert "sparse_segment_lookup" in [m["pattern"] for m in sig.matches]  # the merged gather then fuses
    after = sig.op_counts_after
    assert not {"DynamicPartition", "ParallelDynamicStitch"} & set(after), after
    assert after.get("CtrEmbeddingLookup") == 1 and after.get("ResourceGather") == 1

    # One new variable holds the merged table, in the strategy's row order.
    loaded = tf.saved_model.load(str(dst))
    merged = [v for v in loaded.ctr_variables if v.shape[0] == sum(PART_SIZES)]
    assert len(merged) == 1
    parts = [p.numpy() for p in module.parts]
    for row in range(sum(PART_SIZES)):
        if strategy == "mod":
            want = parts[row % 3][row // 3]
        else:
            p = np.searchsorted(np.cumsum(PART_SIZES), row, side="right")
            want = parts[p][row - (np.cumsum(PART_SIZES)[p - 1] if p else 0)]
        np.testing.assert_array_equal(merged[0].numpy()[row], want)

    # outputs_match above: served on these inputs in a fresh process by the
    # verification; here the loaded copy must agree with the module too.
    got = loaded.signatures["serving_default"](**{k: tf.constant(v) for k, v in inputs.items()})
    want = module.serve(**{k: tf.constant(v) for k, v in inputs.items()})
    for k in want:
        assert_close(got[k], want[k])
    # Ids outside the table fail in both.
    bad = dict(inputs, ids=np.full_like(inputs["ids"], sum(PART_SIZES)))
    for fn in (module.serve, loaded.signatures["serving_default"]):
        with pytest.raises(tf.errors.InvalidArgumentError):
            fn(**{k: tf.constant(v) for k, v in bad.items()})


@pytest.mark.saved_model
def test_a_model_whose_partitions_were_merged_is_rewritten_again(tmp_path, rng):
    # The second rewrite tracked only the variables it merged itself: the
    # first one's merged table, which the signatures read, was left untracked
    # and the save failed (AssertionError: an 'untracked' resource).
    module = PartitionedModule(rng, "mod")
    inputs = partitioned_inputs(rng, sum(PART_SIZES))
    _, _, dst = save_and_optimize(tmp_path, module, inputs)
    feeds = {k: tf.constant(v) for k, v in inputs.items()}
    want = module.serve(**feeds)
    for again, merge in (("dst2", False), ("dst3", True)):
        report = rewrite.optimize_saved_model(dst, tmp_path / again, sample_inputs={"serving_default": inputs},
                                              runs=1, merge_partitions=merge)
        sig = report.signatures["serving_default"]
        assert report.ok and sig.outputs_match and sig.max_abs_diff == 0, report.summary()
        dst = tmp_path / again
        loaded = tf.saved_model.load(str(dst))
        assert len([v for v in loaded.ctr_variables if v.shape[0] == sum(PART_SIZES)]) == 1
        got = loaded.signatures["serving_default"](**feeds)
        for k in want:
            assert_close(got[k], want[k])


@pytest.mark.saved_model
def test_more_mod_partitions_than_rows_merge(tmp_path, rng):
    # TF's 'mod' rule serves 3 rows in 5 partitions; the merge was refused
    # as if the 'div' rule (which divides by zero there) read them.
    module = PartitionedModule(rng, "mod", sizes=(1, 1, 1, 0, 0))
    inputs = partitioned_inputs(rng, 3)
    report, sig, dst = save_and_optimize(tmp_path, module, inputs)
    merges = [m for m in sig.matches if m["pattern"] == "partitioned_table"]
    assert len(merges) == 2 and {m["strategy"] for m in merges} == {"mod"}, (sig.matches, sig.skips)
    assert report.ok and sig.outputs_match and sig.max_abs_diff == 0
    got = tf.saved_model.load(str(dst)).signatures["serving_default"](**{k: tf.constant(v) for k, v in inputs.items()})
    want = module.serve(**{k: tf.constant(v) for k, v in inputs.items()})
    for k in want:
        assert_close(got[k], want[k])


@pytest.mark.saved_model
@pytest.mark.parametrize("case,reason", [
    ("sizes off the layout", "do not follow the layout"),
    ("constant partitions", "not read by ResourceGather from variables"),
])
def test_partitioned_table_left_alone_with_reason(tmp_path, rng, case, reason):
    if case == "sizes off the layout":
        module = PartitionedModule(rng, "mod", sizes=(3, 4, 3))  # 'mod' puts 4 rows in partition 0
    else:
        module = PartitionedModule(rng, "div", constant=True)
    inputs = partitioned_inputs(rng, 9)
    report, sig, _ = save_and_optimize(tmp_path, module, inputs)
    assert "partitioned_table" not in [m["pattern"] for m in sig.matches]
    assert any(s["pattern"] == "partitioned_table" and reason in s["reason"] for s in sig.skips), sig.skips
    assert "ParallelDynamicStitch" in sig.op_counts_after
    assert report.ok and sig.outputs_match


@pytest.mark.saved_model
def test_partitions_another_signature_writes_are_not_merged(tmp_path, rng):
    # A merged table is a copy: a signature updating the partitions (a
    # hot-update hook) no longer reached what the rewritten lookup reads.
    module = PartitionedModule(rng, "mod")

    @tf.function(input_signature=[tf.TensorSpec([], tf.float32, name="delta")])
    def update(delta):
        for part in module.parts:
            part.assign_add(tf.fill(tf.shape(part), delta))
        return {"delta": tf.identity(delta)}

    module.update = update
    src, dst = tmp_path / "src", tmp_path / "dst"
    tf.saved_model.save(module, str(src), signatures={"serving_default": module.serve, "update": module.update})
    inputs = partitioned_inputs(rng, 10)
    report = rewrite.optimize_saved_model(src, dst, runs=0, merge_partitions=True, sample_inputs={
        "serving_default": inputs, "update": {"delta": np.array(0.0, np.float32)}})
    sig = report.signatures["serving_default"]
    assert "partitioned_table" not in [m["pattern"] for m in sig.matches]
    assert any(s["pattern"] == "partitioned_table" and "writes variables" in s["reason"] for s in sig.skips)
    served = tf.saved_model.load(str(dst))
    served.signatures["update"](delta=tf.constant(100.0))
    got = served.signatures["serving_default"](**{k: tf.constant(v) for k, v in inputs.items()})
    module.update(tf.constant(100.0))
    want = module.serve(**{k: tf.constant(v) for k, v in inputs.items()})
    for k in want:
        assert_close(got[k], want[k])


@pytest.mark.saved_model
def test_partitions_are_not_merged_unless_asked_and_checkpoints_reach_the_rewritten_model(tmp_path, rng):
    # A merged table is a copy made at rewrite time: a checkpoint restored
    # into the partitions (or a newer export's variables/) did not reach
    # it, and the rewritten model served stale rows without an error.
    module = PartitionedModule(rng, "mod")
    inputs = partitioned_inputs(rng, sum(PART_SIZES))
    report, sig, dst = save_and_optimize(tmp_path, module, inputs, merge_partitions=False)
    assert report.ok and sig.outputs_match
    assert "partitioned_table" not in [m["pattern"] for m in sig.matches]
    reasons = [s["reason"] for s in sig.skips if s["pattern"] == "partitioned_table"]
    assert len(reasons) == 2 and all("--merge-partitions" in r for r in reasons), reasons  # one per lookup
    for part in module.parts:
        part.assign_add(tf.ones_like(part))
    checkpoint = tf.train.Checkpoint(m=module).write(str(tmp_path / "ckpt" / "ckpt"))
    served = tf.saved_model.load(str(dst))
    tf.train.Checkpoint(m=served).restore(checkpoint).expect_partial()
    feeds = {k: tf.constant(v) for k, v in inputs.items()}
    got, want = served.signatures["serving_default"](**feeds), module.serve(**feeds)
    for k in want:
        assert_close(got[k], want[k])


@pytest.mark.saved_model
def test_partitions_a_function_outside_the_signatures_writes_are_not_merged(tmp_path, rng):
    # A hook kept for Python callers (not a signature) that updates the
    # partitions: only the signatures' writes were looked for, so the merged
    # copy served stale rows after the hook ran.
    module = PartitionedModule(rng, "mod")
    module.bump = tf.function(lambda d: [p.assign_add(tf.fill(tf.shape(p), d)) for p in module.parts] and d,
                              input_signature=[tf.TensorSpec([], tf.float32)])
    inputs = partitioned_inputs(rng, sum(PART_SIZES))
    report, sig, dst = save_and_optimize(tmp_path, module, inputs, merge_partitions=True)
    assert "partitioned_table" not in [m["pattern"] for m in sig.matches]
    assert any(s["pattern"] == "partitioned_table" and "writes variables" in s["reason"] for s in sig.skips)
    served = tf.saved_model.load(str(dst))
    served.bump(tf.constant(1.0))
    module.bump(tf.constant(1.0))
    feeds = {k: tf.constant(v) for k, v in inputs.items()}
    got, want = served.signatures["serving_default"](**feeds), module.serve(**feeds)
    for k in want:
        assert_close(got[k], want[k])


def manual_partitioned(parts, also_stitched):
    def f(ids):
        flat = tf.reshape(ids, [-1])
        assign = tf.cast(flat % 2, tf.int32)
        local = tf.dynamic_partition(flat // 2, assign, 2)
        positions = tf.dynamic_partition(tf.range(tf.size(flat)), assign, 2)
        rows = [tf.gather(p, i) for p, i in zip(parts, local)]
        stitched = tf.raw_ops.ParallelDynamicStitch(indices=positions, data=rows)
        out = tf.reshape(stitched, tf.concat([tf.shape(ids), [D]], 0))
        return {"out": out, "stitched": stitched} if also_stitched else {"out": out}

    return f


@pytest.mark.saved_model
@pytest.mark.parametrize("also_stitched", [False, True], ids=["as written", "stitched rows fetched"])
def test_partitioned_table_written_out(tmp_path, rng, also_stitched):
    module = tf.Module()
    module.parts = [tf.Variable(rng.normal(size=(n, D)).astype(np.float32)) for n in (3, 2)]
    module.serve = tf.function(manual_partitioned(module.parts, also_stitched),
                               input_signature=[tf.TensorSpec([None], tf.int64, name="ids")])
    inputs = {"ids": rng.integers(0, 5, size=7)}
    report, sig, _ = save_and_optimize(tmp_path, module, inputs)
    merged = [m for m in sig.matches if m["pattern"] == "partitioned_table"]
    if also_stitched:
        assert not merged
        assert any("reshaped back" in s["reason"] for s in sig.skips), sig.skips
    else:
        assert [m["strategy"] for m in merged] == ["mod"]
    assert report.ok and sig.outputs_match and sig.max_abs_diff == 0


def test_partitioned_table_online_left_alone_with_reason(rng):
    parts = [tf.Variable(rng.normal(size=(n, D)).astype(np.float32)) for n in PART_SIZES]
    ids = random_ids(rng, vocab=sum(PART_SIZES))
    f = lambda sp: tf.compat.v1.nn.embedding_lookup_sparse(parts, sp, None, partition_strategy="div")  # noqa: E731
    got, stats = run_online(f, ids)
    assert stats["skips"] > 0
    assert_close(got, f(ids))
    cf, graph, report, counts = offline(f, SPARSE2)
    assert any(s["pattern"] == "partitioned_table" and "offline" in s["reason"] for s in report["skip"]), report


@pytest.mark.saved_model
def test_partitioned_table_with_max_norm_fuses_completely(tmp_path, rng):
    module = tf.Module()
    module.parts = [tf.Variable(rng.normal(size=(n, D)).astype(np.float32)) for n in PART_SIZES]

    @tf.function(input_signature=PART_SIGNATURE)
    def serve(indices, ids, shape):
        sp = tf.SparseTensor(indices, ids, shape)
        return {"pooled": tf.compat.v1.nn.embedding_lookup_sparse(module.parts, sp, None, combiner="mean",
                                                                   partition_strategy="mod", max_norm=1.0)}

    module.serve = serve
    report, sig, _ = save_and_optimize(tmp_path, module, partitioned_inputs(rng, sum(PART_SIZES)))
    assert [m["pattern"] for m in sig.matches] == ["partitioned_table", "sparse_segment_lookup", "max_norm_lookup"]
    assert sig.op_counts_after.get("CtrEmbeddingLookup") == 1
    assert not ({"DynamicPartition", "ParallelDynamicStitch", "ResourceGather"} | CLIP_OPS) & set(sig.op_counts_after)
    assert report.ok and sig.outputs_match and sig.max_abs_diff <= 1e-6


# ---------------------------------------------------------------------------
# ids parsed from tf.Examples: canonical by construction, so no SparseReorder


def serialized_examples(rng, rows=40):
    out = []
    for r in range(rows):
        n = int(rng.integers(0, 5)) if r % 7 else 0  # some rows have no id at all
        ids = rng.integers(-2, V, size=n)  # negative ids are pruned by the safe lookup
        weights = rng.uniform(-0.5, 2.0, size=n)
        feature = {"ids": tf.train.Feature(int64_list=tf.train.Int64List(value=ids)),
                   "w": tf.train.Feature(float_list=tf.train.FloatList(value=weights))}
        if r % 11 == 3:
            feature = {}  # the feature missing altogether
        out.append(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return tf.constant(out)


@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_offline_safe_lookup_of_parsed_ids_needs_no_reorder(rng, big_table, combiner, weighted):
    spec = {"ids": tf.io.VarLenFeature(tf.int64), "w": tf.io.VarLenFeature(tf.float32)}

    def f(serialized):
        parsed = tf.io.parse_example(serialized, spec)
        return tf.nn.safe_embedding_lookup_sparse(big_table, parsed["ids"], parsed["w"] if weighted else None,
                                                  combiner=combiner)

    cf, graph, report, counts = offline(f, tf.TensorSpec([None], tf.string))
    assert patterns(report)[-1] == "safe_lookup", report
    assert counts.get("CtrEmbeddingLookup") == 1 and "SparseReorder" not in counts, counts
    examples = serialized_examples(rng)
    [got] = run_graph_def(cf, graph, examples)
    assert_close(got, f(examples))


# ---------------------------------------------------------------------------
# categorical_column_with_hash_bucket: the hash of parsed string keys folds
# into the fused lookup where the graph is served on a CPU (string_keys).


def serialized_string_examples(rng, rows=40):
    out = []
    for r in range(rows):
        n = int(rng.integers(0, 5)) if r % 7 else 0
        keys = [f"{rng.integers(0, 10_000):08x}".encode() for _ in range(n)]
        if n and r % 5 == 0:
            keys[0] = b""  # an empty string is a key like any other
        feature = {"cat": tf.train.Feature(bytes_list=tf.train.BytesList(value=keys))} if r % 11 != 3 else {}
        out.append(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return tf.constant(out)


def hashed_column_fn(table, combiner, buckets=V, also_read_buckets=False):
    spec = {"cat": tf.io.VarLenFeature(tf.string)}

    def f(serialized):
        parsed = tf.io.parse_example(serialized, spec)["cat"]
        ids = tf.SparseTensor(parsed.indices, tf.strings.to_hash_bucket_fast(parsed.values, buckets),
                              parsed.dense_shape)
        out = tf.nn.safe_embedding_lookup_sparse(table, ids, None, combiner=combiner)
        return (out, tf.reduce_sum(ids.values)) if also_read_buckets else out
    return f


@pytest.mark.parametrize("combiner", COMBINERS)
def test_hashed_string_keys_fold_into_the_lookup_on_cpu(rng, big_table, combiner):
    f = hashed_column_fn(big_table, combiner)
    cf = tf.function(f).get_concrete_function(tf.TensorSpec([None], tf.string))
    graph, report = rewrite.optimize_concrete_function(cf, serving_device="cpu")
    counts = rewrite.op_counts(graph, library=True)
    assert patterns(report)[-1] == "string_keys", report
    assert counts.get("CtrEmbeddingLookup") == 1 and "StringToHashBucketFast" not in counts, counts
    [fused] = [n for n in graph.node if n.op == "CtrEmbeddingLookup"]
    assert fused.attr["Tid"].type == tf.string.as_datatype_enum and fused.attr["id_mode"].s == b"hash"
    examples = serialized_string_examples(rng)
    [got] = run_graph_def(cf, graph, examples)
    assert_close(got, f(examples))


@pytest.mark.parametrize("combiner", COMBINERS)
def test_hashed_dense_string_keys_of_a_raw_receiver_fold_past_the_reorder(rng, big_table, combiner):
    # A TF1 receiver of raw [B, N] strings ("" for a missing key), as the hash
    # bucket column builds it: ids not known to be in row order get the safe
    # lookup's SparseReorder, which then permutes the strings instead.
    def f(keys):
        sparse = tf.sparse.from_dense(keys)
        sparse = tf.sparse.reorder(tf.SparseTensor(tf.reverse(sparse.indices, [0]), tf.reverse(sparse.values, [0]),
                                                   sparse.dense_shape))
        ids = tf.SparseTensor(sparse.indices, tf.strings.to_hash_bucket_fast(sparse.values, V), sparse.dense_shape)
        return tf.nn.safe_embedding_lookup_sparse(big_table, ids, None, combiner=combiner)

    cf = tf.function(f).get_concrete_function(tf.TensorSpec([None, 4], tf.string))
    graph, report = rewrite.optimize_concrete_function(cf, serving_device="cpu")
    counts = rewrite.op_counts(graph, library=True)
    assert "string_keys" in patterns(report), report
    assert "StringToHashBucketFast" not in counts, counts
    words = np.array(["", "a", "bb", "ccc", "", "d"], object)
    for batch in (0, 1, 30):
        keys = tf.constant(words[rng.integers(0, len(words), size=(batch, 4))].astype(object))
        [got] = run_graph_def(cf, graph, keys)
        assert_close(got, f(keys))


@pytest.mark.parametrize("serving_device", [None, "gpu"])
def test_hashed_string_keys_stay_hashed_off_cpu(big_table, serving_device):
    # Without a serving device (or for a GPU) the buckets are what the lookup beside its table reads.
    cf = tf.function(hashed_column_fn(big_table, "mean")).get_concrete_function(tf.TensorSpec([None], tf.string))
    graph, report = rewrite.optimize_concrete_function(cf, serving_device=serving_device)
    counts = rewrite.op_counts(graph, library=True)
    assert "string_keys" not in patterns(report), report
    assert counts.get("CtrEmbeddingLookup") == 1 and counts.get("StringToHashBucketFast") == 1, counts
    # The report says what a CPU server would fuse (hunt 134: it said only
    # that no fused lookup absorbed the hash).
    [reason] = [s["reason"] for s in report["skip"] if s.get("op") == "StringToHashBucketFast"]
    assert "(pattern string_keys): rewrite with " + rewrite.CPU_ONLY_HINT in reason, reason
    # Not where a CPU server would not fuse it either (hunt 135): buckets
    # read elsewhere, or the pattern disabled.
    read_twice = tf.function(hashed_column_fn(big_table, "mean", also_read_buckets=True))
    for fn, disabled in ((read_twice, ()), (tf.function(hashed_column_fn(big_table, "mean")), ("string_keys",))):
        _, report = rewrite.optimize_concrete_function(fn.get_concrete_function(tf.TensorSpec([None], tf.string)),
                                                       serving_device=serving_device, disabled_patterns=disabled)
        reasons = [s["reason"] for s in report["skip"] if s.get("op") == "StringToHashBucketFast"]
        assert reasons and not any("string_keys" in r for r in reasons), reasons


def test_hashed_string_keys_read_elsewhere_stay_with_reason(rng, big_table):
    f = hashed_column_fn(big_table, "sum", also_read_buckets=True)
    cf = tf.function(f).get_concrete_function(tf.TensorSpec([None], tf.string))
    graph, report = rewrite.optimize_concrete_function(cf, serving_device="cpu")
    assert "string_keys" not in patterns(report), report
    reasons = [s["reason"] for s in report["skip"] if s["pattern"] == "string_keys"]
    assert reasons and "StringToHashBucketFast) has another consumer" in reasons[0], report["skip"]
    examples = serialized_string_examples(rng)
    got = run_graph_def(cf, graph, examples)
    for g, w in zip(got, f(examples)):
        assert_close(g, w)


def test_hashed_string_key_outside_the_table_errors_like_the_gather(big_table):
    # More buckets than rows: TF's Gather rejects the bucket, and so does the fused op.
    f = hashed_column_fn(big_table, "sum", buckets=100 * V)
    cf = tf.function(f).get_concrete_function(tf.TensorSpec([None], tf.string))
    graph, report = rewrite.optimize_concrete_function(cf, serving_device="cpu")
    assert patterns(report)[-1] == "string_keys", report
    keys = [f"k{i}".encode() for i in range(50)]
    bad = next(k for k in keys if tf.strings.to_hash_bucket_fast(k, 100 * V).numpy() >= V)
    example = tf.train.Example(features=tf.train.Features(feature={
        "cat": tf.train.Feature(bytes_list=tf.train.BytesList(value=[bad]))})).SerializeToString()
    with pytest.raises(tf.errors.InvalidArgumentError):
        f(tf.constant([example]))
    with pytest.raises(tf.errors.InvalidArgumentError, match=f'key "{bad.decode()}" in row 0 hashes to bucket'):
        run_graph_def(cf, graph, tf.constant([example]))


PARTITIONS_ON_TWO_DEVICES = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from tf_ctr_ops import rewrite

    rng = np.random.default_rng(0)
    sizes, same = (4, 3, 3), sys.argv[1] == "same"
    parts = []
    for p, n in enumerate(sizes):
        with tf.device("/CPU:0" if same else f"/CPU:{p % 2}"):
            parts.append(tf.Variable(rng.normal(size=(n, 4)).astype(np.float32)))
    module = tf.Module()
    module.parts = parts
    module.serve = tf.function(
        lambda ids: tf.compat.v1.nn.embedding_lookup(module.parts, ids, partition_strategy="mod"),
        input_signature=[tf.TensorSpec([None], tf.int64, name="ids")])
    options = tf.saved_model.SaveOptions(
        experimental_variable_policy=tf.saved_model.experimental.VariablePolicy.SAVE_VARIABLE_DEVICES)
    tf.saved_model.save(module, "src", signatures={"serving_default": module.serve}, options=options)
    inputs = {"ids": np.array([0, 9, 4, 4, 7], np.int64)}
    report = rewrite.optimize_saved_model("src", "dst", sample_inputs={"serving_default": inputs}, runs=2,
                                          merge_partitions=True)
    sig = report.signatures["serving_default"]
    print(json.dumps({"ok": report.ok, "match": bool(sig.outputs_match),
                      "merged": [m["pattern"] for m in sig.matches].count("partitioned_table"),
                      "skips": [s["reason"] for s in sig.skips if s["pattern"] == "partitioned_table"]}))
""")


@pytest.mark.saved_model
@pytest.mark.parametrize("placement", ["same", "two"])
def test_partitions_on_different_devices_are_never_merged(tmp_path, placement):
    """Partitions saved with their devices (SAVE_VARIABLE_DEVICES) on two
    devices stay partitioned; on one device they merge."""
    import json
    import subprocess
    import sys

    from conftest import fresh_process_env

    run = subprocess.run([sys.executable, "-c", PARTITIONS_ON_TWO_DEVICES, placement], cwd=tmp_path,
                         env=fresh_process_env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["ok"] and result["match"], result
    if placement == "same":
        assert result["merged"] == 1 and not result["skips"], result
    else:
        assert result["merged"] == 0, result
        assert any("different devices (/device:CPU:0, /device:CPU:1)" in r for r in result["skips"]), result


# ---------------------------------------------------------------------------
# GraphDefs TF itself would refuse, given to the offline driver


_MALFORMED_GRAPH_SCRIPT = textwrap.dedent('''
    import sys
    import tensorflow as tf
    import tf_ctr_ops
    from tf_ctr_ops import rewrite

    table = tf.Variable(tf.random.normal([100, 4]))

    def build(fn, spec):
        cf = tf.function(fn, input_signature=[spec]).get_concrete_function()
        return cf.graph.as_graph_def(add_shapes=True), [t.name for t in cf.outputs], rewrite.captured_handle_shapes(cf)

    def node(gd, op):
        return next(n for n in gd.node if n.op == op)

    def malformed(case):
        if case == "bucketize_without_boundaries" or case == "bucketize_without_inputs":
            gd, f, s = build(lambda x: tf.gather(table, tf.raw_ops.Bucketize(input=x, boundaries=[0., 1., 2.])),
                             tf.TensorSpec([None], tf.float32))
            if case == "bucketize_without_boundaries":
                del node(gd, "Bucketize").attr["boundaries"]
            else:
                del node(gd, "Bucketize").input[:]
        else:
            gd, f, s = build(lambda x: tf.gather(table, tf.strings.to_hash_bucket_fast(x, 100) + tf.constant(0, tf.int64)),
                             tf.TensorSpec([None], tf.string))
            hashed = node(gd, "StringToHashBucketFast")
            if case == "duplicate_name":
                gd.node.add().CopyFrom(hashed)
            elif case == "control_input_first":
                hashed.input.insert(0, "^" + hashed.input[0].split(":")[0])
            elif case == "const_without_value":
                del next(n for n in gd.node if n.op == "Const").attr["value"]
            elif case == "identity_cycle":
                ident = gd.node.add()
                ident.name, ident.op = "loop", "Identity"
                ident.input.append("loop")
                ident.attr["T"].type = tf.int64.as_datatype_enum
                hashed.input.append("^loop")
        return gd, f, s

    # One process for all the cases: each spawn pays TensorFlow's import. A
    # case that aborts takes the later ones with it, and their tests fail too.
    for case in sys.argv[1:]:
        gd, f, s = malformed(case)
        try:
            rewrite.optimize_graph_def(gd, f, s, serving_device="cpu")
            print(case, "ACCEPTED", flush=True)
        except RuntimeError as e:
            print(case, "REFUSED", str(e).splitlines()[0], flush=True)
    ''')


_MALFORMED_CASES = ["bucketize_without_boundaries", "bucketize_without_inputs", "duplicate_name",
                    "control_input_first", "const_without_value", "identity_cycle"]


@pytest.fixture(scope="module")
def malformed_graph_run(tmp_path_factory):
    import subprocess
    import sys
    from conftest import fresh_process_env
    cwd = tmp_path_factory.mktemp("malformed")
    script = cwd / "malformed.py"
    script.write_text(_MALFORMED_GRAPH_SCRIPT)
    return subprocess.run([sys.executable, str(script), *_MALFORMED_CASES], capture_output=True, text=True,
                          timeout=300, env=fresh_process_env(), cwd=cwd)


@pytest.mark.parametrize("case", _MALFORMED_CASES)
def test_a_malformed_graph_def_is_refused_not_a_crash(malformed_graph_run, case):
    # Each one aborted the process (a CHECK in a pattern or in TF's shape
    # inference), or, the Identity cycle, looped forever: the offline driver
    # now validates the graph as TF does before running one.
    proc = malformed_graph_run
    outcome = [line for line in proc.stdout.splitlines() if line.startswith(case + " ")]
    assert outcome, f"the child died before {case}: rc {proc.returncode}\n" + proc.stderr[-3000:]
    assert outcome[0].startswith(case + " REFUSED CtrFusionOptimizer failed"), outcome[0]


def test_attrs_stripped_at_their_defaults_are_read_as_their_defaults(big_table):
    # An export that strips default attrs (Estimator's) left a CtrEmbeddingLookup
    # without max_norm: the string-split pattern read it with map::at (abort).
    table = tf.Variable(tf.random.normal([100, 4]))
    cf = tf.function(lambda x: tf.nn.safe_embedding_lookup_sparse(
        table, tf.strings.to_hash_bucket_fast(tf.strings.split(x, ","), 100).to_sparse()),
        input_signature=[tf.TensorSpec([None], tf.string)]).get_concrete_function()
    gd, fetches = cf.graph.as_graph_def(add_shapes=True), [t.name for t in cf.outputs]
    shapes = rewrite.captured_handle_shapes(cf)
    gd, _ = rewrite.optimize_graph_def(gd, fetches, shapes, serving_device="cpu",
                                       disabled_patterns=["string_split_lookup"])
    lookup = next(n for n in gd.node if n.op == "CtrEmbeddingLookup")
    combiner = lookup.attr["combiner"].s
    for attr in ("max_norm", "default_id"):  # at their defaults here (no clip, no default row)
        del lookup.attr[attr]
    optimized, report = rewrite.optimize_graph_def(gd, fetches, shapes, serving_device="cpu")
    assert [m["fused_op"] for m in report["match"]] == ["CtrStringEmbedding"]
    fused = next(n for n in optimized.node if n.op == "CtrStringEmbedding")
    assert fused.attr["combiner"].s == combiner and fused.attr["max_norm"].f < 0

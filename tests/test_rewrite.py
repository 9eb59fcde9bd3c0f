"""CtrFusionOptimizer end to end: online (enable, session_config), offline
(optimize_concrete_function), and SavedModels (optimize_saved_model, the CLI).

Every rewritten graph must compute what the TF-native graph computes; forms
the optimizer does not rewrite yet must still run unchanged, with the
optimizer reporting a skip or nothing, never a rewrite.

EXPECTED_REWRITES (online) and EXPECTED_OFFLINE below are what the optimizer
rewrites today, per form: update them (and the coverage table in docs/rewrite.md,
and the summary in the README) when a pattern lands.
"""

import csv
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import tf_ctr_ops  # noqa: F401  (registers the ops and the optimizer)
from tf_ctr_ops import rewrite
from conftest import data_file, fresh_process_env, serve_in_fresh_process

COMBINERS = ("sum", "mean", "sqrtn")
V, D = 64, 8

# Online (rewrite.enable): rewrites (match records) of one traced function per form.
EXPECTED_REWRITES = {
    "lookup_sparse": 1,  # Unique + ResourceGather + SparseSegment* -> CtrEmbeddingLookup
    "lookup_sparse_const_table": 1,  # the same over GatherV2 on a constant
    "hash_ints": 1,  # ... with StringToHashBucketFast(AsString(ids)) fused in (hash mode)
    "string_split": 2,  # TF1 string_split + hash + lookup: the lookup, then the split into CtrStringEmbedding
    "max_norm": 2,  # the pooling, then the clip_by_norm subgraph into its max_norm (test_rewrite_safe.py)
    "safe": 2,  # the inner lookup, then the retain / SparseFillEmptyRows / Select chain around it
    "safe_weighted_max_norm": 3,  # weighted pooling, its clip, the safe chain
    "weighted_sum": 1,  # Gather + Mul + SegmentSum -> CtrEmbeddingLookup with weights
    "weighted_mean": 1,  # ... + DivNoNan(SegmentSum(w))
    # ... + Sqrt(SegmentSum(Pow(w, 2))), or Square(w) once Grappler's arithmetic pass ran (online)
    "weighted_sqrtn": 1,
}
# Offline (optimize_concrete_function): the patterns that match, in order, per form.
EXPECTED_OFFLINE = {
    "string_split": ["sparse_segment_lookup", "string_split_lookup"],
    "weighted": ["weighted_lookup"],
}
FUSED_OPS = {"CtrEmbeddingLookup", "CtrStringEmbedding"}
REPLACED_OPS = {"Unique", "ResourceGather", "SparseSegmentSum", "SparseSegmentMean", "SparseSegmentSqrtN"}


def delta(before, after):
    return {k: after[k] - before[k] for k in before}


# Online graphs reach the optimizer placed; on a host without a GPU the
# concatenated string op is placed on the CPU, and a last pass makes it read
# its string tensors in place (string_tensors): one rewrite more.
CPU_PLACED = not tf.config.list_physical_devices("GPU")
CPU_PASS = 1 if CPU_PLACED else 0
CONCAT_ONLINE_OP = "CtrConcatStringTensorEmbedding" if CPU_PLACED else "CtrConcatStringEmbedding"


def run_online(fn, *args):
    """Traces and runs a fresh tf.function under rewrite.enable(); returns the
    result and the optimizer's counter deltas."""
    before = rewrite.fusion_stats()
    with rewrite.enable():
        out = tf.function(fn)(*args)
    return out, delta(before, rewrite.fusion_stats())


def assert_same(got, want):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


def random_sparse_ids(rng, rows=32, max_len=6, vocab=V, empty_rows=True):
    lengths = rng.integers(0 if empty_rows else 1, max_len + 1, size=rows)
    lengths[-1] = max(lengths[-1], 1)  # keep the row count: TF's output has max(row) + 1 rows
    values = rng.integers(0, vocab, size=lengths.sum())
    return tf.RaggedTensor.from_row_lengths(values.astype(np.int64), lengths).to_sparse()


def read_csv(name):
    with open(data_file(name), newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture
def table(rng):
    return tf.Variable(rng.normal(size=(V, D)).astype(np.float32))


# ---------------------------------------------------------------------------
# Online: rewrite.enable() for tf.functions


@pytest.mark.parametrize("combiner", COMBINERS)
def test_online_lookup_sparse_every_combiner(rng, table, combiner):
    ids = random_sparse_ids(rng)
    want = tf.nn.embedding_lookup_sparse(table, ids, None, combiner=combiner)
    got, stats = run_online(lambda sp: tf.nn.embedding_lookup_sparse(table, sp, None, combiner=combiner), ids)
    assert stats["rewrites"] == EXPECTED_REWRITES["lookup_sparse"]
    assert_same(got, want)


def test_online_lookup_sparse_on_constant_table(rng):
    params = tf.constant(rng.normal(size=(V, D)).astype(np.float32))
    ids = random_sparse_ids(rng)
    want = tf.nn.embedding_lookup_sparse(params, ids, None, combiner="sqrtn")
    got, stats = run_online(lambda sp: tf.nn.embedding_lookup_sparse(params, sp, None, combiner="sqrtn"), ids)
    assert stats["rewrites"] == EXPECTED_REWRITES["lookup_sparse_const_table"]
    assert_same(got, want)


@pytest.mark.parametrize("form", ["max_norm", "safe", "weighted_sum", "weighted_mean", "weighted_sqrtn"])
def test_online_partly_or_not_rewritten_forms_stay_exact(rng, table, form):
    ids = random_sparse_ids(rng, empty_rows=True)
    weights = tf.SparseTensor(ids.indices, rng.uniform(0.5, 2.0, size=ids.values.shape).astype(np.float32),
                              ids.dense_shape)

    def f(sp, w):
        if form == "max_norm":
            return tf.nn.embedding_lookup_sparse(table, sp, None, combiner="mean", max_norm=0.5)
        if form == "safe":
            return tf.nn.safe_embedding_lookup_sparse(table, sp, None, combiner="sqrtn")
        return tf.nn.embedding_lookup_sparse(table, sp, w, combiner=form.split("_")[1])

    want = f(ids, weights)
    got, stats = run_online(f, ids, weights)
    assert stats["rewrites"] == EXPECTED_REWRITES[form]
    if EXPECTED_REWRITES[form] == 0:  # left alone, with a reason
        assert stats["skips"] > 0
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_online_hash_of_int_ids_is_fused(rng, table):
    keys = random_sparse_ids(rng, vocab=10**12)

    def f(sp):
        buckets = tf.strings.to_hash_bucket_fast(tf.strings.as_string(sp.values), V)
        return tf.nn.embedding_lookup_sparse(table, tf.SparseTensor(sp.indices, buckets, sp.dense_shape), None,
                                             combiner="mean")

    want = f(keys)
    got, stats = run_online(f, keys)
    assert stats["rewrites"] == EXPECTED_REWRITES["hash_ints"]
    assert_same(got, want)
    # The offline view shows the hashing went into the fused op.
    graph, report = rewrite.optimize_concrete_function(
        tf.function(f).get_concrete_function(tf.SparseTensorSpec([None, None], tf.int64)))
    counts = rewrite.op_counts(graph, library=True)
    assert "StringToHashBucketFast" not in counts and "AsString" not in counts
    assert any(n.op == "CtrEmbeddingLookup" and n.attr["id_mode"].s == b"hash" for n in graph.node)
    assert report["match"][0]["fused_op"] == "CtrEmbeddingLookup"


def tf1_split_lookup(table, delimiter, combiner="mean"):
    def f(strings):
        sp = tf.compat.v1.string_split(strings, delimiter)
        buckets = tf.strings.to_hash_bucket_fast(sp.values, V)
        return tf.nn.embedding_lookup_sparse(table, tf.SparseTensor(sp.indices, buckets, sp.dense_shape), None,
                                             combiner=combiner)

    return f


def check_tf1_split(table, strings, delimiter, combiner="mean", report_file=None):
    f = tf1_split_lookup(table, delimiter, combiner)
    strings = tf.constant(strings)
    want = f(strings)
    before = rewrite.fusion_stats()
    with rewrite.enable(report_file=report_file):
        got = tf.function(f)(strings)
    stats = delta(before, rewrite.fusion_stats())
    assert stats["rewrites"] == EXPECTED_REWRITES["string_split"]
    assert_same(got, want)
    return stats


def test_online_tf1_string_split_random(rng, table, tmp_path):
    strings = [",".join(str(v) for v in rng.integers(0, 1000, size=rng.integers(0, 6))) for _ in range(40)]
    strings[-1] = "7,8"
    for combiner in COMBINERS:
        report_file = tmp_path / f"{combiner}.jsonl"
        check_tf1_split(table, strings, ",", combiner, report_file=report_file)
        records = rewrite.read_report(report_file)
        patterns = [m["pattern"] for m in records["match"]]
        assert patterns == ["sparse_segment_lookup", "string_split_lookup"][:EXPECTED_REWRITES["string_split"]]
        if EXPECTED_REWRITES["string_split"] == 1:  # the split part is reported as left alone, with a reason
            assert any(k["pattern"] == "string_split_lookup" and k["reason"] for k in records["skip"])


def test_online_tf1_string_split_criteo(table):
    rows = read_csv("criteo_sample.txt")
    cats = [",".join(r[f"C{i}"] for i in range(1, 27)) for r in rows]
    check_tf1_split(table, cats, ",", "sum")


def test_online_movielens_genres(table):
    genres = [r["genres"] for r in read_csv("movielens_sample.txt")]
    assert any("|" in g for g in genres)
    check_tf1_split(table, genres, "|", "sqrtn")


def test_online_criteo_integer_features_hashed(table):
    rows = read_csv("criteo_sample.txt")
    # The 13 integer features of each row, as ids (absent ones dropped).
    ragged = tf.ragged.constant([[int(float(r[f"I{i}"])) for i in range(1, 14) if r[f"I{i}"]] for r in rows],
                                tf.int64)
    ids = ragged.to_sparse()

    def f(sp):
        buckets = tf.strings.to_hash_bucket_fast(tf.strings.as_string(sp.values), V)
        return tf.nn.embedding_lookup_sparse(table, tf.SparseTensor(sp.indices, buckets, sp.dense_shape), None)

    want = f(ids)
    got, stats = run_online(f, ids)
    assert stats["rewrites"] == EXPECTED_REWRITES["hash_ints"]
    assert_same(got, want)


@pytest.mark.parametrize("form", ["safe_sparse", "split_strings"])
def test_online_lookups_inside_while_loops_stay_as_they_are(rng, table, tmp_path, form):
    """A loop body runs in its loop's frame, which a node the rewrite adds
    would not be in (TF refused the graph: "inputs from different frames").
    The body is left alone, with the reason in the report."""
    sp = random_sparse_ids(rng)
    strings = tf.constant([",".join(str(i) for i in rng.integers(0, V, size=3)) for _ in range(5)] + [""])

    def body_sum(x):
        if form == "safe_sparse":
            return tf.nn.safe_embedding_lookup_sparse(table, x, None, combiner="mean")
        ids = tf.strings.to_hash_bucket_fast(tf.strings.split(x, ","), V)
        return tf.reduce_mean(tf.nn.embedding_lookup(table, ids), axis=1)

    def looped(x):
        init = tf.zeros_like(body_sum(x))
        return tf.while_loop(lambda i, acc: i < 3, lambda i, acc: (i + 1, acc + body_sum(x)), [0, init])[1]

    x = sp if form == "safe_sparse" else strings
    want = tf.function(looped)(x)
    report = tmp_path / "r.jsonl"
    with rewrite.enable(report_file=str(report)):
        got = tf.function(looped)(x)
    assert_same(got, want)
    reasons = [r["reason"] for r in rewrite.read_report(report)["skip"]]
    assert any("inside while loops" in r for r in reasons), reasons


def test_enable_plain_call_and_disable(rng, table):
    ids = random_sparse_ids(rng)
    want = tf.nn.embedding_lookup_sparse(table, ids, None)
    f = lambda sp: tf.nn.embedding_lookup_sparse(table, sp, None)  # noqa: E731
    before = rewrite.fusion_stats()
    handle = rewrite.enable()
    try:
        got = tf.function(f)(ids)
    finally:
        handle.disable()
    assert delta(before, rewrite.fusion_stats())["rewrites"] == 1
    assert_same(got, want)
    # Disabled again: a new function is not rewritten (nor even optimized by it).
    before = rewrite.fusion_stats()
    assert_same(tf.function(f)(ids), want)
    assert delta(before, rewrite.fusion_stats()) == {"graphs": 0, "rewrites": 0, "skips": 0}
    handle.disable()  # idempotent


@pytest.mark.parametrize("order", ["first_enabled_first", "last_enabled_first"])
def test_enable_handles_disable_in_any_order(rng, table, order):
    # Each handle restored the config it replaced: disabling the older one
    # first, then the newer, left the optimizer on.
    ids = random_sparse_ids(rng)
    f = lambda sp: tf.nn.embedding_lookup_sparse(table, sp, None)  # noqa: E731
    handles = [rewrite.enable(), rewrite.enable(serving_device="cpu")]
    for handle in handles if order == "first_enabled_first" else handles[::-1]:
        handle.disable()
    before = rewrite.fusion_stats()
    tf.function(f)(ids)
    assert delta(before, rewrite.fusion_stats()) == {"graphs": 0, "rewrites": 0, "skips": 0}


def test_one_of_two_handles_disabled_keeps_the_other_on(rng, table):
    ids = random_sparse_ids(rng)
    f = lambda sp: tf.nn.embedding_lookup_sparse(table, sp, None)  # noqa: E731
    first, second = rewrite.enable(), rewrite.enable()
    try:
        first.disable()
        before = rewrite.fusion_stats()
        tf.function(f)(ids)
        assert delta(before, rewrite.fusion_stats())["rewrites"] == 1
    finally:
        second.disable()


def _function_config():
    from tensorflow.python.eager import context

    return tf.compat.v1.ConfigProto.FromString(context.context().function_call_options.config_proto_serialized)


_SETTER_AFTER_ENABLE = """
import tensorflow as tf
from tensorflow.core.protobuf import rewriter_config_pb2
from tensorflow.python.eager import context
from tf_ctr_ops import rewrite
def config():
    return tf.compat.v1.ConfigProto.FromString(context.context().function_call_options.config_proto_serialized)
table = tf.ones([8, 2])
ids = tf.SparseTensor([[0, 0], [1, 0]], tf.constant([1, 3], tf.int64), [2, 1])
handle = rewrite.enable()
tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False})
handle.disable()
rewrites = config().graph_options.rewrite_options
print(rewrites.arithmetic_optimization == rewriter_config_pb2.RewriterConfig.OFF,
      [c.name for c in rewrites.custom_optimizers])
# A setter between two handles, the older disabled first: the newer one
# handed back the config from before the setter.
older = rewrite.enable()
tf.config.optimizer.set_experimental_options({"constant_folding": False})
newer = rewrite.enable()
older.disable()
newer.disable()
rewrites = config().graph_options.rewrite_options
print(rewrites.constant_folding == rewriter_config_pb2.RewriterConfig.OFF,
      [c.name for c in rewrites.custom_optimizers])
# A min_graph_nodes set since enable() (which sets its own) stays.
handle = rewrite.enable()
tf.config.optimizer.set_experimental_options({"min_graph_nodes": 7})
handle.disable()
print(config().graph_options.rewrite_options.min_graph_nodes)
"""


def test_disable_keeps_tf_config_settings_made_after_enable(tmp_path):
    # A tf.config setter rebuilds the thread's function options (the rewrite
    # is then off, as documented); disable() then restored the whole config
    # enable() had saved, undoing the user's later setting. In a process of
    # its own: the setting is process-wide.
    proc = subprocess.run([sys.executable, "-c", _SETTER_AFTER_ENABLE], cwd=tmp_path, env=fresh_process_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[-4:] == ["True []", "True []", "7", ""], proc.stdout


def test_a_nested_enable_takes_its_own_options_alone(tmp_path):
    # The inner enable() kept the outer one's report file but not its other options.
    with rewrite.enable(report_file=str(tmp_path / "r.jsonl"), serving_device="cpu",
                        disabled_patterns=["safe_lookup"]):
        with rewrite.enable():
            [entry] = [c for c in _function_config().graph_options.rewrite_options.custom_optimizers
                       if c.name == "CtrFusionOptimizer"]
            assert dict(entry.parameter_map) == {}
        [entry] = [c for c in _function_config().graph_options.rewrite_options.custom_optimizers
                   if c.name == "CtrFusionOptimizer"]
        assert set(entry.parameter_map) == {"report_file", "serving_device", "disabled_patterns"}


def test_a_relative_report_file_is_written_where_it_was_named(rng, table, tmp_path, monkeypatch):
    # Checked against one working directory, written against another (the
    # one current when the function ran): the records were lost.
    (tmp_path / "reports").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    ids = random_sparse_ids(rng)
    with rewrite.enable(report_file="reports/r.jsonl"):
        monkeypatch.chdir(tmp_path / "elsewhere")
        tf.function(lambda sp: tf.nn.embedding_lookup_sparse(table, sp, None))(ids)
    assert rewrite.read_report(str(tmp_path / "reports" / "r.jsonl"))["match"]
    # "link/.." is where the link's target's parent is, as the OS reads it
    # (made absolute lexically, it was this folder).
    (tmp_path / "deep" / "inner").mkdir(parents=True)
    os.symlink(tmp_path / "deep" / "inner", tmp_path / "elsewhere" / "link")
    with rewrite.enable(report_file="link/../r.jsonl"):
        tf.function(lambda sp: tf.nn.embedding_lookup_sparse(table, sp, None))(ids)
    assert rewrite.read_report(str(tmp_path / "deep" / "r.jsonl"))["match"]


def test_reading_a_report_that_was_never_written_is_an_error(rng, table, tmp_path):
    # It read as an empty report: "nothing fused" for a mistyped path.
    path = str(tmp_path / "r.jsonl")
    f = tf.function(lambda sp: tf.nn.embedding_lookup_sparse(table, sp, None))
    with rewrite.enable(report_file=path):
        with pytest.raises(FileNotFoundError, match="no rewrite report at .*r.jsonl: no graph was optimized"):
            rewrite.read_report(path)  # defined, not yet called: nothing optimized
        f(random_sparse_ids(rng))
    assert rewrite.read_report(path)["match"]
    with pytest.raises(FileNotFoundError, match="or the path is wrong"):
        rewrite.read_report(str(tmp_path / "r.json"))


def test_options_that_would_silently_do_nothing_are_errors(tmp_path):
    # A report in a missing folder was dropped unseen; a config without the
    # meta optimizer never ran the pass.
    with pytest.raises(FileNotFoundError, match="does not exist"):
        rewrite.enable(report_file=str(tmp_path / "missing" / "r.jsonl"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        rewrite.session_config(report_file=str(tmp_path / "missing" / "r.jsonl"))
    off = tf.compat.v1.ConfigProto()
    off.graph_options.rewrite_options.disable_meta_optimizer = True
    with pytest.raises(ValueError, match="disables Grappler's meta optimizer"):
        rewrite.session_config(off)


def test_enable_handles_of_two_threads_are_apart(rng, table):
    # The config is per thread: one process-wide list of handles let a
    # handle of thread B decide what thread A's disable restored.
    import threading

    ids = random_sparse_ids(rng)
    f = lambda sp: tf.nn.embedding_lookup_sparse(table, sp, None)  # noqa: E731
    b_enabled, a_disabled, b_result = threading.Event(), threading.Event(), {}

    def thread_b():
        handle = rewrite.enable()
        b_enabled.set()
        a_disabled.wait()
        before = rewrite.fusion_stats()
        tf.function(f)(ids)
        b_result["rewrites"] = delta(before, rewrite.fusion_stats())["rewrites"]
        handle.disable()

    handle = rewrite.enable()
    other = threading.Thread(target=thread_b)
    other.start()
    b_enabled.wait()
    handle.disable()
    a_disabled.set()
    other.join()
    before = rewrite.fusion_stats()
    tf.function(f)(ids)
    assert delta(before, rewrite.fusion_stats())["rewrites"] == 0
    assert b_result["rewrites"] == 1


def test_disable_in_another_thread_is_an_error_and_leaves_the_handle_working(rng, table):
    # It restored the config of the thread it ran in, and dropped the
    # handle: the enabling thread kept the rewrite with no way to stop it.
    import threading

    ids = random_sparse_ids(rng)
    f = lambda sp: tf.nn.embedding_lookup_sparse(table, sp, None)  # noqa: E731
    handle, errors = rewrite.enable(), []

    def disable_elsewhere():
        try:
            handle.disable()
        except RuntimeError as e:
            errors.append(str(e))

    other = threading.Thread(target=disable_elsewhere)
    other.start()
    other.join()
    handle.disable()
    before = rewrite.fusion_stats()
    tf.function(f)(ids)
    assert delta(before, rewrite.fusion_stats())["rewrites"] == 0
    assert len(errors) == 1 and "thread that called enable()" in errors[0]


def test_a_handle_of_a_thread_that_ended_is_refused_in_the_next(rng, table):
    # The next thread may get the ended one's id: the check by id let the
    # old handle restore its config over the new thread's own enable().
    import threading

    ids = random_sparse_ids(rng)
    f = lambda sp: tf.nn.embedding_lookup_sparse(table, sp, None)  # noqa: E731
    box = {}
    first = threading.Thread(target=lambda: box.update(handle=rewrite.enable()))
    first.start()
    first.join()

    def second():
        own = rewrite.enable()
        try:
            box["handle"].disable()
        except RuntimeError as e:
            box["error"] = str(e)
        before = rewrite.fusion_stats()
        tf.function(f)(ids)
        box["rewrites"] = delta(before, rewrite.fusion_stats())["rewrites"]
        own.disable()

    other = threading.Thread(target=second)
    other.start()
    other.join()
    assert "thread that called enable()" in box.get("error", ""), box
    assert box["rewrites"] == 1


def test_session_config_tf1_session(rng):
    params = rng.normal(size=(V, D)).astype(np.float32)
    ids = random_sparse_ids(rng)
    want = tf.nn.embedding_lookup_sparse(tf.constant(params), ids, None, combiner="sqrtn").numpy()
    feed = tf.compat.v1.SparseTensorValue(ids.indices.numpy(), ids.values.numpy(), ids.dense_shape.numpy())
    with tf.Graph().as_default():
        table = tf.compat.v1.get_variable("table", initializer=params, use_resource=True)
        sp = tf.compat.v1.sparse_placeholder(tf.int64, shape=[None, None])
        out = tf.nn.embedding_lookup_sparse(table, sp, None, combiner="sqrtn")
        before = rewrite.fusion_stats()
        with tf.compat.v1.Session(config=rewrite.session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            got = sess.run(out, {sp: feed})
    assert delta(before, rewrite.fusion_stats())["rewrites"] == EXPECTED_REWRITES["lookup_sparse"]
    assert_same(got, want)


def test_a_placeholder_with_default_is_fed_any_size_its_declared_shape_takes(rng):
    # Inference gave it its default's shape: the rewritten graph held a feed
    # of 3 ids to [2] (and a rewrite's verification failed on it).
    params = rng.normal(size=(V, D)).astype(np.float32)
    with tf.Graph().as_default() as g:
        table = tf.compat.v1.get_variable("table", initializer=params, use_resource=True)
        ids = tf.compat.v1.placeholder_with_default(tf.constant([1, 2], tf.int64), shape=[None], name="ids")
        out = tf.nn.embedding_lookup_sparse(table, tf.sparse.from_dense(tf.reshape(ids, [-1, 1])), None,
                                            combiner="sum")
        before = rewrite.fusion_stats()
        with tf.compat.v1.Session(graph=g, config=rewrite.session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for feed in ([1, 2, 3], [4], []):
                assert_same(sess.run(out, {ids: feed}), params[feed].reshape(-1, D))
            assert_same(sess.run(out), params[[1, 2]])
    assert delta(before, rewrite.fusion_stats())["rewrites"] >= 1


def test_session_config_tf1_session_with_string_features(rng):
    """A session's graph reaches the optimizer placed; the string patterns add
    their packs without a device, which the optimizer then places beside the
    strings (an unplaced node failed the session's run with an InternalError)."""
    vocab = 64
    tables = [rng.normal(size=(vocab, d)).astype(np.float32) for d in (4, 8)]
    keys = [b"a", b"", b"ff01", b"q"]
    lists = ["1|5", "", "3||2", "7"]
    with tf.Graph().as_default() as g:
        t = [tf.constant(x) for x in tables]
        a = tf.compat.v1.placeholder(tf.string, [None])
        b = tf.compat.v1.placeholder(tf.string, [None])
        hashed = tf.nn.embedding_lookup(t[0], tf.strings.to_hash_bucket_fast(a, vocab))
        sp = tf.compat.v1.string_split(b, "|")
        ids = tf.SparseTensor(sp.indices, tf.strings.to_number(sp.values, tf.int64), sp.dense_shape)
        out = tf.concat([hashed, tf.nn.embedding_lookup_sparse(t[1], ids, None, combiner="sqrtn")], axis=1)
        with tf.compat.v1.Session(graph=g) as sess:
            want = sess.run(out, {a: keys, b: lists})
        before = rewrite.fusion_stats()
        with tf.compat.v1.Session(graph=g, config=rewrite.session_config()) as sess:
            meta = tf.compat.v1.RunMetadata()
            got = sess.run(out, {a: keys, b: lists}, run_metadata=meta,
                           options=tf.compat.v1.RunOptions(output_partition_graphs=True))
    assert delta(before, rewrite.fusion_stats())["rewrites"] >= 3
    ops = {n.op for pg in meta.partition_graphs for n in pg.node}
    assert CONCAT_ONLINE_OP in ops and "ConcatV2" not in ops
    assert_same(got, want)


def test_session_config_honours_feeds_of_computed_tensors(rng):
    """A TF1 session may feed any tensor. A run that feeds one the pass would
    fuse away (the hashed ids of a gather, the split values of a lookup) is
    left alone, so the fed value is read as TF reads it; runs that feed only
    the graph's inputs still fuse."""
    vocab = 50
    params = rng.normal(size=(vocab, 4)).astype(np.float32)
    with tf.Graph().as_default() as g:
        table = tf.constant(params)
        s = tf.compat.v1.placeholder(tf.string, [None])
        t = tf.compat.v1.placeholder(tf.string, [None])
        hashed = tf.strings.to_hash_bucket_fast(s, vocab)
        sp = tf.compat.v1.string_split(t, ",")
        split_ids = tf.strings.to_hash_bucket_fast(sp.values, vocab)
        pooled = tf.nn.embedding_lookup_sparse(table, tf.SparseTensor(sp.indices, split_ids, sp.dense_shape), None,
                                               combiner="sum")
        out = tf.concat([tf.nn.embedding_lookup(table, hashed), pooled], 1)
        inputs = {s: [b"a", b"bb", b""], t: [b"x,y", b"", b"z"]}
        runs = [{}, {hashed: [1, 2, 3]}, {split_ids: [7, 8, 9]}]
        with tf.compat.v1.Session(graph=g) as sess:
            want = [sess.run(out, {**inputs, **extra}) for extra in runs]
        with tf.compat.v1.Session(graph=g, config=rewrite.session_config()) as sess:
            for extra, expected in zip(runs, want):
                before = rewrite.fusion_stats()
                assert_same(sess.run(out, {**inputs, **extra}), expected)
                assert (delta(before, rewrite.fusion_stats())["rewrites"] > 0) == (not extra)


def test_session_config_keeps_the_given_config():
    base = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1)
    config = rewrite.session_config(base)
    assert config.intra_op_parallelism_threads == 1
    assert [c.name for c in config.graph_options.rewrite_options.custom_optimizers] == ["CtrFusionOptimizer"]
    assert not base.graph_options.rewrite_options.custom_optimizers  # not modified


# ---------------------------------------------------------------------------
# Offline: optimize_concrete_function

SPARSE_SPEC = tf.SparseTensorSpec([None, None], tf.int64)


def offline(fn, *specs):
    cf = tf.function(fn).get_concrete_function(*specs)
    graph, report = rewrite.optimize_concrete_function(cf)
    return cf, graph, report, rewrite.op_counts(graph, library=True)


def run_graph_def(cf, graph_def, *args):
    """Runs an optimized GraphDef of `cf` (outputs as `cf` returns them)."""
    from tensorflow.python.eager import wrap_function

    captures = {internal.op.name: external for external, internal in cf.graph.captures}
    flat_inputs = [t.name for t in cf.inputs[:len(cf.inputs) - len(captures)]]
    fn = wrap_function.function_from_graph_def(graph_def, flat_inputs, [t.name for t in cf.outputs], captures)
    return fn(*tf.nest.flatten(args, expand_composites=True))


@pytest.mark.parametrize("combiner", COMBINERS)
def test_offline_lookup_is_one_fused_op(rng, table, combiner):
    f = lambda sp: tf.nn.embedding_lookup_sparse(table, sp, None, combiner=combiner)  # noqa: E731
    cf, graph, report, counts = offline(f, SPARSE_SPEC)
    assert counts.get("CtrEmbeddingLookup") == 1
    assert not REPLACED_OPS & set(counts), counts
    [match] = report["match"]
    assert match["pattern"] == "sparse_segment_lookup" and match["fused_op"] == "CtrEmbeddingLookup"
    assert {r.rsplit(" (", 1)[1].rstrip(")") for r in match["replaced"]} >= {"Unique", "ResourceGather"}
    assert report["skip"] == []
    ids = random_sparse_ids(rng)
    [got] = run_graph_def(cf, graph, ids)
    assert_same(got, f(ids))


def test_fused_reads_of_a_variable_leave_copy_on_read_mode(rng, table):
    """A variable read sparsely (a gather left native, a sparse optimizer
    update) is in copy-on-read mode, where a plain ReadVariableOp copies the
    whole table at every call. The rewrite's reads leave that mode first, as
    tf.nn's lookups and read_value_no_copy() do; and a table read after a
    sparse read gives the same rows."""
    f = lambda sp: tf.nn.embedding_lookup_sparse(table, sp, None, combiner="sum")  # noqa: E731
    cf, graph, report, counts = offline(f, SPARSE_SPEC)
    reads = [n for n in graph.node if n.op == "ReadVariableOp"]
    disables = {n.name: n for n in graph.node if n.op == "DisableCopyOnRead"}
    assert reads and counts.get("CtrEmbeddingLookup") == 1
    for read in reads:
        waits = [disables[i[1:]] for i in read.input if i.startswith("^") and i[1:] in disables]
        assert [w.input[0] for w in waits] == [read.input[0]], read
    table.sparse_read(tf.constant([0], tf.int64))  # copy-on-read from here on
    ids = random_sparse_ids(rng)
    [got] = run_graph_def(cf, graph, ids)
    assert_same(got, f(ids))


def unique_gather_mean(table, also):
    def f(sp):
        unique, idx = tf.unique(sp.values)
        rows = tf.gather(table, unique)
        pooled = tf.sparse.segment_mean(rows, idx, sp.indices[:, 0])
        return pooled, (unique if also == "unique ids" else rows)

    return f


@pytest.mark.parametrize("case", ["unique ids", "gathered rows", "rank-3 table", "float64 table"])
def test_offline_not_rewritten_with_reason(rng, table, case):
    if case in ("unique ids", "gathered rows"):
        f = unique_gather_mean(table, case)
        reason = "has another consumer"
    elif case == "rank-3 table":
        t3 = tf.Variable(rng.normal(size=(V, 2, 4)).astype(np.float32))
        f = lambda sp: tf.nn.embedding_lookup_sparse(t3, sp, None)  # noqa: E731
        reason = "not a matrix"
    else:
        t64 = tf.Variable(rng.normal(size=(V, D)))
        f = lambda sp: tf.nn.embedding_lookup_sparse(t64, sp, None)  # noqa: E731
        reason = "DT_DOUBLE"
    cf, graph, report, counts = offline(f, SPARSE_SPEC)
    assert report["match"] == [] and not FUSED_OPS & set(counts)
    assert any(reason in s["reason"] for s in report["skip"]), report["skip"]
    ids = random_sparse_ids(rng)
    got = run_graph_def(cf, graph, ids)
    for g, w in zip(got, tf.nest.flatten(f(ids))):
        np.testing.assert_array_equal(g.numpy(), w.numpy())


def test_offline_tf1_string_split(table):
    f = tf1_split_lookup(table, ",", "mean")
    cf, graph, report, counts = offline(f, tf.TensorSpec([None], tf.string))
    assert [m["pattern"] for m in report["match"]] == EXPECTED_OFFLINE["string_split"]
    assert counts.get("CtrStringEmbedding") == 1 and counts.get("CtrPackStrings") == 1
    assert not {"StringSplit", "StringToHashBucketFast", "CtrEmbeddingLookup"} & set(counts), counts
    strings = tf.constant(["1,2,3", "", "4,,5", "x", "", ""])
    [got] = run_graph_def(cf, graph, strings)
    assert_same(got, f(strings))


@pytest.mark.parametrize("combiner", COMBINERS)
def test_offline_weighted_lookup(rng, table, combiner):
    f = lambda sp, w: tf.nn.embedding_lookup_sparse(table, sp, w, combiner=combiner)  # noqa: E731
    cf, graph, report, counts = offline(f, SPARSE_SPEC, tf.SparseTensorSpec([None, None], tf.float32))
    assert [m["pattern"] for m in report["match"]] == EXPECTED_OFFLINE["weighted"]
    if EXPECTED_OFFLINE["weighted"]:
        assert counts.get("CtrEmbeddingLookup") == 1
        assert not {"SegmentSum", "DivNoNan", "ResourceGather"} & set(counts), counts
        assert any(n.attr["has_weights"].b for n in graph.node if n.op == "CtrEmbeddingLookup")
    ids = random_sparse_ids(rng)
    w = tf.SparseTensor(ids.indices, rng.uniform(0.5, 2.0, size=ids.values.shape).astype(np.float32),
                        ids.dense_shape)
    [got] = run_graph_def(cf, graph, ids, w)
    np.testing.assert_allclose(got.numpy(), f(ids, w).numpy(), rtol=1e-5, atol=1e-6)


def test_op_counts_follow_the_function_library():
    graph_def = tf.function(lambda x: tf.function(lambda y: tf.unique(y)[0])(x) + 1).get_concrete_function(
        tf.TensorSpec([None], tf.int64)).graph.as_graph_def()
    assert "Unique" not in rewrite.op_counts(graph_def)
    assert rewrite.op_counts(graph_def, library=True)["Unique"] == 1


# ---------------------------------------------------------------------------
# SavedModels: optimize_saved_model and `python -m tf_ctr_ops optimize`


class LookupModule(tf.Module):
    """A tf.Module with two signatures over one table, and one more table
    behind a string vocabulary (a captured non-variable resource)."""

    def __init__(self, rng):
        super().__init__()
        self.table = tf.Variable(rng.normal(size=(V, D)).astype(np.float32))
        self.unused = tf.Variable(tf.zeros([3]))
        self.vocab = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(tf.constant(["a", "b", "c"]), tf.constant([1, 2, 3], tf.int64)), 0)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64, name="values"),
                                  tf.TensorSpec([None, 2], tf.int64, name="indices")])
    def pooled(self, values, indices):
        sp = tf.SparseTensor(indices, values, tf.stack([tf.reduce_max(indices[:, 0]) + 1, 1000]))
        return {"mean": tf.nn.embedding_lookup_sparse(self.table, sp, None, combiner="mean"),
                "count": tf.size(values)}

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.string, name="tokens")])
    def by_token(self, tokens):
        ids = self.vocab.lookup(tokens)
        sp = tf.sparse.from_dense(ids)
        return {"sum": tf.nn.embedding_lookup_sparse(self.table, sp, None, combiner="sum")}


@pytest.mark.saved_model
def test_optimize_saved_model_api(tmp_path, rng):
    module = LookupModule(rng)
    src, dst = tmp_path / "src", tmp_path / "dst"
    tf.saved_model.save(module, str(src), signatures={"pooled": module.pooled, "by_token": module.by_token})
    samples = {"pooled": {"values": np.array([3, 5, 5, 9], np.int64),
                          "indices": np.array([[0, 0], [0, 1], [2, 0], [2, 1]], np.int64)},
               "by_token": {"tokens": np.array([["a", "b"], ["c", "zz"]], object)}}
    report = rewrite.optimize_saved_model(src, dst, sample_inputs=samples, runs=3)

    assert set(report.signatures) == {"pooled", "by_token"}
    for key, sig in report.signatures.items():
        assert sig.rewritten and sig.inputs == "given"
        assert [m["fused_op"] for m in sig.matches] == ["CtrEmbeddingLookup"], key
        assert sig.op_counts_after.get("CtrEmbeddingLookup") == 1
        assert "Unique" in sig.op_counts_before and "Unique" not in sig.op_counts_after
        assert sig.max_abs_diff <= 1e-6 and sig.outputs_match
        assert sig.latency_ms_before > 0 and sig.latency_ms_after > 0
    assert report.ok and report.verified and report.rewrite_seconds > 0 and not report.rejected_patterns
    assert len(report.matches) == 2 and {m["signature"] for m in report.matches} == {"pooled", "by_token"}

    as_dict = json.loads(report.to_json())
    assert as_dict["max_abs_diff"] <= 1e-6 and as_dict["num_matches"] == 2 and as_dict["ok"]
    text = report.summary()
    assert "signature 'pooled': 1 fused" in text and "outputs match" in text

    # The rewritten model serves the same signatures, input names and output keys.
    loaded, original = tf.saved_model.load(str(dst)), tf.saved_model.load(str(src))
    assert set(loaded.signatures) == {"pooled", "by_token"}
    for key in ("pooled", "by_token"):
        new, old = loaded.signatures[key], original.signatures[key]
        assert new.structured_input_signature == old.structured_input_signature
        assert set(new.structured_outputs) == set(old.structured_outputs)
        inputs = {k: tf.constant(v) for k, v in samples[key].items()}
        for k, want in old(**inputs).items():
            assert_same(new(**inputs)[k], want)


@pytest.mark.saved_model
def test_optimize_saved_model_selected_signature_and_synthesized_inputs(tmp_path, rng):
    module = LookupModule(rng)
    src, dst = tmp_path / "src", tmp_path / "dst"
    tf.saved_model.save(module, str(src), signatures={"pooled": module.pooled, "by_token": module.by_token})
    report = rewrite.optimize_saved_model(src, dst, signature_keys=["pooled"], runs=2)
    assert report.signatures["by_token"].rewritten is False
    assert report.signatures["by_token"].matches == []
    pooled = report.signatures["pooled"]
    # Synthesized: sorted ints (canonical indices), widened to the table's
    # rows, the bound the original names when an id of 999 is past it; then
    # the indices alone, to the widest range the original takes.
    assert pooled.inputs == f"synthesized, ids in [0, {V}) and wider where taken (indices [0, 1000))", pooled.inputs
    assert pooled.outputs_match and pooled.max_abs_diff == 0
    assert "copied unchanged" in report.summary()
    loaded = tf.saved_model.load(str(dst))
    assert_same(loaded.signatures["by_token"](tokens=tf.constant([["a", "c"]]))["sum"],
                module.by_token(tf.constant([["a", "c"]]))["sum"])
    with pytest.raises(ValueError, match="not in"):
        rewrite.optimize_saved_model(src, tmp_path / "x", signature_keys=["nope"])
    with pytest.raises(ValueError, match="differ"):
        rewrite.optimize_saved_model(src, src)


class SparseSignatureModule(tf.Module):
    """A TF2 export of the lookups the rewrite targets, as users write it: a
    signature of SparseTensorSpec ids and weights, which TF flattens into
    three inputs each (indices, values, dense_shape)."""

    def __init__(self, rng):
        super().__init__()
        self.table = tf.Variable(rng.normal(size=(V, D)).astype(np.float32))

    @tf.function(input_signature=[tf.SparseTensorSpec([None, None], tf.int64),
                                  tf.SparseTensorSpec([None, None], tf.float32)])
    def serve(self, ids, weights):
        return {"safe": tf.nn.safe_embedding_lookup_sparse(self.table, ids, weights, combiner="mean"),
                "sum": tf.nn.embedding_lookup_sparse(self.table, ids, None, combiner="sum")}


@pytest.mark.saved_model
def test_optimize_saved_model_synthesizes_sparse_tensor_signature_inputs(tmp_path, rng):
    # The parts of a SparseTensor input were drawn each alone, so indices,
    # values and dense_shape did not fit, the original refused every
    # candidate, and the CLI could not verify (nor write) the model.
    module = SparseSignatureModule(rng)
    src, dst = tmp_path / "src", tmp_path / "dst"
    tf.saved_model.save(module, str(src), signatures={"serving_default": module.serve})
    report = rewrite.optimize_saved_model(src, dst, runs=2)
    sig = report.signatures["serving_default"]
    assert sig.inputs.startswith("synthesized, ids in [0, "), sig.inputs
    assert sig.outputs_match and sig.max_abs_diff is not None and sig.max_abs_diff < 1e-5, report.summary()
    # Two subgraphs fused: the safe lookup refines the CtrEmbeddingLookup its
    # inner weighted lookup became, and was counted as a third.
    assert "signature 'serving_default': 2 fused" in report.summary(), report.summary()
    assert report.to_dict()["num_fused_subgraphs"] == 2 and report.to_dict()["num_matches"] == len(sig.matches) == 3
    loaded = tf.saved_model.load(str(dst))
    ids = random_sparse_ids(rng)
    weights = tf.SparseTensor(ids.indices, rng.uniform(0.5, 2.0, ids.values.shape[0]).astype(np.float32),
                              ids.dense_shape)
    want = module.serve(ids, weights)
    got = loaded.signatures["serving_default"](ids=ids.indices, ids_1=ids.values, ids_2=ids.dense_shape,
                                                weights=weights.indices, weights_1=weights.values,
                                                weights_2=weights.dense_shape)
    for k in want:
        assert_same(got[k], want[k])


def saved_and_rewritten(tmp_path, module):
    """(the serving signature's report, DST) of `module.serve` saved and rewritten with one verifying run."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    tf.saved_model.save(module, str(src), signatures={"serving_default": module.serve})
    return rewrite.optimize_saved_model(src, dst, runs=1).signatures["serving_default"], dst


class RaggedSignatureModule(tf.Module):
    def __init__(self, rng):
        self.table = tf.Variable(rng.standard_normal((20, 4)).astype(np.float32))

    @tf.function(input_signature=[tf.RaggedTensorSpec([None, None], tf.int64)])
    def serve(self, ids):
        rows = tf.nn.embedding_lookup(self.table, ids)
        return {"mean": tf.reduce_mean(rows, axis=1)}


@pytest.mark.saved_model
def test_optimize_saved_model_synthesizes_ragged_tensor_signature_inputs(tmp_path, rng):
    # A RaggedTensorSpec input is flattened to its values (ids) and row splits
    # (ids_1): drawn each alone they did not fit, the original refused them,
    # and the CLI could not verify (nor write) the model.
    module = RaggedSignatureModule(rng)
    sig, dst = saved_and_rewritten(tmp_path, module)
    assert sig.inputs.startswith("synthesized"), sig.inputs
    assert sig.outputs_match and sig.max_abs_diff is not None, sig
    assert [m["pattern"] for m in sig.matches] == ["ragged_reduce_lookup"], sig.matches
    ids = tf.ragged.constant([[3, 1], [], [19, 0, 7]], dtype=tf.int64)
    got = tf.saved_model.load(str(dst)).signatures["serving_default"](ids=ids.values, ids_1=ids.row_splits)
    assert_same(got["mean"], module.serve(ids)["mean"])


class DelimitedIdsModule(tf.Module):
    """Ids in strings split on another delimiter than ","."""

    def __init__(self, rng, sep):
        self.table, self.sep = tf.Variable(rng.standard_normal((50, 4)).astype(np.float32)), sep

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def serve(self, x):
        ids = tf.strings.to_number(tf.strings.split(x, self.sep), tf.int64).to_sparse()
        return {"y": tf.nn.safe_embedding_lookup_sparse(self.table, ids, combiner="sum")}


@pytest.mark.saved_model
@pytest.mark.parametrize("sep, joined", [(None, "' '"), ("||", "'||'")])
def test_optimize_saved_model_synthesizes_ids_joined_by_the_graphs_delimiter(tmp_path, rng, sep, joined):
    # The synthesized id lists were joined by "," alone: the original refused
    # them ("could not correctly convert string: 1,0") and a model splitting
    # on whitespace or "||" could not be verified (nor written).
    module = DelimitedIdsModule(rng, sep)
    sig, dst = saved_and_rewritten(tmp_path, module)
    assert sig.inputs.startswith(f"synthesized (id lists joined by {joined} in x), ids in [0, 50)"), sig.inputs
    assert sig.outputs_match and sig.max_abs_diff is not None, sig
    assert sig.matches, sig
    s = sep or " "
    x = tf.constant([f"3{s}49{s}0", "7", f"12{s}12"])
    got = tf.saved_model.load(str(dst)).signatures["serving_default"](x=x)["y"]
    assert_same(got, module.serve(x)["y"])


class TwoDelimitersModule(tf.Module):
    """Two string features, each split on its own delimiter: hashed tokens of
    "|", numbers of ";"."""

    def __init__(self, rng):
        self.t = tf.Variable(rng.standard_normal((50, 4)).astype(np.float32))
        self.u = tf.Variable(rng.standard_normal((50, 4)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)] * 2)
    def serve(self, x, y):
        hashed = tf.strings.to_hash_bucket_fast(tf.strings.split(x, "|"), 50).to_sparse()
        numbers = tf.strings.to_number(tf.strings.split(y, ";"), tf.int64).to_sparse()
        return {"y": tf.nn.safe_embedding_lookup_sparse(self.t, hashed, combiner="mean")
                + tf.nn.safe_embedding_lookup_sparse(self.u, numbers, combiner="sum")}


@pytest.mark.saved_model
def test_optimize_saved_model_joins_each_inputs_ids_by_its_own_splits_delimiter(tmp_path, rng):
    # One delimiter joined every input: y's ";" refused "|" and x's "|"
    # refused... nothing (a hash takes any token), so x was compared on
    # single-token bags "1;0", or the model could not be verified at all.
    module = TwoDelimitersModule(rng)
    sig, dst = saved_and_rewritten(tmp_path, module)
    assert sig.inputs.startswith("synthesized (id lists joined by '|' in x, ';' in y)"), sig.inputs
    assert sig.outputs_match and sig.max_abs_diff is not None, sig
    x, y = tf.constant(["a|b|c", "", "d"]), tf.constant(["3;49", "7", "12;12"])
    got = tf.saved_model.load(str(dst)).signatures["serving_default"](x=x, y=y)["y"]
    assert_same(got, module.serve(x, y)["y"])


def build_keras_ctr_model(seed=0):
    """A Keras 3 functional CTR model whose embedding layers are TF-native
    (tf.nn.embedding_lookup_sparse on the layer's own table)."""
    import keras

    keras.utils.set_random_seed(seed)

    class PooledEmbedding(keras.layers.Layer):
        def __init__(self, num_rows, dim, combiner, hash_keys=False, **kwargs):
            super().__init__(**kwargs)
            self.num_rows, self.dim, self.combiner, self.hash_keys = num_rows, dim, combiner, hash_keys
            self.table = self.add_weight(shape=(num_rows, dim), initializer="random_normal", name="table")

        def call(self, ids):  # dense [B, N] ids, -1 is padding
            mask = ids >= 0
            sp = tf.SparseTensor(tf.where(mask), tf.boolean_mask(ids, mask), tf.shape(ids, out_type=tf.int64))
            if self.hash_keys:
                sp = tf.SparseTensor(sp.indices, tf.strings.to_hash_bucket_fast(tf.strings.as_string(sp.values),
                                                                                self.num_rows), sp.dense_shape)
            return tf.nn.embedding_lookup_sparse(self.table.value, sp, None, combiner=self.combiner)

        def compute_output_shape(self, shape):
            return (shape[0], self.dim)

    ids = keras.Input((4,), dtype="int64", name="item_ids")
    keys = keras.Input((3,), dtype="int64", name="user_keys")
    numeric = keras.Input((5,), dtype="float32", name="numeric")
    x = keras.layers.Concatenate()([PooledEmbedding(V, D, "mean", name="items")(ids),
                                    PooledEmbedding(32, D, "sqrtn", hash_keys=True, name="users")(keys), numeric])
    x = keras.layers.Dense(16, activation="relu", name="hidden")(x)
    y = keras.layers.Dense(1, activation="sigmoid", name="ctr")(x)
    return keras.Model([ids, keys, numeric], y)


SERVE_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import tensorflow as tf
    import tf_ctr_ops  # noqa: F401
    model = tf.saved_model.load(sys.argv[1])
    inputs = dict(np.load(sys.argv[2]))
    out = model.signatures["serving_default"](**{k: tf.constant(v) for k, v in inputs.items()})
    np.savez(sys.argv[3], **{k: v.numpy() for k, v in out.items()})
    print(sorted(model.signatures))
""")


@pytest.mark.saved_model
def test_cli_rewrites_keras_savedmodel_served_in_fresh_process(tmp_path, rng):
    model = build_keras_ctr_model()
    src, dst = tmp_path / "keras_src", tmp_path / "keras_dst"
    model.export(str(src), verbose=False)

    env = fresh_process_env()
    cli = subprocess.run([sys.executable, "-m", "tf_ctr_ops", "optimize", "keras_src", "keras_dst", "--verify",
                          "--report", "r.json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert "signature 'serving_default': 2 fused, 0 left alone" in cli.stdout, cli.stdout
    assert "outputs match" in cli.stdout

    report = json.loads((tmp_path / "r.json").read_text())
    assert report["ok"] and report["verified"] and report["max_abs_diff"] <= 1e-6
    for key in ("serve", "serving_default"):
        sig = report["signatures"][key]
        assert sorted(m["fused_op"] for m in sig["matches"]) == ["CtrEmbeddingLookup"] * 2
        replaced_ops = {r.rsplit(" (", 1)[1].rstrip(")") for m in sig["matches"] for r in m["replaced"]}
        assert {"Unique", "ResourceGather", "SparseSegmentMean", "SparseSegmentSqrtN", "StringToHashBucketFast",
                "AsString"} <= replaced_ops
        assert sig["op_counts_after"]["CtrEmbeddingLookup"] == 2
        assert not {"Unique", "StringToHashBucketFast", "AsString"} & set(sig["op_counts_after"])
        # The item ids stop at the table's 64 rows; the hashed user keys take any.
        assert sig["inputs"] == "synthesized, ids in [0, 64) and wider where taken (user_keys [0, 1000))", sig
        assert sig["skips"] == [] and sig["max_abs_diff"] <= 1e-6

    inputs = {"item_ids": rng.integers(0, V, size=(6, 4)), "user_keys": rng.integers(0, 10**9, size=(6, 3)),
              "numeric": rng.normal(size=(6, 5)).astype(np.float32)}
    inputs["item_ids"][1, 2:] = -1  # padding
    np.savez(tmp_path / "inputs.npz", **inputs)
    serve = subprocess.run([sys.executable, "-c", SERVE_SCRIPT, "keras_dst", "inputs.npz", "out.npz"], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=300)
    assert serve.returncode == 0, serve.stdout + serve.stderr
    assert "['serve', 'serving_default']" in serve.stdout
    got = np.load(tmp_path / "out.npz")
    want = tf.saved_model.load(str(src)).signatures["serving_default"](
        **{k: tf.constant(v) for k, v in inputs.items()})
    assert set(got.files) == set(want)
    for k in want:
        assert_same(got[k], want[k])


def test_verification_compares_integer_outputs_exactly():
    # Ids near 10^6 that differ by a few are within rtol=1e-5 of each other:
    # only float outputs get the tolerance.
    from tf_ctr_ops._compare import max_abs_diff

    ids = np.array([1_000_000, 7], np.int64)
    assert max_abs_diff({"ids": ids}, {"ids": ids + [3, 0]}) == (3.0, False)
    assert max_abs_diff({"ids": ids}, {"ids": ids.copy()}) == (0.0, True)
    floats = np.array([1_000_000.0, 7.0], np.float32)
    worst, close = max_abs_diff({"y": floats}, {"y": floats + np.float32([3, 0])})
    assert close and worst == 3.0
    assert max_abs_diff({"b": np.array([True])}, {"b": np.array([False])})[1] is False


def test_verification_reads_equal_infinities_as_equal():
    from tf_ctr_ops._compare import max_abs_diff

    y = np.array([np.inf, -np.inf, np.nan, 1.0], np.float32)
    assert max_abs_diff({"y": y}, {"y": y.copy()}) == (0.0, True)
    for other in ([-np.inf, -np.inf, np.nan, 1.0], [np.inf, 5.0, np.nan, 1.0], [np.inf, -np.inf, 0.0, 1.0]):
        assert max_abs_diff({"y": y}, {"y": np.array(other, np.float32)}) == (np.inf, False)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
def test_verification_compares_half_outputs_as_floats(dtype):
    # bfloat16's numpy kind is 'V': it was compared byte for byte, so a NaN
    # (a masked mean of an all-padding row) never equalled itself.
    from tf_ctr_ops._compare import max_abs_diff

    y = tf.constant([np.inf, np.nan, 1.0, 256.0], dtype).numpy()
    assert max_abs_diff({"y": y}, {"y": y.copy()}) == (0.0, True)
    worst, close = max_abs_diff({"y": y}, {"y": tf.constant([np.inf, np.nan, 1.0, 258.0], dtype).numpy()})
    assert worst == 2.0 and not close
    assert max_abs_diff({"y": y}, {"y": tf.constant([np.inf, 0.0, 1.0, 256.0], dtype).numpy()}) == (np.inf, False)
    complex_y = np.array([1 + 1j, 2 - 1j])
    assert max_abs_diff({"c": complex_y}, {"c": complex_y + [1j, 0]}) == (1.0, False)
    big = np.array([2**62 + 1, 7], np.int64)  # differs from 2**62 beyond float64's 53 bits
    assert max_abs_diff({"ids": big}, {"ids": big - [1, 0]}) == (1.0, False)
    strings = np.array([b"a", b"b"], object)
    assert max_abs_diff({"s": strings}, {"s": strings.copy()}) == (0.0, True)
    assert max_abs_diff({"s": strings}, {"s": strings[::-1].copy()}) == (np.inf, False)


def _lookups_after_an_update(ids=None, keys=None):
    """Lookups of a [V, E] table by `ids` ([B, 3]) and `keys` ([B] strings),
    each of a form a pattern fuses."""
    ids = tf.constant([[1, 2, 3], [4, 0, 0]], tf.int64) if ids is None else ids
    keys = tf.constant([b"a", b"b"]) if keys is None else keys
    return {
        "hash_gather": lambda t: tf.nn.embedding_lookup(t, tf.strings.to_hash_bucket_fast(keys, V)),
        "dense_reduce": lambda t: tf.reduce_mean(tf.nn.embedding_lookup(t, ids), axis=1),
        "segment_sum": lambda t: tf.sparse.segment_sum(t, tf.constant([1, 2, 3]), tf.constant([0, 0, 1])),
    }


@pytest.mark.parametrize("form", ["hash_gather", "dense_reduce", "segment_sum"])
def test_online_lookups_after_an_assign_read_the_assigned_table(form):
    # TF2's automatic control dependencies make the gather wait on the assign
    # before it; the fused op, and the variable read the rewrite adds for it,
    # must wait too, or they read the table as it was (a race: tried 4 times).
    lookup = _lookups_after_an_update()[form]
    for _ in range(4):
        results = []
        for online in (False, True):
            table = tf.Variable(np.arange(V * D, dtype=np.float32).reshape(V, D) / 100)

            def step():
                table.assign(table * 2.0 + 1.0)
                return lookup(table)

            before = rewrite.fusion_stats()
            if online:
                with rewrite.enable():
                    results.append(tf.function(step)().numpy())
                assert delta(before, rewrite.fusion_stats())["rewrites"] >= 1
            else:
                results.append(tf.function(step)().numpy())
        np.testing.assert_allclose(results[1], results[0], rtol=1e-6)


def _ancestors(graph_def, name):
    inputs = {n.name: [i.lstrip("^").split(":")[0] for i in n.input] for n in graph_def.node}
    seen, stack = set(), [name]
    while stack:
        for i in inputs[stack.pop()]:
            if i not in seen:
                seen.add(i)
                stack.append(i)
    return seen


@pytest.mark.parametrize("form", ["bucketize_fields", "bucketize_column", "hash_fields"])
def test_table_reads_the_rewrite_adds_wait_on_the_update_before_the_lookup(form):
    """Where the fused op's output is reshaped back under the gather's name
    ([B, N] and [B, 1] keys), the variable read the rewrite adds for it still
    waits on the assign the gather waited on; read before it, the lookup saw
    the old table in about one call of five (a race, so the graph is checked)."""
    table = tf.Variable(np.zeros((6, 8), np.float32))
    lookups = {
        "bucketize_fields": (tf.TensorSpec([None, 3], tf.float32),
                             lambda x: tf.gather(table, tf.raw_ops.Bucketize(input=x, boundaries=[0.0, 1.0]))),
        "bucketize_column": (tf.TensorSpec([None, 3], tf.float32), lambda x: tf.reshape(
            tf.gather(table, tf.raw_ops.Bucketize(input=x[:, :1], boundaries=[0.0, 1.0])), [-1, 8])),
        "hash_fields": (tf.TensorSpec([None, 2], tf.string),
                        lambda x: tf.nn.embedding_lookup(table, tf.strings.to_hash_bucket_fast(x, 6))),
    }
    spec, lookup = lookups[form]

    @tf.function(input_signature=[spec])
    def step(x):
        table.assign_add(tf.ones_like(table))
        return lookup(x)

    concrete = step.get_concrete_function()
    graph_def = concrete.graph.as_graph_def()
    optimized, report = rewrite.optimize_graph_def(graph_def, [t.name for t in concrete.outputs],
                                                   handle_shapes=rewrite.captured_handle_shapes(concrete),
                                                   serving_device="cpu")
    assert report["match"], report
    assign = [n.name for n in optimized.node if n.op == "AssignAddVariableOp"]
    reads = [n.name for n in optimized.node if n.op in ("ReadVariableOp", "DisableCopyOnRead") and "ctr_" in n.name]
    assert assign and reads
    for read in reads:
        assert assign[0] in _ancestors(optimized, read), read


@pytest.mark.parametrize("use_resource", [False, True])
def test_tf1_lookups_under_control_dependencies_read_the_updated_table(use_resource):
    tf1 = tf.compat.v1

    def run(config):
        with tf.Graph().as_default() as g:
            t = tf1.get_variable("t", initializer=np.zeros((V, D), np.float32), use_resource=use_resource)
            x = tf1.placeholder(tf.float32, [])
            ids = tf1.placeholder(tf.int64, [None, 3])
            keys = tf1.placeholder(tf.string, [None])
            update = t.assign(tf.fill([V, D], x))
            with tf.control_dependencies([update]):
                outs = [f(t) for f in _lookups_after_an_update(ids, keys).values()]
            with tf1.Session(graph=g, config=config) as sess:
                sess.run(tf1.global_variables_initializer())
                feeds = {ids: [[1, 2, 3], [4, 5, 6]], keys: [b"a", b"b"]}
                return [sess.run(outs, {**feeds, x: float(i + 1)}) for i in range(10)]

    want = run(None)
    got = run(rewrite.session_config(serving_device="cpu"))
    for w, g in zip(want, got):
        for a, b in zip(w, g):
            np.testing.assert_allclose(b, a, rtol=1e-6)


def test_lookups_on_both_sides_of_an_update_are_not_merged(tmp_path):
    # Grouping the two hashed lookups into one op would have to run it both
    # before and after the assign: a cycle, which TF refuses (it then drops
    # the whole rewrite online, and the rebuilt SavedModel fails offline).
    table = tf.Variable(np.arange(V * D, dtype=np.float32).reshape(V, D) / 100)
    first, second = tf.constant([b"a", b"b"]), tf.constant([b"c", b"d"])

    def step():
        table.assign(table * 0.0 + 1.0)
        before = tf.nn.embedding_lookup(table, tf.strings.to_hash_bucket_fast(first, V))
        table.assign(table * 2.0 + 1.0)
        after = tf.nn.embedding_lookup(table, tf.strings.to_hash_bucket_fast(second, V))
        return before, after

    want = [t.numpy() for t in tf.function(step)()]
    report_file = str(tmp_path / "report.jsonl")
    with rewrite.enable(report_file=report_file):
        got = [t.numpy() for t in tf.function(step)()]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    report = rewrite.read_report(report_file)
    assert [m["pattern"] for m in report["match"]] == ["hash_gather", "hash_gather"], report["match"]
    assert any(s["pattern"] == "group_strings" and "both before and after" in s["reason"] for s in report["skip"])


def test_report_drops_skips_of_what_another_pass_or_pattern_replaced(tmp_path):
    # Grappler runs the pass in each of its iterations: the second may skip,
    # by another pattern, a node the first replaced. Such a node is not left
    # alone, and the report must not say it is. A skip of the fused node
    # itself says why a later pattern did not take it further: it stays.
    records = [
        {"kind": "match", "pattern": "safe_lookup", "fused_node": "emb", "fused_op": "CtrEmbeddingLookup",
         "replaced": ["emb/fill (SparseFillEmptyRows)", "emb (CtrEmbeddingLookup)"]},
        {"kind": "skip", "pattern": "multi_hot_dense", "node": "MatMul", "reason": "few encodings"},
        {"kind": "graph", "id": "g"},
        {"kind": "skip", "pattern": "group_strings", "node": "emb", "reason": "batch unproven"},
        {"kind": "skip", "pattern": "x", "node": "emb/fill", "reason": "replaced already"},
        {"kind": "graph", "id": "g"},
        {"kind": "skip", "pattern": "x", "node": "emb/fill", "reason": "another graph's node of that name"},
        {"kind": "graph", "id": "other"},
    ]
    path = tmp_path / "report.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    report = rewrite.read_report(str(path))
    assert [m["fused_node"] for m in report["match"]] == ["emb"]
    kept = [(s["graph"], s["node"]) for s in report["skip"]]
    assert kept == [("g", "MatMul"), ("g", "emb"), ("other", "emb/fill")], kept
    # One record per graph, counting what the report kept of its passes.
    assert report["graph"] == [{"id": "g", "matches": 1, "skips": 2}, {"id": "other", "matches": 0, "skips": 1}]


def test_signatures_sharing_a_function_count_its_candidates_once():
    # model.export's "serve" and "serving_default" share one function: the
    # header counted its fusions once but its skips once per signature.
    match = {"pattern": "dense_reduce_lookup", "fused_node": "pool/Sum", "fused_op": "CtrEmbeddingLookup",
             "replaced": ["emb/GatherV2 (GatherV2)", "pool/Sum (Sum)"], "graph": "__inference_call_1"}
    skips = [{"pattern": "vocab_lookup", "node": "lookup/Find", "reason": "another layer reads it",
              "graph": "__inference_call_1"},
             {"pattern": "multi_hot_dense", "node": "MatMul", "reason": "one encoding", "graph": "__inference_call_1"}]
    signatures = {k: rewrite.SignatureReport(k, True, matches=[match], skips=list(skips))
                  for k in ("serve", "serving_default")}
    report = rewrite.RewriteReport("src", "dst", signatures, 0.1, 0.2, verified=False)
    assert "1 subgraph(s) fused, 2 left alone" in report.summary()
    assert "signature 'serve': 1 fused, 2 left alone" in report.summary()
    assert report.to_dict()["num_skips"] == 2
    # Different functions' candidates of one node name are each counted.
    signatures["serve"].skips = [dict(k, graph="__inference_call_2") for k in skips]
    assert rewrite.left_alone_count(report.skips) == 4


@pytest.mark.saved_model
def test_features_left_in_two_functions_are_each_counted(tmp_path):
    # The records of the feature ops left native had no graph: two functions'
    # nodes of one name counted once (and explained each other away).
    class Model(tf.Module):
        def __init__(self):
            init = tf.lookup.KeyValueTensorInitializer(["a", "b"], [0, 1], tf.string, tf.int64)
            self.table = tf.lookup.StaticHashTable(init, -1)
            self.emb = tf.Variable(np.ones((4, 3), np.float32))

        def body(self, x):
            return {"out": tf.one_hot(self.table.lookup(x) + 1, 4) @ self.emb}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def f1(self, x):
            return self.body(x)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def f2(self, x):
            return self.body(x)

    model = Model()
    tf.saved_model.save(model, str(tmp_path / "src"), signatures={"a": model.f1, "b": model.f2})
    report = rewrite.optimize_saved_model(str(tmp_path / "src"), str(tmp_path / "dst"), verify=False)
    per_signature = [len(s.skips) for s in report.signatures.values()]
    assert per_signature[0] == per_signature[1] > 0
    assert {r["graph"] for s in report.signatures.values() for r in s.skips} == {
        s.skips[0]["graph"] for s in report.signatures.values()} and len(per_signature) == 2
    assert report.to_dict()["num_skips"] == sum(per_signature)
    assert f"{sum(per_signature)} left alone" in report.summary().splitlines()[1]


def test_an_online_report_lists_each_function_once(table, tmp_path):
    """Grappler runs the optimizer in each of its meta-optimizer passes over
    a function: the report lists the function once, with what was fused."""
    report_file = str(tmp_path / "report.jsonl")
    with rewrite.enable(report_file=report_file):
        @tf.function
        def lookup(strings):
            ids = tf.strings.to_hash_bucket_fast(tf.strings.split(strings, ","), V).to_sparse()
            return tf.nn.safe_embedding_lookup_sparse(table, ids)

        lookup(tf.constant(["1,2", "", "3"]))
    passes = [json.loads(line) for line in open(report_file) if '"kind": "graph"' in line]
    report = rewrite.read_report(report_file)
    assert len(report["graph"]) == 1 < len(passes), (report["graph"], passes)
    assert report["graph"][0]["matches"] == len(report["match"]) > 0, report


@tf.custom_gradient
def _doubled(x):
    return x * 2.0, lambda dy: dy * 2.0


class CustomGradientModule(tf.Module):
    def __init__(self, rng):
        self.table = tf.Variable(rng.normal(size=(100, 4)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="s")])
    def serve(self, s):
        return {"e": _doubled(tf.nn.embedding_lookup(self.table, tf.strings.to_hash_bucket_fast(s, 100)))}


def _int8_keras_model():
    import keras

    s = keras.Input((1,), dtype="string", name="s")
    x = keras.layers.Flatten()(keras.layers.Embedding(64, 4)(keras.layers.Hashing(64)(s)))
    model = keras.Model(s, keras.layers.Dense(1)(x))
    model.quantize("int8")  # its quantized layers hold tf.custom_gradient functions
    return model


@pytest.mark.saved_model
def test_a_model_with_custom_gradients_is_rewritten_without_them(tmp_path, rng):
    """TF cannot re-save custom gradients from a rewritten graph: the model is
    rewritten and saved without them (serving never calls them), with a
    warning, rather than refused."""
    module = CustomGradientModule(rng)
    cases = [(module, lambda path: tf.saved_model.save(module, path, signatures=module.serve), "serving_default",
              np.array(["a", "", "zz", "a"], object)),
             (None, lambda path: _int8_keras_model().export(path, verbose=False), "serve",
              np.array([["a"], [""], ["zz"]], object))]
    for n, (_, save, key, strings) in enumerate(cases):
        src, dst = tmp_path / f"src{n}", tmp_path / f"dst{n}"
        save(str(src))
        with pytest.warns(UserWarning, match="custom_gradient gradients are not kept"):
            report = rewrite.optimize_saved_model(src, dst)
        assert report.ok and report.verified, report.summary()
        if n == 0:
            assert [m["pattern"] for m in report.matches] == ["hash_gather"]
        inputs = {"s": strings}
        want = {k: v.numpy() for k, v in tf.saved_model.load(str(src)).signatures[key](s=tf.constant(strings)).items()}
        got = serve_in_fresh_process(dst, key, inputs, tmp_path)
        assert set(got) == set(want)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6)

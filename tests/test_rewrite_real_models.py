"""The offline rewrite on models written the way users write them: every
rewritten SavedModel is served in a fresh process and compared with the
original, verification always compares, and nothing broken is written."""

import contextlib
import dataclasses
import io
import json
import os
import pickle
import subprocess
import sys
import types

import numpy as np
import pytest
import tensorflow as tf

import tf_ctr_ops  # noqa: F401
from conftest import fresh_process_env, serve_in_fresh_process
from real_models import save_split_safe_lookup_model, save_tf1_examples_model, save_tf1_table_model
from tf_ctr_ops import _saved_model_files, rewrite
from tf_ctr_ops.__main__ import main as cli_main
from tf_ctr_ops.bench.models import (export_keras_lookup_model, keras_lookup_inputs, save_tf1_feature_column_model,
                                     tf_examples)


def run_cli(args, cwd):
    """`tf-ctr-ops optimize ARGS` run in `cwd`, in this process (the rewrite
    still checks its result in a fresh one; test_rewrite.py runs the command
    itself as a process): its exit status and what it printed."""
    out, err, here = io.StringIO(), io.StringIO(), os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli_main(["optimize", *args])
            except SystemExit as e:  # argparse's usage errors
                code = e.code
    finally:
        os.chdir(here)
    return types.SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def graph_facts(**known):
    """The facts of a graph that holds nothing the synthesis reads, but `known`."""
    from tf_ctr_ops import _model_inputs

    facts = _model_inputs.GraphFacts([])
    vars(facts).update(known)
    return facts


def outputs(model_dir, key, inputs):
    fn = tf.saved_model.load(str(model_dir)).signatures[key]
    specs = fn.structured_input_signature[1]
    return {k: v.numpy() for k, v in fn(**{n: tf.constant(a, specs[n].dtype) for n, a in inputs.items()}).items()}


def assert_same_outputs(want, got, atol=1e-6):
    assert set(want) == set(got)
    for k in want:
        if want[k].dtype.kind in "OSU":
            np.testing.assert_array_equal(want[k], got[k])
        else:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=atol)


def test_tf1_feature_column_model_keeps_tables_assets_and_signatures(tmp_path, rng):
    # Served on a CPU, as Estimator exports usually are (without a serving
    # device the hashes stay: test_rewrite_safe.py).
    src, dst = tmp_path / "src", tmp_path / "dst"
    save_tf1_feature_column_model(str(src), str(tmp_path))
    cli = run_cli(["src", "dst", "--report", "r.json", "--serving-device", "cpu"], tmp_path)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["tf1"] and report["verified"] and report["ok"]
    # The two signatures share one graph: the summary lists its records once.
    assert "graph of signatures" in cli.stdout, cli.stdout
    fused_lines = [line for line in cli.stdout.splitlines() if line.startswith("  fused  ")]
    assert fused_lines and len(fused_lines) == len(set(fused_lines)) == report["num_matches"], cli.stdout
    for key in ("serving_default", "predict"):
        sig = report["signatures"][key]
        # Compared on tf.Examples built from the graph's ParseExample spec,
        # each vocabulary column's keys from its own vocabulary.
        assert sig["inputs"] == ("synthesized (tf.Example from the ParseExample spec, vocabulary keys in 3 "
                                 "features)"), sig["inputs"]
        assert sig["outputs_match"] and sig["max_abs_diff"] <= 1e-5
    fused_ops = {m["fused_op"] for m in report["signatures"]["predict"]["matches"]}
    assert "CtrEmbeddingLookup" in fused_ops, report["signatures"]["predict"]
    # ParseExample's sparse ids are in order: the fused safe lookups add no sort.
    after_ops = report["signatures"]["predict"]["op_counts_after"]
    assert "SparseReorder" not in after_ops
    # Nor a SparseReshape of rank-2 ids, which moves nothing, nor the final
    # reshape to [B, D] of each of the four lookups.
    assert "SparseReshape" not in after_ops, after_ops
    assert after_ops.get("Reshape", 0) <= report["signatures"]["predict"]["op_counts_before"]["Reshape"] - 4
    # The vocabulary embedding columns' finds (with the device column's OOV
    # bucket) fold into their lookups, the indicator column is one op; the
    # bucketized column's one-hot is 4 of the logits' ~100 input columns, the
    # rest dense, so it stays with the MatMul, with the reason.
    assert after_ops.get("CtrVocabEmbeddingLookup") == 2 and after_ops.get("CtrVocabIndicator") == 1, after_ops
    assert "LookupTableFindV2" not in after_ops and after_ops.get("OneHot") == 1, after_ops
    skips = report["signatures"]["predict"]["skips"]
    assert any(s["pattern"] == "multi_hot_dense" and "MatMul multiplies the other" in s["reason"] for s in skips)
    left = {s["reason"].split(" (")[0] for s in skips if s["pattern"] == "-"}
    assert left == {"Bucketize stays TF's", "OneHot stays TF's"}, left
    # No pattern reports a lookup it has no business with: the fused columns'
    # lookups read no string split.
    assert not [s for s in skips if s["pattern"] == "string_split_lookup"], skips
    # The two hashed columns' hashes fold into their lookups, and the
    # vocabulary column's OOV hash into its vocabulary lookup.
    assert "StringToHashBucketFast" not in after_ops, after_ops

    # What the SavedModel carries survives: assets, method names, the saver, init op.
    before, after = _saved_model_files.read(src), _saved_model_files.read(dst)
    assert (dst / "assets" / "country_vocab.txt").read_text() == (src / "assets" / "country_vocab.txt").read_text()
    assert {k: s.method_name for k, s in after.meta_graphs[0].signature_def.items()} == \
        {k: s.method_name for k, s in before.meta_graphs[0].signature_def.items()}
    assert after.meta_graphs[0].saver_def == before.meta_graphs[0].saver_def
    assert after.meta_graphs[0].collection_def.keys() == before.meta_graphs[0].collection_def.keys()

    examples = tf_examples(rng, 64)
    for key, name in (("serving_default", "inputs"), ("predict", "examples")):
        want = outputs(src, key, {name: examples})
        got = serve_in_fresh_process(dst, key, {name: examples}, tmp_path)
        assert_same_outputs(want, got, atol=1e-5)


def test_tf1_model_verified_on_tfrecord_inputs(tmp_path, rng):
    src = tmp_path / "src"
    save_tf1_feature_column_model(str(src), str(tmp_path))
    with tf.io.TFRecordWriter(str(tmp_path / "examples.tfrecord")) as w:
        for record in tf_examples(rng, 32):
            w.write(record)
    cli = run_cli(["src", "dst", "--inputs", "examples.tfrecord", "--report", "r.json"], tmp_path)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    sig = json.loads((tmp_path / "r.json").read_text())["signatures"]["predict"]
    assert sig["inputs"] == "file" and sig["outputs_match"]


def test_tf1_table_model_with_nothing_fused_stays_servable(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    save_tf1_table_model(str(src))
    report = rewrite.optimize_saved_model(src, dst, runs=1)
    sig = report.signatures["serving_default"]
    # The plain id lists are no keys of the table, which answers -1; the vocabulary is tried
    # only when the plain values fail, so either way the outputs were compared.
    assert report.tf1 and sig.outputs_match and sig.inputs.startswith("synthesized")
    got = serve_in_fresh_process(dst, "serving_default", {"x": np.array([b"b", b"zz", b"a"], object)}, tmp_path)
    np.testing.assert_array_equal(got["y"], [1, -1, 0])


def _save_tf1(path, build):
    """A TF1 SavedModel (Builder, as Estimators export) of one signature
    {inputs: outputs}, which `build()` makes in a fresh graph."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        inputs, outputs = build()
        session.run(tf.compat.v1.global_variables_initializer())
        builder = tf.compat.v1.saved_model.Builder(str(path))
        builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map={
            "serving_default": tf.compat.v1.saved_model.predict_signature_def(inputs, outputs)})
        builder.save()


_SERVE_TF1_SPARSE = """
import pickle, sys
import tensorflow as tf
import tf_ctr_ops  # noqa: F401
model_dir, feeds_path, out_path = sys.argv[1:]
with open(feeds_path, "rb") as f:
    feeds = {k: tf.compat.v1.SparseTensorValue(*v) for k, v in pickle.load(f).items()}
with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    signature = tf.compat.v1.saved_model.load(session, ["serve"], model_dir).signature_def["serving_default"]
    graph = session.graph
    def sparse(info):
        c = info.coo_sparse
        return tf.SparseTensor(*(graph.get_tensor_by_name(n) for n in (
            c.indices_tensor_name, c.values_tensor_name, c.dense_shape_tensor_name)))
    out = session.run({k: graph.get_tensor_by_name(v.name) for k, v in signature.outputs.items()},
                      {sparse(signature.inputs[k]): v for k, v in feeds.items()})
with open(out_path, "wb") as f:
    pickle.dump(out, f)
"""


def _tf1_outputs(path, feeds):
    """{output: value} of a TF1 SavedModel's serving_default in a session, on
    {input: value} feeds (a SparseTensorValue for a sparse input)."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        meta = tf.compat.v1.saved_model.load(session, ["serve"], str(path))
        signature = meta.signature_def["serving_default"]
        graph = session.graph

        def tensor(info):
            if info.HasField("coo_sparse"):
                c = info.coo_sparse
                return tf.SparseTensor(*(graph.get_tensor_by_name(n) for n in (
                    c.indices_tensor_name, c.values_tensor_name, c.dense_shape_tensor_name)))
            return graph.get_tensor_by_name(info.name)

        return session.run({k: tensor(v) for k, v in signature.outputs.items()},
                           {tensor(signature.inputs[k]): v for k, v in feeds.items()})


def test_tf1_signature_of_sparse_inputs_rewrites_unverified(tmp_path):
    # An Estimator's raw serving receiver takes SparseTensors: Grappler's item
    # builder fed a float one wrongly and aborted the process.
    def build():
        ids = tf.compat.v1.sparse_placeholder(tf.int64, [None, None], name="ids")
        weights = tf.compat.v1.sparse_placeholder(tf.float32, [None, None], name="weights")
        table = tf.compat.v1.get_variable("table", [10, 4])
        return ({"ids": ids, "weights": weights},
                {"out": tf.nn.safe_embedding_lookup_sparse(table, ids, weights, combiner="sqrtn")})

    src, dst = tmp_path / "src", tmp_path / "dst"
    _save_tf1(src, build)
    report = rewrite.optimize_saved_model(src, dst, verify=False, serving_device="cpu")
    assert report.ok and not report.verified
    feeds = {"ids": tf.compat.v1.SparseTensorValue([[0, 0], [0, 1], [2, 0]], [3, 7, 9], [3, 2]),
             "weights": tf.compat.v1.SparseTensorValue([[0, 0], [0, 1], [2, 0]], [1.0, 2.0, 0.5], [3, 2])}
    # Served in a fresh process, as a model server would load it.
    (tmp_path / "feeds.pkl").write_bytes(pickle.dumps({k: tuple(v) for k, v in feeds.items()}))
    proc = subprocess.run([sys.executable, "-c", _SERVE_TF1_SPARSE, str(dst), str(tmp_path / "feeds.pkl"),
                           str(tmp_path / "out.pkl")], cwd=tmp_path, env=fresh_process_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = pickle.loads((tmp_path / "out.pkl").read_bytes())
    np.testing.assert_allclose(got["out"], _tf1_outputs(src, feeds)["out"], rtol=1e-6)


def test_tf1_signature_of_sparse_inputs_verifies_on_an_inputs_file_of_their_components(tmp_path):
    def build():
        ids = tf.compat.v1.sparse_placeholder(tf.int64, [None, None], name="ids")
        table = tf.compat.v1.get_variable("table", [10, 4])
        return {"sp": ids}, {"out": tf.nn.safe_embedding_lookup_sparse(table, ids, None, combiner="sqrtn")}

    _save_tf1(tmp_path / "src", build)
    np.savez(tmp_path / "in.npz", sp_indices=np.array([[0, 0], [0, 1], [2, 0]], np.int64),
             sp_values=np.array([3, 7, 9], np.int64), sp_dense_shape=np.array([3, 2], np.int64))
    cli = run_cli(["src", "dst", "--serving-device", "cpu", "--inputs", "in.npz"], tmp_path)
    assert cli.returncode == 0 and "verify outputs match on inputs file" in cli.stdout, cli.stdout + cli.stderr
    feeds = {"sp": tf.compat.v1.SparseTensorValue([[0, 0], [2, 1]], [4, 8], [3, 2])}
    (tmp_path / "feeds.pkl").write_bytes(pickle.dumps({k: tuple(v) for k, v in feeds.items()}))
    proc = subprocess.run([sys.executable, "-c", _SERVE_TF1_SPARSE, str(tmp_path / "dst"), str(tmp_path / "feeds.pkl"),
                           str(tmp_path / "out.pkl")], cwd=tmp_path, env=fresh_process_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    np.testing.assert_allclose(pickle.loads((tmp_path / "out.pkl").read_bytes())["out"],
                               _tf1_outputs(tmp_path / "src", feeds)["out"], rtol=1e-6)
    # Without the file, the CLI says what to pass (it named a random SparseTensor's bad index before).
    cli = run_cli(["src", "dst2", "--serving-device", "cpu"], tmp_path)
    assert cli.returncode == 1 and "sp_indices, sp_values and sp_dense_shape" in cli.stderr, cli.stdout + cli.stderr
    assert not (tmp_path / "dst2").exists()


def test_tf1_signature_returning_a_sparse_tensor_rewrites_and_verifies(tmp_path, rng):
    # A TF1 graph is rewritten whole: its SparseTensor outputs compare by
    # their components.
    def build():
        ids = tf.compat.v1.placeholder(tf.int64, [None, 3], name="ids")
        table = tf.compat.v1.get_variable("table", [10, 4])
        return {"ids": ids}, {"out": tf.reduce_sum(tf.nn.embedding_lookup(table, ids), 1),
                              "sparse": tf.sparse.from_dense(tf.cast(ids, tf.float32))}

    src, dst = tmp_path / "src", tmp_path / "dst"
    _save_tf1(src, build)
    report = rewrite.optimize_saved_model(src, dst, signature_keys=["serving_default"])
    assert report.ok and report.verified and report.signatures["serving_default"].outputs_match
    assert not [s for s in report.signatures["serving_default"].skips if "copied unchanged" in s["reason"]]
    inputs = {"ids": rng.integers(0, 10, size=(5, 3))}
    want, got = outputs_of(src, inputs), serve_in_fresh_process(dst, "serving_default", inputs, tmp_path)
    np.testing.assert_allclose(got["out"], want["out"], rtol=1e-6)
    for a, b in zip(got["sparse"], want["sparse"]):
        np.testing.assert_array_equal(a, b)


def outputs_of(path, inputs):
    fn = tf.saved_model.load(str(path)).signatures["serving_default"]
    out = fn(**{k: tf.constant(v) for k, v in inputs.items()})
    return {k: v.numpy() if isinstance(v, tf.Tensor) else
            [p.numpy() for p in tf.nest.flatten(v, expand_composites=True)] for k, v in out.items()}


def test_tf1_signature_subset_is_refused(tmp_path):
    src = tmp_path / "src"
    save_tf1_feature_column_model(str(src), str(tmp_path))
    with pytest.raises(ValueError, match="share one graph"):
        rewrite.optimize_saved_model(src, tmp_path / "dst", signature_keys=["predict"])
    assert not (tmp_path / "dst").exists()


def test_keras_lookups_without_oov_verify_on_vocabulary_values(tmp_path, rng):
    src, dst = tmp_path / "src", tmp_path / "dst"
    export_keras_lookup_model(str(src))
    report = rewrite.optimize_saved_model(src, dst, runs=1)
    for key in ("serve", "serving_default"):
        sig = report.signatures[key]
        # The plain id lists and ids 0/1 are out of these vocabularies: the original fails on them.
        assert sig.inputs == "synthesized (vocabulary values)", sig.inputs
        assert sig.outputs_match
        # Nothing here is fused yet, and the report says what it left alone:
        # two StringLookups, an IntegerLookup, a multi-hot StringLookup.
        left = [s for s in sig.skips if s["pattern"] == "-"]
        assert sum("LookupTableFindV2 stays TF's" in s["reason"] for s in left) == 4, sig.skips
        assert any("DenseBincount" in s["reason"] for s in left), sig.skips
    # Left for a GPU server (the default serves on either): the summary says
    # how to fuse them for a CPU one, in the CLI's words.
    assert "4 subgraph(s) left native because their fused ops run on the CPU only" in report.summary()
    assert "--serving-device cpu" in report.summary()
    inputs = keras_lookup_inputs(rng, 16)
    assert_same_outputs(outputs(src, "serving_default", inputs),
                        serve_in_fresh_process(dst, "serving_default", inputs, tmp_path))


def _export_keras_dict_model(path):
    import keras

    keras.utils.set_random_seed(5)
    ids = keras.Input((3,), dtype="int64", name="ids")
    num = keras.Input((1,), dtype="float32", name="num")
    pooled = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(10, 4)(ids))
    model = keras.Model({"ids": ids, "num": num},
                        {"p": keras.layers.Dense(1)(keras.layers.Concatenate()([pooled, num])), "q": pooled})
    model.export(str(path), verbose=False)
    return model


class CallersModule(tf.Module):
    """Functions kept for Python callers around the signature's function f:
    one only calls it; the others also count, assert, or return a None."""

    def __init__(self, rng):
        super().__init__()
        self.table = tf.Variable(rng.normal(size=(50, 8)).astype(np.float32))
        self.calls = tf.Variable(0, dtype=tf.int64)

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.int64, name="a"),
                                  tf.TensorSpec([None, 1], tf.float32, name="b")])
    def f(self, a, b):
        return {"p": tf.nn.embedding_lookup_sparse(self.table, tf.sparse.from_dense(a), None, combiner="mean") * b}

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.int64), tf.TensorSpec([None, 1], tf.float32)])
    def only_calls(self, a, b):
        return self.f(a, b)

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.int64), tf.TensorSpec([None, 1], tf.float32)])
    def counted(self, a, b):
        self.calls.assign_add(1)
        return self.f(a, b)

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.int64), tf.TensorSpec([None, 1], tf.float32)])
    def checked(self, a, b):
        tf.debugging.assert_non_negative(b, message="negative weight")
        return self.f(a, b)

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.int64), tf.TensorSpec([None, 1], tf.float32)])
    def with_none(self, a, b):
        return self.f(a, b), None

    @tf.function(input_signature=[tf.TensorSpec([2, 3], tf.int64), tf.TensorSpec([2, 1], tf.float32)])
    def narrow(self, a, b):
        return self.f(a, b)


def test_only_functions_that_just_call_the_signatures_function_follow_its_rewrite(tmp_path, rng):
    # Re-pointing a function that is one call of the signature's function
    # (what a first rewrite makes of Keras' serve) took functions that also
    # count, assert or print: their rewritten copies dropped that. One that
    # returned a None beside the call failed the whole rewrite, as did one
    # traced for a narrower shape (verified on the signature's inputs).
    # Re-pointed functions lost their argument names.
    module = CallersModule(rng)
    src, dst = tmp_path / "src", tmp_path / "dst"
    tf.saved_model.save(module, str(src), signatures={"serving_default": module.f})
    report = rewrite.optimize_saved_model(src, dst, runs=1)
    assert report.signatures["serving_default"].endpoints == ["f", "only_calls"], report.signatures
    loaded = tf.saved_model.load(str(dst))
    a, b = tf.constant([[1, 2, 3], [4, 0, 0]], tf.int64), tf.constant([[0.5], [2.0]])
    want = module.f(a, b)["p"]
    for fn in (loaded.only_calls, loaded.counted, loaded.checked):
        np.testing.assert_allclose(fn(a, b)["p"], want, rtol=1e-6)
    assert int(loaded.calls.numpy()) == 1
    got, none = loaded.with_none(a, b)
    assert none is None
    np.testing.assert_allclose(got["p"], want, rtol=1e-6)
    with pytest.raises(tf.errors.InvalidArgumentError, match="negative weight"):
        loaded.checked(a, -b)
    np.testing.assert_allclose(loaded.narrow(a, b)["p"], want, rtol=1e-6)
    for fn in (loaded.f, loaded.only_calls):
        np.testing.assert_allclose(fn(a=a, b=b)["p"], want, rtol=1e-6)
        np.testing.assert_allclose(fn(a, b=b)["p"], want, rtol=1e-6)


def test_keras_serve_function_calls_the_rewritten_signature(tmp_path, rng):
    # model.export() saves `serve` and signatures that only call it;
    # reloaded.serve(x) and TFSMLayer call the function, which kept TF's
    # graph while the signatures were rewritten (hunt 127).
    import keras

    src, dst = tmp_path / "src", tmp_path / "dst"
    _export_keras_dict_model(src)
    report = rewrite.optimize_saved_model(src, dst, runs=1)
    assert report.signatures["serve"].endpoints == ["serve"], report.signatures
    assert report.signatures["serving_default"].endpoints == []
    assert "calls  from serve too" in report.summary()
    fused = tf.saved_model.load(str(dst))
    graph = fused.serve.concrete_functions[0].graph.as_graph_def()
    ops = {n.op for f in graph.library.function for n in f.node_def}
    assert "CtrEmbeddingLookup" in ops and "GatherV2" not in ops, sorted(ops)
    native = tf.saved_model.load(str(src))
    feeds = {"ids": tf.constant(rng.integers(0, 10, (7, 3)), tf.int64), "num": tf.constant(rng.random((7, 1)),
                                                                                          tf.float32)}
    want = native.serve(feeds)
    for got in (fused.serve(feeds), keras.layers.TFSMLayer(str(dst))(feeds)):
        assert set(got) == {"p", "q"}
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6)
    # Rewritten again, `serve` (now a call of the first rewrite's function)
    # follows the signature's second rewrite: it kept the first's graph.
    again = tmp_path / "again"
    report = rewrite.optimize_saved_model(dst, again, runs=1, serving_device="cpu")
    assert report.signatures["serve"].endpoints == ["serve"], report.signatures
    twice = tf.saved_model.load(str(again))
    callee = lambda fn: [op.get_attr("f").name for op in fn.graph.get_operations()  # noqa: E731
                         if op.type == "StatefulPartitionedCall"]
    assert callee(twice.serve.concrete_functions[0]) == callee(twice.signatures["serve"])
    got = twice.serve(feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6)


def test_a_serve_function_that_differs_from_its_signature_fails_verification(tmp_path, monkeypatch):
    # The fresh process runs each such function on its signature's inputs: a
    # wrong wiring (here outputs swapped) is caught, not written.
    from tf_ctr_ops import _endpoints

    src = tmp_path / "src"
    _export_keras_dict_model(src)
    wire = _endpoints.rewritten

    def swapped(endpoint, signature):
        return wire(dataclasses.replace(endpoint, outputs=endpoint.outputs[::-1]), signature)

    monkeypatch.setattr(_endpoints, "rewritten", swapped)
    with pytest.raises(rewrite.RewriteError, match="function 'serve', which calls it, returns another"):
        rewrite.optimize_saved_model(src, tmp_path / "dst", runs=1)
    assert not (tmp_path / "dst").exists()


def test_functions_that_do_more_than_call_a_signature_are_left_as_they_are(tmp_path):
    class Model(tf.Module):
        def __init__(self):
            super().__init__()
            self.table = tf.Variable(tf.ones([6, 2]))

        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.int64)])
        def pooled(self, ids):
            return tf.reduce_mean(tf.gather(self.table, ids), 1)

    model = Model()
    serving = tf.function(lambda ids: {"y": model.pooled(ids) * 2.0},
                          input_signature=[tf.TensorSpec([None, 2], tf.int64, name="ids")])
    src = tmp_path / "src"
    tf.saved_model.save(model, str(src), signatures={"serving_default": serving})
    report = rewrite.optimize_saved_model(src, tmp_path / "dst", runs=1)
    assert report.signatures["serving_default"].endpoints == []


def test_an_integer_vocabulary_file_gives_the_synthesized_keys(tmp_path):
    # IntegerLookup(vocabulary=FILE, num_oov_indices=0) fails on any key not
    # in the file: the file (an asset) was read as strings only, and nothing
    # could be verified without --inputs (hunt 126).
    import keras

    (tmp_path / "ids.txt").write_text("10\n20\n30\n")
    lookup = keras.layers.IntegerLookup(vocabulary=str(tmp_path / "ids.txt"), num_oov_indices=0)
    x = keras.Input((1,), dtype="int64", name="x")
    src, dst = tmp_path / "src", tmp_path / "dst"
    keras.Model(x, keras.layers.Flatten()(keras.layers.Embedding(lookup.vocabulary_size(), 2)(lookup(x)))).export(
        str(src), verbose=False)
    sig = rewrite.optimize_saved_model(src, dst, runs=1, serving_device="cpu").signatures["serving_default"]
    assert sig.inputs == "synthesized (vocabulary values)", sig.inputs
    assert sig.outputs_match
    assert [m["fused_op"] for m in sig.matches] == ["CtrVocabEmbedding"], sig.matches


@pytest.mark.parametrize("resave", ["optimized", "loaded and saved"])
def test_a_saved_again_keras_model_still_verifies_on_its_vocabularies(tmp_path, rng, resave):
    # Saving a loaded model again wraps each table initializer in a call of
    # the original, its vocabulary passed in: the synthesizer follows it, so
    # a model optimized twice (or re-exported by a pipeline) still verifies.
    src, again, dst = tmp_path / "src", tmp_path / "again", tmp_path / "dst"
    export_keras_lookup_model(str(src))
    if resave == "optimized":
        rewrite.optimize_saved_model(src, again, serving_device="cpu", runs=0)
    else:
        loaded = tf.saved_model.load(str(src))
        tf.saved_model.save(loaded, str(again), signatures=dict(loaded.signatures))
    report = rewrite.optimize_saved_model(again, dst, serving_device="cpu", runs=0)
    for key in ("serve", "serving_default"):
        sig = report.signatures[key]
        assert sig.inputs == "synthesized (vocabulary values)" and sig.outputs_match, (key, sig.inputs)
    if resave == "loaded and saved":
        assert report.matches, report.summary()  # nothing fused before: the rewrite fuses here
    inputs = keras_lookup_inputs(rng, 16)
    assert_same_outputs(outputs(src, "serving_default", inputs),
                        serve_in_fresh_process(dst, "serving_default", inputs, tmp_path))


@pytest.mark.parametrize("model", ["keras", "module"])
def test_rewritten_models_keep_their_checkpoint_keys(tmp_path, model):
    # A newer export's variables/ fits the rewritten model, and a checkpoint
    # of the original restores into it, only if every variable keeps its key.
    src, dst = tmp_path / "src", tmp_path / "dst"
    if model == "keras":
        export_keras_lookup_model(str(src))
    else:
        save_split_safe_lookup_model(str(src))
    report = rewrite.optimize_saved_model(src, dst, serving_device="cpu", runs=0)
    assert report.matches and report.ok

    def keys(path):
        return {k: tuple(shape) for k, shape in tf.train.list_variables(str(path / "variables" / "variables"))
                if "/.ATTRIBUTES/VARIABLE_VALUE" in k}

    assert keys(src) and keys(src) == keys(dst), (keys(src), keys(dst))


def test_disabled_patterns_keep_their_subgraphs_native(tmp_path):
    src = tmp_path / "src"
    save_split_safe_lookup_model(str(src))
    names = rewrite.pattern_names()
    assert {"safe_lookup", "string_split_lookup", "vocab_lookup", "partitioned_table"} <= set(names), names
    assert len(names) == len(set(names)), names
    twice = ["string_split_lookup"] * 2  # named once in the report
    cli = run_cli(["src", "dst", "--disable", *twice, "--report", "r.json"], tmp_path)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    fused = {m["pattern"] for m in report["signatures"]["serving_default"]["matches"]}
    assert "string_split_lookup" not in fused and "safe_lookup" in fused, fused
    assert "StringSplitV2" in report["signatures"]["serving_default"]["op_counts_after"]
    # The left-alone string hash's own reason cannot say its pattern was off; the summary does.
    assert report["disabled_patterns"] == ["string_split_lookup"]
    assert "disabled string_split_lookup: not run, so what they fuse is left alone" in cli.stdout, cli.stdout
    bad = run_cli(["src", "dst2", "--disable", "no_such_pattern"], tmp_path)
    assert bad.returncode == 2 and "--disable: unknown pattern(s) no_such_pattern;" in bad.stderr, bad.stderr
    assert not (tmp_path / "dst2").exists()
    with pytest.raises(TypeError, match="list of pattern names"):
        rewrite.enable(disabled_patterns="vocab_lookup")
    with pytest.raises(ValueError, match="unknown pattern"):
        rewrite.session_config(disabled_patterns=["vocab"])
    with pytest.raises(ValueError, match="unknown pattern"):
        rewrite.optimize_graph_def(tf.compat.v1.GraphDef(), [], disabled_patterns=["safe"])


def _judge(fn, tries):
    """A `run` for _model_inputs.synthesize: None when `fn` accepts the inputs."""
    def run(candidate):
        tries.append(candidate)
        try:
            fn(**{k: tf.constant(v) for k, v in candidate.items()})
        except tf.errors.InvalidArgumentError as e:
            return str(e)
        return None
    return run


def _synthesized(src, tries, rng):
    """(inputs, how, facts): _model_inputs.synthesize on the SavedModel at
    `src`'s serving_default signature, judged by the loaded original (each
    try appended to `tries`)."""
    from tensorflow.core.protobuf import saved_model_pb2

    from tf_ctr_ops import _model_inputs

    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((src / "saved_model.pb").read_bytes())
    facts = _model_inputs.GraphFacts(proto.meta_graphs, str(src))
    fn = tf.saved_model.load(str(src)).signatures["serving_default"]
    inputs, how = _model_inputs.synthesize(fn.structured_input_signature[1], _judge(fn, tries), facts, rng)
    return inputs, how, facts


def test_inputs_read_by_lookups_get_their_tables_vocabularies_in_one_try(tmp_path, rng):
    # Each try is a call of the original: the search input by input takes
    # hundreds of them on a model of many lookups.
    src = tmp_path / "src"
    export_keras_lookup_model(str(src), features=6)
    tries = []
    inputs, how, facts = _synthesized(src, tries, rng)
    assert set(facts.input_vocabularies) == {f"s{f}" for f in range(6)} | {"device_id", "tags"}
    # The second try is kept; then keys outside the vocabularies are tried an
    # input at a time, at most 3 each (refused here: no lookup has an OOV slot).
    assert how == "synthesized (vocabulary values)", how
    assert all(np.array_equal(v, tries[1][k]) for k, v in inputs.items())
    assert 2 < len(tries) <= 2 + 3 * len(facts.input_vocabularies), len(tries)
    assert set(inputs["s3"].ravel()) <= {f"f3v{i}".encode() for i in range(50)} | {f"f3v{i}" for i in range(50)}


def test_inputs_of_capitalized_names_get_their_vocabularies_too(tmp_path, rng):
    # A FunctionDef lower-cases its arguments' names (`userId` -> `userid`):
    # the vocabularies went by those, the signature's inputs by theirs.
    import keras

    names = ["userId", "itemCategory"]
    inputs = [keras.Input((1,), dtype="string", name=n) for n in names]
    parts = [keras.layers.Flatten()(keras.layers.Embedding(3, 2)(keras.layers.StringLookup(
        vocabulary=[f"{n}{i}" for i in range(3)], mask_token=None, num_oov_indices=0)(x)))
        for n, x in zip(names, inputs)]
    src = tmp_path / "src"
    keras.Model(inputs, keras.layers.Concatenate()(parts)).export(str(src), verbose=False)
    tries = []
    synthesized, how, facts = _synthesized(src, tries, rng)
    assert set(facts.input_vocabularies) == set(names)
    assert how == "synthesized (vocabulary values)", how
    assert all(np.array_equal(v, tries[1][k]) for k, v in synthesized.items())


def test_vocabulary_inputs_get_the_misses_their_lookups_take(tmp_path, rng):
    """One lookup without an OOV slot makes every input take vocabulary keys
    alone; a lookup with a mask and OOV slots must still be compared on an
    empty string and a missing key, and is, where the original takes them."""
    import keras

    from tf_ctr_ops import _model_inputs

    strict = keras.Input((1,), dtype="string", name="strict")
    loose = keras.Input((3,), dtype="string", name="loose")
    strict_ids = keras.layers.StringLookup(vocabulary=["s0", "s1"], mask_token=None, num_oov_indices=0)(strict)
    loose_ids = keras.layers.StringLookup(vocabulary=["l0", "l1", "l2"], mask_token="", num_oov_indices=2)(loose)
    rows = [keras.layers.Flatten()(keras.layers.Embedding(2, 2)(strict_ids)),
            keras.layers.Flatten()(keras.layers.Embedding(6, 2)(loose_ids))]
    src, dst = tmp_path / "src", tmp_path / "dst"
    keras.Model([strict, loose], keras.layers.Concatenate()(rows)).export(str(src), verbose=False)
    inputs, how, _ = _synthesized(src, [], rng)
    assert how == "synthesized (vocabulary values), out-of-vocabulary keys in 1 of 2 vocabulary inputs", how
    assert set(_model_inputs._STRING_MISSES) <= set(inputs["loose"].ravel().tolist()), inputs["loose"]
    assert set(inputs["strict"].ravel().tolist()) <= {b"s0", b"s1"}, inputs["strict"]
    report = rewrite.optimize_saved_model(src, dst, serving_device="cpu", runs=0)
    sig = report.signatures["serving_default"]
    assert sig.inputs == how and sig.outputs_match and report.matches, report.summary()


def test_split_safe_lookup_rewrite_loads_in_a_fresh_process(tmp_path):
    # Its dense_shape readers are re-pointed to a shape of another length:
    # their recorded _output_shapes must not reach the saved graph.
    src, dst = tmp_path / "src", tmp_path / "dst"
    save_split_safe_lookup_model(str(src))
    report = rewrite.optimize_saved_model(src, dst, runs=1)
    sig = report.signatures["serving_default"]
    assert "CtrStringEmbedding" in {m["fused_op"] for m in sig.matches} and not report.rejected_patterns
    x = np.array([b"a|b|c", b"", b"a||d", b"zz"], object)
    assert_same_outputs(outputs(src, "serving_default", {"x": x}),
                        serve_in_fresh_process(dst, "serving_default", {"x": x}, tmp_path))


def test_pattern_whose_result_fails_is_dropped_and_reported(tmp_path, monkeypatch):
    src, dst = tmp_path / "src", tmp_path / "dst"
    save_split_safe_lookup_model(str(src))
    real_check = rewrite._fresh_process_failure

    def check(model_dir, inputs, reference, endpoints):
        failure, diffs = real_check(model_dir, inputs, reference, endpoints)
        if failure is None and b"CtrStringEmbedding" in (tmp_path.joinpath(model_dir, "saved_model.pb")).read_bytes():
            return "gives other outputs than the original (injected)", diffs
        return failure, diffs

    monkeypatch.setattr(rewrite, "_fresh_process_failure", check)
    report = rewrite.optimize_saved_model(src, dst, runs=1)
    assert list(report.rejected_patterns) == ["string_split_lookup"]
    assert "injected" in report.rejected_patterns["string_split_lookup"]
    sig = report.signatures["serving_default"]
    fused = {m["pattern"] for m in sig.matches}
    assert "string_split_lookup" not in fused and {"sparse_segment_lookup", "safe_lookup"} <= fused
    assert any(s["pattern"] == "string_split_lookup" and s["reason"].startswith("dropped") for s in sig.skips)
    assert b"CtrStringEmbedding" not in (dst / "saved_model.pb").read_bytes()
    assert "dropped pattern string_split_lookup" in report.summary()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".ctr-")]  # no temporary folder left


def test_unverifiable_model_fails_and_writes_nothing(tmp_path):
    class Picky(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def serve(self, x):
            tf.debugging.assert_equal(x, tf.constant("only-this-value"))
            return {"n": tf.strings.length(x)}

    picky = Picky()
    tf.saved_model.save(picky, str(tmp_path / "src"), signatures={"serving_default": picky.serve})
    import shutil

    shutil.copytree(tmp_path / "src", tmp_path / "dst")  # a previous model
    (tmp_path / "dst" / "keep.txt").write_text("previous model")

    cli = run_cli(["src", "dst"], tmp_path)
    assert cli.returncode == 1
    error_lines = [line for line in cli.stderr.splitlines() if line.startswith("tf-ctr-ops optimize: error:")]
    assert len(error_lines) == 1 and "cannot verify" in error_lines[0] and "--inputs" in error_lines[0], cli.stderr
    assert (tmp_path / "dst" / "keep.txt").read_text() == "previous model"  # left as it was

    np.savez(tmp_path / "good.npz", x=np.array(["only-this-value"] * 3))
    cli = run_cli(["src", "dst", "--inputs", "good.npz"], tmp_path)
    assert cli.returncode == 0, cli.stderr
    assert "outputs match on inputs file" in cli.stdout
    assert not (tmp_path / "dst" / "keep.txt").exists()  # replaced by the verified model

    cli = run_cli(["src", "dst2", "--no-verify"], tmp_path)
    assert cli.returncode == 0, cli.stderr
    assert "not verified (--no-verify)" in cli.stdout
    got = serve_in_fresh_process(tmp_path / "dst2", "serving_default", {"x": np.array([b"only-this-value"], object)},
                                 tmp_path)
    np.testing.assert_array_equal(got["n"], [15])


def test_given_inputs_the_original_rejects_are_an_error(tmp_path):
    src = tmp_path / "src"
    save_tf1_table_model(str(src))
    np.savez(tmp_path / "wrong.npz", y=np.array(["a"]))
    cli = run_cli(["src", "dst", "--inputs", "wrong.npz"], tmp_path)
    assert cli.returncode == 1 and "array(s) ['y'] that no signature takes" in cli.stderr, cli.stderr
    assert not (tmp_path / "dst").exists()


def test_an_inputs_file_may_leave_a_signature_to_synthesis(tmp_path):
    """A file holding none of a signature's inputs leaves that signature's
    inputs to be synthesized; one holding some of them is an error."""
    from tf_ctr_ops import _model_inputs
    spec = tf.TensorSpec([None], tf.int64)
    signatures = {"both": types.SimpleNamespace(structured_input_signature=((), {"a": spec, "b": spec})),
                  "other": types.SimpleNamespace(structured_input_signature=((), {"c": spec}))}
    np.savez(tmp_path / "one.npz", a=np.arange(3), b=np.arange(3))
    got = _model_inputs.load_inputs_file(tmp_path / "one.npz", signatures)
    assert list(got) == ["both"] and sorted(got["both"]) == ["a", "b"]
    np.savez(tmp_path / "partial.npz", a=np.arange(3))
    with pytest.raises(_model_inputs.InputsError, match=r"no array for input\(s\) \['b'\] of signature 'both'"):
        _model_inputs.load_inputs_file(tmp_path / "partial.npz", signatures)
    np.savez(tmp_path / "empty.npz")
    with pytest.raises(_model_inputs.InputsError, match="holds no arrays"):
        _model_inputs.load_inputs_file(tmp_path / "empty.npz", signatures)


def test_given_inputs_of_no_examples_are_an_error(tmp_path):
    """A batch of 0 gives empty outputs, which agree whatever the rewrite
    did: verifying on it must not report a match."""
    src = tmp_path / "src"
    save_split_safe_lookup_model(str(src))
    np.savez(tmp_path / "empty.npz", x=np.zeros([0], "S1"))
    cli = run_cli(["src", "dst", "--inputs", "empty.npz"], tmp_path)
    assert cli.returncode == 1 and "all empty, so nothing can be compared" in cli.stderr, cli.stdout + cli.stderr
    assert not (tmp_path / "dst").exists()


def _ids_and_strings_signature(tmp_path):
    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.int32), tf.TensorSpec([None], tf.string)])
    def serve(ids, s):
        return {"y": ids, "n": tf.strings.length(s)}

    tf.saved_model.save(tf.Module(), str(tmp_path / "m"), signatures={"serving_default": serve})
    return tf.saved_model.load(str(tmp_path / "m")).signatures["serving_default"]


@pytest.mark.parametrize("arrays, error", [
    (dict(ids=np.array([[1, 2]], np.int64), s=np.array(["a"])), None),
    (dict(ids=np.array([[1, 2]], np.int64), s=np.array(["a"]), extra=np.zeros(1)), r"\['extra'\] that no signature"),
    (dict(ids=np.array([[1.0, 2.0]], np.float32), s=np.array(["a"])), "'ids' .* is float32; the input is int32"),
    (dict(ids=np.array([[1, 2**40]], np.int64), s=np.array(["a"])), "outside int32's range"),
    (dict(ids=np.array([1, 2], np.int64), s=np.array(["a"])), r"'ids' .* has shape \[2\]; the input is \(None, 2\)"),
    (dict(ids=np.array([[1, 2]], np.int64), s=np.array([1])), "'s' .* is int64; the input is string"),
    (dict(ids=np.array([[1, 2]], np.int64), s=np.array(["a"], object)),
     "'s' is an object array.*dtype='S'.*drops each string's trailing NUL bytes.*sample_inputs"),
])
def test_inputs_file_arrays_must_fit_the_signature(tmp_path, arrays, error):
    from tf_ctr_ops import _model_inputs
    fn = _ids_and_strings_signature(tmp_path)  # inputs by name, as the CLI's
    np.savez(tmp_path / "in.npz", **arrays)
    if error is None:
        got = _model_inputs.load_inputs_file(tmp_path / "in.npz", {"serving_default": fn})["serving_default"]
        assert got["ids"].dtype == np.int32 and got["s"].dtype == object
        return
    with pytest.raises(_model_inputs.InputsError, match=error):
        _model_inputs.load_inputs_file(tmp_path / "in.npz", {"serving_default": fn})


@pytest.mark.parametrize("content, error", [
    (b"", r"holds no records$"),
    (b"x\n1|2\n3\n", r"is neither an .npz nor a TFRecord file \(no whole record in its 8 bytes\)$"),
    (b"x,y\n1|2,3\n4|5|6,7\n8,9\n10,11\n",
     r"is neither an .npz nor a readable TFRecord file: DataLossError: corrupted record at 0 \(Is this even a "
     r"TFRecord file\?\)$"),
])
def test_an_inputs_file_that_is_no_npz_nor_tfrecord_says_so(tmp_path, content, error):
    # One line, without TF's eager framing ("{{function_node ...}}", "[Op:...]").
    from tf_ctr_ops import _model_inputs
    (tmp_path / "in.csv").write_bytes(content)
    with pytest.raises(_model_inputs.InputsError, match=error):
        _model_inputs.load_inputs_file(tmp_path / "in.csv", {"serving_default": _ids_and_strings_signature(tmp_path)})


def test_an_inputs_file_serves_a_subset_of_the_signatures(tmp_path):
    # --signature serving_default with a file for both signatures: the other
    # one's inputs, plain or SIGNATURE/INPUT, are no misspelt names.
    from tf_ctr_ops import _model_inputs

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def by_keys(keys):
        return {"y": keys + 1}

    selected = {"serving_default": _ids_and_strings_signature(tmp_path)}
    tf.saved_model.save(tf.Module(), str(tmp_path / "other"), signatures={"by_keys": by_keys})
    unselected = {"by_keys": tf.saved_model.load(str(tmp_path / "other")).signatures["by_keys"]}
    base = dict(ids=np.array([[1, 2]], np.int32), s=np.array(["a"]))
    for name in ("keys", "by_keys/keys"):
        np.savez(tmp_path / "in.npz", **base, **{name: np.array([3], np.int64)})
        got = _model_inputs.load_inputs_file(tmp_path / "in.npz", selected, unselected)
        assert set(got) == {"serving_default"} and set(got["serving_default"]) == {"ids", "s"}, got
        with pytest.raises(_model_inputs.InputsError, match=rf"\['{name}'\] that no signature takes"):
            _model_inputs.load_inputs_file(tmp_path / "in.npz", selected)
    np.savez(tmp_path / "in.npz", **base, kyes=np.array([3], np.int64))
    with pytest.raises(_model_inputs.InputsError, match=r"\['kyes'\] that no signature takes"):
        _model_inputs.load_inputs_file(tmp_path / "in.npz", selected, unselected)


def test_an_inputs_file_names_an_input_by_its_signature_def_key(tmp_path):
    # TF makes `feat/x` the loaded function's argument `feat_x`; servers and
    # saved_model_cli show `feat/x`, and either name is taken.
    from tf_ctr_ops import _model_inputs

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64, name="feat/x"), tf.TensorSpec([None], tf.int64)])
    def serve(feat_x, plain):
        return {"y": feat_x + plain}

    tf.saved_model.save(tf.Module(), str(tmp_path / "m"), signatures={"serving_default": serve})
    signatures = {"serving_default": tf.saved_model.load(str(tmp_path / "m")).signatures["serving_default"]}
    for name in ("feat/x", "feat_x", "serving_default/feat/x"):
        np.savez(tmp_path / "in.npz", **{name: np.array([3], np.int64), "plain": np.array([1], np.int64)})
        got = _model_inputs.load_inputs_file(tmp_path / "in.npz", signatures)["serving_default"]
        assert sorted(got) == ["feat_x", "plain"] and list(got["feat_x"]) == [3], (name, got)
    np.savez(tmp_path / "in.npz", plain=np.array([1], np.int64))
    with pytest.raises(_model_inputs.InputsError, match=r"no array for input\(s\) \['feat/x'\]"):
        _model_inputs.load_inputs_file(tmp_path / "in.npz", signatures)
    # A signature's own name for an input goes before the one all signatures take.
    signatures = {"serving_default": signatures["serving_default"], "other": signatures["serving_default"]}
    for shared, own in (("feat_x", "other/feat/x"), ("feat/x", "other/feat_x")):
        np.savez(tmp_path / "in.npz", **{shared: np.array([3], np.int64), own: np.array([5], np.int64),
                                         "plain": np.array([1], np.int64)})
        got = _model_inputs.load_inputs_file(tmp_path / "in.npz", signatures)
        assert [list(got[k]["feat_x"]) for k in ("serving_default", "other")] == [[3], [5]], (shared, own, got)


@pytest.mark.saved_model
def test_examples_that_lost_their_trailing_nul_in_an_npz_say_why_they_fail(tmp_path):
    # numpy's 'S' dtype strips trailing NUL bytes: a tf.Example whose last
    # byte is 0 (an int64 feature ending in 0) no longer parses.
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def serve(examples):
        return {"y": tf.io.parse_example(examples, {"x": tf.io.FixedLenFeature([1], tf.int64)})["x"] * 2}

    tf.saved_model.save(tf.Module(), str(tmp_path / "src"), signatures={"serving_default": serve})
    example = tf.train.Example(features=tf.train.Features(feature={
        "x": tf.train.Feature(int64_list=tf.train.Int64List(value=[0]))})).SerializeToString()
    assert example.endswith(b"\x00")
    np.savez(tmp_path / "in.npz", examples=np.array([example], dtype="S"))
    cli = run_cli(["src", "dst", "--inputs", "in.npz"], tmp_path)
    assert cli.returncode == 1 and "original model fails on the file inputs" in cli.stderr, cli.stderr
    assert "dtype='S' array in an .npz drops each string's trailing NUL bytes" in cli.stderr, cli.stderr
    assert not (tmp_path / "dst").exists()
    # A failure that is no parse error (an id out of range) gets no such hint.
    from tf_ctr_ops import _model_inputs
    assert _model_inputs.nul_hint(tmp_path / "in.npz", "indices[0,2] = 5000 is not in [0, 1000)") == ""


@pytest.mark.saved_model
def test_inputs_no_synthesized_example_satisfies_say_why_the_examples_failed(tmp_path):
    # The error quoted only the plain strings' parse failure, not why the
    # tf.Examples built from the ParseExample spec failed (the real cause).
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def serve(examples):
        ids = tf.io.parse_example(examples, {"ids": tf.io.VarLenFeature(tf.int64)})["ids"]
        check = tf.debugging.assert_equal(tf.size(ids.values), 1000, message="needs exactly 1000 ids")
        with tf.control_dependencies([check]):
            return {"y": tf.sparse.reduce_sum(ids, axis=1)}

    tf.saved_model.save(tf.Module(), str(tmp_path / "src"), signatures={"serving_default": serve})
    cli = run_cli(["src", "dst"], tmp_path)
    assert cli.returncode == 1 and "no synthesized inputs" in cli.stderr, cli.stderr
    assert "on plain values:" in cli.stderr and "on tf.Examples of the ParseExample spec:" in cli.stderr, cli.stderr
    assert "needs exactly 1000 ids" in cli.stderr, cli.stderr
    assert not (tmp_path / "dst").exists()


def test_inputs_file_kind_is_read_from_its_content_not_its_name(tmp_path):
    """An .npz saved under another name (np.savez to an open file) was read
    as a TFRecord file and refused."""
    from tf_ctr_ops import _model_inputs
    fn = _ids_and_strings_signature(tmp_path)
    with open(tmp_path / "inputs.bin", "wb") as f:
        np.savez(f, ids=np.array([[1, 2]], np.int32), s=np.array(["a"]))
    got = _model_inputs.load_inputs_file(tmp_path / "inputs.bin", {"serving_default": fn})["serving_default"]
    np.testing.assert_array_equal(got["ids"], [[1, 2]])


@pytest.mark.parametrize("options", [None, "GZIP"])
def test_inputs_file_tfrecord_plain_or_gzip(tmp_path, options):
    from tf_ctr_ops import _model_inputs

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def serve(examples):
        return {"n": tf.strings.length(examples)}

    tf.saved_model.save(tf.Module(), str(tmp_path / "m"), signatures={"serving_default": serve})
    fn = tf.saved_model.load(str(tmp_path / "m")).signatures["serving_default"]
    with tf.io.TFRecordWriter(str(tmp_path / "in.tfrecord"), options=options) as w:
        for record in (b"first", b"second"):
            w.write(record)
    got = _model_inputs.load_inputs_file(tmp_path / "in.tfrecord", {"serving_default": fn})["serving_default"]
    assert list(got["examples"]) == [b"first", b"second"]


def test_a_tfrecord_inputs_file_for_an_input_not_a_vector_is_refused(tmp_path):
    # Its [N] records went into a [None, None] input: verified "on inputs
    # file" on inputs the signature does not take.
    from tf_ctr_ops import _model_inputs

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.string)])
    def serve(examples):
        return {"n": tf.strings.length(examples)}

    tf.saved_model.save(tf.Module(), str(tmp_path / "m"), signatures={"serving_default": serve})
    fn = tf.saved_model.load(str(tmp_path / "m")).signatures["serving_default"]
    with tf.io.TFRecordWriter(str(tmp_path / "in.tfrecord")) as w:
        w.write(b"first")
    with pytest.raises(_model_inputs.InputsError, match=r"feeds a vector of serialized tf.Examples; input "
                       r"'examples' of signature 'serving_default' is \(None, None\): use an .npz file"):
        _model_inputs.load_inputs_file(tmp_path / "in.tfrecord", {"serving_default": fn})


def test_a_tfrecord_inputs_file_feeds_the_signatures_of_examples_and_the_others_are_synthesized(tmp_path):
    # A second signature of raw features (or of none) refused the whole file.
    from tf_ctr_ops import _model_inputs

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def examples(records):
        return {"n": tf.strings.length(records)}

    @tf.function(input_signature=[])
    def info():
        return {"v": tf.constant(1)}

    tf.saved_model.save(tf.Module(), str(tmp_path / "m"), signatures={"serving_default": examples, "info": info})
    loaded = tf.saved_model.load(str(tmp_path / "m")).signatures
    with tf.io.TFRecordWriter(str(tmp_path / "in.tfrecord")) as w:
        w.write(b"first")
    got = _model_inputs.load_inputs_file(tmp_path / "in.tfrecord", dict(loaded))
    assert list(got) == ["serving_default"] and list(got["serving_default"]["records"]) == [b"first"], got
    with pytest.raises(_model_inputs.InputsError, match=r"signature 'info' takes \[\]: use an .npz file"):
        _model_inputs.load_inputs_file(tmp_path / "in.tfrecord", {"info": loaded["info"]})


def test_an_npz_member_that_is_no_npy_array_says_so(tmp_path):
    # A member not named .npy came back as bytes (an AttributeError traceback);
    # a damaged .npy was called "an object array, which would need pickle".
    import io
    import zipfile
    from tf_ctr_ops import _model_inputs
    fn = _ids_and_strings_signature(tmp_path)
    buffer = io.BytesIO()
    np.save(buffer, np.array(["a"]))
    npy = buffer.getvalue()
    for member, data, why in (("s", b"not an npy", "its bytes are no .npy array"),
                              ("s.npy", npy[:-4], "EOF"),
                              ("s.npy", npy[:6] + b"\x09\x00" + npy[8:], "version")):
        with zipfile.ZipFile(tmp_path / "in.npz", "w") as z:
            z.writestr(member, data)
        with pytest.raises(_model_inputs.InputsError, match=rf"member 's' is not a readable .npy array \(.*{why}"):
            _model_inputs.load_inputs_file(tmp_path / "in.npz", {"serving_default": fn})


def test_sample_inputs_for_a_signature_the_model_lacks_are_refused(tmp_path):
    # A misspelt key left its signature verified on synthesized inputs.
    module = tf.Module()
    module.table = tf.Variable(tf.random.normal([10, 2]))
    serve = tf.function(lambda ids: {"y": tf.gather(module.table, ids)},
                        input_signature=[tf.TensorSpec([None], tf.int64)])
    tf.saved_model.save(module, str(tmp_path / "src"), signatures={"serving_default": serve})
    with pytest.raises(ValueError, match=r"sample_inputs for signature\(s\) \['serving_defualt'\] not in"):
        rewrite.optimize_saved_model(tmp_path / "src", tmp_path / "dst",
                                     sample_inputs={"serving_defualt": {"ids": np.array([1, 2])}})
    assert not (tmp_path / "dst").exists()


def test_plain_string_inputs_hold_bags_of_several_lengths():
    """Verification's first candidate: id lists of 1 to 8 ids, so that a
    pooling exact on two ids but not on eight is compared on eight too."""
    from tf_ctr_ops import _model_inputs
    specs = {"s": tf.TensorSpec([None], tf.string), "m": tf.TensorSpec([None, 3], tf.string)}
    inputs = _model_inputs.plain_inputs(specs, np.random.default_rng(0))
    assert sorted(len(v.split(b",")) for v in inputs["s"]) == [1, 2, 5, 8]
    assert inputs["m"].shape == (_model_inputs.BATCH, 3)
    for v in np.ravel(inputs["m"]).tolist() + list(inputs["s"]):
        assert set(v.split(b",")) <= {b"0", b"1"}, v


def test_a_masked_lookup_with_several_oov_slots_names_both_when_its_find_stays():
    # With a mask_token the slots' Select reads the mask's, not the find: the
    # hash is still named the slot of its lookup, the find the masked one.
    import keras

    lookup = keras.layers.StringLookup(vocabulary=["a", "b"], mask_token="", num_oov_indices=2)

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.string)])
    def model(keys):
        return lookup(keys)

    records = rewrite._unfused_feature_records(model.get_concrete_function().graph.as_graph_def())
    by_op = {}
    for r in records:
        by_op.setdefault(r["op"], []).append(r["reason"])
    [find] = by_op["LookupTableFindV2"]
    assert "with a mask_token" in find, find
    [hashed] = by_op["StringToHashBucketFast"]
    assert "the out-of-vocabulary slot of a lookup with num_oov_indices > 1" in hashed, hashed


def test_lookups_that_accept_any_key_are_fed_keys_of_their_vocabulary_too(rng):
    """Plain values pass a lookup with out-of-vocabulary slots, so the
    search stopped there: a fused find was compared on misses alone."""
    from tf_ctr_ops import _model_inputs
    vocabulary = np.array([b"sf", b"nyc", b"la"], object)
    specs = {"city": tf.TensorSpec([None], tf.string), "n": tf.TensorSpec([None], tf.int64)}
    facts = graph_facts(input_vocabularies={"city": vocabulary})
    inputs, how = _model_inputs.synthesize(specs, lambda inputs: None, facts, rng)
    fed = set(inputs["city"].ravel().tolist())
    assert set(vocabulary[:2]) <= fed and fed - set(vocabulary), fed  # in order, at the even places of 4
    # ... besides the plain values' own checks, which stay (a first try
    # narrowed them to four values, with no empty string).
    assert b"" in fed and "ids in [0, 1000)" in how and "empty strings" in how and "vocabulary keys" in how, how


def test_a_partition_count_is_no_id_bound():
    """A partitioned table's DynamicPartition names its partition count
    ("partitions[0] = 142 is not in [0, 3)"): ids were kept below 3."""
    from tf_ctr_ops import _model_inputs

    def run(high):
        return None if high <= 10 else f"partitions[0] = {high - 1} is not in [0, 3)"

    assert _model_inputs._widest_ids(lambda high: high, run) == (10, 10)
    assert _model_inputs._named_bound("indices[0,1] = 53 is not in [0, 50)") == 50
    assert _model_inputs._named_bound("id 7 in row 2 is out of range [0, 5)") == 5


def test_a_bound_a_shard_names_is_searched_past():
    """A partitioned table's shard names its own rows when it refuses an id
    (id 333 of 3 "mod" shards of 11 rows: "indices[0] = 111 is not in
    [0, 4)"): ids below 4 would leave rows 4 to 10 of the table the rewrite
    merges uncompared."""
    from tf_ctr_ops import _model_inputs

    tries = []

    def run(high):
        tries.append(high)
        return None if high <= 11 else f"indices[0] = {(high - 1) // 3} is not in [0, 4)"

    assert _model_inputs._widest_ids(lambda high: high, run) == (11, 11)
    assert tries == [1000, 4, 5, 10, 20, 15, 12, 11], tries


def test_synthesized_inputs_do_not_depend_on_the_order_the_signature_lists_them():
    # A loaded signature lists its inputs in another order in every process:
    # the same model and seed must get the same inputs (and the same search).
    from tf_ctr_ops import _model_inputs

    specs = {"b": tf.TensorSpec([None], tf.float32), "a": tf.TensorSpec([None, 2], tf.int64),
             "c": tf.TensorSpec([None], tf.float32)}
    facts = graph_facts()
    run = lambda inputs: None  # noqa: E731 - the original accepts anything
    got = [_model_inputs.synthesize(dict(order), run, facts, np.random.default_rng(3))[0]
           for order in (specs.items(), reversed(list(specs.items())))]
    assert got[0].keys() == got[1].keys()
    for k in got[0]:
        np.testing.assert_array_equal(got[0][k], got[1][k])


def test_fixed_batch_id_matrices_are_widened_too():
    """A `[8, 3]` input of ids (a model exported with a fixed batch) is as
    much ids as a `[None, 3]` one; only a fixed vector stays 0 and 1 (a
    shape, a count)."""
    from tf_ctr_ops import _model_inputs
    table = tf.constant(np.arange(57 * 2, dtype=np.float32).reshape(57, 2))

    @tf.function(input_signature=[tf.TensorSpec([8, 3], tf.int64), tf.TensorSpec([2], tf.int64)])
    def model(ids, shape):
        return tf.reduce_sum(tf.gather(table, ids), axis=1) + tf.cast(tf.reduce_sum(shape), tf.float32)

    facts = graph_facts()
    specs = {"ids": tf.TensorSpec([8, 3], tf.int64), "shape": tf.TensorSpec([2], tf.int64)}
    inputs, how = _model_inputs.synthesize(specs, _judge(model, []), facts, np.random.default_rng(0))
    assert inputs["ids"].shape == (8, 3) and how == "synthesized, ids in [0, 57)", how
    assert inputs["ids"].max() == 56 and set(inputs["shape"].tolist()) <= {0, 1}


@pytest.mark.parametrize("limit, expected_high", [("gather", 57), ("assert", 30), ("assert_tiny", None)])
def test_plain_int_ids_are_widened_to_what_the_original_accepts(limit, expected_high):
    """Ids 0 and 1 alone leave untested what only larger ids reach. The bound
    a gather names is tried next; a refusal naming none steps down 1000, 100,
    10, then halves the gap to the refused range (an identity column's
    assert of 30 buckets: ids up to 29, not 9); a model that accepts only 0
    and 1 keeps them."""
    from tf_ctr_ops import _model_inputs
    table = tf.constant(np.arange(57 * 2, dtype=np.float32).reshape(57, 2))

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.int64, name="ids"),
                                  tf.TensorSpec([2], tf.int64, name="shape")])
    def model(ids, shape):
        if limit == "gather":
            return tf.reduce_sum(tf.gather(table, ids), axis=1) + tf.cast(tf.reduce_sum(shape), tf.float32)
        bound = 30 if limit == "assert" else 2
        with tf.control_dependencies([tf.debugging.assert_less(ids, tf.constant(bound, tf.int64))]):
            return tf.identity(ids) + tf.reduce_sum(shape)

    tries = []
    facts = graph_facts()
    specs = {"ids": tf.TensorSpec([None, 3], tf.int64), "shape": tf.TensorSpec([2], tf.int64)}
    inputs, how = _model_inputs.synthesize(specs, _judge(model, tries), facts, np.random.default_rng(0))
    ids = inputs["ids"]
    assert ids.dtype == np.int64 and ids.shape == (_model_inputs.BATCH, 3)
    assert set(inputs["shape"].tolist()) <= {0, 1}, "a fixed-shape input is not an id"
    if expected_high is None:
        assert how == "synthesized" and set(ids.ravel().tolist()) <= {0, 1}, (how, ids)
        return
    assert how == f"synthesized, ids in [0, {expected_high})", how
    flat = ids.ravel()
    assert flat.max() == expected_high - 1 and flat.min() >= 0 and np.all(np.diff(flat) >= 0), flat
    assert len(set(flat.tolist())) < flat.size, "repeated ids, as real bags hold"
    # [0, 2), 1000, 57, then 58 (refused: the table's own bound); or 100, 10
    # and the halvings 55, 32, 21, 26, 29, 30, 31
    assert len(tries) == (4 if limit == "gather" else 11), len(tries)


def test_example_int_features_are_widened_to_the_table(tmp_path):
    """Serialized tf.Examples synthesized from a ParseExample spec carry int
    ids up to the bound the original names, not only 0 and 1."""
    class ExampleModel(tf.Module):
        def __init__(self):
            super().__init__()
            self.table = tf.Variable(np.arange(30 * 2, dtype=np.float32).reshape(30, 2))

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
        def serve(self, examples):
            parsed = tf.io.parse_example(examples, {"item": tf.io.VarLenFeature(tf.int64),
                                                    "age": tf.io.FixedLenFeature([1], tf.float32)})
            pooled = tf.nn.embedding_lookup_sparse(self.table, parsed["item"], None, combiner="sum")
            return pooled + parsed["age"]

    module = ExampleModel()
    src = tmp_path / "src"
    tf.saved_model.save(module, str(src), signatures={"serving_default": module.serve})
    inputs, how, _ = _synthesized(src, [], np.random.default_rng(0))
    assert how == "synthesized (tf.Example from the ParseExample spec), ids in [0, 30)", how
    items = [v for s in inputs["examples"]
             for v in tf.train.Example.FromString(s).features.feature["item"].int64_list.value]
    assert max(items) == 29 and min(items) >= 0, items


def test_each_id_input_is_widened_to_its_own_table():
    """Two id inputs over tables of 11 and 23 rows: widened together, both
    stop at 11, which leaves the second table's rows 11 to 22 uncompared;
    each is then widened alone, holding the other at 11."""
    from tf_ctr_ops import _model_inputs
    small = tf.constant(np.arange(11 * 2, dtype=np.float32).reshape(11, 2))
    large = tf.constant(np.arange(23 * 2, dtype=np.float32).reshape(23, 2))

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.int64, name="a"),
                                  tf.TensorSpec([None, 3], tf.int64, name="b")])
    def model(a, b):
        return tf.reduce_sum(tf.gather(small, a), axis=1) + tf.reduce_sum(tf.gather(large, b), axis=1)

    facts = graph_facts()
    specs = {"a": tf.TensorSpec([None, 2], tf.int64), "b": tf.TensorSpec([None, 3], tf.int64)}
    inputs, how = _model_inputs.synthesize(specs, _judge(model, []), facts, np.random.default_rng(0))
    assert how == "synthesized, ids in [0, 11) and wider where taken (b [0, 23))", how
    assert inputs["a"].max() == 10 and inputs["b"].max() == 22, inputs
    model(**inputs)  # the inputs given back are the ones accepted together


def test_each_example_id_feature_is_widened_to_its_own_table(tmp_path):
    class ExampleModel(tf.Module):
        def __init__(self):
            super().__init__()
            self.small = tf.Variable(np.arange(11 * 2, dtype=np.float32).reshape(11, 2))
            self.large = tf.Variable(np.arange(30 * 2, dtype=np.float32).reshape(30, 2))

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
        def serve(self, examples):
            parsed = tf.io.parse_example(examples, {"user": tf.io.VarLenFeature(tf.int64),
                                                    "item": tf.io.VarLenFeature(tf.int64)})
            return (tf.nn.embedding_lookup_sparse(self.small, parsed["user"], None, combiner="sum")
                    + tf.nn.embedding_lookup_sparse(self.large, parsed["item"], None, combiner="sum"))

    module = ExampleModel()
    src = tmp_path / "src"
    tf.saved_model.save(module, str(src), signatures={"serving_default": module.serve})
    inputs, how, _ = _synthesized(src, [], np.random.default_rng(0))
    assert how == ("synthesized (tf.Example from the ParseExample spec), ids in [0, 11) and wider where taken "
                   "(item [0, 30))"), how
    examples = [tf.train.Example.FromString(s).features.feature for s in inputs["examples"]]
    assert max(v for e in examples for v in e["item"].int64_list.value) == 29
    assert max(v for e in examples for v in e["user"].int64_list.value) == 10


def test_plain_id_lists_are_widened_keeping_their_bag_lengths():
    """The ids inside the plain delimited strings are widened as integer
    inputs are: a split, to_number and gather sees rows past the second."""
    from tf_ctr_ops import _model_inputs
    table = tf.constant(np.arange(40 * 2, dtype=np.float32).reshape(40, 2))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def model(s):
        ids = tf.strings.to_number(tf.strings.split(s, ","), tf.int64)
        return tf.reduce_sum(tf.gather(table, ids), axis=1)

    facts = graph_facts()
    inputs, how = _model_inputs.synthesize({"s": tf.TensorSpec([None], tf.string)}, _judge(model, []), facts,
                                           np.random.default_rng(0))
    assert how == "synthesized, ids in [0, 40)", how
    bags = [[int(i) for i in v.split(b",")] for v in inputs["s"]]
    assert sorted(len(b) for b in bags) == [1, 2, 5, 8], bags
    flat = [i for b in bags for i in b]
    assert max(flat) == 39 and min(flat) >= 0 and len(set(flat)) > 2, bags


@pytest.mark.parametrize("split", ["v1", "v2"])
def test_synthesized_strings_include_an_empty_one_where_the_original_takes_it(split):
    # An empty string is where TF's two splits differ (v1 gives it no token,
    # v2 one empty token): verification must try it. v2 + to_number rejects
    # it, so there the plain lists stay.
    from tf_ctr_ops import _model_inputs
    table = tf.constant(np.arange(40 * 2, dtype=np.float32).reshape(40, 2))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def model(s):
        if split == "v1":
            sp = tf.compat.v1.string_split(s, ",")
            ids = tf.SparseTensor(sp.indices, tf.strings.to_number(sp.values, tf.int64), sp.dense_shape)
            return tf.nn.safe_embedding_lookup_sparse(table, ids, None)
        return tf.reduce_sum(tf.gather(table, tf.strings.to_number(tf.strings.split(s, ","), tf.int64)), axis=1)

    facts = graph_facts()
    inputs, how = _model_inputs.synthesize({"s": tf.TensorSpec([None], tf.string)}, _judge(model, []), facts,
                                           np.random.default_rng(0))
    if split == "v1":
        assert how == "synthesized, ids in [0, 40), empty strings", how
        assert inputs["s"][1] == b"" and all(inputs["s"][i] for i in (0, 2, 3)), inputs
    else:
        assert how == "synthesized, ids in [0, 40)", how
        assert all(inputs["s"]), inputs


def test_a_saved_model_of_several_meta_graphs_is_refused_in_one_line(tmp_path):
    # Only the serving graph could be verified; the others would be rewritten
    # unchecked.
    v1 = tf.compat.v1
    builder = v1.saved_model.Builder(str(tmp_path / "src"))
    for i, tags in enumerate((["serve"], ["serve", "exp"])):
        with tf.Graph().as_default():
            x = v1.placeholder(tf.float32, [None], name="x")
            signatures = {"serving_default": v1.saved_model.predict_signature_def({"x": x}, {"y": x * 2.0})}
            if i == 0:
                with v1.Session() as sess:
                    builder.add_meta_graph_and_variables(sess, tags, signature_def_map=signatures)
            else:
                builder.add_meta_graph(tags, signature_def_map=signatures)
    builder.save()
    cli = run_cli(["src", "dst"], tmp_path)
    assert cli.returncode == 1 and not (tmp_path / "dst").exists()
    assert "holds 2 MetaGraphs (tag sets [['serve'], ['exp', 'serve']])" in cli.stderr, cli.stderr
    assert len(cli.stderr.strip().splitlines()) == 1, cli.stderr


def test_a_rewrite_that_cannot_be_rebuilt_is_a_rewrite_error(tmp_path):
    # TF's importer refusing the rewritten graph (a dangling input, say) ends
    # as the CLI's one-line error, never as a traceback.
    from tf_ctr_ops import rewrite as rw

    def build(folder, disabled):
        raise ValueError("input ^AssignVariableOp is not found: {{node embedding_lookup}}\nmore")

    with pytest.raises(rw.RewriteError, match=r"could not be rebuilt \(ValueError: input \^AssignVariableOp is not "
                                              r"found: \{\{node embedding_lookup\}\}\)$"):
        rw._servable_rewrite(build, str(tmp_path), None, None, set(), str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_a_pattern_whose_result_cannot_be_rebuilt_is_dropped(tmp_path, monkeypatch):
    # The patterns that fused are known even when TF refuses the rebuilt
    # graph, so they are tried one at a time as for any other failure.
    from tf_ctr_ops import rewrite as rw

    monkeypatch.setattr(rw, "_fresh_process_failure", lambda folder, inputs, reference, endpoints: (None, {}))

    def build(folder, disabled):
        fused = [p for p in ("hash_gather", "group_strings") if p not in disabled]
        reports = {"s": rw.SignatureReport("s", True, matches=[{"pattern": p} for p in fused])}
        if "group_strings" in fused:
            raise rw._RebuildError(reports, ValueError("13 nodes in a cycle"))
        return reports, 0.0, []

    best, dropped = rw._servable_rewrite(build, str(tmp_path), None, None, set(), str(tmp_path))
    assert rw._fused_patterns(best.reports) == ["hash_gather"] and not best.failure
    assert list(dropped) == ["group_strings"] and "13 nodes in a cycle" in dropped["group_strings"]


def _saved_values(model_dir):
    """The values of a SavedModel's variables (whatever their checkpoint keys), in a canonical order."""
    reader = tf.train.load_checkpoint(str(model_dir / "variables" / "variables"))
    return sorted((tuple(reader.get_tensor(k).shape), reader.get_tensor(k).tobytes())
                  for k in reader.get_variable_to_shape_map() if k != "_CHECKPOINTABLE_OBJECT_GRAPH")


class _StatefulModel(tf.Module):
    """A hashed string lookup to fuse, beside signatures that change state (an
    online-learning hook writing table rows, a request counter)."""

    def __init__(self):
        self.table = tf.Variable(tf.reshape(tf.range(20, dtype=tf.float32), [10, 2]))
        self.calls = tf.Variable(0, dtype=tf.int64)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="x")])
    def predict(self, x):
        ids = tf.strings.to_hash_bucket_fast(tf.strings.split(x, "|"), 10).to_sparse()
        return {"emb": tf.nn.safe_embedding_lookup_sparse(self.table, ids, combiner="sum")}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64, name="rows"),
                                  tf.TensorSpec([None, 2], tf.float32, name="values")])
    def set_rows(self, rows, values):
        self.table.scatter_update(tf.IndexedSlices(values, rows))
        return {"rows": tf.identity(rows)}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="y")])
    def count(self, y):
        self.calls.assign_add(1)
        return {"y": y * 2.0}


@pytest.mark.parametrize("given", [False, True])
def test_verification_leaves_the_saved_state_as_it_was(tmp_path, given):
    # Verification called every signature of the very object then saved as
    # dst: a hook's writes (and the synthesized inputs' search, many calls)
    # went into dst's variables, and a search that changed the state made the
    # rewrite look wrong against a fresh dst.
    src, dst = tmp_path / "src", tmp_path / "dst"
    model = _StatefulModel()
    tf.saved_model.save(model, str(src), signatures={"serving_default": model.predict, "set_rows": model.set_rows,
                                                     "count": model.count})
    sample = {"serving_default": {"x": np.array([b"a|b", b"c", b""], object)},
              "set_rows": {"rows": np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]),
                           "values": np.full([10, 2], 100.0, np.float32)},
              "count": {"y": np.array([1.0], np.float32)}} if given else None
    report = rewrite.optimize_saved_model(src, dst, sample_inputs=sample, runs=0)
    fused = {m["fused_op"] for m in report.signatures["serving_default"].matches}
    assert "CtrStringEmbedding" in fused and all(s.outputs_match for s in report.signatures.values()), report
    assert _saved_values(dst) == _saved_values(src)
    x = np.array([b"a|b|c", b"zz", b""], object)
    assert_same_outputs(outputs(src, "serving_default", {"x": x}),
                        serve_in_fresh_process(dst, "serving_default", {"x": x}, tmp_path))


@pytest.mark.parametrize("where", ["same", "dst_holds_src", "dst_inside_src"])
def test_a_dst_that_holds_or_lies_in_src_is_refused_and_src_stays(tmp_path, where):
    # `optimize models/v1 models` moved `models` aside and deleted it: the
    # source model was gone and the command exited 0.
    src = tmp_path / "models" / "v1"
    save_split_safe_lookup_model(str(src))
    before = sorted(p.relative_to(src) for p in src.rglob("*"))
    dst = {"same": src, "dst_holds_src": tmp_path / "models", "dst_inside_src": src / "rewritten"}[where]
    with pytest.raises(ValueError, match="must differ|inside"):
        rewrite.optimize_saved_model(src, dst, runs=0)
    assert sorted(p.relative_to(src) for p in src.rglob("*")) == before


def test_a_dst_under_a_file_is_refused_naming_the_file(tmp_path):
    # It was "FileExistsError: [Errno 17] File exists: '.../afile'".
    save_split_safe_lookup_model(str(tmp_path / "src"))
    (tmp_path / "afile").write_text("")
    with pytest.raises(ValueError, match=r"dst .*afile/sub/v1 cannot be made: .*afile is a file, not a folder"):
        rewrite.optimize_saved_model(tmp_path / "src", tmp_path / "afile" / "sub" / "v1", runs=0)


@pytest.mark.parametrize("damage", ["no_variables", "corrupt_proto"])
def test_a_saved_model_tf_cannot_read_is_a_one_line_error(tmp_path, damage):
    import shutil

    save_split_safe_lookup_model(str(tmp_path / "src"))
    if damage == "no_variables":
        shutil.rmtree(tmp_path / "src" / "variables")
    else:
        (tmp_path / "src" / "saved_model.pb").write_bytes(b"\x0a\xff\xff not a proto")
    cli = run_cli(["src", "dst"], tmp_path)
    assert cli.returncode == 1 and "Traceback" not in cli.stderr, cli.stderr
    assert cli.stderr.startswith("tf-ctr-ops optimize: error: ") and len(cli.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "dst").exists()


def test_assets_extra_of_a_tf2_model_are_kept(tmp_path):
    # TF Serving's warmup requests live in assets.extra/, which the TF1 path
    # copied and the TF2 saver does not write.
    src, dst = tmp_path / "src", tmp_path / "dst"
    save_split_safe_lookup_model(str(src))
    (src / "assets.extra").mkdir()
    (src / "assets.extra" / "tf_serving_warmup_requests").write_bytes(b"warmup")
    rewrite.optimize_saved_model(src, dst, runs=0)
    assert (dst / "assets.extra" / "tf_serving_warmup_requests").read_bytes() == b"warmup"


class _RaggedOutputModel(tf.Module):
    def __init__(self):
        self.table = tf.Variable(tf.reshape(tf.range(20, dtype=tf.float32), [10, 2]))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="x")])
    def predict(self, x):
        ids = tf.strings.to_hash_bucket_fast(tf.strings.split(x, "|"), 10).to_sparse()
        return {"emb": tf.nn.safe_embedding_lookup_sparse(self.table, ids, combiner="sum")}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="s")])
    def tokens(self, s):
        return {"tokens": tf.strings.split(s, ",")}


def test_a_signature_returning_a_ragged_tensor_is_copied_and_the_others_rewritten(tmp_path):
    # Its outputs were compared as dense arrays (a bare numpy error) and its
    # rebuild failed: no model could be rewritten at all.
    src, dst = tmp_path / "src", tmp_path / "dst"
    model = _RaggedOutputModel()
    tf.saved_model.save(model, str(src), signatures={"serving_default": model.predict, "tokens": model.tokens})
    report = rewrite.optimize_saved_model(src, dst, runs=0)
    assert "CtrStringEmbedding" in {m["fused_op"] for m in report.signatures["serving_default"].matches}
    assert not report.signatures["tokens"].rewritten
    assert any("RaggedTensor" in s["reason"] for s in report.signatures["tokens"].skips)
    # Every signature was selected: the summary names why this one was copied.
    assert "signature 'tokens': copied unchanged: it returns composite tensors" in report.summary()
    assert "not selected" not in report.summary()
    served = tf.saved_model.load(str(dst)).signatures["tokens"](s=tf.constant(["a,b", ""]))["tokens"]
    assert served.to_list() == [[b"a", b"b"], [b""]]
    with pytest.raises(ValueError, match="returns composite tensors"):
        rewrite.optimize_saved_model(src, tmp_path / "dst2", signature_keys=["tokens"], runs=0)


def test_dst_keeps_the_modes_of_a_new_folder_and_a_folder_of_other_files_is_refused(tmp_path):
    # mkdtemp made dst 0700: a server running as another user could not read
    # it. A dst folder holding anything but a SavedModel was silently wiped.
    src, dst = tmp_path / "src", tmp_path / "dst"
    save_split_safe_lookup_model(str(src))
    umask = os.umask(0o022)
    try:
        rewrite.optimize_saved_model(src, dst, runs=0)
    finally:
        os.umask(umask)
    assert (dst.stat().st_mode & 0o777) == 0o755
    other = tmp_path / "notes"
    other.mkdir()
    (other / "thesis.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds no SavedModel"):
        rewrite.optimize_saved_model(src, other, runs=0)
    assert (other / "thesis.txt").read_text() == "mine"


def test_an_unwritable_report_path_is_refused_before_the_rewrite(tmp_path):
    save_split_safe_lookup_model(str(tmp_path / "src"))
    cli = run_cli(["src", "dst", "--report", "missing/r.json"], tmp_path)
    assert cli.returncode == 2 and "--report missing/r.json cannot be written" in cli.stderr
    assert not (tmp_path / "dst").exists()


def test_a_report_path_naming_dst_is_refused_before_the_rewrite(tmp_path):
    # It passed the check while DST did not exist yet, and the report's
    # open() then met the written DST folder: a traceback after success.
    save_split_safe_lookup_model(str(tmp_path / "src"))
    cli = run_cli(["src", "dst", "--report", "dst"], tmp_path)
    assert cli.returncode == 2 and "--report dst is DST" in cli.stderr, cli.stderr
    assert not (tmp_path / "dst").exists()


def test_a_report_path_inside_src_or_dst_or_on_the_inputs_is_refused_before_the_rewrite(tmp_path):
    # --report DST/saved_model.pb overwrote the model just written (and
    # SRC/saved_model.pb the source), and the command exited 0.
    save_split_safe_lookup_model(str(tmp_path / "src"))
    assert run_cli(["src", "dst"], tmp_path).returncode == 0
    pb = {name: (tmp_path / name / "saved_model.pb").read_bytes() for name in ("src", "dst")}
    np.savez(tmp_path / "in.npz", x=np.array([b"1|2"]))
    for report, why in (("dst/saved_model.pb", "lies inside DST"), ("src/saved_model.pb", "lies inside SRC"),
                        ("src/variables/new.json", "lies inside SRC"), ("in.npz", "is the --inputs file")):
        cli = run_cli(["src", "dst", "--inputs", "in.npz", "--report", report], tmp_path)
        assert cli.returncode == 2 and f"--report {report} {why}" in cli.stderr, cli.stderr
    assert not (tmp_path / "src" / "variables" / "new.json").exists()
    # A hard link is no path inside SRC, DST or the inputs, but one file.
    for name, target in (("src.json", "src/saved_model.pb"), ("dst.json", "dst/saved_model.pb"), ("in.json", "in.npz")):
        os.link(tmp_path / target, tmp_path / name)
        cli = run_cli(["src", "dst", "--inputs", "in.npz", "--report", name], tmp_path)
        assert cli.returncode == 2 and f"--report {name} is {target} (through a link)" in cli.stderr, cli.stderr
    # Nor is a file of a folder SRC links to (SRC/variables a link to it).
    (tmp_path / "src" / "variables").rename(tmp_path / "store")
    os.symlink(tmp_path / "store", tmp_path / "src" / "variables")
    index = {p.name: p.read_bytes() for p in (tmp_path / "store").iterdir()}
    for report in ("variables.index", "new.json"):  # SRC's file, or a new one in SRC's folder
        cli = run_cli(["src", "dst", "--inputs", "in.npz", "--report", f"store/{report}"], tmp_path)
        assert cli.returncode == 2 and f"is src/variables/{report} (through a link)" in cli.stderr, cli.stderr
    # Nor is a file SRC links to (an asset kept outside it).
    (tmp_path / "vocab.txt").write_text("a\n")
    (tmp_path / "src" / "assets").mkdir(exist_ok=True)
    os.symlink(tmp_path / "vocab.txt", tmp_path / "src" / "assets" / "vocab.txt")
    cli = run_cli(["src", "dst", "--inputs", "in.npz", "--report", "vocab.txt"], tmp_path)
    assert cli.returncode == 2 and "is src/assets/vocab.txt (through a link)" in cli.stderr, cli.stderr
    assert (tmp_path / "vocab.txt").read_text() == "a\n"
    assert {p.name: p.read_bytes() for p in (tmp_path / "store").iterdir()} == index
    assert {name: (tmp_path / name / "saved_model.pb").read_bytes() for name in ("src", "dst")} == pb


def test_the_same_file_check_walks_srcs_own_tree_before_what_its_links_lead_to(tmp_path, monkeypatch):
    # Depth first, a link to a big tree listed before SRC's own folders used
    # up the walk's bound before SRC's own file was seen.
    from tf_ctr_ops import _errors

    (tmp_path / "src" / "assets").mkdir(parents=True)
    (tmp_path / "src" / "assets" / "vocab.txt").write_text("a\n")
    for i in range(10):
        for j in range(10):
            (tmp_path / f"big{i}" / f"d{j}").mkdir(parents=True)
        os.symlink(tmp_path / f"big{i}", tmp_path / "src" / f"link{i}")
    os.link(tmp_path / "src" / "assets" / "vocab.txt", tmp_path / "report.json")
    monkeypatch.setattr(_errors, "_MOST_FOLDERS", 5)
    assert _errors.same_file_in(str(tmp_path / "report.json"), str(tmp_path / "src")) == str(
        tmp_path / "src" / "assets" / "vocab.txt")


def test_a_report_path_that_only_opening_shows_unwritable_is_refused_before_the_rewrite(tmp_path):
    # A link to a missing folder passed the folder check; the report then
    # failed after DST was written, with exit status 1.
    save_split_safe_lookup_model(str(tmp_path / "src"))
    os.symlink(tmp_path / "gone" / "r.json", tmp_path / "r.json")
    cli = run_cli(["src", "dst", "--report", "r.json"], tmp_path)
    assert cli.returncode == 2 and "--report r.json cannot be written: No such file or directory" in cli.stderr
    assert not (tmp_path / "dst").exists()
    cli = run_cli(["src", "dst", "--report", "new.json"], tmp_path)  # a writable path is only checked
    assert cli.returncode == 0 and json.loads((tmp_path / "new.json").read_text())


_KILLED_AROUND_A_FRESH_PROCESS = """
import os, signal, sys, threading, time
from tf_ctr_ops import rewrite
where, folder_file, pid_file = sys.argv[1], sys.argv[2], sys.argv[3]
signal.signal(signal.SIGTERM, rewrite.exit_on_signal)
def kill_once_the_child_runs():
    while not os.path.exists(pid_file):
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)
with rewrite._TERMINATION.temporary_folder() as folder:
    open(folder_file, "w").write(folder)
    open(os.path.join(folder, "request.pkl"), "wb").write(b"x")
    if where == "before":
        os.kill(os.getpid(), signal.SIGTERM)
    if where == "during":
        threading.Thread(target=kill_once_the_child_runs, daemon=True).start()
    child = ("import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); "
             "time.sleep(120 if sys.argv[2] == 'during' else 0)")
    rewrite._TERMINATION.run([sys.executable, "-c", child, pid_file, where], folder, dict(os.environ))
    os.kill(os.getpid(), signal.SIGTERM)  # "after": reading the child's result
    time.sleep(60)
"""


@pytest.mark.parametrize("where", ["before", "during", "after"])
def test_a_kill_around_the_fresh_process_check_ends_the_child_and_removes_its_inputs(tmp_path, where):
    # The check's child ran on, and its folder of (maybe large) inputs stayed,
    # also when the kill came while the inputs were written or the result read.
    import signal

    # cwd outside the checkout: its unbuilt source tree would shadow the installed package.
    proc = subprocess.run([sys.executable, "-c", _KILLED_AROUND_A_FRESH_PROCESS, where, str(tmp_path / "folder"),
                           str(tmp_path / "pid")],
                          cwd=tmp_path, env=fresh_process_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-2000:]
    folder = (tmp_path / "folder").read_text()
    assert folder and not os.path.exists(folder)
    if where != "before":
        assert not os.path.exists(f"/proc/{(tmp_path / 'pid').read_text()}"), "the child still runs"


def test_the_fresh_process_check_and_the_optimizer_keep_their_temporary_folders_where_a_kill_finds_them(monkeypatch):
    # Their TemporaryDirectory was registered only while the child ran.
    seen, folders = [], []

    def child(args, folder, env):
        seen.append(folder in rewrite._TERMINATION.folders and os.path.exists(os.path.join(folder, "request.pkl")))
        folders.append(folder)
        return subprocess.CompletedProcess(args, 1, "", "")

    monkeypatch.setattr(rewrite._TERMINATION, "check", child)
    assert "status 1" in rewrite._serve_in_fresh_process("unused", {"serving_default": {}})["load_error"]
    real_driver = rewrite._run_offline_driver

    def driver(graph_def, fetches, config):
        report = [p.s.decode() for name, p in config.parameter_map.items() if name == "report_file"]
        seen.append(len(report) == 1 and os.path.dirname(report[0]) in rewrite._TERMINATION.folders)
        folders.append(os.path.dirname(report[0]))
        return real_driver(graph_def, fetches, config)

    monkeypatch.setattr(rewrite, "_run_offline_driver", driver)
    rewrite.optimize_graph_def(tf.Graph().as_graph_def(), [])
    assert seen == [True, True]
    assert not any(os.path.exists(f) or f in rewrite._TERMINATION.folders for f in folders)


def test_a_signal_ignored_from_the_start_stays_ignored_by_the_command():
    # A shell's background job starts with SIGINT ignored; the command caught it.
    import signal

    from tf_ctr_ops.__main__ import _exiting_on_signals

    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with _exiting_on_signals(rewrite.exit_on_signal):
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is rewrite.exit_on_signal
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is not rewrite.exit_on_signal
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_report_on_a_pipe_is_checked_without_opening_it(tmp_path):
    # Opening a FIFO with no reader blocked the command forever, and with one
    # ended the reader's input; /dev/fd/N of a pipe resolved to a path that
    # cannot be opened and was refused.
    import threading

    from tf_ctr_ops import _errors

    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    read, write = os.pipe()
    results = []
    checker = threading.Thread(target=lambda: results.extend(
        [_errors.unwritable(str(fifo)), _errors.unwritable(f"/dev/fd/{write}")]), daemon=True)
    checker.start()
    checker.join(timeout=30)
    os.close(read)
    os.close(write)
    assert results == ["", ""], "the check blocked on the FIFO" if not results else results


def test_a_report_on_a_socket_is_refused_before_the_rewrite(tmp_path):
    # Only pipes and terminals are checked without opening: a socket passed,
    # and the report failed after DST was written.
    import socket

    from tf_ctr_ops import _errors

    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tmp_path / "r.sock"))
        assert "cannot be written" in _errors.unwritable(str(tmp_path / "r.sock"))


def test_a_fresh_process_check_past_its_time_limit_is_a_one_line_error(tmp_path, monkeypatch):
    save_split_safe_lookup_model(str(tmp_path / "src"))
    monkeypatch.setattr(rewrite, "_FRESH_PROCESS_TIMEOUT_S", 0.01)
    cli = run_cli(["src", "dst"], tmp_path)
    assert cli.returncode == 1, cli.stderr
    assert cli.stderr.strip() == ("tf-ctr-ops optimize: error: a model's check in a fresh process ran past 0.01 s; "
                                  "DST is left as it was"), cli.stderr
    assert not (tmp_path / "dst").exists() and not list(tmp_path.glob(".ctr-*"))


def test_a_time_out_while_dropping_patterns_leaves_no_temporary_model(tmp_path, monkeypatch):
    # The best model so far (as big as the model) stayed beside DST.
    def build(folder, disabled):  # fuses p1 and p2 unless disabled
        (tmp_path / folder / "saved_model.pb").write_text("x")
        return {"serving_default": types.SimpleNamespace(
            matches=[{"pattern": p} for p in ("p1", "p2") if p not in disabled])}, 0.0, []

    checks = iter([("differs", {}), (None, {})])  # all fused: fails; none: passes; then a time-out

    def check(folder, inputs, reference, endpoints):
        for outcome in checks:
            return outcome
        raise subprocess.TimeoutExpired(["python"], 900)

    monkeypatch.setattr(rewrite, "_fresh_process_failure", check)
    with pytest.raises(subprocess.TimeoutExpired):
        rewrite._servable_rewrite(build, str(tmp_path), {}, {}, set(), "src")
    assert not list(tmp_path.glob(".ctr-*"))


@pytest.mark.parametrize("original_fails_in_run", [None, 1, 3])
def test_an_original_whose_outputs_vary_between_runs_is_named_not_the_rewrite(tmp_path, monkeypatch,
                                                                              original_fails_in_run):
    """With nothing fused the rewrite still differs: the original is run a
    few more times, and one run that differs names the original (an original
    whose reads and writes of a variable are unordered passed one run, and
    the error blamed the rewrite)."""
    def build(folder, disabled):
        (tmp_path / folder / "saved_model.pb").write_text("x")
        return {"serving_default": types.SimpleNamespace(
            matches=[{"pattern": "p1"}] if "p1" not in disabled else [])}, 0.0, []

    original_runs = []

    def check(folder, inputs, reference, endpoints=None):
        if folder != "src":
            return "gives other outputs", {}
        original_runs.append(folder)
        return ("gives other outputs" if len(original_runs) == original_fails_in_run else None), {}

    monkeypatch.setattr(rewrite, "_fresh_process_failure", check)
    with pytest.raises(rewrite.RewriteError) as e:
        rewrite._servable_rewrite(build, str(tmp_path), {}, {}, set(), "src")
    if original_fails_in_run is None:
        assert len(original_runs) == 3 and "while the original gave the same outputs in 3 more runs" in str(e.value)
    else:
        assert len(original_runs) == original_fails_in_run
        assert str(e.value).startswith("the original model itself gives other outputs when loaded again")
    assert not list(tmp_path.glob(".ctr-*"))


def test_a_dst_that_is_a_file_is_refused_before_the_rewrite(tmp_path, monkeypatch):
    save_split_safe_lookup_model(str(tmp_path / "src"))
    (tmp_path / "dst").write_text("mine")
    monkeypatch.setattr(rewrite, "_servable_rewrite", lambda *a: pytest.fail("rewritten before the check"))
    with pytest.raises(ValueError, match="dst .*dst exists and is not a folder"):
        rewrite.optimize_saved_model(tmp_path / "src", tmp_path / "dst")
    assert (tmp_path / "dst").read_text() == "mine"


def test_a_dst_through_a_missing_folder_is_written_where_the_checks_read_it(tmp_path, monkeypatch):
    # "nosuch/../dst": the checks read tmp/dst, the final rename walked
    # through nosuch and failed once the rewrite had run, leaving its
    # .ctr-rewrite-* folder (the whole model) beside dst.
    save_split_safe_lookup_model(str(tmp_path / "src"))
    monkeypatch.chdir(tmp_path)
    rewrite.optimize_saved_model("src", os.path.join("nosuch", "..", "dst"), runs=0)
    assert (tmp_path / "dst" / "saved_model.pb").exists() and not (tmp_path / "nosuch").exists()
    assert not list(tmp_path.glob(".ctr-*"))


def test_the_current_folder_as_dst_is_refused_before_the_rewrite(tmp_path, monkeypatch):
    save_split_safe_lookup_model(str(tmp_path / "src"))
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    monkeypatch.setattr(rewrite, "_servable_rewrite", lambda *a: pytest.fail("rewritten before the check"))
    for dst in (".", ""):
        with pytest.raises(ValueError, match="dst must not be the current folder"):
            rewrite.optimize_saved_model("../src", dst)


@pytest.mark.parametrize("step", ["move_aside", "move_in"])
def test_a_rename_that_fails_puts_dst_back_and_leaves_no_temporary_folder(tmp_path, monkeypatch, step):
    # Another rewrite to the same dst at once: the renames failed with an
    # OSError, leaving .ctr-rewrite-* (and .ctr-replaced-*, the old model).
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "saved_model.pb").write_text("old")
    (tmp_path / ".ctr-rewrite-x").mkdir()
    real_rename = os.rename

    def rename(a, b):
        if os.path.basename(a) == {"move_aside": "dst", "move_in": ".ctr-rewrite-x"}[step]:
            raise OSError(39, "Directory not empty")
        real_rename(a, b)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(rewrite.RewriteError, match=r"could not be put in place \(Directory not empty\)"):
        rewrite._move_into_place(str(tmp_path / ".ctr-rewrite-x"), str(tmp_path / "dst"))
    assert (tmp_path / "dst" / "saved_model.pb").read_text() == "old"
    assert not list(tmp_path.glob(".ctr-*"))


def test_a_killed_optimize_removes_its_temporary_model(tmp_path):
    # SIGTERM left the rewrite's .ctr-rewrite-* folder beside DST, as big as
    # the model; Ctrl-C removed it.
    import signal
    import time

    save_split_safe_lookup_model(str(tmp_path / "src"))
    proc = subprocess.Popen([sys.executable, "-m", "tf_ctr_ops", "optimize", "src", "dst"], cwd=tmp_path,
                            env=fresh_process_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".ctr-rewrite-*")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(tmp_path.glob(".ctr-rewrite-*")), "the rewrite made no temporary model"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.strip().endswith("stopped by signal 15; DST is left as it was"), err
    assert not list(tmp_path.glob(".ctr-*")) and not (tmp_path / "dst").exists()


def test_an_inputs_file_serves_a_rewrite_of_some_signatures(tmp_path):
    # Arrays named for a signature left out by --signature were "arrays that
    # no signature takes": one file could not serve a subset.
    src, dst = tmp_path / "src", tmp_path / "dst"
    model = _StatefulModel()
    tf.saved_model.save(model, str(src), signatures={"serving_default": model.predict, "count": model.count})
    np.savez(tmp_path / "inputs.npz", **{"serving_default/x": np.array([b"a|b", b""]),
                                         "count/y": np.array([1.0], np.float32)})
    cli = run_cli(["src", "dst", "--signature", "serving_default", "--inputs", "inputs.npz"], tmp_path)
    assert cli.returncode == 0, cli.stderr
    np.savez(tmp_path / "typo.npz", **{"serving_default/x": np.array([b"a"]), "cuont/y": np.array([1.0])})
    cli = run_cli(["src", "dst2", "--signature", "serving_default", "--inputs", "typo.npz"], tmp_path)
    assert cli.returncode == 1 and "cuont/y" in cli.stderr


def _export_keras_string_lookup_model(path, input_name="k"):
    import keras

    keys = keras.Input((), dtype="string", name=input_name)
    ids = keras.layers.StringLookup(vocabulary=["a", "b", "c", "d"], num_oov_indices=0)(keys)
    keras.Model(keys, keras.layers.Embedding(4, 3)(ids)).export(str(path))


@pytest.mark.parametrize("serving_device", [None, "cpu"])
def test_rewritten_signatures_keep_their_outputs_static_shapes(tmp_path, serving_device):
    """A Dense after a TFSMLayer of the rewritten model needs the output's
    width, which shape inference on the optimized graph does not always know."""
    _export_keras_string_lookup_model(tmp_path / "src")
    rewrite.optimize_saved_model(str(tmp_path / "src"), str(tmp_path / "dst"), serving_device=serving_device)
    spec = lambda d: tf.saved_model.load(str(tmp_path / d)).signatures["serving_default"].structured_outputs  # noqa
    assert spec("dst")["output_0"].shape.as_list() == spec("src")["output_0"].shape.as_list() == [None, 3]
    keys = {"k": np.array([b"b", b"d", b"a"])}
    np.testing.assert_array_equal(serve_in_fresh_process(tmp_path / "dst", "serving_default", keys, tmp_path)["output_0"],
                                  outputs_of(tmp_path / "src", keys)["output_0"])


@pytest.mark.parametrize("name", ["user-key.v1", "UserHistory", "Class"])
def test_input_keys_are_kept(tmp_path, name):
    """TF Serving, saved_model_cli and C++ loaders feed the SignatureDef's
    keys. A loaded signature holds a key that is no identifier in its spec's
    name, and one with capitals in its argument key (the spec's name is
    lower-cased: "UserHistory" came out "userhistory", and "Class" the
    keyword "class", which TF refused)."""
    _export_keras_string_lookup_model(tmp_path / "src", input_name=name)
    rewrite.optimize_saved_model(str(tmp_path / "src"), str(tmp_path / "dst"), serving_device="cpu")

    def input_keys(folder):
        proto = _saved_model_files.read(str(folder))
        return sorted(proto.meta_graphs[0].signature_def["serving_default"].inputs)

    assert input_keys(tmp_path / "dst") == input_keys(tmp_path / "src") == [name]
    argument = next(iter(tf.saved_model.load(str(tmp_path / "src")).signatures["serving_default"]
                         .structured_input_signature[1]))
    keys = {argument: np.array([b"c", b"a"])}
    np.testing.assert_array_equal(serve_in_fresh_process(tmp_path / "dst", "serving_default", keys, tmp_path)["output_0"],
                                  outputs_of(tmp_path / "src", keys)["output_0"])


def test_an_offline_rewrite_under_enable_compares_with_the_original_graph(tmp_path):
    """Under enable(), the original's reference outputs (and the input
    search) ran fused graphs: a fused op was compared with itself."""
    _export_keras_string_lookup_model(tmp_path / "src")

    def fused_in_this_process(dst, online):
        before = rewrite.fusion_stats()
        with contextlib.ExitStack() as stack:
            if online:
                stack.enter_context(rewrite.enable(serving_device="cpu"))
            rewrite.optimize_saved_model(str(tmp_path / "src"), str(tmp_path / dst), serving_device="cpu", runs=1)
        after = rewrite.fusion_stats()
        return after["rewrites"] - before["rewrites"]

    assert fused_in_this_process("plain", online=False) == fused_in_this_process("under_enable", online=True)
    keys = {"k": np.array([b"b", b"d", b"a"])}
    np.testing.assert_array_equal(
        serve_in_fresh_process(tmp_path / "under_enable", "serving_default", keys, tmp_path)["output_0"],
        outputs_of(tmp_path / "src", keys)["output_0"])


def test_a_function_xla_compiles_keeps_its_ops_and_costs_no_pattern_elsewhere(tmp_path):
    """A tf.function(jit_compile=True) the signature calls was fused, failed
    to compile (the fused ops have no XLA kernels), and the fallback dropped
    its pattern from the whole model."""
    table = tf.Variable(np.arange(240, dtype=np.float32).reshape(60, 4))
    compiled = tf.function(lambda ids: tf.reduce_sum(tf.gather(table, ids), axis=1), jit_compile=True)
    module = tf.Module()
    module.table = table
    module.serve = tf.function(
        lambda ids: {"xla": compiled(ids), "plain": tf.reduce_sum(tf.nn.embedding_lookup(table, ids), axis=1)},
        input_signature=[tf.TensorSpec([None, 3], tf.int64, name="ids")])
    tf.saved_model.save(module, str(tmp_path / "src"), signatures={"serving_default": module.serve})
    report = rewrite.optimize_saved_model(str(tmp_path / "src"), str(tmp_path / "dst"), runs=1)
    sig = report.signatures["serving_default"]
    assert sig.outputs_match
    assert [m["pattern"] for m in sig.matches] == ["dense_reduce_lookup"], sig.matches
    assert not [s for s in sig.skips if s["reason"].startswith("dropped")], sig.skips
    # ... and the report says why it was left alone (it said nothing).
    xla = [s for s in sig.skips if "compiled by XLA (jit_compile=True)" in s["reason"]]
    assert len(xla) == 1 and xla[0]["op"] in ("GatherV2", "ResourceGather"), sig.skips
    ids = {"ids": np.array([[1, 2, 59], [0, 0, 7]], np.int64)}
    got = serve_in_fresh_process(tmp_path / "dst", "serving_default", ids, tmp_path)
    want = outputs_of(tmp_path / "src", ids)
    for key in ("xla", "plain"):
        np.testing.assert_array_equal(got[key], want[key])


def test_lookups_no_pattern_takes_are_reported_with_their_reason(tmp_path):
    """Each of these printed "0 fused, 0 left alone": a pooling of gathered
    rows of a form no pattern takes, and the legacy string hash, were left
    without a word, though the docs promise each its reason."""
    table = tf.Variable(np.arange(200, dtype=np.float32).reshape(50, 4) / 100)
    module = tf.Module()
    module.table = table
    ragged = tf.RaggedTensorSpec([None, None], tf.int64, 1)
    dense = tf.TensorSpec([None, 3], tf.int64, name="ids")
    module.ragged_max = tf.function(lambda r: {"y": tf.reduce_max(tf.gather(table, r), axis=1)},
                                    input_signature=[ragged])
    module.dense_max = tf.function(lambda ids: {"y": tf.reduce_max(tf.gather(table, ids), axis=1)},
                                   input_signature=[dense])
    module.clipped = tf.function(
        lambda ids: {"y": tf.reduce_sum(tf.nn.embedding_lookup(table, ids, max_norm=1.0), axis=1)},
        input_signature=[dense])
    module.legacy_hash = tf.function(lambda s: {"y": tf.gather(table, tf.strings.to_hash_bucket(s, 50))},
                                     input_signature=[tf.TensorSpec([None], tf.string, name="s")])
    signatures = {k: getattr(module, k) for k in ("ragged_max", "dense_max", "clipped", "legacy_hash")}
    tf.saved_model.save(module, str(tmp_path / "src"), signatures=signatures)
    report = rewrite.optimize_saved_model(str(tmp_path / "src"), str(tmp_path / "dst"), runs=1)
    expected = {"ragged_max": ("UnsortedSegmentMax", "stays TF's (a pooling of gathered rows"),
                "dense_max": ("Max", "stays TF's (a pooling of gathered rows"),
                "clipped": ("Sum", "stays TF's (a pooling of gathered rows"),
                "legacy_hash": ("StringToHashBucket", "the legacy string hash")}
    for key, (op, reason) in expected.items():
        sig = report.signatures[key]
        assert sig.outputs_match and not sig.matches, (key, sig.matches)
        assert [s for s in sig.skips if s.get("op") == op and reason in s["reason"]], (key, sig.skips)


def test_a_tf_idf_encoding_says_what_keeps_it_from_its_dense(tmp_path):
    # Its reason said it fuses into the Dense it feeds on a CPU server, which
    # it did feed there: the idf Mul between them was what kept it apart.
    import keras

    keys = keras.Input(shape=(3,), dtype="string", name="k")
    lookup = keras.layers.StringLookup(vocabulary=["a", "b", "c"], idf_weights=[1.0, 2.0, 3.0], output_mode="tf_idf")
    keras.Model(keys, keras.layers.Dense(2)(lookup(keys))).export(str(tmp_path / "src"), verbose=False)
    report = rewrite.optimize_saved_model(str(tmp_path / "src"), str(tmp_path / "dst"), runs=1,
                                          serving_device="cpu")
    sig = report.signatures["serving_default"]
    assert sig.outputs_match
    assert [s for s in sig.skips if s.get("op") == "DenseBincount" and "(tf_idf's idf weights)" in s["reason"]], \
        sig.skips


def test_synthesized_inputs_whose_outputs_are_all_empty_compare_nothing(tmp_path):
    """Outputs that a mask empties on every synthesized input: nothing was
    compared, so the CLI must not report a match."""
    table = tf.Variable(np.arange(40, dtype=np.float32).reshape(10, 4))
    module = tf.Module()
    module.table = table
    module.hits = tf.function(
        lambda ids: {"y": tf.boolean_mask(tf.reduce_mean(tf.nn.embedding_lookup(table, ids), 1),
                                          tf.reduce_sum(tf.cast(ids, tf.float32), 1) > 1e9)},
        input_signature=[tf.TensorSpec([None, 3], tf.int64, name="ids")])
    tf.saved_model.save(module, str(tmp_path / "src"), signatures={"hits": module.hits})
    cli = run_cli(["src", "dst", "--serving-device", "cpu"], tmp_path)
    assert cli.returncode == 1 and "all empty, so nothing can be compared" in cli.stderr, cli.stdout + cli.stderr
    assert not (tmp_path / "dst").exists()


def test_a_signature_without_outputs_does_not_stop_the_rewrite(tmp_path):
    """A hook signature returns nothing: there is nothing of its own to
    compare, which must not refuse the model's other signatures."""
    module = tf.Module()
    module.table = tf.Variable(np.arange(40, dtype=np.float32).reshape(10, 4))
    module.counter = tf.Variable(0)
    module.pooled = tf.function(lambda ids: {"y": tf.reduce_sum(tf.nn.embedding_lookup(module.table, ids), 1)},
                                input_signature=[tf.TensorSpec([None, 3], tf.int64, name="ids")])

    @tf.function(input_signature=[])
    def bump():
        module.counter.assign_add(1)
        return {}

    module.bump = bump
    tf.saved_model.save(module, str(tmp_path / "src"), signatures={"pooled": module.pooled, "bump": bump})
    report = rewrite.optimize_saved_model(str(tmp_path / "src"), str(tmp_path / "dst"), serving_device="cpu")
    assert report.ok and report.signatures["pooled"].outputs_match
    ids = {"ids": np.array([[1, 2, 3], [9, 0, 0]], np.int64)}
    np.testing.assert_allclose(serve_in_fresh_process(tmp_path / "dst", "pooled", ids, tmp_path)["y"],
                               module.pooled(tf.constant(ids["ids"]))["y"].numpy())


def test_a_signature_of_no_outputs_keeps_its_effect(tmp_path):
    """A hook that only updates state: the rebuilt function, pruned to its
    outputs, dropped the update, and the signature that reads it disagreed."""
    module = tf.Module()
    module.count = tf.Variable(0.0)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
    def record(x):
        module.count.assign_add(tf.reduce_sum(x))
        return {}

    @tf.function(input_signature=[])
    def read():
        return {"count": tf.reshape(module.count, [1])}

    module.record, module.read = record, read
    tf.saved_model.save(module, str(tmp_path / "src"), signatures={"record": record, "read": read})
    report = rewrite.optimize_saved_model(str(tmp_path / "src"), str(tmp_path / "dst"), serving_device="cpu")
    assert report.ok
    script = ("import sys, tensorflow as tf, tf_ctr_ops\n"
              "m = tf.saved_model.load(sys.argv[1])\n"
              "m.signatures['record'](x=tf.constant([5.0, 2.0]))\n"
              "print('count', float(m.signatures['read']()['count'][0]))\n")
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "dst")], cwd=tmp_path, env=fresh_process_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "count 7.0" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.saved_model
def test_a_fused_identity_column_is_not_reported_left_by_the_split_pattern(tmp_path):
    # safe_lookup fuses an embedding_column of an identity column; the string
    # split pattern then saw that fused lookup (its row count explicit) and
    # reported it "left", though no string split exists in the model.
    fc = tf.compat.v1.feature_column
    src = str(tmp_path / "src")

    def outputs_of(serialized):
        columns = [fc.embedding_column(fc.categorical_column_with_identity("idd", 10, default_value=0), 4)]
        features = tf.compat.v1.io.parse_example(serialized, fc.make_parse_example_spec(columns))
        return {"net": fc.input_layer(features, columns)}

    save_tf1_examples_model(src, outputs_of)
    report = rewrite.optimize_saved_model(src, str(tmp_path / "dst"))
    assert report.ok and report.verified
    sig = report.signatures["serving_default"]
    assert "safe_lookup" in {m["pattern"] for m in sig.matches}, sig.matches
    assert not [s for s in sig.skips if s["pattern"] == "string_split_lookup"], sig.skips


def test_a_ragged_tensors_row_lengths_are_not_reported_as_an_encoding():
    # RaggedTensor.from_value_rowids counts its row lengths with a
    # DenseBincount whose cumsum is its row_splits: no feature encoding, so no
    # "stays TF's" line; a real count encoding beside it keeps its line.
    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64), tf.TensorSpec([None], tf.int64),
                                  tf.TensorSpec([None, 3], tf.int64)])
    def model(values, rowids, ids):
        ragged = tf.RaggedTensor.from_value_rowids(values, rowids)
        counts = tf.math.bincount(ids, minlength=5, maxlength=5, axis=-1)
        return tf.reduce_sum(ragged, axis=1), counts

    graph = model.get_concrete_function().graph.as_graph_def()
    bincounts = [n.name for n in graph.node if n.op == "DenseBincount"]
    assert len(bincounts) == 2, bincounts
    records = rewrite._unfused_feature_records(graph)
    reported = [r["node"] for r in records if r["op"] == "DenseBincount"]
    assert len(reported) == 1 and "RowPartition" not in reported[0], (reported, bincounts)


def test_a_multi_hot_lookup_of_split_strings_reports_its_ragged_encoding_alone():
    # The split's row lengths (a DenseBincount that its RaggedShape casts as
    # well as the Cumsum of its row_splits reads) were listed as an
    # encoding, and the real one, a RaggedBincount, did not say why it stays.
    import keras

    lookup = keras.layers.StringLookup(vocabulary=["a", "b", "c"], output_mode="multi_hot")

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def model(text):
        return lookup(tf.strings.split(text, " "))

    records = rewrite._unfused_feature_records(model.get_concrete_function().graph.as_graph_def())
    encodings = [r for r in records if "Bincount" in r["op"]]
    assert [r["op"] for r in encodings] == ["RaggedBincount"], records
    assert "ragged rows" in encodings[0]["reason"], encodings


def test_lookups_with_several_oov_slots_say_why_their_find_stays():
    # StringLookup(num_oov_indices=2) hashes a missing key into its OOV slots
    # by SelectV2(Equal(found, -1), hash(keys) + offset, found): the find and
    # the hash get lines that say so, a one-slot lookup's find the plain line.
    import keras

    several = keras.layers.StringLookup(vocabulary=["a", "b"], num_oov_indices=2)
    one = keras.layers.StringLookup(vocabulary=["a", "b"])

    @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.string)])
    def model(keys):
        return several(keys), one(keys)

    records = rewrite._unfused_feature_records(model.get_concrete_function().graph.as_graph_def())
    by_op = {}
    for r in records:
        by_op.setdefault(r["op"], []).append(r["reason"])
    finds = sorted(by_op["LookupTableFindV2"], key=len)
    assert len(finds) == 2 and "out-of-vocabulary slots" not in finds[0], finds
    assert "several out-of-vocabulary slots (num_oov_indices > 1)" in finds[1], finds
    assert by_op["StringToHashBucketFast"] == [
        "StringToHashBucketFast stays TF's (a string hash that no fused lookup absorbed, the out-of-vocabulary slot "
        "of a lookup with num_oov_indices > 1)"], by_op

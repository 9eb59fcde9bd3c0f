"""The offline driver (cc/grappler/offline_rewrite.cc) against the path it
replaces: Grappler's meta optimizer running CtrFusionOptimizer alone over a
MetaGraphDef whose "train_op" collection names the fetches.

Both must fuse the same subgraphs into the same ops, in the graph and in the
functions it calls, and the driver's graph must compute what the native one
computes.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow.python.framework import meta_graph

import tf_ctr_ops  # noqa: F401  (registers the ops and the optimizer)
from tf_ctr_ops import rewrite

V, D = 50, 4


def _feature_model():
    """A Keras-style model: hashed single keys, a split id list, a sum of both,
    called through an inner tf.function (so part of it lives in the library)."""
    table_a = tf.Variable(tf.random.stateless_normal([V, D], seed=[1, 2]))
    table_b = tf.Variable(tf.random.stateless_normal([V, D], seed=[3, 4]))

    @tf.function
    def id_list(ids):
        sp = tf.strings.split(ids, "|").to_sparse()
        hashed = tf.sparse.SparseTensor(sp.indices, tf.strings.to_hash_bucket_fast(sp.values, V), sp.dense_shape)
        return tf.nn.safe_embedding_lookup_sparse(table_b, hashed, combiner="mean")

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.string)])
    def serve(keys, ids):
        a = tf.gather(table_a, tf.strings.to_hash_bucket_fast(keys, V))
        return tf.concat([a, id_list(ids)], axis=1)

    return serve, (table_a, table_b)


def _meta_path(graph_def, fetches, handle_shapes):
    """The meta-optimizer path, as optimize_graph_def ran it before the driver."""
    graph_def = type(graph_def).FromString(graph_def.SerializeToString())
    rewrite._annotate_handle_shapes(graph_def, handle_shapes)
    rewrite._annotate_called_handle_shapes(graph_def)
    meta = meta_graph_pb2.MetaGraphDef()
    meta.graph_def.CopyFrom(graph_def)
    meta.collection_def["train_op"].node_list.value.extend(fetches)
    return rewrite.optimize_meta_graph(meta, serving_device="cpu")


def _fused(report):
    return collections.Counter((m["pattern"], m["fused_op"]) for m in report["match"])


def test_driver_fuses_what_the_meta_optimizer_fuses():
    serve, _ = _feature_model()
    concrete = serve.get_concrete_function()
    graph_def = concrete.graph.as_graph_def(add_shapes=True)
    fetches = [t.name for t in concrete.outputs]
    shapes = rewrite.captured_handle_shapes(concrete)

    driver_graph, driver_report = rewrite.optimize_graph_def(graph_def, fetches, shapes, serving_device="cpu")
    meta_graph, meta_report = _meta_path(graph_def, fetches, shapes)

    assert _fused(driver_report), "nothing fused: the comparison would prove nothing"
    assert _fused(driver_report) == _fused(meta_report)
    fused_ops = {op for op, n in rewrite.op_counts(driver_graph, library=True).items() if op.startswith("Ctr") and n}
    assert fused_ops == {op for op, n in rewrite.op_counts(meta_graph, library=True).items()
                         if op.startswith("Ctr") and n}
    # The driver leaves no Grappler item state behind: no recorded shape it
    # copied for the optimizer, in the graph or the library.
    nodes = list(driver_graph.node) + [n for f in driver_graph.library.function for n in f.node_def]
    assert not [n.name for n in nodes if "_ctr_output_shapes" in n.attr]


def test_driver_graph_computes_the_native_result(tmp_path):
    serve, tables = _feature_model()
    module = tf.Module()
    module.tables = tables
    tf.saved_model.save(module, str(tmp_path), signatures={"serving_default": serve})
    loaded = tf.saved_model.load(str(tmp_path))  # owns the variables the signature reads
    signature = loaded.signatures["serving_default"]
    keys = tf.constant(["a", "bb", "", "zz", "q"])
    ids = tf.constant(["1|2", "", "7", "x|y|z", "3||4"])
    want = serve(keys, ids).numpy()
    optimized, report = rewrite.optimize_concrete_function(signature, serving_device="cpu")
    assert {m["fused_op"] for m in report["match"]} >= {"CtrStringEmbedding"}
    got = rewrite._rebuild_function(signature, optimized, "served_by_driver")(keys=keys, ids=ids)
    np.testing.assert_allclose(np.asarray(tf.nest.flatten(got)[0]), want, rtol=1e-6, atol=1e-6)


def _library_model():
    """Functions with what the body conversion must carry: list and
    multi-output ops read past their first output, a call of another
    function, a stateful op (a control output), several outputs."""
    table = tf.Variable(tf.random.stateless_normal([V, D], seed=[5, 6]))
    calls = tf.Variable(0, dtype=tf.int64)

    @tf.function
    def inner(ids, pairs):
        calls.assign_add(1)
        _, second = tf.split(pairs, 2, axis=1)
        unique_ids, positions = tf.unique(ids)
        sp = tf.strings.split(ids, "|").to_sparse()
        hashed = tf.sparse.SparseTensor(sp.indices, tf.strings.to_hash_bucket_fast(sp.values, V), sp.dense_shape)
        pooled = tf.nn.safe_embedding_lookup_sparse(table, hashed, combiner="sum")
        return pooled, second, tf.size(unique_ids) + tf.reduce_sum(positions)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string), tf.TensorSpec([None, 2], tf.string)])
    def serve(ids, pairs):
        pooled, second, count = inner(ids, pairs)
        keys = tf.gather(table, tf.strings.to_hash_bucket_fast(tf.squeeze(second, 1), V))
        return pooled + keys, count

    return serve, (table, calls)


def _without_handle_data(signature):
    signature = type(signature).FromString(signature.SerializeToString())
    for arg in list(signature.input_arg) + list(signature.output_arg):
        arg.ClearField("handle_data")
    return signature


def _strip_default_attrs(graph_def):
    """The graph as SavedModels store it: attrs at their default left out."""
    meta = meta_graph_pb2.MetaGraphDef()
    meta.graph_def.CopyFrom(graph_def)
    meta_graph.strip_graph_default_valued_attrs(meta)
    return meta.graph_def


@pytest.mark.parametrize("model, stripped", [(_library_model, False), (_feature_model, False), (_library_model, True)],
                         ids=["library", "features", "library-stripped-defaults"])
def test_function_bodies_convert_as_grapplers_own_conversion(model, stripped, monkeypatch):
    """The driver's FunctionDef <-> item conversion (cc/grappler/function_item)
    against Grappler's MakeGrapplerFunctionItem / MakeFunctionDef: the same
    optimized bodies, outputs and control outputs. Grappler's rebuilds the
    signature and drops the resource arguments' handle data; the driver keeps
    the signature, which is how the two runs are told apart."""
    serve, variables = model()  # noqa: F841  (the function reads them)
    concrete = serve.get_concrete_function()
    graph_def = concrete.graph.as_graph_def(add_shapes=True)
    if stripped:
        graph_def = _strip_default_attrs(graph_def)
    fetches = [t.name for t in concrete.outputs]
    shapes = rewrite.captured_handle_shapes(concrete)

    def optimized(grappler_items):
        monkeypatch.setenv("TF_CTR_OPS_GRAPPLER_FUNCTION_ITEMS", grappler_items)
        graph, report = rewrite.optimize_graph_def(graph_def, fetches, shapes, serving_device="cpu")
        return {f.signature.name: f for f in graph.library.function}, report

    ours, our_report = optimized("0")
    grapplers, grappler_report = optimized("1")
    assert _fused(our_report) and _fused(our_report) == _fused(grappler_report)
    assert ours.keys() == grapplers.keys()
    original = {f.signature.name: f for f in graph_def.library.function}
    kept_handle_data = 0
    for name, f in ours.items():
        g = grapplers[name]
        assert {n.name: n for n in f.node_def} == {n.name: n for n in g.node_def}, name
        assert dict(f.ret) == dict(g.ret) and dict(f.control_ret) == dict(g.control_ret), name
        assert _without_handle_data(f.signature) == _without_handle_data(g.signature), name
        assert f.signature == original[name].signature, name
        kept_handle_data += sum(len(a.handle_data) > 0 for a in f.signature.input_arg)
        assert not any(len(a.handle_data) for a in g.signature.input_arg)
    assert kept_handle_data, "no resource argument with handle data: the two runs cannot be told apart"
    if model is _library_model:
        assert any(f.control_ret for f in ours.values()), "the assign_add is no control output: nothing checked"


def test_driver_reports_a_bad_graph_as_an_error():
    dangling = tf.compat.v1.GraphDef()
    node = dangling.node.add()
    node.name, node.op = "x", "NoOp"
    node.input.append("y:0")
    with pytest.raises(RuntimeError, match="Non-existent input y:0 in node x"):
        rewrite.optimize_graph_def(dangling, ["x"])
    with pytest.raises(RuntimeError, match="not a serialized GraphDef"):
        rewrite._run_offline_driver(_NotAGraph(), ["x:0"], _optimizer_config())


class _NotAGraph:
    """Bytes that do not parse as a GraphDef, with the method the driver calls."""

    @staticmethod
    def SerializeToString():
        return b"\xff\xff\xff\xff"


def _optimizer_config():
    config = rewrite._add_fusion_optimizer(tf.compat.v1.ConfigProto(), only=True)
    return config.graph_options.rewrite_options.custom_optimizers[0]


@pytest.mark.parametrize("disabled, hinted", [(None, True), ((), True), (["string_keys"], False),
                                              (iter(["string_keys"]), False)],
                         ids=["None", "empty", "list", "iterator"])
def test_the_meta_path_takes_disabled_patterns_as_the_driver_does(disabled, hinted):
    # None, or an iterator read once (hunt 136: None raised a TypeError, an
    # iterator was spent before the report read it).
    table = tf.Variable(tf.random.stateless_normal([V, 4], seed=[5, 6]))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def hashed_column(serialized):  # categorical_column_with_hash_bucket's embedding
        keys = tf.io.parse_example(serialized, {"cat": tf.io.VarLenFeature(tf.string)})["cat"]
        ids = tf.SparseTensor(keys.indices, tf.strings.to_hash_bucket_fast(keys.values, V), keys.dense_shape)
        return tf.nn.safe_embedding_lookup_sparse(table, ids, None, combiner="mean")

    concrete = hashed_column.get_concrete_function()
    meta = meta_graph_pb2.MetaGraphDef()
    meta.graph_def.CopyFrom(concrete.graph.as_graph_def(add_shapes=True))
    meta.collection_def["train_op"].node_list.value.extend(t.name for t in concrete.outputs)
    _, report = rewrite.optimize_meta_graph(meta, disabled_patterns=disabled)
    reasons = [s["reason"] for s in report["skip"] if s.get("op") == "StringToHashBucketFast"]
    assert reasons and any("(pattern string_keys)" in r for r in reasons) == hinted, reasons

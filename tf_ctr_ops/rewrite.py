"""Rewriting TF-native CTR subgraphs into the fused ops with Grappler.

The rewriting itself is `CtrFusionOptimizer`, a Grappler custom optimizer
compiled into the op library and registered when `tf_ctr_ops` is imported.
This module switches it on:

- online, for the `tf.function`s of this process: `enable()` (a plain call or
  a context manager), or `session_config()` for TF1 sessions;
- offline, on graphs: `optimize_graph_def()` / `optimize_concrete_function()`.

Every rewrite preserves semantics exactly; a subgraph the fused op would not
reproduce is left alone and the reason is reported.
"""

import json
import os
import tempfile

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2, meta_graph_pb2
from tensorflow.python.eager import context
from tensorflow.python.grappler import tf_optimizer

from tf_ctr_ops._loader import load_op_library

_ops = load_op_library()

OPTIMIZER_NAME = "CtrFusionOptimizer"


def _add_fusion_optimizer(config, report_file=None, only=False):
    """Adds CtrFusionOptimizer to a ConfigProto's rewriter config (in place)."""
    rewrite = config.graph_options.rewrite_options
    if not any(c.name == OPTIMIZER_NAME for c in rewrite.custom_optimizers):
        custom = rewrite.custom_optimizers.add()
        custom.name = OPTIMIZER_NAME
        if report_file:
            custom.parameter_map["report_file"].s = os.fsencode(report_file)
    if only:
        # Run the fusion pass alone: offline rewriting should change nothing else.
        del rewrite.optimizers[:]
        rewrite.optimizers.append(OPTIMIZER_NAME)
    rewrite.min_graph_nodes = -1  # also rewrite small graphs
    return config


def session_config(config=None):
    """A `tf.compat.v1.ConfigProto` whose sessions run CtrFusionOptimizer.

    Args:
      config: an existing ConfigProto to extend (copied, not modified).

    Returns:
      A new ConfigProto for `tf.compat.v1.Session(config=...)`.
    """
    out = config_pb2.ConfigProto()
    if config is not None:
        out.CopyFrom(config)
    return _add_fusion_optimizer(out)


class _Enabled:
    """Result of `enable()`: already active; restores the previous config on exit."""

    def __init__(self, previous):
        self._previous = previous

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.disable()
        return False

    def disable(self):
        if self._previous is not None:
            context.context().function_call_options.config_proto_serialized = self._previous
            self._previous = None


def enable():
    """Runs CtrFusionOptimizer on the `tf.function`s this process calls from now on.

    Works as a plain call (`tf_ctr_ops.rewrite.enable()`) and as a context
    manager (`with tf_ctr_ops.rewrite.enable(): ...`), which restores the
    previous configuration on exit. Functions are optimized when first
    instantiated under the configuration.
    """
    options = context.context().function_call_options
    previous = config_pb2.ConfigProto.FromString(options.config_proto_serialized)
    updated = config_pb2.ConfigProto()
    updated.CopyFrom(previous)
    options.config_proto_serialized = _add_fusion_optimizer(updated)
    return _Enabled(previous)


def fusion_stats():
    """What CtrFusionOptimizer did in this process so far (counters)."""
    graphs, rewrites, skips = (int(v) for v in _ops.ctr_fusion_stats().numpy())
    return {"graphs": graphs, "rewrites": rewrites, "skips": skips}


def read_report(path):
    """The JSON-lines report the optimizer appends to: matches, skips, graphs."""
    records = {"match": [], "skip": [], "graph": []}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                rec = json.loads(line)
                records[rec.pop("kind")].append(rec)
    return records


def _annotate_handle_shapes(graph_def, handle_shapes):
    """Records the shapes of captured variables on their placeholders.

    A function graph's captured variable is a bare DT_RESOURCE placeholder; the
    optimizer needs the table's rank to prove a rewrite is exact.
    """
    for node in graph_def.node:
        shape = handle_shapes.get(node.name)
        if shape is not None and node.op == "Placeholder":
            attr = node.attr["_handle_shapes"].list
            del attr.shape[:]
            attr.shape.add().CopyFrom(tf.TensorShape(shape).as_proto())


def optimize_graph_def(graph_def, fetches, handle_shapes=None):
    """Runs CtrFusionOptimizer alone over a GraphDef.

    Args:
      graph_def: the graph (e.g. a function body from `as_graph_def()`).
      fetches: output tensor names that must survive.
      handle_shapes: {placeholder name: shape} of captured variables.

    Returns:
      `(optimized GraphDef, report dict)` with the report's "match", "skip"
      and "graph" records.
    """
    graph_def = type(graph_def).FromString(graph_def.SerializeToString())
    _annotate_handle_shapes(graph_def, handle_shapes or {})
    meta = meta_graph_pb2.MetaGraphDef()
    meta.graph_def.CopyFrom(graph_def)
    fetch = meta_graph_pb2.CollectionDef()
    fetch.node_list.value.extend(fetches)
    meta.collection_def["train_op"].CopyFrom(fetch)
    with tempfile.TemporaryDirectory() as tmp:
        report_file = os.path.join(tmp, "report.jsonl")
        config = _add_fusion_optimizer(config_pb2.ConfigProto(), report_file=report_file, only=True)
        optimized = tf_optimizer.OptimizeGraph(config, meta, graph_id=b"tf_ctr_ops")
        return optimized, read_report(report_file)


def captured_handle_shapes(concrete_function):
    """{placeholder name: shape} for the variables a concrete function captures."""
    by_handle = {id(v.handle): v for v in concrete_function.variables}
    shapes = {}
    for external, internal in concrete_function.graph.captures:
        var = by_handle.get(id(external))
        if var is not None:
            shapes[internal.op.name] = var.shape
    return shapes


def optimize_concrete_function(concrete_function):
    """Optimized GraphDef of a concrete function's body, and the report."""
    graph_def = concrete_function.graph.as_graph_def(add_shapes=True)
    fetches = [t.name for t in concrete_function.outputs]
    return optimize_graph_def(graph_def, fetches, captured_handle_shapes(concrete_function))


def op_counts(graph_def):
    counts = {}
    for node in graph_def.node:
        counts[node.op] = counts.get(node.op, 0) + 1
    return counts

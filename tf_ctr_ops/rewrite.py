"""Rewriting TF-native CTR subgraphs into the fused ops with Grappler.

The rewriting itself is `CtrFusionOptimizer`, a Grappler custom optimizer
compiled into the op library and registered when `tf_ctr_ops` is imported.
This module switches it on:

- online, for the `tf.function`s of this process: `enable()` (a plain call or
  a context manager), or `session_config()` for TF1 sessions;
- offline, on graphs: `optimize_graph_def()` / `optimize_concrete_function()`;
- offline, on a SavedModel: `optimize_saved_model()` (also `python -m
  tf_ctr_ops optimize SRC DST`), which writes a new SavedModel serving the
  same signatures and returns a `RewriteReport`.

Every rewrite preserves semantics: the same outputs, up to float rounding
where the fused op orders its arithmetic differently (a max_norm clip, a
mean's division: a few ulps); a subgraph the fused op would not reproduce is
left alone and the reason is reported.
"""

import contextlib
import dataclasses
import gc
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import config_pb2, meta_graph_pb2, rewriter_config_pb2, saved_model_pb2
from tensorflow.python.eager import context
from tensorflow.python.grappler import tf_optimizer

from tf_ctr_ops import _endpoints, _errors, _fresh_process, _loader, _model_inputs, _partitioned
from tf_ctr_ops import _saved_model_files as _files
from tf_ctr_ops._compare import max_abs_diff
from tf_ctr_ops._loader import load_op_library
from tf_ctr_ops._serve_check import output_arrays

_ops = load_op_library()

OPTIMIZER_NAME = "CtrFusionOptimizer"


SERVING_DEVICES = (None, "cpu", "gpu")


# How the patterns' skip reasons end when only a CPU server would take the fused op.
CPU_ONLY_HINT = "serving_device='cpu' for a CPU server"


def _check_serving_device(serving_device):
    if serving_device not in SERVING_DEVICES:
        raise ValueError(f"serving_device must be one of {SERVING_DEVICES}, got {serving_device!r}")


def pattern_names():
    """The names of the rewrite's patterns, as reports name them and
    `disabled_patterns` takes them: the Grappler pass's, in the order they
    run, and the offline merge of partitioned tables (named as the Grappler
    pattern that does the same online, so one name disables both)."""
    with tf.init_scope(), context.eager_mode():
        names = [n.decode() for n in _ops.ctr_fusion_patterns().numpy()]
    return names + [p for p in (_partitioned.PATTERN,) if p not in names]


def _check_disabled(disabled_patterns):
    """disabled_patterns as a tuple of names, each one of pattern_names()."""
    if isinstance(disabled_patterns, str):
        raise TypeError(f"disabled_patterns must be a list of pattern names, got the string {disabled_patterns!r}")
    names = tuple(dict.fromkeys(disabled_patterns or ()))  # each once, in the caller's order
    known = pattern_names()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown pattern(s) {unknown} in disabled_patterns; the patterns are {known}")
    return names


def _add_fusion_optimizer(config, report_file=None, only=False, serving_device=None, disabled_patterns=()):
    """Adds CtrFusionOptimizer to a ConfigProto's rewriter config (in place),
    with these options alone (an entry already there loses its others)."""
    _check_serving_device(serving_device)
    rewrite = config.graph_options.rewrite_options
    if rewrite.disable_meta_optimizer:
        raise ValueError("the config disables Grappler's meta optimizer (rewrite_options.disable_meta_optimizer), "
                         "which is what runs CtrFusionOptimizer: nothing would be rewritten")
    custom = next((c for c in rewrite.custom_optimizers if c.name == OPTIMIZER_NAME), None)
    if custom is None:
        custom = rewrite.custom_optimizers.add()
        custom.name = OPTIMIZER_NAME
    if report_file:
        # Absolute, as the OS resolves it (no lexical `..`: a link may precede it), for the cwd may change.
        path = os.path.join(os.getcwd(), os.fsdecode(report_file))
        if not os.path.isdir(os.path.dirname(path)):  # the optimizer would drop every record, unseen
            raise FileNotFoundError(f"report_file {report_file}: its folder {os.path.dirname(path)} does not exist")
        custom.parameter_map["report_file"].s = os.fsencode(path)
    elif "report_file" in custom.parameter_map:
        del custom.parameter_map["report_file"]
    if serving_device:
        custom.parameter_map["serving_device"].s = serving_device.encode()
    elif "serving_device" in custom.parameter_map:
        del custom.parameter_map["serving_device"]
    if disabled_patterns:
        custom.parameter_map["disabled_patterns"].s = ",".join(sorted(disabled_patterns)).encode()
    elif "disabled_patterns" in custom.parameter_map:
        del custom.parameter_map["disabled_patterns"]
    if only:
        # Run the fusion pass alone: offline rewriting should change nothing else.
        del rewrite.optimizers[:]
        rewrite.optimizers.append(OPTIMIZER_NAME)
        # The optimizer iterates its patterns to a fixed point itself; a second
        # meta-optimizer iteration would only repeat its skip records.
        rewrite.meta_optimizer_iterations = rewriter_config_pb2.RewriterConfig.ONE
    rewrite.min_graph_nodes = -1  # also rewrite small graphs
    return config


def session_config(config=None, report_file=None, serving_device=None, disabled_patterns=()):
    """A `tf.compat.v1.ConfigProto` whose sessions run CtrFusionOptimizer.

    Args:
      config: an existing ConfigProto to extend (copied, not modified).
      report_file: a JSON-lines file the optimizer appends its match and skip
        records to (read it with `read_report`).
      serving_device: as `optimize_saved_model`'s.
      disabled_patterns: names of patterns not to run (`pattern_names()`).

    Returns:
      A new ConfigProto for `tf.compat.v1.Session(config=...)`.
    """
    out = config_pb2.ConfigProto()
    if config is not None:
        out.CopyFrom(config)
    return _add_fusion_optimizer(out, report_file=report_file, serving_device=serving_device,
                                 disabled_patterns=_check_disabled(disabled_patterns))


class _Enabled:
    """Result of `enable()`: already active; restores the previous config on exit."""

    _threads = threading.local()  # function_call_options are per thread, so are their handles

    def __init__(self, previous, installed):
        self._previous = previous
        self._installed = installed
        self._active = _Enabled._active_in_this_thread()
        self._active.append(self)

    @staticmethod
    def _active_in_this_thread():
        """This thread's enabled handles, oldest first."""
        if not hasattr(_Enabled._threads, "handles"):
            _Enabled._threads.handles = []
        return _Enabled._threads.handles

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.disable()
        return False

    def _undone(self, config):
        """`config` without what this handle set (the fusion entry and
        min_graph_nodes), as they were before it; a min_graph_nodes a
        tf.config setter set since stays."""
        out = config_pb2.ConfigProto()
        out.CopyFrom(config)
        rewrite = out.graph_options.rewrite_options
        before, set_here = self._previous.graph_options.rewrite_options, self._installed.graph_options.rewrite_options
        _set_fusion_entries(rewrite, [c for c in before.custom_optimizers if c.name == OPTIMIZER_NAME])
        if rewrite.min_graph_nodes == set_here.min_graph_nodes:
            rewrite.min_graph_nodes = before.min_graph_nodes
        return out

    def disable(self):
        """The newest handle restores the config it replaced; an older one
        hands its own predecessor's to the handle after it, so handles may be
        disabled in any order. Only in the thread that enabled it: the config
        it restores is that thread's. Where TF rebuilt that config since (a
        tf.config setter does), the rebuilt one stays, with the fusion entry
        as it was before enable()."""
        # By the thread's own list, not its id: Python reuses the id of a
        # thread that ended for the next one.
        if self._active is not _Enabled._active_in_this_thread():
            raise RuntimeError("disable() must be called in the thread that called enable(): the rewrite was "
                               "enabled for that thread's functions only")
        if self not in self._active:
            return
        i = self._active.index(self)
        self._active.pop(i)
        if i < len(self._active):
            # The next handle's saved config, with the fusion entry this
            # handle found (a tf.config setter may have run between the two).
            self._active[i]._previous = self._undone(self._active[i]._previous)
        else:
            options = context.context().function_call_options
            current = config_pb2.ConfigProto.FromString(options.config_proto_serialized)
            options.config_proto_serialized = (self._previous if current == self._installed
                                               else self._undone(current))


def _set_fusion_entries(rewrite_options, entries):
    """`rewrite_options`' custom optimizers with their CtrFusionOptimizer
    entry replaced by `entries` (none, or one), the others kept in order."""
    others = [c for c in rewrite_options.custom_optimizers if c.name != OPTIMIZER_NAME]
    del rewrite_options.custom_optimizers[:]
    rewrite_options.custom_optimizers.extend(others + list(entries))


@contextlib.contextmanager
def _fusion_off():
    """This process's functions without CtrFusionOptimizer, whatever
    `enable()` set: the outputs a rewrite is compared with must be the
    original graph's, not a fused one's."""
    options = context.context().function_call_options
    saved = config_pb2.ConfigProto.FromString(options.config_proto_serialized)
    config = config_pb2.ConfigProto()
    config.CopyFrom(saved)
    rewrite_options = config.graph_options.rewrite_options
    if all(c.name != OPTIMIZER_NAME for c in rewrite_options.custom_optimizers):
        yield
        return
    _set_fusion_entries(rewrite_options, [])
    options.config_proto_serialized = config
    try:
        yield
    finally:
        options.config_proto_serialized = saved


def enable(report_file=None, serving_device=None, disabled_patterns=()):
    """Runs CtrFusionOptimizer on the `tf.function`s this thread calls from now on.

    Works as a plain call (`tf_ctr_ops.rewrite.enable()`) and as a context
    manager (`with tf_ctr_ops.rewrite.enable(): ...`), which restores the
    previous configuration on exit. Functions are optimized when first
    instantiated under the configuration. TensorFlow keeps this
    configuration per thread: a thread that runs functions of its own (a
    background trainer, say) calls `enable()` itself, and a handle is
    disabled in the thread that enabled it. With `report_file`, the optimizer
    appends its match and skip records there (JSON lines; `read_report`).
    `serving_device` is as `optimize_saved_model`'s ("cpu": this process
    serves on its CPU). `disabled_patterns` names patterns not to run
    (`pattern_names()`): the way to keep one kind of subgraph native while
    the others fuse. An `enable()` inside another takes only its own
    options (no report unless it names one).

    TF rebuilds this configuration when `tf.config.optimizer.set_jit`,
    `set_experimental_options`, the threading setters or the device
    placement setters run, and the rewrite is then off: call them before
    `enable()`. A handle's `disable()` keeps what they set.
    """
    options = context.context().function_call_options
    previous = config_pb2.ConfigProto.FromString(options.config_proto_serialized)
    updated = config_pb2.ConfigProto()
    updated.CopyFrom(previous)
    _add_fusion_optimizer(updated, report_file=report_file, serving_device=serving_device,
                          disabled_patterns=_check_disabled(disabled_patterns))
    options.config_proto_serialized = updated
    return _Enabled(previous, updated)


def fusion_stats():
    """What CtrFusionOptimizer did in this process so far (counters).

    Runs eagerly, also inside a `tf.Graph().as_default()` block (TF1 code).
    """
    with tf.init_scope(), context.eager_mode():
        graphs, rewrites, skips = (int(v) for v in _ops.ctr_fusion_stats().numpy())
    return {"graphs": graphs, "rewrites": rewrites, "skips": skips}


def read_report(path):
    """The JSON-lines report the optimizer appends to: matches, skips, graphs.

    Raises FileNotFoundError when there is no file at `path`: the optimizer
    writes one record per graph it runs on, so a missing report is a wrong
    path, or a report file no optimized graph has used yet (a tf.function is
    optimized when it is first called, not when it is defined).

    Each match and skip record gets the id of its graph ("graph": the
    function's name, or the id given to an offline run). A graph optimized
    twice (Grappler's passes) has one "graph" record and its identical skip
    records appear once; a skip of a node that another pattern then
    replaced is dropped: that node is not left alone. (A
    skip of a fused node stays: it says why a later pattern, grouping say,
    left the fused op as it was.)
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no rewrite report at {path}: no graph was optimized with this report file yet "
                                "(a tf.function is optimized when first called), or the path is wrong")
    return _read_records(path)


def _read_records(path):
    """read_report's records; none for a missing file (an offline run of a
    graph Grappler found too small to optimize writes none)."""
    records = {"match": [], "skip": [], "graph": []}
    seen_skips = set()
    pending = []  # a graph's records come before its "graph" record
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                rec = json.loads(line)
                kind = rec.pop("kind")
                if kind != "graph":
                    pending.append((kind, rec))
                    continue
                records["graph"].append(rec)
                for pkind, prec in pending:
                    prec["graph"] = rec.get("id")
                    if pkind == "skip":
                        key = (prec["graph"], prec.get("pattern"), prec.get("node"), prec.get("reason"))
                        if key in seen_skips:
                            continue
                        seen_skips.add(key)
                    records[pkind].append(prec)
                pending = []
    for pkind, prec in pending:  # a report cut short
        records[pkind].append(prec)
    # A graph's records may come from several passes (Grappler runs a custom
    # optimizer in each of its iterations): a skip in one may name what
    # another replaced.
    replaced = _replaced_node_names(records["match"])
    records["skip"] = [s for s in records["skip"] if (s.get("graph"), s.get("node")) not in replaced]
    records["graph"] = _one_record_per_graph(records)
    return records


def _one_record_per_graph(records):
    """The "graph" records, one per graph id, with its matches and skips
    counted from the records kept: each pass over a graph writes one, and
    the later passes of an online rewrite find nothing left to fuse."""
    graphs = {}
    for rec in records["graph"]:
        graphs.setdefault(rec.get("id"), dict(rec))
    for g in graphs.values():
        g["matches"] = sum(m.get("graph") == g.get("id") for m in records["match"])
        g["skips"] = sum(s.get("graph") == g.get("id") for s in records["skip"])
    return list(graphs.values())


def left_alone_count(skips):
    """The candidates the skip records left alone: signatures that share a
    function (model.export's "serve" and "serving_default") report its
    candidates each, as fused_subgraph_count counts its fusions once."""
    return len(_one_per_node(skips))


def _replaced_node_names(matches):
    """(graph, node) of the nodes match records replaced ("name (Op)"), but
    not those a fused node took the name of."""
    replaced = {(m.get("graph"), r.rsplit(" (", 1)[0]) for m in matches for r in m.get("replaced", ())}
    return replaced - {(m.get("graph"), m.get("fused_node")) for m in matches}


def fused_subgraph_count(matches):
    """The TF-native subgraphs the match records (in the order applied)
    fused: a later pattern that refines what an earlier one made (the safe
    lookup around a fused embedding_lookup_sparse, string keys folded into
    it, features grouped into one op) replaces or renews that node and
    fuses no new subgraph."""
    made, count = set(), 0
    for m in matches:
        graph = m.get("graph")
        replaced = {(graph, r.rsplit(" (", 1)[0]) for r in m.get("replaced", ())}
        if (graph, m["fused_node"]) not in made and not replaced & made:
            count += 1
        made.add((graph, m["fused_node"]))
    return count


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


def _annotate_called_handle_shapes(graph_def):
    """Carries `_handle_shapes` of captured variables into the functions the
    graph calls with them (a SavedModel signature's body is such a function),
    as an arg attribute of the resource argument."""
    shapes = {n.name: n.attr["_handle_shapes"] for n in graph_def.node
              if n.op == "Placeholder" and "_handle_shapes" in n.attr}
    by_name = {f.signature.name: f for f in graph_def.library.function}
    for node in graph_def.node:
        fdef = by_name.get(node.attr["f"].func.name) if "f" in node.attr else None
        if fdef is None:
            continue
        data_inputs = [i for i in node.input if not i.startswith("^")]
        for i, name in enumerate(data_inputs[:len(fdef.signature.input_arg)]):
            shape = shapes.get(name.split(":")[0])
            if shape is not None and fdef.signature.input_arg[i].type == tf.resource.as_datatype_enum:
                fdef.arg_attr[i].attr["_handle_shapes"].CopyFrom(shape)


def _keep_recorded_shapes(graph_def):
    """Copies `_output_shapes` to `_ctr_output_shapes`, which Grappler keeps.

    Grappler's item builder erases `_output_shapes`; the optimizer reads the
    copy where its own shape inference knows less than Python did.
    """
    for node in graph_def.node:
        if "_output_shapes" in node.attr:
            node.attr["_ctr_output_shapes"].CopyFrom(node.attr["_output_shapes"])


@contextlib.contextmanager
def _gc_paused():
    """Python's cycle collector off while a large graph is handled: the node
    wrappers a rewrite creates trigger full collections over everything the
    process holds (0.2 s of a 1,000-feature rewrite), and form no cycles."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def optimize_graph_def(graph_def, fetches, handle_shapes=None, serving_device=None, disabled_patterns=()):
    """Runs CtrFusionOptimizer alone over a GraphDef.

    Args:
      graph_def: the graph (e.g. a function body from `as_graph_def()`).
      fetches: output tensor names that must survive.
      handle_shapes: {placeholder name: shape} of captured variables.
      serving_device: as `optimize_saved_model`'s.
      disabled_patterns: names of patterns not to run (`pattern_names()`).

    Returns:
      `(optimized GraphDef, report dict)` with the report's "match", "skip"
      and "graph" records.
    """
    disabled_patterns = _check_disabled(disabled_patterns)
    with _gc_paused():
        return _optimize_graph_def(graph_def, fetches, handle_shapes, serving_device, disabled_patterns)


def _optimize_graph_def(graph_def, fetches, handle_shapes, serving_device, disabled_patterns):
    graph_def = type(graph_def).FromString(graph_def.SerializeToString())
    _annotate_handle_shapes(graph_def, handle_shapes or {})
    _annotate_called_handle_shapes(graph_def)
    _keep_recorded_shapes(graph_def)
    with _TERMINATION.temporary_folder() as tmp:
        report_file = os.path.join(tmp, "report.jsonl")
        config = _add_fusion_optimizer(config_pb2.ConfigProto(), report_file=report_file, only=True,
                                       serving_device=serving_device, disabled_patterns=disabled_patterns)
        optimized = _run_offline_driver(graph_def, fetches, config.graph_options.rewrite_options.custom_optimizers[0])
        report = _read_records(report_file)
    _add_unfused_feature_records(report, optimized, serving_device, disabled_patterns)
    return optimized, report


def _run_offline_driver(graph_def, fetches, optimizer_config):
    """The op library's offline driver (cc/grappler/offline_rewrite.cc): the
    optimizer over the graph and the functions it calls, as the meta optimizer
    runs it with only this pass, without the meta optimizer's own costs."""
    import ctypes

    lib = _loader.c_library()
    run = lib.TfCtrOptimizeGraphDef
    run.restype = ctypes.c_int
    run.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
                    ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_void_p)]
    lib.TfCtrFreeBuffer.argtypes = [ctypes.c_void_p]
    graph = graph_def.SerializeToString()
    config = optimizer_config.SerializeToString()
    out, size, error = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_void_p()
    rc = run(graph, len(graph), "\n".join(fetches).encode(), config, len(config), ctypes.byref(out),
             ctypes.byref(size), ctypes.byref(error))
    try:
        if rc != 0:
            message = ctypes.string_at(error.value).decode(errors="replace") if error.value else "unknown error"
            raise RuntimeError(f"CtrFusionOptimizer failed: {message}")
        return type(graph_def).FromString(ctypes.string_at(out.value, size.value))
    finally:
        lib.TfCtrFreeBuffer(out)
        lib.TfCtrFreeBuffer(error)


# Feature ops that stay TF's where no pattern took them: what a rewrite leaves
# of them is reported, so that a model with nothing fused still says what it
# holds. A pattern's own skip record, where there is one, says why.
_UNFUSED_FEATURE_OPS = {
    "LookupTableFindV2": "a table lookup: a vocabulary's (StringLookup, IntegerLookup, "
                         "categorical_column_with_vocabulary_*) or a MutableHashTable's or DenseHashTable's",
    "OneHot": "a one-hot encoding; one fuses into the Dense it feeds (alone or in a concatenation) on a CPU "
              "server, where nothing sits between them and the encodings are most of its columns",
    "DenseBincount": "a multi-hot or count encoding (CategoryEncoding, multi_hot lookups); one fuses into the "
                     "Dense it feeds on a CPU server, as a one-hot encoding does, unless its rows are ragged",
    "SparseBincount": "a multi-hot or count encoding",
    "RaggedBincount": "a multi-hot or count encoding of ragged rows (split strings, say); the fused encodings "
                      "take dense or sparse ids",
    "Bucketize": "a bucketized numeric feature",
    "SparseCross": "a crossed feature",
    "SparseCrossV2": "a crossed feature",
    "SparseCrossHashed": "a crossed feature",
    "StringToHashBucketFast": "a string hash that no fused lookup absorbed",
    "StringToHashBucketStrong": "a keyed string hash (Hashing with a salt) that no fused lookup absorbed",
    "StringToHashBucket": "tf.strings.to_hash_bucket, the legacy string hash, which no fused op computes: "
                          "to_hash_bucket_fast is the one they compute",
}


def _add_unfused_feature_records(report, graph_def, serving_device=None, disabled_patterns=()):
    """Adds to `report` a record for each feature op left in `graph_def` that
    no pattern's own skip record already explains."""
    explained = {(s.get("graph"), s.get("node")) for s in report["skip"]}
    report["skip"].extend(r for r in _unfused_feature_records(graph_def, serving_device, disabled_patterns)
                          if (r["graph"], r["node"]) not in explained)


_MAIN_GRAPH_ID = "tf_ctr_ops"  # the id the offline rewrite gives the graph itself (its functions: their names)


def _unfused_feature_records(graph_def, serving_device=None, disabled_patterns=()):
    """Skip records for the feature ops left in `graph_def` and the functions
    it calls, each under its graph's id as the optimizer's records are (two
    functions may hold nodes of one name)."""
    records = []
    functions = reachable_functions(graph_def)
    graphs = [(_MAIN_GRAPH_ID, list(graph_def.node))] + [(f.signature.name, list(f.node_def)) for f in functions]
    compiled = _compiled_by_xla(functions)
    for graph, nodes in graphs:
        if graph in compiled:
            records.extend(_xla_function_record(graph, nodes))
            continue
        forms = {**_weighted_encoding_forms(nodes), **_keras_lookup_forms(nodes)}
        if serving_device != "cpu" and "string_keys" not in disabled_patterns:
            forms.update(_hashed_into_fused_lookup_forms(nodes))
        row_lengths = _row_length_bincounts(nodes)
        for n in nodes:
            if n.op in _UNFUSED_FEATURE_OPS and n.name not in row_lengths:
                why = _UNFUSED_FEATURE_OPS[n.op] + forms.get(n.name, "")
                records.append({"pattern": "-", "node": n.name, "op": n.op, "reason": f"{n.op} stays TF's ({why})",
                                "graph": graph})
        records.extend(dict(r, graph=graph) for r in _unfused_pooling_records(nodes, disabled_patterns))
    return records


def _producer(by_name, tensor):
    """The node of `by_name` that outputs `tensor` ("node", "node:1" or a "^node" control input)."""
    return by_name.get(tensor.lstrip("^").split(":")[0])


# Reductions of gathered rows, and the ops that may stand between the
# gather and the reduction (a max_norm clip, a scaling, a cast).
_POOLING_OPS = {"Sum", "Mean", "Max", "Min", "Prod", "UnsortedSegmentSum", "UnsortedSegmentMax",
                "UnsortedSegmentMin", "UnsortedSegmentProd", "SegmentSum", "SegmentMean", "SegmentMax",
                "SegmentMin", "SegmentProd"}
_GATHER_OPS = {"GatherV2", "ResourceGather", "Gather"}
_ROW_TRANSFORMS = {"Identity", "Cast", "Mul", "RealDiv", "Maximum", "Minimum", "Select", "SelectV2"}


def _unfused_pooling_records(nodes, disabled_patterns=()):
    """Records for the poolings of gathered rows left in a graph (its
    reductions of a Gather's rows, through a few elementwise ops): the forms
    no pattern takes (a max, a segment op by hand, rows of another rank,
    rows transformed before the pooling) say so instead of nothing. The
    caller drops those a pattern's own record explains."""
    by_name = {n.name: n for n in nodes}

    def reads_gathered_rows(node, depth=6):
        for tensor in node.input[:2]:
            source = _producer(by_name, tensor)
            if source is None or tensor.startswith("^"):
                continue
            if source.op in _GATHER_OPS or source.op == "CtrVocabEmbedding":
                return source
            if source.op in ("Reshape", "ExpandDims"):  # hash_gather gives its rows their [B, L] axes back
                fused = _producer(by_name, source.input[0])
                if fused is not None and fused.op == "CtrStringEmbedding" and not fused.attr["delimiter"].s:
                    return fused
            if depth > 1 and source.op in _ROW_TRANSFORMS:
                found = reads_gathered_rows(source, depth - 1)
                if found is not None:
                    return found
        return None

    records = []
    for n in nodes:
        gather = reads_gathered_rows(n) if n.op in _POOLING_OPS else None
        if gather is not None:
            records.append({"pattern": "-", "node": n.name, "op": n.op,
                            "reason": f"{n.op} of the rows of {gather.name} stays TF's "
                                      f"({_pooling_left_why(n, gather, disabled_patterns)})"})
    return records


# The fused ops a gather pattern leaves a pooling's rows in (a string per
# row: no delimiter), and the pattern.
_FUSED_GATHERS = {"CtrVocabEmbedding": "vocab_lookup", "CtrStringEmbedding": "hash_gather"}
# The pattern that fuses each pooling op with the gather before it.
_POOLING_PATTERNS = {"Sum": "dense_reduce_lookup", "Mean": "dense_reduce_lookup",
                     "UnsortedSegmentSum": "ragged_reduce_lookup", "SegmentSum": "ragged_reduce_lookup"}


def _pooling_left_why(pooling, gather, disabled_patterns):
    """Why the pooling stays, in facts the graph shows: which pattern took
    its gather, or that the one pattern that pools it is off. Where that one
    declined, its own record (which the caller keeps instead) says why."""
    pattern = _POOLING_PATTERNS.get(pooling.op)
    if pattern in disabled_patterns:
        return f"{pattern}, the pattern that fuses {pooling.op} poolings with the gather before them, is disabled"
    if gather.op in _FUSED_GATHERS:
        return (f"{_FUSED_GATHERS[gather.op]} fused the gather with what produced its ids, alone: a pooling fuses "
                "with them only where dense_reduce_lookup (a Sum or Mean over axis 1 of padded [B, L] ids, L a known "
                "constant) or ragged_reduce_lookup takes ids, gather and pooling together, with the rows read by "
                "nothing else (an FM term's squares read them too); a MutableHashTable's find does not show its "
                "keys' shape")
    return ("a pooling of gathered rows of a form no pattern takes: they fuse sums and means over the ids of "
            "padded [B, L] ids, ragged rows and sparse ids, straight from the gather; a max, a segment op "
            "written by hand, rows of another rank or rows transformed before the pooling stay TF's")


def _weighted_encoding_forms(nodes):
    """{node name: what its report line adds} for the count encodings that a
    Mul scales before anything reads them (StringLookup's tf_idf: the idf
    weights), which the fused encodings do not take."""
    by_name = {n.name: n for n in nodes}
    forms = {}
    for n in nodes:
        if n.op != "Mul":
            continue
        for tensor in n.input[:2]:
            source = _producer(by_name, tensor)
            while source is not None and source.op in ("Cast", "Identity"):  # the counts cast to float
                source = _producer(by_name, source.input[0])
            if source is not None and source.op in ("DenseBincount", "SparseBincount", "RaggedBincount"):
                forms[source.name] = (", scaled by a Mul before the Dense (tf_idf's idf weights), which the fused "
                                      "encodings do not take")
    return forms


def _hashed_into_fused_lookup_forms(nodes):
    """{node name: what its report line adds} for the string hashes whose
    buckets a fused lookup reads (through Identity nodes, or as the values a
    safe lookup's SparseReorder permutes): pattern string_keys moves such a
    hash into the lookup where the model is served on a CPU only (the fused
    op hashes strings on the CPU), and only where nothing else reads the
    hash or what passes it on (a shared hash, an output, stays)."""
    by_name = {n.name: n for n in nodes}
    readers = {}
    for n in nodes:
        for tensor in n.input:
            readers[tensor.lstrip("^").split(":")[0]] = readers.get(tensor.lstrip("^").split(":")[0], 0) + 1
    forms = {}
    for n in nodes:
        if n.op not in ("CtrEmbeddingLookup", "CtrResourceEmbeddingLookup") or len(n.input) < 2:
            continue
        tensor = n.input[1]
        source = _producer(by_name, tensor)
        only_reader = True
        while source is not None and (source.op == "Identity" or (source.op == "SparseReorder"
                                                                   and tensor.endswith(":1"))):
            only_reader &= source.op == "SparseReorder" or readers.get(source.name) == 1
            tensor = source.input[0] if source.op == "Identity" else source.input[1]
            source = _producer(by_name, tensor)
        if source is not None and source.op == "StringToHashBucketFast" and only_reader \
                and readers.get(source.name) == 1:
            forms[source.name] = ("; the fused lookup it feeds hashes the strings itself on a CPU server "
                                  f"(pattern string_keys): rewrite with {CPU_ONLY_HINT}")
    return forms


# Ops of the subgraphs the patterns fuse, beside the feature ops: a function
# XLA compiles that holds one gets a record saying why it was left alone.
_LOOKUP_OPS = {"ResourceGather", "GatherV2", "SparseSegmentSum", "SparseSegmentMean", "SparseSegmentSqrtN",
               "SparseSegmentSumWithNumSegments", "SparseSegmentMeanWithNumSegments",
               "SparseSegmentSqrtNWithNumSegments", "StringSplitV2", "StringToNumber"}


def _compiled_by_xla(functions):
    """Names of the functions XLA compiles (tf.function(jit_compile=True))
    and of those they call: the rewrite leaves them alone (offline_rewrite.cc's
    CompiledByXla), since the fused ops have no XLA kernels."""
    by_name = {f.signature.name: f for f in functions}
    todo = [name for name, f in by_name.items()
            if "_XlaMustCompile" in f.attr and f.attr["_XlaMustCompile"].b]
    compiled = set()
    while todo:
        name = todo.pop()
        if name in compiled or name not in by_name:
            continue
        compiled.add(name)
        todo.extend(_called_functions(by_name[name].node_def, set(by_name)))
    return compiled


def _xla_function_record(graph, nodes):
    """One record for a function XLA compiles, at its first op a pattern
    could fuse (none when it has no such op)."""
    for n in nodes:
        if n.op in _UNFUSED_FEATURE_OPS or n.op in _LOOKUP_OPS:
            return [{"pattern": "-", "node": n.name, "op": n.op, "graph": graph,
                     "reason": f"{graph} is compiled by XLA (jit_compile=True) and the fused ops have no XLA "
                               "kernels, so its ops stay TF's: serve it without jit_compile to fuse it"}]
    return []


_MASKED_FIND = (", with a mask_token: its ids go through SelectV2(Equal(keys, mask), mask id, ids), which only "
                "the vocabulary embedding of an Embedding's gather, or of its pooling over [B, L] ids, takes, not "
                "an encoding")
_OOV_SLOTS_FIND = (", with several out-of-vocabulary slots (num_oov_indices > 1): its missing keys are hashed into "
                   "them by SelectV2(Equal(ids, default), hash(keys) + offset, ids), which only the vocabulary "
                   "embedding of an Embedding's gather, or of its pooling over [B, L] ids, takes, not an encoding")
_OOV_SLOTS_HASH = ", the out-of-vocabulary slot of a lookup with num_oov_indices > 1"


def _row_length_bincounts(nodes):
    """Names of the DenseBincount nodes a Cumsum reads: a RaggedTensor's row
    lengths counted from its value_rowids (their cumsum is its row_splits;
    its shape may read them too), not an encoding of features, which
    nothing sums that way."""
    readers = {}
    for n in nodes:
        for tensor in n.input:
            if not tensor.startswith("^"):
                readers.setdefault(tensor.split(":")[0], []).append(n.op)
    return {n.name for n in nodes
            if n.op == "DenseBincount" and "Cumsum" in readers.get(n.name, ())}


def _keras_lookup_forms(nodes):
    """{node name: what its report line adds} for the Keras lookup forms that
    only vocab_lookup takes (of one graph or function), each a
    SelectV2(Equal(...), x, found) over a LookupTableFindV2: a mask_token's
    (Equal(keys, mask): the find) and several OOV slots' (Equal(found, -1),
    x = hash(keys) + offset: the find and the hash)."""
    by_name = {n.name: n for n in nodes}

    def producer(tensor):
        return _producer(by_name, tensor)

    def same_tensor(a, b):  # "x" and "x:0" name one tensor
        return a.removesuffix(":0") == b.removesuffix(":0")

    forms = {}
    for n in nodes:
        if n.op != "SelectV2" or len(n.input) < 3:
            continue
        condition, below = producer(n.input[0]), producer(n.input[2])
        if condition is None or below is None or condition.op != "Equal":
            continue
        # The slots' Select reads the mask's when there is one.
        find = producer(below.input[2]) if below.op == "SelectV2" and len(below.input) >= 3 else below
        if find is None or find.op != "LookupTableFindV2":
            continue
        if below is find and any(same_tensor(find.input[1], x) for x in condition.input):
            forms[find.name] = _MASKED_FIND
        elif any(producer(x) is below for x in condition.input):
            forms.setdefault(find.name, _OOV_SLOTS_FIND)
            oov = producer(n.input[1])
            while oov is not None and oov.op in ("AddV2", "Add", "Cast"):
                oov = producer(oov.input[0])
            if oov is not None and oov.op in _UNFUSED_FEATURE_OPS:
                forms[oov.name] = _OOV_SLOTS_HASH
    return forms


def optimize_meta_graph(meta_graph, serving_device=None, disabled_patterns=()):
    """Runs CtrFusionOptimizer alone over a MetaGraphDef's graph.

    Grappler keeps what the MetaGraphDef names: its signatures' inputs and
    outputs, the "train_op" collection, init ops (main op, legacy init op,
    table initializers) and the saver's ops. Returns `(optimized GraphDef,
    report dict)` as `optimize_graph_def`; the skips also name each feature
    op that stays TF's (pattern "-").
    """
    disabled_patterns = _check_disabled(disabled_patterns)  # None, or an iterator read once
    meta = meta_graph_pb2.MetaGraphDef()
    meta.CopyFrom(meta_graph)
    _plain_signature_tensors(meta)
    _keep_recorded_shapes(meta.graph_def)
    with _TERMINATION.temporary_folder() as tmp:
        report_file = os.path.join(tmp, "report.jsonl")
        config = _add_fusion_optimizer(config_pb2.ConfigProto(), report_file=report_file, only=True,
                                       serving_device=serving_device, disabled_patterns=disabled_patterns)
        optimized = tf_optimizer.OptimizeGraph(config, meta, graph_id=_MAIN_GRAPH_ID.encode())
        report = _read_records(report_file)
    _add_unfused_feature_records(report, optimized, serving_device, disabled_patterns)
    return optimized, report


def _plain_signature_tensors(meta):
    """Names each component of a signature's SparseTensor (coo_sparse) or
    composite input and output as a tensor of its own, in the copy Grappler
    reads: its item builder feeds a SparseTensor input wrongly (a CHECK that
    aborts the process on a float one). The SavedModel keeps its signatures."""
    for signature in meta.signature_def.values():
        for infos in (signature.inputs, signature.outputs):
            for key in [k for k, info in infos.items() if info.WhichOneof("encoding") != "name"]:
                info = infos[key]
                if info.WhichOneof("encoding") == "coo_sparse":
                    sparse = info.coo_sparse
                    parts = [(sparse.indices_tensor_name, types_pb2.DT_INT64), (sparse.values_tensor_name, info.dtype),
                             (sparse.dense_shape_tensor_name, types_pb2.DT_INT64)]
                else:
                    parts = [(c.name, c.dtype) for c in info.composite_tensor.components]
                del infos[key]
                for i, (name, dtype) in enumerate(parts):
                    infos[f"{key}/{i}"].name = name
                    infos[f"{key}/{i}"].dtype = dtype


def captured_handle_shapes(concrete_function):
    """{placeholder name: shape} for the variables a concrete function captures."""
    by_handle = {id(v.handle): v for v in concrete_function.variables}
    shapes = {}
    for external, internal in concrete_function.graph.captures:
        var = by_handle.get(id(external))
        if var is not None:
            shapes[internal.op.name] = var.shape
    return shapes


def optimize_concrete_function(concrete_function, serving_device=None, disabled_patterns=()):
    """Optimized GraphDef of a concrete function's body, and the report."""
    graph_def = concrete_function.graph.as_graph_def(add_shapes=True)
    fetches = [t.name for t in concrete_function.outputs]
    return optimize_graph_def(graph_def, fetches, captured_handle_shapes(concrete_function),
                              serving_device=serving_device, disabled_patterns=disabled_patterns)


def _called_functions(nodes, library_names):
    """Names of library functions that `nodes` call (as op or through attrs)."""
    called = set()
    for node in nodes:
        if node.op in library_names:
            called.add(node.op)
        for attr in node.attr.values():
            if attr.HasField("func"):
                called.add(attr.func.name)
            if attr.HasField("list"):
                called.update(f.name for f in attr.list.func)
    return called & library_names


def reachable_functions(graph_def):
    """The library functions a GraphDef's nodes call, directly or indirectly."""
    by_name = {f.signature.name: f for f in graph_def.library.function}
    names = set(by_name)
    todo = list(_called_functions(graph_def.node, names))
    found = {}
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found[name] = by_name[name]
        todo.extend(_called_functions(by_name[name].node_def, names) - set(found))
    return [found[n] for n in sorted(found)]


def op_counts(graph_def, library=False):
    """{op: count} of a GraphDef's nodes; with `library`, also of the nodes of
    the library functions it calls (a SavedModel signature's body lives there)."""
    counts = {}
    nodes = list(graph_def.node)
    if library:
        for fdef in reachable_functions(graph_def):
            nodes.extend(fdef.node_def)
    for node in nodes:
        counts[node.op] = counts.get(node.op, 0) + 1
    return counts


# ---------------------------------------------------------------------------
# SavedModels


@dataclasses.dataclass
class SignatureReport:
    """What happened to one signature of a SavedModel."""

    key: str
    rewritten: bool  # False for signatures not selected (copied unchanged)
    matches: list = dataclasses.field(default_factory=list)  # {pattern, fused_node, fused_op, replaced}
    skips: list = dataclasses.field(default_factory=list)  # {pattern, node, reason}
    op_counts_before: dict = dataclasses.field(default_factory=dict)  # graph and the functions it calls
    op_counts_after: dict = dataclasses.field(default_factory=dict)
    inputs: str = None  # "given", "file" or "synthesized ...", when verified
    max_abs_diff: float = None  # over all outputs (inf when a non-numeric output differs)
    outputs_match: bool = None  # by _compare.max_abs_diff: floats allclose, the others equal
    latency_ms_before: float = None  # median of `runs` calls
    latency_ms_after: float = None
    latency_note: str = None  # why the latency was not timed
    endpoints: list = dataclasses.field(default_factory=list)  # the object's functions that call it (Keras' `serve`)


@dataclasses.dataclass
class RewriteReport:
    """The result of `optimize_saved_model`: per signature, what was fused,
    what was left alone and why, op counts, and the verification."""

    src: str
    dst: str
    signatures: dict  # key -> SignatureReport
    rewrite_seconds: float  # optimizing and rebuilding the signatures (no load, save, verify)
    total_seconds: float  # load, rewrite, save (and verify)
    verified: bool  # outputs compared with the original's, in a fresh process
    tf1: bool = False  # a TF1 (Builder) SavedModel: its signatures share one rewritten graph
    rejected_patterns: dict = dataclasses.field(default_factory=dict)  # pattern -> why its result was dropped
    disabled_patterns: list = dataclasses.field(default_factory=list)  # not run, as asked

    @property
    def matches(self):
        records = [dict(m, signature=s.key) for s in self.signatures.values() for m in s.matches]
        return _one_per_node(records) if self.tf1 else records

    @property
    def skips(self):
        records = [dict(k, signature=s.key) for s in self.signatures.values() for k in s.skips]
        return _one_per_node(records) if self.tf1 else records

    @property
    def max_abs_diff(self):
        diffs = [s.max_abs_diff for s in self.signatures.values() if s.max_abs_diff is not None]
        return max(diffs) if diffs else None

    @property
    def ok(self):
        """False when verification found different outputs, or the rewritten
        model failed where the original ran."""
        return not any(s.outputs_match is False for s in self.signatures.values())

    def to_dict(self):
        out = dataclasses.asdict(self)
        out["signatures"] = {k: dataclasses.asdict(v) for k, v in self.signatures.items()}
        out.update(ok=self.ok, max_abs_diff=self.max_abs_diff, num_matches=len(self.matches),
                   num_fused_subgraphs=fused_subgraph_count(self.matches),
                   num_skips=left_alone_count(self.skips))
        return out

    def to_json(self, indent=2):
        return json.dumps(self.to_dict(), indent=indent, default=_json_default)

    def summary(self):
        lines = [f"tf-ctr-ops optimize: {self.src} -> {self.dst}",
                 f"  rewrite {self.rewrite_seconds:.2f} s, total {self.total_seconds:.2f} s; "
                 f"{fused_subgraph_count(self.matches)} subgraph(s) fused, {left_alone_count(self.skips)} left alone"]
        if self.disabled_patterns:
            # The left-alone lines give each op's own reason, which may be only that its pattern did not run.
            lines.append(f"  disabled {', '.join(sorted(self.disabled_patterns))}: not run, so what they fuse "
                         "is left alone")
        rewritten = [s.key for s in self.signatures.values() if s.rewritten]
        shared = self.tf1 and len(rewritten) > 1
        if shared:
            # One graph: its records once, not under each signature.
            lines.append(f"graph of signatures {', '.join(map(repr, rewritten))}: {fused_subgraph_count(self.matches)} fused, "
                         f"{left_alone_count(self.skips)} left alone")
            lines += _record_lines(self.matches, self.skips)
        for s in self.signatures.values():
            if not s.rewritten:
                # Selected but composite (TF2): its own reason, not "not selected".
                why = next((k["reason"] for k in s.skips if k["reason"].startswith("copied unchanged")),
                           "not selected, copied unchanged")
                lines.append(f"signature {s.key!r}: {why}")
                continue
            if shared:
                lines.append(f"signature {s.key!r}:")
            else:
                lines.append(f"signature {s.key!r}: {fused_subgraph_count(s.matches)} fused, {len(s.skips)} left alone")
                lines += _record_lines(s.matches, s.skips)
            before, after = sum(s.op_counts_before.values()), sum(s.op_counts_after.values())
            delta = _count_delta(s.op_counts_before, s.op_counts_after)
            lines.append(f"  ops    {before} -> {after}" + (f": {delta}" if delta else ""))
            if s.endpoints:
                lines.append(f"  calls  from {', '.join(s.endpoints)} too (functions that only called the original)")
            if s.max_abs_diff is not None:
                verdict = "outputs match" if s.outputs_match else "OUTPUTS DIFFER"
                latency = (f"; latency {s.latency_note}" if s.latency_note else
                           "" if s.latency_ms_before is None else  # runs=0 times nothing
                           f"; median latency {s.latency_ms_before:.3f} ms -> {s.latency_ms_after:.3f} ms")
                lines.append(f"  verify {verdict} on inputs {s.inputs}: max |diff| {s.max_abs_diff:.3g}{latency}")
        for pattern, why in self.rejected_patterns.items():
            lines.append(f"dropped pattern {pattern}: {why}")
        cpu_only = {(k.get("graph"), k["node"]) for k in self.skips if CPU_ONLY_HINT in k["reason"]}
        if cpu_only:
            lines.append(f"{len(cpu_only)} subgraph(s) left native because their fused ops run on the CPU only: "
                         "for a model served on CPUs, rewrite the original model with --serving-device cpu "
                         "(serving_device='cpu'), not this rewritten one, whose fused ops no longer match them")
        if not self.verified:
            lines.append("not verified (--no-verify): the rewritten model was loaded in a fresh process, "
                         "its outputs were not compared")
        if not self.ok:
            lines.append("FAILED: the rewritten model does not reproduce the original (see above)")
        return "\n".join(lines)


def _record_lines(matches, skips):
    lines = []
    for m in matches:
        ops = ", ".join(r.rsplit(" (", 1)[-1].rstrip(")") for r in m["replaced"])
        lines.append(f"  fused  {m['fused_node']}: {m['pattern']} -> {m['fused_op']} (replaces {ops})")
    for k in skips:
        lines.append(f"  left   {k['node']} ({k['pattern']}): {k['reason']}")
    return lines


def _one_per_node(records):
    """A TF1 model's signatures share one graph: each record once."""
    seen, out = set(), []
    for r in records:
        key = tuple(sorted((k, str(v)) for k, v in r.items() if k != "signature"))
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def _json_default(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    return str(value)


def _count_delta(before, after):
    parts = []
    for op in sorted(set(before) | set(after)):
        d = after.get(op, 0) - before.get(op, 0)
        if d:
            parts.append(f"{op} {d:+d}")
    return ", ".join(parts)


def _rename_functions(graph_def, suffix):
    """Gives every library function a new name (and updates its callers), so
    the optimized bodies never collide with the originals in this process."""
    names = {f.signature.name for f in graph_def.library.function}
    if not names:
        return graph_def

    def fix_attr(attr):
        if attr.HasField("func") and attr.func.name in names:
            attr.func.name += suffix
        if attr.HasField("list"):
            for f in attr.list.func:
                if f.name in names:
                    f.name += suffix

    def fix_nodes(nodes):
        for node in nodes:
            if node.op in names:
                node.op += suffix
            for attr in node.attr.values():
                fix_attr(attr)

    fix_nodes(graph_def.node)
    for fdef in graph_def.library.function:
        fdef.signature.name += suffix
        fix_nodes(fdef.node_def)
        for attr in fdef.attr.values():
            fix_attr(attr)
    for grad in graph_def.library.gradient:
        if grad.function_name in names:
            grad.function_name += suffix
        if grad.gradient_func in names:
            grad.gradient_func += suffix
    return graph_def


def _signature_inputs(concrete_function):
    """Ordered input keys, their specs, and the graph inputs that receive them."""
    args, kwargs = concrete_function.structured_input_signature
    if args:
        raise ValueError("signature functions take keyword inputs only")
    keys = tf.nest.flatten({k: k for k in kwargs})  # the order of graph.inputs
    specs = [kwargs[k] for k in keys]
    return keys, specs, list(concrete_function.inputs[:len(keys)])


def _input_names(keys, specs, signature_keys):
    """Each input's SignatureDef key, which a loaded signature keeps in one of
    two places: the argument key when it is a Python identifier
    (`UserHistory`), else the spec's name (`user-id`, whose argument key is
    `user_id`). The spec's name of `UserHistory` is `userhistory`, TF's
    lower-cased argument name."""
    return [key if key in signature_keys or spec.name not in signature_keys else spec.name
            for key, spec in zip(keys, specs)]


def _rebuild_function(concrete_function, graph_def, name, extra_captures=None, signature_keys=()):
    """A tf.function concrete function that runs `graph_def` (an optimized body
    of `concrete_function`), with the same input names (`signature_keys`: the
    SignatureDef's) and output structure, capturing the same variables and
    resources."""
    from tensorflow.python.eager import wrap_function

    keys, specs, inputs = _signature_inputs(concrete_function)
    graph_def = _rename_functions(type(graph_def).FromString(graph_def.SerializeToString()),
                                  f"_ctr_{uuid.uuid4().hex[:8]}")
    outputs = tf.nest.pack_sequence_as(concrete_function.structured_outputs,
                                       [t.name for t in concrete_function.outputs], expand_composites=True)
    captures = {internal.op.name: external for external, internal in concrete_function.graph.captures}
    captures.update(extra_captures or {})  # merged partitioned tables
    # The ops that run for their effect (a hook's assign, a signature of no
    # outputs): pruned to the outputs alone, the function would drop them.
    names = {node.name for node in graph_def.node}
    effects = [op.name for op in concrete_function.graph.control_outputs if op.name in names]
    body = wrap_function.function_from_graph_def(graph_def, [t.name for t in inputs], (outputs, effects),
                                                 captures=captures)
    signature = [tf.TensorSpec(spec.shape, spec.dtype, name=input_name)
                 for spec, input_name in zip(specs, _input_names(keys, specs, set(signature_keys)))]

    def serve(*args):
        # The optimized body's shapes come from shape inference on the GraphDef,
        # which can know less than the original function (a Dense after a
        # TFSMLayer needs the output's width): the original's static shapes hold.
        return tf.nest.map_structure(_with_static_shape_of, concrete_function.structured_outputs, body(*args)[0])

    serve.__name__ = name
    return tf.function(serve, input_signature=signature).get_concrete_function()


def _with_static_shape_of(original, rebuilt):
    """`rebuilt` with the static shape of `original` (a tensor, or the spec a
    loaded signature gives)."""
    if isinstance(original, (tf.Tensor, tf.TensorSpec)) and isinstance(rebuilt, tf.Tensor):
        rebuilt.set_shape(original.shape)
    return rebuilt


def _latency_failure_note(failures, others):
    """Why a signature verified once was not timed: which copies failed when
    called again (the original too, or the rewritten model alone)."""
    when = "called again after the other signatures' calls" if others else "called again"
    first = _errors.summary(next(iter(failures.values())))
    if "the original" not in failures:
        return f"not timed: {when}, the rewritten model failed where the original ran ({first})"
    if len(failures) == 1:
        return f"not timed: {when}, the original failed where the rewritten model ran ({first})"
    return f"not timed: {when}, the original and the rewritten model failed ({first})"


def _median_latency_ms(fn, inputs, runs):
    for _ in range(2):
        output_arrays(fn(**inputs))
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        output_arrays(fn(**inputs))
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


class RewriteError(RuntimeError):
    """No verified, servable rewrite could be written; `dst` was left as it was."""


_FRESH_PROCESS_TIMEOUT_S = 900


def _feeds(fn, inputs):
    specs = fn.structured_input_signature[1]
    return {k: tf.constant(v, dtype=specs[k].dtype if k in specs else None) for k, v in inputs.items()}


def _composite_outputs(fn):
    """"name (type)" of each output of `fn` that is not a plain tensor (a
    RaggedTensor, a SparseTensor), comma-joined; "" when there is none."""
    outputs = fn.structured_outputs
    items = outputs.items() if isinstance(outputs, dict) else enumerate(tf.nest.flatten(outputs))
    return ", ".join(f"{k} ({type(v).__name__})" for k, v in items if not isinstance(v, (tf.Tensor, tf.TensorSpec)))


def _outputs(fn, inputs):
    return output_arrays(fn(**_feeds(fn, inputs)))


def _verification_inputs(src, selected, facts, sample_inputs, inputs_file, seed):
    """Per selected signature: the inputs to verify on, where they came from,
    and the original model's outputs on them. Inputs are searched on a copy
    of the model of its own (a signature may change its variables or tables:
    a scatter hook, a request counter), and the outputs come from a fresh
    copy whose signatures run once each in order, from the saved state, as
    the check of the rewritten model runs them."""
    probe = tf.saved_model.load(src)
    inputs, hows = _chosen_inputs(probe, selected, facts, sample_inputs, inputs_file, seed)
    fresh = tf.saved_model.load(src)
    return inputs, hows, {key: _outputs(fresh.signatures[key], feeds) for key, feeds in inputs.items()}


ALL_EMPTY = "all empty, so nothing can be compared"


def _all_empty(outputs):
    """Whether there are outputs and none holds a value (a batch of 0, a mask
    that kept nothing): both models would agree on nothing at all. A
    signature without outputs (a hook that updates state) has nothing to
    compare, and its state is checked by the signatures that read it."""
    return bool(outputs) and all(np.size(v) == 0 for v in outputs.values())


def _chosen_inputs(loaded, selected, facts, sample_inputs, inputs_file, seed):
    signatures = {k: loaded.signatures[k] for k in selected}
    unselected = {k: loaded.signatures[k] for k in loaded.signatures.keys() if k not in signatures}
    given = {k: ("file", v) for k, v in (_model_inputs.load_inputs_file(inputs_file, signatures, unselected).items()
                                         if inputs_file is not None else ())}
    given.update({k: ("given", v) for k, v in (sample_inputs or {}).items() if k in signatures})
    rng = np.random.default_rng(seed)
    inputs, hows, reference = {}, {}, {}
    for key, fn in signatures.items():
        if key in given:
            hows[key], inputs[key] = given[key]
            try:
                reference[key] = _outputs(fn, inputs[key])
            except Exception as e:  # noqa: BLE001 - the user's inputs are wrong
                hint = _model_inputs.nul_hint(inputs_file, str(e)) if hows[key] == "file" else ""
                raise RewriteError(f"signature {key!r}: the original model fails on the {hows[key]} inputs "
                                   f"({_errors.summary(e)}){hint}") from None
            if _all_empty(reference[key]):
                raise RewriteError(f"signature {key!r}: the original model's outputs on the {hows[key]} inputs are "
                                   f"{ALL_EMPTY}; pass inputs with at least one example")
            continue

        if key in facts.sparse_inputs:
            parts = ", ".join(f"{k}_indices, {k}_values and {k}_dense_shape" for k in facts.sparse_inputs[key])
            raise RewriteError(f"signature {key!r}: cannot verify: no inputs are synthesized for its SparseTensor "
                               f"inputs ({', '.join(facts.sparse_inputs[key])}); pass them as --inputs FILE "
                               f"(an .npz of {parts}, with the signature's other inputs), or skip verification (--no-verify)")

        def run(candidate, fn=fn):
            try:
                outputs = _outputs(fn, candidate)
            except Exception as e:  # noqa: BLE001 - the search tries another candidate
                return f"{_errors.summary(e)}\n{e}"  # the summary first, the node names after
            return f"the original model's outputs are {ALL_EMPTY}" if _all_empty(outputs) else None

        try:
            inputs[key], hows[key] = _model_inputs.synthesize(fn.structured_input_signature[1], run, facts, rng)
        except _model_inputs.InputsError as e:
            raise RewriteError(f"signature {key!r}: cannot verify: {e}. Pass inputs the model accepts "
                               "(--inputs FILE, or sample_inputs), or skip verification (--no-verify)") from None
    return inputs, hows


def _fresh_process_env():
    """The environment of the fresh processes: this package's parent first on
    PYTHONPATH, so that they import the package this process runs."""
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
                PYTHONPATH=os.pathsep.join(filter(None, [package_parent, os.environ.get("PYTHONPATH")])))


def _serve_in_fresh_process(model_dir, inputs, endpoints=()):
    """tf_ctr_ops._serve_check's result for `model_dir` run on `inputs`, each
    of `endpoints` (_endpoints.Endpoint) checked against its signature."""
    with _TERMINATION.temporary_folder() as tmp:
        request, result = os.path.join(tmp, "request.pkl"), os.path.join(tmp, "result.pkl")
        with open(request, "wb") as f:
            pickle.dump({"inputs": {k: {n: np.asarray(v) for n, v in feeds.items()} for k, feeds in inputs.items()},
                         "endpoints": {e.name: (e.key, e.feeds, e.outputs) for e in endpoints if e.key in inputs}},
                        f)
        proc = _TERMINATION.check([os.path.abspath(model_dir), request, result], tmp, _fresh_process_env())
        if proc.returncode != 0 or not os.path.exists(result):
            tail = (proc.stderr or proc.stdout).strip().splitlines()
            return {"load_error": f"the process exited with status {proc.returncode}"
                                  + (f" ({tail[-1]})" if tail else ""), "outputs": {}, "errors": {}}
        with open(result, "rb") as f:
            return pickle.load(f)


def _fresh_process_failure(model_dir, inputs, reference, endpoints=()):
    """(None, diffs) when `model_dir` loads in a fresh process and reproduces
    `reference` on `inputs`, and its `endpoints` their signatures' outputs;
    else (what went wrong, diffs so far). diffs: {signature: (max |diff|, close)}."""
    result = _serve_in_fresh_process(model_dir, inputs, endpoints)
    if result["load_error"]:
        return f"does not load in a fresh process ({result['load_error']})", {}
    diffs = {}
    for key in inputs:
        if key in result["errors"]:
            return f"fails on signature {key!r} in a fresh process ({result['errors'][key]})", diffs
        outputs = result["outputs"][key]
        if set(outputs) != set(reference[key]):
            return f"returns outputs {sorted(outputs)} on signature {key!r}, not {sorted(reference[key])}", diffs
        diffs[key] = max_abs_diff(reference[key], outputs)
        if not diffs[key][1]:
            return f"gives other outputs than the original on signature {key!r} (max |diff| {diffs[key][0]:.3g})", diffs
    return None, diffs


@dataclasses.dataclass
class _Attempt:
    folder: str  # removed when the attempt failed
    reports: dict
    rewrite_seconds: float
    failure: str
    diffs: dict


class _RebuildError(Exception):
    """A rewritten signature TF could not rebuild, with the reports so far:
    what fused, so that the patterns can be tried one at a time."""

    def __init__(self, reports, error):
        super().__init__(str(error))
        self.reports, self.error = reports, error


class _Termination:
    """A killed `tf-ctr-ops optimize` (SIGTERM, SIGINT) removes its temporary
    models, each as big as the model. An exception raised by a signal
    handler may land in a __del__, where Python ignores it (and the command
    went on), so the handler removes them itself and exits at once; but
    while DST is being replaced, only once that is done."""

    def __init__(self):
        self.start()

    def start(self):
        """A new rewrite: no temporary model yet, DST not yet replaced."""
        self.folders = set()
        self.children = set()
        self.forked = None  # (server, its child's pid or None until forked) of a check the server runs
        self.replacing = False
        self.replaced = False
        self.pending = None

    def exit(self, signum):
        if self.replacing:
            self.pending = signum
            return
        if self.forked is not None:
            server, pid = self.forked
            server.abandon(pid)
        for child in list(self.children):
            child.kill()
            try:
                child.wait(timeout=10)  # gone before this process is
            except subprocess.TimeoutExpired:
                pass
        for folder in list(self.folders):
            shutil.rmtree(folder, ignore_errors=True)
        dst = "DST was written (its verification was cut short)" if self.replaced else "DST is left as it was"
        print(f"tf-ctr-ops optimize: stopped by signal {signum}; {dst}", file=sys.stderr, flush=True)
        os._exit(128 + signum)

    @contextlib.contextmanager
    def temporary_folder(self):
        """tempfile.TemporaryDirectory that a kill removes too, from its
        making on (the verification's inputs are written before its child
        starts, and its result read after the child ends)."""
        folder = tempfile.mkdtemp()
        self.folders.add(folder)
        try:
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)
            self.folders.discard(folder)

    def run(self, args, folder, env):
        """subprocess.run(args) in `folder` with output captured and the fresh
        process's time limit; a kill meanwhile kills the child."""
        with subprocess.Popen(args, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) as proc:
            self.children.add(proc)
            try:
                out, err = proc.communicate(timeout=_FRESH_PROCESS_TIMEOUT_S)
            except BaseException:  # a time-out, Ctrl-C in a program of the caller's: no child left running
                proc.kill()
                raise
            finally:
                self.children.discard(proc)
        return subprocess.CompletedProcess(args, proc.returncode, out, err)

    def check(self, argv, folder, env):
        """`python -m tf_ctr_ops._serve_check ARGV` in `folder`, forked by the
        check server (see _fresh_process); a new process when another
        thread's check holds the server or it cannot start."""
        with _CHECK_SERVER.claimed() as server:
            if server is not None:
                self.forked = (server, None)
                try:
                    code, out, err = server.run(argv, folder, env, _FRESH_PROCESS_TIMEOUT_S,
                                                on_pid=lambda pid: setattr(self, "forked", (server, pid)))
                    return subprocess.CompletedProcess(argv, code, out, err)
                except _fresh_process.ServerGone:
                    pass
                finally:
                    self.forked = None
        return self.run([sys.executable, "-m", "tf_ctr_ops._serve_check", *argv], folder, env)

    @contextlib.contextmanager
    def replacing_dst(self):
        self.replacing = True
        try:
            yield
            self.replaced = True
        finally:
            self.replacing = False
            if self.pending is not None:
                self.exit(self.pending)


_TERMINATION = _Termination()
_CHECK_SERVER = _fresh_process.Server()


def _start_check_server():
    """Starts the check server now, so that its imports overlap the rewrite
    (unless another thread's check holds it)."""
    with _CHECK_SERVER.claimed() as server:
        if server is not None:
            server.start(_fresh_process_env())


def exit_on_signal(signum, frame=None):
    """A signal handler for the command line: see _Termination."""
    _TERMINATION.exit(signum)


def _attempt(build, parent, inputs, reference, disabled):
    folder = tempfile.mkdtemp(prefix=".ctr-rewrite-", dir=parent)
    _TERMINATION.folders.add(folder)
    _readable_as_made(folder)
    try:
        reports, seconds, endpoints = build(folder, frozenset(disabled))
        failure, diffs = _fresh_process_failure(folder, inputs, reference, endpoints)
    except (_RebuildError, ValueError, tf.errors.OpError) as e:  # TF's importer refused the rewritten graph
        shutil.rmtree(folder, ignore_errors=True)
        reports, e = (e.reports, e.error) if isinstance(e, _RebuildError) else ({}, e)
        first_line = (str(e).strip().splitlines() or [""])[0]
        return _Attempt(folder, reports, 0.0, f"could not be rebuilt ({type(e).__name__}: {first_line})", {})
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    if failure:
        shutil.rmtree(folder, ignore_errors=True)
    return _Attempt(folder, reports, seconds, failure, diffs)


def _fused_patterns(reports):
    names = []
    for report in reports.values():
        for m in report.matches:
            if m["pattern"] not in names:
                names.append(m["pattern"])
    return names


_ORIGINAL_RECHECKS = 3


def _servable_rewrite(build, parent, inputs, reference, disabled, src):
    """The rewrite with every pattern, if it passes the fresh-process check;
    else with the patterns whose results pass, added back one at a time in
    the order they fused (later ones build on earlier ones). Returns the
    passing attempt and {pattern: why it was dropped}."""
    first = _attempt(build, parent, inputs, reference, disabled)
    if not first.failure:
        return first, {}
    fused = _fused_patterns(first.reports)
    if not fused:
        raise RewriteError(f"the re-saved model {first.failure}")
    best = _attempt(build, parent, inputs, reference, set(disabled) | set(fused))
    if best.failure:
        # With nothing fused, the graph differs from the original's in no op:
        # an original whose outputs vary between runs (reads and writes of a
        # variable its graph leaves unordered) may pass one run, so it gets a few.
        for _ in range(_ORIGINAL_RECHECKS):
            original_failure, _ = _fresh_process_failure(src, inputs, reference)
            if original_failure:
                raise RewriteError(f"the original model itself {original_failure} when loaded again (are its "
                                   "outputs random, do they depend on the order of reads and writes of a variable, "
                                   "or does its init op re-initialize variables?): nothing can be verified")
        raise RewriteError(f"with any pattern fused the rewritten model {first.failure}; with none, it "
                           f"{best.failure}, while the original gave the same outputs in {_ORIGINAL_RECHECKS} more "
                           "runs")
    kept, dropped = [], {}
    try:
        for pattern in fused:
            trial = _attempt(build, parent, inputs, reference, set(disabled) | (set(fused) - set(kept) - {pattern}))
            if trial.failure:
                dropped[pattern] = trial.failure
                continue
            shutil.rmtree(best.folder, ignore_errors=True)
            best, kept = trial, kept + [pattern]
    except BaseException:  # a time-out, Ctrl-C: the best model so far is as big as the model
        shutil.rmtree(best.folder, ignore_errors=True)
        raise
    return best, dropped


def _readable_as_made(folder):
    """mkdtemp makes a folder only its owner reads: give it the mode a new
    folder gets (umask applied), so that a server of another user reads dst."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(folder, 0o777 & ~umask)


def _move_into_place(folder, dst):
    """Renames `folder` to `dst` (an absolute path), replacing a previous
    `dst` only now. Where a rename fails (another rewrite to the same dst at
    once) the previous dst is put back and `folder` removed."""
    if not os.path.lexists(dst):
        with _TERMINATION.replacing_dst():
            _rename_or_remove(folder, dst)
        return
    if not os.path.isdir(dst):
        shutil.rmtree(folder, ignore_errors=True)
        raise RewriteError(f"{dst} exists and is not a folder")
    with _TERMINATION.replacing_dst():
        old = tempfile.mkdtemp(prefix=".ctr-replaced-", dir=os.path.dirname(dst))
        aside = os.path.join(old, "model")
        try:
            os.rename(dst, aside)
        except OSError as e:
            shutil.rmtree(old, ignore_errors=True)
            _rename_or_remove(folder, None, e)
        try:
            _rename_or_remove(folder, dst)
        except RewriteError:
            with contextlib.suppress(OSError):
                os.rename(aside, dst)
            raise
        finally:
            shutil.rmtree(old, ignore_errors=True)


def _rename_or_remove(folder, dst, error=None):
    """os.rename(folder, dst); where it fails (or `error` was met before)
    `folder` is removed and a RewriteError raised."""
    if error is None:
        try:
            os.rename(folder, dst)
            return
        except OSError as e:
            error = e
    shutil.rmtree(folder, ignore_errors=True)
    raise RewriteError(f"the rewritten model could not be put in place ({error.strerror or error}); did another "
                       "process change dst meanwhile? This run did not replace it")


def _tf2_builder(src, loaded, proto, available, selected, serving_device, merge_partitions):
    """build(folder, disabled) for a TF2 SavedModel: each selected signature's
    function optimized and rebuilt, saved with the variables and resources
    the signatures capture."""

    written = (_partitioned.EVERY_VARIABLE if _partitioned.library_writes(proto)
               else _partitioned.written_variables(loaded.signatures[k] for k in available))
    endpoints = _endpoints.wrapped_endpoints(loaded, selected)
    # Partitions an earlier rewrite of this model merged: its signatures
    # (rewritten again, or copied) still read them.
    earlier = list(getattr(loaded, "ctr_variables", None) or [])

    def build(folder, disabled):
        reports, functions, made = {}, {}, []
        rewrite_seconds = 0.0
        for key in available:
            original = loaded.signatures[key]
            before = original.graph.as_graph_def()
            if key not in selected:
                functions[key] = original
                counts = op_counts(before, library=True)
                reports[key] = SignatureReport(key, False, op_counts_before=counts, op_counts_after=counts)
                continue
            t0 = time.perf_counter()
            graph_def = original.graph.as_graph_def(add_shapes=True)
            merged, part_matches, part_skips = {}, [], []
            if _partitioned.PATTERN not in disabled:
                graph_def, merged, part_matches, part_skips = _partitioned.merge_partitioned_tables(
                    graph_def, original, _partitioned.saved_variable_devices(proto), written, merge_partitions)
            optimized, records = optimize_graph_def(
                graph_def, [t.name for t in original.outputs],
                dict(captured_handle_shapes(original), **{k: v.shape for k, v in merged.items()}),
                serving_device=serving_device, disabled_patterns=disabled)
            # The merge above gave each partitioned lookup left its reason;
            # the optimizer's own record of it only says it merges offline.
            optimizer_skips = [k for k in records["skip"]
                               if _partitioned.PATTERN in disabled or k["pattern"] != _partitioned.PATTERN]
            reports[key] = SignatureReport(key, True, matches=part_matches + records["match"],
                                           skips=part_skips + optimizer_skips,
                                           op_counts_before=op_counts(before, library=True),
                                           op_counts_after=op_counts(optimized, library=True))
            try:
                functions[key] = _rebuild_function(original, optimized, f"{key}_ctr_fused",
                                                   {k: v.handle for k, v in merged.items()},
                                                   proto.meta_graphs[0].signature_def[key].inputs.keys())
            except (ValueError, tf.errors.OpError) as e:  # TF's importer refused the rewritten graph
                raise _RebuildError(reports, e) from e
            made.extend(v for v in merged.values() if not any(v is w for w in made))
            rewrite_seconds += time.perf_counter() - t0
        # The loaded model is the root again, so its variables keep their
        # checkpoint keys (a training checkpoint of the original restores into
        # the rewritten model); variables the rewrite made (merged partitions)
        # are tracked beside them.
        loaded.ctr_variables = earlier + made
        # The functions a signature only calls (Keras' `serve`) call its
        # rewritten function instead; set again on each build.
        for endpoint in endpoints:
            setattr(loaded, endpoint.name, _endpoints.rewritten(endpoint, functions[endpoint.key]))
            reports[endpoint.key].endpoints.append(endpoint.name)
        _save_rebuilt(loaded, folder, functions)
        _files.restore_method_names(proto, folder)
        _files.copy_assets_extra(src, folder)
        return reports, rewrite_seconds, endpoints

    return build


def _save_rebuilt(loaded, folder, functions):
    """tf.saved_model.save of the loaded model with its rebuilt signatures. TF
    cannot save the gradient functions of functions rebuilt from a GraphDef
    (a model with a tf.custom_gradient, as Keras' int8-quantized layers have):
    such a model is saved without its custom gradients, which serving never
    calls, and the user is told."""
    try:
        tf.saved_model.save(loaded, folder, signatures=functions)
        return
    except ValueError as e:
        if "experimental_custom_gradients" not in str(e):
            raise
    for entry in os.listdir(folder):  # what the refused save wrote
        path = os.path.join(folder, entry)
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    warnings.warn("tf_ctr_ops: the model's tf.custom_gradient gradients are not kept in the rewritten model (TF "
                  "cannot re-save them from a rewritten graph); it serves the same, but a gradient requested "
                  "through it may fail", stacklevel=2)
    tf.saved_model.save(loaded, folder, signatures=functions,
                        options=tf.saved_model.SaveOptions(experimental_custom_gradients=False))


def _tf1_builder(src, proto, serving_device):
    """build(folder, disabled) for a TF1 SavedModel of one MetaGraphDef (the
    caller refuses more): its graph optimized in place, everything else
    copied (see _saved_model_files)."""

    def build(folder, disabled):
        out = saved_model_pb2.SavedModel()
        out.CopyFrom(proto)
        (meta,) = out.meta_graphs
        t0 = time.perf_counter()
        before = op_counts(meta.graph_def, library=True)
        optimized, records = optimize_meta_graph(meta, serving_device, disabled)
        meta.graph_def.CopyFrom(optimized)
        after = op_counts(optimized, library=True)
        reports = {key: SignatureReport(key, True, matches=list(records["match"]), skips=list(records["skip"]),
                                        op_counts_before=before, op_counts_after=after)
                   for key in meta.signature_def if key != "__saved_model_init_op"}
        seconds = time.perf_counter() - t0
        _files.write_tf1(src, folder, out)
        return reports, seconds, []

    return build


def _check_apart(src, dst):
    """dst replaces whatever is there (moved aside, then deleted): a dst that
    holds src would delete the source model, one inside src would change it,
    and a folder that holds anything but a SavedModel would lose it."""
    a, b = os.path.realpath(src), os.path.realpath(dst)
    if a == b:
        raise ValueError("dst must differ from src")
    if os.path.commonpath([a, b]) in (a, b):
        inner, outer = (a, b) if os.path.commonpath([a, b]) == b else (b, a)
        raise ValueError(f"dst and src must not lie inside one another: {inner} is inside {outer}")
    if os.path.lexists(dst) and not os.path.isdir(dst):
        raise ValueError(f"dst {dst} exists and is not a folder")
    folder = os.path.dirname(b)
    while not os.path.exists(folder):  # the first folder that exists is where dst will be made
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder):
        raise ValueError(f"dst {dst} cannot be made: {folder} is a file, not a folder")
    if os.path.isdir(dst) and os.listdir(dst) and not any(
            os.path.exists(os.path.join(dst, name)) for name in ("saved_model.pb", "saved_model.pbtxt")):
        raise ValueError(f"dst {dst} is a folder that holds no SavedModel: the rewrite would replace it and its "
                         "files; remove it or choose another dst")


def optimize_saved_model(src, dst, signature_keys=None, sample_inputs=None, verify=True, runs=20, seed=0,
                         serving_device=None, inputs_file=None, disabled_patterns=(), merge_partitions=False):
    """Rewrites a SavedModel's signatures with CtrFusionOptimizer into a new SavedModel.

    Each selected signature's function is optimized (its body usually lives in
    the function library: every function it calls is rewritten), rebuilt from
    the optimized graph, and served by `dst` under the same signature key, with
    the same input names, output keys and method names. Variables stay
    variables (nothing is frozen: embedding tables may exceed the 2 GB
    GraphDef limit); `dst` holds the variables the signatures read. Signatures
    not selected are copied unchanged. A TF1 SavedModel (written by
    `tf.compat.v1.saved_model.Builder`, as Estimator exports are) is rewritten
    as one graph instead, keeping its main op / legacy init op, table
    initializers, assets, saver and collections as they are. A SavedModel of
    several MetaGraphs (tag sets) is refused: only the serving one could be
    verified.
    Lookups into partitioned tables ('mod' or 'div' lists of variables) are
    first rewritten into gathers from one merged variable per partition
    list, created here and saved in `dst` (see tf_ctr_ops/_partitioned.py).

    Nothing broken is ever written to `dst`. The rewrite goes to a temporary
    folder beside `dst`, which a fresh Python process loads and runs (on the
    verification inputs, when verifying); only a model that passes is moved
    to `dst`. When the fully rewritten model fails, the patterns that fused are
    added back one at a time and those whose result fails are dropped (the
    report says why). `dst` loads in a process that has imported `tf_ctr_ops`.

    Args:
      src: the SavedModel directory to read.
      dst: the directory to write (replaced only on success; must not be `src`).
      signature_keys: the signatures to rewrite; default all (a TF1 model's
        signatures share one graph: all of them).
      sample_inputs: {signature key: {input name: array}} to verify on.
      verify: compare the rewritten model's outputs with the original's (in
        a fresh process) and record both median latencies of `runs` calls.
        Inputs come from `sample_inputs`, else `inputs_file`, else they are
        synthesized so that the original accepts them (see
        tf_ctr_ops/_model_inputs.py: plain values, serialized tf.Examples
        from the graph's ParseExample spec, the lookup tables' vocabularies).
        When none are accepted, RewriteError says so.
      runs: calls per latency measurement.
      seed: seed of the synthesized inputs.
      serving_device: where `dst` will be served: "cpu" makes the
        concatenated string embedding read its string tensors in place
        (`CtrConcatStringTensorEmbedding`, CPU only), with no `CtrPackStrings`
        copy before it, and fuses vocabulary lookups into embeddings
        (`CtrVocabEmbedding`, CPU only: lookup tables live on the host);
        "gpu" or None (the default: either) keep the pack, which is the GPU
        path's one host-to-device copy, and the native lookups. A node placed
        on a device follows its placement.
      inputs_file: an .npz of input arrays (named INPUT, or SIGNATURE/INPUT),
        or a TFRecord file of serialized tf.Examples for signatures whose one
        input is such a string.
      disabled_patterns: names of patterns (as the report names them) not to run.
      merge_partitions: merge a TF2 model's partitioned tables into one
        variable each (pattern `partitioned_table`). The merged variable is a
        copy made now: writes to the partitions, a checkpoint restored into
        them and a newer export's `variables/` do not reach it, so it is
        for a model served as exported. A model any of whose functions
        writes variables is never merged.

    Returns:
      A `RewriteReport`.

    Raises:
      ValueError: for bad arguments (no SavedModel at `src`, unknown signatures).
      RewriteError: when no verified, servable model could be written.
    """
    with _fusion_off():
        return _optimize_saved_model(src, dst, signature_keys, sample_inputs, verify, runs, seed, serving_device,
                                     inputs_file, disabled_patterns, merge_partitions)


def _optimize_saved_model(src, dst, signature_keys, sample_inputs, verify, runs, seed, serving_device, inputs_file,
                          disabled_patterns, merge_partitions):
    _check_serving_device(serving_device)
    disabled_patterns = _check_disabled(disabled_patterns)
    start = time.perf_counter()
    src, dst = os.fspath(src), os.fspath(dst)
    # dst as the checks below read it: a literal "nosuch/../dst" would be
    # walked through nosuch by the final rename, once the whole rewrite ran.
    dst = os.path.abspath(dst)
    if dst == os.path.abspath(os.getcwd()):
        raise ValueError("dst must not be the current folder: it is replaced by a rename")
    _check_apart(src, dst)
    _TERMINATION.start()
    _start_check_server()
    proto = _files.read(src)
    if len(proto.meta_graphs) > 1:  # only the serving graph could be verified
        tag_sets = [sorted(m.meta_info_def.tags) for m in proto.meta_graphs]
        raise ValueError(f"{src} holds {len(tag_sets)} MetaGraphs (tag sets {tag_sets}); the rewrite takes a "
                         f"SavedModel of one: export the serving graph alone")
    loaded = tf.saved_model.load(src)
    available = list(loaded.signatures.keys())
    if signature_keys is None:
        selected = available
    else:
        selected = list(signature_keys)
        missing = [k for k in selected if k not in available]
        if missing:
            raise ValueError(f"signature(s) {missing} not in {src}; it has {available}")
    # Those of signatures left out of this rewrite are ignored; a misspelt key
    # would leave its signature verified on synthesized inputs without a word.
    unknown = sorted(k for k in (sample_inputs or {}) if k not in available)
    if unknown:
        raise ValueError(f"sample_inputs for signature(s) {unknown} not in {src}; it has {available}")
    tf1 = _files.is_tf1(proto)
    # A TF2 signature with composite outputs is copied unchanged; a TF1 graph
    # is optimized whole, composite outputs and all (see _plain_signature_tensors).
    composite = {} if tf1 else {k: _composite_outputs(loaded.signatures[k]) for k in selected}
    composite = {k: names for k, names in composite.items() if names}
    if composite and signature_keys is not None:
        key, names = next(iter(composite.items()))
        raise ValueError(f"signature {key!r} returns composite tensors ({names}): the rewrite takes signatures of "
                         f"plain tensors; leave it out of --signature and it is copied unchanged")
    selected = [k for k in selected if k not in composite]
    if tf1 and set(selected) != set(available):
        raise ValueError(f"{src} is a TF1 SavedModel, whose signatures share one graph: rewrite all of them "
                         f"({available}), not {selected}")

    inputs, hows, reference = {}, {}, {}
    if verify:
        facts = _model_inputs.GraphFacts(proto.meta_graphs, src)
        inputs, hows, reference = _verification_inputs(src, selected, facts, sample_inputs, inputs_file, seed)
    build = (_tf1_builder(src, proto, serving_device) if tf1
             else _tf2_builder(src, loaded, proto, available, selected, serving_device, merge_partitions))
    parent = os.path.dirname(dst)
    os.makedirs(parent, exist_ok=True)
    best, dropped = _servable_rewrite(build, parent, inputs, reference, set(disabled_patterns), src)
    for key, report in best.reports.items():
        if key in inputs:
            report.inputs = hows[key]
            report.max_abs_diff, report.outputs_match = best.diffs[key]
        if report.rewritten:
            report.skips.extend({"pattern": p, "node": "*", "reason": f"dropped: with it the rewritten model {why}"}
                                for p, why in dropped.items())
    for key, names in composite.items():
        best.reports[key].skips.append({"pattern": "*", "node": "*", "reason": f"copied unchanged: it returns "
                                        f"composite tensors ({names}), which the rewrite does not rebuild"})
    _move_into_place(best.folder, dst)

    if verify and runs > 0:
        rewritten = tf.saved_model.load(dst)
        for key in selected:
            report = best.reports[key]
            failures = {}
            for which, model, field in (("the original", loaded, "latency_ms_before"),
                                        ("the rewritten model", rewritten, "latency_ms_after")):
                signature = model.signatures[key]
                try:
                    setattr(report, field, _median_latency_ms(signature, _feeds(signature, inputs[key]), runs))
                except tf.errors.OpError as e:
                    failures[which] = e
            if failures:
                # DST is verified and written; timing calls each signature
                # again and again on one loaded copy of each model, after the
                # other signatures' calls, so one that writes state (a table
                # insert, a counter) can fail where its first call did not.
                report.latency_ms_before = report.latency_ms_after = None
                report.latency_note = _latency_failure_note(failures, others=len(selected) > 1)
    return RewriteReport(src=src, dst=dst, signatures=best.reports, rewrite_seconds=best.rewrite_seconds,
                         total_seconds=time.perf_counter() - start, verified=bool(verify), tf1=tf1,
                         rejected_patterns=dropped, disabled_patterns=list(disabled_patterns))

"""Offline merging of partitioned embedding tables (used by rewrite.optimize_saved_model).

`tf.compat.v1.nn.embedding_lookup(parts, ids, partition_strategy)` over a
list of variables is, in a SavedModel signature's body function,

    flat   = Reshape(ids, [-1]);  positions = Range(0, Size(flat), 1)
    assign = p(flat);  local = r(flat)             (the strategy's arithmetic)
    rows_p = ResourceGather(parts[p], DynamicPartition(local, assign, P)[p])
    out    = Reshape(ParallelDynamicStitch(DynamicPartition(positions, assign, P), rows),
                     concat(Shape(ids), [D]))

With the partitions laid out as the strategy lays them out (partition p holds
V // P + (p < V % P) rows), `out` is ResourceGather(merged, ids) for one
[V, D] table: "mod" puts id r at row r // P of partition r % P, so merged row
r is that row; "div" puts consecutive ids in consecutive partitions, so the
merged table is their concatenation. The merge happens here, once, into a new
variable the rewritten SavedModel saves; the Grappler patterns then fuse the
plain gather like any other lookup. A Grappler pass has no way to create a
variable, so online rewriting leaves partitioned lookups alone.

Only the final Reshape node changes (into the gather); nodes of the old
subgraph that nothing reads any more are removed, the others stay.
"""

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import types_pb2

from tf_ctr_ops._state_writes import all_nodes, writes_variable

_RESOURCE = types_pb2.DT_RESOURCE
PATTERN = "partitioned_table"  # the name reports give this merge, as a Grappler pattern's


class _Body:
    """Name resolution in a FunctionDef: "node:out_arg:i" or a bare argument."""

    def __init__(self, fdef):
        self.fdef = fdef
        self.nodes = {n.name: n for n in fdef.node_def}
        self.args = [a.name for a in fdef.signature.input_arg]

    def node(self, ref):
        return self.nodes.get(ref.split(":")[0]) if ":" in ref else None

    def arg(self, ref):
        return ref if ":" not in ref and ref in self.args else None

    def output_index(self, ref):
        return int(ref.rsplit(":", 1)[1]) if ":" in ref else 0

    def through_identities(self, ref):
        n = self.node(ref)
        while n is not None and n.op == "Identity":
            ref = n.input[0]
            n = self.node(ref)
        return ref

    def const(self, ref):
        n = self.node(self.through_identities(ref))
        if n is None or n.op != "Const":
            return None
        return tf.make_ndarray(n.attr["value"].tensor)

    def int_const(self, ref):
        v = self.const(ref)
        return int(v) if v is not None and v.shape == () and v.dtype.kind in "iu" else None

    def expr(self, ref, leaf):
        """The integer expression computing `ref`, constants folded; `leaf` is
        the one tensor allowed as a variable (the flat ids), shown as "F"."""
        ref = self.through_identities(ref)
        if ref == leaf:
            return "F"
        c = self.int_const(ref)
        if c is not None:
            return c
        n = self.node(ref)
        if n is None:
            return ("?", ref)
        op = {"AddV2": "Add", "SelectV2": "Select"}.get(n.op, n.op)
        if op == "Cast":
            return self.expr(n.input[0], leaf)  # integer casts of in-range values
        kids = [self.expr(i, leaf) for i in n.input if not i.startswith("^")]
        if op in ("FloorDiv", "FloorMod", "Add", "Sub") and all(isinstance(k, int) for k in kids) and len(kids) == 2:
            a, b = kids
            if b == 0 and op in ("FloorDiv", "FloorMod"):
                return ("?", ref)
            return {"FloorDiv": a // b, "FloorMod": a % b, "Add": a + b, "Sub": a - b}[op]
        return (op, *kids)


def _layout_sizes(total, p):
    return [total // p + (1 if i < total % p else 0) for i in range(p)]


def _expected(strategy, total, p):
    """(assignment, local id) expressions of the strategy for `total` ids."""
    if strategy == "mod":
        return ("FloorMod", "F", p), ("FloorDiv", "F", p)
    ipp, extras = total // p, total % p
    assign = ("Maximum", ("FloorDiv", "F", ipp + 1), ("FloorDiv", ("Sub", "F", extras), ipp))
    local = ("Select", ("Less", assign, extras), ("FloorMod", "F", ipp + 1),
             ("FloorMod", ("Sub", "F", extras), ipp))
    return assign, local


class _Match:
    def __init__(self, reshape, ids, parts, strategy, dim, index_dtype, subgraph):
        self.reshape, self.ids, self.parts, self.strategy = reshape, ids, parts, strategy
        self.dim, self.index_dtype, self.subgraph = dim, index_dtype, subgraph


def _match_stitch(body, stitch, part_shapes):
    """A _Match for the lookup ending in `stitch`, or the reason it is not one."""
    p = stitch.attr["N"].i
    indices, rows = list(stitch.input[:p]), list(stitch.input[p:2 * p])
    gathers = [body.node(r) for r in rows]
    if any(g is None or g.op != "ResourceGather" or g.attr["batch_dims"].i != 0 for g in gathers):
        return "the partitions are not read by ResourceGather from variables"
    parts = [body.arg(g.input[0]) for g in gathers]
    if any(a is None or a not in part_shapes for a in parts):
        return "the partitions are not variables the signature captures"
    shapes = [part_shapes[a] for a in parts]
    if any(len(s) != 2 or None in s for s in shapes) or len({s[1] for s in shapes}) != 1:
        return f"partition shapes {shapes} are not matrices of one width"
    dp_rows = [body.node(g.input[1]) for g in gathers]
    dp_pos = [body.node(r) for r in indices]
    for dps in (dp_rows, dp_pos):
        if any(d is None or d.op != "DynamicPartition" or d is not dps[0] for d in dps):
            return "the stitch does not read two DynamicPartitions"
    if [body.output_index(g.input[1]) for g in gathers] != list(range(p)) or \
            [body.output_index(r) for r in indices] != list(range(p)):
        return "partition outputs are not stitched in order"
    dp_ids, dp_positions = dp_rows[0], dp_pos[0]
    if dp_ids.attr["num_partitions"].i != p or dp_positions.attr["num_partitions"].i != p or \
            dp_ids.input[1] != dp_positions.input[1]:
        return "the DynamicPartitions do not share one assignment into the partitions"
    flat_ref = None
    positions = body.node(dp_positions.input[0])
    if positions is not None and positions.op == "Range" and body.int_const(positions.input[0]) == 0 and \
            body.int_const(positions.input[2]) == 1:
        size = body.node(positions.input[1])
        flat_ref = size.input[0] if size is not None and size.op == "Size" else None
    flat = body.node(flat_ref) if flat_ref else None
    shape = body.const(flat.input[1]) if flat is not None and flat.op == "Reshape" else None
    if shape is None or list(shape.reshape(-1)) != [-1]:
        return "the ids are not flattened and counted as embedding_lookup does"
    ids = flat.input[0]
    total = sum(s[0] for s in shapes)
    if _layout_sizes(total, p) != [s[0] for s in shapes]:
        return (f"partition sizes {[s[0] for s in shapes]} do not follow the layout "
                f"{_layout_sizes(total, p)} of {total} rows in {p} partitions")
    got = (body.expr(dp_ids.input[1], flat_ref), body.expr(dp_ids.input[0], flat_ref))
    strategy = next((s for s in ("mod", "div") if got == _expected(s, total, p)), None)
    if strategy == "div" and total < p:
        return f"{total} rows in {p} partitions (TF's 'div' rule divides by zero)"
    if strategy is None:
        return "the partition assignment is neither the 'mod' nor the 'div' rule for these partitions"
    return strategy, parts, shapes[0][1], flat.attr["T"].type, ids


def _final_reshape(body, stitch, dim, ids):
    """The Reshape(stitch, concat(Shape(ids), [D])) reading the stitch, or None."""
    readers = [n for n in body.fdef.node_def if any(i.split(":")[0] == stitch.name for i in n.input
                                                     if not i.startswith("^"))]
    if len(readers) != 1 or readers[0].op != "Reshape":
        return None
    reshape = readers[0]
    concat = body.node(reshape.input[1])
    if concat is None or concat.op != "ConcatV2" or concat.attr["N"].i != 2 or body.int_const(concat.input[2]) != 0:
        return None
    shape_of, width = body.node(concat.input[0]), body.const(concat.input[1])
    if shape_of is None or shape_of.op != "Shape" or shape_of.input[0] != ids or width is None or \
            list(width.reshape(-1)) != [dim]:
        return None
    return reshape


def _remove_dead(body, candidates, replaced_by):
    """Removes the candidate nodes nothing reads any more (repeatedly),
    moving control edges on them to `replaced_by`; returns "name (Op)"s."""
    fdef = body.fdef
    removed = []
    while True:
        read = {i.split(":")[0] for n in fdef.node_def for i in n.input if not i.startswith("^")}
        read |= {v.split(":")[0] for v in fdef.ret.values()}
        dead = [n for n in fdef.node_def if n.name in candidates and n.name not in read]
        if not dead:
            return removed
        names = {n.name for n in dead}
        removed += [f"{n.name} ({n.op})" for n in dead]
        kept = [n for n in fdef.node_def if n.name not in names]
        del fdef.node_def[:]
        fdef.node_def.extend(kept)
        for n in fdef.node_def:
            controls = [i for i in n.input if i.startswith("^")]
            if any(c[1:] in names for c in controls):
                data = [i for i in n.input if not i.startswith("^")]
                new = [c for c in controls if c[1:] not in names]
                if f"^{replaced_by}" not in new and n.name != replaced_by:
                    new.append(f"^{replaced_by}")
                del n.input[:]
                n.input.extend(data + new)
        gone = [k for k, v in fdef.control_ret.items() if v in names]
        for key in gone:
            del fdef.control_ret[key]
        if gone:
            outputs = [k for k in fdef.signature.control_output if k not in gone]
            if replaced_by not in fdef.control_ret.values():
                fdef.control_ret[replaced_by] = replaced_by
                outputs.append(replaced_by)
            del fdef.signature.control_output[:]
            fdef.signature.control_output.extend(outputs)


class _EveryVariable:
    def __contains__(self, handle):
        return True


EVERY_VARIABLE = _EveryVariable()  # `written`, where some function of the model writes variables

NOT_OPTED_IN = ("merging the partitions copies them into a new variable, which later writes, a restored "
                "checkpoint or a newer export's variables/ would not reach: pass merge_partitions=True "
                "(--merge-partitions) where the model is served as exported")


def library_writes(saved_model_proto):
    """Whether any function of the SavedModel (a signature's, or one it
    only keeps for Python callers, such as a hot-update hook) writes a
    variable; the saver's restore function, which assigns every variable
    its checkpoint value, aside."""
    for meta_graph in saved_model_proto.meta_graphs:
        restore = meta_graph.saver_def.restore_op_name.split(":")[0]
        saver = {n.attr["f"].func.name for n in meta_graph.graph_def.node if n.name == restore and "f" in n.attr}
        for f in meta_graph.graph_def.library.function:
            if f.signature.name not in saver and any(writes_variable(n) for n in f.node_def):
                return True
    return False


def written_variables(functions):
    """The handles (ids) of the variables that functions which write any
    variable capture: a merged copy of partitions would not see those
    writes, so such partitions stay as they are (conservative: the write may
    be to another variable of the function)."""
    handles = set()
    for fn in functions:
        if any(writes_variable(n) for n in all_nodes(fn.graph.as_graph_def())):
            handles |= {id(v.handle) for v in fn.variables}
    return handles


def merge_partitioned_tables(graph_def, concrete_function, saved_devices=(), written=frozenset(), merge=True):
    """Rewrites partitioned lookups in the functions `graph_def` calls into
    gathers from merged variables.

    Partitions on different devices are never merged: one variable would
    move the whole table onto one device. `saved_devices` are the variable
    devices the SavedModel records (`saved_variable_devices`): TF's loader
    does not restore them, so two or more of them leave every partitioned
    lookup alone. Partitions among `written` (written_variables of the
    SavedModel's signatures, or EVERY_VARIABLE) are left alone too. Without
    `merge`, lookups that would merge are left alone with NOT_OPTED_IN.

    Returns (graph_def, {placeholder name: merged variable}, match records,
    skip records). `graph_def` is modified in place.
    """
    by_handle = {id(v.handle): v for v in concrete_function.variables}
    outer = {}  # top-level placeholder name -> variable
    for external, internal in concrete_function.graph.captures:
        if id(external) in by_handle:
            outer[internal.op.name] = by_handle[id(external)]
    calls = {}
    for node in graph_def.node:
        if node.op in ("StatefulPartitionedCall", "PartitionedCall"):
            calls.setdefault(node.attr["f"].func.name, []).append(node)
    merged, matches, skips = {}, [], []  # merged: (strategy, partition handles) -> variable
    placeholders = {}  # top-level placeholder -> merged variable
    merged_args = {}  # (function, key) -> argument name
    for fdef in graph_def.library.function:
        stitches = [n for n in fdef.node_def if n.op == "ParallelDynamicStitch"]
        callers = calls.get(fdef.signature.name, [])
        if not stitches:
            continue
        if len(callers) != 1:
            skips += [{"pattern": PATTERN, "node": s.name,
                       "reason": "the function is not called once from the signature"} for s in stitches]
            continue
        call = callers[0]
        body = _Body(fdef)
        call_inputs = [i for i in call.input if not i.startswith("^")]
        part_vars = {}
        for arg, ref in zip(body.args, call_inputs):
            var = outer.get(ref.split(":")[0])
            if var is not None:
                part_vars[arg] = var
        part_shapes = {a: tuple(v.shape.as_list()) for a, v in part_vars.items()}
        for stitch in stitches:
            found = _match_stitch(body, stitch, part_shapes)
            if isinstance(found, str):
                skips.append({"pattern": PATTERN, "node": stitch.name, "reason": found})
                continue
            strategy, parts, dim, index_dtype, ids = found
            reshape = _final_reshape(body, stitch, dim, ids)
            if reshape is None:
                skips.append({"pattern": PATTERN, "node": stitch.name,
                              "reason": "the stitched rows are not reshaped back to ids.shape + [D] alone"})
                continue
            devices = saved_devices if len(saved_devices) > 1 else _devices(part_vars[a].device for a in parts)
            if len(devices) > 1:
                skips.append({"pattern": PATTERN, "node": stitch.name,
                              "reason": f"the partitions sit on different devices ({', '.join(devices)}): "
                                        "merging them would put the whole table on one"})
                continue
            if any(id(part_vars[a].handle) in written for a in parts):
                skips.append({"pattern": PATTERN, "node": stitch.name,
                              "reason": "a function of the model writes variables (a signature that reads the "
                                        "partitions, or a hook): a merged copy would not see its writes"})
                continue
            if not merge:
                skips.append({"pattern": PATTERN, "node": stitch.name, "reason": NOT_OPTED_IN})
                continue
            key = (strategy, tuple(id(part_vars[a].handle) for a in parts))
            if key not in merged:
                values = [part_vars[a].read_value().numpy() for a in parts]
                if strategy == "mod":
                    table = np.empty((sum(len(v) for v in values), dim), values[0].dtype)
                    for i, v in enumerate(values):
                        table[i::len(values)] = v
                else:
                    table = np.concatenate(values, axis=0)
                var = tf.Variable(table, name=f"ctr_merged_{strategy}_table")
                merged[key] = var
            var = merged[key]
            arg_name = merged_args.get((fdef.signature.name, key))
            if arg_name is None:
                arg_name = f"ctr_merged_table_{len(body.args)}"
                placeholder = f"ctr_merged_table_{len(graph_def.node)}"
                fdef.signature.input_arg.add(name=arg_name, type=_RESOURCE)
                shape = fdef.arg_attr[len(body.args)].attr["_handle_shapes"].list.shape.add()
                shape.CopyFrom(tf.TensorShape(var.shape).as_proto())
                if "_input_shapes" in fdef.attr:  # loading checks one per argument
                    shapes_attr = fdef.attr["_input_shapes"].list.shape
                    shapes_attr.add().CopyFrom(shapes_attr[body.args.index(parts[0])])
                body.args.append(arg_name)
                ph = graph_def.node.add(name=placeholder, op="Placeholder")
                ph.attr["dtype"].type = _RESOURCE
                ph.attr["shape"].shape.CopyFrom(tf.TensorShape([]).as_proto())
                ph.attr["_handle_shapes"].list.shape.add().CopyFrom(tf.TensorShape(var.shape).as_proto())
                data = [i for i in call.input if not i.startswith("^")]
                controls = [i for i in call.input if i.startswith("^")]
                del call.input[:]
                call.input.extend(data + [placeholder] + controls)
                call.attr["Tin"].list.type.append(_RESOURCE)
                merged_args[(fdef.signature.name, key)] = arg_name
                placeholders[placeholder] = var
            subgraph = {n.name for n in fdef.node_def if n.name != reshape.name}
            gather_dtype = body.node(stitch.input[len(parts)]).attr["dtype"].type
            old_inputs = [i for i in reshape.input if i.startswith("^")]
            old_shape = reshape.input[1]
            reshape.op = "ResourceGather"
            reshape.attr.clear()
            reshape.attr["dtype"].type = gather_dtype
            reshape.attr["Tindices"].type = index_dtype
            reshape.attr["batch_dims"].i = 0
            reshape.attr["validate_indices"].b = True
            del reshape.input[:]
            reshape.input.extend([arg_name, ids] + old_inputs)
            candidates = _subgraph_above(body, stitch.name, subgraph)
            candidates |= _subgraph_above(body, old_shape.split(":")[0], subgraph)
            removed = _remove_dead(body, candidates, reshape.name)
            body.nodes = {n.name: n for n in fdef.node_def}
            matches.append({"pattern": PATTERN, "fused_node": reshape.name, "fused_op": "ResourceGather",
                            "replaced": removed + [f"{reshape.name} (Reshape)"], "strategy": strategy,
                            "partitions": len(parts)})
    return graph_def, placeholders, matches, skips


def _devices(names):
    """The distinct devices of `names`, in one spelling ("" and this process's
    own job and task left out)."""
    found = set()
    for name in names:
        spec = tf.DeviceSpec.from_string(name or "")
        if spec.job in (None, "localhost"):
            spec = spec.replace(job=None, replica=None, task=None)
        if spec.to_string():
            found.add(spec.to_string())
    return sorted(found)


def saved_variable_devices(proto):
    """The distinct variable devices a SavedModel records
    (SaveOptions(experimental_variable_policy=SAVE_VARIABLE_DEVICES))."""
    return _devices(node.variable.device for meta in proto.meta_graphs for node in meta.object_graph_def.nodes
                    if node.WhichOneof("kind") == "variable")


def _subgraph_above(body, name, allowed):
    """Names of `name` and the nodes it reads from, transitively, within `allowed`."""
    seen, todo = set(), [name]
    while todo:
        n = body.nodes.get(todo.pop())
        if n is None or n.name in seen or n.name not in allowed:
            continue
        seen.add(n.name)
        todo += [i.lstrip("^").split(":")[0] for i in n.input]
    return seen

"""A SavedModel's tf.functions that a signature only wraps, rewritten with it.

Keras' `model.export()` saves a `serve` function and a `serving_default`
signature that does nothing but call it; `reloaded.serve(x)` and
`keras.layers.TFSMLayer` call the function, not the signature. The rewrite
optimizes signatures, so such a function would keep serving TF's graph. Where
a signature is exactly one call of a function (its inputs fed straight in,
each of its outputs returned), the function is replaced by one that calls the
rewritten, verified signature with the same inputs and returns its outputs in
the function's own structure: nothing is computed that verification did not
compare.
"""

import dataclasses
import inspect

import tensorflow as tf

from tf_ctr_ops._state_writes import all_nodes, writes_state

_CALL_OPS = ("StatefulPartitionedCall", "PartitionedCall")


@dataclasses.dataclass
class Endpoint:
    """A loaded object's attribute `name`, a function of one concrete function
    that signature `key` wraps."""

    name: str
    key: str
    original: object  # the restored function
    concrete: object  # its concrete function
    feeds: list  # for each flat input of `concrete`, the signature input (by position) it gets
    outputs: list  # for each flat output of `concrete`, the signature output key that returns it


def wrapped_endpoints(loaded, keys):
    """The Endpoints of `loaded` that signatures `keys` wrap: functions that
    are the one function a signature calls, or one call of it (a model this
    rewrite wrote: its `serve` calls the rewritten function the signature
    calls, and is re-pointed again by a second rewrite)."""
    wrapping = {}
    for key in keys:
        signature = loaded.signatures[key]
        call = _the_call(signature.graph)
        # A function that writes state would run twice in verification (as
        # the signature, then as itself), the second time on the state the
        # first left.
        if call is not None and not any(writes_state(n) for n in all_nodes(signature.graph.as_graph_def())):
            wrapping.setdefault(call.get_attr("f").name, key)
    found = []
    for name, value in sorted(vars(loaded).items()):
        concretes = getattr(value, "concrete_functions", None)
        if name.startswith("_") or not concretes or len(concretes) != 1:
            continue
        concrete = concretes[0]
        call = None if _name(concrete) in wrapping else _the_only_call(concrete.graph)
        key = wrapping.get(_name(concrete) if call is None else call.get_attr("f").name)
        wiring = _wiring(loaded.signatures[key], concrete, call) if key else None
        if wiring:
            found.append(Endpoint(name, key, value, concrete, *wiring))
    return found


def _name(concrete):
    return concrete.name.decode() if isinstance(concrete.name, bytes) else concrete.name


def _the_call(graph):
    """A function graph's one call of a function, or None."""
    calls = [op for op in graph.get_operations() if op.type in _CALL_OPS]
    return calls[0] if len(calls) == 1 else None


# What a function that only calls another holds besides the call: a
# function that also writes a variable, asserts or prints does more than
# the signature, which its re-pointed copy would not do.
_PASS_THROUGH_OPS = ("Placeholder", "Identity", "NoOp")


def _the_only_call(graph):
    """A function graph's one call of a function, where the graph holds
    nothing else that runs (its inputs, Identities), else None."""
    call = _the_call(graph)
    if call is None or any(op is not call and op.type not in _PASS_THROUGH_OPS for op in graph.get_operations()):
        return None
    return call


def _through_identities(tensor):
    while tensor.op.type == "Identity":
        tensor = tensor.op.inputs[0]
    return tensor


def _passed_through(graph_inputs, graph_outputs, call, count):
    """(args, returns) of a graph that is one `call` with its first `count`
    inputs fed straight in and each output returned: args[i] the argument
    graph input i feeds, returns[m] the call output graph output m is; None
    otherwise."""
    position = {t.op.name: i for i, t in enumerate(graph_inputs[:count])}
    fed = [position.get(_through_identities(t).op.name) for t in call.inputs[:count]]
    if None in fed or sorted(fed) != list(range(count)):
        return None
    args = [None] * count
    for arg, index in enumerate(fed):
        args[index] = arg
    returns = []
    for tensor in graph_outputs:
        source = _through_identities(tensor)
        if source.op is not call:
            return None
        returns.append(source.value_index)
    return args, returns


def _wiring(signature, concrete, call=None):
    """(feeds, outputs) of `concrete` in `signature`, or None where the
    signature does more than call it with its inputs and return its outputs.
    `call`: None where `concrete` is the function the signature calls, else
    `concrete`'s one call of that function."""
    args, kwargs = concrete.structured_input_signature
    if kwargs:  # a tf.function's input_signature is positional
        return None
    if len(tf.nest.flatten(concrete.structured_outputs, expand_composites=True)) != len(concrete.outputs):
        return None  # it returns a None or a Python value beside its tensors
    flat_inputs = len(tf.nest.flatten(args, expand_composites=True))
    own = (_passed_through(concrete.inputs, concrete.outputs, call, flat_inputs) if call is not None
           else (list(range(flat_inputs)), list(range(len(concrete.outputs)))))
    if own is None:
        return None
    keys = tf.nest.flatten({k: k for k in signature.structured_input_signature[1]})
    position = {t.op.name: i for i, t in enumerate(signature.inputs[:len(keys)])}
    sig_call = _the_call(signature.graph)
    arg_feeds = [position.get(_through_identities(t).op.name) for t in sig_call.inputs[:flat_inputs]]
    if None in arg_feeds or sorted(arg_feeds) != list(range(len(keys))):
        return None
    returned = {}  # the called function's output -> the signature output key returning it
    output_keys = tf.nest.flatten({k: k for k in signature.structured_outputs})
    for key, tensor in zip(output_keys, signature.outputs):
        source = _through_identities(tensor)
        if source.op is not sig_call or source.value_index in returned:
            return None
        returned[source.value_index] = key
    own_args, own_returns = own
    outputs = [returned.get(index) for index in own_returns]
    if None in outputs or sorted(outputs) != sorted(output_keys):
        return None
    feeds = [arg_feeds[arg] for arg in own_args]
    # Only a function that takes exactly what the signature takes: one
    # traced for a narrower shape would refuse the signature's inputs, and
    # a wider one would refuse, once re-pointed, calls it took before.
    for own_input, position in zip(concrete.inputs[:flat_inputs], feeds):
        fed = signature.inputs[position]
        if own_input.dtype != fed.dtype or own_input.shape != fed.shape:
            return None
    return feeds, outputs


def rewritten(endpoint, signature):
    """A tf.function with `endpoint`'s inputs, argument names and outputs
    that runs the rewritten `signature` (a concrete function taking the
    signature's inputs positionally, in key order, and returning its output
    dict)."""
    concrete = endpoint.concrete
    names = _argument_names(concrete)

    def call(*args, **kwargs):
        if kwargs:  # by name, as the original took them
            args = args + tuple(kwargs[name] for name in names[len(args):])
        flat = tf.nest.flatten(args, expand_composites=True)
        positional = [None] * len(flat)
        for index, position in enumerate(endpoint.feeds):
            positional[position] = flat[index]
        out = signature(*positional)
        return tf.nest.pack_sequence_as(concrete.structured_outputs, [out[k] for k in endpoint.outputs],
                                        expand_composites=True)

    call.__name__ = endpoint.name
    if names:
        call.__signature__ = inspect.Signature(
            [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in names])
    return tf.function(call, input_signature=list(concrete.structured_input_signature[0]))


def _argument_names(concrete):
    """The names `concrete`'s positional arguments may be passed by, or []
    where it takes them by position only (Keras' `serve(*args)`)."""
    function_type = getattr(concrete, "function_type", None)
    parameters = list(function_type.parameters.values()) if function_type is not None else []
    if (len(parameters) != len(concrete.structured_input_signature[0])
            or any(p.kind != inspect.Parameter.POSITIONAL_OR_KEYWORD for p in parameters)):
        return []
    return [p.name for p in parameters]

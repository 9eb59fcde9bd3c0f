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
    """The Endpoints of `loaded` that signatures `keys` wrap."""
    wrapping = {}
    for key in keys:
        signature = loaded.signatures[key]
        calls = [op for op in signature.graph.get_operations() if op.type in _CALL_OPS]
        # A function that writes state would run twice in verification (as
        # the signature, then as itself), the second time on the state the
        # first left.
        if len(calls) == 1 and not any(writes_state(n) for n in all_nodes(signature.graph.as_graph_def())):
            wrapping.setdefault(calls[0].get_attr("f").name, key)
    found = []
    for name, value in sorted(vars(loaded).items()):
        concretes = getattr(value, "concrete_functions", None)
        if name.startswith("_") or not concretes or len(concretes) != 1:
            continue
        concrete = concretes[0]
        key = wrapping.get(concrete.name.decode() if isinstance(concrete.name, bytes) else concrete.name)
        wiring = _wiring(loaded.signatures[key], concrete) if key else None
        if wiring:
            found.append(Endpoint(name, key, value, concrete, *wiring))
    return found


def _through_identities(tensor):
    while tensor.op.type == "Identity":
        tensor = tensor.op.inputs[0]
    return tensor


def _wiring(signature, concrete):
    """(feeds, outputs) of `concrete` in `signature`, or None where the
    signature does more than call it with its inputs and return its outputs."""
    args, kwargs = concrete.structured_input_signature
    if kwargs:  # a tf.function's input_signature is positional
        return None
    call = next(op for op in signature.graph.get_operations() if op.type in _CALL_OPS)
    keys = tf.nest.flatten({k: k for k in signature.structured_input_signature[1]})
    position = {t.op.name: i for i, t in enumerate(signature.inputs[:len(keys)])}
    flat_inputs = len(tf.nest.flatten(args, expand_composites=True))
    feeds = [position.get(_through_identities(t).op.name) for t in call.inputs[:flat_inputs]]
    if None in feeds or sorted(feeds) != list(range(len(keys))):
        return None
    outputs = [None] * len(concrete.outputs)
    output_keys = tf.nest.flatten({k: k for k in signature.structured_outputs})
    for key, tensor in zip(output_keys, signature.outputs):
        source = _through_identities(tensor)
        if source.op is not call or source.value_index >= len(outputs) or outputs[source.value_index]:
            return None
        outputs[source.value_index] = key
    if None in outputs or len(output_keys) != len(outputs):
        return None
    return feeds, outputs


def rewritten(endpoint, signature):
    """A tf.function with `endpoint`'s inputs and outputs that runs the
    rewritten `signature` (a concrete function taking the signature's inputs
    positionally, in key order, and returning its output dict)."""
    concrete = endpoint.concrete

    def call(*args):
        flat = tf.nest.flatten(args, expand_composites=True)
        positional = [None] * len(flat)
        for index, position in enumerate(endpoint.feeds):
            positional[position] = flat[index]
        out = signature(*positional)
        return tf.nest.pack_sequence_as(concrete.structured_outputs, [out[k] for k in endpoint.outputs],
                                        expand_composites=True)

    call.__name__ = endpoint.name
    return tf.function(call, input_signature=list(concrete.structured_input_signature[0]))

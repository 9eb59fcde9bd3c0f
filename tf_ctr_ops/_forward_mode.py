"""Forward-mode differentiation (`tf.autodiff.ForwardAccumulator`) of the ops.

TF's generic JVP transposes an op's gradient function on a tape, with
respect to every input it deems trainable, resource handles included. A
vocabulary op's first input is a lookup table's handle, which has no
gradient, and TF cannot build the zeros it then asks for (a TypeError from
deep inside TF, where `tf.gather(params, table.lookup(keys))` works, because
there the handle feeds an op of its own). Here the transposition runs with
respect to the inputs that carry a tangent only, and with IndexedSlices
gradients made dense (a tape cannot take a gradient of IndexedSlices).

Ops whose gradient function is itself not differentiable (the lookups'
gradient ops, see `ops._no_second_order`) still fail, now with the
NotImplementedError that names that op.
"""

import tensorflow as tf
from tensorflow.python.eager import backprop_util, execute, forwardprop, forwardprop_util
from tensorflow.python.framework import ops as tf_ops


def _jvp_of_tangent_inputs(op_type):
    return lambda attrs, inputs, outputs, tangents: _jvp(op_type, attrs, inputs, outputs, tangents)


def _jvp(op_type, attrs, inputs, outputs, tangents):
    watched = [i for i, t in enumerate(tangents) if t is not None]
    trainable = [k for k, y in enumerate(outputs) if backprop_util.IsTrainable(y)]
    output_tangents = [None] * len(outputs)
    if not watched or not trainable:
        return output_tangents
    with forwardprop_util.push_forwardprop_state():
        with tf.GradientTape() as transpose_tape:
            with tf.GradientTape() as vjp_tape:
                vjp_tape.watch([inputs[i] for i in watched])
                execute.record_gradient(op_type, inputs, attrs, outputs)
            # The VJP is linear in these seeds; its transpose is the JVP.
            seeds = [tf.ones_like(outputs[k]) for k in trainable]
            transpose_tape.watch(seeds)
            vjps = vjp_tape.gradient([outputs[k] for k in trainable], [inputs[i] for i in watched], seeds,
                                     unconnected_gradients=tf.UnconnectedGradients.ZERO)
            vjps = [tf.convert_to_tensor(g) for g in vjps]
        jvps = transpose_tape.gradient(vjps, seeds, output_gradients=[tangents[i] for i in watched])
    for k, jvp in zip(trainable, jvps):
        output_tangents[k] = jvp
    return output_tangents


def register():
    """Gives every op of this library with a gradient the JVP above. A TF
    without the private table keeps its generic JVP (and its errors)."""
    special_cases = getattr(forwardprop, "_SPECIAL_CASES", None)
    if special_cases is None:
        return
    for op_type in tf_ops.gradient_registry.list():
        if op_type.startswith("Ctr"):
            special_cases.setdefault(op_type, _jvp_of_tangent_inputs(op_type))

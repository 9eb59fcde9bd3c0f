"""Loads a SavedModel in this (fresh) process and runs its signatures.

    python -m tf_ctr_ops._serve_check MODEL_DIR REQUEST.pkl RESULT.pkl

`optimize_saved_model` runs this in a new Python process on every model it
writes, before moving it to its destination: a model that loads and serves
only in the process that rewrote it (functions, tables or shapes that exist
only there) is caught here. REQUEST holds {"inputs": {signature key:
{input: array}}, "endpoints": {function name: (signature key, feeds,
outputs)}} (see _endpoints.Endpoint: functions that call a rewritten
signature, which must give its outputs); RESULT receives {"load_error": str
or None, "outputs": {key: {output: array}}, "errors": {key: str}}. Both are
pickles this package writes and reads in its own temporary folder.
"""

import os
import pickle
import sys


def output_arrays(outputs):
    """{name: array} of a signature's outputs; a SparseTensor or RaggedTensor
    output as its component tensors (NAME/0, NAME/1, ...), which compare as
    arrays do."""
    import tensorflow as tf

    arrays = {}
    for key, value in outputs.items():
        if isinstance(value, tf.Tensor):
            arrays[key] = value.numpy()
        else:
            for i, part in enumerate(tf.nest.flatten(value, expand_composites=True)):
                arrays[f"{key}/{i}"] = part.numpy()
    return arrays


def serve(model_dir, request, endpoints=None):
    import tensorflow as tf

    import tf_ctr_ops  # noqa: F401  (registers the fused ops the model may hold)
    from tf_ctr_ops._errors import summary

    result = {"load_error": None, "outputs": {}, "errors": {}}
    try:
        loaded = tf.saved_model.load(model_dir)
    except Exception as e:  # noqa: BLE001 - reported to the parent
        result["load_error"] = summary(e)
        return result
    for key, inputs in request.items():
        try:
            fn = loaded.signatures[key]
            specs = fn.structured_input_signature[1]
            feeds = {k: tf.constant(v, dtype=specs[k].dtype) for k, v in inputs.items()}
            result["outputs"][key] = output_arrays(fn(**feeds))
        except Exception as e:  # noqa: BLE001
            result["errors"][key] = summary(e)
            continue
        # Right after the signature, before another one changes the state it
        # reads (the rewrite takes only functions whose signature writes none).
        for name, (signature, feeds, outputs) in (endpoints or {}).items():
            if signature != key:
                continue
            try:
                differs = _endpoint_differs(loaded, name, key, feeds, outputs, inputs, result["outputs"][key])
            except Exception as e:  # noqa: BLE001
                differs = summary(e)
            if differs:
                result["errors"][key] = f"function {name!r}, which calls it, {differs}"
    return result


def _endpoint_differs(loaded, name, key, feeds, outputs, inputs, want):
    """Why function `name` of `loaded` does not return signature `key`'s
    outputs `want` on its `inputs`, or None."""
    import tensorflow as tf

    from tf_ctr_ops._compare import max_abs_diff

    specs = loaded.signatures[key].structured_input_signature[1]
    by_position = [tf.constant(inputs[k], dtype=specs[k].dtype) for k in tf.nest.flatten({k: k for k in specs})]
    fn = getattr(loaded, name)
    args = tf.nest.pack_sequence_as(fn.concrete_functions[0].structured_input_signature[0],
                                    [by_position[p] for p in feeds], expand_composites=True)
    got = tf.nest.flatten(fn(*args), expand_composites=True)
    for key_out, tensor in zip(outputs, got):
        if not max_abs_diff({key_out: want[key_out]}, {key_out: tensor.numpy()})[1]:
            return f"returns another {key_out!r}"
    return None


def main(argv):
    model_dir, request_path, result_path = argv
    with open(request_path, "rb") as f:
        request = pickle.load(f)
    result = serve(model_dir, request["inputs"], request["endpoints"])
    with open(result_path, "wb") as f:
        pickle.dump(result, f)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.exit(main(sys.argv[1:]))

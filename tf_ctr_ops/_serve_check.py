"""Loads a SavedModel in this (fresh) process and runs its signatures.

    python -m tf_ctr_ops._serve_check MODEL_DIR REQUEST.pkl RESULT.pkl

`optimize_saved_model` runs this in a new Python process on every model it
writes, before moving it to its destination: a model that loads and serves
only in the process that rewrote it (functions, tables or shapes that exist
only there) is caught here. REQUEST holds {signature key: {input: array}};
RESULT receives {"load_error": str or None, "outputs": {key: {output: array}},
"errors": {key: str}}. Both are pickles this package writes and reads in
its own temporary folder.
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


def serve(model_dir, request):
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
    return result


def main(argv):
    model_dir, request_path, result_path = argv
    with open(request_path, "rb") as f:
        request = pickle.load(f)
    result = serve(model_dir, request)
    with open(result_path, "wb") as f:
        pickle.dump(result, f)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.exit(main(sys.argv[1:]))

"""Loads the op library, refusing a TensorFlow it was not compiled against.

A custom-op library links against TF's C++ ABI, which changes between
releases; loading it into another TF fails with an undefined-symbol error or
worse. We compare versions first and raise a clear ImportError instead.
"""

import os

_LIB = None


def build_info():
    try:
        from tf_ctr_ops import _build_info
    except ImportError as e:
        raise ImportError(
            "tf_ctr_ops is not built: its native library is missing. Install it with "
            "`pip install --no-build-isolation .` from the source tree (importing "
            "the package from an unbuilt checkout does not work)."
        ) from e
    return _build_info


def check_tensorflow_version(installed, built):
    if installed != built:
        raise ImportError(
            f"tf_ctr_ops was built against TensorFlow {built}, but TensorFlow {installed} "
            f"is installed. Its op library only works with the exact TensorFlow it was "
            f"compiled with: install tensorflow=={built}, or rebuild tf_ctr_ops against "
            f"{installed} (pip install --no-build-isolation --force-reinstall .)."
        )


def load_op_library():
    global _LIB
    if _LIB is None:
        import tensorflow as tf

        info = build_info()
        check_tensorflow_version(tf.__version__, info.TF_VERSION)
        path = os.path.join(os.path.dirname(__file__), "_tf_ctr_ops.so")
        _LIB = tf.load_op_library(path)
    return _LIB

"""Loads the op library, refusing a TensorFlow it was not compiled against.

A custom-op library links against TF's C++ ABI, which changes between
releases; loading it into another TF fails with an undefined-symbol error or
worse. We compare versions first and raise a clear ImportError instead.
"""

import os

_LIB = None
_CLIB = None


def _not_built_error():
    here = os.path.dirname(os.path.abspath(__file__))
    return ImportError(
        f"tf_ctr_ops was imported from {here}, which holds no built op library. If this is "
        "the source tree, Python found it before the installed package because it runs from "
        "the checkout's root (python -m puts the current directory first): run from another "
        "directory, use the `tf-ctr-ops` command, or build in place with "
        "`python setup.py build_ext --inplace`. Otherwise install the package: "
        "pip install -r requirements-build.txt && pip install --no-build-isolation ."
    )


def build_info():
    try:
        from tf_ctr_ops import _build_info
    except ImportError as e:
        raise _not_built_error() from e
    return _build_info


def check_tensorflow_version(installed, built):
    if installed != built:
        raise ImportError(
            f"tf_ctr_ops was built against TensorFlow {built}, but TensorFlow {installed} "
            f"is installed. Its op library only works with the exact TensorFlow it was "
            f"compiled with: install tensorflow=={built}, or rebuild tf_ctr_ops against "
            f"{installed} (pip install --no-build-isolation --force-reinstall .)."
        )


def library_path():
    return os.path.join(os.path.dirname(__file__), "_tf_ctr_ops.so")


def load_op_library():
    global _LIB
    if _LIB is None:
        import tensorflow as tf

        info = build_info()
        check_tensorflow_version(tf.__version__, info.TF_VERSION)
        path = library_path()
        if not os.path.exists(path):
            raise _not_built_error()
        _LIB = tf.load_op_library(path)
    return _LIB


def c_library():
    """The op library as a ctypes handle, for its few C entry points
    (loaded by TensorFlow first, so this shares TensorFlow's copy)."""
    global _CLIB
    if _CLIB is None:
        import ctypes

        load_op_library()
        _CLIB = ctypes.CDLL(library_path())
    return _CLIB

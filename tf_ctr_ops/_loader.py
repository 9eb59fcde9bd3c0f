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
        check_whole_library(path)
        lib = tf.load_op_library(path)
        if not hasattr(lib, "ctr_embedding_lookup"):
            raise ImportError(
                f"TensorFlow found no ops in {path}: another copy of the tf_ctr_ops op library (or this one "
                "under another path) was loaded into this process first, and TensorFlow keeps the ops of the "
                "first. Import tf_ctr_ops before any tf.load_op_library of its library, and load one copy only.")
        _LIB = lib
    return _LIB


def check_whole_library(path):
    """An ImportError for a library cut short (an interrupted copy or
    download): the dynamic loader maps the parts its ELF header names and
    the process dies of SIGBUS where the file ends before them."""
    import struct

    size = os.path.getsize(path)
    with open(path, "rb") as f:
        header = f.read(64)
        if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
            return  # not a 64-bit little-endian ELF file: the loader refuses it itself, cleanly
        phoff, shoff = struct.unpack_from("<QQ", header, 32)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", header, 54)
        needed = max(phoff + phentsize * phnum, shoff + shentsize * shnum)
        if needed <= size:
            f.seek(phoff)
            table = f.read(phentsize * phnum)
            for i in range(phnum if len(table) == phentsize * phnum else 0):
                p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", table, i * phentsize)
                if p_type == 1:  # PT_LOAD
                    needed = max(needed, p_offset + p_filesz)
    if needed > size:
        raise ImportError(f"{path} is cut short ({size} bytes; its ELF header needs {needed}): reinstall "
                          "tf_ctr_ops, or rebuild it (python setup.py build_ext --inplace)")


def c_library():
    """The op library as a ctypes handle, for its few C entry points
    (loaded by TensorFlow first, so this shares TensorFlow's copy)."""
    global _CLIB
    if _CLIB is None:
        import ctypes

        load_op_library()
        _CLIB = ctypes.CDLL(library_path())
    return _CLIB

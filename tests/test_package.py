"""Packaging: the build pins its TensorFlow, and a mismatch is a clear ImportError."""

import importlib.metadata
import os
import re
import subprocess
import sys

import pytest
import tensorflow as tf

import tf_ctr_ops
from conftest import fresh_process_env
from tf_ctr_ops import _build_info, _loader


def test_build_matches_running_tensorflow():
    assert _build_info.TF_VERSION == tf.__version__


def test_version_mismatch_is_an_import_error_naming_both_versions():
    with pytest.raises(ImportError, match=r"built against TensorFlow 2\.21\.0.*TensorFlow 2\.20\.1 is installed"):
        _loader.check_tensorflow_version("2.20.1", "2.21.0")
    _loader.check_tensorflow_version("2.21.0", "2.21.0")  # no error when they agree


def test_installed_metadata_pins_tensorflow():
    try:
        requires = importlib.metadata.requires("tf-ctr-ops") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("tf-ctr-ops is not installed as a distribution (in-place build)")
    pins = [r for r in requires if re.match(r"tensorflow\b", r)]
    assert pins == [f"tensorflow=={_build_info.TF_VERSION}"], requires


def test_public_api_is_exported():
    for name in ("embedding_lookup_sparse", "safe_embedding_lookup_sparse", "sparse_embedding", "hash_embedding",
                 "pack_strings", "string_embedding", "multi_string_embedding"):
        assert callable(getattr(tf_ctr_ops, name))
    assert {"SparseEmbedding", "HashEmbedding", "StringEmbedding", "MultiStringEmbedding"} <= set(
        tf_ctr_ops.layers.__all__)


def test_rewrite_is_reached_from_a_bare_import(tmp_path):
    # `import tf_ctr_ops; tf_ctr_ops.rewrite.enable()`, in a process that
    # imported nothing else of the package; unknown names stay errors.
    code = ("import sys, tf_ctr_ops; assert 'tf_ctr_ops.rewrite' not in sys.modules; "
            "print(callable(tf_ctr_ops.rewrite.enable)); tf_ctr_ops.no_such_name")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env=fresh_process_env(), timeout=300)
    assert proc.stdout.strip() == "True", proc.stderr[-2000:]
    assert "AttributeError: module 'tf_ctr_ops' has no attribute 'no_such_name'" in proc.stderr, proc.stderr[-2000:]


def _run(code, cwd):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd,
                          env=fresh_process_env(), timeout=300)


@pytest.mark.parametrize("keep", [100, 100_000, "most"])
def test_a_library_cut_short_is_an_import_error_not_a_bus_error(tmp_path, keep):
    # dlopen mapped the parts the ELF header names past the file's end: SIGBUS.
    import shutil

    shutil.copytree(os.path.dirname(_loader.library_path()), tmp_path / "tf_ctr_ops")
    lib = tmp_path / "tf_ctr_ops" / "_tf_ctr_ops.so"
    size = lib.stat().st_size
    with open(lib, "r+b") as f:
        f.truncate(size - 4096 if keep == "most" else keep)
    proc = _run("import tf_ctr_ops", tmp_path)
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert f"_tf_ctr_ops.so is cut short ({lib.stat().st_size} bytes; its ELF header needs" in proc.stderr


def test_a_whole_library_passes_the_length_check():
    _loader.check_whole_library(_loader.library_path())


def test_a_second_copy_of_the_library_neither_aborts_the_process_nor_leaves_empty_ops(tmp_path):
    # Its optimizer registration aborted the process (a name registered
    # twice); loaded first, it left tf_ctr_ops a module without ops, whose
    # first call was an AttributeError deep inside. Loaded after, its kernels
    # are TF's error of kernels registered twice (TF has no way to refuse them).
    import shutil

    copy = tmp_path / "copy" / "_tf_ctr_ops.so"
    copy.parent.mkdir()
    shutil.copyfile(_loader.library_path(), copy)
    after = _run(f"import tensorflow as tf, tf_ctr_ops; tf.load_op_library({str(copy)!r}); print('loaded'); "
                 "tf_ctr_ops.sparse_embedding(tf.ones([4, 2]), tf.ragged.constant([[1, 2]], tf.int64))", tmp_path)
    assert after.returncode == 1 and after.stdout.strip() == "loaded", (after.returncode, after.stderr[-2000:])
    assert "InvalidArgumentError: Multiple OpKernel registrations match" in after.stderr
    first = _run(f"import tensorflow as tf; tf.load_op_library({str(copy)!r}); import tf_ctr_ops", tmp_path)
    assert first.returncode == 1, (first.returncode, first.stderr[-2000:])
    assert "ImportError: TensorFlow found no ops in" in first.stderr and "Import tf_ctr_ops before" in first.stderr

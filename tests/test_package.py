"""Packaging: the build pins its TensorFlow, and a mismatch is a clear ImportError."""

import importlib.metadata
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

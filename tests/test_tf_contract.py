"""TensorFlow's own tests of embedding_lookup_sparse / safe_embedding_lookup_sparse,
run against the fused drop-ins (issue #24).

TF 2.21's tensorflow/python/kernel_tests/nn_ops/embedding_ops_test.py lives
in tests/third_party/ (see tests/third_party/README.md). Its
EmbeddingLookupSparseTest and SafeEmbeddingLookupSparseTest run here as they
are, except that the `embedding_ops` module they call is swapped, for that
file only, for one whose lookups are ours:

  embedding_ops.embedding_lookup_sparse           -> tf_ctr_ops.compat.v1.embedding_lookup_sparse
  embedding_ops.safe_embedding_lookup_sparse      -> tf_ctr_ops.compat.v1.safe_embedding_lookup_sparse
  embedding_ops.safe_embedding_lookup_sparse_v2   -> tf_ctr_ops.safe_embedding_lookup_sparse

TensorFlow itself is not patched. The tests TF's contract keeps us from
passing are listed in KNOWN_EXCEPTIONS with the reason; they run as expected
failures, so one that starts passing fails the suite until it is removed.
"""

import importlib.util
import types
import unittest
from pathlib import Path

import pytest
from tensorflow.python.ops import embedding_ops as tf_embedding_ops

import tf_ctr_ops

TF_TEST_FILE = Path(__file__).resolve().parent / "third_party" / "tf_embedding_ops_test.py"

# test name -> why TF's contract and ours differ there. Names are those absl's
# parameterized gives (method name + index into the parameter product).
KNOWN_EXCEPTIONS = {}


def _load_tf_tests():
    if not TF_TEST_FILE.exists():
        pytest.skip(f"TensorFlow's embedding_ops_test.py is absent: place TF 2.21's "
                    f"tensorflow/python/kernel_tests/nn_ops/embedding_ops_test.py at {TF_TEST_FILE} "
                    "(tests/third_party/README.md)", allow_module_level=True)
    spec = importlib.util.spec_from_file_location("tf_embedding_ops_test", TF_TEST_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.embedding_ops = types.SimpleNamespace(
        embedding_lookup_sparse=tf_ctr_ops.compat.v1.embedding_lookup_sparse,
        safe_embedding_lookup_sparse=tf_ctr_ops.compat.v1.safe_embedding_lookup_sparse,
        safe_embedding_lookup_sparse_v2=tf_ctr_ops.safe_embedding_lookup_sparse,
        # What the two classes do not call stays TF's own.
        embedding_lookup=tf_embedding_ops.embedding_lookup,
        _embedding_lookup_and_transform=tf_embedding_ops._embedding_lookup_and_transform,
    )
    return module


def _with_known_exceptions(cls):
    tests = {name for name in dir(cls) if name.startswith("test")}
    for name in KNOWN_EXCEPTIONS:
        if name in tests:
            setattr(cls, name, unittest.expectedFailure(getattr(cls, name)))
    return cls


_tf = _load_tf_tests()


@_with_known_exceptions
class TestTFEmbeddingLookupSparse(_tf.EmbeddingLookupSparseTest):
    """TF's EmbeddingLookupSparseTest against tf_ctr_ops.compat.v1.embedding_lookup_sparse."""


@_with_known_exceptions
class TestTFSafeEmbeddingLookupSparse(_tf.SafeEmbeddingLookupSparseTest):
    """TF's SafeEmbeddingLookupSparseTest against tf_ctr_ops' safe lookups (v1 and v2)."""


def _tf_test_names(cls):
    # test_session is tf.test.TestCase's deprecated session helper, skipped as "Not a test."
    return {n for n in dir(cls) if n.startswith("test") and n != "test_session"}


def test_all_of_tfs_tests_run():
    # TF 2.21's file: 306 EmbeddingLookupSparseTest cases (192 forward, 12 missing
    # ids, 96 gradient checks, 4 shape errors, 1 type error, 1 variable
    # gradient) and 25 SafeEmbeddingLookupSparseTest cases.
    assert len(_tf_test_names(TestTFEmbeddingLookupSparse)) == 306
    assert len(_tf_test_names(TestTFSafeEmbeddingLookupSparse)) == 25


def test_known_exceptions_name_real_tests():
    names = _tf_test_names(TestTFEmbeddingLookupSparse) | _tf_test_names(TestTFSafeEmbeddingLookupSparse)
    assert set(KNOWN_EXCEPTIONS) <= names

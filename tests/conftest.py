"""Shared fixtures: quiet TF logs, seeded RNG, and the real CTR samples."""

import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# Every Grappler rewrite the tests run compares its incrementally updated
# graph index with one built from scratch after each change, and aborts on a
# difference (cc/grappler/pattern.cc).
os.environ.setdefault("TF_CTR_OPS_CHECK_INDEX", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# tests/third_party/ holds third-party test code that tests/test_tf_contract.py
# runs against the drop-ins; collected on its own it would test TensorFlow
# itself. (A conftest.py there would shadow this one: both import as
# "conftest".)
collect_ignore_glob = ["third_party/*.py"]

DATA_DIR = Path(os.environ.get("TF_CTR_OPS_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"))


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# Hypothesis profiles (tests/test_properties.py). "ci" is the default; "slow"
# (100k examples per property, run before each release) is chosen by `-m slow`,
# TF_CTR_OPS_HYPOTHESIS_PROFILE=slow or hypothesis' own --hypothesis-profile=slow.
settings.register_profile("ci", max_examples=int(os.environ.get("TF_CTR_OPS_HYPOTHESIS_EXAMPLES", 200)),
                          deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("slow", parent=settings.get_profile("ci"), max_examples=100_000)


def _wants_slow(config):
    markexpr = config.getoption("markexpr", "") or ""
    return "slow" in markexpr and "not slow" not in markexpr


def pytest_configure(config):
    config.ctr_hypothesis_profile = (config.getoption("hypothesis_profile", None)
                                     or os.environ.get("TF_CTR_OPS_HYPOTHESIS_PROFILE")
                                     or ("slow" if _wants_slow(config) else "ci"))
    settings.load_profile(config.ctr_hypothesis_profile)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    # Under `-m slow` the property tests are release tests: mark them slow so
    # that the expression selects them (this runs before -m deselects). With
    # the profile chosen otherwise they stay unmarked, so they run as usual.
    if _wants_slow(config):
        for item in items:
            if item.get_closest_marker("property"):
                item.add_marker(pytest.mark.slow)


def random_sparse(rng, batch, width, make, dtype=None, empty_rows=0.2):
    """A SparseTensor [batch, width] in row-major order: each row left empty
    with probability `empty_rows`, else 1..width values make(rng) in its first
    columns. dtype: the values' (None: string for str values, else int64)."""
    import tensorflow as tf

    indices, values = [], []
    for b in range(batch):
        if rng.random() < empty_rows:
            continue
        for j in range(int(rng.integers(1, width + 1))):
            indices.append([b, j])
            values.append(make(rng))
    if dtype is None:
        dtype = tf.string if values and isinstance(values[0], str) else tf.int64
    flat = np.array(values, object if dtype == tf.string else np.int64).reshape(-1)
    return tf.SparseTensor(tf.constant(np.array(indices, np.int64).reshape(-1, 2)), tf.constant(flat, dtype),
                           [batch, width])


def data_file(name):
    """Path of a sample in ../shared/data, or a skip naming what is missing."""
    path = DATA_DIR / name
    if not path.exists():
        pytest.skip(f"real-data sample {path} is absent (set TF_CTR_OPS_DATA to its folder)")
    return path


def fresh_process_env():
    """Environment for a fresh Python process that imports the same tf_ctr_ops.

    The package's parent directory goes first on PYTHONPATH, so an in-place
    build and an installed package are both found; run such processes with a
    cwd outside the checkout, whose unbuilt source tree would shadow them.
    """
    import tf_ctr_ops

    parent = str(Path(tf_ctr_ops.__file__).resolve().parents[1])
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
                PYTHONPATH=os.pathsep.join(filter(None, [parent, os.environ.get("PYTHONPATH")])))


_FRESH_SERVE = """
import pickle, sys
import tensorflow as tf
import tf_ctr_ops  # noqa: F401
model_dir, key, request, result = sys.argv[1:]
fn = tf.saved_model.load(model_dir).signatures[key]
specs = fn.structured_input_signature[1]
with open(request, "rb") as f:
    inputs = pickle.load(f)
out = fn(**{k: tf.constant(v, dtype=specs[k].dtype) for k, v in inputs.items()})
with open(result, "wb") as f:
    # A SparseTensor or RaggedTensor output as the list of its components.
    pickle.dump({k: v.numpy() if isinstance(v, tf.Tensor) else
                 [p.numpy() for p in tf.nest.flatten(v, expand_composites=True)] for k, v in out.items()}, f)
"""


def serve_in_fresh_process(model_dir, key, inputs, work_dir):
    """Outputs of signature `key` of the SavedModel at `model_dir` on `inputs`,
    loaded and run in a new Python process (independent of the package's own
    check); fails the test with the process' output when it cannot serve."""
    import pickle
    import subprocess
    import sys

    request, result = Path(work_dir) / f"{key}_request.pkl", Path(work_dir) / f"{key}_result.pkl"
    request.write_bytes(pickle.dumps(inputs))
    proc = subprocess.run([sys.executable, "-c", _FRESH_SERVE, str(Path(model_dir).resolve()), key, str(request),
                           str(result)], cwd=work_dir, env=fresh_process_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return pickle.loads(result.read_bytes())

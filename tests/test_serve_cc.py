"""Serving outside Python: examples/serve_cc (TensorFlow's C API, linked
against the pip wheel's libraries) loads the op library and a rewritten
SavedModel and serves a batch; its output must be Python's."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import tf_ctr_ops
from real_models import save_split_safe_lookup_model
from tf_ctr_ops import _saved_model_files, rewrite

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "serve_cc"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """examples/serve_cc/serve, built by its build.sh against this TensorFlow."""
    out = tmp_path_factory.mktemp("serve_cc") / "serve"
    build = subprocess.run(["bash", str(EXAMPLE / "build.sh"), str(out)], env=dict(os.environ, PYTHON=sys.executable),
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    return out


def test_cc_server_serves_the_rewritten_model_as_python_does(tmp_path, server):
    src, dst = tmp_path / "src", tmp_path / "dst"
    save_split_safe_lookup_model(str(src))
    report = rewrite.optimize_saved_model(src, dst, runs=1)
    assert "CtrStringEmbedding" in {m["fused_op"] for m in report.signatures["serving_default"].matches}
    signature = _saved_model_files.serving_meta_graph(_saved_model_files.read(dst)).signature_def["serving_default"]
    input_name, output_name = signature.inputs["x"].name, signature.outputs["y"].name
    strings = ["a|b|c", "", "a||d", "zz", "b|b"]
    (tmp_path / "strings.txt").write_text("\n".join(strings) + "\n")
    op_library = Path(tf_ctr_ops.__file__).with_name("_tf_ctr_ops.so")
    served = subprocess.run([str(server), str(op_library), str(dst), input_name, output_name,
                             str(tmp_path / "strings.txt"), "3"], capture_output=True, text=True, timeout=300)
    assert served.returncode == 0, served.stdout + served.stderr
    assert "median latency" in served.stderr
    got = np.array([[float(v) for v in line.split()] for line in served.stdout.splitlines()], np.float32)

    python = tf.saved_model.load(str(dst)).signatures["serving_default"]
    want = python(x=tf.constant(strings))["y"].numpy()
    np.testing.assert_array_equal(got, want)  # printed with 9 significant digits: float32 round-trips


def test_cc_server_without_the_op_library_fails_clearly(tmp_path, server):
    served = subprocess.run([str(server), str(tmp_path / "missing.so"), str(tmp_path), "x:0", "y:0",
                             str(tmp_path / "none.txt")], capture_output=True, text=True, timeout=120)
    assert served.returncode == 1 and "serve: loading the op library" in served.stderr

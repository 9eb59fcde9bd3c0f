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
from tf_ctr_ops import rewrite

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "serve_cc"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """examples/serve_cc/serve, built by its build.sh against this TensorFlow."""
    out = tmp_path_factory.mktemp("serve_cc") / "serve"
    build = subprocess.run(["bash", str(EXAMPLE / "build.sh"), str(out)], env=dict(os.environ, PYTHON=sys.executable),
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    return out


OP_LIBRARY = Path(tf_ctr_ops.__file__).with_name("_tf_ctr_ops.so")


def _serve(server, model, signature, inputs_file, runs="3"):
    return subprocess.run([str(server), str(OP_LIBRARY), str(model), signature, str(inputs_file), runs],
                          capture_output=True, text=True, timeout=300)


def _rows(served):
    assert served.returncode == 0, served.stdout + served.stderr
    assert "median latency" in served.stderr
    return np.array([[float(v) for v in line.split()] for line in served.stdout.splitlines()], np.float32)


def test_cc_server_serves_the_rewritten_model_as_python_does(tmp_path, server):
    src, dst = tmp_path / "src", tmp_path / "dst"
    save_split_safe_lookup_model(str(src))
    report = rewrite.optimize_saved_model(src, dst, runs=1)
    assert "CtrStringEmbedding" in {m["fused_op"] for m in report.signatures["serving_default"].matches}
    strings = ["a|b|c", "", "a||d", "zz", "b|b"]
    # Lines ended by "\r\n" read as those ended by "\n": the "\r" is no part of the string.
    (tmp_path / "strings.txt").write_bytes(("\r\n".join(strings) + "\r\n").encode())
    got = _rows(_serve(server, dst, "serving_default", tmp_path / "strings.txt"))

    python = tf.saved_model.load(str(dst)).signatures["serving_default"]
    want = python(x=tf.constant(strings))["y"].numpy()
    np.testing.assert_array_equal(got, want)  # printed with 9 significant digits: float32 round-trips


def test_cc_server_serves_an_estimator_model_on_tf_examples_from_a_tfrecord_file(tmp_path, server):
    # Serialized tf.Examples hold newlines: they come one per TFRecord record.
    from tf_ctr_ops.bench.models import save_tf1_feature_column_model, tf_examples

    src, dst = tmp_path / "src", tmp_path / "dst"
    save_tf1_feature_column_model(str(src), str(tmp_path))
    rewrite.optimize_saved_model(src, dst, runs=1, serving_device="cpu")
    examples = tf_examples(np.random.default_rng(5), 16)
    assert any(b"\n" in e for e in examples)
    with tf.io.TFRecordWriter(str(tmp_path / "batch.tfrecord")) as writer:
        for example in examples:
            writer.write(example)
    (tmp_path / "batch.tfrecords").write_bytes((tmp_path / "batch.tfrecord").read_bytes())  # either suffix
    for signature, output, file in (("predict", "logits", "batch.tfrecord"), ("serving_default", "scores",
                                                                               "batch.tfrecords")):
        got = _rows(_serve(server, dst, f"{signature}:{output}", tmp_path / file))
        python = tf.saved_model.load(str(dst)).signatures[signature]
        want = python(tf.constant(examples))[output].numpy()
        np.testing.assert_array_equal(got, want.reshape(len(examples), -1))


def test_cc_server_names_what_the_model_has_when_asked_for_what_it_lacks(tmp_path, server):
    src = tmp_path / "src"
    save_split_safe_lookup_model(str(src))
    (tmp_path / "strings.txt").write_text("a|b\n")
    (tmp_path / "cut.tfrecord").write_bytes(b"\x05\x00\x00")
    for signature, inputs, message in (
            ("predict", "strings.txt", "the SavedModel has no signature predict; its signatures: serving_default"),
            ("serving_default:z", "strings.txt", "signature serving_default has no output z; its outputs: y"),
            ("serving_default", "cut.tfrecord", "is not a TFRecord file")):
        served = _serve(server, src, signature, tmp_path / inputs)
        assert served.returncode == 1 and message in served.stderr, served.stderr


def test_cc_server_refuses_a_batch_the_signature_does_not_admit_as_python_does(tmp_path, server):
    m = tf.Module()
    m.f = tf.function(lambda x: {"y": tf.strings.to_number(x)}, input_signature=[tf.TensorSpec([4], tf.string)])
    tf.saved_model.save(m, str(tmp_path / "fixed"), signatures=m.f)
    (tmp_path / "two.txt").write_text("1\n2\n")
    served = _serve(server, tmp_path / "fixed", "serving_default", tmp_path / "two.txt")
    assert served.returncode == 1, served.stdout + served.stderr
    assert "signature serving_default takes a batch of 4 strings;" in served.stderr and "holds 2" in served.stderr
    (tmp_path / "four.txt").write_text("1\n2\n3\n4.5\n")
    np.testing.assert_array_equal(_rows(_serve(server, tmp_path / "fixed", "serving_default", tmp_path / "four.txt")),
                                  [[1], [2], [3], [4.5]])


def test_cc_server_without_the_op_library_fails_clearly(tmp_path, server):
    served = subprocess.run([str(server), str(tmp_path / "missing.so"), str(tmp_path), "serving_default",
                             str(tmp_path / "none.txt")], capture_output=True, text=True, timeout=120)
    assert served.returncode == 1 and "serve: loading the op library" in served.stderr

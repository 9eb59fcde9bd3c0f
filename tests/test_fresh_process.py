"""The rewrite's fresh-process check, forked from a pristine server
(tf_ctr_ops/_fresh_process.py): same results as a new process, no child left
after a time-out or a kill, and a new process when the server cannot serve."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from conftest import fresh_process_env
from tf_ctr_ops import _fresh_process, rewrite

pytestmark = pytest.mark.saved_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    class Doubler(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
        def double(self, x):
            return {"y": 2.0 * x}

    path = str(tmp_path_factory.mktemp("doubler"))
    module = Doubler()
    tf.saved_model.save(module, path, signatures={"serving_default": module.double})
    return path


INPUTS = {"serving_default": {"x": np.array([1.0, -2.5], np.float32)}}


def alive(pid):
    """Whether `pid` runs (a zombie no longer does)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def new_process_only(monkeypatch):
    """Checks from here on run as new processes: the server is held, as by
    another thread's check."""
    busy = _fresh_process.Server()
    busy.lock.acquire()
    monkeypatch.setattr(rewrite, "_CHECK_SERVER", busy)


def test_checks_forked_by_one_server_give_what_a_new_process_gives(model_dir, monkeypatch):
    first = rewrite._serve_in_fresh_process(model_dir, INPUTS)
    server = rewrite._CHECK_SERVER.proc
    assert server is not None and server.poll() is None
    second = rewrite._serve_in_fresh_process(model_dir, INPUTS)
    assert rewrite._CHECK_SERVER.proc is server, "each check started a server"
    new_process_only(monkeypatch)
    plain = rewrite._serve_in_fresh_process(model_dir, INPUTS)
    for result in (first, second, plain):
        assert result["load_error"] is None and not result["errors"], result
        np.testing.assert_array_equal(result["outputs"]["serving_default"]["y"], [2.0, -5.0])


def test_a_model_that_does_not_load_says_so_as_from_a_new_process(tmp_path, monkeypatch):
    forked = rewrite._serve_in_fresh_process(str(tmp_path), INPUTS)["load_error"]
    new_process_only(monkeypatch)
    assert forked == rewrite._serve_in_fresh_process(str(tmp_path), INPUTS)["load_error"]
    assert "SavedModel file does not exist" in forked


def _check_blocked_on_a_fifo(tmp_path):
    """A check whose child blocks opening its request (a FIFO nobody writes):
    (argv, folder) for Server.run and _Termination.check."""
    folder = tmp_path / "check"
    folder.mkdir()
    os.mkfifo(folder / "request.pkl")
    return [str(tmp_path), str(folder / "request.pkl"), str(folder / "result.pkl")], str(folder)


def test_a_check_past_its_time_limit_is_killed_and_the_server_serves_on(tmp_path, model_dir):
    argv, folder = _check_blocked_on_a_fifo(tmp_path)
    server, pids = _fresh_process.Server(), []
    try:
        server.start(fresh_process_env())
        server.run([model_dir, "/nonexistent", str(tmp_path / "r.pkl")], str(tmp_path), fresh_process_env(), 120, pids.append)  # warm
        with pytest.raises(subprocess.TimeoutExpired):
            server.run(argv, folder, fresh_process_env(), 3, pids.append)
        assert len(pids) == 2 and not alive(pids[1]), "the timed-out child still runs"
        proc = server.proc
        code, out, err = server.run([model_dir, "/nonexistent", str(tmp_path / "r.pkl")], str(tmp_path), fresh_process_env(), 120,
                                    pids.append)
        assert server.proc is proc and code != 0 and "/nonexistent" in err, (code, err)
    finally:
        server.stop()


_KILLED_DURING_A_FORKED_CHECK = """
import os, signal, sys, threading, time
from tf_ctr_ops import rewrite
model_dir, folder, pid_file = sys.argv[1:]
signal.signal(signal.SIGTERM, rewrite.exit_on_signal)
rewrite._start_check_server()
def kill_once_the_child_runs():
    while rewrite._TERMINATION.forked is None or rewrite._TERMINATION.forked[1] is None:
        time.sleep(0.05)
    open(pid_file, "w").write(str(rewrite._TERMINATION.forked[1]))
    time.sleep(1)
    os.kill(os.getpid(), signal.SIGTERM)
threading.Thread(target=kill_once_the_child_runs, daemon=True).start()
rewrite._TERMINATION.check([model_dir, os.path.join(folder, "request.pkl"), os.path.join(folder, "result.pkl")],
                           folder, rewrite._fresh_process_env())
time.sleep(60)
"""


def test_a_kill_during_a_forked_check_ends_its_child(tmp_path):
    argv, folder = _check_blocked_on_a_fifo(tmp_path)
    proc = subprocess.run([sys.executable, "-c", _KILLED_DURING_A_FORKED_CHECK, argv[0], folder,
                           str(tmp_path / "pid")], cwd=tmp_path, env=fresh_process_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-2000:]
    pid = int((tmp_path / "pid").read_text())
    deadline = time.monotonic() + 10  # the server reaps it, or its death (PDEATHSIG) ends it
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid), "the forked child still runs"


def test_a_server_that_cannot_start_leaves_the_check_to_a_new_process(model_dir, monkeypatch):
    def start_a_server_that_dies(self, env):
        self.proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)
        self.buffer = b""

    server = _fresh_process.Server()
    monkeypatch.setattr(_fresh_process.Server, "start", start_a_server_that_dies)
    monkeypatch.setattr(rewrite, "_CHECK_SERVER", server)
    result = rewrite._serve_in_fresh_process(model_dir, INPUTS)
    assert result["load_error"] is None, result
    np.testing.assert_array_equal(result["outputs"]["serving_default"]["y"], [2.0, -5.0])
    assert server.proc is None, "the dead server was not let go"


def test_only_variables_the_imports_read_start_another_server(model_dir, monkeypatch):
    # The environment differs from check to check (pytest's PYTEST_CURRENT_TEST,
    # say): a server per check would pay the imports each time again.
    rewrite._serve_in_fresh_process(model_dir, INPUTS)
    server = rewrite._CHECK_SERVER.proc
    monkeypatch.setenv("CTR_TEST_PER_CALL", "1")
    rewrite._serve_in_fresh_process(model_dir, INPUTS)
    assert rewrite._CHECK_SERVER.proc is server, "a variable no import reads started another server"
    monkeypatch.setenv("TF_CTR_TEST_READ_AT_IMPORT", "1")
    result = rewrite._serve_in_fresh_process(model_dir, INPUTS)
    assert rewrite._CHECK_SERVER.proc is not server and server.poll() is not None
    np.testing.assert_array_equal(result["outputs"]["serving_default"]["y"], [2.0, -5.0])

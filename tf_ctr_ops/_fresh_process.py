"""Fresh processes for the rewrite's check, forked from a pristine server.

The rewrite loads and runs every model it writes in a process that has done
nothing but import TensorFlow and tf_ctr_ops (tf_ctr_ops/_serve_check.py),
so that a model which works only in the process that rewrote it is caught.
Starting Python and importing TensorFlow costs about 5 s of CPU, most of a
small model's check, and a rewrite that drops patterns checks several models.

So a server process imports them once and forks one child per check. The
child is as fresh as a new interpreter that ran the same imports: the server
never loads a model, runs an op or creates TensorFlow's runtime (no eager
context, no thread pools), which is also what makes forking it safe. The
server lives as long as the process that started it (it ends when its
requests pipe closes), and the rewrite starts it before its own work, so that
the imports overlap the rewrite.

Protocol, one JSON line each way: the client sends {"argv", "cwd", "stdout",
"stderr"}; the server answers {"pid"} once the child is forked and
{"returncode"} (subprocess's convention) once it ended.

    python -m tf_ctr_ops._fresh_process     # the server; the client is Server
"""

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time


class ServerGone(Exception):
    """The server ended (or never started): the check runs as a plain child."""


class Server:
    """The client side: one server per environment, one check at a time."""

    def __init__(self):
        self.proc = None
        self.env_key = None
        self.buffer = b""
        self.lock = threading.Lock()

    def start(self, env):
        """Starts the server for `env` unless one runs whose imports read the
        same variables (see _import_time_variables)."""
        key = (sys.executable, _import_time_variables(env))
        if self.proc is not None and self.proc.poll() is None and self.env_key == key:
            return
        self.stop()
        # cwd outside any checkout: its unbuilt source tree would shadow the package.
        self.proc = subprocess.Popen([sys.executable, "-m", "tf_ctr_ops._fresh_process"], cwd=tempfile.gettempdir(),
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL)
        self.env_key, self.buffer = key, b""

    def stop(self):
        if self.proc is None:
            return
        with contextlib.suppress(OSError):
            self.proc.stdin.close()  # the server's loop ends
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        self.proc = None

    @contextlib.contextmanager
    def claimed(self):
        """The server for this thread's check, or None when another thread's
        check holds it or the system is not Linux (the check then runs as a
        plain child: forking a process that loaded TensorFlow is Linux's)."""
        if not sys.platform.startswith("linux") or not self.lock.acquire(blocking=False):
            yield None
            return
        try:
            yield self
        finally:
            self.lock.release()

    def run(self, argv, cwd, env, timeout, on_pid):
        """(returncode, stdout, stderr) of `python -m tf_ctr_ops._serve_check
        ARGV` forked by the server in `cwd`; on_pid(pid) is called once it is
        forked. Raises subprocess.TimeoutExpired past `timeout` seconds (the
        child killed) and ServerGone when the server cannot take it."""
        self.start(env)
        deadline = time.monotonic() + timeout
        out, err = os.path.join(cwd, "check.stdout"), os.path.join(cwd, "check.stderr")
        pid = None
        try:
            try:
                self.proc.stdin.write((json.dumps({"argv": argv, "cwd": cwd, "env": dict(env), "stdout": out,
                                                   "stderr": err}) + "\n").encode())
                self.proc.stdin.flush()
            except OSError:
                raise ServerGone() from None
            pid = self._answer(deadline)["pid"]
            on_pid(pid)
            code = self._answer(deadline)["returncode"]
        except BaseException as e:  # a time-out, Ctrl-C in a program of the caller's: no child left running
            self.abandon(pid)
            if isinstance(e, TimeoutError):
                raise subprocess.TimeoutExpired(["python", "-m", "tf_ctr_ops._serve_check", *argv], timeout) from None
            raise
        return code, _read(out), _read(err)

    def abandon(self, pid):
        """Kills the check's child `pid` (None: not forked yet, or unknown)
        and waits until the server reaped it; a server that does not answer
        is stopped (a child not yet forked dies with it: see _child)."""
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                self._answer(time.monotonic() + 10)
                return
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc.stdout.close()
            self.proc = None

    def _answer(self, deadline):
        """The server's next JSON line; TimeoutError past `deadline`."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError()
            chunk = os.read(fd, 4096)
            if not chunk:
                raise ServerGone()
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)


# Variables that Python, the dynamic loader, TensorFlow and its math
# libraries read while the server imports them: another value starts another
# server. The child gets every other variable as the check asked for it.
_IMPORT_TIME_PREFIXES = ("PYTHON", "LD_", "TF_", "TENSORFLOW", "KERAS", "CUDA", "NVIDIA", "XLA_", "OMP_", "KMP_",
                         "MKL", "OPENBLAS", "DNNL", "ONEDNN", "HOME", "PATH", "TMP", "TEMP")


def _import_time_variables(env):
    return tuple(sorted((k, v) for k, v in env.items() if k.upper().startswith(_IMPORT_TIME_PREFIXES)))


def _read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _die_with_parent():
    """The child gets SIGKILL when the server ends (Linux; elsewhere a no-op):
    a server killed mid-check leaves no check running."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _child(job, protocol_fds, server_pid):
    """In the forked child: runs the check as `python -m
    tf_ctr_ops._serve_check ARGV` would, and exits with its status."""
    code = 1
    try:
        _die_with_parent()
        if os.getppid() != server_pid:  # the server ended before the line above
            os._exit(1)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        for fd in protocol_fds:
            os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        for fd, path in ((1, job["stdout"]), (2, job["stderr"])):
            f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(f, fd)
            os.close(f)
        os.environ.clear()
        os.environ.update(job["env"])
        os.chdir(job["cwd"])
        from tf_ctr_ops import _serve_check

        code = _serve_check.main(job["argv"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - reported on the child's stderr, as a plain child's would be
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve(requests, replies):
    """The server's loop: one forked child per request line, until EOF."""
    protocol_fds, server_pid = (requests.fileno(), replies.fileno()), os.getpid()
    for line in requests:
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(job, protocol_fds, server_pid)
        replies.write(json.dumps({"pid": pid}) + "\n")
        replies.flush()
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")
        replies.flush()


def main():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    # The protocol keeps its own descriptors: what an import prints on
    # stdout must not land in the replies.
    requests = os.fdopen(os.dup(0), "r")
    replies = os.fdopen(os.dup(1), "w")
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(null, fd)
    os.close(null)
    # A Ctrl-C at a terminal reaches the whole process group: the check's
    # child stops (the rewrite then kills what is left), the server need not.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import tensorflow  # noqa: F401
    import tf_ctr_ops._serve_check  # noqa: F401  (imports tf_ctr_ops, which loads the op library)

    serve(requests, replies)


if __name__ == "__main__":
    main()

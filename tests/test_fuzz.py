"""The atheris harness over the core (tests/fuzz/fuzz_core.py), run for a bounded time.

Both tests run the harness in a child process, so that a crash it finds is a
failed test and not a dead test session:

- test_corpus_replays: every input kept in tests/fuzz/corpus/ (seeds and past
  findings) passes;
- test_fuzz_for_a_bounded_time: TF_CTR_OPS_FUZZ_SECONDS (default 30) of new
  inputs pass. New interesting inputs go to a temporary folder, never into
  the corpus; a failing input is saved there and its path printed: fix the
  bug, then copy the input into tests/fuzz/corpus/.

Skipped, with the reason, where atheris is not installed (it has wheels for
CPython >= 3.11 on Linux x86-64: pip install atheris).
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("atheris", reason="atheris is not installed (pip install atheris: wheels for CPython >= 3.11 "
                                      "on Linux x86-64); the fuzz harness does not run")

FUZZ = Path(__file__).resolve().parent / "fuzz"
HARNESS = FUZZ / "fuzz_core.py"
CORPUS = FUZZ / "corpus"
SECONDS = int(os.environ.get("TF_CTR_OPS_FUZZ_SECONDS", "30"))


def _env():
    env = dict(os.environ)
    spec = importlib.util.find_spec("tf_ctr_ops")  # fuzz the same build these tests use
    if spec is not None and spec.submodule_search_locations:
        env.setdefault("TF_CTR_OPS_CORE_DIR", list(spec.submodule_search_locations)[0])
    return env


def _run(args, timeout):
    proc = subprocess.run([sys.executable, str(HARNESS), *args], capture_output=True, text=True, env=_env(),
                          timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def test_corpus_replays():
    inputs = sorted(str(p) for p in CORPUS.iterdir() if p.is_file())
    assert inputs, f"{CORPUS} holds no inputs"
    rc, out = _run(inputs, timeout=300)
    assert rc == 0, f"an input of {CORPUS} fails (exit {rc}):\n{out[-6000:]}"


def test_fuzz_for_a_bounded_time(tmp_path):
    new, artifacts = tmp_path / "new", tmp_path / "artifacts"
    new.mkdir()
    artifacts.mkdir()
    rc, out = _run([str(new), str(CORPUS), f"-max_total_time={SECONDS}", f"-artifact_prefix={artifacts}/",
                    "-timeout=20", "-rss_limit_mb=4096", "-print_final_stats=1"], timeout=SECONDS + 300)
    found = sorted(str(p) for p in artifacts.iterdir())
    assert rc == 0 and not found, (
        f"the fuzzer found a failing input (exit {rc}); saved as {found}. Fix the bug, then copy the input into "
        f"{CORPUS}/ so every run replays it.\n{out[-6000:]}")
    runs = [line for line in out.splitlines() if line.startswith("stat::number_of_executed_units")]
    print(runs[-1] if runs else out[-500:])

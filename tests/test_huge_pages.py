"""The CPU kernels back a large table with transparent huge pages the first
time they read it (cc/kernels/huge_pages.h), and TF_CTR_OPS_HUGE_PAGES=0
turns that off. Each case runs in a fresh process, whose huge-page total
(AnonHugePages of /proc/self/smaps_rollup) it reads before and after."""

import platform
import subprocess
import sys

import pytest

from conftest import fresh_process_env

THP = "/sys/kernel/mm/transparent_hugepage/enabled"
MIB = 1 << 20


def _skip_reason():
    if sys.platform != "linux":
        return "huge pages are asked of Linux only"
    try:
        with open(THP) as f:
            mode = f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return f"{THP} is unreadable: no transparent huge pages here"
    if mode == "never":
        return "transparent huge pages are off on this machine (never)"
    major, minor = (int(x) for x in platform.release().split(".")[:2])
    if (major, minor) < (6, 1):
        return f"kernel {platform.release()} has no MADV_COLLAPSE (6.1+): pages are collapsed later, if at all"
    return ""


pytestmark = pytest.mark.skipif(bool(_skip_reason()), reason=_skip_reason() or "-")

SCRIPT = """
import sys
import time
import numpy as np
import tensorflow as tf
import tf_ctr_ops as tco

def huge_kib():
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("AnonHugePages:"))

ids = tf.ragged.constant([[1, 2], [3], []], tf.int64)
if sys.argv[1] == "lookup":
    table = tf.Variable(tf.ones([1 << 19, 32]))  # 64 MiB
    call = lambda: tco.sparse_embedding(table, ids)
    want = tf.constant([[1.0] * 32, [1.0] * 32, [0.0] * 32])
else:
    table = tco.HashTable(dim=32, capacity=1 << 19)  # values 64 MiB, keys 36 MiB (2^20 slots + free stack)
    call = lambda: tco.hash_table_embedding(table, ids, insert=True)
    want = None
before = huge_kib()
got = call()
if want is not None:
    np.testing.assert_array_equal(got.numpy(), want.numpy())
# The pages already there are collapsed by a background thread: wait for
# the bytes hoped for, or for the time given.
goal, deadline = int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
while (huge_kib() - before) * 1024 < goal and time.monotonic() < deadline:
    time.sleep(0.1)
print((huge_kib() - before) * 1024)
"""


def _huge_bytes_gained(kind, tmp_path, goal, wait_s, **env):
    """Huge-page bytes the process gained from one call, once `goal` bytes
    were reached or `wait_s` seconds passed."""
    script = tmp_path / "huge.py"
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(script), kind, str(goal), str(wait_s)],
                         env={**fresh_process_env(), **env}, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return int(out.stdout.strip().splitlines()[-1])


def test_a_large_tables_first_lookup_backs_it_with_huge_pages(tmp_path):
    # All but the partial 2 MiB pages at its ends: 64 MiB less at most 4.
    goal = 60 * MIB
    assert _huge_bytes_gained("lookup", tmp_path, goal, 120) >= goal


def test_a_hash_tables_keys_and_values_get_huge_pages(tmp_path):
    # The key table (the find's probes) and the values (the pooling's rows).
    goal = (60 + 32) * MIB
    assert _huge_bytes_gained("hash_table", tmp_path, goal, 120) >= goal


def test_huge_pages_can_be_turned_off(tmp_path):
    # Without the advice nothing asks for them in the window counted (the
    # kernel's own background scan could, rarely, so the bound is loose).
    assert _huge_bytes_gained("lookup", tmp_path, 1 << 62, 2, TF_CTR_OPS_HUGE_PAGES="0") < 32 * MIB

"""The host side of tools/bench_core_gpu.py, which runs on a GPU machine
without TensorFlow: its inputs must be what the table says they are (the
string cases pool the same ids as the lookup cases, packed as decimal text)."""

import importlib.util
import os

import numpy as np
import pytest

_PATH = os.path.join(os.path.dirname(__file__), "..", "tools", "bench_core_gpu.py")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_core_gpu", _PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # CuPy is imported by main() only
    return module


@pytest.mark.parametrize("zipf", [False, True])
def test_packed_strings_hold_the_lookup_ids(bench, zipf):
    rng = np.random.default_rng(7)
    ids, offsets = bench.ragged_ids(rng, 500, 10**7, 12, zipf=zipf)
    assert offsets[0] == 0 and offsets[-1] == len(ids)
    assert np.all(np.diff(offsets) >= 1) and ids.min() >= 0 and ids.max() < 10**7
    raw, splits = bench.pack_decimal(ids, offsets)
    text = raw.tobytes().decode()
    for r in range(500):
        assert text[splits[r]:splits[r + 1]] == ",".join(map(str, ids[offsets[r]:offsets[r + 1]]))


def test_packing_edge_values(bench):
    ids = np.array([0, 9, 10, 99, 100, 2**62, 7], np.int64)
    offsets = np.array([0, 1, 6, 7], np.int64)
    raw, splits = bench.pack_decimal(ids, offsets)
    assert raw.tobytes().decode() == "0" + "9,10,99,100," + str(2**62) + "7"
    np.testing.assert_array_equal(splits, [0, 1, len("09,10,99,100," + str(2**62)), len(raw)])


def test_table_benchmark_builds_the_table_it_times():
    """tools/bench_table_gpu.py's host side: its table holds every resident key
    (rows in insertion order) and its queries are resident keys."""
    from core_helpers import load_core

    core = load_core()  # the CPU find is in every build of the core
    spec = importlib.util.spec_from_file_location(
        "bench_table_gpu", os.path.join(os.path.dirname(__file__), "..", "tools", "bench_table_gpu.py"))
    table_bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table_bench)
    rng = np.random.default_rng(3)
    keys = rng.choice(np.int64(1) << 62, size=5000, replace=False).astype(np.int64)
    table = table_bench.build_table(core, keys, keys.size)
    np.testing.assert_array_equal(core.hash_table_find(table, keys, keys.size)[0], np.arange(keys.size))
    for dist in ("uniform", "zipf"):
        q = table_bench.queries(rng, keys, 2000, dist)
        assert np.isin(q, keys).all()

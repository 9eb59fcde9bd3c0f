"""Smoke test of the benchmark harness on a tiny shape: structure and sanity, never timings."""

import json
import math

import numpy as np
import pytest

from tf_ctr_ops import bench

TINY = ["--quick", "--batch", "32", "--vocab", "500", "--dim", "8", "--max-len", "9", "--copy-mb", "4"]


def _positive_finite(x):
    return isinstance(x, float) and math.isfinite(x) and x > 0


def test_lookup_suite_quick(tmp_path):
    out = tmp_path / "bench.json"
    results = bench.main(["lookup", *TINY, "--json", str(out)])

    env = results["env"]
    assert env["tensorflow"] and env["nproc"] >= 1 and "TF_VERSION" in env["build_info"]

    res = results["suites"]["lookup"]
    assert res["config"]["batch"] == 32 and res["config"]["quick"]
    assert _positive_finite(res["copy_bandwidth"]["best_GBps"])
    cases = {c["case"]: c for c in res["cases"]}
    assert set(cases) == {f"{k}/{d}" for k in ("lookup", "hash", "ragged") for d in ("zipf", "uniform")}
    for c in cases.values():
        assert 32 <= c["nnz"] <= 32 * 9
        for side in ("fused", "native", "core"):
            t = c[side]
            assert t["runs"] >= 1
            assert 0 < t["p10_ms"] <= t["median_ms"] <= t["p90_ms"]
            assert _positive_finite(c["GBps"][side])
        assert _positive_finite(c["speedup"])
        assert _positive_finite(c["frac_copy"])
        # The suite checked agreement before timing; the recorded errors say so.
        assert set(c["max_abs_err"]) >= {"native", "core"}
        assert all(0 <= e <= 1e-5 for e in c["max_abs_err"].values())
    assert _positive_finite(cases["lookup/zipf"]["speedup_vs_native_tensor"])

    assert {(t["dist"], t["min_speedup"]) for t in res["targets"]} == {
        ("zipf", 2.5), ("uniform", 2.5), ("zipf", 3.0), ("uniform", 3.0)}
    for t in res["targets"]:
        assert isinstance(t["met"], bool) and t["met"] == (t["speedup"] >= t["min_speedup"])

    cor = res["copy_on_read"]
    assert _positive_finite(cor["fused_copy_on_read"]["median_ms"]) and _positive_finite(cor["copy_cost_ms"])

    loaded = json.loads(out.read_text())
    assert loaded["suites"]["lookup"]["cases"][0]["case"] == res["cases"][0]["case"]


def test_mismatch_is_an_error_not_a_timing():
    a = np.ones((4, 3), np.float32)
    assert bench.check_agreement("c", "x", a, a + 1e-7) < 1e-5
    with pytest.raises(bench.BenchmarkMismatch, match="disagrees"):
        bench.check_agreement("c", "x", a, a + 1e-3)
    with pytest.raises(bench.BenchmarkMismatch, match="shape"):
        bench.check_agreement("c", "x", a, a[:2])
    with pytest.raises(bench.BenchmarkMismatch, match="non-finite"):
        bench.check_agreement("c", "x", np.full_like(a, np.nan), a)


def test_suites_registered():
    assert {"lookup", "string", "multi", "rewrite"} <= set(bench.SUITES)
    with pytest.raises(SystemExit):
        bench.parse_args(["no-such-suite"])


def test_rewrite_suite_quick(tmp_path):
    out = tmp_path / "rewrite.json"
    results = bench.main(["rewrite", *TINY, "--json", str(out)])
    res = results["suites"]["rewrite"]
    assert res["features"] == {"hashed": 20, "id_lists": 6}
    # Every feature was fused: 20 single-valued hashes, 3 ragged id lists in
    # one step, and 3 sparse ones in two (the lookup, then the split); then
    # the 23 whose batch the Concatenate proves equal were grouped into one
    # CtrMultiStringEmbedding. The 3 sparse ones keep their own ops: their
    # row count is trimmed (embedding_lookup_sparse's last row + 1).
    rw = res["rewrite"]
    assert rw["matches"] == 20 + 3 + 2 * 3 + 1 and rw["skips"] == 0
    assert rw["fused_ops"] == ["CtrEmbeddingLookup", "CtrMultiStringEmbedding", "CtrStringEmbedding"]
    assert rw["op_counts_after"]["CtrMultiStringEmbedding"] == 1
    assert rw["op_counts_after"]["CtrStringEmbedding"] == 3
    assert not {"StringToHashBucketFast", "StringSplit", "StringSplitV2", "Unique", "GatherV2",
                "UnsortedSegmentSum"} & set(rw["op_counts_after"])
    assert rw["max_abs_diff"] <= 1e-6
    cases = {c["batch"]: c for c in res["cases"]}
    assert set(cases) == {32, 1}  # batch 1024 capped by --batch 32, and batch 1
    for c in cases.values():
        assert 0 <= c["max_abs_err"]["native"] <= 1e-5
        for side in ("fused", "native"):
            assert c[side]["runs"] >= 1 and 0 < c[side]["p10_ms"] <= c[side]["median_ms"] <= c[side]["p90_ms"]
        assert _positive_finite(c["speedup"])
    [target] = res["targets"]
    assert target["batch"] == 32 and target["min_speedup"] == 3.0
    assert isinstance(target["met"], bool) and target["met"] == (target["speedup"] >= 3.0)
    assert json.loads(out.read_text())["suites"]["rewrite"]["cases"][0]["case"] == res["cases"][0]["case"]

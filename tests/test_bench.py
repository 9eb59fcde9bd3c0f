"""Smoke test of the benchmark harness on a tiny shape: structure and sanity, never timings."""

import dataclasses
import io
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import fresh_process_env

from tf_ctr_ops import bench
from tf_ctr_ops.bench import harness
from tf_ctr_ops.bench.lookup import NATIVE_PATHS, SHARDED_NATIVE_PATH

TINY = ["--quick", "--batch", "32", "--vocab", "500", "--dim", "8", "--max-len", "9", "--copy-mb", "4"]


def _positive_finite(x):
    return isinstance(x, float) and math.isfinite(x) and x > 0


def test_the_native_fast_path_is_tfs_fast_path():
    # On the Variable itself TF never takes it (a Variable is a
    # CompositeTensor), nor on a captured constant (its device string is not
    # the ids'): the two 'paths' were one graph, timed twice.
    import tensorflow as tf

    from tf_ctr_ops.bench import lookup

    table = tf.Variable(np.ones([50, 4], np.float32))
    constant = tf.constant(np.ones([50, 4], np.float32))
    spec = tf.SparseTensorSpec([None, None], tf.int64)

    def graph(table_of):
        @tf.function(input_signature=[spec])
        def run(sp):
            with tf.device("/CPU:0"):
                return tf.nn.embedding_lookup_sparse(table_of(), sp, None, combiner="mean", allow_fast_lookup=True)
        return run

    def ops(fn):
        return {op.type for op in fn.get_concrete_function().graph.get_operations()}

    assert "Unique" in ops(graph(lambda: table)) and "Unique" in ops(graph(lambda: constant))
    for source in (table, constant):
        fast = graph(lambda source=source: lookup.tf_fast_path_table(source))
        assert "Unique" not in ops(lookup.check_fast_path(fast, "fast"))
    with pytest.raises(RuntimeError, match="did not take its fast path"):
        lookup.check_fast_path(graph(lambda: table), "native_fast")


def test_lookup_suite_quick(tmp_path):
    out = tmp_path / "bench.json"
    results = bench.main(["lookup", *TINY, "--json", str(out)])

    env = results["env"]
    assert env["tensorflow"] and env["nproc"] >= 1 and "TF_VERSION" in env["build_info"]

    res = results["suites"]["lookup"]
    assert res["config"]["batch"] == 32 and res["config"]["quick"]
    assert _positive_finite(res["copy_bandwidth"]["best_GBps"])
    cases = {c["case"]: c for c in res["cases"]}
    assert set(cases) == {f"{k}/{d}" for k in ("lookup", "hash", "ragged", "grad", "sharded")
                          for d in ("zipf", "uniform")}
    for c in cases.values():
        assert 32 <= c["nnz"] <= 32 * 9
        # A table in shards has no fast path in TF: one native side, named so.
        paths = ("native_unique",) if c["kind"] == "sharded" else ("native_unique", "native_fast")
        sides = ("fused", "native") + paths + (() if c["kind"] in ("grad", "sharded") else ("core",))
        assert ("native_fast" in c) == (c["kind"] != "sharded")
        for side in sides:
            t = c[side]
            assert t["runs"] >= 1
            assert 0 < t["p10_ms"] <= t["median_ms"] <= t["p90_ms"]
            assert _positive_finite(c["GBps"][side])
        # native is the faster of TF's two paths, and the case says which it was.
        fastest = min(paths, key=lambda k: c[k]["median_ms"])
        assert c["native"] == c[fastest]
        assert c["native_path"] == (SHARDED_NATIVE_PATH if c["kind"] == "sharded" else NATIVE_PATHS[fastest])
        assert _positive_finite(c["speedup"])
        assert _positive_finite(c["frac_copy"])
        # The suite checked agreement before timing; the recorded errors say so.
        assert set(c["max_abs_err"]) >= {"native", *paths} | set(sides[2 + len(paths):])
        assert all(0 <= e <= (1e-4 if c["kind"] == "grad" else 1e-5) for e in c["max_abs_err"].values())
    # The gradient case times the fused gradient with and without TF's unique indices.
    for d in ("zipf", "uniform"):
        assert _positive_finite(cases[f"grad/{d}"]["fused_per_id"]["median_ms"])
    assert _positive_finite(cases["lookup/zipf"]["speedup_vs_native_tensor"])

    # The issues set the targets on Zipf ids; uniform cases carry no verdict.
    assert {(t["dist"], t["min_speedup"]) for t in res["targets"]} == {("zipf", 2.5), ("zipf", 3.0)}
    for t in res["targets"]:
        assert isinstance(t["met"], bool) and t["met"] == (t["speedup"] >= t["min_speedup"])

    cor = res["copy_on_read"]
    assert _positive_finite(cor["fused_copy_on_read"]["median_ms"]) and _positive_finite(cor["copy_cost_ms"])
    # A ratio of the probe's own two timings, not of a native time from another run.
    assert cor["time_ratio"] == cor["fused_copy_on_read"]["median_ms"] / cor["fused"]["median_ms"]

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


@pytest.mark.parametrize("model, fused_op, unfused_op", [("tf1-feature-columns", "CtrEmbeddingLookup", "Bucketize"),
                                                         ("keras-lookup", "CtrVocabMultiHot", None),
                                                         ("keras-feature-space", "CtrMultiHotDense", "SparseCross")])
def test_rewrite_suite_on_real_model_styles(tmp_path, model, fused_op, unfused_op):
    out = tmp_path / "models.json"
    results = bench.main(["rewrite", "--model", model, *TINY, "--json", str(out)])
    res = results["suites"]["rewrite"]
    rw = res["rewrite"]
    assert res["model"] == model and rw["max_abs_diff"] <= 1e-6 and not rw["rejected_patterns"]
    # Verified on synthesized inputs the original accepts, as a user without inputs gets it.
    assert rw["verified_on"].startswith("synthesized"), rw
    assert fused_op in rw["fused_ops"]
    if unfused_op is None:  # every feature fused
        assert rw["unfused_feature_ops"] == 0 and not rw["unfused_by_op"], rw
    else:
        assert rw["unfused_by_op"].get(unfused_op, 0) >= 1
    assert rw["unfused_feature_ops"] == sum(rw["unfused_by_op"].values())
    assert [c["case"] for c in res["cases"]] == [f"rewrite/{model}/batch32", f"rewrite/{model}/batch1"]
    for c in res["cases"]:
        assert c["speedup"] == pytest.approx(c["native"]["median_ms"] / c["fused"]["median_ms"])
        assert c["max_abs_err"]["native"] <= 1e-6
    # The Keras model's report times, for scale, the tables' finds that the fused ops replace.
    bounds = [c["table_finds_ms"] for c in res["cases"] if "table_finds_ms" in c]
    assert len(bounds) == (model == "keras-lookup") and all(b > 0 for b in bounds), res["cases"]
    (target,) = res["targets"]
    assert target["batch"] == 32 and target["min_speedup"] == 1.5 and target["met"] == (target["speedup"] >= 1.5)
    assert json.loads(out.read_text())["suites"]["rewrite"]["model"] == model


def test_rewrite_time_suite_scales_the_model(tmp_path):
    results = bench.main(["rewrite", "--features", "40", "--quick", "--json", str(tmp_path / "t.json")])
    res = results["suites"]["rewrite"]
    rows = res["rewrite_time"]
    assert [r["features"] for r in rows] == [26, 40]
    # More features, more nodes and more fused subgraphs; the time is the optimizer's alone.
    assert rows[0]["nodes"] < rows[1]["nodes"] and rows[0]["matches"] < rows[1]["matches"]
    for r in rows:
        assert r["seconds"] > 0 and r["ms_per_feature"] == pytest.approx(1e3 * r["seconds"] / r["features"])
    # A fixed start-up cost outweighs 40 features' work: the limit is judged from 1,000 on.
    target = res["rewrite_time_target"]
    assert target["met"] is None and target["max_seconds"] is None and "judged from --features 1000" in target["target"]
    assert target["seconds"] == rows[-1]["seconds"]


def test_the_rewrite_time_target_is_2_s_per_1000_features_from_1000_on():
    from tf_ctr_ops.bench.rewrite import rewrite_time_target

    assert rewrite_time_target(1000, 1.9)["met"] is True
    assert rewrite_time_target(1000, 2.1)["met"] is False
    target = rewrite_time_target(4000, 7.5)
    assert target["max_seconds"] == pytest.approx(8.0) and target["met"] is True


def test_rewrite_suite_quick(tmp_path):
    out = tmp_path / "rewrite.json"
    results = bench.main(["rewrite", *TINY, "--json", str(out)])
    res = results["suites"]["rewrite"]
    assert res["features"] == {"hashed": 20, "id_lists": 6}
    # Every feature was fused: 20 single-valued hashes, 3 ragged id lists in
    # one step, and 3 sparse ones in two (the lookup, then the split); then
    # the 23 whose batch the Concatenate proves equal were grouped, and then
    # the Concatenate of all 26, the 3 sparse ones' trimmed row counts (last
    # row + 1) included, became one CtrConcatStringEmbedding; served on the
    # CPU, that op and its pack became one CtrConcatStringTensorEmbedding.
    rw = res["rewrite"]
    # One subgraph per feature: the stages that fold keys in and group the
    # features refine the ops made, and fuse no subgraph of their own.
    assert rw["matches"] == 20 + 6 and rw["skips"] == 0
    assert rw["fused_ops"] == ["CtrConcatStringEmbedding", "CtrConcatStringTensorEmbedding", "CtrEmbeddingLookup",
                               "CtrMultiStringEmbedding", "CtrStringEmbedding"]
    assert rw["op_counts_after"]["CtrConcatStringTensorEmbedding"] == 1
    assert not {"StringToHashBucketFast", "StringSplit", "StringSplitV2", "Unique", "GatherV2",
                "UnsortedSegmentSum", "ConcatV2", "CtrStringEmbedding", "CtrMultiStringEmbedding",
                "CtrPackStrings", "CtrConcatStringEmbedding"} & set(rw["op_counts_after"])
    assert rw["max_abs_diff"] <= 1e-6
    # batch 1024 capped by --batch 32, and batch 1; each served as a server
    # runs the graph (flat tensors) and by the Python keyword call.
    cases = {(c["batch"], c["call"]): c for c in res["cases"]}
    assert set(cases) == {(b, call) for b in (32, 1) for call in ("served graph", "python call")}
    assert cases[32, "served graph"]["case"] == "rewrite/batch32"
    assert cases[32, "python call"]["case"] == "rewrite/batch32/python-call"
    for c in cases.values():
        assert 0 <= c["max_abs_err"]["native"] <= 1e-5
        for side in ("fused", "native", "floor"):
            assert c[side]["runs"] >= 1 and 0 < c[side]["p10_ms"] <= c[side]["median_ms"] <= c[side]["p90_ms"]
        assert _positive_finite(c["speedup"])
        floor, fused, native = (c[k]["median_ms"] for k in ("floor", "fused", "native"))
        if fused > floor and native > floor:
            assert c["embedding_speedup"] == pytest.approx((native - floor) / (fused - floor))
        else:
            assert c["embedding_speedup"] is None
    [target] = res["targets"]
    assert target["batch"] == 32 and target["min_speedup"] == 3.0
    assert target["speedup"] == cases[32, "served graph"]["speedup"] and "served graph" in target["target"]
    assert isinstance(target["met"], bool) and target["met"] == (target["speedup"] >= 3.0)
    assert json.loads(out.read_text())["suites"]["rewrite"]["cases"][0]["case"] == res["cases"][0]["case"]


def test_served_graph_call_feeds_each_tensor_to_its_own_input(tmp_path):
    """The flat call binds by name once, so inputs named out of order (and an
    output that weighs each differently) must still come out as the keyword
    call's."""
    import tensorflow as tf

    from tf_ctr_ops.bench.harness import keyword_call, served_graph_call

    class Model(tf.Module):
        def __init__(self):
            self.w = tf.Variable(10.0)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name=n) for n in ("zeta", "alpha", "mid")])
        def serve(self, zeta, alpha, mid):
            return {"out": self.w * zeta + 2.0 * alpha - 3.0 * mid}

    model = Model()
    tf.saved_model.save(model, str(tmp_path), signatures={"serving_default": model.serve})
    sig = tf.saved_model.load(str(tmp_path)).signatures["serving_default"]
    feeds = {"zeta": tf.constant([1.0, 2.0]), "alpha": tf.constant([5.0, 7.0]), "mid": tf.constant([11.0, 13.0])}
    flat = served_graph_call(sig, feeds)
    assert flat is not None
    np.testing.assert_array_equal(flat(), keyword_call(sig, feeds)())
    np.testing.assert_array_equal(flat(), [10 * 1 + 2 * 5 - 3 * 11, 10 * 2 + 2 * 7 - 3 * 13])


def test_served_graph_call_is_none_without_the_flat_entry_point():
    from tf_ctr_ops.bench.harness import served_graph_call

    class KeywordOnly:
        structured_outputs = {"out": None}

        def __call__(self, **feeds):
            return {"out": None}

    assert served_graph_call(KeywordOnly(), {"x": 1}) is None


def test_embedding_speedup_is_measured_beyond_the_floor():
    from tf_ctr_ops.bench.rewrite import embedding_speedup

    def timed(fused, native, floor):
        return {"fused": {"median_ms": fused}, "native": {"median_ms": native}, "floor": {"median_ms": floor}}

    assert embedding_speedup(timed(2.0, 4.0, 1.0)) == pytest.approx(3.0)
    assert embedding_speedup(timed(1.0, 4.0, 1.0)) is None  # no embedding time left to compare
    assert embedding_speedup(timed(2.0, 0.5, 1.0)) is None


# ---------------------------------------------------------------------------
# Command line, grid, outputs


def test_cli_parses_every_option():
    args = bench.parse_args(["lookup", "string", "--device", "gpu", "--quick", "--grid", "full", "--json", "-",
                             "--markdown", "r.md", "--plot", "r.png", "--runs", "7", "--copy-mb", "8",
                             "--seed", "3"])
    assert args.suites == ["lookup", "string"] and args.device == "gpu" and args.quick
    assert (args.grid, args.json, args.markdown, args.plot) == ("full", "-", "r.md", "r.png")
    cfg = bench.config_from_args(args)
    assert cfg.device == "/GPU:0" and cfg.on_gpu and cfg.quick and cfg.grid == "full"
    assert (cfg.runs, cfg.min_runs, cfg.copy_mb, cfg.seed) == (7, 3, 8, 3)

    custom = bench.config_from_args(bench.parse_args(["multi", "--batch", "5", "--vocab", "50", "--dim", "4",
                                                      "--max-len", "3"]))
    assert custom.grid == "custom" and not custom.on_gpu
    assert [(s.batch, s.vocab, s.dim, s.max_len, s.dist, s.headline) for s in custom.shape_list()] == [
        (5, 50, 4, 3, "zipf", True), (5, 50, 4, 3, "uniform", True)]

    for bad in (["lookup", "--device", "tpu"], ["lookup", "--grid", "huge"], ["no-such-suite"], []):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_all_runs_every_registered_suite_in_order():
    assert {"lookup", "string", "multi"} <= set(bench.SUITES)
    suites = bench.parse_args(["all"]).suites
    assert sorted(suites) == sorted(bench.SUITES)
    assert suites[:3] == ["lookup", "string", "multi"]


def _axes(shapes):
    return {k: {getattr(s, k) for s in shapes} for k in ("batch", "vocab", "dim", "max_len", "dist")}


def test_grids():
    headline = bench.config_from_args(bench.parse_args(["lookup", "--grid", "headline"])).shape_list()
    assert [(s.batch, s.vocab, s.dim, s.ids_per_row, s.headline) for s in headline] == [(4096, 10**6, 32, 50, True)] * 2
    assert {s.dist for s in headline} == {"zipf", "uniform"}
    # The default stays short: the README Quickstart (and so CI) runs `bench lookup`.
    assert bench.config_from_args(bench.parse_args(["lookup"])).shape_list() == headline

    full = bench.config_from_args(bench.parse_args(["lookup", "--grid", "full"])).shape_list()
    assert full[:2] == headline and len(full) == 2 + 4 * 3 * 3 * 2 * 2 == len(set(full))
    assert _axes(full[2:]) == {"batch": {1, 64, 1024, 8192}, "vocab": {10**5, 10**7}, "dim": {8, 32, 128},
                               "max_len": {1, 19, 99}, "dist": {"zipf", "uniform"}}
    assert {s.ids_per_row for s in full[2:]} == {1, 10, 50}

    quick = bench.config_from_args(bench.parse_args(["lookup", "--quick"])).shape_list()
    assert quick[:2] == headline and len(quick) < 16 and set(quick[2:]) <= set(full)
    assert _axes(quick[2:]) == _axes(full[2:])  # every value of every axis appears


def test_unaffordable_tables_are_skipped_with_a_note(capsys):
    if bench.mem_available_bytes() is None:
        pytest.skip("no /proc/meminfo here: the benchmark cannot tell what fits")
    results = bench.main(["lookup", "string", "--quick", "--batch", "8", "--vocab", str(10**12), "--dim", "8",
                          "--copy-mb", "4"])
    for name in ("lookup", "string"):
        res = results["suites"][name]
        assert res["cases"] == [] and res["targets"] == []
        assert [s["dist"] for s in res["skipped"]] == ["zipf", "uniform"]
        assert all("GiB" in s["reason"] for s in res["skipped"])
    assert "skipped 2 shape(s) with V=1000000M D=8" in capsys.readouterr().out


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One tiny run of every built-in suite, with JSON and Markdown written (and a plot when possible)."""
    out = tmp_path_factory.mktemp("bench")
    paths = {"json": out / "r.json", "markdown": out / "r.md", "plot": out / "r.png"}
    argv = ["lookup", "string", "multi", *TINY, "--json", str(paths["json"]), "--markdown", str(paths["markdown"])]
    if _have_matplotlib():
        argv += ["--plot", str(paths["plot"])]
    return bench.main(argv), paths


def _have_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def test_json_has_the_environment_and_every_case(tiny_run):
    results, paths = tiny_run
    loaded = json.loads(paths["json"].read_text())
    env = loaded["env"]
    for key in ("tensorflow", "tf_ctr_ops", "cpu_model", "nproc", "tf_intra_op_threads", "tf_inter_op_threads",
                "build_info", "device", "foreign_cpu_load_during"):
        assert key in env, key
    assert env["build_info"]["TF_VERSION"] == env["tensorflow"] and "WITH_CUDA" in env["build_info"]
    assert env["device"] == "/CPU:0" and "gpu_name" not in env
    assert set(loaded["suites"]) == {"lookup", "string", "multi"}
    for name, res in loaded["suites"].items():
        assert res["cases"] and res["cases"] == json.loads(json.dumps(results["suites"][name]["cases"]))
        for c in res["cases"]:
            assert c["batch"] == 32 and c["shape"].startswith("B=32 ")
            assert _positive_finite(c["speedup"]) and _positive_finite(c["frac_copy"])
    assert {c["case"] for c in loaded["suites"]["string"]["cases"]} == {
        f"string/{m}/{d}" for m in ("index", "hash") for d in ("zipf", "uniform")}
    for c in loaded["suites"]["string"]["cases"] + loaded["suites"]["multi"]["cases"]:
        # Both of tf.nn's paths timed; native is the faster.
        fastest = min(NATIVE_PATHS, key=lambda k: c[k]["median_ms"])
        assert c["native"] == c[fastest] and c["native_path"] == NATIVE_PATHS[fastest], c["case"]


def test_markdown_is_a_well_formed_table(tiny_run):
    results, paths = tiny_run
    text = paths["markdown"].read_text()
    lines = text.splitlines()
    assert lines[0] == ("| case | shape | fused ms | native ms | speedup | GB/s | fraction of copy bandwidth |")
    assert set(lines[1].replace("|", "").split()) <= {"---", "---:"} and lines[1].count("|") == 8
    rows = [ln for ln in lines[2:] if ln.startswith("|")]
    ncases = sum(len(r["cases"]) for r in results["suites"].values())
    assert len(rows) == ncases and lines[2 + ncases] == ""
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 7
        fused, native, speedup, gbps, frac = (float(c.rstrip("x")) for c in cells[2:])
        assert fused > 0 and native > 0 and gbps > 0 and frac > 0
        assert speedup == pytest.approx(native / fused, rel=0.02, abs=0.01)
    # A custom shape (TINY's) is not the headline the targets are stated for.
    assert "Targets (stated for the headline shape), judged at the custom shape:" in lines
    assert "Targets, at the headline shape:" not in lines
    env = results["env"]
    machine = next(ln for ln in lines if ln.startswith("Machine: "))
    assert env["cpu_model"] in machine and results["date"] in machine and env["tensorflow"] in machine
    assert "NOT MET" in text or ", met" in text


def test_markdown_gbps_legend_names_what_each_case_counts(tiny_run):
    results, paths = tiny_run
    # One rule for lookups and strings: the legend states it alone.
    assert f"GB/s = bytes / fused time, the bytes counted as {harness.POOLED_BYTES};" in paths["markdown"].read_text()
    # The table suite's find and training rows count other bytes, and said they counted pooled rows.
    from tf_ctr_ops.bench import report

    def case(name, counted=None):
        c = {"case": name, "fused": {}, "native": {}, "GBps": {}}
        return c if counted is None else {**c, "bytes_counted": counted}

    mixed = {"suites": {"lookup": {"cases": [case("lookup/zipf")]},
                        "table": {"cases": [case("table/pooled-zipf", harness.POOLED_BYTES),
                                            case("table/find-zipf", "16 bytes a key"),
                                            case("table/train-step-zipf", "3 x rows")]}}}
    assert report._bytes_legend(mixed) == (f"{harness.POOLED_BYTES} for lookup/zipf, table/pooled-zipf; "
                                           "16 bytes a key for table/find-zipf; 3 x rows for table/train-step-zipf")


def test_markdown_of_whole_model_timings_has_no_empty_bandwidth_legend(tiny_run):
    # The rewrite suite counts no bytes and probes no copy; its legend read
    # "GB/s = ... / fused time; copy bandwidth (...): ." all the same.
    from tf_ctr_ops.bench import report

    results, _ = tiny_run
    case = {"case": "rewrite/batch1024", "shape": "B=1024", "fused": {"median_ms": 1.0},
            "native": {"median_ms": 3.0}, "speedup": 3.0}
    text = report.markdown({**results, "suites": {"rewrite": {"cases": [case]}}})
    legend = next(ln for ln in text.splitlines() if ln.startswith("Medians"))
    assert legend == "Medians of repeated calls.", legend
    text = report.markdown(results)
    assert "; copy bandwidth (GB/s, read + write, measured in the same run): lookup " in text


def test_plot_writes_a_png(tiny_run):
    if not _have_matplotlib():
        pytest.skip("matplotlib is not installed (the optional 'plot' extra)")
    png = tiny_run[1]["plot"].read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000


def test_model_and_features_are_refused_together(capsys):
    # --model ran its model and silently dropped --features.
    with pytest.raises(SystemExit) as e:
        bench.main(["rewrite", "--model", "keras-lookup", "--features", "40"])
    assert e.value.code == 2 and "give one of them" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["lookup", "--model", "keras-lookup"], "--model is an option of the rewrite suite"),
    (["table", "--features", "30"], "--features is an option of the rewrite suite"),
    (["lookup", "--seed", "-1"], "--seed: must be a non-negative integer, got -1"),
])
def test_options_a_run_would_ignore_or_choke_on_are_refused(capsys, argv, message):
    # --model and --features were dropped without a word; a negative seed ended in NumPy's traceback.
    with pytest.raises(SystemExit) as e:
        bench.main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_a_table_of_fewer_rows_than_shards_shards_it_by_rows():
    """TF's "div" strategy divides by the rows per shard: the suite's 4 shards
    of a 3-row table (one empty) ended in a division by zero."""
    results = bench.main(["lookup", "--quick", "--batch", "8", "--vocab", "3", "--dim", "4", "--max-len", "3",
                          "--runs", "2", "--copy-mb", "4"])
    sharded = [c for c in results["suites"]["lookup"]["cases"] if c["series"] == "sharded"]
    assert sharded and all(c["max_abs_err"]["native"] <= 1e-6 for c in sharded), sharded


def test_plot_without_matplotlib_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(bench.BenchmarkError, match=r"--plot needs matplotlib.*pip install"):
        bench.main(["lookup", *TINY, "--plot", str(tmp_path / "x.png")])
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("args", [["--vocab", "0"], ["--batch", "-5"], ["--max-len", "0"], ["--dim", "0"],
                                  ["--features", "-3"], ["--copy-mb", "0"], ["--runs", "0"]])
def test_shapes_must_be_positive(args, capsys):
    # --vocab 0 drew Zipf ids forever; the others ended in numpy tracebacks
    # (--copy-mb 0 in a division by the copy bandwidth, after the whole run).
    with pytest.raises(SystemExit) as e:
        bench.main(["lookup", *args])
    assert e.value.code == 2 and "must be a positive integer" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--json", "--markdown"])
def test_an_output_file_that_cannot_be_written_fails_before_the_run(flag, tmp_path):
    for path in (tmp_path, tmp_path / "missing" / "out"):
        with pytest.raises(bench.BenchmarkError, match=f"{flag} .* cannot be written"):
            bench.main(["lookup", *TINY, flag, str(path)])


def _tf_sees_a_gpu():
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


def test_device_gpu_without_a_gpu_is_a_clear_error(tmp_path):
    if _tf_sees_a_gpu():
        pytest.skip("TensorFlow sees a GPU here, so --device gpu runs")
    with pytest.raises(bench.BenchmarkError, match=r"--device gpu: TensorFlow sees no GPU"):
        bench.main(["lookup", *TINY, "--device", "gpu"])
    proc = subprocess.run([sys.executable, "-m", "tf_ctr_ops.bench", "lookup", "--quick", "--device", "gpu"],
                          cwd=tmp_path, env=fresh_process_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "error: --device gpu: TensorFlow sees no GPU" in proc.stderr and "Traceback" not in proc.stderr


class _FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_draws_on_a_terminal_only():
    tty, pipe = _FakeTerminal(), io.StringIO()
    for stream in (tty, pipe):
        bar = bench.Progress(4, stream=stream)
        bar.step("lookup B=1")
        bar.step("lookup B=64")
        bar.close()
    assert pipe.getvalue() == ""
    text = tty.getvalue()
    assert "\r[" in text and "2/4" in text and "lookup B=64" in text and text.endswith("\r\x1b[K")


def test_progress_bar_does_not_corrupt_json_on_stdout(monkeypatch, capsys):
    terminal = _FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    results = bench.main(["lookup", *TINY, "--json", "-"])
    out = capsys.readouterr().out
    assert json.loads(out)["suites"]["lookup"]["cases"][0]["case"] == results["suites"]["lookup"]["cases"][0]["case"]
    assert "\r" not in terminal.getvalue() and "lookup suite" in terminal.getvalue()  # the report went to stderr


def test_progress_bar_stays_off_stdout_and_json_file(monkeypatch, capsys, tmp_path):
    terminal = _FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    bench.main(["lookup", *TINY, "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    assert "\r[" in terminal.getvalue()  # the bar was drawn ...
    assert "\r" not in out and "lookup/zipf" in out  # ... beside a clean table
    json.loads((tmp_path / "r.json").read_text())


def test_gpu_mode_code_paths_run_under_soft_placement():
    """The --device gpu code paths (device copy probe, no core timing) on whatever device TF places them.

    Without a GPU, soft placement runs everything on the CPU: this checks the
    GPU mode's bookkeeping, not GPU kernels or timings.
    """
    shapes = tuple(bench.headline_shapes(batch=16, vocab=300, dim=8, max_len=5))
    cfg = bench.Config(device="/GPU:0", shapes=shapes, copy_mb=4).quicken()
    for name in ("lookup", "string"):
        res = bench.SUITES[name](cfg)
        assert res["copy_bandwidth"]["method"].startswith("x + 0 on /GPU:0")
        assert res["cases"] and all("core" not in c and "tf_overhead_ms" not in c for c in res["cases"])
        assert all(_positive_finite(c["speedup"]) for c in res["cases"])


def test_all_runs_suites_registered_elsewhere(monkeypatch, tmp_path):
    """A suite from another module (as bench/rewrite.py registers one) runs under `all`, in every output."""
    monkeypatch.setattr(harness, "SUITES", {})  # the registry that @suite and the command line read
    seen = []

    def fake_suite(name, speedup):
        @bench.suite(name)
        def run(cfg):
            seen.append((name, cfg.batch, cfg.device))
            t = {"median_ms": 2.0, "p10_ms": 1.5, "p90_ms": 2.5, "runs": 3}
            return {"suite": name, "config": dataclasses.asdict(cfg), "targets": [],
                    "cases": [{"case": f"{name}/x", "fused": t, "native": {**t, "median_ms": 2.0 * speedup},
                               "speedup": speedup}]}

    fake_suite("rewrite", 3.0)
    fake_suite("zeta", 1.5)
    md = tmp_path / "r.md"
    results = bench.main(["all", "--grid", "headline", "--markdown", str(md), "--json", str(tmp_path / "r.json")])
    assert [s[0] for s in seen] == ["rewrite", "zeta"] and list(results["suites"]) == ["rewrite", "zeta"]
    assert {s[1:] for s in seen} == {(4096, "/CPU:0")}
    rows = [ln for ln in md.read_text().splitlines() if ln.startswith("| rewrite/x") or ln.startswith("| zeta/x")]
    assert rows[0] == "| rewrite/x | B=4096 V=1M D=32 ids~50 | 2 | 6 | 3.00x |  |  |" and len(rows) == 2


def test_table_full_grid_adds_its_large_tables():
    from tf_ctr_ops.bench import table

    full = table._shapes(bench.config_from_args(bench.parse_args(["table", "--grid", "full"])))
    assert [(s.vocab, s.dim) for s in full if not s.headline].count((10_000_000, 64)) >= 1
    quick = table._shapes(bench.config_from_args(bench.parse_args(["table", "--quick"])))
    assert (10_000_000, 64) not in [(s.vocab, s.dim) for s in quick]


def test_table_suite_quick(tmp_path):
    from tf_ctr_ops.bench.table import NATIVE_TABLES

    results = bench.main(["table", *TINY, "--json", str(tmp_path / "t.json")])
    res = results["suites"]["table"]
    assert {(c["series"], c["dist"]) for c in res["cases"]} == {
        ("pooled", "zipf"), ("pooled", "uniform"), ("find", "zipf"), ("find", "uniform"), ("train", "zipf")}
    for c in res["cases"]:
        assert _positive_finite(c["speedup"]) and c["keys"] > 0
        assert all(_positive_finite(v) for v in c["keys_per_s"].values())
        if c["series"] != "train":  # the training step has one native: MutableHashTable
            assert c["native_path"] in NATIVE_TABLES.values() and c["resident_keys"] == 500
    train = next(c for c in res["cases"] if c["series"] == "train")
    assert train["shape"] == "B=8, 26 features x 500 keys D=8" and train["max_abs_err"]["native"] <= 1e-4
    insert = res["inserts"][0]
    assert insert["keys"] == 500 and _positive_finite(insert["speedup"])
    assert all(_positive_finite(insert[k]["keys_per_s"]) for k in ("fused", *NATIVE_TABLES))
    assert {t["target"][:3] for t in res["targets"]} == {"(a)", "(b)"}
    assert json.loads((tmp_path / "t.json").read_text())["suites"]["table"]["inserts"][0]["keys"] == 500


def test_columns_suite_quick(tmp_path):
    results = bench.main(["columns", *TINY, "--json", str(tmp_path / "c.json")])
    res = results["suites"]["columns"]
    assert {c["series"] for c in res["cases"]} == {"cross", "bucketized"}, res
    for c in res["cases"]:
        assert c["batch"] == 32 and c["shape"].startswith("B=32 ") and c["nnz"] > 0
        assert _positive_finite(c["speedup"]) and c["max_abs_err"]["native"] <= 1e-4
    assert json.loads((tmp_path / "c.json").read_text())["suites"]["columns"]["cases"][0]["nnz"] == \
        res["cases"][0]["nnz"]


@pytest.mark.parametrize("flag", ["--json", "--markdown"])
def test_an_output_file_only_opening_shows_unwritable_fails_before_the_run(flag, tmp_path):
    # A link to a missing folder passed the folder check, and the run ended in
    # a FileNotFoundError traceback after all its work.
    os.symlink(tmp_path / "gone" / "out", tmp_path / "out")
    with pytest.raises(bench.BenchmarkError, match=f"{flag} .* cannot be written: No such file or directory"):
        bench.main(["lookup", *TINY, flag, str(tmp_path / "out")])


@pytest.mark.parametrize("value", ["1.5", "abc"])
def test_a_number_option_that_is_no_integer_says_so(value, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["lookup", "--runs", value])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"must be a positive integer, got {value}" in err, err


def test_rewrite_time_needs_at_least_the_models_26_features(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["rewrite", "--features", "25"])
    assert e.value.code == 2 and "--features must be at least 26" in capsys.readouterr().err


def test_the_bench_command_names_itself_in_its_errors(capsys):
    from tf_ctr_ops.__main__ import main

    with pytest.raises(SystemExit):
        main(["bench", "lookup", "--runs", "0"])
    assert capsys.readouterr().err.startswith("usage: tf-ctr-ops bench")


def test_the_gradient_digest_sees_rows_at_other_indices_and_moved_columns():
    # Plain per-bucket sums of index mod 1024 took a row sent to id + 1024,
    # or with its columns swapped, for the right one.
    import tensorflow as tf

    from tf_ctr_ops.bench.lookup import _grad_digest

    values = tf.constant([[1.0, 2.0], [3.0, 5.0], [0.5, 0.25]])
    # Indices of a 10M-row table too, where a float32 product of the index lost its low bits.
    for base in (0, 9_000_000, 50_000_000):
        near = tf.IndexedSlices(values[:1], tf.constant([base + 3], tf.int64), tf.constant([10**8, 2], tf.int64))
        moved = tf.IndexedSlices(values[:1], near.indices + 1024, near.dense_shape)
        assert np.abs(_grad_digest(moved) - _grad_digest(near)).max() > 1e-3, base
    right = tf.IndexedSlices(values, tf.constant([3, 5, 3], tf.int64), tf.constant([4096, 2], tf.int64))
    merged = tf.IndexedSlices(tf.constant([[1.5, 2.25], [3.0, 5.0]]), tf.constant([3, 5], tf.int64),
                              right.dense_shape)
    np.testing.assert_allclose(_grad_digest(merged), _grad_digest(right), rtol=1e-6)  # merging changes nothing
    for wrong in (tf.IndexedSlices(values, right.indices + 1024, right.dense_shape),
                  tf.IndexedSlices(tf.reverse(values, [1]), right.indices, right.dense_shape)):
        assert np.abs(_grad_digest(wrong) - _grad_digest(right)).max() > 1e-3  # the check's rtol is 1e-4


def test_a_training_step_with_a_wrong_update_is_a_mismatch(monkeypatch):
    # Only the first step's loss was compared, which reads the initial values:
    # a 10x gradient was timed as correct.
    import tensorflow as tf

    import tf_ctr_ops as tco

    exact = tco.hash_table_embedding

    def tenfold_gradient(table, keys, **kwargs):
        out = exact(table, keys, **kwargs)
        return tf.stop_gradient(out) + 10.0 * (out - tf.stop_gradient(out)) if kwargs.get("insert") else out

    monkeypatch.setattr(tco, "hash_table_embedding", tenfold_gradient)
    with pytest.raises(bench.BenchmarkMismatch, match="train-step"):
        bench.main(["table", "--batch", "64", "--vocab", "2000", "--dim", "8", "--max-len", "5", "--runs", "3",
                    "--copy-mb", "8"])


@pytest.mark.parametrize("speedup, need, text", [(2.4996, 2.5, "2.49x"), (2.49996, 2.5, "2.49x"),
                                                  (0.99995, 1.0, "0.99x"), (0.29, 1.0, "0.29x"), (2.5, 2.5, "2.50x"),
                                                  (2.4949, 2.5, "2.49x"), (3.731, 2.5, "3.73x"),
                                                  # far from the target: as the table rounds it
                                                  (1.0259, 3.0, "1.03x"), (5.937, 6.0, "5.94x")])
def test_a_missed_target_is_never_printed_rounded_up_to_it(speedup, need, text):
    from tf_ctr_ops.bench.report import speedup_text

    assert speedup_text(speedup, need) == text

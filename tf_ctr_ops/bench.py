"""Benchmarks of the fused tf-ctr-ops kernels against the TF-native graphs they replace.

    python -m tf_ctr_ops.bench lookup                 # full shape, prints a table
    python -m tf_ctr_ops.bench lookup --quick         # fewer repeats, smaller copy probe
    python -m tf_ctr_ops.bench lookup --json out.json
    python -m tf_ctr_ops.bench rewrite --quick        # a TF-native SavedModel before / after rewriting

Every suite is a function registered in `SUITES` (see `@suite`); it takes a
`Config` and returns a JSON-able dict with its cases and target verdicts.
`main(argv)` runs suites in one process and returns their results, so tests
call it directly.

Method, for every case: the fused and the native graph are each one
`tf.function` (graph mode) over a `tf.Variable` table and id containers
(`tf.SparseTensor` / `tf.RaggedTensor`) passed as arguments, as in a training
step; fused and native get separate Variables holding the same values (see
`lookup_suite` for why). Before anything is timed, the fused output, the native
output and the framework-free core output (`tf_ctr_ops._core` on the same NumPy
data) are compared, and a mismatch aborts the suite: a benchmark never times a
wrong answer. Then, after warm-up calls, they are timed in alternating blocks of
back-to-back calls (`time_interleaved`), each call forced to host with
`.numpy()` and timed with `time.perf_counter`; we report the median and the
p10/p90 of the calls. Effective bandwidth counts the table rows read
(nnz * D * itemsize) plus the output written (B * D * itemsize), against a
memory-copy bandwidth (read + write bytes / s) measured in the same run.
Targets are reported as met / not met; a missed target is not an error. The
share of CPU time other processes took during the run is reported too, since a
shared machine makes every figure slower and noisier.
"""

import argparse
import dataclasses
import gc
import json
import os
import platform
import sys
import threading
import time

import numpy as np

# ---------------------------------------------------------------------------
# Suite registry

SUITES = {}


def suite(name):
    """Registers `fn(cfg) -> dict` as the suite `name` of the command line."""

    def register(fn):
        SUITES[name] = fn
        return fn

    return register


@dataclasses.dataclass
class Config:
    batch: int = 4096
    vocab: int = 1_000_000
    dim: int = 32
    max_len: int = 99          # ids per row uniform in [1, max_len]
    zipf_a: float = 1.2
    seed: int = 0
    device: str = "/CPU:0"     # the op library is CPU-only for now; pin the native graphs too
    warmup: int = 3
    runs: int = 200            # timed calls per callable at most ...
    min_runs: int = 30         # ... and at least; in between, until ~budget_s per callable
    budget_s: float = 2.0
    block: int = 5             # timed calls in a row per callable, see time_interleaved
    copy_mb: int = 256
    copy_reps: int = 5
    quick: bool = False

    def quicken(self):
        self.quick = True
        self.warmup, self.runs, self.min_runs, self.budget_s, self.block = 1, 6, 3, 0.3, 3
        self.copy_mb, self.copy_reps = min(self.copy_mb, 64), 3
        return self


class BenchmarkMismatch(AssertionError):
    """The fused and reference outputs of a case disagree: nothing is timed."""


# ---------------------------------------------------------------------------
# Measurement helpers


def summarize(times_s):
    t = np.asarray(times_s, np.float64) * 1e3
    return {"median_ms": float(np.median(t)), "p10_ms": float(np.percentile(t, 10)),
            "p90_ms": float(np.percentile(t, 90)), "runs": int(t.size)}


def time_interleaved(fns, cfg):
    """Times the callables of `fns` {name: fn}; {name: summary of per-call times}.

    Rounds of blocks: in each round every callable runs once untimed (so a block
    starts from the caches and allocator state its own calls leave, not the
    previous callable's), then `cfg.block` timed calls back to back. Alternating
    blocks spreads drift of the machine (clocks, other tenants) over all
    callables alike. Stops after `cfg.runs` timed calls per callable, or once
    both `cfg.min_runs` calls and ~`cfg.budget_s` per callable are done.
    """
    for _ in range(cfg.warmup):
        for fn in fns.values():
            fn()
    times = {k: [] for k in fns}
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter()
        while True:
            for k, fn in fns.items():
                fn()
                for _ in range(cfg.block):
                    t0 = time.perf_counter()
                    fn()
                    times[k].append(time.perf_counter() - t0)
            n = len(next(iter(times.values())))
            if n >= cfg.runs or (n >= cfg.min_runs and time.perf_counter() - start > cfg.budget_s * len(fns)):
                break
    finally:
        if gc_was_enabled:
            gc.enable()
    return {k: summarize(v) for k, v in times.items()}


def copy_bandwidth(cfg):
    """np.copyto of a copy_mb array, 1 thread and one per CPU: (read + write) bytes / s."""
    n = cfg.copy_mb * (1 << 20) // 4
    src = np.ones(n, np.float32)
    dst = np.zeros(n, np.float32)  # touched, so page faults are not timed
    nthreads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    bounds = np.linspace(0, n, nthreads + 1).astype(np.int64)

    def threaded():
        ts = [threading.Thread(target=np.copyto, args=(dst[a:b], src[a:b]))
              for a, b in zip(bounds[:-1], bounds[1:])]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    out = {}
    for name, fn in (("1_thread", lambda: np.copyto(dst, src)), (f"{nthreads}_threads", threaded)):
        fn()
        ts = []
        for _ in range(cfg.copy_reps):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        out[name] = 2 * src.nbytes / float(np.median(ts)) / 1e9
    out["best_GBps"] = max(out.values())
    out["array_MB"] = cfg.copy_mb
    return out


def check_agreement(case, name, got, want, rtol=1e-5, atol=1e-5):
    """Raises BenchmarkMismatch unless got ~= want; returns the max abs error."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        raise BenchmarkMismatch(f"{case}: {name} has shape {got.shape}, expected {want.shape}")
    if not np.all(np.isfinite(got)):
        raise BenchmarkMismatch(f"{case}: {name} has non-finite values")
    try:
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    except AssertionError as e:
        raise BenchmarkMismatch(f"{case}: {name} disagrees with the reference\n{e}") from None
    return float(np.max(np.abs(got - want), initial=0.0))


# ---------------------------------------------------------------------------
# Environment


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
    except OSError:
        return platform.processor() or "unknown", []
    model, flags = "unknown", []
    for line in info.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model == "unknown":
            model = value.strip()
        elif key == "flags" and not flags:
            have = set(value.split())
            flags = [f for f in ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_bf16",
                                 "amx_tile") if f in have]
    return model, flags


def environment():
    import tensorflow as tf

    from tf_ctr_ops import _core
    from tf_ctr_ops._loader import build_info

    info = build_info()
    model, flags = _cpu_model()
    ncpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    intra = tf.config.threading.get_intra_op_parallelism_threads()
    inter = tf.config.threading.get_inter_op_parallelism_threads()
    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "tensorflow": tf.__version__,
        "cpu_model": model,
        "cpu_flags": flags,
        "nproc": ncpu,
        "tf_intra_op_threads": intra or f"0 (default: {ncpu})",
        "tf_inter_op_threads": inter or f"0 (default: {ncpu})",
        "build_info": {k: getattr(info, k) for k in dir(info) if k.isupper()},
        "core_has_cuda": bool(_core.has_cuda),
    }


class ForeignLoad:
    """CPU time used by other processes over an interval, as a fraction of all CPUs.

    From /proc/stat (all CPUs) minus this process's own CPU time: on a shared
    machine, timings taken while this is well above zero are not to be trusted.
    """

    def __init__(self):
        self.start = self._sample()

    @staticmethod
    def _sample():
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        tick = os.sysconf("SC_CLK_TCK")
        total, idle = sum(fields[:8]), fields[3] + fields[4]
        own = sum(os.times()[:4])
        return total / tick, (total - idle) / tick, own

    def fraction(self):
        end = self._sample()
        if self.start is None or end is None:
            return None
        total, busy, own = (e - s for e, s in zip(end, self.start))
        return max(0.0, (busy - own) / total) if total > 0 else None


def foreign_load_probe(seconds=0.5):
    probe = ForeignLoad()
    time.sleep(seconds)
    return probe.fraction()


def print_environment(env):
    print("environment")
    for k, v in env.items():
        if k == "build_info":
            v = ", ".join(f"{a}={b!r}" for a, b in v.items())
        elif isinstance(v, list):
            v = " ".join(v)
        print(f"  {k:22s} {v}")
    print()


def warn_foreign_load(when, fraction, limit=0.05):
    if fraction is not None and fraction > limit:
        print(f"WARNING: other processes used {100 * fraction:.0f}% of the CPUs {when}: the "
              "timings are disturbed (slow and noisy); rerun on a quiet machine\n")


# ---------------------------------------------------------------------------
# Data


def zipf_ids(rng, n, vocab, a):
    """Zipf(a) ranks - 1 (id 0 is the hottest), truncated to [0, vocab) by resampling."""
    ids = rng.zipf(a, n).astype(np.int64) - 1
    bad = ids >= vocab
    while bad.any():
        ids[bad] = rng.zipf(a, int(bad.sum())).astype(np.int64) - 1
        bad = ids >= vocab
    return ids


def make_bags(cfg, dist, rng):
    """CSR bags of B rows with uniform 1..max_len ids each, ids by distribution."""
    lengths = rng.integers(1, cfg.max_len + 1, size=cfg.batch)
    offsets = np.zeros(cfg.batch + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    nnz = int(offsets[-1])
    if dist == "zipf":
        ids = zipf_ids(rng, nnz, cfg.vocab, cfg.zipf_a)
    elif dist == "uniform":
        ids = rng.integers(0, cfg.vocab, size=nnz, dtype=np.int64)
    else:
        raise ValueError(f"unknown id distribution {dist!r}")
    rows = np.repeat(np.arange(cfg.batch, dtype=np.int64), lengths)
    cols = np.arange(nnz, dtype=np.int64) - offsets[rows]
    indices = np.stack([rows, cols], axis=1)
    return {"ids": ids, "offsets": offsets, "indices": indices, "nnz": nnz}


# ---------------------------------------------------------------------------
# lookup suite


LOOKUP_TARGETS = {  # case kind -> (label, minimum fused speedup over native)
    "lookup": ("(a) embedding_lookup_sparse(mean) vs tf.nn.embedding_lookup_sparse", 2.5),
    "hash": ("(b) hash_embedding(int64) vs as_string+to_hash_bucket_fast+tf.nn.els", 3.0),
}


@dataclasses.dataclass
class LookupCase:
    kind: str
    container: str          # "sparse" or "ragged": which input the graphs take
    fused: object           # tf.function
    native: object          # tf.function
    fused_op: str
    native_op: str
    core_kwargs: dict       # tf_ctr_ops._core.embedding_lookup arguments of the same lookup
    native_tensor: object = None  # tf.nn on a plain Tensor table (TF's fast path), for reference


def _lookup_graphs(cfg, fused_table, native_table, tensor_table):
    """The cases of the lookup suite, their graphs built over the given tables."""
    import tensorflow as tf

    import tf_ctr_ops as tco

    sparse_spec = tf.SparseTensorSpec([None, None], tf.int64)
    ragged_spec = tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1,
                                      row_splits_dtype=tf.int64)
    dev, V = cfg.device, cfg.vocab

    @tf.function(input_signature=[sparse_spec])
    def fused_lookup(sp):
        with tf.device(dev):
            return tco.embedding_lookup_sparse(fused_table, sp, None, combiner="mean")

    @tf.function(input_signature=[sparse_spec])
    def native_lookup(sp):
        with tf.device(dev):
            return tf.nn.embedding_lookup_sparse(native_table, sp, None, combiner="mean")

    @tf.function(input_signature=[sparse_spec])
    def native_lookup_tensor(sp):
        with tf.device(dev):
            return tf.nn.embedding_lookup_sparse(tensor_table, sp, None, combiner="mean")

    @tf.function(input_signature=[sparse_spec])
    def fused_hash(sp):
        with tf.device(dev):
            return tco.hash_embedding(fused_table, sp, combiner="mean")

    @tf.function(input_signature=[sparse_spec])
    def native_hash(sp):
        with tf.device(dev):
            buckets = tf.strings.to_hash_bucket_fast(tf.strings.as_string(sp.values), V)
            hashed = tf.SparseTensor(sp.indices, buckets, sp.dense_shape)
            return tf.nn.embedding_lookup_sparse(native_table, hashed, None, combiner="mean")

    @tf.function(input_signature=[ragged_spec])
    def fused_ragged(rt):
        with tf.device(dev):
            return tco.sparse_embedding(fused_table, rt, combiner="mean")

    @tf.function(input_signature=[ragged_spec])
    def native_ragged(rt):
        with tf.device(dev):
            return tf.nn.embedding_lookup_sparse(native_table, rt, None, combiner="mean")

    return [
        LookupCase("lookup", "sparse", fused_lookup, native_lookup, "tco.embedding_lookup_sparse",
                   "tf.nn.embedding_lookup_sparse", {}, native_tensor=native_lookup_tensor),
        LookupCase("hash", "sparse", fused_hash, native_hash, "tco.hash_embedding",
                   "as_string+to_hash_bucket_fast+tf.nn.embedding_lookup_sparse", {"id_mode": "hash"}),
        LookupCase("ragged", "ragged", fused_ragged, native_ragged, "tco.sparse_embedding",
                   "tf.nn.embedding_lookup_sparse(ragged)", {"invalid_ids": "skip_padding"}),
    ]


@suite("lookup")
def lookup_suite(cfg):
    """Fused pooled mean lookups vs tf.nn, for Zipf and uniform ids.

    Cases: (a) lookup, tco.embedding_lookup_sparse vs tf.nn.embedding_lookup_sparse on a
    SparseTensor; (b) hash, tco.hash_embedding vs as_string + to_hash_bucket_fast +
    tf.nn.embedding_lookup_sparse, with the same int64 ids used as raw keys (V buckets);
    (c) ragged, tco.sparse_embedding vs tf.nn.embedding_lookup_sparse on a RaggedTensor.
    Zipf ids are ranks (id 0 hottest), truncated to [0, V) by resampling.
    """
    import tensorflow as tf

    from tf_ctr_ops import _core

    B, V, D = cfg.batch, cfg.vocab, cfg.dim
    rng = np.random.default_rng(cfg.seed)
    t0 = time.perf_counter()
    params = rng.standard_normal((V, D), dtype=np.float32)
    params *= np.float32(0.05)
    # One Variable per side: tf.nn's Variable path gathers with ResourceGather, which
    # switches its Variable to copy-on-read mode, after which every plain read (what
    # the fused op does) copies the whole table. Sharing one Variable would charge
    # that copy to the fused side depending on run order; it is measured on its own
    # below (copy_on_read). A plain Tensor table shows TF's best native path.
    with tf.device(cfg.device):
        fused_table = tf.Variable(params, name="fused_table")
        native_table = tf.Variable(params, name="native_table")
        tensor_table = tf.constant(params)
    graphs = _lookup_graphs(cfg, fused_table, native_table, tensor_table)
    setup_s = time.perf_counter() - t0

    copy = copy_bandwidth(cfg)
    print(f"lookup suite: B={B} V={V} D={D} ids/row U[1,{cfg.max_len}] "
          f"table {params.nbytes / 2**20:.0f} MiB float32 (tf.Variable), setup {setup_s:.1f}s")
    print(f"ids: Zipf({cfg.zipf_a}) ranks truncated to [0, V), or uniform; hash cases use the same "
          "ids as raw int64 keys into V buckets")
    print(f"memory copy: {copy['best_GBps']:.1f} GB/s read+write "
          f"({', '.join(f'{k} {v:.1f}' for k, v in copy.items() if k.endswith(('thread', 'threads')))}; "
          f"np.copyto of {cfg.copy_mb} MiB, median of {cfg.copy_reps})")
    print()

    cases, inputs = [], {}
    for dist in ("zipf", "uniform"):
        bags = make_bags(cfg, dist, rng)
        ids, offsets, nnz = bags["ids"], bags["offsets"], bags["nnz"]
        sp = tf.SparseTensor(tf.constant(bags["indices"]), tf.constant(ids), [B, cfg.max_len])
        rt = tf.RaggedTensor.from_row_splits(tf.constant(ids), tf.constant(offsets), validate=False)
        inputs[dist] = sp
        for g in graphs:
            case = f"{g.kind}/{dist}"
            x = sp if g.container == "sparse" else rt
            fns = {"fused": lambda g=g: g.fused(x).numpy(),
                   "native": lambda g=g: g.native(x).numpy(),
                   "core": lambda g=g: _core.embedding_lookup(params, ids, offsets, combiner="mean",
                                                              **g.core_kwargs)}
            if g.native_tensor is not None:
                fns["native_tensor"] = lambda g=g: g.native_tensor(x).numpy()

            # Correctness first: a benchmark never times a wrong answer.
            got = fns["fused"]()
            errors = {k: check_agreement(case, f"{k} vs fused", fn(), got)
                      for k, fn in fns.items() if k != "fused"}

            t = time_interleaved(fns, cfg)
            nbytes = (nnz + B) * D * params.itemsize
            fused_ms = t["fused"]["median_ms"]
            gbps = {k: nbytes / (v["median_ms"] * 1e-3) / 1e9 for k, v in t.items()}
            entry = {
                "case": case, "kind": g.kind, "dist": dist, "container": g.container,
                "fused_op": g.fused_op, "native_op": g.native_op,
                "batch": B, "vocab": V, "dim": D, "nnz": nnz, "bytes": nbytes,
                **t,
                "speedup": t["native"]["median_ms"] / fused_ms,
                "tf_overhead_ms": fused_ms - t["core"]["median_ms"],
                "GBps": gbps, "frac_copy": gbps["fused"] / copy["best_GBps"],
                "max_abs_err": errors,
            }
            if "native_tensor" in t:
                entry["speedup_vs_native_tensor"] = t["native_tensor"]["median_ms"] / fused_ms
            cases.append(entry)

    copy_on_read = copy_on_read_probe(cfg, params, graphs[0].fused, inputs["zipf"],
                                      next(c for c in cases if c["case"] == "lookup/zipf"),
                                      copy["best_GBps"])

    targets = []
    for c in cases:
        if c["kind"] in LOOKUP_TARGETS:
            label, need = LOOKUP_TARGETS[c["kind"]]
            targets.append({"target": label, "dist": c["dist"], "min_speedup": need,
                            "speedup": c["speedup"], "met": bool(c["speedup"] >= need)})
    result = {"suite": "lookup", "config": dataclasses.asdict(cfg), "copy_bandwidth": copy,
              "cases": cases, "targets": targets, "copy_on_read": copy_on_read}
    print_lookup(result)
    return result


def copy_on_read_probe(cfg, params, fused_lookup, sp, reference_case, copy_GBps):
    """The fused lookup on a Variable in copy-on-read mode, beside one that is not.

    Any sparse access to a resource Variable (ResourceGather, as tf.nn does for a
    Variable, or a sparse optimizer update such as ResourceScatterAdd) puts it in
    copy-on-read mode, where every plain ReadVariableOp copies the whole table.
    The wrappers read tables with read_value_no_copy() so they do not; this probe
    guards that: extra_ms should be ~0, not ~copy_cost_ms.
    """
    import tensorflow as tf

    import tf_ctr_ops as tco

    with tf.device(cfg.device):
        cor_table = tf.Variable(params, name="copy_on_read_table")
    cor_table.sparse_read(tf.constant([0], tf.int64))  # ResourceGather: copy-on-read from now on

    @tf.function(input_signature=[tf.SparseTensorSpec([None, None], tf.int64)])
    def fused_cor(sp):
        with tf.device(cfg.device):
            return tco.embedding_lookup_sparse(cor_table, sp, None, combiner="mean")

    check_agreement("lookup/zipf copy-on-read", "fused (copy-on-read) vs fused",
                    fused_cor(sp).numpy(), fused_lookup(sp).numpy(), rtol=0, atol=0)
    t = time_interleaved({"fused": lambda: fused_lookup(sp).numpy(),
                          "fused_copy_on_read": lambda: fused_cor(sp).numpy()}, cfg)
    extra = t["fused_copy_on_read"]["median_ms"] - t["fused"]["median_ms"]
    out = {"case": "lookup/zipf", "table_MiB": params.nbytes / 2**20, **t, "extra_ms": extra,
           "copy_cost_ms": 2 * params.nbytes / (copy_GBps * 1e9) * 1e3,
           "speedup_vs_native": reference_case["native"]["median_ms"] / t["fused_copy_on_read"]["median_ms"]}
    del cor_table
    return out


def _fmt_t(s):
    return f"{s['median_ms']:.2f} [{s['p10_ms']:.2f}-{s['p90_ms']:.2f}]"


def print_lookup(result):
    cols = [("case", 15, "<"), ("fused ms [p10-p90]", 21, ">"), ("native ms [p10-p90]", 21, ">"),
            ("speedup", 8, ">"), ("core ms", 8, ">"), ("TF ovh ms", 9, ">"), ("GB/s", 6, ">"),
            ("/copy", 6, ">"), ("native GB/s", 11, ">"), ("vs Tensor-table native", 22, ">")]
    line = lambda vals: " ".join(f"{v:{a}{w}}" for v, (_, w, a) in zip(vals, cols))  # noqa: E731
    hdr = line([c[0] for c in cols])
    print(hdr)
    print("-" * len(hdr))
    for c in result["cases"]:
        vt = ""
        if "native_tensor" in c:
            vt = f"{c['native_tensor']['median_ms']:.2f} ms: {c['speedup_vs_native_tensor']:.2f}x"
        print(line([c["case"], _fmt_t(c["fused"]), _fmt_t(c["native"]), f"{c['speedup']:.2f}x",
                    f"{c['core']['median_ms']:.2f}", f"{c['tf_overhead_ms']:.2f}", f"{c['GBps']['fused']:.3g}",
                    f"{c['frac_copy']:.2f}", f"{c['GBps']['native']:.3g}", vt]))
    if result["cases"]:
        c0 = result["cases"][0]
        print(f"nnz ~{c0['nnz']}; times are medians over alternating blocks of back-to-back calls; "
              f"GB/s = (nnz + B) * D * 4 bytes / median time; /copy = fraction of the "
              f"{result['copy_bandwidth']['best_GBps']:.1f} GB/s copy bandwidth; core = "
              "tf_ctr_ops._core on the NumPy data, no TF; TF ovh = fused - core; vs Tensor-table "
              "native = tf.nn on a plain Tensor table, TF's fast path (no Unique, no ResourceGather), "
              "and the fused speedup over it")
    cor = result.get("copy_on_read")
    if cor:
        print(f"copy-on-read check: fused lookup/zipf on a Variable in copy-on-read mode (as after any "
              f"sparse read or sparse optimizer update of it): {_fmt_t(cor['fused_copy_on_read'])} ms vs "
              f"{_fmt_t(cor['fused'])} ms, {cor['extra_ms']:+.2f} ms per call (copying the "
              f"{cor['table_MiB']:.0f} MiB table would cost ~{cor['copy_cost_ms']:.1f} ms); speedup over "
              f"native there: {cor['speedup_vs_native']:.2f}x")
    print()
    for t in result["targets"]:
        verdict = "met" if t["met"] else "NOT MET"
        print(f"target {t['target']} >= {t['min_speedup']}x [{t['dist']}]: {t['speedup']:.2f}x  {verdict}")
    print()


# ---------------------------------------------------------------------------
# Command line


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serializable: {type(o)}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m tf_ctr_ops.bench", description=__doc__.split("\n")[0])
    p.add_argument("suites", nargs="+", choices=sorted(SUITES), help="suites to run, in order")
    p.add_argument("--quick", action="store_true", help="few repeats and a small copy probe (smoke runs)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    d = Config()
    p.add_argument("--batch", type=int, default=d.batch)
    p.add_argument("--vocab", type=int, default=d.vocab)
    p.add_argument("--dim", type=int, default=d.dim)
    p.add_argument("--max-len", type=int, default=d.max_len, help="ids per row are uniform in [1, MAX_LEN]")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--runs", type=int, default=None,
                   help=f"max timed calls per callable (default {d.runs}; at least {d.min_runs}, else "
                        f"~{d.budget_s:g} s per callable)")
    p.add_argument("--copy-mb", type=int, default=None, help=f"copy-probe array size (default {d.copy_mb})")
    return p.parse_args(argv)


def config_from_args(args):
    cfg = Config(batch=args.batch, vocab=args.vocab, dim=args.dim, max_len=args.max_len, seed=args.seed)
    if args.quick:
        cfg.quicken()
    if args.runs is not None:
        cfg.runs = args.runs
        cfg.min_runs = min(cfg.min_runs, args.runs)
    if args.copy_mb is not None:
        cfg.copy_mb = args.copy_mb
    return cfg


def main(argv=None):
    """Runs the suites named in argv; returns {"env": ..., "suites": {name: result}}."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    args = parse_args(argv)
    cfg = config_from_args(args)
    env = environment()
    env["foreign_cpu_load_before"] = foreign_load_probe()
    print_environment(env)
    warn_foreign_load("just before the run", env["foreign_cpu_load_before"])
    t0 = time.perf_counter()
    load = ForeignLoad()
    results = {"env": env, "suites": {}}
    for name in args.suites:
        results["suites"][name] = SUITES[name](dataclasses.replace(cfg))
    results["wall_s"] = time.perf_counter() - t0
    env["foreign_cpu_load_during"] = load.fraction()
    warn_foreign_load("during the run", env["foreign_cpu_load_during"])
    during = env["foreign_cpu_load_during"]
    print(f"done in {results['wall_s']:.1f}s"
          + (f"; other processes used {100 * during:.1f}% of the CPUs meanwhile" if during is not None else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2, default=_json_default)
        print(f"wrote {args.json}")
    return results


# The string and rewrite suites live beside this module and register themselves on import.
from tf_ctr_ops import bench_rewrite, bench_strings  # noqa: E402,F401


if __name__ == "__main__":
    # Run the importable module's main: bench_strings and bench_rewrite register their suites
    # there, not in this __main__ copy.
    from tf_ctr_ops import bench as _bench

    _bench.main()
    sys.exit(0)

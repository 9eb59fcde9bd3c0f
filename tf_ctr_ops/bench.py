"""Benchmarks of the fused tf-ctr-ops kernels against the TF-native graphs they replace.

    python -m tf_ctr_ops.bench all --quick                  # every suite, a representative subset (< 2 min)
    python -m tf_ctr_ops.bench lookup --grid full           # the whole grid (long: prints an estimate)
    python -m tf_ctr_ops.bench string                       # only the headline shape and its targets
    python -m tf_ctr_ops.bench all --quick --json out.json --markdown out.md --plot out.png
    python -m tf_ctr_ops.bench lookup --device gpu          # the same on '/GPU:0'
    python -m tf_ctr_ops.bench rewrite --quick              # a TF-native SavedModel before / after rewriting

Every suite is a function registered in `SUITES` (see `@suite`); it takes a
`Config` and returns a JSON-able dict with its cases and target verdicts.
Modules `tf_ctr_ops/bench_*.py` are imported on import of this one, so a suite
registers itself by living there. `main(argv)` runs suites in one process and
returns their results, so tests call it directly.

Shapes: `Config.shapes` lists the `Shape`s (batch, table rows, dim, ids per
row, id distribution) a suite runs. The grid is batch 1, 64, 1024, 8192 x
dim 8, 32, 128 x about 1, 10, 50 ids per row x uniform and Zipf ids x 1e5 and
1e7 table rows; tables that do not fit in the memory available are skipped,
with a note. The headline shape (B=4096, V=1e6, D=32, ~50 ids per row, both
distributions) carries the targets. `--grid full` runs it and the whole grid,
`--quick` runs it and a small subset of the grid with few repeats, and the
default (`--grid headline`) runs only it: the README Quickstart, and so CI, run
`tf-ctr-ops bench lookup`, which must stay short. `--batch/--vocab/--dim/--max-len`
replace the headline by one custom shape and run only that.

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

On GPU (`--device gpu`) both graphs are placed on '/GPU:0' with their tables;
string inputs stay host strings, so the fused side packs them on the host and
copies the packed bytes to the device inside the timed call, as serving does.
The copy bandwidth is then the device's (an elementwise read + write of
copy_mb), and the core is not timed: it works on host arrays here.
"""

import argparse
import contextlib
import dataclasses
import datetime
import gc
import importlib
import json
import math
import os
import pkgutil
import platform
import sys
import threading
import time

import numpy as np

# ---------------------------------------------------------------------------
# Suite registry

SUITES = {}
_ESTIMATES = {}
SUITE_ORDER = ("lookup", "string", "multi", "rewrite")  # the order of `all`; others follow by name


def suite(name, estimate=None):
    """Registers `fn(cfg) -> dict` as the suite `name` of the command line.

    `estimate(cfg) -> (steps, seconds)`, if given, lets the progress bar count
    the steps the suite reports with `progress()` and lets the run print its
    expected duration; a suite without one is a single step.
    """

    def register(fn):
        SUITES[name] = fn
        if estimate is not None:
            _ESTIMATES[name] = estimate
        return fn

    return register


class BenchmarkError(RuntimeError):
    """The benchmark cannot run as asked (no GPU, no matplotlib, ...); the message says why."""


class BenchmarkMismatch(AssertionError):
    """The fused and reference outputs of a case disagree: nothing is timed."""


# ---------------------------------------------------------------------------
# Shapes and configuration

GRID_BATCHES = (1, 64, 1024, 8192)
GRID_DIMS = (8, 32, 128)
GRID_IDS_PER_ROW = (1, 10, 50)
GRID_DISTS = ("uniform", "zipf")
GRID_VOCABS = (100_000, 10_000_000)
DISTS = ("zipf", "uniform")


def max_len_for(ids_per_row):
    """Row lengths are uniform in [1, max_len]: max_len = 2n - 1 gives a mean of n."""
    return 2 * ids_per_row - 1


@dataclasses.dataclass(frozen=True)
class Shape:
    batch: int
    vocab: int
    dim: int
    max_len: int            # ids per row uniform in [1, max_len], about (1 + max_len) / 2
    dist: str               # "zipf" or "uniform"
    headline: bool = False  # targets are judged here

    @property
    def ids_per_row(self):
        return (1 + self.max_len) / 2

    def label(self):
        return f"B={self.batch} V={_si(self.vocab)} D={self.dim} ids~{self.ids_per_row:g}"


def _si(n):
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1000 and n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)


HEADLINE = dict(batch=4096, vocab=1_000_000, dim=32, max_len=max_len_for(50))


def headline_shapes(batch=HEADLINE["batch"], vocab=HEADLINE["vocab"], dim=HEADLINE["dim"],
                    max_len=HEADLINE["max_len"]):
    return [Shape(batch, vocab, dim, max_len, d, headline=True) for d in DISTS]


def full_grid():
    return [Shape(b, v, d, max_len_for(n), dist)
            for v in GRID_VOCABS for d in GRID_DIMS for b in GRID_BATCHES
            for n in GRID_IDS_PER_ROW for dist in GRID_DISTS]


def quick_grid():
    """A representative subset: every batch size at one shape, then each other axis varied alone."""
    base = dict(vocab=100_000, dim=32, max_len=max_len_for(10), dist="zipf")
    shapes = [Shape(batch=b, **base) for b in GRID_BATCHES]
    at_1024 = dict(base, batch=1024)
    shapes += [Shape(**dict(at_1024, dim=d)) for d in GRID_DIMS if d != base["dim"]]
    shapes += [Shape(**dict(at_1024, max_len=max_len_for(n))) for n in GRID_IDS_PER_ROW
               if max_len_for(n) != base["max_len"]]
    shapes += [Shape(**dict(at_1024, dist="uniform")),
               Shape(**dict(at_1024, dim=8, vocab=GRID_VOCABS[-1], dist="uniform"))]
    return shapes


GRIDS = {"headline": lambda: [], "quick": quick_grid, "full": full_grid}


@dataclasses.dataclass
class Config:
    # The headline (or the one custom) shape; suites that know no grid use these.
    batch: int = HEADLINE["batch"]
    vocab: int = HEADLINE["vocab"]
    dim: int = HEADLINE["dim"]
    max_len: int = HEADLINE["max_len"]  # ids per row uniform in [1, max_len]
    zipf_a: float = 1.2
    seed: int = 0
    device: str = "/CPU:0"     # pin the native graphs too; "/GPU:0" with --device gpu
    grid: str = "headline"     # which shapes besides the headline: see GRIDS
    shapes: tuple = ()         # the Shapes to run; empty: the headline shapes of the fields above
    warmup: int = 3
    runs: int = 200            # timed calls per callable at most ...
    min_runs: int = 30         # ... and at least; in between, until ~budget_s per callable
    budget_s: float = 2.0
    block: int = 5             # timed calls in a row per callable, see time_interleaved
    settle: int = 3            # untimed calls before each block, see time_interleaved
    copy_mb: int = 256
    copy_reps: int = 5
    quick: bool = False
    model: str = ""            # rewrite suite: a real model style (bench_models.MODELS); "": its Criteo model
    features: int = 0          # rewrite suite: time the rewrite alone for up to this many features

    def quicken(self):
        self.quick = True
        self.warmup, self.runs, self.min_runs, self.budget_s, self.block, self.settle = 1, 6, 3, 0.3, 3, 1
        self.copy_mb, self.copy_reps = min(self.copy_mb, 64), 3
        return self

    @property
    def on_gpu(self):
        return "GPU" in self.device.upper()

    def shape_list(self):
        return list(self.shapes) or headline_shapes(self.batch, self.vocab, self.dim, self.max_len)

    def at(self, shape):
        """This config at one shape, for helpers that read batch/vocab/dim/max_len (make_bags)."""
        return dataclasses.replace(self, batch=shape.batch, vocab=shape.vocab, dim=shape.dim,
                                   max_len=shape.max_len, shapes=())


def shape_fields(shape):
    return {"batch": shape.batch, "vocab": shape.vocab, "dim": shape.dim, "max_len": shape.max_len,
            "ids_per_row": shape.ids_per_row, "dist": shape.dist, "headline": shape.headline,
            "shape": shape.label()}


def group_by_table(shapes, cap_vocab=None):
    """{(V, D): [shapes]} in first-seen order, so each table is built once."""
    groups = {}
    for s in shapes:
        if cap_vocab is not None and s.vocab > cap_vocab:
            s = dataclasses.replace(s, vocab=cap_vocab)
        if s not in groups.setdefault((s.vocab, s.dim), []):
            groups[(s.vocab, s.dim)].append(s)
    return groups


# ---------------------------------------------------------------------------
# Memory: tables of 1e7 rows need several GiB each; skip what cannot fit


def mem_available_bytes():
    """MemAvailable of /proc/meminfo (what can be allocated without swapping), or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def memory_shortfall(need_bytes, headroom=0.8):
    """None when `need_bytes` fits in `headroom` of the available memory, else a note saying why not."""
    avail = mem_available_bytes()
    if avail is None or need_bytes <= headroom * avail:
        return None
    return (f"needs ~{need_bytes / 2**30:.1f} GiB of host memory, {avail / 2**30:.1f} GiB available "
            f"(we use at most {headroom:.0%})")


def host_table_copies(cfg, on_host, on_device):
    """Host copies of a table at the peak: the NumPy ones, the TF ones when they live on the host,
    and one transient (the tensor tf.Variable converts the NumPy array to)."""
    return on_host + (0 if cfg.on_gpu else on_device) + 1


# ---------------------------------------------------------------------------
# Progress bar


class Progress:
    """A one-line text progress bar on a terminal's stderr, redrawn in place.

    Disabled (every call a no-op) unless its stream is a terminal: in a log
    file or a pipe, carriage returns would only add noise. Lines printed to
    stdout meanwhile are kept clean by `clear()` (see `_BarAwareStream`).
    """

    def __init__(self, total, stream=None, enabled=None, width=30):
        self.stream = sys.stderr if stream is None else stream
        isatty = getattr(self.stream, "isatty", lambda: False)
        self.enabled = bool(isatty()) if enabled is None else enabled
        self.total, self.done, self.width = max(1, total), 0, width
        self.label, self.start, self.shown = "", time.perf_counter(), False

    def step(self, label=""):
        self.label = label
        self.done = min(self.total, self.done + 1)
        self.draw()

    def set_label(self, label):
        self.label = label
        self.draw()

    def line(self):
        frac = self.done / self.total
        filled = int(round(frac * self.width))
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = time.perf_counter() - self.start
        eta = f" eta {_duration(elapsed / self.done * (self.total - self.done))}" if self.done else ""
        return f"[{bar}] {self.done}/{self.total} {_duration(elapsed)}{eta} {self.label}"[:120]

    def draw(self):
        if self.enabled:
            self.stream.write("\r" + self.line() + "\x1b[K")
            self.stream.flush()
            self.shown = True

    def clear(self):
        if self.enabled and self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False

    def close(self):
        self.clear()


class _BarAwareStream:
    """Wraps stdout so that text printed while the bar is shown starts on a clean line."""

    def __init__(self, stream, bar):
        self._stream, self._bar = stream, bar

    def write(self, text):
        if text:
            self._bar.clear()
        return self._stream.write(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)


_PROGRESS = Progress(1, enabled=False)


def progress(label=""):
    """Suites call this once per step they announced in their estimate, when it is done."""
    _PROGRESS.step(label)


def progress_label(label):
    """What the bar says is running now."""
    _PROGRESS.set_label(label)


def _duration(s):
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


# ---------------------------------------------------------------------------
# Measurement helpers


def summarize(times_s):
    t = np.asarray(times_s, np.float64) * 1e3
    return {"median_ms": float(np.median(t)), "p10_ms": float(np.percentile(t, 10)),
            "p90_ms": float(np.percentile(t, 90)), "runs": int(t.size)}


def time_interleaved(fns, cfg):
    """Times the callables of `fns` {name: fn}; {name: summary of per-call times}.

    Rounds of blocks: in each round every callable runs `cfg.settle` times
    untimed (so a block starts from the caches and allocator state its own
    calls leave, not the previous callable's: after the native string
    composition, whose tokens evict the caches, a fused call takes ~3 calls to
    get back to its own steady state), then `cfg.block` timed calls back to
    back. Alternating
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
                for _ in range(cfg.settle):
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


def estimate_case_s(cfg, callables, call_s):
    """Rough wall time of one time_interleaved call, for the estimate printed before a run."""
    rounds = math.ceil(cfg.min_runs / cfg.block)
    calls = cfg.warmup + rounds * (cfg.block + cfg.settle)
    return callables * max(min(cfg.budget_s, cfg.runs * call_s), calls * call_s)


def measure_copy_bandwidth(cfg):
    """The machine's limit the effective bandwidths are read against: host or device memory."""
    return device_copy_bandwidth(cfg) if cfg.on_gpu else copy_bandwidth(cfg)


def copy_bandwidth(cfg):
    """np.copyto of a copy_mb array, 1 thread and one per CPU: (read + write) bytes / s."""
    n = cfg.copy_mb * (1 << 20) // 4
    src = np.ones(n, np.float32)
    dst = np.zeros(n, np.float32)  # touched, so page faults are not timed
    nthreads = _ncpu()
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
        out[name] = 2 * src.nbytes / _median_time(fn, cfg.copy_reps) / 1e9
    out["best_GBps"] = max(out.values())
    out["array_MB"] = cfg.copy_mb
    out["method"] = "np.copyto (host)"
    return out


def device_copy_bandwidth(cfg):
    """An elementwise read + write of copy_mb on the device: its memory bandwidth, roughly.

    x + v with v a Variable, so that Grappler cannot fold it away; only one
    element comes back to the host, to wait for the kernel.
    """
    import tensorflow as tf

    n = cfg.copy_mb * (1 << 20) // 4
    with tf.device(cfg.device):
        src = tf.ones([n], tf.float32)
        zero = tf.Variable(0.0)

    @tf.function
    def copy():
        with tf.device(cfg.device):
            return (src + zero)[:1]

    fn = lambda: copy().numpy()  # noqa: E731
    fn()
    gbps = 2 * n * 4 / _median_time(fn, max(cfg.copy_reps, 10)) / 1e9
    return {"device": gbps, "best_GBps": gbps, "array_MB": cfg.copy_mb,
            "method": f"x + 0 on {cfg.device} (read + write)"}


def _median_time(fn, reps):
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


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


def timed_entry(case, fns, cfg, nbytes, copy, rtol=1e-5, atol=1e-5, native_paths=None):
    """Checks every callable of `fns` against fns["fused"], then times them all: one case's record.

    native_paths: {key of fns: description} when TF has several native ways to
    compute the case; the fastest of them is the case's "native" (named in
    "native_path"), the others are kept under their keys.
    """
    got = fns["fused"]()
    errors = {k: check_agreement(case, f"{k} vs fused", fn(), got, rtol=rtol, atol=atol)
              for k, fn in fns.items() if k != "fused"}
    t = time_interleaved(fns, cfg)
    native_path = None
    if native_paths:
        native_path = min(native_paths, key=lambda k: t[k]["median_ms"])
        t["native"], errors["native"] = t[native_path], errors[native_path]
    fused_ms = t["fused"]["median_ms"]
    gbps = {k: nbytes / (v["median_ms"] * 1e-3) / 1e9 for k, v in t.items()}
    entry = {"case": case, **t, "bytes": nbytes, "speedup": t["native"]["median_ms"] / fused_ms,
             "GBps": gbps, "frac_copy": gbps["fused"] / copy["best_GBps"], "max_abs_err": errors}
    if "core" in t:
        entry["tf_overhead_ms"] = fused_ms - t["core"]["median_ms"]
    if native_path:
        entry["native_path"] = native_paths[native_path]
    return entry


def core_or_none(cfg, fn):
    """The core callable of a case, or None on GPU (the core runs on host arrays here)."""
    return None if cfg.on_gpu else fn


# The issues state each target on Zipf ids (real CTR id traffic); the uniform
# cases at the headline shape are reported beside them, without a verdict.
TARGET_DIST = "zipf"


def targets_at_headline(cases, targets):
    """Verdicts for the Zipf cases at the headline shape; `targets` maps a series to (label, min speedup)."""
    out = []
    for c in cases:
        if c.get("headline") and c.get("series") in targets and c.get("dist") == TARGET_DIST:
            label, need = targets[c["series"]]
            out.append({"target": label, "dist": c["dist"], "shape": c["shape"], "min_speedup": need,
                        "speedup": c["speedup"], "met": bool(c["speedup"] >= need)})
    return out


def skip_note(suite_name, shapes, reason):
    print(f"{suite_name}: skipped {len(shapes)} shape(s) with V={_si(shapes[0].vocab)} D={shapes[0].dim}: {reason}")
    return [{"shape": s.label(), "dist": s.dist, "reason": reason} for s in shapes]


def skip_table_group(suite_name, shapes, reason):
    """skip_note for the shapes of one table that does not fit, with the progress bar moved past them."""
    notes = skip_note(suite_name, shapes, reason)
    for s in shapes:
        progress(f"{suite_name} {s.label()} {s.dist}: skipped")
    return notes


# ---------------------------------------------------------------------------
# Environment


def _ncpu():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


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


def _gpu_name(tf, device):
    gpus = tf.config.list_physical_devices("GPU")
    index = int(device.rsplit(":", 1)[-1]) if device[-1:].isdigit() else 0
    if index >= len(gpus):
        return None
    details = tf.config.experimental.get_device_details(gpus[index])
    return details.get("device_name", gpus[index].name)


def environment(device="/CPU:0"):
    import tensorflow as tf

    import tf_ctr_ops
    from tf_ctr_ops import _core
    from tf_ctr_ops._loader import build_info

    info = build_info()
    model, flags = _cpu_model()
    ncpu = _ncpu()
    intra = tf.config.threading.get_intra_op_parallelism_threads()
    inter = tf.config.threading.get_inter_op_parallelism_threads()
    env = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "tensorflow": tf.__version__,
        "tf_ctr_ops": tf_ctr_ops.__version__,
        "cpu_model": model,
        "cpu_flags": flags,
        "nproc": ncpu,
        "memory_available_GiB": round((mem_available_bytes() or 0) / 2**30, 1),
        "tf_intra_op_threads": intra or f"0 (default: {ncpu})",
        "tf_inter_op_threads": inter or f"0 (default: {ncpu})",
        "device": device,
        "build_info": {k: getattr(info, k) for k in dir(info) if k.isupper()},
        "core_has_cuda": bool(_core.has_cuda),
    }
    if "GPU" in device.upper():
        env["gpu_name"] = _gpu_name(tf, device)
    return env


def require_gpu():
    """Raises BenchmarkError unless TF sees a GPU and the op library has GPU kernels."""
    import tensorflow as tf

    from tf_ctr_ops._loader import build_info

    if not tf.config.list_physical_devices("GPU"):
        raise BenchmarkError(
            "--device gpu: TensorFlow sees no GPU (tf.config.list_physical_devices('GPU') is empty). "
            "Check nvidia-smi, the driver, CUDA_VISIBLE_DEVICES, and that tensorflow was installed "
            "with GPU support (pip install 'tensorflow[and-cuda]'); or run with --device cpu.")
    if not build_info().WITH_CUDA:
        raise BenchmarkError(
            "--device gpu: this tf_ctr_ops was built without CUDA (tf_ctr_ops/_build_info.py: "
            "WITH_CUDA = False), so its ops would silently run on the CPU. Rebuild with a CUDA toolkit "
            "(TF_CTR_OPS_CUDA=1 pip install --no-build-isolation --force-reinstall .).")


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


def random_table(rng, vocab, dim):
    """[V, D] float32 standard normal * 0.05, generated in chunks (a 1e7-row table is GiBs)."""
    params = np.empty((vocab, dim), np.float32)
    step = max(1, (1 << 24) // max(dim, 1))
    for a in range(0, vocab, step):
        rng.standard_normal(params[a:a + step].shape, dtype=np.float32, out=params[a:a + step])
    params *= np.float32(0.05)
    return params


# ---------------------------------------------------------------------------
# lookup suite


LOOKUP_TARGETS = {  # series -> (label, minimum fused speedup over native), at the headline shape
    "lookup": ("(a) embedding_lookup_sparse(mean) vs tf.nn.embedding_lookup_sparse", 2.5),
    "hash": ("(b) hash_embedding(int64) vs as_string+to_hash_bucket_fast+tf.nn.els", 3.0),
}


@dataclasses.dataclass
class LookupCase:
    kind: str
    container: str          # "sparse" or "ragged": which input the graphs take
    fused: object           # tf.function
    natives: dict           # key -> (description, tf.function): TF's native ways to the same result
    fused_op: str
    native_op: str
    core_kwargs: dict       # tf_ctr_ops._core.embedding_lookup arguments of the same lookup; None: no core
    native_tensor: object = None  # tf.nn on a plain Tensor table (TF's fast path), for reference
    extra: dict = dataclasses.field(default_factory=dict)  # more fused variants, timed beside


# TF 2.21's two native paths for an unweighted lookup of one table: with
# allow_fast_lookup it gathers rows per id with no Unique (and its gradient is
# dense over the table); without, it may take the Unique + Gather path. Every
# case is timed against both and compared with the faster.
NATIVE_PATHS = {"native_unique": "allow_fast_lookup=False", "native_fast": "allow_fast_lookup=True"}


def _grad_digest(grad, buckets=1024):
    """A small digest of an IndexedSlices gradient that does not depend on its
    index order or on whether rows of one index are merged: per-bucket sums."""
    import tensorflow as tf

    rows = tf.reduce_sum(tf.reshape(grad.values, [tf.shape(grad.values)[0], -1]), axis=1)
    return tf.math.unsorted_segment_sum(rows, tf.math.floormod(grad.indices, buckets), buckets)


def _lookup_graphs(cfg, fused_table, native_table, tensor_table, vocab):
    """The cases of the lookup suite, their graphs built over the given tables."""
    import tensorflow as tf

    import tf_ctr_ops as tco
    from tf_ctr_ops import ops as tco_ops

    sparse_spec = tf.SparseTensorSpec([None, None], tf.int64)
    ragged_spec = tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1,
                                      row_splits_dtype=tf.int64)
    dev, V = cfg.device, vocab

    def graph(fn, spec):
        @tf.function(input_signature=[spec])
        def on_device(x):
            with tf.device(dev):
                return fn(x)
        return on_device

    def natives(lookup, spec):
        """The native tf.functions of `lookup(x, allow_fast_lookup)`, one per path."""
        return {key: (label, graph(lambda x, fast=(key == "native_fast"): lookup(x, fast), spec))
                for key, label in NATIVE_PATHS.items()}

    def native_sparse(table):
        return lambda sp, fast: tf.nn.embedding_lookup_sparse(table, sp, None, combiner="mean",
                                                                allow_fast_lookup=fast)

    def native_hash(sp, fast):
        buckets = tf.strings.to_hash_bucket_fast(tf.strings.as_string(sp.values), V)
        hashed = tf.SparseTensor(sp.indices, buckets, sp.dense_shape)
        return native_sparse(native_table)(hashed, fast)

    def with_grad(lookup, table):
        """The lookup's forward and params gradient (of the sum of its outputs), as a digest."""
        def run(x, *args):
            with tf.GradientTape() as tape:
                out = lookup(x, *args)
            return _grad_digest(tape.gradient(out, table))
        return run

    def fused_per_id(sp):  # the fused lookup, its gradient left with one row per id
        return tco_ops._lookup(tco_ops.read_table(fused_table), sp.values, sp.indices[:, 0], -1, None,
                               segment_kind="row_ids", combiner="mean", grad_indices="per_id")

    native_tensor = (graph(lambda sp: native_sparse(tensor_table)(sp, True), sparse_spec)
                     if tensor_table is not None else None)
    return [
        LookupCase("lookup", "sparse",
                   graph(lambda sp: tco.embedding_lookup_sparse(fused_table, sp, None, combiner="mean"),
                         sparse_spec),
                   natives(native_sparse(native_table), sparse_spec), "tco.embedding_lookup_sparse",
                   "tf.nn.embedding_lookup_sparse", {}, native_tensor=native_tensor),
        LookupCase("hash", "sparse", graph(lambda sp: tco.hash_embedding(fused_table, sp, combiner="mean"),
                                           sparse_spec),
                   natives(native_hash, sparse_spec), "tco.hash_embedding",
                   "as_string+to_hash_bucket_fast+tf.nn.embedding_lookup_sparse", {"id_mode": "hash"}),
        LookupCase("ragged", "ragged", graph(lambda rt: tco.sparse_embedding(fused_table, rt, combiner="mean"),
                                             ragged_spec),
                   natives(native_sparse(native_table), ragged_spec), "tco.sparse_embedding",
                   "tf.nn.embedding_lookup_sparse(ragged)", {"invalid_ids": "skip_padding"}),
        LookupCase("grad", "sparse",
                   graph(with_grad(lambda sp: tco.embedding_lookup_sparse(fused_table, sp, None, combiner="mean"),
                                   fused_table), sparse_spec),
                   natives(with_grad(native_sparse(native_table), native_table), sparse_spec),
                   "tco.embedding_lookup_sparse + gradient (unique indices, as TF's)",
                   "tf.nn.embedding_lookup_sparse + gradient", None,
                   extra={"fused_per_id": graph(with_grad(fused_per_id, fused_table), sparse_spec)}),
    ]


def _call_s(shape, per_id_s):
    """Rough seconds per call of a case at `shape`, for estimates only."""
    nnz = shape.batch * shape.ids_per_row
    return 1e-4 + nnz * (per_id_s + shape.dim * 4 / 2e9)


def _table_build_s(vocab, dim, copies):
    return vocab * dim * 4 * copies / 0.5e9


def _estimate_lookup(cfg):
    shapes = cfg.shape_list()
    seconds = sum(_table_build_s(v, d, 3) for v, d in group_by_table(shapes))
    seconds += sum(4 * estimate_case_s(cfg, 4.3, _call_s(s, 5e-8)) for s in shapes)
    return len(shapes), seconds


@suite("lookup", estimate=_estimate_lookup)
def lookup_suite(cfg):
    """Fused pooled mean lookups vs tf.nn, over the shapes of `cfg`.

    Cases: (a) lookup, tco.embedding_lookup_sparse vs tf.nn.embedding_lookup_sparse on a
    SparseTensor; (b) hash, tco.hash_embedding vs as_string + to_hash_bucket_fast +
    tf.nn.embedding_lookup_sparse, with the same int64 ids used as raw keys (V buckets);
    (c) ragged, tco.sparse_embedding vs tf.nn.embedding_lookup_sparse on a RaggedTensor.
    Zipf ids are ranks (id 0 hottest), truncated to [0, V) by resampling.
    """
    import tensorflow as tf

    shapes = cfg.shape_list()
    rng = np.random.default_rng(cfg.seed)
    copy = measure_copy_bandwidth(cfg)
    print(f"lookup suite: {len(shapes)} shapes on {cfg.device}; ids/row uniform in [1, 2n - 1] for ~n")
    print(f"ids: Zipf({cfg.zipf_a}) ranks truncated to [0, V), or uniform; hash cases use the same "
          "ids as raw int64 keys into V buckets")
    _print_copy(copy, cfg)

    cases, skipped, copy_on_read = [], [], None
    for (V, D), group in group_by_table(shapes).items():
        with_headline = any(s.headline for s in group)
        # numpy + fused + native (+ a Tensor table and a copy-on-read Variable at the headline)
        table_bytes = V * D * 4
        need = table_bytes * host_table_copies(cfg, 1, 4 if with_headline else 2)
        reason = memory_shortfall(need)
        if reason:
            skipped += skip_table_group("lookup", group, reason)
            continue
        t0 = time.perf_counter()
        params = random_table(rng, V, D)
        # One Variable per side: tf.nn's Variable path gathers with ResourceGather, which
        # switches its Variable to copy-on-read mode, after which every plain read (what
        # the fused op does) copies the whole table. Sharing one Variable would charge
        # that copy to the fused side depending on run order; it is measured on its own
        # below (copy_on_read). A plain Tensor table shows TF's best native path.
        with tf.device(cfg.device):
            fused_table = tf.Variable(params, name="fused_table")
            native_table = tf.Variable(params, name="native_table")
            tensor_table = tf.constant(params) if with_headline else None
        graphs = _lookup_graphs(cfg, fused_table, native_table, tensor_table, V)
        print(f"table V={_si(V)} D={D}: {table_bytes / 2**20:.0f} MiB float32 (tf.Variable), "
              f"setup {time.perf_counter() - t0:.1f}s")
        for shape in group:
            progress_label(f"lookup {shape.label()} {shape.dist}")
            new, sp = _lookup_cases(cfg, shape, graphs, params, rng, copy)
            cases += new
            if shape.headline and shape.dist == "zipf" and copy_on_read is None:
                ref = next(c for c in new if c["series"] == "lookup")
                copy_on_read = copy_on_read_probe(cfg, params, graphs[0].fused, sp, ref, copy["best_GBps"])
            progress(f"lookup {shape.label()} {shape.dist}")
        del fused_table, native_table, tensor_table, graphs, params
        gc.collect()

    result = {"suite": "lookup", "config": dataclasses.asdict(cfg), "copy_bandwidth": copy,
              "cases": cases, "targets": targets_at_headline(cases, LOOKUP_TARGETS),
              "skipped": skipped, "copy_on_read": copy_on_read}
    print_lookup(result)
    return result


def _lookup_cases(cfg, shape, graphs, params, rng, copy):
    """The timed cases of every graph at one shape; also the SparseTensor they read."""
    import tensorflow as tf

    from tf_ctr_ops import _core

    B, D = shape.batch, shape.dim
    bags = make_bags(cfg.at(shape), shape.dist, rng)
    ids, offsets, nnz = bags["ids"], bags["offsets"], bags["nnz"]
    sp = tf.SparseTensor(tf.constant(bags["indices"]), tf.constant(ids), [B, shape.max_len])
    rt = tf.RaggedTensor.from_row_splits(tf.constant(ids), tf.constant(offsets), validate=False)
    nbytes = (nnz + B) * D * params.itemsize
    cases = []
    for g in graphs:
        x = sp if g.container == "sparse" else rt
        fns = {"fused": lambda g=g: g.fused(x).numpy()}
        fns.update({key: (lambda fn=fn: fn(x).numpy()) for key, (_, fn) in g.natives.items()})
        fns.update({key: (lambda fn=fn: fn(x).numpy()) for key, fn in g.extra.items()})
        if g.core_kwargs is not None:
            core = core_or_none(cfg, lambda g=g: _core.embedding_lookup(params, ids, offsets, combiner="mean",
                                                                         **g.core_kwargs))
            if core is not None:
                fns["core"] = core
        if g.native_tensor is not None and shape.headline:
            fns["native_tensor"] = lambda g=g: g.native_tensor(x).numpy()
        # Gradient digests are sums of many rows: float32 summation order shows.
        tol = 1e-4 if g.kind == "grad" else 1e-5
        entry = timed_entry(f"{g.kind}/{shape.dist}", fns, cfg, nbytes, copy, rtol=tol, atol=tol,
                            native_paths={key: label for key, (label, _) in g.natives.items()})
        entry.update({"kind": g.kind, "series": g.kind, "container": g.container, "fused_op": g.fused_op,
                      "native_op": g.native_op, "nnz": nnz, **shape_fields(shape)})
        if "native_tensor" in entry:
            entry["speedup_vs_native_tensor"] = entry["native_tensor"]["median_ms"] / entry["fused"]["median_ms"]
        cases.append(entry)
    return cases, sp


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
    out = {"case": "lookup/zipf", "shape": reference_case["shape"], "table_MiB": params.nbytes / 2**20, **t,
           "extra_ms": extra, "copy_cost_ms": 2 * params.nbytes / (copy_GBps * 1e9) * 1e3,
           "speedup_vs_native": reference_case["native"]["median_ms"] / t["fused_copy_on_read"]["median_ms"]}
    del cor_table
    return out


def _print_copy(copy, cfg):
    parts = ", ".join(f"{k} {v:.1f}" for k, v in copy.items() if k.endswith(("thread", "threads")))
    print(f"memory copy: {copy['best_GBps']:.1f} GB/s read+write ({copy['method']}"
          f"{'; ' + parts if parts else ''}; {cfg.copy_mb} MiB)")
    print()


def print_lookup(result):
    print_table(result)
    if result["cases"]:
        print(f"GB/s = (nnz + B) * D * 4 bytes / median time; /copy = fraction of the "
              f"{result['copy_bandwidth']['best_GBps']:.1f} GB/s copy bandwidth; core = "
              "tf_ctr_ops._core on the NumPy data, no TF; TF ovh = fused - core; native_tensor "
              "(headline only) = tf.nn on a plain Tensor table, TF's fast path (no Unique, no "
              "ResourceGather), and the fused speedup over it")
        print("native = the faster of tf.nn's two paths on a Variable table, both timed: "
              + ", ".join(f"{k} = {v}" for k, v in NATIVE_PATHS.items()) + "; compared with: "
              + ", ".join(f"{c['case']} {c['native_path']}" for c in result["cases"] if "native_path" in c))
        print("grad = forward + params gradient of the sum of the outputs; fused_per_id = the same fused "
              "lookup with its gradient left at one row per id (no Unique + segment sum): the cost of "
              "TF's unique gradient indices is fused - fused_per_id")
    cor = result.get("copy_on_read")
    if cor:
        print(f"copy-on-read check: fused lookup/zipf on a Variable in copy-on-read mode (as after any "
              f"sparse read or sparse optimizer update of it): {_fmt_t(cor['fused_copy_on_read'])} ms vs "
              f"{_fmt_t(cor['fused'])} ms, {cor['extra_ms']:+.2f} ms per call (copying the "
              f"{cor['table_MiB']:.0f} MiB table would cost ~{cor['copy_cost_ms']:.1f} ms); speedup over "
              f"native there: {cor['speedup_vs_native']:.2f}x")
    print_targets(result)


# ---------------------------------------------------------------------------
# Output: terminal table, Markdown, plot


def _fmt_t(s):
    return f"{s['median_ms']:.3g} [{s['p10_ms']:.3g}-{s['p90_ms']:.3g}]"


def _others(c):
    """References beyond native a case was timed against (Tensor-table tf.nn, separate calls, ...)."""
    skip = {"fused", "native", "core", "GBps", "max_abs_err", "copy_on_read"}
    out = []
    for k, v in c.items():
        if k not in skip and isinstance(v, dict) and "median_ms" in v:
            out.append(f"{k} {v['median_ms']:.3g} ({v['median_ms'] / c['fused']['median_ms']:.2f}x)")
    return ", ".join(out)


def print_table(result):
    """The terminal table of any suite whose cases have fused/native timings."""
    cols = [("case", 20, "<"), ("shape", 26, "<"), ("fused ms [p10-p90]", 22, ">"),
            ("native ms [p10-p90]", 22, ">"), ("speedup", 8, ">"), ("core ms", 8, ">"), ("TF ovh", 7, ">"),
            ("GB/s", 6, ">"), ("/copy", 5, ">"), ("others ms (fused speedup)", 0, "<")]
    line = lambda vals: " ".join(f"{v:{a}{w}}" for v, (_, w, a) in zip(vals, cols)).rstrip()  # noqa: E731
    hdr = line([c[0] for c in cols])
    print(hdr)
    print("-" * len(hdr))
    for c in result.get("cases", []):
        if "fused" not in c or "native" not in c:
            continue
        core = c.get("core")
        print(line([c["case"], c.get("shape", ""), _fmt_t(c["fused"]), _fmt_t(c["native"]),
                    f"{c['speedup']:.2f}x", f"{core['median_ms']:.3g}" if core else "-",
                    f"{c['tf_overhead_ms']:.2g}" if "tf_overhead_ms" in c else "-",
                    f"{c['GBps']['fused']:.3g}" if "GBps" in c else "-",
                    f"{c['frac_copy']:.2g}" if "frac_copy" in c else "-", _others(c)]))
    for s in result.get("skipped", []):
        print(f"skipped {s['shape']} {s['dist']}: {s['reason']}")


def print_targets(result):
    print()
    for t in result.get("targets", []):
        verdict = "met" if t["met"] else "NOT MET"
        print(f"target {t['target']} >= {t['min_speedup']}x [{t['dist']}, {t.get('shape', '')}]: "
              f"{t['speedup']:.2f}x  {verdict}")
    print()


def _all_cases(results):
    for name, res in results["suites"].items():
        for c in res.get("cases", []):
            if "fused" in c and "native" in c:
                yield name, c


def machine_line(results):
    env = results["env"]
    where = env.get("gpu_name") or f"{env['cpu_model']}, {env['nproc']} cores"
    load = env.get("foreign_cpu_load_during")
    load = f"; other processes used {100 * load:.0f}% of the CPUs during the run" if load is not None else ""
    return (f"Machine: {where} ({env['device']}); TensorFlow {env['tensorflow']}, tf_ctr_ops "
            f"{env['tf_ctr_ops']}; {results['date']}{load}.")


def _config_shape(config):
    """The shape a suite without per-case shapes ran at, from its config."""
    try:
        return Shape(config["batch"], config["vocab"], config["dim"], config["max_len"], "").label()
    except (TypeError, KeyError):
        return ""


def markdown(results):
    """The results as a Markdown table, with a line naming the machine and the date."""
    head = ("| case | shape | fused ms | native ms | speedup | GB/s | fraction of copy bandwidth |\n"
            "| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    rows = []
    for name, c in _all_cases(results):
        shape = c.get("shape") or _config_shape(results["suites"][name].get("config"))
        if c.get("dist") and not c["case"].endswith(c["dist"]):
            shape = f"{shape} {c['dist']}"
        gbps = f"{c['GBps']['fused']:.3g}" if "GBps" in c else ""
        frac = f"{c['frac_copy']:.2g}" if "frac_copy" in c else ""
        rows.append(f"| {c['case']} | {shape} | {c['fused']['median_ms']:.3g} | {c['native']['median_ms']:.3g} "
                    f"| {c['speedup']:.2f}x | {gbps} | {frac} |")
    copies = ", ".join(f"{name} {res['copy_bandwidth']['best_GBps']:.1f}"
                       for name, res in results["suites"].items() if "copy_bandwidth" in res)
    notes = [machine_line(results),
             f"Medians of repeated calls; GB/s = (ids + batch) * D * 4 bytes / fused time; copy bandwidth "
             f"(GB/s, read + write, measured in the same run): {copies}."]
    targets = [f"- {t['target']} >= {t['min_speedup']}x [{t['dist']}, {t.get('shape', '')}]: "
               f"{t['speedup']:.2f}x, {'met' if t['met'] else 'NOT MET'}"
               for res in results["suites"].values() for t in res.get("targets", [])]
    if targets:
        notes += ["", "Targets, at the headline shape:", ""] + targets
    return "\n".join([head, *rows, "", *notes]) + "\n"


def _series(c):
    if "series" in c:
        return c["series"]
    dist = c.get("dist")
    return c["case"][: -len(dist) - 1] if dist and c["case"].endswith("/" + dist) else c["case"]


def require_matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise BenchmarkError("--plot needs matplotlib, which is not installed: pip install matplotlib "
                             "(or install tf-ctr-ops with its 'plot' extra: pip install 'tf-ctr-ops[plot]')") from None
    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt

    return plt


def plot(results, path):
    """Speedup against batch size per op: geometric mean over the other axes, and their range.

    The headline cases are left out when grid cases exist: they are one other
    shape (V=1M, ~50 ids), and would make a bump at B=4096 that is no batch effect.
    """
    plt = require_matplotlib()
    from matplotlib.ticker import ScalarFormatter

    cases = [(name, c) for name, c in _all_cases(results) if "batch" in c]
    if any(not c.get("headline") for _, c in cases):
        cases = [(name, c) for name, c in cases if not c.get("headline")]
    series = {}
    for suite_name, c in cases:
        label = _series(c) if _series(c).startswith(suite_name) else f"{suite_name}: {_series(c)}"
        series.setdefault(label, {}).setdefault(c["batch"], []).append(c["speedup"])
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, by_batch in sorted(series.items()):
        xs = sorted(by_batch)
        mid = [float(np.exp(np.mean(np.log(by_batch[x])))) for x in xs]
        lo = [m - min(by_batch[x]) for m, x in zip(mid, xs)]
        hi = [max(by_batch[x]) - m for m, x in zip(mid, xs)]
        ax.errorbar(xs, mid, yerr=[lo, hi], marker="o", capsize=3, label=name)
    ax.axhline(1.0, color="gray", linewidth=0.8, linestyle="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(ScalarFormatter())
    ax.set_xlabel("batch size")
    ax.set_ylabel("speedup of the fused op over TF-native (x)")
    ax.set_title("tf-ctr-ops: speedup vs batch size per op (geometric mean over the other grid axes; "
                 "bars: their range)", fontsize=8)
    ax.legend(fontsize=8)
    fig.text(0.01, 0.005, machine_line(results), fontsize=6)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


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
    p = argparse.ArgumentParser(prog="python -m tf_ctr_ops.bench", description=__doc__.split("\n")[0],
                                epilog="Shapes: --grid picks them; any of --batch/--vocab/--dim/--max-len "
                                       "runs one custom shape instead (the rest from the headline).")
    p.add_argument("suites", nargs="+", choices=sorted(SUITES) + ["all"],
                   help="suites to run, in order; all: every registered suite")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                   help="where both graphs and their tables live (gpu: '/GPU:0')")
    p.add_argument("--quick", action="store_true",
                   help="few repeats, a small copy probe and, unless --grid says otherwise, the quick grid")
    p.add_argument("--grid", choices=sorted(GRIDS),
                   help="headline (default without --quick): only the headline shape; quick (default "
                        "with --quick): it and a representative subset; full: it and the whole grid")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE ('-': stdout, "
                                                  "and everything else to stderr)")
    p.add_argument("--markdown", metavar="FILE", help="also write a Markdown table of the results to FILE")
    p.add_argument("--plot", metavar="FILE.png", help="also plot speedup against batch size per op "
                                                      "(needs matplotlib)")
    d = Config()
    p.add_argument("--batch", type=int, help=f"custom shape: batch (headline {d.batch})")
    p.add_argument("--vocab", type=int, help=f"custom shape: table rows (headline {d.vocab})")
    p.add_argument("--dim", type=int, help=f"custom shape: embedding dim (headline {d.dim})")
    p.add_argument("--max-len", type=int, help=f"custom shape: ids per row are uniform in [1, MAX_LEN] "
                                               f"(headline {d.max_len})")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--runs", type=int, default=None,
                   help=f"max timed calls per callable (default {d.runs}; at least {d.min_runs}, else "
                        f"~{d.budget_s:g} s per callable)")
    p.add_argument("--copy-mb", type=int, default=None, help=f"copy-probe array size (default {d.copy_mb})")
    p.add_argument("--model", choices=("keras-lookup", "tf1-feature-columns"), default="",
                   help="rewrite suite: a real model style instead of its Criteo model (see tf_ctr_ops/bench_models.py)")
    p.add_argument("--features", type=int, default=0,
                   help="rewrite suite: time the optimizer alone on its model scaled to 26 .. FEATURES features")
    args = p.parse_args(argv)
    if "all" in args.suites:
        args.suites = sorted(SUITES, key=lambda n: (SUITE_ORDER.index(n) if n in SUITE_ORDER else len(SUITE_ORDER), n))
    return args


def config_from_args(args):
    custom = {k: v for k, v in (("batch", args.batch), ("vocab", args.vocab), ("dim", args.dim),
                                ("max_len", args.max_len)) if v is not None}
    cfg = Config(seed=args.seed, device="/GPU:0" if args.device == "gpu" else "/CPU:0", model=args.model,
                 features=args.features, **custom)
    if args.quick:
        cfg.quicken()
    if custom:
        cfg.grid = "custom"
    else:
        cfg.grid = args.grid or ("quick" if args.quick else "headline")
    cfg.shapes = tuple(headline_shapes(cfg.batch, cfg.vocab, cfg.dim, cfg.max_len)
                       + ([] if custom else GRIDS[cfg.grid]()))
    if args.runs is not None:
        cfg.runs = args.runs
        cfg.min_runs = min(cfg.min_runs, args.runs)
    if args.copy_mb is not None:
        cfg.copy_mb = args.copy_mb
    return cfg


def estimate(cfg, suites):
    """(progress steps, rough seconds, suites without an estimate) of running `suites`."""
    steps, seconds, unknown = 0, 0.0, []
    for name in suites:
        if name in _ESTIMATES:
            n, s = _ESTIMATES[name](cfg)
            steps, seconds = steps + n, seconds + s
        else:
            steps, unknown = steps + 1, unknown + [name]
    return steps, seconds, unknown


def main(argv=None):
    """Runs the suites named in argv; returns {"env": ..., "suites": {name: result}, ...}."""
    global _PROGRESS
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    args = parse_args(argv)
    cfg = config_from_args(args)
    # Fail before the long part, not after it.
    if args.plot:
        require_matplotlib()
    if cfg.on_gpu:
        require_gpu()
    json_to_stdout = args.json == "-"
    real_stdout = sys.stdout
    steps, seconds, unknown = estimate(cfg, args.suites)
    bar = Progress(steps, enabled=False if json_to_stdout else None)
    out = sys.stderr if json_to_stdout else _BarAwareStream(sys.stdout, bar)
    _PROGRESS = bar
    try:
        with contextlib.redirect_stdout(out):
            results = _run(args, cfg, seconds, unknown, argv)
    finally:
        bar.close()
        _PROGRESS = Progress(1, enabled=False)
    with contextlib.redirect_stdout(sys.stderr if json_to_stdout else real_stdout):
        _write_outputs(args, results, real_stdout)
    return results


def _run(args, cfg, seconds, unknown, argv):
    env = environment(cfg.device)
    env["foreign_cpu_load_before"] = foreign_load_probe()
    print_environment(env)
    warn_foreign_load("just before the run", env["foreign_cpu_load_before"])
    shapes = cfg.shape_list()
    print(f"suites {' '.join(args.suites)}: grid {cfg.grid}, {len(shapes)} shape(s) on {cfg.device}"
          f"{' (quick repeats)' if cfg.quick else ''}; estimated {_duration(seconds)} (rough)"
          f"{' plus ' + ', '.join(unknown) + ' (no estimate)' if unknown else ''}\n")
    t0 = time.perf_counter()
    load = ForeignLoad()
    results = {"env": env, "argv": list(sys.argv[1:] if argv is None else argv), "suites": {},
               "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    for name in args.suites:
        progress_label(name)
        before = _PROGRESS.done
        results["suites"][name] = SUITES[name](dataclasses.replace(cfg))
        if name not in _ESTIMATES and _PROGRESS.done == before:
            progress(name)
    results["wall_s"] = time.perf_counter() - t0
    env["foreign_cpu_load_during"] = load.fraction()
    _PROGRESS.clear()
    warn_foreign_load("during the run", env["foreign_cpu_load_during"])
    during = env["foreign_cpu_load_during"]
    print(f"done in {results['wall_s']:.1f}s"
          + (f"; other processes used {100 * during:.1f}% of the CPUs meanwhile" if during is not None else ""))
    return results


def _write_outputs(args, results, stdout):
    if args.json == "-":
        json.dump(results, stdout, indent=2, default=_json_default)
        stdout.write("\n")
        stdout.flush()
    elif args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2, default=_json_default)
        print(f"wrote {args.json}")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(results))
        print(f"wrote {args.markdown}")
    if args.plot:
        plot(results, args.plot)
        print(f"wrote {args.plot}")


def _import_suite_modules():
    """Imports tf_ctr_ops/bench_*.py, whose @suite decorators register their suites here."""
    import tf_ctr_ops

    for mod in sorted(pkgutil.iter_modules(tf_ctr_ops.__path__), key=lambda m: m.name):
        if mod.name.startswith("bench_"):
            importlib.import_module(f"tf_ctr_ops.{mod.name}")


_import_suite_modules()


if __name__ == "__main__":
    # Run the importable module's main: the bench_* modules register their suites
    # there, not in this __main__ copy.
    from tf_ctr_ops import bench as _bench

    try:
        _bench.main()
    except _bench.BenchmarkError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    sys.exit(0)

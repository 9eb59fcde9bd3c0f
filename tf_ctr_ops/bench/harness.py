"""The benchmark harness: configuration, timing, agreement checks, bandwidth,
the environment, progress, errors and the suite registry.

Suites (tf_ctr_ops/bench/lookup.py, strings.py, rewrite.py, ...) build on
this module and `report`; this module imports no suite. The method (how a
case is checked, timed and read against the copy bandwidth) is described in
the package's docstring, tf_ctr_ops/bench/__init__.py.
"""

import contextlib
import dataclasses
import gc
import math
import os
import platform
import sys
import threading
import time

import numpy as np

# ---------------------------------------------------------------------------
# Suite registry

SUITES = {}
ESTIMATES = {}
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
            ESTIMATES[name] = estimate
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
        return f"B={self.batch} V={si(self.vocab)} D={self.dim} ids~{self.ids_per_row:g}"


def si(n):
    """n for a label: 100k, 10M where exact, else the digits."""
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
    model: str = ""            # rewrite suite: a real model style (models.MODELS); "": its Criteo model
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
    stdout meanwhile are kept clean by `clear()` (see `BarAwareStream`).
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
        eta = f" eta {duration(elapsed / self.done * (self.total - self.done))}" if self.done else ""
        return f"[{bar}] {self.done}/{self.total} {duration(elapsed)}{eta} {self.label}"[:120]

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


class BarAwareStream:
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


@contextlib.contextmanager
def showing_progress(bar):
    """Makes `bar` the one that progress() and progress_label() move, until the block ends; then closes it."""
    global _PROGRESS
    _PROGRESS = bar
    try:
        yield bar
    finally:
        bar.close()
        _PROGRESS = Progress(1, enabled=False)


def duration(s):
    """Seconds as 1m05s, or 2h03m from an hour on."""
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


def estimate_case_s(cfg, callables, seconds_per_call):
    """Rough wall time of one time_interleaved call, for the estimate printed before a run."""
    rounds = math.ceil(cfg.min_runs / cfg.block)
    calls = cfg.warmup + rounds * (cfg.block + cfg.settle)
    return callables * max(min(cfg.budget_s, cfg.runs * seconds_per_call), calls * seconds_per_call)


def call_s(shape, per_id_s):
    """Rough seconds per call of a case at `shape`, for estimates only."""
    nnz = shape.batch * shape.ids_per_row
    return 1e-4 + nnz * (per_id_s + shape.dim * 4 / 2e9)


def table_build_s(vocab, dim, copies):
    """Rough seconds to build `copies` copies of a [vocab, dim] float32 table, for estimates only."""
    return vocab * dim * 4 * copies / 0.5e9


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


# What a case's `bytes` counts, unless its suite says otherwise: an embedding
# lookup must read each id's row and write each bag's pooled row.
POOLED_BYTES = "(ids + batch) x D x element size (rows read, pooled rows written)"


# TF 2.21's two native paths for a lookup of one table: Unique + Gather, and
# the fast path, which gathers rows per id with no Unique. TF takes the fast
# one only for a table that is no CompositeTensor (a Variable is one) on the
# ids' own device, so native_fast reads the Variable into such a tensor
# (tf_fast_path_table). Every case is timed against both and compared with
# the faster.
NATIVE_PATHS = {"native_unique": "allow_fast_lookup=False on the Variable",
                "native_fast": "allow_fast_lookup=True on a tensor read of it (TF's fast path, no Unique)"}


def tf_fast_path_table(table):
    """`table` as tf.nn's fast path takes it, called in the lookup's device
    scope: a plain tensor there (a captured constant's device string, fully
    qualified, differs from the ids' and keeps TF on its Unique path too)."""
    import tensorflow as tf

    read = getattr(table, "read_value_no_copy", None)
    return tf.identity(read() if read is not None else table)


def check_fast_path(fn, what, *args):
    """Refuse to time a 'fast path' that TF did not take (a TF change could
    silently bring its Unique back). args: what to trace `fn` with, if it has
    no input signature."""
    ops = {op.type for op in fn.get_concrete_function(*args).graph.get_operations()}
    if "Unique" in ops:
        raise RuntimeError(f"{what}: tf.nn did not take its fast path (the graph has a Unique op)")
    return fn


def timed_entry(case, fns, cfg, nbytes, copy, rtol=1e-5, atol=1e-5, native_paths=None,
                bytes_counted=POOLED_BYTES):
    """Checks every callable of `fns` against fns["fused"], then times them all: one case's record.

    nbytes: the bytes the case must move at the least, described by
    bytes_counted (the Markdown report's GB/s legend).

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
    entry = {"case": case, **t, "bytes": nbytes, "bytes_counted": bytes_counted, "speedup": t["native"]["median_ms"] / fused_ms,
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
    print(f"{suite_name}: skipped {len(shapes)} shape(s) with V={si(shapes[0].vocab)} D={shapes[0].dim}: {reason}")
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


def twin_tables(cfg, params):
    """`params` as two Variables on cfg.device, the fused side's and the native side's.

    One per side: tf.nn's Variable path gathers with ResourceGather, which
    switches its Variable to copy-on-read mode, after which every plain read
    (what the fused ops do) copies the whole table. Sharing one Variable would
    charge that copy to the fused side depending on run order.
    """
    import tensorflow as tf

    with tf.device(cfg.device):
        return tf.Variable(params, name="fused_table"), tf.Variable(params, name="native_table")


def random_table(rng, vocab, dim):
    """[V, D] float32 standard normal * 0.05, generated in chunks (a 1e7-row table is GiBs)."""
    params = np.empty((vocab, dim), np.float32)
    step = max(1, (1 << 24) // max(dim, 1))
    for a in range(0, vocab, step):
        rng.standard_normal(params[a:a + step].shape, dtype=np.float32, out=params[a:a + step])
    params *= np.float32(0.05)
    return params


# ---------------------------------------------------------------------------
# Serving calls: a SavedModel signature timed as a server or a user calls it


def keyword_call(sig, feeds):
    """sig(**feeds), the public Python call, as a numpy array."""
    (key,) = sig.structured_outputs
    return lambda: sig(**feeds)[key].numpy()


def served_graph_call(sig, feeds):
    """The signature's graph run on the flat tensors of `feeds`, as a numpy
    array: the keyword call less its per-call binding in Python, which is
    done here once. None where this TF's ConcreteFunction lacks the private
    entry points (the suite then times the keyword call alone)."""
    try:
        function_type, call_flat = sig.function_type, sig._call_flat
        flat = function_type.unpack_inputs(function_type.bind(**feeds))
    except AttributeError:
        return None
    (key,) = sig.structured_outputs
    captured = sig.captured_inputs
    return lambda: call_flat(flat, captured)[key].numpy()

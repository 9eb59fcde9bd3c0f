"""Core-level GPU benchmark (issue #25): the CUDA lookup and string_embedding
launchers through tf_ctr_ops._core on CuPy buffers, against the device-to-
device copy bandwidth measured in the same run. TensorFlow is not needed.

    python tools/bench_core_gpu.py                      # the full table
    python tools/bench_core_gpu.py --batch 4096         # launch-bound sizes
    python tools/bench_core_gpu.py --cases lookup-fp32 --dims 32 --repeat 1   # one call each (for ncu)

Every time is the wall time of one binding call (reset status, launch, status
read-back and stream sync), the median of --repeat calls after warm-up calls.

"Effective" bandwidth counts the bytes the call must move at least: each id
(8 bytes) or packed string byte read once, each looked-up row read once, each
output row written once, and the offsets. Before timing, each case's output
is checked: the string kernels against the lookup of the same ids, and 16-bit
tables against float32 within their rounding.

"Gather bound": the same ids' rows read by a minimal kernel (a group of lanes
per id, 16 bytes per lane, 4 rows in flight per group, nothing pooled or
checked), timed the same way. It is what random row reads of that size cost
on this GPU, so "lookup / gather" says how much of a lookup's time is the
pooling rather than the memory system.
"""

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from core_helpers import load_core, to_bfloat16_bits, from_bfloat16_bits  # noqa: E402

cp = None  # CuPy, imported by main(): the packing helpers run without it

CASES = ["lookup-fp32", "lookup-fp16", "lookup-bf16", "lookup-fp32-zipf", "lookup-fp16-zipf",
         "lookup-fp32-hash", "strings-index", "strings-hash"]


# ---------------------------------------------------------------------------
# Inputs.


def ragged_ids(rng, batch, vocab, max_len, zipf):
    lengths = rng.integers(1, max_len + 1, size=batch)
    offsets = np.zeros(batch + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    n = int(offsets[-1])
    if zipf:
        # Ranks drawn Zipf(1.2) and scattered over the table by a fixed permutation.
        ranks = (rng.zipf(1.2, size=n) - 1) % vocab
        ids = rng.permutation(vocab)[ranks].astype(np.int64)
    else:
        ids = rng.integers(0, vocab, size=n, dtype=np.int64)
    return ids, offsets


def pack_decimal(ids, offsets):
    """The ids of each bag as one string "12,7,993": (bytes uint8, string_splits int64)."""
    n = len(ids)
    digits = np.ones(n, np.int64)
    for k in range(1, 19):
        digits += ids >= 10**k
    last = np.zeros(n, bool)
    last[offsets[1:][offsets[1:] > offsets[:-1]] - 1] = True
    token_bytes = digits + (~last)
    starts = np.zeros(n + 1, np.int64)
    np.cumsum(token_bytes, out=starts[1:])
    raw = np.full(int(starts[-1]), ord(","), np.uint8)
    for k in range(int(digits.max(initial=1))):
        has = digits > k
        place = 10 ** (digits[has] - 1 - k)
        raw[starts[:-1][has] + k] = (ids[has] // place) % 10 + ord("0")
    string_splits = starts[offsets]
    return raw, string_splits


# ---------------------------------------------------------------------------
# Timing.


def time_calls(fn, repeat, warmup):
    for _ in range(warmup):
        fn()
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()  # the bindings synchronize the stream before they return
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def copy_bandwidth(nbytes, repeat):
    src = cp.random.random(nbytes // 4, dtype=cp.float32)
    dst = cp.empty_like(src)
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    runs = []
    for i in range(repeat + 2):
        start.record()
        dst[...] = src
        stop.record()
        stop.synchronize()
        if i >= 2:
            runs.append(cp.cuda.get_elapsed_time(start, stop) / 1e3)
    seconds = statistics.median(runs)
    return 2 * src.nbytes / seconds  # read + write


def host_to_device(raw, repeat):
    """(pinned, pageable) seconds to copy the packed bytes to the device."""
    dev = cp.empty(raw.size, cp.uint8)
    pinned_mem = cp.cuda.alloc_pinned_memory(raw.nbytes)
    pinned = np.frombuffer(pinned_mem, np.uint8, raw.size)
    pinned[...] = raw

    def pinned_copy():
        dev.data.copy_from_host(pinned.ctypes.data, raw.nbytes)
        cp.cuda.Device().synchronize()

    def pageable_copy():
        dev.set(raw)
        cp.cuda.Device().synchronize()

    return time_calls(pinned_copy, repeat, 2), time_calls(pageable_copy, repeat, 2)


# The gather bound: rows of `lanes` 16-byte words, read for each id and folded
# into one word per thread so that the loads stay live; the store is (almost)
# never taken.
GATHER_SOURCE = r"""
extern "C" __global__ void gather_rows(const uint4* __restrict__ table, const long long* __restrict__ ids,
                                       long long n, int lanes, unsigned* __restrict__ sink) {
  const long long thread = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long groups = (long long)gridDim.x * blockDim.x / lanes;
  const int rank = threadIdx.x & (lanes - 1);
  unsigned acc = 0;
  for (long long i = thread / lanes * 4; i < n; i += groups * 4) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      v[u] = i + u < n ? __ldg(table + ids[i + u] * lanes + rank) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}
"""


def gather_bound(table, ids, repeat, warmup):
    """Seconds to read the rows of `ids` from `table` (rows of 16-byte words,
    at most 32 per row) with the minimal kernel, launch and sync included."""
    row_bytes = table.shape[1] * table.dtype.itemsize
    lanes = row_bytes // 16
    if row_bytes % 16 or lanes & (lanes - 1) or not 1 <= lanes <= 32:
        return None
    kernel = cp.RawKernel(GATHER_SOURCE, "gather_rows")
    sink = cp.zeros(1, cp.uint32)
    threads = 256
    blocks = min(-(-len(ids) * lanes // (4 * threads)), 1 << 20)

    def call():
        kernel((blocks,), (threads,), (table, ids, np.int64(len(ids)), np.int32(lanes), sink))
        cp.cuda.Device().synchronize()

    return time_calls(call, repeat, warmup)


# ---------------------------------------------------------------------------
# Cases.


class Bench:
    def __init__(self, core, args):
        self.core, self.args = core, args
        self.rng = np.random.default_rng(args.seed)
        self.uniform = ragged_ids(self.rng, args.batch, args.vocab, args.max_len, zipf=False)
        self.zipf = ragged_ids(self.rng, args.batch, args.vocab, args.max_len, zipf=True)
        self.status = cp.zeros(5, cp.int64)
        self.packed = None
        self.reference = {}

    def device_ids(self, which):
        ids, offsets = self.uniform if which == "uniform" else self.zipf
        return cp.asarray(ids), cp.asarray(offsets), len(ids)

    def table(self, dim, dtype):
        key = (dim, dtype)
        if key not in self.reference:
            base = cp.random.default_rng(dim).standard_normal((self.args.vocab, dim), dtype=cp.float32)
            if dtype == "float32":
                dev = base
            elif dtype == "float16":
                dev = base.astype(cp.float16)
            else:
                dev = cp.asarray(to_bfloat16_bits(cp.asnumpy(base)))
            self.reference[key] = dev
        return self.reference[key]

    def lookup(self, dim, dtype, which, id_mode):
        table = self.table(dim, dtype)
        ids, offsets, nnz = self.device_ids(which)
        out = cp.empty((self.args.batch, dim), table.dtype)

        def call():
            self.core.gpu_embedding_lookup(
                table.data.ptr, dtype, self.args.vocab, dim, ids.data.ptr, "int64", nnz, 0,
                offsets.data.ptr, self.args.batch, out.data.ptr, self.status.data.ptr,
                combiner="mean", id_mode=id_mode)

        item = table.dtype.itemsize
        moved = nnz * 8 + (self.args.batch + 1) * 8 + (nnz + self.args.batch) * dim * item
        return call, out, moved

    def strings(self, dim, mode):
        if self.packed is None:
            raw, splits = pack_decimal(*self.uniform)
            self.packed = (raw, cp.asarray(raw), cp.asarray(splits))
        raw, dev_raw, dev_splits = self.packed
        table = self.table(dim, "float32")
        out = cp.empty((self.args.batch, dim), cp.float32)
        nnz = len(self.uniform[0])

        def call():
            self.core.gpu_string_embedding(
                table.data.ptr, "float32", self.args.vocab, dim, dev_raw.data.ptr, dev_splits.data.ptr,
                0, self.args.batch, out.data.ptr, self.status.data.ptr, combiner="mean", id_mode=mode,
                delimiter=b",")

        moved = raw.nbytes + (self.args.batch + 1) * 8 + (nnz + self.args.batch) * dim * 4
        return call, out, moved

    def build(self, case, dim):
        kind, _, rest = case.partition("-")
        if kind == "strings":
            return self.strings(dim, rest)
        parts = rest.split("-")
        dtype = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}[parts[0]]
        which = "zipf" if "zipf" in parts else "uniform"
        mode = "hash" if "hash" in parts else "index"
        return self.lookup(dim, dtype, which, mode)


def as_float32(out):
    if out.dtype == cp.uint16:
        return from_bfloat16_bits(cp.asnumpy(out))
    return cp.asnumpy(out).astype(np.float32)


def check(case, dim, out, results):
    """Compares a case's output with a float32 case of the same ids already run."""
    got = as_float32(out)
    if not np.isfinite(got).all():
        raise SystemExit(f"{case} D={dim}: non-finite output")
    ref_case = {"lookup-fp16": "lookup-fp32", "lookup-bf16": "lookup-fp32", "strings-index": "lookup-fp32",
                "lookup-fp16-zipf": "lookup-fp32-zipf"}.get(case)
    ref = results.get((ref_case, dim), {}).get("out")
    if ref is None:
        return
    tol = {"lookup-fp16": 4e-3, "lookup-bf16": 1.6e-2, "lookup-fp16-zipf": 4e-3}.get(case, 1e-5)
    err = float(np.abs(got - ref).max())
    if err > tol * max(1.0, float(np.abs(ref).max())):
        raise SystemExit(f"{case} D={dim}: differs from {ref_case} by {err}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=262144)
    p.add_argument("--vocab", type=int, default=1_000_000)
    p.add_argument("--max-len", type=int, default=99)
    p.add_argument("--dims", default="32,128")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the figures here")
    p.add_argument("--core-dir", help="load _core from this folder first (another build, for an A/B run)")
    args = p.parse_args()
    global cp
    import cupy as cp

    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tf_ctr_ops")
    core = load_core(first=([args.core_dir] if args.core_dir else []) + [here])
    print(f"# core: {core.__file__}")
    if not getattr(core, "has_cuda", False):
        raise SystemExit("tf_ctr_ops._core was built without CUDA")
    dims = [int(d) for d in args.dims.split(",")]
    cases = [c for c in args.cases.split(",") if c]
    unknown = set(cases) - set(CASES)
    if unknown:
        raise SystemExit(f"unknown cases {sorted(unknown)}; known: {CASES}")

    props = cp.cuda.runtime.getDeviceProperties(0)
    device = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    copy_bw = copy_bandwidth(1 << 30, max(args.repeat, 3))
    bench = Bench(core, args)
    nnz = len(bench.uniform[0])
    print(f"# {device}; B={args.batch}, V={args.vocab}, lengths 1..{args.max_len} ({nnz} ids), mean combiner")
    print(f"# device-to-device copy: {copy_bw / 1e12:.2f} TB/s (read + write)")
    results = {}
    for dim in dims:
        for case in cases:
            call, out, moved = bench.build(case, dim)
            out.fill(float("nan")) if out.dtype != cp.uint16 else out.fill(0xFFFF)
            call()
            check(case, dim, out, results)
            seconds = time_calls(call, args.repeat, args.warmup)
            results[(case, dim)] = {"seconds": seconds, "bytes": moved, "out": as_float32(out)}
            print(f"  {case:18s} D={dim:<4d} {seconds * 1e3:8.3f} ms  {moved / seconds / 1e12:5.2f} TB/s "
                  f"({100 * moved / seconds / copy_bw:3.0f}% of copy)", flush=True)

    def ms(case, dim):
        r = results.get((case, dim))
        return r["seconds"] * 1e3 if r else None

    print()
    print("| case | " + " | ".join(f"D={d}" for d in dims) + " |")
    print("|---|" + "---|" * len(dims))
    for case in cases:
        cells = []
        for dim in dims:
            r = results[(case, dim)]
            cell = f"{r['seconds'] * 1e3:.3f} ms, {r['bytes'] / r['seconds'] / 1e12:.2f} TB/s ({100 * r['bytes'] / r['seconds'] / copy_bw:.0f}%)"
            cells.append(cell)
        print(f"| {case} | " + " | ".join(cells) + " |")
    print()
    for dim in dims:
        ratios = []
        for a, b, label in [("lookup-fp32", "lookup-fp16", "fp32/fp16"), ("lookup-fp32", "lookup-bf16", "fp32/bf16"),
                            ("strings-index", "lookup-fp32", "strings-index/lookup"),
                            ("strings-hash", "lookup-fp32", "strings-hash/lookup")]:
            if ms(a, dim) and ms(b, dim):
                ratios.append(f"{label} {ms(a, dim) / ms(b, dim):.2f}x")
        print(f"D={dim}: " + ", ".join(ratios))
    print()
    gathers = {}
    ids = cp.asarray(bench.uniform[0])
    for dim in dims:
        cells = []
        for case, dtype in (("lookup-fp32", "float32"), ("lookup-fp16", "float16")):
            seconds = gather_bound(bench.table(dim, dtype), ids, args.repeat, args.warmup)
            if seconds is None or not ms(case, dim):
                continue
            gathers[f"{dtype} D={dim}"] = seconds * 1e3
            cells.append(f"{dtype} {seconds * 1e3:.3f} ms ({case} takes {ms(case, dim) / (seconds * 1e3):.2f}x)")
        if cells:
            print(f"gather bound, uniform ids, D={dim}: " + ", ".join(cells))
    if bench.packed is not None:
        raw = bench.packed[0]
        pinned, pageable = host_to_device(raw, max(3, args.repeat // 2))
        print(f"host-to-device copy of the packed strings ({raw.nbytes / 1e6:.1f} MB): pinned {pinned * 1e3:.2f} ms "
              f"({raw.nbytes / pinned / 1e9:.1f} GB/s), pageable {pageable * 1e3:.2f} ms ({raw.nbytes / pageable / 1e9:.1f} GB/s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device, "copy_bytes_per_s": copy_bw, "batch": args.batch, "vocab": args.vocab,
                       "results": {f"{c} D={d}": {"ms": r["seconds"] * 1e3, "bytes": r["bytes"]}
                                   for (c, d), r in results.items()},
                       "gather_bound_ms": gathers}, f, indent=1)


if __name__ == "__main__":
    main()

"""The `lookup` suite of `python -m tf_ctr_ops.bench`: the fused pooled lookups against tf.nn.

lookup: tco.embedding_lookup_sparse vs tf.nn.embedding_lookup_sparse on a SparseTensor;
hash:   tco.hash_embedding vs as_string + to_hash_bucket_fast + tf.nn.embedding_lookup_sparse;
ragged: tco.sparse_embedding vs tf.nn.embedding_lookup_sparse on a RaggedTensor;
grad:   the first case's forward + params gradient, with TF's unique gradient indices and without;
sharded: tco.safe_embedding_lookup_sparse vs tf.nn's on the table in SHARDS "div" shards (a list of
        Variables, as a PartitionedVariable or a ShardedVariable gives them), each gathered on its own.

Each against the faster of tf.nn's two native paths (see NATIVE_PATHS), and
the core (tf_ctr_ops._core) on the same NumPy data; at the headline shape, also
tf.nn on a plain Tensor table, and the fused lookup on a Variable in
copy-on-read mode (copy_on_read_probe).
"""

import dataclasses
import gc
import time

import numpy as np

from tf_ctr_ops.bench.harness import (call_s, check_agreement, core_or_none, estimate_case_s, group_by_table,
                                      host_table_copies, make_bags, measure_copy_bandwidth, memory_shortfall,
                                      progress, progress_label, random_table, shape_fields, si, skip_table_group,
                                      suite, table_build_s, targets_at_headline, time_interleaved, timed_entry,
                                      twin_tables, NATIVE_PATHS, check_fast_path, tf_fast_path_table)  # noqa: F401
from tf_ctr_ops.bench.report import fmt_t, print_copy, print_table, print_targets

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


SHARDS = 4
SHARDED_NATIVE_PATH = "Unique + Gather per shard (TF has no fast path for a table in shards)"


def _grad_digest(grad, buckets=1024):
    """A small digest of an IndexedSlices gradient that does not depend on its
    index order or on whether rows of one index are merged: per-bucket sums
    of each row's columns weighted by position, times a weight of the row's
    own index. A row at another index (of the same bucket) or with its
    columns moved changes it; plain per-bucket sums missed both."""
    import tensorflow as tf

    values = tf.reshape(grad.values, [tf.shape(grad.values)[0], -1])
    by_column = tf.linalg.matvec(values, tf.cast(tf.range(1, tf.shape(values)[1] + 1), values.dtype))
    # From an integer hash of the index: a float product loses the low bits of large ones.
    by_index = 1.0 + tf.cast(tf.math.floormod(tf.cast(grad.indices, tf.int64) * 40503, 65521), values.dtype) / 65521
    return tf.math.unsorted_segment_sum(by_column * by_index, tf.math.floormod(grad.indices, buckets), buckets)


def _lookup_graphs(cfg, fused_table, native_table, tensor_table, vocab, shards):
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

    def natives(lookup, spec, one_table=True):
        """The native tf.functions of `lookup(x, allow_fast_lookup)`, one per path,
        the fast one checked to be TF's fast path; a table in shards has only
        the Unique path (TF's fast path takes one table)."""
        if not one_table:
            return {"native_unique": (SHARDED_NATIVE_PATH, graph(lambda x: lookup(x, False), spec))}
        out = {key: (label, graph(lambda x, fast=(key == "native_fast"): lookup(x, fast), spec))
               for key, label in NATIVE_PATHS.items()}
        check_fast_path(out["native_fast"][1], "native_fast")
        return out

    def native_sparse(table):
        return lambda sp, fast: tf.nn.embedding_lookup_sparse(tf_fast_path_table(table) if fast else table, sp,
                                                                None, combiner="mean", allow_fast_lookup=fast)

    def native_safe(tables):
        return lambda sp, fast: tf.nn.safe_embedding_lookup_sparse(tables, sp, None, combiner="mean",
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
            grad = tape.gradient(out, table)
            if isinstance(grad, tf.Tensor):  # TF's fast path: dense over the table
                grad = tf.IndexedSlices(grad, tf.range(tf.shape(grad)[0]))
            return _grad_digest(grad)
        return run

    def fused_per_id(sp):  # the fused lookup, its gradient left with one row per id
        return tco_ops._lookup(tco_ops.read_table(fused_table), sp.values, sp.indices[:, 0], -1, None,
                               segment_kind="row_ids", combiner="mean", grad_indices="per_id")

    native_tensor = (check_fast_path(graph(lambda sp: native_sparse(tensor_table)(sp, True), sparse_spec),
                                     "native_tensor") if tensor_table is not None else None)
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
        LookupCase("sharded", "sparse",
                   graph(lambda sp: tco.safe_embedding_lookup_sparse(shards[0], sp, None, combiner="mean"),
                         sparse_spec),
                   natives(native_safe(shards[1]), sparse_spec, one_table=False),
                   f"tco.safe_embedding_lookup_sparse ({len(shards[0])} shards)",
                   f"tf.nn.safe_embedding_lookup_sparse ({len(shards[0])} shards)", None),
    ]


def _estimate_lookup(cfg):
    shapes = cfg.shape_list()
    seconds = sum(table_build_s(v, d, 3) for v, d in group_by_table(shapes))
    seconds += sum(4 * estimate_case_s(cfg, 4.3, call_s(s, 5e-8)) for s in shapes)
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
    print_copy(copy, cfg)

    cases, skipped, copy_on_read = [], [], None
    for (V, D), group in group_by_table(shapes).items():
        with_headline = any(s.headline for s in group)
        # numpy + fused + native (+ a Tensor table and a copy-on-read Variable at the headline)
        table_bytes = V * D * 4
        need = table_bytes * host_table_copies(cfg, 1, 6 if with_headline else 4)
        reason = memory_shortfall(need)
        if reason:
            skipped += skip_table_group("lookup", group, reason)
            continue
        t0 = time.perf_counter()
        params = random_table(rng, V, D)
        # The copy-on-read cost twin_tables avoids is measured on its own below
        # (copy_on_read). A plain Tensor table shows TF's best native path.
        fused_table, native_table = twin_tables(cfg, params)
        # "div" shards: the first V % SHARDS hold one row more, as TF splits a table (none empty:
        # TF's "div" divides by the rows per shard). Lists: TF reads a tuple as one table.
        parts = np.array_split(params, min(SHARDS, V))
        shards = [list(side) for side in zip(*(twin_tables(cfg, part) for part in parts))]
        with tf.device(cfg.device):
            tensor_table = tf.constant(params) if with_headline else None
        graphs = _lookup_graphs(cfg, fused_table, native_table, tensor_table, V, shards)
        print(f"table V={si(V)} D={D}: {table_bytes / 2**20:.0f} MiB float32 (tf.Variable), "
              f"setup {time.perf_counter() - t0:.1f}s")
        for shape in group:
            progress_label(f"lookup {shape.label()} {shape.dist}")
            new, sp = _lookup_cases(cfg, shape, graphs, params, rng, copy)
            cases += new
            if shape.headline and shape.dist == "zipf" and copy_on_read is None:
                ref = next(c for c in new if c["series"] == "lookup")
                copy_on_read = copy_on_read_probe(cfg, params, graphs[0].fused, sp, ref, copy["best_GBps"])
            progress(f"lookup {shape.label()} {shape.dist}")
        del fused_table, native_table, tensor_table, graphs, params, shards
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
           # Of this run's two timings only: the native lookup was timed in another run.
           "time_ratio": t["fused_copy_on_read"]["median_ms"] / t["fused"]["median_ms"]}
    del cor_table
    return out


def print_lookup(result):
    print_table(result)
    if result["cases"]:
        print(f"GB/s = (nnz + B) * D * 4 bytes / median time; /copy = fraction of the "
              f"{result['copy_bandwidth']['best_GBps']:.1f} GB/s copy bandwidth; core = "
              "tf_ctr_ops._core on the NumPy data, no TF; TF ovh = fused - core; native_tensor "
              "(headline only) = tf.nn on a plain Tensor table, TF's fast path (no Unique, no "
              "ResourceGather), and the fused speedup over it")
        print("native = the faster of tf.nn's two paths of a Variable table, both timed: "
              + ", ".join(f"{k} = {v}" for k, v in NATIVE_PATHS.items()) + "; compared with: "
              + ", ".join(f"{c['case']} {c['native_path']}" for c in result["cases"] if "native_path" in c))
        print("grad = forward + params gradient of the sum of the outputs; fused_per_id = the same fused "
              "lookup with its gradient left at one row per id (no Unique + segment sum): the cost of "
              "TF's unique gradient indices is fused - fused_per_id")
    cor = result.get("copy_on_read")
    if cor:
        print(f"copy-on-read check: fused lookup/zipf on a Variable in copy-on-read mode (as after any "
              f"sparse read or sparse optimizer update of it): {fmt_t(cor['fused_copy_on_read'])} ms vs "
              f"{fmt_t(cor['fused'])} ms, {cor['extra_ms']:+.2f} ms per call (copying the "
              f"{cor['table_MiB']:.0f} MiB table would cost ~{cor['copy_cost_ms']:.1f} ms), "
              f"{cor['time_ratio']:.2f}x the time of the plain one")
    print_targets(result)

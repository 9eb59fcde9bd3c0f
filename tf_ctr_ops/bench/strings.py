"""The `string` and `multi` suites of `python -m tf_ctr_ops.bench`.

string: `string_embedding` on strings of delimited ids ("12,7,993") against the
        composition it replaces, tf.strings.split -> to_number(int64) or
        to_hash_bucket_fast -> tf.nn.embedding_lookup_sparse(sqrtn), on the
        faster of tf.nn's two paths (harness.NATIVE_PATHS).
multi:  `multi_string_embedding` over 20 string features against 20 separate
        compositions (the faster of tf.nn's two paths), and against 20 separate
        `string_embedding` calls.

Both sides run as tf.functions in one process on the same strings, and their
outputs must agree before anything is timed. Both take host strings: on GPU the
fused side packs them on the host and copies the packed bytes to the device
inside the timed call (CtrPackStrings keeps its outputs in host memory), and the
native side's string ops run on the host as TF places them.
"""

import dataclasses
import gc
import time

import numpy as np

from tf_ctr_ops.bench.harness import (NATIVE_PATHS, call_s, check_fast_path, core_or_none, estimate_case_s,
                                      group_by_table, host_table_copies, make_bags, measure_copy_bandwidth,
                                      memory_shortfall, progress, progress_label, random_table, shape_fields, si,
                                      skip_note, skip_table_group, suite, table_build_s, targets_at_headline,
                                      tf_fast_path_table, timed_entry, twin_tables)
from tf_ctr_ops.bench.report import print_copy, print_table, print_targets

STRING_TARGETS = {  # series -> (label, minimum fused speedup over native), at the headline shape
    "string/index": ("string_embedding vs split + to_number + tf.nn.embedding_lookup_sparse(sqrtn)", 6.0),
}
ID_MODES = ("index", "hash")
MULTI_FEATURES = 20
MULTI_MAX_VOCAB = 100_000  # per feature: 20 tables of 1e7 rows would not fit anywhere we run


def id_strings(ids, offsets, delimiter=","):
    """One delimited string of ids per bag."""
    text = ids.astype(str)
    return np.array([delimiter.join(text[offsets[i]:offsets[i + 1]]) for i in range(len(offsets) - 1)],
                    dtype=object)


def _composition(tf, table, strings, id_mode, vocab, fast=False):
    """split + to_number / to_hash_bucket_fast + tf.nn's lookup; fast: on its
    fast path (see lookup.NATIVE_PATHS)."""
    tokens = tf.strings.split(strings, ",")
    if id_mode == "index":
        ids = tf.strings.to_number(tokens, tf.int64)
    else:
        ids = tf.strings.to_hash_bucket_fast(tokens, vocab)
    return tf.nn.embedding_lookup_sparse(tf_fast_path_table(table) if fast else table, ids.to_sparse(), None,
                                         combiner="sqrtn", allow_fast_lookup=fast)


def _string_call_s(shape):
    return call_s(shape, 3e-7)


def _estimate_string(cfg):
    shapes = cfg.shape_list()
    seconds = sum(table_build_s(v, d, 3) for v, d in group_by_table(shapes))
    seconds += sum(len(ID_MODES) * estimate_case_s(cfg, 3, _string_call_s(s)) for s in shapes)
    return len(shapes), seconds


@suite("string", estimate=_estimate_string)
def string_suite(cfg):
    """string_embedding vs the split/convert/lookup composition, index and hash modes."""
    import tensorflow as tf

    shapes = cfg.shape_list()
    rng = np.random.default_rng(cfg.seed)
    copy = measure_copy_bandwidth(cfg)
    print(f"string suite: {len(shapes)} shapes on {cfg.device}; comma-delimited ids, ~n per row "
          "(uniform in [1, 2n - 1])")
    print_copy(copy, cfg)
    cases, skipped = [], []
    for (V, D), group in group_by_table(shapes).items():
        reason = memory_shortfall(V * D * 4 * host_table_copies(cfg, 1, 2))
        if reason:
            skipped += skip_table_group("string", group, reason)
            continue
        t0 = time.perf_counter()
        params = random_table(rng, V, D)
        fused_table, native_table = twin_tables(cfg, params)
        graphs = _string_graphs(cfg, fused_table, native_table, V)
        print(f"table V={si(V)} D={D}: setup {time.perf_counter() - t0:.1f}s")
        for shape in group:
            progress_label(f"string {shape.label()} {shape.dist}")
            cases += _string_cases(cfg, shape, graphs, params, rng, copy)
            progress(f"string {shape.label()} {shape.dist}")
        del fused_table, native_table, graphs, params
        gc.collect()
    result = {"suite": "string", "config": dataclasses.asdict(cfg), "copy_bandwidth": copy, "cases": cases,
              "targets": targets_at_headline(cases, STRING_TARGETS), "skipped": skipped}
    print_table(result)
    print("core = tf_ctr_ops._core on strings packed beforehand; TF ovh = fused - core, so it also holds the "
          "fused call's packing of the strings")
    print_targets(result)
    return result


def _string_graphs(cfg, fused_table, native_table, vocab):
    """{id_mode: (fused, {native path: native})} tf.functions over host string vectors."""
    import tensorflow as tf

    import tf_ctr_ops as tco

    spec = [tf.TensorSpec([None], tf.string)]
    graphs = {}
    for id_mode in ID_MODES:
        @tf.function(input_signature=spec)
        def fused(x, m=id_mode):
            with tf.device(cfg.device):
                return tco.string_embedding(x, fused_table, combiner="sqrtn", id_mode=m)

        def native(fast, m=id_mode):
            @tf.function(input_signature=spec)
            def run(x):
                with tf.device(cfg.device):
                    return _composition(tf, native_table, x, m, vocab, fast)
            return run

        natives = {key: native(key == "native_fast") for key in NATIVE_PATHS}
        check_fast_path(natives["native_fast"], f"string/{id_mode} native_fast")
        graphs[id_mode] = (fused, natives)
    return graphs


def _string_cases(cfg, shape, graphs, params, rng, copy):
    import tensorflow as tf

    import tf_ctr_ops as tco
    from tf_ctr_ops import _core

    bags = make_bags(cfg.at(shape), shape.dist, rng)
    s = tf.constant(id_strings(bags["ids"], bags["offsets"]).astype(str))
    data, splits = (t.numpy() for t in tco.pack_strings(s))
    nbytes = (bags["nnz"] + shape.batch) * shape.dim * 4
    cases = []
    for id_mode, (fused, natives) in graphs.items():
        fns = {"fused": lambda f=fused: f(s).numpy(),
               **{key: lambda f=native: f(s).numpy() for key, native in natives.items()}}
        core = core_or_none(cfg, lambda m=id_mode: _core.string_embedding(params, data, splits, combiner="sqrtn",
                                                                           id_mode=m))
        if core is not None:
            fns["core"] = core
        entry = timed_entry(f"string/{id_mode}/{shape.dist}", fns, cfg, nbytes, copy, rtol=1e-4, atol=1e-5,
                            native_paths=NATIVE_PATHS)
        entry.update({"series": f"string/{id_mode}", "id_mode": id_mode, "nnz": bags["nnz"],
                      "bytes_packed": int(len(data)), **shape_fields(shape)})
        cases.append(entry)
    return cases


def multi_shapes(cfg):
    """The multi suite's shapes: the grid's, with at most MULTI_MAX_VOCAB rows per feature.

    Its headline stays the smaller shape it always had (D <= 16, ids U[1, 9],
    Zipf): 20 features of the lookup headline would take most of a quick run.
    """
    shapes = []
    for s in cfg.shape_list():
        if s.headline:
            if s.dist != "zipf":
                continue
            s = dataclasses.replace(s, dim=min(s.dim, 16), max_len=min(s.max_len, 9))
        s = dataclasses.replace(s, vocab=min(s.vocab, MULTI_MAX_VOCAB))
        if s not in shapes:
            shapes.append(s)
    return shapes


def _estimate_multi(cfg):
    shapes = multi_shapes(cfg)
    seconds = sum(table_build_s(s.vocab * MULTI_FEATURES, s.dim, 3)
                  + estimate_case_s(cfg, 3, MULTI_FEATURES * _string_call_s(s)) for s in shapes)
    return len(shapes), seconds


@suite("multi", estimate=_estimate_multi)
def multi_suite(cfg, features=MULTI_FEATURES):
    """multi_string_embedding over 20 features vs 20 compositions and 20 single fused calls."""
    shapes = multi_shapes(cfg)
    copy = measure_copy_bandwidth(cfg)
    print(f"multi suite: {features} features, {len(shapes)} shapes on {cfg.device}, at most "
          f"{si(MULTI_MAX_VOCAB)} rows per feature")
    print_copy(copy, cfg)
    rng = np.random.default_rng(cfg.seed + 1)
    cases, skipped = [], []
    for shape in shapes:
        progress_label(f"multi {shape.label()} {shape.dist}")
        reason = memory_shortfall(features * shape.vocab * shape.dim * 4 * host_table_copies(cfg, 1, 2))
        if reason:
            skipped += skip_note("multi", [shape], reason)
        else:
            cases += _multi_cases(cfg, shape, features, rng, copy)
        progress(f"multi {shape.label()} {shape.dist}")
        gc.collect()
    result = {"suite": "multi", "config": dataclasses.asdict(cfg), "copy_bandwidth": copy, "cases": cases,
              "targets": [], "skipped": skipped}
    print_table(result)
    print_targets(result)
    return result


def _multi_cases(cfg, shape, features, rng, copy):
    """The grouped op against its compositions, and its concatenated form
    against theirs concatenated in the graph (the MLP input of a CTR model)."""
    import tensorflow as tf

    import tf_ctr_ops as tco

    V, D = shape.vocab, shape.dim
    tables, native_tables, feats, nnz = [], [], [], 0
    with tf.device(cfg.device):
        for f in range(features):
            params = random_table(rng, V, D)
            tables.append(tf.Variable(params, name=f"fused_{f}"))
            native_tables.append(tf.Variable(params, name=f"native_{f}"))
            bags = make_bags(cfg.at(shape), shape.dist, rng)
            nnz += bags["nnz"]
            feats.append(tf.constant(id_strings(bags["ids"], bags["offsets"]).astype(str)))
    dev = cfg.device

    @tf.function
    def fused(*xs):
        with tf.device(dev):
            return tco.multi_string_embedding(list(xs), tables, combiners="sqrtn", id_modes="index")

    @tf.function
    def singles(*xs):
        with tf.device(dev):
            return [tco.string_embedding(x, t, combiner="sqrtn", id_mode="index") for x, t in zip(xs, tables)]

    def native(fast):
        @tf.function
        def run(*xs):
            with tf.device(dev):
                return [_composition(tf, t, x, "index", V, fast) for x, t in zip(xs, native_tables)]
        return run

    def stacked(fn):
        return lambda: np.concatenate([o.numpy() for o in fn(*feats)], axis=1)

    @tf.function
    def fused_concat(*xs):
        with tf.device(dev):
            return tco.multi_string_embedding(list(xs), tables, combiners="sqrtn", id_modes="index", concat=True)

    # One function each, not a call of the functions above: a nested
    # function call read the native tables whole (copy-on-read after the
    # gathers), a 128 MB copy per call at the headline shape.
    @tf.function
    def grouped_then_concat(*xs):
        with tf.device(dev):
            return tf.concat(tco.multi_string_embedding(list(xs), tables, combiners="sqrtn", id_modes="index"),
                             axis=1)

    def native_concat(fast):
        @tf.function
        def run(*xs):
            with tf.device(dev):
                return tf.concat([_composition(tf, t, x, "index", V, fast) for x, t in zip(xs, native_tables)],
                                 axis=1)
        return run

    def natives(build):
        out = {key: build(key == "native_fast") for key in NATIVE_PATHS}
        check_fast_path(out["native_fast"], f"multi/{features}x native_fast", *feats)
        return out

    nbytes = (nnz + features * shape.batch) * D * 4
    fns = {"fused": stacked(fused), **{k: stacked(fn) for k, fn in natives(native).items()},
           "singles": stacked(singles)}
    entry = timed_entry(f"multi/{features}x/{shape.dist}", fns, cfg, nbytes, copy, rtol=1e-4, atol=1e-5,
                        native_paths=NATIVE_PATHS)
    entry.update({"series": f"multi/{features}x", "features": features, "nnz": nnz, **shape_fields(shape),
                  "speedup_vs_singles": entry["singles"]["median_ms"] / entry["fused"]["median_ms"]})
    concat_fns = {"fused": lambda: fused_concat(*feats).numpy(),
                  **{k: lambda fn=fn: fn(*feats).numpy() for k, fn in natives(native_concat).items()},
                  "grouped": lambda: grouped_then_concat(*feats).numpy()}
    concat = timed_entry(f"multi/{features}x/concat/{shape.dist}", concat_fns, cfg, nbytes, copy,
                         rtol=1e-4, atol=1e-5, native_paths=NATIVE_PATHS)
    concat.update({"series": f"multi/{features}x/concat", "features": features, "nnz": nnz, **shape_fields(shape),
                   "speedup_vs_grouped": concat["grouped"]["median_ms"] / concat["fused"]["median_ms"]})
    return [entry, concat]


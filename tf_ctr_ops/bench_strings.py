"""The `string` and `multi` suites of `python -m tf_ctr_ops.bench`.

string: `string_embedding` on strings of delimited ids ("12,7,993") against the
        composition it replaces, tf.strings.split -> to_number(int64) or
        to_hash_bucket_fast -> tf.nn.embedding_lookup_sparse(sqrtn).
multi:  `multi_string_embedding` over 20 string features against 20 separate
        compositions, and against 20 separate `string_embedding` calls.

Both sides run as tf.functions in one process on the same strings, and their
outputs must agree before anything is timed.
"""

import dataclasses
import time

import numpy as np

from tf_ctr_ops.bench import (check_agreement, copy_bandwidth, make_bags, suite,
                              time_interleaved)

STRING_TARGET = ("string_embedding vs split + to_number + tf.nn.embedding_lookup_sparse(sqrtn)", 6.0)


def id_strings(ids, offsets, delimiter=","):
    """One delimited string of ids per bag."""
    text = ids.astype(str)
    return np.array([delimiter.join(text[offsets[i]:offsets[i + 1]]) for i in range(len(offsets) - 1)],
                    dtype=object)


def _composition(tf, table, strings, id_mode, vocab):
    tokens = tf.strings.split(strings, ",")
    if id_mode == "index":
        ids = tf.strings.to_number(tokens, tf.int64)
    else:
        ids = tf.strings.to_hash_bucket_fast(tokens, vocab)
    return tf.nn.embedding_lookup_sparse(table, ids.to_sparse(), None, combiner="sqrtn")


def _timed_entry(case, fns, cfg, nbytes, copy):
    got = fns["fused"]()
    errors = {k: check_agreement(case, f"{k} vs fused", fn(), got, rtol=1e-4, atol=1e-5)
              for k, fn in fns.items() if k != "fused"}
    t = time_interleaved(fns, cfg)
    fused_ms = t["fused"]["median_ms"]
    gbps = {k: nbytes / (v["median_ms"] * 1e-3) / 1e9 for k, v in t.items()}
    return {"case": case, **t, "speedup": t["native"]["median_ms"] / fused_ms, "GBps": gbps,
            "frac_copy": gbps["fused"] / copy["best_GBps"], "max_abs_err": errors}


@suite("string")
def string_suite(cfg):
    """string_embedding vs the split/convert/lookup composition, index and hash modes."""
    import tensorflow as tf

    import tf_ctr_ops as tco
    from tf_ctr_ops import _core

    B, V, D = cfg.batch, cfg.vocab, cfg.dim
    rng = np.random.default_rng(cfg.seed)
    params = rng.standard_normal((V, D), dtype=np.float32) * np.float32(0.05)
    with tf.device(cfg.device):
        fused_table = tf.Variable(params, name="fused_table")
        native_table = tf.Variable(params, name="native_table")
    copy = copy_bandwidth(cfg)
    print(f"string suite: B={B} V={V} D={D} ids/row U[1,{cfg.max_len}], comma-delimited; "
          f"memory copy {copy['best_GBps']:.1f} GB/s")
    cases = []
    for dist in ("zipf", "uniform"):
        bags = make_bags(cfg, dist, rng)
        strings = id_strings(bags["ids"], bags["offsets"])
        s = tf.constant(strings.astype(str))
        data, splits = (t.numpy() for t in tco.pack_strings(s))
        nbytes = (bags["nnz"] + B) * D * 4
        for id_mode in ("index", "hash"):
            fused = tf.function(lambda x, m=id_mode: tco.string_embedding(x, fused_table, combiner="sqrtn", id_mode=m))
            native = tf.function(lambda x, m=id_mode: _composition(tf, native_table, x, m, V))
            fns = {"fused": lambda f=fused: f(s).numpy(),
                   "native": lambda f=native: f(s).numpy(),
                   "core": lambda m=id_mode: _core.string_embedding(params, data, splits, combiner="sqrtn",
                                                                     id_mode=m)}
            entry = _timed_entry(f"string/{id_mode}/{dist}", fns, cfg, nbytes, copy)
            entry.update({"dist": dist, "id_mode": id_mode, "nnz": bags["nnz"], "bytes_packed": int(len(data)),
                          "tf_overhead_ms": entry["fused"]["median_ms"] - entry["core"]["median_ms"]})
            cases.append(entry)
    label, need = STRING_TARGET
    targets = [{"target": label, "dist": c["dist"], "min_speedup": need, "speedup": c["speedup"],
                "met": bool(c["speedup"] >= need)} for c in cases if c["id_mode"] == "index"]
    result = {"suite": "string", "config": dataclasses.asdict(cfg), "copy_bandwidth": copy, "cases": cases,
              "targets": targets}
    print_cases(result)
    return result


@suite("multi")
def multi_suite(cfg, features=20):
    """multi_string_embedding over 20 features vs 20 compositions and 20 single fused calls."""
    import tensorflow as tf

    import tf_ctr_ops as tco

    B, D = cfg.batch, min(cfg.dim, 16)
    V = min(cfg.vocab, 100_000)
    rng = np.random.default_rng(cfg.seed + 1)
    small = dataclasses.replace(cfg, vocab=V, max_len=min(cfg.max_len, 9))
    copy = copy_bandwidth(cfg)
    tables, native_tables, feats, nnz = [], [], [], 0
    for f in range(features):
        params = rng.standard_normal((V, D), dtype=np.float32) * np.float32(0.05)
        tables.append(tf.Variable(params, name=f"fused_{f}"))
        native_tables.append(tf.Variable(params, name=f"native_{f}"))
        bags = make_bags(small, "zipf", rng)
        nnz += bags["nnz"]
        feats.append(tf.constant(id_strings(bags["ids"], bags["offsets"]).astype(str)))
    print(f"multi suite: {features} features, B={B} V={V} D={D} ids/row U[1,{small.max_len}] Zipf")

    @tf.function
    def fused(*xs):
        return tco.multi_string_embedding(list(xs), tables, combiners="sqrtn", id_modes="index")

    @tf.function
    def singles(*xs):
        return [tco.string_embedding(x, t, combiner="sqrtn", id_mode="index") for x, t in zip(xs, tables)]

    @tf.function
    def native(*xs):
        return [_composition(tf, t, x, "index", V) for x, t in zip(xs, native_tables)]

    def stacked(fn):
        return lambda: np.concatenate([o.numpy() for o in fn(*feats)], axis=1)

    fns = {"fused": stacked(fused), "native": stacked(native), "singles": stacked(singles)}
    entry = _timed_entry(f"multi/{features}x", fns, cfg, (nnz + features * B) * D * 4, copy)
    entry.update({"features": features, "nnz": nnz,
                  "speedup_vs_singles": entry["singles"]["median_ms"] / entry["fused"]["median_ms"]})
    result = {"suite": "multi", "config": dataclasses.asdict(small), "copy_bandwidth": copy, "cases": [entry],
              "targets": []}
    print_cases(result)
    return result


def print_cases(result):
    print(f"{'case':24} {'fused ms':>9} {'native ms':>10} {'speedup':>8} {'other ms':>22} {'GB/s':>6} {'/copy':>6}")
    for c in result["cases"]:
        others = ", ".join(f"{k} {c[k]['median_ms']:.2f}" for k in ("core", "singles") if k in c)
        print(f"{c['case']:24} {c['fused']['median_ms']:9.2f} {c['native']['median_ms']:10.2f} "
              f"{c['speedup']:7.2f}x {others:>22} {c['GBps']['fused']:6.2f} {c['frac_copy']:6.2f}")
    for t in result["targets"]:
        print(f"target {t['target']} >= {t['min_speedup']}x [{t['dist']}]: {t['speedup']:.2f}x  "
              f"{'met' if t['met'] else 'NOT MET'}")
    print()

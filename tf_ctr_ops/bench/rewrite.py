"""The `rewrite` suite of `python -m tf_ctr_ops.bench`: a TF-native CTR model
served before and after `rewrite.optimize_saved_model`.

The model is Criteo-like: 26 categorical string features and a small MLP,
written the way users write it, with no tf_ctr_ops code:

- 20 single-valued hashed features: keras.layers.Hashing + Embedding;
- 6 id-list features ("12|7|993"), split and converted by
  to_hash_bucket_fast (3 of them) or to_number (3), in the two common forms:
  tf.strings.split + tf.reduce_sum(tf.nn.embedding_lookup(table, ragged ids),
  axis=1), and tf.compat.v1.string_split + tf.nn.embedding_lookup_sparse (sqrtn).

It is exported as a SavedModel, rewritten (with verification), and both
SavedModels are loaded in this process; their serving signatures must agree
before their latency is compared, at batch 1024 and batch 1. A floor model
(the same inputs and MLP, no embedding) is timed alongside: the part of each
latency above it is the embedding work the rewrite acts on.

Each signature is timed two ways, in the same rounds:
- `rewrite/batchN`: the signature's graph run on its flat input tensors, as
  a model server runs it (TF Serving hands tensors to Session::Run by name).
  This is the serving latency the target is stated in.
- `rewrite/batchN/python-call`: the Python keyword call, `sig(**feeds)`. It
  first binds every argument to the signature in Python, about 10 us per
  argument (0.27 ms for these 26 on the development VM), a cost both models
  pay and no server does.
"""

import dataclasses
import os
import tempfile
import time

import numpy as np

from tf_ctr_ops.bench.harness import check_agreement, keyword_call, served_graph_call, suite, time_interleaved
from tf_ctr_ops.bench.models import model_style_suite
from tf_ctr_ops.bench.report import speedup_text

HASHED, LISTS = 20, 6
LIST_DELIMITER = "|"
REWRITE_TARGET = ("rewritten SavedModel vs the TF-native one (26 features + MLP), batch {batch}, {call}", 3.0)
SERVE_BATCHES = (1024, 1)


def _hex_tokens(rng, n, distinct, zipf_a):
    """Criteo-style 8-hex-digit categories, Zipf-distributed over `distinct` values."""
    ranks = np.minimum(rng.zipf(zipf_a, size=n), distinct) - 1
    return np.array([f"{(r * 2654435761) % 2**32:08x}" for r in ranks], dtype=object)


def make_inputs(rng, batch, cfg, vocab):
    """{input name: [batch, 1] string array}: hashed categories (some empty, as
    Criteo's are) and id lists of 1..max_len tokens."""
    feeds = {}
    for f in range(HASHED):
        col = _hex_tokens(rng, batch, 10_000, cfg.zipf_a)
        col[rng.random(batch) < 0.05] = ""
        feeds[f"c{f}"] = col.reshape(-1, 1)
    max_len = max(1, min(cfg.max_len, 20))
    for f in range(LISTS):
        lengths = rng.integers(1, max_len + 1, size=batch)
        if f < LISTS // 2:
            tokens = _hex_tokens(rng, int(lengths.sum()), 50_000, cfg.zipf_a)
        else:
            tokens = rng.integers(0, vocab, size=int(lengths.sum())).astype(str).astype(object)
        ends = np.cumsum(lengths)
        feeds[f"l{f}"] = np.array([LIST_DELIMITER.join(tokens[e - n:e]) for n, e in zip(lengths, ends)],
                                  dtype=object).reshape(-1, 1)
    return feeds


def build_model(cfg, vocab, dim, counts=(HASHED, LISTS)):
    """The TF-native Keras 3 functional model, with `counts` = (hashed, id-list) features."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(cfg.seed)

    class IdListEmbedding(keras.layers.Layer):
        """A TF-native pooled lookup of delimited id strings."""

        def __init__(self, num_rows, dim, hashed, ragged, **kwargs):
            super().__init__(**kwargs)
            self.num_rows, self.dim, self.hashed, self.ragged = num_rows, dim, hashed, ragged
            self.table = self.add_weight(shape=(num_rows, dim), initializer="random_normal", name="table")

        def ids(self, tokens):
            if self.hashed:
                return tf.strings.to_hash_bucket_fast(tokens, self.num_rows)
            return tf.strings.to_number(tokens, tf.int64)

        def call(self, strings):
            strings = tf.reshape(strings, [-1])
            if self.ragged:
                ids = self.ids(tf.strings.split(strings, LIST_DELIMITER))
                return tf.reduce_sum(tf.nn.embedding_lookup(self.table.value, ids), axis=1)
            sp = tf.compat.v1.string_split(strings, LIST_DELIMITER)
            ids = tf.SparseTensor(sp.indices, self.ids(sp.values), sp.dense_shape)
            return tf.nn.embedding_lookup_sparse(self.table.value, ids, None, combiner="sqrtn")

        def compute_output_shape(self, shape):
            return (shape[0], self.dim)

    hashed, lists = feature_inputs(counts)
    n_lists = len(lists)
    embedded = []
    for f, x in enumerate(hashed):
        e = keras.layers.Embedding(vocab, dim, name=f"c{f}_emb")(keras.layers.Hashing(vocab, name=f"c{f}_hash")(x))
        embedded.append(keras.layers.Flatten()(e))
    for f, x in enumerate(lists):
        embedded.append(IdListEmbedding(vocab, dim, hashed=f < n_lists // 2, ragged=f % 2 == 0, name=f"l{f}_emb")(x))
    return keras.Model(hashed + lists, mlp_head(keras.layers.Concatenate()(embedded)))


def feature_inputs(counts=(HASHED, LISTS)):
    """The string inputs ([batch, 1] each): hashed categories c*, id lists l*."""
    import keras

    hashed = [keras.Input((1,), dtype="string", name=f"c{f}") for f in range(counts[0])]
    lists = [keras.Input((1,), dtype="string", name=f"l{f}") for f in range(counts[1])]
    return hashed, lists


def mlp_head(features):
    """The 416-64-1 MLP on the concatenated embeddings: the CTR."""
    import keras

    h = keras.layers.Dense(64, activation="relu", name="hidden")(features)
    return keras.layers.Dense(1, activation="sigmoid", name="ctr")(h)


def build_floor_model(cfg, dim):
    """The serving floor: the same 26 string inputs and MLP, with zeros in
    place of the embedded features. Both models spend this much on the call
    and the MLP; what they spend beyond it is the embedding work the rewrite
    acts on."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(cfg.seed)
    width = (HASHED + LISTS) * dim

    class NoFeatures(keras.layers.Layer):
        """Zeros of the embedded width, one row per example."""

        def call(self, strings):
            return tf.zeros([tf.shape(strings[0])[0], width])

        def compute_output_shape(self, shapes):
            return (shapes[0][0], width)

    hashed, lists = feature_inputs()
    inputs = hashed + lists
    return keras.Model(inputs, mlp_head(NoFeatures(name="no_features")(inputs)))


def embedding_speedup(t):
    """(native - floor) / (rewritten - floor) from medians; None when the
    rewritten model is not measurably above the floor."""
    floor = t["floor"]["median_ms"]
    fused, native = t["fused"]["median_ms"] - floor, t["native"]["median_ms"] - floor
    return native / fused if fused > 0 and native > 0 else None


def _fmt(s):
    return f"{s['median_ms']:.3f} [{s['p10_ms']:.3f}-{s['p90_ms']:.3f}]"


@suite("rewrite")
def rewrite_suite(cfg):
    """A TF-native 26-feature CTR SavedModel served before and after optimize_saved_model
    (with --model, a real model style: tf_ctr_ops/bench/models.py)."""
    import tensorflow as tf

    from tf_ctr_ops import rewrite

    if cfg.model:
        return model_style_suite(cfg, cfg.model)
    if cfg.features:
        return rewrite_time_suite(cfg)

    vocab, dim = min(cfg.vocab, 50_000), min(cfg.dim, 16)
    batches = tuple(sorted({min(b, cfg.batch) for b in SERVE_BATCHES}, reverse=True))
    rng = np.random.default_rng(cfg.seed)
    print(f"rewrite suite: {HASHED} hashed + {LISTS} id-list string features, V={vocab} D={dim}, "
          f"MLP {(HASHED + LISTS) * dim}-64-1; batches {batches}")
    with tempfile.TemporaryDirectory(prefix="tf_ctr_ops_bench_rewrite_") as tmp:
        src, dst = os.path.join(tmp, "native"), os.path.join(tmp, "rewritten")
        floor_dir = os.path.join(tmp, "floor")
        with tf.device(cfg.device):
            model = build_model(cfg, vocab, dim)
            build_floor_model(cfg, dim).export(floor_dir, verbose=False)
        t0 = time.perf_counter()
        model.export(src, verbose=False)
        export_s = time.perf_counter() - t0
        samples = make_inputs(rng, 64, cfg, vocab)
        # Rewritten for the device it is served on here, as a user would.
        serving = "gpu" if "GPU" in cfg.device.upper() else "cpu"
        report = rewrite.optimize_saved_model(src, dst, signature_keys=["serving_default"],
                                              sample_inputs={"serving_default": samples}, runs=3,
                                              serving_device=serving)
        sig = report.signatures["serving_default"]
        if not report.ok:
            raise AssertionError(f"the rewritten model disagrees: {report.summary()}")
        native = tf.saved_model.load(src).signatures["serving_default"]
        fused = tf.saved_model.load(dst).signatures["serving_default"]
        floor = tf.saved_model.load(floor_dir).signatures["serving_default"]
        signatures = {"fused": fused, "native": native, "floor": floor}
        cases = []
        for batch in batches:
            feeds = {k: tf.constant(v) for k, v in make_inputs(rng, batch, cfg, vocab).items()}
            calls = {"served graph": {k: served_graph_call(sig, feeds) for k, sig in signatures.items()},
                     "python call": {k: keyword_call(sig, feeds) for k, sig in signatures.items()}}
            if None in calls["served graph"].values():
                del calls["served graph"]
            case = f"rewrite/batch{batch}"
            # Correctness first: a benchmark never times a wrong answer.
            errs = {how: check_agreement(case, f"native vs rewritten ({how})", fns["native"](), fns["fused"](),
                                         rtol=1e-5, atol=1e-6)
                    for how, fns in calls.items()}
            with tf.device(cfg.device):
                t = time_interleaved({(how, k): fn for how, fns in calls.items() for k, fn in fns.items()}, cfg)
            shape = f"B={batch}, {HASHED}+{LISTS} features V={vocab} D={dim}"
            for how in calls:
                timed = {k: t[(how, k)] for k in signatures}
                cases.append({"case": case if how == "served graph" else f"{case}/python-call", "batch": batch,
                              "shape": shape, "call": how, **timed,
                              "speedup": timed["native"]["median_ms"] / timed["fused"]["median_ms"],
                              "embedding_speedup": embedding_speedup(timed),
                              "max_abs_err": {"native": errs[how]}})
    label, need = REWRITE_TARGET
    # The target is on serving latency: the served graph where it was timed.
    served = [c for c in cases if c["batch"] == max(batches)]
    served = [c for c in served if c["call"] == "served graph"] or served
    targets = [{"target": label.format(batch=c["batch"], call=c["call"]), "dist": "criteo-like", "shape": c["shape"],
                "batch": c["batch"], "min_speedup": need, "speedup": c["speedup"], "met": bool(c["speedup"] >= need)}
               for c in served]
    result = {"suite": "rewrite", "config": dataclasses.asdict(cfg), "vocab": vocab, "dim": dim,
              "features": {"hashed": HASHED, "id_lists": LISTS},
              "rewrite": {"matches": rewrite.fused_subgraph_count(sig.matches), "skips": len(sig.skips),
                          "fused_ops": sorted({m["fused_op"] for m in sig.matches}),
                          "op_counts_before": sig.op_counts_before, "op_counts_after": sig.op_counts_after,
                          "rewrite_seconds": report.rewrite_seconds, "total_seconds": report.total_seconds,
                          "export_seconds": export_s, "max_abs_diff": report.max_abs_diff},
              "cases": cases, "targets": targets}
    print_rewrite(result)
    return result


def print_rewrite(result):
    r = result["rewrite"]
    print(f"optimize_saved_model: {r['matches']} fused ({', '.join(r['fused_ops'])}), {r['skips']} left alone, "
          f"{r['rewrite_seconds']:.2f}s rewriting ({r['total_seconds']:.1f}s with load, save and verify); "
          f"ops {sum(r['op_counts_before'].values())} -> {sum(r['op_counts_after'].values())}; "
          f"max |diff| {r['max_abs_diff']:.2g}")
    print(f"{'case':30} {'rewritten ms [p10-p90]':>24} {'native ms [p10-p90]':>24} {'speedup':>8} "
          f"{'floor ms':>9} {'beyond floor':>12}")
    for c in result["cases"]:
        beyond = "n/a" if c["embedding_speedup"] is None else f"{c['embedding_speedup']:.2f}x"
        print(f"{c['case']:30} {_fmt(c['fused']):>24} {_fmt(c['native']):>24} {c['speedup']:7.2f}x "
              f"{c['floor']['median_ms']:9.3f} {beyond:>12}")
    print("rewrite/batchN: the signature's graph on flat tensors, as a server runs it; /python-call: sig(**feeds), "
          "which also binds each of the 26 arguments in Python")
    print("floor: the same signature and MLP with no embedding (call and MLP costs both models pay); "
          "beyond floor: (native - floor) / (rewritten - floor)")
    for t in result["targets"]:
        print(f"target {t['target']} >= {t['min_speedup']}x [batch {t['batch']}]: "
              f"{speedup_text(t['speedup'], t['min_speedup'])}  "
              f"{'met' if t['met'] else 'NOT MET'}")
    print()


# ---------------------------------------------------------------------------
# Rewrite time: `bench rewrite --features N`

REWRITE_TIME_TARGET_S = 2.0  # for 1,000 features
REWRITE_TIME_JUDGED_FROM = 1000
_LADDER = (26, 100, 400, 1000)


def feature_counts(total):
    """(hashed, id-list) features of a `total`-feature model, in Criteo's 20 : 6."""
    hashed = round(total * HASHED / (HASHED + LISTS))
    return hashed, total - hashed


def time_rewrite(graph_def, fetches, handle_shapes, repeats):
    """Best time of `repeats` runs of the optimizer alone over a signature's graph."""
    from tf_ctr_ops import rewrite

    best, report = None, None
    for _ in range(repeats):
        t0 = time.perf_counter()
        _, report = rewrite.optimize_graph_def(graph_def, fetches, handle_shapes, serving_device="cpu")
        elapsed = time.perf_counter() - t0
        best = elapsed if best is None else min(best, elapsed)
    return best, report


def rewrite_time_target(features, seconds):
    """The optimizer's time limit, a time and not a speedup (kept apart from
    the suites' speedup targets): judged from 1,000 features on, where the
    per-feature work outweighs the optimizer's fixed start-up cost."""
    limit = REWRITE_TIME_TARGET_S * max(features, REWRITE_TIME_JUDGED_FROM) / 1000
    judged = features >= REWRITE_TIME_JUDGED_FROM
    text = (f"rewrite of the {features}-feature model in at most {limit:.3g} s ({REWRITE_TIME_TARGET_S:g} s per "
            f"1,000 features" + ("" if judged else f", judged from --features {REWRITE_TIME_JUDGED_FROM}") + ")")
    return {"target": text, "max_seconds": limit if judged else None, "seconds": seconds,
            "met": bool(seconds <= limit) if judged else None}


def rewrite_time_suite(cfg):
    """How the optimizer's time grows with the model: the rewrite suite's model
    at 26 features and up to --features N (optimizing the signature's graph
    only: no load, save or verification)."""
    import tensorflow as tf

    from tf_ctr_ops import rewrite

    sizes = sorted({n for n in _LADDER if n < cfg.features} | {min(26, cfg.features), cfg.features})
    rows = []
    with tempfile.TemporaryDirectory(prefix="tf_ctr_ops_bench_rewrite_time_") as tmp:
        for n in sizes:
            path = os.path.join(tmp, f"m{n}")
            build_model(cfg, 1000, 8, feature_counts(n)).export(path, verbose=False)
            loaded = tf.saved_model.load(path)
            sig = loaded.signatures["serving_default"]
            graph_def = sig.graph.as_graph_def(add_shapes=True)
            seconds, report = time_rewrite(graph_def, [t.name for t in sig.outputs],
                                           rewrite.captured_handle_shapes(sig), 1 if cfg.quick else 3)
            nodes = len(graph_def.node) + sum(len(f.node_def) for f in graph_def.library.function)
            rows.append({"features": n, "nodes": nodes, "matches": len(report["match"]), "seconds": seconds,
                         "ms_per_feature": 1e3 * seconds / n})
            print(f"rewrite time: {n:5d} features, {nodes:6d} nodes, {len(report['match']):5d} fused: "
                  f"{seconds:.2f} s ({1e3 * seconds / n:.2f} ms per feature)", flush=True)
    largest = rows[-1]
    target = rewrite_time_target(largest["features"], largest["seconds"])
    verdict = {True: "met", False: "NOT MET", None: "not judged"}[target["met"]]
    print(f"target {target['target']}: {target['seconds']:.3g} s  {verdict}")
    return {"suite": "rewrite", "rewrite_time": rows, "rewrite_time_target": target, "cases": [], "targets": []}

"""The `table` suite of `python -m tf_ctr_ops.bench`: the key-to-row hash table
against TF's own tables.

insert: every resident key inserted once, in chunks, into an empty table:
        tco.HashTable.find(insert=True) vs TF's find-or-insert composition
        (lookup, Unique of the missing keys, insert at the next rows) on a
        MutableHashTable and on a DenseHashTable. Timed once per side (it
        fills the table the other cases read); reported in keys/s.
find:   the rows of one batch of keys: HashTable.find vs each TF table's lookup.
pooled: the serving lookup, hash_table_embedding(mean) vs each TF table's
        lookup + tf.nn.safe_embedding_lookup_sparse.

Shapes: the lookup suite's (--vocab is the number of resident keys, random
int64 keys; a batch draws them by rank, Zipf or uniform). Both sides hand out
rows in order of first appearance, so they build the same key -> row
assignment, and every case's outputs are compared before it is timed.
`--grid full` adds 10M resident keys at D=64.
"""

import dataclasses
import gc
import time

import numpy as np

from tf_ctr_ops.bench.harness import (POOLED_BYTES, TARGET_DIST, make_bags, measure_copy_bandwidth, memory_shortfall, progress,
                                      progress_label, random_table, si, skip_table_group, suite, timed_entry, _ncpu)
from tf_ctr_ops.bench.report import print_copy, print_table, print_targets

POOLED_TARGET = 5.0             # x the faster TF-native table path, Zipf keys, headline shape
FIND_TARGET_PER_CORE = 50e6     # keys/s per core, Zipf keys
INSERT_CHUNK = 1 << 16
NATIVE_TABLES = {"native_mutable": "MutableHashTable", "native_dense": "DenseHashTable"}
FULL_EXTRA = ((10_000_000, 64),)


def _shapes(cfg):
    shapes = cfg.shape_list()
    if cfg.grid == "full":
        shapes += [dataclasses.replace(s, vocab=v, dim=d, headline=False) for v, d in FULL_EXTRA for s in shapes
                   if s.headline]
    return shapes


def _estimate(cfg):
    shapes = _shapes(cfg)
    return len(shapes) + 1, sum(3 * cfg.budget_s * 3 + s.vocab * 3e-6 for s in shapes) + 4 * cfg.budget_s


@suite("table", estimate=_estimate)
def table_suite(cfg):
    """tco.HashTable vs tf.lookup.experimental.{Mutable,Dense}HashTable: insert, find, pooled lookup."""
    import tensorflow as tf

    shapes = _shapes(cfg)
    rng = np.random.default_rng(cfg.seed + 7)
    copy = measure_copy_bandwidth(cfg)
    threads = _ncpu()
    print(f"table suite: {len(shapes)} shapes on {cfg.device}, {threads} CPU threads; --vocab = resident keys")
    print_copy(copy, cfg)
    cases, skipped, inserts = [], [], []
    for (n_keys, dim), group in _by_table(shapes).items():
        # values: numpy + fused + native + transient; keys and slots: ~64 B per key on both sides
        reason = memory_shortfall(n_keys * (dim * 4 * 4 + 64 * 3))
        if reason:
            skipped += skip_table_group("table", group, reason)
            continue
        tables = _build_tables(cfg, rng, n_keys, dim)
        inserts.append(tables.pop("insert"))
        print(f"tables: {si(n_keys)} keys, D={dim}: insert {_fmt_rates(inserts[-1])}")
        for shape in group:
            progress_label(f"table {shape.label()} {shape.dist}")
            cases += _cases(cfg, shape, tables, rng, copy)
            progress(f"table {shape.label()} {shape.dist}")
        del tables
        gc.collect()
    progress_label("table train")
    cases.append(_train_case(cfg, rng, copy))
    progress("table train")
    targets = _targets(cases, threads)
    result = {"suite": "table", "config": dataclasses.asdict(cfg), "copy_bandwidth": copy, "cases": cases,
              "inserts": inserts, "targets": targets, "skipped": skipped, "threads": threads}
    print_table(result)
    for c in cases:
        if c["series"] == "find":
            print(f"{c['case']} {c['shape']}: {c['keys_per_s']['fused'] / 1e6:.1f}M keys/s fused "
                  f"({c['keys_per_s']['fused'] / threads / 1e6:.1f}M per thread), "
                  f"{c['keys_per_s']['native'] / 1e6:.1f}M native ({c.get('native_path')})")
    print_targets(result)
    return result


def _by_table(shapes):
    groups = {}
    for s in shapes:
        groups.setdefault((s.vocab, s.dim), []).append(s)
    return groups


def _build_tables(cfg, rng, n_keys, dim):
    """The fused table and TF's two, filled with the same keys by each side's
    find-or-insert (timed: the insert record), and twin value matrices."""
    import tensorflow as tf

    import tf_ctr_ops as tco

    keys = rng.choice(np.int64(1) << 62, size=n_keys, replace=False).astype(np.int64)
    params = random_table(rng, n_keys, dim)
    with tf.device(cfg.device):
        # One value matrix per side, as the lookup suite keeps them apart (twin_tables).
        fused = tco.HashTable(dim=dim, capacity=n_keys, initializer=lambda shape, dtype: params)
        native_values = tf.Variable(params, name="native_values")
        mutable = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, default_value=-1)
        dense = tf.lookup.experimental.DenseHashTable(tf.int64, tf.int64, default_value=-1, empty_key=-1,
                                                      deleted_key=-2)
    del params

    chunk_spec = [tf.TensorSpec([None], tf.int64)]
    fused_insert = tf.function(lambda k: fused.find(k, insert=True), input_signature=chunk_spec)

    def native_insert_fn(table):
        size = tf.Variable(0, dtype=tf.int64, trainable=False)
        return tf.function(lambda k: native_find_or_insert(table, size, k), input_signature=chunk_spec)

    fns = {"fused": fused_insert, "native_mutable": native_insert_fn(mutable),
           "native_dense": native_insert_fn(dense)}
    record = {"keys": n_keys, "dim": dim, "chunk": INSERT_CHUNK}
    first = {}
    for name, fn in fns.items():
        fn(keys[:0])  # traced outside the timing: an empty chunk inserts nothing
        t0 = time.perf_counter()
        rows = [fn(keys[a:a + INSERT_CHUNK]).numpy() for a in range(0, n_keys, INSERT_CHUNK)]
        record[name] = {"s": time.perf_counter() - t0}
        record[name]["keys_per_s"] = n_keys / record[name]["s"]
        first[name] = np.concatenate(rows) if rows else np.zeros([0], np.int64)
    for name in NATIVE_TABLES:  # the same assignment: every row of a key equal on all sides
        if not np.array_equal(first[name], first["fused"]):
            from tf_ctr_ops.bench.harness import BenchmarkMismatch
            raise BenchmarkMismatch(f"table insert: {name} assigned other rows than the fused table")
    record["speedup"] = min(record[k]["s"] for k in NATIVE_TABLES) / record["fused"]["s"]
    return {"fused": fused, "mutable": mutable, "dense": dense, "native_values": native_values, "keys": keys,
            "insert": record}


def native_find_or_insert(table, size, keys):
    """TF's find-or-insert of 1-D keys in a tf.lookup table: the keys it lacks
    get rows size, size + 1, ... in order of first appearance."""
    import tensorflow as tf

    missing = tf.boolean_mask(keys, tf.reshape(table.lookup(keys) < 0, [-1]))
    new, _ = tf.unique(missing)
    n = tf.size(new, out_type=tf.int64)
    table.insert(new, tf.range(size, size + n))
    size.assign_add(n)
    return table.lookup(keys)


def _fmt_rates(record):
    parts = [f"{k.replace('native_', '')} {record[k]['keys_per_s'] / 1e6:.2f}M/s" for k in ("fused", *NATIVE_TABLES)]
    return ", ".join(parts) + f" (fused {record['speedup']:.2f}x the faster native)"


def _cases(cfg, shape, tables, rng, copy):
    import tensorflow as tf

    import tf_ctr_ops as tco

    bags = make_bags(cfg.at(shape), shape.dist, rng)
    keys_np = tables["keys"][bags["ids"]]  # ids are ranks: rank 0 the hottest key
    keys = tf.RaggedTensor.from_row_splits(tf.constant(keys_np), tf.constant(bags["offsets"]))
    flat = keys.flat_values
    fused, native_values = tables["fused"], tables["native_values"]
    ragged_spec = [tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1, row_splits_dtype=tf.int64)]
    flat_spec = [tf.TensorSpec([None], tf.int64)]

    def pooled_native(table):
        @tf.function(input_signature=ragged_spec)
        def run(k):
            with tf.device(cfg.device):
                rows = k.with_flat_values(table.lookup(k.flat_values)).to_sparse()
                return tf.nn.safe_embedding_lookup_sparse(native_values, rows, None, combiner="mean")
        return run

    def on_device(fn, spec):
        @tf.function(input_signature=spec)
        def run(k):
            with tf.device(cfg.device):
                return fn(k)
        return run

    pooled = {"fused": on_device(lambda k: tco.hash_table_embedding(fused, k, combiner="mean"), ragged_spec),
              "native_mutable": pooled_native(tables["mutable"]), "native_dense": pooled_native(tables["dense"])}
    find = {"fused": on_device(fused.find, flat_spec),
            "native_mutable": on_device(tables["mutable"].lookup, flat_spec),
            "native_dense": on_device(tables["dense"].lookup, flat_spec)}
    nnz = int(bags["nnz"])
    fields = {"shape": shape.label(), "dist": shape.dist, "headline": shape.headline, "keys": nnz,
              "resident_keys": shape.vocab}
    out = []
    for series, fns, arg, nbytes, counted in (
            ("pooled", pooled, keys, nnz * shape.dim * 4 + shape.batch * shape.dim * 4, POOLED_BYTES),
            ("find", find, flat, nnz * 8 * 2, "16 bytes a key (the key read, its row number written)")):
        calls = {k: (lambda f=f: f(arg).numpy()) for k, f in fns.items()}
        entry = timed_entry(f"table/{series}-{shape.dist}", calls, cfg, nbytes, copy, native_paths=NATIVE_TABLES,
                            bytes_counted=counted)
        entry.update(fields, series=series)
        entry["keys_per_s"] = {k: nnz / (entry[k]["median_ms"] * 1e-3) for k in ("fused", "native")}
        out.append(entry)
    return out


def _targets(cases, threads):
    out = []
    for c in cases:
        if not c.get("headline") or c["dist"] != TARGET_DIST:
            continue
        if c["series"] == "pooled":
            out.append({"target": "(a) hash_table_embedding(mean) vs TF table lookup + safe_embedding_lookup_sparse",
                        "dist": c["dist"], "shape": c["shape"], "min_speedup": POOLED_TARGET,
                        "speedup": c["speedup"], "met": bool(c["speedup"] >= POOLED_TARGET)})
        elif c["series"] == "find":
            per_core = c["keys_per_s"]["fused"] / threads
            out.append({"target": f"(b) find rate per core >= {FIND_TARGET_PER_CORE / 1e6:.0f}M keys/s "
                                  f"(as speedup: rate / target)",
                        "dist": c["dist"], "shape": c["shape"], "min_speedup": 1.0,
                        "speedup": per_core / FIND_TARGET_PER_CORE, "met": bool(per_core >= FIND_TARGET_PER_CORE)})
    return out


TRAIN_FEATURES = 26
TRAIN_HIDDEN = 64
TRAIN_LR = 0.05


def _train_case(cfg, rng, copy):
    """One SGD step of a DeepFM-style model (26 single-key features, each a
    table of raw int64 keys, FM + MLP) with find-or-insert: HashTable +
    hash_table_embedding against MutableHashTable (TF's find-or-insert
    composition) + tf.nn.embedding_lookup. Both start from the same values
    and take one step before the check, so the losses it compares read the
    updated values: a wrong gradient or update fails it."""
    import tensorflow as tf

    import tf_ctr_ops as tco

    batch, dim = max(1, cfg.batch // 4), min(cfg.dim, 16)
    key_space = min(cfg.vocab, 100_000)
    raw = [rng.choice(np.int64(1) << 62, size=key_space, replace=False) for _ in range(TRAIN_FEATURES)]
    params = [random_table(rng, key_space, dim) for _ in range(TRAIN_FEATURES)]
    w1 = rng.normal(0, 0.05, (TRAIN_FEATURES * dim, TRAIN_HIDDEN)).astype(np.float32)
    w2 = rng.normal(0, 0.05, (TRAIN_HIDDEN, 1)).astype(np.float32)
    ranks = np.stack([np.minimum(rng.zipf(cfg.zipf_a, batch) - 1, key_space - 1) for _ in range(TRAIN_FEATURES)], 1)
    keys = tf.constant(np.stack([raw[f][ranks[:, f]] for f in range(TRAIN_FEATURES)], 1))
    labels = tf.constant(rng.integers(0, 2, (batch, 1)).astype(np.float32))

    def head(embs, dense_vars):
        x = tf.stack(embs, axis=1)  # [B, F, D]
        fm = 0.5 * tf.reduce_sum(tf.square(tf.reduce_sum(x, 1)) - tf.reduce_sum(tf.square(x), 1), 1, keepdims=True)
        mlp = tf.nn.relu(tf.reshape(x, [-1, TRAIN_FEATURES * dim]) @ dense_vars[0]) @ dense_vars[1]
        return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels, fm + mlp))

    def sgd(pairs):
        for grad, var in pairs:
            if isinstance(grad, tf.IndexedSlices):
                var.scatter_sub(tf.IndexedSlices(TRAIN_LR * grad.values, grad.indices))
            else:
                var.assign_sub(TRAIN_LR * grad)

    with tf.device(cfg.device):
        tables = [tco.HashTable(dim=dim, capacity=key_space, initializer=lambda shape, dtype, p=p: p)
                  for p in params]
        fused_dense = [tf.Variable(w1), tf.Variable(w2)]
        native_values = [tf.Variable(p) for p in params]
        native_dense = [tf.Variable(w1), tf.Variable(w2)]
        native_tables = [tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, default_value=-1)
                         for _ in range(TRAIN_FEATURES)]
        sizes = [tf.Variable(0, dtype=tf.int64) for _ in range(TRAIN_FEATURES)]

    @tf.function
    def fused_step(k):
        with tf.device(cfg.device):
            with tf.GradientTape() as tape:
                embs = [tco.hash_table_embedding(t, k[:, f:f + 1], combiner="sum", insert=True)
                        for f, t in enumerate(tables)]
                loss = head(embs, fused_dense)
            variables = [t.values for t in tables] + fused_dense
            sgd(zip(tape.gradient(loss, variables), variables))
            return loss

    @tf.function
    def native_step(k):
        with tf.device(cfg.device):
            rows = [native_find_or_insert(t, n, k[:, f]) for f, (t, n) in enumerate(zip(native_tables, sizes))]
            with tf.GradientTape() as tape:
                embs = [tf.nn.embedding_lookup(v, r) for v, r in zip(native_values, rows)]
                loss = head(embs, native_dense)
            variables = native_values + native_dense
            sgd(zip(tape.gradient(loss, variables), variables))
            return loss

    fused_step(keys)  # the first step's loss reads only the initial values
    native_step(keys)
    fns = {"fused": lambda: fused_step(keys).numpy(), "native": lambda: native_step(keys).numpy()}
    nbytes = batch * TRAIN_FEATURES * dim * 4 * 3
    entry = timed_entry("table/train-step-zipf", fns, cfg, nbytes, copy, rtol=1e-4, atol=1e-5,
                        bytes_counted="3 x batch x features x D x 4 (rows read, gradient rows written, "
                                      "rows updated)")
    entry.update({"series": "train", "dist": "zipf", "headline": False, "keys": batch * TRAIN_FEATURES,
                  "shape": f"B={batch}, {TRAIN_FEATURES} features x {si(key_space)} keys D={dim}"})
    entry["keys_per_s"] = {k: batch * TRAIN_FEATURES / (entry[k]["median_ms"] * 1e-3) for k in ("fused", "native")}
    return entry

"""The `columns` suite of `python -m tf_ctr_ops.bench`: the feature columns
whose ids an op of their own builds, each fused with its pooled lookup
against the TF composition (under a linear model or an embedding column):

cross:      tco.cross_embedding_lookup vs tf.nn.safe_embedding_lookup_sparse(
            params, tf.sparse.cross_hashed(inputs, V)). Census-style: two
            sparse string features (1-3 and 1-2 values a row, a tenth of the
            rows missing the first, so they have no crosses) and a dense
            integer bucket, 1-6 crosses a row.
bucketized: tco.bucketized_embedding_lookup vs the bucketized_column's own
            sparse ids (Bucketize and the index building, by feature
            columns' code) + safe_embedding_lookup_sparse; 4 values a row.

Shapes: the grid's batch and dim, with V (capped at 1e6) the table's rows;
outputs are compared before anything is timed. The fused ops run on the CPU.
"""

import dataclasses

import numpy as np

from tf_ctr_ops.bench.harness import measure_copy_bandwidth, progress, progress_label, si, suite, timed_entry
from tf_ctr_ops.bench.report import print_copy, print_table


def _estimate(cfg):
    shapes = _shapes(cfg)
    return len(shapes), len(shapes) * 6 * cfg.budget_s + 2


MAX_BUCKETS = 1_000_000  # crossed columns hash into 1e3-1e6 buckets


def _shapes(cfg):
    """One case per (batch, dim, table size) of the configured shapes, the table capped at MAX_BUCKETS."""
    seen, out = set(), []
    for s in cfg.shape_list():
        s = dataclasses.replace(s, vocab=min(s.vocab, MAX_BUCKETS))
        if (s.batch, s.dim, s.vocab) not in seen:
            seen.add((s.batch, s.dim, s.vocab))
            out.append(s)
    return out


def _features(rng, batch):
    def sparse(width, missing):
        counts = np.where(rng.random(batch) < missing, 0, rng.integers(1, width + 1, batch))
        rows = np.repeat(np.arange(batch), counts)
        cols = np.concatenate([np.arange(c) for c in counts]) if batch else np.zeros(0, np.int64)
        values = np.array([f"v{i}" for i in rng.integers(0, 5000, int(counts.sum()))], dtype=object)
        return rows, cols, values

    return {"a": sparse(3, 0.1), "b": sparse(2, 0.0), "bucket": rng.integers(0, 8, (batch, 1))}


def _bucketized_case(cfg, shape, rng, copy):
    import tensorflow as tf
    from tensorflow.python.feature_column import feature_column_v2 as fc2

    import tf_ctr_ops as tco

    B, D, width = shape.batch, shape.dim, 4
    boundaries = [float(b) for b in np.geomspace(1, 1e4, 30)]
    V = width * (len(boundaries) + 1)
    with tf.device("/CPU:0"):
        params = tf.Variable(rng.normal(size=(V, D)).astype(np.float32))
        values = tf.constant(rng.lognormal(3, 2, (B, width)).astype(np.float32))
    column = fc2.bucketized_column(fc2.numeric_column("x", shape=(width,)), boundaries)

    @tf.function
    def fused(x):
        return tco.bucketized_embedding_lookup(params, x, boundaries, combiner="sum")

    @tf.function
    def native(x):
        ids = column.get_sparse_tensors(fc2.FeatureTransformationCache({"x": x}), None).id_tensor
        return tf.nn.safe_embedding_lookup_sparse(params, ids, None, combiner="sum")

    entry = timed_entry("bucketized", {"fused": lambda: fused(values).numpy(),
                                       "native": lambda: native(values).numpy()},
                        cfg, (B * width + B) * D * 4, copy)
    entry.update({"series": "bucketized", "kind": "bucketized", "fused_op": "CtrBucketizeEmbeddingLookup",
                  "native_op": "Bucketize + bucketized_column ids + safe_embedding_lookup_sparse",
                  "nnz": B * width, "shape": f"B={B} V={si(V)} D={D}", "batch": B, "vocab": V, "dim": D,
                  "dist": "lognormal"})
    return entry


def _cross_case(cfg, shape, rng, copy):
    import tensorflow as tf

    import tf_ctr_ops as tco

    B, V, D = shape.batch, shape.vocab, shape.dim
    f = _features(rng, B)
    with tf.device("/CPU:0"):
        params = tf.Variable(rng.normal(size=(V, D)).astype(np.float32))

        def sp(name, width):
            rows, cols, values = f[name]
            return tf.SparseTensor(tf.constant(np.stack([rows, cols], 1).reshape(-1, 2), tf.int64),
                                   tf.constant(values, tf.string), [B, width])

        inputs = [sp("a", 3), sp("b", 2), tf.constant(f["bucket"], tf.int64)]

    @tf.function
    def fused(a, b, bucket):
        return tco.cross_embedding_lookup(params, [a, b, bucket], V)

    @tf.function
    def native(a, b, bucket):
        return tf.nn.safe_embedding_lookup_sparse(params, tf.sparse.cross_hashed([a, b, bucket], V), None,
                                                  combiner="mean")

    crosses = int(tf.size(tf.sparse.cross_hashed(inputs, V).values))
    entry = timed_entry("cross/strings", {"fused": lambda: fused(*inputs).numpy(),
                                          "native": lambda: native(*inputs).numpy()},
                        cfg, (crosses + B) * D * 4, copy)
    entry.update({"series": "cross", "kind": "cross", "fused_op": "CtrCrossEmbeddingLookup",
                  "native_op": "SparseCross + safe_embedding_lookup_sparse", "nnz": crosses,
                  "shape": f"B={B} V={si(V)} D={D}", "batch": B, "vocab": V, "dim": D, "dist": "uniform"})
    return entry


@suite("columns", estimate=_estimate)
def columns_suite(cfg):
    """Crossed and bucketized columns' fused lookups vs their TF compositions."""
    rng = np.random.default_rng(cfg.seed + 11)
    copy = measure_copy_bandwidth(cfg)
    shapes = _shapes(cfg)
    print(f"columns suite: {len(shapes)} shapes on the CPU; cross: 2 sparse string features x 1 dense bucket, "
          "1-6 crosses a row, mean; bucketized: 4 values a row, sum")
    print_copy(copy, cfg)
    cases = []
    for shape in shapes:
        progress_label(f"columns B={shape.batch} D={shape.dim}")
        cases.append(_cross_case(cfg, shape, rng, copy))
        cases.append(_bucketized_case(cfg, shape, rng, copy))
        progress(f"columns B={shape.batch} D={shape.dim}")
    result = {"suite": "columns", "config": dataclasses.asdict(cfg), "copy_bandwidth": copy, "cases": cases,
              "targets": [], "skipped": []}
    print_table(result)
    return result

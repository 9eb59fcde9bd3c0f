"""Trains a TF1 partitioned embedding on parameter servers, for tests/test_distribute.py.

    python tests/tf1_ps_train.py OUT.npz

As Estimator-era models train: a graph built under
tf.compat.v1.train.replica_device_setter over an in-process cluster on
127.0.0.1 (2 parameter servers, 1 worker), a PartitionedVariable of 4 shards
spread over both servers, and a TF1 optimizer (Adagrad) run in a session on
the worker. The same model trains with tf_ctr_ops' v1 drop-ins and with
tf.compat.v1.nn's lookups, in both partition strategies. Writes the final
shards of each run to OUT.npz, and the ops of the fused lookup's graph that
read a shard's value with the device that ran them (from the session's step
stats) and the shard's device.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from ps_train import free_ports  # noqa: E402

VOCAB, DIM, BATCH, STEPS = 29, 4, 24, 4


def batches(rng):
    """SparseTensor ids with empty rows, negative ids (dropped) and weights."""
    out = []
    for _ in range(STEPS):
        lengths = rng.integers(0, 4, size=BATCH)
        indices = np.array([(r, c) for r in range(BATCH) for c in range(lengths[r])], np.int64).reshape(-1, 2)
        ids = rng.integers(-2, VOCAB, size=len(indices))
        out.append((indices, ids, rng.uniform(0.2, 2.0, size=len(indices)).astype(np.float32)))
    return out


def train(target, cluster, lookup, strategy, data, init):
    graph = tf.Graph()
    with graph.as_default():
        setter = tf.compat.v1.train.replica_device_setter(ps_tasks=2, worker_device="/job:worker/task:0",
                                                          cluster=cluster)
        with tf.compat.v1.device(setter):
            table = tf.compat.v1.get_variable("table", shape=[VOCAB, DIM], initializer=tf.constant(init),
                                              partitioner=tf.compat.v1.fixed_size_partitioner(4),
                                              use_resource=False)
            indices = tf.compat.v1.placeholder(tf.int64, [None, 2])
            ids = tf.compat.v1.placeholder(tf.int64, [None])
            weights = tf.compat.v1.placeholder(tf.float32, [None])
            sp_ids = tf.SparseTensor(indices, ids, [BATCH, 4])
            sp_weights = tf.SparseTensor(indices, weights, [BATCH, 4])
            out = lookup(table, sp_ids, sp_weights, combiner="sqrtn", partition_strategy=strategy)
            loss = tf.reduce_sum(tf.square(out - 0.5))
            step = tf.compat.v1.train.AdagradOptimizer(0.3).minimize(loss)
        shard_reads = {f"{v.op.name}/read": v.device for v in table}
        readers = {op.name: shard_reads[i.op.name] for op in graph.get_operations() for i in op.inputs
                   if i.op.name in shard_reads}
        with tf.compat.v1.Session(target) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            ran_on = {}
            for batch in data:
                meta = tf.compat.v1.RunMetadata()
                sess.run(step, dict(zip((indices, ids, weights), batch)),
                         options=tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
                         run_metadata=meta)
                ran_on.update({n.node_name: d.device for d in meta.step_stats.dev_stats for n in d.node_stats})
            shards = sess.run(list(table))
    placement = [(name, ran_on.get(name, "not run"), device) for name, device in sorted(readers.items())]
    return np.concatenate(shards), placement


def main(out_path):
    spec = {"ps": [f"127.0.0.1:{p}" for p in free_ports(2)], "worker": [f"127.0.0.1:{free_ports(1)[0]}"]}
    cluster = tf.train.ClusterSpec(spec)
    servers = [tf.distribute.Server(cluster, job_name=job, task_index=i)
               for job in ("ps", "worker") for i in range(len(spec[job]))]
    import tf_ctr_ops as tco

    rng = np.random.default_rng(7)
    data, init = batches(rng), rng.normal(size=(VOCAB, DIM)).astype(np.float32)
    results = {"init": init}
    for strategy in ("mod", "div"):
        ours, placement = train(servers[-1].target, cluster, tco.compat.v1.safe_embedding_lookup_sparse, strategy,
                                data, init)
        theirs, _ = train(servers[-1].target, cluster, tf.compat.v1.nn.safe_embedding_lookup_sparse, strategy,
                          data, init)
        results.update({f"ours_{strategy}": ours, f"tf_{strategy}": theirs,
                        f"placement_{strategy}": np.array(placement, dtype=object)})
    np.savez(out_path, **results)


if __name__ == "__main__":
    main(sys.argv[1])

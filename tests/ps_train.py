"""Trains a small CTR model under ParameterServerStrategy, for tests/test_distribute.py.

    python tests/ps_train.py OUT.npz

An in-process cluster on 127.0.0.1 (this process as chief, 2 workers, 2
parameter servers) trains the same model twice from the same weights through
a ClusterCoordinator: once with tf_ctr_ops' drop-ins, hash_embedding and
string_embedding, once with tf.nn's own lookups (the keys hashed, and the
strings of ids split and parsed, by TF's ops there). The
embedding tables are ShardedVariables of 2 shards, one per parameter server;
each step's sparse gradients update each shard where it lives. Steps are
scheduled one at a time, so both runs see the same batches in the same order. Writes both runs' final weights and losses to OUT.npz,
with the devices of the shards and the op types of the step's graph.

Then a HashTable (raw keys, a row each) trains in the cluster and in this
process alone on the same batches: its table variable sits whole on one
parameter server, however the partitioner would cut it, and its values are
partitioned over both.
"""

import os
import socket
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

VOCAB, DIM, BATCH, STEPS, LR = 60, 4, 16, 6, 0.2


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def in_process_cluster():
    ports = free_ports(5)
    spec = tf.train.ClusterSpec({"chief": [f"127.0.0.1:{ports[0]}"],
                                 "worker": [f"127.0.0.1:{p}" for p in ports[1:3]],
                                 "ps": [f"127.0.0.1:{p}" for p in ports[3:5]]})
    servers = [tf.distribute.Server(spec, job_name=job, task_index=i, protocol="grpc", start=True)
               for job in ("worker", "ps") for i in range(2)]
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(spec, task_type="chief", task_id=0,
                                                                    rpc_layer="grpc")
    # Tables (VOCAB rows or more) in 2 shards; the dense weights whole.
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=lambda shape, dtype: [2 if shape[0] >= VOCAB else 1] + [1] * (len(shape) - 1))
    return strategy, servers


def batches(seed=5):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(STEPS):
        lengths = rng.integers(0, 4, size=BATCH)
        ids = rng.integers(-1, VOCAB, size=int(lengths.sum()))  # -1: dropped by the safe lookup
        weights = rng.uniform(0.1, 2.0, size=ids.shape).astype(np.float32)
        # embedding_lookup_sparse ends at the last bag with an id: every bag has one.
        history_lengths = rng.integers(1, 4, size=BATCH)
        history = tf.RaggedTensor.from_row_lengths(rng.integers(0, VOCAB, size=int(history_lengths.sum())),
                                                   history_lengths)
        # Raw keys (user ids, say) hashed into VOCAB buckets: every bag has one, as above.
        key_lengths = rng.integers(1, 3, size=BATCH)
        keys = tf.RaggedTensor.from_row_lengths(rng.integers(0, 10**9, size=int(key_lengths.sum())), key_lengths)
        # Strings of 0-3 delimited ids ("" pools to zeros), as a CSV column holds them.
        tags = tf.constant([",".join(map(str, rng.integers(0, VOCAB, size=rng.integers(0, 4)))) for _ in range(BATCH)])
        labels = rng.integers(0, 2, size=(BATCH, 1)).astype(np.float32)
        out.append((tf.RaggedTensor.from_row_lengths(ids, lengths).to_sparse(),
                    tf.RaggedTensor.from_row_lengths(weights, lengths).to_sparse(), history.to_sparse(),
                    keys.to_sparse(), tags, labels))
    return out


def train(strategy, coordinator, lookups, init):
    safe, plain, hashed, split = lookups
    with strategy.scope():
        items = tf.Variable(init["items"])
        history_table = tf.Variable(init["history"])
        hashed_table = tf.Variable(init["hashed"])
        tags_table = tf.Variable(init["tags"])
        dense = tf.Variable(init["dense"])

    @tf.function
    def step(ids, weights, history, keys, tags, labels):
        with tf.GradientTape() as tape:
            x = tf.concat([safe(items, ids, weights, combiner="sqrtn", default_id=3),
                           plain(history_table, history, None, combiner="mean"),
                           hashed(hashed_table, keys), split(tags_table, tags)], 1)
            logits = tf.matmul(x, dense)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels, logits))
        shards = items.variables + history_table.variables + hashed_table.variables + tags_table.variables
        grads = tape.gradient(loss, shards + [dense])
        for var, g in zip(shards, grads[:-1]):
            var.scatter_sub(tf.IndexedSlices(LR * g.values, g.indices, g.dense_shape))
        dense.assign_sub(LR * grads[-1])
        return loss

    losses = []
    for b in batches():
        result = coordinator.schedule(step, args=b)
        coordinator.join()
        losses.append(result.fetch())
    graph = step.get_concrete_function(*batches()[0]).graph
    return ({"items": tf.concat(items.variables, 0).numpy(), "history": tf.concat(history_table.variables, 0).numpy(),
             "hashed": tf.concat(hashed_table.variables, 0).numpy(), "tags": tf.concat(tags_table.variables, 0).numpy(),
             "dense": dense.numpy(), "loss": np.array(losses)},
            [v.device for v in items.variables], sorted({op.type for op in graph.get_operations()}))


def train_hash_table(strategy=None, coordinator=None):
    """A HashTable of raw keys trained with inserts; without a strategy, in this process."""
    from tf_ctr_ops.hash_table import HashTable, hash_table_embedding

    with strategy.scope() if strategy else tf.name_scope("single"):
        table = HashTable(dim=DIM, capacity=VOCAB, initializer=tf.keras.initializers.RandomUniform(seed=3))
        dense = tf.Variable(np.linspace(-1, 1, DIM, dtype=np.float32).reshape(DIM, 1))

    @tf.function
    def step(keys, labels):
        with tf.GradientTape() as tape:
            logits = tf.matmul(hash_table_embedding(table, keys, combiner="sqrtn", insert=True), dense)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels, logits))
        values = table.values.variables if strategy else [table.values]
        grads = tape.gradient(loss, values + [dense])
        for var, g in zip(values, grads[:-1]):
            if g is not None:
                var.scatter_sub(tf.IndexedSlices(LR * g.values, g.indices, g.dense_shape))
        dense.assign_sub(LR * grads[-1])
        return loss

    losses = []
    for *_, keys, _, labels in batches():
        if coordinator is None:
            losses.append(step(keys, labels).numpy())
        else:
            result = coordinator.schedule(step, args=(keys, labels))
            coordinator.join()
            losses.append(result.fetch())
    keys, values = table.export()
    devices = [table.table.device] + [v.device for v in getattr(table.values, "variables", [table.values])]
    return {"keys": keys.numpy(), "values": values.numpy(), "loss": np.array(losses), "size": table.size().numpy()}, \
        devices


def main(out):
    strategy, _servers = in_process_cluster()
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    import tf_ctr_ops as tco

    rng = np.random.default_rng(0)
    init = {"items": rng.normal(size=(VOCAB, DIM)).astype(np.float32),
            "history": rng.normal(size=(VOCAB, DIM)).astype(np.float32),
            "hashed": rng.normal(size=(VOCAB, DIM)).astype(np.float32),
            "tags": rng.normal(size=(VOCAB, DIM)).astype(np.float32),
            "dense": rng.normal(size=(4 * DIM, 1)).astype(np.float32)}

    def tf_hashed(table, keys):  # what hash_embedding computes, in tf.nn's ops
        buckets = tf.strings.to_hash_bucket_fast(tf.strings.as_string(keys.values), VOCAB)
        return tf.nn.embedding_lookup_sparse(table, tf.SparseTensor(keys.indices, buckets, keys.dense_shape), None,
                                             combiner="mean")

    def tf_split(table, tags):  # what string_embedding computes, in tf.strings' and tf.nn's ops
        tokens = tf.strings.split(tags, ",")
        tokens = tf.ragged.boolean_mask(tokens, tf.strings.length(tokens) > 0)  # "" splits to [""]
        ids = tokens.with_values(tf.strings.to_number(tokens.values, tf.int64)).to_sparse()
        return tf.nn.safe_embedding_lookup_sparse(table, ids, None, combiner="mean")

    ours, devices, ops = train(strategy, coordinator,
                               (tco.safe_embedding_lookup_sparse, tco.embedding_lookup_sparse,
                                lambda table, keys: tco.hash_embedding(table, keys, combiner="mean"),
                                lambda table, tags: tco.string_embedding(tags, table, id_mode="index")), init)
    theirs, _, _ = train(strategy, coordinator,
                         (tf.nn.safe_embedding_lookup_sparse, tf.nn.embedding_lookup_sparse, tf_hashed, tf_split),
                         init)
    table_ps, table_devices = train_hash_table(strategy, coordinator)
    table_single, _ = train_hash_table()
    np.savez(out, devices=np.array(devices), ops=np.array(ops), init_items=init["items"], init_hashed=init["hashed"],
             init_tags=init["tags"], table_devices=np.array(table_devices),
             **{f"ours_{k}": v for k, v in ours.items()}, **{f"tf_{k}": v for k, v in theirs.items()},
             **{f"table_ps_{k}": v for k, v in table_ps.items()},
             **{f"table_single_{k}": v for k, v in table_single.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))

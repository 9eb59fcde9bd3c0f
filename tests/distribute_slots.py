"""Scenario "slots" of tests/distribute_run.py: hash-table slots
(multi_hash_table_embedding), a table found twice a step and tables that
admit keys on their second sighting, inserting under MirroredStrategy or
MultiWorkerMirroredStrategy, against one replica on the same global batches:
every key must get the row one process gives it. Also: a table with eviction
is refused under the strategy (one process evicts)."""

import numpy as np
import tensorflow as tf

GLOBAL_BATCH = 8


def run(strategy, mode, task, out):
    """Writes the table's keys and values and the pooled outputs to out
    (multiworker: every worker to out.TASK.npz)."""
    import tf_ctr_ops as tco

    rng = np.random.default_rng(0)
    batches = [(rng.integers(0, 40, size=(GLOBAL_BATCH, 3)), rng.integers(100, 140, size=(GLOBAL_BATCH, 2)))
               for _ in range(3)]
    with strategy.scope():
        # Distinct initial rows, the same in all runs: a key given another row
        # than in one process would pool another vector.
        table = tco.HashTable(dim=4, capacity=200, initializer=lambda shape, dtype: tf.reshape(
            tf.range(shape[0] * shape[1], dtype=dtype) / 100.0, shape))
        # Too small for the keys: each key without room counts as dropped once.
        small = tco.HashTable(dim=4, capacity=30, initializer=lambda shape, dtype: tf.reshape(
            tf.range(shape[0] * shape[1], dtype=dtype) / 100.0, shape))
        # Found twice a step, a feature at a time; and keys admitted on their
        # second sighting, in slots and in single finds.
        shared, admitting = (tco.HashTable(dim=4, capacity=200, admit_after=admit, initializer=lambda shape, dtype:
                                           tf.reshape(tf.range(shape[0] * shape[1], dtype=dtype) / 100.0, shape))
                             for admit in (1, 2))

    @tf.function
    def step(a, b):
        pooled = tco.multi_hash_table_embedding(table, [a, b], insert=True)
        pooled += tco.multi_hash_table_embedding(small, [a, b], insert=True)
        pooled += [tco.hash_table_embedding(shared, b, insert=True), tco.hash_table_embedding(shared, a, insert=True)]
        pooled += tco.multi_hash_table_embedding(admitting, [a, b], insert=True)
        pooled += [tco.hash_table_embedding(admitting, a[:, :1] + 1000, insert=True)]
        return tf.concat(pooled, axis=1)

    def mirrored_step(a, b):
        data = tf.data.Dataset.from_tensors((a, b)).unbatch().batch(GLOBAL_BATCH)
        for x in strategy.experimental_distribute_dataset(data):
            per_replica = strategy.run(step, args=x)
            return np.concatenate([t.numpy() for t in strategy.experimental_local_results(per_replica)])

    def worker_step(a, b):
        """This worker's half of the global batch: rows [task * half, (task + 1) * half)."""
        half = slice(task * GLOBAL_BATCH // 2, (task + 1) * GLOBAL_BATCH // 2)
        per_replica = strategy.run(step, args=(tf.constant(a[half]), tf.constant(b[half])))
        return np.concatenate([t.numpy() for t in strategy.experimental_local_results(per_replica)])

    one = {"single": lambda a, b: step(tf.constant(a), tf.constant(b)).numpy(), "mirrored": mirrored_step,
           "multiworker": worker_step}[mode]
    outputs = np.stack([one(a, b) for a, b in batches])
    keys, values = table.export()
    shared_keys, admitted_keys = (t.export()[0].numpy() for t in (shared, admitting))
    with strategy.scope():
        evicting = tco.HashTable(dim=4, capacity=4, eviction="lru")
    refusal = ""
    try:  # under a strategy, before any collective, in every worker alike
        strategy.run(tf.function(lambda k: tco.hash_table_embedding(evicting, k, insert=True)),
                     args=(tf.constant([[1], [2]], tf.int64),))
    except NotImplementedError as e:
        refusal = str(e)
    np.savez(f"{out}.{task}.npz" if mode == "multiworker" else out, keys=keys.numpy(), values=values.numpy(),
             outputs=outputs, eviction_refusal=refusal, shared_keys=shared_keys, admitted_keys=admitted_keys,
             small_statistics=[int(small.statistics()[k]) for k in ("size", "dropped")])

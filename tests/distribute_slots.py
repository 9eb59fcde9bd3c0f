"""Hash-table slots (multi_hash_table_embedding) inserting under
MirroredStrategy over 2 logical CPUs, or MultiWorkerMirroredStrategy over two
worker processes (TF_CONFIG), against one replica on the same global
batches: every key must get the row one process gives it.

    python tests/distribute_slots.py single|mirrored OUT.npz
    TF_CONFIG=... python tests/distribute_slots.py multiworker OUT.npz   # writes OUT.npz.TASK.npz
"""
import json
import os
import sys

import numpy as np
import tensorflow as tf

mode, out = sys.argv[1], sys.argv[2]
if mode == "mirrored":
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import tf_ctr_ops as tco  # noqa: E402

GLOBAL_BATCH = 8
rng = np.random.default_rng(0)
batches = [(rng.integers(0, 40, size=(GLOBAL_BATCH, 3)), rng.integers(100, 140, size=(GLOBAL_BATCH, 2)))
           for _ in range(3)]
task = json.loads(os.environ["TF_CONFIG"])["task"]["index"] if mode == "multiworker" else 0
strategy = {"mirrored": lambda: tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]),
            "multiworker": tf.distribute.MultiWorkerMirroredStrategy,
            "single": lambda: None}[mode]()
scope = strategy.scope() if strategy else tf.distribute.get_strategy().scope()
with scope:
    # Distinct initial rows, the same in all runs: a key given another row
    # than in one process would pool another vector.
    table = tco.HashTable(dim=4, capacity=200, initializer=lambda shape, dtype: tf.reshape(
        tf.range(shape[0] * shape[1], dtype=dtype) / 100.0, shape))


@tf.function
def step(a, b):
    pooled = tco.multi_hash_table_embedding(table, [a, b], insert=True)
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


run = {"single": lambda a, b: step(tf.constant(a), tf.constant(b)).numpy(), "mirrored": mirrored_step,
       "multiworker": worker_step}[mode]
outputs = np.stack([run(a, b) for a, b in batches])
keys, values = table.export()
np.savez(f"{out}.{task}.npz" if mode == "multiworker" else out, keys=keys.numpy(), values=values.numpy(),
         outputs=outputs)

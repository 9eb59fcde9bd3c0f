"""Hash-table slots (multi_hash_table_embedding) inserting under
MirroredStrategy over 2 logical CPUs, against one replica on the same global
batches: every key must get the row one process gives it.

    python tests/distribute_slots.py single|mirrored OUT.npz
"""
import sys

import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import tf_ctr_ops as tco  # noqa: E402

mode, out = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(0)
batches = [(rng.integers(0, 40, size=(8, 3)), rng.integers(100, 140, size=(8, 2))) for _ in range(3)]
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]) if mode == "mirrored" else None
scope = strategy.scope() if strategy else tf.distribute.get_strategy().scope()
with scope:
    # Distinct initial rows, the same in both runs: a key given another row
    # than in one process would pool another vector.
    table = tco.HashTable(dim=4, capacity=200, initializer=lambda shape, dtype: tf.reshape(
        tf.range(shape[0] * shape[1], dtype=dtype) / 100.0, shape))


@tf.function
def step(a, b):
    pooled = tco.multi_hash_table_embedding(table, [a, b], insert=True)
    return tf.concat(pooled, axis=1)


outputs = []
for a, b in batches:
    if strategy is None:
        outputs.append(step(tf.constant(a), tf.constant(b)).numpy())
        continue
    data = tf.data.Dataset.from_tensors((a, b)).unbatch().batch(8)
    for x in strategy.experimental_distribute_dataset(data):
        per_replica = strategy.run(step, args=x)
        outputs.append(np.concatenate([t.numpy() for t in strategy.experimental_local_results(per_replica)]))
keys, values = table.export()
np.savez(out, keys=keys.numpy(), values=values.numpy(), outputs=np.stack(outputs))

"""Inserting hash-table slots stepped on a new MirroredStrategy object each
time, traced and eager in turn (tests/test_distribute.py):

    python tests/distribute_new_strategies.py

TF numbers the collectives of every new strategy object from the same
instance keys, so a collective of another kind or rank than an earlier
step's at the same key aborts. The replicas' signal that the inserting
replica is done was a scalar all_reduce, which met the callers' [1]
all_gather there; it is an all_gather too now."""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import tf_ctr_ops as tco  # noqa: E402


def step_on_new_strategy(traced):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        table = tco.HashTable(dim=2, capacity=50)

    def step(a, b):
        return tco.multi_hash_table_embedding(table, [a, b], insert=True)[0]

    data = tf.data.Dataset.from_tensors((tf.constant([[1], [2], [3], [4]], tf.int64),
                                         tf.constant([[5], [6], [7], [8]], tf.int64))).unbatch().batch(4)
    for x in strategy.experimental_distribute_dataset(data):
        strategy.run(tf.function(step) if traced else step, args=x)
    return table.export()[0].numpy()


if __name__ == "__main__":
    for traced in (True, False, True, False):
        keys = step_on_new_strategy(traced)
        assert sorted(keys.tolist()) == list(range(1, 9)), keys
        print("traced" if traced else "eager", "ok", flush=True)
    sys.exit(0)

"""Runs the tf.distribute scenarios of tests/test_distribute.py under one
strategy and, in the same process, under TF's default strategy (one replica)
on the same global batches:

    python tests/distribute_run.py mirrored OUT_DIR                    # 2 logical CPU devices
    TF_CONFIG=... python tests/distribute_run.py multiworker OUT_DIR   # in each worker process

Scenario NAME writes OUT_DIR/NAME.MODE.npz for the strategy and
OUT_DIR/NAME.single.npz for one replica (under MultiWorkerMirroredStrategy
the chief runs the one-replica references). Logical
devices and TF_CONFIG must be set before TensorFlow starts, so a strategy
needs a process of its own; the one-replica runs share it, which spares a
process (and a TensorFlow start) per scenario.
"""

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

MIRRORED = ("layers", "table", "empty_grad", "slots", "subclassed")
MULTI_WORKER = ("layers", "table", "slots")  # the all-padding steps: under MirroredStrategy


def strategy_for(mode):
    if mode == "mirrored":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    if mode == "multiworker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    raise SystemExit(f"unknown mode {mode!r}: mirrored or multiworker")


def run_scenario(name, strategy, mode, task, out_dir):
    # Imported after the device setup: they run no op when imported.
    import distribute_empty_grad
    import distribute_slots
    import distribute_subclassed
    import distribute_train

    print(f"scenario {name} under {mode}", flush=True)  # names the scenario a failure's traceback follows
    out = out_dir / f"{name}.{mode}.npz"
    if name in ("layers", "table"):
        distribute_train.train(strategy, mode, task, out, name)
    elif name == "empty_grad":
        distribute_empty_grad.run(strategy, out)
    elif name == "subclassed":
        distribute_subclassed.run(strategy, out)
    else:
        distribute_slots.run(strategy, mode, task, out)


def main(mode, out_dir):
    strategy = strategy_for(mode)
    out_dir = Path(out_dir)
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"] if mode == "multiworker" else 0
    scenarios = MIRRORED if mode == "mirrored" else MULTI_WORKER
    if task == 0:
        # First: the other worker waits at its first collective until the
        # chief joins, where it would stop answering the chief's health
        # checks if it had finished.
        for name in scenarios:
            run_scenario(name, tf.distribute.get_strategy(), "single", 0, out_dir)
    for name in scenarios:
        run_scenario(name, strategy, mode, task, out_dir)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    sys.exit(main(*sys.argv[1:]))

"""tf.distribute: the layers train under MirroredStrategy (two logical CPU
devices) and MultiWorkerMirroredStrategy (two worker processes on
127.0.0.1), and the result equals single-replica training on the same global
batches; under ParameterServerStrategy the drop-ins train sharded tables as
tf.nn's lookups do. Each run is its own process (tests/distribute_train.py): logical
devices and TF_CONFIG must be set before TensorFlow starts."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import fresh_process_env
from ps_train import free_ports

SCRIPT = Path(__file__).with_name("distribute_train.py")
TIMEOUT_S = 300


def train(mode, out, env=None, wait=True, model="layers"):
    proc = subprocess.Popen([sys.executable, str(SCRIPT), mode, str(out), model], env=env or fresh_process_env(),
                            cwd=out.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if not wait:
        return proc
    output, _ = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == 0, output[-3000:]
    return np.load(out)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return train("single", tmp_path_factory.mktemp("single") / "single.npz")


def assert_same_training(got, want):
    assert int(want["replicas"]) == 1 and int(got["replicas"]) == 2
    weights = sorted(k for k in want.files if k.startswith("w"))
    assert weights == sorted(k for k in got.files if k.startswith("w")) and len(weights) == 5
    for k in weights:
        # Training moved every weight, embedding tables included ...
        assert np.abs(want[k] - want["i" + k[1:]]).max() > 1e-3, k
        # ... and two replicas moved it as one did (float32 summation order apart).
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)


def test_mirrored_strategy_matches_single_replica(single, tmp_path):
    assert_same_training(train("mirrored", tmp_path / "mirrored.npz"), single)


def run_two_workers(start):
    """start(env) -> Popen, called for two worker processes on 127.0.0.1;
    waits for both and checks that they succeeded."""
    cluster = {"worker": [f"127.0.0.1:{p}" for p in free_ports(2)]}
    workers = [start(dict(fresh_process_env(), TF_CONFIG=json.dumps({"cluster": cluster,
                                                                     "task": {"type": "worker", "index": index}})))
               for index in range(2)]
    try:
        outputs = [w.communicate(timeout=TIMEOUT_S)[0] for w in workers]
    finally:
        for w in workers:
            w.kill()
    for w, output in zip(workers, outputs):
        assert w.returncode == 0, output[-3000:]


def train_multi_worker(out, model="layers"):
    """Two worker processes on 127.0.0.1 (the chief writes out)."""
    run_two_workers(lambda env: train("multiworker", out, env=env, wait=False, model=model))
    return np.load(out)


def test_multi_worker_mirrored_strategy_matches_single_replica(single, tmp_path):
    assert_same_training(train_multi_worker(tmp_path / "multiworker.npz"), single)


def test_parameter_server_strategy_with_sharded_tables_matches_tf(tmp_path):
    """ParameterServerStrategy (an in-process cluster: chief, 2 workers, 2
    parameter servers, tests/ps_train.py): tables sharded over both parameter
    servers train through the drop-ins, hash_embedding and string_embedding
    exactly as through tf.nn's lookups."""
    out = tmp_path / "ps.npz"
    proc = subprocess.run([sys.executable, str(SCRIPT.with_name("ps_train.py")), str(out)], env=fresh_process_env(),
                          cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    z = np.load(out)
    assert [d.split("/device")[0] for d in z["devices"]] == ["/job:ps/replica:0/task:0", "/job:ps/replica:0/task:1"]
    assert "CtrEmbeddingLookup" in z["ops"] and "ResourceGather" in z["ops"]
    assert np.abs(z["ours_items"] - z["init_items"]).max() > 1e-3  # the sharded tables trained
    assert np.abs(z["ours_hashed"] - z["init_hashed"]).max() > 1e-3
    assert np.abs(z["ours_tags"] - z["init_tags"]).max() > 1e-3
    for k in ("items", "history", "hashed", "tags", "dense", "loss"):
        np.testing.assert_allclose(z[f"ours_{k}"], z[f"tf_{k}"], rtol=1e-5, atol=1e-6, err_msg=k)
    # A HashTable: its table whole on one server, its values in 2 shards;
    # every key got the row, and trained to the vector, of one process alone.
    table, values = z["table_devices"][0], z["table_devices"][1:]
    assert table.startswith("/job:ps/") and len(values) == 2 and all(v.startswith("/job:ps/") for v in values)
    assert int(z["table_ps_size"]) > 20
    np.testing.assert_array_equal(z["table_ps_keys"], z["table_single_keys"])
    for k in ("values", "loss"):
        np.testing.assert_allclose(z[f"table_ps_{k}"], z[f"table_single_{k}"], rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.fixture(scope="module")
def single_table(tmp_path_factory):
    out = tmp_path_factory.mktemp("single_table") / "single_table.npz"
    return dict(train("single", out, model="table"), rows=np.load(f"{out}.rows0.npy"))


def assert_same_table_training(got, want):
    assert int(got["replicas"]) == 2 and int(want["replicas"]) == 1
    assert int(got["table_size"]) == int(want["table_size"]) == np.unique(got["keys"]).size > 100
    np.testing.assert_array_equal(got["keys"], want["keys"])
    assert np.abs(want["user_vectors"]).max() > 1e-3  # the table's rows trained
    for k in ("user_vectors", "w_items", "w_ctr", "loss"):
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_hash_table_layer_under_mirrored_strategy_matches_single_replica(single_table, tmp_path):
    """Both replicas find and insert in the one table (it is not mirrored), so
    every key has one row; trained key -> vector maps equal one replica's."""
    assert_same_table_training(train("mirrored", tmp_path / "mirrored_table.npz", model="table"), single_table)


def test_hash_table_layer_under_multi_worker_strategy_matches_single_replica(single_table, tmp_path):
    """Each worker has a table of its own; inserting the keys of all replicas in
    replica order keeps the copies equal, so the aggregated gradients of a row
    train the same key everywhere, as one replica trains it. Each worker's
    checkpoint restores its copy (tests/distribute_train.py checks that)."""
    out = tmp_path / "multiworker_table.npz"
    assert_same_table_training(train_multi_worker(out, model="table"), single_table)
    rows = [np.load(f"{out}.rows{task}.npy") for task in (0, 1)]
    np.testing.assert_array_equal(rows[0], rows[1])
    # Rows in order of first appearance in the global batches, as in one process.
    np.testing.assert_array_equal(rows[0], single_table["rows"])


def test_steps_without_gradient_rows_train_under_mirrored_strategy(tmp_path):
    """All-padding batches and not-yet-admitted hash-table keys give table
    gradients of no rows on every replica: TF's all-gather of them crashed
    the process (SIGSEGV). They train, and as one replica does."""
    script = Path(__file__).with_name("distribute_empty_grad.py")
    got = {}
    for mode in ("single", "mirrored"):
        proc = subprocess.run([sys.executable, str(script), mode, str(tmp_path / f"{mode}.npz")],
                              env=fresh_process_env(), cwd=tmp_path, capture_output=True, text=True,
                              timeout=TIMEOUT_S)
        assert proc.returncode == 0, f"{mode}: exit {proc.returncode}\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"
        got[mode] = np.load(tmp_path / f"{mode}.npz")
    assert sorted(got["single"].files) == sorted(got["mirrored"].files)
    assert got["single"]["table_keys"].tolist() == [1, 2, 3, 4, 5, 6, 7], "admitted on the third sighting"
    for k in got["single"].files:
        np.testing.assert_allclose(got["mirrored"][k], got["single"][k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_hash_table_slots_under_mirrored_strategy_give_one_replicas_rows(tmp_path):
    """multi_hash_table_embedding inserts the keys of all its slots in one
    find; replica by replica the slots would interleave ([a0, b0, a1, b1]
    where one process has [a0, a1, b0, b1]) and keys would get other rows,
    so other initial vectors (tests/distribute_slots.py)."""
    runs = {}
    for mode in ("single", "mirrored"):
        out = tmp_path / f"{mode}.npz"
        proc = subprocess.run([sys.executable, str(SCRIPT.with_name("distribute_slots.py")), mode, str(out)],
                              env=fresh_process_env(), cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT_S)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        runs[mode] = np.load(out)
    assert runs["single"]["keys"].size > 50
    np.testing.assert_array_equal(runs["mirrored"]["keys"], runs["single"]["keys"])
    np.testing.assert_array_equal(runs["mirrored"]["outputs"], runs["single"]["outputs"])


def test_hash_table_slots_under_multi_worker_strategy_give_one_replicas_rows(tmp_path):
    """Each worker has its own table and finds all workers' keys slot by slot,
    so both copies give every key the row one process gives it, and each
    worker's half of the batch pools what one process pools for those rows."""
    script = SCRIPT.with_name("distribute_slots.py")
    single = tmp_path / "single.npz"
    proc = subprocess.run([sys.executable, str(script), "single", str(single)], env=fresh_process_env(),
                          cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    want = np.load(single)
    out = tmp_path / "multiworker.npz"
    run_two_workers(lambda env: subprocess.Popen([sys.executable, str(script), "multiworker", str(out)], env=env,
                                                 cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                 text=True))
    got = [np.load(f"{out}.{task}.npz") for task in (0, 1)]
    assert want["keys"].size > 50
    for task in (0, 1):
        np.testing.assert_array_equal(got[task]["keys"], want["keys"])
        np.testing.assert_array_equal(got[task]["values"], want["values"])
    np.testing.assert_array_equal(np.concatenate([got[0]["outputs"], got[1]["outputs"]], axis=1), want["outputs"])

"""tf.distribute: the layers train under MirroredStrategy (two logical CPU
devices) and MultiWorkerMirroredStrategy (two worker processes on
127.0.0.1), and the result equals single-replica training on the same global
batches; under ParameterServerStrategy (and TF1 parameter servers) the
drop-ins train sharded tables as tf.nn's lookups do. Each strategy runs in processes of its own
(tests/distribute_run.py, tests/ps_train.py): logical devices and TF_CONFIG
must be set before TensorFlow starts."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from conftest import fresh_process_env
from ps_train import free_ports

SCRIPT = Path(__file__).with_name("distribute_run.py")
TIMEOUT_S = 300


def start_run(mode, out_dir, env=None):
    return subprocess.Popen([sys.executable, str(SCRIPT), mode, str(out_dir)], env=env or fresh_process_env(),
                            cwd=out_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


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


def run_checks(out_dir, checks):
    """Runs every check on out_dir and fails naming each that failed: one
    process trains all scenarios of a strategy, so one test checks them."""
    failures = []
    for check in checks:
        try:
            check(out_dir)
        except AssertionError as e:
            failures.append(f"{check.__name__}: {e}")
    assert not failures, "\n\n".join(failures)


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


def check_layers_mirrored(mirrored):
    assert_same_training(np.load(mirrored / "layers.mirrored.npz"), np.load(mirrored / "layers.single.npz"))


def check_layers_multi_worker(multiworker):
    assert_same_training(np.load(multiworker / "layers.multiworker.npz"), np.load(multiworker / "layers.single.npz"))


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


def test_tf1_partitioned_table_on_parameter_servers_matches_tf(tmp_path):
    """A TF1 PartitionedVariable over 2 parameter servers (replica_device_setter,
    an in-process cluster; tests/tf1_ps_train.py) trains through the v1 safe
    lookup as through tf.compat.v1.nn's, in both partition strategies, and
    only each shard's own server reads it: a gather of its rows, never the
    whole shard sent to the worker."""
    out = tmp_path / "tf1_ps.npz"
    proc = subprocess.run([sys.executable, str(SCRIPT.with_name("tf1_ps_train.py")), str(out)],
                          env=fresh_process_env(), cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    z = np.load(out, allow_pickle=True)
    for strategy in ("mod", "div"):
        ours = z[f"ours_{strategy}"]
        assert np.abs(ours - z["init"]).max() > 1e-2, strategy  # the shards trained
        np.testing.assert_allclose(ours, z[f"tf_{strategy}"], rtol=1e-5, atol=1e-6, err_msg=strategy)
        placement = [tuple(p) for p in z[f"placement_{strategy}"]]
        gathers = [op for op, _, _ in placement if op.split("/")[-1].startswith("GatherV2")]
        assert len(gathers) == len(placement) == 4, placement
        for op, ran_on, shard_device in placement:
            assert ran_on.startswith(shard_device.replace("/job:ps/", "/job:ps/replica:0/")), (op, ran_on, shard_device)


def assert_same_table_training(got, want):
    assert int(got["replicas"]) == 2 and int(want["replicas"]) == 1
    assert int(got["table_size"]) == int(want["table_size"]) == np.unique(got["keys"]).size > 100
    np.testing.assert_array_equal(got["keys"], want["keys"])
    assert np.abs(want["user_vectors"]).max() > 1e-3  # the table's rows trained
    for k in ("user_vectors", "w_items", "w_ctr", "loss"):
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)


def check_hash_table_layer_mirrored(mirrored):
    """Both replicas find and insert in the one table (it is not mirrored), so
    every key has one row; trained key -> vector maps equal one replica's."""
    assert_same_table_training(np.load(mirrored / "table.mirrored.npz"), np.load(mirrored / "table.single.npz"))


def check_hash_table_layer_multi_worker(multiworker):
    """Each worker has a table of its own; inserting the keys of all replicas in
    replica order keeps the copies equal, so the aggregated gradients of a row
    train the same key everywhere, as one replica trains it. Each worker's
    checkpoint restores its copy (tests/distribute_train.py checks that)."""
    out = multiworker / "table.multiworker.npz"
    assert_same_table_training(np.load(out), np.load(multiworker / "table.single.npz"))
    rows = [np.load(f"{out}.rows{task}.npy") for task in (0, 1)]
    np.testing.assert_array_equal(rows[0], rows[1])
    # Rows in order of first appearance in the global batches, as in one process.
    np.testing.assert_array_equal(rows[0], np.load(multiworker / "table.single.npz.rows0.npy"))


def check_steps_without_gradient_rows_mirrored(mirrored):
    """All-padding batches and not-yet-admitted hash-table keys give table
    gradients of no rows on every replica: TF's all-gather of them crashed
    the process (SIGSEGV). They train, and as one replica does
    (tests/distribute_empty_grad.py)."""
    got = {mode: np.load(mirrored / f"empty_grad.{mode}.npz") for mode in ("single", "mirrored")}
    assert sorted(got["single"].files) == sorted(got["mirrored"].files)
    assert got["single"]["table_keys"].tolist() == [1, 2, 3, 4, 5, 6, 7], "admitted on the third sighting"
    for k in got["single"].files:
        np.testing.assert_allclose(got["mirrored"][k], got["single"][k], rtol=1e-5, atol=1e-6, err_msg=k)


def check_hash_table_slots_mirrored(mirrored):
    """multi_hash_table_embedding inserts the keys of all its slots in one
    find; replica by replica the slots would interleave ([a0, b0, a1, b1]
    where one process has [a0, a1, b0, b1]) and keys would get other rows,
    so other initial vectors (tests/distribute_slots.py)."""
    runs = {mode: np.load(mirrored / f"slots.{mode}.npz") for mode in ("single", "mirrored")}
    assert runs["single"]["keys"].size > 50
    np.testing.assert_array_equal(runs["mirrored"]["keys"], runs["single"]["keys"])
    # A table found twice a step (replica by replica, the second find's keys
    # of the first replica took rows before the first find's of the second)
    # and tables that admit keys on their second sighting, counted once.
    assert runs["single"]["shared_keys"].size > 50 and 0 < runs["single"]["admitted_keys"].size < 80
    for k in ("shared_keys", "admitted_keys"):
        np.testing.assert_array_equal(runs["mirrored"][k], runs["single"][k], err_msg=k)
    np.testing.assert_array_equal(runs["mirrored"]["outputs"], runs["single"]["outputs"])
    # Every replica finds all replicas' keys; each inserted and counted the
    # keys without room as dropped, once per replica.
    size, dropped = runs["single"]["small_statistics"]
    assert size == 30 and dropped > 0, runs["single"]["small_statistics"]
    np.testing.assert_array_equal(runs["mirrored"]["small_statistics"], runs["single"]["small_statistics"])
    assert str(runs["single"]["eviction_refusal"]) == ""
    assert "eviction" in str(runs["mirrored"]["eviction_refusal"])


def check_subclassed_model_keeps_one_key_table(mirrored):
    """A subclassed model's variables are created after Keras' symbolic build
    (tests/distribute_subclassed.py): the key table is still one variable,
    and fit gives every key the row and vector one replica gives it."""
    runs = {mode: np.load(mirrored / f"subclassed.{mode}.npz") for mode in ("single", "mirrored")}
    assert str(runs["mirrored"]["variable_type"]) == "ResourceVariable", runs["mirrored"]["variable_type"]
    assert runs["single"]["keys"].size > 30
    np.testing.assert_array_equal(runs["mirrored"]["keys"], runs["single"]["keys"])
    np.testing.assert_allclose(runs["mirrored"]["values"], runs["single"]["values"], rtol=1e-5, atol=1e-6)


def check_hash_table_slots_multi_worker(multiworker):
    """Each worker has its own table and finds all workers' keys slot by slot,
    so both copies give every key the row one process gives it, and each
    worker's half of the batch pools what one process pools for those rows."""
    want = np.load(multiworker / "slots.single.npz")
    got = [np.load(multiworker / f"slots.multiworker.npz.{task}.npz") for task in (0, 1)]
    assert want["keys"].size > 50
    for task in (0, 1):
        np.testing.assert_array_equal(got[task]["keys"], want["keys"])
        np.testing.assert_array_equal(got[task]["values"], want["values"])
        np.testing.assert_array_equal(got[task]["small_statistics"], want["small_statistics"])
        for k in ("shared_keys", "admitted_keys"):
            np.testing.assert_array_equal(got[task][k], want[k], err_msg=k)
        # It inserted without evicting, dropping new keys once full.
        assert "eviction" in str(got[task]["eviction_refusal"]), got[task]["eviction_refusal"]
    assert str(want["eviction_refusal"]) == ""
    np.testing.assert_array_equal(np.concatenate([got[0]["outputs"], got[1]["outputs"]], axis=1), want["outputs"])


def test_mirrored_strategy_matches_single_replica(tmp_path):
    """MirroredStrategy over two logical CPUs (tests/distribute_run.py): the
    layers, the hash-table layer, steps without gradient rows and hash-table
    slots each train as one replica does on the same global batches."""
    proc = start_run("mirrored", tmp_path)
    output, _ = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == 0, output[-3000:]
    run_checks(tmp_path, [check_layers_mirrored, check_hash_table_layer_mirrored,
                          check_steps_without_gradient_rows_mirrored, check_hash_table_slots_mirrored,
                          check_subclassed_model_keeps_one_key_table])


def test_multi_worker_mirrored_strategy_matches_single_replica(tmp_path):
    """MultiWorkerMirroredStrategy over two worker processes on 127.0.0.1,
    whose chief also runs the one-replica references."""
    run_two_workers(lambda env: start_run("multiworker", tmp_path, env=env))
    run_checks(tmp_path, [check_layers_multi_worker, check_hash_table_layer_multi_worker,
                          check_hash_table_slots_multi_worker])


def test_hash_table_slots_step_on_new_strategies_traced_and_eager():
    """tests/distribute_new_strategies.py: an eager step after a traced one
    on a new MirroredStrategy aborted in a collective (shape mismatch)."""
    proc = subprocess.run([sys.executable, str(SCRIPT.with_name("distribute_new_strategies.py"))],
                          env=fresh_process_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert proc.stdout.split() == ["traced", "ok", "eager", "ok"] * 2, proc.stdout

"""8 threads calling the same ops (the concatenated string ops among them),
and the same tf.function, at once.

Every result must be bit-identical to the serial run: the kernels keep no
state between calls, each bag is pooled by one thread in a fixed order, and
error reporting (the first bad id across shards) is independent of
scheduling. TF_CTR_OPS_CONCURRENCY_ITERS sets the iterations per thread
(default 50; the slow test runs 500).
"""

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tensorflow as tf

import tf_ctr_ops as tco
from tf_ctr_ops import _core
from tf_ctr_ops.strings import _ops as string_ops

THREADS = 8
ITERS = int(os.environ.get("TF_CTR_OPS_CONCURRENCY_ITERS", "50"))


def _inputs():
    rng = np.random.default_rng(7)
    params = tf.constant(rng.normal(size=(500, 16)).astype(np.float32))
    lengths = rng.integers(0, 12, size=256)
    lengths[::17] = 0
    ids = tf.RaggedTensor.from_row_lengths(rng.integers(0, 500, size=int(lengths.sum())), lengths)
    weights = ids.with_flat_values(tf.constant(rng.uniform(-1, 2, size=int(lengths.sum())).astype(np.float32)))
    sp, sw = ids.to_sparse(), weights.to_sparse()
    strings = tf.constant([",".join(str(v) for v in rng.integers(0, 500, size=n)) for n in lengths])
    keys = tf.constant([[f"k{v}" for v in row] for row in rng.integers(0, 10**6, size=(256, 4))])
    return params, ids, weights, sp, sw, strings, keys


PARAMS, IDS, WEIGHTS, SP, SW, STRINGS, KEYS = _inputs()

# Three features for the concatenated ops: whole-string keys, index lists and
# clipped hashed lists, pooled into one [B, 48] output.
CONCAT_ATTRS = dict(combiners=["sum", "mean", "sqrtn"], id_modes=["hash", "index", "hash"], delimiters=["", ",", ","],
                    skip_empty=[True, True, False], max_norms=[-1.0, -1.0, 1.0], num_buckets=[0, 0, 0],
                    trim_empty_tail=[False] * 3)
CONCAT_STRINGS = [KEYS[:, 0], STRINGS, STRINGS]


def _string_tensor_op(strings):
    return string_ops.ctr_concat_string_tensor_embedding(params=[PARAMS] * 3, strings=strings, dense=[],
                                                         **CONCAT_ATTRS)


def _eager_ops():
    """name -> zero-argument callable returning numpy arrays."""
    def grad(fn):
        def run():
            with tf.GradientTape() as tape:
                tape.watch(PARAMS)
                loss = tf.reduce_sum(fn() ** 2)
            return tf.convert_to_tensor(tape.gradient(loss, PARAMS)).numpy()
        return run

    return {
        "embedding_lookup_sparse": lambda: tco.embedding_lookup_sparse(PARAMS, SP, SW, combiner="sqrtn",
                                                                       max_norm=2.0).numpy(),
        "safe_embedding_lookup_sparse": lambda: tco.safe_embedding_lookup_sparse(PARAMS, SP, SW, default_id=3).numpy(),
        "sparse_embedding": lambda: tco.sparse_embedding(PARAMS, IDS, WEIGHTS).numpy(),
        "hash_embedding_int": lambda: tco.hash_embedding(PARAMS, IDS, combiner="sum").numpy(),
        "hash_embedding_str": lambda: tco.hash_embedding(PARAMS, KEYS).numpy(),
        "string_embedding": lambda: tco.string_embedding(STRINGS, PARAMS, id_mode="index").numpy(),
        "multi_string_embedding": lambda: np.concatenate([o.numpy() for o in tco.multi_string_embedding(
            [STRINGS, STRINGS], [PARAMS, PARAMS], id_modes=["mod", "hash"])], axis=1),
        "concat_string_embedding": lambda: tco.multi_string_embedding(
            CONCAT_STRINGS, [PARAMS] * 3, combiners=CONCAT_ATTRS["combiners"], id_modes=CONCAT_ATTRS["id_modes"],
            delimiters=[None, ",", ","], skip_empty=CONCAT_ATTRS["skip_empty"], max_norms=[None, None, 1.0],
            concat=True).numpy(),
        "concat_string_tensor_embedding": lambda: _string_tensor_op(CONCAT_STRINGS).numpy(),
        "pack_strings": lambda: np.concatenate([t.numpy().astype(np.int64) for t in tco.pack_strings(STRINGS)]),
        "grad_sparse_embedding": grad(lambda: tco.sparse_embedding(PARAMS, IDS, WEIGHTS, max_norm=1.0)),
        "grad_string_embedding": grad(lambda: tco.string_embedding(STRINGS, PARAMS, combiner="sqrtn")),
        "core_embedding_lookup": lambda: _core.embedding_lookup(
            PARAMS.numpy(), IDS.flat_values.numpy(), IDS.row_splits.numpy(), WEIGHTS.flat_values.numpy(),
            combiner="mean", threads=2),
        "core_string_embedding": lambda: _core.string_embedding(
            PARAMS.numpy(), *[t.numpy() for t in tco.pack_strings(STRINGS)], id_mode="hash", threads=2),
    }


@tf.function(reduce_retracing=True)
def _graph(params, ids, weights, strings):
    with tf.GradientTape() as tape:
        tape.watch(params)
        a = tco.sparse_embedding(params, ids, weights, combiner="mean")
        b = tco.string_embedding(strings, params, id_mode="mod", combiner="sum")
        c = tco.hash_embedding(params, ids, combiner="sqrtn")
        loss = tf.reduce_sum(a * b) + tf.reduce_sum(c)
    return a, b, c, tf.convert_to_tensor(tape.gradient(loss, params))


def _function_result():
    return np.concatenate([t.numpy().ravel() for t in _graph(PARAMS, IDS, WEIGHTS, STRINGS)])


def _bad_ids_error():
    bad = tf.ragged.constant([[1, 2], [3], [], [7, 10**9, 5], [10**9 + 1]], tf.int64)
    try:
        tco.sparse_embedding(PARAMS, bad)
    except tf.errors.InvalidArgumentError as e:
        return e.message.split("[Op")[0].split("}}")[-1].strip()
    return "no error"


def _bad_token_error():
    """Bad tokens in several shards of the string-tensor op (each shard
    describes its own while its buffer lives): the lowest row's is reported."""
    lists = STRINGS.numpy().astype(object)
    for row in (40, 130, 250):
        lists[row] = f"1,x{row},2".encode()
    try:
        _string_tensor_op([KEYS[:, 0], tf.constant(lists), STRINGS])
    except tf.errors.InvalidArgumentError as e:
        return e.message.split("[Op")[0].split("}}")[-1].strip()
    return "no error"


def _hammer(calls, iters):
    """Runs every call `iters` times on each of THREADS threads, all starting together."""
    barrier = threading.Barrier(THREADS)

    def worker(_):
        barrier.wait()
        return [[fn() for fn in calls.values()] for _ in range(iters)]

    with ThreadPoolExecutor(THREADS) as pool:
        return list(pool.map(worker, range(THREADS)))


def _check(iters):
    calls = dict(_eager_ops())
    calls["tf_function"] = _function_result
    calls["error"] = _bad_ids_error
    calls["token_error"] = _bad_token_error
    serial = {name: fn() for name, fn in calls.items()}
    assert "id 1000000000 in row 3" in serial["error"], serial["error"]
    assert "feature 1: token 'x40' in row 40" in serial["token_error"], serial["token_error"]
    # The two concatenated forms are one op's two inputs: the same bits.
    np.testing.assert_array_equal(serial["concat_string_tensor_embedding"], serial["concat_string_embedding"])
    for thread_results in _hammer(calls, iters):
        for iteration in thread_results:
            for (name, want), got in zip(serial.items(), iteration):
                if isinstance(want, str):
                    assert got == want, name
                else:
                    np.testing.assert_array_equal(got, want, err_msg=name)


def test_ops_and_function_concurrently_match_serial():
    _check(ITERS)


@pytest.mark.slow
def test_ops_and_function_concurrently_match_serial_long():
    _check(500)

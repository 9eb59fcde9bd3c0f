"""Size limits: huge batches, strings, dims, vocabularies and packed buffers.

Either the op handles the size (int64 offsets and row indices throughout),
or it fails with a clear error before allocating: InvalidArgument for sizes
that overflow or contradict the inputs, ResourceExhausted (TF's allocator)
for a tensor that does not fit in memory, as the TF compositions do. Never a
crash. The cases that once crashed the process run in a child process, so a
regression is a failed test naming the case, not a dead test session.

The fast cases run in CI; the heavy ones (B = 1,000,000, a 1,000,000-token
string, D = 1024 at scale, V > 2^31 rows, a packed buffer over 2^31 bytes)
are marked slow: `pytest -m slow tests/test_limits.py`.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import tf_ctr_ops as tco
from tf_ctr_ops import _core
from tf_ctr_ops._loader import load_op_library
from conftest import fresh_process_env

_ops = load_op_library()
TESTS = Path(__file__).resolve().parent
I64_MAX = 2**63 - 1
ERRORS = ("InvalidArgumentError", "ResourceExhaustedError")


# ---------------------------------------------------------------------------
# Adversarial sizes, each run in a child process


def _lookup(ids, segments, num_rows, params=None, kind="row_ids", grad=False):
    params = tf.ones([4, 3]) if params is None else params
    args = dict(params=params, ids=tf.constant(ids, tf.int64), segments=tf.constant(segments, tf.int64),
                num_rows=tf.constant(num_rows, tf.int64), weights=tf.zeros([0]), segment_kind=kind)
    if grad:
        return _ops.ctr_embedding_lookup_grad(grad=tf.zeros([1, 3]), **args)
    return _ops.ctr_embedding_lookup(**args)


def _string_raw(splits, data=b"1,2"):
    return _ops.ctr_string_embedding(params=tf.ones([4, 2]), bytes=tf.constant(list(data), tf.uint8),
                                     row_splits=tf.constant(splits, tf.int64), bag_splits=tf.zeros([0], tf.int64),
                                     id_mode="index")


def _graph_of(build):
    """Builds `build()`'s ops in a fresh graph: shape functions run there, at
    construction, where a failed CHECK aborts the process."""
    with tf.Graph().as_default():
        build()


def _string_of_empty_splits(bagged):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.uint8), tf.TensorSpec([None if bagged else 0], tf.int64),
                                  tf.TensorSpec([0 if bagged else None], tf.int64)])
    def f(data, row_splits, bag_splits):
        return _ops.ctr_string_embedding(params=tf.ones([4, 2]), bytes=data, row_splits=row_splits,
                                         bag_splits=bag_splits, bagged=bagged, id_mode="index")
    f.get_concrete_function()


def _vocab():
    return tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
        tf.constant(["a", "b"]), tf.constant([0, 1], tf.int64)), -1).resource_handle


def _concat_vocab_of_widths(width):
    keys, params = tf.constant([], tf.string), tf.zeros([0, width])
    return _ops.ctr_concat_vocab_embedding(
        table_handles=[_vocab()] * 2, keys=[keys, keys], default_values=[tf.constant(-1, tf.int64)] * 2,
        params=[params, params], dense=[], mask_keys=[], mask_ids=[], missing_keys=["default"] * 2,
        missing_ids=[-1, -1], wrap_negative_ids=[False, False])


def _concat_vocab_of_oov_lists(slots, ids, starts):
    """One feature whose Keras rules name oov_slots but not all three lists:
    the kernel read entry 0 of the empty ones (a segfault)."""
    return _ops.ctr_concat_vocab_embedding(
        table_handles=[_vocab()], keys=[tf.constant(["a"])], default_values=[tf.constant(-1, tf.int64)],
        params=[tf.ones([5, 2])], dense=[], mask_keys=[], mask_ids=[], missing_keys=["default"], missing_ids=[-1],
        wrap_negative_ids=[False], oov_slots=slots, oov_ids=ids, oov_starts=starts)


def _cross_of_values(values):
    """A sparse input (N = 1) with `values` tensors: the kernel and the shape
    function read them at offsets of N (an abort, a segfault)."""
    return _ops.ctr_cross_embedding_lookup(params=tf.ones([10, 4]), indices=[tf.constant([[0, 0], [1, 0]], tf.int64)],
                                           values=values, shapes=[tf.constant([2, 1], tf.int64)], dense_inputs=[],
                                           num_buckets=10, hash_key=0)


def _concat_vocab_of_keys(keys):
    """One feature (N = 1) given `keys`: the kernel read its other inputs at
    offsets of len(keys) (an abort: an int64 tensor read as floats)."""
    return _ops.ctr_concat_vocab_embedding(
        table_handles=[_vocab()], keys=keys, default_values=[tf.zeros([3, 4], tf.int64)], params=[tf.ones([3, 4])],
        dense=[], mask_keys=[], mask_ids=[], missing_keys=["default"], missing_ids=[-1], wrap_negative_ids=[False])


def _cross_rows(batch):
    return _ops.ctr_cross_embedding_lookup(params=tf.zeros([4, 3]), indices=[tf.zeros([0, 2], tf.int64)],
                                           values=[tf.zeros([0], tf.int64)], shapes=[tf.constant([batch, 1], tf.int64)],
                                           dense_inputs=[], num_buckets=4, hash_key=1)


def _int_vocab():
    return tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
        tf.constant([1], tf.int64), tf.constant([0], tf.int64)), -1)


def _lookup_grad_of_no_rows(dim):
    return _ops.ctr_embedding_lookup_grad(
        grad=tf.zeros([0, dim]), params=tf.zeros([0, dim]), ids=tf.zeros([0], tf.int64),
        segments=tf.constant([0], tf.int64), num_rows=tf.constant(-1, tf.int64), weights=tf.zeros([0]),
        segment_kind="row_splits")


CASES = {
    # Bag counts from row ids / num_rows: checked before anything is sized by them.
    "last_row_id_negative": lambda: _lookup([1], [-5], -1),
    "row_id_2^62": lambda: _lookup([1], [2**62], -1),
    "row_id_int64_max": lambda: _lookup([1], [I64_MAX], -1),
    "num_rows_2^62": lambda: _lookup([1], [0], 2**62),
    "num_rows_int64_max": lambda: _lookup([1], [0], I64_MAX),
    "grad_row_id_2^62": lambda: _lookup([1], [2**62], -1, grad=True),
    "safe_dense_shape_2^62": lambda: tco.safe_embedding_lookup_sparse(
        tf.ones([4, 3]), tf.SparseTensor([[0, 0]], tf.constant([1], tf.int64), [2**62, 1])),
    "embedding_lookup_sparse_row_2^62": lambda: tco.embedding_lookup_sparse(
        tf.ones([4, 3]), tf.SparseTensor([[2**62, 0]], tf.constant([1], tf.int64), [2**62 + 1, 1]), None),
    "sparse_embedding_dense_shape_2^62": lambda: tco.sparse_embedding(
        tf.ones([4, 3]), tf.SparseTensor([[0, 0]], tf.constant([1], tf.int64), [2**62, 1])),
    # [B, D] outputs whose element count overflows int64 (a V = 0 table holds no memory).
    "lookup_output_overflow": lambda: tco.sparse_embedding(tf.zeros([0, 2**62]), tf.ragged.constant(
        [[], [], [], []], tf.int64)),
    "string_output_overflow": lambda: tco.string_embedding(["", "", "", ""], tf.zeros([0, 2**62]), id_mode="index"),
    "multi_string_output_overflow": lambda: tco.multi_string_embedding(
        [tf.constant(["", "", "", ""])], [tf.zeros([0, 2**62])], id_modes="index"),
    # Tables of no row and huge rows: products and sums of their widths (the
    # row size, the sharding cost, a concatenation) overflowed int64.
    "lookup_rows_of_2^65_elements": lambda: tco.sparse_embedding(tf.zeros([0, 2**62, 8]), tf.ragged.constant(
        [[]], tf.int64)),
    "lookup_rows_of_2^62_no_bags": lambda: tco.sparse_embedding(tf.zeros([0, 2**62]), tf.ragged.constant(
        [], tf.int64, ragged_rank=1)),
    "lookup_grad_rows_of_2^62_no_bags": lambda: _lookup_grad_of_no_rows(2**62),
    "string_rows_of_2^62_no_strings": lambda: tco.string_embedding(tf.constant([], tf.string), tf.zeros([0, 2**62]),
                                                                   id_mode="index"),
    "concat_strings_width_past_int64": lambda: tco.multi_string_embedding(
        [tf.constant([], tf.string)] * 2, [tf.zeros([0, 2**62])] * 2, id_modes="index", concat=True),
    "vocab_oov_ids_past_int64": lambda: tco.vocab_embedding(_int_vocab(), tf.constant([5], tf.int64), tf.ones([4, 3]),
                                                            oov_slots=4, oov_start=I64_MAX, oov_id=-1),
    "bucketize_column_stride_past_int64": lambda: _ops.ctr_bucketize_embedding_lookup(
        params=tf.ones([4, 3]), input=tf.constant([[1.0, 2.0, 3.0]]), boundaries=[0.5], column_stride=2**62),
    "core_output_overflow": lambda: _core.embedding_lookup(np.zeros((0, 2**40), np.float32), np.zeros(0, np.int64),
                                                           np.zeros(2**23 + 1, np.int64)),
    # An empty batch of a huge-D table: a [0, D] result, with no scratch of D
    # floats (which would be 4 TiB; under ASan a failed `new` aborts).
    "core_empty_batch_huge_dim": lambda: _core.embedding_lookup(np.zeros((0, 2**40), np.float32),
                                                                np.zeros(0, np.int64), np.zeros(1, np.int64)),
    # A crossed batch the size a sparse input's dense_shape claims, with no entries.
    "cross_dense_shape_2^40": lambda: _cross_rows(2**40),
    "cross_dense_shape_int64_max": lambda: _cross_rows(I64_MAX),
    # Shape functions: a batch the cross's splits cannot count; splits of no offset.
    "cross_dense_batch_int64_max_in_a_graph": lambda: _graph_of(lambda: _ops.ctr_cross_embedding_lookup(
        params=tf.zeros([4, 3]), indices=[], values=[], shapes=[],
        dense_inputs=[tf.compat.v1.placeholder(tf.int64, [I64_MAX, 1])], num_buckets=4, hash_key=1)),
    "string_row_splits_of_shape_0_in_a_function": lambda: _string_of_empty_splits(bagged=False),
    "string_bag_splits_of_shape_0_in_a_function": lambda: _string_of_empty_splits(bagged=True),
    # Vocabulary ops: an output of too many dims, or of more than 2^63 elements.
    "vocab_embedding_of_300_dims": lambda: _ops.ctr_vocab_embedding(
        table_handle=_vocab(), keys=tf.fill([1] * 200, "a"), default_value=tf.constant(-1, tf.int64),
        params=tf.zeros([2] + [1] * 100), mask_keys=[], mask_ids=[]),
    "concat_vocab_width_past_int64": lambda: _concat_vocab_of_widths(2**62),
    "vocab_multi_hot_output_past_int64": lambda: _ops.ctr_vocab_multi_hot(
        table_handle=_vocab(), keys=tf.zeros([2**40, 0], tf.string), default_value=tf.constant(-1, tf.int64),
        kernel=tf.zeros([0, 2**40])),
    # No elements out, 2^40 rows: the rows were still walked (for hours).
    "vocab_multi_hot_2^40_rows_of_no_units": lambda: _ops.ctr_vocab_multi_hot(
        table_handle=_vocab(), keys=tf.zeros([2**40, 0], tf.string), default_value=tf.constant(-1, tf.int64),
        kernel=tf.zeros([3, 0])),
    "multi_hot_dense_output_past_int64": lambda: _ops.ctr_multi_hot_dense(
        ids=[tf.zeros([2**40, 0], tf.int64)], dense=[], kernel=tf.zeros([0, 2**40]), depths=[0], binary_output=[True]),
    "multi_hot_dense_2^40_rows_of_no_units": lambda: _ops.ctr_multi_hot_dense(
        ids=[tf.zeros([2**40, 0], tf.int64)], dense=[], kernel=tf.zeros([1, 0]), depths=[1], binary_output=[True]),
    "concat_vocab_oov_slots_alone": lambda: _concat_vocab_of_oov_lists([0], [], []),
    "concat_vocab_oov_ids_missing": lambda: _concat_vocab_of_oov_lists([1], [], [0]),
    "concat_vocab_oov_starts_missing": lambda: _concat_vocab_of_oov_lists([1], [-1], []),
    "cross_values_fewer_than_N": lambda: _cross_of_values([]),
    "cross_values_fewer_than_N_in_a_graph": lambda: _graph_of(lambda: _cross_of_values([])),
    "cross_values_more_than_N": lambda: _cross_of_values([tf.constant([1, 2], tf.int64)] * 2),
    "concat_vocab_keys_more_than_N": lambda: _concat_vocab_of_keys([tf.constant(["a", "b", "c"]),
                                                                    tf.constant(0, tf.int64)]),
    "concat_vocab_keys_more_than_N_in_a_graph": lambda: _graph_of(lambda: _concat_vocab_of_keys(
        [tf.constant(["a", "b", "c"]), tf.constant(0, tf.int64)])),
    # A negative base made kept entries' indices read as "not kept" (-1).
    "unique_kept_negative_idx_base": lambda: _ops.ctr_unique_kept(
        ids=tf.constant([3, 9], tf.int64), segments=tf.constant([0, 2], tf.int64), num_rows=tf.constant(-1, tf.int64),
        weights=tf.zeros([0]), segment_kind="row_splits", table_rows=5, idx_base=-1),
    # A base near int64's end wrapped the indices to negative ones.
    "unique_kept_idx_base_past_int64": lambda: _ops.ctr_unique_kept(
        ids=tf.constant([3, 9], tf.int64), segments=tf.constant([0, 2], tf.int64), num_rows=tf.constant(-1, tf.int64),
        weights=tf.zeros([0]), segment_kind="row_splits", table_rows=10, idx_base=2**63 - 1),
    # int64 byte offsets past the end of a small packed buffer.
    "splits_2^31_past_buffer": lambda: _string_raw([0, 2**31 + 5]),
    "splits_2^33_past_buffer": lambda: _string_raw([2**33, 2**33]),
    "splits_2^62_in_the_middle": lambda: _string_raw([0, 2**62, 3]),
    "splits_negative": lambda: _string_raw([-(2**63), 0]),
    "multi_splits_past_buffer": lambda: _ops.ctr_multi_string_embedding(
        params=[tf.ones([4, 2])], bytes=tf.constant([49], tf.uint8), row_splits=tf.constant([0, 2**31 + 1], tf.int64),
        combiners=["mean"], id_modes=["index"], delimiters=[","], skip_empty=[True], max_norms=[-1.0]),
    "core_splits_past_buffer": lambda: _core.string_embedding(np.ones((4, 2), np.float32),
                                                              np.frombuffer(b"1,2", np.uint8),
                                                              np.array([0, 2**31 + 5], np.int64), id_mode="index"),
}

# The outcome each case must have: the error's class name (any of a tuple), or "ok".
EXPECT = {name: ERRORS for name in CASES}
EXPECT["core_output_overflow"] = ("ValueError", "MemoryError")
EXPECT["core_splits_past_buffer"] = ("ValueError",)
EXPECT["core_empty_batch_huge_dim"] = ("ok",)
for _name in ("lookup_rows_of_2^62_no_bags", "lookup_grad_rows_of_2^62_no_bags", "string_rows_of_2^62_no_strings"):
    EXPECT[_name] = ("ok",)  # empty results: the sanitizer stage catches an overflow on the way
EXPECT["vocab_multi_hot_2^40_rows_of_no_units"] = ("ok",)
EXPECT["multi_hot_dense_2^40_rows_of_no_units"] = ("ok",)
for _name in ("cross_dense_batch_int64_max_in_a_graph", "string_row_splits_of_shape_0_in_a_function",
              "string_bag_splits_of_shape_0_in_a_function", "cross_values_fewer_than_N_in_a_graph",
              "concat_vocab_keys_more_than_N_in_a_graph"):
    EXPECT[_name] = ("ValueError",)  # TF's name for a shape function's error at graph construction


def _outcome(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 (the class is the outcome)
        return type(e).__name__, str(e).splitlines()[0][:300] if str(e) else ""
    return "ok", ""


def _child(names):
    """Runs the named cases in this (child) process, one JSON line each."""
    for name in names:
        print("BEGIN " + name, flush=True)
        kind, message = _outcome(CASES[name])
        print("CASE " + json.dumps([name, kind, message]), flush=True)


@pytest.fixture(scope="module")
def child_outcomes():
    """name -> (outcome, message); a case that kills the child is ("crash", ...)."""
    env = fresh_process_env()  # the same tf_ctr_ops as this run; this folder for `import test_limits`
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(TESTS)])
    results, todo = {}, list(CASES)
    while todo:
        code = f"import test_limits; test_limits._child({todo!r})"
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=TESTS, env=env,
                              timeout=900)
        begun = None
        for line in proc.stdout.splitlines():
            if line.startswith("BEGIN "):
                begun = line[6:]
            elif line.startswith("CASE "):
                name, kind, message = json.loads(line[5:])
                results[name] = (kind, message)
                begun = None
        if begun is not None:  # the child died inside this case
            results[begun] = ("crash", f"exit status {proc.returncode}: {proc.stderr[-2000:]}")
        elif proc.returncode != 0 and len(results) < len(CASES):
            pytest.fail(f"the case runner failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
        todo = [n for n in CASES if n not in results]
    return results


@pytest.mark.parametrize("name", list(CASES))
def test_adversarial_size_is_an_error_not_a_crash(child_outcomes, name):
    kind, message = child_outcomes[name]
    assert kind in EXPECT[name], f"{name}: {kind} {message}"


# ---------------------------------------------------------------------------
# Large but legitimate sizes, fast enough for CI


def test_vocab_beyond_2_to_31_rows():
    """Ids and tokens past 2^31 address rows of a V > 2^31 table (D = 0: no memory)."""
    big = 2**31 + 2
    params = tf.zeros([big, 0])
    ids = tf.ragged.constant([[2**31, 2**31 + 1], [0]], tf.int64)
    assert tco.sparse_embedding(params, ids).shape == (2, 0)
    assert tco.string_embedding(["2147483649,7"], params, id_mode="index").shape == (1, 0)
    assert tco.safe_embedding_lookup_sparse(params, ids.to_sparse(), default_id=2**31 + 1).shape == (2, 0)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"id 2147483650 in row 0 is out of range \[0, 2147483650\)"):
        tco.sparse_embedding(params, tf.ragged.constant([[big]], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="2147483650, out of range"):
        tco.string_embedding(["2147483650"], params, id_mode="index")


def test_hash_buckets_near_2_to_31_match_tf():
    keys = tf.constant([b"a", b"", b"\x00\xff", b"x" * 100, b"2147483647"])
    for buckets in (2**31 - 1, 2**31, 2**31 + 1, 2**32 + 15):
        np.testing.assert_array_equal(_core.hash_buckets(keys.numpy().tolist(), buckets),
                                      tf.strings.to_hash_bucket_fast(keys, buckets).numpy())


def test_dim_1024(rng):
    params = tf.constant(rng.normal(size=(300, 1024)).astype(np.float32))
    ids = tf.RaggedTensor.from_row_lengths(rng.integers(0, 300, size=640), [10] * 64)
    got = tco.sparse_embedding(params, ids, combiner="sqrtn", max_norm=20.0)
    want = tf.nn.safe_embedding_lookup_sparse(params, ids.to_sparse(), combiner="sqrtn", max_norm=20.0)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------
# Heavy sizes (slow profile)


def _mem_available_gib():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


def _need_memory(gib):
    if _mem_available_gib() < gib:
        pytest.skip(f"needs about {gib} GiB of free memory, {_mem_available_gib():.1f} GiB available")


@pytest.mark.slow
def test_batch_of_a_million_rows(rng):
    params = tf.constant(rng.normal(size=(1000, 8)).astype(np.float32))
    lengths = rng.integers(0, 6, size=1_000_000)
    ids = tf.RaggedTensor.from_row_lengths(rng.integers(0, 1000, size=int(lengths.sum())), lengths)
    got = tco.sparse_embedding(params, ids)
    want = tf.nn.safe_embedding_lookup_sparse(params, ids.to_sparse())
    assert got.shape == (1_000_000, 8)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    strings = tf.strings.reduce_join(tf.strings.as_string(ids), axis=1, separator=",")
    got = tco.string_embedding(strings, params, id_mode="index")
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_one_string_of_a_million_tokens(rng):
    params = tf.constant(rng.normal(size=(5000, 4)).astype(np.float32))
    values = rng.integers(0, 5000, size=1_000_000)
    s = ",".join(map(str, values))
    for mode, combiner in (("index", "sum"), ("hash", "mean"), ("mod", "sqrtn")):
        got = tco.string_embedding([s], params, id_mode=mode, combiner=combiner)
        toks = tf.strings.split([s], ",")
        ids = tf.strings.to_hash_bucket_fast(toks, 5000) if mode == "hash" else tf.strings.to_number(toks, tf.int64)
        want = tf.nn.safe_embedding_lookup_sparse(params, ids.to_sparse(), combiner=combiner)
        # A million float32 additions in different orders (TF sums in blocks):
        # the tolerance is relative to the sum of the terms' magnitudes.
        rows = ids.flat_values.numpy() % 5000
        scale = {"sum": 1.0, "mean": 1.0 / len(rows), "sqrtn": len(rows) ** -0.5}[combiner]
        atol = 2e-5 * np.abs(params.numpy()[rows]).sum(axis=0) * scale
        np.testing.assert_array_less(np.abs(got.numpy() - want.numpy())[0], atol)


@pytest.mark.slow
def test_dim_1024_at_scale(rng):
    params = tf.constant(rng.normal(size=(20_000, 1024)).astype(np.float32))
    ids = tf.RaggedTensor.from_row_lengths(rng.integers(0, 20_000, size=200_000), [20] * 10_000)
    with tf.GradientTape() as tape:
        tape.watch(params)
        got = tco.sparse_embedding(params, ids)
    want = tf.nn.safe_embedding_lookup_sparse(params, ids.to_sparse())
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    g = tape.gradient(got, params)
    assert isinstance(g, tf.IndexedSlices) and g.values.shape == (200_000, 1024)


@pytest.mark.slow
def test_vocab_beyond_2_to_31_rows_in_memory():
    """A [2^31 + 16, 1] half table (4 GiB): rows past 2^31 hold what they should."""
    _need_memory(12)
    vocab = 2**31 + 16
    table = np.zeros((vocab, 1), np.float16)
    probe = np.array([0, 2**31 - 1, 2**31, 2**31 + 5, vocab - 1], np.int64)
    table[probe, 0] = [1, 2, 3, 4, 5]
    params = tf.constant(table)
    del table
    ids = tf.RaggedTensor.from_row_lengths(probe, [1] * len(probe))
    got = tco.sparse_embedding(params, ids, combiner="sum").numpy()[:, 0]
    np.testing.assert_array_equal(got, [1, 2, 3, 4, 5])
    got = tco.string_embedding([str(v) for v in probe], params, id_mode="index", combiner="sum").numpy()[:, 0]
    np.testing.assert_array_equal(got, [1, 2, 3, 4, 5])
    want = tf.nn.safe_embedding_lookup_sparse(params, ids.to_sparse(), combiner="sum").numpy()[:, 0]
    np.testing.assert_array_equal(want, [1, 2, 3, 4, 5])


@pytest.mark.slow
def test_packed_buffer_over_2_to_31_bytes():
    """Strings totalling 2^31 + 13 bytes: int64 offsets, and the token after 2^31 is found."""
    _need_memory(14)
    head = b"," * (2**31 + 10) + b"3"  # one token, at byte offset 2^31 + 10
    params = tf.constant(np.arange(20, dtype=np.float32).reshape(10, 2))
    strings = tf.constant([head, b"5,7"])
    del head
    data, splits = tco.pack_strings(strings)
    assert splits.dtype == tf.int64
    np.testing.assert_array_equal(splits.numpy(), [0, 2**31 + 11, 2**31 + 14])
    got = tco.string_embedding((data, splits), params, id_mode="index").numpy()
    np.testing.assert_array_equal(got, [[6, 7], [12, 13]])
    got = tco.string_embedding(strings, params, id_mode="hash", combiner="sum").numpy()
    want = tf.nn.safe_embedding_lookup_sparse(
        params, tf.strings.to_hash_bucket_fast(tf.ragged.constant([[b"3"], [b"5", b"7"]]), 10).to_sparse(),
        combiner="sum").numpy()
    np.testing.assert_array_equal(got, want)

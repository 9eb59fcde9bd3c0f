"""GPU launchers (cuda/lookup_kernels.cu) against the CPU core, through tf_ctr_ops._core.

The CUDA kernels are called on raw device pointers allocated with CuPy or
PyTorch, whichever is installed, and compared with the CPU pooling of the same
framework-free core (_core.embedding_lookup) on random inputs; the gradient is
compared with a float64 NumPy reference. TensorFlow is never imported: _core is
loaded straight from the package folder, without running tf_ctr_ops/__init__.py
(which loads the TF op library).

Skips, with the reason, when _core is not built, was built without CUDA, or no
GPU is reachable through CuPy or PyTorch.
"""

import numpy as np
import pytest

from core_helpers import Buffer, assert_close, backend_or_skip, core_or_skip, decode, encode_table
from core_helpers import upload as upload_to

COMBINERS = ["sum", "mean", "sqrtn"]
DTYPES = ["float32", "float16", "bfloat16"]

core = core_or_skip()
backend = backend_or_skip()


def storage_dtype(dtype):
    return {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}[dtype]


def upload(array, offset=0):
    return upload_to(backend, array, offset)


# ---------------------------------------------------------------------------
# Calls.


def gpu_lookup(table, dtype, keys, offsets, weights=None, misalign=False, **opts):
    """_core.gpu_embedding_lookup on copies of the inputs; float32 result."""
    device_table = np.ascontiguousarray(table)
    vocab, dim = device_table.shape
    shift = device_table.itemsize if misalign else 0
    params = upload(device_table, shift)
    keys_buf = upload(keys)
    weights_buf = upload(np.asarray(weights, np.float32)) if weights is not None else None
    offsets_buf = upload(np.asarray(offsets, np.int64))
    rows = len(offsets) - 1
    out = Buffer(backend, rows * dim * device_table.itemsize, shift)
    status = Buffer(backend, 16)
    core.gpu_embedding_lookup(
        params.ptr, dtype, vocab, dim, keys_buf.ptr, str(keys.dtype), len(keys),
        weights_buf.ptr if weights_buf else 0, offsets_buf.ptr, rows, out.ptr, status.ptr, **opts)
    return decode(out.read(device_table.dtype, (rows, dim)), dtype)


def cpu_lookup(table, keys, offsets, weights=None, **opts):
    return core.embedding_lookup(table, keys, np.asarray(offsets, np.int64), weights, **opts).astype(np.float32)


def gpu_lookup_grad(table, dtype, keys, offsets, grad_out, weights=None, want_weight_grads=False,
                    max_grad_rows=None, **opts):
    """(grad_values float32 [n, dim], grad_indices [n], grad_weights or None)."""
    device_table = np.ascontiguousarray(table)
    vocab, dim = device_table.shape
    rows, nnz = len(offsets) - 1, len(keys)
    cap = nnz + rows if max_grad_rows is None else max_grad_rows
    params = upload(device_table)
    keys_buf = upload(keys)
    weights_buf = upload(np.asarray(weights, np.float32)) if weights is not None else None
    offsets_buf = upload(np.asarray(offsets, np.int64))
    grad_buf = upload(np.ascontiguousarray(grad_out))
    values = Buffer(backend, cap * dim * device_table.itemsize)
    indices = Buffer(backend, cap * 8)
    # NaN-filled, so an entry the kernel forgets to write cannot pass.
    grad_weights = upload(np.full(nnz, np.nan, np.float32)) if want_weight_grads else None
    ws_bytes = core.gpu_embedding_lookup_grad_workspace_bytes(rows)
    workspace = Buffer(backend, ws_bytes)
    n = core.gpu_embedding_lookup_grad(
        params.ptr, dtype, vocab, dim, keys_buf.ptr, str(keys.dtype), nnz,
        weights_buf.ptr if weights_buf else 0, offsets_buf.ptr, rows, grad_buf.ptr, values.ptr,
        indices.ptr, grad_weights.ptr if grad_weights else 0, cap, workspace.ptr, ws_bytes, **opts)
    backend.synchronize()
    got_values = decode(values.read(device_table.dtype, (cap, dim))[:n], dtype)
    got_indices = indices.read(np.int64, (cap,))[:n]
    got_weights = grad_weights.read(np.float32, (nnz,)) if grad_weights else None
    return got_values, got_indices, got_weights


# ---------------------------------------------------------------------------
# Reference semantics (cc/core/lookup.h), for the gradient.

SKIP, BAD = -1, -2


def resolve(keys, vocab, id_mode, invalid_ids):
    k = keys.astype(np.int64)
    if id_mode == "hash":
        rows = core.hash_int_keys(k, vocab) if len(k) else np.zeros(0, np.int64)
    else:
        rows = np.where((k >= 0) & (k < vocab), k, BAD)
        if invalid_ids == "skip_negative":
            rows[k < 0] = SKIP
    if invalid_ids == "skip_padding":
        rows[k == -1] = SKIP
    return rows


def reference_grad(table, keys, offsets, grad_out, weights, combiner="mean", id_mode="index",
                   invalid_ids="error", prune_weights=False, default_id=-1, max_norm=-1.0):
    table = table.astype(np.float64)
    grad_out = grad_out.astype(np.float64)
    rows = resolve(keys, table.shape[0], id_mode, invalid_ids)
    w_all = np.ones(len(keys)) if weights is None else weights.astype(np.float64)

    def clip_scale(x):
        norm = np.sqrt(x @ x)
        return max_norm / norm if max_norm > 0 and norm > max_norm else 1.0

    def clip_backward(x, g, scale):
        norm = np.sqrt(x @ x)
        if max_norm > 0 and norm >= max_norm:  # a tie's gradient is the clip's, as in tf.clip_by_norm
            return scale * (max_norm / norm) * (g - x * (x @ g) / (x @ x))
        return scale * g

    values, indices = [], []
    grad_weights = np.zeros(len(keys))
    for r in range(len(offsets) - 1):
        g = grad_out[r]
        kept = [i for i in range(offsets[r], offsets[r + 1])
                if rows[i] >= 0 and (not prune_weights or w_all[i] > 0)]
        if not kept:
            if default_id >= 0:
                values.append(clip_backward(table[default_id], g, 1.0))
                indices.append(default_id)
            continue
        w = w_all[kept]
        total, total_sq = w.sum(), (w * w).sum()
        scale = {"sum": 1.0,
                 "mean": 0.0 if total == 0 else 1.0 / total,
                 "sqrtn": 0.0 if total_sq == 0 else 1.0 / np.sqrt(total_sq)}[combiner]
        pooled = sum(wi * clip_scale(table[rows[i]]) * table[rows[i]] for i, wi in zip(kept, w))
        g_dot_out = g @ pooled * scale
        for i, wi in zip(kept, w):
            x = table[rows[i]]
            values.append(clip_backward(x, g, wi * scale))
            indices.append(rows[i])
            g_dot_e = clip_scale(x) * (g @ x)
            if combiner == "sum":
                grad_weights[i] = g_dot_e
            elif combiner == "mean":
                grad_weights[i] = 0.0 if total == 0 else (g_dot_e - g_dot_out) * scale
            else:
                grad_weights[i] = 0.0 if total_sq == 0 else g_dot_e * scale - g_dot_out * wi * scale * scale
    dim = table.shape[1]
    return (np.array(values).reshape(-1, dim), np.array(indices, np.int64), grad_weights)


# ---------------------------------------------------------------------------
# Inputs.


# Longest bag of the random batches: short bags (mean under 8) are pooled a
# lane group per bag, long ones a warp per bag (cuda/lookup_kernels.cu).
BAG_LENGTHS = [9, 40]


def random_offsets(rng, batch, max_len, empty_frac=0.2):
    lengths = rng.integers(0, max_len + 1, size=batch)
    lengths[rng.random(batch) < empty_frac] = 0
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def random_keys(rng, n, vocab, id_mode, invalid_ids, key_dtype):
    """Valid ids, plus the invalid ones the policy drops (never ones it rejects)."""
    if id_mode == "hash":
        hi = np.iinfo(key_dtype).max
        keys = rng.integers(-hi, hi, size=n, dtype=np.int64)
    else:
        keys = rng.integers(0, vocab, size=n)
        drop = rng.random(n) < 0.15
        if invalid_ids == "skip_negative":
            keys[drop] = -rng.integers(1, 1000, size=int(drop.sum()))
        elif invalid_ids == "skip_padding":
            keys[drop] = -1
    if invalid_ids == "skip_padding" and id_mode == "hash":
        keys[rng.random(n) < 0.15] = -1
    return keys.astype(key_dtype)


def random_table(rng, vocab, dim):
    return rng.normal(size=(vocab, dim)).astype(np.float32)


# ---------------------------------------------------------------------------
# Forward.

CONFIGS = [
    # (weighted, prune_weights, max_norm, default_id, invalid_ids)
    (False, False, -1.0, -1, "error"),
    (True, False, -1.0, 3, "skip_negative"),
    (True, True, 2.5, -1, "skip_padding"),
    (True, False, 3.0, 5, "error"),
]


@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("id_mode", ["index", "hash"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("key_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "w%d-p%d-n%g-d%d-%s" % c)
@pytest.mark.parametrize("max_len", BAG_LENGTHS)
def test_lookup_matches_cpu(rng, combiner, id_mode, dtype, key_dtype, config, max_len):
    weighted, prune, max_norm, default_id, invalid_ids = config
    vocab, dim = 211, 16
    values = random_table(rng, vocab, dim)
    device_table, _, cpu_table = encode_table(values, dtype)
    offsets = random_offsets(rng, 96, max_len)
    keys = random_keys(rng, int(offsets[-1]), vocab, id_mode, invalid_ids, key_dtype)
    weights = rng.uniform(-1.0, 2.0, size=len(keys)).astype(np.float32) if weighted else None
    opts = dict(combiner=combiner, id_mode=id_mode, invalid_ids=invalid_ids, prune_weights=prune,
                default_id=default_id, max_norm=max_norm)
    got = gpu_lookup(device_table, dtype, keys, offsets, weights, **opts)
    want = cpu_lookup(cpu_table, keys, offsets, weights, **opts)
    assert_close(got, want, dtype)


# Covers every group size (1..32 lanes), the 16-byte and scalar paths, 1, 2
# and 4 fragments per lane, and dims needing several tiles (> 512 floats or
# > 1024 halves on the vector path, > 128 on the scalar one), for both bag
# layouts.
@pytest.mark.parametrize("dim", [1, 2, 3, 4, 7, 8, 12, 16, 31, 32, 64, 100, 128, 129, 200, 256, 260,
                                 512, 516, 1000, 2048])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("misalign", [False, True])
@pytest.mark.parametrize("max_norm", [-1.0, 4.0])
@pytest.mark.parametrize("max_len", BAG_LENGTHS)
def test_lookup_dims_and_alignment(rng, dim, dtype, misalign, max_norm, max_len):
    vocab = 64
    values = random_table(rng, vocab, dim)
    device_table, _, cpu_table = encode_table(values, dtype)
    offsets = random_offsets(rng, 40, max_len)
    keys = rng.integers(0, vocab, size=int(offsets[-1])).astype(np.int64)
    weights = rng.uniform(0.1, 2.0, size=len(keys)).astype(np.float32)
    opts = dict(combiner="sqrtn", max_norm=float(max_norm * np.sqrt(dim) / 4), default_id=1)
    got = gpu_lookup(device_table, dtype, keys, offsets, weights, misalign=misalign, **opts)
    want = cpu_lookup(cpu_table, keys, offsets, weights, **opts)
    assert_close(got, want, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_zero(dtype):
    device_table, _, _ = encode_table(np.ones((5, 8), np.float32), dtype)
    got = gpu_lookup(device_table, dtype, np.zeros(0, np.int64), np.zeros(1, np.int64))
    assert got.shape == (0, 8)


@pytest.mark.parametrize("default_id", [-1, 2])
@pytest.mark.parametrize("combiner", COMBINERS)
def test_all_bags_empty(rng, default_id, combiner):
    values = random_table(rng, 5, 8)
    offsets = np.zeros(7, np.int64)
    keys = np.zeros(0, np.int32)
    got = gpu_lookup(values, "float32", keys, offsets, combiner=combiner, default_id=default_id)
    want = cpu_lookup(values, keys, offsets, combiner=combiner, default_id=default_id)
    assert_close(got, want, "float32")


def test_dim_zero_still_validates_ids():
    table = np.zeros((5, 0), np.float32)
    offsets = np.array([0, 2, 3], np.int64)
    got = gpu_lookup(table, "float32", np.array([1, 2, 4], np.int64), offsets)
    assert got.shape == (2, 0)
    with pytest.raises(ValueError, match="id 7 in row 1"):
        gpu_lookup(table, "float32", np.array([1, 2, 7], np.int64), offsets)


@pytest.mark.parametrize("id_mode", ["index", "hash"])
@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("max_norm", [-1.0, 5.0])
def test_long_bags(rng, id_mode, combiner, max_norm):
    vocab, dim = 1000, 32
    values = random_table(rng, vocab, dim)
    lengths = np.array([10_000, 0, 10_000, 1, 12_345, 10_000])
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    keys = random_keys(rng, int(offsets[-1]), vocab, id_mode, "error", np.int64)
    weights = rng.uniform(0.0, 1.0, size=len(keys)).astype(np.float32)
    opts = dict(combiner=combiner, id_mode=id_mode, max_norm=max_norm)
    got = gpu_lookup(values, "float32", keys, offsets, weights, **opts)
    want = cpu_lookup(values, keys, offsets, weights, **opts)
    assert_close(got, want, "float32")


@pytest.mark.parametrize("key_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("invalid_ids,bad_id", [("error", -1), ("error", 50), ("skip_negative", 50),
                                                ("skip_padding", -2), ("skip_padding", 50)])
@pytest.mark.parametrize("max_len", BAG_LENGTHS)
def test_bad_ids_raise_like_cpu(rng, key_dtype, invalid_ids, bad_id, max_len):
    vocab = 50
    values = random_table(rng, vocab, 8)
    lengths = rng.integers(6, max_len, size=300)  # room for the bad ids planted below
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    keys = rng.integers(0, vocab, size=int(offsets[-1])).astype(key_dtype)
    weights = rng.uniform(-1.0, 1.0, size=len(keys)).astype(np.float32)
    # Bad ids in several bags, more than one in the lowest: the error names the
    # lowest bag and its first bad id, as the CPU does. With prune_weights an
    # id whose weight is <= 0 is dropped before it is checked (the safe
    # lookup's sparse_retain comes first), so row 50's bad id is never named.
    for row, pos, weight in [(250, 3, 0.5), (117, 5, 0.5), (117, 2, 0.25), (199, 0, 0.5), (50, 1, -0.5)]:
        keys[offsets[row] + pos] = bad_id + (pos if bad_id >= vocab else 0)
        weights[offsets[row] + pos] = weight
    opts = dict(invalid_ids=invalid_ids, prune_weights=True)
    with pytest.raises(ValueError) as cpu_err:
        cpu_lookup(values, keys, offsets, weights, **opts)
    with pytest.raises(ValueError) as gpu_err:
        gpu_lookup(values, "float32", keys, offsets, weights, **opts)
    assert str(gpu_err.value) == str(cpu_err.value)
    assert "in row 117 " in str(gpu_err.value)
    # The gradient, called on its own, rejects the same id.
    grad_out = rng.normal(size=(len(offsets) - 1, 8)).astype(np.float32)
    with pytest.raises(ValueError) as grad_err:
        gpu_lookup_grad(values, "float32", keys, offsets, grad_out, weights, **opts)
    assert str(grad_err.value) == str(cpu_err.value)
    # The device is still usable after a rejected call.
    keys[keys < 0] = 0
    keys[keys >= vocab] = 0
    assert_close(gpu_lookup(values, "float32", keys, offsets, weights, **opts),
                 cpu_lookup(values, keys, offsets, weights, **opts), "float32")


def test_hash_mode_has_no_bad_ids(rng):
    values = random_table(rng, 7, 4)
    keys = np.array([-5, 2**40, -(2**62), 0, 123456789], np.int64)
    offsets = np.array([0, 2, 5], np.int64)
    got = gpu_lookup(values, "float32", keys, offsets, id_mode="hash", combiner="sum")
    assert_close(got, cpu_lookup(values, keys, offsets, id_mode="hash", combiner="sum"), "float32")


# ---------------------------------------------------------------------------
# Segment conversion.


def gpu_row_ids_to_offsets(row_ids, num_rows):
    ids = upload(row_ids)
    offsets = Buffer(backend, (num_rows + 1) * 8)
    status = Buffer(backend, 16)
    core.gpu_row_ids_to_offsets(ids.ptr, str(row_ids.dtype), len(row_ids), num_rows, offsets.ptr, status.ptr)
    return offsets.read(np.int64, (num_rows + 1,))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("nnz,num_rows", [(0, 0), (0, 5), (1, 1), (1000, 10), (1000, 5000), (100_000, 997)])
def test_row_ids_to_offsets(rng, dtype, nnz, num_rows):
    row_ids = np.sort(rng.integers(0, max(num_rows, 1), size=nnz)).astype(dtype)
    want = np.searchsorted(row_ids, np.arange(num_rows + 1), side="left").astype(np.int64)
    np.testing.assert_array_equal(gpu_row_ids_to_offsets(row_ids, num_rows), want)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_row_ids_to_offsets_rejects_bad_ids(dtype):
    cases = [
        (np.array([0, 1, 5, 2, 2, 9], dtype), 4, "entry 2"),   # out of range before unsorted
        (np.array([0, 2, 1, 3, -1], dtype), 4, "entry 2"),     # unsorted before negative
        (np.array([-1, 0], dtype), 4, "entry 0"),
        (np.array([0, 0, 3, 3], dtype), 3, "entry 2"),
    ]
    for row_ids, num_rows, where in cases:
        with pytest.raises(ValueError, match=where):
            gpu_row_ids_to_offsets(row_ids, num_rows)


def gpu_splits_to_offsets(splits, nnz):
    buf = upload(splits)
    offsets = Buffer(backend, len(splits) * 8)
    status = Buffer(backend, 16)
    core.gpu_row_splits_to_offsets(buf.ptr, str(splits.dtype), len(splits), nnz, offsets.ptr, status.ptr)
    return offsets.read(np.int64, (len(splits),))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_row_splits_to_offsets(rng, dtype):
    splits = random_offsets(rng, 5000, 7).astype(dtype)
    np.testing.assert_array_equal(gpu_splits_to_offsets(splits, int(splits[-1])), splits.astype(np.int64))
    np.testing.assert_array_equal(gpu_splits_to_offsets(np.zeros(1, dtype), 0), [0])
    for bad, nnz, message in [
        (np.array([1, 2, 3], dtype), 3, r"row_splits\[0\] must be 0"),
        (np.array([0, 4, 2, 6], dtype), 6, r"row_splits\[2\]"),
        (np.array([0, 2, 3], dtype), 4, r"row_splits\[-1\] = 3"),
    ]:
        with pytest.raises(ValueError, match=message):
            gpu_splits_to_offsets(bad, nnz)


def test_offsets_stay_inside_the_ids_whatever_the_splits(dtype=np.int64):
    # The TF kernel queues the pooling behind the offsets before it reads the
    # status, so even rejected splits must give offsets in [0, nnz].
    splits = np.array([0, -5, 9, 2, 1 << 40], dtype)
    buf = upload(splits)
    offsets = Buffer(backend, len(splits) * 8)
    status = Buffer(backend, 16)
    with pytest.raises(ValueError):
        core.gpu_row_splits_to_offsets(buf.ptr, "int64", len(splits), 6, offsets.ptr, status.ptr)
    np.testing.assert_array_equal(offsets.read(np.int64, (len(splits),)), [0, 0, 6, 2, 6])


# ---------------------------------------------------------------------------
# Gradient.


@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("max_norm", [-1.0, 2.0])
@pytest.mark.parametrize("default_id", [-1, 4])
@pytest.mark.parametrize("dim", [3, 16, 130])
def test_grad_matches_reference(rng, combiner, weighted, max_norm, default_id, dim):
    vocab = 60
    values = random_table(rng, vocab, dim)
    offsets = random_offsets(rng, 50, 8)
    keys = random_keys(rng, int(offsets[-1]), vocab, "index", "skip_negative", np.int64)
    weights = rng.uniform(-1.0, 2.0, size=len(keys)).astype(np.float32) if weighted else None
    grad_out = rng.normal(size=(len(offsets) - 1, dim)).astype(np.float32)
    opts = dict(combiner=combiner, invalid_ids="skip_negative", prune_weights=weighted,
                default_id=default_id, max_norm=float(max_norm * np.sqrt(dim) / 4) if max_norm > 0 else -1.0)
    got_v, got_i, got_w = gpu_lookup_grad(values, "float32", keys, offsets, grad_out, weights,
                                          want_weight_grads=weighted, **opts)
    want_v, want_i, want_w = reference_grad(values, keys, offsets, grad_out, weights, **opts)
    np.testing.assert_array_equal(got_i, want_i)
    assert_close(got_v, want_v, "float32")
    if weighted:
        assert_close(got_w, want_w, "float32")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("id_mode", ["index", "hash"])
def test_grad_16bit_tables(rng, dtype, id_mode):
    vocab, dim = 40, 24
    device_table, exact, _ = encode_table(random_table(rng, vocab, dim), dtype)
    offsets = random_offsets(rng, 30, 6)
    keys = random_keys(rng, int(offsets[-1]), vocab, id_mode, "skip_padding", np.int32)
    grad_f32 = rng.normal(size=(len(offsets) - 1, dim)).astype(np.float32)
    grad_device, grad_exact, _ = encode_table(grad_f32, dtype)
    weights = rng.uniform(0.1, 2.0, size=len(keys)).astype(np.float32)
    opts = dict(combiner="mean", id_mode=id_mode, invalid_ids="skip_padding", max_norm=3.0, default_id=0)
    got_v, got_i, got_w = gpu_lookup_grad(device_table, dtype, keys, offsets, grad_device, weights,
                                          want_weight_grads=True, **opts)
    want_v, want_i, want_w = reference_grad(exact, keys, offsets, grad_exact, weights, **opts)
    np.testing.assert_array_equal(got_i, want_i)
    assert_close(got_v, want_v, dtype)
    np.testing.assert_allclose(got_w, want_w, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(want_w).max()))


def test_grad_long_bag(rng):
    vocab, dim = 500, 8
    values = random_table(rng, vocab, dim)
    offsets = np.array([0, 10_000, 10_000, 20_001], np.int64)
    keys = rng.integers(0, vocab, size=int(offsets[-1])).astype(np.int64)
    weights = rng.uniform(0.1, 1.0, size=len(keys)).astype(np.float32)
    grad_out = rng.normal(size=(3, dim)).astype(np.float32)
    opts = dict(combiner="sqrtn", default_id=7)
    got_v, got_i, got_w = gpu_lookup_grad(values, "float32", keys, offsets, grad_out, weights,
                                          want_weight_grads=True, **opts)
    want_v, want_i, want_w = reference_grad(values, keys, offsets, grad_out, weights, **opts)
    np.testing.assert_array_equal(got_i, want_i)
    assert_close(got_v, want_v, "float32")
    assert_close(got_w, want_w, "float32")


def test_grad_batch_zero():
    got_v, got_i, _ = gpu_lookup_grad(np.ones((4, 8), np.float32), "float32", np.zeros(0, np.int64),
                                      np.zeros(1, np.int64), np.zeros((0, 8), np.float32))
    assert got_v.shape == (0, 8) and got_i.shape == (0,)


def test_grad_rejects_small_output_buffers(rng):
    values = random_table(rng, 10, 4)
    offsets = np.array([0, 3, 3, 5], np.int64)
    keys = np.array([1, 2, 3, 4, 5], np.int64)
    grad_out = np.ones((3, 4), np.float32)
    with pytest.raises(ValueError, match="has 5 rows"):
        gpu_lookup_grad(values, "float32", keys, offsets, grad_out, max_grad_rows=4)
    got_v, got_i, _ = gpu_lookup_grad(values, "float32", keys, offsets, grad_out, max_grad_rows=5)
    np.testing.assert_array_equal(got_i, keys)

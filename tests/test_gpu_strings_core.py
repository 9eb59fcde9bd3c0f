"""GPU string embedding (cuda/string_kernels.cu) against the CPU core, through tf_ctr_ops._core.

The CUDA launchers are called on raw device pointers allocated with CuPy or
PyTorch, whichever is installed, and compared with the CPU pooling of the same
framework-free core (_core.string_embedding) on the same packed bytes: every
combiner and id mode, 0-token and 10,000-token rows, multi-byte and
self-overlapping delimiters, and bad tokens (same row, same message). The
grouped launch is compared feature by feature, and the gradient with a float64
NumPy reference. TensorFlow is never imported: _core is loaded straight from
the package folder, without running tf_ctr_ops/__init__.py (which loads the TF
op library).

Skips, with the reason, when _core is not built, was built without CUDA or
without the string bindings, or no GPU is reachable through CuPy or PyTorch.
"""

import numpy as np
import pytest

from core_helpers import assert_close, backend_or_skip, core_or_skip, decode, encode_table
from core_helpers import Buffer as DeviceBuffer
from core_helpers import upload as upload_to

COMBINERS = ["sum", "mean", "sqrtn"]
MODES = ["hash", "index", "mod"]
DTYPES = ["float32", "float16", "bfloat16"]
STATUS_BYTES = 5 * 8  # int64[5]: {row, begin, len, value, kind}

# string_embedding is the CPU reference the GPU launches are compared with.
core = core_or_skip("gpu_string_embedding", "gpu_multi_string_embedding", "gpu_string_embedding_grad",
                    "gpu_gate_string_splits", "string_embedding")
backend = backend_or_skip()


def Buffer(nbytes, offset=0):
    return DeviceBuffer(backend, nbytes, offset)


def upload(array, offset=0):
    return upload_to(backend, array, offset)


def pack(strings, prefix=b""):
    """(bytes uint8, string_splits int64) of the packed strings. A prefix puts
    the first string past offset 0, like a feature's slice of a grouped buffer."""
    data = [s.encode("latin-1") if isinstance(s, str) else s for s in strings]
    lengths = [len(s) for s in data]
    splits = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64) + len(prefix)
    raw = np.frombuffer(prefix + b"".join(data), np.uint8).copy()
    return raw, splits


def random_table(rng, vocab, dim):
    return rng.normal(size=(vocab, dim)).astype(np.float32)


# ---------------------------------------------------------------------------
# Calls.


def gpu_strings(table, dtype, raw, splits, bag_splits=None, misalign=False, **opts):
    """_core.gpu_string_embedding on copies of the inputs; float32 result."""
    device_table = np.ascontiguousarray(table)
    vocab, dim = device_table.shape
    shift = device_table.itemsize if misalign else 0
    params = upload(device_table, shift)
    # Odd byte offsets: tokens start anywhere, nothing may assume alignment.
    bytes_buf = upload(raw, 3 if misalign else 0)
    splits_buf = upload(np.asarray(splits, np.int64))
    bags_buf = upload(np.asarray(bag_splits, np.int64)) if bag_splits is not None else None
    num_bags = len(bag_splits) - 1 if bag_splits is not None else len(splits) - 1
    out = Buffer(num_bags * dim * device_table.itemsize, shift)
    status = Buffer(STATUS_BYTES)
    core.gpu_string_embedding(params.ptr, dtype, vocab, dim, bytes_buf.ptr, splits_buf.ptr,
                              bags_buf.ptr if bags_buf else 0, num_bags, out.ptr, status.ptr, **opts)
    return decode(out.read(device_table.dtype, (num_bags, dim)), dtype)


def cpu_strings(table, raw, splits, bag_splits=None, **opts):
    bags = np.asarray(bag_splits, np.int64) if bag_splits is not None else None
    return core.string_embedding(table, raw, np.asarray(splits, np.int64), bags, **opts).astype(np.float32)


def assert_matches_cpu(values, raw, splits, bag_splits=None, dtype="float32", misalign=False, **opts):
    device_table, _, cpu_table = encode_table(values, dtype)
    want = cpu_strings(cpu_table, raw, splits, bag_splits, **opts)
    got = gpu_strings(device_table, dtype, raw, splits, bag_splits, misalign=misalign, **opts)
    assert got.shape == want.shape
    assert_close(got, want, dtype)
    return got


def assert_same_error(values, raw, splits, bag_splits=None, **opts):
    """Both paths reject the input, naming the same row and token."""
    with pytest.raises(ValueError) as cpu_err:
        cpu_strings(values, raw, splits, bag_splits, **opts)
    with pytest.raises(ValueError) as gpu_err:
        gpu_strings(values, "float32", raw, splits, bag_splits, **opts)
    assert str(gpu_err.value) == str(cpu_err.value)
    return str(gpu_err.value)


def gpu_multi(tables, dtype, raw, splits, batch, feature_opts):
    """_core.gpu_multi_string_embedding; one float32 output per feature."""
    keep, features = [], []
    for table, opts in zip(tables, feature_opts):
        device_table = np.ascontiguousarray(table)
        vocab, dim = device_table.shape
        params = upload(device_table)
        out = Buffer(batch * dim * device_table.itemsize)
        keep += [params, out]
        features.append(dict(params_ptr=params.ptr, vocab=vocab, dim=dim, out_ptr=out.ptr, **opts))
    bytes_buf = upload(raw)
    splits_buf = upload(np.asarray(splits, np.int64))
    scratch_bytes = core.gpu_multi_string_scratch_bytes(len(features))
    scratch = Buffer(scratch_bytes)
    status = Buffer(STATUS_BYTES)
    core.gpu_multi_string_embedding(features, dtype, batch, bytes_buf.ptr, splits_buf.ptr, scratch.ptr,
                                    scratch_bytes, status.ptr)
    return [decode(keep[2 * i + 1].read(np.ascontiguousarray(t).dtype, (batch, t.shape[1])), dtype)
            for i, t in enumerate(tables)]


def gpu_grad(table, dtype, raw, splits, grad_out, bag_splits=None, max_grad_rows=None, **opts):
    """(grad_values float32 [n, dim], grad_indices [n])."""
    device_table = np.ascontiguousarray(table)
    vocab, dim = device_table.shape
    num_bags = len(bag_splits) - 1 if bag_splits is not None else len(splits) - 1
    # Every token but the last of a string ends at a delimiter byte; plus one
    # per string, plus a default row per bag.
    cap = len(raw) + len(splits) + num_bags if max_grad_rows is None else max_grad_rows
    params = upload(device_table)
    bytes_buf = upload(raw)
    splits_buf = upload(np.asarray(splits, np.int64))
    bags_buf = upload(np.asarray(bag_splits, np.int64)) if bag_splits is not None else None
    grad_buf = upload(np.ascontiguousarray(grad_out))
    values = Buffer(cap * dim * device_table.itemsize)
    indices = Buffer(cap * 8)
    ws_bytes = core.gpu_string_embedding_grad_workspace_bytes(num_bags)
    workspace = Buffer(ws_bytes)
    n = core.gpu_string_embedding_grad(
        params.ptr, dtype, vocab, dim, bytes_buf.ptr, splits_buf.ptr, bags_buf.ptr if bags_buf else 0,
        num_bags, grad_buf.ptr, values.ptr, indices.ptr, cap, workspace.ptr, ws_bytes, **opts)
    backend.synchronize()
    got_values = decode(values.read(device_table.dtype, (cap, dim))[:n], dtype)
    return got_values, indices.read(np.int64, (cap,))[:n]


# ---------------------------------------------------------------------------
# Reference semantics (cc/core/strings.h), for the gradient and default rows.


def split_tokens(s, delimiter, skip_empty):
    """The split of cc/core/strings.h: bytes.split is the same left-to-right, non-overlapping split."""
    tokens = s.split(delimiter) if delimiter else [s]
    return [t for t in tokens if t] if skip_empty else tokens


def token_rows(tokens, vocab, id_mode):
    """Table rows of tokens; bad ones are None (the gradient skips them)."""
    if id_mode == "hash":
        return list(core.hash_buckets(tokens, vocab)) if tokens else []
    rows = []
    for t in tokens:
        v = core.parse_int64(t)
        if v is None:
            rows.append(None)
        elif id_mode == "mod":
            rows.append(v % vocab)  # Python's % is a floor mod
        else:
            rows.append(v if 0 <= v < vocab else None)
    return rows


def bag_rows(raw, splits, bag_splits, vocab, id_mode="hash", delimiter=b",", skip_empty=True):
    num_strings = len(splits) - 1
    bags = bag_splits if bag_splits is not None else np.arange(num_strings + 1)
    data = raw.tobytes()
    out = []
    for r in range(len(bags) - 1):
        rows = []
        for j in range(bags[r], bags[r + 1]):
            tokens = split_tokens(data[splits[j]:splits[j + 1]], delimiter, skip_empty)
            rows += [x for x in token_rows(tokens, vocab, id_mode) if x is not None]
        out.append(rows)
    return out


def clip_backward(x, g, scale, max_norm):
    norm = np.sqrt(x @ x)
    if max_norm > 0 and norm >= max_norm:  # a tie's gradient is the clip's, as in tf.clip_by_norm
        return scale * (max_norm / norm) * (g - x * (x @ g) / (x @ x))
    return scale * g


def reference_grad(table, rows_per_bag, grad_out, combiner="mean", max_norm=-1.0, default_id=-1):
    table = table.astype(np.float64)
    grad_out = grad_out.astype(np.float64)
    values, indices = [], []
    for r, rows in enumerate(rows_per_bag):
        g = grad_out[r]
        if not rows:
            if default_id >= 0:
                values.append(clip_backward(table[default_id], g, 1.0, max_norm))
                indices.append(default_id)
            continue
        n = len(rows)
        scale = {"sum": 1.0, "mean": 1.0 / n, "sqrtn": 1.0 / np.sqrt(n)}[combiner]
        for row in rows:
            values.append(clip_backward(table[row], g, scale, max_norm))
            indices.append(row)
    return np.array(values).reshape(-1, table.shape[1]), np.array(indices, np.int64)


def reference_forward(table, rows_per_bag, combiner="mean", max_norm=-1.0, default_id=-1):
    table = table.astype(np.float64)
    out = np.zeros((len(rows_per_bag), table.shape[1]))
    for r, rows in enumerate(rows_per_bag):
        if not rows and default_id >= 0:
            rows = [default_id]
        for row in rows:
            x = table[row]
            norm = np.sqrt(x @ x)
            out[r] += x * (max_norm / norm if max_norm > 0 and norm > max_norm else 1.0)
        n = len(rows)
        out[r] *= {"sum": 1.0, "mean": 1.0 / n if n else 0.0, "sqrtn": 1.0 / np.sqrt(n) if n else 0.0}[combiner]
    return out


# ---------------------------------------------------------------------------
# Inputs.

TRICKY = [" 7 ", "+5", "-3", "", "0x10", "9223372036854775808", "9223372036854775807",
          "-9223372036854775808", "\t12\n", "1 2", "07", "-0", "+-1", "--1", "1e3", "3.0",
          "\xe9\xe8", "1\x00", "\x80\xff", "999", "1000", "abc"]


def random_token(rng, vocab, id_mode):
    if id_mode == "hash":
        n = int(rng.integers(1, 14))
        return bytes(rng.integers(ord("a"), ord("z") + 1, size=n).astype(np.uint8))
    if id_mode == "index":
        v = int(rng.integers(0, vocab))
        return rng.choice([str(v), f" {v}", f"+{v}", f"{v}\t"]).encode()
    return str(int(rng.integers(-10**15, 10**15))).encode()


def random_strings(rng, n, vocab, id_mode, delimiter=b",", max_tokens=12, empty_tokens=False):
    """Strings of valid tokens; empty ones (and stray delimiters) only when
    empty_tokens, since an empty token is a bad number in the parse modes."""
    out = []
    for _ in range(n):
        k = int(rng.integers(0, max_tokens + 1))
        if not delimiter:
            k = min(k, 1)
        tokens = [random_token(rng, vocab, id_mode) for _ in range(k)]
        if empty_tokens:
            tokens = [b"" if rng.random() < 0.2 else t for t in tokens]
            if delimiter and rng.random() < 0.3:
                tokens = [b""] + tokens + [b""]
        out.append(delimiter.join(tokens))
    return out


def random_bag_splits(rng, num_strings, num_bags):
    cuts = np.sort(rng.integers(0, num_strings + 1, size=num_bags - 1))
    return np.concatenate([[0], cuts, [num_strings]]).astype(np.int64)


# ---------------------------------------------------------------------------
# Forward against the CPU.


@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("id_mode", MODES)
@pytest.mark.parametrize("delimiter", [b",", b"::", b""], ids=["comma", "colons", "none"])
@pytest.mark.parametrize("skip_empty", [True, False])
@pytest.mark.parametrize("bagged", [False, True])
def test_matches_cpu(rng, combiner, id_mode, delimiter, skip_empty, bagged):
    vocab, dim = 300, 16
    values = random_table(rng, vocab, dim)
    # Empty tokens are valid only in hash mode, or when skipped.
    strings = random_strings(rng, 120, vocab, id_mode, delimiter,
                             empty_tokens=skip_empty or id_mode == "hash")
    if not skip_empty and id_mode != "hash":
        strings = [s for s in strings if s] or [b"1"]
    raw, splits = pack(strings, prefix=b"ab,c")
    bags = random_bag_splits(rng, len(strings), 40) if bagged else None
    opts = dict(combiner=combiner, id_mode=id_mode, delimiter=delimiter, skip_empty=skip_empty)
    assert_matches_cpu(values, raw, splits, bags, **opts)
    assert_matches_cpu(values, raw, splits, bags, max_norm=0.9, **opts)


@pytest.mark.parametrize("hash_key", [[0, 0], [133, 137], [2**63 - 1, -1]])
@pytest.mark.parametrize("delimiter", [b",", b""], ids=["comma", "none"])
def test_keyed_hash_matches_cpu(rng, hash_key, delimiter):
    # to_hash_bucket_strong's SipHash on the device: the CPU's buckets, which
    # tests/test_keyed_hash.py checks against TF.
    vocab, dim = 300, 16
    values = random_table(rng, vocab, dim)
    strings = random_strings(rng, 120, vocab, "hash", delimiter, empty_tokens=True)
    raw, splits = pack(strings, prefix=b"ab,c")
    got = assert_matches_cpu(values, raw, splits, delimiter=delimiter, hash_key=hash_key)
    assert not np.allclose(got, cpu_strings(values, raw, splits, delimiter=delimiter))


def test_grouped_features_keep_their_keys_on_the_device(rng):
    tables = [random_table(rng, 50, 8), random_table(rng, 70, 4)]
    strings = random_strings(rng, 40, 50, "hash") + random_strings(rng, 40, 70, "hash")
    raw, splits = pack(strings)
    opts = [dict(hash_key=[5, 6]), dict()]
    outs = gpu_multi(tables, "float32", raw, splits, 40, opts)
    for f, (t, o) in enumerate(zip(tables, opts)):
        want = cpu_strings(t, raw, splits[40 * f:40 * (f + 1) + 1], **o)
        assert_close(outs[f], want, "float32")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("id_mode", MODES)
def test_table_dtypes(rng, dtype, id_mode):
    vocab = 200
    strings = random_strings(rng, 90, vocab, id_mode, max_tokens=20)
    raw, splits = pack(strings)
    for dim in (8, 13):  # vector and scalar loads
        values = random_table(rng, vocab, dim)
        assert_matches_cpu(values, raw, splits, dtype=dtype, id_mode=id_mode, combiner="mean")
        assert_matches_cpu(values, raw, splits, dtype=dtype, id_mode=id_mode, combiner="sqrtn", max_norm=1.5)


# dims that exercise 1..32 lanes per token, several tokens per warp at once,
# and rows wider than one register tile (pooled in several passes).
@pytest.mark.parametrize("dim", [0, 1, 3, 4, 8, 12, 32, 33, 64, 128, 132, 260, 516, 1030])
@pytest.mark.parametrize("misalign", [False, True])
@pytest.mark.parametrize("max_norm", [-1.0, 1.0])
def test_dims_and_alignment(rng, dim, misalign, max_norm):
    vocab = 100
    values = random_table(rng, vocab, dim)
    strings = random_strings(rng, 50, vocab, "hash", max_tokens=40)
    raw, splits = pack(strings)
    norm = max_norm * np.sqrt(max(dim, 1)) / 3 if max_norm > 0 else -1.0
    for dtype in ("float32", "float16"):
        assert_matches_cpu(values, raw, splits, dtype=dtype, misalign=misalign, combiner="sum", max_norm=norm)


@pytest.mark.parametrize("id_mode", MODES)
@pytest.mark.parametrize("skip_empty", [True, False])
def test_tricky_tokens(rng, id_mode, skip_empty):
    values = random_table(rng, 1000, 8)
    for tok in TRICKY:
        for strings in ([tok, "1"], [f"2,{tok},3"]):
            raw, splits = pack(strings)
            opts = dict(id_mode=id_mode, skip_empty=skip_empty)
            try:
                want = cpu_strings(values, raw, splits, **opts)
            except ValueError:
                assert_same_error(values, raw, splits, **opts)
                continue
            assert_close(gpu_strings(values, "float32", raw, splits, **opts), want, "float32")


def test_bytes_above_0x7f_and_nul_hash(rng):
    values = random_table(rng, 1000, 8)
    raw, splits = pack([b"\x80\xff,\x00\x01", b"caf\xc3\xa9|x", b"\xff" * 70, b",,\x00,"])
    for skip_empty in (True, False):
        assert_matches_cpu(values, raw, splits, id_mode="hash", skip_empty=skip_empty)


# ---------------------------------------------------------------------------
# Row lengths: nothing to pool, and far more than a warp's worth.


@pytest.mark.parametrize("id_mode", MODES)
def test_zero_token_rows(rng, id_mode):
    values = random_table(rng, 50, 8)
    strings = ["", ",", ",,,,", "", ",,," * 20, "3", ""]
    raw, splits = pack(strings)
    for combiner in COMBINERS:
        got = assert_matches_cpu(values, raw, splits, id_mode=id_mode, combiner=combiner)
        assert not got[[0, 1, 2, 3, 4, 6]].any()
    # Bags of no strings, and of empty strings only.
    bags = np.array([0, 0, 2, 2, 7, 7], np.int64)
    got = assert_matches_cpu(values, raw, splits, bags, id_mode=id_mode)
    assert not got[[0, 1, 2, 4]].any()
    # Without skip_empty an empty string is one empty token: hashed, or a bad number.
    raw, splits = pack(["", "", "5"])
    if id_mode == "hash":
        assert_matches_cpu(values, raw, splits, id_mode=id_mode, skip_empty=False)
    else:
        message = assert_same_error(values, raw, splits, id_mode=id_mode, skip_empty=False)
        assert "row 0" in message


@pytest.mark.parametrize("id_mode", MODES)
@pytest.mark.parametrize("combiner", COMBINERS)
def test_long_rows(rng, id_mode, combiner):
    vocab = 1000
    values = random_table(rng, vocab, 24)
    long_a = b",".join(random_token(rng, vocab, id_mode) for _ in range(10_000))
    long_b = b",".join(random_token(rng, vocab, id_mode) for _ in range(12_345))
    strings = [long_a, b"", b"3", long_b, long_a + b"," + long_b]
    raw, splits = pack(strings)
    assert_matches_cpu(values, raw, splits, id_mode=id_mode, combiner=combiner)
    assert_matches_cpu(values, raw, splits, id_mode=id_mode, combiner=combiner, max_norm=1.0)
    # One bag holding many strings, and a 10,000-token row of one-byte tokens.
    bags = np.array([0, 5], np.int64)
    assert_matches_cpu(values, raw, splits, bags, id_mode=id_mode, combiner=combiner)
    raw, splits = pack([b",".join([b"7"] * 10_000), b"," * 10_000])
    assert_matches_cpu(values, raw, splits, id_mode=id_mode, combiner=combiner)


def test_long_tokens_hash(rng):
    # Fingerprint64's 17-32, 33-64 and > 64-byte paths, up to one 10,000-byte token.
    values = random_table(rng, 997, 8)
    tokens = [bytes(rng.integers(0, 256, size=n).astype(np.uint8)).replace(b",", b";")
              for n in (15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 1000, 10_000)]
    raw, splits = pack([b",".join(tokens)] + tokens)
    assert_matches_cpu(values, raw, splits, id_mode="hash", combiner="sum")
    assert_matches_cpu(values, raw, splits, id_mode="hash", delimiter=b"")


# ---------------------------------------------------------------------------
# Delimiters.


@pytest.mark.parametrize("delimiter", [b",", b"|", b"<>", b"::", b"\x01", b"abc", b"aa", b"aba",
                                       b"0123456789abcdef"])
@pytest.mark.parametrize("skip_empty", [True, False])
def test_delimiters(rng, delimiter, skip_empty):
    values = random_table(rng, 1000, 8)
    strings = random_strings(rng, 30, 1000, "mod", delimiter)
    strings += [delimiter + b"5", b"5" + delimiter, delimiter * 3, delimiter * 2 + b"7" + delimiter,
                delimiter[:-1] if len(delimiter) > 1 else b"8", b"9" + delimiter[:1]]
    raw, splits = pack(strings)
    assert_matches_cpu(values, raw, splits, id_mode="hash", delimiter=delimiter, skip_empty=skip_empty)
    # The edge strings hold pieces of the delimiter, which are not numbers.
    raw, splits = pack(strings[:30])
    if skip_empty:
        assert_matches_cpu(values, raw, splits, id_mode="mod", delimiter=delimiter)


@pytest.mark.parametrize("delimiter", [b"aa", b"aaa", b"aba", b"abab", b"a" * 16, b"ab" * 8])
@pytest.mark.parametrize("skip_empty", [True, False])
def test_self_overlapping_delimiters_across_chunks(rng, delimiter, skip_empty):
    """Runs of a two-letter alphabet make matches overlap each other and
    straddle the 32-byte chunks a warp reads; only left-to-right,
    non-overlapping matches may split."""
    values = random_table(rng, 997, 8)
    strings = [bytes(rng.choice([97, 98], size=int(rng.integers(0, 200)), p=[0.7, 0.3]).astype(np.uint8))
               for _ in range(200)]
    strings += [b"a" * n for n in (1, 2, 3, 31, 32, 33, 63, 64, 65, 97)]
    raw, splits = pack(strings)
    assert_matches_cpu(values, raw, splits, id_mode="hash", delimiter=delimiter, skip_empty=skip_empty,
                       combiner="sum")


def test_delimiter_longer_than_string(rng):
    values = random_table(rng, 100, 8)
    raw, splits = pack(["1", "", "aa", "<<>"])
    assert_matches_cpu(values, raw, splits, id_mode="hash", delimiter=b"<<>>", skip_empty=False)


# ---------------------------------------------------------------------------
# Bad tokens: never an address, reported for the lowest row like the CPU.


def first_bad_split(splits, num_bytes):
    """The string ops' rule: a split is bad if negative, past the bytes, or below the one before."""
    for i, v in enumerate(splits):
        if v < 0 or v > num_bytes or (i > 0 and v < splits[i - 1]):
            return i, int(v)
    return -1, 0


@pytest.mark.parametrize("case", ["valid", "negative", "decreasing", "past the bytes", "several bad", "long"])
def test_bad_string_splits_are_found_and_gated_to_empty_strings(rng, case):
    # What the op kernels queue before any read: the check, then the copy of
    # the splits the string kernels read, all zeros when one is bad.
    num_bytes = 40
    splits = np.sort(rng.integers(0, num_bytes + 1, size=2000 if case == "long" else 12)).astype(np.int64)
    splits[0] = 0
    if case == "negative":
        splits[5] = -3
    elif case == "decreasing":
        splits[7] = splits[6] - 1
    elif case == "past the bytes":
        splits[-1] = num_bytes + 1
    elif case == "several bad":
        splits[9], splits[4] = -1, num_bytes + 7
    elif case == "long":
        splits[1500] = num_bytes + 2
    splits_buf = upload(splits)
    out = Buffer(splits.nbytes)
    status = Buffer(3 * 8)
    got = core.gpu_gate_string_splits(splits_buf.ptr, len(splits), num_bytes, out.ptr, status.ptr)
    assert got == first_bad_split(splits, num_bytes)
    gated = out.read(np.int64, splits.shape)
    np.testing.assert_array_equal(gated, splits if got[0] < 0 else np.zeros_like(splits))


def test_gated_splits_pool_as_empty_strings(rng):
    values = random_table(rng, 100, 8)
    raw, splits = pack(["1,2", "3", "4,5,6"])
    gated = np.zeros_like(splits)
    got = gpu_strings(values, "float32", raw, gated, id_mode="index", default_id=7)
    np.testing.assert_array_equal(got, np.repeat(values[7:8], len(splits) - 1, axis=0))


def test_bad_tokens_raise_like_cpu(rng):
    values = random_table(rng, 100, 8)
    cases = [
        (["1,2", "3,1000"], dict(id_mode="index")),             # out of range
        (["1,2", "3,-1"], dict(id_mode="index")),               # negative
        (["7x", "1"], dict(id_mode="mod")),                     # not a number
        (["1", "2", b"\xff"], dict(id_mode="index")),           # escaped in the message
        (["1", "x" * 100], dict(id_mode="index")),              # long token, shown cut
        (["5", "1,,2"], dict(id_mode="index", skip_empty=False)),  # empty token
        (["", "5"], dict(id_mode="index", delimiter=b"", skip_empty=False)),
        (["1::2::zz::3"], dict(id_mode="mod", delimiter=b"::")),
    ]
    for strings, opts in cases:
        raw, splits = pack(strings)
        assert_same_error(values, raw, splits, **opts)


def test_lowest_bad_row_and_first_bad_token_win(rng):
    values = random_table(rng, 100, 8)
    strings = [",".join(str(v) for v in rng.integers(0, 100, size=50)) for _ in range(400)]
    strings[377] = "1,bad377"
    strings[123] = ",".join(["5"] * 40 + ["101", "x", "200"])  # first bad token: 101
    strings[250] = "nope"
    raw, splits = pack(strings)
    message = assert_same_error(values, raw, splits, id_mode="index")
    assert "row 123" in message and "'101'" in message
    # The same through bags: row numbers are bag numbers.
    bags = np.array([0, 100, 123, 124, 400], np.int64)
    message = assert_same_error(values, raw, splits, bags, id_mode="index")
    assert "row 2" in message


def test_bad_token_after_many_good_ones(rng):
    values = random_table(rng, 100, 8)
    row = ",".join(["7"] * 10_000 + ["100"] + ["x"])
    raw, splits = pack(["1", row, "2"])
    message = assert_same_error(values, raw, splits, id_mode="index")
    assert "row 1" in message and "'100'" in message


def test_hash_mode_has_no_bad_tokens(rng):
    values = random_table(rng, 7, 4)
    raw, splits = pack(TRICKY + ["", ",,"])
    assert_matches_cpu(values, raw, splits, id_mode="hash", skip_empty=False)


def test_batch_zero():
    values = np.ones((4, 8), np.float32)
    got = gpu_strings(values, "float32", np.zeros(0, np.uint8), np.zeros(1, np.int64))
    assert got.shape == (0, 8)


def test_default_row_for_empty_bags(rng):
    # Not an op attribute for strings, but the launchers honour it like BagPool.
    vocab, dim = 30, 8
    values = random_table(rng, vocab, dim)
    raw, splits = pack(["1,2", "", ",", "4"])
    for combiner in COMBINERS:
        got = gpu_strings(values, "float32", raw, splits, id_mode="index", combiner=combiner,
                          max_norm=1.0, default_id=5)
        want = reference_forward(values, bag_rows(raw, splits, None, vocab, "index"), combiner,
                                 max_norm=1.0, default_id=5)
        assert_close(got, want, "float32")


@pytest.mark.parametrize("combiner", COMBINERS)
def test_skip_negative_ids_and_default_row(rng, combiner):
    """The safe lookup's options: negative ids dropped (no count toward mean or
    sqrtn), a bag left empty takes default_id; tokens of a bag that are all
    negative leave it empty."""
    vocab, dim = 30, 8
    values = random_table(rng, vocab, dim)
    rows = [",".join(str(v) for v in rng.integers(-10, vocab, size=rng.integers(0, 40))) for _ in range(64)]
    raw, splits = pack(rows + ["-1,-2", "-5", "", "3,-3"])
    for default_id in (-1, 4):
        assert_matches_cpu(values, raw, splits, id_mode="index", combiner=combiner, invalid_ids="skip_negative",
                           default_id=default_id)
    assert_same_error(values, raw, splits, id_mode="index")  # negative ids are errors by default


def test_hash_num_buckets_below_table_rows(rng):
    vocab, dim = 64, 8
    values = random_table(rng, vocab, dim)
    raw, splits = pack([",".join(f"k{i}" for i in rng.integers(0, 10**6, size=5)) for _ in range(50)])
    got = assert_matches_cpu(values, raw, splits, id_mode="hash", combiner="sum", num_buckets=7)
    # Only the first 7 rows may be read: rows 7.. set to NaN would show through.
    poisoned = values.copy()
    poisoned[7:] = np.nan
    assert np.isfinite(gpu_strings(poisoned, "float32", raw, splits, id_mode="hash", combiner="sum",
                                   num_buckets=7)).all()
    assert got.shape == (50, dim)


def test_hash_buckets_past_the_table_rows_name_the_token_as_the_cpu(rng):
    # Hashing was taken to have no bad keys: a bucket past the rows failed,
    # but the kernel naming the token never ran, and the message named none.
    values = random_table(rng, 8, 4)
    raw, splits = pack([",".join(f"k{i}" for i in rng.integers(0, 10**6, size=5)) for _ in range(50)])
    message = assert_same_error(values, raw, splits, id_mode="hash", combiner="sum", num_buckets=1000)
    assert "'k" in message, message


# ---------------------------------------------------------------------------
# The grouped launch.


MULTI_FEATURES = [
    dict(combiner="mean", id_mode="hash", delimiter=b","),
    dict(combiner="sum", id_mode="index", delimiter=b"::"),
    dict(combiner="sqrtn", id_mode="mod", delimiter=b"", max_norm=1.0),
    dict(combiner="mean", id_mode="hash", delimiter=b"|", skip_empty=False, max_norm=0.5),
]


@pytest.mark.parametrize("dims", [(8, 16, 4, 32), (8, 13, 4, 600)], ids=["vector", "scalar"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_multi_matches_single(rng, dims, dtype):
    vocab, batch = 150, 37
    tables, cpu_tables, strings = [], [], []
    for dim, opts in zip(dims, MULTI_FEATURES):
        device_table, _, cpu_table = encode_table(random_table(rng, vocab, dim), dtype)
        tables.append(device_table)
        cpu_tables.append(cpu_table)
        feature = random_strings(rng, batch, vocab, opts["id_mode"], opts["delimiter"], max_tokens=30,
                                 empty_tokens=opts["id_mode"] == "hash")
        feature[0] = b""
        strings += feature
    raw, splits = pack(strings)
    outs = gpu_multi(tables, dtype, raw, splits, batch, MULTI_FEATURES)
    for f, (out, opts) in enumerate(zip(outs, MULTI_FEATURES)):
        feature_splits = splits[f * batch:(f + 1) * batch + 1]
        assert_close(out, cpu_strings(cpu_tables[f], raw, feature_splits, **opts), dtype)


def test_multi_errors_name_the_feature(rng):
    tables = [random_table(rng, 10, 4) for _ in range(3)]
    opts = [dict(id_mode="hash"), dict(id_mode="index"), dict(id_mode="index")]
    strings = ["a", "b", "c", "1", "2", "30", "1", "x", "2"]  # feature 1 row 2, feature 2 row 1
    raw, splits = pack(strings)
    with pytest.raises(ValueError) as cpu_err:
        cpu_strings(tables[1], raw, splits[3:7], **opts[1])
    with pytest.raises(ValueError) as gpu_err:
        gpu_multi(tables, "float32", raw, splits, 3, opts)
    assert str(gpu_err.value) == "feature 1: " + str(cpu_err.value)


def test_multi_writes_columns_of_one_output(rng):
    """The layout of CtrConcatStringEmbedding: each feature at its own first
    string, with its own string count, pooled into its columns of one
    [rows, width] output; a feature's strings past out_rows (a trimmed tail)
    are split but written nowhere."""
    dims, rows = (4, 8), 3
    tables = [random_table(rng, 50, d) for d in dims]
    a = ["1,2", "", "7"]
    b = ["3", "4,5", "", "", ","]  # two strings past the output
    raw, splits = pack(a + b)
    width = sum(dims)
    params = [upload(t) for t in tables]
    out = Buffer(rows * width * 4)
    features = [dict(params_ptr=params[0].ptr, vocab=50, dim=dims[0], out_ptr=out.ptr, combiner="sum",
                     id_mode="index", first_string=0, num_strings=3, out_rows=rows, out_stride=width),
                dict(params_ptr=params[1].ptr, vocab=50, dim=dims[1], out_ptr=out.ptr + dims[0] * 4,
                     combiner="sqrtn", id_mode="index", first_string=3, num_strings=5, out_rows=rows,
                     out_stride=width)]
    bytes_buf, splits_buf = upload(raw), upload(np.asarray(splits, np.int64))
    scratch_bytes = core.gpu_multi_string_scratch_bytes(2)
    scratch, status = Buffer(scratch_bytes), Buffer(STATUS_BYTES)
    core.gpu_multi_string_embedding(features, "float32", 5, bytes_buf.ptr, splits_buf.ptr, scratch.ptr,
                                    scratch_bytes, status.ptr)
    got = out.read(np.float32, (rows, width))
    want_a = cpu_strings(tables[0], raw, splits[:4], combiner="sum", id_mode="index")
    want_b = cpu_strings(tables[1], raw, splits[3:7], combiner="sqrtn", id_mode="index")
    assert_close(got, np.concatenate([want_a, want_b], axis=1), "float32")


def test_multi_tail_token_errors_name_the_feature_and_row(rng):
    """A bad token in a feature's strings past out_rows is still reported,
    with the feature and the row within it."""
    tables = [random_table(rng, 50, 4)] * 2
    raw, splits = pack(["1", "2", "3", "", "x"])
    params = upload(tables[0])
    out = Buffer(2 * 8 * 4)
    features = [dict(params_ptr=params.ptr, vocab=50, dim=4, out_ptr=out.ptr, id_mode="index", first_string=0,
                     num_strings=2, out_stride=8),
                dict(params_ptr=params.ptr, vocab=50, dim=4, out_ptr=out.ptr + 16, id_mode="index",
                     first_string=2, num_strings=3, out_rows=2, out_stride=8)]
    bytes_buf, splits_buf = upload(raw), upload(np.asarray(splits, np.int64))
    scratch_bytes = core.gpu_multi_string_scratch_bytes(2)
    scratch, status = Buffer(scratch_bytes), Buffer(STATUS_BYTES)
    with pytest.raises(ValueError, match="feature 1: token 'x' in row 2 is not an int64"):
        core.gpu_multi_string_embedding(features, "float32", 3, bytes_buf.ptr, splits_buf.ptr, scratch.ptr,
                                        scratch_bytes, status.ptr)


def test_multi_batch_zero(rng):
    tables = [random_table(rng, 10, 4), random_table(rng, 10, 6)]
    outs = gpu_multi(tables, "float32", np.zeros(0, np.uint8), np.zeros(1, np.int64), 0,
                     [dict(), dict(id_mode="index")])
    assert [o.shape for o in outs] == [(0, 4), (0, 6)]


# ---------------------------------------------------------------------------
# Gradient.


@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("id_mode", MODES)
@pytest.mark.parametrize("max_norm", [-1.0, 1.0])
@pytest.mark.parametrize("default_id", [-1, 4])
@pytest.mark.parametrize("dim", [3, 16, 130])
def test_grad_matches_reference(rng, combiner, id_mode, max_norm, default_id, dim):
    vocab = 60
    values = random_table(rng, vocab, dim)
    strings = random_strings(rng, 80, vocab, id_mode, max_tokens=10, empty_tokens=True)
    raw, splits = pack(strings)
    bags = random_bag_splits(rng, len(strings), 50)
    grad_out = rng.normal(size=(50, dim)).astype(np.float32)
    norm = max_norm * np.sqrt(dim) / 3 if max_norm > 0 else -1.0
    opts = dict(combiner=combiner, id_mode=id_mode, max_norm=norm, default_id=default_id)
    got_v, got_i = gpu_grad(values, "float32", raw, splits, grad_out, bags, **opts)
    want_v, want_i = reference_grad(values, bag_rows(raw, splits, bags, vocab, id_mode), grad_out,
                                    combiner, norm, default_id)
    np.testing.assert_array_equal(got_i, want_i)
    assert_close(got_v, want_v, "float32")


def test_grad_rejects_the_tokens_the_forward_rejects(rng):
    """Called on its own, the gradient fails on the token its forward pass
    fails on (the lowest row's first), with the same message."""
    vocab, dim = 20, 8
    values = random_table(rng, vocab, dim)
    for strings in (["1,2", "99,-1", "3,x,4"], ["1,x,2", "3,,4"], ["5", "1,200"]):
        raw, splits = pack(strings)
        message = assert_same_error(values, raw, splits, id_mode="index", skip_empty=False)
        grad_out = rng.normal(size=(len(strings), dim)).astype(np.float32)
        with pytest.raises(ValueError) as grad_err:
            gpu_grad(values, "float32", raw, splits, grad_out, id_mode="index", skip_empty=False)
        assert str(grad_err.value) == message


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("delimiter", [b",", b"<>", b""])
def test_grad_16bit_tables(rng, dtype, delimiter):
    vocab, dim = 40, 24
    device_table, exact, _ = encode_table(random_table(rng, vocab, dim), dtype)
    strings = random_strings(rng, 30, vocab, "hash", delimiter, max_tokens=8)
    raw, splits = pack(strings)
    grad_device, grad_exact, _ = encode_table(rng.normal(size=(30, dim)).astype(np.float32), dtype)
    opts = dict(combiner="mean", delimiter=delimiter, max_norm=3.0)
    got_v, got_i = gpu_grad(device_table, dtype, raw, splits, grad_device, **opts)
    want_v, want_i = reference_grad(exact, bag_rows(raw, splits, None, vocab, "hash", delimiter), grad_exact,
                                    "mean", 3.0)
    np.testing.assert_array_equal(got_i, want_i)
    assert_close(got_v, want_v, dtype)


def test_grad_long_rows(rng):
    vocab, dim = 500, 8
    values = random_table(rng, vocab, dim)
    strings = [b",".join(random_token(rng, vocab, "index") for _ in range(n)) for n in (10_000, 0, 10_001)]
    raw, splits = pack(strings)
    grad_out = rng.normal(size=(3, dim)).astype(np.float32)
    opts = dict(combiner="sqrtn", id_mode="index", default_id=7)
    got_v, got_i = gpu_grad(values, "float32", raw, splits, grad_out, **opts)
    want_v, want_i = reference_grad(values, bag_rows(raw, splits, None, vocab, "index"), grad_out,
                                    "sqrtn", -1.0, 7)
    np.testing.assert_array_equal(got_i, want_i)
    assert_close(got_v, want_v, "float32")


def test_grad_batch_zero():
    got_v, got_i = gpu_grad(np.ones((4, 8), np.float32), "float32", np.zeros(0, np.uint8),
                            np.zeros(1, np.int64), np.zeros((0, 8), np.float32))
    assert got_v.shape == (0, 8) and got_i.shape == (0,)


def test_grad_rejects_small_output_buffers(rng):
    values = random_table(rng, 10, 4)
    raw, splits = pack(["1,2,3", "", "4,5"])
    grad_out = np.ones((3, 4), np.float32)
    with pytest.raises(ValueError, match="has 5 rows"):
        gpu_grad(values, "float32", raw, splits, grad_out, max_grad_rows=4, id_mode="index")
    _, got_i = gpu_grad(values, "float32", raw, splits, grad_out, max_grad_rows=5, id_mode="index")
    np.testing.assert_array_equal(got_i, [1, 2, 3, 4, 5])

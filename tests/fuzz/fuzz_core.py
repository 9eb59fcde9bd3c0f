"""Atheris fuzz harness over the framework-free core, tf_ctr_ops._core.

Feeds raw buffers, offsets, ids and attributes to the pybind11 module
(packing and token parsing, hashing, pooling) and checks invariants:

- nothing crashes (a crash kills this process: libFuzzer reports it and
  writes the input as crash-<sha1>);
- every rejection is a ValueError or TypeError;
- parse_int64 agrees with a pure-Python statement of TF's to_number(int64)
  rule; hash_buckets(s) == fingerprint64(s) % n, and with a key a
  pure-Python SipHash-2-4 % n; hash_int_keys(k) == hash_buckets(decimal(k));
- embedding_lookup and string_embedding equal a float64 NumPy reference on
  finite inputs, and fail (ValueError) exactly where the reference does;
  hash_table_embedding equals hash_table_find + that reference, on tables
  with corrupt slots too.

TensorFlow is never imported, so an execution takes microseconds. The native
module is not coverage-instrumented (g++ has no libFuzzer instrumentation);
coverage guidance comes from this file's branches on what the core returned.
Run it against the sanitized build (.ci/sanitize.sh does) to also catch
memory errors that do not crash.

    python tests/fuzz/fuzz_core.py NEW_DIR tests/fuzz/corpus -max_total_time=60
    python tests/fuzz/fuzz_core.py tests/fuzz/corpus/*     # replay the kept inputs

New interesting inputs go to the first directory (keep tests/fuzz/corpus
second so CI does not write into it). A finding is fixed, then its input is
copied into tests/fuzz/corpus/ so every later run replays it.
"""

import os
import sys

import atheris
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from core_helpers import load_core  # noqa: E402  (tests/ is on the path only now)

# TF_CTR_OPS_CORE_DIR: the folder of the _core*.so to fuzz (test_fuzz.py sets
# it to the build its tests use); this checkout's package folder is the last resort.
core = load_core(first=[os.environ["TF_CTR_OPS_CORE_DIR"]] if os.environ.get("TF_CTR_OPS_CORE_DIR") else [],
                 last=[os.path.join(ROOT, "tf_ctr_ops")])

I64_MIN, I64_MAX = -(2**63), 2**63 - 1
WHITESPACE = b" \t\n\v\f\r"
COMBINERS = ["sum", "mean", "sqrtn"]
EXPECTED_ERRORS = (ValueError, TypeError)


# ---------------------------------------------------------------------------
# Pure-Python statements of the rules


@atheris.instrument_func
def ref_parse_int64(b):
    """tf.strings.to_number(b, tf.int64): optional ASCII whitespace, an optional
    sign, decimal digits, optional trailing whitespace, within int64; else None."""
    i, n = 0, len(b)
    while i < n and b[i] in WHITESPACE:
        i += 1
    negative = False
    if i < n and b[i] in b"+-":
        negative = b[i] == ord("-")
        i += 1
    j = i
    while j < n and 0x30 <= b[j] <= 0x39:
        j += 1
    if j == i:
        return None
    value = int(b[i:j])
    while j < n and b[j] in WHITESPACE:
        j += 1
    if j != n:
        return None
    value = -value if negative else value
    return value if I64_MIN <= value <= I64_MAX else None


class Rejected(Exception):
    """The reference rejects the input (the core must raise ValueError)."""


def pool(params, rows_weights, combiner, max_norm, default_id):
    """One bag: clip, weight, sum, scale, in float64."""
    dim = params.shape[1]
    if not rows_weights and default_id >= 0:
        rows_weights = [(default_id, 1.0)]
    acc = np.zeros(dim)
    wsum = wsq = 0.0
    for row, w in rows_weights:
        x = params[row].astype(np.float64)
        if max_norm > 0:
            norm = np.sqrt((x * x).sum())
            if norm > max_norm:
                x = x * (max_norm / norm)
        acc += w * x
        wsum += w
        wsq += w * w
    if combiner == "mean":
        return acc / wsum if wsum != 0 else np.zeros(dim)
    if combiner == "sqrtn":
        return acc / np.sqrt(wsq) if wsq != 0 else np.zeros(dim)
    return acc


@atheris.instrument_func
def ref_lookup(params, keys, offsets, weights, combiner, id_mode, invalid_ids, prune, default_id, max_norm):
    vocab = params.shape[0]
    out = []
    for r in range(len(offsets) - 1):
        entries = []
        for i in range(offsets[r], offsets[r + 1]):
            k = int(keys[i])
            if k == -1 and invalid_ids == "skip_padding":
                continue
            if id_mode == "index" and k < 0 and invalid_ids == "skip_negative":
                continue
            w = 1.0 if weights is None else float(weights[i])
            if prune and not w > 0:
                continue  # pruned before its id is checked, as safe_embedding_lookup_sparse does
            if id_mode == "hash":
                row = int(core.hash_int_keys(np.array([k], np.int64), vocab)[0])
            elif 0 <= k < vocab:
                row = k
            else:
                raise Rejected(f"id {k} in row {r}")
            entries.append((row, w))
        out.append(pool(params, entries, combiner, max_norm, default_id))
    return np.array(out).reshape(len(offsets) - 1, params.shape[1])


@atheris.instrument_func
def ref_tokens(s, delimiter, skip_empty):
    toks = [s] if not delimiter else s.split(delimiter)
    return [t for t in toks if t or not skip_empty]


@atheris.instrument_func
def ref_string_embedding(params, data, splits, bag_splits, combiner, id_mode, delimiter, skip_empty, max_norm):
    vocab = params.shape[0]
    strings = [bytes(data[splits[j]:splits[j + 1]]) for j in range(len(splits) - 1)]
    bags = ([[j] for j in range(len(strings))] if bag_splits is None
            else [list(range(bag_splits[r], bag_splits[r + 1])) for r in range(len(bag_splits) - 1)])
    out = []
    for r, members in enumerate(bags):
        entries = []
        for j in members:
            for tok in ref_tokens(strings[j], delimiter, skip_empty):
                if id_mode == "hash":
                    entries.append((int(core.hash_buckets([tok], vocab)[0]), 1.0))
                    continue
                v = ref_parse_int64(tok)
                if v is None:
                    raise Rejected(f"token {tok!r} in row {r} is not a number")
                if id_mode == "mod":
                    entries.append((v % vocab, 1.0))
                elif 0 <= v < vocab:
                    entries.append((v, 1.0))
                else:
                    raise Rejected(f"token {tok!r} in row {r} is out of range")
        out.append(pool(params, entries, combiner, max_norm, -1))
    return np.array(out).reshape(len(bags), params.shape[1])


# ---------------------------------------------------------------------------
# Input decoding


def pick(fdp, choices):
    return choices[fdp.ConsumeIntInRange(0, len(choices) - 1)]


def floats(fdp, n, special):
    """n float32s: raw bit patterns (NaN, inf, subnormals) or tame values."""
    if special:
        raw = fdp.ConsumeBytes(4 * n).ljust(4 * n, b"\0")
        return np.frombuffer(raw, np.float32).copy()
    return np.array([fdp.ConsumeIntInRange(-64, 64) / 8 for _ in range(n)], np.float32)


def ints64(fdp, n, vocab):
    """n int64 ids: raw bit patterns, or mostly table rows with edge values."""
    if fdp.ConsumeBool():
        raw = fdp.ConsumeBytes(8 * n).ljust(8 * n, b"\0")
        return np.frombuffer(raw, np.int64).copy()
    edges = [-1, -2, vocab, I64_MIN, I64_MAX, 2**31 - 1, -(2**31)]
    return np.array([pick(fdp, edges) if fdp.ConsumeIntInRange(0, 5) == 0 else fdp.ConsumeIntInRange(0, max(vocab - 1, 0))
                     for _ in range(n)], np.int64)


@atheris.instrument_func
def splits_for(fdp, total, count):
    """Valid CSR offsets over `total` items in `count` parts, or (sometimes) garbage."""
    if fdp.ConsumeIntInRange(0, 7) == 0:
        n = fdp.ConsumeIntInRange(0, 6)
        return np.array([fdp.ConsumeIntInRange(-3, total + 3) for _ in range(n)], np.int64), False
    cuts = sorted(fdp.ConsumeIntInRange(0, total) for _ in range(max(count - 1, 0)))
    return np.array([0] + cuts + [total], np.int64) if count > 0 else np.array([total], np.int64), total == 0 or count > 0


def check_close(got, want, what):
    got = np.asarray(got, np.float64)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    scale = 1.0 + np.abs(want).max(initial=0.0)
    if not np.allclose(got, want, rtol=1e-4, atol=1e-4 * scale):
        raise AssertionError(f"{what}: core and reference differ\ncore:\n{got}\nreference:\n{want}")


# ---------------------------------------------------------------------------
# Targets


@atheris.instrument_func
def fuzz_parse(fdp):
    b = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 30))
    if fdp.ConsumeBool():  # numbers near the int64 edges, with decorations
        v = fdp.ConsumeIntInRange(-(2**64), 2**64)
        b = pick(fdp, [b"", b" ", b"\t", b"+", b"-", b"\x0b", b"0"]) + str(v).encode() + pick(
            fdp, [b"", b" ", b"\n", b"\x00", b"x", b" 1"])
    got = core.parse_int64(b)
    want = ref_parse_int64(b)
    assert got == want, (b, got, want)


M64 = 2**64 - 1


def ref_siphash24(k0, k1, data):
    """SipHash-2-4 as its paper states it (to_hash_bucket_strong's hash)."""
    def rotl(x, b):
        return ((x << b) | (x >> (64 - b))) & M64

    v = [k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D, k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573]

    def sip_round():
        v[0] = (v[0] + v[1]) & M64
        v[1] = rotl(v[1], 13) ^ v[0]
        v[0] = rotl(v[0], 32)
        v[2] = (v[2] + v[3]) & M64
        v[3] = rotl(v[3], 16) ^ v[2]
        v[0] = (v[0] + v[3]) & M64
        v[3] = rotl(v[3], 21) ^ v[0]
        v[2] = (v[2] + v[1]) & M64
        v[1] = rotl(v[1], 17) ^ v[2]
        v[2] = rotl(v[2], 32)

    whole = len(data) // 8 * 8
    words = [int.from_bytes(data[i:i + 8], "little") for i in range(0, whole, 8)]
    words.append(int.from_bytes(data[whole:], "little") | ((len(data) & 0xFF) << 56))
    for m in words:
        v[3] ^= m
        sip_round()
        sip_round()
        v[0] ^= m
    v[2] ^= 0xFF
    for _ in range(4):
        sip_round()
    return v[0] ^ v[1] ^ v[2] ^ v[3]


@atheris.instrument_func
def fuzz_hash(fdp):
    n = fdp.ConsumeIntInRange(0, 4)
    strings = [fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 140)) for _ in range(n)]
    buckets = pick(fdp, [1, 2, 7, 1000, 2**31 - 1, I64_MAX, 0, -1])
    try:
        got = core.hash_buckets(strings, buckets)
    except EXPECTED_ERRORS:
        assert buckets <= 0
        return
    assert buckets > 0
    for s, b in zip(strings, got):
        assert int(b) == core.fingerprint64(s) % buckets, (s, buckets)
    key = [fdp.ConsumeIntInRange(I64_MIN, I64_MAX) for _ in range(2)]
    for s, b in zip(strings, core.hash_buckets(strings, buckets, key)):
        assert int(b) == ref_siphash24(key[0] & M64, key[1] & M64, s) % buckets, (s, key, buckets)
    keys = ints64(fdp, fdp.ConsumeIntInRange(0, 4), 100)
    for k in ([], key):
        got = core.hash_int_keys(keys, buckets, k)
        want = core.hash_buckets([str(int(x)).encode() for x in keys], buckets, k)
        assert np.array_equal(got, want), (keys, k, got, want)


@atheris.instrument_func
def fuzz_lookup(fdp):
    bad = fdp.ConsumeIntInRange(0, 15)  # 0..7: which argument to make invalid; else none
    vocab, dim = fdp.ConsumeIntInRange(0, 6), fdp.ConsumeIntInRange(0, 4)
    special = fdp.ConsumeIntInRange(0, 3) == 0
    dtype = {0: np.float64, 1: np.int32}.get(bad, pick(fdp, [np.float32, np.float32, np.float16]))
    params = floats(fdp, vocab * dim, special).reshape(vocab, dim).astype(dtype)
    if bad == 2:
        params = params.reshape(-1)
    nnz = fdp.ConsumeIntInRange(0, 10)
    keys = ints64(fdp, nnz, vocab).astype(np.uint64 if bad == 3 else pick(fdp, [np.int64, np.int32]))
    offsets, offsets_ok = splits_for(fdp, nnz, fdp.ConsumeIntInRange(0, 5))
    weights = None
    if fdp.ConsumeBool() or bad == 4:
        weights = floats(fdp, fdp.ConsumeIntInRange(0, 12) if bad == 4 else nnz, special)
    combiner = "max" if bad == 5 else pick(fdp, COMBINERS)
    id_mode = "bogus" if bad == 6 else pick(fdp, ["index", "index", "hash"])
    invalid_ids = "nope" if bad == 7 else pick(fdp, ["error", "skip_negative", "skip_padding"])
    prune = fdp.ConsumeBool()
    default_id = fdp.ConsumeIntInRange(-3, vocab + 1) if fdp.ConsumeIntInRange(0, 7) == 0 else pick(
        fdp, [-1, 0, vocab - 1])
    max_norm = pick(fdp, [-1.0, -1.0, 0.0, 0.5, 2.0, float("nan"), float("inf")])
    threads = fdp.ConsumeIntInRange(0, 3)
    try:
        got = core.embedding_lookup(params, keys, offsets, weights, combiner=combiner, id_mode=id_mode,
                                    invalid_ids=invalid_ids, prune_weights=prune, default_id=default_id,
                                    max_norm=max_norm, threads=threads)
    except EXPECTED_ERRORS:
        got = None
    valid_call = (bad > 7 or (bad == 4 and weights.size == nnz)) and offsets_ok and -1 <= default_id < vocab and not (
        id_mode == "hash" and vocab == 0)
    if not valid_call:
        return  # whether it raised or not, it did not crash
    if special or dtype == np.float16 or not max_norm == max_norm:
        # Raw float bits: only the shape is checked (the property tests compare
        # NaN/inf handling with TF); tame values are exact in float32.
        if got is not None:
            assert got.shape == (len(offsets) - 1, dim) and got.dtype == dtype
        return
    mn = max_norm if np.isfinite(max_norm) else -1.0
    try:
        want = ref_lookup(params, keys, offsets, weights, combiner, id_mode, invalid_ids, prune, default_id, mn)
    except Rejected as e:
        assert got is None, f"core accepted what the reference rejects: {e}"
        return
    assert got is not None, "core rejected a valid input"
    check_close(got, want, "embedding_lookup")


@atheris.instrument_func
def fuzz_strings(fdp):
    bad = fdp.ConsumeIntInRange(0, 11)  # 0..3: which argument to make invalid; else none
    vocab, dim = fdp.ConsumeIntInRange(0, 40), fdp.ConsumeIntInRange(0, 3)
    params = floats(fdp, vocab * dim, False).reshape(vocab, dim)
    if fdp.ConsumeBool():  # delimited numbers: the interesting paths of the parser
        parts = [pick(fdp, [str(fdp.ConsumeIntInRange(-50, 50)).encode(), b"", b" 7", b"+3", b"x",
                            str(fdp.ConsumeIntInRange(I64_MIN - 10, I64_MAX + 10)).encode()])
                 for _ in range(fdp.ConsumeIntInRange(0, 8))]
        delimiter = pick(fdp, [b",", b"::", b"\x00", b"\xff", b"aa"])
        data = delimiter.join(parts)
    else:
        delimiter = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 16))
        data = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 64))
    if bad == 0:
        delimiter = fdp.ConsumeBytes(fdp.ConsumeIntInRange(17, 40))
    buf = np.frombuffer(data, np.uint8).copy()
    splits, _ = splits_for(fdp, len(data), fdp.ConsumeIntInRange(0, 5))
    if fdp.ConsumeIntInRange(0, 5) == 0 and len(splits) > 1:
        splits = splits[1:]  # a feature's slice of a grouped buffer: need not start at 0
    bag_splits, bags_ok = None, True
    if fdp.ConsumeBool():
        bag_splits, bags_ok = splits_for(fdp, max(len(splits) - 1, 0), fdp.ConsumeIntInRange(0, 4))
    combiner = "min" if bad == 1 else pick(fdp, COMBINERS)
    id_mode = "other" if bad == 2 else pick(fdp, ["hash", "index", "mod"])
    if bad == 3:
        params = params.astype(np.float64)
    skip_empty = fdp.ConsumeBool()
    max_norm = pick(fdp, [-1.0, 0.5, 3.0])
    threads = fdp.ConsumeIntInRange(0, 3)
    try:
        got = core.string_embedding(params, buf, splits, bag_splits, combiner=combiner, id_mode=id_mode,
                                    delimiter=delimiter, skip_empty=skip_empty, max_norm=max_norm, threads=threads)
    except EXPECTED_ERRORS:
        got = None
    splits_valid = len(splits) >= 1 and splits[0] >= 0 and splits[-1] <= len(data) and bool(
        np.all(np.diff(splits) >= 0))
    if bad <= 3 or not splits_valid or not bags_ok or (vocab == 0 and id_mode != "index"):
        return
    try:
        want = ref_string_embedding(params, data, splits, bag_splits, combiner, id_mode, delimiter, skip_empty,
                                    max_norm)
    except Rejected as e:
        assert got is None, f"core accepted what the reference rejects: {e}"
        return
    assert got is not None, "core rejected a valid input"
    check_close(got, want, "string_embedding")


@atheris.instrument_func
def ref_table_pool(values, keys, offsets, weights, rows, combiner, prune, max_norm):
    """The lookup of the rows a find gave the keys (-1 left out), as
    hash_table_embedding pools them in two ops."""
    entries = [(int(rows[i]), 1.0 if weights is None else float(weights[i])) for i in range(len(keys))]
    out = []
    for r in range(len(offsets) - 1):
        bag = []
        for row, w in entries[offsets[r]:offsets[r + 1]]:
            if row < 0 or (prune and not w > 0):
                continue
            if row >= values.shape[0]:
                raise Rejected(f"table row {row} in row {r}")
            bag.append((row, w))
        out.append(pool(values, bag, combiner, max_norm, -1))
    return np.array(out).reshape(len(offsets) - 1, values.shape[1])


@atheris.instrument_func
def fuzz_table_pool(fdp):
    """hash_table_embedding (the find and the pooling in one pass) against
    hash_table_find + the lookup's rules, on tables that may be corrupt."""
    num_slots = pick(fdp, [2, 16, 32])
    capacity = min(fdp.ConsumeIntInRange(0, 8), num_slots)
    table = np.zeros([2 + num_slots + -(-capacity // 4), 4], np.int64)
    table[2:2 + num_slots].reshape(-1)[1:2 * num_slots:2] = -1  # every slot's entry: empty
    inserted = ints64(fdp, fdp.ConsumeIntInRange(0, 10), 8)
    core.hash_table_find(table, inserted, capacity, insert=True)
    pairs = table[2:2 + num_slots].reshape(-1)[:2 * num_slots]
    for _ in range(fdp.ConsumeIntInRange(0, 3)):  # a table assigned other tensors
        pairs[fdp.ConsumeIntInRange(0, pairs.size - 1)] = pick(fdp, [-5, 3, capacity, 2**40, I64_MIN, I64_MAX, -1])
    if fdp.ConsumeIntInRange(0, 9) == 0:
        table.reshape(-1)[fdp.ConsumeIntInRange(0, 7)] = pick(fdp, [-1, 99, I64_MAX])
    vocab, dim = fdp.ConsumeIntInRange(0, capacity + 1), fdp.ConsumeIntInRange(0, 3)
    values = floats(fdp, vocab * dim, False).reshape(vocab, dim)
    nnz = fdp.ConsumeIntInRange(0, 10)
    keys = np.concatenate([inserted, ints64(fdp, nnz, 8)])[-nnz:] if nnz else np.zeros([0], np.int64)
    offsets, offsets_ok = splits_for(fdp, keys.size, fdp.ConsumeIntInRange(0, 5))
    weights = floats(fdp, keys.size, False) if fdp.ConsumeBool() else None
    combiner, prune, dense_padding = pick(fdp, COMBINERS), fdp.ConsumeBool(), fdp.ConsumeBool()
    max_norm = pick(fdp, [-1.0, 0.5, 2.0])
    key_fault = False
    try:
        want_rows, _ = core.hash_table_find(table.copy(), keys, capacity, dense_padding=dense_padding)
    except EXPECTED_ERRORS as e:
        want_rows = None  # a header the view refuses: so must the pooling
        # A key whose row is past the capacity, or whose probe meets no empty
        # slot: the pooling refuses it too unless its rules never read it (a
        # pruned weight drops the key before its row is checked).
        key_fault = str(e).startswith("corrupt hash table: key ")
    try:
        got, rows = core.hash_table_embedding(table, values, keys, offsets, weights, combiner=combiner,
                                              capacity=capacity, dense_padding=dense_padding, prune_weights=prune,
                                              max_norm=max_norm, threads=fdp.ConsumeIntInRange(0, 3))
    except EXPECTED_ERRORS:
        got = None
    if not offsets_ok or key_fault:
        return  # garbage offsets, perhaps valid by chance: whether it raised or not, it did not crash
    if want_rows is None:
        assert got is None, "core pooled a table whose header the find refuses"
        return
    try:
        want = ref_table_pool(values, keys, offsets, weights, want_rows, combiner, prune, max_norm)
    except Rejected as e:
        assert got is None, f"core accepted what the reference rejects: {e}"
        return
    assert got is not None, "core rejected a valid input"
    np.testing.assert_array_equal(rows, want_rows)
    check_close(got, want, "hash_table_embedding")


# The last byte of an input picks its target: appended targets leave the
# corpus' inputs (their last bytes are < 4) on the targets they were kept for.
TARGETS = [fuzz_parse, fuzz_hash, fuzz_lookup, fuzz_strings, fuzz_table_pool]


def test_one_input(data):
    fdp = atheris.FuzzedDataProvider(data)
    TARGETS[fdp.ConsumeIntInRange(0, len(TARGETS) - 1)](fdp)


def main():
    np.seterr(all="ignore")
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()

"""Property tests: every fused op against the TF-native composition it replaces.

The rule, for random shapes (batch 0 included), ids across the whole integer
range, byte strings with NUL and bytes above 0x7F, random delimiters, and
weights / table values including 0, negatives, NaN and inf:

- where the TF composition succeeds, the fused op gives the same result (NaN
  in exactly the same positions, infinities equal, finite values within a
  float32 summation-order tolerance);
- where the composition fails, the fused op raises InvalidArgumentError;
- neither ever crashes.

The compositions spell out the fused ops' own rules (docs/robustness.md):
index-mode string ids and sparse_embedding ids outside [0, V) are errors
(TF's Gather rejects them too; the string composition asserts
non-negativity where TF's safe lookup would prune). The documented
differences from TF are passed to run_both as `stricter` / `lenient`: ids
are checked even for D = 0 tables (`degenerate`), hash/mod string modes need
V > 0, and a safe lookup without a default (None, or -1) gives zeros for an
empty row where TF's gather fails (V = 0, or id -1).
Gradients are compared on finite tables, with weights up to 1e30.

Profiles (tests/conftest.py): "ci" (default, 200 examples per property,
TF_CTR_OPS_HYPOTHESIS_EXAMPLES to change) and "slow" (100k examples per
property), selected by `pytest -m slow` or TF_CTR_OPS_HYPOTHESIS_PROFILE=slow.
"""

import math

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import assume, given, note
from hypothesis import strategies as st

import tf_ctr_ops as tco

pytestmark = pytest.mark.property

COMBINERS = ("sum", "mean", "sqrtn")
I32 = (-(2**31), 2**31 - 1)
I64 = (-(2**63), 2**63 - 1)
NAN, INF = float("nan"), float("inf")

# Weights: mostly small dyadic values (their sums are exact in any order, so
# the two sides' denominators agree bit for bit), plus the special values.
NICE_WEIGHTS = st.integers(-12, 12).map(lambda k: k / 4)
SPECIAL_WEIGHTS = st.sampled_from([0.0, -0.0, NAN, INF, -INF, 1e30, -1e30, 3e38, 1e-30, -2.5e-6])
WEIGHTS = st.one_of(NICE_WEIGHTS, NICE_WEIGHTS, NICE_WEIGHTS, SPECIAL_WEIGHTS)
GRAD_WEIGHTS = st.one_of(NICE_WEIGHTS, NICE_WEIGHTS, NICE_WEIGHTS, SPECIAL_WEIGHTS.filter(lambda w: abs(w) != 3e38))
MAX_NORMS = st.one_of(st.none(), st.sampled_from([0.5, 1.0, 3.0]),
                      st.floats(1e-3, 1e3, allow_nan=False, allow_infinity=False))


# ---------------------------------------------------------------------------
# Helpers


def run_both(want_fn, got_fn, compare, stricter=False, lenient=False):
    """The rule: same result where the composition succeeds, InvalidArgument where it fails.

    The documented exceptions to it, set by the callers:
    stricter: the fused op may raise InvalidArgument where TF succeeds;
    lenient: the fused op may succeed where TF fails.
    """
    try:
        want = want_fn()
    except (tf.errors.InvalidArgumentError, UnicodeDecodeError) as e:
        # UnicodeDecodeError: TF failed, with an error message (quoting a
        # non-UTF-8 token) that its Python layer cannot decode.
        note(f"composition failed: {str(e).splitlines()[0][:200]}")
        if lenient:
            try:
                got_fn()
            except tf.errors.InvalidArgumentError:
                pass
            return None
        with pytest.raises(tf.errors.InvalidArgumentError):
            got_fn()
        return None
    if stricter:
        try:
            got = got_fn()
        except tf.errors.InvalidArgumentError:
            return None
    else:
        got = got_fn()
    compare(got, want)
    return got


def degenerate(params):
    """D = 0: TF is inconsistent there (Gather skips its id check for
    zero-width rows, SparseSegment* then rejects every index), so for such
    tables only 'no crash, and the right shape when both succeed' is checked."""
    return dict(stricter=True, lenient=True) if params.shape[1] == 0 else {}


def empty_table(vocab):
    """V = 0 for the string ops, both ways documented (docs/robustness.md):
    stricter, hash and mod modes reject an empty table even when there is no
    token to look up; lenient, an empty row gives zeros where TF's safe
    lookup fails (it fills the row with id 0, outside a table of no rows)."""
    return dict(stricter=True, lenient=True) if vocab == 0 else {}


def dense(x):
    if isinstance(x, tf.IndexedSlices):
        x = tf.convert_to_tensor(x)
    return np.asarray(tf.cast(x, tf.float32))


def assert_same(got, want, atol_rows=None, rtol=2e-5, nonfinite_as_one=False):
    """NaN in the same places, infinities equal, finite values close.

    atol_rows: per output row absolute tolerance (a float32 summation-order
    bound), broadcast over the last axis. nonfinite_as_one: only require
    non-finite values in the same places (gradients: with an infinite weight,
    whether an element ends as inf or NaN depends on association order).
    """
    got, want = dense(got), dense(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    if nonfinite_as_one:
        got, want = got.copy(), want.copy()
        got[~np.isfinite(got)] = np.nan
        want[~np.isfinite(want)] = np.nan
    atol = np.full(want.shape[:1], 1e-6) if atol_rows is None else np.asarray(atol_rows, np.float64)
    atol = atol.reshape(atol.shape + (1,) * (want.ndim - 1))
    nan_g, nan_w = np.isnan(got), np.isnan(want)
    bad = nan_g != nan_w
    fin = ~(nan_g | nan_w)
    with np.errstate(invalid="ignore", over="ignore"):
        inf = fin & (np.isinf(got) | np.isinf(want))
        bad |= inf & (got != want)
        close = np.abs(got.astype(np.float64) - want) <= atol + rtol * np.abs(want.astype(np.float64))
    bad |= fin & ~inf & ~close
    if bad.any():
        where = np.argwhere(bad)[:5].tolist()
        raise AssertionError(f"{int(bad.sum())} of {bad.size} elements differ, e.g. at {where}: "
                             f"got {got[bad][:5]}, want {want[bad][:5]}\ngot:\n{got}\nwant:\n{want}")


@st.composite
def tables(draw, max_vocab=12, max_dim=5, min_vocab=0, min_dim=0):
    """A float32 [V, D] table; sometimes with NaN / inf entries."""
    vocab = draw(st.integers(min_vocab, max_vocab))
    dim = draw(st.integers(min_dim, max_dim))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    values = rng.normal(size=(vocab, dim)).astype(np.float32) * draw(st.sampled_from([1.0, 1.0, 1e-3, 1e3]))
    if vocab * dim and draw(st.integers(0, 4)) == 0:
        flat = values.reshape(-1)
        where = rng.choice(flat.size, size=rng.integers(1, min(3, flat.size) + 1), replace=False)
        flat[where] = rng.choice(np.array([np.nan, np.inf, -np.inf, 0.0], np.float32), size=where.size)
    return values


def id_values(vocab, lo, hi):
    """Ids: mostly table rows, else edges and anything in the dtype's range."""
    rows = st.integers(0, max(vocab - 1, 0))
    edges = st.sampled_from([v for v in (-1, -2, vocab, vocab + 1, lo, hi, 2**31 - 1, -(2**31), 2**32)
                             if lo <= v <= hi])
    return st.one_of(rows, rows, rows, rows, edges, st.integers(lo, hi))


@st.composite
def bags(draw, vocab, lo, hi, max_batch=6, max_len=5, padding=False):
    """Per-bag lists of ids, with the batch size (0 included)."""
    lengths = draw(st.lists(st.integers(0, max_len), max_size=max_batch))
    ids = st.one_of(id_values(vocab, lo, hi), st.just(-1)) if padding else id_values(vocab, lo, hi)
    return [draw(st.lists(ids, min_size=n, max_size=n)) for n in lengths]


def bag_weights(draw, bag_ids, weights=WEIGHTS):
    return [draw(st.lists(weights, min_size=len(b), max_size=len(b))) for b in bag_ids]


def row_bounds(params, bag_w, keep, combiner, max_norm, default_row=False):
    """Per-bag bound on |output| that float32 reordering errors scale with.

    sum_i |w_i| * P / denominator, P the largest finite table entry (or the
    clip norm), over the entries `keep` keeps; non-finite weights are left
    out (they make NaN/inf, compared exactly).
    """
    finite = params[np.isfinite(params)]
    p = float(np.abs(finite).max()) if finite.size else 0.0
    if max_norm is not None:
        p = min(p, max_norm)
    out = []
    for ws, ks in zip(bag_w, keep):
        ws = np.array([w for w, k in zip(ws, ks) if k], np.float64)
        if ws.size == 0:
            out.append(p if default_row else 0.0)
            continue
        fin = ws[np.isfinite(ws)]
        num = np.abs(fin).sum() * p
        den = {"sum": 1.0, "mean": abs(fin.sum()), "sqrtn": math.sqrt((fin ** 2).sum())}[combiner]
        out.append(num / den if den > 0 else num)
    return 4e-6 * np.array(out) + 1e-6


def sparse_from_bags(bag_ids, dtype, bag_w=None, width=None):
    """A canonical-order SparseTensor [B, width] (and weights) from bags."""
    batch = len(bag_ids)
    width = width or max([len(b) for b in bag_ids] + [1])
    idx = [(r, c) for r, b in enumerate(bag_ids) for c in range(len(b))]
    vals = [v for b in bag_ids for v in b]
    indices = tf.constant(np.array(idx, np.int64).reshape(-1, 2))
    sp = tf.SparseTensor(indices, tf.constant(vals, dtype, shape=[len(vals)]), [batch, width])
    sw = None
    if bag_w is not None:
        flat_w = [w for ws in bag_w for w in ws]
        sw = tf.SparseTensor(indices, tf.constant(flat_w, tf.float32, shape=[len(flat_w)]), [batch, width])
    return sp, sw


def ragged_from_bags(bag_ids, dtype, bag_w=None):
    lengths = [len(b) for b in bag_ids]
    vals = [v for b in bag_ids for v in b]
    rt = tf.RaggedTensor.from_row_lengths(tf.constant(vals, dtype, shape=[len(vals)]),
                                          tf.constant(lengths, tf.int64, shape=[len(lengths)]))
    rw = None
    if bag_w is not None:
        flat_w = [w for ws in bag_w for w in ws]
        rw = rt.with_flat_values(tf.constant(flat_w, tf.float32, shape=[len(flat_w)]))
    return rt, rw


def dense_from_bags(bag_ids, dtype, bag_w=None):
    """[B, N] ids padded with -1 ("" for strings), weights padded with 0."""
    pad = b"" if dtype == tf.string else -1
    width = max([len(b) for b in bag_ids] + [0])
    ids = np.full((len(bag_ids), width), pad, dtype=object)
    w = np.zeros((len(bag_ids), width), np.float32)
    for r, b in enumerate(bag_ids):
        ids[r, :len(b)] = b
        if bag_w is not None:
            w[r, :len(b)] = bag_w[r]
    return tf.constant(ids.tolist(), dtype) if ids.size else tf.zeros(ids.shape, dtype), (
        None if bag_w is None else tf.constant(w))


def pooled_rows(params, sp, sw, combiner, max_norm, batch):
    """tf.nn.embedding_lookup_sparse padded to `batch` rows (it stops at the last non-empty row)."""
    out = tf.nn.embedding_lookup_sparse(params, sp, sw, combiner=combiner, max_norm=max_norm)
    missing = batch - tf.shape(out)[0]
    return tf.concat([out, tf.zeros(tf.stack([missing, tf.shape(out)[1]]), out.dtype)], 0)


# ---------------------------------------------------------------------------
# Drop-in ops


def draw_lookup(data, vocab):
    """(id dtype, bags of ids over that dtype's range, optional weights, combiner, max_norm)."""
    id_dtype = data.draw(st.sampled_from([tf.int32, tf.int64]))
    lo, hi = I32 if id_dtype == tf.int32 else I64
    bag_ids = data.draw(bags(vocab, lo, hi))
    bag_w = bag_weights(data.draw, bag_ids) if data.draw(st.booleans()) else None
    return id_dtype, bag_ids, bag_w, data.draw(st.sampled_from(COMBINERS)), data.draw(MAX_NORMS)


@given(data=st.data())
def test_embedding_lookup_sparse(data):
    params = data.draw(tables())
    vocab = params.shape[0]
    id_dtype, bag_ids, bag_w, combiner, max_norm = draw_lookup(data, vocab)
    container = data.draw(st.sampled_from(["sparse", "ragged"]))
    if container == "sparse":
        ids, w = sparse_from_bags(bag_ids, id_dtype, bag_w, width=data.draw(st.integers(0, 3)) + 5)
    else:
        ids, w = ragged_from_bags(bag_ids, id_dtype, bag_w)
    bounds = row_bounds(params, bag_w or [[1.0] * len(b) for b in bag_ids],
                        [[True] * len(b) for b in bag_ids], combiner, max_norm)

    def compare(got, want):
        assert_same(got, want, bounds[:want.shape[0]])

    run_both(lambda: tf.nn.embedding_lookup_sparse(params, ids, w, combiner=combiner, max_norm=max_norm),
             lambda: tco.embedding_lookup_sparse(params, ids, w, combiner=combiner, max_norm=max_norm), compare,
             **degenerate(params))


@given(data=st.data())
def test_safe_embedding_lookup_sparse(data):
    params = data.draw(tables())
    vocab = params.shape[0]
    id_dtype = data.draw(st.sampled_from([tf.int32, tf.int64]))
    lo, hi = I32 if id_dtype == tf.int32 else I64
    lead = data.draw(st.sampled_from([None, (2, 3), (3, 1), (0, 2)]))
    max_batch = 6 if lead is None else int(np.prod(lead))
    bag_ids = data.draw(bags(vocab, lo, hi, max_batch=max_batch))
    if lead is not None:
        bag_ids = (bag_ids + [[]] * max_batch)[:max_batch]
    bag_w = bag_weights(data.draw, bag_ids) if data.draw(st.booleans()) else None
    combiner = data.draw(st.sampled_from(COMBINERS))
    max_norm = data.draw(MAX_NORMS)
    # Past the table and below -1 too: TF fails on those only where a row is empty.
    default_id = data.draw(st.one_of(st.none(), st.integers(0, max(vocab - 1, 0)), st.integers(-3, vocab + 2)))
    width = max([len(b) for b in bag_ids] + [1]) + data.draw(st.integers(0, 2))
    sp, sw = sparse_from_bags(bag_ids, id_dtype, bag_w, width=width)
    if lead is not None:
        # Rank 3: bag r is position divmod(r, lead[1]) of the leading dims.
        ind = sp.indices
        ind = tf.stack([ind[:, 0] // lead[1], ind[:, 0] % lead[1], ind[:, 1]], axis=1)
        sp = tf.SparseTensor(ind, sp.values, [lead[0], lead[1], width])
        sw = None if sw is None else tf.SparseTensor(ind, sw.values, sp.dense_shape)
    prune = combiner != "sum" and bag_w is not None
    w_or_1 = bag_w or [[1.0] * len(b) for b in bag_ids]
    keep = [[i >= 0 and (not prune or w > 0) for i, w in zip(b, ws)] for b, ws in zip(bag_ids, w_or_1)]
    bounds = row_bounds(params, w_or_1, keep, combiner, max_norm, default_row=default_id is not None)

    def compare(got, want):
        assert got.shape == want.shape, (got.shape, want.shape)
        d = want.shape[-1]
        if d:
            assert_same(tf.reshape(got, [-1, d]), tf.reshape(want, [-1, d]), bounds)

    run_both(lambda: tf.nn.safe_embedding_lookup_sparse(params, sp, sw, combiner=combiner, default_id=default_id,
                                                        max_norm=max_norm),
             lambda: tco.safe_embedding_lookup_sparse(params, sp, sw, combiner=combiner, default_id=default_id,
                                                      max_norm=max_norm), compare,
             # Lenient: without a default, TF fills an empty row with id 0
             # (failing on an empty table) or with -1 (failing always); the
             # fused op gives zeros.
             **(degenerate(params) or dict(lenient=default_id == -1 or (vocab == 0 and default_id is None))))


@given(data=st.data())
def test_sharded_lookups_match_tf_v1(data):
    """Lists of shards in both partition strategies, through both v1 drop-ins,
    against tf.compat.v1.nn: row for row, and an error wherever TF's fails."""
    params = data.draw(tables(max_vocab=15, min_vocab=1, min_dim=1))
    vocab = params.shape[0]
    num_shards = data.draw(st.integers(1, min(vocab, 5)))
    strategy = data.draw(st.sampled_from(["mod", "div"]))
    if strategy == "mod":
        shards = [params[p::num_shards] for p in range(num_shards)]
    else:
        shards = np.split(params, np.cumsum(tco.ops.canonical_shard_sizes(vocab, num_shards))[:-1])
    shards = [tf.constant(s) for s in shards]
    id_dtype, bag_ids, bag_w, combiner, max_norm = draw_lookup(data, vocab)
    safe = data.draw(st.booleans())
    if data.draw(st.booleans()):
        assume(bag_ids or not safe)  # TF's ragged safe lookup raises ValueError for a batch of 0 rows
        ids, w = ragged_from_bags(bag_ids, id_dtype, bag_w)
    else:
        ids, w = sparse_from_bags(bag_ids, id_dtype, bag_w)
    w_or_1 = bag_w or [[1.0] * len(b) for b in bag_ids]
    if safe:
        default_id = data.draw(st.one_of(st.none(), st.integers(0, vocab - 1)))
        prune = combiner != "sum" and bag_w is not None
        keep = [[i >= 0 and (not prune or wt > 0) for i, wt in zip(b, ws)] for b, ws in zip(bag_ids, w_or_1)]
        bounds = row_bounds(params, w_or_1, keep, combiner, max_norm, default_row=default_id is not None)
        kw = dict(combiner=combiner, default_id=default_id, max_norm=max_norm, partition_strategy=strategy)
        want_fn = lambda: tf.compat.v1.nn.safe_embedding_lookup_sparse(shards, ids, w, **kw)  # noqa: E731
        got_fn = lambda: tco.compat.v1.safe_embedding_lookup_sparse(shards, ids, w, **kw)  # noqa: E731
    else:
        bounds = row_bounds(params, w_or_1, [[True] * len(b) for b in bag_ids], combiner, max_norm)
        kw = dict(combiner=combiner, max_norm=max_norm, partition_strategy=strategy)
        want_fn = lambda: tf.compat.v1.nn.embedding_lookup_sparse(shards, ids, w, **kw)  # noqa: E731
        got_fn = lambda: tco.compat.v1.embedding_lookup_sparse(shards, ids, w, **kw)  # noqa: E731

    def compare(got, want):
        assert_same(got, want, bounds[:want.shape[0]])

    # Stricter: an id outside [0, V) (negative ones: outside the safe lookup)
    # is always an error; TF's "div" arithmetic casts partitions to int32 and
    # can read some row for a large enough one (docs/tf_contract.md).
    outside = any(i >= vocab or (i < 0 and not safe) for b in bag_ids for i in b)
    run_both(want_fn, got_fn, compare, stricter=outside)


# ---------------------------------------------------------------------------
# CTR-first ops


def _containers(data, bag_ids, id_dtype, bag_w):
    container = data.draw(st.sampled_from(["ragged", "sparse", "dense"]))
    if container == "ragged":
        return container, *ragged_from_bags(bag_ids, id_dtype, bag_w)
    if container == "sparse":
        return container, *sparse_from_bags(bag_ids, id_dtype, bag_w)
    return container, *dense_from_bags(bag_ids, id_dtype, bag_w)


@given(data=st.data())
def test_sparse_embedding(data):
    """Composition: drop the -1 padding, then tf.nn.embedding_lookup_sparse over B rows."""
    params = data.draw(tables())
    vocab = params.shape[0]
    id_dtype = data.draw(st.sampled_from([tf.int32, tf.int64]))
    lo, hi = I32 if id_dtype == tf.int32 else I64
    bag_ids = data.draw(bags(vocab, lo, hi, padding=True))
    bag_w = bag_weights(data.draw, bag_ids) if data.draw(st.booleans()) else None
    combiner = data.draw(st.sampled_from(COMBINERS))
    max_norm = data.draw(MAX_NORMS)
    container, ids, w = _containers(data, bag_ids, id_dtype, bag_w)
    w_or_1 = bag_w or [[1.0] * len(b) for b in bag_ids]
    kept = [[(i, x) for i, x in zip(b, ws) if i != -1] for b, ws in zip(bag_ids, w_or_1)]
    ref_ids = [[i for i, _ in b] for b in kept]
    ref_w = None if bag_w is None else [[x for _, x in b] for b in kept]
    bounds = row_bounds(params, ref_w or [[1.0] * len(b) for b in ref_ids], [[True] * len(b) for b in ref_ids],
                        combiner, max_norm)

    def want():
        sp, sw = sparse_from_bags(ref_ids, tf.int64, ref_w)
        return pooled_rows(params, sp, sw, combiner, max_norm, len(bag_ids))

    run_both(want, lambda: tco.sparse_embedding(params, ids, w, combiner=combiner, max_norm=max_norm),
             lambda got, want: assert_same(got, want, bounds), **degenerate(params))


@given(data=st.data())
def test_hash_embedding_int_keys(data):
    """Composition: to_hash_bucket_fast(as_string(key), V), then the pooling (dense -1 is padding)."""
    params = data.draw(tables())
    vocab = params.shape[0]
    id_dtype = data.draw(st.sampled_from([tf.int32, tf.int64]))
    lo, hi = I32 if id_dtype == tf.int32 else I64
    bag_ids = data.draw(bags(max(vocab, 1000), lo, hi, padding=True))
    bag_w = bag_weights(data.draw, bag_ids) if data.draw(st.booleans()) else None
    combiner = data.draw(st.sampled_from(COMBINERS))
    max_norm = data.draw(MAX_NORMS)
    container, keys, w = _containers(data, bag_ids, id_dtype, bag_w)
    w_or_1 = bag_w or [[1.0] * len(b) for b in bag_ids]
    kept = [[(k, x) for k, x in zip(b, ws) if not (container == "dense" and k == -1)]
            for b, ws in zip(bag_ids, w_or_1)]
    ref_keys = [[k for k, _ in b] for b in kept]
    ref_w = None if bag_w is None else [[x for _, x in b] for b in kept]
    bounds = row_bounds(params, ref_w or [[1.0] * len(b) for b in ref_keys], [[True] * len(b) for b in ref_keys],
                        combiner, max_norm)

    def want():
        sp, sw = sparse_from_bags(ref_keys, id_dtype, ref_w)
        buckets = tf.strings.to_hash_bucket_fast(tf.strings.as_string(sp.values), vocab)
        sp = tf.SparseTensor(sp.indices, buckets, sp.dense_shape)
        return pooled_rows(params, sp, sw, combiner, max_norm, len(bag_ids))

    run_both(want, lambda: tco.hash_embedding(params, keys, w, combiner=combiner, max_norm=max_norm),
             lambda got, want: assert_same(got, want, bounds), **degenerate(params))


BYTES = st.one_of(st.binary(max_size=12), st.text(max_size=6).map(lambda s: s.encode("utf-8")),
                  st.sampled_from([b"", b"\x00", b"a\x00b", b"\xff\xfe", b"05db9164", b"x" * 70, b"-1"]))


@given(data=st.data())
def test_hash_embedding_string_keys(data):
    """Composition: to_hash_bucket_fast(key, V), then the pooling (dense "" is padding)."""
    params = data.draw(tables())
    vocab = params.shape[0]
    lengths = data.draw(st.lists(st.integers(0, 4), max_size=6))
    bag_keys = [data.draw(st.lists(BYTES, min_size=n, max_size=n)) for n in lengths]
    bag_w = bag_weights(data.draw, bag_keys) if data.draw(st.booleans()) else None
    combiner = data.draw(st.sampled_from(COMBINERS))
    max_norm = data.draw(MAX_NORMS)
    container, keys, w = _containers(data, bag_keys, tf.string, bag_w)
    w_or_1 = bag_w or [[1.0] * len(b) for b in bag_keys]
    kept = [[(k, x) for k, x in zip(b, ws) if not (container == "dense" and k == b"")]
            for b, ws in zip(bag_keys, w_or_1)]
    ref_keys = [[k for k, _ in b] for b in kept]
    ref_w = None if bag_w is None else [[x for _, x in b] for b in kept]
    bounds = row_bounds(params, ref_w or [[1.0] * len(b) for b in ref_keys], [[True] * len(b) for b in ref_keys],
                        combiner, max_norm)

    def want():
        sp, sw = sparse_from_bags(ref_keys, tf.string, ref_w)
        sp = tf.SparseTensor(sp.indices, tf.strings.to_hash_bucket_fast(sp.values, vocab), sp.dense_shape)
        return pooled_rows(params, sp, sw, combiner, max_norm, len(bag_keys))

    run_both(want, lambda: tco.hash_embedding(params, keys, w, combiner=combiner, max_norm=max_norm),
             lambda got, want: assert_same(got, want, bounds), **degenerate(params))


# ---------------------------------------------------------------------------
# Strings of delimited ids


DELIMITERS = st.one_of(st.sampled_from([b",", b"|", b"::", b" ", b"\x00", b"\xff", b"aa", b",,"]),
                       st.binary(min_size=1, max_size=16))


def tokens(vocab):
    return st.one_of(
        st.integers(0, max(vocab + 1, 1)).map(lambda v: str(v).encode()),
        st.integers(0, max(vocab + 1, 1)).map(lambda v: str(v).encode()),
        st.integers(-(2**64), 2**64).map(lambda v: str(v).encode()),
        st.sampled_from([b"", b" 7", b"+3", b"-0", b"0x1", b"1e3", b" 12 ", b"\t5\n", b"--1", b"+-1", b"\x0b8",
                         b"9" * 19, b"9223372036854775807", b"-9223372036854775808", b"9223372036854775808",
                         b"\xd9\xa1", b"1\x002", b"\x00", b"\xff"]),
        st.binary(max_size=5),
    )


@st.composite
def id_strings(draw, vocab, delimiter, max_batch=6):
    """Mostly delimited tokens, sometimes raw bytes."""
    structured = st.lists(tokens(vocab), max_size=6).map(lambda ts: delimiter.join(ts))
    return draw(st.lists(st.one_of(structured, structured, st.binary(max_size=16)), max_size=max_batch))


def string_composition(strings, params, delimiter, combiner, id_mode, skip_empty, max_norm, batch):
    """split -> (to_number | to_hash_bucket_fast) -> safe_embedding_lookup_sparse, index ids checked."""
    strings = tf.constant(strings, tf.string, shape=[batch])
    toks = tf.strings.split(strings, delimiter)
    if skip_empty:
        toks = tf.ragged.boolean_mask(toks, tf.not_equal(toks, b""))
    vocab = params.shape[0]
    if id_mode == "hash":
        ids = tf.strings.to_hash_bucket_fast(toks, vocab)
    else:
        ids = tf.strings.to_number(toks, tf.int64)
        if id_mode == "mod":
            ids = tf.math.floormod(ids, vocab)
        else:
            tf.debugging.assert_non_negative(ids.flat_values)  # the fused op's (and Gather's) rule
    sp = ids.to_sparse()
    sp = tf.SparseTensor(sp.indices, sp.values, [batch, sp.dense_shape[1]])
    return tf.nn.safe_embedding_lookup_sparse(params, sp, None, combiner=combiner, max_norm=max_norm)


def string_bounds(params, strings, combiner, max_norm):
    finite = params[np.isfinite(params)]
    p = float(np.abs(finite).max()) if finite.size else 0.0
    if max_norm is not None:
        p = min(p, max_norm)
    n = max([len(s) + 1 for s in strings] + [1])  # at most len + 1 tokens
    return 4e-6 * p * n + 1e-6


@given(data=st.data())
def test_string_embedding(data):
    params = data.draw(tables(max_vocab=40))
    vocab = params.shape[0]
    delimiter = data.draw(DELIMITERS)
    strings = data.draw(id_strings(vocab, delimiter))
    combiner = data.draw(st.sampled_from(COMBINERS))
    id_mode = data.draw(st.sampled_from(["hash", "index", "mod"]))
    skip_empty = data.draw(st.booleans())
    max_norm = data.draw(MAX_NORMS)
    packed = data.draw(st.booleans())
    batch = len(strings)
    inputs = tco.pack_strings(tf.constant(strings, tf.string, shape=[batch])) if packed else tf.constant(
        strings, tf.string, shape=[batch])
    atol = string_bounds(params, strings, combiner, max_norm)
    run_both(lambda: string_composition(strings, params, delimiter, combiner, id_mode, skip_empty, max_norm, batch),
             lambda: tco.string_embedding(inputs, params, delimiter=delimiter, combiner=combiner, id_mode=id_mode,
                                          skip_empty=skip_empty, max_norm=max_norm),
             lambda got, want: assert_same(got, want, np.full(batch, atol)),
             **(degenerate(params) or empty_table(vocab)))


@given(data=st.data())
def test_multi_string_embedding(data):
    n = data.draw(st.integers(1, 3))
    batch = data.draw(st.integers(0, 4))
    tabs, feats, kws = [], [], []
    for _ in range(n):
        params = data.draw(tables(max_vocab=30))
        delimiter = data.draw(DELIMITERS)
        strings = data.draw(id_strings(params.shape[0], delimiter, max_batch=batch))
        strings = (strings + [b""] * batch)[:batch]
        tabs.append(params)
        feats.append(strings)
        kws.append(dict(delimiter=delimiter, combiner=data.draw(st.sampled_from(COMBINERS)),
                        id_mode=data.draw(st.sampled_from(["hash", "index", "mod"])),
                        skip_empty=data.draw(st.booleans()), max_norm=data.draw(MAX_NORMS)))

    concat = data.draw(st.booleans())  # CtrConcatStringEmbedding: the outputs concatenated in place

    def want():
        return [string_composition(f, t, batch=batch, **kw) for f, t, kw in zip(feats, tabs, kws)]

    def got():
        out = tco.multi_string_embedding(
            [tf.constant(f, tf.string, shape=[batch]) for f in feats], tabs,
            delimiters=[k["delimiter"] for k in kws], combiners=[k["combiner"] for k in kws],
            id_modes=[k["id_mode"] for k in kws], skip_empty=[k["skip_empty"] for k in kws],
            max_norms=[k["max_norm"] for k in kws], concat=concat)
        if not concat:
            return out
        assert out.shape == (batch, sum(t.shape[1] for t in tabs))
        return np.split(out.numpy(), np.cumsum([t.shape[1] for t in tabs])[:-1], axis=1)

    def compare(gots, wants):
        assert len(gots) == len(wants) == n
        for g, w, f, t, kw in zip(gots, wants, feats, tabs, kws):
            assert_same(g, w, np.full(batch, string_bounds(t, f, kw["combiner"], kw["max_norm"])))

    run_both(want, got, compare, **(degenerate(np.zeros((1, 0))) if any(t.shape[1] == 0 for t in tabs)
                                    else empty_table(min(t.shape[0] for t in tabs))))


@given(strings=st.lists(BYTES, max_size=8), shape=st.sampled_from(["vector", "column"]))
def test_pack_strings(strings, shape):
    t = tf.constant(strings, tf.string, shape=[len(strings)])
    if shape == "column":
        t = tf.reshape(t, [-1, 1])
    data, splits = tco.pack_strings(t)
    assert data.dtype == tf.uint8 and splits.dtype == tf.int64
    assert bytes(data.numpy().tobytes()) == b"".join(strings)
    np.testing.assert_array_equal(splits.numpy(), np.cumsum([0] + [len(s) for s in strings]))
    # And the composition's view of the same bytes: substr of the packed buffer.
    if strings:
        joined = tf.strings.reduce_join(tf.constant(strings, tf.string))
        pieces = tf.strings.substr(joined, splits[:-1], splits[1:] - splits[:-1])
        assert pieces.numpy().tolist() == strings


# ---------------------------------------------------------------------------
# Gradients


def _grads(fn, params, wv):
    params = tf.convert_to_tensor(params)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(params)
        if wv is not None:
            tape.watch(wv)
        out = fn(params, wv)
        upstream = tf.cast(tf.reshape(tf.range(tf.size(out)) % 7 - 3, tf.shape(out)), out.dtype) / 2
        loss = tf.reduce_sum(out * upstream)
    gp = tape.gradient(loss, params)
    gw = None if wv is None else tape.gradient(loss, wv)
    return out, gp, gw


@given(data=st.data())
def test_lookup_gradients(data):
    """d/dparams (IndexedSlices) and d/dweights of the id lookups equal TF's gradients of the compositions."""
    op = data.draw(st.sampled_from(["embedding_lookup_sparse", "safe_embedding_lookup_sparse", "sparse_embedding",
                                    "hash_embedding"]))
    params = data.draw(tables(min_vocab=1, min_dim=1))
    vocab = params.shape[0]
    bag_ids = data.draw(bags(vocab, *I64))
    if op != "hash_embedding":
        # Gradients are compared where both forwards succeed: keep ids that
        # TF's Gather accepts (negative ids are dropped by the safe variant).
        lo = -3 if op == "safe_embedding_lookup_sparse" else 0
        bag_ids = [[i if lo <= i < vocab else i % vocab for i in b] for b in bag_ids]
    weighted = data.draw(st.booleans())
    # Weights up to 1e30 here: near FLT_MAX, TF's clip_by_norm backward
    # overflows in an intermediate (g / max(|x|, c) * c) where the fused one does not.
    bag_w = bag_weights(data.draw, bag_ids, GRAD_WEIGHTS) if weighted else None
    combiner = data.draw(st.sampled_from(COMBINERS))
    max_norm = data.draw(MAX_NORMS)
    batch = len(bag_ids)
    sp, sw = sparse_from_bags(bag_ids, tf.int64, bag_w)
    wv = None if sw is None else tf.identity(sw.values)

    def sparse_w(wv):
        return None if wv is None else tf.SparseTensor(sp.indices, wv, sp.dense_shape)

    def hashed(sp):
        return tf.SparseTensor(sp.indices, tf.strings.to_hash_bucket_fast(tf.strings.as_string(sp.values), vocab),
                               sp.dense_shape)

    kw = dict(combiner=combiner, max_norm=max_norm)
    fused, comp = {
        "embedding_lookup_sparse": (lambda p, w: tco.embedding_lookup_sparse(p, sp, sparse_w(w), **kw),
                                    lambda p, w: tf.nn.embedding_lookup_sparse(p, sp, sparse_w(w), **kw)),
        "safe_embedding_lookup_sparse": (lambda p, w: tco.safe_embedding_lookup_sparse(p, sp, sparse_w(w), **kw),
                                         lambda p, w: tf.nn.safe_embedding_lookup_sparse(p, sp, sparse_w(w), **kw)),
        "sparse_embedding": (lambda p, w: tco.sparse_embedding(p, sp, sparse_w(w), **kw),
                             lambda p, w: pooled_rows(p, sp, sparse_w(w), combiner, max_norm, batch)),
        "hash_embedding": (lambda p, w: tco.hash_embedding(p, sp, sparse_w(w), **kw),
                           lambda p, w: pooled_rows(p, hashed(sp), sparse_w(w), combiner, max_norm, batch)),
    }[op]
    try:
        want = _grads(comp, params, wv)
    except tf.errors.InvalidArgumentError:
        assume(False)  # the forward property covers failures
    got = _grads(fused, params, wv)
    assert isinstance(got[1], tf.IndexedSlices)
    if not np.isfinite(params).all():
        # inf/NaN table entries: the forward property compares the outputs;
        # the gradients differ where TF's 0 * inf in a zero-denominator bag
        # makes a NaN that the fused backward (div_no_nan: zero) does not.
        return
    w_or_1 = bag_w or [[1.0] * len(b) for b in bag_ids]
    safe = op == "safe_embedding_lookup_sparse"
    prune = safe and combiner != "sum" and weighted
    keep = [[(i >= 0 or not safe) and (not prune or w > 0) for i, w in zip(b, ws)]
            for b, ws in zip(bag_ids, w_or_1)]
    bounds = row_bounds(params, w_or_1, keep, combiner, max_norm)
    assert_same(got[0], want[0], bounds[:want[0].shape[0]])
    scale = float(np.max(bounds, initial=1e-6)) * max(len(b) for b in bag_ids + [[0]]) * 10
    assert_same(got[1], want[1], np.full(vocab, scale), rtol=1e-4, nonfinite_as_one=True)
    if weighted:
        assert_same(got[2], want[2], weight_grad_bounds(params, bag_w, keep, combiner, max_norm), rtol=1e-4,
                    nonfinite_as_one=True)


def weight_grad_bounds(params, bag_w, keep, combiner, max_norm, upstream=1.5):
    """Per-weight tolerance of d/dw: the two terms of (g.e_i - g.out) / W cancel,
    each as large as |g| P / W (times sum|w| / W for the second)."""
    p = float(np.abs(params).max(initial=0.0))
    if max_norm is not None:
        p = min(p, max_norm)
    out = []
    for ws, ks in zip(bag_w, keep):
        fin = np.array([w for w, k in zip(ws, ks) if k and np.isfinite(w)], np.float64)
        den = {"sum": 1.0, "mean": abs(fin.sum()), "sqrtn": math.sqrt((fin ** 2).sum())}[combiner]
        amp = (1.0 + np.abs(fin).sum() / den) / den if den > 0 else 1.0
        out += [1e-5 * (len(ws) + 1) * upstream * p * amp + 1e-6] * len(ws)
    return np.array(out)


@given(data=st.data())
def test_string_gradients(data):
    """d/dparams of string_embedding and multi_string_embedding (grouped, or
    concatenated) equal TF's gradient of the composition."""
    params = data.draw(tables(max_vocab=30, min_vocab=1, min_dim=1))
    vocab = params.shape[0]
    delimiter = data.draw(DELIMITERS)
    strings = data.draw(id_strings(vocab, delimiter))
    batch = len(strings)
    kw = dict(delimiter=delimiter, combiner=data.draw(st.sampled_from(COMBINERS)),
              id_mode=data.draw(st.sampled_from(["hash", "index", "mod"])), skip_empty=data.draw(st.booleans()),
              max_norm=data.draw(MAX_NORMS))
    multi = data.draw(st.sampled_from(["single", "multi", "concat"]))
    try:
        want = _grads(lambda p, _: string_composition(strings, p, batch=batch, **kw), params, None)
    except (tf.errors.InvalidArgumentError, UnicodeDecodeError):
        assume(False)
    if multi != "single":
        other = tf.constant(np.ones((3, 2), np.float32))

        def fused(p, _):
            # The other feature first: under concat, this one's columns start at 2.
            outs = tco.multi_string_embedding(
                [tf.constant([b"1"] * batch, tf.string), tf.constant(strings, tf.string, shape=[batch])], [other, p],
                delimiters=[",", kw["delimiter"]], combiners=kw["combiner"], id_modes=["hash", kw["id_mode"]],
                skip_empty=kw["skip_empty"], max_norms=[None, kw["max_norm"]], concat=multi == "concat")
            return outs[:, 2:] if multi == "concat" else outs[1]
    else:
        def fused(p, _):
            return tco.string_embedding(tf.constant(strings, tf.string, shape=[batch]), p, **kw)
    got = _grads(fused, params, None)
    assert isinstance(got[1], tf.IndexedSlices)
    if not np.isfinite(params).all():
        return  # as in test_lookup_gradients
    atol = string_bounds(params, strings, kw["combiner"], kw["max_norm"])
    assert_same(got[0], want[0], np.full(batch, atol))
    assert_same(got[1], want[1], np.full(vocab, atol * max(batch, 1) * 10), rtol=1e-4)

"""Differential tests of StringEmbedding against the TF string compositions it replaces."""

import csv

import numpy as np
import pytest
import tensorflow as tf

import tf_ctr_ops as tco
from tf_ctr_ops import _core
from conftest import data_file

COMBINERS = ["sum", "mean", "sqrtn"]
MODES = ["hash", "index", "mod"]


def composition(strings, params, delimiter=",", combiner="mean", id_mode="hash", skip_empty=True, max_norm=None):
    """The TF-native chain: split, convert, safe lookup."""
    strings = tf.convert_to_tensor(strings)
    tokens = tf.strings.split(strings, delimiter)
    if skip_empty:
        tokens = tf.ragged.boolean_mask(tokens, tf.not_equal(tokens, ""))
    vocab = params.shape[0]
    if id_mode == "hash":
        ids = tf.strings.to_hash_bucket_fast(tokens, vocab)
    else:
        ids = tf.strings.to_number(tokens, tf.int64)
        if id_mode == "mod":
            ids = tf.math.floormod(ids, vocab)
        else:
            # Index mode replaces the lookup whose Gather rejects ids outside
            # [0, V) (tf.nn.embedding_lookup_sparse): negative ids are errors,
            # not pruned as the safe variant would.
            tf.debugging.assert_non_negative(ids.values)
    sp = ids.to_sparse()
    sp = tf.SparseTensor(sp.indices, sp.values, [tf.shape(strings, out_type=tf.int64)[0], sp.dense_shape[1]])
    return tf.nn.safe_embedding_lookup_sparse(params, sp, None, combiner=combiner, max_norm=max_norm)


def composition_or_error(*args, **kw):
    try:
        return composition(*args, **kw)
    except (tf.errors.InvalidArgumentError, ValueError):
        return None


def assert_matches(strings, params, **kw):
    want = composition_or_error(strings, params, **kw)
    if want is None:
        with pytest.raises(tf.errors.InvalidArgumentError):
            tco.string_embedding(strings, params, **kw)
        return None
    got = tco.string_embedding(strings, params, **kw)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    return got


def random_id_strings(rng, batch, vocab, max_tokens=8, delimiter=","):
    out = []
    for _ in range(batch):
        n = rng.integers(0, max_tokens + 1)
        out.append(delimiter.join(str(v) for v in rng.integers(0, vocab, size=n)))
    return out


@pytest.fixture
def params(rng):
    return tf.constant(rng.normal(size=(1000, 8)).astype(np.float32))


@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("id_mode", MODES)
@pytest.mark.parametrize("skip_empty", [True, False])
def test_random_strings_match_composition(rng, params, combiner, id_mode, skip_empty):
    strings = random_id_strings(rng, 64, 1000)
    if not skip_empty and id_mode != "hash":
        strings = [s for s in strings if s] or ["1"]
    assert_matches(strings, params, combiner=combiner, id_mode=id_mode, skip_empty=skip_empty)
    assert_matches(strings, params, combiner=combiner, id_mode=id_mode, skip_empty=skip_empty, max_norm=0.5)


TRICKY = [" 7 ", "+5", "-3", "", "0x10", "9223372036854775808", "9223372036854775807",
          "-9223372036854775808", "\t12\n", "1 2", "07", "-0", "+-1", "--1", "1e3", "3.0",
          "\xe9\xe8", "1\x00", "\x80\xff", "999", "1000", "abc"]


@pytest.mark.parametrize("id_mode", MODES)
@pytest.mark.parametrize("skip_empty", [True, False])
def test_tricky_tokens_one_by_one(params, id_mode, skip_empty):
    for tok in TRICKY:
        assert_matches([tok, "1"], params, id_mode=id_mode, skip_empty=skip_empty, combiner="sum")
        assert_matches([f"2,{tok},3"], params, id_mode=id_mode, skip_empty=skip_empty)


# Index and mod modes parse each token of 1 to 8 plain digits from one 8-byte
# load; other tokens, and those within 8 bytes of the buffer's end, take the
# general rules. Long strings put every tricky token where the fast parse
# sees it, next to digit-like bytes; a digit delimiter and a two-byte one
# give tokens whose neighbours in the load are digits.
NEAR_DIGITS = ["/", ":", "0/", "9:", "\xfa", "12\xff", "1\xfa9", "5 ", "+7", "007", "0000000", "1234567",
               "12345678", "999999999", "1000000", "0"]


@pytest.mark.parametrize("id_mode", ["index", "mod"])
@pytest.mark.parametrize("skip_empty", [True, False])
@pytest.mark.parametrize("delimiter", [",", "9", "3,"])
def test_fast_number_parse_agrees_with_general_rules(rng, id_mode, skip_empty, delimiter):
    params = tf.constant(rng.normal(size=(10_000, 4)).astype(np.float32))
    pad = ",".join(["123", "45", "6789", "1", "9999"])
    for tok in TRICKY + NEAR_DIGITS:
        for s in (f"{pad},{tok},{pad}", f"{tok},{pad}", f"{pad},{tok}", f"{pad},,{tok},,{pad},"):
            assert_matches([s.encode("latin-1"), pad], params, id_mode=id_mode, skip_empty=skip_empty,
                           combiner="sum", delimiter=delimiter)
    # Short strings back to back: a string's last token is followed in the
    # buffer by the next string's digits, which must not join it.
    short = ["1", "23", "", "456", "7,8", "0", "9999", "1234567", "12345678", "5,", ",6", "+1", "2 "]
    assert_matches(short * 3, params, id_mode=id_mode, skip_empty=skip_empty, combiner="sum", delimiter=delimiter)
    assert_matches([s for s in short if s and not s.startswith(",") and not s.endswith(",")], params,
                   id_mode=id_mode, skip_empty=skip_empty, combiner="mean", delimiter=delimiter)
    digits = [str(v) for v in rng.integers(0, 10_000, size=400)]
    strings = [",".join(digits[i:i + rng.integers(0, 40)]) for i in range(0, 400, 7)]
    assert_matches(strings, params, id_mode=id_mode, skip_empty=skip_empty, combiner="sqrtn",
                   delimiter=delimiter)


def test_bytes_above_0x7f_and_nul_hash(params):
    raw = [b"\x80\xff,\x00\x01", b"caf\xc3\xa9|x", b"\xff" * 70, b",,\x00,"]
    assert_matches(tf.constant(raw), params, id_mode="hash")
    assert_matches(tf.constant(raw), params, id_mode="hash", skip_empty=False)


@pytest.mark.parametrize("delimiter", [",", "|", "<>", "::", "\x01", "abc"])
@pytest.mark.parametrize("skip_empty", [True, False])
def test_delimiters(rng, params, delimiter, skip_empty):
    strings = random_id_strings(rng, 30, 1000, delimiter=delimiter)
    strings += [delimiter + "5", "5" + delimiter, delimiter * 3, delimiter + delimiter + "7" + delimiter,
                delimiter[:-1] if len(delimiter) > 1 else "8", "9" + delimiter[:1]]
    for mode in ("hash", "mod"):
        assert_matches(strings, params, delimiter=delimiter, id_mode=mode, skip_empty=skip_empty)


@pytest.mark.parametrize("id_mode", MODES)
def test_whole_string_tokens_equal_a_gather(rng, params, id_mode):
    """delimiter=None: a single-valued feature, as hash (or to_number) + Gather."""
    V = params.shape[0]
    strings = tf.constant([str(v) for v in rng.integers(-2000, 2000, size=200)] + ["7", "0", "a,b", " 5"])
    if id_mode != "hash":
        strings = tf.constant([str(v) for v in rng.integers(0, V, size=200)] + ["+5", " 7 ", "007"])
    if id_mode == "hash":
        want_ids = tf.strings.to_hash_bucket_fast(strings, V)
    else:
        want_ids = tf.math.floormod(tf.strings.to_number(strings, tf.int64), V)
    table = tf.Variable(params)
    with tf.GradientTape(persistent=True) as tape:
        got = tco.string_embedding(strings, table, delimiter=None, combiner="sum", id_mode=id_mode,
                                   skip_empty=False)
        want = tf.nn.embedding_lookup(table, want_ids)
        loss_got = tf.reduce_sum(got * got)
        loss_want = tf.reduce_sum(want * want)
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    np.testing.assert_allclose(tf.convert_to_tensor(tape.gradient(loss_got, table)).numpy(),
                               tf.convert_to_tensor(tape.gradient(loss_want, table)).numpy(), rtol=1e-6)
    grouped = tco.multi_string_embedding([strings, strings], [table, params], delimiters=[None, None],
                                         combiners="sum", id_modes=id_mode, skip_empty=False)
    for g in grouped:
        np.testing.assert_array_equal(g.numpy(), want.numpy())
    with pytest.raises(tf.errors.InvalidArgumentError, match="token 'x' in row 1"):
        tco.string_embedding(["1", "x"], params, delimiter=None, id_mode="index")
    with pytest.raises(tf.errors.InvalidArgumentError, match="token 'x' in row 1"):
        tco.multi_string_embedding([["1", "2"], ["1", "x"]], [params, params], delimiters=None, id_modes="index")
    # skip_empty: an empty string is a zero row rather than the bucket of "".
    row = tco.string_embedding(["", "x"], params, delimiter=None, combiner="sum", skip_empty=True)
    np.testing.assert_array_equal(row.numpy()[0], 0)
    np.testing.assert_array_equal(row.numpy()[1], tf.gather(params, tf.strings.to_hash_bucket_fast("x", V)).numpy())


@pytest.mark.parametrize("dim", [1, 15, 16, 20, 37, 64])
def test_widths_around_the_column_chunk(rng, dim):
    """CPU pooling sums 16 columns at a time in registers, then the rest one
    by one; single keys are copied a fixed distance behind their prefetch."""
    params = tf.constant(rng.normal(size=(300, dim)).astype(np.float32))
    strings = random_id_strings(rng, 100, 300, max_tokens=12)
    for combiner in ("sum", "sqrtn"):
        assert_matches(strings, params, combiner=combiner, id_mode="index")
    assert_matches(strings, params, combiner="mean", id_mode="hash", max_norm=0.7)
    for batch in (0, 1, 23, 24, 25, 49, 100):
        keys = tf.constant([str(v) for v in rng.integers(0, 300, size=batch)], dtype=tf.string)
        got = tco.string_embedding(keys, params, delimiter=None, combiner="sum", id_mode="hash")
        want = tf.gather(params, tf.strings.to_hash_bucket_fast(keys, 300))
        np.testing.assert_array_equal(got.numpy(), want.numpy().reshape(batch, dim))


def test_delimiter_longer_than_string_and_overlapping(params):
    assert_matches(["1", "", "aa"], params, delimiter="<<>>", id_mode="hash")
    assert_matches(["aaa", "aaaa", "a"], params, delimiter="aa", id_mode="hash", skip_empty=False)


def test_long_rows_and_zero_batch(rng, params):
    long_row = ",".join(str(v) for v in rng.integers(0, 1000, size=10_000))
    for mode in MODES:
        assert_matches([long_row, "", "3"], params, id_mode=mode, combiner="sqrtn")
    out = tco.string_embedding(tf.zeros([0], tf.string), params)
    assert out.shape == (0, 8)
    assert_matches(tf.zeros([0], tf.string), params)


def test_index_errors_name_row_and_token(params):
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"token '1000' in row 1 is id 1000, out of range \[0, 1000\)"):
        tco.string_embedding(["1,2", "3,1000"], params, id_mode="index")
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"token '7x' in row 0 is not an int64"):
        tco.string_embedding(["7x", "1"], params, id_mode="mod")
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"token '\\xff' in row 2"):
        tco.string_embedding(["1", "2", "\xff".encode("latin-1")], params, id_mode="index")


def test_bad_arguments(params):
    with pytest.raises(ValueError, match="delimiter"):
        tco.string_embedding(["1"], params, delimiter="")
    with pytest.raises(ValueError, match="at most 16 bytes"):
        tco.string_embedding(["1"], params, delimiter="x" * 17)
    with pytest.raises(ValueError, match="id_mode"):
        tco.string_embedding(["1"], params, id_mode="number")
    with pytest.raises(ValueError, match="combiner"):
        tco.string_embedding(["1"], params, combiner="max")
    with pytest.raises(TypeError):
        tco.string_embedding(tf.constant([1, 2]), params)
    with pytest.raises(ValueError, match="vector"):
        tco.string_embedding(tf.constant([["a", "b"]]), params)
    with pytest.raises(ValueError, match="equal length"):
        tco.multi_string_embedding([tf.constant(["1"])], [params, params])
    with pytest.raises(ValueError, match="one per feature"):
        tco.multi_string_embedding([tf.constant(["1"])] * 2, [params] * 2, delimiters=[",", "|", ";"])


def test_packed_input_and_pack_strings(params):
    strings = tf.constant(["12,7", "", "a\x00b", "3"])
    data, splits = tco.pack_strings(strings)
    assert data.dtype == tf.uint8 and splits.numpy().tolist() == [0, 4, 4, 7, 8]
    assert bytes(data.numpy()) == b"12,7a\x00b3"
    np.testing.assert_array_equal(tco.string_embedding((data, splits), params).numpy(),
                                  tco.string_embedding(strings, params).numpy())
    d1, s1 = tco.pack_strings(tf.constant([["x"], ["yz"]]))
    assert s1.numpy().tolist() == [0, 1, 3]
    # the grouped op packs its features itself: a pack was a Pack op's dtype error
    with pytest.raises(TypeError, match="packed strings are string_embedding's input"):
        tco.multi_string_embedding([(data, splits)], [params], id_modes="index")


def test_packed_pairs_of_other_dtypes_are_refused_by_name(params):
    # Splits of any dtype were cast to int64 (2.9 read as 2, True as 1, a
    # large uint64 as a negative value), and bytes of another dtype, or a
    # pair given as a list, went to a Pack op's unrelated dtype error.
    data, splits = tco.pack_strings(tf.constant(["1,2,3", "", "5", "7,,8"]))
    want = tco.string_embedding((data, splits), params, id_mode="index")
    for pair in ([data, splits], (data, tf.cast(splits, tf.int32))):
        np.testing.assert_array_equal(tco.string_embedding(pair, params, id_mode="index"), want)
    for bad_splits in (tf.constant([0.0, 2.9, 5.0, 10.0]), tf.constant([False, True]),
                       tf.constant([0, 2**63 + 5], tf.uint64)):
        with pytest.raises(TypeError, match=f"row_splits must be int32 or int64, got {bad_splits.dtype.name}"):
            tco.string_embedding((data, bad_splits), params, id_mode="index")
    with pytest.raises(TypeError, match="bytes must be uint8, as pack_strings gives them, got int8"):
        tco.string_embedding((tf.cast(data, tf.int8), splits), params)
    with pytest.raises(TypeError, match="packed strings are string_embedding's input"):
        tco.layers.StringEmbedding(10, 4)([data, splits])


def test_raw_op_rejects_bad_splits(params):
    from tf_ctr_ops.strings import _ops

    data = tf.constant([49, 44, 50], tf.uint8)
    for splits, pattern in (([0, 5], "outside"), ([-1, 2], "outside"), ([0, 2, 1, 3], "non-decreasing")):
        with pytest.raises(tf.errors.InvalidArgumentError, match=pattern):
            _ops.ctr_string_embedding(params=params, bytes=data, row_splits=tf.constant(splits, tf.int64),
                                      bag_splits=tf.zeros([0], tf.int64))
    # bag_splits split the strings: the message said row_splits and ids
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"bag_splits\[-1\] = 7 does not match the number of strings 1"):
        _ops.ctr_string_embedding(params=params, bytes=data, row_splits=tf.constant([0, 3], tf.int64),
                                  bag_splits=tf.constant([0, 7], tf.int64), bagged=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match="at least one row"):
        tco.string_embedding(["a"], tf.zeros([0, 4]))


@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("id_mode", MODES)
def test_gradient_matches_composition(rng, combiner, id_mode):
    params = tf.Variable(rng.normal(size=(50, 4)).astype(np.float32))
    strings = random_id_strings(rng, 20, 50) + ["", "3,3,3"]
    upstream = tf.constant(rng.normal(size=(len(strings), 4)).astype(np.float32))
    grads = []
    for fn in (tco.string_embedding, composition):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(fn(strings, params, combiner=combiner, id_mode=id_mode, max_norm=1.0) * upstream)
        grads.append(tape.gradient(loss, params))
    assert isinstance(grads[0], tf.IndexedSlices)
    np.testing.assert_allclose(tf.convert_to_tensor(grads[0]).numpy(), tf.convert_to_tensor(grads[1]).numpy(),
                               rtol=1e-5, atol=1e-5)


def test_multi_string_embedding_equals_per_feature(rng):
    tables = [tf.Variable(rng.normal(size=(v, d)).astype(np.float32)) for v, d in ((100, 4), (37, 8), (1000, 2))]
    feats = [tf.constant(random_id_strings(rng, 16, 100)), tf.constant(random_id_strings(rng, 16, 37, delimiter="|")),
             tf.constant(random_id_strings(rng, 16, 5000, delimiter="::"))]
    kw = dict(delimiters=[",", "|", "::"], combiners=["mean", "sum", "sqrtn"], id_modes=["index", "hash", "mod"])
    with tf.GradientTape() as tape:
        outs = tco.multi_string_embedding(feats, tables, **kw)
        loss = sum(tf.reduce_sum(o ** 2) for o in outs)
    multi_grads = tape.gradient(loss, tables)
    with tf.GradientTape() as tape:
        singles = [tco.string_embedding(f, t, delimiter=d, combiner=c, id_mode=m)
                   for f, t, d, c, m in zip(feats, tables, kw["delimiters"], kw["combiners"], kw["id_modes"])]
        loss = sum(tf.reduce_sum(o ** 2) for o in singles)
    single_grads = tape.gradient(loss, tables)
    for a, b in zip(outs, singles):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    for a, b in zip(multi_grads, single_grads):
        assert isinstance(a, tf.IndexedSlices)
        np.testing.assert_allclose(tf.convert_to_tensor(a).numpy(), tf.convert_to_tensor(b).numpy(), rtol=1e-6)


def test_multi_string_embedding_one_fused_op(rng):
    tables = [tf.constant(rng.normal(size=(10, 2)).astype(np.float32)) for _ in range(20)]

    @tf.function
    def f(*feats):
        return tco.multi_string_embedding(list(feats), tables)

    spec = [tf.TensorSpec([None], tf.string)] * 20
    types = [op.type for op in f.get_concrete_function(*spec).graph.get_operations()]
    assert types.count("CtrMultiStringEmbedding") == 1 and types.count("CtrPackStrings") == 1
    assert not {"StringSplitV2", "StringToNumber", "StringToHashBucketFast"} & set(types)


def test_multi_string_embedding_with_skewed_features(rng):
    """Single keys then long id lists: the CPU kernel splits the rows by bytes,
    so every row must still be pooled once, by the right feature's spec."""
    batch = 3000
    tables = [tf.constant(rng.normal(size=(v, 4)).astype(np.float32)) for v in (50, 60, 70, 500)]
    singles = [tf.constant([str(i) for i in rng.integers(0, 1000, size=batch)]) for _ in range(3)]
    lists = tf.constant(random_id_strings(rng, batch, 500, max_tokens=60, delimiter="|"))
    feats = singles + [lists]
    kw = dict(delimiters=[None, None, None, "|"], combiners=["sum", "sum", "mean", "sqrtn"],
              id_modes=["hash", "mod", "hash", "index"])
    outs = tco.multi_string_embedding(feats, tables, **kw)
    for i, (f, t) in enumerate(zip(feats, tables)):
        want = tco.string_embedding(f, t, delimiter=kw["delimiters"][i], combiner=kw["combiners"][i],
                                    id_mode=kw["id_modes"][i])
        np.testing.assert_array_equal(outs[i].numpy(), want.numpy(), err_msg=f"feature {i}")


def test_pack_strings_large_enough_for_the_pool(rng):
    """Packs of more than about 2 MB are copied on the intra-op pool."""
    lengths = rng.integers(0, 40, size=150_000)
    alphabet = np.frombuffer(b"0123456789abcdef|", dtype=np.uint8)
    strings = [bytes(alphabet[rng.integers(0, len(alphabet), size=n)]) for n in lengths]
    halves = [tf.constant(strings[:70_000]), tf.constant(strings[70_000:])]
    data, splits = tf_ctr_ops_raw_pack(halves)
    assert bytes(data.numpy()) == b"".join(strings)
    np.testing.assert_array_equal(splits.numpy(), np.concatenate([[0], np.cumsum(lengths)]))


def test_multi_errors_name_the_feature(params):
    with pytest.raises(tf.errors.InvalidArgumentError, match="feature 1: token 'x' in row 0"):
        tco.multi_string_embedding([tf.constant(["1"]), tf.constant(["x"])], [params, params], id_modes="index")


def test_multi_features_must_share_a_batch(params):
    with pytest.raises(ValueError, match="share one batch size"):
        tco.multi_string_embedding([tf.constant(["1", "2"]), tf.constant(["3"])], [params, params])

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)] * 2)
    def grouped(a, b):
        return tco.multi_string_embedding([a, b], [params, params], id_modes="index")

    # 3 strings in all: no batch split would be wrong silently.
    with pytest.raises(tf.errors.InvalidArgumentError, match="feature 1 holds 4 strings where feature 0 holds 2"):
        grouped(tf.constant(["1", "2"]), tf.constant(["3", "4", "5", "6"]))
    a, b = grouped(tf.constant(["1", "2,3"]), tf.constant(["4", ""]))
    np.testing.assert_allclose(b.numpy(), tco.string_embedding(["4", ""], params, id_mode="index").numpy())


def test_pack_strings_of_several_vectors():
    data, splits = tf_ctr_ops_raw_pack([tf.constant(["ab", ""]), tf.constant("c"), tf.constant([], tf.string)])
    assert bytes(data.numpy()) == b"abc"
    assert splits.numpy().tolist() == [0, 2, 2, 3]


def tf_ctr_ops_raw_pack(vectors):
    from tf_ctr_ops.ops import _ops
    return _ops.ctr_pack_strings(vectors)[:2]


def test_core_module_matches_tf_op(rng, params):
    strings = random_id_strings(rng, 40, 1000) + ["", ",,"]
    data, splits = tco.pack_strings(strings)
    for mode in MODES:
        want = tco.string_embedding(strings, params, id_mode=mode, combiner="sqrtn", max_norm=2.0).numpy()
        got = _core.string_embedding(params.numpy(), data.numpy(), splits.numpy(), id_mode=mode, combiner="sqrtn",
                                     max_norm=2.0)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="token 'x' in row 1"):
        _core.string_embedding(params.numpy(), np.frombuffer(b"1x", np.uint8), np.array([0, 1, 2]), id_mode="index")


@pytest.mark.parametrize("default_id", [None, 7])
@pytest.mark.parametrize("combiner", COMBINERS)
def test_skip_negative_and_default_id_are_the_safe_lookup(rng, params, combiner, default_id):
    """invalid_ids="skip_negative" prunes negative ids and default_id fills bags
    left empty, as tf.nn.safe_embedding_lookup_sparse does."""
    strings = [",".join(str(v) for v in rng.integers(-50, 1000, size=rng.integers(0, 6))) for _ in range(60)]
    strings += ["-1", "-3,-4", "", "0"]
    sp = tf.compat.v1.string_split(strings, ",")
    ids = tf.SparseTensor(sp.indices, tf.strings.to_number(sp.values, tf.int64), sp.dense_shape)
    p = tf.Variable(params)
    with tf.GradientTape(persistent=True) as tape:
        want = tf.nn.safe_embedding_lookup_sparse(p, ids, None, combiner=combiner, default_id=default_id)
        got = tco.string_embedding(strings, p, id_mode="index", combiner=combiner, invalid_ids="skip_negative",
                                   default_id=default_id)
        upstream = tf.constant(rng.normal(size=got.shape).astype(np.float32))
        loss_want, loss_got = tf.reduce_sum(want * upstream), tf.reduce_sum(got * upstream)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tf.convert_to_tensor(tape.gradient(loss_got, p)),
                               tf.convert_to_tensor(tape.gradient(loss_want, p)), rtol=1e-5, atol=1e-6)
    # Ids past the table are still errors; negative ones are errors by default.
    with pytest.raises(tf.errors.InvalidArgumentError, match="token '1000' in row 0"):
        tco.string_embedding(["1000"], params, id_mode="index", invalid_ids="skip_negative")
    with pytest.raises(tf.errors.InvalidArgumentError, match="token '-1' in row 0"):
        tco.string_embedding(["-1"], params, id_mode="index")
    with pytest.raises(ValueError, match="invalid_ids"):
        tco.string_embedding(["1"], params, invalid_ids="skip")
    with pytest.raises(tf.errors.InvalidArgumentError, match="default_id 1000 is out of range"):
        tco.string_embedding(["1"], params, id_mode="index", default_id=1000)


def test_unit_bag_weights_are_the_count_as_tf_divides_by_it():
    """n unit weights sum to float32(n), past 2^24 too, as TF's
    SparseSegmentMean / SqrtN divide by the count of the segment; adding 1.0
    n times in float32 would stop at 2^24 (2^24 + 1 rounds back to it)."""
    for n in (0, 1, 2, 3, 1000, 2**24 - 1, 2**24, 2**24 + 1, 3 * 2**24, 10**12):
        want = float(np.float32(n))
        assert _core.unit_bag_weights(n) == (want, want), n


@pytest.mark.huge
@pytest.mark.parametrize("combiner", ["mean", "sqrtn"])
def test_a_bag_of_more_than_2_to_24_ids_is_divided_by_its_count(combiner):
    # The bag's rows sum to exactly 1.0; its count, 3 * 2^24, is a float32.
    n = 3 * 2**24
    params = tf.constant([[1.0], [0.0]])
    ids = np.ones(n, np.int64)
    ids[0] = 0
    segments = np.zeros(n, np.int32)
    reference = {"mean": tf.sparse.segment_mean, "sqrtn": tf.sparse.segment_sqrt_n}[combiner]
    with tf.GradientTape() as tape:
        tape.watch(params)
        want = reference(params, ids, segments)
    want_grad = tf.convert_to_tensor(tape.gradient(want, params))
    with tf.GradientTape() as tape:
        tape.watch(params)
        got = tco.sparse_embedding(params, tf.RaggedTensor.from_row_lengths(ids, [n]), combiner=combiner)
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    np.testing.assert_allclose(tf.convert_to_tensor(tape.gradient(got, params)).numpy(), want_grad.numpy(),
                               rtol=1e-6)
    packed = b"0" + b",1" * (n - 1)
    np.testing.assert_array_equal(tco.string_embedding([packed], params, id_mode="index", combiner=combiner).numpy(),
                                  want.numpy())


def test_core_module_safe_options_match_tf_op(rng, params):
    strings = [",".join(str(v) for v in rng.integers(-20, 1000, size=rng.integers(0, 5))) for _ in range(30)]
    data, splits = tco.pack_strings(strings)
    want = tco.string_embedding(strings, params, id_mode="index", invalid_ids="skip_negative", default_id=3).numpy()
    got = _core.string_embedding(params.numpy(), data.numpy(), splits.numpy(), id_mode="index",
                                 invalid_ids="skip_negative", default_id=3)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    hashed = [f"k{i}" for i in range(40)]
    data, splits = tco.pack_strings(hashed)
    want = tf.gather(params, tf.strings.to_hash_bucket_fast(hashed, 100)).numpy()
    got = _core.string_embedding(params.numpy(), data.numpy(), splits.numpy(), delimiter=b"", combiner="sum",
                                 num_buckets=100)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_hash_embedding_string_keys(rng, params):
    keys = tf.ragged.constant([["05db9164", "", "a"], [], ["x" * 100]])
    ref = tf.nn.safe_embedding_lookup_sparse(params, tf.strings.to_hash_bucket_fast(keys, 1000).to_sparse(), None)
    np.testing.assert_allclose(tco.hash_embedding(params, keys).numpy(), ref.numpy(), rtol=1e-6)
    dense = tf.constant([["a", ""], ["", ""]])
    ref = tf.nn.safe_embedding_lookup_sparse(
        params, tf.strings.to_hash_bucket_fast(tf.ragged.constant([["a"], []]), 1000).to_sparse(), None,
        combiner="sum")
    np.testing.assert_allclose(tco.hash_embedding(params, dense, combiner="sum").numpy(), ref.numpy(), rtol=1e-6)


# ---------------------------------------------------------------------------
# Real CTR samples


def read_csv(name):
    with open(data_file(name), newline="") as f:
        return list(csv.DictReader(f))


def test_movielens_genres_hash(params):
    rows = read_csv("movielens_sample.txt")
    genres = [r["genres"] for r in rows]
    assert any("|" in g for g in genres)
    for combiner in COMBINERS:
        assert_matches(genres, params, delimiter="|", id_mode="hash", combiner=combiner)


def test_movielens_watched_ids_index(rng):
    rows = read_csv("movielens_sample.txt")
    per_user = {}
    for r in rows:
        per_user.setdefault(r["user_id"], []).append(r["movie_id"])
    strings = [",".join(v) for v in per_user.values()]
    vocab = max(int(m) for r in rows for m in [r["movie_id"]]) + 1
    params = tf.constant(rng.normal(size=(vocab, 8)).astype(np.float32))
    for combiner in COMBINERS:
        assert_matches(strings, params, id_mode="index", combiner=combiner)


def test_criteo_hex_categories_hash(params):
    rows = read_csv("criteo_sample.txt")
    cats = [f"C{i}" for i in range(1, 27)]
    for c in cats:
        values = [r[c] for r in rows]
        assert_matches(values, params, id_mode="hash", combiner="sum")
    # All 26 categories of a row as one delimited string, and through the grouped op.
    joined = [",".join(r[c] for c in cats) for r in rows]
    assert_matches(joined, params, id_mode="hash", combiner="mean")
    outs = tco.multi_string_embedding([tf.constant([r[c] for r in rows]) for c in cats], [params] * 26)
    for c, out in zip(cats, outs):
        want = composition([r[c] for r in rows], params)
        np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


def test_criteo_hex_categories_hash_embedding(params):
    rows = read_csv("criteo_sample.txt")
    keys = tf.constant([[r[f"C{i}"] for i in range(1, 27)] for r in rows])
    ragged = tf.RaggedTensor.from_tensor(keys)
    want = tf.nn.safe_embedding_lookup_sparse(params, tf.strings.to_hash_bucket_fast(ragged, 1000).to_sparse(), None)
    np.testing.assert_allclose(tco.hash_embedding(params, ragged).numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------
# Raw-op attributes the Grappler rewrite relies on


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_one_token_bags_pass_the_gradient_on(rng, params, combiner):
    """One token a string (and the default row of an empty one): the params
    gradient's values are the upstream gradient, one row per string."""
    V = params.shape[0]
    ids = rng.integers(0, V, size=300)
    strings = [str(v) for v in ids]
    strings[123] = ""
    table = tf.Variable(params)
    upstream = tf.constant(rng.normal(size=(300, params.shape[1])).astype(np.float32))
    with tf.GradientTape() as tape:
        got = tco.string_embedding(strings, table, combiner=combiner, id_mode="index", invalid_ids="skip_negative",
                                   default_id=5)
        loss = tf.reduce_sum(got * upstream)
    grad = tape.gradient(loss, table)
    want_indices = ids.copy()
    want_indices[123] = 5
    np.testing.assert_array_equal(grad.indices.numpy(), want_indices)
    np.testing.assert_array_equal(grad.values.numpy(), upstream.numpy())
    np.testing.assert_array_equal(got.numpy(), tf.gather(params, want_indices).numpy())


def test_trim_empty_tail_matches_plain_embedding_lookup_sparse(rng, params):
    from tf_ctr_ops.strings import _ops

    strings = tf.constant(["1,2", "", "3,,4", "", ""])
    data, splits = tco.pack_strings(strings)
    table = tf.Variable(params)
    with tf.GradientTape() as tape:
        got = _ops.ctr_string_embedding(params=table, bytes=data, row_splits=splits, bag_splits=tf.zeros([0], tf.int64),
                                        id_mode="index", combiner="sqrtn", trim_empty_tail=True)
        loss = tf.reduce_sum(got ** 2)
    g_fused = tape.gradient(loss, table)
    sp = tf.compat.v1.string_split(strings, ",")
    with tf.GradientTape() as tape:
        want = tf.nn.embedding_lookup_sparse(table, tf.SparseTensor(sp.indices, tf.strings.to_number(sp.values, tf.int64),
                                                                    sp.dense_shape), None, combiner="sqrtn")
        loss = tf.reduce_sum(want ** 2)
    g_ref = tape.gradient(loss, table)
    assert got.shape == want.shape == (3, 8)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(tf.convert_to_tensor(g_fused).numpy(), tf.convert_to_tensor(g_ref).numpy(),
                               rtol=1e-5, atol=1e-6)
    empty = _ops.ctr_string_embedding(params=params, bytes=data[:0], row_splits=tf.zeros([3], tf.int64),
                                      bag_splits=tf.zeros([0], tf.int64), trim_empty_tail=True)
    assert empty.shape == (0, 8)


def test_num_buckets_differs_from_table_rows(params):
    from tf_ctr_ops.strings import _ops

    strings = tf.constant(["a,b", "c", "zz"])
    data, splits = tco.pack_strings(strings)
    tokens = tf.strings.split(strings, ",")
    got = _ops.ctr_string_embedding(params=params, bytes=data, row_splits=splits, bag_splits=tf.zeros([0], tf.int64),
                                    num_buckets=50)
    want = tf.nn.safe_embedding_lookup_sparse(params, tf.strings.to_hash_bucket_fast(tokens, 50).to_sparse(), None)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)
    small = params[:3]
    buckets = tf.strings.to_hash_bucket_fast(tokens.flat_values, 1000).numpy()
    assert (buckets >= 3).any()
    with pytest.raises(tf.errors.InvalidArgumentError, match="out of range"):
        _ops.ctr_string_embedding(params=small, bytes=data, row_splits=splits, bag_splits=tf.zeros([0], tf.int64),
                                  num_buckets=1000)


def test_lookup_num_buckets_differs_from_table_rows(rng, params):
    from tf_ctr_ops.ops import _ops

    keys = tf.constant([5, 17, -3, 123456], tf.int64)
    got = _ops.ctr_embedding_lookup(params=params, ids=keys, segments=tf.constant([0, 2, 4], tf.int64),
                                    num_rows=tf.constant(-1, tf.int64), weights=tf.zeros([0]), segment_kind="row_splits",
                                    id_mode="hash", num_buckets=40, combiner="sum")
    buckets = tf.strings.to_hash_bucket_fast(tf.strings.as_string(keys), 40)
    want = tf.math.segment_sum(tf.gather(params, buckets), [0, 0, 1, 1])
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)


# The CPU split works on 32-byte chunks (a delimiter mask per chunk, as a GPU
# warp splits): delimiters straddling chunk boundaries, overlapping matches of
# a repetitive delimiter, and strings ending at the end of the packed buffer
# (whose last chunk is copied out before it is read) must split as TF does.
@pytest.mark.parametrize("delimiter", [",", "aa", "aba", "||", "<sep>"])
@pytest.mark.parametrize("skip_empty", [True, False])
def test_chunked_split_agrees_with_tf(rng, params, delimiter, skip_empty):
    alphabet = sorted(set(delimiter)) + ["x", "7"]
    strings = ["".join(rng.choice(alphabet, size=rng.integers(0, 150))) for _ in range(60)]
    strings += [delimiter * k for k in (1, 2, 11, 40)]
    for last in range(0, 70, 3):  # the buffer's last string, of every length around one and two chunks
        tail = "".join(rng.choice(alphabet, size=last))
        assert_matches(strings + [tail], params, delimiter=delimiter, id_mode="hash", skip_empty=skip_empty,
                       combiner="sum")
    assert_matches(strings, params, delimiter=delimiter, id_mode="hash", skip_empty=skip_empty, combiner="sqrtn")


@pytest.mark.parametrize("dtype", [np.float16, tf.bfloat16.as_numpy_dtype])
def test_a_half_tables_gradient_is_as_close_as_tfs_over_many_tokens(rng, dtype):
    """A row per token, summed in half precision by a dense use, drifted
    far from the exact gradient where an id has many tokens; the gradient
    has a row per distinct id, summed in float32, as TF's composition does."""
    vocab, dim = 100, 4
    strings = tf.constant([",".join(map(str, rng.integers(0, vocab, 5000))), "1,2", "3"])
    table, upstream = rng.normal(size=(vocab, dim)), rng.normal(size=(3, dim))

    def gradient(lookup, table_dtype):
        t = tf.Variable(table.astype(table_dtype))
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.cast(lookup(t), tf.float64) * upstream)
        return tape.gradient(loss, t)

    ids = tf.strings.to_number(tf.strings.split(strings, ","), tf.int64).to_sparse()
    theirs = lambda t: tf.nn.safe_embedding_lookup_sparse(t, ids, combiner="sum")
    ours = lambda t: tco.string_embedding(strings, t, id_mode="index", combiner="sum")
    exact = tf.convert_to_tensor(gradient(theirs, np.float64)).numpy()
    got = gradient(ours, dtype)
    assert got.values.shape[0] == len(np.unique(got.indices.numpy()))
    error = np.abs(tf.cast(tf.convert_to_tensor(got), tf.float64).numpy() - exact).max()
    tf_error = np.abs(tf.cast(tf.convert_to_tensor(gradient(theirs, dtype)), tf.float64).numpy() - exact).max()
    assert error <= 1.5 * tf_error, (error, tf_error)


def test_sparse_string_keys_out_of_row_order_are_a_clear_error():
    table = tf.reshape(tf.range(40.0), [20, 2])
    keys = tf.SparseTensor([[1, 0], [0, 0], [0, 1]], tf.constant(["x", "y", "z"]), [2, 2])
    with pytest.raises(tf.errors.InvalidArgumentError, match="row ids must be sorted"):
        tco.hash_embedding(table, keys, combiner="sum")
    np.testing.assert_array_equal(tco.hash_embedding(table, tf.sparse.reorder(keys), combiner="sum"),
                                  tf.nn.safe_embedding_lookup_sparse(
                                      table, tf.SparseTensor(keys.indices, tf.strings.to_hash_bucket_fast(
                                          keys.values, 20), [2, 2]), combiner="sum"))


@pytest.mark.parametrize("case", [([[0, 0], [5, 0]], r"row id 5 of entry 1 is out of range \[0, 2\)"),
                                  ([[0, 0], [-1, 0]], r"row id -1 of entry 1 is out of range \[0, 2\)"),
                                  ([[1, 0], [0, 0]], "row ids must be sorted: entry 1 has row 0 after row 1")])
def test_sparse_string_keys_outside_the_batch_or_out_of_order_name_the_entry_and_row(case):
    # As the integer keys' errors do; the string keys' said only "a row id is
    # outside the batch" (eagerly), or dumped an Assert's data in a function.
    indices, message = case
    table = tf.reshape(tf.range(40.0), [20, 2])
    for key_dtype in (tf.string, tf.int64):
        values = tf.constant(["x", "y"]) if key_dtype == tf.string else tf.constant([3, 4], tf.int64)
        keys = tf.SparseTensor(indices, values, [2, 3])
        spec = tf.SparseTensorSpec([None, None], key_dtype)
        for lookup in (lambda k: tco.hash_embedding(table, k), tf.function(lambda k: tco.hash_embedding(table, k),
                                                                           input_signature=[spec])):
            with pytest.raises(tf.errors.InvalidArgumentError, match=message):
                lookup(keys)


def test_gradient_of_the_weights_of_sparse_string_keys_is_tfs():
    # The weights went through the bags' check op, which has no gradient.
    idx = [[0, 0], [0, 1], [2, 0]]
    keys = tf.SparseTensor(idx, tf.constant(["a", "b", "c"]), [3, 4])
    table = tf.Variable(tf.reshape(tf.range(40.0), [20, 2]))
    weights = tf.Variable([1.0, 2.0, 3.0])
    hashed = tf.SparseTensor(idx, tf.strings.to_hash_bucket_fast(keys.values, 20), [3, 4])

    def gradients(lookup):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(lookup(tf.SparseTensor(idx, weights * 1.0, [3, 4]))))
        return [tf.convert_to_tensor(g) for g in tape.gradient(loss, [table, weights])]

    for combiner in ("sum", "mean", "sqrtn"):
        want = gradients(lambda w: tf.nn.embedding_lookup_sparse(table, hashed, w, combiner=combiner))
        for got in (gradients(lambda w: tco.hash_embedding(table, keys, w, combiner=combiner)),
                    tf.function(lambda: gradients(lambda w: tco.hash_embedding(table, keys, w, combiner=combiner)))()):
            for g, w in zip(got, want):
                np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-6)


def test_packed_bytes_of_partial_splits_with_a_sharded_table():
    # Splits that cover part of the buffer (one string: byte 2 of "1,234").
    table = np.arange(20, dtype=np.float32).reshape(10, 2)
    data, _ = tco.pack_strings(tf.constant(["1,2", "3", "4"]))
    packed = (data, tf.constant([2, 3], tf.int64))
    want = tco.string_embedding(packed, tf.constant(table), id_mode="index")
    np.testing.assert_array_equal(want, [[4.0, 5.0]])
    got = tco.string_embedding(packed, [tf.Variable(table[:5]), tf.Variable(table[5:])], id_mode="index")
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("spec", [tf.TensorSpec(None, tf.string), tf.TensorSpec([None, None], tf.string)])
def test_strings_of_a_shape_known_only_at_run_time_are_checked_then(spec):
    table = tf.constant(np.arange(26, dtype=np.float32).reshape(13, 2))
    f = tf.function(lambda s: tco.string_embedding(s, table, id_mode="index"), input_signature=[spec])
    want = tco.string_embedding(tf.constant(["1,2", "3"]), table, id_mode="index")
    np.testing.assert_array_equal(f(tf.constant([["1,2"], ["3"]])), want)
    if spec.shape.rank is None:
        np.testing.assert_array_equal(f(tf.constant(["1,2", "3"])), want)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"strings must be a vector \[B\] \(or \[B, 1\]\)"):
        f(tf.constant([["1", "2"]]))


def _fed_unchecked(fn, spec, value):
    """Runs fn's graph with `value` fed as a model server feeds it: by name,
    not held to the signature's shape (the placeholder's shape cleared)."""
    from tensorflow.python.eager import wrap_function

    cf = tf.function(fn).get_concrete_function(spec)
    graph_def = cf.graph.as_graph_def()
    for node in graph_def.node:
        if node.op == "Placeholder":
            node.attr["shape"].shape.Clear()
            node.attr["shape"].shape.unknown_rank = True
            node.attr.pop("_output_shapes", None)
    captures = {internal.op.name: external for external, internal in cf.graph.captures}
    inputs = [t.name for t in cf.inputs[:len(cf.inputs) - len(captures)]]
    return wrap_function.function_from_graph_def(graph_def, inputs, [t.name for t in cf.outputs], captures)(value)


@pytest.mark.parametrize("spec_shape, feed", [([None], [["1", "2"], ["3", "4"]]), ([None], "1,2"),
                                              ([None, 1], [[["1"]], [["2"]]])])
def test_a_feed_of_another_rank_than_the_signature_is_refused_at_run_time(params, spec_shape, feed):
    # A [B] signature fed [2, 2] by a model server pooled 4 bags for 2 rows.
    for fn in (lambda s: tco.string_embedding(s, params), tco.layers.StringEmbedding(10, 4)):
        with pytest.raises(tf.errors.InvalidArgumentError):
            _fed_unchecked(fn, tf.TensorSpec(spec_shape, tf.string), tf.constant(feed))
    good = tf.constant(["1,2", "3"]) if spec_shape == [None] else tf.constant([["1,2"], ["3"]])
    [got] = _fed_unchecked(lambda s: tco.string_embedding(s, params), tf.TensorSpec(spec_shape, tf.string), good)
    np.testing.assert_array_equal(got, tco.string_embedding(good, params))


def test_a_grouped_tables_error_names_its_feature():
    with pytest.raises(tf.errors.InvalidArgumentError, match="feature 1: hash and mod modes need a table"):
        tco.multi_string_embedding([tf.constant(["a"]), tf.constant(["b"])], [tf.ones([4, 2]), tf.ones([0, 2])],
                                   id_modes="hash")


@pytest.mark.parametrize("max_norm", [-1.0, 0.5])
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_gradient_op_lists_a_zero_row_for_each_empty_bag_in_bag_order(rng, combiner, max_norm):
    # What TF's safe lookup's gradient lists for a bag it filled with
    # empty_grad_row and zeroed: that row, zero, where the bag stands. A row
    # outside the table lists nothing; default_id keeps its own row.
    from tf_ctr_ops.strings import _ops

    params = tf.constant(rng.normal(size=[6, 3]), tf.float32)
    data, splits = tco.pack_strings(tf.constant(["1,2", "", "3", ",", "4,4"]))
    grad = tf.constant(rng.normal(size=[5, 3]), tf.float32)

    def rows(**attrs):
        values, indices = _ops.ctr_string_embedding_grad(
            grad=grad, params=params, bytes=data, row_splits=splits, bag_splits=tf.zeros([0], tf.int64),
            combiner=combiner, id_mode="index", max_norm=max_norm, **attrs)
        return values.numpy(), indices.numpy()

    plain_values, plain_indices = rows()
    np.testing.assert_array_equal(plain_indices, [1, 2, 3, 4, 4])
    values, indices = rows(empty_grad_row=5)
    np.testing.assert_array_equal(indices, [1, 2, 5, 3, 5, 4, 4])
    np.testing.assert_array_equal(values[[2, 4]], np.zeros([2, 3]))
    np.testing.assert_array_equal(values[[0, 1, 3, 5, 6]], plain_values)
    np.testing.assert_array_equal(rows(empty_grad_row=6)[1], plain_indices)
    default_values, default_indices = rows(empty_grad_row=5, default_id=0)
    np.testing.assert_array_equal(default_indices, [1, 2, 0, 3, 0, 4, 4])
    assert np.abs(default_values[2]).sum() > 0

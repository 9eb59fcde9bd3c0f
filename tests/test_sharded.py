"""ShardedVariable tables (ParameterServerStrategy's partitioned variables):
the drop-ins and sparse_embedding gather each shard's rows from the shard and
pool them in one fused op, never concatenating the shards, and agree with
TF's own lookups on the same ShardedVariable, forward and per-shard gradients."""

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.distribute import sharded_variable

import tf_ctr_ops as tco

COMBINERS = ["sum", "mean", "sqrtn"]
V, D = 23, 4


def sharded(rng, sizes=(8, 8, 7), dim=D):
    table = rng.normal(size=(sum(sizes), dim)).astype(np.float32)
    starts = np.cumsum((0,) + sizes)
    return sharded_variable.ShardedVariable([tf.Variable(table[a:b]) for a, b in zip(starts[:-1], starts[1:])])


def random_ids(rng, rows, dtype=tf.int64, negatives=False):
    lengths = rng.integers(0, 5, size=rows)
    values = rng.integers(-3 if negatives else 0, V, size=int(lengths.sum()))
    return tf.RaggedTensor.from_row_lengths(tf.constant(values, dtype), lengths).to_sparse()


def weights_like(rng, sp):
    return tf.SparseTensor(sp.indices, tf.constant(rng.uniform(-0.5, 2.0, size=sp.values.shape), tf.float32),
                           sp.dense_shape)


def assert_same_gradients(got, want):
    for g, w in zip(got, want):
        assert isinstance(g, tf.IndexedSlices), type(g)  # each shard gets rows of its own
        # The rows a sparse optimizer updates are TF's (their order may differ).
        assert set(g.indices.numpy()) == set(w.indices.numpy()), (g.indices, w.indices)
        np.testing.assert_allclose(tf.convert_to_tensor(g).numpy(), tf.convert_to_tensor(w).numpy(),
                                   rtol=1e-5, atol=1e-6)


def assert_same_as_one_table(table, whole, lookup):
    """lookup(table) on the ShardedVariable (or list of shards) equals lookup(whole) on one
    variable holding its rows: forward, and each shard's IndexedSlices
    gradient is its slice of the whole table's."""
    with tf.GradientTape(persistent=True) as tape:
        got, want = lookup(table), lookup(whole)
        loss_got, loss_want = tf.reduce_sum(got * got), tf.reduce_sum(want * want)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    if not got.shape[0]:
        return
    shards = table if isinstance(table, list) else table.variables
    grads = tape.gradient(loss_got, shards)
    assert all(isinstance(g, tf.IndexedSlices) for g in grads if g is not None)
    per_shard = np.concatenate([np.zeros(v.shape, np.float32) if g is None else tf.convert_to_tensor(g).numpy()
                                for g, v in zip(grads, shards)])
    np.testing.assert_allclose(per_shard, tf.convert_to_tensor(tape.gradient(loss_want, whole)).numpy(),
                               rtol=1e-5, atol=1e-6)


def run_both(table, ours, theirs):
    with tf.GradientTape(persistent=True) as tape:
        got, want = ours(table), theirs(table)
        loss_got, loss_want = tf.reduce_sum(got * got), tf.reduce_sum(want * want)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    if got.shape[0]:
        assert_same_gradients(tape.gradient(loss_got, table.variables), tape.gradient(loss_want, table.variables))


@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("rows", [0, 1, 40, 2000])
def test_embedding_lookup_sparse_matches_tf_on_shards(rng, combiner, weighted, dtype, rows):
    table, sp = sharded(rng), random_ids(rng, rows, dtype)
    w = weights_like(rng, sp) if weighted else None
    run_both(table, lambda t: tco.embedding_lookup_sparse(t, sp, w, combiner=combiner),
             lambda t: tf.nn.embedding_lookup_sparse(t, sp, w, combiner=combiner))


@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("default_id", [None, 0, 17])
def test_safe_embedding_lookup_sparse_matches_tf_on_shards(rng, combiner, weighted, default_id):
    table, sp = sharded(rng), random_ids(rng, 60, negatives=True)
    w = weights_like(rng, sp) if weighted else None
    run_both(table, lambda t: tco.safe_embedding_lookup_sparse(t, sp, w, combiner=combiner, default_id=default_id),
             lambda t: tf.nn.safe_embedding_lookup_sparse(t, sp, w, combiner=combiner, default_id=default_id))


V1_LOOKUPS = {"plain": (tco.compat.v1.embedding_lookup_sparse, tf.compat.v1.nn.embedding_lookup_sparse, {}),
              "safe": (tco.compat.v1.safe_embedding_lookup_sparse, tf.compat.v1.nn.safe_embedding_lookup_sparse, {}),
              "safe default_id": (tco.compat.v1.safe_embedding_lookup_sparse,
                                  tf.compat.v1.nn.safe_embedding_lookup_sparse, {"default_id": 17})}


@pytest.mark.parametrize("strategy", ["mod", "div"])
@pytest.mark.parametrize("lookup", V1_LOOKUPS)
def test_v1_lookups_read_the_shards_in_their_partition_strategy_as_tf(rng, strategy, lookup):
    # TF's dispatch hands a ShardedVariable's shards on as a list with the
    # caller's partition_strategy; the safe v1 drop-in read them as "div".
    ours, theirs, kw = V1_LOOKUPS[lookup]
    table, sp = sharded(rng), random_ids(rng, 60, negatives=lookup != "plain")
    w = weights_like(rng, sp)
    run_both(table, lambda t: ours(t, sp, w, partition_strategy=strategy, **kw),
             lambda t: theirs(t, sp, w, partition_strategy=strategy, **kw))


@pytest.mark.parametrize("default_id", [V, 40, -4])
def test_a_default_id_past_the_shards_fails_only_on_an_empty_row(rng, default_id):
    table = sharded(rng)
    full = tf.RaggedTensor.from_row_lengths(tf.constant(rng.integers(0, V, size=12), tf.int64), [3, 1, 4, 4])
    run_both(table, lambda t: tco.safe_embedding_lookup_sparse(t, full.to_sparse(), None, default_id=default_id),
             lambda t: tf.nn.safe_embedding_lookup_sparse(t, full.to_sparse(), None, default_id=default_id))
    empty = tf.ragged.constant([[1, 2], [-1], [3]], tf.int64).to_sparse()  # row 1 keeps no id
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.nn.safe_embedding_lookup_sparse(table, empty, None, default_id=default_id)
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"default_id {default_id} for empty row 1 is out of"):
        tco.safe_embedding_lookup_sparse(table, empty, None, default_id=default_id)


def test_max_norm_and_uneven_shards(rng):
    table, sp = sharded(rng, sizes=(12, 11)), random_ids(rng, 50)
    run_both(table, lambda t: tco.embedding_lookup_sparse(t, sp, None, combiner="mean", max_norm=0.7),
             lambda t: tf.nn.embedding_lookup_sparse(t, sp, None, combiner="mean", max_norm=0.7))


@pytest.mark.parametrize("in_function", [False, True])
@pytest.mark.parametrize("as_list", [False, True])
def test_ids_outside_the_table_name_row_and_id(rng, in_function, as_list):
    """Eager and in a tf.function (whose Grappler pass once turned the check,
    a stateless op read only through a control edge, into a NoOp: such ids
    were then skipped unsaid), on a ShardedVariable and a list of shards."""
    table = sharded(rng)
    if as_list:
        table = list(table.variables)
    sp = tf.SparseTensor([[0, 0], [2, 0], [2, 1]], tf.constant([3, 5, V], tf.int64), [3, 2])

    def run(fn):
        return tf.function(fn)() if in_function else fn()

    in_row_2 = f"id {V} in row 2 is out of range \\[0, {V}\\)"
    for lookup, message in [
            (lambda: tco.embedding_lookup_sparse(table, sp, None), in_row_2),
            (lambda: tco.safe_embedding_lookup_sparse(table, sp, None, default_id=2), in_row_2),
            (lambda: tco.sparse_embedding(table, tf.constant([[3, -1], [5, V]], tf.int64)),
             f"id {V} in row 1 is out of range"),
            (lambda: tco.string_embedding(tf.constant(["3", f"5,{V}"]), table, id_mode="index"),
             f"token '{V}' in row 1 is id {V}, out of range")]:
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            run(lookup)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"token 'x7' in row 1 is not an int64 number"):
        run(lambda: tco.string_embedding(tf.constant(["1", "3,x7"]), table, id_mode="index"))


@pytest.mark.parametrize("as_list", [False, True])
def test_constant_ids_without_an_empty_bag_build_in_a_function(rng, as_list):
    """Ids known when the graph is built, no bag left empty: the fill row's
    branch (taken only for an empty bag) still builds, and the result is
    one table's."""
    table = sharded(rng)
    shards = list(table.variables) if as_list else table
    whole = tf.concat([v.numpy() for v in table.variables], 0)
    ids = tf.ragged.constant([[1, 22, 9], [16]], dtype=tf.int64)
    for lookup in (lambda t: tco.safe_embedding_lookup_sparse(t, ids, None),
                   lambda t: tco.safe_embedding_lookup_sparse(t, ids, None, default_id=2),
                   lambda t: tco.string_embedding(tf.constant(["1,22,9", "16"]), t, id_mode="index", default_id=0)):
        np.testing.assert_allclose(tf.function(lambda: lookup(shards))().numpy(), lookup(whole).numpy(),
                                   rtol=1e-5, atol=1e-6)


def test_shards_are_never_concatenated(rng):
    table = sharded(rng)

    @tf.function
    def lookup(sp):
        return tco.safe_embedding_lookup_sparse(table, sp, None, combiner="sqrtn")

    graph = lookup.get_concrete_function(tf.SparseTensorSpec([None, None], tf.int64)).graph
    ops = [op.type for op in graph.get_operations()]
    # A gather per shard (shard 0's row 0, which a bag left empty lists in the
    # gradient as TF fills it with id 0, is among the unique ids gathered);
    # no shard is read whole, and only gathered rows are concatenated.
    assert ops.count("ResourceGather") == 3, ops
    reads = [op for op in graph.get_operations() if op.type == "ReadVariableOp"]
    assert reads == [], reads
    concats = [op for op in graph.get_operations() if op.type == "ConcatV2"]
    assert all(i.op.type != "ReadVariableOp" for op in concats for i in op.inputs), concats
    sp = random_ids(rng, 30, negatives=True)
    np.testing.assert_allclose(lookup(sp).numpy(), tf.nn.safe_embedding_lookup_sparse(table, sp, None,
                                                                                       combiner="sqrtn").numpy(),
                               rtol=1e-5, atol=1e-6)


def test_sparse_embedding_on_shards_is_the_one_table_lookup(rng):
    table = sharded(rng)
    whole = tf.concat([v.numpy() for v in table.variables], 0)
    ids = tf.ragged.constant([[1, 22], [], [-1, 9, 9], [16]], dtype=tf.int64)
    for container in (ids, ids.to_sparse(), ids.to_tensor(-1)):
        np.testing.assert_allclose(tco.sparse_embedding(table, container, combiner="sqrtn").numpy(),
                                   tco.sparse_embedding(whole, container, combiner="sqrtn").numpy(), rtol=1e-6)
    with pytest.raises(tf.errors.InvalidArgumentError, match="id -2 in row 0"):
        tco.sparse_embedding(table, tf.constant([[-2, 1]], tf.int64))


def test_shards_off_the_div_layout_are_refused(rng):
    table = sharded(rng, sizes=(5, 18))
    with pytest.raises(ValueError, match="do not follow the layout"):
        tco.embedding_lookup_sparse(table, random_ids(rng, 4), None)


@pytest.mark.parametrize("as_list", [False, True], ids=["sharded_variable", "list"])
def test_ids_that_int64_does_not_hold_are_refused_as_on_one_table(rng, as_list):
    # The shards' path cast ids to int64 before any check: 1.7 read row 1,
    # 2**64 - 1 became a dropped -1, and float keys were hashed as "1.700000".
    table = sharded(rng)
    table = list(table.variables) if as_list else table
    floats = tf.ragged.constant([[1.7, 2.2], [9.9]], tf.float32)
    for lookup in (lambda ids: tco.sparse_embedding(table, ids, combiner="sum"),
                   lambda ids: tco.safe_embedding_lookup_sparse(table, ids, None, combiner="sum"),
                   lambda ids: tco.embedding_lookup_sparse(table, ids, None, combiner="sum")):
        with pytest.raises(TypeError, match="ids must be integers that int64 holds .*got float32"):
            lookup(floats)
        with pytest.raises(TypeError, match="ids must be integers that int64 holds .*got uint64"):
            lookup(tf.ragged.constant([[2**64 - 1, 3]], tf.uint64))
    for keys in (floats, tf.constant([[1.7, 2.0]]), tf.constant([[True, False]]), tf.constant([[2**64 - 1]], tf.uint64)):
        with pytest.raises(TypeError, match="keys must be strings or integers that int64 holds"):
            tco.hash_embedding(table, keys)


@pytest.mark.parametrize("kind", ["int-ragged", "int-sparse", "int-dense", "string-ragged", "string-dense"])
@pytest.mark.parametrize("weighted", [False, True])
def test_hash_embedding_on_shards_is_the_one_table_lookup(rng, kind, weighted):
    table = sharded(rng)
    whole = tf.Variable(tf.concat([v.numpy() for v in table.variables], 0))
    ids = tf.ragged.constant([[1, 22, 10**12], [], [-7, 9, 9], [16]], dtype=tf.int64)
    keys = tf.strings.as_string(ids) if kind.startswith("string") else ids
    w = tf.ragged.constant([[0.5, 2.0, 1.0], [], [1.0, -1.0, 3.0], [0.25]]) if weighted else None
    if kind.endswith("sparse"):
        keys, w = keys.to_sparse(), None if w is None else w.to_sparse()
    elif kind.endswith("dense"):
        keys = keys.to_tensor("" if kind.startswith("string") else -1)
        w = None if w is None else w.to_tensor(0.0)
    assert_same_as_one_table(table, whole, lambda t: tco.hash_embedding(t, keys, w, combiner="sqrtn"))


def test_hash_embedding_never_reads_a_shard_whole(rng):
    table = sharded(rng)

    @tf.function
    def lookup(ids):
        return tco.hash_embedding(table, ids, combiner="mean")

    graph = lookup.get_concrete_function(tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1)).graph
    ops = [op.type for op in graph.get_operations()]
    assert ops.count("ResourceGather") == 3, ops  # a gather per shard; no read of one (below)
    assert "ReadVariableOp" not in ops, ops


# ---------------------------------------------------------------------------
# string_embedding: the fused op checks the strings on a [V, 0] view, TF's
# split and parse give the ids, and each shard is gathered on its own.


def random_id_strings(rng, rows, delimiter=",", negatives=False):
    """Strings of 0-4 ids (one in ten is an empty token, as "1,,2" has), the
    odd one padded with spaces, as to_number takes them."""
    out = []
    for _ in range(rows):
        tokens = [str(v) for v in rng.integers(-3 if negatives else 0, V, size=rng.integers(0, 5))]
        tokens = ["" if rng.random() < 0.1 else (f" {t} " if rng.random() < 0.1 else t) for t in tokens]
        out.append(delimiter.join(tokens))
    return tf.constant(out if out else np.zeros([0], object), tf.string)


@pytest.mark.parametrize("id_mode", ["hash", "index", "mod"])
@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("rows", [0, 1, 60])
def test_string_embedding_on_shards_is_the_one_table_lookup(rng, id_mode, combiner, rows):
    table = sharded(rng)
    whole = tf.Variable(tf.concat([v.numpy() for v in table.variables], 0))
    strings = random_id_strings(rng, rows)
    assert_same_as_one_table(table, whole,
                             lambda t: tco.string_embedding(strings, t, combiner=combiner, id_mode=id_mode))


@pytest.mark.parametrize("options", [
    dict(delimiter="||", skip_empty=False, id_mode="hash"),
    dict(delimiter=None, id_mode="hash"),
    dict(delimiter=None, skip_empty=False, id_mode="hash"),
    dict(invalid_ids="skip_negative", id_mode="index", default_id=20),
    dict(invalid_ids="skip_negative", id_mode="index", max_norm=0.7, combiner="sum"),
    dict(id_mode="mod", default_id=3, combiner="sqrtn"),
])
def test_string_embedding_options_on_shards(rng, options):
    table = sharded(rng)
    whole = tf.concat([v.numpy() for v in table.variables], 0)
    delimiter = options.get("delimiter", ",")
    strings = random_id_strings(rng, 50, delimiter or ",", negatives=options["id_mode"] != "index"
                                or "invalid_ids" in options)
    if delimiter is None:
        strings = tf.concat([strings, tf.constant(["", "7", "a,b"])], 0)
    np.testing.assert_allclose(tco.string_embedding(strings, table, **options).numpy(),
                               tco.string_embedding(strings, whole, **options).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rows", [0, 1, 60])
def test_packed_strings_on_shards_are_the_one_table_lookup(rng, rows):
    table = sharded(rng)
    whole = tf.Variable(tf.concat([v.numpy() for v in table.variables], 0))
    numbers = tco.pack_strings(random_id_strings(rng, rows))
    assert_same_as_one_table(table, whole, lambda t: tco.string_embedding(numbers, t, id_mode="mod"))
    # Every byte value, the delimiter among them, survives the unpacking.
    strings = tf.concat([random_id_strings(rng, rows), tf.constant([bytes(range(256)), b"", b"3,\x00,4"])[:rows]], 0)
    packed = tco.pack_strings(strings)
    assert_same_as_one_table(table, whole, lambda t: tco.string_embedding(packed, t, id_mode="hash"))
    np.testing.assert_array_equal(tco.string_embedding(packed, table).numpy(),
                                  tco.string_embedding(strings, table).numpy())


def test_string_embedding_on_shards_fails_as_on_one_table(rng):
    table = sharded(rng)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"token 'x7' in row 1 "):
        tco.string_embedding(tf.constant(["1,2", "3,x7"]), table, id_mode="index")
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"token '23' in row 0 is id 23, out of range"):
        tco.string_embedding(tf.constant(["23"]), table, id_mode="index")
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"token 'x7' in row 1 "):
        tco.string_embedding(tco.pack_strings(tf.constant(["1,2", "3,x7"])), table, id_mode="index")
    data, splits = tco.pack_strings(tf.constant(["1,2", "3"]))
    with pytest.raises(tf.errors.InvalidArgumentError):  # splits past the bytes: the fused op's check
        tco.string_embedding((data, splits + 1), table)


def test_string_embeddings_never_read_a_shard_whole(rng):
    table = sharded(rng)

    @tf.function
    def lookup(strings):
        return (tco.string_embedding(strings, table, id_mode="mod"),
                tco.multi_string_embedding([strings, strings], [table, table], id_modes="hash", concat=True))

    graph = lookup.get_concrete_function(tf.TensorSpec([None], tf.string)).graph
    ops = [op.type for op in graph.get_operations()]
    assert ops.count("ResourceGather") == 3 * 3 and "ReadVariableOp" not in ops, ops
    strings = random_id_strings(rng, 20)
    whole = tf.concat([v.numpy() for v in table.variables], 0)
    single, grouped = lookup(strings)
    np.testing.assert_allclose(single.numpy(), tco.string_embedding(strings, whole, id_mode="mod").numpy(),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grouped.numpy(), tco.multi_string_embedding([strings, strings], [whole, whole],
                                                                          concat=True).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["sparse", "hash", "string-index", "multi-string"])
def test_a_list_of_shards_is_gathered_shard_by_shard(rng, op):
    """Our own lookups read a list of variables in the "div" layout as they
    read a ShardedVariable: each shard's rows gathered from it, never a
    shard read whole, and the result and gradients of one table."""
    shards = list(sharded(rng).variables)
    whole = tf.Variable(tf.concat([v.numpy() for v in shards], 0))
    ids = tf.ragged.constant([[1, 22, 9], [], [9, 16, 0, 8]], dtype=tf.int64)
    strings = random_id_strings(rng, 30)
    lookup = {
        "sparse": lambda t: tco.sparse_embedding(t, ids.to_tensor(-1), combiner="sqrtn"),
        "hash": lambda t: tco.hash_embedding(t, ids, combiner="sum"),
        "string-index": lambda t: tco.string_embedding(strings, t, id_mode="index", max_norm=0.9),
        "multi-string": lambda t: tco.multi_string_embedding([strings, strings], [t, t], id_modes=["hash", "mod"],
                                                             concat=True),
    }[op]
    graph = tf.function(lambda: lookup(shards)).get_concrete_function().graph
    op_types = [o.type for o in graph.get_operations()]
    assert "ReadVariableOp" not in op_types and op_types.count("ResourceGather") >= len(shards), op_types
    assert_same_as_one_table(shards, whole, lookup)


@pytest.mark.parametrize("wrap", [lambda f: f(), lambda f: tf.function(f)()], ids=["eager", "tf.function"])
@pytest.mark.parametrize("concat", [False, True])
def test_grouped_string_errors_name_the_feature_beside_a_sharded_table(rng, wrap, concat):
    # The grouped op pools the plain table and checks the sharded one's
    # strings on a [V, 0] view: the error is the grouped op's, feature first.
    table = sharded(rng)
    whole = tf.concat([v.numpy() for v in table.variables], 0)
    good, bad = tf.constant(["1,2", ""]), tf.constant(["3", "4,-1"])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"feature 1: token '-1' in row 1 is id -1"):
        wrap(lambda: tco.multi_string_embedding([good, bad], [whole, table], id_modes="index", concat=concat))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"feature 0: token '-1' in row 1 is id -1"):
        wrap(lambda: tco.multi_string_embedding([bad, good], [table, whole], id_modes="index", concat=concat))


@pytest.mark.parametrize("combiner", COMBINERS)
def test_safe_lookup_lists_shard_0_row_0_for_empty_bags_as_tf(rng, combiner):
    """TF fills a bag left empty with id 0 and zeroes its output: shard 0's
    gradient lists its row 0 (zeros) although no bag names id 0."""
    lengths = np.array([2, 0, 3, 0, 1])
    values = rng.integers(1, V, size=int(lengths.sum()))
    sp = tf.RaggedTensor.from_row_lengths(tf.constant(values, tf.int64), lengths).to_sparse()
    table = sharded(rng)
    with tf.GradientTape(persistent=True) as tape:
        got = tco.safe_embedding_lookup_sparse(table, sp, None, combiner=combiner)
        want = tf.nn.safe_embedding_lookup_sparse(table, sp, None, combiner=combiner)
    grads = tape.gradient(got, table.variables), tape.gradient(want, table.variables)
    assert 0 in grads[1][0].indices.numpy()
    assert_same_gradients(*grads)


def one_table_lookups():
    vocab = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(tf.constant(["a", "b"]),
                                                                          tf.constant([0, 1], tf.int64)), -1)
    keys = tf.ragged.constant([["a"], ["b", "a"]]).to_sparse()
    ids = tf.ragged.constant([[1, 2], [3]], tf.int64).to_sparse()
    return {"vocab_embedding_lookup_sparse": lambda t: tco.vocab_embedding_lookup_sparse(vocab, keys, t),
            "bucketized_embedding_lookup": lambda t: tco.bucketized_embedding_lookup(t, tf.constant([[0.5]]), [1.0]),
            "cross_embedding_lookup": lambda t: tco.cross_embedding_lookup(t, [ids, ids], V)}


@pytest.mark.parametrize("op", one_table_lookups())
def test_one_table_lookups_refuse_a_sharded_variable_naming_themselves(rng, op):
    # They read one table: TF's conversion of the ShardedVariable failed with
    # "Converting ShardedVariable to tensor in embedding lookup ops is disallowed".
    with pytest.raises(TypeError, match=f"{op} gathers from one table; a ShardedVariable"):
        one_table_lookups()[op](sharded(rng))
    assert one_table_lookups()[op](tf.Variable(rng.normal(size=(V, D)).astype(np.float32))).shape[-1] == D

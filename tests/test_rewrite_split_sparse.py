"""CtrFusionOptimizer on strings split into a SparseTensor and looked up:

- tf.nn.embedding_lookup_sparse / safe_embedding_lookup_sparse over
  tf.strings.to_number(tf.strings.split(s, sep), tf.int64).to_sparse() or
  to_hash_bucket_fast(...) (the RaggedTensor route, issue form 1);
- the same over tf.compat.v1.string_split (TF1, issue form 2), safe too.

Each becomes one CtrStringEmbedding over CtrPackStrings, and gives what the
TF-native graph gives: trimmed trailing rows for embedding_lookup_sparse,
every row (zeros or default_id) for the safe lookup, negative ids pruned by
the safe lookup, and the same errors for bad tokens.
"""

import numpy as np
import pytest
import tensorflow as tf

import tf_ctr_ops  # noqa: F401  (registers the ops and the optimizer)
from tf_ctr_ops import rewrite
from test_rewrite import offline as offline_specs, read_csv, run_graph_def

V, D = 50, 6
COMBINERS = ("sum", "mean", "sqrtn")
STRINGS = tf.TensorSpec([None], tf.string)
SPLIT_OPS = {"StringSplit", "StringSplitV2", "StringToNumber", "StringToHashBucketFast", "RaggedTensorToSparse",
             "SparseReshape", "SparseReorder", "CtrEmbeddingLookup", "Unique", "SparseFillEmptyRows"}


@pytest.fixture
def table(rng):
    return tf.Variable(rng.normal(size=(V, D)).astype(np.float32))


def sparse_ids(strings, route, convert, sep=","):
    """The SparseTensor of ids the user builds from the strings."""
    if route == "ragged":
        tokens = tf.strings.split(strings, sep)
        ids = tf.strings.to_number(tokens, tf.int64) if convert == "number" else tf.strings.to_hash_bucket_fast(tokens, V)
        return ids.to_sparse()
    sp = tf.compat.v1.string_split(strings, sep)
    values = tf.strings.to_number(sp.values, tf.int64) if convert == "number" else tf.strings.to_hash_bucket_fast(sp.values, V)
    return tf.SparseTensor(sp.indices, values, sp.dense_shape)


def model(table, route, convert, lookup, combiner="mean", sep=","):
    def f(strings):
        ids = sparse_ids(strings, route, convert, sep)
        if lookup == "plain":
            return tf.nn.embedding_lookup_sparse(table, ids, None, combiner=combiner)
        default_id = 3 if lookup == "safe_default" else None
        return tf.nn.safe_embedding_lookup_sparse(table, ids, None, combiner=combiner, default_id=default_id)

    return f


def random_strings(rng, route, convert, lookup, rows=40):
    """Id lists with empty rows (and empty trailing rows), negative ids where
    the lookup prunes them, and tokens valid for the route."""
    out = []
    for _ in range(rows):
        n = rng.integers(0, 5)
        if n == 0 and route == "ragged" and convert == "number":
            n = 1  # "" splits into one empty token, which to_number rejects
        ids = rng.integers(-5 if lookup != "plain" else 0, V, size=n)
        out.append(",".join(str(i) if convert == "number" else f"k{i}" for i in ids))
    if not (route == "ragged" and convert == "number"):
        out[-2:] = ["", ""]  # trailing empty rows: embedding_lookup_sparse drops them
    return out


def offline(fn):
    return offline_specs(fn, STRINGS)


def run_online(fn, *args):
    """Runs fn under rewrite.enable(); the result and how many rewrites fired."""
    before = rewrite.fusion_stats()
    with rewrite.enable():
        out = tf.function(fn)(*args)
    return out, rewrite.fusion_stats()["rewrites"] - before["rewrites"]


def assert_close(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("lookup", ["plain", "safe", "safe_default"])
@pytest.mark.parametrize("convert", ["number", "hash"])
@pytest.mark.parametrize("route", ["ragged", "tf1"])
def test_split_to_sparse_lookup_becomes_string_embedding(rng, table, route, convert, lookup):
    for combiner in COMBINERS:
        f = model(table, route, convert, lookup, combiner)
        cf, graph, report, counts = offline(f)
        assert report["match"][-1]["pattern"] == "string_split_lookup", report
        assert report["match"][-1]["fused_op"] == "CtrStringEmbedding"
        assert counts.get("CtrStringEmbedding") == 1 and counts.get("CtrPackStrings") == 1, counts
        assert not SPLIT_OPS & set(counts), counts
        [node] = [n for n in graph.node if n.op == "CtrStringEmbedding"]
        assert node.attr["trim_empty_tail"].b == (lookup == "plain")
        assert node.attr["invalid_ids"].s == (b"skip_negative" if lookup != "plain" and convert == "number"
                                              else b"error")
        strings = tf.constant(random_strings(rng, route, convert, lookup))
        want = f(strings)
        [got] = run_graph_def(cf, graph, strings)
        assert_close(got, want)
        got, rewrites = run_online(f, strings)
        assert rewrites >= 2  # the lookup, then the split
        assert_close(got, want)


@pytest.mark.parametrize("lookup", ["plain", "safe"])
@pytest.mark.parametrize("route", ["ragged", "tf1"])
def test_batch_of_zero_and_all_empty(table, route, lookup):
    f = model(table, route, "hash", lookup)
    cf, graph, report, counts = offline(f)
    assert counts.get("CtrStringEmbedding") == 1
    cases = [[], ["", ""], ["a"]] if route == "tf1" or lookup != "plain" else [[], ["a"]]
    for strings in cases:
        s = tf.constant(strings, tf.string)
        [got] = run_graph_def(cf, graph, s)
        assert_close(got, f(s))


@pytest.mark.parametrize("route", ["ragged", "tf1"])
def test_bad_tokens_stay_errors(table, route):
    """A token to_number rejects, and an id past the table, fail both ways."""
    for lookup in ("plain", "safe"):
        f = model(table, route, "number", lookup)
        cf, graph, report, counts = offline(f)
        assert counts.get("CtrStringEmbedding") == 1
        for bad in (["1,x"], ["1", str(V)]):
            with pytest.raises(tf.errors.InvalidArgumentError):
                f(tf.constant(bad))
            with pytest.raises(tf.errors.InvalidArgumentError):
                run_graph_def(cf, graph, tf.constant(bad))
    # Without the safe lookup's pruning, a negative id is out of range too.
    f = model(table, route, "number", "plain")
    with pytest.raises(tf.errors.InvalidArgumentError):
        run_online(f, tf.constant(["1,-2"]))


@pytest.mark.parametrize("route", ["ragged", "tf1"])
def test_gradient_under_enable_stays_exact(rng, table, route):
    """Training graphs: the backward pass reads the lookup's intermediates, so
    the optimizer leaves the form alone (with reasons) and TF's gradient stands."""
    strings = tf.constant(random_strings(rng, route, "hash", "safe"))
    upstream = tf.constant(rng.normal(size=(strings.shape[0], D)).astype(np.float32))

    def grad(s):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(table, route, "hash", "safe", "sqrtn")(s) * upstream)
        return loss, tf.convert_to_tensor(tape.gradient(loss, table))

    want = grad(strings)
    before = rewrite.fusion_stats()
    with rewrite.enable():
        got = tf.function(grad)(strings)
    stats = rewrite.fusion_stats()
    assert stats["rewrites"] == before["rewrites"] and stats["skips"] > before["skips"]
    assert_close(got[0], want[0])
    assert_close(got[1], want[1])


@pytest.mark.parametrize("lookup", ["plain", "safe"])
def test_criteo_hex_categories_by_hash_buckets(table, lookup):
    rows = read_csv("criteo_sample.txt")
    cats = tf.constant([",".join(r[f"C{i}"] for i in range(1, 27)) for r in rows])
    f = model(table, "ragged", "hash", lookup, "sum")
    got, rewrites = run_online(f, cats)
    assert rewrites >= 2
    assert_close(got, f(cats))


@pytest.mark.parametrize("route", ["ragged", "tf1"])
def test_movielens_genres(table, route):
    genres = tf.constant([r["genres"] for r in read_csv("movielens_sample.txt")])
    f = model(table, route, "hash", "safe", "sqrtn", sep="|")
    cf, graph, report, counts = offline(f)
    assert counts.get("CtrStringEmbedding") == 1 and not SPLIT_OPS & set(counts), counts
    [got] = run_graph_def(cf, graph, genres)
    assert_close(got, f(genres))


# ---------------------------------------------------------------------------
# Left alone, with a reason, and still exact


def also_values(table, route):
    def f(s):
        ids = sparse_ids(s, route, "hash")
        return tf.nn.safe_embedding_lookup_sparse(table, ids, None), ids.values

    return f


def also_dense_shape(table, route):
    def f(s):
        ids = sparse_ids(s, route, "hash")
        return tf.nn.safe_embedding_lookup_sparse(table, ids, None), ids.dense_shape

    return f


def maxsplit(table, route):
    def f(s):
        tokens = tf.strings.split(s, ",", maxsplit=1)
        return tf.nn.embedding_lookup_sparse(table, tf.strings.to_hash_bucket_fast(tokens, V).to_sparse(), None)

    return f


def int32_ids(table, route):
    def f(s):
        sp = tf.compat.v1.string_split(s, ",") if route == "tf1" else None
        if sp is None:
            return tf.nn.embedding_lookup_sparse(table, tf.strings.to_number(tf.strings.split(s, ","), tf.int32)
                                                 .to_sparse(), None)
        ids = tf.SparseTensor(sp.indices, tf.strings.to_number(sp.values, tf.int32), sp.dense_shape)
        return tf.nn.embedding_lookup_sparse(table, ids, None)

    return f


def v1_keeping_empty_tokens(table, route):
    # TF1's StringSplit gives "" no token even with skip_empty=False; the
    # fused op's skip_empty=False (tf.strings.split's) would hash one.
    def f(s):
        sp = tf.compat.v1.string_split(s, ",", skip_empty=False)
        ids = tf.SparseTensor(sp.indices, tf.strings.to_hash_bucket_fast(sp.values, V), sp.dense_shape)
        return tf.nn.safe_embedding_lookup_sparse(table, ids, None)

    return f


NOT_FUSED = [(route, case, reason) for route in ("ragged", "tf1")
             for case, reason in ((also_values, "another consumer"), (also_dense_shape, "another consumer"),
                                  (int32_ids, None))] + [("ragged", maxsplit, None)]  # TF1 has no maxsplit
NOT_FUSED += [("tf1", v1_keeping_empty_tokens, "skip_empty=false gives an empty string no token")]


@pytest.mark.parametrize("route,case,reason", NOT_FUSED)
def test_not_fused_and_still_exact(rng, table, route, case, reason):
    f = case(table, route)
    cf, graph, report, counts = offline(f)
    assert "CtrStringEmbedding" not in counts, counts
    if reason:
        assert any(reason in s["reason"] for s in report["skip"]), report["skip"]
    strings = tf.constant(["1,2,3", "4", "5,6"] + (["", "5,,6", ","] if case is v1_keeping_empty_tokens else []))
    got = run_graph_def(cf, graph, strings)
    for g, w in zip(got, tf.nest.flatten(f(strings))):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-6)



@pytest.mark.parametrize("default_id", [3, V + 3])
def test_a_rewritten_drop_in_keeps_tfs_default_id_rule(rng, table, default_id):
    # tco's safe lookup fails on a default_id past the table only where a row
    # is left empty, as TF does; whatever the rewrite fuses around it keeps that.
    def f(strings):
        ids = tf.strings.to_number(tf.strings.split(strings, ","), tf.int64)
        return tf_ctr_ops.safe_embedding_lookup_sparse(table, ids, None, default_id=default_id)

    def tf_f(strings):
        return tf.nn.safe_embedding_lookup_sparse(table, sparse_ids(strings, "ragged", "number"), None,
                                                  default_id=default_id)

    cf, graph, report, counts = offline(f)
    full = tf.constant([",".join(str(i) for i in rng.integers(0, V, size=rng.integers(1, 4))) for _ in range(30)])
    [got] = run_graph_def(cf, graph, full)
    assert_close(got, tf_f(full))
    got, _ = run_online(f, full)
    assert_close(got, tf_f(full))
    negative_only = tf.constant(["1,2", "-4", "3"])  # row 1 keeps no id
    if default_id < V:
        [got] = run_graph_def(cf, graph, negative_only)
        assert_close(got, tf_f(negative_only))
        return
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf_f(negative_only)
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"default_id {default_id} for empty row 1"):
        run_graph_def(cf, graph, negative_only)


def _any_rank_inputs(graph_def):
    """graph_def with its placeholders' declared shapes dropped: a model
    server feeds by name, and TF does not hold a feed to the signature's shape."""
    out = type(graph_def)()
    out.CopyFrom(graph_def)
    for node in out.node:
        if node.op == "Placeholder":
            node.attr["shape"].shape.unknown_rank = True
            node.attr["shape"].shape.ClearField("dim")
            node.attr.pop("_output_shapes", None)
    return out


@pytest.mark.parametrize("route", ["safe_lookup", "ragged_sum"])
def test_a_split_fused_away_still_refuses_strings_that_are_not_a_vector(table, route):
    # StringSplit refuses a [B, 1] feed; its pack flattened one and served it.
    def f(x):
        ids = tf.strings.to_hash_bucket_fast(tf.strings.split(x, "|"), table.shape[0])
        if route == "ragged_sum":
            return tf.reduce_sum(tf.gather(table, ids), axis=1)
        return tf.nn.safe_embedding_lookup_sparse(table, ids.to_sparse(), combiner="mean")

    cf, graph, report, counts = offline_specs(f, STRINGS)
    assert counts.get("CtrStringEmbedding") == 1 and not {"StringSplitV2"} & set(counts), counts
    good = tf.constant(["1|2", "", "3"])
    np.testing.assert_allclose(run_graph_def(cf, graph, good)[0], f(good), rtol=1e-6, atol=1e-6)
    column = tf.constant([["1|2"], ["3"]])
    for g in (cf.graph.as_graph_def(), graph):
        with pytest.raises(tf.errors.InvalidArgumentError, match="must be a vector|is not compatible with expected shape"):
            run_graph_def(cf, _any_rank_inputs(g), column)


@pytest.mark.parametrize("join", ["add_n", "concat"])
def test_split_columns_of_one_matrix_still_group_as_columns_behind_their_vector_checks(rng, join):
    # The split's vector check (an EnsureShape) hid the column slices from
    # group_strings: no group for add_n, three packed slices for concat.
    tables = [tf.Variable(rng.normal(size=(50, 4)).astype(np.float32)) for _ in range(3)]

    def feature(t, s):
        return tf.reduce_sum(tf.gather(t, tf.strings.to_hash_bucket_fast(tf.strings.split(s, "|"), 50)), axis=1)

    def f(x):
        fields = [feature(tables[i], x[:, i]) for i in range(3)]
        return tf.add_n(fields) if join == "add_n" else tf.concat(fields, 1)

    cf, graph, report, counts = offline_specs(f, tf.TensorSpec([None, 3], tf.string))
    assert "group_strings" in [m["pattern"] for m in report["match"]], report["skip"]
    assert counts.get("CtrPackStrings") == 1 and "StridedSlice" not in counts, counts
    # Left: x's own shape check (the vacuous vector checks of its columns go).
    assert [n.input for n in graph.node if n.op == "EnsureShape"] == [[cf.inputs[0].op.name]]
    x = tf.constant([["1|2", "", "a"], ["b|c|d", "e", "|"]])
    np.testing.assert_allclose(run_graph_def(cf, graph, x)[0], f(x), rtol=1e-6, atol=1e-6)

"""StringEmbedding: strings of delimited ids pooled in one fused op.

`"12,7,993"` -> split -> to_number / to_hash_bucket_fast -> lookup -> pool,
done in one kernel over one packed uint8 buffer (the single host-to-device
copy of the GPU path) instead of a string allocation per token.
"""

import tensorflow as tf

from tf_ctr_ops._args import (
    COMBINERS,
    ID_MODES,
    as_table,
    check_combiner,
    check_default_id,
    check_delimiter,
    check_hash_key,
    check_id_mode,
    dense_matrix,
    dense_weights_like,
    gathered_shards,
    hash_bucket,
    max_norm_attr,
    per_feature,
)
from tf_ctr_ops._loader import load_op_library
from tf_ctr_ops._table_grad import forward_table, grad_form, optional_attr, string_table_gradient

_ops = load_op_library()


def dense_strings(strings):
    """A string feature as a dense tensor; a ragged or sparse one is refused by name."""
    if isinstance(strings, (tf.RaggedTensor, tf.SparseTensor)):
        raise TypeError(f"strings must be a dense string tensor [B] or [B, 1] (one string of delimited ids per "
                        f"example), got a {type(strings).__name__}")
    if _is_packed(strings):
        raise TypeError("strings must be a dense string tensor [B] or [B, 1], got pack_strings' (bytes, row_splits): "
                        "packed strings are string_embedding's input; the grouped ops pack their features themselves")
    return tf.convert_to_tensor(strings)


def _string_vector(strings):
    strings = dense_strings(strings)
    if strings.dtype != tf.string:
        raise TypeError(f"strings must be a string tensor, got {strings.dtype}")
    if strings.shape.rank == 2 and strings.shape[1] == 1:
        strings = tf.squeeze(strings, axis=1)
    if strings.shape.rank is None or (strings.shape.rank == 2 and strings.shape[1] is None):
        # [B] or [B, 1] only at run time (a signature of unknown rank, a
        # Keras Input(shape=(None,))): checked then.
        shape = tf.shape(strings, out_type=tf.int64)
        is_vector = tf.logical_and(tf.logical_or(tf.equal(tf.size(shape), 1), tf.equal(tf.size(shape), 2)),
                                   tf.equal(tf.reduce_prod(shape[1:]), 1))
        check = tf.debugging.Assert(is_vector, ["strings must be a vector [B] (or [B, 1]), got shape", shape])
        with tf.control_dependencies([check]):
            return tf.reshape(strings, [-1])
    if strings.shape.rank != 1:
        raise ValueError(f"strings must be a vector [B] (or [B, 1]), got shape {strings.shape}")
    # Checked when it runs too: a model server feeds a signature's inputs
    # unchecked, and the pack would flatten a matrix into more bags than rows.
    return tf.ensure_shape(strings, [None])


def pack_strings(strings, name=None):
    """Packs strings into one contiguous uint8 tensor and int64 row_splits.

    Args:
      strings: string tensor `[B]` (or `[B, 1]`, squeezed).

    Returns:
      `(bytes, row_splits)`: uint8 `[total_bytes]` holding every string back to
      back, and int64 `[B + 1]` byte offsets. No per-string allocation.
    """
    data, row_splits, _ = _ops.ctr_pack_strings([_string_vector(strings)], name=name)
    return data, row_splits


def _is_packed(strings):
    """Whether `strings` is pack_strings' (bytes, row_splits): a pair (a
    tuple, or a list as Keras passes two inputs) of uint8 bytes and int32 or
    int64 splits. A pair of integer tensors of another bytes dtype, or splits
    of another dtype, is a TypeError: stacked as strings it failed with an
    unrelated Pack error, and a cast would pass float splits truncated, bools
    as 0 and 1, and large uint64 values as negative ones."""
    if not (isinstance(strings, (tuple, list)) and len(strings) == 2):
        return False
    dtypes = [getattr(t, "dtype", None) for t in strings]
    if None in dtypes:
        return False
    data, splits = (tf.as_dtype(d) for d in dtypes)
    if data != tf.uint8:
        if data.is_integer and splits.is_integer:
            raise TypeError(f"packed strings' bytes must be uint8, as pack_strings gives them, got {data.name}")
        return False
    if splits not in (tf.int32, tf.int64):
        raise TypeError(f"packed strings' row_splits must be int32 or int64, got {splits.name}")
    return True


def _unpack_strings(packed):
    """The [B] strings of pack_strings' (bytes, row_splits), with TF ops: each
    byte becomes its one-byte string, joined per row. For the paths that split
    the strings with TF ops; the fused op must have validated the splits."""
    data, row_splits = packed
    # Splits need not cover the whole buffer (the fused op reads only
    # [splits[0], splits[-1])): the bytes outside belong to no row.
    data = data[row_splits[0]:row_splits[-1]]
    row_splits = row_splits - row_splits[0]
    one_byte = tf.constant([bytes([b]) for b in range(256)], tf.string)
    rows = tf.ragged.row_splits_to_segment_ids(row_splits)
    return tf.strings.unsorted_segment_join(tf.gather(one_byte, tf.cast(data, tf.int32)), rows,
                                            tf.size(row_splits) - 1)


def _check_string_invalid_ids(invalid_ids):
    if invalid_ids not in ("error", "skip_negative"):
        raise ValueError(f"invalid_ids must be 'error' or 'skip_negative', got {invalid_ids!r}")
    return invalid_ids


# The string kernels' table types (the lookups also take float64).
STRING_TABLE_DTYPES = (tf.float32, tf.float16, tf.bfloat16)


def _string_table(table):
    if table.dtype not in STRING_TABLE_DTYPES:
        raise TypeError(f"string embedding tables must be float32, float16 or bfloat16, got {table.dtype.name}")
    return table


def _string_op(table, packed, bag_splits, *, delimiter, combiner, id_mode, skip_empty, max_norm,
               invalid_ids="error", default_id=None, hash_key=None):
    data, row_splits = packed
    return _ops.ctr_string_embedding(
        params=_string_table(table), bytes=data, row_splits=tf.cast(row_splits, tf.int64),
        bag_splits=tf.zeros([0], tf.int64) if bag_splits is None else tf.cast(bag_splits, tf.int64),
        delimiter=delimiter, combiner=check_combiner(combiner), id_mode=check_id_mode(id_mode),
        skip_empty=bool(skip_empty), max_norm=max_norm_attr(max_norm), bagged=bag_splits is not None,
        invalid_ids=_check_string_invalid_ids(invalid_ids), default_id=check_default_id(default_id),
        hash_key=check_hash_key(hash_key))


def string_embedding(strings, params, delimiter=",", combiner="mean", id_mode="hash", skip_empty=True,
                     max_norm=None, invalid_ids="error", default_id=None, hash_key=None, name=None):
    """Pooled embedding of strings of delimited ids, e.g. `"12,7,993"`.

    Equal to `tf.strings.split(strings, delimiter)` (dropping empty tokens when
    `skip_empty`), then `tf.strings.to_hash_bucket_fast(tokens, V)` (`"hash"`),
    `tf.strings.to_number(tokens, tf.int64)` (`"index"`) or that number
    floor-mod V (`"mod"`), then `tf.nn.safe_embedding_lookup_sparse` with
    `combiner`: one fused op on packed bytes.

    Args:
      strings: string tensor `[B]` (or `[B, 1]`), or an already packed
        `(bytes, row_splits)` pair from `pack_strings`.
      params: `[V, D]` table (Tensor or Variable), or a ShardedVariable or a
        list of shards in TF's "div" layout, read shard by shard.
      delimiter: non-empty separator (at most 16 bytes), split as a whole; or
        None: each whole string is one token, for single-valued features
        (`tf.nn.embedding_lookup(params, tf.strings.to_hash_bucket_fast(
        strings, V))` in hash mode with `skip_empty=False`).
      combiner: "sum", "mean" or "sqrtn".
      id_mode: "hash", "index" or "mod".
      skip_empty: drop empty tokens (an empty string gives a zero row); else
        keep them (an empty string is one empty token, which is hashed in
        hash mode and an error in index and mod modes).
      max_norm: if set, rows are clipped to this L2 norm before pooling.
      invalid_ids: index mode: "error" (a negative id is out of range) or
        "skip_negative" (negative ids are dropped, as
        `safe_embedding_lookup_sparse` prunes them).
      default_id: the row of a string left without tokens (None: zeros), as
        `safe_embedding_lookup_sparse`'s `default_id`.
      hash_key: hash mode: None (`to_hash_bucket_fast`), or an integer or
        two that make the hash `tf.strings.to_hash_bucket_strong(tokens, V,
        key)` (keras.layers.Hashing's `salt`; one integer s is `[s, s]`).

    Returns:
      `[B, D]` tensor of the params dtype.

    Raises:
      InvalidArgumentError: in index and mod modes, for a token that
        `to_number` rejects, and in index mode for an id outside `[0, V)`
        (or `>= V` with "skip_negative"), naming the row and the token.
    """
    delimiter = check_delimiter(delimiter)
    with tf.name_scope(name or "string_embedding"):
        shards = gathered_shards(params)
        if shards is not None:
            return _sharded_string_embedding(shards, strings, delimiter=delimiter, combiner=combiner,
                                             id_mode=id_mode, skip_empty=skip_empty, max_norm=max_norm,
                                             invalid_ids=invalid_ids, default_id=default_id,
                                             hash_key=check_hash_key(hash_key))
        table = as_table(params)
        packed = strings if _is_packed(strings) else pack_strings(strings)
        return _string_op(table, packed, None, delimiter=delimiter, combiner=combiner, id_mode=id_mode,
                          skip_empty=skip_empty, max_norm=max_norm, invalid_ids=invalid_ids,
                          default_id=default_id, hash_key=hash_key)


def _sharded_string_embedding(shards, strings, check=None, **attrs):
    """string_embedding over a table in shards, which is never read whole.

    The fused op first runs on a [V, 0] view of the table: it splits and
    parses every string as on one table and fails the same way, naming the
    row and the token. Packed bytes are unpacked into strings again. TF's
    split, to_number and string hash, whose rules the kernel follows bit for
    bit (cc/core/parse.h, string_hash.h), then give the ids, and the
    sharded lookup gathers each shard's rows on its own device (its parameter
    server) and pools them here. A grouped op that ran this feature with its
    others on such a view passes its output as `check` (its errors name the
    feature), which is then not run again.
    """
    from tf_ctr_ops import ops  # here: ops imports this module

    num_rows = sum(int(s.shape[0]) for s in shards)
    if check is None:
        packed = strings if _is_packed(strings) else pack_strings(strings)
        check = _string_op(_zero_width_view(shards), packed, None, **attrs)
    with tf.control_dependencies([check]):
        strings = _unpack_strings(strings) if _is_packed(strings) else _string_vector(strings)
        tokens = _split_tokens(strings, attrs["delimiter"], attrs["skip_empty"])
    if attrs["id_mode"] == "hash":
        ids = hash_bucket(tokens.values, num_rows, attrs["hash_key"])
    else:
        ids = tf.strings.to_number(tokens.values, tf.int64)
        if attrs["id_mode"] == "mod":
            ids = tf.math.floormod(ids, num_rows)
    bags = ops._bags_from_container(tokens.with_values(ids), None, -1)
    return ops.after_check(ops._sharded_lookup(shards, bags, combiner=attrs["combiner"], max_norm=attrs["max_norm"],
                                               invalid_ids=attrs["invalid_ids"], default_id=attrs["default_id"]),
                           check)


def _split_tokens(strings, delimiter, skip_empty):
    """[B, (n)] tokens as the fused op reads them: split on the whole
    delimiter (b"": each string is one token), empty tokens dropped when
    skip_empty."""
    if delimiter:
        tokens = tf.strings.split(strings, sep=delimiter)
    else:
        tokens = tf.RaggedTensor.from_tensor(tf.expand_dims(strings, 1))
    if skip_empty:
        tokens = tf.ragged.boolean_mask(tokens, tf.strings.length(tokens) > 0)
    return tokens


def multi_string_embedding(features, tables, delimiters=",", combiners="mean", id_modes="hash",
                           skip_empty=True, max_norms=None, concat=False, hash_keys=None, name=None):
    """The grouped `string_embedding`: many string features, one pack, one launch.

    Args:
      features: list of N string tensors, each `[B]` (the same B).
      tables: list of N `[V_i, D_i]` tables of one dtype.
      delimiters, combiners, id_modes, skip_empty, max_norms: one value for
        all features, or a list of N.
      concat: return the N outputs concatenated along axis 1, written in
        place by the op (`CtrConcatStringEmbedding`): what `tf.concat(outputs,
        axis=1)` gives, without the copy.
      hash_keys: None, or a list of N: each feature's `hash_key` (see
        `string_embedding`), None for `to_hash_bucket_fast`.

    Returns:
      List of N `[B, D_i]` tensors, identical to calling `string_embedding`
      per feature; with `concat`, one `[B, D_1 + ... + D_N]` tensor.
    """
    for what, value in (("features", features), ("tables", tables)):
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"{what} must be a list (one entry per feature), got {type(value).__name__}; split a "
                            f"[B, N] matrix of string features with tf.unstack(x, axis=1)")
    features, tables = list(features), list(tables)
    n = len(features)
    if n == 0 or len(tables) != n:
        raise ValueError(f"features and tables must be non-empty lists of equal length, got {n} features "
                         f"and {len(tables)} tables")
    delimiters = [check_delimiter(d) for d in per_feature(delimiters, n, "delimiters")]
    combiners = [check_combiner(c) for c in per_feature(combiners, n, "combiners")]
    id_modes = [check_id_mode(m) for m in per_feature(id_modes, n, "id_modes")]
    skip_empty = [bool(s) for s in per_feature(skip_empty, n, "skip_empty")]
    max_norms = [max_norm_attr(m) for m in per_feature(max_norms, n, "max_norms")]
    key_attrs = _grouped_hash_key_attrs(hash_keys, n)
    with tf.name_scope(name or "multi_string_embedding"):
        shards = [gathered_shards(t) for t in tables]
        tables = [_string_table(as_table(t)) if ts is None else _zero_width_view(ts)
                  for t, ts in zip(tables, shards)]
        for i, t in enumerate(tables):
            if t.dtype != tables[0].dtype:
                raise TypeError(f"tables must share one dtype: table 0 is {tables[0].dtype.name}, table {i} is "
                                f"{t.dtype.name}")
        if any(ts is not None for ts in shards):
            # A sharded table is gathered shard by shard on its own devices,
            # which no grouped op can do: the grouped op pools the other
            # features and splits and checks a sharded one's strings on a
            # [V, 0] view (its errors naming the feature, as for the others).
            grouped = multi_string_embedding(features, tables, [d or None for d in delimiters], combiners, id_modes,
                                             skip_empty, [None if m < 0 else m for m in max_norms],
                                             hash_keys=hash_keys)
            keys = hash_keys if hash_keys is not None else [None] * n
            outs = [out if ts is None else _sharded_string_embedding(
                        ts, f, check=out, delimiter=d, combiner=c, id_mode=m, skip_empty=e,
                        max_norm=None if mn < 0 else mn, invalid_ids="error", default_id=None,
                        hash_key=check_hash_key(k))
                    for out, ts, f, d, c, m, e, mn, k in zip(grouped, shards, features, delimiters, combiners,
                                                             id_modes, skip_empty, max_norms, keys)]
            return tf.concat(outs, axis=1) if concat else outs
        features = [_string_vector(f) for f in features]
        _check_same_batch(features)
        # One pack straight from the N feature tensors: a string concat first
        # would copy (and allocate) every string once more.
        # equal_sizes: the grouped op finds feature i's rows at [i * B,
        # (i + 1) * B), so features of different batch sizes must fail.
        attrs = dict(combiners=combiners, id_modes=id_modes, delimiters=delimiters, skip_empty=skip_empty,
                     max_norms=max_norms, **key_attrs)
        if concat:
            # Feature i's strings are found by input_splits: the op checks
            # that the features' row counts agree, as a concat would.
            data, row_splits, input_splits = _ops.ctr_pack_strings(features)
            out = _ops.ctr_concat_string_embedding(params=tables, bytes=data, row_splits=row_splits,
                                                   input_splits=input_splits, dense=[], **attrs)
            # The op's shape function sees packed bytes, not the batch.
            from tf_ctr_ops import ops  # here: ops imports this module
            return ops._with_batch_dim(out, next((f for f in features if f.shape[0] is not None), features[0]))
        data, row_splits, _ = _ops.ctr_pack_strings(features, equal_sizes=True)
        return _ops.ctr_multi_string_embedding(params=tables, bytes=data, row_splits=row_splits, **attrs)


def _zero_width_view(shards):
    """A [V, 0] stand-in of a sharded table: what a string op needs to split,
    parse and check ids against V, and nothing to read."""
    return tf.zeros([sum(int(s.shape[0]) for s in shards), 0], shards[0].dtype)


def _check_same_batch(features):
    """Statically known batch sizes must agree (unknown ones are checked by
    the pack at run time)."""
    sizes = [f.shape[0] for f in features]
    known = [s for s in sizes if s is not None]
    if len(set(known)) > 1:
        raise ValueError(f"features must share one batch size, got {sizes}")


def _sparse_rows(sparse):
    """A SparseTensor [B, N] in row-major order as a RaggedTensor [B, (n)]."""
    if sparse.shape.rank is not None and sparse.shape.rank != 2:
        raise ValueError(f"sparse keys must be a SparseTensor [B, N], got rank {sparse.shape.rank}")
    rows = sparse.indices[:, 0]
    # The integer keys' checks and messages (a row out of the batch or out of
    # order, named with its entry), before from_value_rowids, which would
    # only say that its row partition is invalid.
    # The values go through the check (a control edge alone, Grappler drops
    # with the stateless op); weights take their gradient through it.
    values = _ops.ctr_check_bags(ids=sparse.values, segments=rows, num_rows=sparse.dense_shape[0],
                                 weights=tf.zeros([0], tf.float32), segment_kind="row_ids")
    with tf.control_dependencies([values]):
        rows = tf.identity(rows)
    return tf.RaggedTensor.from_value_rowids(values, rows, nrows=sparse.dense_shape[0])


def string_key_bags(keys, weights=None):
    """String keys as a RaggedTensor [B, (n)], and their weights alike: a
    SparseTensor [B, N] as it is, a dense [B, N] tensor without its "" padding."""
    if isinstance(keys, tf.SparseTensor):
        # By row id, not from_sparse, which wants each row's entries in its
        # first columns: tf.sparse.from_dense of "" padding leaves gaps.
        keys, weights = (None if s is None else _sparse_rows(s) for s in (keys, weights))
    elif not isinstance(keys, tf.RaggedTensor):
        keys = _dense_string_keys(keys)
        mask = tf.not_equal(keys, "")  # dense string keys are padded with ""
        weights = None if weights is None else tf.ragged.boolean_mask(dense_weights_like(weights, keys), mask)
        keys = tf.ragged.boolean_mask(keys, mask)
    if keys.ragged_rank != 1:
        raise ValueError(f"keys must be a RaggedTensor [B, (n)], got ragged rank {keys.ragged_rank}")
    return keys, weights


def _dense_string_keys(keys):
    keys = tf.convert_to_tensor(keys)
    if keys.shape.rank is None:  # a function's TensorSpec(None): checked when it runs
        return dense_matrix(keys)
    if keys.shape.rank != 2:
        raise ValueError(f"dense keys must be [B, N], got shape {keys.shape}")
    return keys


def hash_string_keys(table, keys, combiner, max_norm, hash_key=None):
    """hash_embedding for unweighted string keys: bags of whole-string tokens."""
    if not isinstance(keys, (tf.SparseTensor, tf.RaggedTensor)):
        return _dense_hash_string_keys(table, _dense_string_keys(keys), combiner, max_norm, hash_key)
    keys, _ = string_key_bags(keys)
    return _string_op(table, pack_strings(keys.values), keys.row_splits, delimiter=b"", combiner=combiner,
                      id_mode="hash", skip_empty=False, max_norm=max_norm, hash_key=hash_key)


def _dense_hash_string_keys(table, keys, combiner, max_norm, hash_key):
    """Dense `[B, N]` string keys padded with "": each key is one whole-string
    token (empty delimiter), and `skip_empty` drops the "" keys inside the
    kernel. Building no mask and no ragged tensor matters: a model with one
    `[B, 1]` key per field runs this once per field, and the ~20 ops of
    `tf.ragged.boolean_mask` cost more than the lookup itself."""
    packed = pack_strings(tf.reshape(keys, [-1]))
    bag_splits = None
    if keys.shape[1] != 1:
        shape = tf.shape(keys, out_type=tf.int64)
        bag_splits = tf.range(shape[0] + 1) * shape[1]
    out = _string_op(table, packed, bag_splits, delimiter=b"", combiner=combiner, id_mode="hash",
                     skip_empty=True, max_norm=max_norm, hash_key=hash_key)
    if keys.shape[0] is not None:
        out.set_shape([keys.shape[0], out.shape[1]])
    return out


# ---------------------------------------------------------------------------
# Gradients: IndexedSlices computed in C++ from the packed bytes.


def _attrs(op, names):
    out = {k: op.get_attr(k) for k in names}
    return {k: v.decode() if isinstance(v, bytes) and k != "delimiter" else v for k, v in out.items()}


@tf.RegisterGradient("CtrStringEmbedding")
def _string_embedding_grad(op, grad):
    params, data, row_splits, bag_splits = op.inputs
    params = forward_table(params)
    attrs = _attrs(op, ("combiner", "id_mode", "delimiter", "skip_empty", "max_norm", "bagged", "num_buckets",
                        "invalid_ids", "default_id", "hash_key"))
    if op.get_attr("trim_empty_tail"):
        # The trimmed rows had no tokens: their gradient is zero.
        bags = tf.shape(bag_splits if attrs["bagged"] else row_splits)[0] - 1
        grad = tf.pad(grad, [[0, bags - tf.shape(grad)[0]], [0, 0]])
    return [_params_grad(grad, params, grad_form(op), optional_attr(op, "empty_grad_row", -1), bytes=data,
                        row_splits=row_splits, bag_splits=bag_splits, **attrs), None, None, None]


def _params_grad(grad, params, form, empty_row, **grad_op_args):
    """A string op's params gradient in `form` (its grad_indices) from its
    gradient op's rows: one per token, and with `empty_row` >= 0 a zero row
    naming it in place of each bag that has no token, as TF's safe lookup
    fills such a bag with that id (and zeroes its output) before it gathers."""
    values, indices = _ops.ctr_string_embedding_grad(grad=grad, params=params, empty_grad_row=empty_row,
                                                      **grad_op_args)
    return string_table_gradient(values, indices, params, form)


def _feature_hash_keys(op, n):
    """Each of a grouped op's n features' hash_key: [] or its two integers."""
    keys = [[] for _ in range(n)]
    flat = op.get_attr("hash_keys")
    for k, feature in enumerate(op.get_attr("keyed_features")):
        keys[feature] = list(flat[2 * k:2 * k + 2])
    return keys


def _grouped_hash_key_attrs(hash_keys, n):
    """keyed_features and hash_keys of a grouped op from n features' hash
    keys (None or a list of n, each None, an integer or two)."""
    if hash_keys is None:
        return {}
    hash_keys = list(hash_keys)
    if len(hash_keys) != n:
        raise ValueError(f"hash_keys must be None or a list of {n} entries (None, an integer or two each), got "
                         f"{len(hash_keys)}")
    keyed = [(i, check_hash_key(k)) for i, k in enumerate(hash_keys) if k is not None]
    return dict(keyed_features=[i for i, _ in keyed], hash_keys=[x for _, key in keyed for x in key])


@tf.RegisterGradient("CtrMultiStringEmbedding")
def _multi_string_embedding_grad(op, *grads):
    n = op.get_attr("N")
    tables = [forward_table(t) for t in op.inputs[:n]]
    data, row_splits = op.inputs[n], op.inputs[n + 1]
    batch = (tf.shape(row_splits, out_type=tf.int64)[0] - 1) // n
    attrs = _attrs(op, ("combiners", "id_modes", "delimiters", "skip_empty", "max_norms", "num_buckets"))
    buckets = attrs["num_buckets"] or [0] * n
    hash_keys = _feature_hash_keys(op, n)
    out = []
    for i in range(n):
        grad = grads[i] if grads[i] is not None else tf.zeros([batch, tf.shape(tables[i])[1]], tables[i].dtype)
        out.append(_params_grad(
            grad, tables[i], grad_form(op, i), _empty_grad_row(op, i), bytes=data,
            row_splits=row_splits[i * batch:(i + 1) * batch + 1], bag_splits=tf.zeros([0], tf.int64),
            combiner=attrs["combiners"][i].decode(), id_mode=attrs["id_modes"][i].decode(),
            delimiter=attrs["delimiters"][i], skip_empty=attrs["skip_empty"][i], max_norm=attrs["max_norms"][i],
            bagged=False, num_buckets=buckets[i], hash_key=hash_keys[i]))
    return out + [None, None]


def _empty_grad_row(op, feature):
    """A grouped op's feature's empty_grad_row (its list is empty where every
    feature's is -1)."""
    rows = optional_attr(op, "empty_grad_rows", [])
    return rows[feature] if feature < len(rows) else -1


@tf.RegisterGradient("CtrConcatStringEmbedding")
def _concat_string_embedding_grad(op, grad):
    n = op.get_attr("N")
    data, row_splits, input_splits = op.inputs[n:n + 3]
    return _concat_grad(op, grad, op.inputs[:n], data, row_splits, input_splits, op.inputs[n + 3:], 3)


@tf.RegisterGradient("CtrConcatStringTensorEmbedding")
def _concat_string_tensor_embedding_grad(op, grad):
    # The gradient op reads packed bytes: the strings are packed here, once.
    n, k = op.get_attr("N"), op.get_attr("K")
    data, row_splits, input_splits = _ops.ctr_pack_strings(op.inputs[n:n + k], columns=op.get_attr("columns"))
    return _concat_grad(op, grad, op.inputs[:n], data, row_splits, input_splits, op.inputs[n + k:], k)


def _concat_grad(op, grad, tables, data, row_splits, input_splits, dense, string_inputs):
    """Gradients of a concatenated string embedding: IndexedSlices for each
    table, None for its `string_inputs` string inputs, slices of grad for the
    dense inputs."""
    n, m = op.get_attr("N"), op.get_attr("M")
    tables = [forward_table(t) for t in tables]
    rows = tf.shape(grad, out_type=tf.int64)[0]
    attrs = _attrs(op, ("combiners", "id_modes", "delimiters", "skip_empty", "max_norms", "num_buckets"))
    buckets = attrs["num_buckets"] or [0] * n
    hash_keys = _feature_hash_keys(op, n)
    # Column blocks in layout order: feature i is block i, dense input j block n + j.
    widths = ([tf.shape(t, out_type=tf.int64)[1] for t in tables]
              + [tf.shape(d, out_type=tf.int64)[1] for d in dense])
    columns, column = [None] * (n + m), tf.constant(0, tf.int64)
    for block in op.get_attr("layout") or range(n + m):
        columns[block] = column
        column = column + widths[block]
    out = []
    for i in range(n):
        # Rows past the output (a trimmed tail) had no tokens: the output's
        # rows are the feature's first strings, whatever their count.
        out.append(_params_grad(
            grad[:, columns[i]:columns[i] + widths[i]], tables[i], grad_form(op, i), _empty_grad_row(op, i),
            bytes=data, row_splits=row_splits[input_splits[i]:input_splits[i] + rows + 1],
            bag_splits=tf.zeros([0], tf.int64), combiner=attrs["combiners"][i].decode(),
            id_mode=attrs["id_modes"][i].decode(), delimiter=attrs["delimiters"][i],
            skip_empty=attrs["skip_empty"][i], max_norm=attrs["max_norms"][i], bagged=False,
            num_buckets=buckets[i], hash_key=hash_keys[i]))
    dense_grads = [grad[:, columns[n + j]:columns[n + j] + widths[n + j]] for j in range(m)]
    return out + [None] * string_inputs + dense_grads


__all__ = ["pack_strings", "string_embedding", "multi_string_embedding", "COMBINERS", "ID_MODES"]

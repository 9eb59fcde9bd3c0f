"""Vocabulary embedding: a lookup-table find and the gather of its rows in one op.

This is what StringLookup / IntegerLookup + Embedding and the vocabulary
feature columns compute; the rewrite fuses their subgraphs into it.
"""

import tensorflow as tf

from tf_ctr_ops import ops
from tf_ctr_ops._loader import load_op_library
from tf_ctr_ops._args import as_table, check_combiner, check_default_id, check_matmul_dtype, max_norm_attr, read_table
from tf_ctr_ops._table_grad import dense_table_shape, forward_table, grad_form, optional_attr, table_gradient

_ops = load_op_library()

MISSING_KEY = ("default", "error")


def vocab_embedding(table, keys, params, missing_key="default", wrap_negative_ids=False, mask_key=None, mask_id=0,
                    oov_slots=0, oov_start=0, oov_id=None, name=None):
    """Rows of `params` for `keys`, found in a key -> row-id lookup table.

    Equal to `tf.gather(params, table.lookup(keys))`, in one op:

    Args:
      table: a `tf.lookup` table whose values are int64 row ids
        (`tf.lookup.StaticHashTable`, the table of a `StringLookup` or
        `IntegerLookup` layer's `lookup_table`).
      keys: string or int64 keys of any shape, the table's key dtype.
      params: the [V, ...] embedding table: a Tensor, a Variable, or a list
        of shards in TF's "div" layout (as the other lookups take them).
      missing_key: "default": a key the table lacks reads the row of the
        table's default value. "error": a key whose id is the default value is
        an InvalidArgument naming the key and its row (StringLookup with
        `num_oov_indices=0` asserts that every key is in its vocabulary).
      wrap_negative_ids: a negative id i reads row V + i, as a Keras
        Embedding's gather does.
      mask_key: None, or a scalar key of the table's key dtype whose id is
        `mask_id` whatever the table says: a `StringLookup` /
        `IntegerLookup`'s `mask_token`.
      mask_id: the mask key's id.
      oov_slots: with n > 0, a key whose id is `oov_id` (after the mask)
        gets `oov_start` plus its slot among n:
        `tf.strings.to_hash_bucket_fast(key, n)` of a string key,
        `tf.math.floormod(key, n)` of an integer key, as a lookup layer with
        `num_oov_indices=n > 1` hashes its out-of-vocabulary keys.
      oov_start: the first slot's id.
      oov_id: the id of a key out of the vocabulary; None: the table's
        default value, which must then be a constant.
      name: the op's name.

    Returns:
      keys.shape + params.shape[1:]. Its gradient reaches `params` as
      IndexedSlices, one row per key. An id outside [0, V) (after the wrap) is
      an InvalidArgument naming the key, the id and the row.
    """
    keys, default, missing_id = _find_args(table, keys, missing_key)
    if int(oov_slots) < 0:
        raise ValueError(f"oov_slots must be >= 0, got {oov_slots}")
    if oov_id is None and oov_slots:
        oov_id = tf.get_static_value(default)
        if oov_id is None:
            raise ValueError("oov_slots needs an oov_id, or a table whose default value is a constant")
    masks = [] if mask_key is None else [_mask_key(mask_key, keys.dtype)]
    mask_ids = [tf.constant(mask_id, tf.int64)] if masks else []
    out, _ = _ops.ctr_vocab_embedding(table_handle=table.resource_handle, keys=keys, default_value=default,
                                      params=as_table(params), mask_keys=masks, mask_ids=mask_ids,
                                      missing_key=missing_key, missing_id=missing_id,
                                      wrap_negative_ids=bool(wrap_negative_ids), oov_slots=int(oov_slots),
                                      oov_start=int(oov_start), oov_id=-1 if oov_id is None else int(oov_id),
                                      name=name)
    return out


def _mask_key(key, key_dtype):
    """A scalar mask key of the keys' dtype."""
    key = tf.convert_to_tensor(key, dtype_hint=key_dtype)
    if key.dtype != key_dtype or key.shape.rank != 0:
        raise TypeError(f"mask_key must be a scalar {key_dtype.name} key like the table's, got {key!r}")
    return key


def vocab_multi_hot(table, keys, kernel, binary_output=True, missing_key="default", name=None):
    """A Dense layer's product with the multi-hot (or count) encoding of
    vocabulary ids, without the encoding.

    Equal to `tf.matmul(tf.math.bincount(table.lookup(keys), minlength=depth,
    maxlength=depth, binary_output=binary_output, axis=-1, dtype=kernel.dtype),
    kernel)` with depth = kernel.shape[0]: what a `StringLookup` /
    `IntegerLookup` with `output_mode="multi_hot"` (or `"count"`) feeding a
    `Dense` computes before its bias. Each row sums the kernel rows of its
    distinct ids (times their counts when `binary_output=False`).

    Args:
      table: a `tf.lookup` table whose values are int64 ids.
      keys: [B, L] string or int64 keys, the table's key dtype.
      kernel: the [depth, units] float32 or float64 matrix: a Tensor or a
        Variable. Ids >= depth count for nothing, as the bincount drops them.
      binary_output: True: each distinct id once (multi-hot); False: as often
        as it occurs (count).
      missing_key: as `vocab_embedding`'s.
      name: the op's name.

    Returns:
      [B, units]. Its gradient reaches `kernel` as MatMul's does. A negative
      id is an InvalidArgument naming the key, the id and the row.
    """
    keys, default, missing_id = _find_args(
        table, keys, missing_key, dense_shape="[B, L]", ragged_hint="the count product of bags of keys is "
        "tf.matmul(vocab_indicator(table, sparse_keys, depth, dtype=kernel.dtype), kernel), with sparse_keys a "
        "SparseTensor (a RaggedTensor's .to_sparse()); multi-hot: tf.minimum of the indicator and 1")
    if keys.shape.rank is not None and keys.shape.rank != 2:
        raise ValueError(f"keys must be a [B, L] matrix, got shape {keys.shape}")
    kernel = read_table(kernel)
    check_matmul_dtype(kernel.dtype, "kernel")
    out, _ = _ops.ctr_vocab_multi_hot(table_handle=table.resource_handle, keys=keys, default_value=default,
                                      kernel=kernel, missing_key=missing_key, missing_id=missing_id,
                                      binary_output=bool(binary_output), name=name)
    return out


def vocab_embedding_lookup_sparse(table, sp_keys, params, sp_weights=None, combiner="mean", num_oov_buckets=0,
                                  default_id=None, max_norm=None, name=None):
    """Pooled embeddings of the ids a vocabulary table finds for sparse keys.

    Equal to `tf.nn.safe_embedding_lookup_sparse(params, ids, sp_weights,
    combiner, default_id, max_norm=max_norm)` with `ids = table.lookup(sp_keys)`,
    in one op: what a `categorical_column_with_vocabulary_list` (or `_file`)
    under an `embedding_column` computes, and what the rewrite fuses such
    columns into.

    Args:
      table: a `tf.lookup` table whose values are int64 row ids
        (`tf.lookup.StaticHashTable`).
      sp_keys: string or int64 keys (the table's key dtype) as a
        `tf.SparseTensor [B, N]` or a `tf.RaggedTensor [B, (n)]`.
      params: the [V, ...] embedding table: a Tensor, a Variable, or a list
        of shards in TF's "div" layout.
      sp_weights: optional float weights in the same container as `sp_keys`;
        for "mean" and "sqrtn", entries whose weight is not > 0 are dropped,
        as the safe lookup drops them.
      combiner: "sum", "mean" or "sqrtn".
      num_oov_buckets: n > 0 looks keys up as `tf.lookup.IdTableWithHashBuckets`
        (and the vocabulary columns with `num_oov_buckets=n`) do: a key whose
        found id is the table's default gets `table.size() +
        to_hash_bucket_fast(key, n)` (integer keys hash as their decimal string).
      default_id: the row of a bag left empty; None gives zeros.
      max_norm: if set, rows are clipped to this L2 norm before pooling.
      name: the op's name.

    Returns:
      [B] + params.shape[1:]. Negative ids (keys the table lacks, without
      buckets) are dropped; an id >= V is an InvalidArgument naming the key,
      the id and the row. Its gradient reaches `params` as IndexedSlices.
    """
    if int(num_oov_buckets) < 0:
        raise ValueError(f"num_oov_buckets must be >= 0, got {num_oov_buckets}")
    combiner = check_combiner(combiner)
    with tf.name_scope(name or "vocab_embedding_lookup_sparse"):
        if isinstance(sp_keys, tf.RaggedTensor):
            keys, weights = ops._ragged_bags(sp_keys, sp_weights, ("sp_keys", "sp_weights"))
            bags = ops._Bags(keys.values, keys.row_splits, -1, "row_splits", weights)
        elif isinstance(sp_keys, tf.SparseTensor):
            if sp_keys.shape.rank is not None and sp_keys.shape.rank != 2:
                raise ValueError(f"sp_keys must be a SparseTensor [B, N], got rank {sp_keys.shape.rank}")
            bags, _ = ops._safe_sparse_bags(sp_keys, sp_weights)
        else:
            raise TypeError(f"sp_keys must be a SparseTensor or a RaggedTensor, got {type(sp_keys).__name__}")
        keys, default, _ = _find_args(table, bags.ids, "default")
        weights, has_weights = ops._op_weights(ops._weights_values(bags.weights))
        out, _ = _ops.ctr_vocab_embedding_lookup(
            table_handle=table.resource_handle, default_value=default,
            params=ops.div_table(params, "vocab_embedding_lookup_sparse"), keys=keys,
            mask_keys=[], mask_ids=[],
            segments=tf.cast(bags.segments, tf.int64), num_rows=tf.cast(bags.num_rows, tf.int64),
            weights=weights, combiner=combiner,
            segment_kind=bags.kind, invalid_ids="skip_negative", prune_weights=has_weights and combiner != "sum",
            default_id=check_default_id(default_id), max_norm=max_norm_attr(max_norm),
            has_weights=has_weights, num_oov_buckets=int(num_oov_buckets), **ops.safe_lookup_grad_form(default_id))
        return ops._with_batch_dim(out, sp_keys)


def vocab_indicator(table, sp_keys, depth, num_oov_buckets=0, dtype=tf.float32, name=None):
    """An indicator column of vocabulary ids: each row's count of every id.

    Equal to `tf.reduce_sum(tf.one_hot(tf.sparse.to_dense(ids, default_value=-1),
    depth), axis=-2)` with `ids = table.lookup(sp_keys)`, in one op and without
    the `[B, N, depth]` one-hot tensor: what
    `tf.compat.v1.feature_column.indicator_column` of a vocabulary column
    computes, and what the rewrite fuses it into.

    Args:
      table: a `tf.lookup` table whose values are int64 ids.
      sp_keys: a `tf.SparseTensor [B, N]` of string or int64 keys (the
        table's key dtype), its indices in row-major order and distinct, as
        `tf.sparse.to_dense` requires them.
      depth: the number of ids counted: ids outside `[0, depth)` (keys the
        table lacks, without buckets) count for nothing.
      num_oov_buckets: as `vocab_embedding_lookup_sparse`'s.
      dtype: tf.float32 or tf.float64.
      name: the op's name.

    Returns:
      `[B, depth]` of `dtype`. Out-of-order, repeated or out-of-bounds indices
      are an InvalidArgument naming the index.
    """
    if not isinstance(sp_keys, tf.SparseTensor):
        raise TypeError(f"sp_keys must be a SparseTensor, got {type(sp_keys).__name__}")
    if sp_keys.shape.rank is not None and sp_keys.shape.rank != 2:
        raise ValueError(f"sp_keys must be a SparseTensor [B, N], got rank {sp_keys.shape.rank}")
    if int(depth) < 0 or int(num_oov_buckets) < 0:
        raise ValueError(f"depth and num_oov_buckets must be >= 0, got {depth} and {num_oov_buckets}")
    dtype = check_matmul_dtype(dtype, "dtype")
    keys, default, _ = _find_args(table, sp_keys.values, "default")
    return _ops.ctr_vocab_indicator(table_handle=table.resource_handle, default_value=default, keys=keys,
                                    indices=sp_keys.indices, dense_shape=sp_keys.dense_shape, depth=int(depth),
                                    num_oov_buckets=int(num_oov_buckets), T=dtype, name=name)


_POOL_BAGS_HINT = ("look up its values (tf.ragged.map_flat_values, or SparseTensor.with_values), or pool bags with "
                   "vocab_embedding_lookup_sparse")


def _find_args(table, keys, missing_key, dense_shape="(of any shape)", ragged_hint=_POOL_BAGS_HINT):
    """(keys, default, missing_id) of a find in `table`, checked."""
    if missing_key not in MISSING_KEY:
        raise ValueError(f"missing_key must be one of {MISSING_KEY}, got {missing_key!r}")
    if table.value_dtype != tf.int64:
        raise TypeError(f"the table's values must be int64 row ids, got {table.value_dtype.name}")
    if isinstance(keys, (tf.RaggedTensor, tf.SparseTensor)):
        raise TypeError(f"keys must be a dense tensor {dense_shape}, got a {type(keys).__name__}: {ragged_hint}")
    keys = tf.convert_to_tensor(keys)
    if keys.dtype != table.key_dtype:
        raise TypeError(f"keys must have the table's key dtype {table.key_dtype.name}, got {keys.dtype.name}")
    default = _default_value(table)
    missing_id = -1
    if missing_key == "error":
        missing_id = tf.get_static_value(default)
        if missing_id is None:
            raise ValueError("missing_key='error' needs a table whose default value is a constant")
    return keys, default, int(missing_id)


def _default_value(table):
    # Static tables expose it; the mutable ones (DenseHashTable, MutableHashTable) keep it private.
    value = getattr(table, "default_value", None)
    if value is None:
        value = getattr(table, "_default_value", None)
    if value is None:
        hint = (" (its out-of-vocabulary keys hash to buckets: pass a StaticHashTable of the vocabulary with "
                "default_value=-1, and num_oov_buckets where the function takes it)"
                if isinstance(table, tf.lookup.StaticVocabularyTable) else "")
        raise TypeError(f"table must be a tf.lookup table with a default value, got {type(table).__name__}{hint}")
    value = tf.cast(value, tf.int64)
    if value.shape.rank not in (None, 0):
        raise ValueError(f"the table's default value must be a scalar row id, got shape {value.shape}")
    return value


@tf.RegisterGradient("CtrVocabEmbedding")
def _vocab_embedding_grad(op, grad, _rows_grad):
    params = forward_table(op.inputs[3])
    rows = tf.reshape(op.outputs[1], [-1])
    row_shape = tf.shape(params)[1:]
    values = tf.reshape(grad, tf.concat([[-1], row_shape], axis=0))
    params_grad = table_gradient(values, rows, dense_table_shape(params))
    return [None, None, None, params_grad] + [None] * (2 * op.get_attr("num_masks"))


@tf.RegisterGradient("CtrConcatVocabEmbedding")
def _concat_vocab_embedding_grad(op, grad):
    """IndexedSlices for each feature's table (its rows found again, by the
    single op on a zero-width view of the table), slices of grad for the dense
    inputs, None for the handles, keys and defaults."""
    n, m, masked = op.get_attr("N"), op.get_attr("M"), op.get_attr("num_masked")
    handles, keys, defaults = op.inputs[:n], op.inputs[n:2 * n], op.inputs[2 * n:3 * n]
    params, dense = [forward_table(p) for p in op.inputs[3 * n:4 * n]], op.inputs[4 * n:4 * n + m]
    mask_keys, mask_ids = op.inputs[4 * n + m:4 * n + m + masked], op.inputs[4 * n + m + masked:]
    masks = {f: ([mask_keys[j]], [mask_ids[j]]) for j, f in enumerate(op.get_attr("masked_features"))}
    slots = {k: op.get_attr(k) or [0] * n for k in ("oov_slots", "oov_ids", "oov_starts")}
    widths = [tf.shape(t)[1] for t in list(params) + list(dense)]
    starts, column = [None] * (n + m), tf.constant(0)
    for block in op.get_attr("layout") or range(n + m):
        starts[block] = column
        column = column + widths[block]
    missing, missing_ids, wrap = (op.get_attr(k) for k in ("missing_keys", "missing_ids", "wrap_negative_ids"))
    out = []
    for i in range(n):
        feature_masks, feature_mask_ids = masks.get(i, ([], []))
        _, rows = _ops.ctr_vocab_embedding(table_handle=handles[i], keys=keys[i], default_value=defaults[i],
                                           params=params[i][:, :0], mask_keys=feature_masks,
                                           mask_ids=feature_mask_ids, missing_key=missing[i].decode(),
                                           missing_id=missing_ids[i], wrap_negative_ids=wrap[i],
                                           oov_slots=slots["oov_slots"][i], oov_id=slots["oov_ids"][i],
                                           oov_start=slots["oov_starts"][i])
        values = grad[:, starts[i]:starts[i] + widths[i]]
        out.append(table_gradient(values, rows, dense_table_shape(params[i])))
    dense_grads = [grad[:, starts[n + j]:starts[n + j] + widths[n + j]] for j in range(m)]
    return [None] * (3 * n) + out + dense_grads + [None] * (2 * masked)


@tf.RegisterGradient("CtrVocabMultiHot")
def _vocab_multi_hot_grad(op, grad, _ids_grad):
    """MatMul's gradient for the kernel, on the encoding rebuilt from the ids."""
    kernel = op.inputs[3]
    depth = tf.shape(kernel, out_type=tf.int64)[0]
    encoding = tf.math.bincount(op.outputs[1], minlength=depth, maxlength=depth,
                                binary_output=op.get_attr("binary_output"), axis=-1, dtype=kernel.dtype)
    return [None, None, None, tf.matmul(encoding, grad, transpose_a=True)]


@tf.RegisterGradient("CtrVocabEmbeddingLookup")
def _vocab_embedding_lookup_grad(op, grad, _ids_grad):
    """CtrEmbeddingLookup's gradient on the rows the found ids read (wrapped,
    and with a Keras mask's 0s dropped, as the forward op pooled them)."""
    _, _, params, _, segments, num_rows, weights = op.inputs[:7]
    params = forward_table(params)
    attrs = {k: op.get_attr(k) for k in ("combiner", "segment_kind", "invalid_ids", "prune_weights", "default_id",
                                         "max_norm", "has_weights")}
    attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}
    ids = op.outputs[1]
    rows = ids
    if op.get_attr("wrap_negative_ids"):
        rows = tf.where(ids < 0, ids + tf.shape(params, out_type=tf.int64)[0], ids)
    if op.get_attr("drop_zero_ids"):
        weights = tf.cast(tf.not_equal(ids, 0), tf.float32)
        attrs.update(has_weights=True, prune_weights=True)
    attrs.update(id_mode="index", empty_grad_row=optional_attr(op, "empty_grad_row", -1))
    params_grad, weights_grad = ops.pooled_grads(grad, _ops.ctr_embedding_lookup_grad, dense_table_shape, params, rows,
                                             segments, num_rows, weights, attrs, grad_form(op))
    weights_grad = weights_grad if op.get_attr("has_weights") else None
    return [None, None, params_grad, None, None, None, weights_grad] + [None] * (len(op.inputs) - 7)


# Counts of ids: nothing upstream is differentiable.
tf.no_gradient("CtrVocabIndicator")

"""Python wrappers and gradients of the fused tf-ctr-ops kernels.

Every public function builds exactly one fused op (plus cheap reshapes of the
id containers) in place of the TF-native subgraph it replaces.
"""

import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

from tf_ctr_ops._loader import load_op_library

_ops = load_op_library()

COMBINERS = ("sum", "mean", "sqrtn")


# ---------------------------------------------------------------------------
# Argument normalisation


def _check_combiner(combiner):
    if combiner not in COMBINERS:
        raise ValueError(f"combiner must be one of 'mean', 'sqrtn' or 'sum', got {combiner!r}")
    return combiner


def _max_norm_attr(max_norm):
    if max_norm is None:
        return -1.0
    max_norm = float(max_norm)
    if not max_norm > 0:
        raise ValueError(f"max_norm must be positive or None, got {max_norm}")
    return max_norm


def _as_table(params, dtype=None):
    """One [V, D] tensor from a Tensor, a Variable or a list of 'div' partitions.

    For the 'div' strategy of tf.nn's v2 lookups, partition p holds the ids
    that follow those of partition p - 1, so concatenating the partitions in
    order keeps every id's row: ids need no remapping.
    """
    if type(params).__name__ == "PartitionedVariable":  # tf.compat.v1 partitioned variables
        params = list(params)
    if isinstance(params, (list, tuple)):
        if not params:
            raise ValueError("Missing embedding_weights: an empty list of partitions was given")
        parts = [_read_table(p, dtype) for p in params]
        if len(parts) == 1:
            return parts[0]
        _check_div_layout(parts)
        return tf.concat(parts, axis=0)
    return _read_table(params, dtype)


def _read_table(table, dtype=None):
    """A table's value; a resource variable is read without a copy.

    After a sparse read or a sparse optimizer update a variable is in
    copy-on-read mode, where a plain read copies the whole table on every
    call. Like tf.nn's own lookups, read_value_no_copy() leaves that mode.
    """
    var = getattr(table, "_value", table)  # a Keras 3 variable wraps a tf.Variable
    if isinstance(var, resource_variable_ops.BaseResourceVariable) and dtype in (None, var.dtype):
        return var.read_value_no_copy()
    return tf.convert_to_tensor(table, dtype=dtype)


def _check_div_layout(parts):
    sizes = [p.shape[0] for p in parts]
    if any(s is None for s in sizes):
        return  # dynamic sizes: TF's own layout rules apply at run time
    total, n = sum(sizes), len(sizes)
    expected = [total // n + (1 if i < total % n else 0) for i in range(n)]
    if sizes != expected:
        raise ValueError(
            f"partition sizes {sizes} do not follow the 'div' layout {expected} that "
            "tf.nn.embedding_lookup_sparse assumes for a list of partitions")


def _ids_tensor(values):
    if values.dtype not in (tf.int32, tf.int64):
        values = tf.cast(values, tf.int64)
    return values


def _weights_values(weights):
    return None if weights is None else tf.cast(weights, tf.float32)


def _lookup(table, ids, segments, num_rows, weights, *, segment_kind, combiner, id_mode="index",
            invalid_ids="error", prune_weights=False, default_id=-1, max_norm=None, name=None):
    has_weights = weights is not None
    if not has_weights:
        weights = tf.zeros([0], tf.float32)
    if segments.dtype not in (tf.int32, tf.int64):
        segments = tf.cast(segments, tf.int64)
    return _ops.ctr_embedding_lookup(
        params=table,
        ids=_ids_tensor(ids),
        segments=segments,
        num_rows=tf.cast(num_rows, tf.int64),
        weights=weights,
        combiner=_check_combiner(combiner),
        segment_kind=segment_kind,
        id_mode=id_mode,
        invalid_ids=invalid_ids,
        prune_weights=prune_weights,
        default_id=default_id,
        max_norm=_max_norm_attr(max_norm),
        has_weights=has_weights,
        name=name,
    )


@tf.RegisterGradient("CtrEmbeddingLookup")
def _embedding_lookup_grad(op, grad):
    params, ids, segments, num_rows, weights = op.inputs
    attrs = {k: op.get_attr(k) for k in (
        "combiner", "segment_kind", "id_mode", "invalid_ids", "prune_weights", "default_id",
        "max_norm", "has_weights", "num_buckets")}
    attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}
    values, indices, weights_grad = _ops.ctr_embedding_lookup_grad(
        grad=grad, params=params, ids=ids, segments=segments, num_rows=num_rows,
        weights=weights, **attrs)
    params_grad = tf.IndexedSlices(values, indices, dense_shape=tf.shape(params, out_type=tf.int64))
    return [params_grad, None, None, None, weights_grad if attrs["has_weights"] else None]


# ---------------------------------------------------------------------------
# Id containers -> (ids, segments, num_rows, segment_kind, weights)


class _Bags:
    """Flat ids grouped into bags, in the encoding the fused op takes."""

    def __init__(self, ids, segments, num_rows, kind, weights=None):
        self.ids, self.segments, self.num_rows, self.kind, self.weights = ids, segments, num_rows, kind, weights


def _bags_from_container(ids, weights, padding_value):
    """Ragged [B, (n)], Sparse [B, N] or dense padded [B, N] ids as bags of B rows."""
    if isinstance(ids, tf.RaggedTensor):
        if ids.ragged_rank != 1 or ids.flat_values.shape.rank != 1:
            raise ValueError(f"ids must be a RaggedTensor [B, (n)], got ragged rank {ids.ragged_rank}, "
                             f"shape {ids.shape}")
        w = None
        if weights is not None:
            if not isinstance(weights, tf.RaggedTensor):
                raise TypeError("weights must be a RaggedTensor like ids")
            w = weights.values
        return _Bags(ids.values, ids.row_splits, -1, "row_splits", w)
    if isinstance(ids, tf.SparseTensor):
        if ids.shape.rank is not None and ids.shape.rank != 2:
            raise ValueError(f"ids must be a SparseTensor [B, N], got rank {ids.shape.rank}")
        w = None
        if weights is not None:
            if not isinstance(weights, tf.SparseTensor):
                raise TypeError("weights must be a SparseTensor like ids")
            w = weights.values
        return _Bags(ids.values, ids.indices[:, 0], ids.dense_shape[0], "row_ids", w)
    ids = tf.convert_to_tensor(ids)
    if ids.shape.rank != 2:
        raise ValueError(f"dense ids must be [B, N] padded with {padding_value!r}, got shape {ids.shape}")
    shape = tf.shape(ids, out_type=tf.int64)
    splits = tf.range(shape[0] + 1, dtype=tf.int64) * shape[1]
    w = None
    if weights is not None:
        weights = tf.convert_to_tensor(weights)
        if weights.shape.rank != 2:
            raise ValueError(f"dense weights must be [B, N] like ids, got shape {weights.shape}")
        w = tf.reshape(weights, [-1])
    return _Bags(tf.reshape(ids, [-1]), splits, -1, "row_splits", w)


def _with_batch_dim(out, ids):
    """Carries the static batch size of the id container over to the output."""
    batch = ids.shape[0] if ids.shape.rank else None
    if batch is not None:
        out.set_shape([batch, out.shape[1]])
    return out


# ---------------------------------------------------------------------------
# Drop-in replacements for tf.nn


def embedding_lookup_sparse(params, sp_ids, sp_weights, combiner=None, max_norm=None, name=None,
                            allow_fast_lookup=False):
    """Fused drop-in for `tf.nn.embedding_lookup_sparse`.

    Same arguments, output shape and values (up to float32 summation order):
    rows are pooled over `sp_ids.indices[:, 0]`, the output has
    `max(row) + 1` rows (rows with no ids are zeros), every id must lie in
    `[0, V)`, and `params` may be a Tensor, a Variable or a list of 'div'
    partitions. One `CtrEmbeddingLookup` op replaces Unique, Gather and
    SparseSegment*. `allow_fast_lookup` is accepted for compatibility; the
    fused op is always the fast path and always gives sparse gradients.

    Args:
      params: `[V, D]` table, or a list of partitions concatenating to one.
      sp_ids: `tf.SparseTensor` (rank >= 2) or `tf.RaggedTensor` of int ids.
      sp_weights: `None` or weights in the same container as `sp_ids`.
      combiner: "sum", "mean" (default) or "sqrtn".
      max_norm: if set, rows are clipped to this L2 norm before pooling.
      name: op name.

    Returns:
      `[rows, D]` tensor of the params dtype.
    """
    del allow_fast_lookup
    combiner = _check_combiner(combiner or "mean")
    with tf.name_scope(name or "embedding_lookup_sparse"):
        table = _as_table(params)
        if isinstance(sp_ids, tf.RaggedTensor):
            w = None
            if sp_weights is not None:
                if not isinstance(sp_weights, tf.RaggedTensor):
                    raise TypeError(f"sp_weights must be None or a RaggedTensor, got {type(sp_weights)}")
                w = sp_weights.flat_values
            return _lookup(table, sp_ids.flat_values, sp_ids.value_rowids(), -1, _weights_values(w),
                           segment_kind="row_ids", combiner=combiner, max_norm=max_norm)
        if not isinstance(sp_ids, tf.SparseTensor):
            raise TypeError(f"sp_ids must be SparseTensor, got {type(sp_ids)}")
        w = None
        if sp_weights is not None:
            if not isinstance(sp_weights, tf.SparseTensor):
                raise TypeError(f"sp_weights must be either None or SparseTensor,got {type(sp_weights)}")
            w = sp_weights.values
        return _lookup(table, sp_ids.values, sp_ids.indices[:, 0], -1, _weights_values(w),
                       segment_kind="row_ids", combiner=combiner, max_norm=max_norm)


def safe_embedding_lookup_sparse(embedding_weights, sparse_ids, sparse_weights=None, combiner="mean",
                                 default_id=None, max_norm=None, name=None, allow_fast_lookup=False):
    """Fused drop-in for `tf.nn.safe_embedding_lookup_sparse`.

    Negative ids are dropped; with a combiner other than "sum", entries whose
    weight is not positive are dropped too. Rows left empty give zeros, or
    the row `default_id` when it is given. Ids of rank > 2 pool over the last
    dimension and the output has shape `dense_shape[:-1] + [D]`. One
    `CtrEmbeddingLookup` op replaces the sparse_retain / fill_empty_rows /
    Unique / Gather / SparseSegment* / where chain.

    Args:
      embedding_weights: `[V, D]` table, Variable, or list of 'div' partitions.
      sparse_ids: `tf.SparseTensor` of int ids, rank >= 2, in canonical order.
      sparse_weights: `None` or a `tf.SparseTensor` of float weights.
      combiner: "sum", "mean" (default) or "sqrtn".
      default_id: row for empty rows; `None` gives zeros.
      max_norm: if set, rows are clipped to this L2 norm before pooling.
      name: op name.

    Returns:
      A tensor of shape `dense_shape[:-1] + [D]`, of the params dtype.
    """
    del allow_fast_lookup
    combiner = _check_combiner(combiner)
    if embedding_weights is None or (isinstance(embedding_weights, (list, tuple)) and not embedding_weights):
        raise ValueError(f"Missing embedding_weights {embedding_weights}.")
    with tf.name_scope(name or "embedding_lookup"):
        table = _as_table(embedding_weights)
        if not isinstance(sparse_ids, tf.SparseTensor):
            raise TypeError(f"sparse_ids must be a SparseTensor, got {type(sparse_ids)}")
        dense_shape = sparse_ids.dense_shape
        rank = sparse_ids.shape.rank
        if rank == 2:
            rows, num_rows = sparse_ids.indices[:, 0], dense_shape[0]
            out_shape = None
        else:
            # Linear row index over all but the last dimension, as sparse_reshape makes it.
            lead = dense_shape[:-1]
            strides = tf.math.cumprod(lead, exclusive=True, reverse=True)
            rows = tf.reduce_sum(sparse_ids.indices[:, :-1] * strides[tf.newaxis, :], axis=1)
            num_rows = tf.reduce_prod(lead)
            out_shape = tf.concat([lead, tf.shape(table, out_type=tf.int64)[1:]], 0)
        w = None if sparse_weights is None else sparse_weights.values
        result = _lookup(
            table, sparse_ids.values, rows, num_rows, _weights_values(w), segment_kind="row_ids",
            combiner=combiner, invalid_ids="skip_negative",
            prune_weights=combiner != "sum" and sparse_weights is not None,
            default_id=-1 if default_id is None else int(default_id), max_norm=max_norm)
        if out_shape is not None:
            result = tf.reshape(result, out_shape)
            if rank is not None:
                result.set_shape([None] * (rank - 1) + [table.shape[1]])
        return result


# ---------------------------------------------------------------------------
# CTR-first API


def sparse_embedding(params, ids, weights=None, combiner="mean", max_norm=None, name=None):
    """Pooled embedding of bags of ids: `[B, D]`, a zero row for an empty bag.

    Args:
      params: `[V, D]` float32/float16/bfloat16 table (Tensor or Variable).
      ids: int32/int64 ids as a `tf.RaggedTensor [B, (n)]`, a
        `tf.SparseTensor [B, N]`, or a dense `[B, N]` tensor padded with -1.
      weights: optional float weights in the same container as `ids`.
      combiner: "sum", "mean" or "sqrtn".
      max_norm: if set, rows are clipped to this L2 norm before pooling.

    Returns:
      `[B, D]` tensor of the params dtype.

    Raises:
      InvalidArgumentError: for an id outside `[0, V)` other than the -1
        padding, naming the row and the id.
    """
    with tf.name_scope(name or "sparse_embedding"):
        table = _as_table(params)
        bags = _bags_from_container(ids, weights, -1)
        out = _lookup(table, bags.ids, bags.segments, bags.num_rows, _weights_values(bags.weights),
                      segment_kind=bags.kind, combiner=combiner, invalid_ids="skip_padding",
                      max_norm=max_norm)
        return _with_batch_dim(out, ids)


def hash_embedding(params, keys, weights=None, combiner="mean", max_norm=None, name=None):
    """Pooled embedding of hashed keys: row `to_hash_bucket_fast(key, V)` of `params`.

    Integer keys hash as their decimal string (the Keras `Hashing`
    convention: `to_hash_bucket_fast(as_string(keys), V)`), inside the
    kernel, with no string tensor. String keys hash as themselves.

    Args:
      params: `[V, D]` table; V is the bucket count.
      keys: int32/int64/string keys as a `tf.RaggedTensor [B, (n)]`, a
        `tf.SparseTensor [B, N]` or a dense `[B, N]` tensor, where dense
        integer keys equal to -1 (and dense empty strings) are padding.
      weights: optional float weights in the same container as `keys`.
      combiner: "sum", "mean" or "sqrtn".
      max_norm: if set, rows are clipped to this L2 norm before pooling.

    Returns:
      `[B, D]` tensor of the params dtype.
    """
    with tf.name_scope(name or "hash_embedding"):
        table = _as_table(params)
        dense = not isinstance(keys, (tf.RaggedTensor, tf.SparseTensor))
        if dense:
            keys = tf.convert_to_tensor(keys)
        if keys.dtype == tf.string:
            from tf_ctr_ops import strings  # the packed-string path owns string keys

            return strings.hash_string_keys(table, keys, weights, combiner, max_norm)
        bags = _bags_from_container(keys, weights, -1)
        out = _lookup(table, bags.ids, bags.segments, bags.num_rows, _weights_values(bags.weights),
                      segment_kind=bags.kind, combiner=combiner, id_mode="hash",
                      invalid_ids="skip_padding" if dense else "error", max_norm=max_norm)
        return _with_batch_dim(out, keys)

"""Crossed and bucketized features: the id-building op of a feature column
(tf.sparse.cross_hashed, Bucketize) and the pooled lookup of its ids in one op.

This is what a `crossed_column` or a `bucketized_column` under a linear model
or an `embedding_column` computes; the rewrite fuses their subgraphs into it.
"""

import numbers

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import sparse_ops

from tf_ctr_ops import ops
from tf_ctr_ops._args import check_combiner, check_default_id, max_norm_attr
from tf_ctr_ops._loader import load_op_library
from tf_ctr_ops._table_grad import dense_table_shape, forward_table, grad_form, optional_attr

_ops = load_op_library()

# tf.sparse.cross_hashed's key when none is given (0xDECAFCAFFE).
DEFAULT_HASH_KEY = sparse_ops._DEFAULT_HASH_KEY


def cross_embedding_lookup(params, inputs, num_buckets, hash_key=None, combiner="mean", default_id=None,
                           max_norm=None, name=None):
    """Pooled embeddings of hashed feature crosses.

    Equal to `tf.nn.safe_embedding_lookup_sparse(params,
    tf.sparse.cross_hashed(inputs, num_buckets, hash_key), None, combiner,
    default_id, max_norm=max_norm)`, in one op that never builds the crossed
    SparseTensor.

    Args:
      params: the [V, ...] embedding table (V >= num_buckets): a Tensor, a
        Variable, or a list of shards in TF's "div" layout.
      inputs: the features to cross, as `tf.sparse.cross_hashed` takes them:
        `tf.SparseTensor`s [B, N] in row-major order and dense Tensors [B, k],
        of strings or integers (integers are crossed as int64).
      num_buckets: crossed ids are taken modulo this (>= 1).
      hash_key: the FingerprintCat64 key; None (or 0, as TF reads it) is TF's default key.
      combiner: "sum", "mean" or "sqrtn".
      default_id: the row of a bag left empty (a row missing one of the
        features has no crosses); None gives zeros.
      max_norm: if set, rows are clipped to this L2 norm before pooling.
      name: the op's name.

    Returns:
      [B] + params.shape[1:]. Its gradient reaches `params` as IndexedSlices.
      An id >= V is an InvalidArgument naming the id and its row.
    """
    if not isinstance(inputs, (list, tuple)) or not inputs:
        raise TypeError("inputs must be a non-empty list of SparseTensors and Tensors")
    ragged = [i for i, x in enumerate(inputs) if isinstance(x, tf.RaggedTensor)]
    if ragged:  # as tf.sparse.cross_hashed refuses it; converted, it met an unrelated len() error
        raise TypeError(f"inputs must be SparseTensors and Tensors, as tf.sparse.cross_hashed takes them; input "
                        f"{ragged[0]} is a RaggedTensor (pass its .to_sparse())")
    if int(num_buckets) < 1:
        raise ValueError(f"num_buckets must be >= 1, got {num_buckets}")
    combiner = check_combiner(combiner)
    with tf.name_scope(name or "cross_embedding_lookup"):
        sparse = [i for i in inputs if isinstance(i, tf.SparseTensor)]
        dense = [tf.convert_to_tensor(i) for i in inputs if not isinstance(i, tf.SparseTensor)]
        # Inputs of another rank fail in the op, with SparseCross's errors.
        if hash_key is not None and not isinstance(hash_key, numbers.Integral):
            raise TypeError(f"hash_key must be None or one integer, as tf.sparse.cross_hashed's; got {hash_key!r}")
        key = int(hash_key) if hash_key else DEFAULT_HASH_KEY  # TF's cross_hashed reads 0 as its default too
        if not -(1 << 63) <= key < (1 << 63):
            raise OverflowError(f"hash_key must fit in int64, as tf.sparse.cross_hashed's attr does; got {key}")
        out, _, _, _ = _ops.ctr_cross_embedding_lookup(
            params=ops.div_table(params, "cross_embedding_lookup"), indices=[sp.indices for sp in sparse],
            values=[_crossable(sp.values) for sp in sparse], shapes=[sp.dense_shape for sp in sparse],
            dense_inputs=[_crossable(t) for t in dense], num_buckets=int(num_buckets),
            hash_key=key, combiner=combiner,
            default_id=check_default_id(default_id), max_norm=max_norm_attr(max_norm),
            **ops.safe_lookup_grad_form(default_id))
        first = sparse[0] if sparse else dense[0]
        return ops._with_batch_dim(out, first)


def _crossable(values):
    """Strings as they are; anything else cast to int64 (1.5 crosses as 1, True
    as 1), as tf.sparse.cross_hashed casts it."""
    return values if values.dtype == tf.string else tf.cast(values, tf.int64)


def bucketized_embedding_lookup(params, values, boundaries, combiner="mean", default_id=None, max_norm=None,
                                name=None):
    """Pooled embeddings of bucketized numeric features.

    What a `bucketized_column(numeric_column(key, shape=(S,)), boundaries)`
    under a linear model or an `embedding_column` computes, in one op: value
    s of a row falls in bucket `i` (the index of the first boundary greater
    than it, as `tf.raw_ops.Bucketize` finds it) and names row
    `i + s * (len(boundaries) + 1)` of `params`; each row pools its S rows as
    `tf.nn.safe_embedding_lookup_sparse` does.

    Args:
      params: the [V, ...] embedding table, V >= S * (len(boundaries) + 1):
        a Tensor, a Variable, or a list of shards in TF's "div" layout.
      values: numbers [B, S] (or [B], one per row): int32, int64, float32 or
        float64.
      boundaries: the sorted bucket boundaries (floats).
      combiner: "sum", "mean" or "sqrtn".
      default_id: the row of a bag left empty (only when S is 0); None gives
        zeros.
      max_norm: if set, rows are clipped to this L2 norm before pooling.
      name: the op's name.

    Returns:
      [B] + params.shape[1:]. Its gradient reaches `params` as IndexedSlices.
      An id >= V is an InvalidArgument naming the id and its row.
    """
    if not isinstance(boundaries, (list, tuple, np.ndarray)):
        raise TypeError(f"Expected list for attr boundaries, got {boundaries!r}")  # Bucketize's words
    boundaries = [float(b) for b in boundaries]
    if boundaries != sorted(boundaries):
        # bucketized_column's class (raised where it is built), with Bucketize's words.
        raise ValueError(f"Expected sorted boundaries: boundaries must be sorted, got {boundaries}")
    combiner = check_combiner(combiner)
    with tf.name_scope(name or "bucketized_embedding_lookup"):
        values = tf.convert_to_tensor(values)
        if values.dtype not in (tf.int32, tf.int64, tf.float32, tf.float64):
            raise TypeError(f"values must be int32, int64, float32 or float64, got {values.dtype.name}")
        if values.shape.rank == 1:
            values = values[:, tf.newaxis]
        elif values.shape.rank is None:  # [B] becomes [B, 1] at run time; anything else goes as it is
            one_column = tf.ones(tf.cast(tf.equal(tf.rank(values), 1), tf.int32)[tf.newaxis], tf.int32)
            values = tf.reshape(values, tf.concat([tf.shape(values), one_column], 0))
        if values.shape.rank is not None and values.shape.rank != 2:
            raise ValueError(f"values must be [B] or [B, S], got shape {values.shape}")
        out, _, _, _ = _ops.ctr_bucketize_embedding_lookup(
            params=ops.div_table(params, "bucketized_embedding_lookup"), input=values, boundaries=boundaries,
            column_stride=len(boundaries) + 1,
            combiner=combiner, default_id=check_default_id(default_id),
            max_norm=max_norm_attr(max_norm), **ops.safe_lookup_grad_form(default_id))
        return ops._with_batch_dim(out, values)


@tf.RegisterGradient("CtrBucketizeEmbeddingLookup")
@tf.RegisterGradient("CtrCrossEmbeddingLookup")
def _computed_ids_lookup_grad(op, grad, _ids_grad, _splits_grad, _shape_grad):
    """CtrEmbeddingLookup's gradient on the ids the op computed (crossed or
    bucketized) and their bags; the features have none."""
    params = forward_table(op.inputs[0])
    attrs = dict(combiner=op.get_attr("combiner").decode(), segment_kind="row_splits", invalid_ids="error",
                 default_id=op.get_attr("default_id"), max_norm=op.get_attr("max_norm"), has_weights=False,
                 id_mode="index", prune_weights=False, empty_grad_row=optional_attr(op, "empty_grad_row", -1))
    # The gradient names rows in the dtype of TF's ids: a cross's are int64,
    # Bucketize's int32.
    ids = op.outputs[1] if op.type == "CtrCrossEmbeddingLookup" else tf.cast(op.outputs[1], tf.int32)
    params_grad, _ = ops.pooled_grads(grad, _ops.ctr_embedding_lookup_grad, dense_table_shape, params, ids,
                                      op.outputs[2], tf.constant(-1, tf.int64), tf.zeros([0], tf.float32), attrs,
                                      grad_form(op))
    return [params_grad] + [None] * (len(op.inputs) - 1)

"""Python wrappers and gradients of the fused tf-ctr-ops kernels.

Every public function builds exactly one fused op (plus cheap reshapes of the
id containers) in place of the TF-native subgraph it replaces.
"""

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import composite_tensor
from tensorflow.python.ops import embedding_ops, resource_variable_ops, variables

from tf_ctr_ops import strings
from tf_ctr_ops._args import (  # noqa: F401  (COMBINERS, canonical_shard_sizes: part of this module's API)
    COMBINERS,
    as_table,
    canonical_shard_sizes,
    check_combiner,
    check_default_id,
    check_hash_key,
    dense_matrix,
    dense_weights_like,
    gathered_shards,
    hash_bucket,
    in_place_variable,
    known_value,
    max_norm_attr,
    read_table,
    separate_shards,
    sharded_variables,
    static_row_counts,
    table_operand,
)
from tf_ctr_ops._loader import load_op_library
from tf_ctr_ops._table_grad import dense_table_shape, forward_table, grad_form, table_gradient

_ops = load_op_library()


# ---------------------------------------------------------------------------
# Argument normalisation


def _check_ids_dtype(dtype, hashed):
    # Other integer types widen exactly. Floats, bools and uint64 would not
    # (1.7 would read row 1, NaN and 2**64 - 1 wrap to negative ids that the
    # safe lookup drops unsaid): TF's lookups refuse them, and so do these.
    if dtype in (tf.int32, tf.int64, tf.string):  # strings: hash mode's keys
        return
    if not dtype.is_integer or dtype == tf.uint64:
        what = "keys must be strings or integers" if hashed else "ids must be integers"
        raise TypeError(f"{what} that int64 holds (int8 to int64, uint8 to uint32), got {dtype.name}")


def _ids_tensor(values, hashed):
    _check_ids_dtype(values.dtype, hashed)
    return values if values.dtype in (tf.int32, tf.int64, tf.string) else tf.cast(values, tf.int64)


def _weights_values(weights):
    return None if weights is None else tf.cast(weights, tf.float32)


def _op_segments(segments):
    """Segments as the ops take them: int32 or int64, other integer types widened."""
    return segments if segments.dtype in (tf.int32, tf.int64) else tf.cast(segments, tf.int64)


def _op_weights(weights):
    """(the ops' weights input, has_weights): an empty vector stands for none."""
    return (tf.zeros([0], tf.float32), False) if weights is None else (weights, True)


@tf.RegisterGradient("CtrCheckBags")
def _check_bags_grad(op, grad):
    """The checked values pass through (sparse string keys' weights do)."""
    return [grad, None, None, None]


def _checked_bag_ids(ids, bags):
    """`ids` once `bags` are bags the lookup accepts (CtrCheckBags): what an
    inserting find reads, so that input the pooling refuses changes nothing."""
    weights, has_weights = _op_weights(_weights_values(bags.weights))
    return _ops.ctr_check_bags(ids=ids, segments=_op_segments(bags.segments),
                               num_rows=tf.cast(bags.num_rows, tf.int64), weights=weights,
                               segment_kind=bags.kind, has_weights=has_weights)


def _lookup(table, ids, segments, num_rows, weights, *, segment_kind, combiner, id_mode="index",
            invalid_ids="error", prune_weights=False, default_id=-1, max_norm=None, grad_indices="per_id",
            empty_grad_row=-1, hash_key=(), prune_broadcast=False, name=None):
    """The fused op over `table`: a tensor, or a variable (`table_operand`) read in place."""
    weights, has_weights = _op_weights(weights)
    args = dict(
        ids=_ids_tensor(ids, hashed=id_mode == "hash"),
        segments=_op_segments(segments),
        num_rows=tf.cast(num_rows, tf.int64),
        weights=weights,
        combiner=check_combiner(combiner),
        segment_kind=segment_kind,
        id_mode=id_mode,
        invalid_ids=invalid_ids,
        prune_weights=prune_weights,
        default_id=default_id,
        max_norm=max_norm_attr(max_norm),
        has_weights=has_weights,
        grad_indices=grad_indices,
        empty_grad_row=empty_grad_row,
        hash_key=list(hash_key),
        prune_broadcast=prune_broadcast,
        name=name,
    )
    var = in_place_variable(table)
    check_table_dtype((var if var is not None else table).dtype)
    if var is None:
        return _ops.ctr_embedding_lookup(params=read_table(table), **args)
    # As ResourceVariable.sparse_read does: the tape (or the graph) records
    # that the variable was read, so its gradient is taken through the handle.
    resource_variable_ops.variable_accessed(var)
    return _ops.ctr_resource_embedding_lookup(params=var.handle, T=var.dtype, **args)


def _lookup_grad_attrs(op):
    attrs = {k: op.get_attr(k) for k in (
        "combiner", "segment_kind", "id_mode", "invalid_ids", "prune_weights", "default_id",
        "max_norm", "has_weights", "num_buckets")}
    for optional in ("empty_grad_row", "hash_key", "prune_broadcast"):
        try:
            attrs[optional] = op.get_attr(optional)
        except ValueError:  # a node built without the attr (by an older graph): its default
            pass
    return {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}


def _lookup_grads(op, grad, grad_op, table_shape):
    params, ids, segments, num_rows, weights = op.inputs
    params = forward_table(params)
    params_grad, weights_grad = pooled_grads(grad, grad_op, table_shape, params, ids, segments, num_rows, weights,
                                             _lookup_grad_attrs(op), grad_form(op))
    return [params_grad, None, None, None, weights_grad]


def pooled_grads(grad, grad_op, table_shape, params, ids, segments, num_rows, weights, attrs, order):
    """(params gradient as IndexedSlices, weights gradient or None) of a
    lookup with these inputs and attrs, through its gradient op."""
    values, indices, weights_grad, merged = grad_op(
        grad=grad, params=params, ids=ids, segments=segments, num_rows=num_rows,
        weights=weights, grad_indices=order, **attrs)
    weights_grad = weights_grad if attrs["has_weights"] else None
    if order == "dense":
        return tf.math.unsorted_segment_sum(values, indices, table_shape(params)[0]), weights_grad
    if order != "per_id":  # the CPU kernel merges the rows; the GPU kernel leaves that to us
        values, indices = tf.cond(merged, lambda: (values, indices), lambda: _merge_grad_rows(values, indices))
    if attrs["id_mode"] != "hash" and indices.dtype != ids.dtype:
        # TF's gradient names rows in the ids' own dtype (Gather's indices);
        # a tf.cond whose other branch is a TF lookup needs the same dtypes.
        indices = tf.cast(indices, ids.dtype)
    return table_gradient(values, indices, table_shape(params)), weights_grad


# Every table gradient's dense_shape is int32, as Gather's and
# ResourceGather's gradients give it: a tf.cond or tf.case mixing lookups of
# one table (these, TF's, the string and hash-table ones) needs one
# IndexedSlices type in every branch.
@tf.RegisterGradient("CtrEmbeddingLookup")
def _embedding_lookup_grad(op, grad):
    return _lookup_grads(op, grad, _ops.ctr_embedding_lookup_grad, dense_table_shape)


@tf.RegisterGradient("CtrResourceEmbeddingLookup")
def _resource_embedding_lookup_grad(op, grad):
    """The variable's gradient, IndexedSlices of its rows, as ResourceGather's."""
    return _lookup_grads(op, grad, _ops.ctr_resource_embedding_lookup_grad, resource_variable_ops.variable_shape)


def _no_second_order(op, *grads):
    raise NotImplementedError(
        f"{op.type}: gradients of tf_ctr_ops' lookup gradients (second-order gradients, a gradient penalty, a "
        f"Hessian-vector product, forward-mode differentiation) are not implemented; use the TF-native lookup where "
        f"a model needs them")


for _grad_op in ("CtrEmbeddingLookupGrad", "CtrResourceEmbeddingLookupGrad", "CtrStringEmbeddingGrad"):
    tf.RegisterGradient(_grad_op)(_no_second_order)


def _merge_grad_rows(values, indices):
    """The gradient rows of each table row summed into one, in order of first
    appearance, as TF's gradient of its Unique + Gather gives them."""
    unique, position = tf.unique(indices)
    return tf.math.unsorted_segment_sum(values, position, tf.size(unique)), unique


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
        return _Bags(ids.values, ids.indices[:, 0], _checked_dense_shape(ids)[0], "row_ids", w)
    ids = tf.convert_to_tensor(ids)
    if ids.shape.rank is None:  # a function's TensorSpec(None): checked when it runs
        ids = dense_matrix(ids)
    if ids.shape.rank != 2:
        padding = '""' if ids.dtype == tf.string else repr(padding_value)  # string keys pad with ""
        raise ValueError(f"dense ids must be [B, N] padded with {padding}, got shape {ids.shape}")
    shape = tf.shape(ids, out_type=tf.int64)
    splits = tf.range(shape[0] + 1, dtype=tf.int64) * shape[1]
    w = None
    if weights is not None:
        w = tf.reshape(dense_weights_like(weights, ids), [-1])
    return _Bags(tf.reshape(ids, [-1]), splits, -1, "row_splits", w)


def _checked_dense_shape(sparse):
    """The SparseTensor's dense_shape, checked to be non-negative as TF's
    sparse ops check it (-1 rows is the fused op's "as many as the row ids
    say", which a bad shape must not become)."""
    shape = sparse.dense_shape
    static = tf.get_static_value(shape)
    if static is not None and (np.asarray(static) >= 0).all():
        return shape
    with tf.control_dependencies([tf.debugging.assert_non_negative(
            shape, message="SparseTensor dense_shape must be non-negative")]):
        return tf.identity(shape)


def _with_batch_dim(out, ids):
    """Carries the static batch size of the id container over to the output."""
    batch = ids.shape[0] if ids.shape.rank else None
    if batch is not None:  # out.shape[1:] is unknown for a table of unknown rank
        out.set_shape(tf.TensorShape([batch]).concatenate(out.shape[1:]))
    return out


# ---------------------------------------------------------------------------
# Drop-in replacements for tf.nn and tf.compat.v1.nn
#
# The rules below are those of TF 2.21's tensorflow/python/ops/embedding_ops.py
# and ragged/ragged_embedding_ops.py, which the drop-ins must match call for
# call (docs/tf_contract.md); TF's own tests run against them in
# tests/test_tf_contract.py.

PARTITION_STRATEGIES = ("mod", "div")
POOLED_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)


def _shard_list(params):
    """The shards of a table as TF's lookups read them.

    Only a list or a PartitionedVariable is a list of shards; anything else
    (a tuple too) is one table, converted as tf.convert_to_tensor does.
    """
    if isinstance(params, (list, variables.PartitionedVariable)):
        return list(params)
    return [params]


def _read_shard(shard, dtype=None, in_place=False):
    """A shard's value, converted to `dtype` the way safe_embedding_lookup_sparse does.

    That function converts every shard to the weights' dtype (a tensor of
    another float type is a ValueError, as convert_to_tensor says), and keeps
    a resource variable of that dtype as it is. in_place: a variable the fused
    op can read in place is returned itself (the table is one shard).
    """
    if dtype is not None and not (resource_variable_ops.is_resource_variable(shard) and shard.dtype == dtype):
        shard = tf.convert_to_tensor(shard, dtype=dtype)
    return table_operand(shard) if in_place else read_table(shard)


def div_table(params, op):
    """One table from `params` as tf.nn.safe_embedding_lookup_sparse reads
    them: a list or a PartitionedVariable is shards in the "div" layout (in
    order, so ids need no remapping), anything else one table. A
    ShardedVariable is refused: op gathers from one table, and reading its
    shards whole on every step is what ParameterServerStrategy shards them
    to avoid."""
    if sharded_variables(params) is not None:
        raise TypeError(f"{op} gathers from one table; a ShardedVariable (ParameterServerStrategy) is not "
                        "supported. Look the ids up first and pool them with "
                        "tf_ctr_ops.safe_embedding_lookup_sparse, which gathers shard by shard.")
    shards = _shard_list(params)
    if not shards:
        raise ValueError(f"Missing embedding_weights {params}.")
    table = _MergedShards([read_table(s) for s in shards], "div").table
    check_table_dtype(table.dtype)
    return table


def check_table_dtype(dtype):
    if dtype not in POOLED_DTYPES:
        raise TypeError(f"embedding tables must be float16, bfloat16, float32 or float64, got {dtype.name}")


def _check_shards(parts):
    dtypes = {p.dtype for p in parts}
    if len(dtypes) > 1:
        raise TypeError(f"all shards of a table must have one dtype, got {[p.dtype.name for p in parts]}")
    check_table_dtype(parts[0].dtype)
    for p in parts:
        if p.shape.rank == 0:
            raise ValueError(f"an embedding table must have rank >= 1 ([V] or [V, d1, ...]), got shape {p.shape}")


def _layout_checks(parts, strategy):
    """Checks that the shards follow TF's layout; returns run-time assertions for dynamic sizes.

    A list of shards of other sizes would be read by TF with ids landing in
    other rows than the concatenation suggests (or out of its shard), so it
    is refused rather than reinterpreted.
    """
    sizes = [p.shape[0] if p.shape.rank is not None else None for p in parts]
    n = len(parts)
    if all(s is not None for s in sizes):
        expected = canonical_shard_sizes(sum(sizes), n)
        if sizes != expected:
            raise ValueError(
                f"shard sizes {sizes} do not follow the layout {expected} that partition_strategy="
                f"{strategy!r} reads a table of {sum(sizes)} rows in {n} shards with")
        return []
    dynamic = tf.stack([tf.shape(p, out_type=tf.int64)[0] for p in parts])
    total = tf.reduce_sum(dynamic)
    expected = total // n + tf.cast(tf.range(n, dtype=tf.int64) < total % n, tf.int64)
    return [tf.debugging.assert_equal(
        dynamic, expected,
        message=f"shard sizes do not follow the layout partition_strategy={strategy!r} reads {n} shards with")]


def _mod_row(shard, local, total, n, minimum):
    """Row of the concatenated shards that holds local row `local` of shard
    `shard` in TF's layout: shard p starts at row p * (V // n) + min(p, V % n)."""
    return shard * (total // n) + minimum(shard, total % n) + local


def _merged_rows_mod(ids, total, n):
    """Row of the concatenated shards holding each id under the "mod" strategy
    (id r is local row r // n of shard r % n). Ids outside [0, V) are left as
    they are, so the fused op drops or rejects them with their own value."""
    total = tf.cast(total, ids.dtype)
    merged = _mod_row(ids % n, ids // n, total, n, tf.minimum)
    return tf.where((ids >= 0) & (ids < total), merged, ids)


class _MergedShards:
    """Shards as one table (`table`), with the rows of the concatenation that
    hold the ids (`rows`) and the default_id (`default_row`)."""

    def __init__(self, parts, strategy):
        self._mod = None
        if len(parts) == 1:
            self.table = parts[0]
            return
        if strategy not in PARTITION_STRATEGIES:
            raise ValueError(f"Unrecognized partition strategy: {strategy}")
        checks = _layout_checks(parts, strategy)
        with tf.control_dependencies(checks):
            self.table = tf.concat(parts, axis=0)
        if strategy == "mod":  # "div": shard p holds the run of ids after shard p - 1's, as concatenated
            static = not checks
            self._mod = (len(parts), sum(p.shape[0] for p in parts) if static else None)

    def rows(self, ids):
        if self._mod is None:
            return ids
        n, total = self._mod
        return _merged_rows_mod(ids, tf.shape(self.table, out_type=tf.int64)[0] if total is None else total, n)

    def default_row(self, default_id):
        """The attr value for `default_id` (-1: none)."""
        default_id = check_default_id(default_id)
        if self._mod is None or default_id < 0:
            return default_id
        n, total = self._mod
        if total is None:
            raise ValueError("default_id with 'mod' shards needs their sizes known at graph construction")
        return _mod_row(default_id % n, default_id // n, total, n, min) if default_id < total else default_id


def _place_ids(ids, sizes, strategy):
    """(shard, local row) of each id in [0, V) among shards of static
    `sizes` in `strategy`'s layout: "div" gives shard p the run of ids after
    shard p - 1's, "mod" gives it the ids r with r % n == p, at row r // n."""
    if strategy == "mod":
        return tf.cast(ids % len(sizes), tf.int32), ids // len(sizes)
    starts = np.cumsum([0] + sizes[:-1]).astype(np.int64)
    shard = tf.cast(tf.searchsorted(tf.constant(starts[1:]), ids, side="right"), tf.int32)
    return shard, ids - tf.gather(tf.constant(starts), shard)


def _gather_on_shard(shard, local_ids):
    """The rows of one shard, gathered where the shard lives (its parameter
    server), as TF's partitioned lookups gather them: never read whole."""
    with tf.compat.v1.colocate_with(shard):
        return tf.gather(shard, local_ids)


def _unique_kept(ids, weights, bags, *, table_rows, prune_weights, fill, idx_base=0):
    """The ids a lookup of a table in shards gathers, as TF's lookups list
    them (CtrUniqueKept): (unique ids, the index of each entry into them or
    -1 where it is left out, the index of the `fill` id, listed at the first
    empty bag as TF's safe lookup lists it, or -1 where no bag is empty).
    `idx_base` is added to the entries' indices that are not -1."""
    weights, has_weights = _op_weights(weights)
    return _ops.ctr_unique_kept(ids=ids, segments=_op_segments(bags.segments),
                                num_rows=tf.cast(bags.num_rows, tf.int64), weights=weights, segment_kind=bags.kind,
                                has_weights=has_weights, table_rows=table_rows,
                                prune_weights=bool(prune_weights) and has_weights,
                                fill_id=-1 if fill is None else fill, idx_base=idx_base)


def after_check(out, check):
    """`out`, read through a data edge from `check`: the [B, 0] output of a
    fused op run on a [V, 0] table only for its errors. Grappler turns a
    stateless op that only control edges read into a NoOp, so in a
    tf.function a control dependency alone would drop the check (an id out
    of range would then be skipped unsaid)."""
    empty = tf.reshape(check, tf.concat([tf.shape(out)[:-1], [0]], 0))
    joined = tf.concat([out, tf.cast(empty, out.dtype)], axis=-1)
    joined.set_shape(out.shape)
    return joined


def _sharded_lookup(shards, bags, *, strategy="div", dtype=None, default_id=None, **attrs):
    """CtrEmbeddingLookup over a table in shards without concatenating them.

    As TF's own lookups read a ShardedVariable or a list of partitions: the
    ids are de-duplicated here (on the worker), each shard gathers the rows
    it holds in `strategy`'s layout (on the shard's device: its parameter
    server), and the fused op pools the gathered [U, D] rows here. The ids
    are first checked against the whole table by the same op on a [V, 0]
    view of it, so dropped, pruned and rejected ids, and the errors naming a
    row and an id, are those of one table (its empty output joins the
    result: no graph runs without it).
    Gradients reach each shard as IndexedSlices of its own rows, listed in
    the order TF lists them (the unique ids' first appearance).
    """
    if dtype is not None and any(s.dtype != dtype for s in shards):
        raise ValueError(f"the shards are {shards[0].dtype.name}, the weights {dtype.name}: "
                         "a table is not converted to another float type")
    _check_shards(shards)
    sizes = static_row_counts(shards)
    if sizes is None:
        raise ValueError("the shards of a table read shard by shard must have static row counts")
    if strategy not in PARTITION_STRATEGIES:
        raise ValueError(f"Unrecognized partition strategy: {strategy}")
    _layout_checks(shards, strategy)
    total = sum(sizes)
    attrs.update(default_id=check_default_id(default_id))
    ids = tf.cast(_ids_tensor(bags.ids, hashed=False), tf.int64)
    weights = _weights_values(bags.weights)
    check = _lookup(tf.zeros([total, 0], shards[0].dtype), ids, bags.segments, bags.num_rows, weights,
                    segment_kind=bags.kind, **attrs)
    with tf.control_dependencies([check]):
        # The row an empty bag reads (default_id) or lists in the gradient
        # (empty_grad_row): the op's attr names row 0, which holds a copy
        # of it, read only when a bag is left empty, as TF reads it only to
        # fill one. Its id is listed where TF lists it (the shards'
        # gradients then list their rows in TF's order).
        attr, fill = (("default_id", default_id) if default_id is not None
                      else ("empty_grad_row", attrs.get("empty_grad_row", -1)))
        filled = 0 <= fill < total
        # Only the entries the op pools are gathered (each shard's gradient
        # then has rows for those alone, as with one table); those left out
        # read -1, which the op drops (skip modes) or never sees (the check
        # failed first).
        unique, local_ids, fill_idx = _unique_kept(ids, weights, bags, table_rows=total,
                                                   prune_weights=attrs.get("prune_weights"),
                                                   fill=int(fill) if filled else None,
                                                   idx_base=1 if filled else 0)  # row 0: the fill's
        shard, local = _place_ids(unique, sizes, strategy)
        positions = tf.dynamic_partition(tf.range(tf.size(unique)), shard, len(shards))
        locals_ = tf.dynamic_partition(local, shard, len(shards))
        # Gathered by ids of the ids' own dtype, as TF gathers them: the
        # shards' IndexedSlices gradients then have TF's indices dtype.
        index_dtype = tf.int32 if bags.ids.dtype == tf.int32 else tf.int64
        rows = tf.dynamic_stitch(positions, [_gather_on_shard(s, tf.cast(ids_p, index_dtype))
                                             for s, ids_p in zip(shards, locals_)])
        if filled:
            fill_row = tf.cond(fill_idx >= 0, lambda: tf.gather(rows, fill_idx[None]),
                               lambda: tf.zeros(tf.concat([[1], tf.shape(rows)[1:]], 0), rows.dtype))
            rows = tf.concat([fill_row, rows], 0)
    # Every error is the check's, which names the id and the range of the
    # whole table: the pooling skips what the check let it skip (-1), and
    # reads the fill at row 0 or nothing.
    pool_attrs = dict(attrs, invalid_ids="skip_negative", default_id=-1, empty_grad_row=-1)
    if filled:
        pool_attrs[attr] = 0
    return after_check(_lookup(rows, local_ids, bags.segments, bags.num_rows, weights, segment_kind=bags.kind,
                               **pool_attrs), check)


# The drop-ins' params gradient: unique rows in first-appearance order, as TF
# gives it for variables, and for tensor tables but where _drop_in_grad_form
# says otherwise (docs/tf_contract.md).
_DROP_IN_GRAD_INDICES = "first_appearance"


def safe_lookup_grad_form(default_id):
    """The gradient form of a safe_embedding_lookup_sparse (which the column
    and vocabulary lookups stand for too): a row per distinct id (its
    Unique), and without a default_id a zero row for id 0, which fills the
    bags left empty: a sparse optimizer update such as momentum's moves that
    row as TF's does."""
    return dict(grad_indices=_DROP_IN_GRAD_INDICES, empty_grad_row=0 if default_id is None else -1)


def _drop_in_grad_form(table_is_tensor, weighted, allow_fast_lookup, max_norm):
    """The params gradient TF's embedding_lookup_sparse_impl gives: with
    allow_fast_lookup, no max_norm and one table that reaches it as a tensor
    (not a resource variable, which is a CompositeTensor), it skips Unique:
    the gradient is then one row per id (weighted, Gather's gradient) or
    dense (unweighted, SparseSegment*Grad's). Optimizers see the difference:
    a dense gradient updates every row, and clip_by_global_norm counts a
    repeated id's rows apart."""
    if not (allow_fast_lookup and max_norm is None and table_is_tensor):
        return _DROP_IN_GRAD_INDICES
    return "per_id" if weighted else "dense"


def _single_table(params):
    """params as the one table of a lookup, or None for shards."""
    if isinstance(params, (list, tuple)):
        return params[0] if len(params) == 1 else None
    return None if isinstance(params, variables.PartitionedVariable) else params


def _ragged_bags(ids, weights, arg_names):
    if ids.ragged_rank != 1 or ids.flat_values.shape.rank != 1:
        raise ValueError(f"{arg_names[0]} must be a RaggedTensor of rank 2 with one ragged dimension, "
                         f"got ragged rank {ids.ragged_rank} and shape {ids.shape}")
    w = None
    if weights is not None:
        if not isinstance(weights, tf.RaggedTensor):
            raise TypeError(f"{arg_names[0]} must be of the same type as {arg_names[1]}, received "
                            f"{type(ids).__name__!r} for {arg_names[0]} and {type(weights).__name__!r} "
                            f"for {arg_names[1]}.")
        ids.values.shape.assert_is_compatible_with(weights.values.shape)
        ids.shape.assert_is_compatible_with(weights.shape)
        w = weights.values
    return ids, w


def _sparse_weights_values(ids, weights):
    if weights is None:
        return None
    if not isinstance(weights, tf.SparseTensor):
        raise TypeError(f"sp_weights must be either None or SparseTensor,got {type(weights)}")
    ids.values.shape.assert_is_compatible_with(weights.values.shape)
    ids.indices.shape.assert_is_compatible_with(weights.indices.shape)
    ids.dense_shape.shape.assert_is_compatible_with(weights.dense_shape.shape)
    return weights.values


def _lookup_sparse_bags(sp_ids, sp_weights):
    """embedding_lookup_sparse's bags: the row of each id, as its segment ops take them."""
    if isinstance(sp_ids, tf.RaggedTensor):
        ids, w = _ragged_bags(sp_ids, sp_weights, ("sp_ids", "sp_weights"))
        return _Bags(ids.values, ids.value_rowids(), -1, "row_ids", w)
    if not isinstance(sp_ids, tf.SparseTensor):
        raise TypeError(f"sp_ids must be a SparseTensor or a RaggedTensor, got {type(sp_ids).__name__}")
    return _Bags(sp_ids.values, sp_ids.indices[:, 0], -1, "row_ids", _sparse_weights_values(sp_ids, sp_weights))


def _integer_ids(bags, argument, fix="hash string keys with tf_ctr_ops.hash_embedding "
                 "(or tf.strings.to_hash_bucket_fast)"):
    """Bags whose ids index rows: strings are refused before the kernel,
    whose message is about its id_mode, an argument these functions lack."""
    if bags.ids.dtype == tf.string:
        raise TypeError(f"{argument} must hold integer ids, got strings: {fix}")
    return bags


def _embedding_lookup_sparse(params, sp_ids, sp_weights, partition_strategy, name, combiner, max_norm,
                             allow_fast_lookup=False):
    combiner = check_combiner(combiner or "mean")
    bags = _integer_ids(_lookup_sparse_bags(sp_ids, sp_weights), "sp_ids")
    table = _single_table(params)
    # TF converts a lone table that is neither a tensor nor a composite one (a
    # TF1 RefVariable) to a tensor.
    form = _drop_in_grad_form(table is not None and not isinstance(table, composite_tensor.CompositeTensor),
                              sp_weights is not None, allow_fast_lookup, max_norm)
    # The output is named as the scope (`foo:0` for name="foo"), as TF's is.
    with tf.name_scope(name or "embedding_lookup_sparse") as scope:
        shards = sharded_variables(params)
        if shards is not None:
            return tf.identity(_sharded_lookup(shards, bags, combiner=combiner, max_norm=max_norm,
                                               grad_indices=_DROP_IN_GRAD_INDICES), name=scope)
        shards = _shard_list(params)
        if not shards:
            raise ValueError("Need at least one param")
        separate = separate_shards(shards)
        if separate is not None:
            return tf.identity(_sharded_lookup(separate, bags, strategy=partition_strategy, combiner=combiner,
                                               max_norm=max_norm, grad_indices=_DROP_IN_GRAD_INDICES), name=scope)
        parts = [_read_shard(p, in_place=len(shards) == 1) for p in shards]
        _check_shards(parts)
        merged = _MergedShards(parts, partition_strategy)
        return _lookup(merged.table, merged.rows(bags.ids), bags.segments, -1, _weights_values(bags.weights),
                       segment_kind="row_ids", combiner=combiner, max_norm=max_norm, grad_indices=form,
                       name=scope)


def _in_row_order(rows, ids, weights, num_rows, drops=None):
    """Entries stably sorted by row, when they are not already.

    TF's safe lookup accepts a SparseTensor out of canonical order (its
    sparse_fill_empty_rows sorts by row); the fused op takes bags in row order.
    It also drops negative ids (and pruned weights) before that op checks the
    indices, so a dropped entry's index is never checked: drops(ids, weights)
    names such entries, which go to row 0, where the lookup drops them too.
    Both run only for such input: rows in order and inside [0, num_rows) have
    nothing to sort or move.
    """
    tensors = [rows, ids] + ([] if weights is None else [weights])
    ordered = tf.reduce_all(rows[1:] >= rows[:-1])
    if drops is not None:  # sorted, so the ends bound every row
        ordered = tf.logical_and(ordered, tf.logical_and(tf.reduce_all(rows[:1] >= 0),
                                                         tf.reduce_all(rows[-1:] < num_rows)))

    def sort():
        kept_rows = rows if drops is None else tf.where(drops(ids, weights), tf.zeros_like(rows), rows)
        perm = tf.argsort(kept_rows, stable=True)
        return [tf.gather(t, perm) for t in [kept_rows] + tensors[1:]]

    out = tf.cond(ordered, lambda: [tf.identity(t) for t in tensors], sort)
    return out[0], out[1], (out[2] if weights is not None else None)


def _safe_drops(prune_weights):
    """The entries TF's safe lookup drops before it checks their indices:
    negative ids and, with prune_weights, weights <= 0 (NaN too, as
    tf.greater(w, 0) says)."""
    def drops(ids, weights):
        dropped = ids < 0
        if prune_weights and weights is not None:
            dropped = tf.logical_or(dropped, tf.logical_not(weights > 0))
        return dropped
    return drops


def _pruned_by_broadcast(rows, ids, weights):
    """(rows, ids, weights), none of them where TF's safe lookup prunes every
    entry: its one mask of ids and weights, logical_and(ids >= 0,
    ones_like(weights)), broadcasts one value against none when the graph
    runs, so one id and no weight, or one weight and no id (a request that
    lacks a weighted column's weight feature, or its id feature), leave every
    bag empty. The rewrite's fused ops do the same (their prune_broadcast)."""
    n, m = tf.size(ids, out_type=tf.int64), tf.size(weights, out_type=tf.int64)
    pruned = tf.equal(n + m, 1)
    kept_ids, kept_weights = tf.where(pruned, tf.zeros_like(n), n), tf.where(pruned, tf.zeros_like(m), m)
    return rows[:kept_ids], ids[:kept_ids], weights[:kept_weights]


def _safe_sparse_bags(sparse_ids, sparse_weights, prune_weights=None):
    """(bags, lead) of safe_embedding_lookup_sparse's SparseTensor ids [d0, ..., dn]:
    a bag per index of the lead dimensions [d0, ..., dn-1], linearised as
    sparse_reshape does. prune_weights: whether the lookup drops weights <= 0;
    None when the values are keys to find, not ids (nothing is dropped yet)."""
    w = None
    if sparse_weights is not None:
        if not isinstance(sparse_weights, tf.SparseTensor):
            raise TypeError(f"sparse_weights must be None or a SparseTensor like sparse_ids, "
                            f"got {type(sparse_weights)}")
        # TF rebuilds the weights as SparseTensor(ids.indices, weights.values, ...).
        sparse_ids.indices.shape[:1].assert_is_compatible_with(sparse_weights.values.shape)
        w = sparse_weights.values
    dense_shape = _checked_dense_shape(sparse_ids)
    if sparse_ids.shape.rank == 2:
        rows, num_rows, lead = sparse_ids.indices[:, 0], dense_shape[0], dense_shape[:1]
    else:
        lead = dense_shape[:-1]
        # As sparse_reshape to [bags, dense_shape[-1]] does, in C++'s integer
        # division: a last index past dense_shape[-1] carries into a later bag.
        strides = tf.math.cumprod(dense_shape, exclusive=True, reverse=True)
        flat = tf.reduce_sum(sparse_ids.indices * strides[tf.newaxis, :], axis=1)
        nnz = tf.size(flat, out_type=tf.int64)
        # sparse_reshape's own check: entries in a shape of no elements.
        with tf.control_dependencies([tf.debugging.assert_equal(
                tf.logical_or(tf.equal(nnz, 0), tf.reduce_prod(dense_shape) > 0), True,
                message="sparse_ids has entries but its dense_shape holds no elements (or more than 2^63 - 1)")]):
            rows = tf.truncatediv(flat, tf.maximum(dense_shape[-1], 1))
        num_rows = tf.reduce_prod(lead)
    ids = sparse_ids.values
    if w is not None:
        rows, ids, w = _pruned_by_broadcast(rows, ids, w)
    # Other id types are refused by the lookup.
    drops = _safe_drops(prune_weights) if prune_weights is not None and sparse_ids.values.dtype.is_integer else None
    rows, ids, w = _in_row_order(rows, ids, w, num_rows, drops)
    return _Bags(ids, rows, num_rows, "row_ids", w), lead


def _safe_embedding_lookup_sparse(embedding_weights, sparse_ids, sparse_weights, combiner, default_id, name,
                                  partition_strategy, max_norm, allow_fast_lookup=False):
    if embedding_weights is None:
        raise ValueError(f"Missing embedding_weights {embedding_weights}.")
    check_default_id(default_id)
    sharded = sharded_variables(embedding_weights)
    shards = sharded or _shard_list(embedding_weights)
    if not shards:
        raise ValueError(f"Missing embedding_weights {embedding_weights}.")
    dtype = sparse_weights.dtype if sparse_weights is not None else None
    # TF's dispatch for a ShardedVariable passes its shards on as a list, in
    # partition_strategy's layout ("div" in v2), and never converts them.
    shards_dtype = dtype if sharded else None
    if not sharded:
        # Converted as TF converts them (a tf.function's captured tensor
        # keeps its dtype, as TF's lookup finds it).
        sharded = separate_shards(shards, dtype)
    parts = sharded or [_read_shard(w, dtype, in_place=len(shards) == 1) for w in shards]
    _check_shards(parts)
    combiner = check_combiner(combiner if combiner is not None else "mean")  # as TF falls back
    with tf.name_scope(name or "embedding_lookup"):
        if isinstance(sparse_ids, tf.RaggedTensor):
            ids, w = _ragged_bags(sparse_ids, sparse_weights, ("sparse_ids", "sparse_weights"))
            bags = _Bags(ids.values, ids.row_splits, -1, "row_splits", w)
        elif isinstance(sparse_ids, tf.SparseTensor):
            bags, lead = _safe_sparse_bags(sparse_ids, sparse_weights, combiner != "sum")
        else:
            raise TypeError(f"sparse_ids must be a SparseTensor or a RaggedTensor, got {type(sparse_ids).__name__}")
        _integer_ids(bags, "sparse_ids")
        weighted = bags.weights is not None
        table = _single_table(embedding_weights)
        # TF keeps a resource variable of the weights' dtype; any other table it converts to a tensor.
        table_is_tensor = table is not None and not sharded and not (
            resource_variable_ops.is_resource_variable(table) and dtype in (None, table.dtype))
        attrs = dict(combiner=combiner, invalid_ids="skip_negative", prune_weights=combiner != "sum" and weighted,
                     max_norm=max_norm)
        if sharded:
            result = _sharded_lookup(parts, bags, strategy=partition_strategy, dtype=shards_dtype,
                                     default_id=default_id, **safe_lookup_grad_form(default_id), **attrs)
            row_shape = parts[0].shape[1:]
        else:
            merged = _MergedShards(parts, partition_strategy)
            result = _lookup(merged.table, merged.rows(bags.ids), bags.segments, bags.num_rows,
                             _weights_values(bags.weights), segment_kind=bags.kind,
                             default_id=merged.default_row(default_id),
                             # TF fills a bag left empty with id 0, row 0 of the concatenation too
                             empty_grad_row=0 if default_id is None else -1,
                             grad_indices=_drop_in_grad_form(table_is_tensor, weighted, allow_fast_lookup, max_norm),
                             **attrs)
            row_shape = merged.table.shape[1:]
        rank = sparse_ids.shape.rank
        if isinstance(sparse_ids, tf.SparseTensor) and rank != 2:
            result = tf.reshape(result, tf.concat([lead, tf.shape(result, out_type=tf.int64)[1:]], 0))
            if rank is not None:
                result.set_shape(tf.TensorShape([None] * (rank - 1)).concatenate(row_shape))
        return result


def _run_time_max_norm(max_norm):
    """Whether max_norm is a tensor (or variable) whose value only a run
    gives. The fused op takes max_norm as an attr, so TF's own function
    (from its module: tf.nn is never patched) computes such a lookup."""
    return max_norm is not None and known_value(max_norm) is None


def _integer_table(params):
    """Whether the table (or its first shard) holds integers: TF's lookups
    pool those (Gather and SparseSegmentSum take them), the fused kernels pool
    floats only, so TF's own function computes such a lookup."""
    first = params[0] if isinstance(params, (list, tuple)) and params else params
    dtype = getattr(first, "dtype", None)
    try:
        if dtype is None:  # nested Python lists, converted as TF converts them
            dtype = tf.constant(first).dtype
        return tf.as_dtype(dtype).is_integer
    except (TypeError, ValueError):
        return False


def _tf_computes(params, max_norm):
    return _run_time_max_norm(max_norm) or _integer_table(params)


def embedding_lookup_sparse(params, sp_ids, sp_weights, combiner=None, max_norm=None, name=None,
                            allow_fast_lookup=False):
    """Fused drop-in for `tf.nn.embedding_lookup_sparse` (TF 2.21).

    Same arguments, output shape, dtype, values (up to summation order) and
    errors: rows are pooled over `sp_ids.indices[:, 0]` (or the rows of a
    RaggedTensor), the output has `max(row) + 1` rows (rows with no ids are
    zeros), every id must lie in `[0, V)`. `params` is a table of any rank >= 1
    (float16, bfloat16, float32 or float64), a list of shards in the "div"
    layout, or a PartitionedVariable. Shards are gathered one by one where
    each lives, as TF gathers them, never concatenated (unless their row
    counts are known only at run time). One `CtrEmbeddingLookup` op replaces
    Unique, Gather and SparseSegment*; the params gradient is IndexedSlices
    with unique indices in first-appearance order, as TF's, or, with
    `allow_fast_lookup` on a tensor table (a TF1 RefVariable too), the form
    TF's path without Unique gives: one row per id weighted, dense unweighted.

    Args:
      params: `[V, ...]` table, a list of shards in TF's "div" layout, a
        PartitionedVariable, or a ShardedVariable (read shard by shard, the
        rows of each gathered where it lives, never concatenated).
      sp_ids: `tf.SparseTensor` or `tf.RaggedTensor` `[B, (n)]` of int ids.
      sp_weights: `None` or weights in the same container as `sp_ids`.
      combiner: "sum", "mean" (default) or "sqrtn".
      max_norm: if set, rows are clipped to this L2 norm before pooling.
      name: a name scope for the op.
      allow_fast_lookup: as TF's: it changes only the form of a tensor
        table's gradient (the fused op never runs Unique).

    Returns:
      `[rows] + params.shape[1:]` tensor of the params dtype.
    """
    if _tf_computes(params, max_norm):
        return embedding_ops.embedding_lookup_sparse_v2(params, sp_ids, sp_weights, combiner, max_norm, name,
                                                        allow_fast_lookup)
    return _embedding_lookup_sparse(params, sp_ids, sp_weights, "div", name, combiner, max_norm, allow_fast_lookup)


def safe_embedding_lookup_sparse(embedding_weights, sparse_ids, sparse_weights=None, combiner="mean",
                                 default_id=None, max_norm=None, name=None, allow_fast_lookup=False):
    """Fused drop-in for `tf.nn.safe_embedding_lookup_sparse` (TF 2.21).

    Negative ids are dropped; with a combiner other than "sum", entries whose
    weight is not positive are dropped too. Rows left empty give zeros, or
    the row `default_id` when it is given. SparseTensor ids of rank > 2 pool
    over the last dimension and the output has shape
    `dense_shape[:-1] + params.shape[1:]`; they need not be in canonical
    order. One `CtrEmbeddingLookup` op replaces the sparse_retain /
    fill_empty_rows / Unique / Gather / SparseSegment* / where chain.

    Args:
      embedding_weights: `[V, ...]` table, a list of shards in TF's "div"
        layout, a PartitionedVariable, or a ShardedVariable (read shard by
        shard, never concatenated); converted to the weights' dtype as TF
        converts it (a ShardedVariable must have the weights' dtype).
      sparse_ids: `tf.SparseTensor` of rank >= 2 or `tf.RaggedTensor [B, (n)]` of int ids.
      sparse_weights: `None` or float weights in the same container.
      combiner: "sum", "mean" (default) or "sqrtn".
      default_id: row for empty rows; `None` gives zeros.
      max_norm: if set, rows are clipped to this L2 norm before pooling.
      name: a name scope for the op.
      allow_fast_lookup: as TF's: it changes only the form of a tensor
        table's gradient, as for `embedding_lookup_sparse`.

    Returns:
      The pooled rows, of the params dtype.
    """
    if _tf_computes(embedding_weights, max_norm):
        return embedding_ops.safe_embedding_lookup_sparse_v2(embedding_weights, sparse_ids, sparse_weights, combiner,
                                                             default_id, max_norm, name, allow_fast_lookup)
    return _safe_embedding_lookup_sparse(embedding_weights, sparse_ids, sparse_weights, combiner, default_id,
                                         name, "div", max_norm, allow_fast_lookup)


def embedding_lookup_sparse_v1(params, sp_ids, sp_weights, partition_strategy="mod", name=None, combiner=None,
                               max_norm=None, allow_fast_lookup=False):
    """Fused drop-in for `tf.compat.v1.nn.embedding_lookup_sparse`: as
    `embedding_lookup_sparse`, with a list of shards read in `partition_strategy`'s
    layout ("mod" by default, as TF's v1 function)."""
    if _tf_computes(params, max_norm):
        return embedding_ops.embedding_lookup_sparse(params, sp_ids, sp_weights, partition_strategy, name, combiner,
                                                     max_norm, allow_fast_lookup)
    return _embedding_lookup_sparse(params, sp_ids, sp_weights, partition_strategy, name, combiner, max_norm,
                                    allow_fast_lookup)


def safe_embedding_lookup_sparse_v1(embedding_weights, sparse_ids, sparse_weights=None, combiner="mean",
                                    default_id=None, name=None, partition_strategy="div", max_norm=None,
                                    allow_fast_lookup=False):
    """Fused drop-in for `tf.compat.v1.nn.safe_embedding_lookup_sparse`: as
    `safe_embedding_lookup_sparse`, with a list of shards read in
    `partition_strategy`'s layout ("div" by default, as TF's v1 function)."""
    if _tf_computes(embedding_weights, max_norm):
        return embedding_ops.safe_embedding_lookup_sparse(embedding_weights, sparse_ids, sparse_weights, combiner,
                                                          default_id, name, partition_strategy, max_norm,
                                                          allow_fast_lookup)
    return _safe_embedding_lookup_sparse(embedding_weights, sparse_ids, sparse_weights, combiner, default_id,
                                         name, partition_strategy, max_norm, allow_fast_lookup)


# ---------------------------------------------------------------------------
# CTR-first API


def sparse_embedding(params, ids, weights=None, combiner="mean", max_norm=None, name=None):
    """Pooled embedding of bags of ids: `[B, D]`, a zero row for an empty bag.

    Args:
      params: `[V, D]` float32/float16/bfloat16 table (Tensor, Variable, a
        list of shards in TF's "div" layout, or a ShardedVariable: shards are
        read shard by shard).
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
        if not isinstance(ids, (tf.RaggedTensor, tf.SparseTensor)):
            ids = tf.convert_to_tensor(ids)  # a list or an array of dense [B, N] ids
        bags = _integer_ids(_bags_from_container(ids, weights, -1), "sparse_embedding's ids",
                            fix="hash_embedding hashes string keys into rows, vocab_embedding looks them up "
                            "in a vocabulary")
        attrs = dict(combiner=combiner, invalid_ids="skip_padding", max_norm=max_norm)
        shards = gathered_shards(params)
        if shards is not None:
            out = _sharded_lookup(shards, bags, **attrs)
        else:
            out = _lookup(as_table(params, in_place=True), bags.ids, bags.segments, bags.num_rows, _weights_values(bags.weights),
                          segment_kind=bags.kind, **attrs)
        return _with_batch_dim(out, ids)


def hash_embedding(params, keys, weights=None, combiner="mean", max_norm=None, hash_key=None, name=None):
    """Pooled embedding of hashed keys: row `to_hash_bucket_fast(key, V)` of `params`.

    Integer keys hash as their decimal string (the Keras `Hashing`
    convention: `to_hash_bucket_fast(as_string(keys), V)`), inside the
    kernel, with no string tensor. String keys hash as themselves. With a
    `hash_key` the hash is `to_hash_bucket_strong(..., key=hash_key)`, as
    `keras.layers.Hashing(salt=...)` hashes.

    Args:
      params: `[V, D]` table; V is the bucket count. A ShardedVariable (or
        a list of shards in TF's "div" layout) is read shard by shard (the
        buckets are then hashed by TF's ops).
      keys: int32/int64/string keys as a `tf.RaggedTensor [B, (n)]`, a
        `tf.SparseTensor [B, N]` or a dense `[B, N]` tensor, where dense
        integer keys equal to -1 (and dense empty strings) are padding.
      weights: optional float weights in the same container as `keys`.
      combiner: "sum", "mean" or "sqrtn".
      max_norm: if set, rows are clipped to this L2 norm before pooling.
      hash_key: None (the fast hash), or an integer or two: the `key` of
        `to_hash_bucket_strong` (one integer s is `[s, s]`, as `Hashing`'s
        salt).

    Returns:
      `[B, D]` tensor of the params dtype.
    """
    hash_key = check_hash_key(hash_key)
    with tf.name_scope(name or "hash_embedding"):
        dense = not isinstance(keys, (tf.RaggedTensor, tf.SparseTensor))
        if dense:
            keys = tf.convert_to_tensor(keys)
        _check_ids_dtype(keys.dtype, hashed=True)  # before the -1 padding is compared with them
        shards = gathered_shards(params)
        if shards is not None:
            return _sharded_hash_embedding(shards, keys, weights, combiner, max_norm, hash_key)
        table = as_table(params, in_place=True)
        if keys.dtype == tf.string:
            table = read_table(table)
            if weights is None:  # the packed-string path owns unweighted string keys
                return strings.hash_string_keys(table, keys, combiner, max_norm, hash_key)
            # Weighted string keys: hash with TF, then the fused weighted lookup.
            if table.shape.rank is None or table.shape[0] is None:
                raise ValueError("weighted string keys need a table whose row count is known when the graph is "
                                 "built (TF's string hash takes the bucket count as an int)")
            keys, weights = strings.string_key_bags(keys, weights)
            buckets = hash_bucket(keys.values, int(table.shape[0]), hash_key)
            return sparse_embedding(table, keys.with_values(buckets), weights, combiner=combiner, max_norm=max_norm)
        bags = _bags_from_container(keys, weights, -1)
        out = _lookup(table, bags.ids, bags.segments, bags.num_rows, _weights_values(bags.weights),
                      segment_kind=bags.kind, combiner=combiner, id_mode="hash",
                      invalid_ids="skip_padding" if dense else "error", max_norm=max_norm, hash_key=hash_key)
        return _with_batch_dim(out, keys)


def _sharded_hash_embedding(shards, keys, weights, combiner, max_norm, hash_key):
    """hash_embedding over a table in shards: the buckets computed by TF's
    hashing (the kernel's is bit-identical to it), then sparse_embedding's
    shard-by-shard lookup, so no shard is read whole. Padding (-1 in dense
    integer keys, "" in dense string keys) is left out, as the single table's
    lookup leaves it out."""
    buckets_of = sum(int(s.shape[0]) for s in shards)
    if not isinstance(keys, (tf.RaggedTensor, tf.SparseTensor)):
        keys = tf.convert_to_tensor(keys)
    dense = not isinstance(keys, (tf.RaggedTensor, tf.SparseTensor))
    if keys.dtype == tf.string:
        ragged, weights = strings.string_key_bags(keys, weights)
        bags = _bags_from_container(ragged.with_values(hash_bucket(ragged.values, buckets_of, hash_key)),
                                    weights, -1)
        invalid_ids = "error"
    else:
        bags = _bags_from_container(keys, weights, -1)
        bags.ids = hash_bucket(tf.strings.as_string(bags.ids), buckets_of, hash_key)
        if dense:  # -1 is padding, never hashed
            bags.ids = tf.where(tf.equal(tf.reshape(keys, [-1]), -1), tf.constant(-1, tf.int64), bags.ids)
        invalid_ids = "skip_padding" if dense else "error"
    out = _sharded_lookup(shards, bags, combiner=combiner, max_norm=max_norm, invalid_ids=invalid_ids)
    return _with_batch_dim(out, keys)

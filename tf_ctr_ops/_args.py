"""Argument checks and table reads shared by the op wrappers and the layers.

One home for each rule, so that `ops`, `strings`, `vocab` and `layers` agree
on them and import one way: every one of them imports this module, and it
imports none of them.
"""

import numpy as np
import tensorflow as tf
from tensorflow.python.distribute import sharded_variable
from tensorflow.python.ops import resource_variable_ops

COMBINERS = ("sum", "mean", "sqrtn")
ID_MODES = ("hash", "index", "mod")
MAX_DELIMITER_BYTES = 16


def check_combiner(combiner):
    if combiner not in COMBINERS:
        raise ValueError(f"combiner must be one of 'mean', 'sqrtn' or 'sum', got {combiner!r}")
    return combiner


def known_value(x):
    """x's value where the call knows it (a number, a constant or eager
    tensor, a variable read eagerly), else None: a tensor or a variable
    captured by a function, whose value only a run gives. For attrs that
    TF's functions take as tensors (max_norm, default_id)."""
    if not isinstance(x, (tf.Tensor, tf.Variable)):
        x = getattr(x, "_value", x)  # a Keras 3 variable wraps a tf.Variable
    if not (tf.is_tensor(x) or isinstance(x, tf.Variable)):
        return x
    if isinstance(x, tf.Variable):
        return x.numpy() if tf.executing_eagerly() else None
    return tf.get_static_value(x)


def max_norm_attr(max_norm):
    """The max_norm attr: -1 (off) for None, else a positive float."""
    if max_norm is None:
        return -1.0
    value = known_value(max_norm)
    if value is None:
        raise ValueError(f"max_norm must be a number or a tensor of known value (the fused op takes it as an "
                         f"attr), got {max_norm}")
    try:
        value = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"max_norm must be a number, got {max_norm!r}") from None
    # TF's clip broadcasts max_norm against the [n, D] rows it clips: one
    # value of rank <= 2 ([1] say) is that value; a higher rank fails there.
    if value.size != 1 or value.ndim > 2:
        raise ValueError(f"max_norm must be a scalar (one value, of rank <= 2), got shape {list(value.shape)}")
    max_norm = float(value.reshape(()))
    if not max_norm > 0:
        raise ValueError(f"max_norm must be positive or None, got {max_norm}")
    # The attr is a float32, and the kernels read a denormal (TF flushes
    # them) or 0 as "no clipping": a norm below float32's least normal clips
    # rows to (nearly) zeros, as TF's float32 clip does.
    return max(max_norm, float(np.finfo(np.float32).tiny))


def check_id_mode(id_mode):
    if id_mode not in ID_MODES:
        raise ValueError(f"id_mode must be one of {ID_MODES}, got {id_mode!r}")
    return id_mode


def check_hash_key(hash_key):
    """The hash_key attr: [] (to_hash_bucket_fast) for None, else the two
    integers of to_hash_bucket_strong's `key` (keras.layers.Hashing's salt:
    one integer s is [s, s]); an already checked [] stays []."""
    if hash_key is None or (isinstance(hash_key, (list, tuple)) and len(hash_key) == 0):
        return []
    if isinstance(hash_key, (int, np.integer)) and not isinstance(hash_key, bool):
        hash_key = [hash_key, hash_key]
    try:
        key = [int(k) for k in hash_key]
    except (TypeError, ValueError):
        raise ValueError(f"hash_key must be None, an integer or two integers, got {hash_key!r}") from None
    if len(key) != 2:  # to_hash_bucket_strong's words for it, which TF's tests match
        raise ValueError(f"Key must have 2 elements: hash_key must be None, an integer or two integers, "
                         f"got {hash_key!r}")
    if any(not -2**63 <= k < 2**63 for k in key):
        raise ValueError(f"hash_key must be None, an integer or two int64 integers, got {hash_key!r}")
    return key


def hash_bucket(strings, num_buckets, hash_key):
    """TF's own string hash of `strings` into `num_buckets`: the one the fused
    kernels follow bit for bit (fast, or strong with a key), for the paths
    that leave hashing to TF (sharded tables, weighted string keys)."""
    if hash_key:
        return tf.strings.to_hash_bucket_strong(strings, num_buckets, key=hash_key)
    return tf.strings.to_hash_bucket_fast(strings, num_buckets)


def check_delimiter(delimiter):
    """The delimiter attr: None means each whole string is one token."""
    if delimiter is None:
        return b""
    if tf.is_tensor(delimiter):  # the op takes it as an attr: its value must be known now
        value = tf.get_static_value(delimiter)
        if value is None or np.ndim(value) != 0:
            raise ValueError(f"delimiter must be a string, or a scalar string tensor of known value (the fused "
                             f"op takes it as an attr), got {delimiter}")
        delimiter = value
    if isinstance(delimiter, str):
        delimiter = delimiter.encode("utf-8")
    if not isinstance(delimiter, bytes) or not delimiter:
        raise ValueError(f"delimiter must be a non-empty string, or None for whole-string tokens, got "
                         f"{delimiter!r}")
    if len(delimiter) > MAX_DELIMITER_BYTES:
        raise ValueError(f"delimiter must be at most {MAX_DELIMITER_BYTES} bytes, got {len(delimiter)}")
    return delimiter


def check_matmul_dtype(dtype, what):
    """The dtype of a multi-hot product's kernel or an indicator's output:
    float32 or float64, the types its CPU kernels are built for."""
    dtype = tf.as_dtype(dtype)
    if dtype not in (tf.float32, tf.float64):
        raise TypeError(f"{what} must be float32 or float64, got {dtype.name}")
    return dtype


def check_default_id(default_id):
    """The default_id attr: -1 (none) for None, else the integer given.

    A row past the table, or a negative one, fails as TF's lookups fail on
    it: at run time, on the first row left empty (a model without empty
    rows never reads it). -1, the attr's "none", gives such rows zeros
    where TF fails on them (tests/test_properties.py: lenient)."""
    if default_id is None:
        return -1
    value = known_value(default_id)  # TF takes eager int64 tensors, variables and 0-d arrays too
    if value is None:
        raise TypeError(f"default_id must be an integer row or None (a tensor or variable of known value: the "
                        f"fused op takes it as an attr), got {default_id!r}")
    if isinstance(value, np.ndarray) and value.ndim == 0 and np.issubdtype(value.dtype, np.integer):
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"default_id must be an integer row or None, got {default_id!r}")
    default_id = value
    if not -2**63 <= int(default_id) < 2**63:
        raise ValueError(f"default_id must be a row of the table (an int64), got {int(default_id)}")
    return int(default_id)


def per_feature(value, n, what):
    """One value per feature: a list of n, or one value for all."""
    values = list(value) if isinstance(value, (list, tuple)) else [value] * n
    if len(values) != n:
        raise ValueError(f"{what} must be one value or a list of {n} (one per feature), got {len(values)}")
    return values


def canonical_shard_sizes(total, num_shards):
    """Rows per shard in TF's layout of `total` rows: the first total % n shards get one more.

    Both partition strategies assume it: "div" gives shard p the next run of
    ids, "mod" gives it the ids r with r % n == p, and both make these sizes.
    """
    return [total // num_shards + (1 if i < total % num_shards else 0) for i in range(num_shards)]


def check_div_layout(parts):
    sizes = [p.shape[0] for p in parts]
    if any(s is None for s in sizes):
        return  # dynamic sizes: TF's own layout rules apply at run time
    expected = canonical_shard_sizes(sum(sizes), len(sizes))
    if sizes != expected:
        raise ValueError(
            f"partition sizes {sizes} do not follow the 'div' layout {expected} that "
            "tf.nn.embedding_lookup_sparse assumes for a list of partitions")


def wrapped_variable(table):
    """The tf.Variable a Keras 3 variable wraps, else `table` itself; None
    for a Keras variable that wraps none yet (Keras' symbolic build of a
    loaded model) or that Keras autocasts where it is read.

    In a mixed-precision layer's call Keras autocasts the layer's float
    variables: the Keras variable's dtype is then the policy's compute dtype,
    not the wrapped variable's. Such a variable is read as a tensor
    (`tf.convert_to_tensor` casts it), as every other op of that layer reads
    it, never in place.
    """
    if not hasattr(table, "_value"):
        return table
    var = table._value
    return var if var is not None and tf.as_dtype(table.dtype) == var.dtype else None


def read_table(table, dtype=None):
    """A table's value; a resource variable is read without a copy.

    After a sparse read or a sparse optimizer update a variable is in
    copy-on-read mode, where a plain read copies the whole table on every
    call. Like tf.nn's own lookups, read_value_no_copy() leaves that mode.
    """
    var = wrapped_variable(table)
    if isinstance(var, resource_variable_ops.BaseResourceVariable) and dtype in (None, var.dtype):
        return var.read_value_no_copy()
    return tf.convert_to_tensor(table, dtype=dtype)


def _on_host(var):
    device = tf.DeviceSpec.from_string(var.device or "")
    if device.device_type is not None:
        return device.device_type == "CPU"
    return not tf.config.list_logical_devices("GPU")  # left to the placer: the host is all there is


def sharded_variables(params):
    """The shards of a tf.distribute ShardedVariable (ParameterServerStrategy's
    partitioned tables; a Keras 3 variable may wrap one), else None."""
    var = wrapped_variable(params)
    return list(var.variables) if isinstance(var, sharded_variable.ShardedVariable) else None


def static_row_counts(tables):
    """The tables' row counts, or None where one is unknown before run time."""
    sizes = [t.shape[0] if t.shape.rank else None for t in tables]
    return None if any(n is None for n in sizes) else [int(n) for n in sizes]


def shard_operand(shard, dtype=None):
    """A shard as a partitioned lookup gathers from it: a resource variable
    of the lookup's dtype as it is (its gather runs where it lives), anything
    else converted to `dtype` as safe_embedding_lookup_sparse converts it (a
    TF1 variable to its value, which lives beside it)."""
    if resource_variable_ops.is_resource_variable(shard) and dtype in (None, shard.dtype):
        return shard
    return tf.convert_to_tensor(shard, dtype=dtype)


def separate_shards(shards, dtype=None):
    """Two or more shards as the operands a lookup gathers from one by one
    (never reading them whole), or None: one table, or shards whose row
    counts only a run gives, which are concatenated."""
    if len(shards) < 2:
        return None
    operands = [shard_operand(s, dtype) for s in shards]
    return operands if static_row_counts(operands) is not None else None


def gathered_shards(params):
    """The shards our own lookups gather from one by one, in the "div"
    layout, or None (one table): a ShardedVariable's, or a list, tuple or
    TF1 PartitionedVariable of shards whose row counts the graph knows."""
    shards = sharded_variables(params)
    if shards is None and (isinstance(params, (list, tuple)) or type(params).__name__ == "PartitionedVariable"):
        shards = separate_shards(list(params))
    return shards


def in_place_variable(table, dtype=None):
    """The resource variable a fused lookup reads in place, or None.

    CtrResourceEmbeddingLookup reads a variable on the host under its lock
    (no dense read, so no copy of the table when an optimizer's sparse
    update follows). It has no GPU kernel: a variable elsewhere is read.
    A mirrored variable gives its replica's variable (`handle`).
    """
    var = wrapped_variable(table)
    if not resource_variable_ops.is_resource_variable(var) or dtype not in (None, var.dtype):
        return None
    if isinstance(var, sharded_variable.ShardedVariable):
        return None
    try:
        var.handle  # a distributed variable has one in a replica context only
    except ValueError:
        return None
    return var if _on_host(var) else None


def table_operand(table, dtype=None):
    """What a fused lookup takes for one table: the variable it reads in place, else its value."""
    var = in_place_variable(table, dtype)
    return var if var is not None else read_table(table, dtype)


def as_table(params, dtype=None, in_place=False):
    """One [V, D] tensor from a Tensor, a Variable or a list of 'div' partitions.

    in_place: a single variable is returned as it is where the fused lookup
    reads it in place (`table_operand`).

    For the 'div' strategy of tf.nn's v2 lookups, partition p holds the ids
    that follow those of partition p - 1, so concatenating the partitions in
    order keeps every id's row: ids need no remapping.
    """
    if type(params).__name__ == "PartitionedVariable":  # tf.compat.v1 partitioned variables
        params = list(params)
    if isinstance(params, (list, tuple)):
        if not params:
            raise ValueError("Missing embedding_weights: an empty list of partitions was given")
        if len(params) == 1:
            return as_table(params[0], dtype, in_place)
        parts = [read_table(p, dtype) for p in params]
        check_div_layout(parts)
        return tf.concat(parts, axis=0)
    return table_operand(params, dtype) if in_place else read_table(params, dtype)


def dense_matrix(x):
    """`x`, of unknown rank, checked to be a matrix when it runs (TF's
    EnsureShape error otherwise: an assert's own message would not do, as TF
    may run the shape check before any op it waits on)."""
    return tf.ensure_shape(x, [None, None])


def dense_weights_like(weights, ids):
    """Dense weights `[B, N]` of the dense ids (or keys) `ids`, checked to have
    their shape: statically where both shapes are known, else when it runs."""
    if isinstance(weights, (tf.RaggedTensor, tf.SparseTensor)):
        raise TypeError(f"weights must be a dense tensor [B, N] like ids, got a {type(weights).__name__}")
    weights = tf.convert_to_tensor(weights)
    if weights.shape.rank is None:
        weights = dense_matrix(weights)
    if weights.shape.rank != 2 or not weights.shape.is_compatible_with(ids.shape):
        raise ValueError(f"dense weights must be [B, N] like ids, got shape {weights.shape} for ids of shape "
                         f"{ids.shape}")
    if weights.shape.is_fully_defined() and ids.shape.is_fully_defined():
        return weights
    # Of as many values but another shape, they would be read in the ids' layout.
    with tf.control_dependencies([tf.debugging.assert_equal(
            tf.shape(weights), tf.shape(ids), message="dense weights must have the shape [B, N] of the ids")]):
        return tf.identity(weights)

"""A Dense layer over concatenated one-hot / multi-hot / count encodings and
dense columns, without building the encodings (CtrMultiHotDense)."""

import tensorflow as tf

from tf_ctr_ops._args import check_matmul_dtype, read_table
from tf_ctr_ops._loader import load_op_library

_ops = load_op_library()


def multi_hot_dense(blocks, kernel, name=None):
    """`tf.matmul(tf.concat(columns, axis=1), kernel)` where some column
    blocks are encodings of ids, without the encodings.

    What a `Dense` layer computes before its bias over Keras' `FeatureSpace`
    (`output_mode="concat"`) or over any concatenation of `CategoryEncoding` /
    lookup outputs with `output_mode="one_hot"`, `"multi_hot"` or `"count"`:
    each encoded block adds, per row, the kernel rows its distinct ids name.

    Args:
      blocks: the column blocks in concatenation order. Each is either a float
        [B, w] Tensor (a dense block), or a tuple
        `(ids, depth[, binary_output[, drop_negative]])`: the encoding
        `tf.math.bincount(ids, minlength=depth, maxlength=depth,
        binary_output=binary_output, axis=-1)` of [B, L] int32 or int64 ids
        (binary_output defaults to True; False counts repeats). With
        `drop_negative=True` a negative id counts for nothing, as
        `tf.one_hot(ids[:, 0], depth)` gives it a row of zeros (a one-hot
        block); by default it is an error, as in the bincount. At least one
        block must be an encoding.
      kernel: the [total width, units] float32 or float64 matrix: a Tensor or
        a Variable.
      name: the op's name.

    Returns:
      [B, units]. Ids >= depth count for nothing, as the bincount drops them;
      a negative id (unless dropped) is an InvalidArgument naming its block,
      row and value.
      The gradient reaches `kernel` and the dense blocks as MatMul's does.
    """
    ids, depths, binary, drop, dense, encoded_at, dense_at = [], [], [], [], [], [], []
    for position, block in enumerate(blocks):
        if isinstance(block, tuple):
            if len(block) not in (2, 3, 4):
                raise ValueError("an encoded block is (ids, depth[, binary_output[, drop_negative]]), "
                                 f"got {len(block)} items")
            if isinstance(block[0], (tf.RaggedTensor, tf.SparseTensor)):
                raise TypeError(f"ids must be a dense [B, L] matrix (pad ragged ids with -1 and pass "
                                f"drop_negative=True), got a {type(block[0]).__name__} in block {position}")
            block_ids = tf.convert_to_tensor(block[0])
            if block_ids.dtype not in (tf.int32, tf.int64):
                raise TypeError(f"ids must be int32 or int64, got {block_ids.dtype.name} in block {position}")
            if block_ids.shape.rank is not None and block_ids.shape.rank != 2:
                raise ValueError(f"ids must be a [B, L] matrix, got shape {block_ids.shape} in block {position}")
            if int(block[1]) < 0:
                raise ValueError(f"depth must be >= 0, got {block[1]} in block {position}")
            ids.append(block_ids)
            depths.append(int(block[1]))
            binary.append(bool(block[2]) if len(block) >= 3 else True)
            drop.append(bool(block[3]) if len(block) == 4 else False)
            encoded_at.append(position)
        else:
            dense.append(block)
            dense_at.append(position)
    if not ids:
        raise ValueError("multi_hot_dense needs at least one encoded block (ids, depth); use tf.matmul otherwise")
    kernel = read_table(kernel)
    check_matmul_dtype(kernel.dtype, "kernel")
    dense = [tf.convert_to_tensor(d, dtype=kernel.dtype) for d in dense]
    if not dense:
        # The op's dense list takes its type from `kernel`, which graph
        # building cannot infer for an empty list: one block of no columns.
        dense.append(tf.zeros(tf.stack([tf.shape(ids[0])[0], 0]), kernel.dtype))
        dense_at.append(len(blocks))
    order = {position: block for block, position in enumerate(encoded_at + dense_at)}
    layout = [order[position] for position in range(len(order))]
    return _ops.ctr_multi_hot_dense(ids=ids, dense=dense, kernel=kernel, depths=depths, binary_output=binary,
                                    drop_negative=drop, layout=layout, name=name)


@tf.RegisterGradient("CtrMultiHotDense")
def _multi_hot_dense_grad(op, grad):
    """MatMul's gradients, on the concatenation rebuilt from the ids."""
    n, m = len(op.get_attr("Tids")), op.get_attr("M")
    kernel = op.inputs[n + m]
    depths, binary = op.get_attr("depths"), op.get_attr("binary_output")
    drop = op.get_attr("drop_negative") or [False] * n

    columns_of = op.get_attr("column_depths") or [0] * n

    def encoding(i):
        ids = op.inputs[i]
        if columns_of[i]:  # one-hot encodings of each id column, side by side
            return tf.reshape(tf.one_hot(ids, columns_of[i], dtype=kernel.dtype), [tf.shape(ids)[0], depths[i]])
        if drop[i]:  # a dropped negative id counts as one past the depth, which the bincount drops
            ids = tf.where(ids < 0, tf.cast(depths[i], ids.dtype), ids)
        return tf.math.bincount(ids, minlength=depths[i], maxlength=depths[i], binary_output=binary[i], axis=-1,
                                dtype=kernel.dtype)

    columns = [encoding(i) for i in range(n)]
    columns += list(op.inputs[n:n + m])
    layout = op.get_attr("layout") or range(n + m)
    concatenated = tf.concat([columns[b] for b in layout], axis=1)
    kernel_grad = tf.matmul(concatenated, grad, transpose_a=True)
    first, start = {}, tf.constant(0)
    for b in layout:
        first[b] = start
        start = start + tf.shape(columns[b])[1]
    dense_grads = [tf.matmul(grad, kernel[first[n + j]:first[n + j] + tf.shape(op.inputs[n + j])[1]],
                             transpose_b=True) for j in range(m)]
    return [None] * n + dense_grads + [kernel_grad]

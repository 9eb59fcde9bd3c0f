"""The gradient of an embedding table: IndexedSlices of the rows a lookup read."""

import tensorflow as tf


def dense_table_shape(params):
    """The int32 dense_shape of a table tensor's gradient, read as TF's
    Gather gradient reads it (int64, then cast): tf.shape's int32 output
    refuses a dimension of 2**31 - 1, which is still a valid row count."""
    return tf.cast(tf.shape(params, out_type=tf.int64), tf.int32)


def table_gradient(values, indices, dense_shape):
    """`tf.IndexedSlices(values, indices, dense_shape)`, with one zero row
    (row 0) when it would have none under a strategy of several replicas.

    Why: MirroredStrategy and MultiWorkerMirroredStrategy aggregate
    IndexedSlices with a collective all-gather, and TF 2.21's (RingGatherer)
    crashes the process when every replica's gradient has no rows, as on a
    step whose bags hold no id with a row (all padding, or hash-table keys
    not yet admitted). The zero row is the same gradient: optimizers that
    add it (SGD, Adagrad) or densify it (Keras' Adam) update as without it.
    """
    if tf.distribute.has_strategy() and tf.distribute.get_strategy().num_replicas_in_sync > 1:
        values, indices = _at_least_one_row(values, indices, dense_shape)
    return tf.IndexedSlices(values, indices, dense_shape)


def _at_least_one_row(values, indices, dense_shape):
    def one_zero_row():
        return tf.zeros(tf.concat([[1], tf.shape(values)[1:]], 0), values.dtype), tf.zeros([1], indices.dtype)

    # a table of no rows has no row 0 to name
    empty = tf.logical_and(tf.equal(tf.size(indices), 0), dense_shape[0] > 0)
    return tf.cond(empty, one_zero_row, lambda: (values, indices))

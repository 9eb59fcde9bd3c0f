"""The `tf.compat` forms of the drop-ins: `tf_ctr_ops.compat.v1` mirrors `tf.compat.v1.nn`."""

from tf_ctr_ops.compat import v1  # noqa: F401

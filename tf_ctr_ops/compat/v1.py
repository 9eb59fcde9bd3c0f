"""Fused drop-ins for `tf.compat.v1.nn.embedding_lookup_sparse` and
`tf.compat.v1.nn.safe_embedding_lookup_sparse`: TF's v1 signatures, with
`partition_strategy` ("mod" and "div" by default, respectively)."""

from tf_ctr_ops.ops import embedding_lookup_sparse_v1 as embedding_lookup_sparse
from tf_ctr_ops.ops import safe_embedding_lookup_sparse_v1 as safe_embedding_lookup_sparse

__all__ = ["embedding_lookup_sparse", "safe_embedding_lookup_sparse"]

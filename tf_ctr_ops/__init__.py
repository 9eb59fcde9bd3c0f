"""tf-ctr-ops: fused embedding and string-feature ops for TensorFlow CTR models.

    import tf_ctr_ops as tco
    y = tco.sparse_embedding(table, ragged_ids, combiner="mean")

Importing the package loads the op library (checking the TensorFlow version
it was built against) and registers the gradients and Keras layers.
"""

from tf_ctr_ops._loader import load_op_library as _load_op_library

_load_op_library()

from tf_ctr_ops.ops import (  # noqa: E402
    embedding_lookup_sparse,
    hash_embedding,
    safe_embedding_lookup_sparse,
    sparse_embedding,
)
from tf_ctr_ops import compat, layers  # noqa: E402,F401  (compat.v1: the v1 drop-ins; layers: registers Keras layers)

from tf_ctr_ops.strings import (  # noqa: E402
    multi_string_embedding,
    pack_strings,
    string_embedding,
)
from tf_ctr_ops.vocab import (  # noqa: E402
    vocab_embedding, vocab_embedding_lookup_sparse, vocab_indicator, vocab_multi_hot)
from tf_ctr_ops.multi_hot import multi_hot_dense  # noqa: E402
from tf_ctr_ops.columns import bucketized_embedding_lookup, cross_embedding_lookup  # noqa: E402
from tf_ctr_ops.hash_table import HashTable, hash_table_embedding, multi_hash_table_embedding  # noqa: E402
from tf_ctr_ops import _forward_mode  # noqa: E402

_forward_mode.register()  # after every module above registered its gradients

__version__ = "0.1.0"

__all__ = [
    "embedding_lookup_sparse",
    "safe_embedding_lookup_sparse",
    "sparse_embedding",
    "hash_embedding",
    "pack_strings",
    "string_embedding",
    "multi_string_embedding",
    "vocab_embedding",
    "vocab_embedding_lookup_sparse",
    "vocab_indicator",
    "vocab_multi_hot",
    "multi_hot_dense",
    "cross_embedding_lookup",
    "bucketized_embedding_lookup",
    "HashTable",
    "hash_table_embedding",
    "multi_hash_table_embedding",
]


def __getattr__(name):
    # `tf_ctr_ops.rewrite.enable()` after a bare `import tf_ctr_ops`, as
    # users spell it; imported on first use (it loads Grappler's bindings).
    if name == "rewrite":
        import importlib

        return importlib.import_module("tf_ctr_ops.rewrite")
    raise AttributeError(f"module 'tf_ctr_ops' has no attribute {name!r}")

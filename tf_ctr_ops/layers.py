"""Keras 3 layers over the fused tf-ctr-ops lookups (TensorFlow backend).

`SparseEmbedding` pools rows of a `[input_dim, output_dim]` table over bags of
ids; `HashEmbedding` hashes its keys into `num_buckets` rows first;
`StringEmbedding` and `MultiStringEmbedding` take strings of delimited ids.
Each runs one fused op per call, and the gradient of a table is a
`tf.IndexedSlices` holding only the looked-up rows.

All layers are registered under the `tf_ctr_ops` package: after `import tf_ctr_ops`, `keras.models.load_model`
restores models that use them, and `tf.saved_model.load` runs SavedModels
exported from them (`model.export`), as long as `tf_ctr_ops` has been imported
in that process first (the op library must be loaded before the graph is).
"""

import keras
import numpy as np
import tensorflow as tf
from keras import constraints, initializers, regularizers

try:
    from keras.src.backend.common.symbolic_scope import in_symbolic_scope as _in_symbolic_scope
except ImportError:  # a Keras without it never infers outputs by a scratch call
    def _in_symbolic_scope():
        return False

from tf_ctr_ops import _args
from tf_ctr_ops import hash_table as _hash_table
from tf_ctr_ops import ops as _ops
from tf_ctr_ops import strings as _strings

__all__ = ["SparseEmbedding", "HashEmbedding", "StringEmbedding", "MultiStringEmbedding", "HashTableEmbedding"]

# A table is read in its own (variable) dtype: autocasting it to a mixed
# policy's compute dtype would cast the whole [V, D] table every call and pool
# rounded rows. Keras opens its autocast scope in a layer's own call whatever
# the layer's `autocast` (a layer called alone, or a mixed layer in a float32
# model, as a `.keras` file loads into a fresh process), so the weight itself
# opts out, and the layer's `autocast = False` says so where Keras asks.
_TABLE_WEIGHT = {"trainable": True, "autocast": False}

_CONTAINERS_DOC = """
    Inputs:
        The ids of each example, in one of three containers (of int32 or int64
        ids):
        - `tf.RaggedTensor` of shape `(batch_size, (bag_size))`;
        - `tf.SparseTensor` of shape `(batch_size, max_bag_size)`, in
          canonical (row-major) order;
        - a dense tensor of shape `(batch_size, max_bag_size)` where `-1`
          marks padding.
        An empty bag gives a zero row. The optional `weights` call argument
        holds one float per id, in the same container (for dense ids, a
        `(batch_size, max_bag_size)` tensor; weights at padding are ignored).

    Output shape:
        `(batch_size, output_dim)`, in the layer's compute dtype. The table is
        stored (and looked up) in the layer's variable dtype, and only the
        pooled output is cast: under the `"mixed_float16"` or
        `"mixed_bfloat16"` policy the table stays float32 and the output is
        half, with no full-table cast per step.

    Keras models (TensorFlow backend, checked with Keras 3.15):
        - `keras.Input(shape=(None,), dtype="int64", ragged=True)` feeds a
          `tf.RaggedTensor` through a functional model, and
          `keras.Input(shape=(max_bag_size,), dtype="int64", sparse=True)` a
          `tf.SparseTensor`; `model.fit`, `model.predict` and `model.save` /
          `keras.models.load_model` all work with them. Dense `-1`-padded
          inputs need no flag: `keras.Input(shape=(max_bag_size,),
          dtype="int64")`. `weights` may be a second input of the same kind:
          `layer(ids, weights=w)`.
        - `model.export(path)` writes every input as a *dense*
          `tf.TensorSpec`, ragged and sparse ones included (Keras builds no
          other spec, and refuses a `tf.RaggedTensorSpec` or
          `tf.SparseTensorSpec` as `input_signature`). The exported `serve`
          then takes dense ids padded with `-1` (`ragged.to_tensor(-1)`,
          `tf.sparse.to_dense(sp, default_value=-1)`; weights padded with
          anything) and gives the same outputs. For a ragged endpoint,
          export a `tf.function` with a ragged signature instead:

          ```python
          archive = keras.export.ExportArchive()
          archive.track(model)
          archive.add_endpoint("serve", tf.function(
              lambda ids: model(ids, training=False),
              input_signature=[tf.RaggedTensorSpec(
                  [None, None], tf.int64, ragged_rank=1,
                  row_splits_dtype=tf.int64)]))
          archive.write_out(path)
          ```
        - To run an exported SavedModel, `import tf_ctr_ops` first (it loads
          the op library), then `loaded = tf.saved_model.load(path)` and
          `loaded.serve(ids)` (kept in a name: the functions of a loaded
          object that is dropped lose its variables).
"""


def _check_positive_int(value, name):
    # A NumPy integer too (a size read from an array); kept as an int, which
    # the layer's config serializes.
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"`{name}` must be a positive integer, got {name}={value!r}")
    return int(value)


def _check_max_norm(max_norm):
    if max_norm is None:
        return None
    return _args.max_norm_attr(max_norm)  # a float, or a clear ValueError if not > 0


def _is_feature(x):
    """A tensor or array of rank >= 1 (not a Python number or a scalar)."""
    if isinstance(x, (tf.RaggedTensor, tf.SparseTensor)):
        return True
    rank = getattr(getattr(x, "shape", None), "rank", None)
    return (rank if rank is not None else len(getattr(x, "shape", ()))) >= 1


def _check_one_feature(x):
    """A list of features (tensors, arrays, keras.Inputs) is refused: stacked,
    N features of B ids would be B bags of N ids (Keras' Embedding refuses
    them too)."""
    if isinstance(x, (list, tuple)) and any(_is_feature(e) for e in x):
        raise TypeError(f"expected one feature (a Tensor, RaggedTensor or SparseTensor), got a list of {len(x)}: "
                        "call the layer once per feature (HashTableEmbedding takes a list as slots)")


def _as_container(x):
    """Ragged and sparse tensors as they are; anything else (lists, arrays) as a dense tensor."""
    if x is None or isinstance(x, (tf.RaggedTensor, tf.SparseTensor)):
        return x
    _check_one_feature(x)
    return tf.convert_to_tensor(x)


def _id_bags(x, what="ids"):
    """`_as_container(x)`, with a dense vector of ids `[B]` (a Keras
    `Input(shape=())` feature, as `Hashing` + `Embedding` take it) as `[B, 1]`:
    one id per row. Weights alike."""
    x = _as_container(x)
    if isinstance(x, tf.Tensor) and x.shape.rank is not None:
        _check_dense_rank(what, x.shape)
    if isinstance(x, tf.Tensor) and x.shape.rank == 1:
        x = tf.expand_dims(x, 1)
    elif isinstance(x, tf.Tensor) and x.shape.rank is None:  # a function's TensorSpec(None): [B] known when it runs
        one_column = tf.ones(tf.cast(tf.equal(tf.rank(x), 1), tf.int32)[tf.newaxis], tf.int32)
        x = tf.reshape(x, tf.concat([tf.shape(x), one_column], 0))
    return x


def _weights_aligned(ids, weights):
    """`weights`, once they hold one weight per id in the ids' own layout (a
    ragged tensor's row splits, a sparse tensor's indices, a dense one's
    shape), as Keras' `Embedding(ids) * weights[..., None]` demands; the op
    alone would take any weights of as many values."""
    if weights is None or ids is None:
        return weights
    if isinstance(ids, tf.RaggedTensor) and isinstance(weights, tf.RaggedTensor):
        parts = [(ids.row_splits, tf.cast(weights.row_splits, ids.row_splits.dtype), "row splits")]
    elif isinstance(ids, tf.SparseTensor) and isinstance(weights, tf.SparseTensor):
        parts = [(ids.indices, weights.indices, "indices"), (ids.dense_shape, weights.dense_shape, "dense_shape")]
    elif isinstance(ids, tf.Tensor) and isinstance(weights, tf.Tensor):
        parts = [(tf.shape(ids, out_type=tf.int64), tf.shape(weights, out_type=tf.int64), "shape")]
    else:
        return weights  # of another kind: the op's own checks apply
    checks = []
    for a, b, what in parts:
        a, b = tf.reshape(a, [-1]), tf.reshape(b, [-1])
        n = tf.minimum(tf.size(a), tf.size(b))
        # The first position where they differ (n: one is a prefix of the other).
        first = tf.concat([tf.cast(tf.where(tf.not_equal(a[:n], b[:n]))[:, 0], tf.int32), [n]], 0)[0]
        same = tf.logical_and(tf.equal(tf.size(a), tf.size(b)), tf.equal(first, n))
        checks.append(tf.debugging.Assert(same, [
            f"weights must hold one weight per id: the ids' and their {what} differ at flat position", first,
            "(ids':", a[first:first + 1], "weights':", b[first:first + 1], "; sizes", tf.size(a), tf.size(b), ")"]))
    with tf.control_dependencies(checks):
        return tf.nest.map_structure(tf.identity, weights, expand_composites=True)


def _values_dtype(x):
    return (x.values if isinstance(x, (tf.RaggedTensor, tf.SparseTensor)) else x).dtype


def _batch_size(x):
    if isinstance(x, tf.RaggedTensor):
        return x.nrows()
    if isinstance(x, tf.SparseTensor):
        return x.dense_shape[0]
    return tf.shape(x, out_type=tf.int64)[0]


def _in_keras_symbolic_pass():
    """Whether Keras only infers this call's output: building a subclassed
    model (or a layer holding this one) and loading a saved one, it calls
    `call` on float32 placeholders in a scratch graph that never runs, and
    the variables it creates there are not initialized yet. Keras' own
    `Embedding` casts those float ids; a key layer cannot (a float key is
    no key), so it gives the output's shape and dtype instead."""
    return _in_symbolic_scope()


def _symbolic_output(inputs, output_dim, dtype):
    """Zeros of a pooled call's [batch, output_dim] output: all a scratch call is read for."""
    out = tf.zeros(tf.stack([_batch_size(inputs), tf.constant(output_dim, tf.int64)]), dtype)
    out.set_shape([inputs.shape[0] if inputs.shape.rank else None, output_dim])
    return out


def _float_keys_error(layer, dtype):
    if isinstance(layer, (StringEmbedding, MultiStringEmbedding)):
        what, wanted = "inputs: it takes strings of delimited ids", "string"
    else:
        strings = ' or a string' if isinstance(layer, (HashEmbedding, HashTableEmbedding)) else ''
        what, wanted = f"keys: a key must be an integer{strings}", "int64"
    return TypeError(
        f"{type(layer).__name__} {layer.name!r} got {tf.as_dtype(dtype).name} {what}. Keras converts a "
        f"model's inputs to its input layer's dtype, which is float32 unless set: start the model with "
        f"keras.Input(shape=..., dtype=\"{wanted}\") (a Sequential model too); export a subclassed model with "
        f"model.export(path, input_signature=[tf.TensorSpec(..., tf.{wanted})])")


def _string_ids_error(layer):
    return TypeError(f"{type(layer).__name__} {layer.name!r} takes integer ids, got strings: hash string keys with "
                     f"HashEmbedding or HashTableEmbedding, split strings of delimited ids with StringEmbedding, or "
                     f"map a vocabulary to ids with keras.layers.StringLookup first")


class _FusedOpLayer(keras.layers.Layer):
    """A layer of tf_ctr_ops' fused ops, which have no XLA kernels: Keras'
    jit_compile="auto" must not pick XLA for its model (as on a GPU it would),
    as Keras' own Hashing and StringLookup say."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_jit = False


class _PooledOutput:
    """The [batch, output_dim] output of a pooled embedding layer, in its compute dtype."""

    def _in_compute_dtype(self, outputs):
        return outputs if outputs.dtype == self.compute_dtype else tf.cast(outputs, self.compute_dtype)

    def compute_output_shape(self, input_shape):
        batch = input_shape[0] if input_shape is not None and len(input_shape) else None
        return (batch, self.output_dim)

    def compute_output_spec(self, inputs, *args, **kwargs):
        _check_dense_id_specs(self, inputs, kwargs.get("weights", args[0] if args else None))
        if getattr(self, "_takes_ids", False) and not getattr(self, "_takes_string_keys", True):
            if any(getattr(spec, "dtype", None) == "string" for spec in tf.nest.flatten(inputs)):
                raise _string_ids_error(self)
        return super().compute_output_spec(inputs, *args, **kwargs)


def _dense_specs(specs):
    """The dense ones of a functional model's inputs (KerasTensors)."""
    return [s for s in tf.nest.flatten(specs)
            if getattr(s, "shape", None) is not None and not getattr(s, "sparse", False)
            and not getattr(s, "ragged", False)]


def _check_dense_rank(what, shape, owner=""):
    """The layers' dense ids and weights are [B] or [B, N]."""
    if len(shape) not in (1, 2):
        form = "one weight per id, in the ids' layout" if what == "weights" else "ids padded with -1, or '' for strings"
        raise ValueError(f"{owner}dense {what} must be [B] or [B, N] ({form}), got shape {tuple(shape)}")


def _check_dense_id_specs(layer, specs, weights=None):
    """Keras infers a functional model's output from compute_output_shape
    without calling the layer, so ids or weights of another rank would
    otherwise pass until the model's first call."""
    owner = f"{type(layer).__name__} {layer.name!r}: "
    for what, given in (("ids", specs), ("weights", weights)):
        for spec in _dense_specs(given):
            _check_dense_rank(what, spec.shape, owner)


class _PooledEmbeddingBase(_PooledOutput, _FusedOpLayer):
    """Shared table, config and casting of the pooled embedding layers."""

    def compute_output_spec(self, inputs, *args, **kwargs):
        _check_one_feature(inputs)  # a functional model is built without calling the layer
        return super().compute_output_spec(inputs, *args, **kwargs)

    _rows_arg = None  # name of the constructor argument giving the table rows

    def __init__(self, rows, output_dim, combiner="mean", embeddings_initializer="uniform",
                 embeddings_regularizer=None, embeddings_constraint=None, max_norm=None, **kwargs):
        super().__init__(**kwargs)
        self._rows = _check_positive_int(rows, self._rows_arg)
        self.output_dim = _check_positive_int(output_dim, "output_dim")
        self.combiner = _args.check_combiner(combiner)
        self.max_norm = _check_max_norm(max_norm)
        self.embeddings_initializer = initializers.get(embeddings_initializer)
        self.embeddings_regularizer = regularizers.get(embeddings_regularizer)
        self.embeddings_constraint = constraints.get(embeddings_constraint)
        self.autocast = False  # see _TABLE_WEIGHT

    def build(self, input_shape=None):
        if self.built:
            return
        self._embeddings = self.add_weight(
            shape=(self._rows, self.output_dim),
            initializer=self.embeddings_initializer,
            name="embeddings",
            regularizer=self.embeddings_regularizer,
            constraint=self.embeddings_constraint,
            **_TABLE_WEIGHT,
        )
        self.built = True

    @property
    def embeddings(self):
        """The `[rows, output_dim]` table variable (the layer must be built)."""
        if not self.built:
            raise AttributeError("You must build the layer before accessing `embeddings`.")
        return self._embeddings

    def _lookup(self, table, inputs, weights):
        raise NotImplementedError

    def call(self, inputs, weights=None):
        if self._takes_ids:
            inputs, weights = _id_bags(inputs), _id_bags(weights, "weights")
        else:
            inputs, weights = _as_container(inputs), _as_container(weights)
        weights = _weights_aligned(inputs, weights)
        if self._takes_ids and _values_dtype(inputs).is_floating:
            if _in_keras_symbolic_pass():
                return _symbolic_output(inputs, self.output_dim, self.compute_dtype)
            inputs = self._float_ids(inputs)
        if self._takes_ids and not self._takes_string_keys and _values_dtype(inputs) == tf.string:
            raise _string_ids_error(self)
        table = self._embeddings  # read without copy-on-read copies (_args.read_table)
        return self._in_compute_dtype(self._lookup(table, inputs, weights))

    _takes_ids = True  # StringEmbedding takes strings
    _takes_string_keys = False  # HashEmbedding hashes them

    def _float_ids(self, inputs):
        """Ids given as floats (by a model whose input layer was left float32)."""
        raise _float_keys_error(self, _values_dtype(inputs))

    def get_config(self):
        config = super().get_config()
        config.update({
            self._rows_arg: self._rows,
            "output_dim": self.output_dim,
            "combiner": self.combiner,
            "embeddings_initializer": initializers.serialize(self.embeddings_initializer),
            "embeddings_regularizer": regularizers.serialize(self.embeddings_regularizer),
            "embeddings_constraint": constraints.serialize(self.embeddings_constraint),
            "max_norm": self.max_norm,
        })
        return config


@keras.saving.register_keras_serializable(package="tf_ctr_ops")
class SparseEmbedding(_PooledEmbeddingBase):
    """Pooled embedding of bags of ids, in one fused op.

    Each example is a bag of ids in `[0, input_dim)`; the layer looks up their
    rows of a trainable `(input_dim, output_dim)` table and pools them with
    `combiner`. For ids in `[0, input_dim)` (plus `-1` padding) and positive
    weights, it gives the same result as
    `tf.nn.safe_embedding_lookup_sparse(layer.embeddings, sparse_ids,
    sparse_weights, combiner)`, without its chain of sparse ops; weights that
    are not positive are kept, as `tf.nn.embedding_lookup_sparse` keeps them.
    Its table gradient is a `tf.IndexedSlices` of the rows looked up, so
    optimizers touch only those rows. It has one row per id, as
    `keras.layers.Embedding`'s has: optimizers that square gradients (Adam,
    RMSprop, Adagrad) or clip them see a repeated id's rows apart, where
    `tf.nn`'s lookups sum them first, so such training follows an
    `Embedding`-based model's, not a `tf.nn`-based one's.

    Example:

    >>> layer = SparseEmbedding(input_dim=1000, output_dim=8, combiner="mean")
    >>> ids = tf.ragged.constant([[3, 17, 17], [], [999]], dtype=tf.int64)
    >>> layer(ids).shape
    TensorShape([3, 8])
    >>> dense = tf.constant([[3, 17, 17], [-1, -1, -1], [999, -1, -1]])
    >>> w = tf.ones([3, 3])
    >>> layer(dense, weights=w).shape  # same bags, as -1-padded ids
    TensorShape([3, 8])

    In a functional model, with ragged inputs:

    ```python
    ids = keras.Input(shape=(None,), dtype="int64", ragged=True)
    x = SparseEmbedding(input_dim=10_000, output_dim=16)(ids)
    ctr = keras.layers.Dense(1, activation="sigmoid")(x)
    model = keras.Model(ids, ctr)
    ```

    Args:
        input_dim: Integer. Number of table rows; ids must lie in
            `[0, input_dim)` (or be `-1`, padding). Any other id raises an
            `InvalidArgumentError` naming the example row and the id.
        output_dim: Integer. Dimension of the embedding.
        combiner: `"mean"` (default), `"sum"` or `"sqrtn"`: how the rows of a
            bag are pooled, as `tf.nn.embedding_lookup_sparse` defines them
            (with weights, `"mean"` divides by the sum of the weights and
            `"sqrtn"` by the root of the sum of their squares).
        embeddings_initializer: Initializer for the table.
        embeddings_regularizer: Regularizer applied to the table.
        embeddings_constraint: Constraint applied to the table.
        max_norm: Optional float. Rows are clipped to this L2 norm before
            pooling (the table itself is not changed).
        **kwargs: Base layer keyword arguments, such as `name` and `dtype`.
    """

    _rows_arg = "input_dim"

    def __init__(self, input_dim, output_dim, combiner="mean", embeddings_initializer="uniform",
                 embeddings_regularizer=None, embeddings_constraint=None, max_norm=None, **kwargs):
        super().__init__(input_dim, output_dim, combiner=combiner,
                         embeddings_initializer=embeddings_initializer,
                         embeddings_regularizer=embeddings_regularizer,
                         embeddings_constraint=embeddings_constraint, max_norm=max_norm, **kwargs)

    @property
    def input_dim(self):
        return self._rows

    def _float_ids(self, inputs):
        # As Keras' Embedding: a model whose input layer was left float32
        # (a Sequential model without keras.Input) gives its ids as floats.
        cast = lambda x: tf.cast(x, tf.int64)  # noqa: E731
        if isinstance(inputs, tf.RaggedTensor):
            return inputs.with_flat_values(cast(inputs.flat_values))
        if isinstance(inputs, tf.SparseTensor):
            return tf.SparseTensor(inputs.indices, cast(inputs.values), inputs.dense_shape)
        return cast(inputs)

    def _lookup(self, table, inputs, weights):
        return _ops.sparse_embedding(table, inputs, weights, combiner=self.combiner,
                                     max_norm=self.max_norm)


SparseEmbedding.__doc__ += _CONTAINERS_DOC


@keras.saving.register_keras_serializable(package="tf_ctr_ops")
class HashEmbedding(_PooledEmbeddingBase):
    """Pooled embedding of hashed keys, in one fused op.

    Each key is hashed into one of `num_buckets` rows of a trainable
    `(num_buckets, output_dim)` table, exactly as
    `tf.strings.to_hash_bucket_fast(tf.strings.as_string(key), num_buckets)`
    (the convention of `keras.layers.Hashing` for integer keys), and the rows
    of each bag are pooled with `combiner`. Integer keys are hashed inside
    the kernel, without materializing any string tensor. String keys
    (`tf.string`) are hashed as themselves, by the same call (it hands them
    to `tf_ctr_ops.strings`).

    Example:

    >>> layer = HashEmbedding(num_buckets=1024, output_dim=8, combiner="sum")
    >>> user_ids = tf.ragged.constant([[123456789], [42, 7]], dtype=tf.int64)
    >>> layer(user_ids).shape
    TensorShape([2, 8])

    Any integer is a valid key, including negative ones, except that `-1` in a
    dense input is padding (the dense container has no other way to mark it;
    dense string keys are padded with `""`). So a model fed ragged or sparse
    keys that may hold `-1` cannot be served from the dense signature that
    `model.export` writes (see below); export a ragged endpoint instead.

    Args:
        num_buckets: Integer. Number of hash buckets (table rows).
        output_dim: Integer. Dimension of the embedding.
        combiner: `"mean"` (default), `"sum"` or `"sqrtn"`.
        embeddings_initializer: Initializer for the table.
        embeddings_regularizer: Regularizer applied to the table.
        embeddings_constraint: Constraint applied to the table.
        max_norm: Optional float. Rows are clipped to this L2 norm before
            pooling.
        salt: Optional integer or pair of integers, as `keras.layers.Hashing`'s:
            keys are then hashed with `tf.strings.to_hash_bucket_strong`
            (SipHash) keyed with it (one integer s is `[s, s]`).
        **kwargs: Base layer keyword arguments, such as `name` and `dtype`.
    """

    _rows_arg = "num_buckets"
    _takes_string_keys = True

    def __init__(self, num_buckets, output_dim, combiner="mean", embeddings_initializer="uniform",
                 embeddings_regularizer=None, embeddings_constraint=None, max_norm=None, salt=None, **kwargs):
        super().__init__(num_buckets, output_dim, combiner=combiner,
                         embeddings_initializer=embeddings_initializer,
                         embeddings_regularizer=embeddings_regularizer,
                         embeddings_constraint=embeddings_constraint, max_norm=max_norm, **kwargs)
        self.salt = _args.check_hash_key(salt) or None

    @property
    def num_buckets(self):
        return self._rows

    def _lookup(self, table, inputs, weights):
        return _ops.hash_embedding(table, inputs, weights, combiner=self.combiner,
                                   max_norm=self.max_norm, hash_key=self.salt)

    def get_config(self):
        config = super().get_config()
        config["salt"] = self.salt
        return config


HashEmbedding.__doc__ += _CONTAINERS_DOC


def _check_string_table_dtype(layer):
    if tf.as_dtype(layer.variable_dtype) not in _strings.STRING_TABLE_DTYPES:
        raise ValueError(f"{type(layer).__name__} tables must be float32, float16 or bfloat16 (dtype policies "
                         f"float32, float16, bfloat16, mixed_float16 or mixed_bfloat16), got {layer.variable_dtype}")


def _layer_delimiter(delimiter):
    """A string layer's delimiter as its config keeps it: text (bytes are
    decoded, and Keras' serialized bytes read back), or None. The config is
    JSON, so a delimiter that is not UTF-8 is refused here rather than when
    the model is saved; tf_ctr_ops.string_embedding takes any bytes."""
    if isinstance(delimiter, dict) and delimiter.get("class_name") == "__bytes__":
        delimiter = delimiter["config"]["value"]  # a config saved before delimiters were kept as text
    _args.check_delimiter(delimiter)
    if isinstance(delimiter, bytes):
        try:
            return delimiter.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"a layer's delimiter must be UTF-8 text (the layer's config saves it), got "
                             f"{delimiter!r}; tf_ctr_ops.string_embedding takes any bytes") from None
    return delimiter


def _not_a_feature_list(layer, n, got):
    return TypeError(f"{type(layer).__name__} takes a list of {n} string tensors (one per feature), got {got}; "
                     f"split a [B, {n}] matrix of features with tf.unstack(x, axis=1)")


def _feature_list(inputs, n, layer):
    """The list of n features a grouped layer takes: a single tensor (a [B, N]
    matrix, say) would be read row by row, as features."""
    if not isinstance(inputs, (list, tuple)):
        raise _not_a_feature_list(layer, n, type(inputs).__name__)
    if len(inputs) != n:
        raise ValueError(f"expected {n} string features, got {len(inputs)}")
    return list(inputs)


def _string_inputs(inputs):
    inputs = _strings.dense_strings(inputs)
    if inputs.shape.rank == 2 and inputs.shape[1] == 1:
        inputs = tf.squeeze(inputs, axis=1)
    return inputs


def _check_string_specs(layer, specs):
    """A functional model's inputs (KerasTensors) are strings: Keras infers
    the output from compute_output_shape without calling the layer, so an
    int64 Input would otherwise pass until the model's first call."""
    for spec in tf.nest.flatten(specs):
        dtype = getattr(spec, "dtype", None)
        if dtype is not None and tf.as_dtype(dtype) != tf.string:
            raise TypeError(f"{type(layer).__name__} {layer.name!r} takes string inputs, got {tf.as_dtype(dtype).name} "
                            "(give its keras.Input dtype='string')")


def _check_string_vector_specs(layer, specs):
    """Each feature is a dense vector of strings [B] (or [B, 1]); see _check_string_specs."""
    for spec in tf.nest.flatten(specs):
        for kind in ("ragged", "sparse"):
            if getattr(spec, kind, False):
                raise TypeError(f"{type(layer).__name__} {layer.name!r} takes a dense vector of strings [B] (or "
                                f"[B, 1]) of delimited ids, one string per example; got a {kind} input")
    for spec in _dense_specs(specs):
        shape = tuple(spec.shape)
        if not (len(shape) == 1 or (len(shape) == 2 and shape[1] in (1, None))):
            raise ValueError(f"{type(layer).__name__} {layer.name!r} takes a vector of strings [B] (or [B, 1]), "
                             f"got shape {shape}")


@keras.saving.register_keras_serializable(package="tf_ctr_ops")
class StringEmbedding(_PooledEmbeddingBase):
    """Pooled embedding of strings of delimited ids, e.g. `"12,7,993"`.

    One fused op splits each string, maps every token to a row (hashing it,
    or parsing it as an int64), looks the rows up and pools them: the
    `tf.strings.split` + `to_number` / `to_hash_bucket_fast` +
    `embedding_lookup_sparse` chain, with no token strings.

    Example:

    >>> inputs = keras.Input(shape=(), dtype="string")
    >>> pooled = StringEmbedding(1000, 8, delimiter="|")(inputs)
    >>> model = keras.Model(inputs, pooled)
    >>> model(tf.constant(["Comedy|Drama", ""])).shape
    TensorShape([2, 8])

    Args:
        num_buckets: Table rows V: hash buckets in "hash" mode, the id range
            in "index" mode, the modulus in "mod" mode.
        output_dim: Embedding size D.
        delimiter: Non-empty token separator (at most 16 bytes), or None:
            each whole string is one token (a single-valued feature).
        combiner: "sum", "mean" or "sqrtn".
        id_mode: "hash", "index" or "mod" (see `tf_ctr_ops.string_embedding`).
        skip_empty: Drop empty tokens (an empty string pools to zeros).
        embeddings_initializer, embeddings_regularizer, embeddings_constraint:
            For the `[num_buckets, output_dim]` table.
        max_norm: If set, rows are clipped to this L2 norm before pooling.

    Input: a string tensor `[B]` or `[B, 1]`. Output: `[B, output_dim]`.
    """

    _rows_arg = "num_buckets"
    _takes_ids = False

    def __init__(self, num_buckets, output_dim, delimiter=",", combiner="mean", id_mode="hash",
                 skip_empty=True, embeddings_initializer="uniform", embeddings_regularizer=None,
                 embeddings_constraint=None, max_norm=None, **kwargs):
        super().__init__(num_buckets, output_dim, combiner=combiner,
                         embeddings_initializer=embeddings_initializer,
                         embeddings_regularizer=embeddings_regularizer,
                         embeddings_constraint=embeddings_constraint, max_norm=max_norm, **kwargs)
        _check_string_table_dtype(self)
        self.delimiter = _layer_delimiter(delimiter)
        self.id_mode = _args.check_id_mode(id_mode)
        self.skip_empty = bool(skip_empty)

    @property
    def num_buckets(self):
        return self._rows

    def compute_output_spec(self, inputs, weights=None):
        _check_string_specs(self, inputs)
        _check_string_vector_specs(self, inputs)
        return super().compute_output_spec(inputs, weights)

    def call(self, inputs, weights=None):
        if _strings._is_packed(inputs):  # before the list of features is refused as such
            _strings.dense_strings(inputs)
        # Keras rebuilds a loaded model on float32 placeholders; other
        # non-string inputs go on to the op's TypeError, at construction.
        dtype = _values_dtype(_as_container(inputs))
        if dtype.is_floating:
            if _in_keras_symbolic_pass():
                return _symbolic_output(_string_inputs(inputs), self.output_dim, self.compute_dtype)
            raise _float_keys_error(self, dtype)
        return super().call(inputs, weights)

    def _lookup(self, table, inputs, weights):
        if weights is not None:
            raise ValueError("StringEmbedding takes no weights")
        return _strings.string_embedding(_string_inputs(inputs), table, delimiter=self.delimiter,
                                         combiner=self.combiner, id_mode=self.id_mode,
                                         skip_empty=self.skip_empty, max_norm=self.max_norm)

    def get_config(self):
        config = super().get_config()
        config.update({"delimiter": self.delimiter, "id_mode": self.id_mode, "skip_empty": self.skip_empty})
        return config


@keras.saving.register_keras_serializable(package="tf_ctr_ops")
class MultiStringEmbedding(_FusedOpLayer):
    """Many string features of one batch embedded by one grouped op.

    Equivalent to one `StringEmbedding` per feature, but all features are
    packed into one buffer and pooled in one kernel launch
    (`tf_ctr_ops.multi_string_embedding`).

    Example:

    >>> genres = keras.Input(shape=(), dtype="string")
    >>> history = keras.Input(shape=(), dtype="string")
    >>> g, h = MultiStringEmbedding([20, 4000], [4, 16], delimiters=["|", ","],
    ...                             id_modes=["hash", "index"])([genres, history])
    >>> (g.shape, h.shape)
    ((None, 4), (None, 16))

    Args:
        num_buckets: List of table sizes, one per feature.
        output_dims: List of embedding sizes (or one int for all).
        delimiters, combiners, id_modes, skip_empty: One value for all
            features, or a list with one per feature. A delimiter of None
            makes each whole string one token (a single-valued feature).
        embeddings_initializer: Initializer of every table.
        max_norm: If set, rows are clipped to this L2 norm before pooling.
        concat: Return the features' embeddings concatenated, `[B, D_1 +
            ... + D_N]`, written in place by one op (what a `Concatenate`
            of the outputs gives, the MLP's input, without its copy).

    Input: a list of string tensors `[B]`. Output: a list of `[B, D_i]`, or
    with `concat` one `[B, D_1 + ... + D_N]`.
    """

    def __init__(self, num_buckets, output_dims, delimiters=",", combiners="mean", id_modes="hash",
                 skip_empty=True, embeddings_initializer="uniform", max_norm=None, concat=False, **kwargs):
        super().__init__(**kwargs)
        _check_string_table_dtype(self)
        if not isinstance(num_buckets, (list, tuple)):
            # The feature count comes from it: one value cannot stand for all.
            raise TypeError(f"`num_buckets` must be a list with one table size per feature, got "
                            f"{type(num_buckets).__name__} {num_buckets!r}")
        self.num_buckets = [_check_positive_int(v, "num_buckets") for v in num_buckets]
        n = len(self.num_buckets)
        if n == 0:
            raise ValueError("`num_buckets` must list at least one feature")
        self.output_dims = [_check_positive_int(d, "output_dims")
                            for d in _args.per_feature(output_dims, n, "output_dims")]
        self.delimiters = [_layer_delimiter(d) for d in _args.per_feature(delimiters, n, "delimiters")]
        self.combiners = [_args.check_combiner(c) for c in _args.per_feature(combiners, n, "combiners")]
        self.id_modes = [_args.check_id_mode(m) for m in _args.per_feature(id_modes, n, "id_modes")]
        self.skip_empty = [bool(s) for s in _args.per_feature(skip_empty, n, "skip_empty")]
        self.embeddings_initializer = initializers.get(embeddings_initializer)
        self.max_norm = _check_max_norm(max_norm)
        self.concat = bool(concat)
        self.autocast = False  # see _TABLE_WEIGHT

    def build(self, input_shape=None):
        if self.built:
            return
        # An attribute each, not a list: Keras gives tf.train.Checkpoint the
        # variables of a layer's attributes, but not those of its lists.
        for i, (v, d) in enumerate(zip(self.num_buckets, self.output_dims)):
            setattr(self, f"embeddings_{i}", self.add_weight(shape=(v, d), initializer=self.embeddings_initializer,
                                                             name=f"embeddings_{i}", **_TABLE_WEIGHT))
        self.built = True

    @property
    def tables(self):
        return [getattr(self, f"embeddings_{i}") for i in range(len(self.num_buckets))]

    def compute_output_spec(self, inputs):
        _check_string_specs(self, inputs)
        spec = super().compute_output_spec(inputs)  # refuses anything but a list of the features first
        _check_string_vector_specs(self, inputs)
        return spec

    def call(self, inputs):
        inputs = [_string_inputs(x) for x in _feature_list(inputs, len(self.num_buckets), self)]
        floats = [x.dtype for x in inputs if x.dtype.is_floating]
        if floats:  # as StringEmbedding's
            if not _in_keras_symbolic_pass():
                raise _float_keys_error(self, floats[0])
            outs = [_symbolic_output(inputs[0], d, self.compute_dtype) for d in self.output_dims]
            return tf.concat(outs, 1) if self.concat else outs
        outs = _strings.multi_string_embedding(
            inputs, list(self.tables), delimiters=self.delimiters,
            combiners=self.combiners, id_modes=self.id_modes, skip_empty=self.skip_empty,
            max_norms=self.max_norm, concat=self.concat)
        cast = lambda o: o if o.dtype == self.compute_dtype else tf.cast(o, self.compute_dtype)  # noqa: E731
        return cast(outs) if self.concat else [cast(o) for o in outs]

    def compute_output_shape(self, input_shape):
        # One tensor's shape is a tuple of dims; a list of inputs', a list of tuples.
        if isinstance(input_shape, tuple) and all(d is None or isinstance(d, int) for d in input_shape):
            raise _not_a_feature_list(self, len(self.num_buckets), f"one tensor of shape {input_shape}")
        _feature_list(list(input_shape), len(self.num_buckets), self)
        batch = input_shape[0][0] if input_shape and input_shape[0] else None
        if self.concat:
            return (batch, sum(self.output_dims))
        return [(batch, d) for d in self.output_dims]

    def get_config(self):
        config = super().get_config()
        config.update({
            "num_buckets": self.num_buckets, "output_dims": self.output_dims, "delimiters": self.delimiters,
            "combiners": self.combiners, "id_modes": self.id_modes, "skip_empty": self.skip_empty,
            "embeddings_initializer": initializers.serialize(self.embeddings_initializer),
            "max_norm": self.max_norm, "concat": self.concat,
        })
        return config


@keras.saving.register_keras_serializable(package="tf_ctr_ops")
class EmptyHashTable(initializers.Initializer):
    """Initializer of a `HashTableEmbedding`'s `table` weight: no keys."""

    def __init__(self, num_slots, capacity, key_dtype=None):
        self.num_slots, self.capacity = int(num_slots), int(capacity)
        self.key_dtype = None if key_dtype is None else tf.as_dtype(key_dtype).name

    def __call__(self, shape, dtype=None):
        return _hash_table.empty_table(self.num_slots, self.capacity, self.key_dtype)

    def get_config(self):
        return {"num_slots": self.num_slots, "capacity": self.capacity, "key_dtype": self.key_dtype}


@keras.saving.register_keras_serializable(package="tf_ctr_ops")
class HashTableEmbedding(_PooledOutput, _FusedOpLayer):
    """Pooled embedding of raw keys, each with a row of its own.

    A key (a user id, an item id, any int64 or string) gets the next free row
    of the `[capacity, output_dim]` table the first time the layer sees it in
    training (`training=True`, as `fit` calls it); in inference the table is
    only read and a key without a row is left out of its bag. Two keys never
    share a row, unlike `HashEmbedding`'s buckets.

    Example:

    >>> user_items = keras.Input(shape=(None,), dtype="int64")
    >>> HashTableEmbedding(8, capacity=1000)(user_items).shape
    (None, 8)

    Args:
        output_dim: Embedding width.
        capacity: Rows of the table; keys beyond it read no row (counted as
            dropped in `statistics()`).
        combiner: "sum", "mean" or "sqrtn".
        key_dtype: "int64" (int32 keys are accepted too) or "string" (keys
            kept as their 64-bit fingerprints).
        embeddings_initializer: Initializer of the rows.
        admit_after: A key gets a row on its admit_after-th sighting in
            training (each occurrence counts).
        eviction: None (a full table drops new keys), "lru" or "lfu": evict
            the least recently / least often seen keys (see `tco.HashTable`);
            their rows are reset by `embeddings_initializer`.
        num_slots: Hash slots, a power of two (default: >= 2 x capacity).
        max_norm: If set, rows are clipped to this L2 norm before pooling.
        table_device: Where `table` lives and keys are found: "/CPU:0"
            (default) or a GPU (see `tco.HashTable`).

    The weights are `table` (int64 slots, non-trainable, on `table_device`) and
    `embeddings`. Inputs and weights: as `SparseEmbedding`, with -1 (or "")
    as the padding of dense keys.

    Slots: called on a list of N features (of one batch size), the layer
    returns N outputs of its one table, found and pooled by one op each
    (`tco.multi_hash_table_embedding`), as HugeCTR's slots share a table.
    """

    def __init__(self, output_dim, capacity, combiner="mean", key_dtype="int64", embeddings_initializer="uniform",
                 admit_after=1, eviction=None, num_slots=None, max_norm=None, table_device="/CPU:0", **kwargs):
        super().__init__(**kwargs)
        self._restores_any_capacity = False  # until its variables exist (build, a load, or a first call)
        self.output_dim = _check_positive_int(output_dim, "output_dim")
        self.capacity, self.num_slots, self.admit_after = _hash_table.check_table_args(
            capacity, num_slots, admit_after)
        self.combiner = _args.check_combiner(combiner)
        self.key_dtype = _hash_table.check_key_dtype(key_dtype)
        self.eviction = _hash_table.check_eviction(eviction)
        self.table_device = _hash_table.check_table_device(table_device)
        self.embeddings_initializer = initializers.get(embeddings_initializer)
        self.reset_seed = _hash_table.reset_seed_of(self.embeddings_initializer)
        self.max_norm = _check_max_norm(max_norm)
        self.autocast = False  # see _TABLE_WEIGHT
        self._slot_optimizer = _hash_table._SlotOptimizer()

    def reset_slots_of(self, optimizer):
        """With eviction: also reset the optimizer's slots (momentums,
        accumulators, ...) of a row given to a new key, e.g.
        `layer.reset_slots_of(model.optimizer)` after `compile` (a step traced
        before keeps the slots it was traced with: `fit` retraces after a
        `compile`, else `model.make_train_function(force=True)` does)."""
        self._slot_optimizer.set(optimizer)

    def slot_optimizer(self):
        return self._slot_optimizer.get()

    def build(self, input_shape=None):
        if self.built:
            return
        self.table = _hash_table.create_table_weight(lambda: self.add_weight(
            shape=_hash_table.table_shape(self.num_slots, self.capacity), dtype="int64",
            initializer=EmptyHashTable(self.num_slots, self.capacity, self.key_dtype), name="table", trainable=False),
            self.table_device)
        self.embeddings = self.add_weight(shape=(self.capacity, self.output_dim),
                                          initializer=self.embeddings_initializer, name="embeddings",
                                          **_TABLE_WEIGHT)
        _hash_table.check_restored_key_kind(self)
        self._restores_any_capacity = _hash_table.restore_any_capacity(self)
        self.built = True

    @property
    def values(self):
        return self.embeddings

    def load_own_variables(self, store):
        # `.weights.h5` and `.keras` loads assign the stored arrays as they
        # are: refuse a table of the other key kind, as a restore does.
        stored = self._trainable_variables + self._non_trainable_variables
        reset = None
        for i, variable in enumerate(stored):
            if variable is self.table and str(i) in store:
                _hash_table.check_saved_key_kind(store[str(i)], self)
                if tf.executing_eagerly():  # an evicting layer's table loaded into one that does not evict
                    reset = self._free_row_reset(store[str(i)])
        super().load_own_variables(store)
        if reset is not None:
            _hash_table._variable(self.embeddings).scatter_update(reset)
        if self.built and not self._restores_any_capacity:  # built in a symbolic pass, its variables made now
            self._restores_any_capacity = _hash_table.restore_any_capacity(self)

    def _free_row_reset(self, table_array):
        try:
            return _hash_table.free_row_reset(self, np.asarray(table_array))
        except (TypeError, ValueError, tf.errors.OpError) as e:
            raise ValueError(f"{type(self).__name__} {self.name!r}: the rows its weights' table had freed could "
                             f"not be given fresh values from its initializer ({e}); nothing was loaded") from e

    def _variables_initialized(self):
        return all(_hash_table._variable(v) is not None for v in (self.table, self.embeddings))

    @property
    def dim(self):
        return self.output_dim

    @property
    def row_initializer(self):
        return self.embeddings_initializer

    def statistics(self):
        """A dict of scalar tensors: size, occupied slots, dropped inserts, load factor."""
        self._check_built("statistics")
        return _hash_table.table_statistics(self.table, self.capacity)

    def export(self):
        """(keys, rows' values) of every key with a row, in row order (the
        order keys were inserted in, until eviction gives a freed row to a
        new key)."""
        self._check_built("export")
        return _hash_table.export_rows(self.table, self.embeddings, self.num_slots)

    def _check_built(self, what):
        if not self.built:
            raise RuntimeError(f"HashTableEmbedding.{what}() needs the layer's table: call the layer (or build "
                               f"it) first")

    def call(self, inputs, weights=None, training=None):
        # A frozen layer (trainable=False) only reads, as Keras' BatchNorm
        # runs in inference mode: no inserts, no evictions.
        insert = bool(training) and self.trainable
        features = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
        features = [_as_container(x) for x in features]
        floats = [_values_dtype(x) for x in features if _values_dtype(x).is_floating]
        if _in_keras_symbolic_pass() and (floats or not self._variables_initialized()):
            outputs = [_symbolic_output(x, self.output_dim, self.compute_dtype) for x in features]
            return outputs if isinstance(inputs, (list, tuple)) else outputs[0]
        if floats:
            raise _float_keys_error(self, floats[0])
        if not self._restores_any_capacity:  # a subclassed model's layer is built before its variables exist
            self._restores_any_capacity = _hash_table.restore_any_capacity(self)
        if isinstance(inputs, (list, tuple)):  # slots: features sharing this table
            if weights is not None and not isinstance(weights, (list, tuple)):
                raise ValueError(f"weights of a list of {len(inputs)} features must be a list of {len(inputs)} "
                                 "(one per feature, None where unweighted), got one value")
            weights = [None] * len(inputs) if weights is None else [_id_bags(w, "weights") for w in weights]
            outputs = _hash_table.multi_hash_table_embedding(
                self, [_id_bags(x) for x in inputs], weights, combiners=self.combiner,
                max_norms=self.max_norm, insert=insert)
            return [self._in_compute_dtype(out) for out in outputs]
        ids = _id_bags(inputs)
        weights = _weights_aligned(ids, _id_bags(weights, "weights"))
        return self._in_compute_dtype(_hash_table.hash_table_embedding(
            self, ids, weights, combiner=self.combiner, max_norm=self.max_norm, insert=insert))

    def compute_output_spec(self, inputs, *args, **kwargs):
        # A functional model is built without calling the layer: keys of the
        # other kind would otherwise pass until its first call. Float keys
        # have their own error at the call (_float_keys_error).
        for spec in tf.nest.flatten(inputs):
            dtype = tf.as_dtype(getattr(spec, "dtype", None) or "float32")
            if dtype == tf.string or dtype.is_integer:
                try:
                    _hash_table.check_key_kind(self.key_dtype, dtype)
                except TypeError as e:
                    raise TypeError(f"{type(self).__name__} {self.name!r}: {e}") from None
        return super().compute_output_spec(inputs, *args, **kwargs)

    def compute_output_shape(self, input_shape):
        if isinstance(input_shape, (list, tuple)) and input_shape and all(
                isinstance(s, (list, tuple)) for s in input_shape):
            return [_PooledOutput.compute_output_shape(self, s) for s in input_shape]
        return super().compute_output_shape(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update({
            "output_dim": self.output_dim, "capacity": self.capacity, "combiner": self.combiner,
            "key_dtype": self.key_dtype.name,
            "embeddings_initializer": initializers.serialize(self.embeddings_initializer),
            "admit_after": self.admit_after, "eviction": self.eviction, "num_slots": self.num_slots,
            "max_norm": self.max_norm, "table_device": self.table_device,
        })
        return config

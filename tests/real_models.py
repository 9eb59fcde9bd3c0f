"""SavedModels for the rewrite's tests beside the real model styles of
tf_ctr_ops/bench/models.py (a Keras lookup model, an Estimator-style TF1
feature-column model):

- a minimal TF1 model with one StaticHashTable;
- `tf.nn.safe_embedding_lookup_sparse` over `tf.strings.split` of a [None]
  string input, saved with `tf.saved_model.save`;
- any TF1 model of serialized tf.Examples, saved by Builder as Estimator
  exports are (save_tf1_examples_model).
"""

import tensorflow as tf


def save_tf1_table_model(path):
    """TF1: one StaticHashTable initialized by the main op, nothing to fuse."""
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.string, [None], name="x")
        init = tf.lookup.KeyValueTensorInitializer(["a", "b", "c"], [0, 1, 2], tf.string, tf.int64)
        table = tf.lookup.StaticHashTable(init, -1)
        y = table.lookup(x)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.tables_initializer())
            builder = tf.compat.v1.saved_model.Builder(path)
            sig = tf.compat.v1.saved_model.predict_signature_def({"x": x}, {"y": y})
            builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={"serving_default": sig},
                                                 main_op=tf.compat.v1.tables_initializer())
            builder.save()


def save_tf1_examples_model(path, outputs_of, seed=None):
    """TF1: `outputs_of(serialized)` ({key: tensor}) over a [None] string
    input "examples" of serialized tf.Examples, its variables initialized and
    saved by Builder with the one signature "serving_default"."""
    with tf.Graph().as_default():
        if seed is not None:
            tf.compat.v1.set_random_seed(seed)
        serialized = tf.compat.v1.placeholder(tf.string, [None], name="examples")
        outputs = outputs_of(serialized)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            builder = tf.compat.v1.saved_model.Builder(path)
            builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={
                "serving_default": tf.compat.v1.saved_model.predict_signature_def({"examples": serialized},
                                                                                  outputs)})
            builder.save()


def save_split_safe_lookup_model(path, buckets=1000, dim=8):
    """safe_embedding_lookup_sparse over hashed split tokens of a [None] string input."""

    class Model(tf.Module):
        def __init__(self):
            self.table = tf.Variable(tf.random.stateless_normal([buckets, dim], seed=[1, 2]))

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def serve(self, x):
            ids = tf.strings.to_hash_bucket_fast(tf.strings.split(x, "|"), buckets).to_sparse()
            return {"y": tf.nn.safe_embedding_lookup_sparse(self.table, ids, combiner="mean")}

    model = Model()
    tf.saved_model.save(model, path, signatures={"serving_default": model.serve})
    return model

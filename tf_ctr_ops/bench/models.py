"""Real model styles for `bench rewrite --model NAME`, written as users write them.

- `keras-lookup`: keras-io's structured-data style (26 fields at bench size:
  24 StringLookups, an IntegerLookup, a multi-hot StringLookup), exported with
  `model.export`: StringLookup / IntegerLookup without OOV slots feeding
  Embedding layers, a multi-hot StringLookup feeding a Dense layer, a numeric
  input, an MLP.
- `keras-feature-space`: keras-io's "structured data classification with
  FeatureSpace" style (26 fields at bench size: string and integer
  categorical features one-hot encoded, a discretized and a normalized float,
  two crosses), `output_mode="concat"` into an MLP, exported with
  `model.export`: one-hot encodings (DenseBincount) concatenated into a Dense.
- `tf1-feature-columns`: a TF1 `tf.compat.v1.feature_column` model exported
  as Estimator exports are (`tf.compat.v1.saved_model.Builder`, a
  serialized tf.Example input parsed by ParseExample, a main op that
  initializes tables and local variables, a vocabulary file kept as an
  asset): hashed `embedding_column`s (Criteo's 26 categorical fields at full
  size), a vocabulary-list and a vocabulary-file embedding column, an
  indicator column, numeric and bucketized columns.

With --quick each has 4 fields, not 26 (the cases' shapes say so).

The rewrite tests build the same models small (tests/test_rewrite_real_models.py).
Each suite run rewrites the model with `optimize_saved_model` on synthesized
inputs (the verification a user gets with no inputs of their own), then
serves both SavedModels in this process, checks that they agree, and times
them at batch 1024 and 1, interleaved.
"""

import os
import tempfile
import time

import numpy as np

from tf_ctr_ops.bench.harness import check_agreement, keyword_call, served_graph_call, time_interleaved
from tf_ctr_ops.bench.report import speedup_text

MODELS = ("keras-lookup", "keras-feature-space", "tf1-feature-columns")
TARGET = 1.5  # rewritten vs native serving latency at batch 1024
SERVE_BATCHES = (1024, 1)

COUNTRIES = ["us", "de", "fr", "cn", "br"]
DEVICES = ["phone", "tablet", "pc"]
WEEKDAYS = ["mon", "tue", "wed", "thu", "fri"]
TAGS = [f"tag{i}" for i in range(20)]


# ---------------------------------------------------------------------------
# keras-lookup


def _vocabulary(feature, size):
    return [f"f{feature}v{i}" for i in range(size)]


def export_keras_lookup_model(path, features=2, vocab=50, dim=8, seed=0):
    """Exports the Keras model to `path`; returns it and the (input, lookup
    layer) pairs its Embeddings read. Inputs: `s0..` string
    [B, 1] (one vocabulary each), `device_id` int64 [B, 1], `tags` string
    [B, 3] (multi-hot), `price` float32 [B, 1]."""
    import keras

    keras.utils.set_random_seed(seed)
    strings = [keras.Input(shape=(1,), dtype="string", name=f"s{f}") for f in range(features)]
    device_id = keras.Input(shape=(1,), dtype="int64", name="device_id")
    tags = keras.Input(shape=(3,), dtype="string", name="tags")
    price = keras.Input(shape=(1,), dtype="float32", name="price")
    parts, lookups = [], []
    for f, x in enumerate(strings):
        lookups.append((f"s{f}", keras.layers.StringLookup(vocabulary=_vocabulary(f, vocab), mask_token=None,
                                                           num_oov_indices=0)))
        parts.append(keras.layers.Flatten()(keras.layers.Embedding(vocab, dim)(lookups[-1][1](x))))
    lookups.append(("device_id", keras.layers.IntegerLookup(vocabulary=[3, 5, 7, 11], mask_token=None,
                                                            num_oov_indices=0)))
    parts.append(keras.layers.Flatten()(keras.layers.Embedding(4, dim)(lookups[-1][1](device_id))))
    hot = keras.layers.StringLookup(vocabulary=TAGS, mask_token=None, num_oov_indices=0, output_mode="multi_hot")(tags)
    parts.append(keras.layers.Dense(dim)(hot))
    parts.append(price)
    hidden = keras.layers.Dense(64, activation="relu")(keras.layers.Concatenate()(parts))
    model = keras.Model(strings + [device_id, tags, price], keras.layers.Dense(1, activation="sigmoid")(hidden))
    model.export(path, verbose=False)
    return model, lookups


def table_finds(lookups):
    """A concrete function of the model's inputs -> the vocabulary tables'
    finds alone (TF's LookupTableFindV2), for the (input, lookup layer)
    pairs an Embedding reads: the finds the fused ops replace with a memo of
    each table. Timed as the models are (served graph), so the figures
    compare."""
    import tensorflow as tf

    @tf.function
    def finds(**feeds):
        return {"ids": tf.add_n([tf.reshape(layer.lookup_table.lookup(feeds[name]), [-1])
                                 for name, layer in lookups])}
    return finds


def keras_lookup_inputs(rng, batch, features=2, vocab=50):
    """{input: array} for export_keras_lookup_model's model: in-vocabulary values."""
    feeds = {f"s{f}": np.array(_vocabulary(f, vocab), dtype=object)[rng.integers(0, vocab, size=(batch, 1))]
             for f in range(features)}
    feeds["device_id"] = np.array([3, 5, 7, 11], np.int64)[rng.integers(0, 4, size=(batch, 1))]
    feeds["tags"] = np.array(TAGS, dtype=object)[rng.integers(0, len(TAGS), size=(batch, 3))]
    feeds["price"] = rng.normal(size=(batch, 1)).astype(np.float32)
    return feeds


# ---------------------------------------------------------------------------
# keras-feature-space


def export_feature_space_model(path, rng, strings=2, vocab=50, rows=2000, seed=0):
    """Exports a FeatureSpace model to `path`, adapted on `rows` generated
    rows. Inputs: `s0..` string [B, 1] (`vocab` values each), `hour` and
    `slot` int32 [B, 1], `price` and `age` float32 [B, 1]; crosses of
    s0 x hour and slot x age."""
    import keras
    import tensorflow as tf
    from keras.utils import FeatureSpace

    keras.utils.set_random_seed(seed)
    data = feature_space_inputs(rng, rows, strings, vocab)
    features = {f"s{f}": FeatureSpace.string_categorical(num_oov_indices=1) for f in range(strings)}
    features.update(hour=FeatureSpace.integer_categorical(num_oov_indices=1),
                    slot=FeatureSpace.integer_categorical(num_oov_indices=1),
                    age=FeatureSpace.float_discretized(num_bins=10), price=FeatureSpace.float_normalized())
    fs = FeatureSpace(features=features, output_mode="concat",
                      crosses=[FeatureSpace.cross(feature_names=("s0", "hour"), crossing_dim=256),
                               FeatureSpace.cross(feature_names=("slot", "age"), crossing_dim=64)])
    fs.adapt(tf.data.Dataset.from_tensor_slices({k: v[:, 0] for k, v in data.items()}).batch(256))
    encoded = keras.Input(shape=(fs.get_encoded_features().shape[-1],))
    hidden = keras.layers.Dense(64, activation="relu")(encoded)
    trained = keras.Model(encoded, keras.layers.Dense(1, activation="sigmoid")(hidden))
    keras.Model(fs.get_inputs(), trained(fs.get_encoded_features())).export(path, verbose=False)


def feature_space_inputs(rng, batch, strings=2, vocab=50):
    """{input: [batch, 1] array} for export_feature_space_model's model."""
    feeds = {f"s{f}": np.array(_vocabulary(f, vocab), dtype=object)[rng.integers(0, vocab, size=(batch, 1))]
             for f in range(strings)}
    feeds["hour"] = rng.integers(0, 24, size=(batch, 1)).astype(np.int32)
    feeds["slot"] = rng.integers(0, 8, size=(batch, 1)).astype(np.int32)
    feeds["age"] = rng.uniform(18, 80, size=(batch, 1)).astype(np.float32)
    feeds["price"] = rng.lognormal(size=(batch, 1)).astype(np.float32)
    return feeds


# ---------------------------------------------------------------------------
# tf1-feature-columns


def save_tf1_feature_column_model(path, work_dir, hashed=2, buckets=1000, dim=8, seed=0):
    """Writes the Estimator-style TF1 SavedModel to `path` (its vocabulary file
    in `work_dir`). Signatures: "serving_default" (classify: inputs ->
    classes, scores) and "predict" (examples -> logits)."""
    import tensorflow as tf

    fc = tf.compat.v1.feature_column
    vocab_file = os.path.join(work_dir, "country_vocab.txt")
    with open(vocab_file, "w") as f:
        f.write("\n".join(COUNTRIES) + "\n")
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(seed)
        serialized = tf.compat.v1.placeholder(tf.string, [None], name="input_example_tensor")
        columns = [fc.embedding_column(fc.categorical_column_with_hash_bucket(f"c{f}", buckets), dim,
                                       combiner="mean" if f % 2 == 0 else "sqrtn") for f in range(hashed)]
        columns += [
            fc.embedding_column(fc.categorical_column_with_vocabulary_list("device", DEVICES, num_oov_buckets=1),
                                4, combiner="sqrtn"),
            fc.embedding_column(fc.categorical_column_with_vocabulary_file("country", vocab_file,
                                                                           vocabulary_size=len(COUNTRIES)), 4),
            fc.indicator_column(fc.categorical_column_with_vocabulary_list("weekday", WEEKDAYS)),
            fc.numeric_column("price"),
            fc.bucketized_column(fc.numeric_column("age"), [18.0, 30.0, 50.0]),
        ]
        features = tf.compat.v1.io.parse_example(serialized, fc.make_parse_example_spec(columns))
        net = fc.input_layer(features, columns)
        w = tf.compat.v1.get_variable("logit_w", [net.shape[1], 1])
        logits = tf.matmul(net, w)
        scores = tf.concat([1.0 - tf.sigmoid(logits), tf.sigmoid(logits)], axis=1)
        classes = tf.tile(tf.constant([["0", "1"]]), [tf.shape(logits)[0], 1])
        # Estimator's main op: tables and local variables (global ones are restored).
        main_op = tf.group(tf.compat.v1.tables_initializer(), tf.compat.v1.local_variables_initializer())
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.tables_initializer()])
            builder = tf.compat.v1.saved_model.Builder(path)
            signatures = {
                "serving_default": tf.compat.v1.saved_model.classification_signature_def(serialized, classes, scores),
                "predict": tf.compat.v1.saved_model.predict_signature_def({"examples": serialized},
                                                                          {"logits": logits}),
            }
            builder.add_meta_graph_and_variables(
                sess, ["serve"], signature_def_map=signatures, main_op=main_op,
                assets_collection=tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.ASSET_FILEPATHS))
            builder.save()


def tf_examples(rng, n, hashed=2):
    """n serialized tf.Examples for save_tf1_feature_column_model's model,
    with the gaps of real logs: missing categories, an out-of-vocabulary device."""
    import tensorflow as tf

    def strings(values):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v.encode() for v in values]))

    def floats(value):
        return tf.train.Feature(float_list=tf.train.FloatList(value=[value]))

    out = []
    for _ in range(n):
        feature = {f"c{f}": strings([f"{rng.integers(0, 10_000):08x}"] if rng.random() < 0.95 else [])
                   for f in range(hashed)}
        feature["device"] = strings([DEVICES[rng.integers(0, 3)]] if rng.random() < 0.9 else ["watch"])
        feature["country"] = strings([COUNTRIES[rng.integers(0, len(COUNTRIES))]])
        feature["weekday"] = strings([WEEKDAYS[rng.integers(0, len(WEEKDAYS))]])
        feature["price"] = floats(float(rng.random() * 10))
        feature["age"] = floats(float(rng.integers(10, 70)))
        out.append(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return np.array(out, dtype=object)


# ---------------------------------------------------------------------------
# The suite


FIELDS, QUICK_FIELDS = 26, 4  # Criteo's categorical fields at bench size; --quick's


def _build(name, folder, rng, fields):
    """(SavedModel path, signature key, make_inputs(batch)) of model `name`
    with `fields` categorical fields."""
    path = os.path.join(folder, "native")
    if name == "keras-lookup":
        features, vocab = fields - 2, 1000  # with the IntegerLookup and the multi-hot lookup
        _, lookups = export_keras_lookup_model(path, features=features, vocab=vocab, dim=16)
        return (path, "serving_default", lambda batch: keras_lookup_inputs(rng, batch, features, vocab),
                table_finds(lookups))
    if name == "keras-feature-space":
        strings, vocab = max(fields - 4, 1), 100  # with two integer, a discretized and a normalized feature
        export_feature_space_model(path, rng, strings=strings, vocab=vocab)
        return path, "serving_default", lambda batch: feature_space_inputs(rng, batch, strings, vocab), None
    save_tf1_feature_column_model(path, folder, hashed=fields, buckets=10_000, dim=16)
    return path, "predict", lambda batch: {"examples": tf_examples(rng, batch, hashed=fields)}, None


def model_style_suite(cfg, name):
    """Rewrites model style `name`, then times native against rewritten serving."""
    import tensorflow as tf

    from tf_ctr_ops import rewrite

    if name not in MODELS:
        raise ValueError(f"--model must be one of {MODELS}, got {name!r}")
    rng = np.random.default_rng(cfg.seed)
    fields = QUICK_FIELDS if cfg.quick else FIELDS
    batches = tuple(sorted({min(b, cfg.batch) for b in SERVE_BATCHES}, reverse=True))
    with tempfile.TemporaryDirectory(prefix="tf_ctr_ops_bench_models_") as tmp:
        with tf.device(cfg.device):
            src, key, make_inputs, finds = _build(name, tmp, rng, fields)
        dst = os.path.join(tmp, "rewritten")
        t0 = time.perf_counter()
        # Synthesized inputs, as a user without any; served where this suite times it.
        report = rewrite.optimize_saved_model(src, dst, runs=3, serving_device="gpu" if cfg.on_gpu else "cpu")
        optimize_s = time.perf_counter() - t0
        sig = report.signatures[key]
        models = {"native": tf.saved_model.load(src).signatures[key],
                  "fused": tf.saved_model.load(dst).signatures[key]}
        cases = []
        for batch in batches:
            feeds = {k: tf.constant(v) for k, v in make_inputs(batch).items()}
            calls = {k: served_graph_call(fn, feeds) or keyword_call(fn, feeds) for k, fn in models.items()}
            case = f"rewrite/{name}/batch{batch}"
            err = check_agreement(case, "native vs rewritten", calls["native"](), calls["fused"](),
                                  rtol=1e-5, atol=1e-6)
            with tf.device(cfg.device):
                t = time_interleaved(calls, cfg)
            cases.append({"case": case, "batch": batch, "shape": f"B={batch}, model {name}, {fields} fields", **t,
                          "speedup": t["native"]["median_ms"] / t["fused"]["median_ms"],
                          "max_abs_err": {"native": err}})
            if finds is not None and batch == max(batches):
                # What the fused ops do in the tables' place: TF's finds of the same keys.
                with tf.device(cfg.device):
                    fn = finds.get_concrete_function(**feeds)
                    call = served_graph_call(fn, feeds) or keyword_call(fn, feeds)
                    cases[-1]["table_finds_ms"] = time_interleaved({"finds": call}, cfg)["finds"]["median_ms"]
    left = [s for s in sig.skips if s["pattern"] == "-"]
    targets = [{"target": f"rewritten {name} SavedModel vs the native one, batch {c['batch']}, served graph",
                "dist": name, "shape": c["shape"], "batch": c["batch"], "min_speedup": TARGET,
                "speedup": c["speedup"], "met": bool(c["speedup"] >= TARGET)}
               for c in cases if c["batch"] == max(batches)]
    result = {"suite": "rewrite", "model": name, "fields": fields,
              # Subgraphs fused: a later stage (string_keys) refines an op an earlier one made.
              "rewrite": {"matches": rewrite.fused_subgraph_count(sig.matches), "skips": len(sig.skips), "unfused_feature_ops": len(left),
                          "unfused_by_op": _count_ops(left), "fused_ops": sorted({m["fused_op"] for m in sig.matches}),
                          "verified_on": sig.inputs, "max_abs_diff": sig.max_abs_diff,
                          "rejected_patterns": report.rejected_patterns, "optimize_seconds": optimize_s},
              "cases": cases, "targets": targets}
    print_model_style(result)
    return result


def _count_ops(records):
    counts = {}
    for r in records:
        counts[r["op"]] = counts.get(r["op"], 0) + 1
    return counts


def print_model_style(result):
    r = result["rewrite"]
    unfused = ", ".join(f"{op} x{n}" for op, n in sorted(r["unfused_by_op"].items())) or "none"
    print(f"model {result['model']} ({result['fields']} fields): {r['matches']} subgraph(s) fused ({', '.join(r['fused_ops']) or 'none'}); "
          f"feature ops left unfused: {unfused}; verified on {r['verified_on']} inputs "
          f"(max |diff| {r['max_abs_diff']:.2g}); optimize {r['optimize_seconds']:.1f}s")
    for c in result["cases"]:
        print(f"{c['case']:40} rewritten {c['fused']['median_ms']:.3f} ms  native {c['native']['median_ms']:.3f} ms"
              f"  {c['speedup']:.2f}x")
        if "table_finds_ms" in c:
            finds, fused = c["table_finds_ms"], c["fused"]["median_ms"]
            print(f"{'':40} for scale: TF's finds of the same keys in the vocabulary tables alone take "
                  f"{finds:.3f} ms ({100 * finds / fused:.0f}% of the rewritten model's time; the fused ops "
                  "find through a memo of each table)")
    for t in result["targets"]:
        print(f"target {t['target']} >= {t['min_speedup']}x: {speedup_text(t['speedup'], t['min_speedup'])}  "
              f"{'met' if t['met'] else 'NOT MET'}")
    print()

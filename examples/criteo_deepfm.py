"""DeepFM on Criteo-format data with tf-ctr-ops: train, export, serve, rewrite.

    python examples/criteo_deepfm.py                      # generated Criteo-like data
    python examples/criteo_deepfm.py --data train.txt     # Criteo TSV, or CSV with a header
    python examples/criteo_deepfm.py --smoke              # a tiny run (CI)

What it does, in order:

1. loads Criteo-format rows (label, I1..I13 counts, C1..C26 hex categories)
   or generates them with Criteo's cardinalities, Zipf-distributed ids and
   Criteo's missing-value rates;
2. trains a DeepFM-style Keras model whose 26 categorical fields are
   `tf_ctr_ops.layers.HashEmbedding` layers, and prints held-out logloss and AUC;
3. exports it as a SavedModel and serves a batch from it in a fresh process;
4. builds the same model from TF-native Keras layers (`Hashing` + `Embedding`,
   the "twin") with the trained weights, rewrites the twin's SavedModel with
   `tf_ctr_ops.rewrite.optimize_saved_model`, rewrites the tf-ctr-ops model's
   SavedModel too (its 26 per-field ops become grouped ones), and times
   serving a batch with all four, interleaved in this process.

Every model that serves here computes the same function: the script checks
that their outputs agree before it times them.
"""

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_ctr_ops  # noqa: E402  (loads the op library before any SavedModel using it)
from tf_ctr_ops import rewrite  # noqa: E402
from tf_ctr_ops.layers import HashEmbedding  # noqa: E402
# ctr_metrics: examples/, beside this file
from ctr_metrics import (agrees, exit_on_bad_data, fill_defaults, logloss, positive_int, roc_auc,  # noqa: E402
                         stratified_split)

DENSE = [f"I{i}" for i in range(1, 14)]
CATEGORICAL = [f"C{i}" for i in range(1, 27)]

# Distinct values of C1..C26 in the Criteo Kaggle display-advertising training set.
CRITEO_CARDINALITIES = [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
                        27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572]
# Approximate fractions of missing values per column in the same set.
DENSE_MISSING = [0.45, 0.0, 0.21, 0.22, 0.03, 0.22, 0.04, 0.0, 0.04, 0.45, 0.04, 0.77, 0.22]
CATEGORICAL_MISSING = [0.0, 0.0, 0.03, 0.03, 0.0, 0.12, 0.0, 0.0, 0.0, 0.0, 0.0, 0.03, 0.0,
                       0.0, 0.0, 0.03, 0.0, 0.0, 0.44, 0.44, 0.03, 0.76, 0.0, 0.03, 0.44, 0.44]

# A missing category is its own key, as in most Criteo pipelines; the empty
# string would be padding (a zero row) for HashEmbedding but a bucket for
# keras.layers.Hashing, and the two models must compute the same function.
MISSING = "<missing>"


@dataclass
class Data:
    labels: np.ndarray  # float32 [N]
    dense: np.ndarray  # float32 [N, 13]: log1p(max(x, 0)), missing -> 0
    categorical: np.ndarray  # object [N, 26] of str: hex ids, missing -> MISSING
    source: str

    def __len__(self):
        return len(self.labels)

    def take(self, rows):
        return Data(self.labels[rows], self.dense[rows], self.categorical[rows], self.source)

    def inputs(self):
        return {"dense": self.dense, "categorical": self.categorical}

    def dataset(self, batch_size, shuffle_seed=None):
        """A tf.data pipeline of ({"dense", "categorical"}, label) batches."""
        inputs = {"dense": self.dense, "categorical": tf.constant(self.categorical.astype(str))}
        ds = tf.data.Dataset.from_tensor_slices((inputs, self.labels))
        if shuffle_seed is not None:
            ds = ds.shuffle(len(self), seed=shuffle_seed)
        return ds.batch(batch_size).prefetch(2)


def transform_counts(values):
    """log1p(max(x, 0)) of integer counts, where NaN (missing) becomes 0."""
    values = np.nan_to_num(values, nan=0.0)
    return np.log1p(np.maximum(values, 0.0)).astype(np.float32)


# ---------------------------------------------------------------------------
# Data: Criteo files, or generated rows of the same shape


def load_criteo(path, max_rows=None):
    """Reads Criteo's TSV (no header) or a CSV whose header is label,I1..I13,C1..C26."""
    with open(path, newline="") as f:
        first = f.readline()
        f.seek(0)
        has_header = first.startswith("label")
        delimiter = "\t" if "\t" in first else ","
        reader = csv.reader(f, delimiter=delimiter)
        if has_header:
            next(reader)
        rows = []
        for line, row in enumerate(reader, start=2 if has_header else 1):
            if max_rows is not None and len(rows) >= max_rows:
                break
            if len(row) != 40:
                raise ValueError(f"{path}:{line}: expected 40 fields (label, 13 counts, 26 categories), "
                                 f"got {len(row)}")
            rows.append(row)
    if not rows:
        raise ValueError(f"{path} holds no rows")
    labels = np.array([float(r[0]) for r in rows], np.float32)
    counts = np.array([[float(v) if v else np.nan for v in r[1:14]] for r in rows], np.float64)
    categorical = np.array([[v or MISSING for v in r[14:]] for r in rows], dtype=object)
    return Data(labels, transform_counts(counts), categorical, f"{path} ({len(rows):,} rows)")


def _hex_keys(ids, field):
    """Distinct 32-bit hex strings for the ids of one field, like Criteo's hashed values."""
    unique, inverse = np.unique(ids, return_inverse=True)
    scrambled = (unique.astype(np.uint64) * np.uint64(2654435761) + np.uint64(field * 40503)) & np.uint64(0xFFFFFFFF)
    return np.char.mod("%08x", scrambled).astype(object)[inverse]


def generate_criteo(rows, seed=0):
    """Criteo-shaped rows: Criteo's cardinalities and missing rates, Zipf ids,
    heavy-tailed counts, and labels from a hidden logistic model (CTR ~ 0.25)
    in which popular ids carry learnable effects."""
    rng = np.random.default_rng(seed)
    logits = np.full(rows, -1.6)
    categorical = np.empty((rows, len(CATEGORICAL)), dtype=object)
    for f, (cardinality, missing) in enumerate(zip(CRITEO_CARDINALITIES, CATEGORICAL_MISSING)):
        ids = (rng.zipf(1.15, rows) - 1) % cardinality
        unique, inverse = np.unique(ids, return_inverse=True)
        logits += rng.normal(0.0, 0.35, len(unique))[inverse]
        keys = _hex_keys(ids, f)
        keys[rng.random(rows) < missing] = MISSING
        categorical[:, f] = keys
    counts = np.floor(rng.lognormal(rng.uniform(0.5, 4.0, len(DENSE)), 1.3, (rows, len(DENSE))))
    dense = transform_counts(np.where(rng.random(counts.shape) < DENSE_MISSING, np.nan, counts))
    logits += (dense - dense.mean(0)) @ rng.normal(0.0, 0.15, len(DENSE))
    labels = (rng.random(rows) < 1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
    return Data(labels, dense, categorical, f"generated ({rows:,} Criteo-like rows, seed {seed})")

# ---------------------------------------------------------------------------
# The model: one builder, two kinds of field embedding


def num_buckets(cardinality, cap):
    """Hash buckets of a field: twice its cardinality (few collisions), at most `cap`."""
    return int(min(max(2 * cardinality, 16), cap))


def fused_field(field, buckets, width):
    """The tf-ctr-ops field embedding: the keys hashed and looked up by one fused op."""
    return HashEmbedding(buckets, width, combiner="sum", name=f"embed_{field}")


def native_field(field, buckets, width):
    """The TF-native twin: keras.layers.Hashing (to_hash_bucket_fast) + Embedding (a gather)."""
    hashing = keras.layers.Hashing(num_bins=buckets, name=f"hash_{field}")
    embedding = keras.layers.Embedding(buckets, width, name=f"embed_{field}")
    return lambda keys: keras.ops.squeeze(embedding(hashing(keys)), axis=1)


def deepfm(field_embedding, buckets, k=8, hidden=(128, 64)):
    """DeepFM: first-order terms + factorization-machine pairwise terms + an MLP.

    Each field's table has k + 1 columns: its first-order weight, then its
    k-dimensional factor, which the FM and the MLP share.
    """
    dense = keras.Input(shape=(len(DENSE),), dtype="float32", name="dense")
    categorical = keras.Input(shape=(len(CATEGORICAL),), dtype="string", name="categorical")
    rows = [field_embedding(name, v, k + 1)(categorical[:, i:i + 1])
            for i, (name, v) in enumerate(zip(CATEGORICAL, buckets))]
    rows = keras.ops.stack(rows, axis=1)  # [B, 26, k + 1]
    first_order, factors = rows[:, :, 0], rows[:, :, 1:]

    linear = keras.layers.Dense(1, name="linear_dense")(dense) + keras.ops.sum(first_order, axis=1, keepdims=True)
    # 1/2 * sum over factor dims of ((sum_i v_i)^2 - sum_i v_i^2): all pairs <v_i, v_j>.
    pairwise = 0.5 * keras.ops.sum(keras.ops.square(keras.ops.sum(factors, axis=1))
                                   - keras.ops.sum(keras.ops.square(factors), axis=1), axis=1, keepdims=True)
    deep = keras.layers.Concatenate(name="deep_inputs")([keras.layers.Flatten(name="flat_factors")(factors), dense])
    for i, units in enumerate(hidden):
        deep = keras.layers.Dense(units, activation="relu", name=f"mlp_{i}")(deep)
    deep = keras.layers.Dense(1, name="mlp_out")(deep)
    ctr = keras.layers.Activation("sigmoid", name="ctr")(linear + pairwise + deep)
    return keras.Model({"dense": dense, "categorical": categorical}, ctr, name="deepfm")


def copy_weights(src, dst):
    """Copies weights layer by layer (by name): the twin gets the trained model's weights."""
    for layer in dst.layers:
        weights = layer.get_weights()
        if weights:
            layer.set_weights(src.get_layer(layer.name).get_weights())


# ---------------------------------------------------------------------------
# Timing

def interleaved_median_ms(fns, inputs, rounds):
    """Median latency of each function, calling them in turn each round (same
    process, same load), after a warm-up call of each."""
    for fn in fns.values():
        fn(**inputs)["output_0"].numpy()
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn(**inputs)["output_0"].numpy()
            times[name].append(time.perf_counter() - start)
    return {name: 1e3 * float(np.median(t)) for name, t in times.items()}


def batch_of(data, size):
    """`size` rows of `data`, cycling through it when it has fewer."""
    return data.take(np.arange(size) % len(data))


def as_tensors(inputs):
    return {k: tf.constant(v.astype(str) if v.dtype == object else v) for k, v in inputs.items()}


# ---------------------------------------------------------------------------
# Serving in a fresh process

SERVE_SCRIPT = """
import sys
import numpy as np
import tensorflow as tf
import tf_ctr_ops  # the SavedModel's graph uses the fused ops: load their library first

model = tf.saved_model.load(sys.argv[1])
batch = np.load(sys.argv[2])
out = model.serve({"dense": tf.constant(batch["dense"]), "categorical": tf.constant(batch["categorical"])})
np.save(sys.argv[3], out.numpy())
"""


def serve_in_fresh_process(export_dir, batch, workdir):
    """Runs the exported model in a new Python process; returns its output."""
    np.savez(os.path.join(workdir, "batch.npz"), dense=batch["dense"], categorical=batch["categorical"].astype(str))
    out_path = os.path.join(workdir, "served.npy")
    # cwd=workdir: a `-c` script puts its cwd first on sys.path, and a checkout
    # root there would shadow the installed package with the unbuilt sources;
    # so paths given relative to ours (--out DIR) are made absolute.
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    if env.get("PYTHONPATH"):
        # Relative entries (PYTHONPATH=.) would resolve against workdir.
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) if p else p
                                            for p in env["PYTHONPATH"].split(os.pathsep))
    proc = subprocess.run([sys.executable, "-c", SERVE_SCRIPT, os.path.abspath(export_dir), "batch.npz", out_path],
                          cwd=workdir, capture_output=True, text=True, timeout=300, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"serving in a fresh process failed:\n{proc.stdout}{proc.stderr}")
    return np.load(out_path)


# ---------------------------------------------------------------------------


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", metavar="PATH", help="Criteo-format file (TSV without header, or CSV with the "
                        "header label,I1..I13,C1..C26); default: generated data")
    parser.add_argument("--rows", type=positive_int, help="rows to generate, or to read at most from --data "
                        "(default: 60000 generated, the whole file)")
    parser.add_argument("--epochs", type=positive_int, help="default 2 (--smoke: 1)")
    parser.add_argument("--batch-size", type=positive_int, default=512)
    parser.add_argument("--max-buckets", type=positive_int, help="hash buckets per field at most (default 2^17, "
                        "--smoke: 2^12)")
    parser.add_argument("--serve-batch", type=positive_int, help="batch size of the latency comparison (default "
                        "1024, --smoke: 256)")
    parser.add_argument("--rounds", type=positive_int, help="interleaved calls per model for the latency (default "
                        "100, --smoke: 5)")
    parser.add_argument("--out", metavar="DIR", help="keep the SavedModels here (default: a temporary folder)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="a tiny, fast run (tests); options given still hold")
    args = parser.parse_args(argv)
    defaults = dict(rows=3000, epochs=1, max_buckets=2 ** 12, serve_batch=256, rounds=5) if args.smoke else dict(
        epochs=2, max_buckets=2 ** 17, serve_batch=1024, rounds=100)
    return fill_defaults(args, defaults)


def load_split(args):
    """(train, held-out) Data from --data or generated, with the `data` line printed."""
    data = load_criteo(args.data, args.rows) if args.data else generate_criteo(args.rows or 60_000, args.seed)
    train_rows, test_rows = stratified_split(data.labels, holdout=0.2, seed=args.seed)
    train, test = data.take(train_rows), data.take(test_rows)
    print(f"data      {data.source}: {len(train):,} train / {len(test):,} held out, "
          f"{len(DENSE)} counts + {len(CATEGORICAL)} categorical fields, CTR {data.labels.mean():.3f}")
    return train, test


def train_and_evaluate(model, train, test, args, field_layer):
    """Trains with Adam and prints the `train` and `quality` lines (held-out logloss and AUC)."""
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="binary_crossentropy")
    t0 = time.perf_counter()
    model.fit(train.dataset(args.batch_size, shuffle_seed=args.seed), epochs=args.epochs, shuffle=False, verbose=0)
    train_s = time.perf_counter() - t0
    probs = model.predict(test.dataset(4096), verbose=0)[:, 0]
    baseline = logloss(test.labels, np.full(len(test), train.labels.mean()))
    print(f"train     {args.epochs} epoch(s) in {train_s:.1f} s: 26 {field_layer} fields, "
          f"{model.count_params():,} parameters")
    print(f"quality   held-out logloss {logloss(test.labels, probs):.4f} (constant CTR: {baseline:.4f}), "
          f"AUC {roc_auc(test.labels, probs):.4f}")


def main(argv=None):
    args = parse_args(argv)
    keras.utils.set_random_seed(args.seed)
    t_start = time.perf_counter()
    train, test = exit_on_bad_data(load_split, args)

    buckets = [num_buckets(c, args.max_buckets) for c in CRITEO_CARDINALITIES]
    model = deepfm(fused_field, buckets)
    train_and_evaluate(model, train, test, args, "HashEmbedding")

    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or tmp
        os.makedirs(out, exist_ok=True)
        serve_batch = batch_of(test, args.serve_batch).inputs()
        in_process = model(as_tensors(serve_batch), training=False).numpy()

        ours_dir = os.path.join(out, "deepfm_tf_ctr_ops")
        model.export(ours_dir, verbose=False)
        fresh = serve_in_fresh_process(ours_dir, serve_batch, tmp)
        where = ours_dir if args.out else "a temporary folder (--out DIR keeps it)"
        export_diff = np.abs(fresh - in_process).max()
        print(f"export    SavedModel in {where}; a fresh process served {len(fresh):,} rows, "
              f"max |diff| vs in-process {export_diff:.3g}")
        if not agrees("the exported model's outputs in a fresh process and the model's", export_diff):
            return 1

        twin = deepfm(native_field, buckets)
        copy_weights(model, twin)
        twin_dir, fused_dir = os.path.join(out, "deepfm_native"), os.path.join(out, "deepfm_native_rewritten")
        twin.export(twin_dir, verbose=False)
        samples = {key: serve_batch for key in ("serve", "serving_default")}
        # Rewritten for the device this process serves it on.
        serving_device = "gpu" if tf.config.list_physical_devices("GPU") else "cpu"
        report = rewrite.optimize_saved_model(twin_dir, fused_dir, sample_inputs=samples, runs=3,
                                              serving_device=serving_device)
        sig = report.signatures["serving_default"]
        verdict = "outputs match" if report.ok and sig.outputs_match else "OUTPUTS DIFFER"
        print(f"rewrite   TF-native twin (keras Hashing + Embedding, the trained weights): "
              f"{rewrite.fused_subgraph_count(sig.matches)} subgraph(s) fused, {len(sig.skips)} left alone; "
              f"{verdict}")
        if verdict != "outputs match":
            return 1
        if not sig.matches and not sig.skips:
            print("            (the optimizer found no subgraph it rewrites in this model)")
        for reason, count in skip_reasons(sig.skips):
            print(f"            left alone x{count}: {reason}")
        grouped_dir = os.path.join(out, "deepfm_tf_ctr_ops_rewritten")
        report = rewrite.optimize_saved_model(ours_dir, grouped_dir, sample_inputs=samples, runs=0,
                                              serving_device=serving_device)
        sig = report.signatures["serving_default"]
        verdict = "outputs match" if report.ok and sig.outputs_match else "OUTPUTS DIFFER"
        fused_ops = sorted({m["fused_op"] for m in sig.matches})
        print(f"rewrite   tf-ctr-ops model (one HashEmbedding per field): {len(sig.matches)} subgraph(s) grouped "
              f"({', '.join(fused_ops) or 'none'}); {verdict}")
        if verdict != "outputs match":
            return 1

        models = {"native twin": tf.saved_model.load(twin_dir).signatures["serving_default"],
                  "rewritten twin": tf.saved_model.load(fused_dir).signatures["serving_default"],
                  "tf-ctr-ops layers": tf.saved_model.load(ours_dir).signatures["serving_default"],
                  "layers, rewritten": tf.saved_model.load(grouped_dir).signatures["serving_default"]}
        inputs = as_tensors(serve_batch)
        outputs = {name: fn(**inputs)["output_0"].numpy() for name, fn in models.items()}
        agreement = max(np.abs(o - outputs["native twin"]).max() for o in outputs.values())
        print(f"agree     all four SavedModels on {len(in_process):,} rows: max |diff| {agreement:.3g}")
        if not agrees("the four SavedModels' outputs", agreement):
            return 1  # before timing: a speedup of a model that computes something else means nothing
        latency = interleaved_median_ms(models, inputs, args.rounds)
        print(f"serving   batch {args.serve_batch:,}, median of {args.rounds} interleaved calls "
              f"(speedup against the native twin):")
        for name, ms in latency.items():
            speedup = "" if name == "native twin" else f"   {latency['native twin'] / ms:.2f}x"
            print(f"            {name:18s} {ms:8.2f} ms{speedup}")
    print(f"done      in {time.perf_counter() - t_start:.0f} s")
    return 0


def skip_reasons(skips, most=3):
    """The most frequent reasons subgraphs were left alone, with their counts."""
    counts = {}
    for skip in skips:
        counts[skip["reason"]] = counts.get(skip["reason"], 0) + 1
    return sorted(counts.items(), key=lambda kv: -kv[1])[:most]


if __name__ == "__main__":
    sys.exit(main())

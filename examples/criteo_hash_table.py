"""DeepFM on raw Criteo keys with HashTableEmbedding: every key its own row.

    python examples/criteo_hash_table.py                   # generated Criteo-like data
    python examples/criteo_hash_table.py --data train.txt  # Criteo TSV, or CSV with a header
    python examples/criteo_hash_table.py --smoke           # a tiny run (CI)

The model of criteo_deepfm.py, with its 26 categorical fields embedded by
`tf_ctr_ops.layers.HashTableEmbedding` instead of hash buckets: the raw hex
keys are never hashed into a fixed number of buckets; each key gets a row of
its own the first time training sees it (after `--admit-after` sightings),
up to the field's capacity. It trains, prints held-out logloss and AUC and the
tables' statistics, exports a SavedModel (the tables are ordinary variables in
it) and serves a batch from it in a fresh process, checking that the outputs
match, and checks that serving inserted nothing.
"""

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tf_ctr_ops  # noqa: E402,F401  (loads the op library before any SavedModel using it)
from tf_ctr_ops.layers import HashTableEmbedding  # noqa: E402
# ctr_metrics: examples/, beside this file
from ctr_metrics import agrees, exit_on_bad_data, fill_defaults, positive_int  # noqa: E402
from criteo_deepfm import (CATEGORICAL, CRITEO_CARDINALITIES, as_tensors, batch_of, deepfm,  # noqa: E402
                           load_split, serve_in_fresh_process, train_and_evaluate)


def table_field(capacities, admit_after):
    """Field embeddings keyed by the raw strings, one table per field."""
    def field(name, _, width):
        return HashTableEmbedding(width, capacity=capacities[name], key_dtype="string", combiner="sum",
                                  admit_after=admit_after, name=f"embed_{name}")
    return field


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", metavar="PATH", help="Criteo-format file (TSV without header, or CSV with the "
                        "header label,I1..I13,C1..C26); default: generated data")
    parser.add_argument("--rows", type=positive_int, help="rows to generate, or to read at most from --data "
                        "(default: 60000 generated, the whole file)")
    parser.add_argument("--epochs", type=positive_int, help="default 2 (--smoke: 1)")
    parser.add_argument("--batch-size", type=positive_int, default=512)
    parser.add_argument("--max-capacity", type=positive_int, help="rows per field's table at most (default 2^17, "
                        "--smoke: 2^12)")
    parser.add_argument("--admit-after", type=int, default=1,
                        help="a key gets a row on its N-th sighting in training (1: the first)")
    parser.add_argument("--out", metavar="DIR", help="keep the SavedModel here (default: a temporary folder)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="a tiny, fast run (tests); options given still hold")
    args = parser.parse_args(argv)
    defaults = dict(rows=3000, epochs=1, max_capacity=2 ** 12) if args.smoke else dict(epochs=2, max_capacity=2 ** 17)
    return fill_defaults(args, defaults)


def main(argv=None):
    args = parse_args(argv)
    keras.utils.set_random_seed(args.seed)
    t_start = time.perf_counter()
    train, test = exit_on_bad_data(load_split, args)

    capacities = {name: int(min(max(c, 16), args.max_capacity)) for name, c in zip(CATEGORICAL, CRITEO_CARDINALITIES)}
    model = deepfm(table_field(capacities, args.admit_after), [0] * len(CATEGORICAL))
    train_and_evaluate(model, train, test, args, "HashTableEmbedding")

    tables = [model.get_layer(f"embed_{name}") for name in CATEGORICAL]
    stats = [{k: float(v) for k, v in t.statistics().items()} for t in tables]
    distinct = [len(np.unique(train.categorical[:, i])) for i in range(len(CATEGORICAL))]
    print(f"tables    {int(sum(s['size'] for s in stats)):,} keys with a row "
          f"({sum(distinct):,} distinct keys in training), {int(sum(s['dropped'] for s in stats)):,} "
          f"inserts dropped at capacity; fullest table {max(s['load_factor'] for s in stats):.0%} full")

    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or tmp
        os.makedirs(out, exist_ok=True)
        serve_batch = batch_of(test, 256).inputs()
        in_process = model(as_tensors(serve_batch), training=False).numpy()
        sizes = [int(t.statistics()["size"]) for t in tables]
        export_dir = os.path.join(out, "deepfm_hash_table")
        model.export(export_dir, verbose=False)
        fresh = serve_in_fresh_process(export_dir, serve_batch, tmp)
        unchanged = sizes == [int(t.statistics()["size"]) for t in tables]
        where = export_dir if args.out else "a temporary folder (--out DIR keeps it)"
        export_diff = np.abs(fresh - in_process).max()
        print(f"export    SavedModel in {where}; a fresh process served {len(fresh):,} rows, "
              f"max |diff| vs in-process {export_diff:.3g}; "
              f"serving inserted {'nothing' if unchanged else 'KEYS (a bug)'}")
        if not unchanged or not agrees("the exported model's outputs in a fresh process and the model's",
                                       export_diff):
            return 1
    print(f"done      in {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

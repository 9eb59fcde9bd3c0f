"""CI runs of examples/: each in smoke mode in a fresh process, on the real
samples in ../shared/data where present (MovieLens on generated data too), checking the
exit code and the lines a user reads. Plus in-process checks of the helpers
those lines depend on (the Criteo reader, AUC)."""

import importlib.util
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from conftest import data_file, fresh_process_env

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
NUMBER = r"([-+0-9.eE]+|nan|inf)"


def run_example(name, *args, cwd):
    # cwd outside the checkout: the example must find the built package, not the sources.
    proc = subprocess.run([sys.executable, str(EXAMPLES / name), *map(str, args)], cwd=cwd, env=fresh_process_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return proc.stdout


def number_after(pattern, out):
    match = re.search(pattern + NUMBER, out)
    assert match, f"no line matching {pattern!r} in:\n{out}"
    return float(match.group(1))


def check_quality(out):
    auc = number_after(r"AUC ", out)
    loss = number_after(r"held-out logloss ", out)
    assert 0.0 <= auc <= 1.0, out
    assert math.isfinite(loss) and loss > 0, out


def check_criteo_run(out, serve_batch):
    check_quality(out)
    assert number_after(rf"a fresh process served {serve_batch:,} rows, max \|diff\| vs in-process ", out) <= 1e-6
    # The fused model, the TF-native twin and both rewritten models are one function.
    assert number_after(r"all four SavedModels on [\d,]+ rows: max \|diff\| ", out) <= 1e-5, out
    assert re.search(r"rewrite .*: \d+ subgraph\(s\) fused, \d+ left alone; outputs match", out), out
    # The per-field ops of the fused model are grouped into one op per output.
    assert re.search(r"rewrite +tf-ctr-ops model .*: [1-9]\d* subgraph\(s\) grouped \(.*Ctr(Multi|Concat)String"
                     r".*\); outputs match", out), out
    for name in ("native twin", "rewritten twin", "tf-ctr-ops layers", "layers, rewritten"):
        ms = number_after(rf"\n +{name} +", out)
        assert math.isfinite(ms) and ms > 0, out
    assert len(re.findall(r" ms +\d+\.\d\dx\n", out)) == 3, out  # each speedup against the native twin


# The Criteo examples run once each, on the real sample: CI's main job runs
# criteo_deepfm.py on generated data at full size, and
# test_generated_criteo_has_criteo_shape below checks the generator.
def test_criteo_deepfm_real_sample(tmp_path):
    path = data_file("criteo_sample.txt")
    # --out relative to the cwd: the fresh serving process runs elsewhere
    out = run_example("criteo_deepfm.py", "--smoke", "--data", path, "--out", "models", cwd=tmp_path)
    assert "(200 rows): 160 train / 40 held out" in out, out
    check_criteo_run(out, 256)
    for model in ("deepfm_tf_ctr_ops", "deepfm_native", "deepfm_native_rewritten", "deepfm_tf_ctr_ops_rewritten"):
        assert (tmp_path / "models" / model / "saved_model.pb").exists()


@pytest.mark.parametrize("real", [False, True], ids=["generated", "real_sample"])
def test_movielens_sequence(tmp_path, real):
    args = ["--smoke"] + (["--data", data_file("movielens_sample.txt")] if real else [])
    out = run_example("movielens_sequence.py", *args, cwd=tmp_path)
    check_quality(out)
    # Both StringEmbeddings equal the split + convert + lookup composition.
    assert number_after(r"genres max \|diff\| ", out) <= 1e-6, out
    assert number_after(r"history max \|diff\| ", out) <= 1e-6, out
    if real:
        assert "(200 ratings)" in out


class LookupModule(tf.Module):
    """A TF-native lookup that CtrFusionOptimizer rewrites: dense ids, 0 is padding."""

    def __init__(self):
        super().__init__()
        self.table = tf.Variable(np.random.default_rng(0).normal(size=(50, 4)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int64, name="ids")])
    def pooled(self, ids):
        return {"mean": tf.nn.embedding_lookup_sparse(self.table, tf.sparse.from_dense(ids), None, combiner="mean")}


def test_optimize_saved_model_example(tmp_path):
    module = LookupModule()
    tf.saved_model.save(module, str(tmp_path / "model"), signatures={"serving_default": module.pooled})
    out = run_example("optimize_saved_model.py", "model", "--report", "report.json", cwd=tmp_path)
    assert "signature 'serving_default': 1 fused, 0 left alone" in out, out
    assert "outputs match" in out, out
    assert "wrote model_ctr_fused: 1 subgraph(s) fused, 0 left alone" in out, out
    assert (tmp_path / "model_ctr_fused" / "saved_model.pb").exists() and (tmp_path / "report.json").exists()
    shutil.rmtree(tmp_path / "model_ctr_fused")
    out = run_example("optimize_saved_model.py", ".", cwd=tmp_path / "model")  # beside it, not inside
    assert "wrote ../model_ctr_fused: 1 subgraph(s) fused" in out, out
    assert (tmp_path / "model_ctr_fused" / "saved_model.pb").exists()


def load_example(name):
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))  # as `python examples/NAME.py` has it: its helpers beside it
    spec = importlib.util.spec_from_file_location(name.removesuffix(".py"), EXAMPLES / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_optimize_example_refuses_bad_paths_in_one_line(tmp_path, monkeypatch, capsys):
    # In this process: each case fails before TensorFlow reads a model, and an
    # uncaught exception here is the traceback a user would see.
    example = load_example("optimize_saved_model.py")
    monkeypatch.chdir(tmp_path)
    module = LookupModule()
    tf.saved_model.save(module, "model", signatures={"serving_default": module.pooled})
    (tmp_path / "empty").mkdir()
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "saved_model.pb").write_bytes(b"not a proto")
    for args, want in ((["nosuch"], "error: nosuch is not a SavedModel: it does not exist"),
                       (["empty"], "error: empty is not a SavedModel: it has no saved_model.pb"),
                       (["corrupt"], "error: ")):
        assert example.main(args) == 1, args
        assert want in capsys.readouterr().err, args
    # A report that cannot be written is refused before DST is: it was a traceback after.
    with pytest.raises(SystemExit) as exit_info:
        example.main(["model", "out", "--report", "."])
    assert exit_info.value.code == 2 and "--report . cannot be written" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------
# In-process checks of the Criteo example's helpers


@pytest.fixture(scope="module")
def criteo():
    return load_example("criteo_deepfm.py")


def test_criteo_example_fails_when_its_savedmodels_disagree(criteo, monkeypatch, capsys):
    # The agreement was printed, never checked: a twin of random weights was
    # timed as the native model and the run exited 0.
    monkeypatch.setattr(criteo, "copy_weights", lambda src, dst: None)
    assert criteo.main(["--smoke", "--rows", "600", "--rounds", "1"]) == 1
    out, err = capsys.readouterr()
    assert "error: the four SavedModels' outputs differ by" in err, err
    assert "serving   batch" not in out, out


def test_criteo_example_options_hold_under_smoke(criteo):
    args = criteo.parse_args(["--smoke", "--epochs", "3", "--serve-batch", "8"])
    assert (args.epochs, args.serve_batch, args.rounds, args.rows) == (3, 8, 5, 3000)
    with pytest.raises(SystemExit):
        criteo.parse_args(["--serve-batch", "0"])


def test_criteo_reader_takes_tsv_and_csv_alike(criteo, tmp_path):
    rows = [["1", "", "-3", "7"] + [""] * 10 + ["05db9164", ""] + [f"{i:08x}" for i in range(24)],
            ["0"] + ["2"] * 13 + ["68fd1e64"] * 26]
    (tmp_path / "train.txt").write_text("".join("\t".join(r) + "\n" for r in rows))
    header = ["label"] + criteo.DENSE + criteo.CATEGORICAL
    (tmp_path / "sample.csv").write_text("".join(",".join(r) + "\n" for r in [header] + rows))
    tsv, csv = criteo.load_criteo(tmp_path / "train.txt"), criteo.load_criteo(tmp_path / "sample.csv")
    for data in (tsv, csv):
        np.testing.assert_array_equal(data.labels, [1, 0])
        # log1p(max(x, 0)); missing -> 0
        np.testing.assert_allclose(data.dense[0, :3], [0.0, 0.0, np.log1p(7)], rtol=1e-6)
        np.testing.assert_allclose(data.dense[1], np.full(13, np.log1p(2)), rtol=1e-6)
        assert list(data.categorical[0, :2]) == ["05db9164", criteo.MISSING]
    (tmp_path / "bad.txt").write_text("1\t2\t3\n")
    with pytest.raises(ValueError, match="bad.txt:1: expected 40 fields"):
        criteo.load_criteo(tmp_path / "bad.txt")


def test_roc_auc_counts_pairs_with_ties_as_half(criteo):
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 2, 300).astype(np.float32)
    scores = rng.integers(0, 20, 300) / 20.0  # many ties
    pos, neg = scores[labels == 1], scores[labels == 0]
    pairs = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    assert criteo.roc_auc(labels, scores) == pytest.approx(pairs / (len(pos) * len(neg)))
    assert math.isnan(criteo.roc_auc(np.ones(4), np.arange(4.0)))


def test_generated_criteo_has_criteo_shape(criteo):
    data = criteo.generate_criteo(4000, seed=1)
    assert data.dense.shape == (4000, 13) and data.categorical.shape == (4000, 26)
    assert 0.1 < data.labels.mean() < 0.4
    distinct = [len(set(data.categorical[:, f])) for f in range(26)]
    assert distinct[8] <= 3 + 1 and distinct[2] > 500  # C9 has 3 values (+ missing), C3 ~10M
    missing = (data.categorical == criteo.MISSING).mean(0)
    assert missing[21] > 0.6 and missing[0] == 0  # C22 is mostly missing, C1 never


def check_hash_table_run(out):
    check_quality(out)
    assert "26 HashTableEmbedding fields" in out, out
    keys, distinct = re.search(r"tables +([\d,]+) keys with a row \(([\d,]+) distinct", out).groups()
    assert 0 < int(keys.replace(",", "")) <= int(distinct.replace(",", "")), out
    assert number_after(r"a fresh process served [\d,]+ rows, max \|diff\| vs in-process ", out) <= 1e-6, out
    assert "serving inserted nothing" in out, out


def test_criteo_hash_table_real_sample(tmp_path):
    path = data_file("criteo_sample.txt")
    out = run_example("criteo_hash_table.py", "--smoke", "--data", path, "--admit-after", "2", "--out", "ht",
                      cwd=tmp_path)
    assert "(200 rows): 160 train / 40 held out" in out, out
    check_hash_table_run(out)
    assert (tmp_path / "ht" / "deepfm_hash_table" / "saved_model.pb").exists()


@pytest.mark.parametrize("labels", [[0, 1], [1, 1], [0, 0, 1, 1, 1], [0, 1, 2]])
def test_the_split_holds_out_at_least_one_row_and_trains_on_the_rest(criteo, labels):
    # Two rows of different classes held out nothing, and the example died in
    # Keras' predict on an empty dataset.
    metrics = sys.modules["ctr_metrics"]
    train, test = metrics.stratified_split(np.array(labels), 0.2, seed=0)
    assert len(test) >= 1 and len(train) >= 1
    assert sorted(np.concatenate([train, test]).tolist()) == list(range(len(labels)))


def test_too_few_rows_to_split_is_a_one_line_error(criteo, capsys):
    with pytest.raises(SystemExit) as exit_:
        criteo.main(["--smoke", "--rows", "1"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "error: 1 row(s) cannot be split into train and held-out rows; give at least 2")

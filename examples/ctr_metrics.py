"""Evaluation helpers shared by the examples: a stratified train/held-out
split, logloss and ROC AUC (NumPy only, so the examples need no scikit-learn),
and the checks that make an example fail rather than print a difference."""

import argparse
import sys

import numpy as np

AGREE_ATOL = 1e-5  # the same weights served two ways: float32 rounding only


def positive_int(text):
    """argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def fill_defaults(args, defaults):
    """Sets each option of `defaults` that the command line left None: an
    option given still holds under --smoke."""
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def agrees(what, diff, atol=AGREE_ATOL):
    """Whether a max |difference| is within atol (NaN is not); if not, says so
    on stderr, and the example exits 1."""
    if diff <= atol:
        return True
    print(f"error: {what} differ by {diff:.3g} (more than {atol:g})", file=sys.stderr)
    return False


def stratified_split(labels, holdout, seed=0):
    """Train and held-out row indices, each class split in proportion, with at
    least one row on each side (a model cannot be evaluated on no rows)."""
    if len(labels) < 2:
        raise ValueError(f"{len(labels)} row(s) cannot be split into train and held-out rows; give at least 2")
    rng = np.random.default_rng(seed)
    train, test = [], []
    for cls in np.unique(labels):
        rows = rng.permutation(np.flatnonzero(labels == cls))
        cut = max(1, int(round(len(rows) * holdout))) if len(rows) > 1 else 0
        test.append(rows[:cut])
        train.append(rows[cut:])
    train, test = rng.permutation(np.concatenate(train)), np.concatenate(test)
    if not len(test):  # every class had one row
        train, test = train[1:], train[:1]
    return train, np.sort(test)


def exit_on_bad_data(load, *args):
    """load(*args), or a one-line error and exit status 2 where the data cannot be used."""
    try:
        return load(*args)
    except ValueError as e:  # a malformed --data file, or too few rows to hold some out
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def logloss(labels, probs):
    p = np.clip(probs.astype(np.float64), 1e-7, 1 - 1e-7)
    return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)))


def roc_auc(labels, scores):
    """Area under the ROC curve (Mann-Whitney U with average ranks for ties); NaN with one class."""
    labels = np.asarray(labels) > 0.5
    positives, negatives = int(labels.sum()), int((~labels).sum())
    if positives == 0 or negatives == 0:
        return float("nan")
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    average_rank = np.cumsum(counts) - (counts - 1) / 2.0  # 1-based rank of each distinct score
    ranks = average_rank[inverse]
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))

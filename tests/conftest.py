"""Shared fixtures: quiet TF logs, seeded RNG, and the real CTR samples."""

import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

DATA_DIR = Path(os.environ.get("TF_CTR_OPS_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"))


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def data_file(name):
    """Path of a sample in ../shared/data, or a skip naming what is missing."""
    path = DATA_DIR / name
    if not path.exists():
        pytest.skip(f"real-data sample {path} is absent (set TF_CTR_OPS_DATA to its folder)")
    return path

"""The one rule by which verification compares a rewritten model's outputs
with the original's."""

import numpy as np


def _numeric(dtype):
    """Numbers numpy knows, or one of ml_dtypes' floats (bfloat16), whose
    numpy kind is 'V' (raw bytes), not 'f'."""
    if dtype.kind in "fciub":
        return True
    try:
        import tensorflow as tf

        return tf.as_dtype(dtype).is_floating
    except (TypeError, ValueError):
        return False


def max_abs_diff(reference, actual):
    """Largest |difference| over the outputs of `reference` ({name: array})
    and `actual`, and whether all are close: integers, booleans and strings
    equal, floats allclose(rtol=1e-5, atol=1e-6) with NaN equal to NaN."""
    worst, close = 0.0, True
    for key in reference:
        a, b = np.asarray(reference[key]), np.asarray(actual[key])
        if a.shape != b.shape:
            return float("inf"), False
        if a.size == 0:
            continue
        if a.dtype.kind in "iub" and b.dtype.kind in "iub":  # ids, counts, flags: exact
            if not np.array_equal(a, b):
                # In Python ints: int64 ids that differ beyond float64's 53 bits would read as equal.
                return float(np.abs(a.astype(object) - b.astype(object)).max()), False
        elif _numeric(a.dtype) and _numeric(b.dtype):
            # Complex values keep their imaginary parts (float64 would drop them).
            wide = np.complex128 if "c" in (a.dtype.kind, b.dtype.kind) else np.float64
            a64, b64 = a.astype(wide), b.astype(wide)
            # Equal infinities (and NaN against NaN) do not differ; inf - inf
            # would be NaN, reported as an infinite difference.
            same = (a64 == b64) | (np.isnan(a64) & np.isnan(b64))
            with np.errstate(invalid="ignore"):
                diff = np.where(same, 0.0, np.abs(a64 - b64))
            diff = np.where(np.isnan(diff), np.inf, diff)
            worst = max(worst, float(diff.max()))
            close &= bool(np.allclose(a64, b64, rtol=1e-5, atol=1e-6, equal_nan=True))
        elif not np.array_equal(a, b):
            return float("inf"), False
    return worst, close

"""Comparing results: the project's float tolerance rule, NaN/inf aware, with messages that show the worst element."""
import numpy as np


def _np(x):
    if hasattr(x, "array"):  # smalltrain Tensor
        x = x.array
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch tensor
        x = x.detach().cpu().numpy()
    if hasattr(x, "get") and not isinstance(x, np.ndarray):  # cupy
        x = x.get()
    return np.asarray(x)


def max_error(ours, ref):
    """max|ours - ref| over finite entries and the scale max(1, max|ref|) that the tolerance multiplies."""
    a, b = _np(ours).astype(np.float64), _np(ref).astype(np.float64)
    finite = np.isfinite(b) & np.isfinite(a)
    err = float(np.abs(a[finite] - b[finite]).max()) if finite.any() else 0.0
    scale = max(1.0, float(np.abs(b[np.isfinite(b)]).max())) if np.isfinite(b).any() else 1.0
    return err, scale


def assert_close(ours, ref, rtol=1e-5, name="value"):
    """Assert shape, NaN/inf positions, and max|ours - ref| <= rtol * max(1, max|ref|)."""
    a, b = _np(ours), _np(ref)
    if a.shape != b.shape:
        raise AssertionError(f"{name}: shape {list(a.shape)} != expected {list(b.shape)}")
    if a.dtype.kind == "b" or b.dtype.kind == "b" or (a.dtype.kind in "iu" and b.dtype.kind in "iu"):
        if not np.array_equal(a, b):
            bad = np.argwhere(a != b)[:5].tolist()
            raise AssertionError(f"{name}: integer/bool values differ at {bad}")
        return 0.0
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    if not np.array_equal(np.isnan(a64), np.isnan(b64)):
        raise AssertionError(f"{name}: NaN positions differ (ours {int(np.isnan(a64).sum())} NaN, expected "
                             f"{int(np.isnan(b64).sum())})")
    inf_a, inf_b = np.isinf(a64), np.isinf(b64)
    if not np.array_equal(inf_a, inf_b) or not np.array_equal(a64[inf_a], b64[inf_b]):
        raise AssertionError(f"{name}: infinities differ")
    err, scale = max_error(a64, b64)
    if err > rtol * scale:
        with np.errstate(invalid="ignore"):
            diff = np.where(np.isfinite(a64) & np.isfinite(b64), np.abs(a64 - b64), 0)
        where = tuple(int(i) for i in np.unravel_index(int(np.argmax(diff)), diff.shape)) if diff.size else ()
        raise AssertionError(f"{name}: max|ours - expected| = {err:.3g} > {rtol:g} * {scale:.3g} at index "
                             f"{list(where)} (ours {float(a64[where])!r}, expected {float(b64[where])!r})")
    return err

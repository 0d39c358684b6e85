"""Golden tests of smalltrain/ops/adaptive_pool.py's adaptive_max_pool2d against torch: uneven, overlapping and
upsampling windows, None in output_size, ties, NaN and infinities, layouts, the returned indices, errors, float64
gradcheck. (adaptive_avg_pool2d's cases are in test_pool.py, from before it moved here.)"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import smalltrain
from smalltrain.ops.adaptive_pool import adaptive_max_pool2d
from _layouts import as_is as _as_is, batch_inner as _batch_inner, transposed as _transposed
from smalltrain.testing import golden, gradcheck


def _normal(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


def _ties(rng, shape):
    """Integer-valued floats: most windows have several maxima (the first in scan order is the argmax)."""
    return rng.integers(0, 3, shape).astype(np.float32)


def _specials(rng, shape):
    """NaN (windows with two: the last wins), +-inf, a plane of -inf (the argmax stays each window's first)."""
    x = rng.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    flat[rng.choice(flat.size, size=max(1, flat.size // 8), replace=False)] = np.nan
    flat[rng.choice(flat.size, size=max(1, flat.size // 10), replace=False)] = np.inf
    x[..., 0, :, :] = -np.inf
    x[..., 1, 1:3] = np.nan
    return x


def _infinities(rng, shape):
    """+-inf without NaN (the tiled argmax path), and a plane of -inf whose argmax is each window's first."""
    x = _specials(rng, shape)
    x[np.isnan(x)] = -np.inf
    return x


# id, input shape, output_size, input maker, layout; windows that tile the input take one argmax (_tiled_max)
CASES = [
    ("uneven", (2, 3, 7, 9), (3, 4), _normal, _as_is),
    ("uniform", (2, 3, 8, 8), 4, _normal, _as_is),
    ("global", (2, 5, 6, 7), 1, _normal, _as_is),
    ("none_keeps", (2, 3, 5, 9), (None, 4), _normal, _as_is),
    ("list", (2, 3, 5, 9), [2, None], _normal, _as_is),
    ("upsample", (2, 2, 5, 3), (7, 8), _normal, _as_is),   # overlapping windows share an argmax: gradients sum
    ("identity", (1, 2, 4, 5), (4, 5), _normal, _as_is),
    ("ties", (2, 3, 7, 6), (3, 4), _ties, _as_is),
    ("ties_tiled", (2, 3, 6, 8), (3, 4), _ties, _as_is),
    ("infinities_tiled", (2, 3, 4, 6), (2, 3), _infinities, _batch_inner),
    ("infinities_uneven", (2, 3, 5, 6), (2, 4), _infinities, _transposed),
    ("specials", (2, 3, 6, 7), (3, 2), _specials, _as_is),
    ("specials_upsample", (1, 3, 4, 3), (5, 4), _specials, _as_is),
    ("size1_dims", (1, 1, 1, 5), (1, 2), _normal, _as_is),
    ("empty_batch", (0, 3, 4, 5), (2, 3), _normal, _as_is),
    ("unbatched", (3, 7, 6), (3, 5), _normal, _as_is),
    ("noncontig", (2, 3, 7, 6), (4, 3), _ties, _transposed),
    ("batch_inner", (4, 3, 6, 9), (4, 5), _normal, _batch_inner),
]


@pytest.mark.parametrize("indices", [False, True], ids=["values", "indices"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_adaptive_max_pool2d_golden(case, indices, device, rng):
    _, shape, size, make, layout = case
    golden(lambda x: adaptive_max_pool2d(layout(x), size, indices), lambda x: F.adaptive_max_pool2d(x, size, indices),
           make(rng, shape), device=device)


def test_adaptive_max_pool2d_float64_and_zero_output(device, rng):
    golden(lambda x: adaptive_max_pool2d(x, (2, 3)), lambda x: F.adaptive_max_pool2d(x, (2, 3)),
           rng.standard_normal((2, 2, 5, 7)), device=device)
    # forward only: torch's backward refuses an empty grad_output
    golden(lambda x: adaptive_max_pool2d(x, 0, True), lambda x: F.adaptive_max_pool2d(x, 0, True),
           _normal(rng, (2, 3, 4, 4)), device=device, grad=False)


# id, input, positional args, exception type torch raises, our message
ERRORS = [
    ("negative", np.zeros((2, 3, 8, 8), np.float32), ((-1, 2),), RuntimeError,
     r"adaptive_max_pool2d: elements of output_size must be greater than or equal to 0"),
    ("len3", np.zeros((2, 3, 8, 8), np.float32), ((1, 2, 3),), RuntimeError, r"output_size must be 2"),
    ("rank2", np.zeros((8, 8), np.float32), (2,), RuntimeError,
     r"adaptive_max_pool2d\(\): Expected 3D or 4D tensor, but got \[8, 8\]"),
    ("rank2_tuple", np.zeros((8, 8), np.float32), ((2, 2),), ValueError, r"Input dimension should be at least 3"),
    ("empty_h", np.zeros((2, 3, 0, 8), np.float32), (2,), RuntimeError, r"dimension 2 being empty"),
    ("empty_c_unbatched", np.zeros((2, 0, 8), np.float32), (2,), RuntimeError, r"dimension 1 being empty"),
    ("integer", np.zeros((2, 3, 4, 4), np.int64), (2,), NotImplementedError, r"adaptive_max_pool2d.*int64"),
]


@pytest.mark.parametrize("case", ERRORS, ids=[c[0] for c in ERRORS])
def test_errors_raise_torchs_type(case, device):
    _, x, args, exc, msg = case
    with pytest.raises(exc):
        F.adaptive_max_pool2d(torch.tensor(x), *args)
    with pytest.raises(exc, match=msg):
        adaptive_max_pool2d(smalltrain.tensor(x, device=device), *args)
    with pytest.raises(TypeError, match="must be Tensor"):
        adaptive_max_pool2d(x, 2)


@pytest.mark.parametrize("size", [(3, 2), (7, 4), 1], ids=["uneven", "upsample", "global"])
def test_gradcheck(size, device, rng):
    # distinct values spaced well beyond the finite-difference step, so no max is ever tied
    x = rng.permutation(2 * 2 * 5 * 6).reshape(2, 2, 5, 6) * 0.1
    assert gradcheck(lambda t: adaptive_max_pool2d(t, size), (smalltrain.tensor(x, device=device,
                                                                                requires_grad=True),))

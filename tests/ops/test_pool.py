"""Golden tests for smalltrain.ops.pool against torch.nn.functional: max/avg/adaptive pooling, gradients, errors."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import smalltrain
from smalltrain.ops.pool import adaptive_avg_pool2d, avg_pool2d, max_pool2d
from _layouts import as_is as _as_is, batch_inner as _batch_inner, transposed as _transposed
from smalltrain.testing import golden, gradcheck


def _normal(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


def _ties(rng, shape):
    """Integer-valued floats: almost every window has several maxima."""
    return rng.integers(0, 3, shape).astype(np.float32)


def _specials(rng, shape):
    """NaN (some windows with two), +-inf, and a row of -inf so padded windows see only -inf."""
    x = rng.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    flat[rng.choice(flat.size, size=max(1, flat.size // 8), replace=False)] = np.nan
    flat[rng.choice(flat.size, size=max(1, flat.size // 10), replace=False)] = np.inf
    flat[rng.choice(flat.size, size=max(1, flat.size // 10), replace=False)] = -np.inf
    x[..., 0, :] = -np.inf
    x[..., 1, 1:3] = np.nan
    return x


def _signed_zeros(rng, shape):
    """-0.0, 0.0 and -1: windows whose maxima are zeros of both signs (they tie: the first in scan order wins)."""
    return rng.choice(np.array([-0.0, 0.0, -1.0], np.float32), shape)


def _inf_corner(rng, shape):
    """-inf in the first two rows and columns: windows over the top-left padding see only -inf."""
    x = rng.standard_normal(shape).astype(np.float32)
    x[..., :2, :] = -np.inf
    x[..., :, :2] = -np.inf
    return x


# id, input shape, kwargs, input maker, layout as smalltrain sees it
MAX_CASES = [
    ("k2", (2, 3, 8, 8), {"kernel_size": 2}, _normal, _as_is),
    ("nonsquare", (2, 3, 7, 9), {"kernel_size": (2, 3), "stride": (1, 2)}, _normal, _as_is),
    ("overlap", (2, 2, 6, 7), {"kernel_size": 3, "stride": 1}, _normal, _as_is),
    ("padding", (2, 2, 7, 6), {"kernel_size": 3, "stride": 2, "padding": 1}, _normal, _as_is),
    ("dilation", (1, 2, 9, 8), {"kernel_size": 2, "stride": 1, "dilation": 2}, _normal, _as_is),
    ("dilation_pad", (2, 1, 8, 9), {"kernel_size": (3, 2), "stride": (2, 1), "padding": 1, "dilation": (2, 3)},
     _normal, _as_is),
    ("ceil_5_k2", (1, 2, 5, 5), {"kernel_size": 2, "ceil_mode": True}, _normal, _as_is),
    ("ceil_pad", (1, 2, 6, 6), {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}, _normal, _as_is),
    ("ceil_s3", (1, 2, 4, 7), {"kernel_size": 2, "stride": 3, "padding": 1, "ceil_mode": True}, _normal, _as_is),
    ("ceil_tiny", (1, 1, 2, 2), {"kernel_size": 2, "stride": 3, "padding": 1, "ceil_mode": True}, _normal, _as_is),
    ("ceil_drop_last", (1, 2, 5, 5), {"kernel_size": 2, "stride": 2, "padding": 1, "ceil_mode": True},
     _normal, _as_is),
    ("ceil_dilated", (1, 2, 7, 8), {"kernel_size": 2, "stride": 2, "dilation": 2, "ceil_mode": True},
     _normal, _as_is),
    ("ties_k2", (2, 3, 6, 8), {"kernel_size": 2}, _ties, _as_is),
    ("ties_overlap", (2, 2, 7, 6), {"kernel_size": 3, "stride": 1, "padding": 1}, _ties, _as_is),
    ("ties_dilated", (1, 3, 8, 8), {"kernel_size": 2, "stride": 1, "dilation": 2}, _ties, _as_is),
    ("specials", (2, 3, 6, 8), {"kernel_size": 2}, _specials, _as_is),
    ("specials_pad", (2, 2, 7, 6), {"kernel_size": 3, "stride": 2, "padding": 1}, _specials, _as_is),
    ("specials_overlap", (1, 3, 6, 6), {"kernel_size": 3, "stride": 1, "ceil_mode": True}, _specials, _as_is),
    ("inf_corner_pad", (2, 2, 7, 6), {"kernel_size": 3, "stride": 2, "padding": 1}, _inf_corner, _as_is),
    ("inf_corner_dilated", (1, 2, 8, 9), {"kernel_size": 3, "stride": 1, "padding": 1, "dilation": (2, 3)},
     _inf_corner, _as_is),
    ("empty_batch", (0, 3, 4, 4), {"kernel_size": 2}, _normal, _as_is),
    ("one_pixel", (1, 1, 1, 1), {"kernel_size": 1}, _normal, _as_is),
    ("h_is_1", (2, 1, 1, 5), {"kernel_size": (1, 2), "stride": 1}, _normal, _as_is),
    ("stride_empty_tuple", (2, 2, 6, 6), {"kernel_size": 3, "stride": ()}, _normal, _as_is),
    ("unbatched", (3, 6, 5), {"kernel_size": 2, "stride": 1}, _normal, _as_is),
    ("noncontig", (2, 3, 6, 7), {"kernel_size": 2, "stride": (2, 1), "padding": 1}, _ties, _transposed),
    ("batch_inner", (4, 3, 6, 6), {"kernel_size": 2}, _normal, _batch_inner),
    ("batch_inner_pad", (3, 2, 5, 7), {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True},
     _ties, _batch_inner),
    ("lenet", (5, 6, 24, 24), {"kernel_size": 2}, _normal, _as_is),
    # no padding: the maximum first, then the argmax from comparisons with it (pool._max_then_argmax)
    ("signed_zero_ties", (3, 2, 6, 8), {"kernel_size": 2}, _signed_zeros, _batch_inner),
    ("ties_k3_tiling", (2, 3, 9, 7), {"kernel_size": 3}, _ties, _batch_inner),
    ("ties_ceil_no_pad", (2, 2, 7, 5), {"kernel_size": 2, "ceil_mode": True}, _ties, _transposed),
    ("inf_ceil_no_pad", (1, 2, 5, 7), {"kernel_size": (2, 3), "stride": 2, "ceil_mode": True}, _inf_corner, _as_is),
]


@pytest.mark.parametrize("indices", [False, True], ids=["values", "indices"])
@pytest.mark.parametrize("case", MAX_CASES, ids=[c[0] for c in MAX_CASES])
def test_max_pool2d_golden(case, indices, device, rng):
    _, shape, kw, make, layout = case
    golden(lambda x: max_pool2d(layout(x), return_indices=indices, **kw),
           lambda x: F.max_pool2d(x, return_indices=indices, **kw), make(rng, shape), device=device)


@pytest.mark.parametrize("kw", [{"kernel_size": 2}, {"kernel_size": 3, "stride": 1, "padding": 1}],
                         ids=["tiling", "overlapping"])
def test_max_pool2d_nonfinite_upstream_gradient(kw, device, rng):
    """inf and NaN in the gradient reach only the argmax positions; every other input gradient stays 0."""
    c = rng.standard_normal((2, 3, 4, 4)).astype(np.float32)
    c[0, 0, 0, :2] = np.inf
    c[1, 2, 3, 3] = np.nan
    golden(lambda x, c: max_pool2d(x, **kw) * c, lambda x, c: F.max_pool2d(x, **kw) * c,
           _normal(rng, (2, 3, 8, 8) if kw["kernel_size"] == 2 else (2, 3, 4, 4)), c, device=device)


def test_max_pool2d_integer_input(device, rng):
    x = rng.integers(-50, 50, (2, 3, 5, 6))
    golden(lambda x: max_pool2d(x, 2, 1, 1, return_indices=True),
           lambda x: F.max_pool2d(x, 2, 1, 1, return_indices=True), x, device=device)


AVG_CASES = [
    ("k2", (2, 3, 8, 8), {"kernel_size": 2}, _as_is),
    ("nonsquare", (2, 3, 7, 9), {"kernel_size": (2, 3), "stride": (1, 2)}, _as_is),
    ("overlap", (2, 2, 6, 7), {"kernel_size": 3, "stride": 1}, _as_is),
    ("pad_include", (2, 2, 7, 6), {"kernel_size": 3, "stride": 2, "padding": 1}, _as_is),
    ("pad_exclude", (2, 2, 7, 6), {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False},
     _as_is),
    ("ceil_include", (1, 2, 5, 5), {"kernel_size": 2, "stride": 2, "padding": 1, "ceil_mode": True}, _as_is),
    ("ceil_exclude", (1, 2, 5, 5),
     {"kernel_size": 2, "stride": 2, "padding": 1, "ceil_mode": True, "count_include_pad": False}, _as_is),
    ("ceil_overhang", (1, 2, 6, 7), {"kernel_size": 3, "stride": 2, "ceil_mode": True}, _as_is),
    ("ceil_overhang_pad", (2, 1, 6, 8), {"kernel_size": (3, 2), "stride": (2, 3), "padding": 1,
                                         "ceil_mode": True}, _as_is),
    ("ceil_overhang_exclude", (2, 1, 6, 8), {"kernel_size": (3, 2), "stride": (2, 3), "padding": 1,
                                             "ceil_mode": True, "count_include_pad": False}, _as_is),
    ("divisor", (2, 2, 6, 6), {"kernel_size": 3, "stride": 2, "padding": 1, "divisor_override": 5}, _as_is),
    ("divisor_ceil", (1, 2, 5, 7), {"kernel_size": 2, "padding": 1, "ceil_mode": True, "divisor_override": 3},
     _as_is),
    ("empty_batch", (0, 3, 4, 4), {"kernel_size": 2}, _as_is),
    ("one_pixel", (1, 1, 1, 1), {"kernel_size": 1}, _as_is),
    ("unbatched", (3, 6, 5), {"kernel_size": 2, "stride": 1, "padding": 1}, _as_is),
    ("noncontig", (2, 3, 6, 7), {"kernel_size": 2, "stride": (2, 1), "padding": 1}, _transposed),
    ("batch_inner", (4, 3, 6, 6), {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}, _batch_inner),
]


@pytest.mark.parametrize("case", AVG_CASES, ids=[c[0] for c in AVG_CASES])
def test_avg_pool2d_golden(case, device, rng):
    _, shape, kw, layout = case
    golden(lambda x: avg_pool2d(layout(x), **kw), lambda x: F.avg_pool2d(x, **kw), _normal(rng, shape),
           device=device)


def test_avg_pool2d_specials(device, rng):
    golden(lambda x: avg_pool2d(x, 2, 1), lambda x: F.avg_pool2d(x, 2, 1), _specials(rng, (2, 2, 5, 6)),
           device=device)


def test_avg_pool2d_integer_input(device, rng):
    x = rng.integers(-50, 50, (2, 3, 5, 6))
    golden(lambda x: avg_pool2d(x, 2, 1, 1), lambda x: F.avg_pool2d(x, 2, 1, 1), x, device=device)


ADAPTIVE_CASES = [
    ("uneven", (2, 3, 7, 9), (3, 4), _as_is),
    ("uniform", (2, 3, 8, 8), 4, _as_is),
    ("global", (2, 5, 6, 7), 1, _as_is),
    ("none_keeps", (2, 3, 5, 9), (None, 4), _as_is),
    ("list", (2, 3, 5, 9), [2, None], _as_is),
    ("upsample", (2, 2, 5, 3), (7, 8), _as_is),
    ("zero_out", (2, 3, 4, 4), 0, _as_is),  # forward only: torch's backward refuses an empty grad_output
    ("empty_batch", (0, 3, 4, 5), (2, 3), _as_is),
    ("unbatched", (3, 7, 6), (3, 5), _as_is),
    ("noncontig", (2, 3, 7, 6), (4, 3), _transposed),
    ("batch_inner", (4, 3, 6, 9), (4, 5), _batch_inner),
]


@pytest.mark.parametrize("case", ADAPTIVE_CASES, ids=[c[0] for c in ADAPTIVE_CASES])
def test_adaptive_avg_pool2d_golden(case, device, rng):
    name, shape, size, layout = case
    golden(lambda x: adaptive_avg_pool2d(layout(x), size), lambda x: F.adaptive_avg_pool2d(x, size),
           _normal(rng, shape), device=device, grad=name != "zero_out")


GRADCHECKS = [
    ("max_pad_dilated", lambda x: max_pool2d(x, (3, 2), (2, 1), 1, (1, 2), ceil_mode=True)),
    ("max_overlap", lambda x: max_pool2d(x, 2, 1)),
    ("avg_exclude_ceil", lambda x: avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False)),
    ("avg_divisor", lambda x: avg_pool2d(x, 2, 1, 1, divisor_override=3)),
    ("adaptive", lambda x: adaptive_avg_pool2d(x, (3, 2))),
]


@pytest.mark.parametrize("case", GRADCHECKS, ids=[c[0] for c in GRADCHECKS])
def test_pool_gradcheck(case, rng):
    # distinct values spaced well beyond the finite-difference step, so no max is ever tied
    x = rng.permutation(2 * 2 * 5 * 6).reshape(2, 2, 5, 6) * 0.1
    assert gradcheck(case[1], (smalltrain.tensor(x, requires_grad=True),))


# id, function name, input shape, positional args, kwargs, exception, message regex
ERRORS = [
    ("max_pad_half", "max_pool2d", (2, 3, 8, 8), (2,), {"padding": 2}, RuntimeError,
     r"max_pool2d: pad should be at most half of effective kernel size, but got pad=2, kernel_size=2"),
    ("max_pad_half_dilated", "max_pool2d", (2, 3, 8, 8), (2,), {"padding": 2, "dilation": 3}, RuntimeError,
     r"max_pool2d: pad should be smaller than or equal to half of kernel size"),
    ("max_stride0", "max_pool2d", (2, 3, 8, 8), (2,), {"stride": 0}, RuntimeError,
     r"max_pool2d: stride should not be zero"),
    ("max_stride_neg", "max_pool2d", (2, 3, 8, 8), (2,), {"stride": -1}, RuntimeError,
     r"max_pool2d: stride should be greater than zero, but got dH: -1 dW: -1"),
    ("max_kernel0", "max_pool2d", (2, 3, 8, 8), (0, 1), {}, RuntimeError,
     r"max_pool2d: kernel size should be greater than zero, but got kH: 0 kW: 0"),
    ("max_kernel_neg", "max_pool2d", (2, 3, 8, 8), (-1,), {}, RuntimeError,
     r"max_pool2d: kernel size should be greater than zero"),
    ("max_dilation0", "max_pool2d", (2, 3, 8, 8), (2,), {"dilation": 0}, RuntimeError,
     r"max_pool2d: dilation should be greater than zero"),
    ("max_pad_neg", "max_pool2d", (2, 3, 8, 8), (2,), {"padding": -1}, RuntimeError,
     r"max_pool2d: pad must be non-negative"),
    ("max_too_small", "max_pool2d", (1, 2, 2, 2), (3,), {}, RuntimeError,
     r"max_pool2d: Given input size: \(2x2x2\). Calculated output size: \(2x0x0\). Output size is too small"),
    ("max_rank2", "max_pool2d", (8, 8), (2,), {}, RuntimeError,
     r"max_pool2d: non-empty 3D or 4D \(batch mode\) tensor expected"),
    ("max_rank5", "max_pool2d", (1, 1, 1, 8, 8), (2,), {}, RuntimeError, r"max_pool2d: non-empty 3D or 4D"),
    ("max_empty_channels", "max_pool2d", (2, 0, 8, 8), (2,), {}, RuntimeError,
     r"max_pool2d: Expected 3D or 4D \(batch mode\) tensor with optional 0 dim batch size.*\[2, 0, 8, 8\]"),
    ("max_kernel_len3", "max_pool2d", (2, 3, 8, 8), ((2, 2, 2),), {}, RuntimeError,
     r"max_pool2d: kernel_size must either be a single int, or a tuple of two ints"),
    ("max_stride_len3", "max_pool2d", (2, 3, 8, 8), (2, (2, 2, 2)), {}, RuntimeError,
     r"max_pool2d: stride must either be omitted"),
    ("max_kernel_float", "max_pool2d", (2, 3, 8, 8), (2.0,), {}, TypeError, r"max_pool2d\(\): argument 'kernel_size'"),
    ("avg_pad_half", "avg_pool2d", (2, 3, 8, 8), (2,), {"padding": 2}, RuntimeError,
     r"avg_pool2d: pad should be at most half of effective kernel size"),
    ("avg_stride0", "avg_pool2d", (2, 3, 8, 8), (2,), {"stride": 0}, RuntimeError,
     r"avg_pool2d: stride should not be zero"),
    ("avg_stride_neg", "avg_pool2d", (2, 3, 8, 8), (2, -1), {}, RuntimeError,
     r"avg_pool2d: stride should be greater than zero"),
    ("avg_kernel_neg", "avg_pool2d", (2, 3, 8, 8), (-1,), {}, RuntimeError,
     r"avg_pool2d: kernel size should be greater than zero"),
    ("avg_too_small", "avg_pool2d", (1, 2, 2, 2), (3,), {}, RuntimeError, r"avg_pool2d: .*Output size is too small"),
    ("avg_rank2", "avg_pool2d", (8, 8), (2,), {}, IndexError, r"avg_pool2d: Dimension out of range"),
    ("avg_rank5", "avg_pool2d", (1, 1, 1, 8, 8), (2,), {}, RuntimeError, r"avg_pool2d: Expected 3D or 4D"),
    ("avg_divisor0", "avg_pool2d", (2, 3, 8, 8), (2,), {"divisor_override": 0}, RuntimeError,
     r"avg_pool2d: divisor must be not zero"),
    ("avg_padding_len3", "avg_pool2d", (2, 3, 8, 8), (2, 2, (1, 1, 1)), {}, RuntimeError,
     r"avg_pool2d: padding must either be a single int, or a tuple of two ints"),
    ("adaptive_negative", "adaptive_avg_pool2d", (2, 3, 8, 8), ((-1, 2),), {}, RuntimeError,
     r"adaptive_avg_pool2d: elements of output_size must be greater than or equal to 0 but received \{-1, 2\}"),
    ("adaptive_len3", "adaptive_avg_pool2d", (2, 3, 8, 8), ((1, 2, 3),), {}, RuntimeError,
     r"adaptive_avg_pool2d: output_size must be 2"),
    ("adaptive_rank2", "adaptive_avg_pool2d", (8, 8), (2,), {}, RuntimeError,
     r"adaptive_avg_pool2d\(\): Expected 3D or 4D tensor, but got \[8, 8\]"),
    ("adaptive_rank2_tuple", "adaptive_avg_pool2d", (8, 8), ((2, 2),), {}, ValueError,
     r"adaptive_avg_pool2d: Input dimension should be at least 3"),
    ("adaptive_empty_h", "adaptive_avg_pool2d", (2, 3, 0, 8), (2,), {}, RuntimeError,
     r"adaptive_avg_pool2d\(\): Expected input to have non-zero size .* dimension 2 being empty"),
]

_OURS = {"max_pool2d": max_pool2d, "avg_pool2d": avg_pool2d, "adaptive_avg_pool2d": adaptive_avg_pool2d}


@pytest.mark.parametrize("case", ERRORS, ids=[c[0] for c in ERRORS])
def test_pool_errors(case, device):
    _, name, shape, args, kw, exc, msg = case
    x = np.zeros(shape, np.float32)
    with pytest.raises(exc):  # the exception type torch raises for the same call
        getattr(F, name)(torch.tensor(x), *args, **kw)
    with pytest.raises(exc, match=msg):
        _OURS[name](smalltrain.tensor(x, device=device), *args, **kw)

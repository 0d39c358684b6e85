"""Golden tests for smalltrain.ops.pool against torch.nn.functional: max/avg (2-D and 1-D) and adaptive average
pooling, gradients, errors."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import smalltrain
from smalltrain.ops.activation import Gelu, apply_named
from smalltrain.ops.pool import act_max_pool2d, adaptive_avg_pool2d, avg_pool1d, avg_pool2d, max_pool1d, max_pool2d
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


# ---- 1-D pooling ----------------------------------------------------------------------------------------------

# id, input shape, kwargs, input maker, transposed input (non-contiguous)?
POOL1D_CASES = [
    ("k2", (2, 3, 8), {"kernel_size": 2}, _normal, False),
    ("overlap_pad", (2, 3, 9), {"kernel_size": 3, "stride": 2, "padding": 1}, _normal, False),
    ("ceil", (1, 2, 7), {"kernel_size": 2, "ceil_mode": True}, _normal, False),
    ("ties", (2, 3, 10), {"kernel_size": 3, "stride": 1}, _ties, False),
    ("specials", (2, 3, 8, ), {"kernel_size": 2, "stride": 1}, _specials, False),
    ("tuple_args", (2, 2, 9), {"kernel_size": (3,), "stride": (2,), "padding": (1,)}, _normal, False),
    ("unbatched", (3, 7), {"kernel_size": 3, "stride": 2}, _normal, False),
    ("empty_batch", (0, 3, 6), {"kernel_size": 2}, _normal, False),
    ("length1", (2, 3, 1), {"kernel_size": 1}, _normal, False),
    ("noncontig", (2, 6, 3), {"kernel_size": 2, "stride": 1}, _normal, True),
]


def _fits_dilated(case):
    """Whether a dilation of 2 keeps the case's window inside its padded input."""
    _, shape, kw, _, _ = case
    k = kw["kernel_size"][0] if isinstance(kw["kernel_size"], tuple) else kw["kernel_size"]
    p = kw.get("padding", 0)
    return 2 * (k - 1) + 1 <= shape[-1] + 2 * (p[0] if isinstance(p, tuple) else p)


POOL1D_GRID = [(op, case) for op in ("max", "max_indices", "max_dilated", "avg", "avg_exclude")
               for case in POOL1D_CASES if op != "max_dilated" or _fits_dilated(case)]


@pytest.mark.parametrize("op,case", POOL1D_GRID, ids=[f"{op}-{case[0]}" for op, case in POOL1D_GRID])
def test_pool1d_golden(op, case, device, rng):
    _, shape, kw, make, transpose = case
    kw = dict(kw)
    if op == "max_indices":
        kw["return_indices"] = True
    if op == "max_dilated":
        kw["dilation"] = 2
    if op == "avg_exclude":
        kw["count_include_pad"] = False
    ours, theirs = (max_pool1d, F.max_pool1d) if op.startswith("max") else (avg_pool1d, F.avg_pool1d)
    x = make(rng, shape)
    if op.startswith("avg") and make is _specials:
        x[np.isnan(x)] = 1.5   # avg's NaN rules are pool2d's (tested above); here the windows' arithmetic
    layout = (lambda t: t.transpose(-1, -2)) if transpose else (lambda t: t)
    golden(lambda t: ours(layout(t), **kw), lambda t: theirs(layout(t), **kw), x, device=device)


POOL1D_ERRORS = [
    # (ours, torch's, input shape, args, kwargs, exception type torch raises, our message)
    (max_pool1d, F.max_pool1d, (2, 2, 2, 4), (2,), {}, RuntimeError, r"max_pool1d: Expected 2D or 3D"),
    (max_pool1d, F.max_pool1d, (4,), (2,), {}, RuntimeError, r"max_pool1d: Expected 2D or 3D"),
    (avg_pool1d, F.avg_pool1d, (2, 2, 2, 4), (2,), {}, RuntimeError, r"avg_pool1d: Expected 2 to 3 dimensions"),
    (avg_pool1d, F.avg_pool1d, (1, 1, 4), (5,), {}, RuntimeError, r"Output size is too small"),
    (max_pool1d, F.max_pool1d, (1, 1, 4), (2,), {"padding": 2}, RuntimeError, r"pad should be at most half"),
    (max_pool1d, F.max_pool1d, (1, 1, 4), ((2, 2),), {}, RuntimeError, r"kernel_size must be a single int"),
    (avg_pool1d, F.avg_pool1d, (1, 1, 4), (2,), {"stride": 0}, RuntimeError, r"stride should not be zero"),
]


@pytest.mark.parametrize("ours,theirs,shape,args,kw,exc,msg", POOL1D_ERRORS)
def test_pool1d_errors(ours, theirs, shape, args, kw, exc, msg, device):
    x = np.zeros(shape, np.float32)
    with pytest.raises(exc):
        theirs(torch.tensor(x), *args, **kw)
    with pytest.raises(exc, match=msg):
        ours(smalltrain.tensor(x, device=device), *args, **kw)


@pytest.mark.parametrize("fn", [lambda x: max_pool1d(x, 3, 2, 1, dilation=1, ceil_mode=True),
                                lambda x: avg_pool1d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False)],
                         ids=["max", "avg"])
def test_pool1d_gradcheck(fn, rng):
    x = rng.permutation(2 * 3 * 9).reshape(2, 3, 9) * 0.1
    assert gradcheck(fn, (smalltrain.tensor(x, requires_grad=True),))


# ---- act_max_pool2d: an activation, then max pooling (pooled first on the CPU) ----------------------------------

_TORCH_ACT = {"relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}


def _shifted_normal(rng, shape):
    """Normal values shifted and widened: many windows wholly negative, with the smallest left of GELU's minimum."""
    return (rng.standard_normal(shape) * 1.5 - 0.5).astype(np.float32)


def _nan_and_minus_inf(rng, shape):
    """_specials without +inf: torch's vectorized CPU GELU gives NaN at +inf in some builds (2.11), inf in others
    (ours: inf, as its scalar and CUDA kernels; ops/test_activation.py test_gelu_at_infinity)."""
    x = _specials(rng, shape)
    x[x == np.inf] = 3.0
    return x


# id, input shape, max_pool2d kwargs, input maker, layout; the first five take the pooled-first op
ACT_CASES = [
    ("lenet", (4, 6, 24, 24), {"kernel_size": 2}, _shifted_normal, _batch_inner),
    ("overlap", (2, 3, 9, 8), {"kernel_size": 3, "stride": 2}, _shifted_normal, _as_is),
    ("stride1", (2, 2, 7, 6), {"kernel_size": 2, "stride": 1}, _shifted_normal, _transposed),
    ("dilation", (2, 2, 9, 8), {"kernel_size": 2, "stride": 2, "dilation": 2}, _shifted_normal, _as_is),
    ("ceil_inside", (2, 2, 8, 8), {"kernel_size": 2, "ceil_mode": True}, _ties, _batch_inner),
    # the two ops: padding, a ceil-mode window past the edge, NaN and inf, an unbatched input
    ("padding", (2, 2, 7, 6), {"kernel_size": 3, "stride": 2, "padding": 1}, _shifted_normal, _as_is),
    ("ceil_outside", (1, 2, 5, 5), {"kernel_size": 2, "ceil_mode": True}, _shifted_normal, _as_is),
    ("specials", (2, 3, 6, 8), {"kernel_size": 2}, _nan_and_minus_inf, _as_is),
    ("unbatched", (3, 6, 6), {"kernel_size": 2}, _shifted_normal, _as_is),
]


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("case", ACT_CASES, ids=[c[0] for c in ACT_CASES])
def test_act_max_pool2d_golden(case, activation, device, rng):
    _, shape, kw, make, layout = case
    golden(lambda x: act_max_pool2d(layout(x), activation, **kw),
           lambda x: F.max_pool2d(_TORCH_ACT[activation](x), **kw), make(rng, shape), device=device)


def _two_ops_and_fused(x, activation, kw, g, dtype=np.float32):
    """(value, input gradient) of act_max_pool2d and of the two ops, and the fused op's grad_fn name."""
    res = []
    for fn in (lambda t: act_max_pool2d(t, activation, **kw),
               lambda t: max_pool2d(apply_named(t, activation), **kw)):
        t = smalltrain.tensor(x.astype(dtype), requires_grad=True)
        y = fn(t)
        y.backward(smalltrain.tensor(g.astype(dtype)))
        res.append((y.detach().numpy(), t.grad.numpy(), y.grad_fn.name()))
    return res


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh"])
def test_act_max_pool2d_pools_first_as_the_two_ops(activation, dtype, rng):
    """Tiling windows: the pooled-first op runs and gives the two ops' values and gradients bit for bit."""
    x = _shifted_normal(rng, (3, 4, 12, 10))
    g = rng.standard_normal((3, 4, 6, 5)).astype(np.float32)
    (y1, d1, name1), (y2, d2, _) = _two_ops_and_fused(x, activation, {"kernel_size": 2}, g, dtype)
    assert name1 == "ActMaxPool2dBackward"
    np.testing.assert_array_equal(y1, y2)
    np.testing.assert_array_equal(d1, d2)


def _gelu32(a):
    return Gelu.fwd(np, np.asarray(a, np.float32), "none")[0]


def _gelu_tie():
    """Two float32 inputs either side of GELU's minimum whose float32 GELUs are equal (and above GELU(-1))."""
    right = np.linspace(-0.7, -0.1, 1 << 20, dtype=np.float32)
    left = np.linspace(-3.0, -0.76, 1 << 20, dtype=np.float32)
    common, i, j = np.intersect1d(_gelu32(left), _gelu32(right), return_indices=True)
    return left[i[-1]], right[j[-1]]   # the largest shared value: near -2 and -0.1


def test_act_max_pool2d_gelu_ties(rng):
    """Windows whose largest GELU is shared by different elements: the first in the scan wins, as pooling after
    GELU does; where the smallest element's GELU is the largest, it wins and takes the gradient."""
    lo, hi = _gelu_tie()
    assert lo != hi and _gelu32(lo) == _gelu32(hi)
    windows = [
        (hi, lo, -0.75, -1.0),      # the tie: hi first
        (-0.75, lo, hi, -1.0),      # the tie: lo first
        (-20.0, -25.0, -30.0, -21.0),   # GELU is -0 for all four: the first
        (-25.0, -20.0, -30.0, -21.0),
        (-3.0, -0.2, -2.9, -0.3),   # the smallest's GELU (-0.0040) beats the largest's (-0.084)
        (0.5, -3.0, 0.5, -0.1),     # duplicates of the largest: the first
        (-0.8, -0.8, -0.8, -0.8),   # constant
    ]
    x = np.zeros((1, len(windows), 2, 2), np.float32)
    for c, w in enumerate(windows):
        x[0, c] = np.array(w, np.float32).reshape(2, 2)
    g = rng.standard_normal((1, len(windows), 1, 1)).astype(np.float32)
    (y1, d1, name1), (y2, d2, _) = _two_ops_and_fused(x, "gelu", {"kernel_size": 2}, g)
    assert name1 == "ActMaxPool2dBackward"
    np.testing.assert_array_equal(y1, y2)
    np.testing.assert_array_equal(d1, d2)
    assert np.count_nonzero(d1[0, 4]) == 1 and d1[0, 4, 0, 0] != 0   # the smallest, -3.0, took the gradient
    assert d1[0, 0, 0, 0] != 0 and d1[0, 0, 0, 1] == 0   # hi (earlier) won the tie
    assert d1[0, 1, 0, 1] != 0 and d1[0, 1, 1, 0] == 0   # lo (earlier) won the tie


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh"])
def test_act_max_pool2d_gradcheck(activation, rng):
    # distinct values spaced well beyond the finite-difference step, either side of GELU's minimum
    x = rng.permutation(2 * 2 * 6 * 6).reshape(2, 2, 6, 6) * 0.05 - 3.0
    assert gradcheck(lambda t: act_max_pool2d(t, activation, 2), (smalltrain.tensor(x, requires_grad=True),))


def test_act_max_pool2d_errors():
    x = smalltrain.tensor(np.zeros((1, 1, 4, 4), np.float32))
    with pytest.raises(ValueError, match=r"activation must be None, 'relu', 'gelu' or 'gelu_tanh', got 'tanh'"):
        act_max_pool2d(x, "tanh", 2)
    with pytest.raises(RuntimeError, match=r"max_pool2d: pad should be at most half of effective kernel size"):
        act_max_pool2d(x, "gelu", 2, padding=2)
    np.testing.assert_array_equal(act_max_pool2d(x, None, 2).numpy(), max_pool2d(x, 2).numpy())

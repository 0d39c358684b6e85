"""Golden tests of smalltrain/ops/norm.py against torch: batch_norm in training (batch statistics, in-place running
stats with the unbiased variance) and eval, layer_norm, edge shapes, errors and float64 gradcheck."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import smalltrain as st
from smalltrain.ops import norm as N
from smalltrain.testing import golden, gradcheck

BN_SHAPES = [(6, 3), (4, 3, 5), (2, 3, 4, 5), (2, 3, 1, 1), (5, 1)]


def _bn_args(rng, shape, dtype=np.float32):
    c = shape[1]
    x = (rng.standard_normal(shape) * 2 + 1).astype(dtype)
    rm = rng.standard_normal(c).astype(dtype)
    rv = (rng.random(c) + 0.5).astype(dtype)
    w = (rng.random(c) + 0.5).astype(dtype)
    b = rng.standard_normal(c).astype(dtype)
    return x, rm, rv, w, b


def _bn_golden(x, rm, rv, w, b, device, affine, training, **kw):
    """Compare the output, the gradients and the running stats after the call (returned as extra outputs)."""
    def ours(x_, rm_, rv_, w_, b_):
        y = N.batch_norm(x_, rm_, rv_, w_ if affine else None, b_ if affine else None, training=training, **kw)
        return y, rm_, rv_

    def theirs(x_, rm_, rv_, w_, b_):
        y = TF.batch_norm(x_, rm_, rv_, w_ if affine else None, b_ if affine else None, training=training, **kw)
        return y, rm_, rv_
    golden(ours, theirs, x, rm, rv, w, b, device=device, requires_grad=(True, False, False, affine, affine))


@pytest.mark.parametrize("shape", BN_SHAPES)
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_golden(shape, affine, training, device, rng):
    _bn_golden(*_bn_args(rng, shape), device, affine, training)


@pytest.mark.parametrize("momentum,eps", [(0.0, 1e-5), (0.5, 1e-3), (1.0, 1e-5), (0.1, 0.5)])
def test_batch_norm_momentum_and_eps(momentum, eps, device, rng):
    _bn_golden(*_bn_args(rng, (4, 3, 2, 2)), device, True, True, momentum=momentum, eps=eps)
    _bn_golden(*_bn_args(rng, (4, 3, 2, 2)), device, True, False, momentum=momentum, eps=eps)


def test_batch_norm_float64(device, rng):
    _bn_golden(*_bn_args(rng, (8, 3, 3), np.float64), device, True, True)


def test_batch_norm_large_offset_is_at_least_as_accurate_as_torch(rng):
    # float32 values near 1e3 with a spread of 1e-2: the two-pass variance stays close to the float64 answer
    x = (rng.standard_normal((16, 3)) * 1e-2 + 1e3).astype(np.float32)
    x64 = x.astype(np.float64)
    exact = (x64 - x64.mean(0)) / np.sqrt(x64.var(0) + 1e-5)
    ours = N.batch_norm(st.tensor(x), None, None, training=True).array
    theirs = TF.batch_norm(torch.tensor(x), None, None, training=True).numpy()
    assert np.abs(ours - exact).max() <= np.abs(theirs - exact).max()


def test_batch_norm_without_running_stats_in_training(device, rng):
    x, _, _, w, b = _bn_args(rng, (5, 3, 4))
    golden(lambda t, w_, b_: N.batch_norm(t, None, None, w_, b_, training=True),
           lambda t, w_, b_: TF.batch_norm(t, None, None, w_, b_, training=True), x, w, b, device=device)


def test_batch_norm_noncontiguous(device, rng):
    x = rng.standard_normal((3, 4, 2, 5)).astype(np.float32)   # permuted to [N=4, C=3, 2, 5]
    rm, rv = np.zeros(3, np.float32), np.ones(3, np.float32)
    golden(lambda t, m, v: (N.batch_norm(t.permute(1, 0, 2, 3), m, v, training=True), m, v),
           lambda t, m, v: (TF.batch_norm(t.permute(1, 0, 2, 3), m, v, training=True), m, v), x, rm, rv,
           device=device, requires_grad=(True, False, False))


def test_batch_norm_empty_batch_leaves_running_stats(device):
    x = np.zeros((0, 3), np.float32)
    rm, rv = np.full(3, 0.5, np.float32), np.full(3, 2.0, np.float32)
    _bn_golden(x, rm, rv, np.ones(3, np.float32), np.zeros(3, np.float32), device, True, True)


def test_running_stats_update_in_place_even_under_no_grad(rng):
    x = st.tensor(rng.standard_normal((6, 2)).astype(np.float32))
    rm, rv = st.zeros(2), st.ones(2)
    arrays = rm.array, rv.array
    with st.no_grad():
        N.batch_norm(x, rm, rv, training=True, momentum=0.3)
    assert rm.array is arrays[0] and rv.array is arrays[1]
    a = x.array
    np.testing.assert_allclose(rm.array, 0.3 * a.mean(0), rtol=1e-6)
    np.testing.assert_allclose(rv.array, 0.7 + 0.3 * a.var(0, ddof=1), rtol=1e-6)


BN_ERRORS = [
    (lambda: N.batch_norm(st.randn(1, 3), st.zeros(3), st.ones(3), training=True), ValueError,
     "Expected more than 1 value per channel"),
    (lambda: N.batch_norm(st.randn(1, 3, 1, 1), None, None, training=True), ValueError, "more than 1 value"),
    (lambda: N.batch_norm(st.randn(2, 4), st.zeros(3), st.ones(3), training=True), RuntimeError,
     "running_mean should contain 4 elements not 3"),
    (lambda: N.batch_norm(st.randn(2, 3), st.zeros(3), st.ones(2), training=True), RuntimeError,
     "running_var should contain 3 elements not 2"),
    (lambda: N.batch_norm(st.randn(2, 3), st.zeros(3), st.ones(3), st.ones(4), training=True), RuntimeError,
     "weight should contain 3 elements not 4"),
    (lambda: N.batch_norm(st.randn(2, 3), st.zeros(3), st.ones(3), None, st.ones(4)), RuntimeError,
     "bias should contain 3 elements not 4"),
    (lambda: N.batch_norm(st.randn(2, 3), None, None, training=False), RuntimeError,
     "must be defined in evaluation mode"),
    (lambda: N.batch_norm(st.randn(2, 3), st.zeros(3), st.ones(3), training=True, momentum=None), TypeError,
     "momentum"),
    (lambda: N.batch_norm(st.ones(2, 3, dtype=st.int64), st.zeros(3), st.ones(3), training=True),
     NotImplementedError, "batch_norm.*int64"),
    (lambda: N.batch_norm(st.randn(3), st.zeros(3), st.ones(3), training=True), RuntimeError, "at least 2 dims"),
    (lambda: N.layer_norm(st.randn(3, 5), (4,)), RuntimeError, r"normalized_shape=\[4\].*\[3, 5\]"),
    (lambda: N.layer_norm(st.randn(3, 5), (5,), st.ones(4)), RuntimeError, "weight to be of same shape"),
    (lambda: N.layer_norm(st.randn(3, 5), (5,), None, st.ones(4)), RuntimeError, "bias to be of same shape"),
    (lambda: N.layer_norm(st.randn(3, 5), 5), TypeError, "tuple of ints"),
]


@pytest.mark.parametrize("call,exc,match", BN_ERRORS)
def test_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


# ---- layer_norm -----------------------------------------------------------------------------------------------

LN_CASES = [((3, 5), (5,)), ((2, 3, 4), (3, 4)), ((2, 3, 4), (4,)), ((4, 1), (1,)), ((0, 5), (5,)), ((6,), (6,))]


@pytest.mark.parametrize("shape,nshape", LN_CASES)
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_golden(shape, nshape, affine, device, rng):
    x = (rng.standard_normal(shape) * 3 - 1).astype(np.float32)
    w = (rng.random(nshape) + 0.5).astype(np.float32)
    b = rng.standard_normal(nshape).astype(np.float32)
    golden(lambda t, w_, b_: N.layer_norm(t, nshape, w_ if affine else None, b_ if affine else None, eps=1e-4),
           lambda t, w_, b_: TF.layer_norm(t, nshape, w_ if affine else None, b_ if affine else None, eps=1e-4),
           x, w, b, device=device, requires_grad=(True, affine, affine))


def test_layer_norm_scale_without_shift(device, rng):
    # nn.LayerNorm(bias=False): a weight and no bias
    x = rng.standard_normal((3, 2, 5)).astype(np.float32)
    w = (rng.random((2, 5)) + 0.5).astype(np.float32)
    golden(lambda t, w_: N.layer_norm(t, (2, 5), w_), lambda t, w_: TF.layer_norm(t, (2, 5), w_), x, w,
           device=device)


def test_layer_norm_edge_rows(device):
    # a NaN row and an inf row stay NaN, a constant row normalizes to 0 (its gradient is finite), float64
    x = np.array([[np.nan, 1.0, 2.0, 3.0], [np.inf, 1.0, 0.0, -1.0], [2.5, 2.5, 2.5, 2.5], [1e8, -1e8, 0.0, 3.0],
                  [-0.0, 0.0, 1e-30, -1e-30]], np.float64)
    w, b = np.array([1.0, 2.0, 0.5, -1.0]), np.array([0.0, 1.0, -1.0, 0.5])
    golden(lambda t, w_, b_: N.layer_norm(t, (4,), w_, b_), lambda t, w_, b_: TF.layer_norm(t, (4,), w_, b_), x, w, b,
           device=device)


def test_layer_norm_noncontiguous(device, rng):
    x = rng.standard_normal((4, 3)).astype(np.float32)
    golden(lambda t: N.layer_norm(t.transpose(0, 1), [4]), lambda t: TF.layer_norm(t.transpose(0, 1), [4]), x,
           device=device)


# ---- gradcheck ------------------------------------------------------------------------------------------------

def _t(a, grad=False, device="cpu"):
    return st.tensor(a, dtype=st.float64, device=device, requires_grad=grad)


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 2, 2)])
def test_batch_norm_gradcheck(training, shape, device, rng):
    x, rm, rv, w, b = _bn_args(rng, shape, np.float64)
    args = (_t(x, True, device), _t(w, True, device), _t(b, True, device))
    assert gradcheck(lambda x_, w_, b_: N.batch_norm(x_, _t(rm, device=device), _t(rv, device=device), w_, b_,
                                                      training=training), args)


def test_layer_norm_gradcheck(device, rng):
    args = (_t(rng.standard_normal((3, 2, 4)), True, device), _t(rng.random((2, 4)) + 0.5, True, device),
            _t(rng.standard_normal((2, 4)), True, device))
    assert gradcheck(lambda x, w, b: N.layer_norm(x, (2, 4), w, b), args)

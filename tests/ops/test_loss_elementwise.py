"""Golden tests of smalltrain/ops/loss_elementwise.py's smooth_l1_loss, huber_loss and kl_div against torch: every
reduction and parameter, the branch points, broadcasting, NaN and infinities, errors, float64 gradcheck. (mse, l1
and the binary cross-entropies are tested in test_loss.py, through ops.loss which re-exports them.)"""
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import smalltrain as st
from smalltrain.ops import loss_elementwise as LE
from smalltrain.testing import golden, gradcheck

REDUCTIONS = ["none", "mean", "sum"]


def _quiet_golden(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # the broadcast and kl_div 'mean' warnings, ours and torch's
        return golden(*args, **kwargs)


def _pair(rng, xs, ts, dtype=np.float32):
    """Input and target whose differences land on both sides of 1 and exactly on the branch points."""
    x = np.asarray(rng.standard_normal(xs) * 2, dtype)
    t = np.asarray(rng.standard_normal(ts) * 2, dtype)
    if x.size >= 4 and xs == ts:
        flat_x, flat_t = x.reshape(-1), t.reshape(-1)
        flat_t[:4] = flat_x[:4] - np.array([0.5, -0.5, 1.0, -1.0], dtype)   # |d| at beta 0.5 / 1 and delta 0.5 / 1
        flat_t[4:5] = flat_x[4:5]                                           # d = 0
    return x, t


SHAPES = [((3, 4), (3, 4)), ((2, 3, 4), (2, 3, 4)), ((3, 4), (4,)), ((3, 1), (1, 4)), ((0, 4), (0, 4)),
          ((), ()), ((1, 1), (1, 1))]


@pytest.mark.parametrize("xs,ts", SHAPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("beta", [1.0, 0.5, 2.0, 0.0])
def test_smooth_l1_loss(beta, reduction, xs, ts, device, rng):
    x, t = _pair(rng, xs, ts)
    _quiet_golden(lambda a, b: LE.smooth_l1_loss(a, b, reduction=reduction, beta=beta),
                  lambda a, b: TF.smooth_l1_loss(a, b, reduction=reduction, beta=beta), x, t, device=device)


@pytest.mark.parametrize("xs,ts", SHAPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("delta", [1.0, 0.5, 2.5])
def test_huber_loss(delta, reduction, xs, ts, device, rng):
    x, t = _pair(rng, xs, ts)
    _quiet_golden(lambda a, b: LE.huber_loss(a, b, reduction=reduction, delta=delta),
                  lambda a, b: TF.huber_loss(a, b, reduction=reduction, delta=delta), x, t, device=device)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_huber_loss_weighted_means_over_elements_like_torch(reduction, device, rng):
    x, t = _pair(rng, (3, 4), (3, 4))
    w = rng.random((3, 4)).astype(np.float32)
    golden(lambda a, b, c: LE.huber_loss(a, b, reduction=reduction, delta=0.7, weight=c),
           lambda a, b, c: TF.huber_loss(a, b, reduction=reduction, delta=0.7, weight=c), x, t, w, device=device,
           requires_grad=(True, True, False))


@pytest.mark.parametrize("op", ["smooth_l1_loss", "huber_loss"])
def test_nonfinite_and_float64(op, device):
    x = np.array([np.nan, np.inf, -np.inf, 1e30, 0.0, -0.0, 2.0], np.float64)
    t = np.array([0.0, 0.0, 1.0, 0.0, -0.0, 0.0, np.nan], np.float64)
    golden(lambda a, b: getattr(LE, op)(a, b, reduction="none"), lambda a, b: getattr(TF, op)(a, b, reduction="none"),
           x, t, device=device)
    golden(lambda a, b: getattr(LE, op)(a.transpose(0, 1), b), lambda a, b: getattr(TF, op)(a.transpose(0, 1), b),
           np.arange(12.0).reshape(3, 4), np.linspace(0, 11, 12).reshape(4, 3) * 0.9, device=device)


def _kl_inputs(rng, shape, log_target):
    x = np.log(rng.dirichlet(np.ones(shape[-1]), shape[:-1])).astype(np.float32)
    p = rng.dirichlet(np.ones(shape[-1]), shape[:-1]).astype(np.float32)
    if not log_target:
        p.reshape(-1)[0] = 0.0   # xlogy(0, 0) = 0 forward; its target gradient is NaN in torch too
        return x, p
    return x, np.log(p)


@pytest.mark.parametrize("shape", [(4, 5), (2, 3, 4), (1, 1), (6,)])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum", "batchmean"])
@pytest.mark.parametrize("log_target", [False, True])
def test_kl_div(log_target, reduction, shape, device, rng):
    x, t = _kl_inputs(rng, shape, log_target)
    _quiet_golden(lambda a, b: LE.kl_div(a, b, reduction=reduction, log_target=log_target),
                  lambda a, b: TF.kl_div(a, b, reduction=reduction, log_target=log_target), x, t, device=device)


@pytest.mark.parametrize("reduction", ["batchmean", "sum", "none"])
def test_kl_div_edges(reduction, device):
    x = np.array([[-np.inf, -1.0, 0.0], [np.nan, -2.0, -0.5]], np.float64)
    t = np.array([[0.0, 0.5, 0.5], [0.2, np.nan, 0.8]], np.float64)
    _quiet_golden(lambda a, b: LE.kl_div(a, b, reduction=reduction), lambda a, b: TF.kl_div(a, b, reduction=reduction),
                  x, t, device=device)
    _quiet_golden(lambda a, b: LE.kl_div(a, b, reduction=reduction),   # a 0-d input: batchmean is the sum
                  lambda a, b: TF.kl_div(a, b, reduction=reduction), np.array(-0.3), np.array(0.6), device=device)
    _quiet_golden(lambda a, b: LE.kl_div(a, b, reduction=reduction), lambda a, b: TF.kl_div(a, b, reduction=reduction),
                  np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32), device=device)


def test_kl_div_mean_warns_like_torch():
    with pytest.warns(UserWarning, match="'batchmean' divides only by the batch size"):
        LE.kl_div(st.randn(2, 3), st.rand(2, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LE.kl_div(st.randn(2, 3), st.rand(2, 3), reduction="batchmean")


@pytest.mark.parametrize("size_average,reduce", [(None, False), (False, None), (True, True)])
def test_legacy_flags(size_average, reduce, rng):
    x, t = _pair(rng, (3, 4), (3, 4))
    for op in ("smooth_l1_loss", "kl_div"):
        _quiet_golden(lambda a, b: getattr(LE, op)(a, b, size_average, reduce),
                      lambda a, b: getattr(TF, op)(a, b, size_average, reduce), x, np.abs(t))


ERRORS = [
    # (ours, torch's, exception type torch raises, our message)
    (lambda: LE.smooth_l1_loss(st.randn(3), st.randn(3), beta=-1.0),
     lambda: TF.smooth_l1_loss(torch.randn(3), torch.randn(3), beta=-1.0), RuntimeError, "negative values for beta"),
    (lambda: LE.huber_loss(st.randn(3), st.randn(3), delta=0.0),
     lambda: TF.huber_loss(torch.randn(3), torch.randn(3), delta=0.0), RuntimeError, "non-positive values for delta"),
    (lambda: LE.huber_loss(st.randn(3), st.randn(3), weight=st.ones(2)),
     lambda: TF.huber_loss(torch.randn(3), torch.randn(3), weight=torch.ones(2)), ValueError,
     "Weights and input must have the same size"),
    (lambda: LE.smooth_l1_loss(st.randn(3), st.randn(4)),
     lambda: TF.smooth_l1_loss(torch.randn(3), torch.randn(4)), RuntimeError, "must match"),
    (lambda: LE.huber_loss(st.randn(3), st.randn(3), reduction="avg"),
     lambda: TF.huber_loss(torch.randn(3), torch.randn(3), reduction="avg"), ValueError, "avg is not a valid value"),
    (lambda: LE.kl_div(st.randn(3), st.rand(3), reduction="batch"),
     lambda: TF.kl_div(torch.randn(3), torch.rand(3), reduction="batch"), ValueError, "batch is not a valid value"),
    (lambda: LE.kl_div(st.randn(2, 3), st.rand(4, 3)),
     lambda: TF.kl_div(torch.randn(2, 3), torch.rand(4, 3)), RuntimeError, "must match"),
    (lambda: LE.smooth_l1_loss(st.tensor([1, 2]), st.tensor([1, 2])),
     lambda: TF.smooth_l1_loss(torch.tensor([1, 2]), torch.tensor([1, 2])), RuntimeError, "smooth_l1_loss"),
    (lambda: LE.kl_div([1.0], st.rand(1)), lambda: TF.kl_div([1.0], torch.rand(1)), TypeError, "must be Tensor"),
]


@pytest.mark.parametrize("ours,theirs,exc,match", ERRORS)
def test_errors_raise_torchs_type(ours, theirs, exc, match):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        with pytest.raises(exc):
            theirs()
        with pytest.raises(exc, match=match):
            ours()


def _t(a, grad=True):
    return st.tensor(np.asarray(a, np.float64), requires_grad=grad)


GRADCHECK = [
    ("smooth_l1", lambda x, t: LE.smooth_l1_loss(x, t, beta=0.7)),
    ("smooth_l1_none", lambda x, t: LE.smooth_l1_loss(x, t, reduction="none", beta=2.0)),
    ("huber", lambda x, t: LE.huber_loss(x, t, delta=0.6, reduction="sum")),
    ("huber_weighted", lambda x, t: LE.huber_loss(x, t, delta=1.5, weight=_t(np.linspace(0.1, 2, 12).reshape(3, 4),
                                                                               False))),
    ("kl_div", lambda x, t: LE.kl_div(x, t.abs() + 0.1, reduction="batchmean")),
    ("kl_div_log_target", lambda x, t: LE.kl_div(x, t, reduction="none", log_target=True)),
]


@pytest.mark.parametrize("name,fn", GRADCHECK, ids=[g[0] for g in GRADCHECK])
def test_gradcheck(name, fn, rng):
    x = rng.standard_normal((3, 4)) * 2
    t = x + rng.choice([-1.0, 1.0], (3, 4)) * rng.uniform(0.2, 3.0, (3, 4))   # differences away from the kinks
    assert gradcheck(fn, (_t(x), _t(t)))

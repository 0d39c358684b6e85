"""Golden tests of smalltrain/ops/loss.py against torch: the full cross_entropy option grid, nll_loss, mse/l1,
binary cross-entropy (with logits), edge inputs (huge logits, -inf, empty batch, all ignored), errors, gradcheck."""
import itertools
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import smalltrain as st
from smalltrain.ops import loss as L
from smalltrain.testing import golden, gradcheck

C = 5
SHAPES = {2: (4, C), 4: (2, C, 3, 2)}


def _class_target(rng, shape, ignore):
    t = rng.integers(0, C, (shape[0],) + shape[2:])
    if ignore is not None:
        t.reshape(-1)[::3] = ignore   # every third target is ignored
    return t


def _ce_inputs(rng, nd, prob, weighted, ignore):
    shape = SHAPES[nd]
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    t = rng.random(shape).astype(np.float32) if prob else _class_target(rng, shape, ignore)
    w = (rng.random(C) + 0.2).astype(np.float32) if weighted else None
    return x, t, w


def _run_ce(ours, theirs, x, t, w, device, **kw):
    prob = t.dtype.kind == "f"
    if w is None:
        golden(lambda a, b: ours(a, b, **kw), lambda a, b: theirs(a, b, **kw), x, t, device=device,
               requires_grad=(True, prob))
    else:
        golden(lambda a, b, c: ours(a, b, c, **kw), lambda a, b, c: theirs(a, b, c, **kw), x, t, w, device=device,
               requires_grad=(True, prob, False))


CE_GRID = [(red, weighted, ignore, ls, prob, nd)
           for red, weighted, ignore, ls, prob, nd in itertools.product(
               ["none", "mean", "sum"], [False, True], [None, 1, -100], [0.0, 0.25], [False, True], [2, 4])
           if not (prob and ignore is not None)]


@pytest.mark.parametrize("reduction,weighted,ignore,smoothing,prob,nd", CE_GRID)
def test_cross_entropy_grid(reduction, weighted, ignore, smoothing, prob, nd, device, rng):
    x, t, w = _ce_inputs(rng, nd, prob, weighted, ignore)
    kw = {"reduction": reduction, "label_smoothing": smoothing}
    if ignore is not None:
        kw["ignore_index"] = ignore
    _run_ce(L.cross_entropy, TF.cross_entropy, x, t, w, device, **kw)


def _logits(kind, rng):
    if kind == "huge":       # log_softmax must subtract the max first
        return (rng.standard_normal((4, C)) * 1e4).astype(np.float32)
    if kind == "neg_inf":    # masked logits (never the target's)
        x = rng.standard_normal((4, C)).astype(np.float32)
        x[:, 3] = -np.inf
        return x
    if kind == "ties":
        return np.zeros((4, C), np.float32)
    if kind == "float64":
        return rng.standard_normal((4, C))
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["huge", "neg_inf", "ties", "float64"])
@pytest.mark.parametrize("reduction,smoothing", [("mean", 0.0), ("none", 0.0), ("sum", 0.1)])
def test_cross_entropy_edge_logits(kind, reduction, smoothing, device, rng):
    x = _logits(kind, rng)
    t = np.array([0, 1, 2, 4])
    if kind == "neg_inf" and smoothing:
        pytest.skip("smoothing reads log p of every class: -inf logits give inf/NaN (as in torch)")
    _run_ce(L.cross_entropy, TF.cross_entropy, x, t, None, device, reduction=reduction, label_smoothing=smoothing)


SPECIAL_CE = [
    # (id, logits shape, target builder, kwargs)
    ("unbatched", (C,), lambda r: np.array(3), {}),
    ("unbatched_smooth_none", (C,), lambda r: np.array(3), {"label_smoothing": 0.2, "reduction": "none"}),
    ("unbatched_prob", (C,), lambda r: r.random(C).astype(np.float32), {}),
    ("3d", (2, C, 4), lambda r: r.integers(0, C, (2, 4)), {"reduction": "none"}),
    ("5d", (2, C, 2, 2, 2), lambda r: r.integers(0, C, (2, 2, 2, 2)), {"label_smoothing": 0.1}),
    ("size1", (1, C, 1, 1), lambda r: np.array([[[2]]]), {}),
    ("one_class", (3, 1), lambda r: np.zeros(3, np.int64), {"label_smoothing": 0.3}),
    ("uint8_target", (4, C), lambda r: r.integers(0, C, 4).astype(np.uint8), {}),
    ("all_ignored_mean", (3, C), lambda r: np.full(3, -100), {}),
    ("all_ignored_smooth", (3, C), lambda r: np.full(3, 2), {"ignore_index": 2, "label_smoothing": 0.2}),
    ("all_ignored_sum", (3, C), lambda r: np.full(3, -100), {"reduction": "sum"}),
    ("empty_mean", (0, C), lambda r: np.zeros(0, np.int64), {}),
    ("empty_sum", (0, C), lambda r: np.zeros(0, np.int64), {"reduction": "sum"}),
    ("empty_prob", (0, C), lambda r: np.zeros((0, C), np.float32), {}),
    ("prob_float64_target", (3, C), lambda r: r.random((3, C)), {}),
    ("prob_negative_ignore", (3, C), lambda r: r.random((3, C)).astype(np.float32), {"ignore_index": -5}),
    ("negative_smoothing", (3, C), lambda r: np.array([0, 1, 2]), {"label_smoothing": -0.1}),
]


@pytest.mark.parametrize("name,shape,target,kw", SPECIAL_CE, ids=[s[0] for s in SPECIAL_CE])
def test_cross_entropy_special(name, shape, target, kw, device, rng):
    x = (rng.standard_normal(shape) * 2).astype(np.float32)
    _run_ce(L.cross_entropy, TF.cross_entropy, x, target(rng), None, device, **kw)


def test_cross_entropy_unbatched_with_1d_target_forward(rng):
    # torch accepts a [C] input with a [1] target (its backward then fails, so only the value is compared)
    x = rng.standard_normal(C).astype(np.float32)
    golden(lambda a, b: L.cross_entropy(a, b, reduction="none"), lambda a, b: TF.cross_entropy(a, b, reduction="none"),
           x, np.array([3]), grad=False)


def test_cross_entropy_noncontiguous(device, rng):
    x = rng.standard_normal((C, 4)).astype(np.float32)
    t = np.array([0, 4, 1, 1])
    golden(lambda a, b: L.cross_entropy(a.transpose(0, 1), b, label_smoothing=0.1),
           lambda a, b: TF.cross_entropy(a.transpose(0, 1), b, label_smoothing=0.1), x, t, device=device)
    x4 = rng.standard_normal((2, 3, C, 2)).astype(np.float32)   # class dim moved into place by a permute
    t4 = rng.integers(0, C, (2, 3, 2))
    golden(lambda a, b: L.cross_entropy(a.permute(0, 2, 1, 3), b, reduction="none"),
           lambda a, b: TF.cross_entropy(a.permute(0, 2, 1, 3), b, reduction="none"), x4, t4, device=device)


# ---- nll_loss -------------------------------------------------------------------------------------------------

NLL_GRID = list(itertools.product(["none", "mean", "sum"], [False, True], [None, 1], [2, 4]))


@pytest.mark.parametrize("reduction,weighted,ignore,nd", NLL_GRID)
def test_nll_loss_grid(reduction, weighted, ignore, nd, device, rng):
    x, t, w = _ce_inputs(rng, nd, False, weighted, ignore)
    kw = {"reduction": reduction} if ignore is None else {"reduction": reduction, "ignore_index": ignore}
    _run_ce(L.nll_loss, TF.nll_loss, x, t, w, device, **kw)


@pytest.mark.parametrize("shape,target", [((C,), np.array(2)), ((0, C), np.zeros(0, np.int64)),
                                          ((3, C), np.full(3, -100))])
def test_nll_loss_special(shape, target, device, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    _run_ce(L.nll_loss, TF.nll_loss, x, target, None, device)


def test_nll_loss_weighted_zero_total_is_nan_like_torch(rng):
    x = rng.standard_normal((2, 3)).astype(np.float32)
    w = np.array([0.0, 1.0, 1.0], np.float32)
    _run_ce(L.nll_loss, TF.nll_loss, x, np.array([0, 0]), w, "cpu")


# ---- mse / l1 -------------------------------------------------------------------------------------------------

PAIR_CASES = [
    # (input shape, target shape, input dtype, target dtype)
    ((3, 4), (3, 4), np.float32, np.float32),
    ((2, 3, 4), (2, 3, 4), np.float64, np.float64),
    ((3, 4), (4,), np.float32, np.float32),          # broadcast (torch warns)
    ((3, 1), (1, 4), np.float32, np.float32),
    ((3, 4), (3, 4), np.float32, np.float64),        # promotion to float64
    ((0, 4), (0, 4), np.float32, np.float32),
    ((), (), np.float32, np.float32),
]


def _torch_pair(op, **kw):
    """torch's op with both operands promoted first: what it does inside, but some releases (2.11) reject mixed
    dtypes in mse_loss's backward ('Found dtype Double but expected Float'); the values are the same."""
    def run(a, b, *rest):
        dt = torch.result_type(a, b)
        return getattr(TF, op)(a.to(dt), b.to(dt), *rest, **kw)
    return run


@pytest.mark.parametrize("op", ["mse_loss", "l1_loss"])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("xs,ts,xd,td", PAIR_CASES)
def test_pointwise_losses(op, reduction, xs, ts, xd, td, device, rng):
    x = rng.standard_normal(xs).astype(xd)
    t = rng.standard_normal(ts).astype(td)
    if x.size and xs == ts:
        t.reshape(-1)[0] = x.reshape(-1)[0]   # a zero difference: l1's gradient is sign(0) = 0 there
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        golden(lambda a, b: getattr(L, op)(a, b, reduction=reduction), _torch_pair(op, reduction=reduction), x, t,
               device=device)


@pytest.mark.parametrize("op", ["mse_loss", "l1_loss"])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_pointwise_losses_weighted_and_int_target(op, reduction, device, rng):
    x, t = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    w = rng.random((3, 4)).astype(np.float32)
    golden(lambda a, b, c: getattr(L, op)(a, b, reduction=reduction, weight=c),
           lambda a, b, c: getattr(TF, op)(a, b, reduction=reduction, weight=c), x, t, w, device=device,
           requires_grad=(True, True, False))
    golden(lambda a, b: getattr(L, op)(a, b, reduction=reduction), _torch_pair(op, reduction=reduction), x,
           np.arange(12).reshape(3, 4), device=device)


def test_pointwise_loss_warns_on_broadcast():
    with pytest.warns(UserWarning, match="different to the input size"):
        L.mse_loss(st.randn(3, 4), st.randn(4))


@pytest.mark.parametrize("size_average,reduce", [(None, False), (False, None), (True, True), (False, True)])
def test_legacy_reduction_flags(size_average, reduce, rng):
    x, t = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        golden(lambda a, b: L.mse_loss(a, b, size_average, reduce), lambda a, b: TF.mse_loss(a, b, size_average,
                                                                                             reduce), x, t)


# ---- binary cross-entropy -------------------------------------------------------------------------------------

@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("weighted", [False, True])
def test_binary_cross_entropy(reduction, weighted, device, rng):
    x = rng.uniform(0.02, 0.98, (3, 4)).astype(np.float32)
    x[0, :3] = [0.0, 1.0, 1e-30]   # log clamped at -100, the gradient's denominator at 1e-12
    t = rng.random((3, 4)).astype(np.float32)
    t[0, :3] = [1.0, 0.0, 1.0]
    args, rg = (x, t), (True, True)
    if weighted:
        args, rg = (x, t, rng.random(4).astype(np.float32)), (True, True, False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        golden(lambda a, b, *w: L.binary_cross_entropy(a, b, *w, reduction=reduction),
               lambda a, b, *w: TF.binary_cross_entropy(a, b, *w, reduction=reduction), *args, device=device,
               requires_grad=(True, False) + rg[2:])
        golden(lambda a, b, *w: L.binary_cross_entropy(a, b, *w, reduction=reduction),   # target gradient
               lambda a, b, *w: TF.binary_cross_entropy(a, b, *w, reduction=reduction), x[1:], t[1:],
               *args[2:], device=device, requires_grad=rg)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("weighted,pos_weighted", [(False, False), (True, False), (False, True), (True, True)])
def test_binary_cross_entropy_with_logits(reduction, weighted, pos_weighted, device, rng):
    x = (rng.standard_normal((3, 4)) * 4).astype(np.float32)
    x[0, :2] = [200.0, -200.0]   # log-sigmoid must not overflow
    t = rng.random((3, 4)).astype(np.float32)
    w = rng.random((3, 1)).astype(np.float32)
    pw = (rng.random(4) * 3).astype(np.float32)

    def call(f, a, b, w_, pw_):
        return f(a, b, w_ if weighted else None, reduction=reduction, pos_weight=pw_ if pos_weighted else None)
    golden(lambda a, b, c, d: call(L.binary_cross_entropy_with_logits, a, b, c, d),
           lambda a, b, c, d: call(TF.binary_cross_entropy_with_logits, a, b, c, d), x, t, w, pw, device=device,
           requires_grad=(True, True, False, False))


# ---- errors ---------------------------------------------------------------------------------------------------

def _x():
    return st.randn(3, C)


ERRORS = [
    # (call, expected exception, message regex) -- the exception types are torch's for the same call
    (lambda: L.cross_entropy(_x(), st.tensor([0, 10, 1])), IndexError, "Target 10 is out of bounds"),
    (lambda: L.cross_entropy(_x(), st.tensor([0, -1, 1])), IndexError, "Target -1 is out of bounds"),
    (lambda: L.nll_loss(_x(), st.tensor([0, 5, 1])), IndexError, "Target 5 is out of bounds"),
    (lambda: L.cross_entropy(_x(), st.tensor([0, 1, 1], dtype=st.int32)), RuntimeError, "Long or Byte.*int32"),
    (lambda: L.cross_entropy(_x(), st.tensor([0, 1])), ValueError, r"batch_size \(3\).*batch_size \(2\)"),
    (lambda: L.cross_entropy(_x(), st.tensor([[0, 1, 1]])), ValueError, "batch_size"),
    (lambda: L.cross_entropy(_x(), st.zeros(3, 4, dtype=st.int64)), RuntimeError, "multi-target not supported"),
    (lambda: L.cross_entropy(_x(), st.rand(3, 5), ignore_index=1), RuntimeError, "ignore_index is not supported"),
    (lambda: L.cross_entropy(_x(), st.zeros(3, 5, dtype=st.int64)), RuntimeError, "Expected floating point"),
    (lambda: L.cross_entropy(_x(), st.tensor([0, 1, 1]), weight=st.ones(4)), RuntimeError, "all 5 classes"),
    (lambda: L.cross_entropy(_x(), st.rand(3, 5), weight=st.ones(4)), RuntimeError, "all 5 classes"),
    (lambda: L.cross_entropy(_x(), st.tensor([0, 1, 1]), reduction="foo"), ValueError, "not a valid value"),
    (lambda: L.cross_entropy(_x(), st.tensor([0, 1, 1]), label_smoothing=1.5), RuntimeError, "label_smoothing"),
    (lambda: L.cross_entropy(st.randn(5), st.tensor([1, 2])), ValueError, "1D target must have size 1"),
    (lambda: L.cross_entropy(st.randn(2, 3, 4, 5), st.zeros(2, 4, 4, dtype=st.int64)), RuntimeError,
     "size mismatch"),
    (lambda: L.cross_entropy(st.tensor([[1, 2]]), st.tensor([0])), NotImplementedError, "int64"),
    (lambda: L.cross_entropy(st.tensor(1.0), st.tensor(0)), IndexError, "out of range"),
    (lambda: L.nll_loss(st.tensor(1.0), st.tensor(0)), ValueError, "Expected 1 or more dimensions"),
    (lambda: L.nll_loss(_x(), st.rand(3)), RuntimeError, "Long or Byte"),
    (lambda: L.nll_loss(_x(), st.tensor([0, 1, 2]), weight=st.ones(5, 1)), RuntimeError, "all 5 classes"),
    (lambda: L.mse_loss(_x(), st.randn(4)), RuntimeError, "must match"),
    (lambda: L.mse_loss(st.tensor([1, 2]), st.tensor([1, 2])), NotImplementedError, "mse_loss"),
    (lambda: L.l1_loss(_x(), _x(), reduction="bad"), ValueError, "bad is not a valid value"),
    (lambda: L.mse_loss(_x(), _x(), weight=st.ones(5)), ValueError, "Weights and input must have the same size"),
    (lambda: L.binary_cross_entropy(st.rand(3), st.rand(4)), ValueError, "different to the input size"),
    (lambda: L.binary_cross_entropy(st.rand(3) * 2 + 1.5, st.rand(3)), RuntimeError, "between 0 and 1"),
    (lambda: L.binary_cross_entropy(st.tensor([float("nan")]), st.rand(1)), RuntimeError, "between 0 and 1"),
    (lambda: L.binary_cross_entropy(st.rand(2), st.rand(2, dtype=st.float64)), RuntimeError, "Found dtype"),
    (lambda: L.binary_cross_entropy(st.rand(3), st.rand(3), weight=st.rand(2)), RuntimeError, "broadcast"),
    (lambda: L.binary_cross_entropy_with_logits(st.rand(3), st.rand(4)), ValueError, "must be the same as"),
    (lambda: L.binary_cross_entropy_with_logits(_x(), st.rand(3, 5), pos_weight=st.ones(4)), RuntimeError,
     "broadcast"),
]


@pytest.mark.parametrize("call,exc,match", ERRORS)
def test_errors(call, exc, match):
    with warnings.catch_warnings(), pytest.raises(exc, match=match):
        warnings.simplefilter("ignore", UserWarning)   # the broadcast warning comes before the error, as in torch
        call()


# ---- gradcheck (float64) --------------------------------------------------------------------------------------

def _t(a, grad=False):
    return st.tensor(a, dtype=st.float64 if np.asarray(a).dtype.kind == "f" else None, requires_grad=grad)


GRADCHECK = [
    ("ce_mean_weight_ignore_smooth", lambda r: (
        _t(r.standard_normal((4, 3)), True), _t(np.array([0, 2, 1, 2]))),
     lambda x, t: L.cross_entropy(x, t, _t([0.5, 1.0, 2.0]), ignore_index=1, label_smoothing=0.2)),
    ("ce_none_4d", lambda r: (_t(r.standard_normal((2, 3, 2, 2)), True), _t(r.integers(0, 3, (2, 2, 2)))),
     lambda x, t: L.cross_entropy(x, t, reduction="none")),
    ("ce_prob_both_grads", lambda r: (_t(r.standard_normal((3, 4)), True), _t(r.random((3, 4)), True)),
     lambda x, t: L.cross_entropy(x, t, _t([1.0, 2.0, 0.5, 1.0]), label_smoothing=0.1)),
    ("nll_sum", lambda r: (_t(r.standard_normal((4, 3)), True), _t(np.array([0, 2, 1, 2]))),
     lambda x, t: L.nll_loss(x, t, _t([0.5, 1.0, 2.0]), reduction="sum")),
    ("mse", lambda r: (_t(r.standard_normal((3, 4)), True), _t(r.standard_normal((3, 4)), True)),
     lambda x, t: L.mse_loss(x, t)),
    ("l1", lambda r: (_t(r.standard_normal((3, 4)), True), _t(r.standard_normal((3, 4)), True)),
     lambda x, t: L.l1_loss(x, t, reduction="sum")),
    ("bce", lambda r: (_t(r.uniform(0.1, 0.9, (3, 4)), True), _t(r.random((3, 4)), True)),
     lambda x, t: L.binary_cross_entropy(x, t, _t(np.linspace(0.5, 2, 4)))),
    ("bce_logits", lambda r: (_t(r.standard_normal((3, 4)) * 3, True), _t(r.random((3, 4)), True)),
     lambda x, t: L.binary_cross_entropy_with_logits(x, t, _t(np.linspace(0.5, 2, 4)),
                                                     pos_weight=_t(np.linspace(0.2, 3, 4)))),
]


@pytest.mark.parametrize("name,make,fn", GRADCHECK, ids=[g[0] for g in GRADCHECK])
def test_gradcheck(name, make, fn, rng):
    assert gradcheck(fn, make(rng))


# ---- the cross-entropy in the kernel that writes its logits (autograd/held.py, backend/cuda/_common.py HeldHead) ----
HEAD_CASES = [  # rows per block, batch, classes, reduction, weighted, ignore_index, label_smoothing, dtype
    (1, 64, 10, "mean", False, None, 0.0, "float32"),
    (2, 33, 10, "sum", True, 1, 0.0, "float32"),
    (4, 300, 40, "mean", True, -100, 0.25, "float32"),
    (8, 1100, 20, "mean", False, 3, 0.0, "float32"),   # 22,000 gradient elements: no unit gradient, a backward kernel
    (4, 130, 10, "none", False, None, 0.0, "float32"),  # not fused: the chain runs first, then the loss's own kernel
    (2, 50, 10, "mean", True, 2, 0.1, "float64"),
]
def _loss_and_grads(head, inputs, target, weight, device, dtype, **kw):
    """head(tensors) -> logits; the cross-entropy of the logits, the logits and the gradient of every input, as
    NumPy arrays."""
    from smalltrain.nn import functional as F
    t = [st.tensor(a.astype(dtype), device=device, requires_grad=True) for a in inputs]
    logits = head(t)
    loss = F.cross_entropy(logits, st.tensor(target, device=device),
                           None if weight is None else st.tensor(weight.astype(dtype), device=device), **kw)
    loss.backward(None if loss.ndim == 0 else st.ones_like(loss))
    return [loss.detach().cpu().numpy(), logits.detach().cpu().numpy()] + [v.grad.cpu().numpy() for v in t]


def _fused_against_two_kernels_and_torch(ours, theirs, inputs, target, weight, dtype, kw, monkeypatch, tol_scale=1):
    """The loss, logits and gradients with the head's launch held outside captures too (eager_holds), so that the
    cross-entropy runs in its kernel, equal those of the two kernels (nothing held) and torch's in float64."""
    from smalltrain.backend.cuda import _common as cuda_common
    two = _loss_and_grads(ours, inputs, target, weight, "cuda", dtype, **kw)
    with cuda_common.eager_holds():
        one = _loss_and_grads(ours, inputs, target, weight, "cuda", dtype, **kw)
    tx = [torch.tensor(a, requires_grad=True) for a in inputs]
    logits = theirs(tx)
    loss = TF.cross_entropy(logits, torch.tensor(target), None if weight is None else torch.tensor(weight), **kw)
    loss.backward(None if loss.ndim == 0 else torch.ones_like(loss))
    ref = [loss.detach().numpy(), logits.detach().numpy()] + [v.grad.numpy() for v in tx]
    tol = (2e-6 if dtype == "float32" else 1e-12) * tol_scale
    for i, (u, v, r) in enumerate(zip(one, two, ref)):
        name = ["loss", "logits"][i] if i < 2 else f"input {i - 2}"
        scale = max(np.abs(r).max(), 1e-30)
        assert np.abs(u - v).max() <= tol * scale, f"{name}: fused against two kernels"
        assert np.abs(u - r).max() <= 50 * tol * scale, f"{name}: fused against torch"


def _targets(rng, m, c, ignore, weighted):
    target = rng.integers(0, c, m)
    if ignore is not None:
        target[::7] = ignore
    return target, (rng.random(c) + 0.2 if weighted else None)


@pytest.mark.skipif(not st.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("rows,m,c,reduction,weighted,ignore,smoothing,dtype", HEAD_CASES)
def test_chain_with_the_cross_entropy_in_its_kernel(rows, m, c, reduction, weighted, ignore, smoothing, dtype, rng,
                                                    monkeypatch, record_kernels):
    """A two-layer chain's logits: chain_fwd_ce (chain_fwd and the loss's kernel where the reduction is 'none')."""
    from smalltrain.backend.cuda import linear_chain as cuda_chain
    from smalltrain.ops.matmul import linear_chain
    monkeypatch.setattr(cuda_chain, "_CHAIN_ROWS", (rows,))
    inputs = [rng.standard_normal((m, 24)), rng.standard_normal((16, 24)) * 0.5, rng.standard_normal((c, 16)) * 0.5,
              rng.standard_normal(16) * 0.1, rng.standard_normal(c) * 0.1]
    target, weight = _targets(rng, m, c, ignore, weighted)
    kw = {"reduction": reduction, "label_smoothing": smoothing} | ({} if ignore is None else {"ignore_index": ignore})
    names = record_kernels(cuda_chain, "get")
    _fused_against_two_kernels_and_torch(
        lambda t: linear_chain(t[0], [(t[1], t[3], "relu"), (t[2], t[4], None)]),
        lambda t: TF.linear(TF.relu(TF.linear(t[0], t[1], t[3])), t[2], t[4]), inputs, target, weight, dtype, kw,
        monkeypatch)
    heads = [n for n in names if n.startswith("chain_fwd")]
    fused = f"chain_fwd_r{rows}" if reduction == "none" else f"chain_fwd_ce_r{rows}"
    assert heads == [f"chain_fwd_r{rows}", fused]


@pytest.mark.skipif(not st.cuda.is_available(), reason="no CUDA device")
def test_chain_with_the_cross_entropy_in_its_kernel_flags_a_bad_target(monkeypatch):
    from smalltrain.backend.cuda import _common as cuda_common
    from smalltrain.ops.matmul import linear_chain
    with cuda_common.eager_holds(), pytest.raises(IndexError, match="Target 12 is out of bounds"):
        _loss_and_grads(lambda t: linear_chain(t[0], [(t[1], t[3], "relu"), (t[2], t[4], None)]),
                        [np.ones((4, 24)), np.ones((16, 24)), np.ones((10, 16)), np.zeros(16), np.zeros(10)],
                        np.array([1, 12, 0, 3]), None, "cuda", "float32")

"""Golden tests for smalltrain.ops.inplace against torch: in-place ops on views write through to the base, and
backward through the base (and the view) sees the write (torch's CopySlices); in-place on a leaf that requires grad,
or on a view of one, raises."""
import numpy as np
import pytest
import torch

import smalltrain as st
from smalltrain.testing import golden, golden_error


def both(fn, *inputs, device="cpu", **kw):
    return golden(lambda *a: fn(st, *a), lambda *a: fn(torch, *a), *inputs, device=device, **kw)


def _rows(L, x):
    a = x * 1.5
    a[1:].add_(5)
    return a


def _column_mul(L, x, w):
    a = x.clone()
    a[:, 1].mul_(w[:, 0])   # the op saves the view's old values for w's gradient
    return a * x


def _transpose_view(L, x, w):
    a = x * 1.0
    a.t().sub_(w)          # w: [3, 2], a.t(): [3, 2]
    return a.exp()


def _reshape_view(L, x):
    a = x + 0.0
    a.view(-1)[1:5].relu_()
    return a * a


def _chain_of_views(L, x, w):
    a = x * 2.0
    v = a[1:][:, ::2]
    v.mul_(w[:1, :2])
    v.add_(1)
    return a.sum(0), v


def _view_of_plain_base(L, w):
    b = L.zeros(3, 3, dtype=w.dtype, device=w.device)
    b[1].copy_(w[0])       # a base that did not require grad takes the view's history
    b[2, 1:3].fill_(7.0)
    return b * 2


def _zero_and_fill(L, x):
    a = x.sigmoid()
    b = a * 1.0
    b[0].zero_()
    b[1, :2].fill_(0.25)
    return b


def _iadd_on_view(L, x, w):
    a = x * 3.0
    v = a[:, 1:3]
    v += w[:2, :2]
    return a, v


def _setitem_on_view(L, x, w):
    a = x * 1.0
    a[1][0:2] = w[0, :2]
    return a


def _clamp_view(L, x):
    a = x * 1.0
    a[0].clamp_(-0.5, 0.5)
    a[1].div_(2).neg_()
    return a


def _base_written_after_views(L, x, w):
    a = x * 2.0
    row, col = a[1:], a.t()[:, 0]
    a.mul_(w)              # views made before the write see it, values and gradients
    return row * 1.0, col.exp()


def _sibling_views(L, x, w):
    a = x * 1.0
    first, second = a[0], a[:, 1:]
    first.add_(w[0])
    second.mul_(w[1, :2])   # overlaps the first write: its history includes it
    return first + 0.0, a


CASES = {"base_then_views": (_base_written_after_views, 2), "sibling_views": (_sibling_views, 2),
         "rows": (_rows, 1), "column_mul": (_column_mul, 2), "transpose": (_transpose_view, 2),
         "reshape": (_reshape_view, 1), "chain_of_views": (_chain_of_views, 2), "plain_base": (_view_of_plain_base, -1),
         "zero_fill": (_zero_and_fill, 1), "iadd": (_iadd_on_view, 2), "setitem": (_setitem_on_view, 2),
         "clamp_div_neg": (_clamp_view, 1)}


@pytest.mark.parametrize("case", sorted(CASES))
def test_inplace_on_views_golden(case, device, rng):
    fn, n = CASES[case]
    x = rng.uniform(-2, 2, (2, 3)).astype(np.float32)
    w = rng.uniform(-2, 2, (3, 2) if case == "transpose" else (2, 3)).astype(np.float32)
    inputs = (w,) if n == -1 else (x,) if n == 1 else (x, w)
    both(fn, *inputs, device=device)


def test_write_goes_through_to_base(device):
    a = st.tensor([1.0, 2.0, 3.0], device=device, requires_grad=True).clone()
    v = a[1:]
    v.add_(5)
    assert a.tolist() == [1.0, 7.0, 8.0]
    assert a.grad_fn is not None and "CopySlices" in a.grad_fn.name()
    a[0].zero_()   # an integer index is a 0-d view, as in torch
    assert a.tolist() == [0.0, 7.0, 8.0]


def test_producer_saved_output_survives_the_write():
    # torch raises here (exp saved its output); ours keeps the producer's copy, so the gradient stays right
    x = st.tensor([0.5, 1.0], requires_grad=True)
    e = (x * 2).exp()
    e.add_(1)
    e.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * np.exp(2 * np.array([0.5, 1.0])), rtol=1e-6)


ERRORS = [
    (lambda L, a: a.requires_grad_()[1:].add_(1), r"view of a leaf Variable"),
    (lambda L, a: a.requires_grad_().t().mul_(2), r"view of a leaf Variable"),
    (lambda L, a: a.requires_grad_().view(-1).zero_(), r"view of a leaf Variable"),
    (lambda L, a: a.requires_grad_().relu_(), r"leaf Variable"),
    (lambda L, a: a.requires_grad_()[0].fill_(1.0), r"view of a leaf Variable"),
]


@pytest.mark.parametrize("k", range(len(ERRORS)))
def test_inplace_errors(k, device):
    fn, match = ERRORS[k]
    golden_error(lambda a: fn(st, a), lambda a: fn(torch, a), np.ones((2, 2), np.float32), match=match,
                 device=device)


def test_no_grad_inplace_on_leaf_view_is_allowed(device):
    p = st.ones(2, 3, device=device, requires_grad=True)
    with st.no_grad():
        p[0].mul_(3)
    assert p.is_leaf and p.tolist() == [[3.0, 3.0, 3.0], [1.0, 1.0, 1.0]]


@pytest.mark.parametrize("name, kwargs", [("relu", {}), ("leaky_relu", {"negative_slope": 0.1}), ("elu", {}),
                                          ("hardtanh", {}), ("relu6", {}), ("silu", {}), ("hardswish", {})])
def test_an_inplace_activation_on_a_view_writes_through_and_backpropagates_as_torchs(name, kwargs):
    """F.<act>(view, inplace=True) on a view of a tensor that requires grad: the base sees the write, and the
    gradient through the base is torch's."""
    results = []
    for lib in (st, torch):
        a0 = lib.tensor([-1.5, 2.0, -3.0, 7.0, 0.5], requires_grad=True)
        a = a0 * 2
        out = getattr(lib.nn.functional, name)(a[1:4], inplace=True, **kwargs)
        (a * lib.tensor([1.0, 2.0, 3.0, 4.0, 5.0])).sum().backward()
        results.append((out.tolist(), a.tolist(), a0.grad.tolist()))
    for ours, theirs in zip(*results):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)   # (elu_: torch derives from the output)

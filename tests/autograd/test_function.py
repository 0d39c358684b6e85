"""smalltrain.autograd.Function, the contract users write custom ops against: forward/backward with ctx,
save_for_backward/saved_tensors, needs_input_grad, mark_non_differentiable, multiple outputs, non-tensor arguments,
materialize_grads, and a course-lab style GELU written with tensor ops in both passes, checked against torch."""
import math

import numpy as np
import pytest
import torch

import smalltrain as st
from smalltrain.autograd import Function
from smalltrain.testing import assert_close, gradcheck


def make_gelu(lib, base):
    """The same user code for both frameworks: tanh-approximated GELU, forward and backward with tensor ops."""
    c = math.sqrt(2.0 / math.pi)

    class GELU(base):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return 0.5 * x * (1 + lib.tanh(c * (x + 0.044715 * x.pow(3))))

        @staticmethod
        def backward(ctx, grad_output):
            (x,) = ctx.saved_tensors
            inner = c * (x + 0.044715 * x.pow(3))
            sech2 = 1 / lib.cosh(inner).pow(2)
            dinner = c * (1 + 3 * 0.044715 * x.pow(2))
            return grad_output * (0.5 * (1 + lib.tanh(inner)) + 0.5 * x * sech2 * dinner)
    return GELU


def test_custom_gelu_matches_torch(device, rng):
    x0 = rng.uniform(-3, 3, (4, 5)).astype(np.float32)
    g0 = rng.standard_normal((4, 5)).astype(np.float32)
    xs, xt = st.tensor(x0, device=device, requires_grad=True), torch.tensor(x0, requires_grad=True)
    ys = make_gelu(st, Function).apply(xs)
    yt = make_gelu(torch, torch.autograd.Function).apply(xt)
    assert_close(ys, yt)
    assert_close(ys, torch.nn.functional.gelu(torch.tensor(x0), approximate="tanh"))
    assert ys.grad_fn is not None and ys.requires_grad
    ys.backward(st.tensor(g0, device=device))
    yt.backward(torch.tensor(g0))
    assert_close(xs.grad, xt.grad)


def test_custom_gelu_gradcheck(rng):
    gelu = make_gelu(st, Function)
    x = st.tensor(rng.uniform(-3, 3, (3, 4)), requires_grad=True)
    assert gradcheck(gelu.apply, (x,))


class ScaleShift(Function):
    """y = x * w + shift, with a non-tensor argument and needs_input_grad checked in backward."""

    @staticmethod
    def forward(ctx, x, w, shift):
        ctx.save_for_backward(x, w)
        ctx.seen = ctx.needs_input_grad
        return x.array * w.array + shift

    @staticmethod
    def backward(ctx, dout):
        x, w = ctx.saved_tensors
        dx = dout.array * w.array if ctx.needs_input_grad[0] else None
        dw = dout.array * x.array if ctx.needs_input_grad[1] else None
        return dx, dw   # the trailing non-tensor argument may be omitted


def test_needs_input_grad_and_raw_arrays(device):
    x = st.tensor([1.0, 2.0], device=device, requires_grad=True)
    w = st.tensor([3.0, 4.0], device=device)
    y = ScaleShift.apply(x, w, 0.5)
    assert y.tolist() == [3.5, 8.5] and y.grad_fn.seen == (True, False, False)
    y.sum().backward()
    assert x.grad.tolist() == [3.0, 4.0] and w.grad is None
    with st.no_grad():
        z = ScaleShift.apply(x, w, 0.0)
    assert z.grad_fn is None and not z.requires_grad


class SortWithIndex(Function):
    """Two outputs: sorted values (differentiable) and indices (marked non-differentiable)."""

    @staticmethod
    def forward(ctx, x):
        order = np.argsort(x.array, kind="stable")
        ctx.order = order
        idx = st.Tensor._wrap(order.astype(np.int64))
        ctx.mark_non_differentiable(idx)
        return st.Tensor._wrap(x.array[order]), idx

    @staticmethod
    def backward(ctx, dvalues, dindices):
        assert dindices is None
        dx = np.zeros_like(dvalues.array)
        dx[ctx.order] = dvalues.array
        return dx


def test_multiple_outputs_and_mark_non_differentiable():
    x = st.tensor([3.0, 1.0, 2.0], requires_grad=True)
    values, indices = SortWithIndex.apply(x)
    assert indices.tolist() == [1, 2, 0] and not indices.requires_grad and values.requires_grad
    (values * st.tensor([1.0, 10.0, 100.0])).sum().backward()
    assert x.grad.tolist() == [100.0, 1.0, 10.0]


class TwoOutputs(Function):
    @staticmethod
    def forward(ctx, x):
        return x.array * 2, x.array * 3

    @staticmethod
    def backward(ctx, da, db):
        ctx.got = (da is None, db is None)
        return (0 if da is None else da.array * 2) + (0 if db is None else db.array * 3)


@pytest.mark.parametrize("materialize", [True, False])
def test_unused_output_gradients(materialize):
    class Fn(TwoOutputs):
        @staticmethod
        def forward(ctx, x):
            ctx.set_materialize_grads(materialize)
            return TwoOutputs.forward(ctx, x)
    x = st.tensor([1.0, 2.0], requires_grad=True)
    a, _ = Fn.apply(x)
    node = a.grad_fn
    a.sum().backward()
    assert x.grad.tolist() == [2.0, 2.0]
    assert node.got == ((False, False) if materialize else (False, True))


def test_both_outputs_feed_the_loss():
    x = st.tensor([1.0, 2.0], requires_grad=True)
    a, b = TwoOutputs.apply(x)
    (a * b).sum().backward()   # d(6 x^2)/dx = 12 x
    assert x.grad.tolist() == [12.0, 24.0]


def test_saved_tensors_are_freed_after_backward():
    gelu = make_gelu(st, Function)
    x = st.tensor([0.5, -1.0], requires_grad=True)
    y = gelu.apply(x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.backward()


def test_backward_returning_too_many_gradients_raises():
    class Bad(Function):
        @staticmethod
        def forward(ctx, x):
            return x.array * 1

        @staticmethod
        def backward(ctx, dout):
            return dout.array, dout.array

    with pytest.raises(RuntimeError, match="incorrect number of gradients"):
        Bad.apply(st.ones(2, requires_grad=True)).sum().backward()


def test_forward_returning_an_input_does_not_rewire_it():
    class Passthrough(Function):
        @staticmethod
        def forward(ctx, x, y):
            return y

        @staticmethod
        def backward(ctx, dout):
            return None, dout.array

    x, y = st.ones(2, requires_grad=True), st.ones(2)
    out = Passthrough.apply(x, y)
    assert out is not y and y.grad_fn is None and not y.requires_grad and out.requires_grad

"""CUDA linear layer with the bias and an activation fused into the GEMM's epilogue: out = act(x @ W^T + b).

The GEMM writes y^T = W @ x^T as [F, M]; the convolution's epilogue kernels (kernels/conv.cu, bias_act_* with
N = M rows, O = F features, P = 1) then transpose it to [M, F] adding the bias and applying the activation in
one pass, and in backward turn dout into g^T = (dout * act'(y + b))^T, from which dW = g^T @ x, dx = (g^T)^T @ W
and db = the row sums of g^T. Against linear-then-activation this saves a launch each way and an op's dispatch.
"""
from dataclasses import dataclass

from . import cupy
from ._common import check_array, check_dtype, i32, i64, launch, ptr
from .blas import gemm, sum_rows
from .conv import ACTIVATIONS, check_affine


@dataclass
class LinearSaved:
    """x [M, K], weight [F, K] (references), bias, yT [F, M] (the GEMM result, kept when an activation needs it)."""
    x: object
    weight: object
    bias: object
    yT: object
    activation: object


def linear_act_forward(x, w, b=None, activation=None):
    """act(x @ w^T + b) for x [M, K], w [F, K], b [F] or None (cupy float arrays of one dtype and device);
    activation None, 'relu', 'gelu' or 'gelu_tanh'. Returns (out [M, F], LinearSaved)."""
    op = "linear"
    check_affine(op, x, w, b, 2, activation, bias_ndim=1)
    m, k = x.shape
    f = w.shape[0]
    if w.shape[1] != k or (b is not None and b.shape[0] != f):
        raise RuntimeError(f"{op}: expected weight [F, {k}] and bias [F], got weight {list(w.shape)}"
                           f"{'' if b is None else f' and bias {list(b.shape)}'}")
    with x.device:
        yT = gemm(w, x.T)
        out = cupy().empty((m, f), dtype=x.dtype)
        launch("conv", "bias_act_fwd", x.dtype, out.size, (yT, ptr(b), out, i64(m), i64(f), i64(1),
                                                         i32(ACTIVATIONS[activation])))
    return out, LinearSaved(x, w, b, yT if activation else None, activation)


def linear_act_backward(dout, saved, needs=(True, True, True)):
    """(dx [M, K], dw [F, K], db [F]) from dout [M, F]; None where `needs` (input, weight, bias) says so."""
    op = "linear_backward"
    x, w = saved.x, saved.weight
    m, f = x.shape[0], w.shape[0]
    check_array(op, "grad_output", dout, 2)
    if tuple(dout.shape) != (m, f):
        raise RuntimeError(f"{op}: expected grad_output of shape {[m, f]}, got {list(dout.shape)}")
    check_dtype(op, "grad_output", dout, x.dtype)
    with dout.device:
        dout = cupy().ascontiguousarray(dout)
        gT = cupy().empty((f, m), dtype=x.dtype)
        launch("conv", "bias_act_bwd", x.dtype, gT.size, (dout, ptr(saved.yT), ptr(saved.bias), gT, i64(m), i64(f),
                                                         i64(1), i32(ACTIVATIONS[saved.activation])))
        dx = gemm(gT.T, w) if needs[0] else None
        dw = gemm(gT, x) if needs[1] else None
        db = sum_rows(gT, 1) if len(needs) > 2 and needs[2] and saved.bias is not None else None
    return dx, dw, db

"""Matrix products: batched matmul with broadcasting, and linear (x @ W^T + b) as one op with one GEMM each way.

On CUDA the GEMMs go through our direct cuBLAS calls (backend/cuda/blas.py), which CUDA graphs can capture;
shapes that those do not cover (1-D operands, more than one batch dim) use the array library's matmul.
"""
import numpy as np

from ..autograd import held, pending
from ..autograd.engine import Prepared, takes_plainly
from ..autograd.function import Function
from ..backend.cuda import blas
from ..backend.cuda import linear as cuda_linear
from ..backend.cuda import linear_chain as cuda_chain
from ._util import check_same_device, offered_producer, xp_of
from .activation import apply_named


def _mm(x, y):
    """x @ y for raw arrays of one device (shapes already checked)."""
    if isinstance(x, np.ndarray):
        return x @ y
    if blas.supported(x, y) and (x.ndim == 2 or y.ndim == 2 or x.shape[0] == y.shape[0] or
                                 1 in (x.shape[0], y.shape[0])):
        return blas.gemm(x, y)
    return x @ y


def _sum_rows(g):
    """g [M, N] summed over M (a bias gradient)."""
    if isinstance(g, np.ndarray):
        return g.sum(axis=0)
    return blas.sum_rows(g, 0)


def _swap(a):
    return a.swapaxes(-1, -2)


class MatMul(Function):
    @staticmethod
    def forward(ctx, a, b):
        check_same_device("matmul", a, b)
        x, y = a.array, b.array
        if x.ndim == 0 or y.ndim == 0:
            raise RuntimeError(f"matmul: both arguments to matmul need to be at least 1D, but they are "
                               f"{x.ndim}D and {y.ndim}D")
        kx = x.shape[-1]
        ky = y.shape[0] if y.ndim == 1 else y.shape[-2]
        if kx != ky:
            if x.ndim == 1 and y.ndim == 1:
                raise RuntimeError(f"dot: inconsistent tensor size, expected tensor [{kx}] and src [{ky}] to have "
                                   f"the same number of elements, but got {kx} and {ky} elements respectively")
            raise RuntimeError(f"matmul: mat1 and mat2 shapes cannot be multiplied ({_fmt(x)} and {_fmt(y)})")
        if x.dtype != y.dtype:
            raise RuntimeError(f"matmul: expected both arguments to have the same dtype, but got: {x.dtype} "
                               f"!= {y.dtype}")
        need = ctx.needs_input_grad
        ctx.x = x if need[1] else None   # save only what backward reads
        ctx.y = y if need[0] else None
        ctx.ndims = x.ndim, y.ndim
        try:
            return _mm(x, y)
        except ValueError:
            bx, by = x.shape[:-2], y.shape[:-2]
            raise RuntimeError(f"matmul: batch dimensions {list(bx)} and {list(by)} do not broadcast (shapes "
                               f"{list(x.shape)} and {list(y.shape)})") from None

    @staticmethod
    def backward(ctx, dout):
        g, x, y = dout.array, ctx.x, ctx.y
        nx, ny = ctx.ndims
        if nx == 1 and ny == 1:   # a dot product: the gradient is a scalar times the other vector
            return (g * y if y is not None else None), (g * x if x is not None else None)
        # promote 1-D operands to matrices so one formula covers every case, then drop the added dims
        g2 = g
        if nx == 1:
            g2 = g2[..., None, :]
        if ny == 1:
            g2 = g2[..., None]
        dx = dy = None
        if y is not None:
            dx = _mm(g2, _swap(y[:, None] if ny == 1 else y))
            if nx == 1:
                dx = dx[..., 0, :]
        if x is not None and ny == 2 and nx > 2:
            # batched input times one matrix: one GEMM over the flattened batch, not a batch of GEMMs summed
            dy = _mm(x.reshape(-1, x.shape[-1]).T, g.reshape(-1, g.shape[-1]))
        elif x is not None:
            dy = _mm(_swap(x[None, :] if nx == 1 else x), g2)
            if ny == 1:
                dy = dy[..., 0]
        return dx, dy


def _fmt(a):
    return "x".join(str(n) for n in (a.shape if a.ndim > 1 else (1,) + a.shape))


class Linear(Function):
    @staticmethod
    def forward(ctx, x, weight, bias=None):
        check_same_device("linear", x, weight, bias)
        a, w = x.array, weight.array
        if w.ndim != 2 or a.ndim == 0 or a.shape[-1] != w.shape[1]:
            rows = a.size // a.shape[-1] if a.ndim and a.shape[-1] else 1
            cols = a.shape[-1] if a.ndim else 1
            raise RuntimeError(f"linear: mat1 and mat2 shapes cannot be multiplied ({rows}x{cols} and "
                               f"{'x'.join(str(n) for n in w.shape[::-1])}); expected input [..., "
                               f"{w.shape[-1] if w.ndim else '?'}] for weight {list(w.shape)}, got {list(a.shape)}")
        need = ctx.needs_input_grad
        ctx.a = a if need[1] else None   # save only what backward reads (as torch: a later in-place write
        ctx.w = w if need[0] else None   # into what was not saved fails no backward)
        # a transposed view of x (a flattened batch-inner conv output): dx in that layout too, so the reshape back
        # and the activation's backward stay copy-free (w^T g^T is the same product)
        ctx.transposed = a.ndim == 2 and isinstance(a, np.ndarray) and a.flags.f_contiguous and not \
            a.flags.c_contiguous
        out = _mm(a.reshape(-1, a.shape[-1]), w.T).reshape(a.shape[:-1] + (w.shape[0],)) if a.ndim != 2 \
            else _mm(a, w.T)
        if bias is not None:
            out += bias.array
        return out

    @staticmethod
    def backward(ctx, dout):
        g, a, w = dout.array, ctx.a, ctx.w
        need = ctx.needs_input_grad
        g2 = g.reshape(-1, g.shape[-1])
        dx = None
        if need[0]:
            if ctx.transposed:
                dx = _mm(w.T, g2.T).T
            else:
                dx = _mm(g2, w).reshape(g.shape[:-1] + (w.shape[1],))
        dw = db = None
        if need[1]:
            dw = _mm(g2.T, a.reshape(-1, a.shape[-1]))
        if len(need) > 2 and need[2]:
            db = _sum_rows(g2)
        return dx, dw, db


class LinearAct(Function):
    """activation(x @ W^T + b) on CUDA with the bias and activation in the GEMM's epilogue (backend/cuda/linear.py)."""

    @staticmethod
    def forward(ctx, x, weight, bias, activation):
        a = x.array
        lead = a.shape[:-1]
        out, ctx.saved = cuda_linear.linear_act_forward(a.reshape(-1, a.shape[-1]), weight.array,
                                                    None if bias is None else bias.array, activation)
        ctx.shape = a.shape
        return out.reshape(lead + (weight.array.shape[0],))

    @staticmethod
    def backward(ctx, dout):
        g = dout.array
        dx, dw, db = cuda_linear.linear_act_backward(g.reshape(-1, g.shape[-1]), ctx.saved, ctx.needs_input_grad[:3])
        return (None if dx is None else dx.reshape(ctx.shape)), dw, db, None


class LinearChain(Function):
    """act_L(... act_1(x @ W_1^T + b_1) ...) on CUDA as one launch forward and two backward (backend/cuda/linear.py:
    linear_chain_*). Inputs: x, the activations (a tuple), flatten (x [N, ...] read as [N, d0], as x.flatten(1);
    else as [..., d0]), then weight, bias per layer (a bias may be None). Where x is the output of a convolution
    that pooled in its epilogue (Conv2dActPool; the engine offers "conv_g") and flatten, dx is written as that
    convolution's g through the pooling (linear_chain_backward's `into`), so its pooling's backward kernel does
    not run."""
    makes_prepared = True

    @staticmethod
    def forward(ctx, x, activations, flatten, *params):
        a = x.array
        layers = [(params[2 * i].array, None if params[2 * i + 1] is None else params[2 * i + 1].array, act)
                  for i, act in enumerate(activations)]
        rows = a.reshape(a.shape[0], -1) if flatten else a.reshape(-1, a.shape[-1])
        # hold: the launch may wait for the op after it (linear_chain marks the output; autograd/held.py)
        out, ctx.saved = cuda_chain.linear_chain_forward(rows, layers, save=True in ctx.needs_input_grad, hold=True)
        ctx.shape = a.shape
        return out if flatten or a.ndim == 2 else out.reshape(a.shape[:-1] + (out.shape[-1],))

    @staticmethod
    def backward(ctx, dout):
        g = dout.array
        need = ctx.needs_input_grad
        needs = [(need[3 + 2 * i], need[4 + 2 * i]) for i in range(len(ctx.saved.weights))]
        dx, grads = cuda_chain.linear_chain_backward(g.reshape(-1, g.shape[-1]), ctx.saved, need[0], needs,
                                                      offered_producer(ctx),
                                                      takes_plainly(ctx, range(3, len(ctx.inputs))))
        if isinstance(dx, cuda_chain.ProducerGrad):   # written as the producing convolution's g
            dx = Prepared("conv_g", dx)
        elif dx is not None:
            dx = dx.reshape(ctx.shape)
        return (dx, None, None) + tuple(v for pair in grads for v in pair)


def _fused_chain(x, layers, flatten=False):
    """Whether LinearChain takes these [(weight, bias, activation), ...]: CUDA float input (at least 2-D where
    flatten), every weight 2-D of the input's dtype and each layer's input width its predecessor's output width
    (the first's the input's last dim, or its dims after the first where flatten), biases matching, and a chain
    the kernels take (cuda_chain.chain_rows). Anything else runs layer by layer (which raises the clear
    errors)."""
    a = x.array
    if not (x.is_cuda and a.dtype.kind == "f" and a.ndim >= (2 if flatten else 1) and a.size > 0):
        return False
    widths = [a.size // a.shape[0] if flatten else a.shape[-1]]
    for w, b, _ in layers:
        wa = w.array
        if (wa.ndim != 2 or wa.dtype != a.dtype or wa.shape[1] != widths[-1] or not w.is_cuda
                or (b is not None and (b.array.ndim != 1 or b.array.shape[0] != wa.shape[0]
                                       or b.array.dtype != a.dtype))):
            return False
        widths.append(wa.shape[0])
    return cuda_chain.chain_rows(a.size // widths[0], widths, a.dtype.itemsize) is not None


def linear_chain(input, layers, flatten=False):  # noqa: A002
    """act_L(... act_1(input @ W_1^T + b_1) ...) for layers [(weight, bias or None, activation), ...], activation
    None, 'relu', 'gelu' or 'gelu_tanh' each: on CUDA one fused op per run of up to CHAIN.max_layers layers where the
    chain kernels take it; else linear_act layer by layer (the same values up to float rounding). flatten: the
    chain of input.flatten(1) (flattened inside the op, so that its backward can hand a pooled convolution before
    it its g: LinearChain)."""
    layers = list(layers)
    x = input
    step = max(cuda_chain.CHAIN.max_layers, 1)
    for start in range(0, len(layers), step):
        part = layers[start:start + step]
        flat = flatten and start == 0
        if len(part) > 1 and _fused_chain(x, part, flat):
            check_same_device("linear", x, *(t for w, b, _ in part for t in (w, b)))
            x = held.mark(LinearChain.apply(x, tuple(act for _, _, act in part), flat,
                                            *(t for w, b, _ in part for t in (w, b))))
        else:
            if flat:
                x = x.flatten(1)
            for w, b, act in part:
                x = linear_act(x, w, b, act)
    return x


def _fused_linear(x, weight):
    """Whether LinearAct takes linear(x, weight): CUDA float input of the weight's dtype and a matching last dim (the
    plain op raises the clear errors otherwise)."""
    a, w = x.array, weight.array
    return (x.is_cuda and a.ndim > 0 and a.dtype.kind == "f" and w.ndim == 2 and a.shape[-1] == w.shape[-1]
            and a.dtype == w.dtype)


def linear_act(input, weight, bias=None, activation=None):  # noqa: A002
    """activation(linear(input, weight, bias)), activation None, 'relu', 'gelu' or 'gelu_tanh': fused on CUDA
    (the bias and activation inside the layer's kernels each way), composed on the CPU."""
    if not _fused_linear(input, weight):
        return apply_named(Linear.apply(input, weight, bias), activation)
    check_same_device("linear", input, weight, bias)
    return LinearAct.apply(input, weight, bias, activation)


def matmul(a, b):
    return MatMul.apply(a, b)


def mm(a, b):
    if a.array.ndim != 2 or b.array.ndim != 2:
        raise RuntimeError(f"mm: expected 2-D tensors, got {a.array.ndim}-D and {b.array.ndim}-D")
    return MatMul.apply(a, b)


def bmm(a, b):
    if a.array.ndim != 3 or b.array.ndim != 3:
        raise RuntimeError(f"bmm: expected 3-D tensors, got {a.array.ndim}-D and {b.array.ndim}-D")
    return MatMul.apply(a, b)


def linear(input, weight, bias=None):  # noqa: A002
    """x @ W^T + b. On CUDA the fused layer of backend/cuda/linear.py (one launch each way for small layers),
    deferred so that an activation and further linear layers may join it (ops/fusion.py)."""
    if type(input) is pending.PendingTensor:
        out = pending.absorb(input, "linear", weight, bias)
        if out is not None:
            return out
    if _fused_linear(input, weight):
        check_same_device("linear", input, weight, bias)
        return pending.defer("linear", run_layers, (input, ((weight, bias, None),), False))
    return Linear.apply(input, weight, bias)


def run_layers(input, layers, flatten):  # noqa: A002
    """linear_chain's value for [(weight, bias, activation), ...]: one fused layer where there is one."""
    if len(layers) == 1:
        w, b, act = layers[0]
        return linear_act(input.flatten(1) if flatten else input, w, b, act)
    return linear_chain(input, layers, flatten)


_ = xp_of

"""2-D convolution with torch.nn.functional.conv2d's signature: im2col + one GEMM forward; GEMMs + col2im back.

Images go through the GEMMs batch-innermost ([C, H, W, N], see backend/cpu.py); the output is handed back as an
[N, C, H, W]-shaped view of that memory, so a following conv or pool reads it without a transpose copy.
"""
import operator

import numpy as np

from ..autograd import pending
from ..autograd.engine import Prepared, takes_plainly
from ..autograd.function import Function
from ..backend import cpu, metadata_cache
from ..backend.conv_geometry import conv_ints as _ints
from ..backend.conv_geometry import conv_padding as _padding
from ..backend.cuda import conv as cuda_conv
from ..backend.cuda import linear as cuda_linear
from ..backend.cuda import pool as cuda_pool
from ..tensor import Tensor
from ._util import check_same_device, offered_producer, xp_of
from .activation import apply_named
from .matmul import linear
from .pool import _geometry, act_max_pool2d, max_pool2d


def _shape(a):
    return list(a.shape)


def _check(x, w, b, stride, padding, dilation, groups):
    """Validate everything before any work; returns (stride, pads, dilation, groups) normalized. A pure function of
    the arrays' shapes and dtypes and the arguments, so it is cached on those (an eager step repeats it per call)."""
    return _check_metadata(x.shape, w.shape, None if b is None else b.shape, x.dtype, w.dtype,
                           None if b is None else b.dtype, stride, padding, dilation, groups)


@metadata_cache
def _check_metadata(x_shape, w_shape, b_shape, x_dtype, w_dtype, b_dtype, stride, padding, dilation, groups):
    x, w = _Meta(x_shape, x_dtype), _Meta(w_shape, w_dtype)
    b = None if b_shape is None else _Meta(b_shape, b_dtype)
    if x.ndim not in (3, 4):
        raise RuntimeError(f"conv2d: expected 3D (unbatched) or 4D (batched) input, but got input of size: "
                           f"{_shape(x)}")
    if w.ndim != 4:
        raise RuntimeError(f"conv2d: expected a 4D weight [out_channels, in_channels/groups, kH, kW], got weight "
                           f"{_shape(w)}")
    stride, dilation = _ints("stride", stride), _ints("dilation", dilation)
    if min(stride) <= 0:
        raise RuntimeError(f"conv2d: non-positive stride is not supported, got stride={list(stride)}")
    if min(dilation) <= 0:
        raise RuntimeError(f"conv2d: non-positive dilation is not supported, got dilation={list(dilation)}")
    pads = _padding(padding, stride, dilation, w.shape[2:])
    groups = operator.index(groups)
    if groups <= 0:
        raise RuntimeError(f"conv2d: non-positive groups is not supported, got groups={groups}")
    o, cg = w.shape[:2]
    if o < groups or o % groups:
        raise RuntimeError(f"conv2d: Given groups={groups}, expected weight to be divisible by {groups} at "
                           f"dimension 0, but got weight of size {_shape(w)}")
    xs = x.shape if x.ndim == 4 else (1,) + x.shape
    if xs[1] != cg * groups:
        raise RuntimeError(f"conv2d: expected input with {cg * groups} channels (weight {_shape(w)}, groups={groups})"
                           f", got input {list(xs)}")
    if b is not None and (b.ndim != 1 or b.shape[0] != o):
        raise RuntimeError(f"conv2d: expected bias to be 1-dimensional with {o} elements (weight {_shape(w)}), "
                           f"but got bias of size {_shape(b)}")
    for name, a in (("weight", w), ("bias", b)):
        if a is not None and a.dtype != x.dtype:
            raise RuntimeError(f"conv2d: expected {name} to have the input's dtype {x.dtype}, got {a.dtype}")
    padded = (xs[2] + pads[0] + pads[1], xs[3] + pads[2] + pads[3])
    extent = tuple(d * (k - 1) + 1 for d, k in zip(dilation, w.shape[2:]))
    if padded[0] < extent[0] or padded[1] < extent[1]:
        raise RuntimeError(f"conv2d: Calculated padded input size per channel: ({padded[0]} x {padded[1]}). "
                           f"Kernel size: ({extent[0]} x {extent[1]}). Kernel size can't be greater than actual "
                           f"input size")
    return stride, pads, dilation, groups


def _out_hw(hw, kernel, stride, pads, dilation):
    """(OH, OW) of a convolution of an (H, W) input, pads = (top, bottom, left, right) as _check returns them."""
    return tuple((size + p0 + p1 - d * (k - 1) - 1) // s + 1
                 for size, p0, p1, d, k, s in zip(hw, pads[0::2], pads[1::2], dilation, kernel, stride))


class Conv2d(Function):
    """out[n, o] = sum over c in o's group, i, j of w[o, c, i, j] * xpad[n, c, oh*s + i*d, ow*s + j*d] + b[o]."""

    @staticmethod
    def forward(ctx, input, weight, bias, stride, pads, dilation, groups, activation=None):
        x, w = input.array, weight.array
        unbatched = x.ndim == 3
        if unbatched:
            x = x[None]
        if not isinstance(x, np.ndarray):
            # CUDA: the tile, direct, implicit-GEMM or im2col + GEMM kernels (smalltrain/backend/cuda/conv/)
            if x.dtype.kind != "f":   # torch convolves integers on the CPU only
                raise NotImplementedError(f"conv2d: the CUDA convolution supports float32 and float64 input, "
                                          f"got {x.dtype}")
            out, ctx.kernel_saved = cuda_conv.conv2d_forward(
                x, w, None if bias is None else bias.array, stride, pads, dilation, groups, activation=activation,
                needs_input_grad=ctx.needs_input_grad[:3])
            ctx.unbatched = unbatched
            return out[0] if unbatched else out
        if activation is not None:
            raise RuntimeError("conv2d: a fused activation runs on CUDA only (conv2d_act composes it on the CPU)")
        n, _, h, wd = x.shape
        o, cg, kh, kw = w.shape
        out_hw = _out_hw((h, wd), (kh, kw), stride, pads, dilation)
        xpad = cpu.pad_batch_inner(x, pads)
        cols = cpu.im2col(xpad, (kh, kw), stride, dilation, out_hw, groups)
        # weight rows in the (kh, kw, c) order of the cols rows
        og = o // groups
        w2 = w.reshape(groups, og, cg, kh, kw).transpose(0, 1, 3, 4, 2).reshape(groups, og, kh * kw * cg)
        out = cpu.matmul_long_n(w2[0], cols[0]) if groups == 1 else w2 @ cols
        out = out.reshape(o, out_hw[0], out_hw[1], n)
        if bias is not None:
            out += bias.array[:, None, None, None]
        need = ctx.needs_input_grad
        ctx.geom = (xpad.shape, (kh, kw), stride, dilation, out_hw, groups, pads, (h, wd), unbatched)
        ctx.cols = cols if need[1] else None
        ctx.w2 = w2 if need[0] else None
        out = out.transpose(3, 0, 1, 2)
        return out[0] if unbatched else out

    @staticmethod
    def prepared_kind(ctx):
        """On CUDA (batched) the next layer may hand this one its g ready-made (autograd.engine.Prepared, kind
        "conv_g": a backend.cuda.conv.ProducerGrad, the output's gradient times the activation's derivative, [O,
        N*OH*OW], maybe with the weight gradient's partial rows): see Conv2dActLinear."""
        return "conv_g" if hasattr(ctx, "kernel_saved") and not ctx.unbatched else None

    @staticmethod
    def backward(ctx, dout):
        if isinstance(dout, Prepared):   # the next layer wrote g (prepared_kind), maybe our dw's rows or sums
            return cuda_conv.conv2d_backward(None, ctx.kernel_saved, g=dout.value.g, wpartial=dout.value.wpartial,
                                             wgrad_beside=takes_plainly(ctx, (1, 2)))
        if hasattr(ctx, "kernel_saved"):
            dx, dw, db = cuda_conv.conv2d_backward(dout.array[None] if ctx.unbatched else dout.array, ctx.kernel_saved,
                                                   wgrad_beside=takes_plainly(ctx, (1, 2)))
            return (dx[0] if ctx.unbatched and dx is not None else dx), dw, db
        padded_shape, kernel, stride, dilation, out_hw, groups, pads, (h, wd), unbatched = ctx.geom
        g = dout.array[None] if unbatched else dout.array
        xp = xp_of(g)
        o, cols_n = g.shape[1], g.shape[0] * out_hw[0] * out_hw[1]
        gt = xp.ascontiguousarray(g.transpose(1, 2, 3, 0)).reshape(groups, o // groups, cols_n)
        need = ctx.needs_input_grad
        dx = dw = db = None
        if need[2]:
            # a GEMV with a ones vector: OpenBLAS sums LeNet's [6, 36864] rows ~3x faster than NumPy's reduction
            # (75 -> 21 us; [16, 4096]: 23 -> 6 us)
            g2 = gt.reshape(o, cols_n)
            db = g2 @ cpu.ones(cols_n, g.dtype) if xp is np else g2.sum(axis=1)
        if need[1]:
            cols = ctx.cols
            # (cols @ gt^T)^T rather than gt @ cols^T: the same product, measured 1.4-1.9x faster in OpenBLAS for
            # these long-K, tiny-output shapes (LeNet's two convolutions)
            dw2 = cpu.matmul_long_k(cols[0], gt[0].T).T if groups == 1 else \
                (cols @ gt.transpose(0, 2, 1)).transpose(0, 2, 1)
            cg = padded_shape[0] // groups
            dw = dw2.reshape(o, kernel[0], kernel[1], cg).transpose(0, 3, 1, 2)
        if need[0]:
            w2, k = ctx.w2, ctx.w2.shape[2]
            if groups == 1:
                dcols = xp.matmul(w2[0].T, gt[0], out=cpu.scratch(xp, (k, cols_n), g.dtype))
            else:
                dcols = xp.matmul(w2.transpose(0, 2, 1), gt, out=cpu.scratch(xp, (groups, k, cols_n), g.dtype))
            dxpad = cpu.col2im(dcols, padded_shape, kernel, stride, dilation, out_hw, groups)
            dx = dxpad[:, pads[0]:pads[0] + h, pads[2]:pads[2] + wd].transpose(3, 0, 1, 2)
            if unbatched:
                dx = dx[0]
        return dx, dw, db


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """torch.nn.functional.conv2d: input [N, C, H, W] or [C, H, W], weight [O, C/groups, kH, kW], bias [O]."""
    check_same_device("conv2d", input, weight, bias)
    x = input.array
    stride, pads, dilation, groups = _check(x, weight.array, None if bias is None else bias.array,
                                            stride, padding, dilation, groups)
    if type(x) is not np.ndarray and x.ndim == 4 and x.dtype.kind == "f" and dilation == (1, 1) and groups == 1:
        # on CUDA the op after it may absorb it (an activation, then max pooling, flatten, linear: ops/fusion.py)
        return pending.defer("conv", Conv2d.apply, (input, weight, bias, stride, pads, dilation, groups, None))
    return Conv2d.apply(input, weight, bias, stride, pads, dilation, groups)


def conv2d_act(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, activation=None):
    """activation(conv2d(...)) with activation None, 'relu', 'gelu' or 'gelu_tanh'; on CUDA the bias and the
    activation run in the convolution's epilogue kernel (and its derivative in the backward's), on the CPU it is
    conv2d followed by the activation op. Same values either way, up to float32 rounding."""
    if not input.is_cuda or activation is None:
        return apply_named(conv2d(input, weight, bias, stride, padding, dilation, groups), activation)
    check_same_device("conv2d", input, weight, bias)
    stride, pads, dilation, groups = _check(input.array, weight.array, None if bias is None else bias.array,
                                            stride, padding, dilation, groups)
    return Conv2d.apply(input, weight, bias, stride, pads, dilation, groups, activation)


class Conv2dActPool(Function):
    """max_pool2d(activation(conv2d(x))) on CUDA: one kernel where tile_conv's pooling epilogue takes it (2x2
    windows at stride 2 tiling the output), else the convolution kernels, then the pooling kernel; backward one
    kernel for the pooling's gradient times the activation's derivative (backend/cuda/pool.py) feeding the
    convolution's gradient kernels directly. The activated, unpooled output is not kept. Where it pooled in the
    epilogue, the next layer (a convolution, or the linear chain reading the output flattened: LinearChain) may
    hand it its g ready-made, through the pooling's backward ("conv_g", as Conv2d's), so the pooling's backward
    kernel does not run; and where x comes from another CUDA convolution, its input gradient is written as that
    one's g the same way (conv2d_backward's `into`, as Conv2dActLinear's)."""
    makes_prepared = True

    @staticmethod
    def forward(ctx, input, weight, bias, stride, pads, dilation, groups, activation, pool):
        k, s, p, d, ceil_mode = pool
        out, ctx.kernel_saved = cuda_conv.conv2d_forward(
            input.array, weight.array, None if bias is None else bias.array, stride, pads, dilation, groups,
            activation=activation, needs_input_grad=ctx.needs_input_grad[:3], pool=(k, s, p, d))
        if ctx.kernel_saved.pool is not None:   # pooled in the convolution's epilogue
            ctx.pool_saved = ctx.kernel_saved.pool
            return out
        pooled, _, ctx.pool_saved = cuda_pool.max_pool2d_forward(out, k, s, p, d, ceil_mode)
        return pooled

    @staticmethod
    def prepared_kind(ctx):
        """"conv_g" (see Conv2d.prepared_kind) where the pooling ran in the convolution's epilogue: conv2d_backward
        then writes the g through it."""
        return "conv_g" if ctx.kernel_saved.pool is not None else None

    @staticmethod
    def backward(ctx, dout):
        saved = ctx.kernel_saved
        g = wpartial = dpool = None
        if isinstance(dout, Prepared):   # the next layer wrote g (prepared_kind), maybe our dw's rows or sums
            g, wpartial = dout.value.g, dout.value.wpartial
        elif saved.pool is not None:   # pooled in the epilogue: conv2d_backward takes the pooled gradient
            dpool = dout.array
        else:
            g = cuda_pool.max_pool2d_backward_act(dout.array, ctx.pool_saved, saved.y, saved.bias, saved.activation)
        # the g handed to us (by the chain, or another convolution) or made from the pooled gradient: either way our
        # input gradient may be written as the producer's g in turn (LeNet-5: the chain -> the second convolution ->
        # the first)
        return _into_producer(ctx, saved, g, wpartial, dpool)


def _into_producer(ctx, saved, g, wpartial=None, dpool=None):
    """conv2d_backward from g (or dpool), its input gradient written as the producing convolution's g (a Prepared
    "conv_g") where the engine offered that kind for the input (the producer's prepared_kind, this node its only
    consumer)."""
    dx, dw, db = cuda_conv.conv2d_backward(None, saved, g=g, wpartial=wpartial, into=offered_producer(ctx),
                                           wgrad_beside=takes_plainly(ctx, (1, 2)), dpool=dpool)
    return (Prepared("conv_g", dx) if isinstance(dx, cuda_conv.ProducerGrad) else dx), dw, db


class _Meta:
    """What the checks read of an array: its shape, ndim and dtype (for _check_metadata, and for the pooling's
    geometry checks on the convolution's output, which is not made yet)."""

    def __init__(self, shape, dtype=None):
        self.shape, self.ndim, self.dtype = tuple(shape), len(shape), dtype


def conv2d_act_pool(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, activation=None,  # noqa: A002
                    kernel_size=2, pool_stride=None, pool_padding=0, pool_dilation=1, ceil_mode=False):
    """max_pool2d(activation(conv2d(input, ...)), kernel_size, pool_stride, ...): fused on CUDA for a batched float
    input (Conv2dActPool), else conv2d then act_max_pool2d (the activation and pooling one op on the CPU). Every
    argument is checked before a kernel runs."""
    x = input.array
    if not input.is_cuda:
        return act_max_pool2d(conv2d(input, weight, bias, stride, padding, dilation, groups), activation,
                              kernel_size, pool_stride, pool_padding, pool_dilation, ceil_mode)
    if x.ndim != 4 or x.dtype.kind != "f":
        return max_pool2d(conv2d_act(input, weight, bias, stride, padding, dilation, groups, activation),
                          kernel_size, pool_stride, pool_padding, pool_dilation, ceil_mode)
    check_same_device("conv2d", input, weight, bias)
    stride, pads, dilation, groups = _check(x, weight.array, None if bias is None else bias.array, stride, padding,
                                            dilation, groups)
    pool, _ = act_pool_geometry(x.shape, weight.array.shape, stride, pads, dilation, kernel_size, pool_stride,
                                pool_padding, pool_dilation, ceil_mode)
    return Conv2dActPool.apply(input, weight, bias, stride, pads, dilation, groups, activation, pool)


def act_pool_geometry(x_shape, w_shape, stride, pads, dilation, kernel_size, pool_stride, pool_padding,
                      pool_dilation, ceil_mode):
    """((k, s, p, d, ceil_mode), (OH, OW)) of the pooling after a convolution of checked geometry (the pooling's
    checks run on the convolution's output shape, which is not made yet)."""
    out_hw = _out_hw(x_shape[2:], w_shape[2:], stride, pads, dilation)
    k, s, p, d, pooled = _geometry("max_pool2d", _Meta((x_shape[0], w_shape[0]) + out_hw), kernel_size,
                                   pool_stride, pool_padding, pool_dilation, ceil_mode)
    return (k, s, p, d, bool(ceil_mode)), pooled


class Conv2dActLinear(Function):
    """linear(flatten(activation(conv2d(x))), W, b) on CUDA: the convolution's kernels, then the linear layer's on
    the output viewed as [N, O*OH*OW]; backward the linear layer's kernel writes the convolution's g (its output's
    gradient times the activation's derivative, in the layout conv2d_backward takes: backend/cuda/linear.py
    linear_backward_into_conv), so the transpose-and-derivative kernel between the two layers is not run. Where x
    comes from another CUDA convolution with no other consumer (the engine offers "conv_g"), the input gradient is
    written as that convolution's g the same way (conv2d_backward's `into`).
    Inputs: x, conv weight, conv bias, the geometry, the activation, linear weight, linear bias."""
    makes_prepared = True

    @staticmethod
    def forward(ctx, input, weight, bias, stride, pads, dilation, groups, activation, lin_weight, lin_bias):
        need = ctx.needs_input_grad
        x, lw = input.array, lin_weight.array
        lb = None if lin_bias is None else lin_bias.array
        m, (f, k) = x.shape[0], lw.shape
        # the convolution's epilogue computes the linear layer too where it can (conv2d_forward's `linear`)
        out, ctx.conv_saved, y = cuda_conv.conv2d_forward(
            x, weight.array, None if bias is None else bias.array, stride, pads, dilation, groups,
            activation=activation, needs_input_grad=need[:3],
            keep_pre_activation=cuda_linear.into_conv_needs_pre_activation(m, k, f, activation), linear=(lw, lb))
        if y is None:
            y, ctx.lin_saved = cuda_linear.linear_act_forward(out.reshape(m, -1), lw, lb)
        else:
            ctx.lin_saved = cuda_linear.LinearSaved(out.reshape(m, -1), lw, lb, None, None)
        return y

    @staticmethod
    def backward(ctx, dout):
        need = ctx.needs_input_grad
        conv_saved = ctx.conv_saved
        g, dlw, dlb = cuda_linear.linear_backward_into_conv(dout.array, ctx.lin_saved, conv_saved,
                                                           (any(need[:3]), need[8], need[9]))
        dx = dw = db = None
        if g is not None:
            dx, dw, db = _into_producer(ctx, conv_saved, g)
        return dx, dw, db, None, None, None, None, None, dlw, dlb


def conv2d_act_linear(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, activation=None,  # noqa: A002
                      lin_weight=None, lin_bias=None):
    """linear(flatten(activation(conv2d(input, ...))), lin_weight, lin_bias): fused on CUDA for a batched float
    input whose flattened convolution output matches lin_weight [F, O*OH*OW] (Conv2dActLinear), composed of the
    separate ops otherwise (which raise the clear errors). Every argument is checked before a kernel runs."""
    x = input.array
    if input.is_cuda and x.ndim == 4 and x.dtype.kind == "f":
        check_same_device("conv2d", input, weight, bias, lin_weight, lin_bias)
        stride, pads, dilation, groups = _check(x, weight.array, None if bias is None else bias.array, stride,
                                                padding, dilation, groups)
        if act_linear_fits(x.shape, weight.array.shape, stride, pads, dilation, lin_weight, lin_bias, x.dtype):
            return Conv2dActLinear.apply(input, weight, bias, stride, pads, dilation, groups, activation, lin_weight,
                                         lin_bias)
    out = conv2d_act(input, weight, bias, stride, padding, dilation, groups, activation)
    return linear(out.reshape(out.shape[0], -1), lin_weight, lin_bias)   # nn.Flatten()'s start_dim 1


def act_linear_fits(x_shape, w_shape, stride, pads, dilation, lin_weight, lin_bias, dtype):
    """Whether Conv2dActLinear takes linear layer (lin_weight, lin_bias) after a convolution of checked geometry
    (linear_fits of its flattened output)."""
    oh, ow = _out_hw(x_shape[2:], w_shape[2:], stride, pads, dilation)
    return linear_fits(w_shape[0] * oh * ow, lin_weight, lin_bias, dtype)


def linear_fits(width, weight, bias, dtype):
    """Whether linear(x, weight, bias) may join, on CUDA, a fused op whose output has rows of `width` elements of
    `dtype`: weight a CUDA tensor [F, width] and bias [F] or None, of that dtype (else the plain linear raises the
    clear error)."""
    if not isinstance(weight, Tensor) or not (bias is None or isinstance(bias, Tensor)):
        return False
    w, b = weight.array, None if bias is None else bias.array
    return (type(w) is not np.ndarray and w.ndim == 2 and w.shape[1] == width and w.dtype == dtype
            and (b is None or (type(b) is type(w) and b.shape == (w.shape[0],) and b.dtype == dtype)))

"""Normalization as fused Functions: batch_norm (batch statistics and in-place running-stat updates in training,
running statistics in eval) and layer_norm. Each backward is one closed-form pass, never a chain of ops.
"""
import numpy as np

from ..autograd import pending
from ..autograd.function import Function
from ..backend.cuda import norm as cuda_norm
from ._util import check_same_device, xp_of
from .activation import expect_tensor


def _quiet():
    # the statistics of an empty batch are NaN (as in torch); NumPy would also warn
    return np.errstate(divide="ignore", invalid="ignore")


def _standardize(xp, a, axes, eps):
    """(x - mean) / sqrt(var + eps) over `axes` with the biased variance, two-pass; also mean, var, 1/std."""
    if a.size == 0:   # NaN statistics, as torch's, without NumPy's "mean of empty slice" warning
        stat = xp.full([1 if i in axes else n for i, n in enumerate(a.shape)], np.nan, a.dtype)
        return a.copy(), stat, stat, stat
    mean = a.mean(axis=axes, keepdims=True)
    xhat = a - mean
    var = (xhat * xhat).mean(axis=axes, keepdims=True)
    invstd = 1 / xp.sqrt(var + eps)
    xhat *= invstd
    return xhat, mean, var, invstd


def _affine(xhat, w, b):
    y = xhat if w is None else xhat * w
    return y if b is None else y + b


_KERNEL_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _on_kernel(a, running_mean, running_var, weight, bias, training):
    """Whether the CUDA kernels cover this call: float32/64 throughout, a non-empty batch, and running statistics
    that can be updated in place (contiguous) when training."""
    if isinstance(a, np.ndarray) or a.dtype not in _KERNEL_FLOATS or a.size == 0:
        return False
    for t in (running_mean, running_var, weight, bias):
        if t is not None and t.array.dtype != a.dtype:
            return False
    return not training or running_mean is None or (running_mean.array.flags.c_contiguous and
                                                    running_var.array.flags.c_contiguous)


class BatchNorm(Function):
    """batch_norm, on CUDA optionally followed by an activation in the same kernels (the fusion rule of
    batch_norm -> relu/gelu: ops/fusion.py)."""

    @staticmethod
    def forward(ctx, x, running_mean, running_var, weight, bias, training, momentum, eps, activation=None):
        a = x.array
        if _on_kernel(a, running_mean, running_var, weight, bias, training):
            # CUDA: statistics, the running-stat update, normalization and activation (backend/cuda/norm.py)
            arrays = [None if t is None else t.array for t in (running_mean, running_var, weight, bias)]
            y, ctx.kernel_saved = cuda_norm.batch_norm_forward(a, *arrays, training=training, momentum=momentum,
                                                             eps=eps, activation=activation)
            return y
        if activation is not None:
            raise RuntimeError(f"batch_norm: a fused activation ({activation}) needs the CUDA kernels")
        # in x's own layout (a convolution's output may be batch-inner): per-channel sums over the other axes,
        # broadcast back through [1, C, 1, ...]; the output is written over x * scale (scale = invstd * weight)
        c = a.shape[1]
        axes = (0,) + tuple(range(2, a.ndim))
        bshape = (1, c) + (1,) * (a.ndim - 2)
        count = a.size // c if c else 0
        xp = xp_of(a)
        with _quiet():
            if training:
                mean = a.sum(axis=axes) / count
                centered = a - mean.astype(a.dtype).reshape(bshape)
                var = xp.square(centered).sum(axis=axes) / count
                if running_mean is not None and a.size:
                    _update(running_mean.array, mean, momentum)
                    # running_var tracks the unbiased variance, normalization uses the biased one
                    _update(running_var.array, var * (count / (count - 1)), momentum)
            else:
                centered = a - running_mean.array.reshape(bshape)
                var = running_var.array
            invstd = (1 / xp.sqrt(var + eps)).astype(a.dtype, copy=False)
        scale = invstd if weight is None else invstd * weight.array
        ctx.centered, ctx.invstd, ctx.weight, ctx.training = centered, invstd, weight, training
        ctx.axes, ctx.bshape, ctx.count = axes, bshape, max(count, 1)
        y = centered * scale.reshape(bshape)
        if bias is not None:
            y += bias.array.reshape(bshape)
        return y

    @staticmethod
    def backward(ctx, dout):
        need = ctx.needs_input_grad
        if hasattr(ctx, "kernel_saved"):
            wanted = (need[0], len(need) > 3 and need[3], len(need) > 4 and need[4])
            dx, dw, db = cuda_norm.batch_norm_backward(dout.array, ctx.kernel_saved, needs_input_grad=wanted)
            return dx, None, None, dw, db, None, None, None, None
        g, centered, invstd, weight = dout.array, ctx.centered, ctx.invstd, ctx.weight
        axes, bshape, count = ctx.axes, ctx.bshape, ctx.count
        sum_g = g.sum(axis=axes)
        # sum(g * xhat), xhat = centered * invstd (an empty batch: zeros, the sum of nothing, its statistics NaN)
        sum_gx = (g * centered).sum(axis=axes) * invstd if g.size else sum_g
        dx = None
        if need[0]:
            k = invstd if weight is None else invstd * weight.array
            dx = g * k.reshape(bshape)
            if ctx.training:   # dx = k * (g - mean(g) - xhat * mean(g * xhat))
                dx -= (k * sum_g / count).reshape(bshape)
                dx -= centered * (k * invstd * sum_gx / count).reshape(bshape)
        dw = sum_gx if len(need) > 3 and need[3] else None
        db = sum_g if len(need) > 4 and need[4] else None
        return dx, None, None, dw, db, None, None, None, None


def _update(stat, value, momentum):
    """stat <- (1 - momentum) * stat + momentum * value, in place (buffers keep their identity)."""
    stat *= 1 - momentum
    stat += (momentum * value).astype(stat.dtype, copy=False)


def _check_size(op, what, t, c):
    if t is not None and t.array.size != c:
        raise RuntimeError(f"{op}: {what} should contain {c} elements not {t.array.size} (shape "
                           f"{list(t.array.shape)})")


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-5):
    expect_tensor("batch_norm", input)
    a = input.array
    check_same_device("batch_norm", input, running_mean, running_var, weight, bias)
    if not isinstance(momentum, (int, float)) or isinstance(momentum, bool):
        raise TypeError(f"batch_norm(): argument 'momentum' must be float, not {type(momentum).__name__}")
    if a.ndim < 2:
        raise RuntimeError(f"batch_norm: expected input [N, C, ...] with at least 2 dims, got {list(a.shape)}")
    if a.dtype.kind != "f":
        raise NotImplementedError(f"batch_norm: not implemented for {input.dtype} input; expected a floating "
                                  "point tensor")
    c = a.shape[1]
    if training and a.size // max(c, 1) == 1:
        raise ValueError(f"Expected more than 1 value per channel when training, got input size {list(a.shape)}")
    if not training and (running_mean is None or running_var is None):
        raise RuntimeError("batch_norm: running_mean and running_var must be defined in evaluation mode")
    if (running_mean is None) != (running_var is None):
        raise RuntimeError("batch_norm: running_mean and running_var must both be given or both be None")
    for what, t in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight),
                    ("bias", bias)):
        _check_size("batch_norm", what, t, c)
    args = (input, running_mean, running_var, weight, bias, bool(training), float(momentum), float(eps))
    if _on_kernel(a, running_mean, running_var, weight, bias, training):
        # deferred: an activation after it may join it (ops/fusion.py); a training step's running-stat update
        # happens even if nothing reads the output, and once (the token) if the output is also read unfused
        return pending.defer("batch_norm", run_batch_norm, args + ([False],),
                             effects=bool(training) and running_mean is not None)
    return BatchNorm.apply(*args)


def run_batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps, token, activation=None):
    """BatchNorm of a deferred batch_norm (token: [whether a run of it already updated the running statistics])."""
    if token[0] and training:
        running_mean = running_var = None
    token[0] = True
    return BatchNorm.apply(x, running_mean, running_var, weight, bias, training, momentum, eps, activation)


class LayerNorm(Function):
    @staticmethod
    def forward(ctx, x, weight, bias, k, eps):
        a = x.array
        axes = tuple(range(a.ndim - k, a.ndim))
        with _quiet():
            xhat, _, _, invstd = _standardize(xp_of(a), a, axes, eps)
        w = None if weight is None else weight.array
        ctx.xhat, ctx.invstd, ctx.w, ctx.axes = xhat, invstd, w, axes
        return _affine(xhat, w, None if bias is None else bias.array)

    @staticmethod
    def backward(ctx, dout):
        g, xhat, invstd, w, axes = dout.array, ctx.xhat, ctx.invstd, ctx.w, ctx.axes
        need = ctx.needs_input_grad
        lead = tuple(range(g.ndim - len(axes)))
        dx = dw = db = None
        if need[0]:
            gw = g if w is None else g * w
            dx = invstd * (gw - gw.mean(axis=axes, keepdims=True) - xhat * (gw * xhat).mean(axis=axes,
                                                                                           keepdims=True))
        if need[1]:
            dw = (g * xhat).sum(axis=lead)
        if len(need) > 2 and need[2]:
            db = g.sum(axis=lead)
        return dx, dw, db


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    if not isinstance(normalized_shape, (tuple, list)) or \
            not all(isinstance(n, int) and not isinstance(n, bool) for n in normalized_shape):
        raise TypeError(f"layer_norm(): argument 'normalized_shape' must be tuple of ints, not "
                        f"{type(normalized_shape).__name__}")
    expect_tensor("layer_norm", input)
    shape, a = tuple(normalized_shape), input.array
    check_same_device("layer_norm", input, weight, bias)
    k = len(shape)
    if k == 0 or a.ndim < k or a.shape[a.ndim - k:] != shape:
        raise RuntimeError(f"layer_norm: Given normalized_shape={list(shape)}, expected input with shape "
                           f"[*, {', '.join(map(str, shape))}], but got input of size{list(a.shape)}")
    for what, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.array.shape != shape:
            raise RuntimeError(f"layer_norm: Expected {what} to be of same shape as normalized_shape, but got "
                               f"{what} of shape {list(t.array.shape)} and normalized_shape = {list(shape)}")
    if a.dtype.kind != "f":
        raise NotImplementedError(f"layer_norm: not implemented for {input.dtype} input; expected a floating "
                                  "point tensor")
    return LayerNorm.apply(input, weight, bias, k, float(eps))


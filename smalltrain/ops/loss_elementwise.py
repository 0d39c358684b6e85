"""Elementwise losses, each one fused Function over input and target of one shape: mse_loss, l1_loss,
smooth_l1_loss, huber_loss, kl_div, binary_cross_entropy and binary_cross_entropy_with_logits; and the reduction
helpers ('none', 'mean', 'sum' and torch's legacy size_average/reduce flags) that ops/loss.py shares.
"""
import warnings

import numpy as np

from ..autograd.function import Function
from ._util import check_same_device, check_values, xp_of
from .activation import _stable_sigmoid, expect_tensor

_EPS12 = float(np.float32(1e-12))   # torch's EPSILON in binary_cross_entropy_backward, a float constant


def _quiet():
    # 0/0 for an empty batch or all-ignored targets is NaN in torch too; NumPy would also warn about it
    return np.errstate(divide="ignore", invalid="ignore", over="ignore")


def _reduction(op, input, target, reduction, size_average=None, reduce=None):
    """The reduction string (the legacy size_average/reduce flags map onto it as in torch), after type checks."""
    expect_tensor(op, input)
    expect_tensor(op, target, "target", 2)
    if size_average is not None or reduce is not None:
        warnings.warn("size_average and reduce args will be deprecated, please use reduction= instead.",
                      UserWarning, stacklevel=3)
        sa = True if size_average is None else size_average
        reduction = "none" if reduce is False else ("mean" if sa else "sum")
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"{reduction} is not a valid value for reduction (expected 'none', 'mean' or 'sum')")
    return reduction


def _reduce(loss, reduction, denom=None):
    if reduction == "none":
        return loss
    total = loss.sum()
    if reduction == "sum":
        return total
    with _quiet():
        return total / (loss.size if denom is None else denom)


def _scale(g, reduction, denom, shape):
    """The upstream gradient as a per-element factor: g itself, a scalar, or g / denom."""
    if reduction == "none":
        return g.reshape(shape)
    with _quiet():
        return g if reduction == "sum" else g / denom


def _weighted_scale(ctx, dout):
    """_scale of an elementwise loss's backward (ctx.reduction, ctx.n), times its per-element weight ctx.w if any."""
    s = _scale(dout.array, ctx.reduction, ctx.n, dout.array.shape)
    return s if ctx.w is None else s * ctx.w


# ---- elementwise losses ---------------------------------------------------------------------------------------

def _pair(op, x, y, same_dtype=False):
    """Raw input and target in one float dtype; torch's errors for integer pairs and shapes that do not broadcast."""
    a, b = x.array, y.array
    if a.dtype.kind != "f" and b.dtype.kind != "f":
        raise NotImplementedError(f"{op}: not implemented for {x.dtype} input and {y.dtype} target; expected "
                                  "floating point tensors")
    if same_dtype and a.dtype != b.dtype:
        raise RuntimeError(f"{op}: Found dtype {b.dtype} but expected {a.dtype} (target must have the input's "
                           "dtype)")
    dt = a.dtype if b.dtype.kind != "f" else b.dtype if a.dtype.kind != "f" else np.result_type(a.dtype, b.dtype)
    try:
        np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise RuntimeError(f"{op}: The size of tensor a ({list(a.shape)}) must match the size of tensor b "
                           f"({list(b.shape)}): the shapes do not broadcast") from None
    return a.astype(dt, copy=False), b.astype(dt, copy=False)


class _Elementwise(Function):
    """loss = reduce(weight * f(input, target; params)); a subclass gives `fwd(xp, a, b, *params) -> (loss, saved)`
    and `bwd(xp, s, saved, *params) -> d input` (the target gets its negative), s being the upstream gradient
    already scaled. With a weight, 'mean' divides by sum(weight) as torch's mse/l1 do (by the element count where
    `mean_over_weight` is False, as torch's huber_loss does)."""
    mean_over_weight = True

    @staticmethod
    def forward(ctx, x, y, weight, reduction, *params):
        cls = ctx.fn
        a, b = _pair(cls.name, x, y)
        w = None if weight is None else weight.array.astype(a.dtype, copy=False)
        with _quiet():
            loss, ctx.saved = cls.fwd(xp_of(a), a, b, *params)
            if w is not None:
                loss = loss * w
        ctx.reduction, ctx.w, ctx.params = reduction, w, params
        ctx.n = loss.size if w is None or not cls.mean_over_weight else w.sum()
        return _reduce(loss, reduction, ctx.n)

    @staticmethod
    def backward(ctx, dout):
        s = _weighted_scale(ctx, dout)
        with _quiet():
            dx = ctx.fn.bwd(xp_of(dout.array), s, ctx.saved, *ctx.params)
        return dx, (-dx if ctx.needs_input_grad[1] else None), None, None


class MSELoss(_Elementwise):
    name = "mse_loss"

    @staticmethod
    def fwd(xp, a, b):
        d = a - b
        return d * d, d

    bwd = staticmethod(lambda xp, s, d: 2 * d * s)


class L1Loss(_Elementwise):
    name = "l1_loss"

    @staticmethod
    def fwd(xp, a, b):
        d = a - b
        return xp.abs(d), d

    bwd = staticmethod(lambda xp, s, d: xp.sign(d) * s)


class SmoothL1Loss(_Elementwise):
    """0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta (torch's formula and branch points)."""
    name = "smooth_l1_loss"

    @staticmethod
    def fwd(xp, a, b, beta):
        d = a - b
        z = xp.abs(d)
        return xp.where(z < beta, 0.5 * z * z / beta, z - 0.5 * beta), d

    @staticmethod
    def bwd(xp, s, d, beta):
        return xp.where(d < -beta, -s, xp.where(d > beta, s, d * s / beta))


class HuberLoss(_Elementwise):
    """0.5 d^2 where |d| < delta, else delta (|d| - 0.5 delta); torch's backward clips d to [-delta, delta]."""
    name, mean_over_weight = "huber_loss", False

    @staticmethod
    def fwd(xp, a, b, delta):
        d = a - b
        z = xp.abs(d)
        return xp.where(z < delta, 0.5 * z * z, delta * (z - 0.5 * delta)), d

    @staticmethod
    def bwd(xp, s, d, delta):
        return xp.where(d <= -delta, -s * delta, xp.where(d >= delta, s * delta, d * s))


def _pointwise_loss(fn, input, target, size_average, reduce, reduction, weight, *params):
    op = fn.name
    reduction = _reduction(op, input, target, reduction, size_average, reduce)
    check_same_device(op, input, target, weight)
    if input.array.shape != target.array.shape:
        warnings.warn(f"Using a target size ({list(target.array.shape)}) that is different to the input size "
                      f"({list(input.array.shape)}). This will likely lead to incorrect results due to "
                      "broadcasting. Please ensure they have the same size.", UserWarning, stacklevel=3)
    if weight is not None and weight.array.shape != input.array.shape:
        raise ValueError(f"{op}: Weights and input must have the same size (weight {list(weight.array.shape)}, "
                         f"input {list(input.array.shape)})")
    return fn.apply(input, target, weight, reduction, *params)


def mse_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    return _pointwise_loss(MSELoss, input, target, size_average, reduce, reduction, weight)


def l1_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    return _pointwise_loss(L1Loss, input, target, size_average, reduce, reduction, weight)


def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    if beta < 0:
        raise RuntimeError(f"smooth_l1_loss does not support negative values for beta (got beta={beta})")
    if beta == 0:   # torch's own switch: the quadratic part vanishes
        return _pointwise_loss(L1Loss, input, target, size_average, reduce, reduction, None)
    return _pointwise_loss(SmoothL1Loss, input, target, size_average, reduce, reduction, None, float(beta))


def huber_loss(input, target, reduction="mean", delta=1.0, weight=None):
    if delta <= 0:
        raise RuntimeError(f"huber_loss does not support non-positive values for delta (got delta={delta})")
    return _pointwise_loss(HuberLoss, input, target, None, None, reduction, weight, float(delta))


# ---- Kullback-Leibler divergence ------------------------------------------------------------------------------

class KLDiv(Function):
    """torch's kl_div: target * (log(target) - input) (xlogy: 0 where target is 0), or with log_target
    exp(target) * (target - input); gradients as torch's autograd derives them from those formulas."""

    @staticmethod
    def forward(ctx, x, y, reduction, log_target, denom):
        a, b = _pair("kl_div", x, y)
        xp = xp_of(a)
        with _quiet():
            if log_target:
                e = xp.exp(b)
                loss, ctx.e = e * (b - a), e
            else:
                loss = xp.where(b == 0, 0, b * xp.log(b)) - b * a
                loss = xp.where(xp.isnan(b), b, loss)   # xlogy(NaN, y) is NaN
        ctx.a, ctx.b, ctx.log_target, ctx.reduction = a, b, log_target, reduction
        ctx.n = loss.size if denom is None else denom
        return _reduce(loss, reduction, ctx.n)

    @staticmethod
    def backward(ctx, dout):
        s = _scale(dout.array, ctx.reduction, ctx.n, dout.array.shape)
        a, b = ctx.a, ctx.b
        xp = xp_of(a)
        with _quiet():
            if ctx.log_target:
                dx = -(s * ctx.e)
                dt = s * ctx.e * (b - a + 1) if ctx.needs_input_grad[1] else None
            else:
                dx = -(s * b)
                # d xlogy(t, t) / dt = xlogy(t != 0, t) + t / t: NaN at t = 0, as torch's autograd gives
                dt = s * (xp.where(b != 0, xp.log(b), 0) + b / b - a) if ctx.needs_input_grad[1] else None
        return dx, dt, None, None, None


def kl_div(input, target, size_average=None, reduce=None, reduction="mean", log_target=False):
    batchmean = reduction == "batchmean" and size_average is None and reduce is None
    reduction = _reduction("kl_div", input, target, "sum" if batchmean else reduction, size_average, reduce)
    if reduction == "mean" and size_average is None and reduce is None:
        warnings.warn("reduction: 'mean' divides the total loss by both the batch size and the support size."
                      "'batchmean' divides only by the batch size, and aligns with the KL div math definition."
                      "'mean' will be changed to behave the same as 'batchmean' in the next major release.",
                      UserWarning, stacklevel=2)
    check_same_device("kl_div", input, target)
    if batchmean and input.array.ndim:
        return KLDiv.apply(input, target, "mean", bool(log_target), input.array.shape[0])
    return KLDiv.apply(input, target, reduction, bool(log_target), None)


# ---- binary cross-entropy -------------------------------------------------------------------------------------

def _weights(op, shape, xp, dtype, *weights):
    out = []
    for w in weights:
        if w is None:
            out.append(None)
            continue
        try:
            np.broadcast_shapes(w.array.shape, shape)
        except ValueError:
            raise RuntimeError(f"{op}: weight of shape {list(w.array.shape)} does not broadcast to the input's "
                               f"shape {list(shape)}") from None
        out.append(w.array.astype(dtype, copy=False))
    return out


class BinaryCrossEntropy(Function):
    @staticmethod
    def forward(ctx, x, y, weight, reduction):
        a, b = _pair("binary_cross_entropy", x, y, same_dtype=True)
        xp = xp_of(a)
        check_values(~((a >= 0) & (a <= 1)), lambda: RuntimeError(
            "binary_cross_entropy: all elements of input should be between 0 and 1"))
        (w,) = _weights("binary_cross_entropy", a.shape, xp, a.dtype, weight)
        with _quiet():
            log_x, log_1mx = xp.log(a), xp.log1p(-a)
            loss = (b - 1) * xp.maximum(log_1mx, -100) - b * xp.maximum(log_x, -100)   # torch's clamp at -100
        if w is not None:
            loss = loss * w
        ctx.a, ctx.b, ctx.w, ctx.logit, ctx.reduction, ctx.n = a, b, w, log_1mx - log_x, reduction, loss.size
        return _reduce(loss, reduction)

    @staticmethod
    def backward(ctx, dout):
        s = _weighted_scale(ctx, dout)
        a = ctx.a
        with _quiet():
            dx = s * (a - ctx.b) / xp_of(a).maximum((1 - a) * a, _EPS12)
        return dx, s * ctx.logit, None, None


class BinaryCrossEntropyWithLogits(Function):
    @staticmethod
    def forward(ctx, x, y, weight, pos_weight, reduction):
        a, b = _pair("binary_cross_entropy_with_logits", x, y)
        xp = xp_of(a)
        w, pw = _weights("binary_cross_entropy_with_logits", a.shape, xp, a.dtype, weight, pos_weight)
        log_sig = xp.minimum(a, 0) - xp.log1p(xp.exp(-xp.abs(a)))
        lw = 1 if pw is None else (pw - 1) * b + 1
        loss = (1 - b) * a - lw * log_sig
        if w is not None:
            loss = loss * w
        ctx.a, ctx.b, ctx.w, ctx.pw, ctx.lw, ctx.log_sig = a, b, w, pw, lw, log_sig
        ctx.reduction, ctx.n = reduction, loss.size
        return _reduce(loss, reduction)

    @staticmethod
    def backward(ctx, dout):
        s = _weighted_scale(ctx, dout)
        a, b, pw = ctx.a, ctx.b, ctx.pw
        sig = _stable_sigmoid(xp_of(a), a)
        dx = s * (sig - b if pw is None else ctx.lw * sig - pw * b)
        dy = s * (-a if pw is None else -a - (pw - 1) * ctx.log_sig)
        return dx, dy, None, None, None


def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None,
                         reduction="mean"):
    reduction = _reduction("binary_cross_entropy", input, target, reduction, size_average, reduce)
    check_same_device("binary_cross_entropy", input, target, weight)
    if input.array.shape != target.array.shape:
        raise ValueError(f"binary_cross_entropy: Using a target size ({list(target.array.shape)}) that is different "
                         f"to the input size ({list(input.array.shape)}) is deprecated. Please ensure they have the "
                         "same size.")
    return BinaryCrossEntropy.apply(input, target, weight, reduction)


def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None,
                                     reduction="mean", pos_weight=None):
    reduction = _reduction("binary_cross_entropy_with_logits", input, target, reduction, size_average, reduce)
    check_same_device("binary_cross_entropy_with_logits", input, target, weight, pos_weight)
    if input.array.shape != target.array.shape:
        raise ValueError(f"binary_cross_entropy_with_logits: Target size ({list(target.array.shape)}) must be the "
                         f"same as input size ({list(input.array.shape)})")
    return BinaryCrossEntropyWithLogits.apply(input, target, weight, pos_weight, reduction)



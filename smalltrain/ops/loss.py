"""Losses over class-index targets, each one fused Function: cross_entropy (log_softmax + NLL in one pass, for class
indices or class probabilities, with weights, ignore_index and label smoothing as torch) and nll_loss. Inputs are
viewed as [N, C, M] (M = spatial size). The elementwise losses live in ops/loss_elementwise.py (re-exported here).
"""
import math

import numpy as np

from ..autograd import held, pending
from ..autograd.function import Function
from ..backend.cuda import loss as cuda_loss
from ._util import check_same_device, check_values, xp_of
from .loss_elementwise import (  # noqa: F401  (the elementwise losses are re-exported: ops.loss is the family)
    _quiet,
    _reduce,
    _reduction,
    _scale,
    binary_cross_entropy,
    binary_cross_entropy_with_logits,
    huber_loss,
    kl_div,
    l1_loss,
    mse_loss,
    smooth_l1_loss,
)


# ---- class-index targets: shared layout and checks -----------------------------------------------------------

def _class_layout(op, a, t, weight):
    """Input as [N, C, M], target as [N, M] int64 and the 'none' output shape, after torch's checks."""
    if t.dtype != np.int64 and t.dtype != np.uint8:
        raise RuntimeError(f"{op}: expected target dtype to be Long or Byte, but got {t.dtype} "
                           f"(target shape {list(t.shape)})")
    if a.ndim == 1:
        if t.ndim > 1:
            raise RuntimeError(f"{op}: 0D or 1D target tensor expected, multi-target not supported (input "
                               f"{list(a.shape)}, target {list(t.shape)})")
        if t.ndim == 1 and t.shape[0] != 1:
            raise ValueError(f"{op}: For 1D input, 1D target must have size 1, but got target size: {t.shape[0]}")
        n, c, m, out_shape = 1, a.shape[0], 1, ()
    else:
        if t.ndim == 0 or a.shape[0] != t.shape[0]:
            raise ValueError(f"{op}: Expected input batch_size ({a.shape[0]}) to match target batch_size "
                             f"({t.shape[0] if t.ndim else 0}).")
        if a.ndim == 2 and t.ndim != 1:
            raise RuntimeError(f"{op}: 0D or 1D target tensor expected, multi-target not supported (input "
                               f"{list(a.shape)}, target {list(t.shape)})")
        if a.ndim > 2 and t.shape[1:] != a.shape[2:]:
            raise RuntimeError(f"{op}: size mismatch (got input: {list(a.shape)}, target: {list(t.shape)}); "
                               f"expected target [{a.shape[0]}, {', '.join(map(str, a.shape[2:]))}]")
        n, c, m, out_shape = a.shape[0], a.shape[1], math.prod(a.shape[2:]), t.shape
    _check_weight(op, weight, c)
    return a.reshape(n, c, m), t.reshape(n, m).astype(np.int64, copy=False), out_shape


def _check_weight(op, weight, c):
    if weight is not None and (weight.array.ndim != 1 or weight.array.shape[0] != c):
        raise RuntimeError(f"{op}: weight tensor should be defined either for all {c} classes or no classes but "
                           f"got weight tensor of shape: {list(weight.array.shape)}")


def _targets(op, t2, c, weight, ignore_index, dtype):
    """Per (n, m): whether counted, a safe class index, the class weight (0 where ignored), the index arrays."""
    xp = xp_of(t2)
    valid = t2 != ignore_index
    bad = valid & ((t2 < 0) | (t2 >= c))
    check_values(bad, lambda: cuda_loss.bad_target_error(op, t2, c, ignore_index))
    valid &= ~bad   # (on a GPU the error comes at the next sync: meanwhile bad targets read class 0, weight 0)
    ts = xp.where(valid, t2, 0)
    w_t = valid.astype(dtype) if weight is None or c == 0 else xp.where(valid, weight[ts], 0).astype(dtype, copy=False)
    idx = (xp.arange(t2.shape[0])[:, None], ts, xp.arange(t2.shape[1])[None, :])
    return valid, w_t, idx


class CrossEntropy(Function):
    """Class-index targets. Forward: one shifted copy of the input, exponentiated in place after the target and
    smoothing terms are read from it. Backward: softmax * A - B (B at the targets and, with smoothing, w / C)."""

    @staticmethod
    def forward(ctx, x, target, weight, ignore_index, reduction, eps, head=None, op="cross_entropy"):
        # head: the held launch that writes x (cross_entropy), run with this loss in its epilogue by the kernel
        # path, or first; op: the name errors give (nll_loss where this is nll_loss(log_softmax(x)))
        a3, t2, out_shape = _class_layout(op, x.array, target.array, weight)
        xp, c = xp_of(a3), a3.shape[1]
        w = None if weight is None else weight.array.astype(a3.dtype, copy=False)
        if xp is not np and target.array.dtype == np.int64 and a3.size:
            # one fused kernel: log-softmax, the loss and the gradient backward only scales
            loss, ctx.kernel_saved = cuda_loss.cross_entropy_forward(x.array, target.array, w, ignore_index,
                                                                   reduction, eps, head=head, op=op)
            return loss
        if head is not None:
            head.settle()
        valid, w_t, idx = _targets(op, t2, c, w, ignore_index, a3.dtype)
        ctx.in_shape, ctx.reduction, ctx.denom = x.array.shape, reduction, w_t.sum()
        if c == 0:   # the bounds check passed, so every target is ignored: the loss is 0 (or 0/0 for 'mean')
            return _reduce(xp.zeros(out_shape, a3.dtype), reduction, ctx.denom)
        e = a3 - a3.max(axis=1, keepdims=True)
        s_t = e[idx]
        ws = (e if w is None else e * w[:, None]).sum(axis=1) if eps else None
        xp.exp(e, out=e)
        se = e.sum(axis=1)
        with _quiet():
            lse = xp.log(se)
            loss = xp.where(valid, w_t * (lse - s_t), 0)
            if eps:   # torch: (1 - eps) * nll + eps / C * smooth, smooth = -sum_c w_c log p_c (0 where ignored)
                big_w = c if w is None else w.sum()
                loss = (1 - eps) * loss + (eps / c) * xp.where(valid, big_w * lse - ws, 0)
        ctx.e, ctx.se, ctx.w, ctx.valid, ctx.w_t, ctx.idx, ctx.eps = e, se, w, valid, w_t, idx, eps
        return _reduce(loss.reshape(out_shape), reduction, ctx.denom)

    @staticmethod
    def backward_unit(ctx):
        """The gradient for `loss.backward()` without a gradient (autograd.engine.UNIT_SEED): on CUDA the forward's
        last block wrote it where the input was small (cuda_loss.cross_entropy_forward), so no kernel runs here."""
        saved = getattr(ctx, "kernel_saved", None)
        if saved is None or saved.unit is None:
            return NotImplemented
        dx, saved.unit = saved.unit, None   # handed out once: a retained graph's next pass runs backward
        return dx, None

    @staticmethod
    def backward(ctx, dout):
        if hasattr(ctx, "kernel_saved"):
            return cuda_loss.cross_entropy_backward(dout.array, ctx.kernel_saved), None
        if not hasattr(ctx, "e"):
            return xp_of(dout.array).zeros(ctx.in_shape, dout.array.dtype), None
        e, w, eps = ctx.e, ctx.w, ctx.eps
        n, c, m = e.shape
        xp = xp_of(e)
        with _quiet():
            scale = _scale(dout.array, ctx.reduction, ctx.denom, (n, m))
            # ignored targets get exactly 0, even when 'mean' divides by a zero total weight (as in torch)
            vs = xp.where(ctx.valid, scale, 0)
            nll = xp.where(ctx.valid, scale * ((1 - eps) * ctx.w_t), 0)
            big_w = c if w is None else w.sum()
            dx = e * ((nll + vs * (eps * big_w / c)) / ctx.se)[:, None, :]
            if eps:
                dx -= (vs * (eps / c))[:, None, :] * (1 if w is None else w[:, None])
            dx[ctx.idx] -= nll
        return dx.reshape(ctx.in_shape), None


class CrossEntropyProb(Function):
    """Class-probability targets (same shape as the input): loss = -sum_c w_c t_c log p_c, mean over samples."""

    @staticmethod
    def forward(ctx, x, target, weight, reduction, eps):
        a, t = x.array, target.array
        dt = np.result_type(a.dtype, t.dtype)
        shape = a.shape
        n, c = (1, shape[0]) if a.ndim == 1 else shape[:2]
        m = math.prod(shape[2:])
        a3, t3 = a.reshape(n, c, m).astype(dt, copy=False), t.reshape(n, c, m).astype(dt, copy=False)
        xp = xp_of(a3)
        if eps:
            t3 = t3 * (1 - eps) + eps / c
        w = None if weight is None else weight.array.astype(dt, copy=False)[:, None]
        wt = t3 if w is None else t3 * w
        s = a3 - a3.max(axis=1, keepdims=True) if a3.size else a3.copy()
        e = xp.exp(s)
        with _quiet():
            se = e.sum(axis=1)
            lse = xp.log(se)
            swt = wt.sum(axis=1)
            loss = swt * lse - (wt * s).sum(axis=1)
        if ctx.needs_input_grad[1]:
            ctx.logp = s - lse[:, None, :]
        ctx.e, ctx.se, ctx.wt, ctx.swt, ctx.w = e, se, wt, swt, w
        ctx.eps, ctx.reduction, ctx.nm, ctx.shape = eps, reduction, (n, m), shape
        return _reduce(loss.reshape(shape[:1] + shape[2:] if a.ndim > 1 else ()), reduction, n * m)

    @staticmethod
    def backward(ctx, dout):
        n, m = ctx.nm
        scale = _scale(dout.array, ctx.reduction, n * m, (n, m))
        s3 = scale[:, None, :] if ctx.reduction == "none" else scale
        dx = dt = None
        with _quiet():
            if ctx.needs_input_grad[0]:
                dx = (ctx.e * (scale * ctx.swt / ctx.se)[:, None, :] - ctx.wt * s3).reshape(ctx.shape)
            if ctx.needs_input_grad[1]:
                lw = ctx.logp if ctx.w is None else ctx.logp * ctx.w
                dt = (lw * (-(1 - ctx.eps) * s3)).reshape(ctx.shape)
        return dx, dt


class NLLLoss(Function):
    @staticmethod
    def forward(ctx, x, target, weight, ignore_index, reduction):
        a3, t2, out_shape = _class_layout("nll_loss", x.array, target.array, weight)
        w = None if weight is None else weight.array.astype(a3.dtype, copy=False)
        valid, w_t, idx = _targets("nll_loss", t2, a3.shape[1], w, ignore_index, a3.dtype)
        xp = xp_of(a3)
        with _quiet():
            loss = xp.where(valid, -w_t * a3[idx], 0) if a3.shape[1] else xp.zeros(w_t.shape, a3.dtype)
        denom = w_t.sum()
        ctx.shape, ctx.w_t, ctx.valid, ctx.idx = a3.shape, w_t, valid, idx
        ctx.reduction, ctx.denom = reduction, denom
        ctx.in_shape = x.array.shape
        return _reduce(loss.reshape(out_shape), reduction, denom)

    @staticmethod
    def backward(ctx, dout):
        g = dout.array
        xp = xp_of(g)
        dx = xp.zeros(ctx.shape, g.dtype)
        if ctx.shape[1] == 0:
            return dx.reshape(ctx.in_shape), None
        with _quiet():
            dx[ctx.idx] = xp.where(ctx.valid, -ctx.w_t * _scale(g, ctx.reduction, ctx.denom, ctx.w_t.shape), 0)
        return dx.reshape(ctx.in_shape), None


def _float_check(op, x, what="input"):
    if x.array.dtype.kind != "f":
        raise NotImplementedError(f"{op}: not implemented for {x.dtype} {what} of shape {list(x.array.shape)}; "
                                  "expected a floating point tensor")


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                  reduction="mean", label_smoothing=0.0):
    # input may be the output of a launch held back for this loss (autograd/held.py): taken before anything reads
    # it, it is run by CrossEntropy's kernel path with the loss in its epilogue, or as it was before any other path
    # reads input, or at the latest on the way out (an error)
    return _taking_head(input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing,
                        "cross_entropy")


def nll_of_log_softmax(input, target, weight, ignore_index, reduction):  # noqa: A002
    """nll_loss(log_softmax(input, 1), target, ...) as one cross_entropy (its value exactly), a bad target's error
    named nll_loss's (ops/fusion.py)."""
    return _taking_head(input, target, weight, None, ignore_index, None, reduction, 0.0, "nll_loss")


def _taking_head(input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing, op):  # noqa: A002
    head = held.take(pending.resolve(input))
    try:
        return _cross_entropy(input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing,
                              head, op)
    finally:
        if head is not None:
            head.settle()


def _cross_entropy(input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing, head,
                   op):
    reduction = _reduction("cross_entropy", input, target, reduction, size_average, reduce)
    check_same_device("cross_entropy", input, target, weight)
    a, t = input.array, target.array
    if a.ndim == 0:
        raise IndexError("cross_entropy: Dimension out of range (expected to be in range of [-1, 0], but got 1): "
                         "expected input [C] or [N, C, ...], got a 0-d tensor")
    _float_check("cross_entropy", input)
    eps = float(label_smoothing)
    if a.shape == t.shape:   # torch reads a target of the input's shape as class probabilities
        if t.dtype.kind != "f":
            raise RuntimeError(f"cross_entropy: Expected floating point type for target with class probabilities, "
                               f"got {target.dtype}")
        if ignore_index >= 0:
            raise RuntimeError("cross_entropy: ignore_index is not supported for floating point target")
    if eps > 1.0:
        raise RuntimeError(f"cross_entropy: label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing}")
    eps = max(eps, 0.0)   # torch ignores a negative label_smoothing
    if a.shape == t.shape:
        _check_weight("cross_entropy", weight, a.shape[0] if a.ndim == 1 else a.shape[1])
        if head is not None:
            head.settle()
        return CrossEntropyProb.apply(input, target, weight, reduction, eps)
    return CrossEntropy.apply(input, target, weight, ignore_index, reduction, eps, head, op)


def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
             reduction="mean"):
    if type(input) is pending.PendingTensor:   # log_softmax before it: cross_entropy, one op (ops/fusion.py)
        out = pending.absorb(input, "nll_loss", target, weight, size_average, ignore_index, reduce, reduction)
        if out is not None:
            return out
    reduction = _reduction("nll_loss", input, target, reduction, size_average, reduce)
    check_same_device("nll_loss", input, target, weight)
    if input.array.ndim == 0:
        raise ValueError("nll_loss: Expected 1 or more dimensions (got 0)")
    _float_check("nll_loss", input)
    return NLLLoss.apply(input, target, weight, ignore_index, reduction)

"""CUDA softmax / log_softmax over one dim and fused cross-entropy (kernels/loss.cu): one warp per row; cross-entropy
computes the loss and the gradient of the unreduced loss in one pass, so its backward is one scaling kernel."""
import math
from dataclasses import dataclass

import numpy as np

from . import cupy, device_checks
from .tuning import Tuning
from ._common import (BLOCK, check_array, check_dtype, check_float, contiguous, device_counters, dim_index, get, i32,
                      i64, launch, launch_rows, ptr, rows_grid, same_device, scalar)


def _softmax_forward(op, x, dim, log):
    check_array(op, "input", x)
    check_float(op, "input", x)
    d = dim_index(op, dim, x.ndim)
    shape = x.shape if x.ndim else (1,)
    outer, c, inner = math.prod(shape[:d]), shape[d], math.prod(shape[d + 1:])
    with x.device:
        x = contiguous(x)
        out = cupy().empty_like(x)
        args = (x, out, i64(outer * inner), i64(c), i64(inner))
        if log:
            launch_rows("loss", "log_softmax_fwd", x.dtype, outer * inner, args)
        else:
            launch_rows("loss", "softmax_fwd", x.dtype, outer * inner, args)
    return out, (out, d)


def _softmax_backward(op, dout, saved, log):
    out, d = saved
    check_array(op, "grad_output", dout)
    check_dtype(op, "grad_output", dout, out.dtype)
    if dout.shape != out.shape:
        raise RuntimeError(f"{op}: expected grad_output of shape {list(out.shape)}, got {list(dout.shape)}")
    same_device(op, dout, out)
    shape = out.shape if out.ndim else (1,)
    outer, c, inner = math.prod(shape[:d]), shape[d], math.prod(shape[d + 1:])
    with out.device:
        dout = contiguous(dout)
        dx = cupy().empty_like(out)
        args = (dout, out, dx, i64(outer * inner), i64(c), i64(inner))
        if log:
            launch_rows("loss", "log_softmax_bwd", out.dtype, outer * inner, args)
        else:
            launch_rows("loss", "softmax_bwd", out.dtype, outer * inner, args)
    return dx


def softmax_forward(x, dim):
    """exp(x - max) / sum(exp(x - max)) along dim. Returns (out, saved = (out, dim)) for softmax_backward."""
    return _softmax_forward("softmax", x, dim, log=False)


def softmax_backward(dout, saved):
    """dx = out * (dout - sum(dout * out, dim))."""
    return _softmax_backward("softmax_backward", dout, saved, log=False)


def log_softmax_forward(x, dim):
    """x - max - log(sum(exp(x - max))) along dim. Returns (out, saved = (out, dim)) for log_softmax_backward."""
    return _softmax_forward("log_softmax", x, dim, log=True)


def log_softmax_backward(dout, saved):
    """dx = dout - exp(out) * sum(dout, dim)."""
    return _softmax_backward("log_softmax_backward", dout, saved, log=True)


@dataclass
class CrossEntropySaved:
    """grad: d(unreduced loss)/d(input), input-shaped; wsum: the 0-d sum of target weights (the 'mean' divisor);
    reduction; target_shape (the 'none' loss shape); target (contiguous) and ignore_index, whose rows backward
    zeroes; unit: backward's dx for a loss gradient of 1, written by the forward where the input is small, or None."""
    grad: object
    wsum: object
    reduction: str
    target_shape: tuple
    target: object = None
    ignore_index: int = -100
    unit: object = None


def _ce_validate(x, target, weight, reduction, label_smoothing):
    op = "cross_entropy"
    check_array(op, "input", x, None)
    check_array(op, "target", target)
    check_float(op, "input", x)
    if x.ndim == 0:
        raise RuntimeError(f"{op}: input must have at least 1 dimension (classes), got a 0-dim input")
    if target.dtype.kind == "f":
        raise NotImplementedError(f"{op}: the CUDA kernel takes class-index targets; probability targets (float "
                                  f"target of shape {list(target.shape)}) need the array-code path")
    check_dtype(op, "target", target, np.int64)
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    if not 0.0 <= label_smoothing <= 1.0:
        raise RuntimeError(f"{op}: label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing}")
    c = x.shape[0] if x.ndim == 1 else x.shape[1]
    if x.ndim == 1:
        if target.ndim != 0:
            raise RuntimeError(f"{op}: for an unbatched input [C], expected a 0-dim target, got {list(target.shape)}")
    elif x.ndim == 2 and (target.ndim != 1 or target.shape[0] != x.shape[0]):
        if target.ndim == 1:
            raise ValueError(f"Expected input batch_size ({x.shape[0]}) to match target batch_size "
                             f"({target.shape[0]}).")
        raise RuntimeError(f"{op}: expected target of shape [{x.shape[0]}], got {list(target.shape)}")
    elif x.ndim > 2 and tuple(target.shape) != (x.shape[0],) + tuple(x.shape[2:]):
        raise RuntimeError(f"{op}: Expected target size {[x.shape[0]] + list(x.shape[2:])}, got "
                           f"{list(target.shape)}")
    if weight is not None:
        check_array(op, "weight", weight)
        check_dtype(op, "weight", weight, x.dtype)
        if tuple(weight.shape) != (c,):
            raise RuntimeError(f"{op}: weight tensor should be defined either for all {c} classes or no classes but "
                               f"got weight tensor of shape: {list(weight.shape)}")
    same_device(op, x, target, weight)
    return c


LOSS = Tuning(
    "loss",
    ce_unit_max=(1 << 14, "up to this many logits cross_entropy_forward also writes the gradient for a loss "
                          "gradient of 1, so that loss.backward() runs no kernel; each block then adds every target's "
                          "weight itself, work that grows with the input"),
)


def bad_target_error(op, target, c, ignore_index):
    """The IndexError for the first target outside [0, c) that is not ignore_index (target: a NumPy or CuPy array,
    read when the error is made: at a device check, after the work before it)."""
    bad = device_checks.first_outside(target, 0, c, skip=ignore_index)
    got = "A target" if bad is None else f"Target {bad}"
    return IndexError(f"{op}: {got} is out of bounds (classes 0..{c - 1}, ignore_index={ignore_index}).")


def cross_entropy_forward(x, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0,
                          check_target=None, compute_grad=True, head=None, op="cross_entropy"):
    """torch's cross_entropy with class-index targets: logits x [N, C], [N, C, d1, ...] or [C]; target int64
    [N], [N, d1, ...] or []; weight [C] or None; label smoothing as torch (the smoothing term is weighted too and
    'mean' divides both terms by the sum of the targets' weights; all targets ignored gives NaN).

    check_target: False skips the check of the targets; otherwise (the default) the forward kernel flags targets
    outside [0, C) that are not ignore_index, and the IndexError (bad_target_error) is raised at the next host
    synchronization (device_checks.py), inside a CUDA graph too. Such rows give NaN (never an out-of-bounds read).
    compute_grad: also write the gradient (what backward scales), and for 'mean' / 'sum' over at most
    LOSS.ce_unit_max elements the gradient for a loss gradient of 1 too (saved.unit: `loss.backward()` then runs no
    kernel, ops/loss.py CrossEntropy.backward_unit).
    head: the held launch (autograd/held.py) of the op whose output x is [N, C], its info a _common.HeldHead (the
    linear chain's, tile_conv_lin's): for 'mean' and 'sum' it runs with this loss in its epilogue, one kernel;
    otherwise it runs first, as it was. op: the name a bad target's error gives (nll_loss where it computes
    nll_loss(log_softmax(x))). Returns (loss, CrossEntropySaved).
    """
    c = _ce_validate(x, target, weight, reduction, float(label_smoothing))
    cp = cupy()
    shape = x.shape if x.ndim > 1 else (1,) + x.shape
    outer, inner = shape[0], math.prod(shape[2:])
    with x.device:
        counter = device_counters("cross_entropy", 1) if reduction != "none" and outer * inner else None
        fused = head is not None and counter is not None and x.ndim == 2
        if head is not None and not fused:
            head.settle()   # before anything here reads x
        x, target, weight = contiguous(x), contiguous(target), contiguous(weight)
        flag = None
        if target.size and check_target is not False:
            flag = device_checks.flag(lambda: bad_target_error(op, target, c, ignore_index))
        rows = outer * inner
        loss_rows = cp.empty(rows, dtype=x.dtype)
        wt_rows = cp.empty(rows, dtype=x.dtype)
        grad = cp.empty(x.shape, dtype=x.dtype) if compute_grad else None
        args = (x, target, ptr(weight), loss_rows, wt_rows, ptr(grad), i64(rows), i64(c), i64(inner),
                i64(ignore_index), scalar(label_smoothing, x.dtype), ptr(flag))
        wsum = unit = None
        if reduction == "none":
            launch_rows("loss", "cross_entropy_fwd", x.dtype, rows, args)
            loss = loss_rows.reshape(target.shape)
        else:
            loss = cp.empty((), dtype=x.dtype)
            mean = reduction == "mean"
            wsum = cp.empty((), dtype=x.dtype) if mean else None
            if counter is not None:   # one launch: the last block adds the blocks' sums
                unit = cp.empty_like(grad) if grad is not None and grad.size <= LOSS.ce_unit_max else None
                ends = (counter, i32(mean), loss, ptr(wsum), ptr(unit))
                if fused:   # the head's kernel, its rows' loss in its epilogue (args[9:]: ignore_index, ls, flag)
                    head.done = True
                    head.info.with_cross_entropy((target, ptr(weight), ptr(grad)) + args[9:], ends)
                else:
                    grid = rows_grid(rows)
                    get("loss", "cross_entropy_fwd_reduce", x.dtype)((grid,), (BLOCK,), args + (
                        cp.empty(2 * grid, dtype=x.dtype),) + ends)
            else:   # no rows, or a capture before the counter exists
                launch_rows("loss", "cross_entropy_fwd", x.dtype, rows, args)
                get("loss", "cross_entropy_reduce", x.dtype)((1,), (1024,), (loss_rows, wt_rows, i64(rows),
                                                                            i32(mean), loss, ptr(wsum)))
    return loss, CrossEntropySaved(grad, wsum, reduction, tuple(target.shape), target, int(ignore_index), unit)


def cross_entropy_backward(dout, saved):
    """dx = grad * (dout / wsum ('mean'), dout ('sum'), or dout per target element ('none')), 0 where the target
    is ignored (also when every target is, which makes 'mean' divide by 0); no host sync."""
    op = "cross_entropy_backward"
    grad = saved.grad
    if grad is None:
        raise RuntimeError(f"{op}: the forward ran with compute_grad=False")
    check_array(op, "grad_output", dout)
    check_dtype(op, "grad_output", dout, grad.dtype)
    same_device(op, dout, grad)
    want = saved.target_shape if saved.reduction == "none" else ()
    if tuple(dout.shape) != tuple(want):
        raise RuntimeError(f"{op}: expected grad_output of shape {list(want)}, got {list(dout.shape)}")
    shape = grad.shape if grad.ndim > 1 else (1,) + grad.shape
    outer, c, inner = shape[0], shape[1], math.prod(shape[2:])
    with grad.device:
        if saved.reduction == "none":
            scale, stride = contiguous(dout).reshape(-1), 1
        else:
            scale, stride = contiguous(dout.reshape(1)), 0
        dx = cupy().empty_like(grad)
        launch("loss", "cross_entropy_bwd", grad.dtype, dx.size,
               (grad, saved.target, i64(saved.ignore_index), scale, i64(stride), ptr(saved.wsum), dx, i64(outer),
                i64(c), i64(inner)))
    return dx


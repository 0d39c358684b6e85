"""CUDA batch normalization (kernels/norm.cu): training forward with batch statistics and the running-stat update
fused in, eval forward with running statistics, and one backward kernel for both; x is [N, C, *]."""
import math
import numpy as np

from . import cupy
from ._common import (BLOCK, check_array, check_dtype, check_float, check_shape, contiguous, get, i32, i64, launch,
                      ptr, require_contiguous, same_device)


def _validate(x, running_mean, running_var, weight, bias, training):
    op = "batch_norm"
    check_array(op, "input", x)
    check_float(op, "input", x)
    if x.ndim < 2:
        raise ValueError(f"{op}: expected 2D or higher input [N, C, *], got input of shape {list(x.shape)}")
    c = x.shape[1]
    for name, a in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight),
                    ("bias", bias)):
        if a is not None:
            check_array(op, name, a)
            check_dtype(op, name, a, x.dtype)
            check_shape(op, name, a, (c,))
    if (running_mean is None) != (running_var is None):
        raise RuntimeError(f"{op}: running_mean and running_var must both be given or both be None")
    if not training and running_mean is None:
        raise RuntimeError(f"{op}: running_mean and running_var must be defined in evaluation mode")
    for name, a in (("running_mean", running_mean), ("running_var", running_var)):
        if a is not None and training:
            require_contiguous(op, name, a)
    same_device(op, x, running_mean, running_var, weight, bias)
    m = x.size // c if c else 0
    if training and m <= 1:
        raise ValueError(f"Expected more than 1 value per channel when training, got input size {list(x.shape)}")
    return c, math.prod(x.shape[2:])


def batch_norm_forward(x, running_mean, running_var, weight=None, bias=None, training=True, momentum=0.1, eps=1e-5):
    """torch's batch_norm: y = (x - mean) / sqrt(var + eps) * weight + bias per channel of x [N, C, *].

    training: batch statistics (biased var); running_mean/var (or None) are updated in place with momentum and the
    unbiased var. Eval: running statistics. weight/bias None means affine=False. All arrays cupy, one float dtype.
    Returns (y, saved) with saved = (x, weight, mean, invstd, training): the batch mean and 1/sqrt(var + eps), or
    for eval a copy of running_mean and 1/sqrt(running_var + eps).
    """
    c, s = _validate(x, running_mean, running_var, weight, bias, training)
    cp = cupy()
    n = x.shape[0]
    with x.device:
        x, weight, bias = contiguous(x), contiguous(weight), contiguous(bias)
        y = cp.empty_like(x)
        if training:  # one block per channel; c > 0 here since m > 1
            mean = cp.empty(c, dtype=x.dtype)
            invstd = cp.empty(c, dtype=x.dtype)
            get("norm", "bn_fwd_train", x.dtype)((c,), (BLOCK,), (
                x, ptr(weight), ptr(bias), y, mean, invstd, ptr(running_mean), ptr(running_var), i64(n), i64(c),
                i64(s), np.float64(eps), np.float64(momentum)))
        else:
            rm, rv = contiguous(running_mean), contiguous(running_var)
            launch("norm", "bn_fwd_eval", x.dtype, x.size,
                   (x, ptr(weight), ptr(bias), rm, rv, y, i64(n), i64(c), i64(s), np.float64(eps)))
            mean = rm.copy()
            invstd = 1 / cp.sqrt(rv + x.dtype.type(eps))
    return y, (x, weight, mean, invstd, bool(training))


def batch_norm_backward(dout, saved, needs_input_grad=(True, True, True)):
    """Gradients (dx, dweight, dbias) of batch_norm_forward's output; None where needs_input_grad (input, weight,
    bias) says no (dweight also without a weight). Training mode differentiates through the
    batch statistics: dx = w * invstd * (dout - mean(dout) - xhat * mean(dout * xhat))."""
    op = "batch_norm_backward"
    x, weight, mean, invstd, training = saved
    check_array(op, "grad_output", dout)
    check_dtype(op, "grad_output", dout, x.dtype)
    check_shape(op, "grad_output", dout, x.shape)
    same_device(op, dout, x)
    need_x, need_w, need_b = (tuple(bool(v) for v in needs_input_grad) + (True,) * 3)[:3]
    cp = cupy()
    n, c = x.shape[:2]
    s = math.prod(x.shape[2:])
    with x.device:
        dout = contiguous(dout)
        dx = cp.empty_like(x) if need_x else None
        dw = cp.empty(c, dtype=x.dtype) if need_w and weight is not None else None
        db = cp.empty(c, dtype=x.dtype) if need_b else None
        if c and (dx is not None or dw is not None or db is not None):
            get("norm", "bn_bwd", x.dtype)((c,), (BLOCK,), (
                dout, x, ptr(weight), mean, invstd, ptr(dx), ptr(dw), ptr(db), i64(n), i64(c), i64(s),
                i32(training)))
    return dx, dw, db


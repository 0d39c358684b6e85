"""CUDA batch normalization (kernels/norm.cu), with an optional activation after it in the same pass: training
forward with batch statistics and the running-stat update, eval forward with running statistics, and the backward
of both; x is [N, C, *]. A channel's values are split over several blocks where the channels alone would leave
the GPU idle (split)."""
import math
import numpy as np

from . import cupy
from ._common import (BLOCK, check_array, check_dtype, check_float, check_shape, contiguous, device_counters, get,
                      i32, i64, launch, ptr, require_contiguous, same_device)
from .conv.plan import ACTIVATIONS, sm_count
from .tuning import Tuning


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


NORM = Tuning(
    "norm",
    blocks_per_sm=(4, "blocks per SM the grid C x P aims at: a channel's values split until the channels fill it"),
    min_chunk=(4 * BLOCK, "the fewest values a slice of a channel gets (4 a thread): below it the partials and the "
                          "last block's combination cost more than the split gains"),
    max_slices=(1024, "the most slices of a channel (the last block combines one partial per slice)"),
)
_MAX_CHANNELS = 4096   # ticket counters: wider layers fill the GPU with a block per channel anyway


def split(c, m):
    """(P, chunk): each channel's m values in P slices of `chunk` (one block each), so that the grid C x P fills
    the GPU (NORM.blocks_per_sm) without slices under NORM.min_chunk values; P = 1 where C alone fills it."""
    want = -(-NORM.blocks_per_sm * sm_count() // max(c, 1))
    p = max(1, min(want, -(-m // NORM.min_chunk), NORM.max_slices))
    chunk = -(-m // p)
    return -(-m // chunk), chunk


def _slices(c, m):
    """(P, chunk, part, tickets) of a launch over grid C x P (split): the float64 partials [C, P, 2] and the ticket
    counters its last blocks take, None where P = 1, also with more channels than counters, or while capturing
    before the counters exist (device_counters)."""
    p, chunk = split(c, m)
    tickets = device_counters("batch_norm", _MAX_CHANNELS) if p > 1 and c <= _MAX_CHANNELS else None
    if tickets is None:
        return 1, m, None, None
    return p, chunk, cupy().empty(2 * c * p, dtype=np.float64), tickets


def batch_norm_forward(x, running_mean, running_var, weight=None, bias=None, training=True, momentum=0.1, eps=1e-5,
                       activation=None):
    """act(torch's batch_norm): y = act((x - mean) / sqrt(var + eps) * weight + bias) per channel of x [N, C, *];
    activation None, 'relu', 'gelu' or 'gelu_tanh' (fused: one pass writes the activated output).

    training: batch statistics (biased var); running_mean/var (or None) are updated in place with momentum and the
    unbiased var. Eval: running statistics. weight/bias None means affine=False. All arrays cupy, one float dtype.
    Returns (y, saved) with saved = (x, weight, bias, mean, invstd, training, activation): the batch mean and
    1/sqrt(var + eps), or for eval running_mean and 1/sqrt(running_var + eps).
    """
    c, s = _validate(x, running_mean, running_var, weight, bias, training)
    act = ACTIVATIONS[activation]
    cp = cupy()
    n = x.shape[0]
    m = n * s
    with x.device:
        x, weight, bias = contiguous(x), contiguous(weight), contiguous(bias)
        y = cp.empty_like(x)
        mean = cp.empty(c, dtype=x.dtype)
        invstd = cp.empty(c, dtype=x.dtype)
        if training:  # c > 0 here since m > 1
            p, chunk, part, tickets = _slices(c, m)
            get("norm", "bn_stats", x.dtype)((c, p), (BLOCK,), (
                x, ptr(weight), ptr(bias), y, mean, invstd, ptr(running_mean), ptr(running_var), ptr(part),
                ptr(tickets), i64(n), i64(c), i64(s), i64(chunk), np.float64(eps), np.float64(momentum), i32(act)))
            applied = p == 1
        else:
            launch("norm", "bn_eval_stats", x.dtype, c, (contiguous(running_mean), contiguous(running_var), mean,
                                                          invstd, i64(c), np.float64(eps)))
            applied = False
        if not applied and x.size:
            launch("norm", "bn_apply", x.dtype, x.size, (x, mean, invstd, ptr(weight), ptr(bias), y, i64(n), i64(c),
                                                         i64(s), i32(act)))
    return y, (x, weight, bias, mean, invstd, bool(training), activation)


def batch_norm_backward(dout, saved, needs_input_grad=(True, True, True)):
    """Gradients (dx, dweight, dbias) of batch_norm_forward's output; None where needs_input_grad (input, weight,
    bias) says no (dweight also without a weight). Training mode differentiates through the batch statistics:
    dx = w * invstd * (g - mean(g) - xhat * mean(g * xhat)), g = act'(pre-activation) * dout."""
    op = "batch_norm_backward"
    x, weight, bias, mean, invstd, training, activation = saved
    check_array(op, "grad_output", dout)
    check_dtype(op, "grad_output", dout, x.dtype)
    check_shape(op, "grad_output", dout, x.shape)
    same_device(op, dout, x)
    need_x, need_w, need_b = (tuple(bool(v) for v in needs_input_grad) + (True,) * 3)[:3]
    act = ACTIVATIONS[activation]
    cp = cupy()
    n, c = x.shape[:2]
    s = math.prod(x.shape[2:])
    with x.device:
        dout = contiguous(dout)
        dx = cp.empty_like(x) if need_x else None
        dw = cp.empty(c, dtype=x.dtype) if need_w and weight is not None else None
        db = cp.empty(c, dtype=x.dtype) if need_b else None
        if not c or (dx is None and dw is None and db is None):
            return dx, dw, db
        common = (ptr(weight), ptr(bias), mean, invstd)
        if dw is None and db is None and not training:   # dx = w * invstd * g needs no sums
            launch("norm", "bn_bwd_dx", x.dtype, x.size, (dout, x) + common + (ptr(None), dx, i64(n), i64(c), i64(s),
                                                                                i32(0), i32(act)))
            return dx, dw, db
        p, chunk, part, tickets = _slices(c, n * s)
        coef = cp.empty(2 * c, dtype=x.dtype) if p > 1 and dx is not None and training else None
        get("norm", "bn_bwd_reduce", x.dtype)((c, p), (BLOCK,), (
            dout, x) + common + (ptr(dx), ptr(dw), ptr(db), ptr(coef), ptr(part), ptr(tickets), i64(n), i64(c),
                                 i64(s), i64(chunk), i32(training), i32(act)))
        if p > 1 and dx is not None:
            launch("norm", "bn_bwd_dx", x.dtype, x.size, (dout, x) + common + (ptr(coef), dx, i64(n), i64(c), i64(s),
                                                                                i32(training), i32(act)))
    return dx, dw, db

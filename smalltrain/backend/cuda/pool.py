"""CUDA max and average 2-D pooling launchers (kernels/pool.cu), torch's semantics: padding, dilation (max),
ceil_mode, count_include_pad, divisor_override; max pooling returns torch's flat h*W + w argmax indices."""
import math
import operator

import numpy as np

from . import cupy
from ._common import check_array, check_dtype, check_float, contiguous, i32, i32s, i64, launch, pair, ptr
from .conv import ACTIVATIONS


def pool_output_size(size, kernel, pad, stride, dilation, ceil_mode):
    """torch's pooling_output_shape: floor (or ceil) division, and a last window must start inside the input."""
    out = (size + 2 * pad - dilation * (kernel - 1) - 1 + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def _geometry(op, x, kernel_size, stride, padding, dilation, ceil_mode):
    check_array(op, "input", x, (3, 4))
    check_float(op, "input", x)
    kh, kw = pair(op, "kernel_size", kernel_size)
    sh, sw = (kh, kw) if stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0) \
        else pair(op, "stride", stride)
    ph, pw = pair(op, "padding", padding)
    dh, dw = pair(op, "dilation", dilation)
    if min(kh, kw) <= 0:
        raise RuntimeError(f"{op}: kernel_size must be greater than zero, but got kH: {kh} kW: {kw}")
    if min(sh, sw) <= 0:
        raise RuntimeError(f"{op}: stride should be greater than zero, but got dH: {sh} dW: {sw}")
    if min(dh, dw) <= 0:
        raise RuntimeError(f"{op}: dilation should be greater than zero, but got dilationH: {dh} dilationW: {dw}")
    if ph < 0 or pw < 0 or ph > ((kh - 1) * dh + 1) // 2 or pw > ((kw - 1) * dw + 1) // 2:
        raise RuntimeError(f"{op}: pad should be at most half of effective kernel size, but got pad={[ph, pw]}, "
                           f"kernel_size={[kh, kw]} and dilation={[dh, dw]}")
    h, w = x.shape[-2:]
    oh = pool_output_size(h, kh, ph, sh, dh, ceil_mode)
    ow = pool_output_size(w, kw, pw, sw, dw, ceil_mode)
    if oh < 1 or ow < 1:
        raise RuntimeError(f"{op}: Given input size: ({'x'.join(map(str, x.shape[-3:]))}). Calculated output size: "
                           f"({x.shape[-3]}x{oh}x{ow}). Output size is too small")
    return (kh, kw), (sh, sw), (ph, pw), (dh, dw), (oh, ow)


def _args(b, h, w, out_hw, kernel, stride, pad):
    return (i64(b), i64(h), i64(w), i64(out_hw[0]), i64(out_hw[1]), i64(kernel[0]), i64(kernel[1]), i64(stride[0]),
            i64(stride[1]), i64(pad[0]), i64(pad[1]))


def _check_grad(op, dout, x_shape, out_hw, dtype, device_id):
    """dout must be a cupy array of the pooled output's shape, dtype and device (checked before any launch)."""
    check_array(op, "grad_output", dout)
    expected = tuple(x_shape[:-2]) + tuple(out_hw)
    if tuple(dout.shape) != expected:
        raise RuntimeError(f"{op}: expected grad_output of shape {list(expected)}, got {list(dout.shape)}")
    check_dtype(op, "grad_output", dout, dtype)
    if dout.device.id != device_id:
        raise RuntimeError(f"{op}: expected all tensors to be on the same device, but found at least two devices, "
                           f"cuda:{device_id} and cuda:{dout.device.id}")


def max_pool2d_forward(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """torch's max_pool2d_with_indices: x [N, C, H, W] or [C, H, W] (float32/float64 cupy).

    Returns (out [..., OH, OW], indices int64 [..., OH, OW] = h*W + w of each window's first maximum (NaN wins),
    saved) with saved = (indices, x_shape, dtype, geometry) for max_pool2d_backward. stride None means kernel_size.
    """
    op = "max_pool2d"
    kernel, stride, pad, dil, out_hw = _geometry(op, x, kernel_size, stride, padding, dilation, ceil_mode)
    cp = cupy()
    with x.device:
        x = contiguous(x)
        h, w = x.shape[-2:]
        b = math.prod(x.shape[:-2])
        out = cp.empty(x.shape[:-2] + out_hw, dtype=x.dtype)
        idx = cp.empty(out.shape, dtype=cp.int64)
        launch("pool", "max_pool2d_fwd", x.dtype, out.size,
               (x, out, idx) + _args(b, h, w, out_hw, kernel, stride, pad) + (i64(dil[0]), i64(dil[1])))
    return out, idx, (idx, tuple(x.shape), x.dtype, (kernel, stride, pad, dil, out_hw))


def max_pool2d_backward(dout, saved):
    """dx [..., H, W]: each dout element added to the input position its index names (one thread per input
    element gathers from the windows that can hold it: deterministic, no atomics)."""
    op = "max_pool2d_backward"
    idx, x_shape, dtype, (kernel, stride, pad, dil, out_hw) = saved
    _check_grad(op, dout, x_shape, out_hw, dtype, idx.device.id)
    cp = cupy()
    with idx.device:
        dout = contiguous(dout)
        h, w = x_shape[-2:]
        b = math.prod(x_shape[:-2])
        dx = cp.empty(x_shape, dtype=dtype)
        launch("pool", "max_pool2d_bwd", dtype, dx.size,
               (dout, idx, dx) + _args(b, h, w, out_hw, kernel, stride, pad) + (i64(dil[0]), i64(dil[1])))
    return dx


def max_pool2d_backward_act(dout, saved, y, bias, activation):
    """The output gradient of a convolution + activation whose output this pooling read (saved from
    max_pool2d_forward on its [N, C, H, W] output): g [C, N*H*W] = max_pool2d_backward(dout) * act'(y + bias), y
    [C, N*H*W] the convolution's sum before the bias (None without an activation). One kernel for what is
    otherwise the pooling's backward and the convolution's bias_act_bwd (backend/cuda/conv.py takes g as is)."""
    op = "max_pool2d_backward_act"
    idx, x_shape, dtype, (kernel, stride, pad, dil, out_hw) = saved
    _check_grad(op, dout, x_shape, out_hw, dtype, idx.device.id)
    if len(x_shape) != 4:
        raise RuntimeError(f"{op}: expected the pooling of a batched [N, C, H, W] input, got input {list(x_shape)}")
    n, c, h, w = x_shape
    if activation not in ACTIVATIONS:
        raise ValueError(f"{op}: activation must be one of {list(ACTIVATIONS)}, got {activation!r}")
    if activation is not None:
        check_array(op, "y", y, 2)
        check_dtype(op, "y", y, dtype)
        if tuple(y.shape) != (c, n * h * w) or not y.flags.c_contiguous:
            raise RuntimeError(f"{op}: expected a C-contiguous y of shape {[c, n * h * w]}, got {list(y.shape)}")
    if bias is not None and (tuple(bias.shape) != (c,) or bias.dtype != dtype):
        raise RuntimeError(f"{op}: expected a {np.dtype(dtype)} bias of shape [{c}], got {bias.dtype} "
                           f"{list(bias.shape)}")
    tiled = _tiles_exactly(x_shape, kernel, stride, pad, dil, out_hw)
    cp = cupy()
    with idx.device:
        dout = contiguous(dout)
        g = cp.empty((c, n * h * w), dtype=dtype)
        if tiled:
            launch("pool", "max_pool2d_bwd_act_tiled", dtype, dout.size, (
                dout, idx, g, ptr(y), ptr(bias)) + i32s((n * c, c) + tuple(out_hw) + tuple(kernel) + (
                    ACTIVATIONS[activation],)))
            return g
        launch("pool", "max_pool2d_bwd_act", dtype, g.size,
               (dout, idx, g, ptr(y), ptr(bias), i64(n * c), i64(c), i64(h), i64(w), i64(out_hw[0]),
                i64(out_hw[1]), i64(kernel[0]), i64(kernel[1]), i64(stride[0]), i64(stride[1]), i64(pad[0]),
                i64(pad[1]), i64(dil[0]), i64(dil[1]), i32(ACTIVATIONS[activation])))
    return g


def _tiles_exactly(x_shape, kernel, stride, pad, dil, out_hw):
    """Whether the pooling's windows tile the [N, C, H, W] input exactly: kernel == stride, no padding or dilation,
    H = OH * kh and W = OW * kw (every input in one window), with 32-bit indices. max_pool2d_backward_act then runs
    a thread per window (max_pool2d_bwd_act_tiled) rather than one per input element gathering its windows."""
    n, c, h, w = x_shape
    return (tuple(kernel) == tuple(stride) and tuple(pad) == (0, 0) and tuple(dil) == (1, 1)
            and h == out_hw[0] * kernel[0] and w == out_hw[1] * kernel[1] and n * c * h * w < 2 ** 31)


def _avg_options(op, count_include_pad, divisor_override):
    if divisor_override is None:
        return int(bool(count_include_pad)), 0
    divisor = operator.index(divisor_override)
    if divisor == 0:
        raise RuntimeError(f"{op}: divisor must be not zero")
    if divisor < 0:
        raise RuntimeError(f"{op}: divisor_override must be positive, got {divisor}")
    return int(bool(count_include_pad)), divisor


def avg_pool2d_forward(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                       divisor_override=None):
    """torch's avg_pool2d: x [N, C, H, W] or [C, H, W] (float32/float64 cupy).

    Returns (out [..., OH, OW], saved) with saved = (x_shape, geometry, options) for avg_pool2d_backward (the
    input itself is not needed).
    """
    op = "avg_pool2d"
    kernel, stride, pad, _, out_hw = _geometry(op, x, kernel_size, stride, padding, 1, ceil_mode)
    cip, divisor = _avg_options(op, count_include_pad, divisor_override)
    cp = cupy()
    with x.device:
        x = contiguous(x)
        h, w = x.shape[-2:]
        b = math.prod(x.shape[:-2])
        out = cp.empty(x.shape[:-2] + out_hw, dtype=x.dtype)
        launch("pool", "avg_pool2d_fwd", x.dtype, out.size,
               (x, out) + _args(b, h, w, out_hw, kernel, stride, pad) + (i32(cip), i64(divisor)))
    return out, (tuple(x.shape), x.dtype, x.device.id, (kernel, stride, pad, out_hw), (cip, divisor))


def avg_pool2d_backward(dout, saved):
    """dx [..., H, W] = sum over the windows holding each input element of dout / that window's divisor."""
    op = "avg_pool2d_backward"
    x_shape, dtype, device_id, (kernel, stride, pad, out_hw), (cip, divisor) = saved
    _check_grad(op, dout, x_shape, out_hw, dtype, device_id)
    cp = cupy()
    with dout.device:
        dout = contiguous(dout)
        h, w = x_shape[-2:]
        b = math.prod(x_shape[:-2])
        dx = cp.empty(x_shape, dtype=dtype)
        launch("pool", "avg_pool2d_bwd", dtype, dx.size,
               (dout, dx) + _args(b, h, w, out_hw, kernel, stride, pad) + (i32(cip), i64(divisor)))
    return dx


"""Pooling with torch.nn.functional's signatures: max_pool2d, avg_pool2d, their 1-D forms (a 2-D pool over a
height of 1); and act_max_pool2d, an activation then max pooling as one op (the fused layers' form, pooled first on
the CPU). Adaptive pooling lives in ops/adaptive_pool.py (re-exported here).

Max and average pooling scan the kernel offsets (one strided slice of the input per offset, all windows at
once), so they keep the input's memory layout; adaptive average pooling is two small GEMMs with pooling matrices.
"""
import operator

import numpy as np

from ..autograd import pending
from ..autograd.function import Function
from ..backend import cpu
from ..backend.cuda import pool as cuda_pool
from ..tensor import Tensor
from ._util import xp_of
from .activation import apply_named, expect_tensor, named_pointwise, pointwise_backward
from .adaptive_pool import adaptive_avg_pool2d, adaptive_max_pool2d  # noqa: F401  (the pooling family's names)

_KERNEL_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _pair(op, name, value, allow_empty=False):
    """torch's int-or-pair arguments: one int, or a sequence of one or two ints; () means "use the default"."""
    vals = value if isinstance(value, (tuple, list)) else (value,)
    try:
        vals = tuple(operator.index(v) for v in vals)
    except TypeError:
        raise TypeError(f"{op}(): argument '{name}' must be an int or a tuple of ints, not {value!r}") from None
    if allow_empty and not vals:
        return None
    if len(vals) not in (1, 2):
        what = {"kernel_size": "must either be a single int, or a tuple of two ints",
                "stride": "must either be omitted, a single int, or a tuple of two ints",
                "padding": "must either be a single int, or a tuple of two ints",
                "dilation": "must be either a single int, or a tuple of two ints"}[name]
        raise RuntimeError(f"{op}: {name} {what}, got {name}={list(vals)}")
    return vals * 2 if len(vals) == 1 else vals


def _trunc_half(v):
    return int(v / 2)  # C++ integer division (toward zero), which torch's check uses


def _out_size(op, size, k, p, s, d, ceil_mode):
    """torch's pooling_output_shape: floor or ceil, and in ceil mode the last window must start in the input."""
    if s == 0:
        raise RuntimeError(f"{op}: stride should not be zero")
    if p < 0:
        raise RuntimeError(f"{op}: pad must be non-negative, but got pad: {p}")
    if p > _trunc_half((k - 1) * d + 1):
        raise RuntimeError(f"{op}: pad should be at most half of effective kernel size, but got pad={p}, "
                           f"kernel_size={k} and dilation={d}")
    out = (size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _geometry(op, x, kernel, stride, padding, dilation, ceil_mode, divisor_override=None):
    """Validate like torch (same checks, same order); returns the pairs k, s, p, d and (OH, OW)."""
    k = _pair(op, "kernel_size", kernel)
    s = _pair(op, "stride", stride if stride is not None else (), allow_empty=True) or k
    p = _pair(op, "padding", padding)
    d = _pair(op, "dilation", dilation)
    if divisor_override is not None and divisor_override == 0:
        raise RuntimeError(f"{op}: divisor must be not zero")
    if op == "max_pool2d" and x.ndim not in (3, 4):
        raise RuntimeError(f"{op}: non-empty 3D or 4D (batch mode) tensor expected for input, got input of size "
                           f"{list(x.shape)}")
    if x.ndim < 3:
        raise IndexError(f"{op}: Dimension out of range (expected to be in range of [{-max(x.ndim, 1)}, "
                         f"{max(x.ndim, 1) - 1}], but got -3): input of size {list(x.shape)}")
    oh = _out_size(op, x.shape[-2], k[0], p[0], s[0], d[0], ceil_mode)
    ow = _out_size(op, x.shape[-1], k[1], p[1], s[1], d[1], ceil_mode)
    if min(k) <= 0:
        raise RuntimeError(f"{op}: kernel size should be greater than zero, but got kH: {k[0]} kW: {k[1]}")
    if min(s) <= 0:
        raise RuntimeError(f"{op}: stride should be greater than zero, but got dH: {s[0]} dW: {s[1]}")
    if min(d) <= 0:
        raise RuntimeError(f"{op}: dilation should be greater than zero, but got dilationH: {d[0]} dilationW: {d[1]}")
    if x.ndim not in (3, 4) or 0 in x.shape[-3:] or (x.ndim == 3 and x.shape[0] == 0):
        raise RuntimeError(f"{op}: Expected 3D or 4D (batch mode) tensor with optional 0 dim batch size for input, "
                           f"but got: {list(x.shape)}")
    if k[1] // 2 < p[1] or k[0] // 2 < p[0]:
        raise RuntimeError(f"{op}: pad should be smaller than or equal to half of kernel size, but got "
                           f"padW = {p[1]}, padH = {p[0]}, kW = {k[1]}, kH = {k[0]}")
    c, h, w = x.shape[-3:]
    if oh < 1 or ow < 1:
        raise RuntimeError(f"{op}: Given input size: ({c}x{h}x{w}). Calculated output size: ({c}x{oh}x{ow}). "
                           f"Output size is too small")
    return k, s, p, d, (oh, ow)


def _padded(x, k, s, p, d, out_hw, fill):
    """x padded by p on the top/left and by whatever the last (ceil mode) window needs on the bottom/right."""
    n, c, h, w = x.shape
    hp = max(h + 2 * p[0], (out_hw[0] - 1) * s[0] + (k[0] - 1) * d[0] + 1)
    wp = max(w + 2 * p[1], (out_hw[1] - 1) * s[1] + (k[1] - 1) * d[1] + 1)
    if (hp, wp) == (h, w):
        return x
    buf = cpu.empty_like_layout(x, (n, c, hp, wp), fill=fill)
    buf[:, :, p[0]:p[0] + h, p[1]:p[1] + w] = x
    return buf


def _offsets(a, k, s, d, out_hw):
    """(offset index, strided view [N, C, OH, OW] of the window elements at that offset), in window scan order."""
    for i in range(k[0]):
        for j in range(k[1]):
            yield i * k[1] + j, a[:, :, i * d[0]:i * d[0] + s[0] * (out_hw[0] - 1) + 1:s[0],
                                  j * d[1]:j * d[1] + s[1] * (out_hw[1] - 1) + 1:s[1]]


def _first_valid(xp, k, s, p, d, out_hw):
    """Per window, the scan-order offset of its first element inside the input (torch's initial argmax)."""
    def axis(n, st, pad, dil):
        start = np.arange(n) * st - pad
        return np.where(start < 0, -(start // dil), 0)  # ceil(-start / dil) rows of padding are skipped
    k0 = axis(out_hw[0], s[0], p[0], d[0])[:, None] * k[1] + axis(out_hw[1], s[1], p[1], d[1])[None, :]
    return xp.asarray(k0)


def _raise_to(xp, idx, mask, off):
    """idx = off where mask. Offsets only grow along the scan and a window's padding never wins, so wherever mask
    holds idx <= off, and the update is a max: plain SIMD passes instead of a slow masked copy."""
    xp.maximum(idx, xp.multiply(mask, off, dtype=idx.dtype), out=idx)


def _route(xp, view, g, mask, finite, accumulate):
    """view (+)= g where mask, else 0. g * mask is the fast form, exact unless g holds inf or NaN (inf * 0)."""
    if finite and not accumulate:
        xp.multiply(g, mask, out=view)
        return
    part = g * mask if finite else xp.where(mask, g, 0)
    if accumulate:
        with np.errstate(invalid="ignore"):  # inf + -inf from two windows is NaN, silently, as in torch
            view += part
    else:
        view[...] = part


def _max_then_argmax(views):
    """NumPy, no padding: (max over the window offsets, int8 scan-order offset of each window's first max), or None
    where a window holds NaN (the scan in MaxPool2d.forward gives torch's NaN rule).

    The maximum first (one np.maximum per offset), then the argmax from K-1 comparisons with it: idx =
    n0 * (1 + n1 * (1 + ... n_{K-2})) with n_k = (view_k != max) as uint8, which is the first k with view_k == max.
    About half the passes of tracking the argmax along the scan (LeNet's 2x2 pools: 214 -> 147 and 79 -> 61 us).
    Ties go to the first offset, and -0.0 ties with 0.0, as the scan's strict > does."""
    vs = [v for _, v in views]
    out = np.maximum(vs[0], vs[1])
    for v in vs[2:]:
        np.maximum(out, v, out=out)
    if out.dtype.kind == "f" and np.isnan(out).any():
        return None
    return out, _first_index_of(vs, out)


def _first_index_of(vs, target):
    """int8 scan-order offset of the first of the window views `vs` equal to `target`, which holds one of each
    window's elements: n0 * (1 + n1 * (1 + ... n_{K-2})) with n_k = (vs[k] != target) as uint8."""
    one = np.uint8(1)
    idx = np.not_equal(vs[-2], target).view(np.uint8)
    for v in vs[-3::-1]:
        idx += one
        idx *= np.not_equal(v, target).view(np.uint8)
    return idx.view(np.int8)


class MaxPool2d(Function):
    """out = max over the window (NaN wins); argmax = first max in scan order (the last NaN), as torch's kernel."""

    @staticmethod
    def forward(ctx, input, k, s, p, d, out_hw, return_indices, ceil_mode=False):
        x = input.array
        xp = xp_of(x)
        if xp is not np and x.dtype.kind == "f":
            # CUDA: one kernel each way (smalltrain/backend/cuda/pool.py), indices as torch's h * W + w
            out, flat, ctx.kernel_saved = cuda_pool.max_pool2d_forward(x, k, s, p, d, ceil_mode)
            if not return_indices:
                return out
            flat = Tensor._wrap(flat)
            ctx.mark_non_differentiable(flat)
            return out, flat
        x4 = x[None] if x.ndim == 3 else x
        floating = x.dtype.kind == "f"
        fill = -np.inf if floating else np.iinfo(x.dtype).min
        xpad = _padded(x4, k, s, p, d, out_hw, fill)
        views = list(_offsets(xpad, k, s, d, out_hw))
        res = _max_then_argmax(views) if xp is np and not (p[0] or p[1]) and 1 < len(views) < 128 else None
        if res is not None:
            out, idx = res
        else:
            out = views[0][1].copy(order="K")
            idx = cpu.empty_like_layout(out, out.shape, dtype=np.int8 if k[0] * k[1] < 128 else np.int32)
            idx[...] = _first_valid(xp, k, s, p, d, out_hw) if p[0] or p[1] else 0
            for off, v in views[1:]:
                upd = v > out
                xp.maximum(out, v, out=out)
                _raise_to(xp, idx, upd, off)
            if floating and (xp is not np or xp.isnan(out).any()):
                for off, v in views:
                    _raise_to(xp, idx, xp.isnan(v), off)  # the last NaN of a window wins, as in torch
        ctx.geom = (x4.shape, xpad.shape, k, s, p, d, out_hw, x.ndim == 3, cpu.layout_order(x4))
        ctx.idx = idx
        if x.ndim == 3:
            out, idx = out[0], idx[0]
        if not return_indices:
            return out
        flat = Tensor._wrap(_flat_indices(xp, idx, x4.shape[3], k, s, p, d, out_hw))
        ctx.mark_non_differentiable(flat)
        return out, flat

    @staticmethod
    def backward(ctx, dout, dindices=None):
        if hasattr(ctx, "kernel_saved"):
            return cuda_pool.max_pool2d_backward(dout.array, ctx.kernel_saved)
        return _to_windows(dout.array, ctx.idx, ctx.geom)


def _to_windows(g, idx, geom):
    """The input's gradient: each window's g at its argmax offset idx, the rest 0 (summed where windows overlap)."""
    x_shape, pad_shape, k, s, p, d, out_hw, unbatched, order = geom
    g = g[None] if unbatched else g
    xp = xp_of(g)
    # windows that tile the (padded) input exactly write each element once: no zero fill, no accumulation
    tiles = d == (1, 1) and s == k and pad_shape[2:] == (out_hw[0] * k[0], out_hw[1] * k[1])
    finite = xp is np and bool(np.isfinite(g).all())
    dx = cpu.empty_in_order(xp, order, pad_shape, g.dtype, fill=None if tiles else 0)  # the input's layout
    for off, view in _offsets(dx, k, s, d, out_hw):
        _route(xp, view, g, idx == off, finite, not tiles)
    dx = dx[:, :, p[0]:p[0] + x_shape[2], p[1]:p[1] + x_shape[3]]
    return dx[0] if unbatched else dx


def _flat_indices(xp, idx, width, k, s, p, d, out_hw):
    """Window offsets -> torch's returned indices: h * W + w into each input plane (int64)."""
    oh = np.arange(out_hw[0]) * s[0] - p[0]
    ow = np.arange(out_hw[1]) * s[1] - p[1]
    base = xp.asarray(oh[:, None] * width + ow[None, :])
    table = xp.asarray([i * d[0] * width + j * d[1] for i in range(k[0]) for j in range(k[1])], dtype=np.int64)
    return xp.take(table, idx.astype(np.int64)) + base


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    """torch.nn.functional.max_pool2d on [N, C, H, W] or [C, H, W]; -inf padding; optionally the argmax indices."""
    if type(input) is pending.PendingTensor:   # a deferred convolution + activation may take it (ops/fusion.py)
        out = pending.absorb(input, "max_pool2d", kernel_size, stride, padding, dilation, ceil_mode, return_indices)
        if out is not None:
            return out
    x = input.array
    k, s, p, d, out_hw = _geometry("max_pool2d", x, kernel_size, stride, padding, dilation, ceil_mode)
    if x.dtype.kind not in "fiu":
        raise NotImplementedError(f"max_pool2d: not implemented for dtype {x.dtype}")
    return MaxPool2d.apply(input, k, s, p, d, out_hw, bool(return_indices), bool(ceil_mode))


# ---- an activation, then max pooling: pooled first on the CPU --------------------------------------------------

# For each activation act_max_pool2d takes: None where it never decreases (ReLU: the window's largest element has
# the largest activation); else a point right of its minimum m, where it falls on (-inf, m] and rises on
# [m, inf) (GELU: m = -0.7518, -0.7522 in the tanh form). The largest activation of a window is then that of its
# largest or of its smallest element, and the smallest can win only where it lies left of this point and the
# largest is negative.
_FALLS_BELOW = {"relu": None, "gelu": -0.7, "gelu_tanh": -0.7}


def _in_memory_order(a):
    """a's elements in memory order as a view: `a` is a fresh ufunc result, one block in some order of axes."""
    return np.ravel(a, order="K")


def _winners(views, hi, lo, fn, params, falls_below):
    """Per window, the element whose activation is the window's largest and comes first in the scan: the largest
    element `hi` (overwritten), replaced by the smallest `lo` where the activation falls and lo's is larger. Where
    the two are equal with different elements (GELU underflowing to -0, a pair either side of the minimum) every
    element of the window is compared, as pooling after the activation does."""
    if falls_below is None:
        return hi
    both = lo < falls_below
    both &= hi < 0
    both &= lo < hi
    both = np.flatnonzero(_in_memory_order(both))   # positions, then take: ~5x faster than boolean indexing
    if both.size == 0:
        return hi
    flat_hi, flat_lo = _in_memory_order(hi), _in_memory_order(lo)
    a_hi, a_lo = flat_hi.take(both), flat_lo.take(both)
    f = fn.fwd(np, np.concatenate((a_hi, a_lo)), *params)[0]   # one evaluation: each NumPy call costs ~1-2 us
    f_hi, f_lo = f[:both.size], f[both.size:]
    flat_hi[both] = np.where(f_lo > f_hi, a_lo, a_hi)
    tie = f_lo == f_hi
    if tie.any():
        # the tied windows' elements: memory-order positions back to [N, C, OH, OW] indices, then each view's
        at = both[tie]
        order = cpu.layout_order(hi)
        ix = np.unravel_index(at, tuple(hi.shape[i] for i in order))
        ix = tuple(ix[order.index(axis)] for axis in range(hi.ndim))
        elems = np.stack([v[ix] for v in views])
        flat_hi[at] = elems[np.argmax(fn.fwd(np, elems, *params)[0], axis=0), np.arange(at.size)]
    return hi


class ActMaxPool2d(Function):
    """max_pool2d(activation(x)) without padding on the CPU, pooled first: per window the element whose
    activation wins (its largest element, or for GELU maybe its smallest: _winners), its first offset in the scan,
    then the activation of the winners alone, a quarter of the elements for 2x2 windows; backward the
    activation's derivative at the winners, routed to their offsets. The same values and argmax as the two ops,
    except where two elements' activations differ by rounding alone (GELU's flat bottom): there either may win.
    Inputs: x [N, C, H, W] (finite), the activation's name, its window views, their largest and smallest
    element, the geometry."""

    @staticmethod
    def forward(ctx, input, activation, views, hi, lo, geom):
        fn, params = named_pointwise(activation)
        with np.errstate(all="ignore"):
            winners = _winners(views, hi, lo, fn, params, _FALLS_BELOW[activation])
            out, saved = fn.fwd(np, winners, *params)
        if ctx.needs_input_grad[0]:
            ctx.idx = _first_index_of(views, winners)
            ctx.act, ctx.params, ctx.saved, ctx.geom = fn, params, saved, geom
        return out

    @staticmethod
    def backward(ctx, dout):
        return _to_windows(pointwise_backward(ctx.act, dout.array, ctx.saved, ctx.params), ctx.idx, ctx.geom)


def act_max_pool2d(input, activation, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """max_pool2d(activation(input), ...) for activation None, 'relu', 'gelu' or 'gelu_tanh' (the fused layers'
    names): one op, pooled first (ActMaxPool2d), for a finite batched float CPU input whose windows need no
    padding and number fewer than 128; the two ops otherwise."""
    x = input.array
    if activation is not None:
        named_pointwise(activation)   # a bad name fails here, before any pass over the data
    k, s, p, d, out_hw = _geometry("max_pool2d", x, kernel_size, stride, padding, dilation, ceil_mode)
    inside = all((out_hw[i] - 1) * s[i] + (k[i] - 1) * d[i] < x.shape[x.ndim - 2 + i] for i in (0, 1))
    if (activation is not None and type(x) is np.ndarray and x.ndim == 4 and x.dtype.kind == "f" and p == (0, 0)
            and inside and 1 < k[0] * k[1] < 128):
        views = [v for _, v in _offsets(x, k, s, d, out_hw)]
        hi, lo = np.maximum(views[0], views[1]), np.minimum(views[0], views[1])
        for v in views[2:]:
            np.maximum(hi, v, out=hi)
            np.minimum(lo, v, out=lo)
        if np.isfinite(hi).all() and np.isfinite(lo).all():   # else NaN's and inf's rules: the two ops
            geom = (x.shape, x.shape, k, s, p, d, out_hw, False, cpu.layout_order(x))
            return ActMaxPool2d.apply(input, activation, views, hi, lo, geom)
    return max_pool2d(apply_named(input, activation), kernel_size, stride, padding, dilation, ceil_mode)


def _divisor(xp, hw, k, s, p, out_hw, count_include_pad, divisor_override, dtype):
    """torch's avg_pool2d divisor per window: the window clipped to the padded input, or only its real part."""
    if divisor_override is not None:
        return divisor_override

    def axis(n, size, k, s, p):
        start = np.arange(n) * s - p
        end = np.minimum(start + k, size + p)
        if count_include_pad:
            return end - start
        return np.minimum(end, size) - np.maximum(start, 0)
    div = axis(out_hw[0], hw[0], k[0], s[0], p[0])[:, None] * axis(out_hw[1], hw[1], k[1], s[1], p[1])[None, :]
    return xp.asarray(div, dtype=dtype if np.dtype(dtype).kind == "f" else np.int64)


class AvgPool2d(Function):
    """out = sum over the window (zero padding) / divisor; the gradient spreads dout / divisor over the window."""

    @staticmethod
    def forward(ctx, input, k, s, p, out_hw, count_include_pad, divisor_override, ceil_mode=False):
        x = input.array
        xp = xp_of(x)
        if xp is not np and x.dtype in _KERNEL_FLOATS and (divisor_override is None or (
                isinstance(divisor_override, int) and divisor_override > 0)):
            # CUDA: one kernel each way (smalltrain/backend/cuda/pool.py); it takes only positive int divisors
            out, ctx.kernel_saved = cuda_pool.avg_pool2d_forward(x, k, s, p, ceil_mode, count_include_pad,
                                                               divisor_override)
            return out
        x4 = x[None] if x.ndim == 3 else x
        xpad = _padded(x4, k, s, p, (1, 1), out_hw, 0)
        views = [v for _, v in _offsets(xpad, k, s, (1, 1), out_hw)]
        floating = x.dtype.kind == "f"
        acc = views[0].copy(order="K") if floating else views[0].astype(np.int64, order="K")
        with np.errstate(invalid="ignore"):  # inf + -inf is NaN, silently, as in torch
            for v in views[1:]:
                acc += v
        div = _divisor(xp, x4.shape[2:], k, s, p, out_hw, count_include_pad, divisor_override, x.dtype)
        if floating:
            acc /= div
            out = acc
        else:  # integer average: C++ division, truncating toward zero
            q = xp.abs(acc) // xp.abs(div)
            out = xp.where((acc < 0) != (xp.asarray(div) < 0), -q, q).astype(x.dtype)
        ctx.geom = (x4.shape, xpad.shape, k, s, p, out_hw, x.ndim == 3, cpu.layout_order(x4))
        ctx.div = div
        return out[0] if x.ndim == 3 else out

    @staticmethod
    def backward(ctx, dout):
        if hasattr(ctx, "kernel_saved"):
            return cuda_pool.avg_pool2d_backward(dout.array, ctx.kernel_saved)
        x_shape, pad_shape, k, s, p, out_hw, unbatched, order = ctx.geom
        g = dout.array[None] if unbatched else dout.array
        xp = xp_of(g)
        gd = g / ctx.div
        dx = cpu.empty_in_order(xp, order, pad_shape, g.dtype, fill=0)
        for _, view in _offsets(dx, k, s, (1, 1), out_hw):
            view += gd
        dx = dx[:, :, p[0]:p[0] + x_shape[2], p[1]:p[1] + x_shape[3]]
        return dx[0] if unbatched else dx


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    """torch.nn.functional.avg_pool2d on [N, C, H, W] or [C, H, W] (zero padding, torch's divisor rules)."""
    x = input.array
    k, s, p, _, out_hw = _geometry("avg_pool2d", x, kernel_size, stride, padding, 1, ceil_mode, divisor_override)
    if x.dtype.kind not in "fiu":
        raise NotImplementedError(f"avg_pool2d: not implemented for dtype {x.dtype}")
    return AvgPool2d.apply(input, k, s, p, out_hw, bool(count_include_pad), divisor_override, bool(ceil_mode))


# ---- 1-D pooling: the 2-D ops over [N, C, 1, L] --------------------------------------------------------------

def _single(op, name, value):
    vals = value if isinstance(value, (tuple, list)) else (value,)
    if len(vals) != 1:
        raise RuntimeError(f"{op}: {name} must be a single int or a tuple of one int, got {name}={list(vals)}")
    return (1, vals[0])


def _as_2d(op, input, ndim_error):
    expect_tensor(op, input)
    if input.array.ndim not in (2, 3):
        raise RuntimeError(ndim_error.format(shape=list(input.array.shape), ndim=input.array.ndim))
    return input.unsqueeze(-2)


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    """torch.nn.functional.avg_pool1d on [N, C, L] or [C, L]."""
    x = _as_2d("avg_pool1d", input, "avg_pool1d: Expected 2 to 3 dimensions, but got {ndim}-dimensional tensor "
               "for argument #1 'self' (input of size {shape})")
    k = _single("avg_pool1d", "kernel_size", kernel_size)
    s = None if stride is None or stride == () else _single("avg_pool1d", "stride", stride)
    p = (0, _single("avg_pool1d", "padding", padding)[1])
    return avg_pool2d(x, k, s, p, ceil_mode, count_include_pad).squeeze(-2)


def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """torch.nn.functional.max_pool1d on [N, C, L] or [C, L]; the indices index L."""
    x = _as_2d("max_pool1d", input, "max_pool1d: Expected 2D or 3D (batch mode) tensor with optional 0 dim batch "
               "size for input, but got:{shape}")
    k = _single("max_pool1d", "kernel_size", kernel_size)
    s = None if stride is None or stride == () else _single("max_pool1d", "stride", stride)
    p = (0, _single("max_pool1d", "padding", padding)[1])
    d = _single("max_pool1d", "dilation", dilation)
    out = max_pool2d(x, k, s, p, d, ceil_mode, return_indices)
    if return_indices:
        return out[0].squeeze(-2), out[1].squeeze(-2)
    return out.squeeze(-2)

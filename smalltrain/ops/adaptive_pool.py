"""Adaptive 2-D pooling to a fixed output size, torch's windows [floor(i * H / OH), ceil((i + 1) * H / OH)):
adaptive_avg_pool2d as two small GEMMs with averaging matrices, adaptive_max_pool2d as a scan over the offsets of
the largest window (one gather per offset, masked where a window is shorter).
"""
import operator

import numpy as np

from ..autograd.function import Function
from ..tensor import Tensor
from ._util import xp_of
from .activation import expect_tensor


def _adaptive_matrix(xp, n_in, n_out, dtype):
    """[n_out, n_in]: row i averages input [floor(i*n_in/n_out), ceil((i+1)*n_in/n_out)), as torch's windows."""
    i = np.arange(n_out)
    start = (i * n_in) // n_out
    end = -((-(i + 1) * n_in) // n_out)
    cols = np.arange(n_in)
    inside = (cols[None, :] >= start[:, None]) & (cols[None, :] < end[:, None])
    return xp.asarray(inside / (end - start)[:, None], dtype=dtype)


class AdaptiveAvgPool2d(Function):
    """out = A @ x @ B^T over the last two axes, A and B the row and column averaging matrices."""

    @staticmethod
    def forward(ctx, input, out_hw):
        x = input.array
        xp = xp_of(x)
        x4 = x[None] if x.ndim == 3 else x
        a = _adaptive_matrix(xp, x4.shape[2], out_hw[0], x.dtype)
        b = _adaptive_matrix(xp, x4.shape[3], out_hw[1], x.dtype)
        y = xp.tensordot(x4, b, axes=([3], [1]))                    # [N, C, H, OW]
        out = xp.tensordot(a, y, axes=([1], [2])).transpose(1, 2, 0, 3)
        ctx.a, ctx.b, ctx.unbatched = a, b, x.ndim == 3
        return out[0] if ctx.unbatched else out

    @staticmethod
    def backward(ctx, dout):
        g = dout.array[None] if ctx.unbatched else dout.array
        xp = xp_of(g)
        t = xp.tensordot(g, ctx.b, axes=([3], [0]))                 # [N, C, OH, W]
        dx = xp.tensordot(ctx.a, t, axes=([0], [2])).transpose(1, 2, 0, 3)
        return dx[0] if ctx.unbatched else dx


def _adaptive_size(x, output_size, op="adaptive_avg_pool2d"):
    """torch's output_size: an int, or a pair whose None entries keep the input's size."""
    if isinstance(output_size, (tuple, list)):
        if x.ndim <= len(output_size):
            raise ValueError(f"{op}: Input dimension should be at least {len(output_size) + 1}, "
                             f"got input of size {list(x.shape)}")
        output_size = [x.shape[x.ndim - len(output_size) + i] if v is None else v for i, v in enumerate(output_size)]
    else:
        output_size = [output_size] * 2
    try:
        size = [operator.index(v) for v in output_size]
    except TypeError:
        raise TypeError(f"{op}: output_size must be an int or a tuple of ints (or None), "
                        f"got {output_size!r}") from None
    if len(size) != 2:
        raise RuntimeError(f"{op}: output_size must be 2, got {size}")
    if size[0] < 0 or size[1] < 0:
        raise RuntimeError(f"{op}: elements of output_size must be greater than or equal to 0 but "
                           f"received {{{size[0]}, {size[1]}}}")
    return tuple(size)


def _adaptive_input(op, input, output_size):
    """The output size (OH, OW) after torch's checks of the input ([N, C, H, W] or [C, H, W], float)."""
    expect_tensor(op, input)
    x = input.array
    out_hw = _adaptive_size(x, output_size, op)
    if x.ndim not in (3, 4):
        raise RuntimeError(f"{op}(): Expected 3D or 4D tensor, but got {list(x.shape)}")
    for dim in range(1, x.ndim):
        if x.shape[dim] == 0:
            raise RuntimeError(f"{op}(): Expected input to have non-zero size for non-batch dimensions, but input "
                               f"has sizes {list(x.shape)} with dimension {dim} being empty")
    if x.dtype.kind != "f":
        raise NotImplementedError(f"{op}: not implemented for dtype {x.dtype}")
    return out_hw


def adaptive_avg_pool2d(input, output_size):
    """torch.nn.functional.adaptive_avg_pool2d on [N, C, H, W] or [C, H, W]."""
    return AdaptiveAvgPool2d.apply(input, _adaptive_input("adaptive_avg_pool2d", input, output_size))


def _windows(n_in, n_out):
    """Start and length of each of n_out adaptive windows over n_in elements."""
    i = np.arange(n_out)
    start = (i * n_in) // n_out
    end = -((-(i + 1) * n_in) // n_out)
    return start, end - start


class AdaptiveMaxPool2d(Function):
    """out = max over each window; the argmax is the first max in row-major scan order, a NaN wins (the last one),
    as torch's kernel. The gradient goes to the argmax (summed where windows share it)."""

    @staticmethod
    def forward(ctx, input, out_hw, return_indices):
        x = input.array
        xp = xp_of(x)
        x4 = x[None] if x.ndim == 3 else x
        tiles = min(out_hw) > 0 and x4.shape[2] % out_hw[0] == 0 and x4.shape[3] % out_hw[1] == 0
        found = _tiled_max(xp, x4, out_hw) if tiles else None
        out, idx = found if found is not None else _scanned_max(xp, x4, out_hw)
        ctx.idx, ctx.in_shape = idx, x.shape
        if x.ndim == 3:
            out, idx = out[0], idx[0]
        if not return_indices:
            return out
        indices = Tensor._wrap(idx)
        ctx.mark_non_differentiable(indices)
        return out, indices

    @staticmethod
    def backward(ctx, dout, dindices=None):
        g = dout.array
        xp = xp_of(g)
        idx = ctx.idx
        n, c = idx.shape[:2]
        hw = int(np.prod(ctx.in_shape[-2:]))
        planes = xp.arange(n * c, dtype=np.int64).reshape(n, c, 1, 1) * hw
        # windows overlap when OH does not divide H: bincount sums what lands on one element
        dx = xp.bincount((idx + planes).ravel(), weights=g.reshape(idx.shape).ravel(), minlength=n * c * hw)
        return dx.astype(g.dtype, copy=False).reshape(ctx.in_shape), None, None


def _tiled_max(xp, x4, out_hw):
    """Windows that tile the input (OH divides H, OW divides W): one argmax over a [N, C, OH, OW, kh * kw] view.
    In a window holding NaN the last NaN wins, as in torch (argmax would give the first): found on the device, with
    no read back (None for an empty input)."""
    n, c, h, w = x4.shape
    kh, kw = h // out_hw[0], w // out_hw[1]
    if x4.size == 0:
        return None
    win = x4.reshape(n, c, out_hw[0], kh, out_hw[1], kw).transpose(0, 1, 2, 4, 3, 5).reshape(
        n, c, out_hw[0], out_hw[1], kh * kw)
    k = xp.argmax(win, axis=-1)   # the first max in scan order, as torch's strict comparison
    nan = xp.isnan(win)
    k = xp.where(nan.any(axis=-1), kh * kw - 1 - xp.argmax(nan[..., ::-1], axis=-1), k)
    out = xp.take_along_axis(win, k[..., None], axis=-1)[..., 0]
    rows = xp.arange(out_hw[0], dtype=np.int64)[:, None] * kh + k // kw
    cols = xp.arange(out_hw[1], dtype=np.int64)[None, :] * kw + k % kw
    return out, rows * w + cols


def _scanned_max(xp, x4, out_hw):
    """Any windows: a scan over the offsets of the largest window (one gather per offset)."""
    n, c, h, w = x4.shape
    (sh, lh), (sw, lw) = _windows(h, out_hw[0]), _windows(w, out_hw[1])
    out = xp.full((n, c) + out_hw, -np.inf, x4.dtype)
    idx = xp.asarray((sh[:, None] * w + sw[None, :]).astype(np.int64))   # a window's first element
    idx = xp.broadcast_to(idx, out.shape).copy()
    for di in range(int(lh.max(initial=0))):
        rows = np.minimum(sh + di, h - 1)   # clamped in shorter windows, whose extra offsets are masked out
        for dj in range(int(lw.max(initial=0))):
            cols = np.minimum(sw + dj, w - 1)
            v = x4[:, :, xp.asarray(rows[:, None]), xp.asarray(cols[None, :])]
            inside = xp.asarray((di < lh)[:, None] & (dj < lw)[None, :])
            take = inside & ((v > out) | xp.isnan(v))
            out = xp.where(take, v, out)
            idx = xp.where(take, xp.asarray(rows[:, None] * w + cols[None, :]), idx)
    return out, idx


def adaptive_max_pool2d(input, output_size, return_indices=False):
    """torch.nn.functional.adaptive_max_pool2d on [N, C, H, W] or [C, H, W]; optionally the argmax indices
    (h * W + w into each input plane)."""
    out_hw = _adaptive_input("adaptive_max_pool2d", input, output_size)
    return AdaptiveMaxPool2d.apply(input, out_hw, bool(return_indices))

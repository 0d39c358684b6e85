"""Scans along one dim: cumsum and cumprod with torch's dtypes (integers and bools accumulate in int64) and
gradients (cumprod's exact where the input has zeros, as torch's)."""
import numpy as np

from .._dtype import to_numpy_dtype
from ..autograd.function import Function
from ._util import normalize_dim, xp_of


def _scan_dtype(a, dtype):
    if dtype is not None:
        return to_numpy_dtype(dtype)
    return np.dtype(np.int64) if a.dtype.kind in "biu" else a.dtype


def _reverse_cumsum(g, axis):
    xp = xp_of(g)
    return xp.flip(xp.cumsum(xp.flip(g, axis), axis=axis), axis)


class Cumsum(Function):
    @staticmethod
    def forward(ctx, x, dim, dtype):
        a = x.array
        ctx.dim, ctx.dtype = dim, a.dtype
        if a.ndim == 0:
            return a.astype(dtype)
        return xp_of(a).cumsum(a, axis=dim, dtype=dtype)

    @staticmethod
    def backward(ctx, dout):
        g = dout.array
        if g.ndim == 0:
            return g, None, None
        return _reverse_cumsum(g, ctx.dim).astype(ctx.dtype, copy=False), None, None


class Cumprod(Function):
    @staticmethod
    def forward(ctx, x, dim, dtype):
        a = x.array
        out = a.astype(dtype) if a.ndim == 0 else xp_of(a).cumprod(a, axis=dim, dtype=dtype)
        ctx.dim, ctx.x, ctx.out = dim, a, out
        return out

    @staticmethod
    def backward(ctx, dout):
        g, a, out = dout.array, ctx.x, ctx.out
        if g.ndim == 0:
            return g, None, None
        xp = xp_of(g)
        axis = ctx.dim
        a_last, g_last, out_last = (xp.moveaxis(v, axis, -1) for v in (a, g, out))
        n = a_last.shape[-1]
        pos = xp.arange(n)
        is_zero = a_last == 0
        # the first zero of each slice (n where there is none): entries before it divide exactly by x
        first = xp.where(is_zero.any(-1), xp.argmax(is_zero, -1), n)[..., None]
        safe = xp.where(pos < first, a_last, 1)
        dx = xp.where(pos < first, _reverse_cumsum(g_last * out_last, -1) / safe, 0)
        # at the first zero z: prod(x[:z]) * sum_{j>=z} g_j * prod(x[z+1..j])
        ones_to_z = xp.where(pos <= first, 1, a_last)
        tail = xp.sum(xp.where(pos >= first, g_last * xp.cumprod(ones_to_z, -1), 0), -1, keepdims=True)
        before = xp.prod(xp.where(pos < first, a_last, 1), -1, keepdims=True)
        dx = xp.where(pos == first, before * tail, dx)
        return xp.moveaxis(dx, -1, axis).astype(a.dtype, copy=False), None, None


def cumsum(input, dim, dtype=None):  # noqa: A002 - torch's names
    a = input.array
    return Cumsum.apply(input, normalize_dim("cumsum", dim, a.ndim), _scan_dtype(a, dtype))


def cumprod(input, dim, dtype=None):  # noqa: A002
    a = input.array
    return Cumprod.apply(input, normalize_dim("cumprod", dim, a.ndim), _scan_dtype(a, dtype))

"""Sorting and selection: sort, argsort, topk (values and indices, the gradient routed to the indices) and unique.

Order follows torch: NaN counts as larger than every number (last ascending, first descending); sorts are stable,
so ties keep their input order (descending too).
"""
from collections import namedtuple

import numpy as np

from ..autograd.function import Function
from ..tensor import Tensor
from ._util import normalize_dim, xp_of

topk_result = namedtuple("topk", ["values", "indices"])
sort_result = namedtuple("sort", ["values", "indices"])


def _argsort(a, axis, descending):
    """Stable argsort along axis; descending keeps ties in input order (argsort of the flipped input, reversed)."""
    xp = xp_of(a)
    kw = {"kind": "stable"}   # CuPy's sorts are stable and accept only this kind
    if a.dtype == np.bool_:
        a = a.astype(np.uint8)
    if not descending:
        return xp.argsort(a, axis=axis, **kw)
    n = a.shape[axis]
    flipped = xp.argsort(xp.flip(a, axis), axis=axis, **kw)
    return (n - 1) - xp.flip(flipped, axis)


def _scatter_along(shape, axis, idx, g):
    """Zeros of `shape` with g written at idx along axis (idx: distinct positions per slice, as a sort's)."""
    xp = xp_of(g)
    out = xp.zeros(shape, g.dtype)
    grid = [xp.arange(n).reshape((1,) * i + (n,) + (1,) * (idx.ndim - i - 1)) for i, n in enumerate(idx.shape)]
    grid[axis] = idx
    out[tuple(grid)] = g
    return out


class SortSelect(Function):
    """The first k entries of a sort along dim (k = the whole dim for sort): values and int64 indices."""

    @staticmethod
    def forward(ctx, x, dim, descending, k):
        a = x.array
        xp = xp_of(a)
        if a.ndim == 0:
            ctx.shape, ctx.axis, ctx.idx = a.shape, 0, None
            return a.copy(), xp.zeros((), np.int64)
        idx = _argsort(a, dim, descending)
        if k is not None and k != a.shape[dim]:
            idx = xp.take(idx, xp.arange(k), axis=dim)
        idx = idx.astype(np.int64, copy=False)
        ctx.shape, ctx.axis, ctx.idx = a.shape, dim, idx
        return xp.take_along_axis(a, idx, axis=dim), idx

    @staticmethod
    def backward(ctx, dvalues, dindices):
        g = dvalues.array
        if ctx.idx is None:
            return g, None, None, None
        return _scatter_along(ctx.shape, ctx.axis, ctx.idx, g), None, None, None


def sort(input, dim=-1, descending=False, *, stable=False):  # noqa: A002 - torch's names
    """(values, indices) sorted along dim; stable always (torch's CPU sort is too)."""
    d = normalize_dim("sort", dim, input.array.ndim)
    return sort_result(*SortSelect.apply(input, d, bool(descending), None))


def argsort(input, dim=-1, descending=False, *, stable=False):  # noqa: A002
    d = normalize_dim("argsort", dim, input.array.ndim)
    a = input.array
    if a.ndim == 0:
        return Tensor._wrap(xp_of(a).zeros((), np.int64))
    return Tensor._wrap(_argsort(a, d, bool(descending)).astype(np.int64, copy=False))


def topk(input, k, dim=-1, largest=True, sorted=True):  # noqa: A002
    """The k largest (or smallest) entries along dim and their indices, largest first (smallest first)."""
    a = input.array
    d = normalize_dim("topk", dim, a.ndim)
    n = a.shape[d] if a.ndim else 1
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool):
        raise TypeError(f"topk(): argument 'k' must be int, not {type(k).__name__}")
    if not 0 <= k <= n:
        raise RuntimeError(f"topk: selected index k out of range (k={k}, dimension {d} has size {n})")
    return topk_result(*SortSelect.apply(input, d, bool(largest), int(k)))


def unique(input, sorted=True, return_inverse=False, return_counts=False, dim=None):  # noqa: A002
    """The distinct values (sorted), and optionally each input element's index among them and their counts.
    Not differentiable (as torch's)."""
    a = input.array
    xp = xp_of(a)
    if dim is None:
        res = xp.unique(a.reshape(-1), return_inverse=True, return_counts=True)
        values, inverse, counts = res
        inverse = inverse.reshape(a.shape)
    else:
        d = normalize_dim("unique", dim, a.ndim)
        values, inverse, counts = xp.unique(a, return_inverse=True, return_counts=True, axis=d)
        inverse = inverse.reshape(-1)
    out = [Tensor._wrap(values)]
    if return_inverse:
        out.append(Tensor._wrap(inverse.astype(np.int64, copy=False)))
    if return_counts:
        out.append(Tensor._wrap(counts.astype(np.int64, copy=False)))
    return out[0] if len(out) == 1 else tuple(out)

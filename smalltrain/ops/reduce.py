"""Reductions over dims: sum, mean, var, std, max/min (values and indices), amax/amin, logsumexp, argmax/argmin.

Gradients follow torch: max(dim) routes to the returned index; max() and amax/amin split evenly among ties.
"""
import math

import numpy as np

from .._dtype import get_default_dtype, to_numpy_dtype
from ..autograd.function import Function
from ..tensor import Tensor
from ._util import normalize_dim, normalize_dims, xp_of


def _expand_back(g, shape, axes, keepdim):
    """Reshape a reduced gradient so that it broadcasts against the input again."""
    if not keepdim and axes:
        g = g.reshape([1 if i in axes else n for i, n in enumerate(shape)])
    return g


class Sum(Function):
    @staticmethod
    def forward(ctx, x, dim=None, keepdim=False, dtype=None):
        a = x.array
        axes = normalize_dims("sum", dim, a.ndim)
        ctx.shape, ctx.axes, ctx.keepdim = a.shape, axes, keepdim
        if dtype is None and a.dtype.kind in "bui":
            dtype = np.int64  # torch sums integers and bools as int64
        return a.sum(axis=None if dim is None else axes, keepdims=keepdim, dtype=dtype)

    @staticmethod
    def backward(ctx, dout):
        g = _expand_back(dout.array, ctx.shape, ctx.axes, ctx.keepdim)
        return xp_of(g).broadcast_to(g, ctx.shape), None, None, None


class Mean(Function):
    @staticmethod
    def forward(ctx, x, dim=None, keepdim=False, dtype=None):
        a = x.array
        if a.dtype.kind not in "fc" and dtype is None:
            raise RuntimeError(f"mean(): could not infer output dtype. Input dtype must be either a floating "
                               f"point or complex dtype. Got: {x.dtype}")
        axes = normalize_dims("mean", dim, a.ndim)
        ctx.shape, ctx.axes, ctx.keepdim = a.shape, axes, keepdim
        ctx.count = math.prod([a.shape[i] for i in axes])
        return a.mean(axis=None if dim is None else axes, keepdims=keepdim, dtype=dtype)

    @staticmethod
    def backward(ctx, dout):
        g = _expand_back(dout.array, ctx.shape, ctx.axes, ctx.keepdim) / ctx.count
        return xp_of(g).broadcast_to(g, ctx.shape), None, None, None


def _check_float(op, a):
    if a.dtype.kind != "f":
        raise RuntimeError(f"{op}: std and var only support floating point and complex dtypes (got {a.dtype})")


class Var(Function):
    @staticmethod
    def forward(ctx, x, dim=None, correction=1, keepdim=False):
        return _var(ctx, "var", x.array, dim, correction, keepdim)

    @staticmethod
    def backward(ctx, dout):
        return _var_grad(ctx, dout.array), None, None, None


def _var(ctx, op, a, dim, correction, keepdim):
    """var(a) over dim, checked as `op`; keeps what _var_grad reads (the centered input, the divisor, the dims)."""
    _check_float(op, a)
    axes = normalize_dims(op, dim, a.ndim)
    n = math.prod([a.shape[i] for i in axes])
    with np.errstate(divide="ignore", invalid="ignore"):
        centered = a - a.mean(axis=axes, keepdims=True)
        denom = n - correction if n > correction else 0  # (the builtin max is shadowed here)
        ctx.centered, ctx.denom, ctx.axes, ctx.keepdim = centered, denom, axes, keepdim
        return (centered * centered).sum(axis=axes, keepdims=keepdim) / denom


def _var_grad(ctx, g):
    """d var / d a times g (g: the gradient of var's output)."""
    g = _expand_back(g, ctx.centered.shape, ctx.axes, ctx.keepdim)
    scale = 2 / ctx.denom if ctx.denom else math.inf
    return g * scale * ctx.centered


class Std(Function):
    """sqrt(var) as one op: like torch, a zero std gives a zero gradient instead of inf * 0."""

    @staticmethod
    def forward(ctx, x, dim=None, correction=1, keepdim=False):
        ctx.out = xp_of(x.array).sqrt(_var(ctx, "std", x.array, dim, correction, keepdim))
        return ctx.out

    @staticmethod
    def backward(ctx, dout):
        xp = xp_of(dout.array)
        with np.errstate(divide="ignore", invalid="ignore"):
            gv = xp.where(ctx.out == 0, 0, dout.array / (2 * ctx.out))
        return _var_grad(ctx, gv), None, None, None


class MaxMin(Function):
    """max/min over one dim, returning values and indices; the gradient goes to the index."""

    @staticmethod
    def forward(ctx, x, dim, keepdim, is_max):
        a = x.array
        xp = xp_of(a)
        d = normalize_dim("max" if is_max else "min", dim, a.ndim)
        if a.ndim and a.shape[d] == 0:
            raise IndexError(f"{'max' if is_max else 'min'}(): Expected reduction dim {dim} to have non-zero size.")
        a_ = a if a.ndim else a.reshape(1)
        idx = xp.expand_dims(_arg(xp, a_, d, is_max), d)
        vals = xp.take_along_axis(a_, idx, axis=d)
        ctx.shape, ctx.d, ctx.idx = a.shape, d, idx
        if not keepdim or not a.ndim:
            vals, idx_out = vals.squeeze(d), idx.squeeze(d)
        else:
            idx_out = idx
        if not a.ndim:
            vals, idx_out = vals.reshape(()), idx_out.reshape(())
        ind = Tensor._wrap(idx_out.astype(np.int64, copy=False))
        ctx.mark_non_differentiable(ind)
        return Tensor._wrap(vals), ind

    @staticmethod
    def backward(ctx, dout, dind):
        g = dout.array
        xp = xp_of(g)
        shape = ctx.shape if ctx.shape else (1,)
        dx = xp.zeros(shape, g.dtype)
        xp.put_along_axis(dx, ctx.idx, g.reshape(ctx.idx.shape), axis=ctx.d)
        return dx.reshape(ctx.shape), None, None, None


def _arg(xp, a, d, is_max):
    """argmax/argmin; NumPy, like torch, returns the first NaN where there is one, else the first extreme."""
    return xp.argmax(a, axis=d) if is_max else xp.argmin(a, axis=d)


def _check_nonempty(op, a, axes, dim):
    if a.size == 0:
        if dim is None:
            raise RuntimeError(f"{op}(): Expected reduction dim to be specified for input.numel() == 0. Specify "
                               "the reduction dim with the 'dim' argument.")
        for d in axes:
            if a.shape[d] == 0:
                raise IndexError(f"{op}(): Expected reduction dim {d} to have non-zero size.")


class AMaxMin(Function):
    """amax/amin (and max()/min() with no dim): the gradient is split evenly among tied extremes."""

    @staticmethod
    def forward(ctx, x, dim, keepdim, is_max, name=None):
        a = x.array
        op = name or ("amax" if is_max else "amin")
        axes = normalize_dims(op, dim, a.ndim)
        _check_nonempty(op, a, axes, dim)
        out = a.max(axis=axes, keepdims=True) if is_max else a.min(axis=axes, keepdims=True)
        ctx.a, ctx.out, ctx.axes, ctx.keepdim, ctx.full = a, out, axes, keepdim, name is not None
        return out if keepdim else out.reshape([n for i, n in enumerate(a.shape) if i not in axes])

    @staticmethod
    def backward(ctx, dout):
        g = _expand_back(dout.array, ctx.a.shape, ctx.axes, ctx.keepdim)
        xp = xp_of(g)
        mask = ctx.a == ctx.out
        if ctx.full:   # max()/min() count NaN inputs as matching a NaN result; amax/amin give NaN there (0 / 0)
            mask |= xp.isnan(ctx.a) & xp.isnan(ctx.out)
        count = mask.sum(axis=ctx.axes, keepdims=True)
        return g * mask / count, None, None, None, None


class LogSumExp(Function):
    @staticmethod
    def forward(ctx, x, dim, keepdim=False):
        a = x.array
        if a.dtype.kind != "f":
            a = a.astype(get_default_dtype().np)  # torch returns the default float for integer input
        xp = xp_of(a)
        axes = normalize_dims("logsumexp", dim, a.ndim)
        m = a.max(axis=axes, keepdims=True) if a.size else xp.zeros([1] * a.ndim, a.dtype)
        m = xp.where(xp.isfinite(m), m, 0)  # all -inf rows give -inf, not NaN
        with np.errstate(divide="ignore"):
            out = xp.log(xp.exp(a - m).sum(axis=axes, keepdims=True)) + m
        ctx.a, ctx.out, ctx.axes, ctx.keepdim = a, out, axes, keepdim
        return out if keepdim else out.reshape([n for i, n in enumerate(a.shape) if i not in axes])

    @staticmethod
    def backward(ctx, dout):
        g = _expand_back(dout.array, ctx.a.shape, ctx.axes, ctx.keepdim)
        return g * xp_of(g).exp(ctx.a - ctx.out), None, None


def sum(x, dim=None, keepdim=False, dtype=None):  # noqa: A001
    return Sum.apply(x, dim, keepdim, None if dtype is None else to_numpy_dtype(dtype))


def mean(x, dim=None, keepdim=False, dtype=None):
    return Mean.apply(x, dim, keepdim, None if dtype is None else to_numpy_dtype(dtype))


def _correction(dim, unbiased, correction):
    if isinstance(dim, bool):   # var(x, False): the old `unbiased` positional form
        dim, unbiased = None, dim
    if correction is None:
        correction = 1 if unbiased is None or unbiased else 0
    return dim, correction


def var(x, dim=None, unbiased=None, keepdim=False, correction=None):
    dim, correction = _correction(dim, unbiased, correction)
    return Var.apply(x, dim, correction, keepdim)


def std(x, dim=None, unbiased=None, keepdim=False, correction=None):
    dim, correction = _correction(dim, unbiased, correction)
    return Std.apply(x, dim, correction, keepdim)


def _max_or_min(x, dim, keepdim, is_max, other):
    if other is not None:
        from .elementwise import maximum, minimum
        return maximum(x, other) if is_max else minimum(x, other)
    if dim is None:
        return AMaxMin.apply(x, None, False, is_max, "max" if is_max else "min")
    from ..return_types import values_indices
    return values_indices(*MaxMin.apply(x, dim, keepdim, is_max))


def max(x, dim=None, keepdim=False, other=None):  # noqa: A001
    """max(x) -> the largest value; max(x, dim) -> (values, indices); max(x, other) -> elementwise maximum."""
    if isinstance(dim, Tensor):
        dim, other = None, dim
    return _max_or_min(x, dim, keepdim, True, other)


def min(x, dim=None, keepdim=False, other=None):  # noqa: A001
    if isinstance(dim, Tensor):
        dim, other = None, dim
    return _max_or_min(x, dim, keepdim, False, other)


def amax(x, dim=(), keepdim=False):
    return AMaxMin.apply(x, None if dim == () else dim, keepdim, True)


def amin(x, dim=(), keepdim=False):
    return AMaxMin.apply(x, None if dim == () else dim, keepdim, False)


def logsumexp(x, dim, keepdim=False):
    return LogSumExp.apply(x, dim, keepdim)


def _arg_reduce(x, dim, keepdim, is_max):
    a = x.array
    xp = xp_of(a)
    op = "argmax" if is_max else "argmin"
    if dim is None:
        if a.size == 0:
            raise IndexError(f"{op}(): Expected reduction dim to be specified for input.numel() == 0.")
        r = _arg(xp, a.reshape(-1), 0, is_max)
        return Tensor._wrap(xp.asarray(r, dtype=np.int64).reshape([1] * a.ndim if keepdim else ()))
    d = normalize_dim(op, dim, a.ndim)
    if a.ndim == 0:
        return Tensor._wrap(xp.zeros((), np.int64))
    _check_nonempty(op, a, (d,), dim)
    r = _arg(xp, a, d, is_max).astype(np.int64)
    return Tensor._wrap(xp.expand_dims(r, d) if keepdim else r)


def argmax(x, dim=None, keepdim=False):
    return _arg_reduce(x, dim, keepdim, True)


def argmin(x, dim=None, keepdim=False):
    return _arg_reduce(x, dim, keepdim, False)


def prod(x, dim=None, keepdim=False):
    # not differentiable here; kept for shape arithmetic in user code
    a = x.array
    return Tensor._wrap(a.prod(axis=normalize_dims("prod", dim, a.ndim), keepdims=keepdim))


def all(x, dim=None, keepdim=False):  # noqa: A001
    a = x.array
    return Tensor._wrap(a.all(axis=normalize_dims("all", dim, a.ndim), keepdims=keepdim))


def any(x, dim=None, keepdim=False):  # noqa: A001
    a = x.array
    return Tensor._wrap(a.any(axis=normalize_dims("any", dim, a.ndim), keepdims=keepdim))


def count_nonzero(x, dim=None):
    a = x.array
    return Tensor._wrap(xp_of(a).asarray((a != 0).sum(axis=normalize_dims("count_nonzero", dim, a.ndim)),
                                         dtype=np.int64))

"""Indexing: ints, slices, None, Ellipsis, integer and boolean arrays; gather. Gradients scatter-add repeats."""
import numpy as np

from ..autograd import grad_mode
from ..autograd.function import Function
from ..tensor import Tensor
from ._util import normalize_dim, xp_of


def _convert_key(key, a):
    """Tensors inside an index become arrays; lists become integer/bool arrays, as torch reads them."""
    xp = xp_of(a)

    def one(k):
        if isinstance(k, Tensor):
            k = k.array
            if k.dtype.kind not in "biu":
                raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
            return k
        if isinstance(k, list):
            return xp.asarray(k)
        return k
    if isinstance(key, tuple):
        return tuple(one(k) for k in key)
    return one(key)


def _is_advanced(key):
    items = key if isinstance(key, tuple) else (key,)
    return any(hasattr(k, "dtype") and getattr(k, "ndim", 0) >= 0 and not np.isscalar(k) for k in items)


def _check_bounds(key, shape):
    """IndexError naming the dim and size, before NumPy/CuPy (CuPy would wrap or fault silently)."""
    items = key if isinstance(key, tuple) else (key,)
    dim = 0
    for k in items:
        if k is None:
            continue
        if k is Ellipsis:
            dim = len(shape) - sum(1 for j in items if j is not None and j is not Ellipsis and
                                   not (hasattr(j, "dtype") and j.dtype == np.bool_)) + dim
            continue
        if dim >= len(shape):
            raise IndexError(f"too many indices for tensor of dimension {len(shape)}")
        if isinstance(k, (int, np.integer)) and not isinstance(k, bool):
            if not -shape[dim] <= k < shape[dim]:
                raise IndexError(f"index {k} is out of bounds for dimension {dim} with size {shape[dim]}")
        elif hasattr(k, "dtype") and k.dtype.kind in "iu" and k.size:
            lo, hi = int(k.min()), int(k.max())
            if lo < -shape[dim] or hi >= shape[dim]:
                bad = hi if hi >= shape[dim] else lo
                raise IndexError(f"index {bad} is out of bounds for dimension {dim} with size {shape[dim]}")
        dim += k.ndim if hasattr(k, "dtype") and k.dtype == np.bool_ else 1


class GetItem(Function):
    @staticmethod
    def forward(ctx, x, key):
        a = x.array
        key = _convert_key(key, a)
        _check_bounds(key, a.shape)
        ctx.key, ctx.shape, ctx.dtype = key, a.shape, a.dtype
        ctx.advanced = _is_advanced(key)
        return a[key]

    @staticmethod
    def backward(ctx, dout):
        g = dout.array
        xp = xp_of(g)
        dx = xp.zeros(ctx.shape, g.dtype)
        if ctx.advanced:
            if xp is np:
                np.add.at(dx, ctx.key, g)
            else:
                xp.add.at(dx, ctx.key, g)
        else:
            dx[ctx.key] = g
        return dx, None


def getitem(x, key):
    return GetItem.apply(x, key)


def setitem(x, key, value):
    """`x[key] = value`, untracked; like torch it refuses a leaf that requires grad while recording."""
    if grad_mode._state.enabled and (x.requires_grad or (isinstance(value, Tensor) and value.requires_grad)):
        raise RuntimeError("setitem: in-place assignment into a tensor that requires grad is not supported "
                           "while recording; do it under smalltrain.no_grad()")
    a = x.array
    key = _convert_key(key, a)
    _check_bounds(key, a.shape)
    a[key] = value.array if isinstance(value, Tensor) else value


class Gather(Function):
    @staticmethod
    def forward(ctx, x, dim, index):
        a, idx = x.array, index.array
        d = normalize_dim("gather", dim, a.ndim)
        if idx.ndim != a.ndim:
            raise RuntimeError(f"gather(): Index tensor must have the same number of dimensions as input tensor "
                               f"(got index {list(idx.shape)} for input {list(a.shape)})")
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= a.shape[d]):
            raise RuntimeError(f"gather(): index out of range for dimension {d} with size {a.shape[d]}")
        ctx.shape, ctx.d, ctx.idx = a.shape, d, idx
        return xp_of(a).take_along_axis(a, idx, axis=d)

    @staticmethod
    def backward(ctx, dout):
        g = dout.array
        xp = xp_of(g)
        dx = xp.zeros(ctx.shape, g.dtype)
        grid = list(xp.indices(ctx.idx.shape, sparse=True))
        grid[ctx.d] = ctx.idx
        if xp is np:
            np.add.at(dx, tuple(grid), g)
        else:
            xp.add.at(dx, tuple(grid), g)
        return dx, None, None


def gather(x, dim, index):
    return Gather.apply(x, dim, index)


def index_select(x, dim, index):
    d = normalize_dim("index_select", dim, x.array.ndim)
    return getitem(x, (slice(None),) * d + (index,))


def masked_fill(x, mask, value):
    from .elementwise import where
    v = value.item() if isinstance(value, Tensor) else value
    return where(mask, Tensor._wrap(xp_of(x.array).asarray(v, dtype=x.array.dtype)), x)


def nonzero(x, as_tuple=False):
    nz = xp_of(x.array).nonzero(x.array)
    if as_tuple:
        return tuple(Tensor._wrap(i.astype(np.int64)) for i in nz)
    return Tensor._wrap(xp_of(x.array).stack(nz, axis=1).astype(np.int64))

"""Indexing: ints, slices, None, Ellipsis, integer and boolean arrays; gather. Gradients scatter-add repeats."""
import numpy as np

from ..autograd import grad_mode, versions
from ..autograd.function import Function
from ..backend.cuda import device_checks, index as cuda_index
from ..tensor import Tensor
from .inplace import before_write, check_leaf, commit, link_view
from ._util import check_same_device, check_values, normalize_dim, xp_of

_KERNEL_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_VALID = "only integers, slices (`:`), ellipsis (`...`), None and long or byte or bool tensors are valid indices"


def _item(k, xp):
    """One index item as NumPy/CuPy reads it; Tensors and lists become integer or bool arrays."""
    if isinstance(k, Tensor):
        k = k.array
    elif isinstance(k, list):
        k = xp.asarray(k) if k else xp.zeros(0, np.int64)
    elif k is None or k is Ellipsis or isinstance(k, (slice, int, np.integer)):
        return k
    if not hasattr(k, "dtype") or k.dtype.kind not in "biu":
        what = f"{type(k).__name__}" + (f" of dtype {k.dtype}" if hasattr(k, "dtype") else "")
        raise IndexError(f"{_VALID} (got {what})")
    return k


def _prepare_key(key, shape, xp):
    """The key with arrays in place of Tensors/lists, checked like torch before anything is indexed.

    Returns (key, advanced, scatter): `advanced` when an integer or bool array is involved; `scatter` when
    integer arrays may repeat an element, so the gradient must be summed with add.at rather than assigned.
    """
    tk = type(key)
    if tk is slice and shape and (key.step is None or key.step > 0):
        return key, False, False   # the common x[a:b] needs no further checks
    if tk is int and shape and -shape[0] <= key < shape[0]:
        return key, False, False
    is_tuple = isinstance(key, tuple)
    items = tuple(_item(k, xp) for k in (key if is_tuple else (key,)))
    consumed = 0
    for k in items:
        if k is not None and k is not Ellipsis and not isinstance(k, bool):
            consumed += k.ndim if getattr(k, "dtype", None) == np.bool_ else 1
    if consumed > len(shape):
        raise IndexError(f"too many indices for tensor of dimension {len(shape)}")
    _check_broadcast(items)
    dim, advanced, scatter = 0, False, False
    items = list(items)
    for pos, k in enumerate(items):
        if k is None or isinstance(k, bool):
            advanced = advanced or isinstance(k, bool)
        elif k is Ellipsis:
            dim += len(shape) - consumed
        elif isinstance(k, slice):
            if k.step is not None and k.step <= 0:
                raise ValueError("step must be greater than zero" if k.step < 0 else "slice step cannot be zero")
            dim += 1
        elif isinstance(k, (int, np.integer)):
            if not -shape[dim] <= k < shape[dim]:
                raise IndexError(f"index {k} is out of bounds for dimension {dim} with size {shape[dim]}")
            dim += 1
        elif k.dtype == np.bool_:
            if tuple(k.shape) != tuple(shape[dim:dim + k.ndim]):
                bad = next(i for i in range(k.ndim) if k.shape[i] != shape[dim + i])
                raise IndexError(f"The shape of the mask {list(k.shape)} at index {bad} does not match the shape "
                                 f"of the indexed tensor {list(shape)} at index {dim + bad}")
            dim, advanced = dim + k.ndim, True
        else:
            size = shape[dim]
            check_values((k < -size) | (k >= size), lambda k=k, d=dim, n=size: _out_of_bounds(
                IndexError, "index", k, -n, n, f"for dimension {d} with size {n}"))
            if xp_of(k) is not np:   # the error comes at the next sync: until then, read inside the tensor
                items[pos] = xp_of(k).clip(k, -size, size - 1)
            dim, advanced, scatter = dim + 1, True, True
    return (tuple(items) if is_tuple else items[0]), advanced, scatter


def _out_of_bounds(kind, what, index, lo, hi, where):
    """The `kind` error for the first index outside [lo, hi) (index read at the check: see check_values)."""
    bad = device_checks.first_outside(index, lo, hi)
    return kind(f"{what} {'(one of them)' if bad is None else bad} is out of bounds {where}")


def _check_broadcast(items):
    """Integer index arrays must broadcast together (IndexError as torch; CuPy itself would raise ValueError)."""
    shapes = [tuple(k.shape) for k in items if hasattr(k, "shape") and getattr(k, "ndim", 0) and k.dtype != np.bool_]
    if len(shapes) > 1:
        try:
            np.broadcast_shapes(*shapes)
        except ValueError:
            raise IndexError("shape mismatch: indexing tensors could not be broadcast together with shapes "
                             + ", ".join(str(list(s)) for s in shapes)) from None


class GetItem(Function):
    @staticmethod
    def forward(ctx, x, key):
        a = x.array
        key, _, ctx.scatter = _prepare_key(key, a.shape, xp_of(a))
        ctx.key, ctx.shape = key, a.shape
        try:
            out = a[key]
            if getattr(out, "ndim", 0) == 0 and not (isinstance(key, tuple) and any(k is Ellipsis for k in key)):
                out = a[(key if isinstance(key, tuple) else (key,)) + (Ellipsis,)]   # ints only: a 0-d view, as torch's
            return out
        except (IndexError, ValueError) as e:  # arrays (bool masks among them) that do not broadcast together
            if isinstance(e, ValueError) and "broadcast" not in str(e):
                raise
            raise IndexError(f"index: shape mismatch: {e}") from None

    @staticmethod
    def backward(ctx, dout):
        g = dout.array
        xp = xp_of(g)
        dx = xp.zeros(ctx.shape, g.dtype)
        if ctx.scatter:
            xp.add.at(dx, ctx.key, g)   # repeated indices sum their gradients
        else:
            dx[ctx.key] = g
        return dx, None


class SetItem(Function):
    """`x[key] = value` recorded: x's gradient is zero where it was overwritten, value's is the indexed slice."""

    @staticmethod
    def forward(ctx, x, value, key):
        a = x.array
        key, _, _ = _prepare_key(key, a.shape, xp_of(a))
        out = a.copy()
        _assign(out, key, value.array if isinstance(value, Tensor) else value)
        ctx.key = key
        return out

    @staticmethod
    def backward(ctx, dout):
        g = dout.array
        dx = dv = None
        if ctx.needs_input_grad[0]:
            dx = g.copy()
            dx[ctx.key] = 0
        if ctx.needs_input_grad[1]:
            dv = g[ctx.key]
        return dx, dv, None


def _assign(a, key, v):
    try:
        a[key] = v
    except ValueError as e:
        raise RuntimeError(f"setitem: shape mismatch: value of shape {list(getattr(v, 'shape', ()))} cannot be "
                           f"broadcast to the indexing result ({e})") from None


def getitem(x, key):
    out = GetItem.apply(x, key)
    if out.array.ndim == 0 and not (isinstance(key, tuple) and any(k is Ellipsis for k in key)):
        view_key = (key if isinstance(key, tuple) else (key,)) + (Ellipsis,)
    else:
        view_key = key
    return link_view(out, x, lambda a: a[view_key])   # basic indexing: a view of x (advanced copies)


def setitem(x, key, value):
    """`x[key] = value`. While recording, a leaf that requires grad refuses (as in torch); otherwise a tensor in
    a graph, or a value that requires grad, makes x the output of a recorded SetItem."""
    if grad_mode._state.enabled and (x.requires_grad or (isinstance(value, Tensor) and value.requires_grad)):
        check_leaf(x, "setitem")
        commit(x, "setitem", SetItem.apply(x, value, key))   # written through, x's base rebased if x is a view
        return
    before_write()
    a = x.array
    key, _, _ = _prepare_key(key, a.shape, xp_of(a))
    if isinstance(value, Tensor):
        value = value.array
    if not getattr(a.flags, "writeable", True):
        raise RuntimeError("setitem: the tensor's memory is read-only (an expanded tensor or a read-only NumPy "
                           "array); clone() it first")
    _assign(a, key, value)
    versions.bump(x)


class Gather(Function):
    @staticmethod
    def forward(ctx, x, dim, index):
        a, idx = x.array, index.array
        d = normalize_dim("gather", dim, a.ndim)
        if idx.ndim != a.ndim:
            raise RuntimeError(f"gather(): Index tensor must have the same number of dimensions as input tensor "
                               f"(got index {list(idx.shape)} for input {list(a.shape)})")
        if idx.dtype.kind not in "iu":
            raise RuntimeError(f"gather(): Expected dtype int64 for index, got {idx.dtype}")
        for i in range(a.ndim):
            if i != d and idx.shape[i] > a.shape[i]:
                raise RuntimeError(f"gather(): Size does not match at dimension {i} expected index "
                                   f"{list(idx.shape)} to be no larger than self {list(a.shape)} apart from "
                                   f"dimension {d}")
        ctx.in_shape, out_shape = a.shape, idx.shape
        if a.ndim == 0:   # a 0-d input and index act as 1-element vectors
            a, idx = a.reshape(1), idx.reshape(1)
        ctx.shape, ctx.d, ctx.idx = a.shape, d, idx
        ctx.on_kernel = not isinstance(a, np.ndarray) and a.dtype in _KERNEL_FLOATS and idx.dtype == np.int64
        if ctx.on_kernel:
            # the launcher checks the bounds itself, except while a CUDA graph is captured (no host read then)
            return cuda_index.gather(a, d, idx).reshape(out_shape)
        n = a.shape[d]
        check_values((idx < 0) | (idx >= n), lambda: _out_of_bounds(
            RuntimeError, "gather(): index", idx, 0, n, f"for dimension {d} with size {n}"))
        # torch reads only the leading block of the other dims that the index covers
        a = a[tuple(slice(None) if i == d else slice(0, n) for i, n in enumerate(idx.shape))]
        return xp_of(a).take_along_axis(a, idx, axis=d).reshape(out_shape)

    @staticmethod
    def backward(ctx, dout):
        g = dout.array.reshape(ctx.idx.shape)
        if ctx.on_kernel:
            dx = cuda_index.gather_backward(g, ctx.d, ctx.idx, ctx.shape)
            return dx.reshape(ctx.in_shape), None, None
        xp = xp_of(g)
        dx = xp.zeros(ctx.shape, g.dtype)
        nd = ctx.idx.ndim
        # open grids (what numpy.indices(sparse=True) gives; CuPy's indices has no sparse option)
        grid = [xp.arange(n).reshape((1,) * i + (n,) + (1,) * (nd - i - 1)) for i, n in enumerate(ctx.idx.shape)]
        grid[ctx.d] = ctx.idx
        xp.add.at(dx, tuple(grid), g)   # an index repeated along dim sums its gradients
        return dx.reshape(ctx.in_shape), None, None


def gather(x, dim, index):
    check_same_device("gather", x, index)
    return Gather.apply(x, dim, index)


def index_select(x, dim, index):
    d = normalize_dim("index_select", dim, x.array.ndim)
    return getitem(x, (slice(None),) * d + (index,))


def masked_fill(x, mask, value):
    from .elementwise import where
    check_same_device("masked_fill", x, mask)
    xp = xp_of(x.array)
    if isinstance(value, Tensor) and value.array.ndim:
        raise RuntimeError(f"masked_fill_ only supports a 0-dimensional value tensor, but got tensor with "
                           f"{value.array.ndim} dimension(s).")
    if isinstance(value, Tensor) and xp_of(value.array) is xp:
        v = value.array.astype(x.array.dtype)   # on x's device already: no host read
    else:
        v = xp.asarray(value.item() if isinstance(value, Tensor) else value, dtype=x.array.dtype)
    return where(mask, Tensor._wrap(v), x)


def nonzero(x, as_tuple=False):
    nz = xp_of(x.array).nonzero(x.array)
    if as_tuple:
        return tuple(Tensor._wrap(i.astype(np.int64)) for i in nz)
    return Tensor._wrap(xp_of(x.array).stack(nz, axis=1).astype(np.int64))

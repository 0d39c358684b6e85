"""In-place ops with torch's semantics: the result is written into the tensor's own memory (so into its base's, for a
view), and while recording, the in-place op joins the graph: the tensor's history moves onto it, and a view's base
is rebased onto a CopySlices node, so that backward through the base sees the write (torch's "CopySlices").

A view remembers its base tensor and how to make the view from the base's array (`tensor._view = (base, fn,
version)`); view ops (basic indexing, view/reshape/flatten/squeeze/unsqueeze, permute/transpose) set it with
link_view. A base counts its recorded in-place writes (`_version`, once it has views); a view whose version is
behind takes the base's new history when next used by an op (refresh_view, called from Function.apply).
Every write here counts in the memory's version counter (autograd/versions.py), so that backward refuses values an
op saved before they were overwritten; the node that made the tensor gets a copy of what it saved instead (torch
raises there too, where the op saved its output).
"""
import numpy as np

from ..autograd import grad_mode, versions
from ..autograd.versions import overlaps
from ..autograd.function import Function, stale_views
from ..backend import hooks
from ..tensor import Tensor


def link_view(out, x, fn):
    """Mark `out`, made from x by a view op whose array-level form is fn(array), as a view of x's base (when its
    array does share x's memory: a reshape may have copied). Returns out."""
    a, o = x.array, out.array
    if type(o) is np.ndarray:   # NumPy: a view's base is the array owning the memory (cheaper than a bounds check)
        b = o.base
        if b is None or out is x or (b is not a and b is not a.base):
            return out
    elif out is x or not overlaps(o, a):
        return out
    if x._view is None:
        if x._version is None:
            x._version = 0
        out._view = (x, fn, x._version)
    else:
        base, first, _ = x._view
        out._view = (base, lambda a: fn(first(a)), base._version)
    return out


def recording(t, *operands):
    """Whether an in-place op on t with these operands must be recorded."""
    if not grad_mode._state.enabled:
        return False
    return t.requires_grad or any(isinstance(o, Tensor) and o.requires_grad for o in operands)


def check_leaf(t, op):
    """torch refuses in-place ops, while recording, on a leaf that requires grad and on views of one."""
    if t.requires_grad and t._ctx is None:
        raise RuntimeError(f"{op}: a leaf Variable that requires grad is being used in an in-place operation. "
                           "Wrap the update in smalltrain.no_grad().")
    if t._view is not None:
        base = t._view[0]
        if base.requires_grad and base._ctx is None:
            raise RuntimeError(f"{op}: a view of a leaf Variable that requires grad is being used in an in-place "
                               "operation. Wrap the update in smalltrain.no_grad().")


def recorded(t, op, compute, saves_input=True):
    """In-place op `op` on t while recording: `compute(x)` makes the result out of place from a tensor x that
    carries t's values and history; the result is written into t's memory and t (and its base) take its history.

    saves_input: whether compute's op keeps x's array for backward; x is then a copy, so the write into t's
    memory cannot change what backward reads.
    """
    check_leaf(t, op)
    if t._view is not None and t._view[2] != t._view[0]._version:
        refresh_view(t)
    x = Tensor._wrap(t.array.copy() if saves_input else t.array, t.requires_grad)
    x._ctx, x._out_idx = t._ctx, t._out_idx
    return commit(t, op, compute(x))


def commit(t, op, new):
    """Write the recorded result `new` into t in place and move t's (and its base's) history onto it."""
    a = t.array
    if new.array.shape != a.shape:
        raise RuntimeError(f"{op}: output with shape {list(a.shape)} doesn't match the broadcast shape "
                           f"{list(new.array.shape)}")
    if new.array.dtype != a.dtype:
        if (new.array.dtype.kind == "f" and a.dtype.kind != "f") or (a.dtype.kind == "b" and
                                                                     new.array.dtype.kind != "b"):
            raise RuntimeError(f"{op}: result type {new.dtype} can't be cast to the desired output type {t.dtype}")
        new = new.to(t.dtype)
    _keep_saved(t)
    if getattr(a.flags, "writeable", True):
        a[...] = new.array
    else:   # read-only memory (an expanded tensor): the tensor gets memory of its own
        t.array = new.array
    versions.bump(t)
    if t._view is None or not new.requires_grad:
        t._ctx, t._out_idx, t.requires_grad = new._ctx, new._out_idx, new.requires_grad
        if t._version is not None:   # t has views: they now read t's new history (refresh_view)
            t._version += 1
            stale_views[0] = True
        return t
    base, fn, _ = t._view
    rebased = CopySlices.apply(base, new, fn)
    base._ctx, base._out_idx, base.requires_grad = rebased._ctx, 0, True
    base._version += 1
    stale_views[0] = True
    view = AsView.apply(base, fn)
    t._ctx, t._out_idx, t.requires_grad = view._ctx, 0, True
    t._view = (base, fn, base._version)
    return t


def refresh_view(t):
    """A view made before its base was written in place while recording: its history becomes the base's."""
    base, fn, _ = t._view
    t._view = (base, fn, base._version)
    if base.requires_grad:
        view = AsView.apply(base, fn)
        t._ctx, t._out_idx, t.requires_grad = view._ctx, 0, True


def _keep_saved(t):
    """The nodes that made t (and its base) may have saved the values about to be overwritten (exp and sigmoid
    save their output): give them a copy."""
    for owner in (t, t._view[0] if t._view is not None else None):
        node = owner._ctx if owner is not None else None
        if node is None or node.freed:
            continue
        for k, v in list(node.__dict__.items()):
            if hasattr(v, "strides") and overlaps(v, t.array):
                node.__dict__[k] = v.copy()
        if node.to_save:
            node.to_save = tuple(Tensor._wrap(s.array.copy()) if isinstance(s, Tensor) and overlaps(s.array, t.array)
                                 else s for s in node.to_save)


def before_write():
    """Run the op held back or deferred, if any, before an unrecorded in-place write: it may read the memory about
    to be written, and must see it as it was when the op was called (recorded writes run ops, which run it)."""
    if hooks.held is not None:
        hooks.flush()


def write(t, value):
    """Write `value` (array or scalar) into t's memory, keeping t's dtype and identity (no recording)."""
    before_write()
    a = t.array
    if not getattr(a.flags, "writeable", True):
        from ._util import xp_of
        t.array = xp_of(a).asarray(value, dtype=a.dtype).reshape(a.shape).copy()
    else:
        a[...] = value
    versions.bump(t)
    return t


def _positions(fn, shape, xp):
    """The flat positions in a base of `shape` of the elements of the view fn(base)."""
    return xp.asarray(fn(xp.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)))


class CopySlices(Function):
    """The base after an in-place op on its view fn(base) wrote `value` there: base's old values elsewhere."""

    @staticmethod
    def forward(ctx, base, value, fn):
        ctx.view_fn = fn
        return base.array

    @staticmethod
    def backward(ctx, dout):
        from ._util import xp_of
        g = dout.array
        xp = xp_of(g)
        pos = _positions(ctx.view_fn, g.shape, xp)
        d_base = d_value = None
        if ctx.needs_input_grad[0]:
            d_base = g.copy()
            d_base.reshape(-1)[pos.reshape(-1)] = 0
        if ctx.needs_input_grad[1]:
            d_value = xp.ascontiguousarray(g).reshape(-1)[pos]
        return d_base, d_value, None


class AsView(Function):
    """A view fn(base) made again from the rebased base (torch's AsStridedBackward after CopySlices)."""

    @staticmethod
    def forward(ctx, base, fn):
        ctx.view_fn, ctx.shape = fn, base.array.shape
        return fn(base.array)

    @staticmethod
    def backward(ctx, dout):
        from ._util import xp_of
        g = dout.array
        xp = xp_of(g)
        pos = _positions(ctx.view_fn, ctx.shape, xp)
        dx = xp.zeros(ctx.shape, g.dtype)
        dx.reshape(-1)[pos.reshape(-1)] = g.reshape(-1)
        return dx, None


class Overwrite(Function):
    """x's values replaced by `src` broadcast to x's shape and dtype (fill_, zero_ and copy_ while recording):
    x gets no gradient, src gets the gradient summed to its shape."""

    @staticmethod
    def forward(ctx, x, src):
        from ._util import xp_of
        a = x.array
        s = src.array if isinstance(src, Tensor) else src
        ctx.dtype = getattr(s, "dtype", None)
        out = xp_of(a).empty_like(a)
        try:
            out[...] = s
        except ValueError as e:
            raise RuntimeError(f"copy_: cannot copy a tensor of shape {list(getattr(s, 'shape', ()))} into one of "
                               f"shape {list(a.shape)} ({e})") from None
        return out

    @staticmethod
    def backward(ctx, dout):
        g = dout.array
        return None, (g if ctx.dtype is None else g.astype(ctx.dtype, copy=False))


stale_views[1] = refresh_view

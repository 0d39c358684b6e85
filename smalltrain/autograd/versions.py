"""Version counters: backward refuses to use values that an in-place write changed after an op saved them, as
torch does ("one of the variables needed for gradient computation has been modified by an inplace operation").

A tensor's memory has one counter, shared by its views and by `detach()` (not by `.data`, as in torch), made when
the tensor first feeds a recorded op. Every in-place write into the memory bumps it (`bump`): the in-place tensor
ops, setitem, `inplace=True` layers and the optimizers' steps. A recorded op notes each input's counter and value
(`note_inputs`); backward, before running a node, checks them (`check`). A changed counter fails the backward only
where the node really saved memory that the write touched: the ops save raw arrays, often views of their inputs,
so an op that saved nothing of a tensor (add) or saved a copy goes on with correct values, as torch's add does.
"""
import numpy as np


class Counter:
    """In-place writes so far into one tensor's memory, and the array last written (its memory, for the check; its
    range is computed only when a check finds the count changed, since a step writes every parameter)."""

    __slots__ = ("n", "array")

    def __init__(self):
        self.n = 0
        self.array = None


def bounds(a):
    """The [low, high) byte range an array's elements occupy."""
    ptr = a.ctypes.data if isinstance(a, np.ndarray) else a.data.ptr
    if a.size == 0:
        return ptr, ptr
    lo = hi = ptr
    for n, s in zip(a.shape, a.strides):
        if s < 0:
            lo += (n - 1) * s
        else:
            hi += (n - 1) * s
    return lo, hi + a.itemsize


def overlaps(a, b):
    """Whether two arrays of one device may share memory (a bounds check, as numpy.may_share_memory)."""
    if type(a) is not type(b) or not hasattr(a, "strides") or not hasattr(b, "strides"):
        return False
    (alo, ahi), (blo, bhi) = bounds(a), bounds(b)
    return alo < bhi and blo < ahi


def counter(t):
    """The counter of t's memory (its base's, for a view), made on first use."""
    owner = t._view[0] if t._view is not None else t
    c = owner._vc
    if c is None:
        c = owner._vc = Counter()
    return c


def bump(t):
    """Count an in-place write into t's memory. Free where no recorded op has taken the memory as an input."""
    owner = t._view[0] if t._view is not None else t
    c = owner._vc
    if c is not None:
        c.n += 1
        c.array = owner.array


def note_inputs(ctx, args, tensor_type):
    """Record on node ctx the counter and count of each tensor input (Function.apply, while recording). (counter()
    inlined: this runs for every recorded op, and the call doubled its cost, 0.3 -> 0.6 us for two inputs.)"""
    noted = []
    for a in args:
        if isinstance(a, tensor_type):
            owner = a._view[0] if a._view is not None else a
            c = owner._vc
            if c is None:
                c = owner._vc = Counter()
            noted.append((c, c.n))
    ctx.versions = noted


def check(node):
    """Raise torch's error when memory this node saved was written in place since it ran."""
    for c, n in node.versions:
        if c.n != n and _saved_overlap(node, *bounds(c.array)):
            raise RuntimeError(
                f"one of the variables needed for gradient computation has been modified by an inplace operation: "
                f"[{c.array.dtype} tensor of shape {list(c.array.shape)}], saved by {node.name()}, is at version "
                f"{c.n}; expected version {n} instead. Hint: the in-place write came after the op that needed the "
                "old values; write into a clone() instead, or make the write after backward.")


def _saved_overlap(node, lo, hi):
    """Whether an array the node saved lies in [lo, hi): directly, in a tuple or list, or as a field of a record
    (the CUDA layers keep theirs in one, as backend/cuda/linear.py's LinearSaved)."""
    for v in list(node.__dict__.values()) + list(node.to_save):
        for a in _arrays(v, 2):
            alo, ahi = bounds(a)
            if alo < hi and lo < ahi:
                return True
    return False


def _arrays(v, depth):
    v = getattr(v, "array", v)
    if isinstance(v, np.ndarray) or hasattr(getattr(v, "data", None), "ptr"):   # a NumPy or CuPy array
        yield v
    elif depth and isinstance(v, (tuple, list)):
        for u in v:
            yield from _arrays(u, depth - 1)
    elif depth and hasattr(v, "__dict__") and not isinstance(v, type):
        for u in vars(v).values():
            yield from _arrays(u, depth - 1)

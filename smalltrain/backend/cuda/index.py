"""CUDA gather and scatter-add along one dim (kernels/index.cu), torch.gather / torch.scatter_add semantics; the
index may be smaller than the input in the other dims (the kernels then work on a sliced contiguous copy); and
several device-to-device copies in one launch (copy_many), also as graph nodes whose sources change per replay."""

import math
import numpy as np

from . import cupy, device_checks, graphs
from ._common import NULL, check_array, check_dtype, check_float, contiguous, dim_index, i64, launch, same_device
from .loader import kernel, launch_1d

COPY_MAX = 4   # copies per launch (index.cu ST_COPY_MAX)


def copy_many(pairs, updatable=False):
    """dst[...] = src for each (dst, src) pair of C-contiguous arrays of one device with the same number of bytes,
    on the current stream, in one launch per COPY_MAX pairs (index.cu copy_many) instead of a copy each.

    updatable (during a capture): each COPY_MAX pairs, empty ones too, are one kernel node whose sources can be
    replaced before a replay (copy_sources); the nodes are returned (None outside a capture, where nothing is
    launched)."""
    op = "copy_many"
    for k, (dst, src) in enumerate(pairs):
        check_array(op, f"dst[{k}]", dst)
        check_array(op, f"src[{k}]", src)
        for name, a in ((f"dst[{k}]", dst), (f"src[{k}]", src)):
            if not a.flags.c_contiguous:
                raise RuntimeError(f"{op}: expected C-contiguous arrays, got {name} of shape {list(a.shape)} and "
                                   f"strides {list(a.strides)}")
        if dst.nbytes != src.nbytes:
            raise RuntimeError(f"{op}: expected dst[{k}] and src[{k}] of the same size in bytes, got {dst.nbytes} and "
                               f"{src.nbytes}")
        same_device(op, dst, src)
    if updatable and not graphs.is_current_stream_capturing():
        return None
    nodes, kern = [], kernel("index", "copy_many")
    for i in range(0, len(pairs), COPY_MAX):
        group = [(d, s) for d, s in pairs[i:i + COPY_MAX] if d.nbytes or updatable]
        if not group:
            continue
        args = []
        for dst, src in group:
            args += [dst, src, i64(dst.nbytes)]
        args += [NULL, NULL, i64(0)] * (COPY_MAX - len(group))
        # a thread per 16-byte vector of the largest copy (or per byte of one that cannot be vectorized); the
        # kernel loops over the grid, so a node's later sources need no other grid
        threads = max(max(d.nbytes // 16 + d.nbytes % 16 if (d.data.ptr | s.data.ptr) % 16 == 0 else d.nbytes
                          for d, s in group), 1)
        if updatable:
            block = min(threads, 256)
            nodes.append(graphs.updatable_launch(kern, (min(-(-threads // block), 2048),), (block,), tuple(args)))
        else:
            launch_1d(kern, threads, tuple(args), max_blocks=2048)
    return nodes


def copy_sources(node, sources):
    """Before the next replays of an updatable copy_many node: sources[k] (an array of dst_k's size, C-contiguous,
    on its device, which the caller ensures) is copied into dst_k; None copies nothing into it."""
    changes = {}
    for k, src in enumerate(sources):
        changes[3 * k + 1] = src
        changes[3 * k + 2] = 0 if src is None else src.nbytes
    node.set(changes)


def _check_index(op, x, dim, index, name="self"):
    check_array(op, "index", index)
    if index.dtype != np.int64:
        raise RuntimeError(f"{op}: Expected dtype int64 for index, got {index.dtype}")
    if index.ndim != x.ndim:
        raise RuntimeError(f"{op}: Index tensor must have the same number of dimensions as {name} tensor "
                           f"(index {list(index.shape)}, {name} {list(x.shape)})")
    for d in range(x.ndim):
        if d != dim and index.shape[d] > x.shape[d]:
            raise RuntimeError(f"{op}: Size does not match at dimension {d} expected index {list(index.shape)} to be "
                               f"no larger than {name} {list(x.shape)} apart from dimension {dim}")


def _bounds(op, index, dim, size):
    """Flag indices outside [0, size) on the GPU; the RuntimeError (as torch's) comes at the next host
    synchronization (device_checks.py), nothing is read back here."""
    def error():
        bad = device_checks.first_outside(index, 0, size)
        got = "an index" if bad is None else f"index {bad}"
        return RuntimeError(f"{op}: {got} is out of bounds for dimension {dim} with size {size}")
    device_checks.expect_none((index < 0) | (index >= size), error)


def _region(x_shape, index_shape, dim):
    """Slices of x covering index's extent in every dim except dim (None if that is all of x)."""
    if all(d == dim or a == b for d, (a, b) in enumerate(zip(x_shape, index_shape))):
        return None
    return tuple(slice(None) if d == dim else slice(0, n) for d, n in enumerate(index_shape))


def _sizes(shape, dim, j):
    return math.prod(shape[:dim]), shape[dim], j, math.prod(shape[dim + 1:])


def gather(x, dim, index, check_bounds=None):
    """out[..., j, ...] = x[..., index[..., j, ...], ...] along dim; out has index's shape and x's dtype.

    index int64 with x's ndim, no larger than x outside dim. Out-of-range indices raise RuntimeError (as torch) at
    the next host synchronization (device_checks.py) unless check_bounds is False; they yield NaN, never a read out
    of bounds.
    """
    op = "gather"
    check_array(op, "input", x)
    check_float(op, "input", x)
    d = dim_index(op, dim, x.ndim)
    _check_index(op, x, d, index)
    same_device(op, x, index)
    if x.ndim == 0:
        return gather(x.reshape(1), 0, index.reshape(1), check_bounds).reshape(())
    with x.device:
        region = _region(x.shape, index.shape, d)
        x = contiguous(x if region is None else x[region])
        index = contiguous(index)
        if check_bounds is not False:
            _bounds(op, index, d, x.shape[d])
        outer, size, j, inner = _sizes(x.shape, d, index.shape[d])
        out = cupy().empty(index.shape, dtype=x.dtype)
        launch("index", "gather", x.dtype, out.size, (x, index, out, i64(outer), i64(size), i64(j), i64(inner)))
    return out


def scatter_add(x, dim, index, src, check_bounds=None, inplace=False):
    """torch.scatter_add: out = x (copied unless inplace); out[..., index[..., j, ...], ...] += src[..., j, ...].

    index int64 with x's ndim, no larger than src anywhere and than x outside dim; src has x's dtype. Sums use
    atomicAdd, so their order (the last bits) varies between runs. check_bounds as in gather (out-of-range
    entries are skipped without it). Returns out.
    """
    op = "scatter_add"
    for name, a in (("self", x), ("src", src)):
        check_array(op, name, a)
    check_float(op, "self", x)
    check_dtype(op, "src", src, x.dtype)
    d = dim_index(op, dim, x.ndim)
    _check_index(op, x, d, index)
    if src.ndim != index.ndim or any(a > b for a, b in zip(index.shape, src.shape)):
        raise RuntimeError(f"{op}: Expected index {list(index.shape)} to be no larger than src {list(src.shape)}")
    same_device(op, x, index, src)
    if x.ndim == 0:
        out = scatter_add(x.reshape(1), 0, index.reshape(1), src.reshape(1), check_bounds, inplace)
        return x if inplace else out.reshape(())
    cp = cupy()
    with x.device:
        if check_bounds is not False:
            _bounds(op, index, d, x.shape[d])
        region = tuple(slice(0, n) for n in index.shape)
        src = contiguous(src if tuple(src.shape) == tuple(index.shape) else src[region])
        index = contiguous(index)
        out = x if inplace else x.copy()
        target_region = _region(x.shape, index.shape, d)
        direct = target_region is None and out.flags.c_contiguous
        target = out if direct else cp.zeros(index.shape[:d] + (x.shape[d],) + index.shape[d + 1:], dtype=x.dtype)
        outer, size, j, inner = _sizes(target.shape, d, index.shape[d])
        launch("index", "scatter_add", x.dtype, index.size,
               (target, index, src, i64(outer), i64(size), i64(j), i64(inner)))
        if not direct:
            if target_region is None:
                out += target
            else:
                out[target_region] += target
    return out


def gather_backward(dout, dim, index, x_shape, check_bounds=False):
    """The gradient of gather for an input of x_shape: zeros scattered-added with dout at index."""
    check_array("gather_backward", "grad_output", dout)
    with dout.device:
        zeros = cupy().zeros(tuple(x_shape), dtype=dout.dtype)
    return scatter_add(zeros, dim, index, dout, check_bounds=check_bounds, inplace=True)


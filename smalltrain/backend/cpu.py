"""Array helpers for convolution and pooling on xp (numpy or cupy) arrays: im2col/col2im, padding, layouts.

Convolution works on images stored batch-innermost, [C, H, W, N]: a window row then spans W*N contiguous
elements, so the im2col copy and the col2im adds move long runs instead of one short image row at a time.
"""
import sys
import threading

import numpy as np


def xp_of(a):
    """numpy or cupy, from an array."""
    if isinstance(a, np.ndarray):
        return np
    from . import cuda
    return cuda.cupy()


def as_strided(a, shape, strides):
    """A view of `a`'s memory with the given shape and byte strides (no copy, no bounds check: callers size it)."""
    return xp_of(a).lib.stride_tricks.as_strided(a, shape=shape, strides=strides)


class Workspace:
    """Reusable big scratch buffers (im2col columns and their gradient) for NumPy; CuPy has its own memory pool.

    A fresh multi-megabyte array is mmapped by malloc and costs a page fault per 4 KiB page on first touch, which
    on small VMs costs more than the im2col copy itself. A buffer is handed out again only when nothing else
    holds a reference to it (a saved-for-backward array, or any view of it, keeps it taken).
    """

    def __init__(self, max_bytes=256 << 20):
        self.max_bytes = max_bytes
        self.entries = []  # [buffer, refcount it has when free], most recently used last
        self.lock = threading.Lock()  # two threads must never be handed the same free buffer

    def get(self, shape, dtype):
        dtype = np.dtype(dtype)
        with self.lock:
            for i, (buf, free_refs) in enumerate(self.entries):
                if buf.shape == shape and buf.dtype == dtype and sys.getrefcount(buf) == free_refs:
                    self.entries.append(self.entries.pop(i))
                    return buf
            buf = np.empty(shape, dtype)
            self.entries.append([buf, 0])
            self.entries[-1][1] = sys.getrefcount(buf)  # held by the entry and a local here, as in the loop above
            self._evict()
            return buf

    def _evict(self):
        total = sum(b.nbytes for b, _ in self.entries)
        for entry in list(self.entries[:-1]):
            if total <= self.max_bytes:
                break
            self.entries.remove(entry)
            total -= entry[0].nbytes

    def clear(self):
        with self.lock:
            self.entries.clear()


workspace = Workspace()


def scratch(xp, shape, dtype):
    """An uninitialized array for a temporary: from the workspace on NumPy, fresh on CuPy."""
    return workspace.get(tuple(shape), dtype) if xp is np else xp.empty(shape, dtype)


# Longest run of a GEMM's long dimension handed to OpenBLAS in one call (see matmul_long_n / matmul_long_k)
GEMM_SPLIT = 4608


def matmul_long_n(a, b, out=None):
    """a [M, K] @ b [K, N] for NumPy arrays, as calls of at most GEMM_SPLIT columns of b when N is long.

    OpenBLAS runs LeNet's first convolution ([6, 25] @ [25, 36864]) 1.5-2.5x faster as nine 4096-column products
    than as one (measured 366-577 -> 228-290 us): small M with a long N is its slow case. Same values: each output
    column is the same dot product either way."""
    n = b.shape[1]
    if out is None:
        out = np.empty((a.shape[0], n), dtype=np.result_type(a, b))
    if n <= 2 * GEMM_SPLIT:
        return np.matmul(a, b, out=out)
    step = -(-n // -(-n // GEMM_SPLIT))   # equal pieces
    for s in range(0, n, step):
        np.matmul(a, b[:, s:s + step], out=out[:, s:s + step])
    return out


def matmul_long_k(a, b):
    """a [M, K] @ b [K, N] for NumPy arrays, summed over pieces of at most GEMM_SPLIT of K when K is long and M, N
    are small (a convolution's weight gradient over a large batch of output pixels).

    OpenBLAS runs [25, 36864] @ [36864, 6] ~2x faster as nine partial products (654-668 -> 306-325 us on LeNet's
    first convolution). The partial sums are added in another order than one call adds them: float rounding only."""
    k = a.shape[1]
    if k <= 2 * GEMM_SPLIT or a.shape[0] * b.shape[1] > (1 << 16):
        return a @ b
    step = -(-k // -(-k // GEMM_SPLIT))
    acc = a[:, :step] @ b[:step]
    for s in range(step, k, step):
        acc += a[:, s:s + step] @ b[s:s + step]
    return acc


_ONES = {}


def ones(n, dtype):
    """A read-only NumPy vector of n ones (cached: a reduction by GEMV needs one per size)."""
    key = (n, np.dtype(dtype))
    v = _ONES.get(key)
    if v is None:
        if len(_ONES) > 32:
            _ONES.clear()
        v = _ONES[key] = np.ones(n, dtype)
        v.flags.writeable = False
    return v


def layout_order(a):
    """a's axes from outermost (largest stride) to innermost: the permutation that makes it C-contiguous."""
    return tuple(sorted(range(a.ndim), key=lambda d: (-abs(a.strides[d]), d)))


def in_layout_of(a, ref, min_size=4096):
    """`a` stored with `ref`'s memory order of axes: `a` itself when the orders agree (or it is small), else one
    copy. NumPy runs a binary op between two large arrays of different layouts ~2x slower than that copy plus the
    op (e.g. a gradient in [N, C, H, W] order meeting an activation kept in the batch-inner order of conv2d)."""
    if a.size < min_size or a.shape != ref.shape or a.strides == ref.strides:
        return a
    order = layout_order(ref)
    if layout_order(a) == order:
        return a
    return np.ascontiguousarray(a.transpose(order)).transpose(tuple(np.argsort(order)))


def empty_in_order(xp, order, shape, dtype, fill=None):
    """An array of `shape` stored with its axes in memory order `order` (see layout_order), optionally filled."""
    buf = xp.empty(tuple(shape[d] for d in order), dtype=dtype)
    if fill is not None:
        buf.fill(fill)
    return buf.transpose(tuple(np.argsort(order)))


def empty_like_layout(a, shape, dtype=None, fill=None):
    """An array of `shape` whose memory order of axes follows `a`'s.

    Keeping the producer's layout (e.g. the batch-innermost one conv2d returns) makes every later elementwise
    pass over it contiguous, instead of transposing it back and forth.
    """
    return empty_in_order(xp_of(a), layout_order(a), shape, dtype or a.dtype, fill)


def pad_batch_inner(x, pads, value=0):
    """[N, C, H, W] (any layout) -> contiguous [C, H + top + bottom, W + left + right, N], padded with `value`.

    No copy when `x` is already batch-inner and there is no padding.
    """
    xp = xp_of(x)
    top, bottom, left, right = pads
    xt = x.transpose(1, 2, 3, 0)
    if not (top or bottom or left or right):
        return xp.ascontiguousarray(xt)
    c, h, w, n = xt.shape
    buf = xp.empty((c, h + top + bottom, w + left + right, n), dtype=x.dtype)
    buf[:, :top] = value
    buf[:, top + h:] = value
    buf[:, top:top + h, :left] = value
    buf[:, top:top + h, left + w:] = value
    buf[:, top:top + h, left:left + w] = xt
    return buf


def _window_view(xpad, kernel, stride, dilation, out_hw, groups):
    """The strided view [G, kh, kw, C/G, OH, OW, N] of windows over a contiguous [C, Hp, Wp, N] array."""
    c, _, _, n = xpad.shape
    sc, sh, sw, sn = xpad.strides
    (kh, kw), (st_h, st_w), (dh, dw), (oh, ow) = kernel, stride, dilation, out_hw
    cg = c // groups
    return as_strided(xpad, (groups, kh, kw, cg, oh, ow, n),
                      (cg * sc, dh * sh, dw * sw, sc, st_h * sh, st_w * sw, sn))


def im2col(xpad, kernel, stride, dilation, out_hw, groups=1):
    """Contiguous [C, Hp, Wp, N] -> cols [G, kh*kw*C/G, OH*OW*N]: rows ordered (kh, kw, c), columns (oh, ow, n).

    One copy of one strided view; with stride 1 along W each copied run is OW*N elements long.
    """
    xp = xp_of(xpad)
    view = _window_view(xpad, kernel, stride, dilation, out_hw, groups)
    g, kh, kw, cg, oh, ow, n = view.shape
    cols = scratch(xp, view.shape, xpad.dtype)
    cols[...] = view
    return cols.reshape(g, kh * kw * cg, oh * ow * n)


def col2im(dcols, padded_shape, kernel, stride, dilation, out_hw, groups=1):
    """The adjoint of im2col: cols [G, kh*kw*C/G, OH*OW*N] -> [C, Hp, Wp, N], summing overlapping windows.

    One strided slice-add per kernel offset (kh*kw of them), each over every channel and image at once.
    """
    xp = xp_of(dcols)
    c, hp, wp, n = padded_shape
    (kh, kw), (st_h, st_w), (dh, dw), (oh, ow) = kernel, stride, dilation, out_hw
    cg = c // groups
    dx = xp.zeros(padded_shape, dtype=dcols.dtype)
    dxg = dx.reshape(groups, cg, hp, wp, n)
    d = dcols.reshape(groups, kh, kw, cg, oh, ow, n)
    for i in range(kh):
        for j in range(kw):
            rows = slice(i * dh, i * dh + st_h * (oh - 1) + 1, st_h)
            cols = slice(j * dw, j * dw + st_w * (ow - 1) + 1, st_w)
            dxg[:, :, rows, cols] += d[:, i, j]
    return dx

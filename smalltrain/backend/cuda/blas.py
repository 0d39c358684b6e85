"""cuBLAS GEMM/GEMV called directly (ctypes), so that matrix products can be captured in CUDA graphs.

CuPy refuses every cuBLAS call while a stream is capturing (its setStream raises NotImplementedError), although
cuBLAS itself supports capture (CUDA >= 12.2 allocates its workspace stream-ordered). We therefore keep our own
cuBLAS handle per device and call libcublas through ctypes: one call costs a few microseconds of host time
instead of the ~30 us of cupy.matmul's dispatch, which matters for launch-bound small models too.

Row-major arrays are handed to column-major cuBLAS by the usual identity C^T = B^T A^T, so any operand that is
row- or column-contiguous (plain or transposed views) is used in place without a copy. float32 products are
full float32 unless CUPY_TF32=1 is set (then TF32 tensor cores, as CuPy does).
"""
import ctypes
import os

from . import cupy
from .graphs import is_current_stream_capturing

_OP_N, _OP_T = 0, 1
_TF32_TENSOR_OP_MATH = 3
_INT_MAX = 2 ** 31 - 1


class _Lib:
    """libcublas's entry points with their C signatures, and one handle per device."""

    def __init__(self):
        cp = cupy()
        from cupy_backends.cuda.libs import cublas as _loaded  # noqa: F401 - makes CuPy load libcublas first
        lib = ctypes.CDLL(_library_path())
        vp, i, ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
        sig = {
            "cublasCreate_v2": [ctypes.POINTER(vp)],
            "cublasSetStream_v2": [vp, vp],
            "cublasSetMathMode": [vp, i],
            "cublasSgemm_v2": [vp, i, i, i, i, i, vp, vp, i, vp, i, vp, vp, i],
            "cublasDgemm_v2": [vp, i, i, i, i, i, vp, vp, i, vp, i, vp, vp, i],
            "cublasSgemmStridedBatched": [vp, i, i, i, i, i, vp, vp, i, ll, vp, i, ll, vp, vp, i, ll, i],
            "cublasDgemmStridedBatched": [vp, i, i, i, i, i, vp, vp, i, ll, vp, i, ll, vp, vp, i, ll, i],
            "cublasSgemv_v2": [vp, i, i, i, vp, vp, i, vp, i, vp, vp, i],
            "cublasDgemv_v2": [vp, i, i, i, vp, vp, i, vp, i, vp, vp, i],
        }
        for name, args in sig.items():
            f = getattr(lib, name)
            f.argtypes, f.restype = args, ctypes.c_int
            setattr(self, name, f)
        self.handles = {}    # device id -> [handle, stream the handle is set to]
        self.cp = cp
        self.tf32 = os.getenv("CUPY_TF32") == "1"
        # host scalars (cuBLAS's default pointer mode reads alpha/beta on the host at call/capture time)
        self.scalars = {(k, v): (ctypes.c_float if k == "f" else ctypes.c_double)(v)
                        for k in "fd" for v in (0.0, 1.0)}

    def handle(self):
        """The current device's handle, set to the current stream (setting it is what CuPy refuses in capture)."""
        dev = self.cp.cuda.Device().id
        entry = self.handles.get(dev)
        if entry is None:
            h = ctypes.c_void_p()
            _check(self.cublasCreate_v2(ctypes.byref(h)), "cublasCreate")
            if self.tf32:
                _check(self.cublasSetMathMode(h, _TF32_TENSOR_OP_MATH), "cublasSetMathMode")
            entry = self.handles[dev] = [h, None]
        stream = self.cp.cuda.get_current_stream().ptr
        if entry[1] != stream:
            _check(self.cublasSetStream_v2(entry[0], stream), "cublasSetStream")
            entry[1] = stream
        return entry[0]

    def scalar(self, dtype_char, value):
        s = self.scalars.get((dtype_char, value))
        if s is None:
            s = (ctypes.c_float if dtype_char == "f" else ctypes.c_double)(value)
        return ctypes.byref(s)


def _library_path():
    """The libcublas that CuPy loaded (read from the process's mappings), else the soname of this CUDA major."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rsplit(" ", 1)[-1].strip()
                if "/libcublas.so" in path:
                    return path
    except OSError:
        pass
    major = cupy().cuda.runtime.runtimeGetVersion() // 1000
    return f"libcublas.so.{major}"


_lib = None


def _get():
    global _lib
    if _lib is None:
        _lib = _Lib()
    return _lib


def _check(status, what):
    if status != 0:
        raise RuntimeError(f"{what} failed with cuBLAS status {status}")


def _layout(shape, strides, itemsize):
    """('row'|'col', leading dimension) for a matrix usable in place by cuBLAS, or None (needs a copy)."""
    r, c = shape
    s0, s1 = strides[0] // itemsize, strides[1] // itemsize
    if strides[0] % itemsize or strides[1] % itemsize or s0 < 0 or s1 < 0:
        return None
    if (s1 == 1 or c == 1) and (r == 1 or s0 >= max(c, 1)):
        return "row", (s0 if r > 1 else max(c, 1))
    if (s0 == 1 or r == 1) and (c == 1 or s1 >= max(r, 1)):
        return "col", (s1 if c > 1 else max(r, 1))
    return None


def _operand(a):
    """(array, layout, ld, batch stride) for a 2-D or 3-D operand, copying it only if no layout fits."""
    lay = _layout(a.shape[-2:], a.strides[-2:], a.itemsize)
    if lay is None:
        a = cupy().ascontiguousarray(a)
        lay = _layout(a.shape[-2:], a.strides[-2:], a.itemsize)
    bstride = 0
    if a.ndim == 3 and a.shape[0] > 1:
        if a.strides[0] % a.itemsize or a.strides[0] < 0:
            a = cupy().ascontiguousarray(a)
            lay = _layout(a.shape[-2:], a.strides[-2:], a.itemsize)
        bstride = a.strides[0] // a.itemsize
    return a, lay[0], lay[1], bstride


def supported(a, b):
    """True when gemm handles a @ b: float32/float64 of one dtype, 2-D or 3-D each, one device."""
    return (a.dtype == b.dtype and a.dtype.char in "fd" and 2 <= a.ndim <= 3 and 2 <= b.ndim <= 3
            and a.device.id == b.device.id)


_MAX_PLANS = 4096
_plans = {}   # (shapes, strides, dtype) of both operands -> the cuBLAS call's arguments (see _plan)


def _dims(a, b):
    """(m, k, n, batch of a, batch of b, batch, result shape) of a @ b, a [(B,) m, k], b [(B,) k, n]."""
    m, k = a.shape[-2:]
    n = b.shape[-1]
    ba = a.shape[0] if a.ndim == 3 else 1
    bb = b.shape[0] if b.ndim == 3 else 1
    batch = max(ba, bb)
    return m, k, n, ba, bb, batch, ((batch,) if a.ndim == 3 or b.ndim == 3 else ()) + (m, n)


def _plan(a, b):
    """(result shape, routine name, op1, op2, n, m, k, ldb, lda, stride b, stride a, batch) for a @ b, a [(B,) m, k],
    b [(B,) k, n], when both are usable in place; None for an empty product, k == 0, dimensions beyond int32 or an
    operand that needs a copy (_gemm_general handles those)."""
    m, k, n, ba, bb, batch, shape = _dims(a, b)
    if 0 in (m, n, k, batch) or max(m, n, k) > _INT_MAX:
        return None
    ops = []
    for x, bx in ((a, ba), (b, bb)):
        lay = _layout(x.shape[-2:], x.strides[-2:], x.itemsize)
        if lay is None or (x.ndim == 3 and x.shape[0] > 1 and (x.strides[0] % x.itemsize or x.strides[0] < 0)):
            return None
        ops.append((lay[0], lay[1], x.strides[0] // x.itemsize if bx > 1 else 0))
    (lay_a, lda, sa), (lay_b, ldb, sb) = ops
    ch = a.dtype.char
    name = (f"cublas{ch.upper().replace('F', 'S')}gemm_v2" if batch == 1 else
            f"cublas{ch.upper().replace('F', 'S')}gemmStridedBatched")
    op1 = _OP_N if lay_b == "row" else _OP_T    # column-major B^T
    op2 = _OP_N if lay_a == "row" else _OP_T    # column-major A^T
    return (shape, name, op1, op2, n, m, k, ldb, lda, sb, sa, batch)


def gemm(a, b, out=None, beta=0.0):
    """out = a @ b (+ beta * out), a [(B,) m, k], b [(B,) k, n]; batch dims of size 1 broadcast.

    Callers check `supported(a, b)` and shapes first. out, when given, must be C-contiguous of the result's shape.
    The call's arguments are planned once per operand signature: this runs every GEMM of every step.
    """
    key = (a.shape, a.strides, b.shape, b.strides, a.dtype.char)
    plan = _plans.get(key)
    if plan is None:
        plan = _plan(a, b)
        if plan is None:
            return _gemm_general(a, b, out, beta)
        if len(_plans) >= _MAX_PLANS:   # a program with ever new shapes: start over rather than grow without bound
            _plans.clear()
        _plans[key] = plan
    return _run(plan, a, b, out, beta)


def _run(plan, a, b, out, beta):
    shape, name, op1, op2, n, m, k, ldb, lda, sb, sa, batch = plan
    if out is None:
        out = cupy().empty(shape, dtype=a.dtype)
    lib = _get()
    ch = a.dtype.char
    f = getattr(lib, name)
    if batch == 1:
        status = f(lib.handle(), op1, op2, n, m, k, lib.scalar(ch, 1.0), b.data.ptr, ldb, a.data.ptr, lda,
                   lib.scalar(ch, float(beta)), out.data.ptr, n)
    else:
        status = f(lib.handle(), op1, op2, n, m, k, lib.scalar(ch, 1.0), b.data.ptr, ldb, sb, a.data.ptr, lda, sa,
                   lib.scalar(ch, float(beta)), out.data.ptr, n, m * n, batch)
    _check(status, "gemm" if batch == 1 else "gemm (strided batched)")
    return out


def _gemm_general(a, b, out, beta):
    """gemm for what _plan leaves out: empty results, k == 0, dimensions beyond int32, operands to be copied."""
    cp = cupy()
    m, k, n, _, _, _, shape = _dims(a, b)
    if out is None:
        out = cp.empty(shape, dtype=a.dtype)
    if out.size == 0:
        return out
    if k == 0:
        if beta == 0.0:
            out.fill(0)
        else:
            out *= beta
        return out
    if max(m, n, k) > _INT_MAX:
        out[...] = cp.matmul(a, b) + (beta * out if beta else 0)
        return out
    a, _, _, _ = _operand(a)
    b, _, _, _ = _operand(b)
    plan = _plan(a, b)   # both usable in place now
    assert plan is not None, (a.shape, a.strides, b.shape, b.strides)
    return _run(plan, a, b, out, beta)


_ones = {}


def sum_rows(g, axis):
    """g.sum(axis) for a C-contiguous 2-D float array, as one GEMV against a cached vector of ones.

    The ones vector is made outside graph capture (a capture records its fill without running it); during
    a capture with no vector large enough yet, this falls back to the array library's reduction.
    """
    cp = cupy()
    r, c = g.shape
    length = r if axis == 0 else c
    if not g.flags.c_contiguous or g.dtype.char not in "fd" or max(r, c) > _INT_MAX:
        return g.sum(axis=axis)
    key = (g.device.id, g.dtype.char)
    ones = _ones.get(key)
    if ones is None or ones.size < length:
        if is_current_stream_capturing():
            return g.sum(axis=axis)
        size = 1 << max(16, (length - 1).bit_length())
        ones = _ones[key] = cp.ones(size, dtype=g.dtype)
    out = cp.empty(c if axis == 0 else r, dtype=g.dtype)
    if out.size == 0:
        return out
    if length == 0:
        out.fill(0)
        return out
    lib = _get()
    ch = g.dtype.char
    f = lib.cublasSgemv_v2 if ch == "f" else lib.cublasDgemv_v2
    # column-major view of g is g^T [c, r] with leading dimension c
    trans = _OP_N if axis == 0 else _OP_T
    _check(f(lib.handle(), trans, c, r, lib.scalar(ch, 1.0), g.data.ptr, c, ones.data.ptr, 1, lib.scalar(ch, 0.0),
             out.data.ptr, 1), "gemv")
    return out

"""Dependent launch: our kernels launched with CUDA's programmatic stream serialization while a graph is captured.

In a replayed graph, a kernel's blocks start only after the kernel ahead of it has finished and the GPU has launched
the next: a gap of about a microsecond at each of a small model's ~30 kernels, which is much of a LeNet-5 step.
Every kernel of ours starts with st_dependent_entry() (kernels/common.cuh): it waits (griddepcontrol.wait) until the
kernel ahead in its stream has completed and its writes are visible, then lets its own successor be scheduled. Such
a kernel may therefore be launched with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (cuLaunchKernelEx,
through ctypes: CuPy's launch takes no attributes), so that its blocks are already resident when its predecessor
ends. Results are the same bit for bit: only when a kernel starts changes, not what it reads.

DEPENDENT_LAUNCH switches it on (off: every launch is CuPy's). Only launches inside a capture take it (an eager
step would pay ctypes' host cost at every launch); launches of other kernels (CuPy's, cuBLAS) are never dependent.
"""
import ctypes

import numpy as np

from . import cupy
from .graphs import is_current_stream_capturing

DEPENDENT_LAUNCH = False
_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6   # cuda.h CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION


class _LaunchAttribute(ctypes.Structure):   # cuda.h CUlaunchAttribute: an id, padding, a 64-byte value union
    _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_ubyte * 4), ("value", ctypes.c_int),
                ("value_rest", ctypes.c_ubyte * 60)]


class _LaunchConfig(ctypes.Structure):   # cuda.h CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_mem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


_driver = []   # [cuLaunchKernelEx] once loaded


def _launch_kernel_ex():
    if not _driver:
        fn = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                       ctypes.c_void_p]
        _driver.append(fn)
    return _driver[0]


def _argument(a):
    """A ctypes value holding kernel argument `a` as CuPy passes it (an array: its device pointer; None: a null
    pointer; Python int, float, bool: int64, float64, bool; a NumPy scalar: its own bytes), or None for a type CuPy
    takes some other way (the launch is then CuPy's). The driver copies each parameter's size from it."""
    if a is None:
        return ctypes.c_uint64(0)
    if isinstance(a, np.generic):
        return ctypes.create_string_buffer(a.tobytes(), max(a.itemsize, 1))
    if isinstance(a, bool):
        return ctypes.c_bool(a)
    if isinstance(a, int):
        return ctypes.c_int64(a)
    if isinstance(a, float):
        return ctypes.c_double(a)
    pointer = getattr(getattr(a, "data", None), "ptr", None)   # a CuPy array's MemoryPointer (no CuPy import)
    return ctypes.c_uint64(pointer) if isinstance(pointer, int) else None


def _dims(d):
    d = tuple(d) if isinstance(d, (tuple, list)) else (d,)
    return tuple(d) + (1,) * (3 - len(d))


class Kernel:
    """One of our kernels (a CuPy RawKernel, or the emulator's), called as CuPy's: kernel(grid, block, args,
    shared_mem=0). Launched dependent where DEPENDENT_LAUNCH is on, a graph is being captured and every argument is
    one _argument takes; otherwise exactly CuPy's launch. Other attributes (read and set) are the RawKernel's."""

    dependent_launches = 0   # dependent launches made (tests: the captured steps take this path)

    def __init__(self, raw):
        object.__setattr__(self, "raw", raw)

    def __getattr__(self, name):
        return getattr(self.raw, name)

    def __setattr__(self, name, value):   # e.g. max_dynamic_shared_size_bytes, the shared-memory opt-in
        setattr(self.raw, name, value)

    def __call__(self, grid, block, args, shared_mem=0):
        if DEPENDENT_LAUNCH and is_current_stream_capturing() and self._launch_dependent(grid, block, args,
                                                                                         shared_mem):
            return
        self.raw(grid, block, args, shared_mem=shared_mem)

    def _launch_dependent(self, grid, block, args, shared_mem):
        function = getattr(getattr(self.raw, "kernel", None), "ptr", None)   # the CUfunction (the emulator: none)
        if function is None:
            return False
        values = [_argument(a) for a in args]
        if any(v is None for v in values):
            return False
        params = (ctypes.c_void_p * max(len(values), 1))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p)
                                                            for v in values])
        attr = _LaunchAttribute(id=_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION, value=1)
        config = _LaunchConfig(grid=(ctypes.c_uint * 3)(*_dims(grid)), block=(ctypes.c_uint * 3)(*_dims(block)),
                               shared_mem=int(shared_mem), stream=cupy().cuda.get_current_stream().ptr,
                               attrs=ctypes.pointer(attr), num_attrs=1)
        status = _launch_kernel_ex()(ctypes.byref(config), function, params, None)
        if status != 0:
            raise RuntimeError(f"cuLaunchKernelEx (dependent launch of {getattr(self.raw, 'name', '?')}) failed "
                               f"with CUresult {status}")
        Kernel.dependent_launches += 1
        return True

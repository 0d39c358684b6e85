"""Devices and array modules: `xp` is numpy for CPU arrays and cupy for CUDA arrays; the metadata cache of the ops'
checks and launch plans."""
import functools

import numpy as np

from . import hooks


class Device:
    """A device, spelled like torch's: `Device('cpu')`, `Device('cuda')`, `Device('cuda:1')`, `Device('cuda', 1)`."""

    __slots__ = ("type", "index")

    def __new__(cls, spec="cpu", index=None):
        if isinstance(spec, Device):
            return spec
        if not isinstance(spec, str):
            raise TypeError(f"device: expected a string like 'cpu' or 'cuda:0', got {spec!r}")
        kind, _, idx = spec.partition(":")
        if kind not in ("cpu", "cuda"):
            raise RuntimeError(f"device: expected 'cpu' or 'cuda[:N]', got {spec!r}")
        if idx:
            if index is not None or not idx.isdigit():
                raise RuntimeError(f"device: invalid device string {spec!r}")
            index = int(idx)
        if kind == "cpu":
            index = None
        elif index is None:
            index = 0
        key = (kind, index)
        cached = _DEVICES.get(key)
        if cached is None:
            cached = object.__new__(cls)
            object.__setattr__(cached, "type", kind)
            object.__setattr__(cached, "index", index)
            _DEVICES[key] = cached
        return cached

    def __setattr__(self, name, value):
        raise AttributeError("Device is immutable")

    def __repr__(self):
        return f"device(type='{self.type}')" if self.index is None else \
            f"device(type='{self.type}', index={self.index})"

    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __eq__(self, other):
        if isinstance(other, str):
            other = Device(other)
        return isinstance(other, Device) and self.type == other.type and self.index == other.index

    def __hash__(self):
        return hash((self.type, self.index))

    def __reduce__(self):
        return (Device, (str(self),))


_DEVICES = {}
CPU = Device("cpu")


def as_device(device):
    """None means CPU; strings and ints (CUDA ordinals, as torch accepts) become Devices."""
    if device is None:
        return CPU
    if isinstance(device, int) and not isinstance(device, bool):
        return Device("cuda", device)
    return Device(device)


def device_of(array):
    """The Device an ndarray lives on."""
    if isinstance(array, np.ndarray):
        return CPU
    index = array.device.id
    # the cached Device directly: Device() parses its arguments, a few us on every op's device check
    return _DEVICES.get(("cuda", index)) or Device("cuda", index)


def get_array_module(x):
    """numpy for CPU arrays/devices, cupy for CUDA ones (imported lazily: CPU use never needs CuPy)."""
    if isinstance(x, Device):
        if x.type == "cpu":
            return np
        from . import cuda
        return cuda.cupy()
    if isinstance(x, np.ndarray) or np.isscalar(x):
        return np
    from . import cuda
    return cuda.cupy()


def to_host(array):
    """`array` as a NumPy array: itself on the CPU; a copy of a CUDA array, after the value checks the GPU ran since
    the last synchronization have been read (cuda/device_checks.py: their failures raise here)."""
    if isinstance(array, np.ndarray):
        return array
    if hooks.held is not None:   # what the host reads includes the effects of an op held back (a deferred
        hooks.flush()            # batch_norm's running statistics)
    from .cuda import device_checks
    device_checks.raise_pending()
    return array.get()


def to_device(array, device):
    """Copy an ndarray to `device` (no copy if it is already there)."""
    device = as_device(device)
    if device.type == "cpu":
        return to_host(array)
    from . import cuda
    cp = cuda.cupy()
    if device.index >= cuda.device_count():
        raise RuntimeError(f"to: CUDA device {device.index} requested, but only {cuda.device_count()} visible")
    with cp.cuda.Device(device.index):
        if isinstance(array, cp.ndarray) and array.device.id == device.index:
            return array
        if isinstance(array, np.ndarray) and array.flags.c_contiguous and array.size and is_pinned(array):
            # page-locked source: one direct copy (CuPy would stage it through its own pinned buffer first)
            out = cp.empty(array.shape, dtype=array.dtype)
            rt = cp.cuda.runtime
            rt.memcpyAsync(out.data.ptr, array.ctypes.data, array.nbytes, rt.memcpyHostToDevice,
                           cp.cuda.get_current_stream().ptr)
            return out
        return cp.asarray(array)


def is_pinned(array):
    """True for a NumPy array in page-locked (pinned) host memory, as Tensor.pin_memory makes."""
    from . import cuda
    if not isinstance(array, np.ndarray) or not cuda.is_available():
        return False
    cp = cuda.cupy()
    try:
        attrs = cp.cuda.runtime.pointerGetAttributes(array.ctypes.data)
    except cp.cuda.runtime.CUDARuntimeError:
        return False
    return attrs.type == cp.cuda.runtime.memoryTypeHost


def pin(array):
    """A copy of a NumPy array in page-locked host memory (needs CUDA: the pages are registered with the driver)."""
    from . import cuda
    cp = cuda.cupy()
    mem = cp.cuda.alloc_pinned_memory(max(array.nbytes, 1))
    out = np.frombuffer(mem, dtype=array.dtype, count=array.size).reshape(array.shape)
    out[...] = array
    return out


def metadata_cache(fn):
    """Memoize a pure function of array metadata (shapes, dtypes, geometry arguments): validation and launch
    planning that an eager step would otherwise redo, identically, for every call of every op. Exceptions are not
    cached (bad input raises every time), and unhashable arguments (a list from a caller) take the plain call."""
    memo = functools.lru_cache(maxsize=1024)(fn)

    @functools.wraps(fn)
    def call(*args):
        try:
            return memo(*args)
        except TypeError:   # unhashable arguments, or a TypeError of fn's own checks, which the plain call repeats
            return fn(*args)
    call.cache_clear = memo.cache_clear
    return call

"""Tensor creation: tensor, from_numpy, zeros/ones/empty/full, rand/randn/randint, arange, linspace, eye, *_like."""
import numpy as np

from . import _dtype, random
from .backend import as_device, get_array_module, to_device, to_host
from .tensor import Tensor


def _infer_np_dtype(a, data):
    """torch's inference for Python data: floats -> the default float, ints -> int64, bools -> bool; NumPy
    scalars keep their own dtype."""
    probe = data
    while isinstance(probe, (list, tuple)) and probe:
        probe = probe[0]
    kind = a.dtype.kind
    if isinstance(probe, np.generic) and kind in "biuf":
        return a.dtype
    if kind == "b":
        return np.dtype(np.bool_)
    if kind in "iu":
        return np.dtype(np.int64)
    if kind == "f":
        return _dtype.get_default_dtype().np
    if a.size == 0 and kind not in "OUS":
        return _dtype.get_default_dtype().np
    raise TypeError(f"tensor: could not infer a dtype from data of type {type(probe).__name__}")


def _to_array(data, dtype=None, device=None):
    """Copy `data` (nested lists, scalars, arrays, Tensors) into a fresh array of `dtype` on `device`."""
    np_dtype = _dtype.to_numpy_dtype(dtype)
    if isinstance(data, Tensor):
        data = data.array
    if hasattr(data, "__cuda_array_interface__"):
        a = data.astype(np_dtype or data.dtype, copy=True)
        return a if device is None else to_device(a, device)
    if isinstance(data, np.ndarray):
        a = np.array(data, dtype=np_dtype or (data.dtype if data.dtype in _dtype._BY_NP
                                             else _dtype.from_numpy_dtype(data.dtype).np))
    else:
        if isinstance(data, (list, tuple)) and data and isinstance(data[0], Tensor):
            data = [to_host(d.array) for d in data]
        if np_dtype is not None:
            a = np.array(data, dtype=np_dtype)
        else:
            a = np.array(data)
            a = a.astype(_infer_np_dtype(a, data), copy=False)
    _dtype.from_numpy_dtype(a.dtype)  # rejects unsupported element types (object, complex, ...)
    dev = as_device(device)
    return a if dev.type == "cpu" else to_device(a, dev)


def tensor(data, dtype=None, device=None, requires_grad=False):
    """A new tensor holding a copy of `data`."""
    t = Tensor._wrap(_to_array(data, dtype, device))
    if requires_grad:
        t.requires_grad_()
    return t


def as_tensor(data, dtype=None, device=None):
    if isinstance(data, Tensor):
        return data.to(device=device or data.device, dtype=dtype or data.dtype)
    if isinstance(data, np.ndarray) and dtype is None and device is None and data.dtype in _dtype._BY_NP:
        return Tensor._wrap(data)
    return tensor(data, dtype, device)


def from_numpy(array):
    """A tensor sharing memory with `array`, like torch.from_numpy."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"expected np.ndarray (got {type(array).__name__})")
    _dtype.from_numpy_dtype(array.dtype)
    return Tensor._wrap(array)


def _shape(size):
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    for s in size:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
            raise TypeError(f"expected a sequence of integers as the size, got {list(size)}")
        if s < 0:
            raise RuntimeError(f"Trying to create tensor with negative dimension {s}: {list(size)}")
    return tuple(int(s) for s in size)


def _make(fill, size, dtype, device, requires_grad, default=None):
    dev = as_device(device)
    xp = get_array_module(dev)
    np_dtype = _dtype.to_numpy_dtype(dtype) or (default or _dtype.get_default_dtype().np)
    if dev.type == "cuda":
        with xp.cuda.Device(dev.index):
            a = fill(xp, _shape(size), np_dtype)
    else:
        a = fill(xp, _shape(size), np_dtype)
    t = Tensor._wrap(a)
    return t.requires_grad_() if requires_grad else t


def zeros(*shape, size=None, dtype=None, device=None, requires_grad=False):
    return _make(lambda xp, s, d: xp.zeros(s, d), shape or (size,), dtype, device, requires_grad)


def ones(*shape, size=None, dtype=None, device=None, requires_grad=False):
    return _make(lambda xp, s, d: xp.ones(s, d), shape or (size,), dtype, device, requires_grad)


def empty(*shape, size=None, dtype=None, device=None, requires_grad=False):
    return _make(lambda xp, s, d: xp.empty(s, d), shape or (size,), dtype, device, requires_grad)


def full(size, fill_value, dtype=None, device=None, requires_grad=False):
    if dtype is None:
        dtype = _dtype.bool_ if isinstance(fill_value, bool) else \
            _dtype.int64 if isinstance(fill_value, int) else None
    return _make(lambda xp, s, d: xp.full(s, fill_value, d), (size,) if isinstance(size, int) else tuple(size),
                 dtype, device, requires_grad)


def _random(xp, shape, dtype, kind, generator=None, **kw):
    """Draw on the CPU generator (one stream for both devices: the same seed gives the same numbers), or on
    `generator` (a smalltrain.Generator or numpy.random.Generator)."""
    g = random.default_generator() if generator is None else generator
    if kind == "rand":
        a = g.random(shape, dtype=np.float64 if dtype == np.float64 else np.float32)
    elif kind == "randn":
        a = g.standard_normal(shape, dtype=np.float64 if dtype == np.float64 else np.float32)
    else:
        a = g.integers(kw["low"], kw["high"], size=shape, dtype=np.int64)
    a = a.astype(dtype, copy=False)
    return a if xp is np else xp.asarray(a)


def rand(*shape, size=None, dtype=None, device=None, requires_grad=False, generator=None):
    """Uniform on [0, 1) from the global generator (manual_seed makes it reproducible)."""
    return _make(lambda xp, s, d: _random(xp, s, d, "rand", generator), shape or (size,), dtype, device, requires_grad)


def randn(*shape, size=None, dtype=None, device=None, requires_grad=False, generator=None):
    """Standard normal from the global generator."""
    return _make(lambda xp, s, d: _random(xp, s, d, "randn", generator), shape or (size,), dtype, device, requires_grad)


def randint(low, high=None, size=None, dtype=None, device=None, requires_grad=False, generator=None):
    """Integers in [low, high): randint(high, size) or randint(low, high, size), int64 by default."""
    if size is None and isinstance(high, (tuple, list)):
        low, high, size = 0, low, high   # randint(high, size)
    elif high is None:
        low, high = 0, low
    if size is None:
        raise TypeError("randint() missing required argument 'size'")
    if high <= low:
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={low} >= to={high}")
    return _make(lambda xp, s, d: _random(xp, s, d, "randint", generator, low=low, high=high), tuple(size), dtype,
                 device, requires_grad, default=np.int64)


def randperm(n, dtype=None, device=None, generator=None):
    g = random.default_generator() if generator is None else generator
    a = g.permutation(int(n)).astype(_dtype.to_numpy_dtype(dtype) or np.int64)
    return Tensor._wrap(a if as_device(device).type == "cpu" else to_device(a, device))


def arange(start, end=None, step=1, dtype=None, device=None, requires_grad=False):
    if end is None:
        start, end = 0, start
    if step == 0:
        raise RuntimeError("arange: step must be nonzero")
    if (end - start) * step < 0:
        raise RuntimeError(f"arange: upper bound and larger bound inconsistent with step sign "
                           f"(start={start}, end={end}, step={step})")
    all_int = all(isinstance(v, (int, np.integer)) for v in (start, end, step))
    default = np.int64 if all_int else None
    return _make(lambda xp, s, d: xp.arange(start, end, step).astype(d), (), dtype, device, requires_grad,
                 default=default)


def linspace(start, end, steps, dtype=None, device=None, requires_grad=False):
    if steps < 0:
        raise RuntimeError(f"linspace: number of steps must be non-negative, got {steps}")
    return _make(lambda xp, s, d: xp.linspace(start, end, steps).astype(d), (), dtype, device, requires_grad)


def eye(n, m=None, dtype=None, device=None, requires_grad=False):
    return _make(lambda xp, s, d: xp.eye(n, m, dtype=d), (), dtype, device, requires_grad)


def _like(fn):
    def like(t, dtype=None, device=None, requires_grad=False, **kw):
        return fn(*t.array.shape, dtype=dtype or t.dtype, device=device or t.device, requires_grad=requires_grad,
                  **kw)
    like.__name__ = fn.__name__ + "_like"
    return like


zeros_like, ones_like, empty_like, rand_like, randn_like = (_like(f) for f in (zeros, ones, empty, rand, randn))


def full_like(t, fill_value, dtype=None, device=None, requires_grad=False):
    return full(t.array.shape, fill_value, dtype=dtype or t.dtype, device=device or t.device,
                requires_grad=requires_grad)


def randint_like(t, low, high=None, dtype=None, device=None):
    return randint(low, high, t.array.shape, dtype=dtype or t.dtype, device=device or t.device)

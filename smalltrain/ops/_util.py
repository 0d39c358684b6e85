"""Small helpers every op file uses: raw arrays of operands, torch's dtype promotion for scalars."""
import numpy as np

from ..tensor import Tensor


def arr(x):
    """The raw array of a Tensor; Python scalars pass through (NumPy broadcasts them)."""
    return x.array if isinstance(x, Tensor) else x


def xp_of(a):
    """numpy or cupy, from an array."""
    if isinstance(a, np.ndarray) or not hasattr(a, "__cuda_array_interface__"):
        return np
    from ..backend import cuda
    return cuda.cupy()


def fix_float(out, *operands):
    """torch keeps float32 when ints or Python floats meet float32 tensors; NumPy would give float64."""
    if getattr(out, "dtype", None) == np.float64:
        for o in operands:
            if isinstance(o, Tensor) and o.array.dtype == np.float64:
                return out
            if isinstance(o, np.ndarray) and o.dtype == np.float64:
                return out
        return out.astype(np.float32)
    return out


def check_same_device(op, *tensors):
    """Mixing CPU and CUDA tensors (or two GPUs) in one op is an error, as in torch."""
    first = None
    for t in tensors:
        if isinstance(t, Tensor):
            d = t.device
            if first is None:
                first = d
            elif d != first:
                raise RuntimeError(f"{op}: expected all tensors to be on the same device, but found at least "
                                   f"two devices, {first} and {d}")


def normalize_dim(op, dim, ndim):
    """A dim index in range [-ndim, ndim) made non-negative; IndexError like torch otherwise."""
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"{op}: dimension out of range (expected to be in range of [{-n}, {n - 1}], "
                         f"but got {dim})")
    return dim % n


def normalize_dims(op, dim, ndim):
    """None -> all dims; int or sequence -> a tuple of non-negative dims."""
    if dim is None:
        return tuple(range(ndim))
    if isinstance(dim, (list, tuple)):
        return tuple(normalize_dim(op, d, ndim) for d in dim)
    return (normalize_dim(op, dim, ndim),)

"""Small helpers every op file uses: raw arrays of operands, torch's dtype promotion, dim checks."""
import numpy as np

from .._dtype import get_default_dtype, result_type
from ..backend import cuda
from ..tensor import Tensor


def arr(x):
    """The raw array of a Tensor; Python scalars pass through (NumPy broadcasts them)."""
    return x.array if isinstance(x, Tensor) else x


def xp_of(a):
    """numpy or cupy, from an array."""
    if isinstance(a, np.ndarray) or not hasattr(a, "__cuda_array_interface__"):
        return np
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


def promote(op, a, b, floating=False):
    """The raw operands of binary op `op` cast to torch's result dtype, and that dtype.

    Python scalars stay Python scalars: NumPy treats them as weak, so they take the array's dtype. With
    `floating`, an integer result type becomes the default float (true division). CPU and CUDA operands raise.
    """
    x = a.array if isinstance(a, Tensor) else a
    y = b.array if isinstance(b, Tensor) else b
    tx, ty = type(x), type(y)
    # fast paths: same dtype, or a float array with a Python number (NumPy keeps the array's dtype, as torch)
    if ty is float or ty is int:
        dx = x.dtype
        if dx.kind == "f" or (ty is int and dx.kind in "iu" and not floating):
            return x, y, dx
    elif tx is float or tx is int:
        dy = y.dtype
        if dy.kind == "f" or (tx is int and dy.kind in "iu" and not floating):
            return x, y, dy
    else:
        dx, dy = getattr(x, "dtype", None), getattr(y, "dtype", None)
        if dx is not None and dx == dy and (not floating or dx.kind == "f"):
            if tx is not ty:
                x, y = _device_operands(op, a, b, x, y)
            return x, y, dx
    dx, dy = getattr(x, "dtype", None), getattr(y, "dtype", None)
    if dx is not None and dy is not None and type(x) is not type(y):
        x, y = _device_operands(op, a, b, x, y)
    dt = result_type(a, b)
    if floating and dt.kind != "f":
        dt = get_default_dtype().np
    return _cast(x, dt), _cast(y, dt), dt


def _device_operands(op, a, b, x, y):
    """Operands on different devices: a 0-dim CPU tensor joins a CUDA tensor's op as a Python scalar (as in torch,
    where it is a 'CPU scalar'); any other mix raises."""
    if isinstance(x, np.ndarray) and x.ndim == 0 and xp_of(y) is not np:
        return _cpu_scalar(op, a, x), y
    if isinstance(y, np.ndarray) and y.ndim == 0 and xp_of(x) is not np:
        return x, _cpu_scalar(op, b, y)
    check_same_device(op, a, b)
    return x, y


def _cpu_scalar(op, t, v):
    if isinstance(t, Tensor) and t.requires_grad:
        # its gradient would be computed on the GPU and land in a CPU tensor's .grad (ops' forwards run with
        # grad mode off, so requires_grad alone decides)
        raise RuntimeError(f"{op}: a 0-dim CPU tensor that requires grad cannot be used with CUDA tensors; move it "
                           f"to their device first (.to('cuda'))")
    return v.item()


def _cast(v, dt):
    if isinstance(v, np.generic):  # NumPy scalars are strong under NEP 50; torch reads them as Python numbers
        v = v.item()
    if v is None or isinstance(v, (bool, int, float)):
        return v
    return v if v.dtype == dt else v.astype(dt)


def broadcast_error(op, x, y):
    """torch's RuntimeError for operands whose shapes do not broadcast (None when they do)."""
    sa, sb = tuple(getattr(x, "shape", ())), tuple(getattr(y, "shape", ()))
    n = max(len(sa), len(sb))
    pa, pb = (1,) * (n - len(sa)) + sa, (1,) * (n - len(sb)) + sb
    for i in range(n - 1, -1, -1):
        if pa[i] != pb[i] and pa[i] != 1 and pb[i] != 1:
            return RuntimeError(f"{op}: The size of tensor a ({pa[i]}) must match the size of tensor b ({pb[i]}) "
                                f"at non-singleton dimension {i} (shapes {list(sa)} and {list(sb)})")
    return None


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
    """None or () -> all dims (as torch reduces); int or sequence -> a tuple of distinct non-negative dims."""
    if dim is None:
        return tuple(range(ndim))
    if isinstance(dim, (list, tuple)):
        if not dim:
            return tuple(range(ndim))
        dims = tuple(normalize_dim(op, d, ndim) for d in dim)
        if ndim == 0:
            return ()   # a 0-d tensor accepts dim 0 / -1 and has nothing to reduce
        if len(set(dims)) != len(dims):
            d = next(d for d in dims if dims.count(d) > 1)
            raise RuntimeError(f"{op}: dim {d} appears multiple times in the list of dims")
        return dims
    d = normalize_dim(op, dim, ndim)
    return (d,) if ndim else ()


def offered_producer(ctx):
    """The kernels' saved state (ctx.kernel_saved) of the op that made this node's first input, where the engine
    offered that op's "conv_g" kind for it (autograd.engine.Prepared: this node its only consumer), else None."""
    offered = ctx.__dict__.get("prepared_for")
    return ctx.inputs[0]._ctx.kernel_saved if offered and offered[0] == "conv_g" else None


def check_values(bad, error):
    """Values an op cannot take: `bad` marks them (a boolean array), error() makes the exception that names the op,
    what it expected and what came. On the CPU it is raised now; on a GPU, reading `bad` back would stall the
    stream (and break a graph capture), so the GPU flags it and the error is raised at the next host
    synchronization (backend/cuda/device_checks.py), as torch's device asserts."""
    if xp_of(bad) is np:
        if np.any(bad):
            raise error()
    else:
        from ..backend.cuda import device_checks
        device_checks.expect_none(bad, error)

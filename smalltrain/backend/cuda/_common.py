"""Checks and launch plumbing shared by the CUDA launchers: array type, dtype, device and contiguity validation
before any kernel runs, kernel lookup by `<name>_<f32|f64>`, and exact-width scalar arguments.
"""
import contextlib
import functools
import operator

import numpy as np

from .. import hooks
from . import cupy
from . import graphs
from .graphs import is_current_stream_capturing
from .loader import MAX_BLOCKS, kernel, launch_1d

BLOCK = 256
FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
NULL = np.uint64(0)  # a null pointer argument (kernel pointer parameters are 8 bytes)


def suffix(op, dtype):
    """'f32' or 'f64' for the kernels of a float dtype; TypeError for any other dtype."""
    dtype = np.dtype(dtype)
    if dtype == np.float32:
        return "f32"
    if dtype == np.float64:
        return "f64"
    raise TypeError(f"{op}: the CUDA kernel supports float32 and float64, got {dtype}")


def check_array(op, name, a, ndim=None):
    """`a` must be a cupy ndarray (TypeError) with one of the ndims in `ndim` (RuntimeError)."""
    cp = cupy()
    if not isinstance(a, cp.ndarray):
        raise TypeError(f"{op}: expected {name} to be a cupy.ndarray on a CUDA device, got {type(a).__name__}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if a.ndim not in allowed:
            want = " or ".join(f"{d}-D" for d in allowed)
            raise RuntimeError(f"{op}: expected {name} to be {want}, got {name} of shape {list(a.shape)}")
    return a


def check_float(op, name, a):
    """`a` must be float32 or float64 (TypeError otherwise, no kernel exists for it)."""
    suffix(f"{op} ({name})", a.dtype)
    return a


def check_dtype(op, name, a, dtype):
    """`a` must have exactly `dtype` (RuntimeError, as torch's 'expected scalar type' errors)."""
    if a.dtype != dtype:
        raise RuntimeError(f"{op}: expected {name} to have dtype {np.dtype(dtype)}, got {a.dtype}")
    return a


def check_shape(op, name, a, shape):
    if tuple(a.shape) != tuple(shape):
        raise RuntimeError(f"{op}: expected {name} of shape {list(shape)}, got {list(a.shape)}")
    return a


def same_device(op, *arrays):
    """All non-None arrays on one GPU (RuntimeError like torch's); returns that cupy Device."""
    first = None
    for a in arrays:
        if a is None:
            continue
        if first is None:
            first = a.device
        elif a.device.id != first.id:
            raise RuntimeError(f"{op}: expected all tensors to be on the same device, but found at least two "
                               f"devices, cuda:{first.id} and cuda:{a.device.id}")
    return first


def grad_array(param):
    """An array for the gradient of `param` (a weight or bias array an op was given): the memory of that leaf's .grad
    where the running backward pass offers it (hooks.claim_grad: a view into a flat gradient buffer), else a new
    array of its shape and dtype."""
    slot = hooks.claim_grad(param)
    return slot if slot is not None else cupy().empty(param.shape, dtype=param.dtype)


def contiguous(a):
    """A C-contiguous version of `a` (itself when it already is): kernels index flat memory."""
    return a if a is None or a.flags.c_contiguous else cupy().ascontiguousarray(a)


def require_contiguous(op, name, a):
    """For arrays updated in place (optimizer state, running stats): a copy would lose the update."""
    if not a.flags.c_contiguous:
        raise RuntimeError(f"{op}: {name} is updated in place and must be C-contiguous, got strides "
                           f"{list(a.strides)} for shape {list(a.shape)}")
    return a


def ptr(a):
    """The device address of `a`, or a null pointer for None."""
    return NULL if a is None else a


def i64(v):
    return np.int64(v)


def i32(v):
    return np.int32(v)


@functools.lru_cache(maxsize=4096)
def i32s(values):
    """A tuple of int32 kernel arguments for a tuple of ints, cached: kernels of fixed geometry are launched with
    the same integers every step, and packing each costs ~0.5 us of host time per launch."""
    return tuple(np.int32(v) for v in values)


def scalar(v, dtype):
    """A kernel scalar of the array dtype (a `T` parameter)."""
    return np.dtype(dtype).type(v)


def get(family, name, dtype, op=None):
    """The kernel `<name>_<f32|f64>` of kernels/<family>.cu for dtype, on the current device. Every launch asks for
    its kernel here first, so a launch held back (hooks.held) runs before it."""
    if hooks.held is not None:
        hooks.flush()
    kern = kernel(family, f"{name}_{suffix(op or name, dtype)}")
    return graphs.programmatic(kern) if graphs.programmatic_launches() else kern


def launch(family, name, dtype, n, args, block=BLOCK):
    """Launch a grid-stride kernel over n items (n == 0 launches nothing)."""
    launch_1d(get(family, name, dtype), int(n), args, block=block, max_blocks=MAX_BLOCKS)


def rows_grid(rows, block=BLOCK):
    """The grid of a one-warp-per-row kernel over `rows` rows (launch_rows's)."""
    warps = block // 32
    return min((int(rows) + warps - 1) // warps, MAX_BLOCKS)


def launch_rows(family, name, dtype, rows, args, block=BLOCK):
    """Launch a one-warp-per-row kernel over `rows` rows (the kernel loops rows grid-stride by warps)."""
    if int(rows) <= 0:
        return
    get(family, name, dtype)((rows_grid(rows, block),), (block,), args)


_counters = {}   # (name, device id) -> uint32 counters, zero between launches


def device_counters(name, size):
    """`size` zeroed uint32 counters on the current device for kernels that finish with a last-block step (each
    block takes a ticket; the last one of a group does the group's final work and resets its counter to 0), made
    once per name and device. None while a CUDA graph is being captured before they exist (a capture records the
    zero fill without running it): the caller then takes a path without them. The kernels using one set run one
    after another on the stream that launches them."""
    cp = cupy()
    key = (name, cp.cuda.Device().id)
    counters = _counters.get(key)
    if counters is None:
        if is_current_stream_capturing():
            return None
        counters = _counters[key] = cp.zeros(size, dtype=cp.uint32)
    return counters


SMEM_DEFAULT_BYTES = 48 * 1024   # the dynamic shared memory a block may use without opting in
_attributes = {}   # (device id, name) -> the device attribute's value
_opted_in = {}     # id(kernel) -> the dynamic shared memory it was allowed


def device_attribute(name):
    """A CUDA device attribute of the current device (cupy's names, e.g. "MultiProcessorCount"), read once."""
    dev = cupy().cuda.Device()
    value = _attributes.get((dev.id, name))
    if value is None:
        value = _attributes[dev.id, name] = dev.attributes[name]
    return value


def smem_optin_bytes():
    """The most dynamic shared memory a block may use on the current device once its kernel opts in (H200:
    227 KiB; without opting in, 48 KiB)."""
    return device_attribute("MaxSharedMemoryPerBlockOptin")


def with_smem(kern, nbytes):
    """kern, allowed nbytes of dynamic shared memory: over 48 KiB a kernel must opt in first (the function
    attribute, set once per kernel and size; the kernels get() returns are cached per device, so it stays set)."""
    if nbytes > SMEM_DEFAULT_BYTES and _opted_in.get(id(kern), 0) < nbytes:
        kern.max_dynamic_shared_size_bytes = nbytes
        _opted_in[id(kern)] = nbytes
    return kern


# run_beside's side streams per device, taken in turn: with two, two works queued beside the same stretch of the
# current stream (LeNet-5's chain_wgrad and its second layer's weight gradient) run beside each other too
_SIDE_STREAMS = 2
_side = {}   # device id -> [[(side stream, fork event, join event), ...], the next one's index]


def run_beside(side_work, main_work, enabled=True, defer=False):
    """(side_work(), main_work()), the first queued on a side stream of the current device (the next of its
    _SIDE_STREAMS), the second on the current stream, so that the GPU runs them at the same time: the side stream
    first waits for everything queued on the current stream so far, and before returning the current stream waits for
    the side stream's work (a fork and a join, which a CUDA graph capture records as two edges). For independent work
    of small kernels that leave most SMs idle, such as a convolution's weight gradient beside its input gradient.
    enabled=False runs both on the current stream, side_work first. defer: the join is left to the backward pass in
    progress (hooks.defer_join; an op asks autograd.engine.takes_plainly first), so that side_work also runs beside
    the pass's later work; side_work and main_work (and what they reference) are kept until then.

    Memory: the side stream's allocations come from its own part of the pool, and the join precedes every later
    free on the current stream; the arrays both read are referenced by the caller until this returns (with defer, by
    the join until it runs). So no block is reused while the other stream may still touch it."""
    if not enabled:
        return side_work(), main_work()
    cp = cupy()
    dev = cp.cuda.Device().id
    sides = _side.setdefault(dev, [[], 0])
    while len(sides[0]) < _SIDE_STREAMS:
        sides[0].append((cp.cuda.Stream(non_blocking=True), cp.cuda.Event(disable_timing=True),
                         cp.cuda.Event(disable_timing=True)))
    side, fork, join = sides[0][sides[1] % _SIDE_STREAMS]
    sides[1] += 1
    main = cp.cuda.get_current_stream()
    fork.record(main)
    side.wait_event(fork)

    def join_now():
        join.record(side)
        main.wait_event(join)

    try:
        with side:
            first = side_work()
        second = main_work()
    except BaseException:
        join_now()
        raise
    if defer:
        hooks.defer_join(lambda: (join_now(), side_work, main_work))   # the works' references live until then
    else:
        join_now()
    return first, second


_eager_holds = [False]   # eager_holds(): launches are held outside captures too


@contextlib.contextmanager
def eager_holds():
    """Within the block, launch_or_hold holds launches outside captures too, so that the fused heads (a held launch
    taken over by the cross-entropy after it) run in an eager step: tests compare them there against the separate
    kernels and torch, and profilers time them."""
    _eager_holds[0] = True
    try:
        yield
    finally:
        _eager_holds[0] = False


class HeldHead:
    """The launch of a kernel that writes logits [N, C] (linear.py's chain, conv.py's tile_conv_lin), held
    (launch_or_hold) so that it can run later (hooks.hold) on the device and stream it was made on: as it was
    (plain), or with the cross-entropy of its rows in its epilogue (with_cross_entropy; loss.py
    cross_entropy_forward). launch(ce) makes the launch, ce None or the cross-entropy's arguments; slots: the partial
    sums the fused reduction writes."""
    __slots__ = ("launch", "slots", "dtype", "device", "stream")

    def __init__(self, launch, slots, dtype, device):
        self.launch, self.slots, self.dtype, self.device = launch, slots, dtype, device
        self.stream = cupy().cuda.get_current_stream()

    def plain(self):
        self._run(None)

    def with_cross_entropy(self, ce_args, ends):
        """ce_args: the loss's (target, class weights, grad, ignore_index, label smoothing, bad-target flag), ends
        its (counter, mean, loss, wsum, unit), as loss.py's cross_entropy_fwd_reduce takes them, checked by the
        caller."""
        self._run(ce_args + (cupy().empty(2 * self.slots, dtype=self.dtype),) + ends)

    def _run(self, ce):
        with self.device, self.stream:
            self.launch(ce)


def launch_or_hold(hold, out, launch, slots, dtype, device):
    """Hold launch (as HeldHead takes it) for the op after it (hooks.hold), where `hold` allows (the caller then ties
    its output tensor to it: autograd.held.mark) and one of our CUDA graphs is being captured (its end flushes what is
    held) or eager_holds() is in effect; else run launch(None) now, on the current device and stream: an eager step
    makes no record."""
    if hold and (_eager_holds[0] or is_current_stream_capturing()):
        head = HeldHead(launch, slots, dtype, device)
        hooks.hold(out, head.plain, head)
    else:
        launch(None)


def dim_index(op, dim, ndim):
    """A dim in [-ndim, ndim) made non-negative (0-d arrays take dim 0 or -1), IndexError otherwise."""
    n = max(ndim, 1)
    dim = operator.index(dim)
    if not -n <= dim < n:
        raise IndexError(f"{op}: Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})")
    return dim % n


def pair(op, name, value):
    """An int or a sequence of one or two ints -> (int, int); TypeError / RuntimeError like torch otherwise."""
    vals = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    try:
        vals = tuple(operator.index(v) for v in vals)
    except TypeError:
        raise TypeError(f"{op}: {name} must be an int or a tuple of ints, got {value!r}") from None
    if len(vals) == 1:
        vals = vals * 2
    if len(vals) != 2:
        raise RuntimeError(f"{op}: expected {name} to be a single int or a pair of ints, got {list(vals)}")
    return vals

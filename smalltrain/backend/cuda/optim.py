"""Fused multi-tensor optimizer launchers (kernels/optim.cu): one launch updates a whole parameter list in place
(per dtype), in torch's single-tensor operation order. The device tables of buffer addresses are cached, so a step
after the first copies nothing to the GPU and, with Adam's device-side step count, can be captured in a CUDA graph.
"""
from collections import OrderedDict

import numpy as np

from . import cupy
from ._common import (NULL, check_array, check_dtype, check_float, check_shape, device_counters, get, i32, i64, ptr,
                      require_contiguous)
from .graphs import constant, keep_alive
from .loader import kernel

# elements per block: 2 per thread. The parameters of a small model are tens of thousands of floats, so larger
# chunks leave a few blocks each walking a long serial loop (the update is latency-bound, not bandwidth-bound)
CHUNK = 512
_BLOCK = 256
_TABLES = OrderedDict()
_MAX_TABLES = 64


def _check_lists(op, named):
    """named: [(name, list)], the first the params. Same lengths; each entry a contiguous cupy float array with
    its param's shape and dtype, on the params' device. Returns the device id.

    This runs every step over every parameter, gradient and state buffer, so the common case is one tight pass of
    plain comparisons; only when it finds something wrong do the named checks below run to say what."""
    params = named[0][1]
    nd = cupy().ndarray
    if params and type(params[0]) is nd:
        device = params[0].data.device_id
        if all(len(lst) == len(params) and all(
                type(a) is nd and a.dtype is p.dtype and a.dtype.char in "fd" and a.shape == p.shape
                and a.data.device_id == device and a.flags.c_contiguous for p, a in zip(params, lst))
               for _, lst in named):
            return device
    device = None
    for name, lst in named:
        if len(lst) != len(params):
            raise RuntimeError(f"{op}: expected {len(params)} {name} (one per parameter), got {len(lst)}")
        for i, (p, a) in enumerate(zip(params, lst)):
            label = f"{name}[{i}]"
            check_array(op, label, a)
            check_float(op, label, a)
            require_contiguous(op, label, a)
            check_dtype(op, label, a, p.dtype)
            check_shape(op, label, a, p.shape)
            if device is None:
                device = a.device.id
            elif a.device.id != device:
                raise RuntimeError(f"{op}: expected all tensors to be on the same device, but found at least two "
                                   f"devices, cuda:{device} and cuda:{a.device.id} ({label})")
    return device


def _tables(buffers):
    """(records [n, K+1], n) on the device for buffers [K][T], cached by address and size: one record per block of
    CHUNK elements, [count, the K buffers' addresses at the block's first element].

    A block's loads of its record are independent of each other, so it reaches its elements after one round trip
    to memory, not three (block -> tensor index -> addresses and size -> elements).
    A new table is uploaded from pinned host memory with an asynchronous copy: no stream synchronization
    (gradients dropped by zero_grad() come back at new addresses). One made while a CUDA graph is captured points
    into the graph's pool, so every replay reads the same table: it is written once, when the capture ends (_upload),
    and kept alive with the graph, not cached (after a failed capture it would never be written).
    """
    ptrs = np.array([[a.data.ptr for a in lst] for lst in buffers], dtype=np.uint64)
    sizes = np.array([a.size for a in buffers[0]], dtype=np.int64)
    key = (cupy().cuda.Device().id, ptrs.tobytes(), sizes.tobytes())
    hit = _TABLES.get(key)
    if hit is not None:
        _TABLES.move_to_end(key)
        keep_alive(hit)   # a graph captured now reads this table on every replay, even after the cache drops it
        return hit[:2]
    counts = (sizes + CHUNK - 1) // CHUNK
    n = int(counts.sum())
    tensor = np.repeat(np.arange(len(sizes), dtype=np.int64), counts)
    first_chunk = np.repeat(np.cumsum(counts) - counts, counts)
    start = (np.arange(n, dtype=np.int64) - first_chunk) * CHUNK
    itemsize = np.uint64(buffers[0][0].dtype.itemsize)   # one dtype per table (_by_dtype's groups)
    records = np.empty((n, len(buffers) + 1), dtype=np.int64)
    records[:, 0] = np.minimum(sizes[tensor] - start, CHUNK)
    records[:, 1:] = (ptrs[:, tensor].T + start.astype(np.uint64)[:, None] * itemsize).view(np.int64)
    table, pinned = _upload(records.reshape(-1))
    hit = (table, n, pinned)
    if keep_alive(hit):
        return hit[:2]
    _TABLES[key] = hit
    if len(_TABLES) > _MAX_TABLES:
        _TABLES.popitem(last=False)
    return hit[:2]


class _Staging:
    """A few reusable pinned host buffers for eager uploads; each slot waits for its previous copy to finish."""

    def __init__(self, slots=8):
        self.slots = [None] * slots   # (pinned memory, its size in bytes, event after its last copy)
        self.next = 0

    def take(self, nbytes):
        cp = cupy()
        i, self.next = self.next, (self.next + 1) % len(self.slots)
        slot = self.slots[i]
        if slot is not None:
            slot[2].synchronize()   # long done in practice: 8 uploads ago
        if slot is None or slot[1] < nbytes:
            slot = [cp.cuda.alloc_pinned_memory(max(nbytes, 4096)), max(nbytes, 4096), None]
            self.slots[i] = slot
        return slot


_staging = _Staging()


def _upload(host):
    """host (an int64 NumPy array) copied to a new device array asynchronously from pinned memory; returns
    (device array, pinned memory a graph captured now must keep, or None).

    While one of our graphs (graphs.CUDAGraph) is captured the table is a graphs.constant: written once when the
    capture ends, not by a copy node that every replay would run before the optimizer's kernel. In a capture made
    by other means, a plain cudaMemcpyAsync from pinned memory is captured (cupy's own host-to-device copies refuse
    to run during stream capture), and every replay repeats it from the same pinned buffer.
    """
    cp = cupy()
    rt = cp.cuda.runtime
    stream = cp.cuda.get_current_stream()
    capturing = bool(stream.is_capturing())
    if capturing:
        table = constant(host)
        if table is not None:
            return table, None
    if capturing:
        slot = [cp.cuda.alloc_pinned_memory(host.nbytes), host.nbytes, None]
    else:
        slot = _staging.take(host.nbytes)
    staged = np.frombuffer(slot[0], dtype=np.int64, count=host.size)
    staged[...] = host
    table = cp.empty(host.size, dtype=np.int64)
    rt.memcpyAsync(table.data.ptr, staged.ctypes.data, host.nbytes, rt.memcpyHostToDevice, stream.ptr)
    if capturing:
        return table, slot[0]
    slot[2] = stream.record()
    return table, None


def _by_dtype(params):
    groups = {}
    for i, p in enumerate(params):
        groups.setdefault(p.dtype, []).append(i)
    return groups.items()


def _hyper(op, hyper, names, device):
    """NULL, or `hyper` checked: a contiguous device float64 array with one value per name, read by the kernel
    instead of the float arguments (so a captured graph follows a scheduler that changes them)."""
    if hyper is None:
        return NULL
    check_array(op, "hyper", hyper)
    check_dtype(op, "hyper", hyper, np.float64)
    require_contiguous(op, "hyper", hyper)
    if hyper.size != len(names) or hyper.device.id != device:
        raise RuntimeError(f"{op}: expected hyper as a float64 array [{', '.join(names)}] on cuda:{device}, got "
                           f"{hyper.size} values on cuda:{hyper.device.id}")
    return hyper


def set_hyper(hyper, values):
    """Write `values` (at most 5 floats) into the device float64 array `hyper` with one tiny launch."""
    values = [float(v) for v in values]
    if not 1 <= len(values) <= 5 or hyper.size < len(values) or hyper.dtype != np.float64:
        raise RuntimeError(f"set_hyper: expected 1 to 5 values for a float64 array of at least that size, got "
                           f"{len(values)} values for {hyper.size} {hyper.dtype} elements")
    padded = [np.float64(v) for v in values + [0.0] * (5 - len(values))]
    kernel("optim", "set_hyper")((1,), (1,), (hyper, i32(len(values)), *padded))


SGD_HYPER = ("lr", "momentum", "dampening", "weight_decay")
ADAM_HYPER = ("lr", "beta1", "beta2", "eps", "weight_decay")


def sgd_step(params, grads, momentum_buffers=None, *, lr, momentum=0.0, dampening=0.0, weight_decay=0.0,
             nesterov=False, maximize=False, first_step=False, hyper=None):
    """torch.optim.SGD's update of every param in place, one launch per dtype.

    params, grads (and momentum_buffers when momentum != 0): lists of contiguous cupy arrays, pairwise of one
    shape and dtype. first_step: the buffers are (re)initialized to the gradient, as torch does when a parameter
    has no momentum buffer yet (their content is ignored). hyper: None or a device float64 array of SGD_HYPER's
    values, read by the kernel in place of lr, momentum, dampening and weight_decay (which still decide whether
    momentum and weight decay are applied at all).
    """
    op = "sgd_step"
    if nesterov and (momentum <= 0 or dampening != 0):
        raise ValueError("Nesterov momentum requires a momentum and zero dampening")
    named = [("params", params), ("grads", grads)]
    if momentum != 0:
        if momentum_buffers is None:
            raise RuntimeError(f"{op}: momentum={momentum} needs momentum_buffers")
        named.append(("momentum_buffers", momentum_buffers))
    if not params:
        return
    device = _check_lists(op, named)
    hyper = _hyper(op, hyper, SGD_HYPER, device)
    with cupy().cuda.Device(device):
        for dtype, idx in _by_dtype(params):
            records, n = _tables([[lst[i] for i in idx] for _, lst in named])
            if n:
                get("optim", "sgd_step", dtype)((n,), (_BLOCK,), (
                    records, i64(len(named) + 1), np.float64(lr), hyper,
                    np.float64(momentum), np.float64(dampening), np.float64(weight_decay), i32(nesterov),
                    i32(maximize), i32(first_step)))


def adam_step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs=None, *, step, lr, beta1=0.9, beta2=0.999,
              eps=1e-8, weight_decay=0.0, amsgrad=False, maximize=False, decoupled_weight_decay=False,
              increment_step=True, hyper=None):
    """torch.optim.Adam / AdamW (decoupled_weight_decay=True) update of every param in place, one launch per dtype.

    step: a 1-element float32 or float64 cupy array shared by the list, incremented on the device (unless
    increment_step=False: by the last block of the last launch, else by a kernel of its own first); the kernel
    computes the bias corrections from it, so no host value changes between steps and the step can be replayed as
    a CUDA graph. max_exp_avg_sqs is needed with amsgrad. hyper: None or a
    device float64 array of ADAM_HYPER's values (as in sgd_step). All lists as in sgd_step.
    """
    op = "adam_step"
    named = [("params", params), ("grads", grads), ("exp_avgs", exp_avgs), ("exp_avg_sqs", exp_avg_sqs)]
    if amsgrad:
        if max_exp_avg_sqs is None:
            raise RuntimeError(f"{op}: amsgrad=True needs max_exp_avg_sqs")
        named.append(("max_exp_avg_sqs", max_exp_avg_sqs))
    check_array(op, "step", step)
    if step.dtype not in (np.float32, np.float64) or step.size != 1:
        raise RuntimeError(f"{op}: expected step as a 1-element float32 or float64 array, got {step.dtype} of shape "
                           f"{list(step.shape)}")
    if not params:
        return
    device = _check_lists(op, named)
    if step.device.id != device:
        raise RuntimeError(f"{op}: expected step on cuda:{device}, got cuda:{step.device.id}")
    hyper = _hyper(op, hyper, ADAM_HYPER, device)
    with cupy().cuda.Device(device):
        groups = [(dtype, idx, _tables([[lst[i] for i in idx] for _, lst in named]))
                  for dtype, idx in _by_dtype(params)]
        groups = [group for group in groups if group[2][1]]
        # the count: every launch computes with step + 1 and the last one's last block stores it (a ticket)
        counter = device_counters("adam_step", 1) if increment_step and groups else None
        if increment_step and counter is None:
            get("optim", "increment_step", step.dtype)((1,), (1,), (step,))
        for k, (dtype, idx, (records, n)) in enumerate(groups):
            get("optim", "adam_step", dtype)((n,), (_BLOCK,), (
                records, i64(len(named) + 1), np.float64(lr), hyper, np.float64(beta1),
                np.float64(beta2), np.float64(eps), np.float64(weight_decay), step, i32(step.dtype == np.float64),
                i32(counter is not None), ptr(counter if k == len(groups) - 1 else None), i32(amsgrad),
                i32(maximize), i32(decoupled_weight_decay)))


"""Collectives on Tensors, as torch.distributed has them: in place on the given tensors, on CPU or CUDA arrays.

Each call validates its arguments on every rank before communicating (a rank that raises here has not entered
the collective), flattens non-contiguous arrays through a contiguous copy, and returns None (or a completed
Work when async_op=True: the operations are synchronous on the host, NCCL's are ordered on the current stream).
"""
from ..tensor import Tensor
from .process_group import default_group
from .reduce_op import ReduceOp


class Work:
    """A finished operation (what torch returns for async_op=True)."""

    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True


def _done(async_op):
    return Work() if async_op else None


def _check_tensor(op, t, what="tensor"):
    if not isinstance(t, Tensor):
        raise TypeError(f"{op}: expected parameter `{what}` of type Tensor, but got {type(t).__name__} instead")


def _check_op(name, op):
    if not isinstance(op, ReduceOp):
        raise TypeError(f"{name}: expected op to be a smalltrain.distributed.ReduceOp, got {op!r}")


def _check_rank(name, src, g):
    if not isinstance(src, int) or not 0 <= src < g.world_size:
        raise RuntimeError(f"{name}: invalid root rank: {src} (world size {g.world_size})")


def _check_list(name, tensors, like, g, what):
    if not isinstance(tensors, (list, tuple)) or len(tensors) != g.world_size:
        n = len(tensors) if isinstance(tensors, (list, tuple)) else type(tensors).__name__
        raise RuntimeError(f"{name}: {what} must be a list of world size ({g.world_size}) tensors, got {n}")
    for i, t in enumerate(tensors):
        _check_tensor(name, t, f"{what}[{i}]")
        if t.array.shape != like.array.shape:
            raise RuntimeError(f"{name}: invalid tensor size at index {i} (expected {list(like.array.shape)}, got "
                               f"{list(t.array.shape)})")
        if t.array.dtype != like.array.dtype:
            raise ValueError(f"{name}: tensors must have the same dtype; found {t.dtype} at index {i} and "
                             f"{like.dtype}")
        if t.device != like.device:
            raise RuntimeError(f"{name}: tensors must be on the same device; found {t.device} at index {i} and "
                               f"{like.device}")


def _flat(a):
    """A flat contiguous array sharing memory with `a` when possible (then nothing needs copying back)."""
    if a.flags.c_contiguous:
        return a.reshape(-1), False
    from ..ops._util import xp_of
    return xp_of(a).ascontiguousarray(a).reshape(-1), True


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    """Reduce `tensor` over all ranks with `op`, in place; every rank ends with the result."""
    g = default_group(group)
    _check_tensor("all_reduce", tensor)
    _check_op("all_reduce", op)
    buf, copied = _flat(tensor.array)
    g.all_reduce_array(buf, op)
    if copied:
        tensor.array[...] = buf.reshape(tensor.array.shape)
    return _done(async_op)


def broadcast(tensor, src=0, group=None, async_op=False):
    """Overwrite `tensor` on every rank with rank `src`'s, in place."""
    g = default_group(group)
    _check_tensor("broadcast", tensor)
    _check_rank("broadcast", src, g)
    buf, copied = _flat(tensor.array)
    g.broadcast_array(buf, src)
    if copied:
        tensor.array[...] = buf.reshape(tensor.array.shape)
    return _done(async_op)


def all_gather(tensor_list, tensor, group=None, async_op=False):
    """tensor_list[r] receives rank r's `tensor` (world-size tensors of its shape, dtype and device)."""
    g = default_group(group)
    _check_tensor("all_gather", tensor)
    _check_list("all_gather", tensor_list, tensor, g, "tensor_list")
    a = tensor.array
    from ..ops._util import xp_of
    xp = xp_of(a)
    send, _ = _flat(a)
    recv = _empty_like(xp, a, (g.world_size * a.size,))
    g.backend_for(send).all_gather(send, recv)
    recv = recv.reshape((g.world_size,) + a.shape)
    for r, t in enumerate(tensor_list):
        t.array[...] = recv[r]
    return _done(async_op)


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op=False):
    """output = op over ranks of input_list[rank] (each rank contributes world-size tensors of output's shape)."""
    g = default_group(group)
    _check_tensor("reduce_scatter", output, "output")
    _check_op("reduce_scatter", op)
    _check_list("reduce_scatter", input_list, output, g, "input_list")
    a = output.array
    from ..ops._util import xp_of
    xp = xp_of(a)
    send = xp.stack([t.array for t in input_list]).reshape(-1)
    recv, copied = _flat(a)
    g.backend_for(send).reduce_scatter(send, recv, op)
    if copied:
        a[...] = recv.reshape(a.shape)
    return _done(async_op)


def broadcast_object_list(object_list, src=0, group=None):
    """Replace object_list's items on every rank with rank `src`'s (pickled through MPI)."""
    g = default_group(group)
    _check_rank("broadcast_object_list", src, g)
    object_list[:] = g.host.bcast_object(list(object_list), src)


def all_gather_object(object_list, obj, group=None):
    """object_list[r] receives rank r's `obj` (pickled through MPI)."""
    g = default_group(group)
    if len(object_list) != g.world_size:
        raise RuntimeError(f"all_gather_object: object_list must have world size ({g.world_size}) entries, got "
                           f"{len(object_list)}")
    object_list[:] = g.host.allgather_object(obj)


def _empty_like(xp, a, shape):
    if xp.__name__ == "numpy":
        return xp.empty(shape, a.dtype)
    with a.device:
        return xp.empty(shape, a.dtype)

"""Host-side communication: MPI through mpi4py (buffer-based, in place on contiguous NumPy arrays, each collective
bounded by the group's timeout), a stand-in for a single process when mpi4py is missing, and CUDA arrays staged
through host memory when there is no NCCL.

Every backend here takes flat contiguous arrays; the Tensor-level API in collectives.py makes them so.
"""
import math
import os
import pickle
import sys
import time

import numpy as np

from .reduce_op import ReduceOp


def import_mpi():
    """(MPI module, None) or (None, the ImportError): importing mpi4py initializes MPI, so it is done lazily."""
    try:
        from mpi4py import MPI
    except (ImportError, OSError, RuntimeError) as e:  # mpi4py missing, or without an MPI library to load
        return None, e
    return MPI, None


def _check_avg(op, buf):
    if op is ReduceOp.AVG and buf.dtype.kind not in "fc":
        raise RuntimeError(f"all_reduce: ReduceOp.AVG needs a floating-point tensor, got dtype {buf.dtype}")


class CollectiveTimeout(RuntimeError):
    """A collective did not complete within the process group's timeout (some rank never joined it)."""


DEFAULT_TIMEOUT_S = 300.0
TIMEOUT_ENV = "SMALLTRAIN_DIST_TIMEOUT"


def resolve_timeout(timeout):
    """Seconds from init_process_group's `timeout` (a timedelta or a number), else $SMALLTRAIN_DIST_TIMEOUT, else
    DEFAULT_TIMEOUT_S; ValueError for a value that is not a positive finite number."""
    source = "init_process_group(timeout=...)"
    if timeout is None:
        timeout, source = os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S), f"${TIMEOUT_ENV}"
    if hasattr(timeout, "total_seconds"):
        timeout = timeout.total_seconds()
    try:
        seconds = float(timeout)
    except (TypeError, ValueError):
        raise ValueError(f"{source}: expected a number of seconds or a timedelta, got {timeout!r}") from None
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{source}: the timeout must be a positive finite number of seconds, got {timeout!r}")
    return seconds


class MpiBackend:
    """Collectives over an MPI communicator (a duplicate of COMM_WORLD, so user MPI traffic cannot interleave).

    Every collective is started nonblocking and polled until it completes or `timeout` seconds pass; then the
    rank prints which collective it waited in, and for how long, and aborts the whole job (a rank that died,
    stopped, or took another path through the program would otherwise leave the others waiting forever).
    Polling from Python also lets SIGINT/SIGTERM handlers run while a rank waits."""

    name = "mpi"

    def __init__(self, MPI, comm, timeout=DEFAULT_TIMEOUT_S):
        self.MPI = MPI
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.timeout = timeout
        self._ops = {ReduceOp.SUM: MPI.SUM, ReduceOp.AVG: MPI.SUM, ReduceOp.MAX: MPI.MAX, ReduceOp.MIN: MPI.MIN,
                     ReduceOp.PRODUCT: MPI.PROD}

    def _wait(self, request, what):
        """Poll `request` until done; past the deadline, say what we waited for and abort the job."""
        if request.Test():
            return
        start = time.monotonic()
        deadline, polls = start + self.timeout, 0
        while not request.Test():
            polls += 1
            if polls > 100:   # a quick collective completes within the first polls; then stop burning a core
                time.sleep(0.0002 if polls < 2000 else 0.002)
            if time.monotonic() > deadline:
                self._timed_out(what, time.monotonic() - start)

    def _timed_out(self, what, waited):
        message = (f"[rank {self.rank}] smalltrain.distributed: {what} did not complete within the process "
                   f"group's timeout of {self.timeout:g} s (rank {self.rank} of {self.size} waited {waited:.1f} "
                   f"s): another rank failed, stopped, or is running a different program or settings; aborting "
                   f"the job (raise the limit with init_process_group(timeout=...) or ${TIMEOUT_ENV})")
        _say(message)
        self.abort(1)
        raise CollectiveTimeout(message)   # only reached if Abort returned

    def local_rank(self):
        """Rank among the processes of this node: MPI's shared-memory split of the communicator."""
        return self._node()[0]

    def local_size(self):
        """How many processes of the job share this node."""
        return self._node()[1]

    def _node(self):
        node = self.comm.Split_type(self.MPI.COMM_TYPE_SHARED, key=self.rank)
        try:
            return node.Get_rank(), node.Get_size()
        finally:
            node.Free()

    def all_reduce(self, buf, op):
        _check_avg(op, buf)
        if buf.dtype == np.bool_:
            # MPI defines MAX/MIN/SUM only for numeric types; on 0/1 bytes they are OR, AND and (saturated) OR
            logical_and = op in (ReduceOp.MIN, ReduceOp.PRODUCT)
            mpi_op = self.MPI.MIN if logical_and else self.MPI.MAX
            self._wait(self.comm.Iallreduce(self.MPI.IN_PLACE, buf.view(np.uint8), op=mpi_op), "all_reduce")
            return
        self._wait(self.comm.Iallreduce(self.MPI.IN_PLACE, buf, op=self._ops[op]),
                   f"all_reduce of {buf.size} x {buf.dtype}")
        if op is ReduceOp.AVG:
            buf /= self.size

    def broadcast(self, buf, src):
        self._wait(self.comm.Ibcast(buf.view(np.uint8) if buf.dtype == np.bool_ else buf, root=src),
                   f"broadcast of {buf.size} x {buf.dtype} from rank {src}")

    def all_gather(self, send, recv):
        if send.dtype == np.bool_:
            send, recv = send.view(np.uint8), recv.view(np.uint8)
        self._wait(self.comm.Iallgather(send, recv), f"all_gather of {send.size} x {send.dtype}")

    def reduce_scatter(self, send, recv, op):
        _check_avg(op, send)
        self._wait(self.comm.Ireduce_scatter_block(send, recv, op=self._ops[op]),
                   f"reduce_scatter of {send.size} x {send.dtype}")
        if op is ReduceOp.AVG:
            recv /= self.size

    def barrier(self):
        self._wait(self.comm.Ibarrier(), "barrier")

    def bcast_object(self, obj, src=0):
        data = np.frombuffer(pickle.dumps(obj), np.uint8) if self.rank == src else None
        size = np.array([0 if data is None else data.size], np.int64)
        self._wait(self.comm.Ibcast(size, root=src), f"broadcast_object_list from rank {src} (size)")
        buf = data.copy() if data is not None else np.empty(int(size[0]), np.uint8)
        self._wait(self.comm.Ibcast(buf, root=src), f"broadcast_object_list from rank {src}")
        return obj if self.rank == src else pickle.loads(buf.tobytes())

    def allgather_object(self, obj):
        data = np.frombuffer(pickle.dumps(obj), np.uint8)
        sizes = np.empty(self.size, np.int64)
        self._wait(self.comm.Iallgather(np.array([data.size], np.int64), sizes), "all_gather_object (sizes)")
        recv = np.empty(int(sizes.sum()), np.uint8)
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        self._wait(self.comm.Iallgatherv(data, [recv, sizes.tolist(), offsets.tolist(), self.MPI.BYTE]),
                   "all_gather_object")
        return [pickle.loads(recv[o:o + n].tobytes()) for o, n in zip(offsets.tolist(), sizes.tolist())]

    def abort(self, code=1):
        self.MPI.COMM_WORLD.Abort(code)

    def destroy(self):
        if self.comm != self.MPI.COMM_WORLD:
            self.comm.Free()


def _say(message):
    """Write to stderr and give the launcher a moment to forward it: Abort kills every rank at once."""
    sys.stdout.flush()
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    time.sleep(1.0)


class LocalBackend:
    """World size 1 without mpi4py: every collective is the identity (copies where input and output differ)."""

    name = "local"
    rank, size = 0, 1

    def local_rank(self):
        return 0

    def local_size(self):
        return 1

    def all_reduce(self, buf, op):
        _check_avg(op, buf)

    def broadcast(self, buf, src):
        pass

    def all_gather(self, send, recv):
        recv[...] = send

    def reduce_scatter(self, send, recv, op):
        _check_avg(op, send)
        recv[...] = send

    def barrier(self):
        pass

    def bcast_object(self, obj, src=0):
        return obj

    def allgather_object(self, obj):
        return [obj]

    def abort(self, code=1):
        import os
        os._exit(code)

    def destroy(self):
        pass


class HostStaged:
    """CUDA arrays through a host backend (the 'mpi' process group given CUDA tensors): copy down, reduce, copy up."""

    def __init__(self, host):
        self.host = host

    def all_reduce(self, buf, op):
        h = buf.get()
        self.host.all_reduce(h, op)
        buf.set(h)

    def broadcast(self, buf, src):
        h = buf.get()
        self.host.broadcast(h, src)
        buf.set(h)

    def all_gather(self, send, recv):
        h = np.empty(recv.shape, recv.dtype)
        self.host.all_gather(send.get(), h)
        recv.set(h)

    def reduce_scatter(self, send, recv, op):
        h = np.empty(recv.shape, recv.dtype)
        self.host.reduce_scatter(send.get(), h, op)
        recv.set(h)


def create_host(world_size_from_env, timeout=DEFAULT_TIMEOUT_S):
    """The MPI backend over a duplicate of COMM_WORLD, or LocalBackend for a lone process without mpi4py."""
    MPI, err = import_mpi()
    if MPI is None:
        if world_size_from_env > 1:
            raise RuntimeError(f"init_process_group: the launcher started {world_size_from_env} processes but "
                               f"mpi4py cannot be used ({type(err).__name__}: {err}); install mpi4py and an MPI "
                               "library (pip install mpi4py mpich)")
        return LocalBackend()
    return MpiBackend(MPI, MPI.COMM_WORLD.Dup(), timeout)

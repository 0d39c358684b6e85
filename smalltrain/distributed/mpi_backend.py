"""Host-side communication: MPI through mpi4py (buffer-based, in place on contiguous NumPy arrays), a stand-in for
a single process when mpi4py is missing, and CUDA arrays staged through host memory when there is no NCCL.

Every backend here takes flat contiguous arrays; the Tensor-level API in collectives.py makes them so.
"""
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


class MpiBackend:
    """Collectives over an MPI communicator (a duplicate of COMM_WORLD, so user MPI traffic cannot interleave)."""

    name = "mpi"

    def __init__(self, MPI, comm):
        self.MPI = MPI
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self._ops = {ReduceOp.SUM: MPI.SUM, ReduceOp.AVG: MPI.SUM, ReduceOp.MAX: MPI.MAX, ReduceOp.MIN: MPI.MIN,
                     ReduceOp.PRODUCT: MPI.PROD}

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
            self.comm.Allreduce(self.MPI.IN_PLACE, buf.view(np.uint8), op=self.MPI.MIN if logical_and else self.MPI.MAX)
            return
        self.comm.Allreduce(self.MPI.IN_PLACE, buf, op=self._ops[op])
        if op is ReduceOp.AVG:
            buf /= self.size

    def broadcast(self, buf, src):
        self.comm.Bcast(buf.view(np.uint8) if buf.dtype == np.bool_ else buf, root=src)

    def all_gather(self, send, recv):
        if send.dtype == np.bool_:
            send, recv = send.view(np.uint8), recv.view(np.uint8)
        self.comm.Allgather(send, recv)

    def reduce_scatter(self, send, recv, op):
        _check_avg(op, send)
        self.comm.Reduce_scatter_block(send, recv, op=self._ops[op])
        if op is ReduceOp.AVG:
            recv /= self.size

    def barrier(self):
        self.comm.Barrier()

    def bcast_object(self, obj, src=0):
        return self.comm.bcast(obj, root=src)

    def allgather_object(self, obj):
        return self.comm.allgather(obj)

    def abort(self, code=1):
        self.MPI.COMM_WORLD.Abort(code)

    def destroy(self):
        if self.comm != self.MPI.COMM_WORLD:
            self.comm.Free()


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


def create_host(world_size_from_env):
    """The MPI backend over a duplicate of COMM_WORLD, or LocalBackend for a lone process without mpi4py."""
    MPI, err = import_mpi()
    if MPI is None:
        if world_size_from_env > 1:
            raise RuntimeError(f"init_process_group: the launcher started {world_size_from_env} processes but "
                               f"mpi4py cannot be used ({type(err).__name__}: {err}); install mpi4py and an MPI "
                               "library (pip install mpi4py mpich)")
        return LocalBackend()
    return MpiBackend(MPI, MPI.COMM_WORLD.Dup())

"""Collectives on CUDA arrays through NCCL (cupy.cuda.nccl), one GPU per process, bootstrapped over MPI.

CuPy is imported only when a process group with backend='nccl' is created. Operations are enqueued on the current
CUDA stream and return without waiting (no host synchronization, so a captured CUDA graph can contain them); a
watchdog (nccl_watchdog.py) ends the job when one does not complete within the group's timeout.
"""
from . import launch
from .mpi_backend import DEFAULT_TIMEOUT_S
from .nccl_watchdog import Watchdog
from .reduce_op import ReduceOp


class NcclBackend:
    name = "nccl"

    def __init__(self, host, local_rank, timeout=DEFAULT_TIMEOUT_S):
        """Select GPU `local_rank` (modulo the visible count), then create the communicator: rank 0 makes the
        unique id, MPI broadcasts it, every rank joins (a collective call: all ranks must get here). A collective
        not complete after `timeout` seconds ends the job (the watchdog)."""
        from ..backend import cuda
        from ..backend.cuda import graphs
        cp = cuda.cupy()  # RuntimeError naming the reason when CUDA cannot be used
        self.graphs, self.host = graphs, host
        from cupy.cuda import nccl
        self.cp, self.nccl = cp, nccl
        n_devices = cp.cuda.runtime.getDeviceCount()
        if n_devices == 0:
            raise RuntimeError("init_process_group(backend='nccl'): no CUDA device is visible to this process")
        self.device_id = local_rank % n_devices
        cp.cuda.Device(self.device_id).use()
        _check_one_gpu_per_rank(host, cp.cuda.runtime.deviceGetPCIBusId(self.device_id), n_devices)
        uid = nccl.get_unique_id() if host.rank == 0 else None
        uid = host.bcast_object(uid, 0)
        self.comm = nccl.NcclCommunicator(host.size, uid, host.rank)
        self.rank, self.size = host.rank, host.size
        self._types = {"float16": nccl.NCCL_FLOAT16, "float32": nccl.NCCL_FLOAT32, "float64": nccl.NCCL_FLOAT64,
                       "int8": nccl.NCCL_INT8, "uint8": nccl.NCCL_UINT8, "bool": nccl.NCCL_UINT8,
                       "int32": nccl.NCCL_INT32, "int64": nccl.NCCL_INT64}
        self._avg = getattr(nccl, "NCCL_AVG", None)  # NCCL >= 2.10
        self._ops = {ReduceOp.SUM: nccl.NCCL_SUM, ReduceOp.MAX: nccl.NCCL_MAX, ReduceOp.MIN: nccl.NCCL_MIN,
                     ReduceOp.PRODUCT: nccl.NCCL_PROD}
        self.watchdog = Watchdog(self.rank, self.size, timeout, self._timed_out, self.device_id)

    def _timed_out(self, message):
        """(The watchdog's thread.) Abort the communicator, which ends this rank's waiting kernels, and the job."""
        def abort():
            try:
                self.comm.abort()
            finally:
                self.host.abort(1)
        launch.say_and_abort(self.rank, message, abort)

    def _queued(self, what):
        """Watch the collective just queued: an event after it now, or after each replay of the graph being
        captured (whose events cannot be queried until it runs)."""
        def watch():   # (on the current stream: the collective's, or the replay's)
            event = self.cp.cuda.Event(block=False, disable_timing=True)
            event.record()
            self.watchdog.watch(what, event)
        if self.graphs.is_current_stream_capturing():
            self.graphs.after_replay(watch)
            return
        watch()

    def _dtype(self, op_name, buf):
        if buf.device.id != self.device_id:
            raise RuntimeError(f"{op_name}: the NCCL process group of this rank uses cuda:{self.device_id}, got a "
                               f"tensor on cuda:{buf.device.id}")
        t = self._types.get(buf.dtype.name)
        if t is None:
            raise TypeError(f"{op_name}: NCCL cannot communicate dtype {buf.dtype}")
        return t

    def _op(self, op, buf):
        """(NCCL op, whether to divide by the world size afterwards)."""
        if op is not ReduceOp.AVG:
            return self._ops[op], False
        if buf.dtype.kind not in "fc":
            raise RuntimeError(f"all_reduce: ReduceOp.AVG needs a floating-point tensor, got dtype {buf.dtype}")
        return (self._avg, False) if self._avg is not None else (self.nccl.NCCL_SUM, True)

    def _stream(self):
        return self.cp.cuda.get_current_stream().ptr

    def all_reduce(self, buf, op):
        dt = self._dtype("all_reduce", buf)
        nop, divide = self._op(op, buf)
        self.comm.allReduce(buf.data.ptr, buf.data.ptr, buf.size, dt, nop, self._stream())
        self._queued("all_reduce")
        if divide:
            buf /= self.size

    def broadcast(self, buf, src):
        self.comm.bcast(buf.data.ptr, buf.size, self._dtype("broadcast", buf), src, self._stream())
        self._queued("broadcast")

    def all_gather(self, send, recv):
        dt = self._dtype("all_gather", send)
        self._dtype("all_gather", recv)
        self.comm.allGather(send.data.ptr, recv.data.ptr, send.size, dt, self._stream())
        self._queued("all_gather")

    def reduce_scatter(self, send, recv, op):
        dt = self._dtype("reduce_scatter", send)
        self._dtype("reduce_scatter", recv)
        nop, divide = self._op(op, send)
        self.comm.reduceScatter(send.data.ptr, recv.data.ptr, recv.size, dt, nop, self._stream())
        self._queued("reduce_scatter")
        if divide:
            recv /= self.size

    def synchronize(self):
        self.cp.cuda.get_current_stream().synchronize()

    def destroy(self):
        self.watchdog.stop()
        self.comm.destroy()


def _check_one_gpu_per_rank(host, bus_id, n_devices):
    """NCCL fails with an opaque 'invalid usage' when two ranks share a GPU: say so, on every rank, before."""
    import socket
    everyone = host.allgather_object((socket.gethostname(), bus_id))
    mine = everyone[host.rank]
    sharing = [r for r, g in enumerate(everyone) if g == mine]
    if len(sharing) > 1:
        raise RuntimeError(f"init_process_group(backend='nccl'): ranks {sharing} would share GPU {bus_id} on "
                           f"{mine[0]} ({n_devices} visible to this process); NCCL needs one GPU per process: start "
                           "at most as many processes per node as there are GPUs, or use backend='mpi'")

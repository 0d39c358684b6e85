"""The process group: rank, world size, local rank, and which backend moves which arrays (MPI for host arrays and
bootstrap, NCCL for CUDA arrays when backend='nccl'); init_process_group and the default-group queries.
"""
import numpy as np

from . import launch, mpi_backend
from .reduce_op import ReduceOp

_default_group = None


class ProcessGroup:
    """What `init_process_group` returns. `.rank`, `.world_size`, `.local_rank`, `.backend` ('mpi' or 'nccl');
    `.allreduce_scalars(values)` sums Python numbers over all ranks (the trainer's evaluation counts)."""

    def __init__(self, backend, host, local_rank):
        self.backend = backend
        self.host = host              # MpiBackend (or LocalBackend for a lone process without mpi4py)
        self.rank = host.rank
        self.world_size = host.size
        self.local_rank = local_rank
        self.nccl = None              # NcclBackend when backend == 'nccl'

    def __repr__(self):
        return f"ProcessGroup(backend={self.backend!r}, rank={self.rank}, world_size={self.world_size})"

    def backend_for(self, array):
        """NumPy arrays go over MPI; CUDA arrays over NCCL, or staged through host memory in an 'mpi' group."""
        if isinstance(array, np.ndarray):
            return self.host
        if self.nccl is not None:
            return self.nccl
        return mpi_backend.HostStaged(self.host)

    # raw flat contiguous arrays (collectives.py validates and flattens Tensors)
    def all_reduce_array(self, buf, op=ReduceOp.SUM):
        self.backend_for(buf).all_reduce(buf, op)

    def broadcast_array(self, buf, src=0):
        self.backend_for(buf).broadcast(buf, src)

    def allreduce_scalars(self, values):
        """Sums of `values` (numbers) over all ranks; ints stay ints (exact below 2**53)."""
        values = list(values)
        buf = np.array([float(v) for v in values], np.float64)
        self.host.all_reduce(buf, ReduceOp.SUM)
        return [round(s) if isinstance(v, (bool, int, np.integer)) else float(s) for v, s in zip(values, buf)]

    def abort_job(self, message):
        """Print `message` as this rank's and end the whole job (every rank) at once; returns only if alone."""
        if self.world_size > 1:
            launch.say_and_abort(self.rank, message, lambda: self.host.abort(1))

    def barrier(self):
        if self.nccl is not None:
            self.nccl.synchronize()  # work already enqueued on the GPU finishes before anyone passes
        self.host.barrier()

    def destroy(self):
        if self.nccl is not None:
            self.nccl.destroy()
        self.host.destroy()


def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1, **kwargs):
    """Join the job that mpiexec/srun started (or a job of one process without a launcher) and return its group.

    backend: 'mpi' (CPU arrays; CUDA arrays staged through the host), 'nccl' (CUDA arrays over NCCL, one GPU per
    process chosen by local rank), or None ('nccl' if CUDA is available, else 'mpi'). Rank and world size come
    from MPI; `world_size`/`rank`, when given, must agree with it. An uncaught exception on any rank afterwards
    (SIGINT and SIGTERM included: they raise KeyboardInterrupt and launch.Terminated) prints its traceback prefixed
    with `[rank N]` and aborts the whole job (MPI Abort), so no rank hangs.

    timeout: how long a collective may wait for the other ranks (a timedelta or seconds; default
    $SMALLTRAIN_DIST_TIMEOUT, else 300 s); past it the waiting rank names the collective and aborts the job.
    A torchrun-style launch (RANK, WORLD_SIZE, LOCAL_RANK set, but MPI sees another number of processes) is
    refused with the mpiexec command to use: each process would otherwise train alone.
    """
    global _default_group
    if _default_group is not None:
        raise ValueError("trying to initialize the default process group twice!")
    if backend is None:
        from .. import cuda
        backend = "nccl" if cuda.is_available() else "mpi"
    backend = str(backend).lower()
    if backend not in ("mpi", "nccl"):
        raise ValueError(f"init_process_group: unknown backend {backend!r}; expected 'mpi', 'nccl' or None")
    if init_method not in (None, "env://", "mpi://"):
        raise ValueError(f"init_process_group: init_method {init_method!r} is not supported; ranks come from MPI "
                         "(start the job with mpiexec or srun)")
    seconds = mpi_backend.resolve_timeout(timeout)
    host = mpi_backend.create_host(launch.env_world_size(), seconds)
    promised = launch.torchrun_world_size()
    if promised is not None and promised != host.size:
        host.destroy()
        raise RuntimeError(f"init_process_group: this process was started by torchrun or a launcher like it "
                           f"(RANK, WORLD_SIZE={promised}, LOCAL_RANK are set), but smalltrain's process groups "
                           f"come from MPI, which sees a job of {host.size} process(es): each process would "
                           f"train alone. Start the job with MPI instead: {launch.mpiexec_command(promised)}")
    for name, given, actual in (("world_size", world_size, host.size), ("rank", rank, host.rank)):
        if given not in (-1, None) and given != actual:
            host.destroy()
            raise ValueError(f"init_process_group: {name}={given} was passed but MPI reports {actual}")
    try:
        local_rank = host.local_rank()
    except (RuntimeError, AttributeError, NotImplementedError):  # no shared-memory split: trust the launcher
        local_rank = launch.env_local_rank() or 0
    group = ProcessGroup(backend, host, local_rank)
    if host.size > 1:
        launch.install_abort_hook(host.rank, lambda: host.abort(1))
        launch.install_signal_handlers()
        launch.share_cpu_threads(host.local_size() if hasattr(host, "local_size") else 1)
    if backend == "nccl":
        from .nccl_backend import NcclBackend
        try:
            group.nccl = NcclBackend(host, local_rank, seconds)
        except Exception:
            if host.size == 1:  # with more ranks the abort hook ends the job if nobody catches this
                host.destroy()
            raise
    _default_group = group
    return group


def destroy_process_group(group=None):
    """Free the communicators and restore sys.excepthook; init_process_group may be called again afterwards."""
    global _default_group
    g = group or _default_group
    if g is None:
        return
    g.destroy()
    if g is _default_group:
        _default_group = None
        launch.remove_abort_hook()
        launch.remove_signal_handlers()


def is_initialized():
    return _default_group is not None


def is_available():
    return True


def default_group(group=None):
    """`group`, or the default one; ValueError (torch's) when init_process_group has not run."""
    if group is not None:
        return group
    if _default_group is None:
        raise ValueError("Default process group has not been initialized, please make sure to call "
                         "init_process_group.")
    return _default_group


def get_rank(group=None):
    return default_group(group).rank


def get_world_size(group=None):
    return default_group(group).world_size


def get_backend(group=None):
    return default_group(group).backend


def get_local_rank():
    """This process's rank among those on its node: from the group (MPI's shared-memory split) once initialized,
    else from the launcher's variables (OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, SLURM_LOCALID, LOCAL_RANK),
    else 0. Use it to pick the GPU: `cuda:{get_local_rank()}`."""
    if _default_group is not None:
        return _default_group.local_rank
    r = launch.env_local_rank()
    return 0 if r is None else r


def barrier(group=None):
    default_group(group).barrier()

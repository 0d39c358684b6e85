"""What the launcher (mpiexec, srun, torchrun) tells a process, and the crash handler that ends the whole job.

One rank that dies while the others wait in a collective would hang the job forever; the hook aborts it instead.
"""
import os
import sys
import time
import traceback

# who sets what: Open MPI, MPICH/Intel MPI (hydra), PMIx, Slurm (srun), torchrun
_LOCAL_RANK_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK")
_WORLD_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_STEP_NUM_TASKS", "WORLD_SIZE")


def env_local_rank():
    """The local rank from the launcher's environment, or None when no launcher set one."""
    for name in _LOCAL_RANK_VARS:
        value = os.environ.get(name)
        if value is not None and value.strip().isdigit():
            return int(value)
    return None


def env_world_size():
    """The number of processes the launcher started (1 when there is no launcher)."""
    for name in _WORLD_SIZE_VARS:
        value = os.environ.get(name)
        if value is not None and value.strip().isdigit():
            return int(value)
    return 1


_previous_hook = None


def install_abort_hook(rank, abort):
    """Replace sys.excepthook: print the traceback prefixed with `[rank N]`, then call abort() (MPI Abort)."""
    global _previous_hook
    if _previous_hook is None:
        _previous_hook = sys.excepthook

    def hook(exc_type, exc, tb):
        text = "".join(traceback.format_exception(exc_type, exc, tb))
        prefixed = "".join(f"[rank {rank}] {line}\n" for line in text.rstrip("\n").split("\n"))
        try:
            sys.stderr.write(prefixed)
            sys.stderr.flush()
            sys.stdout.flush()
            # the launcher forwards our output asynchronously; Abort kills every rank at once, so give the
            # forwarding a moment first or the traceback can be lost (seen under heavy load)
            time.sleep(1.0)
        finally:
            abort()
    sys.excepthook = hook


def remove_abort_hook():
    global _previous_hook
    if _previous_hook is not None:
        sys.excepthook = _previous_hook
        _previous_hook = None


_thread_limit = None


def usable_cores():
    """The cores this process may run on: its CPU affinity where the OS reports one (a container or a batch job
    given 16 cores of a larger host), else os.cpu_count()."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):   # no affinity API (macOS, Windows)
        return os.cpu_count() or 1


def share_cpu_threads(local_size):
    """Give each of a node's `local_size` processes usable cores / local_size BLAS threads.

    OpenBLAS starts one spinning thread per core in every process; two ranks on two cores then oversubscribe
    them and each GEMM gets ~60x slower (measured: a LeNet-5 step went from 19 ms to 1.2 s). A thread count
    the user set (OPENBLAS_NUM_THREADS, OMP_NUM_THREADS, MKL_NUM_THREADS) is left alone. Returns the limit set.
    """
    global _thread_limit
    if local_size <= 1 or any(v in os.environ for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                                        "MKL_NUM_THREADS")):
        return None
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:   # part of the 'dist' extra; without it the job is only slower
        return None
    limit = max(1, usable_cores() // local_size)
    _thread_limit = threadpool_limits(limits=limit, user_api="blas")
    return limit

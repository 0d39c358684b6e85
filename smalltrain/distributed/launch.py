"""What the launcher (mpiexec, srun, torchrun) tells a process, and the crash handlers that end the whole job.

One rank that dies while the others wait in a collective would hang the job forever; the hook aborts it instead.
"""
import os
import shlex
import signal
import sys
import threading
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


_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


def torchrun_world_size():
    """WORLD_SIZE when a torchrun-style launcher set RANK, WORLD_SIZE and LOCAL_RANK, else None."""
    values = [os.environ.get(name, "").strip() for name in _TORCHRUN_VARS]
    if not all(v.isdigit() for v in values):
        return None
    return int(values[1])


def mpiexec_command(n):
    """The mpiexec line that starts this very command as an n-process job (for error messages)."""
    argv0 = sys.argv[0] if sys.argv else ""
    if "smalltrain" in argv0 and os.path.basename(argv0) in ("smalltrain", "__main__.py", "cli.py"):
        command = ["smalltrain", *sys.argv[1:]]
    else:
        command = ["python", *sys.argv]
    return f"mpiexec -n {n} {shlex.join(command)}"


def say_and_abort(rank, message, abort):
    """Print `message` prefixed with `[rank N]` on stderr, let the launcher forward it, then abort() the job."""
    try:
        sys.stdout.flush()
        sys.stderr.write("".join(f"[rank {rank}] {line}\n" for line in message.rstrip("\n").split("\n")))
        sys.stderr.flush()
        # the launcher forwards our output asynchronously; Abort kills every rank at once, so give the
        # forwarding a moment first or the message can be lost (seen under heavy load)
        time.sleep(1.0)
    finally:
        abort()


class Terminated(KeyboardInterrupt):
    """SIGTERM received: raised where the rank is, so that it ends the whole job with a message as Ctrl-C does."""


def _on_sigterm(signum, frame):
    raise Terminated("terminated by SIGTERM")


_previous_sigterm = None


def install_signal_handlers():
    """Turn SIGTERM into the exception Terminated (SIGINT already raises KeyboardInterrupt); main thread only."""
    global _previous_sigterm
    if threading.current_thread() is threading.main_thread() and _previous_sigterm is None:
        _previous_sigterm = signal.signal(signal.SIGTERM, _on_sigterm)


def remove_signal_handlers():
    global _previous_sigterm
    if _previous_sigterm is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _previous_sigterm)
        _previous_sigterm = None


_previous_hook = None


def install_abort_hook(rank, abort):
    """Replace sys.excepthook: print the traceback prefixed with `[rank N]`, then call abort() (MPI Abort)."""
    global _previous_hook
    if _previous_hook is None:
        _previous_hook = sys.excepthook

    def hook(exc_type, exc, tb):
        say_and_abort(rank, "".join(traceback.format_exception(exc_type, exc, tb)), abort)
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

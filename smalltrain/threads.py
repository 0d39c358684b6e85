"""CPU thread controls with torch's names. smalltrain's CPU work runs in NumPy, whose GEMMs (matmul, conv) use the
BLAS library's thread pool: set_num_threads limits it through threadpoolctl. There is no inter-op pool (ops run
one after another), so the interop count is kept and reported only."""
import os

_interop = [None]


def _blas_info():
    import numpy  # noqa: F401 - loads the BLAS threadpoolctl looks for
    from threadpoolctl import threadpool_info
    return [i for i in threadpool_info() if i.get("user_api") in ("blas", "openmp")]


def set_num_threads(num):
    """Use at most `num` threads for CPU GEMMs (process-wide, until changed)."""
    if not isinstance(num, int) or isinstance(num, bool) or num <= 0:
        raise RuntimeError(f"set_num_threads expects a positive integer, but got {num!r}")
    from threadpoolctl import threadpool_limits
    threadpool_limits(limits=num)


def get_num_threads():
    """The threads CPU GEMMs may use (the BLAS pool's size; the CPU count where no pool is found)."""
    info = _blas_info()
    return max(i["num_threads"] for i in info) if info else (os.cpu_count() or 1)


def set_num_interop_threads(num):
    if not isinstance(num, int) or isinstance(num, bool) or num <= 0:
        raise RuntimeError(f"set_num_interop_threads expects a positive integer, but got {num!r}")
    _interop[0] = num


def get_num_interop_threads():
    return _interop[0] if _interop[0] is not None else (os.cpu_count() or 1)

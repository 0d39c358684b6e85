"""Shared benchmark plumbing: timing (warm-up excluded, median of repeats), environment line, result table."""
import os
import platform
import statistics
import time


def timeit(fn, warmup=3, repeats=7, inner=1, sync=None):
    """Median seconds per call of fn() over `repeats` timed runs of `inner` calls, after `warmup` calls."""
    for _ in range(warmup):
        fn()
    if sync:
        sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        if sync:
            sync()
        times.append((time.perf_counter() - t0) / inner)
    return statistics.median(times)


def environment(torch=None):
    import numpy as np
    parts = [f"python {platform.python_version()}", f"numpy {np.__version__}", f"cpus {os.cpu_count()}",
             f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}"]
    if torch is not None:
        parts.append(f"torch {torch.__version__} threads {torch.get_num_threads()}")
    try:
        import threadpoolctl
        for info in threadpoolctl.threadpool_info():
            if info.get("internal_api") == "openblas" and "numpy" in info.get("filepath", ""):
                parts.append(f"numpy BLAS {info.get('internal_api')} {info.get('version')} "
                             f"{info.get('architecture')} threads {info.get('num_threads')}")
    except ImportError:
        pass
    return ", ".join(parts)


def table(rows, headers):
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(str(h).ljust(w) for h, w in zip(headers, widths))
    out = [line, "-" * len(line)]
    out += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(out)

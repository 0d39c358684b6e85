"""What the bench prints besides its figures: the environment line (versions, CPU, GPU, BLAS), aligned tables,
and one-line failure reports."""
import os
import platform
import sys
import traceback

import numpy as np


class ModeProcessError(RuntimeError):
    """A mode that failed in its own process: the message is that process's one-line report."""


def _cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cuda_description(device):
    from ..backend import as_device
    from ..backend.cuda import cupy
    cp = cupy()
    index = as_device(device).index
    name = cp.cuda.runtime.getDeviceProperties(index)["name"]
    name = name.decode() if isinstance(name, bytes) else name
    rt = cp.cuda.runtime.runtimeGetVersion()
    return [f"cupy {cp.__version__}", f"CUDA runtime {rt // 1000}.{rt % 1000 // 10}", f"GPU {name}",
            f"CUPY_TF32={os.environ.get('CUPY_TF32', '(unset)')}"]


def environment(torch=None, device=None):
    """One line of versions and hardware: Python, NumPy, smalltrain, the CPU (and the GPU for a CUDA `device`),
    torch and its thread count when given, NumPy's BLAS when threadpoolctl is installed."""
    from .. import __version__
    parts = [f"smalltrain {__version__}", f"python {platform.python_version()}", f"numpy {np.__version__}",
             f"cpu {_cpu_name()} x{os.cpu_count()}",
             f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}"]
    if device is not None and str(device).startswith("cuda"):
        try:
            parts += _cuda_description(device)
        except Exception as e:  # noqa: BLE001 - the line is informational: never fail a benchmark over it
            parts.append(f"GPU unknown ({type(e).__name__})")
    if torch is not None:
        parts.append(f"torch {torch.__version__} threads {torch.get_num_threads()}")
        if device is not None and str(device).startswith("cuda") and torch.cuda.is_available():
            parts.append(f"torch CUDA {torch.version.cuda} cuDNN {torch.backends.cudnn.version()}")
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
    """Rows of strings as aligned text columns under a header line and a rule."""
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(str(h).ljust(w) for h, w in zip(headers, widths)).rstrip()
    out = [line, "-" * len(line)]
    out += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(out)


def one_line(e):
    """'Type: first line of the message (at file:line)' for an exception."""
    where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    at = f" (at {os.path.basename(where.filename)}:{where.lineno})" if where else ""
    msg = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {msg}{at}"


def report_failure(what, e):
    # a ModeProcessError already carries the child's one-line report
    line = str(e) if isinstance(e, ModeProcessError) else one_line(e)
    print(f"smalltrain bench: {what}: {line}", file=sys.stderr, flush=True)

"""CUDA through CuPy, imported lazily so that CPU-only installs never need it."""
import functools

_cupy = None
_import_error = None


def cupy():
    """The cupy module; RuntimeError with the reason if CUDA cannot be used here."""
    global _cupy, _import_error
    if _cupy is None:
        if _import_error is not None:
            raise RuntimeError(_import_error)
        try:
            import cupy as cp
            cp.cuda.runtime.getDeviceCount()
        except Exception as e:  # ImportError, or a CUDA driver error
            _import_error = (f"CUDA requested but not usable: {type(e).__name__}: {e}. "
                             "Install the 'cuda' extra (pip install 'smalltrain[cuda]', CuPy for CUDA 13; "
                             "cupy-cuda12x for older drivers) on a machine with an NVIDIA GPU.")
            raise RuntimeError(_import_error) from None
        _cupy = cp
        from . import loader   # (CuPy's own run-time compiles are said aloud too)
        loader.watch_cupy_compiles(cp)
    return _cupy


@functools.lru_cache(maxsize=None)
def is_available():
    try:
        return cupy().cuda.runtime.getDeviceCount() > 0
    except RuntimeError:
        return False


def device_count():
    return cupy().cuda.runtime.getDeviceCount() if is_available() else 0

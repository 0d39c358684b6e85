"""`smalltrain.cuda`: the torch.cuda-like namespace (availability, device count, synchronize, seeding)."""
from .backend import cuda as _backend


def is_available():
    return _backend.is_available()


def device_count():
    return _backend.device_count()


def synchronize(device=None):
    if is_available():
        cp = _backend.cupy()
        if device is None:
            cp.cuda.Device().synchronize()
        else:
            from .backend import as_device
            cp.cuda.Device(as_device(device).index).synchronize()
        from .backend.cuda import device_checks
        device_checks.raise_pending()   # the value checks the GPU ran (a bad class index...) report here


def current_device():
    return _backend.cupy().cuda.Device().id if is_available() else 0


def set_device(device):
    from .backend import as_device
    d = as_device(device)
    _backend.cupy().cuda.Device(d.index).use()


def manual_seed(seed):
    """Seeds the generator that CUDA tensors draw from (the shared one, see smalltrain.random)."""
    from . import random
    random.manual_seed(seed)


manual_seed_all = manual_seed


def compile_module(source_or_path, options=()):
    """Compile CUDA C (a .cu path or source text) once per device; returns a cupy.RawModule."""
    from .backend.cuda.loader import compile_module as f
    return f(source_or_path, options)


def elementwise_kernel(in_params, out_params, operation, name, preamble=""):
    """A cached cupy.ElementwiseKernel for custom pointwise ops."""
    from .backend.cuda.loader import elementwise_kernel as f
    return f(in_params, out_params, operation, name, preamble)


def CUDAGraph():  # noqa: N802 - torch's spelling of a class
    """A CUDA graph to capture into (see smalltrain.backend.cuda.graphs)."""
    from .backend.cuda.graphs import CUDAGraph as cls
    return cls()


def graph(cuda_graph):
    """Context manager capturing its block into `cuda_graph`, as torch.cuda.graph."""
    from .backend.cuda.graphs import graph as g
    return g(cuda_graph)


def is_current_stream_capturing():
    from .backend.cuda.graphs import is_current_stream_capturing as f
    return f() if _backend._cupy is not None else False

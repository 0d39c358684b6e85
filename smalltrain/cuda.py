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

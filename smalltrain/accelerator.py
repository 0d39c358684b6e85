"""`smalltrain.accelerator`, torch.accelerator's device-agnostic calls, mapped to CUDA (smalltrain's one
accelerator): `device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else 'cpu'`."""
from . import cuda as _cuda
from .backend import Device


def is_available():
    return _cuda.is_available()


def current_accelerator(check_available=False):
    """device('cuda') where a GPU is present, else None (torch's answer for a CPU-only build)."""
    return Device("cuda") if _cuda.is_available() else None


def device_count():
    return _cuda.device_count() if _cuda.is_available() else 0


def current_device_index():
    return _cuda.current_device()


def set_device_index(device):
    _cuda.set_device(device)


def synchronize(device=None):
    _cuda.synchronize(device)

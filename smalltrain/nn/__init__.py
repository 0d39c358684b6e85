"""smalltrain.nn, as torch.nn: Module and Parameter, the layers, `functional`, `init`, `utils`, and `parallel`
(imported on first use: it pulls in the distributed machinery)."""
import importlib

from . import functional, init, modules, utils
from .module import Module
from .modules import *
from .parameter import Buffer, Parameter

__all__ = ["Buffer", "Module", "Parameter", "functional", "init", "parallel", "utils"]  # noqa: F405 (parallel: lazy)
__all__ += modules.__all__


def __getattr__(name):
    if name == "parallel":
        return importlib.import_module(".parallel", __name__)
    raise AttributeError(f"module 'smalltrain.nn' has no attribute '{name}'")

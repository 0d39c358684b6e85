"""Utilities: data loading (`utils.data`), TensorBoard logging, checkpoints and file helpers."""
import importlib


def __getattr__(name):
    # `smalltrain.utils.data.DataLoader` right after `import smalltrain`, as torch.utils.data after `import torch`;
    # loaded on first use, so the top-level import stays light
    if name in ("data", "tensorboard", "checkpoint", "io", "plot"):
        return importlib.import_module("." + name, __name__)
    raise AttributeError(f"module 'smalltrain.utils' has no attribute '{name}'")

"""The MNIST models the trainer knows: MLP, MnistCnn (2 conv layers), LeNet5; `build(name, **config)` makes one."""
from .cnn import MnistCnn
from .lenet import LeNet5
from .mlp import MLP

MODELS = {"mlp": MLP, "cnn": MnistCnn, "lenet5": LeNet5}


def build(name, **config):
    """A model by its command-line name, with its constructor arguments."""
    try:
        cls = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; expected one of {', '.join(MODELS)}") from None
    return cls(**config)


__all__ = ["MLP", "MnistCnn", "LeNet5", "MODELS", "build"]

"""The MNIST models the trainer knows: MLP, MnistCnn (2 conv layers), LeNet5; `build(name, **config)` makes one.

`build_model(name, config, where)` first checks a config that came from a file (a checkpoint's `model_config`):
known names and keys, types, and bounded sizes, so an edited file cannot make us allocate gigabytes or raise a
TypeError from a constructor.
"""
from .cnn import MnistCnn
from .lenet import LeNet5
from .mlp import _ACTIVATIONS as _MLP_ACTIVATIONS
from .mlp import MLP

MODELS = {"mlp": MLP, "cnn": MnistCnn, "lenet5": LeNet5}

MAX_WIDTH = 1 << 16           # in_features and each hidden width of the MLP
MAX_LAYERS = 16               # hidden layers of the MLP
MAX_CLASSES = 1000
MAX_PARAMETERS = 50_000_000   # 200 MB of float32: far above any model here (LeNet-5 has 44,426)


def build(name, **config):
    """A model by its command-line name, with its constructor arguments."""
    try:
        cls = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; expected one of {', '.join(MODELS)}") from None
    return cls(**config)


def _int(where, key, value, lo, hi):
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ValueError(f"{where}: model_config[{key!r}] must be an int in [{lo}, {hi}], got {value!r}")
    return value


def _choice(where, key, value, choices):
    if value not in choices:
        raise ValueError(f"{where}: model_config[{key!r}] must be one of {', '.join(map(repr, choices))}, "
                         f"got {value!r}")
    return value


def _mlp_parameters(where, config):
    width = _int(where, "in_features", config.get("in_features", 784), 1, MAX_WIDTH)
    hidden = config.get("hidden", [256])
    if not isinstance(hidden, list) or not 0 <= len(hidden) <= MAX_LAYERS:
        raise ValueError(f"{where}: model_config['hidden'] must be a list of at most {MAX_LAYERS} widths, "
                         f"got {hidden!r}")
    count = 0
    for h in hidden:
        _int(where, "hidden", h, 1, MAX_WIDTH)
        count, width = count + width * h + h, h
    _choice(where, "activation", config.get("activation", "relu"), tuple(_MLP_ACTIVATIONS))
    return count + width * config.get("num_classes", 10) + config.get("num_classes", 10)


_KEYS = {"mlp": ("in_features", "hidden", "num_classes", "activation"), "cnn": ("num_classes",),
         "lenet5": ("activation", "num_classes")}


def validate_config(name, config, where="model config"):
    """ValueError naming `where` and the field unless `config` is a valid, bounded config of model `name`."""
    if name not in MODELS:
        raise ValueError(f"{where}: unknown model {name!r}; expected one of {', '.join(MODELS)}")
    if not isinstance(config, dict):
        raise ValueError(f"{where}: model_config must be a JSON object, got {type(config).__name__}")
    unknown = sorted(set(config) - set(_KEYS[name]))
    if unknown:
        raise ValueError(f"{where}: model_config has unknown key(s) {', '.join(map(repr, unknown))} for model "
                         f"{name!r} (known: {', '.join(_KEYS[name])})")
    classes = _int(where, "num_classes", config.get("num_classes", 10), 1, MAX_CLASSES)
    if name == "mlp":
        count = _mlp_parameters(where, config)
    elif name == "lenet5":
        _choice(where, "activation", config.get("activation", "gelu"), ("gelu", "relu"))
        count = 44_426 + 85 * (classes - 10)
    else:
        count = 4_800 + 18_433 * classes
    if count > MAX_PARAMETERS:
        raise ValueError(f"{where}: model_config {config} makes a {name} of {count:,} parameters, more than the "
                         f"{MAX_PARAMETERS:,} allowed")


def build_model(name, config, where="model config"):
    """`build(name, **config)` after validate_config: for configs read from files."""
    validate_config(name, config, where)
    return build(name, **config)


__all__ = ["MLP", "MnistCnn", "LeNet5", "MODELS", "build", "build_model", "validate_config"]

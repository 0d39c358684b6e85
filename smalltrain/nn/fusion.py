"""An activation module followed by MaxPool2d, as one op on the CPU (ops.pool.act_max_pool2d, pooled first: the
activation runs on a quarter of the elements for 2x2 windows); nn.Sequential pairs them.

On CUDA nothing is paired here: the ops find their fusions themselves, however the model is written (a deferred
convolution or linear layer absorbed by the activation, pooling or linear layer after it: ops/fusion.py).
"""
from ..ops.activation import apply_named
from ..ops.pool import act_max_pool2d
from .modules.activation import GELU, ReLU
from .modules.pooling import MaxPool2d

# (imported at module level: these checks run for every module of every nn.Sequential forward, where an import
# statement inside a function costs ~1-2 us each time)


def activation_name(module):
    """'relu', 'gelu' or 'gelu_tanh' for a fusable activation module, else None."""
    if type(module) is ReLU:
        return "relu"
    if type(module) is GELU:
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(module.approximate)
    return None


def _hooked(module):
    return bool(module._forward_pre_hooks or module._forward_hooks)


def _plain_pool(pool):
    return type(pool) is MaxPool2d and not pool.return_indices and not _hooked(pool)


def act_pool_fusable(act_module, pool_module):
    """True when an activation module, then MaxPool2d `pool_module`, may run as one op (act_pool)."""
    return (activation_name(act_module) is not None and not _hooked(act_module)
            and not getattr(act_module, "inplace", False) and _plain_pool(pool_module))


def act_pool(x, activation, pool):
    """pool(activation(x)): one op where `pool` is an unhooked MaxPool2d without indices (ops.pool.act_max_pool2d,
    pooled first on the CPU), else the activation, then the module."""
    if not _plain_pool(pool):
        return pool(apply_named(x, activation))
    return act_max_pool2d(x, activation, pool.kernel_size, pool.stride, pool.padding, pool.dilation, pool.ceil_mode)

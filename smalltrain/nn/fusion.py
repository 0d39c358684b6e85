"""Layer + activation fusion: Linear or Conv2d followed by ReLU or GELU runs as one fused op on CUDA.

On the GPU a small model's step is bound by launches and per-op dispatch, not arithmetic: applying the bias and
the activation inside the layer's epilogue kernel (and the activation's derivative inside its backward kernel)
saves a launch and an autograd node per pair. `nn.Sequential` fuses such adjacent pairs by itself; models with
their own forward call `layer_act(layer, x, activation)`. The values are those of the unfused layers (the same
kernels' arithmetic); layers with hooks, non-zero padding modes, and CPU tensors take the ordinary path.
"""
from ..tensor import Tensor


def activation_name(module):
    """'relu', 'gelu' or 'gelu_tanh' for a fusable activation module, else None."""
    from .modules.activation import GELU, ReLU
    if type(module) is ReLU:
        return "relu"
    if type(module) is GELU:
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(module.approximate)
    return None


def _hooked(module):
    return bool(module._forward_pre_hooks or module._forward_hooks)


def _fusable_layer(layer):
    from .modules.conv import Conv2d
    from .modules.linear import Linear
    if _hooked(layer):
        return False
    return type(layer) is Linear or (type(layer) is Conv2d and layer.padding_mode == "zeros")


def fusable(layer, act_module):
    """True when `layer` then `act_module` may run as one fused op."""
    return activation_name(act_module) is not None and not _hooked(act_module) and _fusable_layer(layer)


def layer_act(layer, x, activation):
    """activation(layer(x)) for activation None, 'relu', 'gelu' or 'gelu_tanh'; fused when x is on CUDA."""
    from ..ops.activation import apply_named
    if not (isinstance(x, Tensor) and x.is_cuda and _fusable_layer(layer)):
        return apply_named(layer(x), activation)
    from ..ops.conv import conv2d_act
    from ..ops.matmul import linear_act
    from .modules.linear import Linear
    if type(layer) is Linear:
        return linear_act(x, layer.weight, layer.bias, activation)
    return conv2d_act(x, layer.weight, layer.bias, layer.stride, layer.padding, layer.dilation, layer.groups,
                      activation)

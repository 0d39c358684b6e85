"""Layer + activation fusion: Linear or Conv2d followed by ReLU or GELU runs as one fused op on CUDA, a
Conv2d + activation followed by MaxPool2d, or by Flatten and a last Linear layer, as one op whose backward is one
kernel fewer, and a run of small Linear (+ activation) layers as one chain op (one launch forward, two backward),
a Flatten before it done inside the op (so that its backward can hand a pooled convolution before it its g).
On the CPU an activation followed by MaxPool2d is one op, pooled first (ops.pool.act_max_pool2d): the activation
runs on a quarter of the elements for 2x2 windows.

On the GPU a small model's step is bound by launches and per-op dispatch, not arithmetic: applying the bias and
the activation inside the layer's epilogue kernel (and the activation's derivative inside its backward kernel)
saves a launch and an autograd node per pair. `nn.Sequential` fuses such adjacent pairs and runs by itself; models
with their own forward call `layer_act(layer, x, activation)`, `layer_act_pool(...)`, `layer_act_linear(...)` and
`chain_act(x, pairs)`.
The values are those of the unfused layers up to float rounding (the chain sums in another order); layers with
hooks, non-zero padding modes, and CPU tensors take the ordinary path.
"""
from ..ops.activation import apply_named
from ..ops.conv import conv2d_act, conv2d_act_linear, conv2d_act_pool
from ..ops.matmul import linear_act, linear_chain
from ..ops.pool import act_max_pool2d
from ..tensor import Tensor
from .modules.activation import GELU, ReLU
from .modules.conv import Conv2d
from .modules.flatten import Flatten
from .modules.linear import Linear
from .modules.pooling import MaxPool2d

# (imported at module level: these checks run for every layer of every forward on CUDA, where an import statement
# inside a function costs ~1-2 us each time)


def activation_name(module):
    """'relu', 'gelu' or 'gelu_tanh' for a fusable activation module, else None."""
    if type(module) is ReLU:
        return "relu"
    if type(module) is GELU:
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(module.approximate)
    return None


def _hooked(module):
    return bool(module._forward_pre_hooks or module._forward_hooks)


def _fusable_layer(layer):
    if _hooked(layer):
        return False
    return type(layer) is Linear or (type(layer) is Conv2d and layer.padding_mode == "zeros")


def fusable(layer, act_module):
    """True when `layer` then `act_module` may run as one fused op."""
    return activation_name(act_module) is not None and not _hooked(act_module) and _fusable_layer(layer)


def layer_act(layer, x, activation):
    """activation(layer(x)) for activation None, 'relu', 'gelu' or 'gelu_tanh'; fused when x is on CUDA."""
    if not (isinstance(x, Tensor) and x.is_cuda and _fusable_layer(layer)):
        return apply_named(layer(x), activation)
    if type(layer) is Linear:
        return linear_act(x, layer.weight, layer.bias, activation)
    return conv2d_act(x, layer.weight, layer.bias, layer.stride, layer.padding, layer.dilation, layer.groups,
                      activation)


def _conv_and_pool(layer, pool):
    """An unhooked zero-padded Conv2d and an unhooked MaxPool2d without indices: the pair Conv2dActPool takes."""
    return type(layer) is Conv2d and _fusable_layer(layer) and _plain_pool(pool)


def pool_fusable(layer, act_module, pool_module):
    """True when Conv2d `layer`, `act_module`, then MaxPool2d `pool_module` may run as one fused op."""
    return fusable(layer, act_module) and _conv_and_pool(layer, pool_module)


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


def layer_act_pool(layer, x, activation, pool):
    """pool(activation(layer(x))): one fused op when x is a batched CUDA tensor, `layer` an unhooked Conv2d with
    zero padding and `pool` an unhooked MaxPool2d without indices; else the layer, then act_pool."""
    if not (isinstance(x, Tensor) and x.is_cuda and x.ndim == 4 and _conv_and_pool(layer, pool)):
        return act_pool(layer(x), activation, pool)
    return conv2d_act_pool(x, layer.weight, layer.bias, layer.stride, layer.padding, layer.dilation, layer.groups,
                           activation, pool.kernel_size, pool.stride, pool.padding, pool.dilation, pool.ceil_mode)


def plain_flatten(module):
    """An unhooked Flatten from dim 1 to the last (x.flatten(1)), which a fused op after it may do itself."""
    return type(module) is Flatten and not _hooked(module) and module.start_dim == 1 and module.end_dim == -1


def _conv_and_linear(layer, flatten, linear):
    """An unhooked zero-padded Conv2d, plain_flatten and an unhooked Linear: the layers Conv2dActLinear takes."""
    return type(layer) is Conv2d and _fusable_layer(layer) and plain_flatten(flatten) and _chain_layer(linear)


def linear_fusable(modules, i):
    """True when modules[i:i + 4] are a Conv2d, a fusable activation, Flatten and a Linear that ends its run of
    Linear layers (where a chain follows, the chain op pays more than this fusion)."""
    return (i + 3 < len(modules) and fusable(modules[i], modules[i + 1])
            and _conv_and_linear(modules[i], modules[i + 2], modules[i + 3])
            and linear_run(modules, i + 3)[1] == i + 4)


def layer_act_linear(layer, x, activation, flatten, linear):
    """linear(flatten(activation(layer(x)))): one fused op (its backward one kernel fewer) when x is a batched CUDA
    tensor and the layers are an unhooked zero-padded Conv2d, Flatten() and an unhooked Linear; else the modules
    one by one."""
    if not (isinstance(x, Tensor) and x.is_cuda and x.ndim == 4 and _conv_and_linear(layer, flatten, linear)):
        return linear(flatten(layer_act(layer, x, activation)))
    return conv2d_act_linear(x, layer.weight, layer.bias, layer.stride, layer.padding, layer.dilation, layer.groups,
                             activation, linear.weight, linear.bias)


def _chain_layer(module):
    return type(module) is Linear and not _hooked(module)


def linear_run(modules, i):
    """The run of unhooked Linear layers, each optionally followed by a fusable activation, that starts at
    modules[i]: ([(layer, activation name or None), ...], the index after the run)."""
    pairs = []
    while i < len(modules) and _chain_layer(modules[i]):
        act = activation_name(modules[i + 1]) if i + 1 < len(modules) and fusable(modules[i], modules[i + 1]) else None
        pairs.append((modules[i], act))
        i += 2 if act else 1
    return pairs, i


def chain_act(x, pairs, flatten=False):
    """act_n(layer_n(... act_1(layer_1(x)) ...)) for pairs [(Linear, activation name or None), ...] (of
    x.flatten(1) where flatten): on CUDA one chain op per run of up to four layers where the chain kernels take it
    (ops.matmul.linear_chain, which flattens inside the op: its backward may then hand a pooled convolution before
    it its g), else the layers one by one (fused pairs on CUDA)."""
    if not (isinstance(x, Tensor) and x.is_cuda and all(_chain_layer(layer) for layer, _ in pairs)):
        if flatten:
            x = x.flatten(1)
        for layer, act in pairs:
            x = layer_act(layer, x, act)
        return x
    return linear_chain(x, [(layer.weight, layer.bias, act) for layer, act in pairs], flatten)

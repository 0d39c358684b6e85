"""The fusion rules: which deferred op (autograd/pending.py) the op after it absorbs, and into which fused op.

On CUDA a convolution, a linear layer, batch_norm and log_softmax are deferred (ops/conv.py conv2d, ops/matmul.py
linear, ops/norm.py batch_norm, ops/activation.py log_softmax), and these rules join what follows them, however the
model spells it (modules or F.* calls):
  conv2d -> relu | gelu | gelu tanh (or none)        conv2d_act: bias and activation in the convolution's epilogue
         -> max_pool2d                                conv2d_act_pool (Conv2dActPool)
         -> flatten(1) -> linear                      conv2d_act_linear, or, after the pooling, the linear chain
                                                      reading the pooled output flattened (its backward writes the
                                                      convolution's g through the pooling)
  linear -> relu | gelu | gelu tanh -> linear ...     linear_act for one layer, linear_chain for a run of them
  log_softmax(dim=1) -> nll_loss                      cross_entropy (its value is exactly nll_loss(log_softmax))
  batch_norm -> relu | gelu | gelu tanh               batch_norm with the activation in its elementwise pass, and
                                                      its backward's (ops/norm.py BatchNorm)
On the CPU a ReLU or GELU of a batched image is deferred (ops/activation.py) and joins a max_pool2d after it:
  relu | gelu | gelu tanh -> max_pool2d               act_max_pool2d: pooled first, the activation on a quarter
                                                      of the values for 2x2 windows (ops/pool.py ActMaxPool2d)
Each rule returns its fused op deferred in turn, so that the next op may join; a rule returns None to decline
(the consumer then runs its plain path, which runs the deferred op first). The value is the unfused ops' up to
float32 rounding (the fused kernels sum in another order).
"""
import numpy as np

from ..autograd.pending import defer, raw_array, rule
from ..tensor import Tensor
from .conv import Conv2d, Conv2dActLinear, Conv2dActPool, act_linear_fits, act_pool_geometry, linear_fits
from .loss import nll_of_log_softmax
from .matmul import run_layers
from .norm import run_batch_norm
from .pool import act_max_pool2d


@rule("act_cpu", "max_pool2d")
def _act_pool_cpu(args, kernel_size, stride, padding, dilation, ceil_mode, return_indices):
    """On the CPU: the activation on the pooled values (act_max_pool2d checks the rest and otherwise runs both)."""
    if return_indices:
        return None
    x, activation = args
    return act_max_pool2d(x, activation, kernel_size, stride, padding, dilation, ceil_mode)


@rule("conv", "act")
def _conv_act(args, activation):
    return defer("conv_act", Conv2d.apply, args[:-1] + (activation,))


# a convolution without activation pools and flattens into a linear layer as one with (activation None)
@rule("conv", "max_pool2d")
@rule("conv_act", "max_pool2d")
def _conv_act_pool(args, kernel_size, stride, padding, dilation, ceil_mode, return_indices):
    if return_indices:
        return None
    x, w, _, conv_stride, pads, conv_dilation = args[:6]
    pool, pooled = act_pool_geometry(raw_array(x).shape, w.array.shape, conv_stride, pads, conv_dilation, kernel_size,
                                     stride, padding, dilation, ceil_mode)
    return defer("conv_act_pool", _run_pool, args + (pool, w.array.shape[0] * pooled[0] * pooled[1]))


def _run_pool(*args):
    return Conv2dActPool.apply(*args[:-1])   # (the last argument: the pooled output's width, for the rules)


@rule("conv", "flatten")
@rule("conv_act", "flatten")
def _conv_act_flat(args):
    return defer("conv_act_flat", _run_flat, (Conv2d.apply,) + args)


@rule("conv_act_pool", "flatten")
def _conv_act_pool_flat(args):
    return defer("conv_act_pool_flat", _run_flat, (_run_pool,) + args)


def _run_flat(run, *args):
    return run(*args).flatten(1)


@rule("conv_act_flat", "linear")
def _conv_act_linear(args, weight, bias):
    x, w, _, stride, pads, dilation = args[1:7]
    a = raw_array(x)
    if not act_linear_fits(a.shape, w.array.shape, stride, pads, dilation, weight, bias, a.dtype):
        return None
    return defer("conv_act_linear", Conv2dActLinear.apply, args[1:] + (weight, bias))


@rule("conv_act_pool_flat", "linear")
def _pooled_chain(args, weight, bias):
    x, width = args[1], args[-1]
    if not linear_fits(width, weight, bias, raw_array(x).dtype):
        return None
    # the chain reads the pooled output flattened, inside its op: its backward hands the convolution its g
    return defer("linear", run_layers, (_run_pool(*args[1:]), ((weight, bias, None),), True))


def _conv_act_then_chain(args, layers):
    """(input, layers, flatten) of a linear chain, where another activation or linear layer follows a deferred
    conv2d_act_linear: the convolution with its activation now, and the linear layers as a chain reading its output
    flattened."""
    conv_args, (weight, bias) = args[:-2], args[-2:]
    return Conv2d.apply(*conv_args), ((weight, bias, None),) + layers, True


@rule("conv_act_linear", "act")
def _conv_act_linear_act(args, activation):
    return _linear_act(_conv_act_then_chain(args, ()), activation)


@rule("conv_act_linear", "linear")
def _conv_act_linear_linear(args, weight, bias):
    if not linear_fits(args[-2].array.shape[0], weight, bias, raw_array(args[0]).dtype):
        return None
    return defer("linear", run_layers, _conv_act_then_chain(args, ((weight, bias, None),)))


@rule("linear", "act")
def _linear_act(args, activation):
    x, layers, flatten = args
    w, b, act = layers[-1]
    if act is not None:
        return None
    return defer("linear", run_layers, (x, layers[:-1] + ((w, b, activation),), flatten))


@rule("linear", "linear")
def _linear_linear(args, weight, bias):
    x, layers, flatten = args
    if not linear_fits(layers[-1][0].array.shape[0], weight, bias, raw_array(x).dtype):
        return None
    return defer("linear", run_layers, (x, layers + ((weight, bias, None),), flatten))


@rule("batch_norm", "act")
def _batch_norm_act(args, activation):
    return defer("batch_norm_act", run_batch_norm, args + (activation,), effects=args[5] and args[1] is not None)


@rule("log_softmax", "nll_loss")
def _nll_of_log_softmax(args, target, weight, size_average, ignore_index, reduce, reduction):
    x = raw_array(args[0])   # (not running a held launch that writes it: cross_entropy may take it over)
    if (not isinstance(target, Tensor) or not (weight is None or isinstance(weight, Tensor))
            or size_average is not None or reduce is not None or reduction not in ("mean", "sum", "none")):
        return None
    t = target.array
    if type(t) is np.ndarray or t.dtype != np.int64 or t.shape != x.shape[:1]:
        return None   # (the plain nll_loss raises the clear error)
    if weight is not None and (type(weight.array) is np.ndarray or weight.array.shape != x.shape[1:]):
        return None
    return defer("cross_entropy", nll_of_log_softmax, (args[0], target, weight, ignore_index, reduction))


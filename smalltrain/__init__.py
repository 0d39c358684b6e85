"""smalltrain: tensors, reverse-mode autograd and every operator written out, on NumPy (CPU) and CuPy (CUDA).

The top level mirrors torch's: `import smalltrain as torch` runs scripts that use the supported subset.
"""
import importlib

from ._dtype import (bool_, double, float, float16, float32, float64, get_default_dtype, half, int, int8,  # noqa
                     int16, int32, int64, long, set_default_dtype, uint8)
from ._dtype import dtype
from . import _dtype
from .backend import Device as device
from .tensor import Size, Tensor
from .creation import (arange, as_tensor, empty, empty_like, eye, from_numpy, full, full_like, linspace, ones,
                       ones_like, rand, rand_like, randint, randint_like, randn, randn_like, randperm, tensor,
                       zeros, zeros_like)
from .autograd import enable_grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled
from .random import get_rng_state, initial_seed, manual_seed, seed, set_rng_state
from .ops.elementwise import (abs, add, allclose, bitwise_and, bitwise_not, bitwise_or, bitwise_xor, ceil,  # noqa
                              clamp, clip, cos, cosh, div, eq, equal, exp, floor, ge, gt, isfinite, isinf, isnan, le,
                              log, log1p, logical_and, logical_not, logical_or, logical_xor, lt, maximum, minimum,
                              mul, ne, neg, pow, round, rsqrt, sigmoid, sign, sin, sinh, sqrt, sub, tanh, where)
from .ops.reduce import (all, amax, amin, any, argmax, argmin, count_nonzero, logsumexp, max, mean, min, prod,  # noqa
                         std, sum, var)
from .ops.shape import (cat, chunk, concat, concatenate, flatten, flip,  # noqa
                        permute, repeat, reshape, split, squeeze, stack, t, transpose, unbind, unflatten,
                        unsqueeze)
from .ops.index import gather, index_select, masked_fill, nonzero
from .ops.matmul import bmm, matmul, mm
from .ops.sort import argsort, sort, topk, unique
from .ops.scan import cumprod, cumsum
from .ops import fusion as _fusion  # noqa: F401  (registers the rules that fuse deferred ops on CUDA)
from . import cuda
from . import autograd
from . import accelerator, backends
from .backends import get_float32_matmul_precision, set_float32_matmul_precision
from .threads import get_num_interop_threads, get_num_threads, set_num_interop_threads, set_num_threads

bool = bool_  # noqa: A001 - torch.bool
negative, multiply, divide, subtract = neg, mul, div, sub
__version__ = "0.1.0"

_LAZY = ("nn", "optim", "utils", "datasets", "transforms", "distributed", "models", "testing", "backend", "ops",
         "train", "cli", "compile_")


def __getattr__(name):
    # submodules load on first use, so `import smalltrain` stays fast and never imports CuPy or MPI
    if name in _LAZY:
        return importlib.import_module("." + name, __name__)
    if name in ("relu", "softmax", "log_softmax", "dropout"):
        return getattr(importlib.import_module(".nn.functional", __name__), name)
    if name == "compile":
        return importlib.import_module(".compile_", __name__).compile
    if name == "Generator":
        return importlib.import_module(".generator", __name__).Generator
    if name in ("save", "load"):
        return getattr(importlib.import_module(".serialization", __name__), name)
    raise AttributeError(f"module 'smalltrain' has no attribute '{name}'")


def result_type(*operands):
    """The dtype torch's promotion gives an op over these tensors and Python numbers."""
    return _dtype.from_numpy_dtype(_dtype.result_type(*operands))


def promote_types(type1, type2):
    return _dtype.from_numpy_dtype(_dtype.promote_types(_dtype.to_numpy_dtype(type1), _dtype.to_numpy_dtype(type2)))


def is_tensor(obj):
    return isinstance(obj, Tensor)


def numel(input):  # noqa: A002
    return input.numel()


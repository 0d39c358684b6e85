"""Dropout: each element is zeroed with probability p and the survivors are scaled by 1 / (1 - p). Masks come from
smalltrain.random's generator (CuPy's generator for CUDA arrays), so manual_seed makes them reproducible.
"""
import numpy as np

from .. import random as _random
from ..autograd.function import Function
from ._util import xp_of
from .activation import apply_inplace, expect_tensor


def _noise(a, p):
    """mask / (1 - p) in a's dtype, the mask kept with probability 1 - p (torch's bernoulli_(1 - p) / (1 - p))."""
    xp = xp_of(a)
    if p == 1:
        return xp.zeros(a.shape, a.dtype)
    dt = np.float64 if a.dtype == np.float64 else np.float32
    if xp is np:
        u = _random.default_generator().random(a.shape, dtype=dt)
    else:   # a later CUDA pass replaces this with a counter-based kernel that needs no separate draw
        u = xp.random.random(a.shape, dtype=dt)
    return xp.multiply(u < 1 - p, 1 / (1 - p), dtype=a.dtype)


class Dropout(Function):
    @staticmethod
    def forward(ctx, x, p):
        noise = _noise(x.array, p)
        ctx.noise = noise
        return x.array * noise

    @staticmethod
    def backward(ctx, dout):
        return dout.array * ctx.noise, None


def dropout(input, p=0.5, training=True, inplace=False):
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    expect_tensor("dropout", input)
    a = input.array
    if not training or p == 0 or a.size == 0:
        return input   # torch returns the input itself here
    if a.dtype.kind != "f":
        raise RuntimeError(f"dropout: result type Float can't be cast to the desired output type {input.dtype} "
                           f"(input shape {list(a.shape)})")
    if inplace:
        return apply_inplace(input, "dropout", lambda t: Dropout.apply(t, p))
    return Dropout.apply(input, p)

"""Dropout: each element is zeroed with probability p and the survivors are scaled by 1 / (1 - p). CPU masks come
from smalltrain.random's generator; float CUDA arrays use the Philox kernel (backend/cuda/dropout.py), whose mask is
a function of a device-side (seed, offset) that each call advances. manual_seed makes both reproducible.
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


_KERNEL_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_cuda_states = {}   # device id -> (the generator it was seeded under, device uint64 [seed, offset])


def _cuda_state(a):
    """This device's Philox state. manual_seed makes a new generator, and the next call restarts at (seed, 0).

    Built and advanced by kernels only (no host-to-device copy, no sync), so a captured CUDA graph advances the
    offset on every replay and draws a new mask each step.
    """
    gen = _random.default_generator()
    dev = a.device.id
    have = _cuda_states.get(dev)
    if have is None or have[0] is not gen:
        from ..backend.cuda import cupy
        with a.device:
            state = cupy().zeros(2, dtype=np.uint64)
            state[0] = np.uint64(_random.initial_seed() % 2 ** 64)
        _cuda_states[dev] = have = (gen, state)
    return have[1]


class Dropout(Function):
    @staticmethod
    def forward(ctx, x, p):
        a = x.array
        if not isinstance(a, np.ndarray) and a.dtype in _KERNEL_FLOATS:
            from ..backend.cuda import dropout as kernels
            state = _cuda_state(a)
            out, ctx.kernel_saved = kernels.dropout_forward(a, p, state=state)   # it keeps a snapshot of state
            state[1:] += np.uint64(1)
            return out
        noise = _noise(a, p)
        ctx.noise = noise
        return a * noise

    @staticmethod
    def backward(ctx, dout):
        if hasattr(ctx, "kernel_saved"):
            from ..backend.cuda import dropout as kernels
            return kernels.dropout_backward(dout.array, ctx.kernel_saved), None
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

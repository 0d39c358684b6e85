"""Dropout: each element is zeroed with probability p and the survivors are scaled by 1 / (1 - p). CPU masks come
from smalltrain.random's generator; float CUDA arrays use the Philox kernel (backend/cuda/dropout.py), whose mask is
a function of a device-side (seed, offset) that each call advances. manual_seed makes both reproducible.
dropout1d and dropout2d zero whole channels (one draw per (sample, channel), broadcast over the spatial dims), as
torch's feature dropout.
"""
import warnings

import numpy as np

from .. import random as _random
from ..autograd.function import Function
from ._util import xp_of
from .activation import apply_inplace, expect_tensor


def _noise(a, p, shape=None):
    """mask / (1 - p) in a's dtype and of `shape` (a's by default), the mask kept with probability 1 - p (torch's
    bernoulli_(1 - p) / (1 - p))."""
    xp = xp_of(a)
    shape = a.shape if shape is None else shape
    if p == 1:
        return xp.zeros(shape, a.dtype)
    dt = np.float64 if a.dtype == np.float64 else np.float32
    if xp is np:
        u = _random.default_generator().random(shape, dtype=dt)
    else:   # a later CUDA pass replaces this with a counter-based kernel that needs no separate draw
        u = xp.random.random(shape, dtype=dt)
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


# ---- channel (feature) dropout --------------------------------------------------------------------------------

def _channel_noise(a, p, shape):
    """The noise of `shape` for a's channels. On CUDA (float32/64) the Philox kernel drops elements of a ones array
    of that shape: the draw comes from the same device-side state as dropout's, so it is reproducible under
    manual_seed and needs no host synchronization."""
    if isinstance(a, np.ndarray) or a.dtype not in _KERNEL_FLOATS:
        return _noise(a, p, shape)
    from ..backend.cuda import dropout as kernels
    state = _cuda_state(a)
    with a.device:
        ones = xp_of(a).ones(shape, a.dtype)
    noise, _ = kernels.dropout_forward(ones, p, state=state)
    state[1:] += np.uint64(1)
    return noise


class FeatureDropout(Function):
    """out = x * noise, one noise value per (sample, channel) broadcast over the rest (`shape` is the noise's)."""

    @staticmethod
    def forward(ctx, x, p, shape):
        noise = _channel_noise(x.array, p, shape)
        ctx.noise = noise
        return x.array * noise

    @staticmethod
    def backward(ctx, dout):
        return dout.array * ctx.noise, None, None


def _feature_dropout(op, input, p, training, inplace, batched=True):
    """torch's feature_dropout: identity when not training, p == 0 or empty; else one draw per input[n, c] (per
    input[c] when not `batched`)."""
    a = input.array
    if not training or p == 0 or a.size == 0:
        return input
    if a.ndim < 2:
        raise RuntimeError(f"{op}: Feature dropout requires at least 2 dimensions in the input, got input of size "
                           f"{list(a.shape)}")
    if a.dtype.kind != "f":
        raise RuntimeError(f"{op}: result type Float can't be cast to the desired output type {input.dtype} "
                           f"(input shape {list(a.shape)})")
    lead = 1 if not batched else 2
    shape = a.shape[:lead] + (1,) * (a.ndim - lead)
    if inplace:
        return apply_inplace(input, op, lambda t: FeatureDropout.apply(t, p, shape))
    return FeatureDropout.apply(input, p, shape)


def _check_p(p):
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")


def dropout1d(input, p=0.5, training=True, inplace=False):
    """Zeroes whole channels of [N, C, L] (or [C, L]) input with probability p; survivors scaled by 1 / (1 - p)."""
    _check_p(p)
    expect_tensor("dropout1d", input)
    ndim = input.array.ndim
    if ndim not in (2, 3):
        raise RuntimeError(f"dropout1d: Expected 2D or 3D input, but received a {ndim}D input. Note that dropout1d "
                           "exists to provide channel-wise dropout on inputs with 1 spatial dimension, a channel "
                           "dimension, and an optional batch dimension (i.e. 2D or 3D inputs).")
    return _feature_dropout("dropout1d", input, p, training, inplace, batched=ndim == 3)


def dropout2d(input, p=0.5, training=True, inplace=False):
    """Zeroes whole channels of [N, C, H, W] input with probability p. As torch: a 3-D input is read as [N, C, L]
    (with a warning), other ranks warn and still drop input[n, c] slices."""
    _check_p(p)
    expect_tensor("dropout2d", input)
    ndim = input.array.ndim
    if ndim not in (3, 4):
        warnings.warn(f"dropout2d: Received a {ndim}-D input to dropout2d, which is deprecated and will result in "
                      "an error in a future release. To retain the behavior and silence this warning, please use "
                      "dropout instead. Note that dropout2d exists to provide channel-wise dropout on inputs with 2 "
                      "spatial dimensions, a channel dimension, and an optional batch dimension (i.e. 3D or 4D "
                      "inputs).", UserWarning, stacklevel=2)
    if ndim == 3:
        warnings.warn("dropout2d: Received a 3D input to dropout2d and assuming that channel-wise 1D dropout "
                      "behavior is desired - input is interpreted as shape (N, C, L), where C is the channel dim. "
                      "This behavior will change in a future release to interpret the input as one without a batch "
                      "dimension, i.e. shape (C, H, W). To maintain the 1D channel-wise dropout behavior, please "
                      "switch to using dropout1d instead.", UserWarning, stacklevel=2)
    return _feature_dropout("dropout2d", input, p, training, inplace)

"""Gradient clipping (clip_grad_norm_, clip_grad_value_) with torch's formulas; everything stays on the device
(no host synchronization) unless error_if_nonfinite asks for a check."""
import math

import numpy as np

from ...ops._util import xp_of
from ...tensor import Tensor


def _vector_norm(xp, a, p):
    """torch.linalg.vector_norm of a flat array (0-d result in a's dtype)."""
    if p == math.inf:
        return xp.abs(a).max() if a.size else xp.zeros((), a.dtype)
    if p == -math.inf:
        return xp.abs(a).min() if a.size else xp.asarray(math.inf, a.dtype)
    if p == 0:
        return xp.asarray(xp.count_nonzero(a), dtype=a.dtype)
    if p == 1:
        return xp.abs(a).sum()
    if p == 2:
        return xp.sqrt(xp.dot(a, a))
    return (xp.abs(a) ** p).sum() ** (1.0 / p)


def get_total_norm(tensors, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """The norm of the norms of `tensors` (a Tensor or an iterable of them): a 0-d Tensor."""
    tensors = [tensors] if isinstance(tensors, Tensor) else [t for t in tensors if t is not None]
    norm_type = float(norm_type)
    if not tensors:
        return Tensor._wrap(np.zeros((), np.float32))
    xp = xp_of(tensors[0].array)
    dt = np.result_type(*[t.array.dtype for t in tensors])
    norms = xp.stack([_vector_norm(xp, t.array.reshape(-1), norm_type).astype(dt) for t in tensors])
    total = _vector_norm(xp, norms, norm_type)
    if error_if_nonfinite and not bool(xp.isfinite(total)):
        raise RuntimeError(f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, so "
                           "it cannot be clipped. To disable this error and scale the gradients by the non-finite "
                           "norm anyway, set `error_if_nonfinite=False`")
    return Tensor._wrap(total)


def _params(parameters):
    return [parameters] if isinstance(parameters, Tensor) else list(parameters)


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """Scale all gradients in place by min(1, max_norm / (total_norm + 1e-6)); returns total_norm (0-d Tensor)."""
    grads = [p.grad for p in _params(parameters) if p.grad is not None]
    total = get_total_norm(grads, norm_type, error_if_nonfinite, foreach)
    if grads:
        xp = xp_of(total.array)
        coef = xp.minimum(float(max_norm) / (total.array + 1e-6), 1.0)
        for g in grads:
            g.array *= coef.astype(g.array.dtype)
    return total


def clip_grad_norm(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """Deprecated alias of clip_grad_norm_."""
    return clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite, foreach)


def clip_grad_value_(parameters, clip_value, foreach=None):
    """Clamp every gradient in place to [-clip_value, clip_value]."""
    clip_value = float(clip_value)
    for p in _params(parameters):
        if p.grad is not None:
            xp = xp_of(p.grad.array)
            xp.clip(p.grad.array, -clip_value, clip_value, out=p.grad.array)

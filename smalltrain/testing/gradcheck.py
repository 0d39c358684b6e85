"""Finite-difference gradient check in float64: compares backward() with central differences."""
import numpy as np


def gradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-3, seed=0, raise_exception=True):
    """Check d(sum(fn(*inputs) * v))/d(input) against central differences, for every input requiring grad.

    `inputs` is a tuple of Tensors (float64 for a meaningful check); fn may return a Tensor or a tuple.
    Returns True, or raises AssertionError naming the input and the worst element.
    """
    from ..autograd import no_grad
    from ..tensor import Tensor

    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    for t in inputs:  # perturbations below write through a flat view, which needs contiguous memory
        if isinstance(t, Tensor) and not t.array.flags.c_contiguous:
            t.array = t.array.copy()
    rng = np.random.default_rng(seed)

    def outputs(*args):
        out = fn(*args)
        out = out if isinstance(out, tuple) else (out,)
        return [o for o in out if isinstance(o, Tensor) and o.array.dtype.kind == "f"]

    outs = outputs(*inputs)
    weights = [rng.standard_normal(o.array.shape) for o in outs]

    def scalar(*args):
        with no_grad():
            return sum(float((_host(o.array) * w).sum()) for o, w in zip(outputs(*args), weights))

    for t in inputs:
        if isinstance(t, Tensor):
            t.grad = None
    total = None
    for o, w in zip(outs, weights):
        if not o.requires_grad:
            continue
        term = (o * Tensor._wrap(_like(o.array, w))).sum()
        total = term if total is None else total + term
    if total is not None:
        total.backward()
    for k, t in enumerate(inputs):
        if not (isinstance(t, Tensor) and t.requires_grad):
            continue
        if t.array.dtype != np.float64 and raise_exception:
            raise AssertionError(f"gradcheck: input {k} is {t.dtype}; use float64 for a finite-difference check")
        analytic = np.zeros(t.array.shape) if t.grad is None else _host(t.grad.array).astype(np.float64)
        numeric = np.zeros(t.array.shape)
        flat = t.array.reshape(-1)
        for i in range(flat.size):
            orig = flat[i].item()
            flat[i] = orig + eps
            hi = scalar(*inputs)
            flat[i] = orig - eps
            lo = scalar(*inputs)
            flat[i] = orig
            numeric.reshape(-1)[i] = (hi - lo) / (2 * eps)
        bad = np.abs(analytic - numeric) > atol + rtol * np.abs(numeric)
        if bad.any():
            i = np.unravel_index(int(np.argmax(np.abs(analytic - numeric))), numeric.shape)
            msg = (f"gradcheck: input {k} gradient mismatch at index {list(i)}: analytic {analytic[i]:.8g}, "
                   f"numeric {numeric[i]:.8g} ({int(bad.sum())} of {bad.size} elements off)")
            if raise_exception:
                raise AssertionError(msg)
            return False
    return True


def _host(a):
    return a if isinstance(a, np.ndarray) else a.get()


def _like(a, w):
    if isinstance(a, np.ndarray):
        return w.astype(a.dtype)
    from ..backend import get_array_module
    return get_array_module(a).asarray(w, dtype=a.dtype)

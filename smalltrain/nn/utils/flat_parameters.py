"""flatten_parameters: a model's parameters and their gradients as views into one flat buffer each.

A fused optimizer then updates every parameter with one pass over each buffer (optim/fused.py), and a collective
can reduce all gradients at once. The gradients land in their views without copies where the op that makes them
claims the view (autograd.engine.claim_grad: the convolution and linear kernels of backend/cuda); any other
gradient is copied into its view when the backward pass accumulates it.
"""
import contextlib
import weakref

import numpy as np

from ..._identity_map import IdentityWeakMap
from ...autograd import engine
from ...ops._util import xp_of
from ...tensor import Tensor
from ..module import typename

# each parameter's offset rounded up to this many bytes, as CuPy aligns its allocations: the kernels take their
# vector loads and stores (float4) only on aligned arrays, and a flat LeNet-5 with the parameters packed end to end
# trained 2.1-2.5 us a step slower on an H100 (benchmarks/RESULTS.md). The gaps start as
# zeros; the fused optimizers update them as elements with a zero gradient, and nothing reads them.
ALIGN_BYTES = 256
_owners = IdentityWeakMap()   # parameter -> the FlatParameters it is a view of


class FlatParameters:
    """Parameters as views into `data` and their gradients as views into `grad` (flat arrays, in the order given,
    each parameter at an offset of a multiple of ALIGN_BYTES; the gaps between them start as zeros).

    `params[i].array` is `data[offsets[i]:offsets[i] + numel].reshape(shape)`, and once a backward pass (or the
    constructor, for a gradient already there) gives it a gradient, `params[i].grad.array` is the same slice of
    `grad`. zero_grad(set_to_none=True) drops the .grad tensors and keeps the memory, which the next pass writes
    again. Replacing a parameter's array (module.to(), vector_to_parameters) detaches it: `intact()` then says so,
    and the optimizers update parameters one array at a time again."""

    def __init__(self, params):
        params = list(params)
        _check(params)
        first = params[0].array
        xp = xp_of(first)
        sizes = [p.array.size for p in params]
        step = max(1, ALIGN_BYTES // first.dtype.itemsize)
        self.offsets, total = [], 0
        for n in sizes:
            self.offsets.append(total)
            total += -(-n // step) * step
        with contextlib.nullcontext() if xp is np else first.device:
            self.data = xp.zeros(total, dtype=first.dtype)
            self.grad = xp.zeros(total, dtype=first.dtype)
        # weakly: the registry (_owners) keeps this object for as long as one of its parameters lives
        self._params = [weakref.ref(p) for p in params]
        self._views, self._grad_views = [], []
        for p, off, n in zip(params, self.offsets, sizes):
            view = self.data[off:off + n].reshape(p.array.shape)
            view[...] = p.array
            p.array = view
            gview = self.grad[off:off + n].reshape(view.shape)
            if p.grad is not None:
                gview[...] = p.grad.array
                p.grad = Tensor._wrap(gview)
            engine.set_grad_slot(p, gview)
            _owners.set(p, self)
            self._views.append(view)
            self._grad_views.append(gview)

    @property
    def params(self):
        """The parameters, in the buffers' order (None for one that no longer exists)."""
        return [r() for r in self._params]

    def intact(self):
        """True while every parameter's array is still its view into `data`."""
        return all(p is not None and p.array is v for p, v in zip(self.params, self._views))

    def grads_in_place(self):
        """True while intact() and every parameter's .grad is its view into `grad` (none dropped or replaced)."""
        return self.intact() and all(p.grad is not None and p.grad.array is g
                                     for p, g in zip(self.params, self._grad_views))

    def __repr__(self):
        return f"FlatParameters({len(self._params)} parameters, {self.data.size} elements, {self.data.dtype})"


def owner(param):
    """The FlatParameters whose view `param` is, or None."""
    return _owners.get_for(param)


def flatten_parameters(parameters):
    """Make `parameters` (e.g. model.parameters()) views into one flat buffer, and their gradients views into
    another; returns the FlatParameters. The values are kept; call it before making the optimizer."""
    return FlatParameters(parameters)


def _check(params):
    if not params:
        raise ValueError("flatten_parameters: expected at least one parameter, got none")
    first = params[0]
    for i, p in enumerate(params):
        if not isinstance(p, Tensor):
            raise TypeError(f"flatten_parameters: expected Tensors, got {typename(p)} at position {i}")
        if p._ctx is not None:
            raise ValueError(f"flatten_parameters: expected leaf tensors, got a non-leaf at position {i}")
        a = p.array
        if a.dtype.kind != "f":
            raise TypeError(f"flatten_parameters: expected floating point parameters, got {a.dtype} at position {i}")
        if a.dtype != first.array.dtype:
            raise TypeError(f"flatten_parameters: expected one dtype, got {first.array.dtype} at position 0 and "
                            f"{a.dtype} at position {i}")
        if p.device != first.device:
            raise RuntimeError(f"flatten_parameters: expected one device, got {first.device} at position 0 and "
                               f"{p.device} at position {i}")
        if owner(p) is not None:
            raise ValueError(f"flatten_parameters: the parameter at position {i} is flattened already")
    if len({id(p) for p in params}) != len(params):
        raise ValueError("flatten_parameters: a parameter appears more than once")

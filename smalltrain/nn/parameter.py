"""`Parameter` (a Tensor that a Module registers as learnable) and `Buffer` (a Tensor it registers as state),
as torch.nn.Parameter and torch.nn.Buffer."""
import numpy as np

from .._dtype import get_default_dtype
from ..tensor import Tensor


def _array_of(data):
    if data is None:
        return np.empty((0,), dtype=get_default_dtype().np)
    if isinstance(data, Tensor):
        return data.array
    if isinstance(data, np.ndarray) or hasattr(data, "__cuda_array_interface__"):
        return data  # an array is shared like a Tensor's (torch only takes Tensors; arrays are a convenience)
    from ..creation import _to_array
    return _to_array(data)


class Parameter(Tensor):
    """A leaf Tensor sharing `data`'s array, requiring grad by default; assigning it to a Module attribute
    registers it, so `module.parameters()` and `state_dict()` see it."""

    __slots__ = ()

    def __init__(self, data=None, requires_grad=True):
        array = _array_of(data)
        if requires_grad and array.dtype.kind not in "fc":
            raise RuntimeError(f"Only Tensors of floating point and complex dtype can require gradients (got "
                               f"{array.dtype})")
        self._init_leaf(array, bool(requires_grad))

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        result = type(self)(self.array.copy(), self.requires_grad)
        if self.grad is not None:
            result.grad = Tensor._wrap(self.grad.array.copy())
        memo[id(self)] = result
        return result


class Buffer(Tensor):
    """A Tensor that, assigned to a Module attribute, registers as a buffer (`persistent=False`: not saved)."""

    __slots__ = ("persistent",)

    def __init__(self, data=None, *, persistent=True):
        Tensor.__init__(self)
        self.array = _array_of(data)
        self.persistent = bool(persistent)

    def __deepcopy__(self, memo):
        if id(self) not in memo:
            memo[id(self)] = type(self)(self.array.copy(), persistent=self.persistent)
        return memo[id(self)]


def is_lazy(param):
    return False

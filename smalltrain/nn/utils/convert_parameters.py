"""parameters_to_vector / vector_to_parameters, as torch.nn.utils: one flat vector for all parameters."""
from ...ops.shape import cat
from ...tensor import Tensor
from ..module import typename


def _check_same_device(params):
    device = None
    for p in params:
        if device is None:
            device = p.device
        elif p.device != device:
            raise TypeError("Found two parameters on different devices, this is currently not supported.")


def parameters_to_vector(parameters):
    """Concatenate the flattened parameters (differentiable, like torch's)."""
    params = list(parameters)
    _check_same_device(params)
    return cat([p.reshape(-1) for p in params])


def vector_to_parameters(vec, parameters):
    """Make each parameter's data a view of the matching slice of `vec`, as torch does."""
    if not isinstance(vec, Tensor):
        raise TypeError(f"expected smalltrain.Tensor, but got: {typename(vec)}")
    params = list(parameters)
    _check_same_device(params)
    flat, pointer = vec.array.reshape(-1), 0
    for p in params:
        k = p.numel()
        if pointer + k > flat.size:  # torch fails the same way (a too-long vector is accepted, as there)
            raise RuntimeError(f"vector_to_parameters: vec has {flat.size} elements, fewer than the parameters "
                               f"need ({sum(q.numel() for q in params)})")
        p.array = flat[pointer:pointer + k].reshape(p.array.shape)
        pointer += k

"""Parameter utilities, as torch.nn.utils: gradient clipping and flattening parameters to one vector; and
flatten_parameters (parameters and gradients as views into flat buffers, for the fused optimizers)."""
from .clip_grad import clip_grad_norm, clip_grad_norm_, clip_grad_value_, get_total_norm
from .convert_parameters import parameters_to_vector, vector_to_parameters
from .flat_parameters import FlatParameters, flatten_parameters

__all__ = [
           "FlatParameters",
           "clip_grad_norm",
           "clip_grad_norm_",
           "clip_grad_value_",
           "flatten_parameters",
           "get_total_norm",
           "parameters_to_vector",
           "vector_to_parameters",
]

"""Every CUDA launcher in one namespace: `from smalltrain.backend.cuda import ops; ops.conv2d_forward(...)`.

Launchers take and return cupy arrays, validate shapes, dtypes (float32/float64), devices and contiguity before
any kernel runs, and return (output, saved) from forwards and gradients from backwards. Importing this module
does not import CuPy; the first launch compiles the family's .cu file with NVRTC (once per device).
"""
from .activation import gelu_backward, gelu_forward, relu_backward, relu_forward
from .conv import Conv2dSaved, col2im, conv2d_backward, conv2d_forward, im2col
from .dropout import dropout_backward, dropout_forward, dropout_mask, dropout_state
from .index import gather, gather_backward, scatter_add
from .linear import LinearSaved, linear_act_backward, linear_act_forward
from .linear_chain import ChainSaved, linear_chain_backward, linear_chain_forward
from .loss import (CrossEntropySaved, cross_entropy_backward, cross_entropy_forward, log_softmax_backward,
                   log_softmax_forward, softmax_backward, softmax_forward)
from .norm import batch_norm_backward, batch_norm_forward
from .optim import adam_step, sgd_step
from .pool import (avg_pool2d_backward, avg_pool2d_forward, max_pool2d_backward, max_pool2d_backward_act,
                   max_pool2d_forward)

__all__ = ["conv2d_forward", "conv2d_backward", "Conv2dSaved", "im2col", "col2im",
           "max_pool2d_forward", "max_pool2d_backward", "max_pool2d_backward_act", "avg_pool2d_forward",
           "avg_pool2d_backward",
           "relu_forward", "relu_backward", "gelu_forward", "gelu_backward",
           "softmax_forward", "softmax_backward", "log_softmax_forward", "log_softmax_backward",
           "cross_entropy_forward", "cross_entropy_backward", "CrossEntropySaved",
           "batch_norm_forward", "batch_norm_backward",
           "dropout_state", "dropout_forward", "dropout_backward", "dropout_mask",
           "gather", "gather_backward", "scatter_add",
           "linear_act_forward", "linear_act_backward", "LinearSaved",
           "linear_chain_forward", "linear_chain_backward", "ChainSaved",
           "sgd_step", "adam_step"]

"""torch.nn.functional for smalltrain: the same names, signatures and semantics, each a thin call into smalltrain.ops
(where the forward and backward of every op are written out)."""
import importlib

import numpy as np

from ..ops._util import xp_of
from ..ops.activation import (
    elu,
    gelu,
    hardtanh,
    leaky_relu,
    log_softmax,
    relu,
    relu6,
    relu_,
    sigmoid,
    silu,
    softmax,
    softplus,
    tanh,
)
from ..ops.dropout import dropout
from ..ops.dropout import dropout1d, dropout2d
from ..ops.embedding import embedding
from ..ops.loss import (
    binary_cross_entropy,
    binary_cross_entropy_with_logits,
    cross_entropy,
    l1_loss,
    mse_loss,
    nll_loss,
)
from ..ops.activation import hardswish
from ..ops.loss import huber_loss, kl_div, smooth_l1_loss
from ..ops.matmul import linear
from ..ops.norm import batch_norm, layer_norm
from ..ops.pad import pad
from ..ops.shape import flatten
from ..tensor import Tensor


def _lazy(module, name):
    """A stand-in that imports smalltrain.ops.<module>.<name> on first call (for files not written yet)."""
    def call(*args, **kwargs):
        return getattr(importlib.import_module(module, __package__), name)(*args, **kwargs)
    call.__name__ = call.__qualname__ = name
    return call


# TODO(lead): drop the fallbacks once ops/conv.py and ops/pool.py are in
try:
    from ..ops.conv import conv2d
except ImportError:
    conv2d = _lazy("..ops.conv", "conv2d")
try:
    from ..ops.pool import adaptive_avg_pool2d, avg_pool2d, max_pool2d
except ImportError:
    max_pool2d = _lazy("..ops.pool", "max_pool2d")
    avg_pool2d = _lazy("..ops.pool", "avg_pool2d")
    adaptive_avg_pool2d = _lazy("..ops.pool", "adaptive_avg_pool2d")
from ..ops.pool import adaptive_max_pool2d, avg_pool1d, max_pool1d  # noqa: E402


def one_hot(tensor, num_classes=-1):
    """int64 one-hot encoding along a new last dim, with torch's checks (int64 input, 0 <= class < num_classes)."""
    a = tensor.array
    if a.dtype != np.int64:
        raise RuntimeError(f"one_hot is only applicable to index tensor of type LongTensor (got {tensor.dtype}).")
    xp = xp_of(a)
    if a.size == 0:
        if num_classes <= 0:
            raise RuntimeError("one_hot: Can not infer total number of classes from empty tensor.")
    else:
        if int(a.min()) < 0:
            raise RuntimeError(f"one_hot: Class values must be non-negative (got {int(a.min())}).")
        if num_classes == -1:
            num_classes = int(a.max()) + 1
        elif int(a.max()) >= num_classes:
            raise RuntimeError(f"one_hot: Class values must be smaller than num_classes (got {int(a.max())}, "
                               f"num_classes={num_classes}).")
    return Tensor._wrap((a[..., None] == xp.arange(num_classes)).astype(np.int64))


__all__ = ["adaptive_avg_pool2d", "avg_pool2d", "batch_norm", "binary_cross_entropy",
           "binary_cross_entropy_with_logits", "conv2d", "cross_entropy", "dropout", "elu", "flatten", "gelu",
           "hardtanh", "l1_loss", "layer_norm", "leaky_relu", "linear", "log_softmax", "max_pool2d", "mse_loss",
           "nll_loss", "one_hot", "pad", "relu", "relu6", "relu_", "sigmoid", "silu", "softmax", "softplus", "tanh"]
__all__ += ["adaptive_max_pool2d", "avg_pool1d", "dropout1d", "dropout2d", "embedding", "hardswish", "huber_loss",
            "kl_div", "max_pool1d", "smooth_l1_loss"]

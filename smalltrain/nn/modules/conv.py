"""Conv2d with torch's constructor, validation, default initialization and repr; forward is F.conv2d, after
reflect / replicate / circular padding for the padding modes other than zeros."""

import numpy as np

from ... import creation
from ...ops._util import xp_of
from ...tensor import Tensor
from .. import functional as F
from .. import init
from ..module import Module
from ..parameter import Parameter
from .utils import _pair, _reverse_repeat_tuple

_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


def _source_indices(n, lo, hi, mode):
    """For each padded position along a dim of size n, the input position it copies."""
    i = np.arange(-lo, n + hi)
    if mode == "replicate":
        return np.clip(i, 0, n - 1)
    if mode == "circular":
        if max(lo, hi) > n:
            raise RuntimeError(f"Padding value causes wrapping around more than once (pads ({lo}, {hi}) for a "
                               f"dimension of size {n})")
        return i % n
    if max(lo, hi) >= n:
        raise RuntimeError(f"Padding size should be less than the corresponding input dimension, but got: padding "
                           f"({lo}, {hi}) for a dimension of size {n}")
    return (n - 1) - np.abs((n - 1) - np.abs(i))  # reflect about the first and last element


def _mode_pad(x, pads, mode):
    """Pad H and W by gathering input rows then columns (differentiable: the gather's backward scatter-adds).
    F.pad only implements constant padding, so the other modes are built here."""
    left, right, top, bottom = pads
    h, w = x.shape[-2:]
    rows = _source_indices(h, top, bottom, mode)
    cols = _source_indices(w, left, right, mode)
    xp = xp_of(x.array)
    return x[..., Tensor._wrap(xp.asarray(rows)), :][..., Tensor._wrap(xp.asarray(cols))]


class Conv2d(Module):
    """2-D convolution over [N, C, H, W]; weight [out_channels, in_channels // groups, kH, kW]."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, padding_mode="zeros", device=None, dtype=None):
        super().__init__()
        kernel_size, stride, dilation = _pair(kernel_size), _pair(stride), _pair(dilation)
        padding = padding if isinstance(padding, str) else _pair(padding)
        if groups <= 0:
            raise ValueError("groups must be a positive integer")
        if in_channels % groups != 0:
            raise ValueError("in_channels must be divisible by groups")
        if out_channels % groups != 0:
            raise ValueError("out_channels must be divisible by groups")
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ValueError(f"Invalid padding string {padding!r}, should be one of {{'same', 'valid'}}")
            if padding == "same" and any(s != 1 for s in stride):
                raise ValueError("padding='same' is not supported for strided convolutions")
        if padding_mode not in _PADDING_MODES:
            raise ValueError("padding_mode must be one of {'zeros', 'reflect', 'replicate', 'circular'}, but got "
                             f"padding_mode='{padding_mode}'")
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, kernel_size
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        self.transposed, self.output_padding = False, (0, 0)
        self.padding_mode = padding_mode
        self._reversed_padding_repeated_twice = self._pad_amounts()
        self.weight = Parameter(creation.empty((out_channels, in_channels // groups, *kernel_size), device=device,
                                               dtype=dtype))
        if bias:
            self.bias = Parameter(creation.empty(out_channels, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def _pad_amounts(self):
        """F.pad's (left, right, top, bottom) for the padding modes other than zeros."""
        if not isinstance(self.padding, str):
            return list(_reverse_repeat_tuple(self.padding, 2))
        amounts = [0, 0] * 2
        if self.padding == "same":
            for d, k, i in zip(self.dilation, self.kernel_size, (1, 0)):
                total = d * (k - 1)
                amounts[2 * i], amounts[2 * i + 1] = total // 2, total - total // 2
        return amounts

    def reset_parameters(self):
        init.default_weight_and_bias_(self.weight, self.bias)

    def _conv_forward(self, input, weight, bias):
        if self.padding_mode != "zeros":
            return F.conv2d(_mode_pad(input, self._reversed_padding_repeated_twice, self.padding_mode), weight,
                            bias, self.stride, _pair(0), self.dilation, self.groups)
        return F.conv2d(input, weight, bias, self.stride, self.padding, self.dilation, self.groups)

    def forward(self, input):
        return self._conv_forward(input, self.weight, self.bias)

    def extra_repr(self):
        s = "{in_channels}, {out_channels}, kernel_size={kernel_size}, stride={stride}"
        if self.padding != (0,) * len(self.padding):
            s += ", padding={padding}"
        if self.dilation != (1,) * len(self.dilation):
            s += ", dilation={dilation}"
        if self.groups != 1:
            s += ", groups={groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += ", padding_mode={padding_mode}"
        return s.format(**self.__dict__)

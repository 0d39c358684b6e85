"""Identity and Linear (y = x W^T + b), with torch's default initialization."""

from ... import creation
from .. import functional as F
from .. import init
from ..module import Module
from ..parameter import Parameter


class Identity(Module):
    """Returns its input; constructor arguments are accepted and ignored, as torch's."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, input):
        return input


class Linear(Module):
    """y = x W^T + b with W [out_features, in_features]; W ~ kaiming_uniform(a=sqrt(5)) (i.e. U(-1/sqrt(in),
    1/sqrt(in))) and b ~ U(-1/sqrt(in), 1/sqrt(in)), as torch initializes them."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = Parameter(creation.empty((out_features, in_features), device=device, dtype=dtype))
        if bias:
            self.bias = Parameter(creation.empty(out_features, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        init.default_weight_and_bias_(self.weight, self.bias)

    def forward(self, input):
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"

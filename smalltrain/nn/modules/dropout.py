"""Dropout layers: Dropout zeroes elements with probability p in training (scaling the rest by 1/(1-p)); Dropout1d
and Dropout2d zero whole channels; all are the identity in eval."""
from .. import functional as F
from ..module import Module


class _DropoutNd(Module):
    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        if p < 0 or p > 1:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p
        self.inplace = inplace

    def extra_repr(self):
        return f"p={self.p}, inplace={self.inplace}"


class Dropout(_DropoutNd):
    def forward(self, input):
        return F.dropout(input, self.p, self.training, self.inplace)


class Dropout1d(_DropoutNd):
    """Channels of [N, C, L] or [C, L]."""

    def forward(self, input):
        return F.dropout1d(input, self.p, self.training, self.inplace)


class Dropout2d(_DropoutNd):
    """Channels of [N, C, H, W] (a 3-D input is read as [N, C, L], with torch's warning)."""

    def forward(self, input):
        return F.dropout2d(input, self.p, self.training, self.inplace)

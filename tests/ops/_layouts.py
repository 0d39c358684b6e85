"""Memory layouts the conv and pooling tables feed in: the same values, stored differently."""


def as_is(x):
    return x


def transposed(x):
    """Same values, non-contiguous memory (H and W strides swapped)."""
    return x.transpose(-1, -2).contiguous().transpose(-1, -2)


def batch_inner(x):
    """Same values stored as [C, H, W, N]: the layout conv2d itself returns."""
    return x.permute(1, 2, 3, 0).contiguous().permute(3, 0, 1, 2)

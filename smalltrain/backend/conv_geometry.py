"""The convolution's argument rules shared by every device: ints or tuples of ints (torch's errors) and the padding
rule ('same', 'valid', ints) resolved to (top, bottom, left, right). ops/conv.py validates with these, and the CUDA
backend resolves padding with the same rule (backend/cuda/conv/plan.py)."""
import operator


def conv_ints(name, value, n=2):
    """An int or a sequence of n ints -> tuple of n ints; TypeError / RuntimeError like torch otherwise."""
    vals = value if isinstance(value, (tuple, list)) else (value,)
    try:
        vals = tuple(operator.index(v) for v in vals)
    except TypeError:
        raise TypeError(f"conv2d: {name} must be an int or a tuple of {n} ints, got {value!r}") from None
    if len(vals) == 1:
        return vals * n
    if len(vals) != n:
        raise RuntimeError(f"conv2d: expected {name} to be a single integer value or a list of {n} values to match "
                           f"the convolution dimensions, but got {name}={list(vals)}")
    return vals


def conv_padding(padding, stride, dilation, kernel):
    """(top, bottom, left, right); 'same' pads like torch: total d*(k-1), the odd extra row/column at the end."""
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0, 0, 0)
        if padding != "same":
            raise RuntimeError(f"conv2d: Invalid padding string: {padding!r} (expected 'same' or 'valid')")
        if stride != (1, 1):
            raise RuntimeError(f"conv2d: padding='same' is not supported for strided convolutions, got "
                               f"stride={list(stride)}")
        out = []
        for d, k in zip(dilation, kernel):
            total = d * (k - 1)
            out += [total // 2, total - total // 2]
        return tuple(out)
    ph, pw = conv_ints("padding", padding)
    if ph < 0 or pw < 0:
        raise RuntimeError(f"conv2d: negative padding is not supported, got padding={[ph, pw]}")
    return (ph, ph, pw, pw)

"""Constant padding as torch.nn.functional.pad: pads are listed from the last dim backward, (left, right) per dim;
negative pads crop. The backward pass slices the gradient of the kept region back out.
"""
from ..autograd.function import Function
from ._util import xp_of
from .activation import expect_tensor

_OTHER_MODES = ("reflect", "replicate", "circular")


def _plan(shape, pad):
    """(output shape, input slices kept, where they land in the output), after torch's checks."""
    if not isinstance(pad, (tuple, list)):
        raise TypeError(f"pad(): argument 'pad' must be tuple of ints, not {type(pad).__name__}")
    for i, p in enumerate(pad):
        if not isinstance(p, int) or isinstance(p, bool):
            raise TypeError(f"pad(): argument 'pad' must be tuple of ints, but found element of type "
                            f"{type(p).__name__} at pos {i}")
    if len(pad) % 2:
        raise RuntimeError(f"pad: Padding length must be divisible by 2, got {len(pad)} ({tuple(pad)})")
    if len(pad) > 2 * len(shape):
        raise RuntimeError(f"pad: Padding length should be less than or equal to two times the input dimension "
                           f"but got padding length {len(pad)} and input of dimension {len(shape)}")
    out, src, dst = list(shape), [slice(None)] * len(shape), [slice(None)] * len(shape)
    for i in range(len(pad) // 2):
        d, lo, hi = len(shape) - 1 - i, pad[2 * i], pad[2 * i + 1]
        kept = shape[d] + min(lo, 0) + min(hi, 0)
        if kept < 0:
            raise RuntimeError(f"pad: the pads ({lo}, {hi}) crop more than dimension {d} holds (size {shape[d]}); "
                               "narrow(): length must be non-negative.")
        out[d] = kept + max(lo, 0) + max(hi, 0)
        src[d] = slice(max(-lo, 0), max(-lo, 0) + kept)
        dst[d] = slice(max(lo, 0), max(lo, 0) + kept)
    return tuple(out), tuple(src), tuple(dst)


class ConstantPad(Function):
    @staticmethod
    def forward(ctx, x, pad, value):
        a = x.array
        shape, src, dst = _plan(a.shape, pad)
        out = xp_of(a).full(shape, value, dtype=a.dtype)
        out[dst] = a[src]
        ctx.in_shape, ctx.src, ctx.dst = a.shape, src, dst
        return out

    @staticmethod
    def backward(ctx, dout):
        g = dout.array
        xp = xp_of(g)
        kept = g[ctx.dst]
        if kept.shape == ctx.in_shape:
            return xp.ascontiguousarray(kept), None, None
        dx = xp.zeros(ctx.in_shape, g.dtype)   # cropped parts of the input get no gradient
        dx[ctx.src] = kept
        return dx, None, None


def pad(input, pad, mode="constant", value=None):
    expect_tensor("pad", input)
    if mode != "constant":
        if mode in _OTHER_MODES:
            raise NotImplementedError(f"pad: mode '{mode}' is not implemented yet; only 'constant' is supported")
        raise NotImplementedError(f"Unrecognised padding mode {mode}")
    return ConstantPad.apply(input, pad, 0 if value is None else value)

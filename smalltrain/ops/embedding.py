"""embedding: rows of a weight matrix looked up by integer indices (torch.nn.functional.embedding), with torch's
padding_idx (that row gets no gradient), max_norm (rows renormalized in place before the lookup) and
scale_grad_by_freq. The backward scatter-adds the upstream rows into a dense weight gradient (xp.add.at: NumPy and
CuPy alike); sparse gradients are not supported.
"""
import numpy as np

from ..autograd.function import Function
from ..backend.cuda import device_checks
from ..tensor import Tensor
from ._util import check_same_device, check_values, xp_of
from .activation import expect_tensor


class Embedding(Function):
    """out[..., :] = weight[index[...], :]; dweight[i] = sum of dout rows whose index is i (over its count with
    scale_grad_by_freq), 0 for padding_idx."""

    @staticmethod
    def forward(ctx, weight, index, padding_idx, scale_grad_by_freq):
        w, idx = weight.array, index.array
        if ctx.needs_input_grad[0]:
            ctx.idx, ctx.shape = idx, w.shape
            ctx.padding_idx, ctx.scale = padding_idx, scale_grad_by_freq
        return w[idx]

    @staticmethod
    def backward(ctx, dout):
        g = dout.array
        xp = xp_of(g)
        flat = ctx.idx.reshape(-1)
        rows = g.reshape(flat.size, ctx.shape[1])
        if ctx.scale:   # each row's gradient over the number of times its index occurs in this batch
            counts = xp.bincount(flat, minlength=ctx.shape[0])
            rows = rows / counts[flat][:, None].astype(g.dtype)
        dw = xp.zeros(ctx.shape, g.dtype)
        xp.add.at(dw, flat, rows)   # repeated indices sum their gradients
        if ctx.padding_idx is not None:
            dw[ctx.padding_idx] = 0
        return dw, None, None, None


def _renorm_(w, idx, max_norm, norm_type):
    """torch's embedding_renorm_: each referenced row whose norm exceeds max_norm is scaled to max_norm / (norm +
    1e-7) of itself, in place and outside autograd."""
    xp = xp_of(w)
    rows = xp.unique(idx.reshape(-1))
    sel = w[rows]
    if norm_type == float("inf"):
        norms = xp.abs(sel).max(axis=1)
    else:
        norms = (xp.abs(sel) ** norm_type).sum(axis=1) ** (1.0 / norm_type)
    over = norms > max_norm
    scale = xp.where(over, max_norm / (norms + 1e-7), 1).astype(w.dtype, copy=False)
    w[rows] = sel * scale[:, None]


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
              sparse=False):
    """torch.nn.functional.embedding: weight [num_embeddings, embedding_dim], input an int64/int32 index tensor of
    any shape; the result is input.shape + [embedding_dim]."""
    expect_tensor("embedding", input)
    expect_tensor("embedding", weight, "weight", 2)
    check_same_device("embedding", input, weight)
    w, idx = weight.array, input.array
    n = w.shape[0] if w.ndim else 0
    if padding_idx is not None:
        if padding_idx > 0 and padding_idx >= n:
            raise AssertionError(f"Padding_idx must be within num_embeddings (padding_idx={padding_idx}, "
                                 f"num_embeddings={n})")
        if padding_idx < 0:
            if padding_idx < -n:
                raise AssertionError(f"Padding_idx must be within num_embeddings (padding_idx={padding_idx}, "
                                     f"num_embeddings={n})")
            padding_idx += n
    if sparse:
        raise NotImplementedError("embedding: sparse=True (sparse gradients) is not supported; use sparse=False")
    if idx.dtype not in (np.int64, np.int32):
        raise RuntimeError(f"embedding: Expected tensor for argument #1 'indices' to have one of the following "
                           f"scalar types: Long, Int; but got {input.dtype} instead (input shape {list(idx.shape)})")
    if w.ndim != 2:
        raise RuntimeError(f"embedding: 'weight' must be 2-D, got weight of shape {list(w.shape)}")
    check_values((idx < 0) | (idx >= n), lambda: _out_of_range(idx, n))
    if xp_of(idx) is not np and idx.size:   # the error comes at the next sync: until then, read inside the table
        input = Tensor._wrap(xp_of(idx).clip(idx, 0, n - 1))
    if max_norm is not None and idx.size:
        _renorm_(w, idx, float(max_norm), float(norm_type))
    return Embedding.apply(weight, input, padding_idx, bool(scale_grad_by_freq))


def _out_of_range(idx, n):
    """The IndexError for the first index outside [0, n) (idx read at the check)."""
    bad = device_checks.first_outside(idx, 0, n)
    got = "an index" if bad is None else f"index {bad}"
    return IndexError(f"embedding: index out of range in self ({got}, num_embeddings {n})")

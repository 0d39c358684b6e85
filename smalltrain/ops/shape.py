"""Shape ops: reshape/view, permute/transpose, squeeze/unsqueeze, expand, repeat, cat/stack, split/chunk, flip."""
import numpy as np

from .._dtype import result_type
from ..autograd import pending
from ..autograd.function import Function
from ..tensor import Tensor
from ._util import check_same_device, normalize_dim, xp_of
from .inplace import link_view


def _shape_arg(shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return tuple(int(s) for s in shape)


def infer_shape(op, shape, numel, old_shape):
    """Resolve one -1 like torch; RuntimeError naming both shapes when the sizes disagree."""
    shape = list(shape)
    known, infer = 1, 0
    for s in shape:
        if s == -1:
            infer += 1
        elif s < 0:
            raise RuntimeError(f"{op}: invalid shape dimension {s} in {shape}")
        else:
            known *= s
    if infer > 1:
        raise RuntimeError(f"{op}: only one dimension can be inferred")
    if infer:
        if known == 0 and numel == 0:
            raise RuntimeError(f"{op}: cannot reshape tensor of 0 elements into shape {shape} because the "
                               "unspecified dimension size -1 can be any value and is ambiguous")
        if known == 0 or numel % known:
            raise RuntimeError(f"{op}: shape '{shape}' is invalid for input of size {numel}")
        shape[shape.index(-1)] = numel // known
    elif known != numel:
        raise RuntimeError(f"{op}: shape '{list(shape)}' is invalid for input of size {numel} "
                           f"(input shape {list(old_shape)})")
    return tuple(shape)


class Reshape(Function):
    @classmethod
    def apply(cls, x, shape):
        out = super().apply(x, shape)
        new_shape = out.array.shape
        return link_view(out, x, lambda a: a.reshape(new_shape))

    @staticmethod
    def forward(ctx, x, shape):
        a = x.array
        ctx.shape = a.shape
        return a.reshape(infer_shape("view", shape, a.size, a.shape))

    @staticmethod
    def backward(ctx, dout):
        return dout.array.reshape(ctx.shape), None


class Permute(Function):
    @classmethod
    def apply(cls, x, dims):
        out = super().apply(x, dims)
        return link_view(out, x, lambda a: a.transpose([d % a.ndim for d in dims]))

    @staticmethod
    def forward(ctx, x, dims):
        a = x.array
        if len(dims) != a.ndim:
            raise RuntimeError(f"permute(sparse_coo): number of dimensions in the tensor input does not match "
                               f"the length of the desired ordering of dimensions i.e. input.dim() = {a.ndim} "
                               f"is not equal to len(dims) = {len(dims)}")
        dims = tuple(normalize_dim("permute", d, a.ndim) for d in dims)
        if len(set(dims)) != len(dims):
            raise RuntimeError(f"permute(): duplicate dims are not allowed, got {list(dims)}")
        ctx.inv = tuple(np.argsort(dims))
        return a.transpose(dims)

    @staticmethod
    def backward(ctx, dout):
        return dout.array.transpose(ctx.inv), None


class Expand(Function):
    @staticmethod
    def forward(ctx, x, shape):
        a = x.array
        if len(shape) < a.ndim:
            raise RuntimeError(f"expand: the number of sizes provided ({len(shape)}) must be greater or equal to "
                               f"the number of dimensions in the tensor ({a.ndim})")
        lead = len(shape) - a.ndim
        for i in range(lead):
            if shape[i] < 0:
                raise RuntimeError(f"expand: The expanded size of the tensor ({shape[i]}) isn't allowed in a leading, "
                                   f"non-existing dimension {i}")
        full = [a.shape[i - lead] if s == -1 and i >= lead else s for i, s in enumerate(shape)]
        for i in range(a.ndim):
            if a.shape[i] != 1 and a.shape[i] != full[i + lead]:
                raise RuntimeError(f"expand: the expanded size of the tensor ({full[i + lead]}) must match the "
                                   f"existing size ({a.shape[i]}) at non-singleton dimension {i + lead}.  "
                                   f"Target sizes: {list(shape)}.  Tensor sizes: {list(a.shape)}")
        return xp_of(a).broadcast_to(a, tuple(full))

    @staticmethod
    def backward(ctx, dout):
        return dout.array, None  # the engine sums back to the input's shape


class Repeat(Function):
    @staticmethod
    def forward(ctx, x, repeats):
        a = x.array
        if len(repeats) < a.ndim:
            raise RuntimeError("repeat: Number of dimensions of repeat dims can not be smaller than number of "
                               f"dimensions of tensor (got {len(repeats)} for a tensor of {a.ndim} dims)")
        a_ = a.reshape((1,) * (len(repeats) - a.ndim) + a.shape)
        ctx.shape, ctx.expanded, ctx.repeats = a.shape, a_.shape, repeats
        return xp_of(a).tile(a_, repeats)

    @staticmethod
    def backward(ctx, dout):
        g = dout.array
        split = []
        for r, n in zip(ctx.repeats, ctx.expanded):
            split += [r, n]
        g = g.reshape(split).sum(axis=tuple(range(0, len(split), 2)))
        return g.reshape(ctx.shape), None


class Cat(Function):
    @staticmethod
    def forward(ctx, dim, *tensors):
        check_same_device("cat", *tensors)
        arrays = [t.array for t in tensors]
        # torch still accepts legacy 1-D empty tensors next to tensors of any rank
        ref = next((a for a in arrays if not (a.ndim == 1 and a.shape[0] == 0)), arrays[0])
        if ref.ndim == 0:
            raise RuntimeError("cat: zero-dimensional tensor cannot be concatenated")
        d = normalize_dim("cat", dim, ref.ndim)
        arrays = [a for a in arrays if not (a.ndim == 1 and a.shape[0] == 0 and ref.ndim > 1)]
        for i, a in enumerate(arrays):
            if a.ndim != ref.ndim or any(a.shape[k] != ref.shape[k] for k in range(ref.ndim) if k != d):
                raise RuntimeError(f"cat: sizes of tensors must match except in dimension {d}; expected "
                                   f"{list(ref.shape)} (any size at dim {d}), got {list(a.shape)} for tensor {i}")
        ctx.d = d
        ctx.sizes = [t.array.shape[d] if t.array.ndim == ref.ndim else 0 for t in tensors]
        ctx.shapes = [t.array.shape for t in tensors]
        dt = arrays[0].dtype
        if any(a.dtype != dt for a in arrays):
            dt = result_type(*tensors)   # torch promotes (int64 with float32 -> float32; NumPy says float64)
            arrays = [a.astype(dt, copy=False) for a in arrays]
        return xp_of(ref).concatenate(arrays, axis=d)

    @staticmethod
    def backward(ctx, dout):
        g = dout.array
        out, start = [None], 0
        for size, shape in zip(ctx.sizes, ctx.shapes):
            if len(shape) != g.ndim:
                out.append(xp_of(g).zeros(shape, g.dtype))
                continue
            sl = [slice(None)] * g.ndim
            sl[ctx.d] = slice(start, start + size)
            out.append(g[tuple(sl)])
            start += size
        return tuple(out)


def view(x, *shape):
    return Reshape.apply(x, _shape_arg(shape))


reshape = view


def flatten(x, start_dim=0, end_dim=-1):
    if type(x) is pending.PendingTensor and start_dim == 1 and end_dim == -1:   # a linear layer after it may fuse
        out = pending.absorb(x, "flatten")                                     # with the op before (ops/fusion.py)
        if out is not None:
            return out
    shape = x.array.shape
    if not shape:
        return Reshape.apply(x, (1,))
    s = normalize_dim("flatten", start_dim, len(shape))
    e = normalize_dim("flatten", end_dim, len(shape))
    if s > e:
        raise RuntimeError("flatten() has invalid args: start_dim cannot come after end_dim")
    merged = 1
    for n in shape[s:e + 1]:
        merged *= n
    return Reshape.apply(x, shape[:s] + (merged,) + shape[e + 1:])   # an empty batch stays (0, N), as torch's


def unflatten(x, dim, sizes):
    shape = x.array.shape
    d = normalize_dim("unflatten", dim, len(shape))
    sizes = tuple(infer_shape("unflatten", sizes, shape[d], (shape[d],)))
    return Reshape.apply(x, shape[:d] + sizes + shape[d + 1:])


def permute(x, *dims):
    return Permute.apply(x, _shape_arg(dims))


def transpose(x, dim0, dim1):
    n = x.array.ndim
    if n < 2 and dim0 in (0, -1) and dim1 in (0, -1):
        return x
    dims = list(range(n))
    d0, d1 = normalize_dim("transpose", dim0, n), normalize_dim("transpose", dim1, n)
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return Permute.apply(x, tuple(dims))


def t(x):
    if x.array.ndim > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {x.array.ndim}D")
    return transpose(x, 0, 1) if x.array.ndim == 2 else x


def squeeze(x, dim=None):
    shape = x.array.shape
    if dim is None:
        new = tuple(n for n in shape if n != 1)
    else:
        dims = dim if isinstance(dim, (tuple, list)) else (dim,)
        dims = {normalize_dim("squeeze", d, len(shape)) for d in dims} if shape else set()
        new = tuple(n for i, n in enumerate(shape) if not (i in dims and n == 1))
    return x if new == shape else Reshape.apply(x, new)


def unsqueeze(x, dim):
    shape = x.array.shape
    d = normalize_dim("unsqueeze", dim, len(shape) + 1)
    return Reshape.apply(x, shape[:d] + (1,) + shape[d:])


def expand(x, *shape):
    return Expand.apply(x, _shape_arg(shape))


def expand_as(x, other):
    return Expand.apply(x, other.array.shape)


def repeat(x, *repeats):
    return Repeat.apply(x, _shape_arg(repeats))


def cat(tensors, dim=0):
    tensors = list(tensors)
    if not tensors:
        raise ValueError("cat(): expected a non-empty list of Tensors")
    return Cat.apply(dim, *tensors)


concat = concatenate = cat


def stack(tensors, dim=0):
    tensors = list(tensors)
    if not tensors:
        raise RuntimeError("stack expects a non-empty TensorList")
    shape = tensors[0].array.shape
    for i, t_ in enumerate(tensors):
        if t_.array.shape != shape:
            raise RuntimeError(f"stack expects each tensor to be equal size, but got {list(shape)} at entry 0 "
                               f"and {list(t_.array.shape)} at entry {i}")
    d = normalize_dim("stack", dim, len(shape) + 1)
    return cat([unsqueeze(t_, d) for t_ in tensors], d)


def split(x, split_size_or_sections, dim=0):
    from .index import getitem
    n = x.array.shape[normalize_dim("split", dim, x.array.ndim)]
    d = normalize_dim("split", dim, x.array.ndim)
    if isinstance(split_size_or_sections, int):
        if split_size_or_sections <= 0 and n:
            raise RuntimeError(f"split: split_size must be positive, got {split_size_or_sections}")
        step = split_size_or_sections
        sizes = [min(step, n - i) for i in range(0, n, step)] if n else [0]
    else:
        sizes = list(split_size_or_sections)
        if sum(sizes) != n:
            raise RuntimeError(f"split_with_sizes expects split_sizes to sum exactly to {n} (input tensor's size "
                               f"at dimension {d}), but got split_sizes={sizes}")
    out, start = [], 0
    for s in sizes:
        key = (slice(None),) * d + (slice(start, start + s),)
        out.append(getitem(x, key))
        start += s
    return tuple(out)


def chunk(x, chunks, dim=0):
    if chunks <= 0:
        raise RuntimeError(f"chunk expects `chunks` to be greater than 0, got: {chunks}")
    n = x.array.shape[normalize_dim("chunk", dim, x.array.ndim)]
    return split(x, max(-(-n // chunks), 1), dim)


def unbind(x, dim=0):
    from .index import getitem
    d = normalize_dim("unbind", dim, x.array.ndim)
    return tuple(getitem(x, (slice(None),) * d + (i,)) for i in range(x.array.shape[d]))


def flip(x, dims):
    dims = dims if isinstance(dims, (tuple, list)) else (dims,)
    return Flip.apply(x, tuple(sorted({normalize_dim("flip", d, x.array.ndim) for d in dims})))


class Flip(Function):
    @staticmethod
    def forward(ctx, x, dims):
        ctx.dims = dims
        return xp_of(x.array).flip(x.array, dims) if dims else x.array

    @staticmethod
    def backward(ctx, dout):
        return (xp_of(dout.array).flip(dout.array, ctx.dims) if ctx.dims else dout.array), None


def contiguous(x):
    a = x.array
    if a.flags.c_contiguous:
        return x
    return Contiguous.apply(x)


class Contiguous(Function):
    @staticmethod
    def forward(ctx, x):
        return xp_of(x.array).ascontiguousarray(x.array)

    @staticmethod
    def backward(ctx, dout):
        return dout.array


_ = Tensor

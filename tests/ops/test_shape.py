"""Golden tests for smalltrain.ops.shape against torch: reshape/view/flatten/unflatten, permute/transpose/t, squeeze,
unsqueeze, expand, repeat, cat/stack, split/chunk/unbind, flip; error rows and float64 gradchecks."""
import numpy as np
import pytest
import torch

import smalltrain as st
from smalltrain.testing import golden, golden_error, gradcheck


def both(fn, *inputs, device="cpu", **kw):
    return golden(lambda *a: fn(st, *a), lambda *a: fn(torch, *a), *inputs, device=device, **kw)


# name: (fn(lib, x), input shape)
UNARY = {
    "reshape": (lambda L, x: x.reshape(2, 6), (3, 4)), "reshape_tuple": (lambda L, x: x.reshape((4, -1, 1)), (3, 4)),
    "reshape_flat": (lambda L, x: L.reshape(x, (-1,)), (3, 4)), "view": (lambda L, x: x.view(6, 4), (2, 3, 4)),
    "view_scalar": (lambda L, x: x.view(1, 1), ()), "view_to_scalar": (lambda L, x: x.view(()), (1,)),
    "view_as": (lambda L, x: x.view_as(L.zeros(4, 3)), (3, 4)), "reshape_empty": (lambda L, x: x.reshape(3, 0, 2),
                                                                                    (0, 6)),
    "flatten": (lambda L, x: x.flatten(), (2, 3, 4)), "flatten_1": (lambda L, x: x.flatten(1), (2, 3, 4)),
    "flatten_0_1": (lambda L, x: L.flatten(x, 0, 1), (2, 3, 4)), "flatten_scalar": (lambda L, x: x.flatten(), ()),
    "flatten_neg": (lambda L, x: x.flatten(-2, -1), (2, 3, 4)),
    "unflatten": (lambda L, x: x.unflatten(1, (2, 2)), (3, 4)),
    "unflatten_infer": (lambda L, x: L.unflatten(x, -1, (-1, 2)), (3, 4)),
    "permute": (lambda L, x: x.permute(2, 0, 1), (2, 3, 4)), "permute_tuple": (lambda L, x: x.permute((-1, 0, 1)),
                                                                               (2, 3, 4)),
    "transpose": (lambda L, x: x.transpose(0, 2), (2, 3, 4)), "transpose_neg": (lambda L, x: L.transpose(x, -1, -2),
                                                                                (2, 3, 4)),
    "transpose_1d": (lambda L, x: x.transpose(0, -1), (3,)), "t": (lambda L, x: x.t(), (3, 4)),
    "t_1d": (lambda L, x: L.t(x), (3,)), "T": (lambda L, x: x.T, (3, 4)), "mT": (lambda L, x: x.mT, (2, 3, 4)),
    "swapaxes": (lambda L, x: x.swapaxes(0, 1), (2, 3, 4)),
    "squeeze": (lambda L, x: x.squeeze(), (1, 3, 1, 4)), "squeeze_dim": (lambda L, x: x.squeeze(2), (1, 3, 1, 4)),
    "squeeze_tuple": (lambda L, x: L.squeeze(x, (0, 2)), (1, 3, 1, 4)),
    "squeeze_noop": (lambda L, x: x.squeeze(1), (1, 3, 1, 4)),
    "squeeze_neg": (lambda L, x: x.squeeze(-2), (1, 3, 1, 4)),
    "unsqueeze0": (lambda L, x: x.unsqueeze(0), (3, 4)), "unsqueeze_neg": (lambda L, x: L.unsqueeze(x, -1), (3, 4)),
    "unsqueeze_mid": (lambda L, x: x.unsqueeze(1), (3, 4)), "unsqueeze_scalar": (lambda L, x: x.unsqueeze(0), ()),
    "expand": (lambda L, x: x.expand(3, 4), (3, 1)), "expand_new_dims": (lambda L, x: x.expand(2, 3, 4), (3, 1)),
    "expand_keep": (lambda L, x: x.expand(-1, 4), (3, 1)), "expand_tuple": (lambda L, x: x.expand((2, 2, 3)), (3,)),
    "expand_as": (lambda L, x: x.expand_as(L.zeros(2, 3, 4)), (1, 4)),
    "repeat": (lambda L, x: x.repeat(2, 1), (2, 3)), "repeat_new_dims": (lambda L, x: x.repeat(1, 2, 2), (2, 3)),
    "repeat_tuple": (lambda L, x: x.repeat((3, 2)), (2, 1)), "repeat_zero": (lambda L, x: x.repeat(0, 2), (2, 3)),
    "flip": (lambda L, x: x.flip(0), (3, 4)), "flip_dims": (lambda L, x: L.flip(x, (0, -1)), (2, 3, 4)),
    "contiguous": (lambda L, x: x.t().contiguous(), (3, 4)),
    "split": (lambda L, x: x.split(2), (5, 3)), "split_dim": (lambda L, x: L.split(x, 2, dim=1), (3, 5)),
    "split_sizes": (lambda L, x: x.split([1, 3, 1]), (5, 3)), "split_big": (lambda L, x: x.split(7), (5, 3)),
    "chunk": (lambda L, x: x.chunk(3), (5, 3)), "chunk_dim": (lambda L, x: L.chunk(x, 2, dim=-1), (3, 5)),
    "chunk_more_than_size": (lambda L, x: x.chunk(8), (5, 3)), "chunk_even": (lambda L, x: x.chunk(4), (6, 2)),
    "unbind": (lambda L, x: x.unbind(1), (2, 3)), "unbind_fn": (lambda L, x: L.unbind(x), (2, 3)),
    "iter": (lambda L, x: list(x), (3, 2)),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_shape_ops(name, device, rng):
    fn, shape = UNARY[name]
    both(fn, rng.uniform(-1, 1, shape).astype(np.float32), device=device)


# name: (fn(lib, *xs), input shapes)
MULTI = {
    "cat0": (lambda L, a, b: L.cat([a, b]), [(2, 3), (4, 3)]),
    "cat1": (lambda L, a, b, c: L.cat((a, b, c), dim=1), [(2, 1), (2, 3), (2, 2)]),
    "cat_neg": (lambda L, a, b: L.cat([a, b], -1), [(2, 3, 1), (2, 3, 2)]),
    "cat_empty": (lambda L, a, b: L.cat([a, b]), [(0, 3), (2, 3)]),
    "cat_legacy_empty": (lambda L, a, b: L.cat([a, b]), [(0,), (2, 3)]),
    "cat_legacy_empty_last": (lambda L, a, b: L.cat([a, b], 1), [(2, 3), (0,)]),
    "concat": (lambda L, a, b: L.concat([a, b], 1), [(2, 3), (2, 3)]),
    "stack0": (lambda L, a, b: L.stack([a, b]), [(2, 3), (2, 3)]),
    "stack1": (lambda L, a, b, c: L.stack((a, b, c), 1), [(2, 3)] * 3),
    "stack_neg": (lambda L, a, b: L.stack([a, b], dim=-1), [(2, 3), (2, 3)]),
    "stack_scalars": (lambda L, a, b: L.stack([a, b]), [(), ()]),
}


@pytest.mark.parametrize("name", sorted(MULTI))
def test_cat_stack(name, device, rng):
    fn, shapes = MULTI[name]
    both(fn, *[rng.uniform(-1, 1, s).astype(np.float32) for s in shapes], device=device)


def test_cat_promotes_dtypes(device):
    both(lambda L, a, b: L.cat([a, b]), np.array([1, 2]), np.array([0.5], np.float32), device=device, grad=False)
    both(lambda L, a, b: L.cat([a, b]), np.array([True]), np.array([3], np.int32), device=device, grad=False)


def test_views_share_memory_like_torch(device):
    x = st.zeros(2, 3, device=device)
    x.view(6)[0] = 1.0
    x.t()[2, 1] = 2.0
    x[1].fill_(3.0) if False else None
    assert x.tolist() == [[1.0, 0.0, 0.0], [0.0, 0.0, 2.0]]
    assert not x.t().is_contiguous() and x.t().contiguous().is_contiguous()


def test_view_of_noncontiguous_copies():
    """torch raises for view() on a non-contiguous tensor; smalltrain's view copies instead (a deliberate
    leniency: conv/pool outputs may be non-contiguous here where torch's are contiguous)."""
    x = st.arange(6.0).reshape(2, 3)
    assert x.t().view(6).tolist() == [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]


ERRORS = [  # (fn(lib, x), input shape, message regex)
    (lambda L, x: x.view(5), (2, 3), r"invalid for input of size 6"),
    (lambda L, x: x.reshape(-1, -1), (2, 3), r"only one dimension can be inferred"),
    (lambda L, x: x.view(4, -1), (2, 3), r"invalid for input of size 6"),
    (lambda L, x: x.reshape(3, 0, -1), (0, 6), r"ambiguous"),
    (lambda L, x: x.permute(1, 0), (2, 3, 4), r"number of dimensions"),
    (lambda L, x: x.permute(0, 0, 1), (2, 3, 4), r"duplicate dims"),
    (lambda L, x: x.permute(0, 1, 3), (2, 3, 4), r"out of range"),
    (lambda L, x: x.transpose(0, 3), (2, 3, 4), r"out of range"),
    (lambda L, x: x.squeeze(3), (2, 3, 4), r"out of range"),
    (lambda L, x: x.unsqueeze(3), (2, 3), r"out of range"),
    (lambda L, x: x.unsqueeze(-4), (2, 3), r"out of range"),
    (lambda L, x: x.expand(3, 4), (2, 1), r"must match the existing size"),
    (lambda L, x: x.expand(4), (2, 1), r"number of sizes provided"),
    (lambda L, x: x.expand(-1, 2, 1), (2, 1), r"isn't allowed in a leading, non-existing dimension"),
    (lambda L, x: x.repeat(2), (2, 3), r"can not be smaller"),
    (lambda L, x: L.cat([x, x.t()]), (2, 3), r"must match"),
    (lambda L, x: L.cat([x, x.flatten()]), (2, 3), r"must match"),
    (lambda L, x: L.cat([x, x], 2), (2, 3), r"out of range"),
    (lambda L, x: L.cat([]), (2, 3), r"non-empty"),
    (lambda L, x: L.cat([x.sum(), x.sum()]), (2, 3), r"zero-dimensional"),
    (lambda L, x: L.stack([x, x.t()]), (2, 3), r"equal size"),
    (lambda L, x: L.stack([x, x], 3), (2, 3), r"out of range"),
    (lambda L, x: x.split([1, 1]), (3, 2), r"sum exactly to 3"),
    (lambda L, x: x.chunk(0), (3, 2), r"greater than 0"),
    (lambda L, x: x.split(2, dim=2), (3, 2), r"out of range"),
    (lambda L, x: x.t(), (2, 3, 4), r"<= 2 dimensions"),
    (lambda L, x: x.flatten(2, 1), (2, 3, 4), r"start_dim cannot come after end_dim"),
    (lambda L, x: x.flatten(0, 3), (2, 3, 4), r"out of range"),
    (lambda L, x: x.unflatten(1, (2, 2)), (2, 3), r"invalid for input of size 3|sizes"),
    (lambda L, x: x.flip(2), (2, 3), r"out of range"),
]


@pytest.mark.parametrize("fn,shape,match", ERRORS, ids=[f"{i}-{e[2]}" for i, e in enumerate(ERRORS)])
def test_errors(fn, shape, match, device):
    golden_error(lambda *a: fn(st, *a), lambda *a: fn(torch, *a), np.ones(shape, np.float32), match=match,
                 device=device)


GRADCHECK = {
    "reshape": (lambda x: x.reshape(4, 3) * st.arange(12.0, dtype=st.float64).reshape(4, 3), [(3, 4)]),
    "permute": (lambda x: x.permute(2, 0, 1) * st.arange(24.0, dtype=st.float64).reshape(4, 2, 3), [(2, 3, 4)]),
    "expand": (lambda x: x.expand(2, 3, 4) * st.arange(24.0, dtype=st.float64).reshape(2, 3, 4), [(3, 1)]),
    "repeat": (lambda x: x.repeat(2, 1, 2) * st.arange(24.0, dtype=st.float64).reshape(2, 2, 6), [(2, 3)]),
    "cat": (lambda a, b: st.cat([a, b * 2], 1), [(2, 3), (2, 2)]),
    "stack": (lambda a, b: st.stack([a, b * 3], -1), [(2, 3), (2, 3)]),
    "split": (lambda x: [p * (i + 1) for i, p in enumerate(x.split([1, 2], 1))], [(2, 3)]),
    "chunk": (lambda x: [p * (i + 1) for i, p in enumerate(x.chunk(2))], [(3, 2)]),
    "squeeze_unsqueeze": (lambda x: x.squeeze(0).unsqueeze(-1).transpose(0, 1), [(1, 3, 2)]),
    "flatten_unflatten": (lambda x: x.flatten().unflatten(0, (3, 4)).t(), [(2, 6)]),
    "flip": (lambda x: x.flip((0, 1)) * st.arange(6.0, dtype=st.float64).reshape(2, 3), [(2, 3)]),
    "unbind": (lambda x: [p * (i + 2) for i, p in enumerate(x.unbind(1))], [(2, 3)]),
}


@pytest.mark.parametrize("name", sorted(GRADCHECK))
def test_gradcheck(name, rng):
    fn, shapes = GRADCHECK[name]

    def wrapped(*xs):
        out = fn(*xs)
        return tuple(out) if isinstance(out, list) else out
    xs = tuple(st.tensor(rng.uniform(-1, 1, s), requires_grad=True) for s in shapes)
    assert gradcheck(wrapped, xs)


@pytest.mark.parametrize("shape", [(0, 3, 4), (2, 0, 4), (0, 0)])
def test_flatten_empty(shape, device):
    ours = st.zeros(*shape, device=device)
    assert ours.flatten(1).shape == torch.zeros(*shape).flatten(1).shape
    assert st.nn.Flatten()(ours).shape == torch.nn.Flatten()(torch.zeros(*shape)).shape

"""Golden tests for smalltrain.ops.index against torch: every indexing form (ints, slices, None, Ellipsis, integer and
bool arrays/tensors/lists, combinations), repeated indices (gradients scatter-add), negative indices, setitem
(plain and recorded), gather/index_select/masked_fill, error rows raised before anything runs, gradchecks."""
import numpy as np
import pytest
import torch

import smalltrain as st
from smalltrain.testing import golden, golden_error, gradcheck


def both(fn, *inputs, device="cpu", **kw):
    return golden(lambda *a: fn(st, *a), lambda *a: fn(torch, *a), *inputs, device=device, **kw)


def idx(L, values, dtype=None, like=None):
    """An index tensor, on `like`'s device when given (gather and masked_fill want it there, as in torch)."""
    return L.tensor(values, dtype=dtype or L.int64, device=None if like is None else like.device)


# name: fn(lib, x) on a (3, 4, 5) input
INDEX = {
    "int": lambda L, x: x[1], "neg_int": lambda L, x: x[-1], "ints": lambda L, x: x[1, 2],
    "neg_ints": lambda L, x: x[-1, -2, -5], "slice": lambda L, x: x[1:], "slices": lambda L, x: x[:, 1:3],
    "step": lambda L, x: x[::2], "mixed_slice": lambda L, x: x[1:-1, ::3, 2:], "oob_slice": lambda L, x: x[5:10],
    "neg_slice": lambda L, x: x[-10:, -2:], "none": lambda L, x: x[None], "none_mid": lambda L, x: x[:, None],
    "none_int": lambda L, x: x[None, 1, None], "ellipsis_int": lambda L, x: x[..., 1],
    "int_ellipsis": lambda L, x: x[1, ...], "ellipsis_none": lambda L, x: x[..., None],
    "ellipsis_only": lambda L, x: x[...], "ellipsis_mid": lambda L, x: x[0, ..., 1:3],
    "list": lambda L, x: x[[0, 2]], "repeated_tensor": lambda L, x: x[idx(L, [0, 0, 2, 0])],
    "pairs": lambda L, x: x[[0, 1], [1, 2]], "nested_list": lambda L, x: x[idx(L, [[0, 1], [1, 0]])],
    "dim1_repeated": lambda L, x: x[:, [2, 0, 2]], "neg_list": lambda L, x: x[[0, -1], -1],
    "slice_then_array": lambda L, x: x[1:, [0, 0]], "separated_arrays": lambda L, x: x[[0, 1], :, [1, 1]],
    "none_array_slice": lambda L, x: x[None, [0, 0], 1:], "array_ellipsis": lambda L, x: x[idx(L, [2, 1]), ...],
    "int32_index": lambda L, x: x[idx(L, [1, 1], L.int32)], "zero_d_tensor": lambda L, x: x[idx(L, 1)],
    "broadcast_arrays": lambda L, x: x[idx(L, [[0], [2]]), idx(L, [1, 3, 3])],
    "mask_values": lambda L, x: x[x > 0], "mask_dim0": lambda L, x: x[idx(L, [True, False, True], L.bool)],
    "mask_dim1": lambda L, x: x[:, idx(L, [True, False, True, True], L.bool)],
    "mask_list": lambda L, x: x[[True, False, True]], "mask_2d": lambda L, x: x[x.sum(2) > 0],
    "mask_and_int": lambda L, x: x[idx(L, [False, True, True], L.bool), 2],
    "empty_list": lambda L, x: x[[]], "all_false_mask": lambda L, x: x[x > 100],
    "index_select": lambda L, x: L.index_select(x, 1, idx(L, [3, 0, 3])),
    "index_select_method": lambda L, x: x.index_select(-1, idx(L, [4])),
    "gather": lambda L, x: x.gather(2, idx(L, np.random.default_rng(3).integers(0, 5, (3, 4, 2)), like=x)),
    "gather_fn": lambda L, x: L.gather(x, 0, idx(L, [[[0] * 5] * 4, [[2] * 5] * 4], like=x)),
    "gather_smaller_index": lambda L, x: x.gather(1, idx(L, [[[0, 1], [3, 3], [1, 1], [0, 2], [2, 0]]] * 2,
                                                         like=x)),
    "gather_0d": lambda L, x: x[0, 0, 0].gather(0, idx(L, 0, like=x)),
    "masked_fill": lambda L, x: x.masked_fill(x > 0.5, -1.0), "masked_fill_fn": lambda L, x: L.masked_fill(
        x, idx(L, [True, False, True, False, False], L.bool, like=x), 2.0),
    "masked_fill_tensor_value": lambda L, x: x.masked_fill(x < 0, L.tensor(0.25, device=x.device)),
}


@pytest.mark.parametrize("name", sorted(INDEX))
def test_getitem(name, device, rng):
    both(INDEX[name], rng.uniform(-1, 1, (3, 4, 5)).astype(np.float32), device=device)


def test_repeated_indices_sum_their_gradients(device):
    x = st.tensor([1.0, 2.0, 3.0], device=device, requires_grad=True)
    x[st.tensor([0, 0, 2, 0], device=device)].sum().backward()
    assert x.grad.tolist() == [3.0, 0.0, 1.0]


def test_nonzero_and_where_tuple(device, rng):
    x = rng.integers(-1, 2, (3, 4)).astype(np.float32)
    both(lambda L, x: [x.nonzero(), L.nonzero(x, as_tuple=True)[1]], x, device=device, grad=False)


# name: fn(lib, x, v) assigning into x (no grad)
SETITEM = {
    "int": lambda L, x, v: x.__setitem__(1, 5.0), "slice_tensor": lambda L, x, v: x.__setitem__((slice(None), 0),
                                                                                               v[:, 0]),
    "mask": lambda L, x, v: x.__setitem__(x > 0, 0.0), "repeated": lambda L, x, v: x.__setitem__([0, 0], v[1]),
    "broadcast": lambda L, x, v: x.__setitem__((Ellipsis, 1), v[0, :, 1]),
    "broadcast_column": lambda L, x, v: x.__setitem__((0, slice(None), slice(1, 3)), v[0, :, :1]),
    "none_ellipsis": lambda L, x, v: x.__setitem__((None, Ellipsis, 0), -1.0),
    "array_pairs": lambda L, x, v: x.__setitem__(([0, 2], [1, 3]), v[0, 0, :1]),
    "int_into_float": lambda L, x, v: x.__setitem__(0, 7),
}


@pytest.mark.parametrize("name", sorted(SETITEM))
def test_setitem(name, device, rng):
    x0, v0 = rng.uniform(-1, 1, (3, 4, 5)).astype(np.float32), rng.uniform(-1, 1, (3, 4, 5)).astype(np.float32)
    xs, xt = st.tensor(x0, device=device), torch.tensor(x0)
    SETITEM[name](st, xs, st.tensor(v0, device=device))
    SETITEM[name](torch, xt, torch.tensor(v0))
    np.testing.assert_array_equal(xs.numpy(force=True), xt.numpy())


def test_setitem_on_leaf_under_no_grad(device):
    w = st.ones(3, device=device, requires_grad=True)
    with st.no_grad():
        w[1] = 0.0
    assert w.tolist() == [1.0, 0.0, 1.0] and w.is_leaf and w.requires_grad


def test_setitem_recorded(device, rng):
    """A value that requires grad written into a plain tensor, and a write into an intermediate tensor."""
    def build(L, y):
        out = L.zeros(3, 2, device=y.device) if L is st else L.zeros(3, 2)
        out[1] = y * 2
        out[2, 0] = y[0] ** 2
        return out
    both(build, rng.uniform(-1, 1, (2,)).astype(np.float32), device=device)

    def overwrite(L, x):
        h = x * 3
        h[0] = 0.0
        h[:, 1] = h[:, 2] * 2
        return h * x
    both(overwrite, rng.uniform(-1, 1, (2, 3)).astype(np.float32), device=device)


ERRORS = [  # (fn(lib, x) on a (3, 4) input, message regex)
    (lambda L, x: x[5], r"index 5 is out of bounds for dimension 0 with size 3"),
    (lambda L, x: x[-4], r"index -4 is out of bounds"),
    (lambda L, x: x[:, 4], r"out of bounds for dimension 1 with size 4"),
    (lambda L, x: x[[0, 5]], r"index 5 is out of bounds"),
    (lambda L, x: x[L.tensor([0, -4])], r"index -4 is out of bounds"),
    (lambda L, x: x[..., [4]], r"out of bounds for dimension 1"),
    (lambda L, x: x[0, 0, 0], r"too many indices"),
    (lambda L, x: x[None, 0, ..., 0, 0], r"too many indices"),
    (lambda L, x: x[::-1], r"step must be greater than zero"),
    (lambda L, x: x[:, ::0], r"slice step cannot be zero"),
    (lambda L, x: x[L.tensor([True, False])], r"shape of the mask \[2\] at index 0 does not match"),
    (lambda L, x: x[:, L.tensor([True, False])], r"at index 1"),
    (lambda L, x: x[L.tensor([0.0, 1.0])], r"tensors used as indices|valid indices"),
    (lambda L, x: x[[0, 1], [0, 1, 2]], r"shape mismatch|broadcast"),
    (lambda L, x: x.__setitem__([0, 3], 1.0), r"index 3 is out of bounds"),
    (lambda L, x: x.__setitem__(0, x[:2, :2]), r"shape mismatch|broadcast|expand"),
    (lambda L, x: x.gather(1, idx(L, [[0, 4]] * 3, like=x)), r"out of bounds|out of range"),
    (lambda L, x: x.gather(1, idx(L, [0, 1], like=x)), r"same number of dimensions"),
    (lambda L, x: x.gather(1, idx(L, [[0]] * 4, like=x)), r"Size does not match at dimension 0"),
    (lambda L, x: x.gather(0, idx(L, [[-1]], like=x)), r"out of bounds"),
    (lambda L, x: x.index_select(2, L.tensor([0])), r"out of range"),
    (lambda L, x: x.masked_fill(x > 0, L.ones(2)), r"0-dimensional value tensor"),
]


@pytest.mark.parametrize("fn,match", ERRORS, ids=[f"{i}-{e[1][:30]}" for i, e in enumerate(ERRORS)])
def test_errors(fn, match, device):
    golden_error(lambda *a: fn(st, *a), lambda *a: fn(torch, *a), np.ones((3, 4), np.float32), match=match,
                 device=device)


@pytest.mark.skipif(not st.cuda.is_available(), reason="no CUDA device")
def test_index_tensors_on_another_device():
    """Indexing takes CPU index tensors on a CUDA tensor; gather and masked_fill want them on its device (torch)."""
    x = st.arange(6.0, device="cuda").reshape(2, 3)
    assert x[st.tensor([1, 0])].tolist() == [[3.0, 4.0, 5.0], [0.0, 1.0, 2.0]]
    with pytest.raises(RuntimeError, match="same device"):
        x.gather(1, st.tensor([[0], [1]]))
    with pytest.raises(RuntimeError, match="same device"):
        x.masked_fill(st.tensor([True, False, True]), 0.0)


def test_out_of_range_raises_before_anything_runs():
    x = st.arange(6.0).reshape(2, 3).requires_grad_()
    with pytest.raises(IndexError):
        x[st.tensor([0, 1, 7])]
    with st.no_grad(), pytest.raises(IndexError):
        x[[0, 2], 0] = 100.0
    assert x.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]] and x.grad is None


@pytest.mark.skipif(not st.cuda.is_available(), reason="no CUDA device")
def test_out_of_range_on_cuda_raises_at_the_next_sync():
    """On a GPU the indices are checked there and the error comes at the next sync, as torch's device assert;
    meanwhile nothing is read or written outside the tensor."""
    x = st.arange(6.0, device="cuda").reshape(2, 3).requires_grad_()
    y = x[st.tensor([0, 1, 7], device="cuda")]
    with pytest.raises(IndexError, match="index 7 is out of bounds for dimension 0 with size 2"):
        y.sum().item()
    with st.no_grad():
        x[st.tensor([0, 2], device="cuda"), 0] = 100.0
    with pytest.raises(IndexError, match="index 2 is out of bounds for dimension 0 with size 2"):
        st.cuda.synchronize()


GRADCHECK = {
    "ints_slices": lambda x: x[1, 1:] * 2, "none_ellipsis": lambda x: x[None, ..., 1],
    "repeated": lambda x: x[st.tensor([0, 0, 2])] * st.tensor([[1.0], [2.0], [3.0]], dtype=st.float64),
    "pairs_repeated": lambda x: x[[0, 0, 2], [1, 1, 3]], "mask": lambda x: x[x > 0] ** 2,
    "combo": lambda x: x[1:, [3, 3, 0]], "gather": lambda x: x.gather(1, st.tensor([[0, 0], [3, 1], [2, 2]])),
    "masked_fill": lambda x: x.masked_fill(x > 0, 0.5) * x,
}


@pytest.mark.parametrize("name", sorted(GRADCHECK))
def test_gradcheck(name, rng):
    x = st.tensor(rng.uniform(-1, 1, (3, 4)), requires_grad=True)
    assert gradcheck(GRADCHECK[name], (x,))

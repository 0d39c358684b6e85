"""Tensor attributes and conversions against torch: shape/size/dtype/device/ndim/numel, numpy/item/tolist, to(),
float/long/..., detach/clone/contiguous/requires_grad_/.data, Python protocol (len, iter, bool, format, deepcopy),
and repr, character for character."""
import copy

import numpy as np
import pytest
import torch

import smalltrain as st
from smalltrain.testing import assert_close, golden


def test_attributes(device):
    x = st.zeros(2, 3, 4, device=device)
    assert x.shape == (2, 3, 4) and isinstance(x.shape, st.Size) and repr(x.shape) == "smalltrain.Size([2, 3, 4])"
    assert x.size() == (2, 3, 4) and x.size(1) == 3 and x.size(-1) == 4
    assert x.dtype == st.float32 and x.ndim == 3 and x.dim() == 3 and x.numel() == 24 and len(x) == 2
    assert x.device == st.device(device) and str(x.device) == ("cpu" if device == "cpu" else "cuda:0")
    assert x.is_leaf and x.grad_fn is None and not x.requires_grad and x.is_contiguous()
    assert x.shape.numel() == 24 and x.element_size() == 4 and x.is_floating_point()
    with pytest.raises(IndexError, match="out of range"):
        x.size(3)


def test_numpy_item_tolist():
    a = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    t = st.from_numpy(a)
    assert t.numpy() is a or np.shares_memory(t.numpy(), a)
    assert st.tensor([[2.5]]).item() == 2.5 and isinstance(st.tensor(3).item(), int)
    assert t.tolist() == torch.from_numpy(a).tolist() and st.tensor(1.5).tolist() == 1.5
    with pytest.raises(RuntimeError, match="cannot be converted to Scalar"):
        t.item()
    with pytest.raises(RuntimeError, match="requires grad"):
        st.ones(2, requires_grad=True).numpy()


def test_conversions(device):
    x = st.tensor([1.7, -2.5, 0.0], device=device, requires_grad=True)
    xt = torch.tensor([1.7, -2.5, 0.0], requires_grad=True)
    for name in ("float", "double", "long", "int", "bool", "half"):
        ours, theirs = getattr(x, name)(), getattr(xt, name)()
        assert str(ours.dtype).split(".")[1] == str(theirs.dtype).split(".")[1]
        assert ours.tolist() == theirs.tolist()
    assert x.to(st.float64).dtype == st.float64 and x.to(float).dtype == st.float64 and x.to(int).dtype == st.int64
    assert x.to(device) is x and x.to(st.float32) is x and x.to(x) is x and x.type(st.int32).dtype == st.int32
    assert x.to(device=device, dtype=st.float64).dtype == st.float64 and x.to("cpu").device == st.device("cpu")
    assert x.type() == "smalltrain.float32" and x.type_as(st.ones(1, dtype=st.float64)).dtype == st.float64
    y = x.double()
    y.sum().backward()   # the gradient converts back to the source dtype
    assert x.grad.dtype == st.float32 and x.grad.tolist() == [1.0, 1.0, 1.0]


def test_detach_clone_data_requires_grad(device):
    x = st.tensor([1.0, 2.0], device=device, requires_grad=True)
    d = x.detach()
    assert not d.requires_grad and d.grad_fn is None
    d.array[0] = 5.0                       # shares memory, as torch's detach
    assert x.tolist() == [5.0, 2.0]
    c = x.clone()
    assert c.requires_grad and c.grad_fn is not None
    c.array[1] = 9.0
    assert x.tolist() == [5.0, 2.0]
    (c * 3).sum().backward()
    assert x.grad.tolist() == [3.0, 3.0]
    data = x.data
    assert not data.requires_grad and data.is_leaf and np.shares_memory(data.array, x.array)
    x.data = st.tensor([0.0, 1.0], device=device)
    assert x.tolist() == [0.0, 1.0] and x.requires_grad
    t = st.tensor(x.tolist(), device=device).t()
    assert t.contiguous().is_contiguous()
    assert st.ones(2, device=device).requires_grad_().requires_grad
    with pytest.raises(RuntimeError, match="floating point"):
        st.tensor([1, 2], device=device).requires_grad_()
    with pytest.raises(RuntimeError, match="leaf"):
        (x * 2).requires_grad_(False)


def test_python_protocol():
    x = st.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert [r.tolist() for r in x] == [[1.0, 2.0], [3.0, 4.0]]
    assert bool(st.tensor([1.0])) and not bool(st.tensor(0.0)) and float(st.tensor(2.5)) == 2.5
    assert int(st.tensor(3.9)) == 3 and [10, 20, 30][st.tensor(1)] == 20
    assert f"{st.tensor(2.5):.3f}" == "2.500" and f"{x.sum():.1f}" == "10.0"
    with pytest.raises(RuntimeError, match="ambiguous"):
        bool(x)
    with pytest.raises(TypeError, match="0-d"):
        len(st.tensor(1.0))
    assert hash(x) != hash(st.tensor([[1.0, 2.0], [3.0, 4.0]])) and x in {x}
    assert (x == None) is False and (x != None) is True and x in [None, x]  # noqa: E711 - torch's answer


def test_deepcopy():
    x = st.tensor([1.0, 2.0], requires_grad=True)
    (x * 2).sum().backward()
    y = copy.deepcopy(x)
    assert y is not x and y.requires_grad and y.grad.tolist() == [2.0, 2.0] and not np.shares_memory(y.array,
                                                                                                       x.array)
    y.array[0] = 7.0
    assert x.tolist() == [1.0, 2.0]
    with pytest.raises(RuntimeError, match="graph leaves"):
        copy.deepcopy(x * 2)


REPR = {
    "frac": lambda L: L.tensor([1.5, -2.25, 3.0]), "whole": lambda L: L.tensor([1.0, 2.0, -3.0]),
    "sci": lambda L: L.tensor([1e-5, 1.0, 123.0]), "big": lambda L: L.tensor([1e9, 1.0]),
    "nonfinite": lambda L: L.tensor([1.0, float("nan"), float("inf"), -float("inf")]),
    "nan_frac": lambda L: L.tensor([0.5, float("nan")]), "zeros": lambda L: L.zeros(2, 2),
    "int": lambda L: L.tensor([[1, -20], [300, 4]]), "bool": lambda L: L.tensor([True, False]),
    "bool_all": lambda L: L.tensor([True, True]), "scalar": lambda L: L.tensor(2.5),
    "scalar_int": lambda L: L.tensor(7),
    "f64": lambda L: L.tensor([1.5, 2.0], dtype=L.float64), "i32": lambda L: L.tensor([1, 2], dtype=L.int32),
    "u8": lambda L: L.tensor([1, 2], dtype=L.uint8), "empty": lambda L: L.zeros(0), "empty2": lambda L: L.zeros(0, 3),
    "empty_int": lambda L: L.zeros(0, dtype=L.int64), "requires_grad": lambda L: L.tensor([1.0, 2.0],
                                                                                        requires_grad=True),
    "3d": lambda L: L.arange(24.0).reshape(2, 3, 4) / 7, "wrapped_row": lambda L: L.arange(30.0) / 3,
    "summarized": lambda L: L.arange(2000.0).reshape(40, 50), "neg_zero": lambda L: L.tensor([-0.0, 0.0, 1.5]),
    "f64_wide": lambda L: L.arange(12, dtype=L.float64).reshape(1, 12) * 1000.5,
}


@pytest.mark.parametrize("name", sorted(REPR))
def test_repr_matches_torch(name):
    assert repr(REPR[name](st)) == repr(REPR[name](torch)).replace("torch.", "smalltrain.")


def test_repr_of_graph_output():
    y = st.tensor([1.0, 2.0], requires_grad=True) * 2
    assert repr(y) == "tensor([2., 4.], grad_fn=<MulBackward>)"


def test_legacy_constructor_and_dtype_objects():
    assert st.Tensor([1, 2]).dtype == st.float32 and st.Tensor(np.array([1, 2])).dtype == st.int64
    assert st.float32 == np.float32 and st.float == st.float32 and st.long == st.int64 and st.double == st.float64
    assert repr(st.int64) == "smalltrain.int64" and st.bool.is_floating_point is False
    assert st.get_default_dtype() == st.float32


@pytest.mark.parametrize("op", ["add", "mul", "t", "sum", "max", "index"])
def test_methods_on_noncontiguous_inputs(op, device, rng):
    """Tensors that are transposed views go through every family the same as contiguous ones."""
    fns = {"add": lambda x: x.t() + 1, "mul": lambda x: x.t() * x.t(), "t": lambda x: x.t().reshape(-1),
           "sum": lambda x: x.t().sum(0), "max": lambda x: x.t().max(1)[0], "index": lambda x: x.t()[1:, [0, 0]]}
    golden(fns[op], fns[op], rng.uniform(-1, 1, (3, 4)).astype(np.float32), device=device)
    assert_close(fns[op](st.tensor(np.eye(3, 4, dtype=np.float32))),
                 fns[op](torch.tensor(np.eye(3, 4, dtype=np.float32))))


INT_DIVISION = {"floordiv": lambda L, a, b: a // b, "mod": lambda L, a, b: a % b,
                "floordiv_scalar": lambda L, a, b: a // 0, "mod_scalar": lambda L, a, b: a % 0,
                "rfloordiv": lambda L, a, b: 5 // b, "trunc": lambda L, a, b: L.div(a, b, rounding_mode="trunc")}


@pytest.mark.parametrize("name", sorted(INT_DIVISION))
def test_integer_division_by_zero_raises_like_torch(name):
    a, b = np.array([3, -3, 4]), np.array([0, 2, 1])
    fn = INT_DIVISION[name]
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        fn(torch, torch.tensor(a), torch.tensor(b))
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        fn(st, st.tensor(a), st.tensor(b))


def test_true_division_of_integers_by_zero_gives_inf_nan():
    a, b = np.array([3, -3, 0, 4]), np.array([0, 0, 0, 2])
    ours, theirs = st.tensor(a) / st.tensor(b), torch.tensor(a) / torch.tensor(b)
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    nonzero = np.array([0, 2, 1, 3])   # a nonzero divisor still floors and wraps like torch
    np.testing.assert_array_equal((st.tensor(a) // st.tensor(nonzero + 1)).numpy(),
                                  (torch.tensor(a) // torch.tensor(nonzero + 1)).numpy())

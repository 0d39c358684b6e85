"""Golden tests for smalltrain.ops.matmul against torch: 1-D/2-D/batched/broadcast batch dims for matmul, mm, bmm,
linear; chains of linear layers; dtypes; error rows; float64 gradchecks."""
import numpy as np
import pytest
import torch

import smalltrain as st
from smalltrain.ops.matmul import linear, linear_chain
from smalltrain.testing import golden, golden_error, gradcheck

SHAPES = [((3,), (3,)), ((3,), (3, 4)), ((2, 3), (3,)), ((2, 3), (3, 4)), ((5, 2, 3), (3, 4)), ((2, 3), (5, 3, 4)),
          ((5, 2, 3), (5, 3, 4)), ((5, 1, 2, 3), (4, 3, 2)), ((3,), (5, 3, 4)), ((5, 2, 3), (3,)),
          ((1, 2, 3), (4, 3, 2)), ((2, 0), (0, 3)), ((0, 3), (3, 2)), ((2, 1, 3), (1, 3, 1))]


@pytest.mark.parametrize("shapes", SHAPES, ids=str)
def test_matmul_shapes(shapes, device, rng):
    a, b = (rng.uniform(-1, 1, s).astype(np.float32) for s in shapes)
    golden(lambda x, y: x @ y, lambda x, y: x @ y, a, b, device=device)
    golden(st.matmul, torch.matmul, a, b, device=device)


def test_mm_bmm_and_dtypes(device, rng):
    a, b = rng.uniform(-1, 1, (2, 3)), rng.uniform(-1, 1, (3, 4))
    golden(st.mm, torch.mm, a.astype(np.float32), b.astype(np.float32), device=device)
    golden(lambda x, y: x.mm(y), lambda x, y: x.mm(y), a, b, device=device)   # float64 stays float64
    p, q = rng.uniform(-1, 1, (4, 2, 3)).astype(np.float32), rng.uniform(-1, 1, (4, 3, 5)).astype(np.float32)
    golden(st.bmm, torch.bmm, p, q, device=device)
    golden(lambda x, y: x.bmm(y), lambda x, y: x.bmm(y), p, q, device=device)
    i, j = rng.integers(-3, 3, (2, 3)), rng.integers(-3, 3, (3, 2))
    golden(lambda x, y: x @ y, lambda x, y: x @ y, i, j, device=device)
    golden(lambda x, y: x @ y, lambda x, y: x @ y, a.astype(np.float32), np.arange(3.0, dtype=np.float32),
           device=device, requires_grad=(True, False))


@pytest.mark.parametrize("xshape", [(4, 3), (2, 4, 3), (3,)], ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_linear(xshape, bias, device, rng):
    x, w = rng.uniform(-1, 1, xshape).astype(np.float32), rng.uniform(-1, 1, (5, 3)).astype(np.float32)
    b = rng.uniform(-1, 1, (5,)).astype(np.float32)
    if bias:
        golden(linear, torch.nn.functional.linear, x, w, b, device=device)
    else:
        golden(linear, torch.nn.functional.linear, x, w, device=device)


ERRORS = [  # (fn(lib, a, b), shapes or dtypes, message regex)
    (lambda L, a, b: a @ b, ((2, 3), (2, 3)), r"cannot be multiplied \(2x3 and 2x3\)"),
    (lambda L, a, b: a @ b, ((3,), (4,)), r"inconsistent tensor size"),
    (lambda L, a, b: a @ b, ((2, 2, 3), (3, 3, 2)), r"batch|size"),
    (lambda L, a, b: a @ b, ((5, 3), (4,)), r"cannot be multiplied"),
    (lambda L, a, b: a.sum() @ b, ((3,), (3,)), r"at least 1D"),
    (lambda L, a, b: L.mm(a, b), ((2, 2, 3), (3, 2)), r"2-D|2D|matrix"),
    (lambda L, a, b: L.bmm(a, b), ((2, 3), (3, 2)), r"3-D|3D"),
    (lambda L, a, b: a @ b.double(), ((2, 3), (3, 2)), r"dtype|same dtype|expected"),
]


def test_linear_error(device):
    golden_error(linear, torch.nn.functional.linear, np.ones((2, 4), np.float32), np.ones((5, 3), np.float32),
                 match=r"cannot be multiplied \(2x4 and 3x5\)", device=device)


@pytest.mark.parametrize("fn,shapes,match", ERRORS, ids=[f"{i}-{e[2][:20]}" for i, e in enumerate(ERRORS)])
def test_errors(fn, shapes, match, device):
    a, b = (np.ones(s, np.float32) for s in shapes)
    golden_error(lambda *t: fn(st, *t), lambda *t: fn(torch, *t), a, b, match=match, device=device)


@pytest.mark.parametrize("shapes", [s for s in SHAPES if 0 not in s[0] + s[1]], ids=str)
def test_gradcheck(shapes, rng):
    a, b = (st.tensor(rng.uniform(-1, 1, s), requires_grad=True) for s in shapes)
    assert gradcheck(lambda x, y: x @ y, (a, b))


def test_gradcheck_linear(rng):
    x, w, b = (st.tensor(rng.uniform(-1, 1, s), requires_grad=True) for s in ((2, 2, 3), (4, 3), (4,)))
    assert gradcheck(linear, (x, w, b))


def test_linear_on_a_transposed_input_keeps_its_layout_in_the_gradient(rng):
    # a flattened batch-inner activation reaches linear as an F-ordered [N, features] view; its gradient comes
    # back in that layout (so the reshape back stays a view) and equals torch's
    base = rng.standard_normal((300, 5)).astype(np.float32)       # [features, N] in memory
    w = rng.standard_normal((7, 300)).astype(np.float32)
    g = rng.standard_normal((5, 7)).astype(np.float32)
    leaf = st.tensor(base, requires_grad=True)
    x = leaf.t()                                   # [N, features], F-ordered
    seen = []
    x.register_hook(lambda grad: seen.append(grad.detach().numpy()))
    wt = st.tensor(w, requires_grad=True)
    linear(x, wt).backward(st.tensor(g))
    tx, tw = torch.tensor(base).t().requires_grad_(True), torch.tensor(w, requires_grad=True)
    torch.nn.functional.linear(tx, tw).backward(torch.tensor(g))
    dx = seen[0]
    assert dx.flags.f_contiguous and not dx.flags.c_contiguous
    np.testing.assert_allclose(leaf.grad.numpy(), tx.grad.numpy().T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(wt.grad.numpy(), tw.grad.numpy(), rtol=1e-5, atol=1e-5)


CHAINS = [  # leading dims, widths d0..dL, activations, biases
    ((64,), (256, 120, 84, 10), ("gelu", "gelu", None), (True, True, True)),   # LeNet-5's head
    ((2, 5), (33, 17, 9), ("relu", "gelu_tanh"), (True, False)),              # 3-D input, a layer without bias
    ((300,), (20, 40, 30, 20, 10), ("relu", None, "gelu", "relu"), (False, True, True, True)),  # 4 rows a block
    ((7,), (5, 6, 7, 8, 9, 3), ("relu",) * 5, (True,) * 5),                  # five layers: a chain of 4, then 1
]


def _chain_args(dims, widths, biases, rng, dtype=np.float32):
    x = rng.uniform(-1, 1, dims + (widths[0],)).astype(dtype)
    params = []
    for i, bias in enumerate(biases):
        params.append((rng.uniform(-1, 1, (widths[i + 1], widths[i])) / np.sqrt(widths[i])).astype(dtype))
        params.append(rng.uniform(-1, 1, widths[i + 1]).astype(dtype) if bias else None)
    return x, params


def _torch_chain(acts):
    def run(x, *params):
        for i, act in enumerate(acts):
            x = torch.nn.functional.linear(x, params[2 * i], params[2 * i + 1])
            if act == "relu":
                x = torch.relu(x)
            elif act:
                x = torch.nn.functional.gelu(x, approximate="tanh" if act == "gelu_tanh" else "none")
        return x
    return run


@pytest.mark.parametrize("dims, widths, acts, biases", CHAINS, ids=str)
def test_linear_chain(dims, widths, acts, biases, device, rng):
    """linear_chain equals torch's layers one by one, forward and backward; on CUDA the runs of two to four layers
    are one LinearChain op (the last of five layers a LinearAct)."""
    x, params = _chain_args(dims, widths, biases, rng)
    names = []

    def ours(x, *params):
        out = linear_chain(x, [(params[2 * i], params[2 * i + 1], act) for i, act in enumerate(acts)])
        names.append(out.grad_fn.name())
        return out
    golden(ours, _torch_chain(acts), x, *params, device=device)
    if device == "cuda":
        assert names[0] == ("LinearActBackward" if len(acts) > 4 else "LinearChainBackward"), names


def test_linear_chain_of_a_flattened_input(device, rng):
    """linear_chain(x, layers, flatten=True) is the chain of x.flatten(1), forward and backward (the input gradient
    in x's shape); on CUDA one LinearChain op reading x itself; a 1-D input cannot be flattened from dim 1."""
    acts = ("gelu", "relu", None)
    x, params = _chain_args((6,), (24, 16, 12, 5), (True, False, True), rng)
    x = x.reshape(6, 4, 2, 3)
    names = []

    def ours(x, *params):
        out = linear_chain(x, [(params[2 * i], params[2 * i + 1], act) for i, act in enumerate(acts)], flatten=True)
        names.append(out.grad_fn.name())
        return out
    torch_chain = _torch_chain(acts)
    golden(ours, lambda x, *params: torch_chain(x.flatten(1), *params), x, *params, device=device)
    if device == "cuda":
        assert names[0] == "LinearChainBackward", names
    with pytest.raises(IndexError):
        linear_chain(st.tensor(x.reshape(-1)[:24], device=device), [(st.tensor(params[0], device=device), None,
                                                                     None)] * 2, flatten=True)


def test_linear_chain_gradcheck(rng):
    """float64 central differences through a chain (on CUDA: the chain kernels, r1 and r2 row layouts; on the CPU
    the layers it composes)."""
    device = "cuda" if st.cuda.is_available() else "cpu"
    for dims in ((3,), (200,)):
        x, params = _chain_args(dims, (6, 5, 4), (True, False), rng, np.float64)
        ts = [st.tensor(x, device=device, requires_grad=True)]
        ts += [None if p is None else st.tensor(p, device=device, requires_grad=True) for p in params]
        acts = ("gelu", "gelu_tanh")
        assert gradcheck(lambda x, w0, b0, w1: linear_chain(x, [(w0, b0, acts[0]), (w1, None, acts[1])]),
                         tuple(ts[:4]))

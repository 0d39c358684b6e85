"""Golden tests for smalltrain.ops.elementwise against torch: binary ops over broadcast shapes and scalars on both
sides, unary math on random and special values (NaN, +-0, +-inf), dtype promotion, comparisons, where, clamp,
in-place updates, error rows, and float64 gradchecks of every differentiable op."""
import numpy as np
import pytest
import torch

import smalltrain as st
from smalltrain.testing import golden, golden_error, gradcheck

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

SPECIAL = np.array([np.nan, 0.0, -0.0, np.inf, -np.inf, 1.0, -1.0, 0.5, -2.5, 30.0], np.float32)


def both(fn, *inputs, device="cpu", **kw):
    """Run fn(lib, *tensors) with lib = smalltrain and lib = torch through the golden helper."""
    return golden(lambda *a: fn(st, *a), lambda *a: fn(torch, *a), *inputs, device=device, **kw)


def uniform(rng, shape, lo=-2.0, hi=2.0, dtype=np.float32):
    return rng.uniform(lo, hi, shape).astype(dtype)


def away_from_zero(rng, shape):
    return (rng.uniform(0.5, 2.0, shape) * rng.choice([-1, 1], shape)).astype(np.float32)


def ties(rng, shape):
    return rng.integers(-2, 3, shape).astype(np.float32)   # small integers: many exact ties


# op: (fn(lib, a, b), make a, make b)
BINARY = {
    "add": (lambda L, a, b: a + b, uniform, uniform),
    "add_fn_alpha": (lambda L, a, b: L.add(a, b, alpha=2.5), uniform, uniform),
    "sub": (lambda L, a, b: a - b, uniform, uniform),
    "mul": (lambda L, a, b: a * b, uniform, uniform),
    "div": (lambda L, a, b: a / b, uniform, away_from_zero),
    "pow": (lambda L, a, b: a ** b, lambda r, s: uniform(r, s, 0.5, 2.0), uniform),
    "maximum": (lambda L, a, b: L.maximum(a, b), ties, ties),
    "minimum": (lambda L, a, b: L.minimum(a, b), ties, ties),
    "where": (lambda L, a, b: L.where(a > b, a, b), ties, ties),
}
SHAPES = [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 1, 4), (3, 1)), ((), (3,)), ((1,), (2, 3)), ((2, 3, 1), (1, 1, 5)),
          ((0, 3), (3,)), ((4,), ())]


@pytest.mark.parametrize("shapes", SHAPES, ids=str)
@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_broadcast(op, shapes, device, rng):
    fn, make_a, make_b = BINARY[op]
    both(fn, make_a(rng, shapes[0]), make_b(rng, shapes[1]), device=device)


SCALAR = {
    "t+2": lambda L, a: a + 2, "2+t": lambda L, a: 2 + a, "t-2.5": lambda L, a: a - 2.5,
    "2.5-t": lambda L, a: 2.5 - a, "t*3": lambda L, a: a * 3, "3*t": lambda L, a: 3 * a, "t/2": lambda L, a: a / 2,
    "2/t": lambda L, a: 2 / a, "t**2": lambda L, a: a ** 2, "2**t": lambda L, a: 2 ** a,
    "t**0.5": lambda L, a: a.abs() ** 0.5, "t**-1": lambda L, a: a ** -1, "t**0": lambda L, a: a ** 0,
    "0**t": lambda L, a: 0.0 ** a.abs(), "-t": lambda L, a: -a, "sub_alpha": lambda L, a: L.sub(a, 1.5, alpha=2),
    "t+True": lambda L, a: a + True, "t*0-d": lambda L, a: a * L.tensor(3.0, dtype=L.float64),
}


@pytest.mark.parametrize("op", sorted(SCALAR))
def test_scalar_operands(op, device, rng):
    both(SCALAR[op], away_from_zero(rng, (2, 3)), device=device)


@pytest.mark.skipif(not st.cuda.is_available(), reason="no CUDA device")
def test_cpu_tensors_with_cuda_tensors():
    """A 0-dim CPU tensor acts as a scalar in a CUDA op (torch's CPU scalar); any larger CPU tensor raises."""
    a = st.tensor([[1.0, 2.0]], device="cuda")
    out = a * st.tensor(3, dtype=st.int64) + st.tensor(0.5, dtype=st.float64)
    assert out.device.type == "cuda" and out.dtype == st.float32 and out.tolist() == [[3.5, 6.5]]
    assert st.where(a > 1, a, st.tensor(0.0)).tolist() == [[0.0, 2.0]]
    with pytest.raises(RuntimeError, match="same device"):
        a + st.tensor([1.0, 2.0])
    with pytest.raises(RuntimeError, match="requires grad"):
        a * st.tensor(2.0, requires_grad=True)


# name: (fn(lib, x), domain of the random input (lo, hi))
UNARY = {
    "exp": (lambda L, x: L.exp(x), (-3, 3)), "log": (lambda L, x: L.log(x), (0.1, 3)),
    "log1p": (lambda L, x: L.log1p(x), (-0.9, 3)), "sqrt": (lambda L, x: L.sqrt(x), (0.1, 3)),
    "rsqrt": (lambda L, x: L.rsqrt(x), (0.1, 3)), "abs": (lambda L, x: L.abs(x), (-2, 2)),
    "sin": (lambda L, x: L.sin(x), (-4, 4)), "cos": (lambda L, x: L.cos(x), (-4, 4)),
    "tanh": (lambda L, x: L.tanh(x), (-3, 3)), "sigmoid": (lambda L, x: L.sigmoid(x), (-6, 6)),
    "cosh": (lambda L, x: L.cosh(x), (-3, 3)), "sinh": (lambda L, x: L.sinh(x), (-3, 3)),
    "neg": (lambda L, x: L.neg(x), (-2, 2)), "method_exp": (lambda L, x: x.exp(), (-3, 3)),
    "clamp_min": (lambda L, x: L.clamp(x, min=-0.5), (-2, 2)), "clamp_max": (lambda L, x: x.clamp(max=0.5), (-2, 2)),
    "clamp_both": (lambda L, x: x.clamp(-0.5, 0.5), (-2, 2)), "clamp_inverted": (lambda L, x: x.clamp(1, -1), (-2, 2)),
    "clip": (lambda L, x: L.clip(x, -1, 1), (-2, 2)), "pow_tensor_self": (lambda L, x: x ** x, (0.2, 2)),
}


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_random(op, device, rng):
    fn, (lo, hi) = UNARY[op]
    both(fn, uniform(rng, (3, 5), lo, hi), device=device)


@pytest.mark.parametrize("op", sorted(set(UNARY) - {"pow_tensor_self"}))
def test_unary_special_values(op, device):
    both(UNARY[op][0], SPECIAL.copy(), device=device)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "pow", "maximum", "minimum"])
def test_binary_special_values(op, device):
    a = np.repeat(SPECIAL, SPECIAL.size)
    b = np.tile(SPECIAL, SPECIAL.size)
    both(BINARY[op][0], a, b, device=device)


def test_sigmoid_is_stable_on_large_inputs(device):
    both(lambda L, x: L.sigmoid(x), np.array([-200.0, -80.0, 80.0, 200.0], np.float32), device=device)


COMPARE = ["eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor"]


COMPARE_CASES = [(op, rhs) for op in COMPARE for rhs in ("tensor", "broadcast", "scalar")
                 if not (op.startswith("logical") and rhs == "scalar")]   # torch's logical ops take tensors only


@pytest.mark.parametrize("op,rhs", COMPARE_CASES, ids=[f"{o}-{r}" for o, r in COMPARE_CASES])
def test_comparisons(op, rhs, device, rng):
    a = np.concatenate([ties(rng, (6,)), [np.nan, np.inf]]).astype(np.float32)
    b = {"tensor": np.concatenate([ties(rng, (6,)), [np.nan, 1.0]]).astype(np.float32),
         "broadcast": ties(rng, (3, 1)), "scalar": 1.0}[rhs]
    if rhs == "broadcast":
        a = a[None, :]
    both(lambda L, x, y: getattr(L, op)(x, y), a, b, device=device, grad=False)


def test_comparison_operators_and_bitwise(device, rng):
    a, b = ties(rng, (4, 3)), ties(rng, (3,))
    both(lambda L, x, y: [x == y, x != y, x < y, x <= y, x > y, x >= y, x > 0.5, 0.5 < x], a, b, device=device,
         grad=False)
    m, n = rng.random((5,)) > 0.5, rng.random((5,)) > 0.5
    both(lambda L, x, y: [x & y, x | y, x ^ y, ~x, L.logical_not(x)], m, n, device=device, grad=False)
    i, j = rng.integers(-8, 8, (5,)), rng.integers(-8, 8, (5,))
    both(lambda L, x, y: [x & y, x | y, x ^ y, ~x, x // 3, x % 3, -7 % x.abs().clamp(min=1)], i, j, device=device,
         grad=False)


def test_where_forms(device, rng):
    c = rng.random((3, 4)) > 0.5
    x, y = uniform(rng, (3, 4)), uniform(rng, (4,))
    both(lambda L, c, x, y: L.where(c, x, y), c, x, y, device=device)
    both(lambda L, c, x: L.where(c, x, 0.0), c, x, device=device)
    both(lambda L, c, y: L.where(c, 1.5, y), c, y, device=device)
    both(lambda L, c, x: x.where(c, -x), c, x, device=device)
    both(lambda L, c: L.where(c), c, device=device, grad=False)


# (lhs, rhs, fn): outputs compared with dtype; lhs/rhs are arrays (tensors) or plain values
I64, I32, U8 = np.array([3, -1, 2]), np.array([3, -1, 2], np.int32), np.array([3, 1, 250], np.uint8)
F32, F64, B = np.array([1.5, -2.0, 0.25], np.float32), np.array([1.5, -2.0, 0.25]), np.array([True, False, True])
PROMOTION = [
    (I64, 2.5, "add"), (I64, I64, "div"), (I64, I64, "sub"), (U8, I64, "add"), (U8, 3, "add"), (U8, U8, "div"),
    (B, B, "add"), (B, B, "mul"), (B, 2, "mul"), (B, 2.5, "mul"), (B, F32, "add"), (I32, np.array(1.5), "add"),
    (F32, np.array(1.5), "add"), (F32, F64, "mul"), (I32, np.array(7), "add"), (I32, 2.5, "mul"), (I64, 2, "pow"),
    (I64, 0.5, "pow"), (I64, np.array(1.5, np.float32), "mul"), (2.5, I64, "sub"), (I64, F32, "maximum"),
    (F64, 2.5, "add"), (I32, I64, "mul"), (U8, np.int64(2), "mul"), (F32, np.float64(2.0), "mul"),
    (B, np.array(3, np.int32), "add"), (3, I32, "div"), (I64, F32, "minimum"),
]
BINOPS = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b, "div": lambda a, b: a / b,
          "pow": lambda a, b: a ** b, "maximum": lambda a, b: a.maximum(b), "minimum": lambda a, b: a.minimum(b)}


@pytest.mark.parametrize("row", PROMOTION, ids=lambda r: str(r))
def test_dtype_promotion(row, device):
    lhs, rhs, op = row
    both(lambda L, a, b: BINOPS[op](a, b), lhs, rhs, device=device, grad=False)


def test_result_type_and_promote_types():
    def conv(L, v):
        return L.tensor(v) if isinstance(v, np.ndarray) else v
    for lhs, rhs, _ in PROMOTION:
        if isinstance(lhs, np.ndarray) or isinstance(rhs, np.ndarray):
            ours, theirs = st.result_type(conv(st, lhs), conv(st, rhs)), torch.result_type(conv(torch, lhs),
                                                                                         conv(torch, rhs))
            assert str(ours).split(".")[1] == str(theirs).split(".")[1], (lhs, rhs)
    names = ["bool", "uint8", "int32", "int64", "float16", "float32", "float64"]
    for a in names:
        for b in names:
            ours = st.promote_types(getattr(st, a), getattr(st, b))
            assert str(ours).split(".")[1] == str(torch.promote_types(getattr(torch, a), getattr(torch, b))).split(
                ".")[1], (a, b)


def test_unary_dtype_rules(device):
    ints = np.array([4, 1, 9])
    both(lambda L, x: [L.exp(x), L.sqrt(x), L.sigmoid(x), L.log(x), x.abs(), -x, L.clamp(x, 0.5), L.clamp(x, 2),
                       L.where(x > 2, x, 0.5), x.float(), x.double()], ints, device=device, grad=False)


INPLACE = {
    "add_": lambda L, t, o: t.add_(o), "add_alpha": lambda L, t, o: t.add_(o, alpha=-0.5),
    "sub_": lambda L, t, o: t.sub_(o, alpha=2), "mul_": lambda L, t, o: t.mul_(o), "div_": lambda L, t, o: t.div_(o),
    "copy_": lambda L, t, o: t.copy_(o), "zero_": lambda L, t, o: t.zero_(), "fill_": lambda L, t, o: t.fill_(2.5),
    "addcmul_": lambda L, t, o: t.addcmul_(o, o, value=0.5), "addcdiv_": lambda L, t, o: t.addcdiv_(o, o + 3, value=2),
    "clamp_": lambda L, t, o: t.clamp_(-0.5, 0.5), "scalar_mul_": lambda L, t, o: t.mul_(0.9),
    "broadcast_add_": lambda L, t, o: t.add_(o[0]), "iadd": lambda L, t, o: t.__iadd__(o),
    "exp_": lambda L, t, o: t.exp_(), "fill_tensor": lambda L, t, o: t.fill_(L.tensor(1.25)),
}


@pytest.mark.parametrize("op", sorted(INPLACE))
def test_inplace_under_no_grad(op, device, rng):
    t0, o = uniform(rng, (2, 3)), uniform(rng, (2, 3))
    ts, tt = st.tensor(t0, device=device, requires_grad=True), torch.tensor(t0, requires_grad=True)
    with st.no_grad():
        rs = INPLACE[op](st, ts, st.tensor(o, device=device))
    with torch.no_grad():
        rt = INPLACE[op](torch, tt, torch.tensor(o))
    assert rs is ts and rt is tt
    assert ts.dtype == st.float32 and ts.requires_grad and ts.is_leaf
    np.testing.assert_allclose(ts.detach().numpy(force=True), tt.detach().numpy(), rtol=1e-6, atol=1e-6)


def test_inplace_keeps_integer_dtype_and_views(device):
    a = st.tensor([1, 2, 3], device=device)
    a.add_(2).mul_(3)
    assert a.dtype == st.int64 and a.tolist() == [9, 12, 15]
    base = st.zeros(2, 3, device=device)
    base[0].fill_(1.0)   # a basic-index view shares memory, as in torch
    assert base.tolist() == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]


@pytest.mark.parametrize("op", ["mul_", "add_", "div_", "exp_", "sub_"])
def test_inplace_on_intermediate_while_recording(op, device, rng):
    """torch records in-place ops on non-leaf tensors; ours rebinds the tensor to the recorded result."""
    def fn(L, x, y):
        h = x * 2
        getattr(h, op)(*(() if op == "exp_" else (y,)))
        return h * x
    both(fn, uniform(rng, (3,)), away_from_zero(rng, (3,)), device=device)


ERRORS = [  # (fn(lib, *inputs), inputs, message regex)
    (lambda L, a, b: a + b, (np.ones((2, 3), np.float32), np.ones((3, 2), np.float32)), r"add: The size of tensor a"),
    (lambda L, a, b: a * b, (np.ones(3, np.float32), np.ones(4, np.float32)), r"must match the size"),
    (lambda L, a, b: L.maximum(a, b), (np.ones(3, np.float32), np.ones(2, np.float32)), r"maximum"),
    (lambda L, a, b: a - b, (np.array([True]), np.array([True])), r"Subtraction.*bool"),
    (lambda L, a: a - 1, (np.array([True]),), r"Subtraction.*bool"),
    (lambda L, a: -a, (np.array([True]),), r"Negation.*bool"),
    (lambda L, a: a ** -1, (np.array([1, 2]),), r"negative integer powers"),
    (lambda L, a: L.where(a, a, a), (np.array([1, 0]),), r"boolean"),
    (lambda L, a: L.clamp(a), (np.ones(2, np.float32),), r"At least one of 'min' or 'max'"),
    (lambda L, a: a.add_(1.5), (np.array([1, 2]),), r"can't be cast"),
    (lambda L, a, b: a.add_(b), (np.ones(3, np.float32), np.ones((2, 3), np.float32)), r"add_"),
    (lambda L, a: a.requires_grad_().mul_(2), (np.ones(3, np.float32),), r"leaf Variable"),
    (lambda L, a: a.requires_grad_().__iadd__(2), (np.ones(3, np.float32),), r"leaf Variable"),
    (lambda L, a: a.requires_grad_().zero_(), (np.ones(3, np.float32),), r"leaf Variable"),
    (lambda L, a: a.requires_grad_().copy_(a.detach()), (np.ones(3, np.float32),), r"leaf Variable"),
    (lambda L, a: L.div(a, 2, rounding_mode="round"), (np.ones(3, np.float32),), r"rounding_mode"),
    (lambda L, a, b: L.where(a > 0, a, b), (np.ones(3, np.float32), np.ones(2, np.float32)), r"where"),
    (lambda L, a, b: a == b, (np.ones(3, np.float32), np.ones(2, np.float32)), r"eq"),
]


@pytest.mark.parametrize("fn,inputs,match", ERRORS, ids=[e[2] for e in ERRORS])
def test_errors(fn, inputs, match, device):
    golden_error(lambda *a: fn(st, *a), lambda *a: fn(torch, *a), *inputs, match=match, device=device)


# float64 central-difference checks of every differentiable op: (fn, input shapes, domain)
GRADCHECK = {
    "add": (lambda a, b: st.add(a, b, alpha=0.5), [(2, 3), (3,)], (-1, 1)),
    "sub": (lambda a, b: a - b, [(2, 3), (2, 1)], (-1, 1)), "mul": (lambda a, b: a * b, [(2, 3), (3,)], (-1, 1)),
    "div": (lambda a, b: a / b, [(2, 3), (3,)], (0.5, 2)), "pow": (lambda a, b: a ** b, [(2, 3), (3,)], (0.5, 2)),
    "pow_scalar": (lambda a: a ** 3 + 2 ** a + a ** -0.5, [(2, 3)], (0.5, 2)),
    "rdiv_rsub": (lambda a: 1 / a - (2 - a), [(4,)], (0.5, 2)),
    "maximum": (lambda a, b: st.maximum(a, b), [(2, 3), (3,)], (-1, 1)),
    "minimum": (lambda a, b: st.minimum(a, b), [(2, 3), (3,)], (-1, 1)),
    "where": (lambda a, b: st.where(a > 0, a, b), [(2, 3), (3,)], (-1, 1)),
    "clamp": (lambda a: a.clamp(-0.5, 0.5), [(3, 4)], (-1, 1)),
    "neg_abs": (lambda a: -a.abs(), [(3, 4)], (-1, 1)),
}
for _name in ("exp", "log", "log1p", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "cosh", "sinh"):
    GRADCHECK[_name] = (getattr(st, _name), [(2, 3)], (0.2, 2))


@pytest.mark.parametrize("op", sorted(GRADCHECK))
def test_gradcheck(op, rng):
    fn, shapes, (lo, hi) = GRADCHECK[op]
    inputs = []
    for s in shapes:
        a = rng.uniform(lo, hi, s)
        if lo < 0:   # keep kinks (abs at 0, clamp bounds, max ties) out of the finite-difference step
            a = np.where(np.abs(a) < 0.05, 0.3, a)
            a = np.where(np.abs(np.abs(a) - 0.5) < 0.05, 0.7, a)
        inputs.append(st.tensor(a, dtype=st.float64, requires_grad=True))
    assert gradcheck(fn, tuple(inputs))


CLAMP_TENSOR_BOUNDS = {
    "both": lambda L, x, lo, hi: L.clamp(x, lo, hi),
    "min_only": lambda L, x, lo, hi: x.clamp(min=lo),
    "max_only": lambda L, x, lo, hi: L.clip(x, max=hi),
    "crossed": lambda L, x, lo, hi: L.clamp(x, hi, lo),    # min > max in places: the output is max, as torch's
    "broadcast": lambda L, x, lo, hi: L.clamp(x, lo[0], hi[:, :1]),
}


@pytest.mark.parametrize("name", sorted(CLAMP_TENSOR_BOUNDS))
def test_clamp_tensor_bounds_golden(name, device, rng):
    x = uniform(rng, (3, 4))
    lo, hi = uniform(rng, (3, 4), -1.5, 0.0), uniform(rng, (3, 4), 0.0, 1.5)
    both(CLAMP_TENSOR_BOUNDS[name], x, lo, hi, device=device)


def test_clamp_inplace_tensor_bounds_on_view(device, rng):
    x, lo, hi = uniform(rng, (2, 3)), uniform(rng, (3,), -0.5, 0.5), uniform(rng, (3,), 0.5, 1.0)

    def fn(L, x, lo, hi):
        a = x * 1.0
        a[1].clamp_(lo, hi)
        return a
    both(fn, x, lo, hi, device=device)

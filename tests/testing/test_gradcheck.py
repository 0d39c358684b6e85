"""The verification helpers themselves: gradcheck catches a wrong backward, golden catches wrong values, gradients
and dtypes, golden_error catches a wrong exception type, and assert_close applies the project's tolerance rule
max|ours - ref| <= rtol * max(1, max|ref|) with NaN/inf positions compared exactly."""
import numpy as np
import pytest
import torch

import smalltrain as st
from smalltrain.autograd import Function
from smalltrain.testing import assert_close, golden, golden_error, gradcheck, max_error


class WrongSquare(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.x = x.array
        return x.array ** 2

    @staticmethod
    def backward(ctx, dout):
        return dout.array * ctx.x * 2.1   # off by 5%


def test_gradcheck_accepts_right_and_rejects_wrong(rng):
    x = st.tensor(rng.uniform(-1, 1, (2, 3)), requires_grad=True)
    assert gradcheck(lambda t: (t * t).sum(1), (x,))
    assert gradcheck(lambda a, b: (a * b, a - b), (x, st.tensor(rng.uniform(-1, 1, (3,)), requires_grad=True)))
    with pytest.raises(AssertionError, match="input 0 gradient mismatch"):
        gradcheck(WrongSquare.apply, (x,))
    assert gradcheck(WrongSquare.apply, (x,), raise_exception=False) is False
    with pytest.raises(AssertionError, match="use float64"):
        gradcheck(lambda t: t * 2, (st.ones(2, requires_grad=True),))


def test_gradcheck_handles_noncontiguous_inputs(rng):
    x = st.tensor(rng.uniform(-1, 1, (3, 2)), requires_grad=True)
    x.array = x.array.T
    assert gradcheck(lambda t: t.exp(), (x,))


def test_golden_catches_wrong_values_gradients_and_dtypes(rng):
    a = rng.uniform(0.5, 1, (3,)).astype(np.float32)
    assert set(golden(st.exp, torch.exp, a)) == {"out0", "grad0"}
    with pytest.raises(AssertionError, match="output 0"):
        golden(st.exp, torch.sin, a)
    with pytest.raises(AssertionError, match="gradient of input 0"):
        golden(lambda x: WrongSquare.apply(x.double()), lambda x: (x.double() ** 2), a)
    with pytest.raises(AssertionError, match="dtype"):
        golden(lambda x: x.double(), lambda x: x, a)
    with pytest.raises(AssertionError, match="requires_grad"):
        golden(lambda x: x.detach() * 2, lambda x: x * 2, a)


def test_golden_error_compares_exception_types():
    assert golden_error(lambda x: x[5], lambda x: x[5], np.ones(3), match="out of bounds") is IndexError
    with pytest.raises(AssertionError, match="torch raised IndexError, we raised ValueError"):
        golden_error(lambda x: (_ for _ in ()).throw(ValueError("x")), lambda x: x[5], np.ones(3))
    with pytest.raises(AssertionError, match="we raised nothing"):
        golden_error(lambda x: x, lambda x: x[5], np.ones(3))
    with pytest.raises(AssertionError, match="does not match"):
        golden_error(lambda x: x[5], lambda x: x[5], np.ones(3), match="no such text")


def test_tolerance_rule():
    ref = np.array([0.5, -2.0, 4.0])
    assert max_error(ref + [0, 0, 3.9e-5], ref) == pytest.approx((3.9e-5, 4.0))
    assert_close(ref + [0, 0, 3.9e-5], ref)                   # 3.9e-5 <= 1e-5 * max(1, 4)
    with pytest.raises(AssertionError, match="max|ours - expected|"):
        assert_close(ref + [0, 0, 4.1e-5], ref)
    small = np.array([0.1, 0.2])                               # the scale never drops below 1
    assert_close(small + 9e-6, small)
    with pytest.raises(AssertionError):
        assert_close(small + 1.1e-5, small)
    assert_close(ref * (1 + 1e-3), ref, rtol=2e-3)
    with pytest.raises(AssertionError, match="NaN positions"):
        assert_close(np.array([np.nan, 1.0]), np.array([1.0, 1.0]))
    with pytest.raises(AssertionError, match="infinities"):
        assert_close(np.array([np.inf, 1.0]), np.array([-np.inf, 1.0]))
    assert_close(np.array([np.nan, np.inf, 1.0]), np.array([np.nan, np.inf, 1.0]))
    with pytest.raises(AssertionError, match="shape"):
        assert_close(np.ones(2), np.ones(3))
    with pytest.raises(AssertionError, match="integer/bool values differ"):
        assert_close(np.array([1, 2]), np.array([1, 3]))

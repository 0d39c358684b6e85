"""nn.init against torch.nn.init: gains and fans exactly, distributions by their formulas (fixed seed, sample
statistics within loose bounds), in-place writes without graph, reproducibility, errors."""
import math

import numpy as np
import pytest
import torch

import smalltrain as st
from smalltrain import nn
from smalltrain.nn import init

GAINS = [("linear", None), ("conv2d", None), ("conv_transpose3d", None), ("sigmoid", None), ("tanh", None),
         ("relu", None), ("leaky_relu", None), ("leaky_relu", 0.2), ("leaky_relu", 3), ("leaky_relu", math.sqrt(5)),
         ("selu", None)]


@pytest.mark.parametrize("nonlinearity, param", GAINS)
def test_calculate_gain_equals_torch(nonlinearity, param):
    assert init.calculate_gain(nonlinearity, param) == pytest.approx(torch.nn.init.calculate_gain(nonlinearity,
                                                                                                  param), rel=1e-15)


@pytest.mark.parametrize("args, exc, pattern", [(("softsign",), ValueError, "Unsupported nonlinearity softsign"),
                                                (("leaky_relu", True), ValueError, "negative_slope True not a valid"),
                                                (("leaky_relu", "x"), ValueError, "negative_slope x not a valid")])
def test_calculate_gain_errors_match_torch(args, exc, pattern):
    with pytest.raises(exc, match=pattern):
        torch.nn.init.calculate_gain(*args)
    with pytest.raises(exc, match=pattern):
        init.calculate_gain(*args)


@pytest.mark.parametrize("shape", [(3, 4), (8, 2, 3, 5), (6, 4, 7), (1, 1)])
def test_fans_equal_torch(shape):
    assert init._calculate_fan_in_and_fan_out(st.empty(*shape)) == \
        torch.nn.init._calculate_fan_in_and_fan_out(torch.empty(*shape))


def test_fans_need_two_dims():
    for lib, t in ((init, st.empty(5)), (torch.nn.init, torch.empty(5))):
        with pytest.raises(ValueError, match="Fan in and fan out can not be computed for tensor with fewer than 2"):
            lib._calculate_fan_in_and_fan_out(t)
        with pytest.raises(ValueError, match="Fan in and fan out"):
            lib.xavier_uniform_(t)


SHAPE = (200, 100, 3, 3)   # fan_in 900, fan_out 1800; 180k samples keep the sample std within ~0.5% of sigma
FAN_IN, FAN_OUT = 900, 1800
SQ3 = math.sqrt(3)

# (name, fill, expected (low, high) support or None, expected mean, expected std)
DISTRIBUTIONS = [
    ("uniform", lambda t: init.uniform_(t, -2.0, 3.0), (-2.0, 3.0), 0.5, 5 / math.sqrt(12)),
    ("normal", lambda t: init.normal_(t, 1.0, 0.5), None, 1.0, 0.5),
    ("xavier_uniform", lambda t: init.xavier_uniform_(t, gain=2.0), 2 * math.sqrt(6 / (FAN_IN + FAN_OUT)), 0.0,
     2 * math.sqrt(2 / (FAN_IN + FAN_OUT))),
    ("xavier_normal", lambda t: init.xavier_normal_(t), None, 0.0, math.sqrt(2 / (FAN_IN + FAN_OUT))),
    ("kaiming_uniform", lambda t: init.kaiming_uniform_(t), math.sqrt(6 / FAN_IN), 0.0, math.sqrt(2 / FAN_IN)),
    ("kaiming_uniform_leaky", lambda t: init.kaiming_uniform_(t, a=0.2), math.sqrt(6 / (1 + 0.2 ** 2) / FAN_IN), 0.0,
     math.sqrt(2 / (1 + 0.2 ** 2) / FAN_IN)),
    ("kaiming_uniform_sqrt5", lambda t: init.kaiming_uniform_(t, a=math.sqrt(5)), 1 / math.sqrt(FAN_IN), 0.0,
     1 / math.sqrt(3 * FAN_IN)),
    ("kaiming_uniform_fan_out_relu", lambda t: init.kaiming_uniform_(t, mode="fan_out", nonlinearity="relu"),
     math.sqrt(6 / FAN_OUT), 0.0, math.sqrt(2 / FAN_OUT)),
    ("kaiming_normal", lambda t: init.kaiming_normal_(t, nonlinearity="relu"), None, 0.0, math.sqrt(2 / FAN_IN)),
    ("kaiming_normal_tanh_fan_out", lambda t: init.kaiming_normal_(t, mode="fan_out", nonlinearity="tanh"), None, 0.0,
     5 / 3 / math.sqrt(FAN_OUT)),
    ("trunc_normal", lambda t: init.trunc_normal_(t, 0.0, 1.0, -1.0, 1.0), (-1.0, 1.0), 0.0,
     # std of N(0, 1) truncated to [-1, 1]: sqrt(1 - 2 phi(1) / (2 Phi(1) - 1))
     math.sqrt(1 - 2 * math.exp(-0.5) / math.sqrt(2 * math.pi) / math.erf(1 / math.sqrt(2)))),
]


@pytest.mark.parametrize("name, fill, support, mean, std", DISTRIBUTIONS, ids=[d[0] for d in DISTRIBUTIONS])
def test_distribution_follows_formula(name, fill, support, mean, std):
    p = nn.Parameter(st.empty(*SHAPE))
    arr = p.array
    assert fill(p) is p and p.array is arr and p.grad_fn is None and p.requires_grad  # in place, no graph
    a = arr.astype(np.float64)
    if support is not None:
        lo, hi = support if isinstance(support, tuple) else (-support, support)
        assert a.min() >= lo and a.max() <= hi
        assert a.min() < lo + 0.01 * (hi - lo) and a.max() > hi - 0.01 * (hi - lo)  # the whole range is used
    assert abs(a.std() / std - 1) < 0.05
    assert abs(a.mean() - mean) < 0.05 * std


def test_torch_agrees_with_the_same_formulas():
    """The statistic bounds above are torch's behaviour too (guards the expected formulas themselves)."""
    torch.manual_seed(0)
    t = torch.empty(*SHAPE)
    torch.nn.init.kaiming_uniform_(t, a=math.sqrt(5))
    assert abs(t.std().item() / (1 / math.sqrt(3 * FAN_IN)) - 1) < 0.05
    assert t.abs().max().item() <= 1 / math.sqrt(FAN_IN)
    torch.nn.init.xavier_normal_(t)
    assert abs(t.std().item() / math.sqrt(2 / (FAN_IN + FAN_OUT)) - 1) < 0.05


def test_constant_fills_and_eye_and_orthogonal():
    t = st.empty(3, 4, dtype=st.float64)
    assert np.all(init.constant_(t, 2.5).array == 2.5)
    assert np.all(init.ones_(t).array == 1) and np.all(init.zeros_(t).array == 0)
    assert np.array_equal(init.eye_(t).array, torch.nn.init.eye_(torch.empty(3, 4, dtype=torch.float64)).numpy())
    with pytest.raises(ValueError, match="Only tensors with 2 dimensions are supported"):
        init.eye_(st.empty(2, 2, 2))
    q = init.orthogonal_(st.empty(5, 3, dtype=st.float64), gain=2.0).array
    assert np.allclose(q.T @ q, 4 * np.eye(3))
    q = init.orthogonal_(st.empty(3, 2, 2, dtype=st.float64)).array.reshape(3, 4)
    assert np.allclose(q @ q.T, np.eye(3))


def test_reproducible_and_generator_argument():
    st.manual_seed(3)
    a = init.normal_(st.empty(50)).array.copy()
    st.manual_seed(3)
    assert np.array_equal(init.normal_(st.empty(50)).array, a)
    g1, g2 = np.random.default_rng(5), np.random.default_rng(5)
    assert np.array_equal(init.uniform_(st.empty(20), generator=g1).array,
                          init.uniform_(st.empty(20), generator=g2).array)


def test_tensor_methods_use_init():
    st.manual_seed(1)
    t = st.empty(1000).uniform_(-1, 2)
    assert t.array.min() >= -1 and t.array.max() <= 2 and t.array.min() < -0.9
    t.normal_(5.0, 0.1)
    assert abs(t.array.mean() - 5.0) < 0.02


def test_mode_errors_and_zero_element_warning():
    with pytest.raises(ValueError, match=r"Mode fan_avg not supported, please use one of \['fan_in', 'fan_out'\]"):
        init.kaiming_uniform_(st.empty(3, 3), mode="fan_avg")
    with pytest.raises(ValueError, match="Mode fan_avg not supported"):
        torch.nn.init.kaiming_uniform_(torch.empty(3, 3), mode="fan_avg")
    with pytest.warns(UserWarning, match="Initializing zero-element tensors is a no-op"):
        init.kaiming_normal_(st.empty(0, 3))

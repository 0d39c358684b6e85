"""Tests of smalltrain/nn/functional.py: every name torch.nn.functional has is there and is a plain name swap
(golden against torch through the namespace), one_hot's dtype and errors, inplace= arguments, lazy conv/pool."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import smalltrain as st
import smalltrain.nn.functional as F
from smalltrain.testing import golden


def _r(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


# (name, inputs builder, kwargs, requires_grad per input or None)
CALLS = [
    ("linear", lambda r: (_r(r, 4, 3), _r(r, 5, 3), _r(r, 5)), {}, None),
    ("conv2d", lambda r: (_r(r, 2, 3, 6, 5), _r(r, 4, 3, 3, 3), _r(r, 4)), {"padding": 1, "stride": 2}, None),
    ("max_pool2d", lambda r: (_r(r, 2, 3, 6, 6),), {"kernel_size": 2}, None),
    ("avg_pool2d", lambda r: (_r(r, 2, 3, 6, 6),), {"kernel_size": 3, "stride": 2, "padding": 1}, None),
    ("adaptive_avg_pool2d", lambda r: (_r(r, 2, 3, 7, 5),), {"output_size": (2, 3)}, None),
    ("relu", lambda r: (_r(r, 3, 4),), {}, None),
    ("relu6", lambda r: (_r(r, 3, 4) * 5,), {}, None),
    ("leaky_relu", lambda r: (_r(r, 3, 4),), {"negative_slope": 0.3}, None),
    ("hardtanh", lambda r: (_r(r, 3, 4),), {"min_val": -0.5, "max_val": 0.5}, None),
    ("elu", lambda r: (_r(r, 3, 4),), {"alpha": 1.5}, None),
    ("softplus", lambda r: (_r(r, 3, 4),), {"beta": 2.0}, None),
    ("gelu", lambda r: (_r(r, 3, 4),), {"approximate": "tanh"}, None),
    ("silu", lambda r: (_r(r, 3, 4),), {}, None),
    ("sigmoid", lambda r: (_r(r, 3, 4),), {}, None),
    ("tanh", lambda r: (_r(r, 3, 4),), {}, None),
    ("softmax", lambda r: (_r(r, 3, 4),), {"dim": 1}, None),
    ("log_softmax", lambda r: (_r(r, 3, 4),), {"dim": 0}, None),
    ("batch_norm", lambda r: (_r(r, 4, 3, 2), np.zeros(3, np.float32), np.ones(3, np.float32), _r(r, 3), _r(r, 3)),
     {"training": True}, (True, False, False, True, True)),
    ("layer_norm", lambda r: (_r(r, 4, 3), ), {"normalized_shape": (3,)}, None),
    ("cross_entropy", lambda r: (_r(r, 4, 3), np.array([0, 2, 1, 1])), {"label_smoothing": 0.1}, None),
    ("nll_loss", lambda r: (_r(r, 4, 3), np.array([0, 2, 1, 1])), {"ignore_index": 1}, None),
    ("mse_loss", lambda r: (_r(r, 4, 3), _r(r, 4, 3)), {}, None),
    ("l1_loss", lambda r: (_r(r, 4, 3), _r(r, 4, 3)), {"reduction": "sum"}, None),
    ("binary_cross_entropy", lambda r: (r.uniform(0.1, 0.9, (4, 3)).astype(np.float32),
                                        r.random((4, 3)).astype(np.float32)), {}, None),
    ("binary_cross_entropy_with_logits", lambda r: (_r(r, 4, 3), r.random((4, 3)).astype(np.float32)), {}, None),
    ("pad", lambda r: (_r(r, 2, 3),), {"pad": (1, 2, 0, 1), "value": 0.5}, None),
]


@pytest.mark.parametrize("name,make,kwargs,rg", CALLS, ids=[c[0] for c in CALLS])
def test_name_swap_golden(name, make, kwargs, rg, device, rng):
    golden(lambda *a: getattr(F, name)(*a, **kwargs), lambda *a: getattr(TF, name)(*a, **kwargs), *make(rng),
           device=device, requires_grad=rg)


def test_flatten_matches_torch_flatten(device, rng):
    x = _r(rng, 2, 3, 4)
    golden(lambda t: F.flatten(t, 1), lambda t: torch.flatten(t, 1), x, device=device)


def test_dropout_through_the_namespace(device):
    x = st.ones(1000, device=device)
    assert F.dropout(x, 0.5, training=False) is x
    kept = F.dropout(x, 0.25).array != 0
    assert 0.65 < float(kept.mean()) < 0.85


@pytest.mark.parametrize("name", ["relu", "relu6", "leaky_relu", "hardtanh", "elu", "silu"])
def test_inplace_argument_accepted(name, rng):
    x = _r(rng, 3, 4)
    t = st.tensor(x)
    assert getattr(F, name)(t, inplace=True) is t
    golden(lambda a: getattr(F, name)(a * 1, inplace=True), lambda a: getattr(TF, name)(a * 1, inplace=True), x)
    t = st.tensor(x)
    assert F.relu_(t) is t and float(t.array.min()) >= 0


ONE_HOT = [
    (np.array([0, 2, 1]), -1),
    (np.array([[0, 3], [1, 1]]), 5),
    (np.array(1), 3),
    (np.zeros(0, np.int64), 3),
]


@pytest.mark.parametrize("idx,num_classes", ONE_HOT)
def test_one_hot(idx, num_classes, device):
    golden(lambda t: F.one_hot(t, num_classes), lambda t: TF.one_hot(t, num_classes), idx, device=device)


@pytest.mark.parametrize("call,exc,match", [
    (lambda: F.one_hot(st.tensor([0, -2])), RuntimeError, "non-negative"),
    (lambda: F.one_hot(st.tensor([0, 3]), 3), RuntimeError, "smaller than num_classes"),
    (lambda: F.one_hot(st.tensor([0.0, 2.0])), RuntimeError, "LongTensor"),
    (lambda: F.one_hot(st.tensor([0, 2], dtype=st.int32)), RuntimeError, "LongTensor"),
    (lambda: F.one_hot(st.zeros(0, dtype=st.int64)), RuntimeError, "empty tensor"),
])
def test_one_hot_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_top_level_aliases_and_all():
    assert st.relu is F.relu and st.softmax is F.softmax and st.log_softmax is F.log_softmax
    assert st.dropout is F.dropout
    for name in F.__all__:
        assert callable(getattr(F, name)), name
        assert hasattr(TF, name) or name == "flatten", name


def test_lazy_stand_in_imports_on_call():
    # what functional.py falls back on while a file is missing: resolved at call time, errors then
    conv = F._lazy("..ops.conv", "conv2d")
    x, w = st.randn(1, 1, 3, 3), st.randn(1, 1, 2, 2)
    np.testing.assert_allclose(conv(x, w).array, F.conv2d(x, w).array)
    missing = F._lazy("..ops.not_a_module", "f")
    with pytest.raises(ImportError):
        missing()


@pytest.mark.parametrize("call", [
    lambda: F.relu(np.ones(3)), lambda: F.gelu([1.0]), lambda: F.softmax(np.ones(3), 0),
    lambda: F.cross_entropy(st.randn(2, 3), [0, 1]), lambda: F.nll_loss(np.ones((2, 3)), st.tensor([0, 1])),
    lambda: F.mse_loss(np.ones(3), st.ones(3)), lambda: F.pad(np.ones(3), (1, 1)), lambda: F.dropout(np.ones(3)),
    lambda: F.batch_norm(np.ones((2, 3)), None, None, training=True), lambda: F.layer_norm(np.ones(3), (3,)),
])
def test_non_tensor_arguments_raise_type_error(call):
    with pytest.raises(TypeError, match="must be Tensor"):
        call()

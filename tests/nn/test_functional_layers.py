"""smalltrain.nn.functional's names for the small-model layers and losses (hardswish, dropout1d/2d, embedding,
1-D and adaptive max pooling, smooth_l1/huber/kl_div): a plain name swap against torch.nn.functional, torch's
parameter names and defaults, inplace= arguments and TypeError for non-tensors. The ops' full tables live in
tests/ops."""
import inspect
import warnings

import numpy as np
import pytest
import torch.nn.functional as TF

import smalltrain as st
import smalltrain.nn.functional as F
from smalltrain.testing import golden

NEW_NAMES = ["adaptive_max_pool2d", "avg_pool1d", "dropout1d", "dropout2d", "embedding", "hardswish", "huber_loss",
             "kl_div", "max_pool1d", "smooth_l1_loss"]


def _r(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


# (name, inputs builder, kwargs, requires_grad per input or None)
CALLS = [
    ("hardswish", lambda r: (_r(r, 3, 4) * 4,), {}, None),
    ("smooth_l1_loss", lambda r: (_r(r, 4, 3), _r(r, 4, 3)), {"beta": 0.5}, None),
    ("huber_loss", lambda r: (_r(r, 4, 3), _r(r, 4, 3)), {"delta": 0.5, "reduction": "sum"}, None),
    ("kl_div", lambda r: (_r(r, 4, 3), r.random((4, 3)).astype(np.float32)), {"reduction": "batchmean"}, None),
    ("avg_pool1d", lambda r: (_r(r, 2, 3, 7),), {"kernel_size": 3, "stride": 2, "padding": 1}, None),
    ("max_pool1d", lambda r: (_r(r, 2, 3, 7),), {"kernel_size": 2, "return_indices": True}, None),
    ("adaptive_max_pool2d", lambda r: (_r(r, 2, 3, 7, 5),), {"output_size": (2, 3), "return_indices": True}, None),
    ("dropout1d", lambda r: (_r(r, 2, 3, 4),), {"training": False}, None),
    ("dropout2d", lambda r: (_r(r, 2, 3, 4, 4),), {"p": 0.0}, None),
]


@pytest.mark.parametrize("name,make,kwargs,rg", CALLS, ids=[c[0] for c in CALLS])
def test_name_swap_golden(name, make, kwargs, rg, device, rng):
    golden(lambda *a: getattr(F, name)(*a, **kwargs), lambda *a: getattr(TF, name)(*a, **kwargs), *make(rng),
           device=device, requires_grad=rg)


def test_embedding_name_swap(device, rng):
    golden(lambda w, i: F.embedding(i, w, padding_idx=0), lambda w, i: TF.embedding(i, w, padding_idx=0),
           _r(rng, 5, 3), np.array([[0, 4], [4, 1]]), device=device)


@pytest.mark.parametrize("name", NEW_NAMES)
def test_exported_with_torchs_parameters(name):
    assert name in F.__all__ and callable(getattr(F, name))
    try:
        theirs = inspect.signature(getattr(TF, name))
    except (TypeError, ValueError):
        pytest.skip(f"torch's {name} has no inspectable signature")
    if list(theirs.parameters) in (["args", "kwargs"], []):
        pytest.skip(f"torch's {name} dispatches on its arguments (*args, **kwargs)")
    ours = inspect.signature(getattr(F, name))
    assert [(p.name, p.default) for p in ours.parameters.values()] == \
        [(p.name, p.default) for p in theirs.parameters.values()]


@pytest.mark.parametrize("name,kwargs", [("elu", {"alpha": 0.5}), ("leaky_relu", {"negative_slope": 0.2}),
                                         ("hardswish", {})])
def test_inplace_argument(name, kwargs, rng):
    x = _r(rng, 3, 4) * 4
    t = st.tensor(x)
    assert getattr(F, name)(t, inplace=True, **kwargs) is t
    golden(lambda a: getattr(F, name)(a * 1, inplace=True, **kwargs),
           lambda a: getattr(TF, name)(a * 1, inplace=True, **kwargs), x)


@pytest.mark.parametrize("call", [
    lambda: F.hardswish(np.ones(3)), lambda: F.smooth_l1_loss(np.ones(3), st.ones(3)),
    lambda: F.huber_loss(st.ones(3), [1.0, 2.0, 3.0]), lambda: F.kl_div(np.ones(3), st.ones(3)),
    lambda: F.dropout1d(np.ones((2, 3))), lambda: F.dropout2d(np.ones((2, 3, 4, 4))),
    lambda: F.embedding([0, 1], st.ones(3, 2)), lambda: F.avg_pool1d(np.ones((1, 2, 4)), 2),
    lambda: F.max_pool1d(np.ones((1, 2, 4)), 2), lambda: F.adaptive_max_pool2d(np.ones((1, 2, 4, 4)), 2),
])
def test_non_tensor_arguments_raise_type_error(call):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(TypeError, match="must be Tensor"):
            call()

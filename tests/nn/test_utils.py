"""nn.utils against torch.nn.utils: clip_grad_norm_ (every norm type, clipping and not), clip_grad_value_,
parameters_to_vector / vector_to_parameters."""
import math

import numpy as np
import pytest
import torch

import smalltrain as st
from smalltrain import nn
from smalltrain.nn import utils
from smalltrain.testing import assert_close

SHAPES = [(4, 3), (3,), (2, 2, 3)]


def _params(device, scale=1.0, nan=False):
    rng = np.random.default_rng(0)
    grads = [(rng.standard_normal(s) * scale).astype(np.float32) for s in SHAPES]
    if nan:
        grads[1][0] = np.nan
    ours, theirs = [], []
    for g in grads:
        p = nn.Parameter(st.zeros(*g.shape, device=device))
        p.grad = st.tensor(g, device=device)
        q = torch.nn.Parameter(torch.zeros(*g.shape))
        q.grad = torch.tensor(g)
        ours.append(p), theirs.append(q)
    return ours, theirs


@pytest.mark.parametrize("norm_type", [2.0, 1, 3.5, 0.5, math.inf, -math.inf, 0, "inf"])
@pytest.mark.parametrize("max_norm", [0.5, 1e3])  # clipping, and a no-op coefficient of 1
def test_clip_grad_norm_equals_torch(norm_type, max_norm, device):
    ours, theirs = _params(device)
    nt = float(norm_type)
    total_s = utils.clip_grad_norm_(ours, max_norm, norm_type=nt)
    total_t = torch.nn.utils.clip_grad_norm_(theirs, max_norm, norm_type=nt)
    assert isinstance(total_s, st.Tensor) and total_s.shape == () and total_s.dtype == st.float32
    assert_close(total_s, total_t)
    for p, q in zip(ours, theirs):
        assert_close(p.grad, q.grad)


def test_clip_grad_norm_single_tensor_none_grads_and_empty():
    p = nn.Parameter(st.zeros(3))
    p.grad = st.tensor([3.0, 4.0, 0.0])
    q = nn.Parameter(st.zeros(2))  # no grad: skipped
    assert_close(utils.clip_grad_norm_([p, q], 1.0), np.float32(5.0))
    assert_close(p.grad, np.array([0.6, 0.8, 0.0]), rtol=1e-5)
    p.grad = st.tensor([3.0, 4.0, 0.0])
    assert_close(utils.clip_grad_norm_(p, 10.0), np.float32(5.0))
    assert_close(p.grad, np.array([3.0, 4.0, 0.0]))
    assert utils.clip_grad_norm_([q], 1.0).item() == torch.nn.utils.clip_grad_norm_([], 1.0).item() == 0.0


def test_clip_grad_norm_nonfinite(device):
    ours, theirs = _params(device, nan=True)
    with pytest.raises(RuntimeError, match="is non-finite, so it cannot be clipped"):
        torch.nn.utils.clip_grad_norm_(theirs, 1.0, error_if_nonfinite=True)
    with pytest.raises(RuntimeError, match="is non-finite, so it cannot be clipped"):
        utils.clip_grad_norm_(ours, 1.0, error_if_nonfinite=True)
    total_s = utils.clip_grad_norm_(ours, 1.0)  # without the check, NaN propagates as in torch
    total_t = torch.nn.utils.clip_grad_norm_(theirs, 1.0)
    assert math.isnan(total_s.item()) and math.isnan(total_t.item())
    for p, q in zip(ours, theirs):
        assert_close(p.grad, q.grad)


def test_clip_grad_norm_keeps_grad_arrays():
    ours, _ = _params("cpu", scale=10.0)
    arrays = [p.grad.array for p in ours]
    utils.clip_grad_norm_(ours, 1.0)
    assert all(p.grad.array is a for p, a in zip(ours, arrays))  # in place: DDP bucket views stay bound


@pytest.mark.parametrize("clip", [0.3, 2.0])
def test_clip_grad_value_equals_torch(clip, device):
    ours, theirs = _params(device)
    assert utils.clip_grad_value_(ours, clip) is None
    torch.nn.utils.clip_grad_value_(theirs, clip)
    for p, q in zip(ours, theirs):
        assert_close(p.grad, q.grad)


def test_parameters_to_vector_and_back_equal_torch():
    ours, theirs = nn.Linear(3, 2), torch.nn.Linear(3, 2)
    theirs.load_state_dict({k: torch.tensor(np.array(v)) for k, v in ours.state_dict().items()})
    vec_s = utils.parameters_to_vector(ours.parameters())
    vec_t = torch.nn.utils.parameters_to_vector(theirs.parameters())
    assert_close(vec_s, vec_t.detach())
    g = np.arange(8, dtype=np.float32)
    (vec_s * st.tensor(g)).sum().backward()  # differentiable, as torch's
    (vec_t * torch.tensor(g)).sum().backward()
    assert_close(ours.weight.grad, theirs.weight.grad) and assert_close(ours.bias.grad, theirs.bias.grad)
    new = np.linspace(-1, 1, 8).astype(np.float32)
    weight = ours.weight
    utils.vector_to_parameters(st.tensor(new), ours.parameters())
    torch.nn.utils.vector_to_parameters(torch.tensor(new), theirs.parameters())
    assert ours.weight is weight
    assert_close(ours.weight, theirs.weight.detach()) and assert_close(ours.bias, theirs.bias.detach())
    with pytest.raises(TypeError, match="expected .*Tensor, but got: numpy.ndarray"):
        utils.vector_to_parameters(new, ours.parameters())
    with pytest.raises(TypeError, match="expected torch.Tensor, but got: numpy.ndarray"):
        torch.nn.utils.vector_to_parameters(new, theirs.parameters())
    with pytest.raises(RuntimeError):
        utils.vector_to_parameters(st.zeros(5), ours.parameters())

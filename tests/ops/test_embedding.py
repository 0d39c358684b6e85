"""Golden tests of smalltrain/ops/embedding.py against torch: lookups of any index shape, repeated indices (their
gradients sum), padding_idx, scale_grad_by_freq, max_norm's in-place renormalization, errors, float64 gradcheck."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import smalltrain as st
from smalltrain.ops.embedding import embedding
from smalltrain.testing import assert_close, golden, gradcheck

IDX = np.array([[0, 2, 5, 2], [2, 2, 1, 0]])   # repeats, and rows 3 and 4 never looked up

# id, index array, kwargs
CASES = [
    ("plain", IDX, {}),
    ("padding", IDX, {"padding_idx": 2}),
    ("padding_negative", IDX, {"padding_idx": -1}),
    ("freq", IDX, {"scale_grad_by_freq": True}),
    ("freq_padding", IDX, {"scale_grad_by_freq": True, "padding_idx": 0}),
    ("vector", np.array([4, 1, 1]), {}),
    ("scalar", np.array(3), {}),
    ("int32", IDX.astype(np.int32), {}),
    ("empty", np.zeros((0, 3), np.int64), {}),
    ("3d", np.arange(24).reshape(2, 3, 4) % 6, {}),
    ("noncontig", IDX.T, {}),
]


@pytest.mark.parametrize("name,idx,kw", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_embedding_golden(name, idx, kw, dtype, device, rng):
    w = rng.standard_normal((6, 4)).astype(dtype)
    golden(lambda a, b: embedding(b, a, **kw), lambda a, b: TF.embedding(b, a, **kw), w, idx, device=device)


def test_embedding_values_pass_through_unchanged(device):
    w = np.array([[np.nan, np.inf], [-np.inf, -0.0], [1e30, 2.0]], np.float32)
    golden(lambda a, b: embedding(b, a), lambda a, b: TF.embedding(b, a), w, np.array([2, 0, 1, 0]), device=device)


@pytest.mark.parametrize("kw", [{"max_norm": 1.0}, {"max_norm": 0.5, "norm_type": 1.0},
                                {"max_norm": 0.7, "norm_type": float("inf")}, {"max_norm": 100.0}],
                         ids=["l2", "l1", "linf", "none_over"])
def test_max_norm_renormalizes_looked_up_rows_in_place(kw, device, rng):
    w = rng.standard_normal((6, 4)).astype(np.float32) * 2
    ours, theirs = st.tensor(w, device=device, requires_grad=True), torch.tensor(w, requires_grad=True)
    out_s = embedding(st.tensor(IDX, device=device), ours, **kw)
    out_t = TF.embedding(torch.tensor(IDX), theirs, **kw)
    assert_close(out_s, out_t)
    assert_close(ours.detach(), theirs.detach())     # rows 3 and 4, never looked up, are left as they were
    g = rng.standard_normal(out_t.shape).astype(np.float32)
    (out_s * st.tensor(g, device=device)).sum().backward()
    (out_t * torch.tensor(g)).sum().backward()
    assert_close(ours.grad, theirs.grad)


ERRORS = [
    # (weight shape, index, kwargs, exception type torch raises, our message)
    ((6, 4), np.array([0, 6]), {}, IndexError, "index out of range in self"),
    ((6, 4), np.array([-1, 2]), {}, IndexError, "index out of range in self"),
    ((6, 4), np.array([0.0, 1.0]), {}, RuntimeError, "Expected tensor for argument #1 'indices'.*Long, Int"),
    ((6,), np.array([0, 1]), {}, RuntimeError, "'weight' must be 2-D"),
    ((6, 4), np.array([0, 1]), {"padding_idx": 6}, AssertionError, "Padding_idx must be within num_embeddings"),
    ((6, 4), np.array([0, 1]), {"padding_idx": -7}, AssertionError, "Padding_idx must be within num_embeddings"),
]


@pytest.mark.parametrize("shape,idx,kw,exc,match", ERRORS)
def test_errors_raise_torchs_type(shape, idx, kw, exc, match):
    w = np.zeros(shape, np.float32)
    with pytest.raises(exc):
        TF.embedding(torch.tensor(idx), torch.tensor(w), **kw)
    with pytest.raises(exc, match=match):
        embedding(st.tensor(idx), st.tensor(w), **kw)


def test_sparse_and_non_tensor_refused_clearly():
    with pytest.raises(NotImplementedError, match="sparse=True"):
        embedding(st.tensor([0, 1]), st.randn(3, 2), sparse=True)
    with pytest.raises(TypeError, match="must be Tensor"):
        embedding([0, 1], st.randn(3, 2))


# padding_idx's row (and scale_grad_by_freq) are defined away from the derivative: the checked padding row is unused
@pytest.mark.parametrize("kw", [{}, {"padding_idx": 2}])
def test_gradcheck(kw, device, rng):
    w = st.tensor(rng.standard_normal((5, 3)), device=device, requires_grad=True)
    idx = st.tensor(np.array([[1, 4, 1], [0, 1, 3]]), device=device)
    assert gradcheck(lambda t: embedding(idx, t, **kw), (w,))

"""Tests of smalltrain/ops/dropout.py: keep rate and scaling statistics, gradient = mask * scale, reproducibility
under manual_seed, eval/p=0 identity, p=1, in-place semantics, torch's errors, float64 gradcheck; and the same for
the channel dropouts (dropout1d, dropout2d), with torch's warnings for the ranks dropout2d does not expect."""
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import smalltrain as st
from smalltrain.ops.dropout import dropout, dropout1d, dropout2d
from smalltrain.testing import assert_close, gradcheck


def _host(t):
    a = t.array
    return a if isinstance(a, np.ndarray) else a.get()


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
@pytest.mark.parametrize("dtype", [st.float32, st.float64])
def test_keep_rate_scaling_and_gradient(p, dtype, device):
    n = 100_000
    x = st.full((n,), 2.0, dtype=dtype, device=device, requires_grad=True)
    y = dropout(x, p)
    out = _host(y)
    kept = out != 0
    # the kept fraction is Binomial(n, 1 - p)/n: 6 standard deviations is far beyond chance
    assert abs(kept.mean() - (1 - p)) < 6 * np.sqrt(p * (1 - p) / n)
    assert y.dtype == dtype
    np.testing.assert_array_equal(out[kept], np.asarray(2.0 / (1 - p), out.dtype))
    g = np.random.default_rng(0).standard_normal(n).astype(out.dtype)
    y.backward(st.tensor(g, device=device))
    np.testing.assert_allclose(_host(x.grad), g * kept / (1 - p), rtol=1e-6)


def test_matches_torch_given_the_same_mask(rng):
    # torch's formula x * bernoulli(1 - p) / (1 - p): recover our mask and apply torch's arithmetic to it
    x = rng.standard_normal((4, 6)).astype(np.float32)
    y = dropout(st.tensor(x), 0.3)
    mask = torch.tensor(y.array != 0, dtype=torch.float32)
    assert_close(y, torch.tensor(x) * mask.div_(1 - 0.3))


def test_reproducible_under_manual_seed(device):
    x = st.ones(64, 32, device=device)
    st.manual_seed(7)
    a = _host(dropout(x, 0.5))
    st.manual_seed(7)
    b = _host(dropout(x, 0.5))
    c = _host(dropout(x, 0.5))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(b, c)


def test_eval_and_p0_return_the_input_itself(device):
    x = st.randn(3, 4, device=device, requires_grad=True)
    assert dropout(x, 0.5, training=False) is x
    assert dropout(x, 0.0) is x
    ints = st.tensor([1, 2, 3], device=device)
    assert dropout(ints, 0.5, training=False) is ints
    empty = st.zeros(0, 3, device=device)
    assert dropout(empty, 0.5) is empty


def test_p1_gives_zeros_and_keeps_nan_like_torch(device):
    x = st.tensor([1.0, -2.0, float("nan")], device=device, requires_grad=True)
    y = dropout(x, 1.0)
    assert_close(y, TF.dropout(torch.tensor([1.0, -2.0, float("nan")]), 1.0))
    y.sum().backward()
    np.testing.assert_array_equal(_host(x.grad), [0.0, 0.0, 0.0])


def test_inplace(rng):
    x = st.tensor(rng.standard_normal((50, 40)).astype(np.float32))
    before = x.array.copy()
    out = dropout(x, 0.5, inplace=True)
    assert out is x
    kept = x.array != 0
    np.testing.assert_allclose(x.array[kept], before[kept] * 2, rtol=1e-6)
    leaf = st.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable"):
        dropout(leaf, 0.5, inplace=True)
    h = leaf * 1.0   # a non-leaf while recording: rebound to the recorded result, gradients stay right
    y = dropout(h, 0.5, inplace=True)
    assert y is h
    y.sum().backward()
    np.testing.assert_allclose(leaf.grad.array, (y.array != 0) * 2.0, rtol=1e-6)


@pytest.mark.parametrize("call,exc,match", [
    (lambda: dropout(st.randn(3), 1.5), ValueError, "between 0 and 1, but got 1.5"),
    (lambda: dropout(st.randn(3), -0.1), ValueError, "between 0 and 1, but got -0.1"),
    (lambda: dropout(st.tensor([1, 2]), 0.5), RuntimeError, "can't be cast"),
])
def test_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_torch_raises_the_same_types():
    with pytest.raises(ValueError):
        TF.dropout(torch.randn(3), 1.5)
    with pytest.raises(RuntimeError):
        TF.dropout(torch.tensor([1, 2]), 0.5)


def test_gradcheck(device, rng):
    def fn(t):
        st.manual_seed(3)   # the same mask on every evaluation
        return dropout(t, 0.4)
    x = st.tensor(rng.standard_normal((4, 5)), dtype=st.float64, device=device, requires_grad=True)
    assert gradcheck(fn, (x,))


# ---- channel dropout ------------------------------------------------------------------------------------------

CHANNEL_CASES = [
    # (op, input shape, shape of one draw per channel: the mask is constant over the other dims)
    ("dropout1d", (40, 50, 3), (40, 50, 1)),
    ("dropout1d", (2000, 3), (2000, 1)),            # unbatched [C, L]
    ("dropout2d", (40, 50, 3, 2), (40, 50, 1, 1)),
    ("dropout2d", (40, 50, 3), (40, 50, 1)),        # 3-D: read as [N, C, L] (with a warning), as torch
    ("dropout2d", (40, 50), (40, 50)),              # 2-D: warns, then drops input[n, c], as torch
]


@pytest.mark.filterwarnings("ignore:dropout2d")
@pytest.mark.parametrize("op,shape,draws", CHANNEL_CASES)
@pytest.mark.parametrize("p", [0.3, 0.8])
def test_channel_dropout_masks_whole_channels(op, shape, draws, p, device):
    fn = {"dropout1d": dropout1d, "dropout2d": dropout2d}[op]
    x = st.full(shape, 3.0, device=device, requires_grad=True)
    y = fn(x, p)
    out = _host(y)
    per_channel = out.reshape(draws + (-1,))
    assert (per_channel == per_channel[..., :1]).all()   # one decision per channel
    kept = out != 0
    n = int(np.prod(draws))
    assert abs(per_channel[..., 0].astype(bool).mean() - (1 - p)) < 6 * np.sqrt(p * (1 - p) / n)
    np.testing.assert_array_equal(out[kept], np.float32(3.0 / (1 - p)))
    g = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    y.backward(st.tensor(g, device=device))
    np.testing.assert_allclose(_host(x.grad), g * kept / (1 - p), rtol=1e-6)


def test_channel_dropout_reproducible_under_manual_seed(device):
    x = st.ones(64, 32, 3, device=device)
    st.manual_seed(11)
    a = _host(dropout1d(x, 0.5))
    st.manual_seed(11)
    b = _host(dropout1d(x, 0.5))
    c = _host(dropout1d(x, 0.5))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(b, c)


def test_channel_dropout_matches_torch_given_the_same_mask(rng):
    x = rng.standard_normal((3, 4, 2, 5)).astype(np.float32)
    y = dropout2d(st.tensor(x), 0.4)
    mask = torch.tensor(y.array[:, :, :1, :1] != 0, dtype=torch.float32)
    assert_close(y, torch.tensor(x) * mask.div_(1 - 0.4))


@pytest.mark.parametrize("fn", [dropout1d, dropout2d])
def test_channel_dropout_identity_p1_and_inplace(fn, device, rng):
    x = st.randn(2, 3, 4, device=device, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert fn(x, 0.5, training=False) is x and fn(x, 0.0) is x
        empty = st.zeros(0, 3, 4, device=device)
        assert fn(empty, 0.5) is empty
        nan = st.tensor([[[1.0, float("nan")]]], device=device)
        assert_close(fn(nan, 1.0), torch.tensor([[[0.0, float("nan")]]]))
        t = st.tensor(rng.standard_normal((6, 5, 4)).astype(np.float32), device=device)
        before = _host(t).copy()
        assert fn(t, 0.5, inplace=True) is t
        kept = _host(t) != 0
        np.testing.assert_allclose(_host(t)[kept], before[kept] * 2, rtol=1e-6)


@pytest.mark.parametrize("shape,match", [((2, 3), "Received a 2-D input"), ((2, 3, 4), "Received a 3D input"),
                                         ((2, 3, 4, 5, 6), "Received a 5-D input")])
def test_dropout2d_warns_like_torch(shape, match):
    with pytest.warns(UserWarning, match=match):
        dropout2d(st.ones(*shape), 0.5)
    with pytest.warns(UserWarning, match=match):
        TF.dropout2d(torch.ones(*shape), 0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dropout2d(st.ones(2, 3, 4, 5), 0.5)


CHANNEL_ERRORS = [
    # (ours, torch's, exception type torch raises, our message)
    (lambda: dropout1d(st.ones(2, 3, 4, 5)), lambda: TF.dropout1d(torch.ones(2, 3, 4, 5)), RuntimeError,
     "Expected 2D or 3D input, but received a 4D input"),
    (lambda: dropout1d(st.ones(3)), lambda: TF.dropout1d(torch.ones(3)), RuntimeError, "received a 1D input"),
    (lambda: dropout2d(st.ones(3)), lambda: TF.dropout2d(torch.ones(3)), RuntimeError,
     "requires at least 2 dimensions"),
    (lambda: dropout2d(st.ones(2, 3), 1.5), lambda: TF.dropout2d(torch.ones(2, 3), 1.5), ValueError,
     "between 0 and 1, but got 1.5"),
    (lambda: dropout1d(st.ones(2, 3), -0.5), lambda: TF.dropout1d(torch.ones(2, 3), -0.5), ValueError,
     "between 0 and 1, but got -0.5"),
    (lambda: dropout2d(st.tensor([[[1, 2]]]), 0.5), lambda: TF.dropout2d(torch.tensor([[[1, 2]]]), 0.5), RuntimeError,
     "can't be cast"),
]


@pytest.mark.filterwarnings("ignore:dropout2d")
@pytest.mark.parametrize("ours,theirs,exc,match", CHANNEL_ERRORS)
def test_channel_dropout_errors_raise_torchs_type(ours, theirs, exc, match):
    with pytest.raises(exc):
        theirs()
    with pytest.raises(exc, match=match):
        ours()


def test_channel_dropout_gradcheck(device, rng):
    def fn(t):
        st.manual_seed(5)
        return dropout2d(t, 0.5)
    x = st.tensor(rng.standard_normal((3, 4, 2, 2)), dtype=st.float64, device=device, requires_grad=True)
    assert gradcheck(fn, (x,))

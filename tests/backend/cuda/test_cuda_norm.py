"""CUDA batch norm (backend/cuda/norm.py) against torch float64 on the CPU."""
import cuda_reference as ref
import numpy as np
import pytest

import smalltrain
from smalltrain.backend.cuda import cupy, ops
from smalltrain.testing import assert_close

GPU = smalltrain.cuda.is_available()
cp = cupy() if GPU else None
gpu = pytest.mark.skipif(not GPU, reason="no CUDA device")
DTYPES = [np.float32, np.float64]


def g(a):
    return cp.asarray(a)


# ((shape), affine, track running stats); the last two are wide enough to split a channel over several blocks
# (norm.py split: [6, 3, 24, 24] in 4 slices, [3000, 2] in 3), the partials combined by the last block
BN_CASES = [((6, 5), True, True), ((4, 3, 7, 9), True, True), ((2, 4, 33), False, True), ((4, 3, 7, 9), True, False),
            ((5, 2, 3), False, False), ((6, 3, 24, 24), True, True), ((3000, 2), False, True)]
ACTS = {None: lambda t: t, "relu": lambda t: t.relu(),
        "gelu": lambda t: __import__("torch").nn.functional.gelu(t),
        "gelu_tanh": lambda t: __import__("torch").nn.functional.gelu(t, approximate="tanh")}


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("case", BN_CASES)
@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
def test_batch_norm(case, training, dtype, activation, rng):
    torch = pytest.importorskip("torch")
    shape, affine, track = case
    if not training and not track:
        pytest.skip("eval mode needs running statistics")
    c = shape[1]
    x = (rng.standard_normal(shape) * 2 + 1).astype(dtype)
    w, b = ((rng.standard_normal(c).astype(dtype), rng.standard_normal(c).astype(dtype)) if affine else (None, None))
    rm, rv = ((rng.standard_normal(c).astype(dtype), (rng.random(c) + 0.5).astype(dtype)) if track else (None, None))
    grm, grv = (g(rm), g(rv)) if track else (None, None)
    y, saved = ops.batch_norm_forward(g(x), grm, grv, None if w is None else g(w), None if b is None else g(b),
                                      training, 0.1, 1e-5, activation=activation)
    ry, rrm, rrv = ref.batch_norm(x, rm, rv, w, b, training, 0.1, 1e-5)
    tol = ref.tol(dtype)
    assert_close(y, ACTS[activation](torch.tensor(ry)), tol, name="batch_norm forward")
    if track:
        assert_close(grm, rrm, tol, name="running_mean")
        assert_close(grv, rrv, tol, name="running_var")
    t64 = lambda a: None if a is None else torch.tensor(a.astype(np.float64), requires_grad=True)  # noqa: E731
    tx, tw, tb = t64(x), t64(w), t64(b)
    ty = torch.nn.functional.batch_norm(tx, None if rm is None else torch.tensor(rm.astype(np.float64)),
                                        None if rv is None else torch.tensor(rv.astype(np.float64)), tw, tb,
                                        training, 0.1, 1e-5)
    dout = rng.standard_normal(shape).astype(dtype)
    ACTS[activation](ty).backward(torch.tensor(dout.astype(np.float64)))
    dx, dw, db = ops.batch_norm_backward(g(dout), saved)
    assert_close(dx, tx.grad, tol, name="batch_norm dx")
    if affine:
        assert_close(dw, tw.grad, tol, name="batch_norm dweight")
        assert_close(db, tb.grad, tol, name="batch_norm dbias")
    else:
        assert dw is None
    if training:   # dx alone, and the sums alone, as the op asks for them
        dx_only = ops.batch_norm_backward(g(dout), saved, needs_input_grad=(True, False, False))
        assert_close(dx_only[0], tx.grad, tol, name="batch_norm dx alone")
        assert dx_only[1:] == (None, None)
        if affine:
            sums = ops.batch_norm_backward(g(dout), saved, needs_input_grad=(False, True, True))
            assert sums[0] is None
            assert_close(sums[2], tb.grad, tol, name="batch_norm dbias alone")


@gpu
def test_batch_norm_splits_wide_channels_and_leaves_the_counters_at_zero():
    from smalltrain.backend.cuda import norm
    assert norm.split(3, 6 * 24 * 24)[0] > 1 and norm.split(3, 252)[0] == 1
    tickets = norm._slices(3, 6 * 24 * 24)[3]   # the counters the split launches take
    x = cp.asarray(np.random.default_rng(0).standard_normal((6, 3, 24, 24)).astype(np.float32))
    for _ in range(2):   # the second launch finds the tickets the first one reset
        y, saved = ops.batch_norm_forward(x, None, None)
        ops.batch_norm_backward(cp.ones_like(y), saved)
        assert int(tickets.sum()) == 0
    assert_close(y.mean(axis=(0, 2, 3)), np.zeros(3), 1e-5, name="normalized mean")


@gpu
def test_batch_norm_errors():
    x = cp.ones((1, 3), cp.float32)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        ops.batch_norm_forward(x, None, None)
    with pytest.raises(RuntimeError, match="shape"):
        ops.batch_norm_forward(cp.ones((4, 3), cp.float32), cp.zeros(2, cp.float32), cp.ones(2, cp.float32))
    with pytest.raises(RuntimeError, match="evaluation mode"):
        ops.batch_norm_forward(cp.ones((4, 3), cp.float32), None, None, training=False)

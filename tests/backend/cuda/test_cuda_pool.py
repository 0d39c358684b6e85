"""CUDA pooling (backend/cuda/pool.py) against torch float64 on the CPU; the pooling backward with the
activation's derivative by windows and by gathering."""
import cuda_reference as ref
import numpy as np
import pytest

import smalltrain
from smalltrain.backend.cuda import cupy, ops
from smalltrain.backend.cuda import pool as pool_kernels
from smalltrain.testing import assert_close

GPU = smalltrain.cuda.is_available()
cp = cupy() if GPU else None
gpu = pytest.mark.skipif(not GPU, reason="no CUDA device")
DTYPES = [np.float32, np.float64]


def g(a):
    return cp.asarray(a)


MAX_POOL_CASES = [  # x shape, kernel, stride, padding, dilation, ceil_mode, with a NaN
    ((2, 3, 11, 9), 2, None, 0, 1, False, False),
    ((2, 3, 11, 9), 3, 2, 1, 1, True, False),
    ((2, 2, 13, 10), 3, (2, 1), (1, 0), (2, 1), False, False),
    ((1, 4, 9, 9), 2, 2, 0, 1, True, False),
    ((3, 7, 8), (3, 2), (2, 2), (1, 1), 1, False, True),
]


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", MAX_POOL_CASES)
def test_max_pool2d(case, dtype, rng):
    torch = pytest.importorskip("torch")
    shape, kernel, stride, padding, dilation, ceil_mode, nan = case
    x = rng.standard_normal(shape).astype(dtype)
    if nan:
        x.reshape(-1)[[5, 17, 18]] = np.nan
    out, idx, saved = ops.max_pool2d_forward(g(x), kernel, stride, padding, dilation, ceil_mode)
    tx = torch.tensor(x.astype(np.float64), requires_grad=True)
    tout, tidx = torch.nn.functional.max_pool2d(tx, kernel, stride, padding, dilation, ceil_mode, return_indices=True)
    assert_close(out, tout.detach(), ref.tol(dtype), name="max_pool2d forward")
    np.testing.assert_array_equal(idx.get(), tidx.numpy())
    dout = rng.standard_normal(tuple(tout.shape)).astype(dtype)
    tout.backward(torch.tensor(dout.astype(np.float64)))
    assert_close(ops.max_pool2d_backward(g(dout), saved), tx.grad, ref.tol(dtype), name="max_pool2d dx")


AVG_POOL_CASES = [  # x shape, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override
    ((2, 3, 11, 9), 3, 2, 1, True, True, None),
    ((2, 3, 11, 9), 3, 2, 1, True, False, None),
    ((2, 3, 10, 7), 2, None, 0, False, True, None),
    ((1, 2, 9, 12), (3, 2), (2, 1), (1, 1), False, False, None),
    ((4, 7, 7), 3, 1, 1, False, True, 5),
]


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", AVG_POOL_CASES)
def test_avg_pool2d(case, dtype, rng):
    torch = pytest.importorskip("torch")
    shape, kernel, stride, padding, ceil_mode, cip, divisor = case
    x = rng.standard_normal(shape).astype(dtype)
    out, saved = ops.avg_pool2d_forward(g(x), kernel, stride, padding, ceil_mode, cip, divisor)
    tx = torch.tensor(x.astype(np.float64), requires_grad=True)
    tout = torch.nn.functional.avg_pool2d(tx, kernel, stride, padding, ceil_mode, cip, divisor)
    assert_close(out, tout.detach(), ref.tol(dtype), name="avg_pool2d forward")
    dout = rng.standard_normal(tuple(tout.shape)).astype(dtype)
    tout.backward(torch.tensor(dout.astype(np.float64)))
    assert_close(ops.avg_pool2d_backward(g(dout), saved), tx.grad, ref.tol(dtype), name="avg_pool2d dx")


@gpu
@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,pool", [((4, 6, 24, 24), (2, 2, 0)), ((3, 16, 8, 8), (2, 2, 0)),   # LeNet-5's
                                        ((2, 3, 9, 12), (3, 3, 0)), ((2, 3, 9, 10), (2, 2, 0)),    # 9 rows: gather
                                        ((2, 3, 8, 8), (3, 2, 1))])                                 # overlapping
def test_pool_backward_act_by_windows_equals_the_gather(shape, pool, activation, dtype, rng, record_kernels):
    """Where the windows tile the input, max_pool2d_backward_act runs a thread per window (the tiled kernel). The
    same pooling with one more input row, in no window, runs the gather kernel: bit-equal on the rows both have
    (ties and the activation's derivative included). Elsewhere the gather runs."""
    n, c, h, w = shape
    x = rng.standard_normal(shape).astype(dtype)
    x[..., ::3, ::2] = x[..., 1::3, ::2][..., : x[..., ::3, ::2].shape[-2], :]   # equal values: ties in windows
    yh = rng.standard_normal((c, n * h * w)).astype(dtype)
    # two windows whose maximum's pre-activation is not finite (NaN, +inf), where the others' are read too
    # (common.cuh pooled_act_grad): the NaNs and infs around them as the gather gives them
    x[0, 0, 1, 1] = x[0, 0, 0, 3] = 1e30
    for (r, col), v in (((1, 1), np.nan), ((0, 0), np.inf), ((0, 1), -np.inf), ((0, 3), np.inf), ((1, 2), np.nan)):
        yh[0, r * w + col] = v
    bias = g(rng.standard_normal(c).astype(dtype))
    k, s, p = pool
    names = record_kernels(pool_kernels, "launch")

    def backward_act(x, y):
        pooled, _, saved = ops.max_pool2d_forward(g(x), k, s, p)
        dpool = g(np.random.default_rng(5).standard_normal(pooled.shape).astype(dtype))
        return ops.max_pool2d_backward_act(dpool, saved, g(y) if activation else None, bias, activation)
    got = backward_act(x, yh)
    launched = [name for name in names if "bwd_act" in name]
    exact = k == s and p == 0 and h % k == 0 and w % k == 0
    assert launched == ["max_pool2d_bwd_act_tiled" if exact else "max_pool2d_bwd_act"]
    assert bool(cp.isnan(got).any()) == (activation == "gelu")   # ReLU's derivative passes or zeroes a NaN
    if exact:
        taller = np.concatenate([x, np.full((n, c, 1, w), -np.inf, dtype)], axis=2)   # a row in no window
        ytaller = np.concatenate([yh.reshape(c, n, h, w), np.ones((c, n, 1, w), dtype)], axis=2).reshape(c, -1)
        gathered = backward_act(taller, ytaller)
        assert [name for name in names if "bwd_act" in name][1:] == ["max_pool2d_bwd_act"]
        gathered = gathered.reshape(c, n, h + 1, w)[:, :, :h].reshape(c, -1)
        assert cp.array_equal(got, gathered, equal_nan=True)


@gpu
@pytest.mark.parametrize("kwargs, exc, msg", [
    ({"kernel_size": 3, "padding": 2}, RuntimeError, "half of effective kernel size"),
    ({"kernel_size": 0}, RuntimeError, "kernel_size"),
    ({"kernel_size": 2, "stride": 0}, RuntimeError, "stride"),
    ({"kernel_size": 9}, RuntimeError, "Output size is too small"),
])
def test_pool_errors(kwargs, exc, msg):
    x = cp.ones((1, 2, 5, 5), dtype=cp.float32)
    with pytest.raises(exc, match=msg):
        ops.max_pool2d_forward(x, **kwargs)
    with pytest.raises(exc, match=msg):
        ops.avg_pool2d_forward(x, **kwargs)
    with pytest.raises(RuntimeError, match="divisor must be not zero"):
        ops.avg_pool2d_forward(x, 2, divisor_override=0)


def test_pool_tiles_exactly():
    """pool._tiles_exactly, the tiled max_pool2d_backward_act's rule (no GPU needed): kernel == stride, no padding
    or dilation, every input row and column in a window, 32-bit indices."""
    from smalltrain.backend.cuda import pool
    assert pool._tiles_exactly((64, 6, 24, 24), (2, 2), (2, 2), (0, 0), (1, 1), (12, 12))     # LeNet-5's
    assert pool._tiles_exactly((2, 3, 9, 12), (3, 3), (3, 3), (0, 0), (1, 1), (3, 4))
    assert not pool._tiles_exactly((2, 3, 9, 10), (2, 2), (2, 2), (0, 0), (1, 1), (4, 5))      # a row left over
    assert not pool._tiles_exactly((2, 3, 8, 8), (3, 3), (2, 2), (1, 1), (1, 1), (4, 4))       # overlapping
    assert not pool._tiles_exactly((2, 3, 8, 8), (2, 2), (2, 2), (0, 0), (2, 2), (2, 2))       # dilated
    assert not pool._tiles_exactly((2 ** 16, 64, 32, 32), (2, 2), (2, 2), (0, 0), (1, 1), (16, 16))   # 2^32 inputs

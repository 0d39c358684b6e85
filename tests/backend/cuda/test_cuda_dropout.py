"""CUDA dropout (backend/cuda/dropout.py), bit-exact against a NumPy Philox4x32-10, and that reference against
Random123's known-answer vectors."""
import cuda_reference as ref
import numpy as np
import pytest

import smalltrain
from smalltrain.backend.cuda import cupy, ops

GPU = smalltrain.cuda.is_available()
cp = cupy() if GPU else None
gpu = pytest.mark.skipif(not GPU, reason="no CUDA device")
DTYPES = [np.float32, np.float64]


def g(a):
    return cp.asarray(a)


@gpu
def test_dropout_mask_matches_philox_reference():
    n, p, seed, offset = 10007, 0.3, 2 ** 40 + 12345, 2 ** 33 + 3
    mask = ops.dropout_mask((n,), p, seed=seed, offset=offset)
    np.testing.assert_array_equal(mask.get(), ref.dropout_mask(n, p, seed, offset))


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_dropout_forward_backward(dtype, rng):
    x = rng.standard_normal((37, 29)).astype(dtype)
    p, seed, offset = 0.4, 99, 5
    state = ops.dropout_state(seed, offset)
    out, saved = ops.dropout_forward(g(x), p, state=state)
    keep = ref.dropout_mask(x.size, p, seed, offset).reshape(x.shape).astype(bool)
    scale = dtype(1 / (1 - p))
    np.testing.assert_array_equal(out.get(), np.where(keep, x * scale, 0))
    state[1] += 1  # the caller advancing its state must not change what backward regenerates
    dout = rng.standard_normal(x.shape).astype(dtype)
    np.testing.assert_array_equal(ops.dropout_backward(g(dout), saved).get(), np.where(keep, dout * scale, 0))
    assert abs((1 - keep.mean()) - p) < 5 * np.sqrt(p * (1 - p) / x.size)


@gpu
def test_dropout_reproducible_edges_and_errors(rng):
    x = g(rng.standard_normal(1001).astype(np.float32))
    a, _ = ops.dropout_forward(x, 0.5, seed=7, offset=0)
    b, _ = ops.dropout_forward(x, 0.5, seed=7, offset=0)
    c, _ = ops.dropout_forward(x, 0.5, seed=7, offset=1)
    assert cp.array_equal(a, b) and not cp.array_equal(a, c)
    assert cp.array_equal(ops.dropout_forward(x, 0.0, seed=1)[0], x)
    assert not ops.dropout_forward(x, 1.0, seed=1)[0].any()
    same, saved = ops.dropout_forward(x, 0.5, training=False)
    assert same is x and saved is None
    with pytest.raises(ValueError, match="between 0 and 1"):
        ops.dropout_forward(x, 1.5, seed=1)
    with pytest.raises(RuntimeError, match="uint64"):
        ops.dropout_forward(x, 0.5, state=cp.zeros(2, cp.int64))


@pytest.mark.parametrize("ctr, key, want", [
    ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    ([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
    ([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0],
     [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]),
])
def test_philox_reference_known_answers(ctr, key, want):
    out = ref.philox4x32_10([np.array([c], np.uint64) for c in ctr], [np.array([k], np.uint64) for k in key])
    assert [int(v[0]) for v in out] == want


def test_dropout_reference_mask_rate():
    mask = ref.dropout_mask(40001, 0.25, seed=3, offset=0)
    assert mask.dtype == np.uint8 and abs(1 - mask.mean() - 0.25) < 0.01
    assert not np.array_equal(mask, ref.dropout_mask(40001, 0.25, seed=3, offset=1))

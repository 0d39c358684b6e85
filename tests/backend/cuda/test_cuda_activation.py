"""CUDA activations (backend/cuda/activation.py) against float64 NumPy."""
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


def _act_input(rng, dtype):
    x = (rng.standard_normal(1031) * 3).astype(dtype)  # 1031: not a multiple of the block
    x[:4] = [0.0, -0.0, np.nan, -1e-30]
    return x


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["relu", "gelu", "gelu_tanh"])
def test_activation(name, dtype, rng):
    x = _act_input(rng, dtype).reshape(1031, 1)
    dout = rng.standard_normal(x.shape).astype(dtype)
    if name == "relu":
        out, saved = ops.relu_forward(g(x))
        dx = ops.relu_backward(g(dout), saved)
    else:
        out, saved = ops.gelu_forward(g(x), "tanh" if name == "gelu_tanh" else "none")
        dx = ops.gelu_backward(g(dout), saved)
    assert out.shape == x.shape and out.dtype == dtype
    assert_close(out, ref.act(x, name), ref.tol(dtype), name=f"{name} forward")
    assert_close(dx, ref.act_grad(dout, x, name), ref.tol(dtype), name=f"{name} backward")


@gpu
def test_activation_errors():
    with pytest.raises(RuntimeError, match="approximate"):
        ops.gelu_forward(cp.ones(3, cp.float32), "fast")
    with pytest.raises(TypeError, match="float32 and float64"):
        ops.relu_forward(cp.ones(3, cp.int64))
    with pytest.raises(RuntimeError, match="shape"):
        ops.relu_backward(cp.ones(4, cp.float32), cp.ones(3, cp.float32))

"""examples/custom_gelu.py's array-code GELU on the CPU: float64 gradcheck and forward/gradient against torch's
F.gelu(approximate='tanh'), through the example's own check(); its CUDA half runs in tests/cuda's GPU runs."""
import importlib.util
import os

import numpy as np
import pytest

import smalltrain
from smalltrain.testing import assert_close

PATH = os.path.join(os.path.dirname(__file__), "..", "examples", "custom_gelu.py")


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("custom_gelu_example", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_array_code_gelu_passes_gradcheck_and_matches_torch(example):
    example.check(example.GELUTanh.apply, "cpu")


def test_array_code_gelu_values_and_dispatch(example):
    torch = pytest.importorskip("torch")
    x = np.array([-3.0, -0.5, 0.0, 0.7, 4.0], dtype=np.float32)
    out = example.gelu_tanh(smalltrain.tensor(x))
    assert out.dtype == smalltrain.float32 and out.grad_fn is None
    want = torch.nn.functional.gelu(torch.tensor(x), approximate="tanh").numpy()
    assert_close(out, want, 1e-5)  # the project rule; near x = -3, 1 + tanh cancels to ~1e-2
    t = smalltrain.tensor(x, requires_grad=True)
    example.gelu_tanh(t).sum().backward()
    tt = torch.tensor(x, requires_grad=True)
    torch.nn.functional.gelu(tt, approximate="tanh").sum().backward()
    assert_close(t.grad, tt.grad, 1e-5)

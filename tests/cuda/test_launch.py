"""Dependent launch (smalltrain/backend/cuda/launch.py): kernel arguments marshalled as CuPy passes them, and on the
GPU the captured training steps with DEPENDENT_LAUNCH on replay bit for bit what they replay with it off."""
import ctypes

import numpy as np
import pytest

import smalltrain
from smalltrain import models
from smalltrain.backend.cuda import launch
from smalltrain.nn import functional as F
from smalltrain.testing import cuda_emulator


@pytest.mark.parametrize("value, want", [
    (np.int32(-3), np.int32(-3).tobytes()), (np.int64(1 << 40), np.int64(1 << 40).tobytes()),
    (np.float32(0.1), np.float32(0.1).tobytes()), (np.float64(-2.5), np.float64(-2.5).tobytes()),
    (np.uint64(0), bytes(8)), (None, bytes(8)), (7, np.int64(7).tobytes()), (0.5, np.float64(0.5).tobytes()),
    (True, b"\x01"),
])
def test_scalar_arguments_hold_cupys_bytes(value, want):
    held = launch._argument(value)
    assert ctypes.string_at(ctypes.addressof(held), len(want)) == want


def test_other_arguments_are_left_to_cupy():
    assert launch._argument("text") is None and launch._argument([1, 2]) is None


def _captured_params(model_name, batch, steps, dependent, monkeypatch):
    monkeypatch.setattr(launch, "DEPENDENT_LAUNCH", dependent)
    smalltrain.manual_seed(0)
    model = getattr(models, model_name)().to("cuda")
    opt = smalltrain.optim.Adam(model.parameters(), lr=1e-3)

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss
    compiled = smalltrain.compile(step)
    rng = np.random.default_rng(1)
    xs = [smalltrain.tensor(rng.standard_normal((batch, 1, 28, 28)).astype(np.float32), device="cuda")
          for _ in range(3)]
    ys = [smalltrain.tensor(rng.integers(0, 10, batch), device="cuda") for _ in range(3)]
    before = launch.Kernel.dependent_launches
    for i in range(steps):
        loss = compiled(xs[i % 3], ys[i % 3])
    assert compiled.stats["captures"] == 1
    made = launch.Kernel.dependent_launches - before
    return [p.detach().cpu().numpy() for p in model.parameters()], float(loss.item()), made


@pytest.mark.skipif(not smalltrain.cuda.is_available() or cuda_emulator.installed(),
                    reason="a CUDA device (dependent launch goes through the driver, which the emulator has not)")
@pytest.mark.parametrize("model_name, batch", [("LeNet5", 64), ("LeNet5", 512), ("MnistCnn", 64)])
def test_dependent_launch_replays_the_same_step(model_name, batch, monkeypatch):
    plain, plain_loss, none = _captured_params(model_name, batch, 30, False, monkeypatch)
    dependent, dependent_loss, made = _captured_params(model_name, batch, 30, True, monkeypatch)
    assert none == 0 and made >= 10, (none, made)   # the capture launched our kernels dependent
    assert dependent_loss == plain_loss
    for p, q in zip(plain, dependent):
        assert np.array_equal(p, q)

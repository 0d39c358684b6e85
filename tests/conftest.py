"""Shared fixtures: the device list every golden table runs over (CUDA cases skip cleanly without a GPU), the
seed, and reprs as the installed torch prints them. With SMALLTRAIN_CUDA_EMULATOR=1 and no GPU, the CUDA cases run
on the CPU emulator of the CUDA backend (tests/tooling/cuda_emulator.py, on sys.path through pyproject's pytest
`pythonpath`), installed here before any test module imports CuPy."""
import contextlib
import inspect
import re

import numpy as np
import pytest
import torch

import cuda_emulator
import smalltrain

EMULATED = cuda_emulator.install_if_requested()

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not smalltrain.cuda.is_available(),
                                                                 reason="no CUDA device"))]


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def _seed():
    smalltrain.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _no_device_check_left_over():
    """A value check a test left on the GPU (backend/cuda/device_checks.py: raised at the next sync) is dropped
    after it, so that it cannot fail the next test."""
    yield
    if smalltrain.cuda.is_available():
        from smalltrain.backend.cuda import device_checks
        device_checks.discard_pending()


@pytest.fixture
def torch_repr():
    """Our repr as the installed torch would print it. torch 2.13 (the pinned reference) has BatchNorm's `bias`
    keyword and prints it; 2.11 (on the GPU machine) has neither, so there the comparison leaves it out."""
    if "bias" in inspect.signature(torch.nn.BatchNorm1d).parameters:
        return repr
    return lambda module: re.sub(r", bias=(True|False)(?=, track_running_stats)", "", repr(module))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """On the emulator, a test that needs what it does not emulate (cuda_emulator.NotEmulated) is a skip."""
    outcome = yield
    if EMULATED and call.excinfo is not None and call.excinfo.errisinstance(cuda_emulator.NotEmulated):
        report = outcome.get_result()
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {call.excinfo.value}")


@pytest.fixture
def record_kernels(monkeypatch):
    """record(module, attr): the kernel names that module.attr (a launcher or kernel getter taking (family, name,
    ...)) is called with from then on, in a list (a test clears it between runs)."""
    def record(module, attr):
        names, real = [], getattr(module, attr)
        monkeypatch.setattr(module, attr,
                            lambda family, name, *a, **k: names.append(name) or real(family, name, *a, **k))
        return names
    return record


@pytest.fixture
def tune():
    """tune(**entries): the conv tuning table (backend/cuda/conv/plan.py CONV) with those entries, through
    tuning.override, until the test ends."""
    from smalltrain.backend.cuda.conv import CONV
    from smalltrain.backend.cuda.tuning import override
    with contextlib.ExitStack() as stack:
        yield lambda **entries: stack.enter_context(override(CONV, **entries))


@pytest.fixture
def conv_launches(monkeypatch):
    """The names of the kernels the CUDA convolution's rooms ask for (their `get`) from then on, in one list."""
    from smalltrain.backend.cuda import conv
    names = []
    for room in (conv.tile, conv.fused, conv.direct, conv.igemm, conv.epilogue, conv.wgrad):
        monkeypatch.setattr(room, "get", lambda family, name, *a, _real=room.get, **k: names.append(name)
                            or _real(family, name, *a, **k))
    return names


@pytest.fixture(autouse=True)
def _emulator_reset():
    yield
    if EMULATED:
        cuda_emulator.reset()   # a capture a failed test left open

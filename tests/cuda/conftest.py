"""Fixtures for the CUDA kernel tests: CuPy's free memory is poisoned before each test. With
SMALLTRAIN_CUDA_EMULATOR=1 these tests run on the CPU emulator of the kernels (smalltrain/testing/cuda_emulator.py)
where no GPU is present."""
import os

import pytest

import smalltrain

EMULATED = os.environ.get("SMALLTRAIN_CUDA_EMULATOR") == "1" and not smalltrain.cuda.is_available()
if EMULATED:
    from smalltrain.testing import cuda_emulator
    cuda_emulator.install()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """On the emulator, a test that needs what it does not emulate (cuda_emulator.NotEmulated) is a skip."""
    outcome = yield
    if EMULATED and call.excinfo is not None and call.excinfo.errisinstance(cuda_emulator.NotEmulated):
        report = outcome.get_result()
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {call.excinfo.value}")


@pytest.fixture(autouse=True)
def _poison_pool():
    """Fill CuPy's pooled free memory with 0xFF bytes (NaN as a float, -1 as an int): an output element that a
    kernel forgets to write then shows up as NaN instead of a plausible stale value."""
    if smalltrain.cuda.is_available() and not EMULATED:   # the emulator poisons each allocation itself
        from smalltrain.backend.cuda import cupy
        cp = cupy()
        cp.get_default_memory_pool().free_all_blocks()
        junk = cp.full(1 << 26, 255, dtype=cp.uint8)  # 64 MiB, split by the pool for the test's allocations
        del junk
    yield


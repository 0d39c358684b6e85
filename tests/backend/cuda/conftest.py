"""Fixtures for the CUDA backend's tests (tests/backend/cuda and its conv/): CuPy's free memory is poisoned before
each test (on the emulator, see tests/conftest.py, each allocation is)."""
import pytest

import smalltrain
import cuda_emulator


@pytest.fixture(autouse=True)
def _poison_pool():
    """Fill CuPy's pooled free memory with 0xFF bytes (NaN as a float, -1 as an int): an output element that a
    kernel forgets to write then shows up as NaN instead of a plausible stale value."""
    if smalltrain.cuda.is_available() and not cuda_emulator.installed():
        from smalltrain.backend.cuda import cupy
        cp = cupy()
        cp.get_default_memory_pool().free_all_blocks()
        junk = cp.full(1 << 26, 255, dtype=cp.uint8)  # 64 MiB, split by the pool for the test's allocations
        del junk
    yield


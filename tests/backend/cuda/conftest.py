"""Fixtures of the CUDA backend's tests: tests/cuda's reference code on the path (cuda_reference) and CuPy's free
memory poisoned before each test, as there (tests/conftest.py has `tune` and `conv_launches`)."""
import os
import sys

import pytest

import smalltrain
from smalltrain.testing import cuda_emulator

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "cuda"))   # cuda_reference


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

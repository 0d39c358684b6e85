"""smalltrain.backend: devices and the metadata cache of the ops' checks and launch plans."""
import numpy as np
import pytest

from smalltrain.backend import CPU, Device, device_of, metadata_cache
from smalltrain.ops import conv


def test_metadata_cache_caches_results_not_errors_and_takes_unhashable_arguments():
    calls = []

    @metadata_cache
    def plan(shape, stride):
        calls.append((shape, stride))
        if min(stride) <= 0:
            raise RuntimeError(f"bad stride {stride}")
        return shape[0] * stride[0]

    assert plan((4, 5), (2, 1)) == 8 and plan((4, 5), (2, 1)) == 8
    assert calls == [((4, 5), (2, 1))]                       # the second call was a cache hit
    for _ in range(2):                                        # an error is raised again on every call
        with pytest.raises(RuntimeError, match="bad stride"):
            plan((4, 5), (0, 1))
    assert len(calls) == 3
    assert plan((4, 5), [3, 1]) == 12 and plan((4, 5), [3, 1]) == 12   # a list: the plain call each time
    assert len(calls) == 5
    plan.cache_clear()
    assert plan((4, 5), (2, 1)) == 8 and len(calls) == 6


def test_conv_checks_are_cached_per_metadata_and_still_raise():
    x, w = np.zeros((2, 3, 8, 8), np.float32), np.zeros((4, 3, 3, 3), np.float32)
    assert conv._check(x, w, None, 1, 0, 1, 1) == ((1, 1), (0, 0, 0, 0), (1, 1), 1)
    assert conv._check(x, w, None, [2, 1], [1, 0], 1, 1) == ((2, 1), (1, 1, 0, 0), (1, 1), 1)   # lists work too
    for _ in range(2):
        with pytest.raises(RuntimeError, match=r"expected input with 3 channels .* got input \[2, 2, 8, 8\]"):
            conv._check(x[:, :2], w, None, 1, 0, 1, 1)
        with pytest.raises(RuntimeError, match="expected weight to have the input's dtype float32, got float64"):
            conv._check(x, w.astype(np.float64), None, 1, 0, 1, 1)
        with pytest.raises(TypeError, match="stride must be an int or a tuple of 2 ints"):
            conv._check(x, w, None, 1.5, 0, 1, 1)


def test_device_of_returns_the_cached_device():
    assert device_of(np.zeros(2)) is CPU
    assert Device("cuda:1") is Device("cuda", 1)

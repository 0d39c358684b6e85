"""Shared fixtures: the device list every golden table runs over (CUDA cases skip cleanly without a GPU)."""
import numpy as np
import pytest

import smalltrain

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

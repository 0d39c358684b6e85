"""Shared fixtures: the device list every golden table runs over (CUDA cases skip cleanly without a GPU), the
seed, and reprs as the installed torch prints them."""
import inspect
import re

import numpy as np
import pytest
import torch

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


@pytest.fixture
def torch_repr():
    """Our repr as the installed torch would print it. torch 2.13 (the pinned reference) has BatchNorm's `bias`
    keyword and prints it; 2.11 (on the GPU machine) has neither, so there the comparison leaves it out."""
    if "bias" in inspect.signature(torch.nn.BatchNorm1d).parameters:
        return repr
    return lambda module: re.sub(r", bias=(True|False)(?=, track_running_stats)", "", repr(module))

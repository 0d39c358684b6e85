"""Tensor.pin_memory / is_pinned (torch's names): page-locked host copies and the direct upload from them."""
import numpy as np
import pytest

import smalltrain as st

cuda = pytest.mark.skipif(not st.cuda.is_available(), reason="no CUDA device")


def test_ordinary_arrays_are_not_pinned():
    assert not st.tensor([1.0, 2.0]).is_pinned()


@cuda
def test_pinned_copy_uploads_the_same_values():
    host = np.random.default_rng(0).integers(0, 255, (1000, 28, 28)).astype(np.uint8)
    pinned = st.from_numpy(host).pin_memory()
    assert pinned.is_pinned() and pinned.device.type == "cpu"
    assert np.array_equal(pinned.numpy(), host)
    host[0, 0, 0] ^= 1   # a copy, not a view of the source
    assert pinned.numpy()[0, 0, 0] != host[0, 0, 0]
    up = pinned.to("cuda")
    assert up.device.type == "cuda" and np.array_equal(up.cpu().numpy(), pinned.numpy())


@cuda
def test_only_cpu_tensors_can_be_pinned():
    with pytest.raises(RuntimeError, match="only CPU tensors can be pinned"):
        st.tensor([1.0]).to("cuda").pin_memory()

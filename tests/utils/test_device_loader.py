"""DeviceDataLoader yields exactly the batches DataLoader yields for the same sampler, from device-resident data."""
import numpy as np
import pytest

import smalltrain
from smalltrain.utils.data import DataLoader, DeviceDataLoader, DistributedSampler, TensorDataset

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not smalltrain.cuda.is_available(),
                                                                 reason="no CUDA device"))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("drop_last", [False, True])
def test_same_batches_as_dataloader(device, drop_last):
    rng = np.random.default_rng(0)
    ds = TensorDataset(smalltrain.tensor(rng.standard_normal((103, 1, 4, 4)).astype(np.float32)),
                       smalltrain.tensor(rng.integers(0, 10, 103)))
    sampler = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=3)
    sampler.set_epoch(2)
    ref = list(DataLoader(ds, batch_size=16, sampler=sampler, drop_last=drop_last))
    dev = DeviceDataLoader(ds, 16, device, sampler=sampler, drop_last=drop_last)
    got = list(dev)
    assert len(dev) == len(ref) == len(got)
    for (x, y), (rx, ry) in zip(got, ref):
        assert str(x.device).startswith(device)
        assert np.array_equal(x.cpu().numpy(), rx.numpy()) and np.array_equal(y.cpu().numpy(), ry.numpy())


def test_bad_batch_size_is_reported():
    ds = TensorDataset(smalltrain.zeros(4, 2), smalltrain.zeros(4))
    with pytest.raises(ValueError, match="batch_size should be a positive integer"):
        DeviceDataLoader(ds, 0, "cpu")


def test_out_of_range_sampler_index_is_reported_before_any_batch():
    ds = TensorDataset(smalltrain.zeros(4, 2), smalltrain.zeros(4))
    loader = DeviceDataLoader(ds, 2, "cpu", sampler=[0, 1, 2, 4])
    with pytest.raises(IndexError, match="sampler gave index 4, but the data set has 4 samples"):
        next(iter(loader))

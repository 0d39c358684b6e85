"""DeviceDataLoader: a whole (small) data set moved to the device once, batches gathered there from a permutation.

For data sets that fit in device memory (MNIST is 188 MB as float32), copying every batch from the host costs
more than the model's step on a GPU. This loader runs the data set's transforms once on the host (the same
values the ordinary DataLoader yields), uploads the result, and per epoch uploads only the sampler's index
order; each batch is then two gathers on the device. Same batches, same order as DataLoader with that sampler.
"""
import numpy as np

from ... import creation
from .dataloader import DataLoader


class DeviceDataLoader:
    """Iterate (inputs, targets) batches of `dataset` resident on `device`, in the order `sampler` gives
    (sequential if None). `len()` and drop_last as DataLoader."""

    def __init__(self, dataset, batch_size, device, sampler=None, drop_last=False, chunk=8192):
        if not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"batch_size should be a positive integer value, but got batch_size={batch_size!r}")
        self.dataset, self.batch_size, self.device = dataset, batch_size, device
        self.sampler, self.drop_last = sampler, drop_last
        xs, ys = [], []
        for x, y in DataLoader(dataset, batch_size=chunk, shuffle=False):
            xs.append(x.numpy())
            ys.append(y.numpy())
        self.inputs = creation.tensor(np.concatenate(xs), device=device)
        self.targets = creation.tensor(np.concatenate(ys), device=device)

    def __len__(self):
        n = len(self.sampler) if self.sampler is not None else len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self):
        order = np.fromiter(self.sampler, dtype=np.int64) if self.sampler is not None else \
            np.arange(len(self.dataset), dtype=np.int64)
        n = self.inputs.shape[0]
        if order.size and (order.min() < -n or order.max() >= n):   # checked once here, not per batch on the GPU
            bad = order[(order < -n) | (order >= n)][0]
            raise IndexError(f"DeviceDataLoader: the sampler gave index {bad}, but the data set has {n} samples")
        order %= n   # torch-style negative indices, made explicit for the unchecked gather
        index = creation.tensor(order, device=self.device)   # one upload per epoch
        b = self.batch_size
        for k in range(len(self)):
            rows = index[k * b:(k + 1) * b]
            yield take_rows(self.inputs, rows), take_rows(self.targets, rows)


def take_rows(data, index):
    """data[index] for an int64 index tensor of valid rows, gathered without a bounds check (so no host read per
    batch, and capturable in a CUDA graph); callers check the indices once where they come from."""
    from ...backend import get_array_module
    from ...tensor import Tensor
    return Tensor._wrap(get_array_module(data.array).take(data.array, index.array, axis=0))

"""Datasets, torch.utils.data's: Dataset, IterableDataset, TensorDataset, Subset, ConcatDataset, random_split.

`BatchedSamples` is what a vectorized `__getitems__` returns: a sequence of samples stored as whole-batch
columns, so default_collate hands the columns out without touching the samples one by one.
"""
import bisect
import itertools
import math
import warnings
from collections.abc import Sequence

import numpy as np

from ...tensor import Tensor

__all__ = ["BatchedSamples", "ConcatDataset", "Dataset", "IterableDataset", "Subset", "TensorDataset",
           "random_split"]


class Dataset:
    """A map-style dataset: `__getitem__(index)` and usually `__len__`. `a + b` concatenates."""

    def __getitem__(self, index):
        raise NotImplementedError("Subclasses of Dataset should implement __getitem__.")

    def __add__(self, other):
        return ConcatDataset([self, other])


class IterableDataset(Dataset):
    """A dataset that is a stream: `__iter__` yields samples (the DataLoader batches them in order)."""

    def __iter__(self):
        raise NotImplementedError("Subclasses of IterableDataset should implement __iter__.")

    def __add__(self, other):
        raise TypeError("IterableDataset does not support concatenation with +")


class BatchedSamples(Sequence):
    """`len(columns[0])` samples held as columns: sample k is `tuple(column[k] ...)`.

    `scalar[i]` marks a column whose per-sample value is a Python number (MNIST's int label) rather than a
    0-d Tensor. default_collate returns `collated()`, exactly what it would build from the samples one by one.
    """

    __slots__ = ("columns", "scalar")

    def __init__(self, columns, scalar=None):
        self.columns = tuple(columns)
        self.scalar = tuple(scalar) if scalar is not None else (False,) * len(self.columns)
        if len({len(c) for c in self.columns}) > 1:
            raise ValueError(f"BatchedSamples: columns of different lengths {[len(c) for c in self.columns]}")

    def __len__(self):
        return len(self.columns[0]) if self.columns else 0

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        return tuple(c[k].item() if s else c[k] for c, s in zip(self.columns, self.scalar))

    def collated(self):
        return list(self.columns)

    def __repr__(self):
        shapes = ", ".join(str(list(c.shape)) for c in self.columns)
        return f"BatchedSamples({len(self)} samples, columns {shapes})"


def _gather(tensor, index):
    """tensor[index] for an int64 index array: one fancy-index call, through autograd only when it must."""
    if tensor.requires_grad:
        return tensor[Tensor._wrap(index)]
    xp_index = index if isinstance(tensor.array, np.ndarray) else _to_device_index(tensor.array, index)
    return Tensor._wrap(tensor.array[xp_index])


def _to_device_index(array, index):
    from ...backend import get_array_module
    return get_array_module(array).asarray(index)


def _index_array(indices, length, who):
    index = np.asarray(indices.array if isinstance(indices, Tensor) else indices)
    if index.dtype == object or (index.size and index.dtype.kind not in "iu"):
        raise TypeError(f"{who}: expected integer indices, got {index.dtype}")
    index = index.astype(np.int64, copy=False).reshape(-1)
    if index.size and (index.max() >= length or index.min() < -length):
        bad = index[(index >= length) | (index < -length)][0]
        raise IndexError(f"{who}: index {bad} is out of range for a dataset of {length} samples")
    return index


class TensorDataset(Dataset):
    """Samples are rows of the given tensors (all with the same first dimension)."""

    def __init__(self, *tensors):
        sizes = [t.shape[0] if t.ndim else None for t in tensors]
        if not tensors or None in sizes or len(set(sizes)) > 1:
            raise AssertionError(f"Size mismatch between tensors: first dimensions {sizes}")
        self.tensors = tensors

    def __getitem__(self, index):
        return tuple(t[index] for t in self.tensors)

    def __getitems__(self, indices):
        index = _index_array(indices, len(self), "TensorDataset")
        return BatchedSamples(_gather(t, index) for t in self.tensors)

    def __len__(self):
        return self.tensors[0].shape[0]


class Subset(Dataset):
    """The samples of `dataset` at `indices`, in that order."""

    def __init__(self, dataset, indices):
        self.dataset = dataset
        self.indices = indices

    def __getitem__(self, idx):
        if isinstance(idx, list):
            return self.dataset[[self.indices[i] for i in idx]]
        return self.dataset[self.indices[idx]]

    def __getitems__(self, indices):
        if not callable(getattr(self.dataset, "__getitems__", None)):
            return [self.dataset[self.indices[i]] for i in indices]
        mapping = self._mapping()
        return self.dataset.__getitems__(mapping[_index_array(indices, len(mapping), "Subset")])

    def _mapping(self):
        # cached as an array: the batch path maps its indices with one fancy index instead of a Python loop
        cached = getattr(self, "_mapping_cache", None)
        if cached is None or cached[0] is not self.indices:
            arr = self.indices.array if isinstance(self.indices, Tensor) else self.indices
            cached = (self.indices, np.asarray(arr, dtype=np.int64).reshape(-1))
            self._mapping_cache = cached
        return cached[1]

    def __len__(self):
        return len(self.indices)


class ConcatDataset(Dataset):
    """Datasets one after another; `cumulative_sizes[i]` is the end of dataset i."""

    def __init__(self, datasets):
        self.datasets = list(datasets)
        if not self.datasets:
            raise AssertionError("datasets should not be an empty iterable")
        for d in self.datasets:
            if isinstance(d, IterableDataset):
                raise AssertionError("ConcatDataset does not support IterableDataset")  # noqa: TRY004 - torch's
        self.cumulative_sizes = list(itertools.accumulate(len(d) for d in self.datasets))

    def __len__(self):
        return self.cumulative_sizes[-1]

    def __getitem__(self, idx):
        if idx < 0:
            if -idx > len(self):
                raise ValueError("absolute value of index should not exceed dataset length")
            idx = len(self) + idx
        which = bisect.bisect_right(self.cumulative_sizes, idx)
        start = self.cumulative_sizes[which - 1] if which else 0
        return self.datasets[which][idx - start]


def _split_lengths(n, lengths):
    """torch's rule: fractions summing to 1 become floor(n * f), the remainder handed out round-robin."""
    if math.isclose(sum(lengths), 1) and sum(lengths) <= 1:
        sizes = []
        for i, frac in enumerate(lengths):
            if frac < 0 or frac > 1:
                raise ValueError(f"Fraction at index {i} is not between 0 and 1")
            sizes.append(math.floor(n * frac))
        for i in range(n - sum(sizes)):
            sizes[i % len(sizes)] += 1
        for i, size in enumerate(sizes):
            if size == 0:
                warnings.warn(f"Length of split at index {i} is 0. This might result in an empty dataset.",
                              stacklevel=3)
        lengths = sizes
    if sum(lengths) != n:
        raise ValueError("Sum of input lengths does not equal the length of the input dataset!")
    return lengths


def random_split(dataset, lengths, generator=None):
    """Disjoint random Subsets of the given lengths (or fractions summing to 1), as torch splits them.

    `generator`: None (smalltrain's global generator), a numpy.random.Generator, or an MT19937Generator
    (then the split is torch's exactly for `torch.Generator().manual_seed(same seed)`).
    """
    from .sampler import _permutation
    lengths = _split_lengths(len(dataset), list(lengths))
    indices = _permutation(sum(lengths), generator).tolist()
    return [Subset(dataset, indices[end - size:end]) for end, size in zip(itertools.accumulate(lengths), lengths)]

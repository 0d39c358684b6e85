"""Tests for smalltrain.utils.data.dataset against torch.utils.data: TensorDataset, Subset, ConcatDataset,
random_split (lengths, fractions, and torch's exact indices for a seeded generator), BatchedSamples."""
import warnings

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import smalltrain
from smalltrain.utils.data import (BatchedSamples, ConcatDataset, Dataset, MT19937Generator, Subset, TensorDataset,
                                   random_split)


def pair(n=10):
    x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    y = (np.arange(n) * 7 % 5).astype(np.int64)
    return TensorDataset(smalltrain.from_numpy(x), smalltrain.from_numpy(y)), \
        tud.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))


def same(ours, theirs):
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_tensor_dataset_matches_torch():
    ours, theirs = pair()
    assert len(ours) == len(theirs) == 10
    for i in (0, 3, -1):
        same(ours[i], theirs[i])
    batch = ours.__getitems__([4, 0, 4, -2])
    assert isinstance(batch, BatchedSamples) and len(batch) == 4
    x, y = batch.collated()
    np.testing.assert_array_equal(x.numpy(), theirs.tensors[0].numpy()[[4, 0, 4, -2]])
    np.testing.assert_array_equal(y.numpy(), theirs.tensors[1].numpy()[[4, 0, 4, -2]])
    same(batch[1], theirs[0])
    with pytest.raises(IndexError, match="index 10 is out of range for a dataset of 10 samples"):
        ours.__getitems__([1, 10])
    with pytest.raises(AssertionError, match="Size mismatch between tensors"):
        TensorDataset(smalltrain.zeros(3, 2), smalltrain.zeros(4))


def test_subset_maps_indices_and_batches_through_the_parent():
    ours, theirs = pair()
    idx = [9, 2, 5, 5, 0]
    s, t = Subset(ours, idx), tud.Subset(theirs, idx)
    assert len(s) == len(t) == 5
    for i in range(5):
        same(s[i], t[i])
    x, y = s.__getitems__([0, 3, 4]).collated()
    np.testing.assert_array_equal(x.numpy(), theirs.tensors[0].numpy()[[9, 5, 0]])
    nested = Subset(s, [4, 0])                               # a Subset of a Subset still gathers in one call
    np.testing.assert_array_equal(nested.__getitems__([0, 1]).collated()[1].numpy(), y.numpy()[[2, 0]])

    class Plain(Dataset):
        def __getitem__(self, i):
            return i * 10

        def __len__(self):
            return 20

    assert Subset(Plain(), [3, 1]).__getitems__([1, 0]) == [10, 30]


def test_concat_dataset_matches_torch():
    a, ta = pair(4)
    b, tb = pair(7)
    ours, theirs = a + b, tud.ConcatDataset([ta, tb])
    assert isinstance(ours, ConcatDataset)
    assert ours.cumulative_sizes == theirs.cumulative_sizes == [4, 11]
    for i in [0, 3, 4, 10, -1, -11]:
        same(ours[i], theirs[i])
    with pytest.raises(ValueError, match="absolute value of index should not exceed dataset length"):
        ours[-12]
    with pytest.raises(AssertionError, match="datasets should not be an empty iterable"):
        ConcatDataset([])


LENGTHS = [[3, 7], [10], [0.3, 0.7], [0.25, 0.25, 0.5], [0.1] * 10, [1 / 3] * 3, [0.5, 0.5, 0.0], [0.05, 0.95]]


@pytest.mark.parametrize("lengths", LENGTHS, ids=str)
@pytest.mark.parametrize("seed", [0, 42])
def test_random_split_is_torchs_for_the_same_seed(lengths, seed):
    n = 10
    with warnings.catch_warnings(record=True) as ours_warned:
        warnings.simplefilter("always")
        ours = random_split(range(n), lengths, generator=MT19937Generator(seed))
    with warnings.catch_warnings(record=True) as torch_warned:
        warnings.simplefilter("always")
        theirs = tud.random_split(range(n), lengths, generator=torch.Generator().manual_seed(seed))
    assert [list(s) for s in ours] == [list(s) for s in theirs]
    assert [str(w.message) for w in ours_warned] == [str(w.message) for w in torch_warned]


def test_random_split_errors_and_default_generator():
    with pytest.raises(ValueError, match="Sum of input lengths does not equal the length of the input dataset!"):
        random_split(range(10), [3, 3])
    with pytest.raises(ValueError, match="Fraction at index 1 is not between 0 and 1"):
        random_split(range(10), [0.5, 1.5, -1.0])
    smalltrain.manual_seed(3)
    first = [list(s) for s in random_split(range(50), [20, 30])]
    smalltrain.manual_seed(3)
    assert [list(s) for s in random_split(range(50), [20, 30])] == first
    assert sorted(first[0] + first[1]) == list(range(50))
    numpy_split = random_split(range(50), [0.5, 0.5], generator=np.random.default_rng(0))
    assert sorted(numpy_split[0].indices + numpy_split[1].indices) == list(range(50))


def test_batched_samples_is_a_sequence_of_samples():
    b = BatchedSamples((smalltrain.tensor([[1.0, 2.0], [3.0, 4.0]]), smalltrain.tensor([7, 8])), scalar=(False, True))
    assert len(b) == 2 and b[1][1] == 8 and type(b[1][1]) is int
    np.testing.assert_array_equal(b[-1][0].numpy(), [3.0, 4.0])
    assert [s[1] for s in b] == [7, 8] and [s[1] for s in b[::-1]] == [8, 7]
    assert repr(b) == "BatchedSamples(2 samples, columns [2, 2], [2])"
    with pytest.raises(ValueError, match="columns of different lengths"):
        BatchedSamples((smalltrain.zeros(2), smalltrain.zeros(3)))

"""Tests for smalltrain.utils.data.dataloader with torch's DataLoader as the golden reference: the same batches
(sequential, seeded shuffle, distributed, custom batch samplers, iterable datasets), default_collate on every
container type, torch's argument errors, and MNIST batches fetched with one __getitems__ call each."""
import collections

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import smalltrain
from smalltrain import transforms as T
from smalltrain.datasets import MNIST
from smalltrain.utils.data import (BatchSampler, DataLoader, Dataset, DistributedSampler, IterableDataset,
                                   MT19937Generator, SequentialSampler, TensorDataset, default_collate)


def to_numpy(batch):
    """A collated batch (ours or torch's) as nested Python containers of NumPy arrays, for comparison."""
    if isinstance(batch, (smalltrain.Tensor, torch.Tensor)):
        return batch.numpy()
    if isinstance(batch, dict):
        return {k: to_numpy(v) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(to_numpy(v) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_numpy(v) for v in batch)
    return batch


def assert_same(ours, theirs):
    if isinstance(theirs, np.ndarray):
        assert isinstance(ours, np.ndarray) and ours.dtype == theirs.dtype and ours.shape == theirs.shape
        np.testing.assert_array_equal(ours, theirs)
    elif isinstance(theirs, dict):
        assert type(ours) is type(theirs) and ours.keys() == theirs.keys()
        for k in theirs:
            assert_same(ours[k], theirs[k])
    elif isinstance(theirs, (list, tuple)):
        assert type(ours) is type(theirs) and len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            assert_same(a, b)
    else:
        assert ours == theirs


def assert_same_batches(ours, theirs):
    assert len(ours) == len(theirs)
    got, want = [to_numpy(b) for b in ours], [to_numpy(b) for b in theirs]
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert_same(a, b)


def tensors(n=23):
    x = np.random.default_rng(0).standard_normal((n, 3, 2)).astype(np.float32)
    y = np.arange(n, dtype=np.int64) * 3 % 7
    return (TensorDataset(smalltrain.from_numpy(x), smalltrain.from_numpy(y)),
            tud.TensorDataset(torch.from_numpy(x), torch.from_numpy(y)))


class Samples(Dataset):
    """Per-sample Python containers (no __getitems__): exercises default_collate on every type."""

    Point = collections.namedtuple("Point", "x y")

    def __init__(self, n=11):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"image": np.full((2, 2), i, dtype=np.uint8), "label": i % 3, "weight": i / 4,
                "name": f"s{i}", "pair": (i, [np.float64(i), np.int32(-i)]), "point": self.Point(i, 2.0 * i),
                "flag": bool(i % 2)}


class TorchSamples(tud.Dataset):
    def __init__(self, n=11):
        self.ours = Samples(n)

    def __len__(self):
        return len(self.ours)

    def __getitem__(self, i):
        return self.ours[i]


@pytest.mark.parametrize("batch_size, drop_last", [(1, False), (4, False), (4, True), (23, False), (30, True),
                                                   (30, False)])
def test_sequential_batches_match_torch(batch_size, drop_last):
    ours, theirs = tensors()
    assert_same_batches(DataLoader(ours, batch_size=batch_size, drop_last=drop_last),
                        tud.DataLoader(theirs, batch_size=batch_size, drop_last=drop_last))


def test_default_collate_of_every_container_matches_torch():
    assert_same_batches(DataLoader(Samples(), batch_size=4), tud.DataLoader(TorchSamples(), batch_size=4))
    for batch in ([1.5, 2.5], [np.float32(1), np.float32(2)], [np.array([1, 2]), np.array([3, 4])], [3, 4],
                  [[1, 2], [3, 4]], [("a", 1), ("b", 2)]):
        assert_same(to_numpy(default_collate(batch)), to_numpy(tud.default_collate(batch)))


def test_default_collate_errors_match_torch():
    for bad in ([None, None], [object()], [np.array(["a"]), np.array(["b"])]):
        with pytest.raises(TypeError) as ours:
            default_collate(bad)
        with pytest.raises(TypeError) as theirs:
            tud.default_collate(bad)
        assert str(ours.value).split(";")[0] == str(theirs.value).split(";")[0]
    with pytest.raises(RuntimeError, match="each element in list of batch should be of equal size"):
        default_collate([[1, 2], [3]])


@pytest.mark.parametrize("seed", [0, 123])
def test_seeded_shuffle_matches_torch_over_epochs(seed):
    ours, theirs = tensors()
    a = DataLoader(ours, batch_size=5, shuffle=True, generator=MT19937Generator(seed))
    b = tud.DataLoader(theirs, batch_size=5, shuffle=True, generator=torch.Generator().manual_seed(seed))
    for _ in range(3):
        assert_same_batches(a, b)


def test_distributed_sampler_batches_match_torch():
    ours, theirs = tensors()
    for rank in range(3):
        a = DistributedSampler(ours, num_replicas=3, rank=rank, seed=5)
        b = tud.DistributedSampler(theirs, num_replicas=3, rank=rank, seed=5)
        for epoch in (0, 1):
            a.set_epoch(epoch)
            b.set_epoch(epoch)
            assert_same_batches(DataLoader(ours, batch_size=3, sampler=a), tud.DataLoader(theirs, batch_size=3,
                                                                                          sampler=b))


def test_custom_batch_sampler_and_no_batching_match_torch():
    ours, theirs = tensors()
    batches = [[3, 1], [0], [22, 5, 5]]
    assert_same_batches(DataLoader(ours, batch_sampler=batches), tud.DataLoader(theirs, batch_sampler=batches))
    assert_same_batches(DataLoader(ours, batch_size=None), tud.DataLoader(theirs, batch_size=None))
    assert_same_batches(DataLoader(Samples(3), batch_size=None), tud.DataLoader(TorchSamples(3), batch_size=None))
    assert_same_batches(DataLoader(ours, batch_size=None, sampler=[4, 2]),
                        tud.DataLoader(theirs, batch_size=None, sampler=[4, 2]))


def test_iterable_dataset_matches_torch():
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(10))

        def __len__(self):
            return 10

    class TorchStream(tud.IterableDataset):
        def __iter__(self):
            return iter(range(10))

        def __len__(self):
            return 10

    for kwargs in ({"batch_size": 3}, {"batch_size": 3, "drop_last": True}, {"batch_size": None}):
        assert_same_batches(DataLoader(Stream(), **kwargs), tud.DataLoader(TorchStream(), **kwargs))
    with pytest.raises(ValueError, match="expected unspecified shuffle option, but got shuffle=True"):
        DataLoader(Stream(), shuffle=True)


BAD_ARGS = [
    {"shuffle": True, "sampler": [0, 1]},
    {"batch_sampler": [[0]], "batch_size": 2},
    {"batch_sampler": [[0]], "shuffle": True},
    {"batch_sampler": [[0]], "sampler": [0]},
    {"batch_sampler": [[0]], "drop_last": True},
    {"batch_size": None, "drop_last": True},
    {"num_workers": -1},
    {"timeout": -1},
    {"prefetch_factor": 2},
    {"persistent_workers": True},
    {"batch_size": 0},
    {"batch_size": 2, "drop_last": "yes"},
]


@pytest.mark.parametrize("kwargs", BAD_ARGS, ids=lambda k: ",".join(k))
def test_argument_errors_match_torch(kwargs):
    ours, theirs = tensors()
    with pytest.raises(ValueError) as want:
        tud.DataLoader(theirs, **kwargs)
    with pytest.raises(ValueError) as got:
        DataLoader(ours, **kwargs)
    assert str(got.value) == str(want.value)


def test_loader_attributes_are_frozen_and_workers_accepted():
    ours, _ = tensors()
    loader = DataLoader(ours, batch_size=4)
    with pytest.raises(ValueError, match="batch_size attribute should not be set after DataLoader is initialized"):
        loader.batch_size = 8
    with pytest.warns(UserWarning, match="num_workers=2 is accepted for compatibility"):
        loader = DataLoader(ours, batch_size=4, num_workers=2, pin_memory=True, persistent_workers=True)
    assert len(list(loader)) == len(loader) == 6
    it = iter(loader)
    assert len(it) == 6 and next(it)[0].shape[0] == 4


class Counting(MNIST):
    """MNIST that counts how it is read."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = collections.Counter()

    def __getitem__(self, i):
        self.calls["getitem"] += 1
        return super().__getitem__(i)

    def __getitems__(self, indices):
        self.calls["getitems"] += 1
        return super().__getitems__(indices)


def test_mnist_batches_are_one_gather_each_and_match_torch():
    transform = T.Compose([T.ToTensor(), T.Normalize((0.1307,), (0.3081,))])
    ds = Counting(train=False, transform=transform)
    x = torch.from_numpy(ds.data.numpy()).unsqueeze(1).float().div(255).sub_(0.1307).div_(0.3081)
    reference = tud.TensorDataset(x, torch.from_numpy(ds.targets.numpy()))
    sampler = DistributedSampler(ds, num_replicas=2, rank=1, seed=3)
    torch_sampler = tud.DistributedSampler(reference, num_replicas=2, rank=1, seed=3)
    ours = DataLoader(ds, batch_size=1000, sampler=sampler)
    assert_same_batches(ours, tud.DataLoader(reference, batch_size=1000, sampler=torch_sampler))
    assert ds.calls == {"getitems": 5}
    images, labels = next(iter(DataLoader(ds, batch_size=64)))
    assert images.dtype == smalltrain.float32 and tuple(images.shape) == (64, 1, 28, 28)
    assert labels.dtype == smalltrain.int64 and ds.calls["getitem"] == 0


def test_per_sample_path_gives_the_same_mnist_batches():
    class NoBatch(Dataset):
        def __init__(self, ds):
            self.ds = ds

        def __len__(self):
            return len(self.ds)

        def __getitem__(self, i):
            return self.ds[i]

    ds = MNIST(train=False)
    sampler = BatchSampler(SequentialSampler(range(200)), 64, False)
    assert_same_batches(DataLoader(ds, batch_sampler=sampler), DataLoader(NoBatch(ds), batch_sampler=sampler))

"""Tests for smalltrain.utils.data.sampler with torch as the golden reference: MT19937Generator reproduces
torch.randperm/randint bit for bit, DistributedSampler yields torch's indices over a grid of (n, world, rank,
shuffle, drop_last, seed, epoch), and the other samplers match torch's outputs and errors."""
import numpy as np
import pytest
import torch
import torch.utils.data as tud

import smalltrain
from smalltrain.utils.data import (BatchSampler, DistributedSampler, MT19937Generator, RandomSampler,
                                   SequentialSampler, SubsetRandomSampler)

SEEDS = [0, 1, 42, 2 ** 31 - 1, 2 ** 32 - 1, 2 ** 32 + 7, 2 ** 63 - 1, -1, -12345]


@pytest.mark.parametrize("seed", SEEDS)
def test_randperm_is_torchs_for_every_small_n(seed):
    ours, theirs = MT19937Generator(seed), torch.Generator().manual_seed(seed)
    for n in list(range(40)) + [100, 1000, 4097]:           # one generator: the streams stay in step
        assert ours.randperm(n).tolist() == torch.randperm(n, generator=theirs).tolist(), n
    assert ours.initial_seed() == theirs.initial_seed()


@pytest.mark.parametrize("n, seed", [(60000, 0), (10000, 7), (123457, 2 ** 40)])
def test_randperm_is_torchs_for_dataset_sized_n(n, seed):
    ours = MT19937Generator(seed).randperm(n)
    assert ours.dtype == np.int64
    np.testing.assert_array_equal(ours, torch.randperm(n, generator=torch.Generator().manual_seed(seed)).numpy())


@pytest.mark.parametrize("low, high", [(0, 10), (0, 1), (-5, 3), (0, 2 ** 28 - 1), (0, 2 ** 28), (0, 2 ** 31),
                                       (0, 2 ** 32), (5, 2 ** 33), (-(2 ** 40), 2 ** 40)])
def test_randint_is_torchs(low, high):
    ours, theirs = MT19937Generator(11), torch.Generator().manual_seed(11)
    for size in [(7,), (3, 4), ()]:
        np.testing.assert_array_equal(ours.randint(low, high, size),
                                      torch.randint(low, high, size, generator=theirs).numpy())
    with pytest.raises(RuntimeError, match="random_ expects 'from' to be less than 'to'"):
        ours.randint(3, 3, (1,))


def test_default_seed_int64_draw_and_state_round_trip():
    ours, theirs = MT19937Generator(), torch.Generator()
    assert ours.initial_seed() == theirs.initial_seed() == 67280421310721
    assert ours.random_int64() == torch.empty((), dtype=torch.int64).random_(generator=theirs).item()
    state = ours.get_state()
    a = ours.randperm(20)
    np.testing.assert_array_equal(ours.set_state(state).randperm(20), a)
    assert repr(MT19937Generator(5)) == "MT19937Generator(seed=5)"


GRID_N = [0, 1, 2, 5, 10, 17, 100]


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("n", GRID_N)
def test_distributed_sampler_yields_torchs_indices(n, world):
    for rank in range(world):
        for shuffle in (True, False):
            for drop_last in (False, True):
                for seed in (0, 42):
                    ours = DistributedSampler(range(n), world, rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
                    theirs = tud.DistributedSampler(range(n), world, rank, shuffle=shuffle, seed=seed,
                                                    drop_last=drop_last)
                    assert (ours.num_samples, ours.total_size) == (theirs.num_samples, theirs.total_size)
                    for epoch in (0, 1, 5):
                        ours.set_epoch(epoch)
                        theirs.set_epoch(epoch)
                        got = list(ours)
                        assert got == list(theirs), (n, world, rank, shuffle, drop_last, seed, epoch)
                        assert len(ours) == len(got) and all(type(i) is int for i in got)


def test_distributed_sampler_on_mnist_sized_data_and_shards_cover_everything():
    n, world = 60000, 3
    shards = []
    for rank in range(world):
        ours = DistributedSampler(range(n), world, rank, seed=7)
        ours.set_epoch(2)
        theirs = tud.DistributedSampler(range(n), world, rank, seed=7)
        theirs.set_epoch(2)
        shards.append(ours.indices())
        np.testing.assert_array_equal(shards[-1], list(theirs))
    assert sorted(np.concatenate(shards).tolist()) == list(range(n))


def test_distributed_sampler_errors_match_torch():
    for rank in (-1, 4):
        with pytest.raises(ValueError) as ours:
            DistributedSampler(range(10), num_replicas=4, rank=rank)
        with pytest.raises(ValueError) as theirs:
            tud.DistributedSampler(range(10), num_replicas=4, rank=rank)
        assert str(ours.value) == str(theirs.value)
    with pytest.raises(ValueError, match="Default process group has not been initialized"):
        DistributedSampler(range(10))


def test_distributed_sampler_takes_world_and_rank_from_an_initialized_group(monkeypatch):
    import smalltrain.distributed as dist
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 4)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 3)
    s = DistributedSampler(range(10), shuffle=False)
    assert (s.num_replicas, s.rank, list(s)) == (4, 3, [3, 7, 1])


def test_sequential_and_batch_samplers_match_torch():
    assert list(SequentialSampler(range(5))) == list(tud.SequentialSampler(range(5))) and len(SequentialSampler(
        range(5))) == 5
    for n in (0, 1, 9, 10):
        for bs in (1, 3, 10, 11):
            for drop_last in (False, True):
                ours = BatchSampler(SequentialSampler(range(n)), bs, drop_last)
                theirs = tud.BatchSampler(tud.SequentialSampler(range(n)), bs, drop_last)
                assert list(ours) == list(theirs) and len(ours) == len(theirs)
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match=f"batch_size should be a positive integer value, but got "
                                             f"batch_size={bad}"):
            BatchSampler(range(3), bad, False)
    with pytest.raises(ValueError, match="drop_last should be a boolean value, but got drop_last=1"):
        BatchSampler(range(3), 2, 1)


@pytest.mark.parametrize("replacement, num_samples", [(False, None), (False, 7), (False, 25), (True, None),
                                                      (True, 70), (True, 3)])
def test_random_sampler_with_seeded_generator_is_torchs(replacement, num_samples):
    n = 10
    ours = RandomSampler(range(n), replacement, num_samples, generator=MT19937Generator(3))
    theirs = tud.RandomSampler(range(n), replacement, num_samples, generator=torch.Generator().manual_seed(3))
    for _ in range(2):                                      # the shared generator advances the same way
        got = list(ours)
        assert got == list(theirs) and len(got) == len(ours) == len(theirs)


def test_random_sampler_default_and_numpy_generators():
    smalltrain.manual_seed(5)
    first = list(RandomSampler(range(30)))
    smalltrain.manual_seed(5)
    s = RandomSampler(range(30))
    assert list(s) == first and sorted(first) == list(range(30))
    assert list(s) != first                                 # the next epoch is another permutation
    draws = list(RandomSampler(range(4), replacement=True, num_samples=50, generator=np.random.default_rng(0)))
    assert len(draws) == 50 and set(draws) <= set(range(4))


def test_random_sampler_errors_match_torch():
    for kwargs in ({"replacement": 1}, {"num_samples": 0}, {"num_samples": 2.5}):
        with pytest.raises((TypeError, ValueError)) as ours:
            RandomSampler(range(3), **kwargs)
        with pytest.raises((TypeError, ValueError)) as theirs:
            tud.RandomSampler(range(3), **kwargs)
        assert type(ours.value) is type(theirs.value) and str(ours.value) == str(theirs.value)


def test_subset_random_sampler_is_torchs():
    indices = [10, 20, 30, 40, 50]
    ours = SubsetRandomSampler(indices, generator=MT19937Generator(9))
    theirs = tud.SubsetRandomSampler(indices, generator=torch.Generator().manual_seed(9))
    assert list(ours) == list(theirs) and list(ours) == list(theirs) and len(ours) == 5

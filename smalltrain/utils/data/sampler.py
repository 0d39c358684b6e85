"""Samplers (torch.utils.data's): Sequential, Random, SubsetRandom, Batch and Distributed, plus MT19937Generator,
a NumPy reimplementation of torch's CPU generator whose randperm/randint give torch's numbers bit for bit.

DistributedSampler shuffles with it, so its shards are exactly torch's for the same (seed, epoch).
"""
import itertools
import math

import numpy as np

__all__ = ["BatchSampler", "DistributedSampler", "MT19937Generator", "RandomSampler", "Sampler",
           "SequentialSampler", "SubsetRandomSampler"]

_TORCH_DEFAULT_SEED = 67280421310721   # what a fresh torch.Generator() is seeded with
_MASK32, _MASK64 = 0xFFFF_FFFF, 0xFFFF_FFFF_FFFF_FFFF
# torch's CPU randperm switches from a swap shuffle driven by 32-bit draws to the inside-out shuffle driven by
# 64-bit draws at this size (aten/src/ATen/native/TensorFactories.cpp, randperm_cpu)
_RANDPERM_SMALL = _MASK32 // 20
# torch.randint draws 64 bits per value from this span up (measured against torch 2.13: 2**28 - 1 takes 32 bits)
_RANDINT_WIDE = 2 ** 28


def _mt19937_key(seed):
    """The state init_genrand(seed) gives, as torch's at::mt19937 (and the C reference) seed it."""
    key = np.empty(624, dtype=np.uint32)
    s = seed & _MASK32
    key[0] = s
    for j in range(1, 624):
        s = (1812433253 * (s ^ (s >> 30)) + j) & _MASK32
        key[j] = s
    return key


class MT19937Generator:
    """torch.Generator (CPU) on NumPy: the same seed gives the same randperm and randint values as torch.

    torch's CPU generator is a standard MT19937 seeded with init_genrand(seed mod 2**32); randperm(n) for
    n < 2**32/20 is a forward Fisher-Yates loop swapping i with i + (draw mod (n - i)). NumPy's MT19937 bit
    generator produces the same 32-bit stream, so only the seeding and the loop are written out here.
    """

    def __init__(self, seed=_TORCH_DEFAULT_SEED):
        self._bits = np.random.MT19937()
        self.manual_seed(seed)

    def manual_seed(self, seed):
        seed = int(seed) & _MASK64            # torch wraps negative seeds the same way
        self._seed = seed
        self._bits.state = {"bit_generator": "MT19937", "state": {"key": _mt19937_key(seed), "pos": 624}}
        return self

    def initial_seed(self):
        return self._seed

    def get_state(self):
        return self._bits.state

    def set_state(self, state):
        self._bits.state = state
        return self

    def _draw32(self, n):
        return self._bits.random_raw(n)       # uint64 array holding 32-bit draws

    def _draw64(self, n):
        pairs = self._draw32(2 * n).reshape(n, 2)
        return (pairs[:, 0] << np.uint64(32)) | pairs[:, 1]

    def random_int64(self):
        """What torch.empty((), dtype=torch.int64).random_(generator=g) draws (the DataLoader's base seed)."""
        return int(self._draw64(1)[0] % np.uint64(2 ** 63))

    def randint(self, low, high=None, size=()):
        """torch.randint(low, high, size, generator=self) as an int64 array."""
        if high is None:
            low, high = 0, low
        span = int(high) - int(low)
        if span <= 0:
            raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={low} >= to={high}")
        size = (size,) if isinstance(size, int) else tuple(size)
        count = math.prod(size)
        draws = self._draw64(count) if span >= _RANDINT_WIDE else self._draw32(count)
        return ((draws % np.uint64(span)).astype(np.int64) + int(low)).reshape(size)

    def randperm(self, n):
        """torch.randperm(n, generator=self) as an int64 array."""
        n = int(n)
        if n < 0:
            raise RuntimeError(f"randperm: n must be non-negative, got {n}")
        if n >= _RANDPERM_SMALL:
            return self._randperm_inside_out(n)
        perm = list(range(n))
        if n > 1:
            steps = (self._draw32(n - 1) % np.arange(n, 1, -1, dtype=np.uint64)).tolist()
            # inherently sequential (each swap reads the previous ones); list swaps are the fastest Python form
            for i, step in enumerate(steps):
                j = i + step
                perm[i], perm[j] = perm[j], perm[i]
        return np.array(perm, dtype=np.int64)

    def _randperm_inside_out(self, n):
        perm = np.empty(n, dtype=np.int64)
        picks = (self._draw64(n) % np.arange(1, n + 1, dtype=np.uint64)).tolist()
        for i, z in enumerate(picks):
            perm[i] = perm[z]
            perm[z] = i
        return perm

    def __repr__(self):
        return f"MT19937Generator(seed={self._seed})"


def _global_generator():
    from ... import random
    return random.default_generator()


def _permutation(n, generator):
    """A random permutation of range(n) as int64: from torch's stream for an MT19937Generator, else NumPy's."""
    if generator is None:
        generator = _global_generator()
    if isinstance(generator, MT19937Generator):
        return generator.randperm(n)
    return generator.permutation(n).astype(np.int64, copy=False)


def _randint(high, size, generator):
    if generator is None:
        generator = _global_generator()
    if isinstance(generator, MT19937Generator):
        return generator.randint(high, size=size)
    return generator.integers(0, high, size=size, dtype=np.int64)


class Sampler:
    """Yields dataset indices (or lists of them, for batch samplers); `__len__` where the count is known."""

    def __init__(self, data_source=None):
        pass

    def __iter__(self):
        raise NotImplementedError


class SequentialSampler(Sampler):
    """0, 1, ..., len(data_source) - 1."""

    def __init__(self, data_source):
        self.data_source = data_source

    def __iter__(self):
        return iter(range(len(self.data_source)))

    def __len__(self):
        return len(self.data_source)


class RandomSampler(Sampler):
    """A fresh permutation each epoch, or `num_samples` draws with replacement.

    `generator`: None (smalltrain's global NumPy generator, read at each epoch so manual_seed applies), a
    numpy.random.Generator, or an MT19937Generator (then the indices are torch's for the same seed).
    """

    def __init__(self, data_source, replacement=False, num_samples=None, generator=None):
        self.data_source = data_source
        self.replacement = replacement
        self._num_samples = num_samples
        self.generator = generator
        if not isinstance(self.replacement, bool):
            raise TypeError(f"replacement should be a boolean value, but got replacement={self.replacement}")
        if not isinstance(self.num_samples, int) or self.num_samples <= 0:
            raise ValueError(f"num_samples should be a positive integer value, but got "
                             f"num_samples={self.num_samples}")

    @property
    def num_samples(self):
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __iter__(self):
        n = len(self.data_source)
        gen = self.generator
        # the draws are made in torch's order and chunks, so a shared MT19937Generator advances as torch's does
        if self.replacement:
            for _ in range(self.num_samples // 32):
                yield from _randint(n, 32, gen).tolist()
            yield from _randint(n, self.num_samples % 32, gen).tolist()
        else:
            for _ in range(self.num_samples // n):
                yield from _permutation(n, gen).tolist()
            yield from _permutation(n, gen)[: self.num_samples % n].tolist()

    def __len__(self):
        return self.num_samples


class SubsetRandomSampler(Sampler):
    """The given indices in a random order each epoch."""

    def __init__(self, indices, generator=None):
        self.indices = indices
        self.generator = generator

    def __iter__(self):
        for i in _permutation(len(self.indices), self.generator).tolist():
            yield self.indices[i]

    def __len__(self):
        return len(self.indices)


class BatchSampler(Sampler):
    """Groups the indices of `sampler` into lists of `batch_size` (the last one shorter unless drop_last)."""

    def __init__(self, sampler, batch_size, drop_last):
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise ValueError(f"batch_size should be a positive integer value, but got batch_size={batch_size}")
        if not isinstance(drop_last, bool):
            raise ValueError(f"drop_last should be a boolean value, but got drop_last={drop_last}")  # noqa: TRY004
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last

    def __iter__(self):
        # islice/zip group the indices in C: no Python-level step per sample
        it = iter(self.sampler)
        if self.drop_last:
            yield from (list(b) for b in zip(*[it] * self.batch_size))
            return
        batch = list(itertools.islice(it, self.batch_size))
        while batch:
            yield batch
            batch = list(itertools.islice(it, self.batch_size))

    def __len__(self):
        if self.drop_last:
            return len(self.sampler) // self.batch_size
        return (len(self.sampler) + self.batch_size - 1) // self.batch_size


def _from_process_group(what):
    try:
        from ... import distributed as dist
    except ImportError as e:
        raise RuntimeError("Requires distributed package to be available") from e
    if not dist.is_available():
        raise RuntimeError("Requires distributed package to be available")
    return dist.get_world_size() if what == "world_size" else dist.get_rank()


class DistributedSampler(Sampler):
    """This rank's shard of the dataset: torch's DistributedSampler, index for index.

    With shuffle, epoch e uses torch.randperm(n) seeded with seed + e (reproduced by MT19937Generator); the
    list is padded by repeating its start (or cut, with drop_last) to a multiple of num_replicas, and rank r
    takes every num_replicas-th index starting at r. Call set_epoch(e) before each epoch.
    """

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0, drop_last=False):
        if num_replicas is None:
            num_replicas = _from_process_group("world_size")
        if rank is None:
            rank = _from_process_group("rank")
        if rank >= num_replicas or rank < 0:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]")
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self.drop_last = drop_last
        n = len(dataset)
        if drop_last and n % num_replicas != 0:
            self.num_samples = math.ceil((n - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(n / num_replicas)
        self.total_size = self.num_samples * num_replicas
        self.shuffle = shuffle
        self.seed = seed

    def indices(self):
        """This rank's indices for the current epoch, as an int64 array."""
        n = len(self.dataset)
        if self.shuffle:
            order = MT19937Generator(self.seed + self.epoch).randperm(n)
        else:
            order = np.arange(n, dtype=np.int64)
        if self.drop_last:
            order = order[: self.total_size]
        elif n:
            order = np.resize(order, self.total_size)    # cyclic repetition = torch's padding
        return order[self.rank: self.total_size: self.num_replicas]

    def __iter__(self):
        return iter(self.indices().tolist())

    def __len__(self):
        return self.num_samples

    def set_epoch(self, epoch):
        self.epoch = epoch

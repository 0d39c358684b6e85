"""DataLoader and default_collate, torch.utils.data's: the same arguments, validation errors and batches.

Batches are built in the calling process. A dataset with `__getitems__` is asked for a whole batch at once; when
it answers with BatchedSamples (MNIST, TensorDataset, Subset of those) collation is free.
"""
import collections.abc
import copy
import itertools
import numbers
import warnings

import numpy as np

from ... import _dtype, creation
from ...ops.shape import stack
from ...tensor import Tensor
from .dataset import BatchedSamples, IterableDataset
from .sampler import BatchSampler, MT19937Generator, RandomSampler, SequentialSampler

__all__ = ["DataLoader", "default_collate", "default_convert"]

_COLLATE_ERR = "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found {}"


def _collate_sequence(batch, elem):
    it = iter(batch)
    size = len(next(it))
    if not all(len(e) == size for e in it):
        raise RuntimeError("each element in list of batch should be of equal size")
    transposed = list(zip(*batch))
    if isinstance(elem, tuple):
        return [default_collate(s) for s in transposed]      # tuples become lists, as in torch
    return _rebuild_sequence(elem, [default_collate(s) for s in transposed])


def _rebuild_sequence(proto, items):
    """The list `items` as a sequence of proto's type, as torch's collate and convert do: a mutable sequence is
    copied and filled in place (it keeps its other attributes), another type is called with the list, and a type
    that cannot be built either way gives the list."""
    try:
        if isinstance(proto, collections.abc.MutableSequence):
            clone = copy.copy(proto)
            for i, item in enumerate(items):
                clone[i] = item
            return clone
        return type(proto)(items)
    except TypeError:
        return items


def _collate_mapping(batch, elem):
    return _rebuild_mapping(elem, {key: default_collate([d[key] for d in batch]) for key in elem})


def _rebuild_mapping(proto, items):
    """The dict `items` as a mapping of proto's type, as torch's collate and convert do: a mutable mapping is copied
    and updated (it keeps its other attributes), another type is called with the dict, and a type that cannot be
    built either way gives the dict."""
    try:
        if isinstance(proto, collections.abc.MutableMapping):
            clone = copy.copy(proto)
            clone.update(items)
            return clone
        return type(proto)(items)
    except TypeError:
        return items


def default_collate(batch):
    """Merge a list of samples into a batch, as torch's default_collate: Tensors and arrays are stacked on a new
    first dim, Python floats become float64 and ints int64 tensors, strings stay a list, and tuples
    (returned as lists), lists, named tuples and dicts are collated field by field."""
    if isinstance(batch, BatchedSamples):
        return batch.collated()
    elem = batch[0]
    if isinstance(elem, Tensor):
        return stack(list(batch), 0)
    if isinstance(elem, (np.ndarray, np.generic)) and not isinstance(elem, (np.str_, np.bytes_)):
        if elem.dtype.kind in "OSUV":
            raise TypeError(_COLLATE_ERR.format(elem.dtype))
        if elem.shape == ():
            return creation.as_tensor(np.asarray(batch))
        return creation.as_tensor(np.stack(batch))
    if isinstance(elem, float):
        return creation.tensor(batch, dtype=_dtype.float64)
    if isinstance(elem, numbers.Integral):
        return creation.tensor(batch)
    if isinstance(elem, (str, bytes)):
        return batch
    if isinstance(elem, collections.abc.Mapping):
        return _collate_mapping(batch, elem)
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):
        return type(elem)(*(default_collate(s) for s in zip(*batch)))
    if isinstance(elem, collections.abc.Sequence):
        return _collate_sequence(batch, elem)
    raise TypeError(_COLLATE_ERR.format(type(elem)))


def _is_numpy_numeric(x):
    return isinstance(x, (np.ndarray, np.generic)) and x.dtype.kind not in "OSUV"


def default_convert(data):
    """What batch_size=None loaders apply to each sample: NumPy arrays and scalars become Tensors, containers
    are converted element by element (tuples become lists, as in torch), anything else is left alone."""
    if _is_numpy_numeric(data):
        return creation.as_tensor(data)
    if isinstance(data, collections.abc.Mapping):
        return _rebuild_mapping(data, {k: default_convert(v) for k, v in data.items()})
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]
    if isinstance(data, collections.abc.Sequence) and not isinstance(data, (str, bytes)):
        return _rebuild_sequence(data, [default_convert(d) for d in data])
    return data


class _MapFetcher:
    def __init__(self, dataset, auto_collation, collate_fn):
        self.dataset, self.auto_collation, self.collate_fn = dataset, auto_collation, collate_fn
        self.getitems = getattr(dataset, "__getitems__", None) if auto_collation else None

    def __call__(self, index):
        if not self.auto_collation:
            return self.collate_fn(self.dataset[index])
        if self.getitems:
            return self.collate_fn(self.getitems(index))       # one gather for the whole batch
        return self.collate_fn([self.dataset[i] for i in index])


class _IterableFetcher:
    def __init__(self, dataset, auto_collation, collate_fn, drop_last):
        self.it, self.auto_collation, self.collate_fn, self.drop_last = iter(dataset), auto_collation, \
            collate_fn, drop_last

    def __call__(self, index):
        if not self.auto_collation:
            return self.collate_fn(next(self.it))
        data = list(itertools.islice(self.it, len(index)))
        if not data or (self.drop_last and len(data) < len(index)):
            raise StopIteration
        return self.collate_fn(data)


class _InfiniteConstantSampler:
    def __iter__(self):
        return itertools.repeat(None)


class _DataLoaderIter:
    """One pass over the loader (what `iter(loader)` returns): `len()` and `next()` like torch's iterator."""

    def __init__(self, loader):
        self._loader = loader
        self._index_iter = iter(loader._index_sampler)
        # torch draws a base seed for workers from loader.generator on every pass, after iter(sampler); drawing
        # it too keeps a shared MT19937Generator in step, so shuffle=True batches stay identical to torch's
        if isinstance(loader.generator, MT19937Generator):
            loader.generator.random_int64()
        if loader._is_iterable:
            self._fetch = _IterableFetcher(loader.dataset, loader._auto_collation, loader.collate_fn,
                                           loader.drop_last)
        else:
            self._fetch = _MapFetcher(loader.dataset, loader._auto_collation, loader.collate_fn)

    def __iter__(self):
        return self

    def __next__(self):
        return self._fetch(next(self._index_iter))

    def __len__(self):
        return len(self._loader)


class DataLoader:
    """Iterate a dataset in batches: torch.utils.data.DataLoader's arguments, checks and batches.

    Loading happens in the calling process: num_workers > 0 is accepted (with a warning) and gives the same
    batches; pin_memory is a no-op (there is no pinned host memory on the NumPy backend).
    """

    _frozen = ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers")

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None, num_workers=0,
                 collate_fn=None, pin_memory=False, drop_last=False, timeout=0, worker_init_fn=None,
                 multiprocessing_context=None, generator=None, *, prefetch_factor=None, persistent_workers=False,
                 pin_memory_device="", in_order=True):
        self._check_workers(num_workers, timeout, prefetch_factor, persistent_workers)
        self.dataset, self.num_workers, self.pin_memory, self.timeout = dataset, num_workers, pin_memory, timeout
        self.worker_init_fn, self.multiprocessing_context = worker_init_fn, multiprocessing_context
        self.prefetch_factor, self.pin_memory_device, self.in_order = prefetch_factor, pin_memory_device, in_order
        self._is_iterable = isinstance(dataset, IterableDataset)
        if self._is_iterable:
            self._check_iterable(shuffle, sampler, batch_sampler)
        else:
            shuffle = bool(shuffle)
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, "
                                 "and drop_last")
            batch_size, drop_last = None, False
        elif batch_size is None and drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually exclusive with "
                             "drop_last")
        if sampler is None:
            if self._is_iterable:
                sampler = _InfiniteConstantSampler()
            else:
                sampler = RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
        if batch_size is not None and batch_sampler is None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.batch_size, self.drop_last, self.sampler, self.batch_sampler = batch_size, drop_last, sampler, \
            batch_sampler
        self.generator = generator
        if collate_fn is None:
            collate_fn = default_collate if self._auto_collation else default_convert
        self.collate_fn = collate_fn
        self.persistent_workers = persistent_workers
        self._initialized = True

    @staticmethod
    def _check_workers(num_workers, timeout, prefetch_factor, persistent_workers):
        if num_workers < 0:
            raise ValueError("num_workers option should be non-negative; use num_workers=0 to disable "
                             "multiprocessing.")
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError("prefetch_factor option could only be specified in multiprocessing.let num_workers "
                             "> 0 to enable multiprocessing, otherwise set prefetch_factor to None.")
        if prefetch_factor is not None and prefetch_factor < 0:
            raise ValueError("prefetch_factor option should be non-negative")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        if num_workers > 0:
            warnings.warn(f"DataLoader: num_workers={num_workers} is accepted for compatibility; smalltrain "
                          "loads batches in the main process (one vectorized gather per batch)", stacklevel=4)

    @staticmethod
    def _check_iterable(shuffle, sampler, batch_sampler):
        if shuffle not in {False, None}:
            raise ValueError(f"DataLoader with IterableDataset: expected unspecified shuffle option, but got "
                             f"shuffle={shuffle}")
        if sampler is not None:
            raise ValueError(f"DataLoader with IterableDataset: expected unspecified sampler option, but got "
                             f"sampler={sampler}")
        if batch_sampler is not None:
            raise ValueError(f"DataLoader with IterableDataset: expected unspecified batch_sampler option, but "
                             f"got batch_sampler={batch_sampler}")

    def __setattr__(self, name, value):
        if getattr(self, "_initialized", False) and name in self._frozen:
            raise ValueError(f"{name} attribute should not be set after {type(self).__name__} is initialized")
        super().__setattr__(name, value)

    @property
    def _auto_collation(self):
        return self.batch_sampler is not None

    @property
    def _index_sampler(self):
        return self.batch_sampler if self._auto_collation else self.sampler

    def __iter__(self):
        return _DataLoaderIter(self)

    def __len__(self):
        if self._is_iterable:
            n = len(self.dataset)
            if self.batch_size is not None:
                n = n // self.batch_size if self.drop_last else -(-n // self.batch_size)
            return n
        return len(self._index_sampler)

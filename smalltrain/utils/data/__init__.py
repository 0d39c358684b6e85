"""`smalltrain.utils.data`, torch.utils.data's subset: datasets, samplers (DistributedSampler index-exact with
torch's), DataLoader with vectorized batch fetching, default_collate, and DeviceDataLoader (data set resident on the
GPU)."""
from .dataloader import DataLoader, default_collate, default_convert
from .device import DeviceDataLoader
from .dataset import BatchedSamples, ConcatDataset, Dataset, IterableDataset, Subset, TensorDataset, random_split
from .sampler import (BatchSampler, DistributedSampler, MT19937Generator, RandomSampler, Sampler,
                      SequentialSampler, SubsetRandomSampler)

__all__ = ["BatchSampler", "BatchedSamples", "ConcatDataset", "DataLoader", "Dataset", "DeviceDataLoader",
           "DistributedSampler",
           "IterableDataset", "MT19937Generator", "RandomSampler", "Sampler", "SequentialSampler", "Subset",
           "SubsetRandomSampler", "TensorDataset", "default_collate", "default_convert", "random_split"]

"""`smalltrain.Generator`, torch.Generator's counterpart: a seeded random stream to hand to randn/rand/randint/
randperm, Tensor.normal_/uniform_, nn.init, DataLoader, RandomSampler and random_split.

It is the MT19937 generator torch's CPU generator is (utils.data.sampler.MT19937Generator), so randperm, randint,
shuffles and random_split give torch's numbers for the same seed; floats (rand, randn, normal_, uniform_) come from
NumPy's algorithms on that same stream: reproducible from the seed, not torch's values.
"""
import secrets

import numpy as np

from .backend import as_device
from .utils.data.sampler import MT19937Generator


class Generator(MT19937Generator):
    """Generator(device='cpu'); manual_seed(seed) returns the generator, as torch's. A CUDA generator draws on the
    host and the tensors are copied to the device (one stream for both, as smalltrain's global generator)."""

    def __init__(self, device="cpu"):
        super().__init__()
        self.device = as_device(device)
        self._numpy = np.random.Generator(self._bits)   # shares the MT19937 state: one stream

    def seed(self):
        """Seed from the operating system's entropy and return that seed (torch.Generator.seed)."""
        s = secrets.randbits(63)
        self.manual_seed(s)
        return s

    def set_state(self, state):
        super().set_state(state)
        return self

    # the numpy.random.Generator methods creation and nn.init draw with
    def random(self, size=None, dtype=np.float64):
        return self._numpy.random(size, dtype=dtype)

    def standard_normal(self, size=None, dtype=np.float64):
        return self._numpy.standard_normal(size, dtype=dtype)

    def uniform(self, low=0.0, high=1.0, size=None):
        return self._numpy.uniform(low, high, size)

    def normal(self, loc=0.0, scale=1.0, size=None):
        return self._numpy.normal(loc, scale, size)

    def integers(self, low, high=None, size=None, dtype=np.int64):
        return self.randint(low, high, () if size is None else size).astype(dtype, copy=False)

    def permutation(self, n):
        return self.randperm(n)

    def __repr__(self):
        return f"<smalltrain.Generator(device='{self.device}', seed={self.initial_seed()})>"

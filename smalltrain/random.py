"""The global random state: one NumPy generator for CPU tensors (and CuPy's for CUDA), seeded by manual_seed."""
import numpy as np

_generator = np.random.default_rng(0)
_seed = 0


def manual_seed(seed):
    """Seed every generator smalltrain uses: the same seed gives the same numbers."""
    global _generator, _seed
    seed = int(seed)
    if seed < 0:
        raise ValueError(f"manual_seed: expected a non-negative seed, got {seed}")
    _seed = seed
    _generator = np.random.default_rng(seed)
    from .backend import cuda
    if cuda._cupy is not None:
        cuda._cupy.random.seed(seed)
    return _generator


def default_generator():
    """The global numpy.random.Generator."""
    return _generator


def initial_seed():
    return _seed


def get_rng_state():
    """A JSON-serializable snapshot of the CPU generator (for checkpoints)."""
    return _generator.bit_generator.state


def set_rng_state(state):
    _generator.bit_generator.state = state


seed = manual_seed

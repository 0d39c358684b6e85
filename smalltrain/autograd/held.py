"""One kernel launch held back, so that the op after it can take it over: fusion across an op boundary.

An op cannot know, when it launches, what reads its output next. The CUDA ops that end in logits (the chain of
linear layers, ops/matmul.py LinearChain) therefore hold their forward launch while a
CUDA graph is captured, and mark their output tensor held; cross_entropy, finding a held tensor as its input,
takes the launch and runs one kernel for both (backend/cuda/_common.py HeldHead). Anything else that could see
the held output, or whose work must run after it, runs it first ("flushes"):
  - reading the held tensor in any way (HeldTensor: its `array`, and so its shape, dtype, device and data);
  - any op (Function.apply) and any launch of the CUDA backend's kernels (backend/cuda/_common.get), so that work
    queued after the hold stays after it;
  - the end of a capture (backend/cuda/graphs.py; an aborted capture drops it).
One launch is held at a time: holding another flushes the first. The record of the launch held now is
backend/hooks.py's `held` (None when none is), where the backend's launches read it; autograd/handoff.py installs
hold, flush and drop as the backend's hooks.
"""
from ..backend import hooks
from ..tensor import Tensor


class Held:
    """A held launch: `out` the array it writes, `launch()` the launch as it was, `info` what a taker needs to
    launch the fused kernel instead; `tensor` the op's output while it is marked held."""

    __slots__ = ("out", "launch", "info", "tensor", "done")

    def __init__(self, out, launch, info):
        self.out, self.launch, self.info, self.tensor, self.done = out, launch, info, None, False

    def settle(self):
        """Run the launch as it was, unless a taker already launched its fused kernel (`done`)."""
        if not self.done:
            self.done = True
            self.launch()


def hold(out, launch, info=None):
    """Hold `launch` (which writes `out`) until it is flushed or taken; flushes what was held before."""
    flush()
    hooks.held = Held(out, launch, info)


def pending():
    return hooks.held is not None


def flush():
    """Run the held launch, if any (before anything that could read what it writes)."""
    h = hooks.held
    if h is None:
        return
    hooks.held = None
    _release(h)
    h.settle()


def drop():
    """Forget the held launch without running it (a capture that failed: nothing it recorded is kept)."""
    h, hooks.held = hooks.held, None
    if h is not None:
        _release(h)
        if getattr(h, "prev", None) is not None:   # a deferred op holding a launch beneath it (pending.py)
            _release(h.prev)


def mark(tensor):
    """Tie the held launch to `tensor`, the op's output over its `out` array: reading the tensor flushes it. A
    tensor over any other array, or one of a subclass, flushes it at once."""
    h = hooks.held
    if h is None:
        return tensor
    if type(tensor) is Tensor and _ARRAY.__get__(tensor) is h.out:
        h.tensor = tensor
        tensor.__class__ = HeldTensor
    else:
        flush()
    return tensor


def take(tensor):
    """The Held record whose output `tensor` is, now the caller's (who must launch its fused kernel or call
    settle()), or None where `tensor` is not held."""
    h = hooks.held
    if h is None or h.tensor is not tensor:
        return None
    hooks.held = None
    _release(h)
    return h


def _release(h):
    if h.tensor is not None:
        h.tensor.__class__ = Tensor
        h.tensor = None


_ARRAY = Tensor.__dict__["array"]   # the slot's own descriptor, which HeldTensor's property wraps


class HeldTensor(Tensor):
    """A Tensor whose array a held launch has not written yet: any access to the array runs that launch first and
    turns the tensor back into a plain Tensor (mark, flush)."""

    __slots__ = ()

    @property
    def array(self):
        flush()
        return _ARRAY.__get__(self)

    @array.setter
    def array(self, value):
        flush()
        _ARRAY.__set__(self, value)

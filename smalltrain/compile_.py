"""`smalltrain.compile(step)`: run a whole training step as one CUDA graph replay instead of ~100 launches.

On CUDA the step is run eagerly for a few warm-up calls (so optimizer state and workspaces exist), then captured
once per input signature (shapes, dtypes, devices) into a graph with static input buffers; later calls copy
their arguments into those buffers, replay, and return the captured outputs without a host sync. Anything that
cannot be captured (a host sync such as `.item()`) makes it warn once and run that signature eagerly. On the CPU
the step simply runs eagerly.
"""
import functools
import warnings

from .backend.cuda import cupy
from .tensor import Tensor


def _signature(args, kwargs):
    def one(a):
        if isinstance(a, Tensor):
            return ("T", a.array.shape, a.array.dtype.str, str(a.device))
        return ("V", repr(a))
    return tuple(one(a) for a in args) + tuple((k, one(v)) for k, v in sorted(kwargs.items()))


def _copy_into(dst, src):
    """dst[...] = src for a static input buffer (same shape, dtype and device: the signature matched). Contiguous
    arrays take one cudaMemcpyAsync on the current stream, ~10x less host time than CuPy's elementwise copy (which
    a replayed small step pays twice, beside a graph launch of a few microseconds)."""
    if dst.flags.c_contiguous and src.flags.c_contiguous:
        cp = cupy()
        cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, dst.nbytes, cp.cuda.runtime.memcpyDeviceToDevice,
                                    cp.cuda.get_current_stream().ptr)
    else:
        dst[...] = src


class CompiledStep:
    """The callable `smalltrain.compile` returns; `.stats` counts captures, replays and eager calls."""

    def __init__(self, fn, warmup=3, warn_recapture=True):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.warmup = warmup
        self.warn_recapture = warn_recapture
        self.entries = {}   # signature -> (graph, static inputs, outputs) or "eager"
        self.seen = {}      # signature -> warm-up calls made
        self.stats = {"captures": 0, "replays": 0, "eager": 0}

    def __call__(self, *args, **kwargs):
        tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, Tensor)]
        if not tensors or not tensors[0].is_cuda:
            self.stats["eager"] += 1
            return self.fn(*args, **kwargs)
        sig = _signature(args, kwargs)
        entry = self.entries.get(sig)
        if entry == "eager" or (entry is None and self.seen.get(sig, 0) < self.warmup):
            self.seen[sig] = self.seen.get(sig, 0) + 1
            self.stats["eager"] += 1
            return self.fn(*args, **kwargs)
        if entry is None:
            entry = self._capture(sig, args, kwargs)
            if entry == "eager":
                self.stats["eager"] += 1
                return self.fn(*args, **kwargs)
        graph, static_args, static_kwargs, outputs = entry
        for a, s in zip(args, static_args):
            if isinstance(a, Tensor) and a is not s:
                _copy_into(s.array, a.array)
        for k, a in kwargs.items():
            if isinstance(a, Tensor) and a is not static_kwargs[k]:
                _copy_into(static_kwargs[k].array, a.array)
        graph.replay()
        self.stats["replays"] += 1
        return outputs

    def _capture(self, sig, args, kwargs):
        from .backend.cuda.graphs import CUDAGraph, graph
        if self.entries and self.warn_recapture:
            warnings.warn(f"smalltrain.compile({self.fn.__name__}): new input shapes or dtypes; capturing another "
                          "graph for them", stacklevel=3)
        static_args = [Tensor._wrap(a.array.copy()) if isinstance(a, Tensor) else a for a in args]
        static_kwargs = {k: Tensor._wrap(v.array.copy()) if isinstance(v, Tensor) else v for k, v in kwargs.items()}
        g = CUDAGraph()
        try:
            with graph(g):
                outputs = self.fn(*static_args, **static_kwargs)
        except Exception as e:  # a host sync or another non-capturable operation inside the step
            warnings.warn(f"smalltrain.compile({self.fn.__name__}): cannot capture this step as a CUDA graph "
                          f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); running it eagerly",
                          stacklevel=3)
            self.entries[sig] = "eager"
            return "eager"
        self.stats["captures"] += 1
        entry = (g, static_args, static_kwargs, outputs)
        self.entries[sig] = entry
        return entry


def compile(fn=None, *, warmup=3, mode=None, warn_recapture=True):  # noqa: A001 - torch's name
    """Capture `fn` (a training step) as a CUDA graph on first CUDA use; usable as `@smalltrain.compile` too.

    warn_recapture=False silences the warning for a new input signature (the trainer's last partial batch).
    """
    if fn is None:
        return lambda f: CompiledStep(f, warmup, warn_recapture)
    return CompiledStep(fn, warmup, warn_recapture)

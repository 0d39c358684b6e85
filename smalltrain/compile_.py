"""`smalltrain.compile(step)`: run a whole training step as one CUDA graph replay instead of ~100 launches.

On CUDA the step is run eagerly for a few warm-up calls (so optimizer state and workspaces exist), then captured
once per input signature (shapes, dtypes, devices) into a graph with static input buffers; later calls copy
their arguments into those buffers (by a node at the head of the graph whose sources each call sets), replay,
and return the captured outputs without a host sync. Anything that
cannot be captured (a host sync such as `.item()`) makes it warn once and run that signature eagerly. On the CPU
the step simply runs eagerly.
"""
import functools
import warnings

from .backend.cuda.index import COPY_MAX, copy_many, copy_sources
from .tensor import Tensor

# A replay's tensor arguments are copied into the graph's static buffers by a kernel node at its head
# (index.copy_many, up to 4 a node) whose sources each call sets before the launch (graphs.KernelNode): a
# cudaMemcpyAsync each, queued before the launch, left 6.5-8.8 us between one replay's last kernel and the next's
# first (benchmarks/RESULTS.md, "CUDA host side and capture").


def _signature(args, kwargs):
    def one(a):
        if isinstance(a, Tensor):
            return ("T", a.array.shape, a.array.dtype.str, str(a.device))
        return ("V", repr(a))
    return tuple(one(a) for a in args) + tuple((k, one(v)) for k, v in sorted(kwargs.items()))


class CompiledStep:
    """The callable `smalltrain.compile` returns; `.stats` counts captures, replays and eager calls."""

    def __init__(self, fn, warmup=3, warn_recapture=True):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.warmup = warmup
        self.warn_recapture = warn_recapture
        self.entries = {}   # signature -> (graph, static inputs, outputs, input copy nodes or None) or "eager"
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
        graph, static_args, static_kwargs, outputs, nodes = entry
        pairs = [(s.array, a.array) for a, s in zip(args, static_args) if isinstance(a, Tensor)]
        # (in the capture's order of the keywords: the nodes' slots follow it)
        pairs += [(s.array, kwargs[k].array) for k, s in static_kwargs.items() if isinstance(s, Tensor)]
        # the graph's head copies the contiguous ones; a view is copied into its buffer before the launch
        sources = []
        for dst, src in pairs:
            if dst is not src and not src.flags.c_contiguous:
                dst[...] = src
            sources.append(src if dst is not src and src.flags.c_contiguous else None)
        for i, node in enumerate(nodes):
            copy_sources(node, sources[i * COPY_MAX:(i + 1) * COPY_MAX])
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
                # sources to be set by each call (the buffers themselves until then)
                statics = [a.array for a in list(static_args) + list(static_kwargs.values()) if isinstance(a, Tensor)]
                nodes = copy_many([(a, a) for a in statics], updatable=True)
                outputs = self.fn(*static_args, **static_kwargs)
        except Exception as e:  # a host sync or another non-capturable operation inside the step
            warnings.warn(f"smalltrain.compile({self.fn.__name__}): cannot capture this step as a CUDA graph "
                          f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); running it eagerly",
                          stacklevel=3)
            self.entries[sig] = "eager"
            return "eager"
        self.stats["captures"] += 1
        entry = (g, static_args, static_kwargs, outputs, nodes)
        self.entries[sig] = entry
        return entry


def compile(fn=None, *, warmup=3, mode=None, warn_recapture=True):  # noqa: A001 - torch's name
    """Capture `fn` (a training step) as a CUDA graph on first CUDA use; usable as `@smalltrain.compile` too.

    warn_recapture=False silences the warning for a new input signature (the trainer's last partial batch).
    """
    if fn is None:
        return lambda f: CompiledStep(f, warmup, warn_recapture)
    return CompiledStep(fn, warmup, warn_recapture)

"""CUDA graphs on CuPy: capture a stretch of work once, replay it with one launch (`smalltrain.cuda.CUDAGraph`).

Allocations made while capturing come from a pool private to the graph, so the addresses the graph writes
stay valid and reserved for replays (the same contract as torch.cuda.graph).

A replay runs no Python, so host values read while capturing are frozen into the graph. Code whose inputs
change between replays (an optimizer's learning rate under a scheduler) keeps them in device memory and
registers a hook with `on_replay`; every replay of that graph first runs its hooks on the host.
"""
import contextlib

from ...autograd import held
from . import cupy

_capturing = []   # the CUDAGraphs whose capture is in progress, innermost last


def is_current_stream_capturing():
    """True while a capture is in progress: ops skip host-synchronizing checks then (see ops that read it)."""
    return bool(_capturing)


def keep_alive(obj):
    """Tie obj's lifetime to the graph being captured now (memory its replays read); False outside a capture."""
    if not _capturing:
        return False
    _capturing[-1].kept.append(obj)
    return True


def on_replay(hook):
    """Run hook() on the host before every replay of the graph being captured now; False outside a capture."""
    if not _capturing:
        return False
    _capturing[-1].replay_hooks.append(hook)
    return True


class CUDAGraph:
    """A captured graph. `capture_begin()` / `capture_end()` (or `with smalltrain.cuda.graph(g):`), then `replay()`."""

    def __init__(self):
        cp = cupy()
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.pool = cp.cuda.MemoryPool()
        self.graph = None
        self.replay_hooks = []
        self.kept = []   # buffers that replays read but that nothing else may keep alive (see keep_alive)
        self._prev_allocator = None
        self._stream_ctx = None

    def capture_begin(self):
        cp = cupy()
        if self.graph is not None:
            raise RuntimeError("CUDAGraph: this graph was already captured; make a new CUDAGraph to capture again")
        # work queued before the capture must finish first: the graph reads what it wrote
        cp.cuda.get_current_stream().synchronize()
        self._prev_allocator = cp.cuda.get_allocator()
        cp.cuda.set_allocator(self.pool.malloc)
        self._stream_ctx = self.stream.__enter__()
        _capturing.append(self)
        try:
            self.stream.begin_capture()
        except Exception:
            self._restore()
            raise

    def capture_end(self):
        try:
            held.flush()   # a launch held back inside the capture belongs to it (autograd/held.py)
            self.graph = self.stream.end_capture()
            self.graph.upload(self.stream)
        finally:
            self._restore()

    def abort(self):
        """End a capture that failed (e.g. a host sync inside it), leaving no graph."""
        held.drop()
        try:
            if self.stream.is_capturing():
                self.stream.end_capture()
        except Exception:
            pass
        self._restore()

    def _restore(self):
        cp = cupy()
        if self._stream_ctx is not None:
            self.stream.__exit__(None, None, None)
            self._stream_ctx = None
            _capturing.remove(self)
        if self._prev_allocator is not None:
            cp.cuda.set_allocator(self._prev_allocator)
            self._prev_allocator = None

    def replay(self):
        if self.graph is None:
            raise RuntimeError("CUDAGraph.replay: nothing captured yet")
        for hook in self.replay_hooks:
            hook()
        self.graph.launch(cupy().cuda.get_current_stream())


@contextlib.contextmanager
def graph(cuda_graph):
    """`with smalltrain.cuda.graph(g): ...` captures the block into g (run it once eagerly first to warm up)."""
    cuda_graph.capture_begin()
    try:
        yield cuda_graph
    except BaseException:
        cuda_graph.abort()
        raise
    cuda_graph.capture_end()

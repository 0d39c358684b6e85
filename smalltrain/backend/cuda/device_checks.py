"""Value checks that run on the GPU and are reported at the next host synchronization, as torch's device asserts.

Whether a class index, an embedding row or a gather index is in range is known only once the data is read, and
reading it back from the GPU inside a step stalls the pipeline (and breaks a CUDA graph capture). So an op that
must check values on the GPU takes a flag (`flag`: a 1-element uint32 device array, zero until a kernel sets it)
together with a function that describes the failure, and sets the flag from the device: a kernel of its own, or
`expect_none(bad, describe)` for a boolean array computed with CuPy. Nothing is read back then.

`raise_pending()` runs where the host synchronizes anyway (a tensor's item/numpy/tolist/repr, a copy to the CPU,
`smalltrain.cuda.synchronize`): it reads the flags set since the last check (one small copy per device) and raises
the first failure's exception, naming the op, what was expected and what came. A flag taken while a CUDA graph is
captured belongs to the graph: every replay arms it again, so a bad value in any replayed step is reported at the
sync after it.
"""
import numpy as np

from . import cupy
from . import graphs

CHUNK = 4096        # flags per device allocation (16 KiB)
MAX_PENDING = 1024  # an eager loop that never synchronizes is checked after this many flags (one read per MAX)

_chunks = {}   # device id -> [uint32 device arrays of CHUNK flags]
_used = {}     # device id -> flags handed out of the last chunk
_free = {}     # device id -> [(chunk, index)] flags of eager calls, checked and clear, to hand out again
_graph_owned = set()   # (device id, chunk, index) of flags taken while capturing: never freed, re-armed per replay
_pending = {}  # device id -> {(chunk, index): describe} flags that kernels may have set since the last check


def _new_chunk(dev):
    host = np.zeros(CHUNK, dtype=np.uint32)
    # while capturing, memory from the graph's pool would be reused by its replays: take it from outside, zeroed
    # when the capture ends (graphs.constant)
    chunk = graphs.constant(host) if graphs.is_current_stream_capturing() else cupy().asarray(host)
    _chunks.setdefault(dev, []).append(chunk)
    _used[dev] = 0


def _take(dev):
    free = _free.get(dev)
    if free and not graphs.is_current_stream_capturing():
        return free.pop()
    if dev not in _chunks or _used[dev] == CHUNK:
        _new_chunk(dev)
    _used[dev] += 1
    return len(_chunks[dev]) - 1, _used[dev] - 1


def flag(describe):
    """A zeroed 1-element uint32 array on the current device for a kernel to set (to any nonzero value) when the
    values it checks are bad; `describe()` then returns the exception to raise (it may read the arrays it closes
    over: it runs on the host at the check, after the work before it has finished)."""
    dev = cupy().cuda.Device().id
    pending = _pending.setdefault(dev, {})
    if len(pending) >= MAX_PENDING:
        raise_pending()
        pending = _pending.setdefault(dev, {})
    key = _take(dev)
    pending[key] = describe
    if graphs.is_current_stream_capturing():
        _graph_owned.add((dev,) + key)
        graphs.on_replay(lambda: _pending.setdefault(dev, {}).__setitem__(key, describe))
    chunk, i = key
    return _chunks[dev][chunk][i:i + 1]


def expect_none(bad, describe):
    """Report describe()'s exception at the next check if any element of the device array `bad` is true; queues
    one small reduction, reads nothing back."""
    if bad.size:
        f = flag(describe)
        f |= bad.any()


def raise_pending():
    """Read the flags set since the last check and raise the first failure's exception (see the module's
    docstring); a no-op when none is pending, and while a capture is in progress (reading would end it)."""
    if not _pending or graphs.is_current_stream_capturing():
        return
    cp = cupy()
    failure = None
    pending = list(_pending.items())
    _pending.clear()
    for dev, flags in pending:
        with cp.cuda.Device(dev):
            chunks = _chunks[dev]
            seen = {c: chunks[c].get() for c in {c for c, _ in flags}}
            for (c, i), describe in flags.items():
                if seen[c][i]:
                    chunks[c][i:i + 1].fill(0)
                    failure = failure or describe
                if (dev, c, i) not in _graph_owned:
                    _free.setdefault(dev, []).append((c, i))
    if failure is not None:
        raise failure()


def first_outside(values, lo, hi, skip=None):
    """The first of `values` (a NumPy or CuPy array, read to the host) outside [lo, hi) and other than `skip`, as
    an int; None if there is none by now (a describe() runs at the check, when a graph's input may already hold
    the next batch)."""
    v = values.ravel() if isinstance(values, np.ndarray) else values.ravel().get()
    out = (v < lo) | (v >= hi)
    if skip is not None:
        out &= v != skip
    bad = v[out]
    return int(bad[0]) if bad.size else None


def discard_pending():
    """Forget the failures found so far without raising them (a test's teardown: what one test left behind must not
    fail the next); the flags are cleared all the same."""
    try:
        raise_pending()
    except Exception:  # noqa: BLE001 - whatever the op's error type, it is dropped here on purpose
        pass

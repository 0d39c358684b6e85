"""CUDA graphs on CuPy: capture a stretch of work once, replay it with one launch (`smalltrain.cuda.CUDAGraph`).

Allocations made while capturing come from a pool private to the graph, so the addresses the graph writes
stay valid and reserved for replays (the same contract as torch.cuda.graph).

A replay runs no Python, so host values read while capturing are frozen into the graph. Code whose inputs
change between replays (an optimizer's learning rate under a scheduler) keeps them in device memory and
registers a hook with `on_replay`; every replay of that graph first runs its hooks on the host. Data the replays
read that is the same on every replay but made while capturing (an optimizer's table of addresses, which point
into the graph's pool) is a `constant`: written once when the capture ends, not by a node of every replay. The
other way round, a kernel captured by `updatable_launch` is a node whose arguments each call may replace before
launching a replay (`KernelNode.set`), without queueing any work: how a compiled step takes its inputs.

On a real driver a graph is instantiated with its nodes' stream priorities: captures run on a stream of the device's
greatest priority and run_beside's side streams (_common.py) have the least, so where a side kernel and a main-stream
kernel both wait for SMs, a replay dispatches the main stream's blocks (the step's critical path) first. From compute
capability 9.0 on, smalltrain's kernels in a graph are launched with programmatic stream serialization (PDL:
ProgrammaticKernel below), so that a replay starts each one while its predecessor still runs; every kernel of
kernels/*.cu first waits for its predecessors to finish (ST_GRID_WAIT, common.cuh), so only the launch's latency is
hidden.
"""
import contextlib
import ctypes

import numpy as np

from .. import hooks
from . import cupy

_capturing = []   # the CUDAGraphs whose capture is in progress, innermost last

_PROGRAMMATIC_STREAM_SERIALIZATION = 6   # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (cuda.h)
_GREATEST_PRIORITY = -(1 << 20)   # CUDA clamps a stream's priority into the device's range (greatest: -5 on H100)
_INSTANTIATE_FLAG_USE_NODE_PRIORITY = 8   # CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY (cuda.h)


class _LaunchAttribute(ctypes.Structure):   # CUlaunchAttribute: an id, padding to 8 bytes, a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_char * 64)]


class _LaunchConfig(ctypes.Structure):   # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("smem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)), ("nattrs", ctypes.c_uint)]


class _KernelNodeParams(ctypes.Structure):   # CUDA_KERNEL_NODE_PARAMS_v2
    _fields_ = [("func", ctypes.c_void_p), ("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("smem", ctypes.c_uint), ("params", ctypes.POINTER(ctypes.c_void_p)), ("extra", ctypes.c_void_p),
                ("kern", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


_SCALARS = {"int32": ctypes.c_int32, "int64": ctypes.c_int64, "uint32": ctypes.c_uint32, "uint64": ctypes.c_uint64,
            "float32": ctypes.c_float, "float64": ctypes.c_double, "bool": ctypes.c_bool}


def pack_arguments(args, array_type):
    """Kernel arguments as cuLaunchKernelEx takes them: (the values, kept alive by the caller, and the array of
    their addresses). As CuPy passes them: an array (of array_type) by its device address, None as a null pointer,
    a NumPy scalar as its type, a Python int as int64, float as double and bool as bool."""
    values = []
    for a in args:
        if isinstance(a, array_type):
            values.append(ctypes.c_void_p(a.data.ptr))
        elif a is None:
            values.append(ctypes.c_void_p(None))
        elif isinstance(a, np.generic) and a.dtype.name in _SCALARS:
            values.append(_SCALARS[a.dtype.name](a.item()))
        elif isinstance(a, (bool, int, float)):
            values.append(ctypes.c_bool(a) if isinstance(a, bool) else ctypes.c_int64(a) if isinstance(a, int)
                          else ctypes.c_double(a))
        else:
            raise TypeError(f"programmatic launch: expected device arrays, None, NumPy scalars or Python numbers as "
                            f"kernel arguments, got {type(a).__name__}")
    return values, (ctypes.c_void_p * max(1, len(values)))(*[ctypes.addressof(v) for v in values])


def programmatic_launches():
    """True while a graph whose kernels are launched with PDL is being captured."""
    return bool(_capturing) and _capturing[-1].programmatic


class ProgrammaticKernel:
    """A CuPy kernel (RawKernel) launched with programmatic stream serialization (PDL, the module's docstring);
    attributes are the kernel's own."""

    def __init__(self, kern):
        object.__setattr__(self, "_kern", kern)

    def __getattr__(self, name):
        return getattr(self._kern, name)

    def __setattr__(self, name, value):
        setattr(self._kern, name, value)

    def __call__(self, grid, block, args, shared_mem=0):
        launch_ex(self._kern, grid, block, args, shared_mem, programmatic=True)


# programmaticStreamSerializationAllowed = 1, the one attribute a programmatic launch passes (built once)
_PROGRAMMATIC_ATTRIBUTE = _LaunchAttribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION,
                                           value=(1).to_bytes(4, "little") + bytes(60))


def _launch_shape(kern, grid, block):
    """(the CUfunction of the CuPy kernel `kern`, grid and block as three sizes each), as the driver takes them."""
    return (getattr(kern, "kernel", kern).ptr, tuple(grid) + (1,) * (3 - len(grid)),
            tuple(block) + (1,) * (3 - len(block)))


def launch_ex(kern, grid, block, args, shared_mem=0, programmatic=False):
    """Launch the CuPy kernel `kern` on the current stream through cuLaunchKernelEx, with programmatic stream
    serialization or without attributes (benchmarks/pdl_probe.py compares the two with CuPy's own launch)."""
    cp = cupy()
    driver = _Driver.get()
    values, params = pack_arguments(args, cp.ndarray)   # (values: alive until the launch has copied them)
    function, grid, block = _launch_shape(kern, grid, block)
    config = _LaunchConfig(grid, block, int(shared_mem), cp.cuda.get_current_stream().ptr,
                           ctypes.pointer(_PROGRAMMATIC_ATTRIBUTE), int(programmatic))
    driver.check(driver.cuLaunchKernelEx(ctypes.byref(config), function, params, None), "cuLaunchKernelEx")


_programmatic = {}   # id(RawKernel) -> (RawKernel, its ProgrammaticKernel)


def programmatic(kern):
    """kern's ProgrammaticKernel (one per kernel)."""
    entry = _programmatic.get(id(kern))
    if entry is None or entry[0] is not kern:
        entry = _programmatic[id(kern)] = (kern, ProgrammaticKernel(kern))
    return entry[1]


class _Driver:
    """The libcuda calls that CuPy does not offer with flags or attributes (graph instantiation, kernel launch),
    bound through ctypes once (as blas.py binds cuBLAS). CUgraph / CUgraphExec / CUstream are the runtime's
    cudaGraph_t / cudaGraphExec_t / cudaStream_t."""

    _instance = None

    @classmethod
    def get(cls):
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def __init__(self):
        lib = ctypes.CDLL("libcuda.so.1")
        vp = ctypes.c_void_p
        for name, args in {"cuGraphInstantiateWithFlags": [ctypes.POINTER(vp), vp, ctypes.c_ulonglong],
                           "cuLaunchKernelEx": [ctypes.POINTER(_LaunchConfig), vp, ctypes.POINTER(vp), vp],
                           "cuGraphUpload": [vp, vp], "cuGraphLaunch": [vp, vp],
                           "cuStreamGetCaptureInfo_v3": [vp, ctypes.POINTER(ctypes.c_int),
                                                         ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(vp),
                                                         ctypes.POINTER(ctypes.POINTER(vp)), ctypes.POINTER(vp),
                                                         ctypes.POINTER(ctypes.c_size_t)],
                           "cuGraphExecKernelNodeSetParams_v2": [vp, vp, ctypes.POINTER(_KernelNodeParams)],
                           "cuGraphExecDestroy": [vp], "cuGraphDestroy": [vp],
                           "cuGetErrorName": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]}.items():
            f = getattr(lib, name)
            f.argtypes, f.restype = args, ctypes.c_int
            setattr(self, name, f)

    def check(self, status, what):
        if status != 0:
            name = ctypes.c_char_p()
            self.cuGetErrorName(status, ctypes.byref(name))
            raise RuntimeError(f"{what} failed: {(name.value or b'CUresult %d' % status).decode()}")


class _DriverGraph:
    """An executable graph instantiated through the driver from a captured cudaGraph_t, with node priorities where
    asked: the launch / upload interface of cupy.cuda.graph.Graph. It keeps the cudaGraph_t until it is destroyed
    itself, because its kernel nodes' arguments are updated through that graph's node handles (KernelNode)."""

    def __init__(self, graph_handle, node_priorities):
        self._driver = _Driver.get()
        self._graph = ctypes.c_void_p(graph_handle)
        self._exec = ctypes.c_void_p()
        flags = _INSTANTIATE_FLAG_USE_NODE_PRIORITY if node_priorities else 0
        try:
            self._driver.check(self._driver.cuGraphInstantiateWithFlags(ctypes.byref(self._exec), graph_handle,
                                                                        flags), "cuGraphInstantiateWithFlags")
        except Exception:
            self._driver.cuGraphDestroy(graph_handle)
            self._graph = None
            raise

    def upload(self, stream):
        self._driver.check(self._driver.cuGraphUpload(self._exec, stream.ptr), "cuGraphUpload")

    def launch(self, stream):
        self._driver.check(self._driver.cuGraphLaunch(self._exec, stream.ptr), "cuGraphLaunch")

    def __del__(self):
        if getattr(self, "_exec", None):
            self._driver.cuGraphExecDestroy(self._exec)
        if getattr(self, "_graph", None):
            self._driver.cuGraphDestroy(self._graph)


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


def after_replay(hook):
    """Run hook() on the host after every replay of the graph being captured now is queued (work it queues then
    follows the replay on the stream: an event marking its end); False outside a capture."""
    if not _capturing:
        return False
    _capturing[-1].after_replay_hooks.append(hook)
    return True


def after_capture(hook):
    """Run hook(stream) once when the capture in progress ends, outside it, on the graph's stream, which is synchronized
    before the first replay: for device data every replay reads the same, written once rather than by a node of
    every replay. If the capture fails the hook never runs. False outside a capture."""
    if not _capturing:
        return False
    _capturing[-1].capture_end_hooks.append(hook)
    return True


def constant(host):
    """During a capture: a device array equal to host (a NumPy array) on every replay, for data made while capturing
    that the replays only read (an optimizer's table of addresses into the graph's pool). It is written once when
    the capture ends (after_capture) instead of by a copy node of every replay. Its memory comes from outside the
    graph's pool: the captured work reuses the pool's blocks in stream order, so a block freed earlier in the
    capture would be written again by every replay before the constant is read. None outside a capture."""
    if not _capturing:
        return None
    g, cp = _capturing[-1], cupy()
    host = np.ascontiguousarray(host)
    if g._prev_allocator is not None:
        dev = cp.ndarray(host.shape, host.dtype, memptr=g._prev_allocator(max(host.nbytes, 1)))
    else:   # the emulator: no allocator, and no array shares memory with another
        dev = cp.empty(host.shape, host.dtype)
    g.kept.append(dev)
    after_capture(lambda stream: dev.set(host, stream=stream))
    return dev


def updatable_launch(kern, grid, block, args, shared_mem=0):
    """During a capture: launch the CuPy kernel `kern` on the current stream as a kernel node whose arguments can be
    replaced before each replay (`node.set`, KernelNode's); the node is returned. None, launching nothing, outside a
    capture. On the emulator its kernels record such nodes themselves (tests/tooling/cuda_emulator.py
    capture_updatable)."""
    if not _capturing:
        return None
    g, cp = _capturing[-1], cupy()
    hooks.flush()   # (a launch held back belongs before this one)
    if not g.driver:
        return kern.capture_updatable(grid, block, args, shared_mem)
    driver = _Driver.get()
    launch_ex(kern, grid, block, args, shared_mem, programmatic=g.programmatic)
    # the node just captured is what the stream's next work would depend on
    status, capture_id, graph = ctypes.c_int(), ctypes.c_uint64(), ctypes.c_void_p()
    deps, edges, count = ctypes.POINTER(ctypes.c_void_p)(), ctypes.c_void_p(), ctypes.c_size_t()
    driver.check(driver.cuStreamGetCaptureInfo_v3(cp.cuda.get_current_stream().ptr, ctypes.byref(status),
                                                  ctypes.byref(capture_id), ctypes.byref(graph), ctypes.byref(deps),
                                                  ctypes.byref(edges), ctypes.byref(count)), "cuStreamGetCaptureInfo")
    if count.value != 1:
        raise RuntimeError(f"updatable_launch: expected the captured kernel as the stream's one dependency, got "
                           f"{count.value} dependencies")
    return KernelNode(g, deps[0], kern, grid, block, args, shared_mem)


class KernelNode:
    """A kernel node of a captured graph (updatable_launch) whose arguments can be replaced before a replay:
    `set({position: value})` takes device arrays (their address), None or Python ints for the arguments at those
    positions, the others keeping their last values. The change holds for the replays launched after it, not for
    those already queued (cuGraphExecKernelNodeSetParams)."""

    def __init__(self, cuda_graph, node, kern, grid, block, args, shared_mem):
        self.cuda_graph = cuda_graph
        self.node = ctypes.c_void_p(node)
        self._array = cupy().ndarray
        self.values, params = pack_arguments(args, self._array)
        function, grid, block = _launch_shape(kern, grid, block)
        self._params = _KernelNodeParams(function, grid, block, int(shared_mem),
                                         ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p)), None, None, None)
        self._keep = params

    def set(self, changes):
        graph = self.cuda_graph.graph
        if graph is None:
            raise RuntimeError("KernelNode.set: the graph's capture has not ended")
        for i, v in changes.items():   # (every call of a compiled step: no lookups per value)
            self.values[i].value = v.data.ptr if isinstance(v, self._array) else 0 if v is None else v
        driver = graph._driver
        driver.check(driver.cuGraphExecKernelNodeSetParams_v2(graph._exec, self.node, ctypes.byref(self._params)),
                     "cuGraphExecKernelNodeSetParams")


class CUDAGraph:
    """A captured graph. `capture_begin()` / `capture_end()` (or `with smalltrain.cuda.graph(g):`), then `replay()`."""

    def __init__(self):
        cp = cupy()
        # a real CUDA driver (not the emulator): the graph is instantiated through it (_DriverGraph), so that its
        # nodes can keep their priorities and have their arguments replaced between replays (KernelNode)
        self.driver = hasattr(cp.cuda.runtime, "streamEndCapture")
        self.node_priorities = self.driver
        # PDL needs compute capability 9.0 (ST_GRID_WAIT is compiled in from sm_90 on, a no-op before)
        self.programmatic = self.driver and int(cp.cuda.Device().compute_capability) >= 90
        self.stream = cp.cuda.Stream(non_blocking=True, priority=_GREATEST_PRIORITY) if self.node_priorities \
            else cp.cuda.Stream(non_blocking=True)
        self.pool = cp.cuda.MemoryPool()
        self.graph = None
        self.replay_hooks = []
        self.after_replay_hooks = []
        self.capture_end_hooks = []
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
            hooks.flush()   # a launch held back inside the capture belongs to it (hooks.held)
            if self.driver:
                self.graph = _DriverGraph(cupy().cuda.runtime.streamEndCapture(self.stream.ptr), self.node_priorities)
            else:
                self.graph = self.stream.end_capture()
            self.graph.upload(self.stream)
        finally:
            self._restore()
        if self.capture_end_hooks:
            for hook in self.capture_end_hooks:
                hook(self.stream)
            self.stream.synchronize()   # replays may be launched on another stream
            self.capture_end_hooks = []

    def abort(self):
        """End a capture that failed (e.g. a host sync inside it), leaving no graph."""
        hooks.drop()
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
        for hook in self.after_replay_hooks:
            hook()


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

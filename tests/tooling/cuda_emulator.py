"""Run smalltrain's CUDA C kernels on the CPU: g++ compiles a kernel family with cuda_emulator.h, and each CUDA thread
runs as a fiber (see the header for what is and is not emulated). Test tooling, not part of the installed package:
pytest finds it through pyproject's `pythonpath` (tests/tooling); a script outside pytest puts tests/tooling on
sys.path itself.

For testing kernels where no GPU is at hand, and for stepping through one in gdb. It is slow (scalar code, a fiber
switch per thread per barrier): use small shapes. Two levels:
- A kernel alone, called as CuPy's RawKernel, `kernel(grid, block, args, shared_mem=0)`, with NumPy arrays for
  device arrays and NumPy scalars of the parameters' exact widths (as backend/cuda/_common.py passes them); each
  argument's size is checked against the kernel's parameter list before it runs:

      import cuda_emulator
      kern = cuda_emulator.kernel("activation", "act_fwd_f32")
      kern((2,), (256,), (x, out, np.int64(x.size), np.int32(1)))

- smalltrain on an emulated H200: install() puts a NumPy-backed `cupy` in CuPy's place (DeviceArray, streams,
  graph capture and replay, cuBLAS with its column-major semantics, NCCL for a world of one process), under the
  backend's launchers and the Tensor-level CUDA paths alike. The test suite's CUDA cases run this way with
  SMALLTRAIN_CUDA_EMULATOR=1 where no GPU is present (install_if_requested: tests/conftest.py, and the worker
  processes of the distributed tests); NCCL between processes, timings and torch's own CUDA are out of its reach.
"""
import contextlib
import ctypes
import functools
import hashlib
import os
import re
import shutil
import stat
import subprocess
import tempfile
import types

import numpy as np

from smalltrain.backend.cuda import loader

HEADER = os.path.join(os.path.dirname(__file__), "cuda_emulator.h")
_FLAGS = ("-std=c++17", "-O1", "-g", "-fPIC", "-shared", "-fno-strict-aliasing", "-w")
# SMALLTRAIN_EMULATOR_ASAN=1: kernels built with AddressSanitizer (heap and global bounds: device arrays, shared
# memory), for a process started with the ASan runtime preloaded (see tests/testing/test_cuda_emulator.py). Fiber
# stacks are not instrumented (asan-stack=0): ASan cannot follow the switches between them.
_ASAN_FLAGS = ("-fsanitize=address", "--param", "asan-stack=0", "-fno-omit-frame-pointer")
# `extern __shared__ T name[];` (dynamic shared memory) becomes a pointer into the emulator's per-block buffer
_DYNAMIC_SHARED = re.compile(r"extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?([\w\s]+?)\s+(\w+)\s*\[\s*\]\s*;")
# a static `__shared__ T name[...];` (or scalar) gets a call that poisons it once per block
_STATIC_SHARED = re.compile(r"(__shared__\s+(?:__align__\(\d+\)\s+)?[\w:<>]+\s+(\w+)\s*(?:\[[^\]]+\]\s*)*;)")
_KERNEL = re.compile(r'extern\s+"C"\s+void\s+(\w+)\s*\(')


def available():
    """True where a C++ compiler (g++) is on PATH."""
    return shutil.which("g++") is not None


def _cache_dir():
    """The folder of compiled kernel libraries: SMALLTRAIN_EMULATOR_CACHE, else $XDG_CACHE_HOME/smalltrain/emulator
    (~/.cache by default). Private to the user: created 0700, and one that another user owns or may write to is
    refused, since ctypes loads (runs) whatever library lies there."""
    d = os.environ.get("SMALLTRAIN_EMULATOR_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "smalltrain", "emulator")
    os.makedirs(d, mode=0o700, exist_ok=True)
    check_private(d)
    return d


def check_private(folder):
    """Raise PermissionError unless `folder` is a directory owned by this user that no one else may write to."""
    st = os.stat(folder)
    if not stat.S_ISDIR(st.st_mode):
        raise PermissionError(f"cuda_emulator: the kernel cache {folder!r} is not a directory")
    if st.st_uid != os.geteuid():
        raise PermissionError(f"cuda_emulator: the kernel cache {folder!r} is owned by uid {st.st_uid}, not by this "
                              f"user (uid {os.geteuid()}); its libraries would be loaded and run: use a folder of "
                              f"your own (SMALLTRAIN_EMULATOR_CACHE)")
    if st.st_mode & 0o022:
        raise PermissionError(f"cuda_emulator: the kernel cache {folder!r} has mode {stat.S_IMODE(st.st_mode):04o}, "
                              f"writable by group or others, who could plant a library there: expected no group/"
                              f"other write permission (chmod 700)")


def _compile(source, name):
    """The path of a shared library of `source` (CUDA C) with a launcher per extern "C" kernel; cached by content."""
    if not available():
        raise RuntimeError("cuda_emulator: g++ is needed to compile kernels for the CPU, and it is not on PATH")
    with open(HEADER) as f:
        header = f.read()
    text = _DYNAMIC_SHARED.sub(r"\1* \2 = reinterpret_cast<\1*>(st_emu::dynamic_shared_base);", source)
    text = _STATIC_SHARED.sub(r"\1 st_emu::poison_shared(&\2, sizeof(\2));", text)
    text = '#include "cuda_emulator.h"\n' + text
    flags = _FLAGS + (_ASAN_FLAGS if os.environ.get("SMALLTRAIN_EMULATOR_ASAN") == "1" else ())
    key = hashlib.sha256("\0".join((header, text) + flags).encode()).hexdigest()[:20]
    cache = _cache_dir()
    out = os.path.join(cache, f"{name}-{key}.so")
    if os.path.exists(out):
        return out
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, name + ".cpp")
        with open(src, "w") as f:
            f.write(text)
        pre = subprocess.run(["g++", "-std=c++17", "-E", "-I", os.path.dirname(HEADER), src],
                             capture_output=True, text=True)
        if pre.returncode:
            raise RuntimeError(f"cuda_emulator: preprocessing {name} failed:\n{pre.stderr[-4000:]}")
        names = sorted(set(_KERNEL.findall(pre.stdout)))
        with open(src, "a") as f:
            f.write("\n// launchers, generated by cuda_emulator.py\n")
            for k in names:
                f.write(f'extern "C" int st_emu_launch_{k}(const unsigned* d, size_t s, void** a) '
                        f"{{ return st_emu::launch(&{k}, d, s, a); }}\n"
                        f'extern "C" int st_emu_params_{k}(int* sizes) '
                        f"{{ return st_emu::param_sizes(&{k}, sizes); }}\n")
        # the source stays beside the library (its debug information points there: gdb shows the kernel's lines)
        kept = out[:-3] + ".cpp"
        _replace_atomically(kept, lambda staged: shutil.copy(src, staged))

        def build(staged):
            cc = subprocess.run(["g++", *flags, "-I", os.path.dirname(HEADER), kept, "-o", staged],
                                capture_output=True, text=True)
            if cc.returncode:
                raise RuntimeError(f"cuda_emulator: compiling {name} failed:\n{cc.stderr[-4000:]}")
        _replace_atomically(out, build)
    return out


def _replace_atomically(path, write):
    """write(staged) makes the file at a fresh name beside `path` (same folder, so the same file system), which
    then replaces `path` in one rename: a concurrent reader (pytest-xdist workers compile the same family) never
    sees half a file, and a failed write leaves nothing behind."""
    fd, staged = tempfile.mkstemp(dir=os.path.dirname(path), prefix=os.path.basename(path) + ".", suffix=".tmp")
    os.close(fd)
    try:
        write(staged)
        os.replace(staged, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staged)
        raise


class Module:
    """A compiled kernel family: get_function(name) as CuPy's RawModule."""

    def __init__(self, source, name="module"):
        self.lib = ctypes.CDLL(_compile(source, name))
        self.lib.st_emu_error.restype = ctypes.c_char_p

    def get_function(self, name):
        return Kernel(self, name)


class Kernel:
    """One kernel: call it as a CuPy RawKernel, kernel(grid, block, args, shared_mem=0). As on the GPU, dynamic
    shared memory over 48 KiB needs max_dynamic_shared_size_bytes set first (the opt-in), up to an H200's."""

    max_dynamic_shared_size_bytes = 0

    def __init__(self, module, name):
        try:
            self._launch = getattr(module.lib, "st_emu_launch_" + name)
        except AttributeError:
            raise KeyError(f"cuda_emulator: no kernel named {name!r} in this module") from None
        self.module, self.name = module, name
        sizes = (ctypes.c_int * 64)()
        n = getattr(module.lib, "st_emu_params_" + name)(sizes)
        self.param_sizes = tuple(sizes[:n])

    def __call__(self, grid, block, args, shared_mem=0):
        _run(self._prepare(grid, block, args, shared_mem)[0])

    def capture_updatable(self, grid, block, args, shared_mem=0):
        """While a graph is captured: record this launch as a node whose arguments can be replaced before a replay
        (graphs.updatable_launch's contract, KernelNode's set); returns the node."""
        if not _capture:
            raise RuntimeError(f"cuda_emulator: {self.name}: an updatable node outside a capture")
        run, cells = self._prepare(grid, block, args, shared_mem)
        _run(run)
        return _UpdatableNode(self.name, cells)

    def _prepare(self, grid, block, args, shared_mem):
        """(the launch as a callable, the argument cells it reads when it runs)."""
        grid, block = _dims("grid", grid), _dims("block", block)
        shared_mem = int(shared_mem)
        allowed = max(SMEM_DEFAULT_BYTES, min(self.max_dynamic_shared_size_bytes,
                                              H200_ATTRIBUTES["MaxSharedMemoryPerBlockOptin"]))
        if shared_mem > allowed:
            raise RuntimeError(f"{self.name}: {shared_mem} bytes of dynamic shared memory, but the kernel may use "
                               f"{allowed} (over {SMEM_DEFAULT_BYTES} it must opt in: max_dynamic_shared_size_bytes)")
        args = tuple(args)
        if len(args) != len(self.param_sizes):
            raise TypeError(f"{self.name}: expected {len(self.param_sizes)} arguments, got {len(args)}")
        cells = []
        for i, (a, size) in enumerate(zip(args, self.param_sizes)):
            a = _unwrap(a)
            if isinstance(a, np.ndarray):
                if size != 8:
                    raise TypeError(f"{self.name}: argument {i} is an array, but the parameter is {size} bytes")
                cells.append(np.array([a.ctypes.data], dtype=np.uint64))
            elif isinstance(a, np.generic):
                if a.itemsize != size:
                    raise TypeError(f"{self.name}: argument {i} is {a.dtype} ({a.itemsize} bytes), but the "
                                    f"parameter is {size} bytes")
                cells.append(np.array([a]))
            else:
                raise TypeError(f"{self.name}: argument {i} must be a NumPy array or a NumPy scalar of the "
                                f"parameter's exact width, got {type(a).__name__}")
        ptrs = (ctypes.c_void_p * max(1, len(cells)))(*[c.ctypes.data for c in cells])
        dims = (ctypes.c_uint * 6)(*grid, *block)

        def run(cells=cells):   # the argument cells stay alive as long as a captured graph holds this
            if self._launch(dims, ctypes.c_size_t(shared_mem), ptrs):
                raise RuntimeError(f"{self.name}: {self.module.lib.st_emu_error().decode()}")
        return run, cells


class _UpdatableNode:
    """A recorded launch whose argument cells set({position: value}) rewrites in place, so that the graph's later
    replays read the new values: a device array (its address) or None where the launch took an array, a Python int
    where it took an integer scalar (the cell keeps its width). Replays run when launched here, so none is queued
    when the arguments change."""

    def __init__(self, name, cells):
        self.name, self.cells = name, cells

    def set(self, changes):
        if _capture:
            raise RuntimeError(f"cuda_emulator: {self.name}: set while the graph's capture has not ended")
        for i, v in changes.items():
            v = _unwrap(v)
            cell = self.cells[i]
            if isinstance(v, np.ndarray) or v is None:
                if cell.dtype != np.uint64:
                    raise TypeError(f"{self.name}: argument {i} was {cell.dtype}, not an array")
                cell[0] = 0 if v is None else v.ctypes.data
            elif isinstance(v, (int, np.integer)) and cell.dtype.kind in "iu":
                cell[0] = v
            else:
                raise TypeError(f"{self.name}: argument {i}: cannot set a {cell.dtype} cell to {type(v).__name__}")


def _dims(what, d):
    d = (d,) if isinstance(d, (int, np.integer)) else tuple(d)
    if not 1 <= len(d) <= 3 or any(int(v) < 1 for v in d):
        raise ValueError(f"cuda_emulator: {what} must be 1 to 3 positive sizes, got {d}")
    return tuple(int(v) for v in d) + (1,) * (3 - len(d))


@functools.lru_cache(maxsize=None)
def module(family):
    """The emulated module of smalltrain/backend/cuda/kernels/<family>.cu."""
    return Module(loader.read_source(loader.family_path(family)), family.replace("/", "_"))


def kernel(family, name):
    """The emulated kernel `name` of smalltrain/backend/cuda/kernels/<family>.cu."""
    return module(family).get_function(name)


# ---- an emulated device: CuPy's API over NumPy, for the host launchers of smalltrain/backend/cuda ------------------

# The device the host code plans for (its launch shapes depend on these): an H200's
H200_ATTRIBUTES = {"MultiProcessorCount": 132, "MaxSharedMemoryPerBlockOptin": 232448,
                   "MaxSharedMemoryPerMultiprocessor": 233472, "MaxThreadsPerMultiProcessor": 2048,
                   "WarpSize": 32, "MaxThreadsPerBlock": 1024}
SMEM_DEFAULT_BYTES = 48 * 1024


class DeviceArray:
    """A cupy.ndarray stand-in: a NumPy array inside (`_a`), with CuPy's surface. Not an ndarray, so that code that
    tells host from device arrays (isinstance(x, np.ndarray)) takes its CUDA path; and as CuPy, it refuses implicit
    conversion to NumPy (`.get()` copies to the host). Methods, operators, NumPy functions and ufuncs run on the
    inner array and hand back DeviceArrays (0-d arrays where NumPy gives scalars, as CuPy); while a graph is captured
    they go into it (_call), and reading values on the host raises, as a synchronization does in a capture."""

    __slots__ = ("_a",)
    __array_priority__ = 100

    def __init__(self, a):
        self._a = a

    # the attributes of an array that are plain values
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: _wrap(self._a.T))
    device = property(lambda self: _Device())
    data = property(lambda self: _Pointer(self._a.ctypes.data))

    @property
    def __cuda_array_interface__(self):
        a = self._a
        return {"shape": a.shape, "typestr": a.dtype.str, "data": (a.ctypes.data, not a.flags.writeable),
                "strides": None if a.flags.c_contiguous else a.strides, "version": 3}

    def get(self, stream=None, order="C", out=None):
        _host_sync("get")
        if out is not None:
            np.copyto(out, self._a)
            return out
        return np.array(self._a, order=order)

    def set(self, arr, stream=None):
        _host_sync("set")
        np.copyto(self._a, arr)

    def __getattr__(self, name):   # methods: reshape, transpose, sum, astype, fill, copy, view, ...
        attr = getattr(self._a, name)
        if not callable(attr):
            return _wrap(attr)

        if name in _HOST_READS:
            _host_sync(name)
            return attr
        return lambda *args, **kwargs: _call(attr, (self,) + args, kwargs, bound=True)

    def __getitem__(self, key):
        return _call(np.ndarray.__getitem__, (self, key), {})

    def __setitem__(self, key, value):
        _call(np.ndarray.__setitem__, (self, key, value), {})

    def __array__(self, *args, **kwargs):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct a "
                        "NumPy array explicitly.")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return _call(getattr(ufunc, method), inputs, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        return _call(func, args, kwargs)

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __bool__(self):
        _host_sync("bool")
        return bool(self._a)

    def __float__(self):
        _host_sync("float")
        return float(self._a)

    def __int__(self):
        _host_sync("int")
        return int(self._a)

    def __index__(self):
        _host_sync("index")
        return self._a.__index__()

    def __complex__(self):
        _host_sync("complex")
        return complex(self._a)

    def __repr__(self):
        return repr(self._a).replace("array", "DeviceArray", 1)

    def __dlpack__(self, *args, **kwargs):
        raise NotEmulated("cuda_emulator: DLPack exchange is not emulated")


def _operator(name):
    f = getattr(np.ndarray, name)

    def op(self, *args):
        return _call(f, (self,) + args, {})
    op.__name__ = name
    return op


def _inplace(name):
    f = getattr(np.ndarray, name)

    def op(self, other):
        _call(f, (self, other), {})
        return self
    op.__name__ = name
    return op


for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or", "xor", "lshift",
              "rshift"):
    setattr(DeviceArray, f"__{_name}__", _operator(f"__{_name}__"))
    setattr(DeviceArray, f"__r{_name}__", _operator(f"__r{_name}__"))
    setattr(DeviceArray, f"__i{_name}__", _inplace(f"__i{_name}__"))
for _name in ("neg", "pos", "abs", "invert", "lt", "le", "eq", "ne", "gt", "ge"):
    setattr(DeviceArray, f"__{_name}__", _operator(f"__{_name}__"))
DeviceArray.__hash__ = None


def _unwrap(obj):
    """DeviceArrays -> their NumPy arrays, inside tuples, lists and dicts too."""
    if isinstance(obj, DeviceArray):
        return obj._a
    if isinstance(obj, (tuple, list)):
        return type(obj)(_unwrap(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _unwrap(v) for k, v in obj.items()}
    return obj


def _wrap(obj):
    """NumPy arrays and scalars -> DeviceArrays (a scalar as a 0-d array, as CuPy returns), inside tuples too."""
    if isinstance(obj, np.ndarray):
        return DeviceArray(obj)
    if isinstance(obj, np.generic):
        return DeviceArray(np.asarray(obj))
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_wrap(o) for o in obj)
    if isinstance(obj, list):
        return [_wrap(o) for o in obj]
    return obj


class _Pointer:
    device_id = 0

    def __init__(self, ptr):
        self.ptr = ptr


class _Device:
    """cupy.cuda.Device: one device, id 0, with H200_ATTRIBUTES."""

    def __init__(self, device_id=0):
        if int(device_id) != 0:
            raise RuntimeError(f"cuda_emulator: one device (0) is emulated, got device {device_id}")
        self.id = 0
        self.attributes = dict(H200_ATTRIBUTES)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def use(self):
        pass

    def synchronize(self):
        pass


class NotEmulated(NotImplementedError):
    """Something the emulated device does not do (tests/cuda/conftest.py reports the test as skipped)."""


_streams = []     # the streams entered (`with stream:`), innermost last
_capture = []     # while a graph is captured: [the capturing stream, its recorded work, arrays allocated meanwhile]


# methods that hand array contents to the host: a synchronization, which a stream capture does not allow
_HOST_READS = {"item", "tolist", "tobytes", "__array__"}


def _host_sync(what):
    if _capture:
        raise RuntimeError(f"cuda_emulator: {what} reads a device array on the host while a CUDA graph is captured "
                           f"(cudaErrorStreamCaptureUnsupported: operation not permitted when stream is capturing)")


def _device_arrays(obj, found):
    if isinstance(obj, DeviceArray):
        found.append(obj._a)
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            _device_arrays(o, found)
    elif isinstance(obj, dict):
        for o in obj.values():
            _device_arrays(o, found)
    return found


def _as_arrays(out):
    """A function's result with NumPy scalars as 0-d arrays (CuPy returns device arrays), inside tuples too."""
    if isinstance(out, np.generic):
        return np.asarray(out)
    if isinstance(out, tuple) and not hasattr(out, "_fields"):
        return tuple(_as_arrays(o) for o in out)
    if isinstance(out, list):
        return [_as_arrays(o) for o in out]
    return out


# calls that write into arrays they are given (besides out=): in place, fill, copies into, scatters
_WRITERS = {f"__i{op}__" for op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or",
                                    "xor", "lshift", "rshift")} | {
    "__setitem__", "fill", "copyto", "put", "putmask", "place", "at", "sort", "partition", "itemset"}


def _call(f, args, kwargs, bound=False):
    """f on the arrays inside `args` (DeviceArrays unwrapped), its arrays handed back as DeviceArrays.

    While a graph is captured the call also goes into the graph, as CuPy's kernel for it would: it runs now (so that
    its results exist, with the shapes the code goes on with; their values are garbage until a replay, as on the
    GPU), and each replay runs it again on the arrays' contents at that point and copies what it makes into the
    arrays it made now (kept alive by the graph). A call whose results are views of its inputs is simply run again;
    one that writes into them (in-place operators, fill, out=: _WRITERS) runs in the replays only, as on the GPU."""
    call = (lambda: f(*_unwrap(args[1:]), **_unwrap(kwargs))) if bound else \
        (lambda: f(*_unwrap(args), **_unwrap(kwargs)))
    if not _capture:
        return _wrap(call())
    if kwargs.get("out") is not None or getattr(f, "__name__", "") in _WRITERS:
        # it writes into existing arrays: on the GPU a capture runs nothing, so it must not run now either (it would
        # write the garbage of arrays made during the capture into an optimizer's state, say), only in replays
        _capture[1].append(call)
        out = kwargs.get("out")
        return out[0] if isinstance(out, tuple) and len(out) == 1 else out
    with np.errstate(all="ignore"):
        out = _as_arrays(call())
    inputs = _device_arrays((args, kwargs), [])
    flat = _flat_arrays(out)
    made = [k for k, r in enumerate(flat) if not any(np.may_share_memory(r, i) for i in inputs)]
    if made:
        _capture[2].extend(flat[k] for k in made)

        def again():
            with np.errstate(all="ignore"):
                new = _flat_arrays(_as_arrays(call()))
            for k in made:
                np.copyto(flat[k], new[k])
        _capture[1].append(again)
    else:
        _capture[1].append(call)
    return _wrap(out)


def _flat_arrays(out):
    if isinstance(out, np.ndarray):
        return [out]
    if isinstance(out, (tuple, list)):
        return [r for o in out for r in _flat_arrays(o)]
    return []


def _run(work):
    """Run `work` (a kernel launch, a cuBLAS call, a copy) now, or record it into the graph being captured: as on
    the GPU, arguments are bound at the call, arrays by address and scalars by value."""
    if _capture:
        _capture[1].append(work)
    else:
        work()


class _Stream:
    """cupy.cuda.Stream and Event. The emulator runs work at once, in order, so every stream is the same queue;
    begin_capture/end_capture record the work queued meanwhile (on any stream: the backend's side stream forks from
    and joins the capturing one) into a _Graph."""

    ptr = 0

    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self):
        _streams.append(self)
        return self

    def __exit__(self, *exc):
        _streams.remove(self)
        return False

    def is_capturing(self):
        return bool(_capture) and _capture[0] is self

    def begin_capture(self, *args):
        if _capture:
            raise RuntimeError("cuda_emulator: a graph is being captured already")
        _capture[:] = [self, [], []]

    def end_capture(self):
        if not _capture or _capture[0] is not self:
            raise RuntimeError("cuda_emulator: end_capture on a stream that is not capturing")
        work, allocated = _capture[1], _capture[2]
        _capture.clear()
        return _Graph(work, allocated)

    def record(self, *args):
        return _Stream()

    def wait_event(self, *args):
        pass

    def synchronize(self):
        if _capture:
            raise RuntimeError("cuda_emulator: synchronize while a graph is captured (illegal on the GPU)")


class _Graph:
    """A captured graph: its work, and the arrays allocated during the capture, which live as long as it does (on
    the GPU they come from the graph's private pool: its replays write them after the capture's code dropped them)."""

    def __init__(self, work, allocated):
        self.work, self.allocated = work, allocated

    def upload(self, *args):
        pass

    def launch(self, *args):
        for w in self.work:
            w()


def _current_stream():
    return _streams[-1] if _streams else _DEFAULT_STREAM


_DEFAULT_STREAM = _Stream()


class _MemoryPool:
    def malloc(self, nbytes):
        raise NotEmulated("cuda_emulator: allocations go through cupy.empty, not an allocator")

    def free_all_blocks(self):
        pass

    def used_bytes(self):
        return 0


def _poisoned(shape, dtype=float, order="C"):
    """cupy.empty: filled with 0xFF bytes (NaN as a float, -1 as an int), as the GPU tests poison CuPy's pool, so
    that an element a kernel forgets to write shows."""
    a = np.empty(shape, dtype=dtype, order=order)
    a.reshape(-1).view(np.uint8).fill(255)
    if _capture:
        _capture[2].append(a)
    return DeviceArray(a)


def _upload(a, dtype=None, order=None):
    """cupy.asarray: a host array is copied (to the "device"), as CuPy does; a DeviceArray passes through."""
    if isinstance(a, DeviceArray):
        return a if dtype is None or np.dtype(dtype) == a.dtype else DeviceArray(a._a.astype(dtype))
    return DeviceArray(np.array(a, dtype=dtype, order=order or "K", copy=True))


@contextlib.contextmanager
def _using_allocator(allocator=None):
    yield


_pinned = []   # the page-locked host buffers alloc_pinned_memory made (address ranges for cudaPointerGetAttributes)


def _alloc_pinned(nbytes):
    buf = np.empty(max(int(nbytes), 1), np.uint8)
    _pinned.append(buf)
    return buf


def _pointer_attributes(ptr):
    """cudaPointerGetAttributes: host memory from alloc_pinned_memory is page-locked host memory; CUDA raises for
    memory it does not know."""
    for buf in _pinned:
        start = buf.ctypes.data
        if start <= ptr < start + buf.nbytes:
            return types.SimpleNamespace(type=1, devicePointer=ptr, hostPointer=ptr)
    raise RuntimeError("cuda_emulator: cudaErrorInvalidValue (not memory CUDA allocated or registered)")


def _memcpy(dst, src, nbytes, kind, stream=0):
    """cudaMemcpyAsync: host and device memory are one here (recorded while a graph is captured, as on the GPU)."""
    _run(lambda: ctypes.memmove(dst, src, nbytes))


class _Ufunc:
    """A NumPy ufunc as cupy's: called, or through .at / .reduce / .accumulate / .outer, on DeviceArrays."""

    def __init__(self, ufunc):
        self.ufunc = ufunc
        self.__name__ = ufunc.__name__

    def __call__(self, *args, **kwargs):
        return _call(self.ufunc, args, kwargs)

    def __getattr__(self, name):
        attr = getattr(self.ufunc, name)
        if name in ("at", "reduce", "accumulate", "outer", "reduceat"):
            return lambda *args, **kwargs: _call(attr, args, kwargs)
        return attr


def _numpy_function(name):
    f = getattr(np, name)
    if isinstance(f, np.ufunc):
        return _Ufunc(f)
    if not callable(f) or isinstance(f, type):
        return f

    @functools.wraps(f)
    def wrapped(*args, **kwargs):
        return _call(f, args, kwargs)
    return wrapped


# NCCL's data types by their enum value in cupy.cuda.nccl, as item sizes (what a world of one needs to copy them)
_NCCL_TYPES = {"NCCL_INT8": 1, "NCCL_UINT8": 1, "NCCL_INT32": 4, "NCCL_INT64": 8, "NCCL_FLOAT16": 2,
               "NCCL_FLOAT32": 4, "NCCL_FLOAT64": 8}
_NCCL_ITEMSIZES = tuple(_NCCL_TYPES.values())   # by enum value
_NCCL_OPS = ("NCCL_SUM", "NCCL_PROD", "NCCL_MAX", "NCCL_MIN", "NCCL_AVG")


class _NcclCommunicator:
    """cupy.cuda.nccl.NcclCommunicator for a world of one process: every collective is a copy (or nothing, in
    place); the copies join the stream's work like any other (recorded while a graph is captured)."""

    def __init__(self, size, unique_id, rank):
        if size != 1:
            raise NotEmulated(f"NCCL across {size} processes (the emulator gives each process its own device)")

    def _copy(self, dst, src, count, dtype):
        if dst != src:
            _memcpy(dst, src, count * _NCCL_ITEMSIZES[dtype], 3)   # (3: device to device)

    def allReduce(self, send, recv, count, dtype, op, stream):
        self._copy(recv, send, count, dtype)

    def reduceScatter(self, send, recv, count, dtype, op, stream):
        self._copy(recv, send, count, dtype)

    def allGather(self, send, recv, count, dtype, stream):
        self._copy(recv, send, count, dtype)

    def bcast(self, buf, count, dtype, root, stream):
        pass

    def destroy(self):
        pass


def _fake_nccl():
    nccl = types.ModuleType("cupy.cuda.nccl")
    for i, name in enumerate(_NCCL_TYPES):
        setattr(nccl, name, i)
    for i, name in enumerate(_NCCL_OPS):
        setattr(nccl, name, i)
    nccl.get_unique_id = lambda: b"emulated"
    nccl.NcclCommunicator = _NcclCommunicator
    return nccl


def _fake_cupy():
    """A module with the part of CuPy's API that smalltrain's CUDA host code and kernel tests use, over NumPy."""
    cp = types.ModuleType("cupy")
    cp.__getattr__ = _numpy_function
    cp.ndarray = DeviceArray
    cp.empty = _poisoned
    cp.empty_like = lambda a, dtype=None: _poisoned(a.shape, dtype or a.dtype)
    cp.asarray = _upload
    cp.array = lambda a, dtype=None, copy=True, **kw: DeviceArray(np.array(_unwrap(a), dtype=dtype, copy=True, **kw))
    cp.asnumpy = lambda a, stream=None: a.get() if isinstance(a, DeviceArray) else np.asarray(a)
    cp.get_default_memory_pool = lambda: _MemoryPool()
    cp.RawModule = lambda code, options=(), **kwargs: Module(code)
    cuda = types.ModuleType("cupy.cuda")   # a module: `from cupy.cuda import nccl` (distributed/nccl_backend.py)
    cuda.__dict__.update(
        Device=_Device, Stream=_Stream, Event=_Stream, get_current_stream=_current_stream,
        MemoryPool=_MemoryPool, set_allocator=lambda *a: None, get_allocator=lambda: None,
        alloc_pinned_memory=_alloc_pinned, using_allocator=_using_allocator, nccl=_fake_nccl())
    cuda.runtime = types.SimpleNamespace(
        getDeviceCount=lambda: 1, CUDARuntimeError=RuntimeError, memcpyAsync=_memcpy,
        pointerGetAttributes=_pointer_attributes, memoryTypeHost=1, memoryTypeDevice=2, memcpyHostToDevice=1,
        memcpyDeviceToHost=2, memcpyDeviceToDevice=3, memcpyDefault=4,
        deviceGetPCIBusId=lambda device: f"0000:00:{device:02x}.0")
    cp.cuda = cuda
    return cp


_MODULES = ("cupy", "cupy.cuda", "cupy.cuda.nccl")   # the names install() puts in sys.modules


_installed = []


def installed():
    """True while install() is in effect."""
    return bool(_installed)


def reset():
    """Forget a capture left open (by a test that failed inside one) and the streams entered."""
    _capture.clear()
    _streams.clear()


def install():
    """Make smalltrain's CUDA backend run on this emulator: `cupy` (sys.modules and the backend's handle) becomes
    NumPy with CuPy's names, kernels compile with g++, cuBLAS calls become NumPy matmuls (_Cublas). uninstall()
    undoes it."""
    import sys

    from smalltrain.backend import cuda as backend_cuda
    from smalltrain.backend.cuda import _common, blas
    if _installed:
        return
    cp = _fake_cupy()
    saved = dict(modules={name: sys.modules.get(name) for name in _MODULES}, handle=backend_cuda._cupy,
                 error=backend_cuda._import_error, compiled=loader._compiled, blas=blas._lib)
    sys.modules.update(zip(_MODULES, (cp, cp.cuda, cp.cuda.nccl)))
    backend_cuda._cupy, backend_cuda._import_error = cp, None
    loader._compiled = lambda source, options, device_id: _module_of_source(source)
    blas._lib = _Cublas()
    _installed.append(saved)
    reset()
    _clear_caches(backend_cuda, _common)


def install_if_requested():
    """install() where SMALLTRAIN_CUDA_EMULATOR=1 and no GPU is usable (the test suite's conftest, and the worker
    processes its distributed tests start); whether the emulator is in effect."""
    import os

    from smalltrain import cuda
    if os.environ.get("SMALLTRAIN_CUDA_EMULATOR") == "1" and not cuda.is_available():
        install()
    return installed()


def uninstall():
    import sys

    from smalltrain.backend import cuda as backend_cuda
    from smalltrain.backend.cuda import _common, blas
    if not _installed:
        return
    saved = _installed.pop()
    for name, module in saved["modules"].items():
        if module is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = module
    backend_cuda._cupy, backend_cuda._import_error = saved["handle"], saved["error"]
    loader._compiled, blas._lib = saved["compiled"], saved["blas"]
    _clear_caches(backend_cuda, _common)


def _clear_caches(backend_cuda, _common):
    """Everything the backend cached per device (kernels, attributes, counters, side streams) belongs to the
    device it was made on."""
    backend_cuda.is_available.cache_clear()
    loader._kernel.cache_clear()
    loader.family_module.cache_clear()
    for d in (_common._attributes, _common._opted_in, _common._counters, _common._side):
        d.clear()


@functools.lru_cache(maxsize=None)
def _module_of_source(source):
    return Module(source, "k" + hashlib.sha256(source.encode()).hexdigest()[:8])


class _Cublas:
    """blas._Lib's cuBLAS entry points over NumPy, with cuBLAS's column-major semantics: the host code's layouts,
    transposes and leading dimensions (blas._plan) are exercised as on the GPU. Its products are NumPy's, never
    TF32, whatever `tf32` (backends.cuda.matmul.allow_tf32) says; it makes no handles to switch."""

    def __init__(self):
        self.tf32, self.handles = False, {}

    def handle(self):
        return None

    def scalar(self, dtype_char, value):
        return float(value)

    @staticmethod
    def _matrix(ptr, dtype, rows, cols, ld, op):
        """The column-major [rows, cols] operand op(M) at `ptr` (op 1: M stored [cols, rows] is transposed)."""
        r, c = (cols, rows) if op else (rows, cols)
        item = np.dtype(dtype).itemsize
        flat = np.frombuffer((ctypes.c_char * (item * (ld * (c - 1) + r))).from_address(ptr), dtype=dtype)
        m = np.lib.stride_tricks.as_strided(flat, (r, c), (item, ld * item))
        return m.T if op else m

    def _gemm_now(self, dtype, op_a, op_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        A = self._matrix(a, dtype, m, k, lda, op_a)
        B = self._matrix(b, dtype, k, n, ldb, op_b)
        C = self._matrix(c, dtype, m, n, ldc, 0)
        prod = alpha * (A @ B)
        C[...] = prod + beta * C if beta else prod
        return 0

    def _batched_now(self, dtype, op_a, op_b, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, batch):
        item = np.dtype(dtype).itemsize
        for i in range(batch):
            self._gemm_now(dtype, op_a, op_b, m, n, k, alpha, a + i * sa * item, lda, b + i * sb * item, ldb, beta,
                       c + i * sc * item, ldc)
        return 0

    def _gemv_now(self, dtype, op, m, n, alpha, a, lda, x, incx, beta, y, incy):
        A = self._matrix(a, dtype, m, n, lda, 0)
        A = A.T if op else A
        X = self._matrix(x, dtype, 1, A.shape[1], incx, 0)[0]
        Y = self._matrix(y, dtype, 1, A.shape[0], incy, 0)[0]
        prod = alpha * (A @ X)
        Y[...] = prod + beta * Y if beta else prod
        return 0


# the entry points blas._Lib calls (after the handle): each goes into the graph while one is captured (_run)
for _name, _now, _dtype in (("cublasSgemm_v2", "_gemm_now", np.float32), ("cublasDgemm_v2", "_gemm_now", np.float64),
                            ("cublasSgemmStridedBatched", "_batched_now", np.float32),
                            ("cublasDgemmStridedBatched", "_batched_now", np.float64),
                            ("cublasSgemv_v2", "_gemv_now", np.float32), ("cublasDgemv_v2", "_gemv_now", np.float64)):
    setattr(_Cublas, _name, lambda self, handle, *args, _now=_now, _dtype=_dtype:
            _run(lambda: getattr(self, _now)(_dtype, *args)) or 0)

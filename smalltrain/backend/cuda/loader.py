"""Loading our CUDA C: our kernel files as one module per element type (family_source), loaded when a kernel of
that type is first asked for: from the binary shipped in kernels/prebuilt/ where one was built from this exact source
for this GPU's architecture (prebuilt.py), else compiled with NVRTC (once per device, cached on disk by CuPy, said
aloud on stderr when it takes a while). A family is a path under kernels/ without its .cu: "optim", or "conv/tile"
for kernels/conv/tile.cu (the convolution's kernels are a file per algorithm, so that a run loads only the
algorithms it launches).

The same API serves smalltrain's own kernels (smalltrain/backend/cuda/kernels/*.cu) and users' custom ops.
"""
import functools
import hashlib
import os
import re

from . import cupy, prebuilt

KERNEL_DIR = os.path.join(os.path.dirname(__file__), "kernels")
_OPTIONS = ("-std=c++17",)
_INCLUDE = re.compile(r'^[ \t]*#include "([^"]+)"[ \t]*$', re.MULTILINE)
# grid-stride kernels cover any n with at most this many blocks (a few waves on any current GPU)
MAX_BLOCKS = 65536


@functools.lru_cache(maxsize=None)
def _compiled(source, options, device_id):
    cp = cupy()
    with cp.cuda.Device(device_id):
        module = cp.RawModule(code=source, options=options)
        module.compile()
    return module


def compile_module(source_or_path, options=()):
    """A cupy.RawModule for CUDA C source text or a .cu path, compiled once per (source, options, device)."""
    looks_like_path = "\n" not in source_or_path and source_or_path.endswith(".cu")
    if looks_like_path:
        if not os.path.exists(source_or_path):
            raise FileNotFoundError(f"compile_module: no CUDA source file {source_or_path}")
        with open(source_or_path) as f:
            source = f.read()
    else:
        source = source_or_path
    device_id = cupy().cuda.Device().id
    options = tuple(_OPTIONS) + tuple(options)
    return prebuilt.announced(lambda: _compiled(source, options, device_id), "of a custom module",
                              _gpu_name(device_id), "source given at run time", _cache_dir())


def kernel(family, name):
    """The kernel `name` from smalltrain/backend/cuda/kernels/<family>.cu on the current device."""
    return _kernel(family, name, cupy().cuda.Device().id)


@functools.lru_cache(maxsize=None)
def _kernel(family, name, device_id):
    return family_module(family, dtypes_of(name), device_id).get_function(name)


_DTYPE_NAMES = {1: "float32", 2: "float64", 3: "float32 and float64"}


@functools.lru_cache(maxsize=None)
def family_module(family, dtypes, device_id):
    """kernels/<family>.cu's module of the element types `dtypes` on a device: its prebuilt binary where one was
    built from this source for this architecture, else compiled with NVRTC (and said so, when it takes a while)."""
    source = family_source(family, dtypes)
    cp = cupy()
    capability = getattr(cp.cuda.Device(device_id), "compute_capability", None)   # None on the CPU emulator
    path, why = prebuilt.choose(_manifest(), prebuilt.module_key(family, dtypes), source, capability)
    if path is not None:
        try:
            with cp.cuda.Device(device_id):
                module = cp.RawModule(path=path)
                module.compile()
            return module
        except Exception as e:  # noqa: BLE001 - a driver older than the build, a damaged file: compile instead
            why = f"the prebuilt binary {os.path.basename(path)} did not load: {type(e).__name__}: {e}"
    return prebuilt.announced(lambda: _compiled(source, _OPTIONS, device_id),
                              f"{family} ({_DTYPE_NAMES[dtypes]})", _gpu_name(device_id), why, _cache_dir())


@functools.lru_cache(maxsize=None)
def _manifest():
    return prebuilt.read_manifest()


def _gpu_name(device_id):
    """'sm_90 (NVIDIA H100 80GB HBM3)' for the message of a run-time compile."""
    try:
        cp = cupy()
        name = cp.cuda.runtime.getDeviceProperties(device_id)["name"]
        name = name.decode() if isinstance(name, bytes) else name
        return f"sm_{cp.cuda.Device(device_id).compute_capability} ({name})"
    except Exception:  # noqa: BLE001 - the message must not fail the compile (the emulator has no such properties)
        return f"device {device_id}"


def watch_cupy_compiles(cp):
    """Make CuPy's own run-time compiles say so (prebuilt.watch_cupy_compiles), on the current device's name."""
    try:
        from cupy.cuda import compiler
    except ImportError:   # (the CPU emulator's stand-in has none: nothing compiles there)
        return
    prebuilt.watch_cupy_compiles(compiler, _gpu_name(cp.cuda.Device().id), _cache_dir())


def _cache_dir():
    """CuPy's on-disk cache of compiled kernels (CUPY_CACHE_DIR, by default ~/.cupy/kernel_cache)."""
    return os.environ.get("CUPY_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cupy", "kernel_cache")


def families():
    """Every kernel family: the .cu files under kernels/, as paths without .cu ("optim", "conv/tile")."""
    out = []
    for root, _, files in os.walk(KERNEL_DIR):
        for name in files:
            if name.endswith(".cu"):
                out.append(os.path.relpath(os.path.join(root, name), KERNEL_DIR)[:-3].replace(os.sep, "/"))
    return sorted(out)


def prebuilt_modules():
    """(key, source) of every module the package ships prebuilt: each family's float32 module (float64 runs, the
    tests' gradchecks, compile at run time)."""
    return [(prebuilt.module_key(family, 1), family_source(family, 1)) for family in families()]


def family_path(family):
    """The .cu file of a kernel family: kernels/<family>.cu."""
    return os.path.join(KERNEL_DIR, family + ".cu")


def dtypes_of(name):
    """The ST_DTYPES variant (kernels/common.cuh) of a module with the kernel `name`: 2 for a float64 kernel (_f64),
    else 1 (float32 ones, and those of no element type, which every variant has)."""
    return 2 if name.endswith("_f64") else 1


def family_source(family, dtypes=3):
    """The text of kernels/<family>.cu (read_source) with its kernels instantiated for `dtypes` only (1 float32, 2
    float64, 3 both; common.cuh ST_INSTANTIATE): a float32 run compiles no float64 kernel and a float64 one no
    float32 kernel."""
    return f"#define ST_DTYPES {int(dtypes)}\n" + read_source(family_path(family))


def read_source(path, _depth=0):
    """The text of a .cu file with its `#include "local.cuh"` lines replaced by those files' text.

    Inlining here (rather than passing -I to NVRTC) makes the source text, and so CuPy's on-disk cache key,
    change whenever a shared header changes.
    """
    if _depth > 8:
        raise RuntimeError(f"read_source: includes nested too deeply at {path}")
    with open(path) as f:
        text = f.read()
    base = os.path.dirname(path)

    def inline(match):
        return read_source(os.path.join(base, match.group(1)), _depth + 1)
    return _INCLUDE.sub(inline, text)


@functools.lru_cache(maxsize=None)
def elementwise_kernel(in_params, out_params, operation, name, preamble=""):
    """A cached cupy.ElementwiseKernel: the quick way to write a custom pointwise forward or backward."""
    return cupy().ElementwiseKernel(in_params, out_params, operation, name, preamble=preamble)


def launch_1d(kern, n, args, block=256, shared_mem=0, max_blocks=None):
    """Launch `kern` over n threads in 1-D blocks (n == 0 launches nothing).

    With `max_blocks`, the grid is capped: the kernel must then loop grid-stride over its n items.
    """
    if n <= 0:
        return
    grid = (n + block - 1) // block
    if max_blocks is not None:
        grid = min(grid, max_blocks)
    kern((grid,), (block,), args, shared_mem=shared_mem)


def source_digest(source):
    return hashlib.sha1(source.encode()).hexdigest()[:12]

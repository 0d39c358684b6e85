"""Loading our CUDA C: .cu files (or source strings) compiled once per device with NVRTC and cached; our kernel
files as one module per element type (family_source), compiled when a kernel of that type is first asked for, and
instances only some runs use as modules of their own (_PARTS).

The same API serves smalltrain's own kernels (smalltrain/backend/cuda/kernels/*.cu) and users' custom ops.
"""
import functools
import hashlib
import os
import re

from . import cupy

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
    return _compiled(source, tuple(_OPTIONS) + tuple(options), cupy().cuda.Device().id)


def kernel(family, name):
    """The kernel `name` from smalltrain/backend/cuda/kernels/<family>.cu on the current device."""
    return _kernel(family, name, cupy().cuda.Device().id)


@functools.lru_cache(maxsize=None)
def _kernel(family, name, device_id):
    return compile_module(family_source(family, dtypes_of(name), part_of(name))).get_function(name)


# Kernels whose names end in one of these markers (before the element type's _f32 / _f64) are a module of their own,
# compiled with the macro defined when one of them is first asked for; the family's main module leaves them out.
# conv.cu's _arr instances (TILE_ARRANGE) are half of its tile kernels: in one module they took its float32 compile in
# NVRTC from ~1m25s to ~2m10s (sm_90, this project's 2-core machine), and the CUDA emulator's g++ compiles them in
# ~11 s against the rest's ~16, for every run, including those that arrange no weights.
_PARTS = {"_arr": "ST_ARRANGED"}


def part_of(name):
    """The macro (_PARTS) of the module with the kernel `name`, or None for its family's main module."""
    stem = name.rsplit("_", 1)[0]
    return next((macro for marker, macro in _PARTS.items() if stem.endswith(marker)), None)


def family_parts(family):
    """The parts of kernels/<family>.cu's modules, as family_source takes them: None (the main module), then each
    _PARTS macro its source tests."""
    text = read_source(os.path.join(KERNEL_DIR, family + ".cu"))
    return [None] + [macro for macro in _PARTS.values() if macro in text]


def dtypes_of(name):
    """The ST_DTYPES variant (kernels/common.cuh) of a module with the kernel `name`: 2 for a float64 kernel (_f64),
    else 1 (float32 ones, and those of no element type, which every variant has)."""
    return 2 if name.endswith("_f64") else 1


def family_source(family, dtypes=3, part=None):
    """The text of kernels/<family>.cu (read_source) with its kernels instantiated for `dtypes` only (1 float32, 2
    float64, 3 both; common.cuh ST_INSTANTIATE): a float32 run compiles no float64 kernel (conv.cu in nvcc for
    sm_90 on a 2-core machine: 32 s instead of 67) and a float64 one no float32 kernel. `part`: a _PARTS macro,
    defined first (that part's module), or None (the main module)."""
    defines = f"#define ST_DTYPES {int(dtypes)}\n" + (f"#define {part} 1\n" if part else "")
    return defines + read_source(os.path.join(KERNEL_DIR, family + ".cu"))


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

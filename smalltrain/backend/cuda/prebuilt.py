"""Kernels compiled ahead of time, and the note any run-time compilation prints.

The package ships each kernel module's float32 build as a fatbin for the common GPU architectures (kernels/prebuilt/:
sm_80 .. sm_120), with a manifest of the exact source text each was built from (a digest). The loader takes a
binary when its digest matches the module's source and it holds code the device can run (the same major
architecture, an equal or lower minor); anything else (float64 modules, users' own kernels, a GPU outside the list,
a source edited since the build) compiles with NVRTC, and says so once on stderr. A first GPU run then loads
binaries in milliseconds instead of compiling for minutes.

Rebuild after changing a .cu file (needs nvcc; tests/backend/cuda/test_prebuilt.py fails until then):

    python -m smalltrain.backend.cuda.build_kernels
"""
import atexit
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

from ...utils.io import atomic_write

PREBUILT_DIR = os.path.join(os.path.dirname(__file__), "kernels", "prebuilt")
MANIFEST = "manifest.json"
# sm_80 (A100), 86 (RTX 30), 89 (RTX 40, L4), 90 (H100/H200), 100 (B200), 120 (RTX 50): every architecture CUDA 13's
# nvcc builds for that a current driver runs, cubins only (no PTX to JIT)
ARCHS = ("80", "86", "89", "90", "100", "120")
NVCC_OPTIONS = ("-std=c++17",)
ANNOUNCE_AFTER_S = 1.0   # a compile that the cache answers at once stays silent

# run-time compilation so far in this process (the trainer keeps it out of its rates); `inside`: an announced
# compile is running (CuPy's NVRTC calls under it are its own, already counted); CuPy's own kernels, counted apart
_stats = {"seconds": 0.0, "inside": 0, "cupy_kernels": 0, "cupy_seconds": 0.0}


def digest(source, options=NVCC_OPTIONS):
    """What a binary was built from: the module's full source text and the compile options."""
    return hashlib.sha256("\0".join((source, *options)).encode()).hexdigest()


def module_key(family, dtypes, part=None):
    """The file stem of a module's binary: 'conv-tile.f32' (family path separators as '-')."""
    kind = {1: "f32", 2: "f64", 3: "f32f64"}[int(dtypes)]
    return ".".join([family.replace("/", "-"), kind] + ([part] if part else []))


def read_manifest(directory=None):
    path = os.path.join(directory or PREBUILT_DIR, MANIFEST)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def runs_on(archs, capability):
    """Whether a fatbin of cubins for `archs` (['80', '90'] ...) has code for a device of compute `capability`
    ('89'): a cubin runs on its own major architecture at an equal or higher minor."""
    major, minor = divmod(int(capability), 10)
    return any(divmod(int(a), 10)[0] == major and divmod(int(a), 10)[1] <= minor for a in archs)


def choose(manifest, key, source, capability, directory=None):
    """(path of the binary to load, None) or (None, why it compiles instead) for module `key` on a device of
    compute `capability` (None: not a real GPU)."""
    if capability is None:
        return None, "no device architecture to match"
    entry = (manifest or {}).get("modules", {}).get(key)
    if entry is None:
        return None, f"no prebuilt binary for {key}"
    if entry["digest"] != digest(source):
        return None, (f"the prebuilt binary of {key} is stale (its .cu changed since; rebuild: "
                      "python -m smalltrain.backend.cuda.build_kernels)")
    if not runs_on(manifest["archs"], capability):
        return None, f"the prebuilt binaries hold sm_{', sm_'.join(manifest['archs'])}, not this GPU's sm_{capability}"
    path = os.path.join(directory or PREBUILT_DIR, entry["file"])
    if not os.path.exists(path):
        return None, f"the prebuilt binary {path} is missing"
    return path, None


def compile_seconds():
    """Seconds this process has spent compiling kernels at run time."""
    return _stats["seconds"]


def announced(compile, what, gpu, why, cache_dir, after_s=None, stream=None):
    """Run `compile()`; if it is still running after `after_s` seconds, say on stderr what is compiled, for which
    GPU, why, and where the cache lives, then how long it took (after_s: ANNOUNCE_AFTER_S by default; 0 says it
    before the compile starts). Its time counts in compile_seconds()."""
    stream = stream or sys.stderr
    after_s = ANNOUNCE_AFTER_S if after_s is None else after_s
    said = threading.Event()

    def say():
        said.set()
        print(f"smalltrain: compiling CUDA kernels {what} for {gpu} with NVRTC ({why}); the result is cached in "
              f"{cache_dir} (CUPY_CACHE_DIR; delete it to recompile) ...", file=stream, flush=True)
    timer = threading.Timer(after_s, say) if after_s > 0 else None
    start = time.perf_counter()
    if timer is None:
        say()
    else:
        timer.start()
    done = False
    _stats["inside"] += 1
    try:
        result = compile()
        done = True
        return result
    finally:
        _stats["inside"] -= 1
        if timer is not None:
            timer.cancel()
            timer.join()   # a note being printed ends before the closing one
        elapsed = time.perf_counter() - start
        _stats["seconds"] += elapsed
        if said.is_set():
            outcome = "compiled" if done else "failed to compile"
            print(f"smalltrain: {outcome} {what} in {elapsed:.1f} s", file=stream, flush=True)


def watch_cupy_compiles(compiler, gpu, cache_dir, stream=None):
    """CuPy compiles its own kernels (the elementwise operations and reductions behind the ops written with CuPy
    arrays) with NVRTC when each is first used, into its cache. Wrap `compiler.compile_using_nvrtc` (CuPy's
    cupy.cuda.compiler, which calls it only when its cache misses) so that the first such compile says so on
    stderr, once, what compiles, for which GPU and where the cache lives; the process's total is said when it
    exits, and the time counts in compile_seconds(). Does nothing if this CuPy has no such function."""
    original = getattr(compiler, "compile_using_nvrtc", None)
    if original is None or getattr(original, "watched_by_smalltrain", False):
        return
    stream = stream or sys.stderr

    def watched(*args, **kwargs):
        if _stats["inside"]:   # one of smalltrain's modules: announced() times it
            return original(*args, **kwargs)
        if not _stats["cupy_kernels"]:
            print(f"smalltrain: CuPy is compiling its own kernels (elementwise operations and reductions) for {gpu} "
                  f"with NVRTC as each is first used; they are cached in {cache_dir} (CUPY_CACHE_DIR; delete it to "
                  "recompile), and the time is left out of the rates shown", file=stream, flush=True)
            atexit.register(lambda: print(f"smalltrain: CuPy compiled {_stats['cupy_kernels']} kernel(s) in "
                                          f"{_stats['cupy_seconds']:.1f} s at run time", file=stream, flush=True))
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            elapsed = time.perf_counter() - start
            _stats["seconds"] += elapsed
            _stats["cupy_seconds"] += elapsed
            _stats["cupy_kernels"] += 1
    watched.watched_by_smalltrain = True
    compiler.compile_using_nvrtc = watched


# -- building (maintainers, with nvcc) -----------------------------------------------------------------------------

def _nvcc_version(nvcc):
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    return out.strip().splitlines()[-1]


def build_one(source, out_path, archs=ARCHS, nvcc="nvcc"):
    """Compile `source` into a size-compressed fatbin of cubins for `archs` at out_path (atomically)."""
    with tempfile.TemporaryDirectory() as tmp:
        cu = os.path.join(tmp, "module.cu")
        with open(cu, "w") as f:
            f.write(source)
        gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
        tmp_out = os.path.join(tmp, "module.fatbin")
        run = subprocess.run([nvcc, "-fatbin", *NVCC_OPTIONS, *gencode, "--compress-mode=size", "-t", "0",
                              "-o", tmp_out, cu], capture_output=True, text=True)
        if run.returncode:
            raise RuntimeError(f"nvcc failed for {out_path}:\n{run.stderr[-4000:]}")
        with open(tmp_out, "rb") as f, atomic_write(out_path) as g:   # a reader never sees half a binary
            g.write(f.read())


def build(modules, directory=PREBUILT_DIR, archs=ARCHS, nvcc="nvcc", jobs=None, log=print, force=False):
    """Build every (key, source) of `modules` into `directory` and write its manifest; binaries no module names
    are removed. A module whose binary the manifest already records for this source and these architectures is
    kept as it is, unless `force`."""
    from concurrent.futures import ThreadPoolExecutor
    os.makedirs(directory, exist_ok=True)
    old = read_manifest(directory) or {}
    same_archs = old.get("archs") == list(archs)
    kept = {key: old["modules"][key] for key, source in modules
            if not force and same_archs and key in old.get("modules", {})
            and old["modules"][key]["digest"] == digest(source)
            and os.path.exists(os.path.join(directory, old["modules"][key]["file"]))}
    modules = [(key, source) for key, source in modules if key not in kept]

    def one(item):
        key, source = item
        start = time.perf_counter()
        path = os.path.join(directory, key + ".fatbin")
        build_one(source, path, archs, nvcc)
        log(f"{key}: {os.path.getsize(path) / 1e6:.2f} MB in {time.perf_counter() - start:.0f} s")
        return key, {"digest": digest(source), "file": key + ".fatbin", "bytes": os.path.getsize(path)}
    with ThreadPoolExecutor(jobs or os.cpu_count() or 1) as pool:
        entries = dict(kept, **dict(pool.map(one, modules)))
    if kept:
        log(f"kept {len(kept)} binaries built from the same sources")
    for name in os.listdir(directory):
        if name.endswith(".fatbin") and name[:-len(".fatbin")] not in entries:
            os.remove(os.path.join(directory, name))
    manifest = {"format": 1, "nvcc": _nvcc_version(nvcc) if modules else old.get("nvcc"),
                "options": list(NVCC_OPTIONS), "archs": list(archs),
                "modules": dict(sorted(entries.items()))}
    with atomic_write(os.path.join(directory, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    return manifest

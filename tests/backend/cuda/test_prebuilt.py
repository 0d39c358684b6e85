"""The prebuilt kernel binaries (backend/cuda/prebuilt.py): which binary a device loads, when it compiles instead,
and the note a run-time compilation prints."""
import io
import json
import os
import subprocess
import sys
import time

import cuda_emulator
import pytest

import smalltrain
from smalltrain.backend.cuda import prebuilt

SOURCE = 'extern "C" __global__ void k_f32(float* x) { x[0] = 1.0f; }\n'


def _manifest(tmp_path, archs=("80", "90"), source=SOURCE, write_file=True):
    manifest = {"format": 1, "archs": list(archs),
                "modules": {"demo.f32": {"digest": prebuilt.digest(source), "file": "demo.f32.fatbin"}}}
    (tmp_path / prebuilt.MANIFEST).write_text(json.dumps(manifest))
    if write_file:
        (tmp_path / "demo.f32.fatbin").write_bytes(b"\x50\xed\x55\xba")
    return prebuilt.read_manifest(str(tmp_path))


@pytest.mark.parametrize("archs, capability, runs", [
    (("80",), "80", True), (("80",), "86", True), (("80",), "89", True), (("86",), "80", False),
    (("80",), "90", False), (("90",), "90", True), (("90",), "100", False), (("100", "120"), "120", True),
    (("80", "90"), "75", False)])
def test_a_cubin_runs_on_its_major_architecture_at_an_equal_or_higher_minor(archs, capability, runs):
    assert prebuilt.runs_on(archs, capability) is runs


def test_a_binary_built_from_this_source_for_this_architecture_is_loaded(tmp_path):
    manifest = _manifest(tmp_path)
    path, why = prebuilt.choose(manifest, "demo.f32", SOURCE, "90", str(tmp_path))
    assert (path, why) == (str(tmp_path / "demo.f32.fatbin"), None)
    assert prebuilt.choose(manifest, "demo.f32", SOURCE, "86", str(tmp_path))[0] == path


def test_a_stale_binary_compiles_instead_and_says_how_to_rebuild(tmp_path):
    manifest = _manifest(tmp_path)
    path, why = prebuilt.choose(manifest, "demo.f32", SOURCE.replace("1.0f", "2.0f"), "90", str(tmp_path))
    assert path is None
    assert "stale" in why and "python -m smalltrain.backend.cuda.build_kernels" in why


@pytest.mark.parametrize("key, capability, write_file, expected", [
    ("other.f32", "90", True, "no prebuilt binary for other.f32"),
    ("demo.f32", "75", True, "not this GPU's sm_75"),
    ("demo.f32", "100", True, "not this GPU's sm_100"),
    ("demo.f32", None, True, "no device architecture"),
    ("demo.f32", "90", False, "is missing")])
def test_a_missing_binary_or_a_foreign_architecture_compiles_instead(tmp_path, key, capability, write_file,
                                                                   expected):
    manifest = _manifest(tmp_path, write_file=write_file)
    path, why = prebuilt.choose(manifest, key, SOURCE, capability, str(tmp_path))
    assert path is None and expected in why


def test_no_manifest_compiles_everything(tmp_path):
    assert prebuilt.read_manifest(str(tmp_path)) is None
    assert prebuilt.choose(None, "demo.f32", SOURCE, "90", str(tmp_path)) == (None, "no prebuilt binary for demo.f32")


def test_the_digest_covers_the_source_and_the_options():
    assert prebuilt.digest(SOURCE) != prebuilt.digest(SOURCE + " ")
    assert prebuilt.digest(SOURCE) != prebuilt.digest(SOURCE, ("-std=c++20",))
    assert prebuilt.module_key("conv/tile", 1) == "conv-tile.f32"
    assert prebuilt.module_key("pool", 2, "ST_PART") == "pool.f64.ST_PART"


def test_a_slow_compile_says_what_for_which_gpu_why_where_cached_and_how_long():
    stream, before = io.StringIO(), prebuilt.compile_seconds()

    def compile():   # returns once the note is out, so the test does not race the timer
        deadline = time.monotonic() + 10
        while "compiling" not in stream.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
        return "module"
    out = prebuilt.announced(compile, "conv-tile (float32)", "sm_90 (NVIDIA H100)", "no prebuilt binary",
                             "/cache/dir", after_s=0.0, stream=stream)
    lines = stream.getvalue().splitlines()
    assert out == "module" and len(lines) == 2
    assert lines[0].startswith("smalltrain: compiling CUDA kernels conv-tile (float32) for sm_90 (NVIDIA H100)")
    assert "no prebuilt binary" in lines[0] and "/cache/dir" in lines[0] and "CUPY_CACHE_DIR" in lines[0]
    assert lines[1].startswith("smalltrain: compiled conv-tile (float32) in ") and lines[1].endswith(" s")
    assert prebuilt.compile_seconds() > before


def test_a_compile_the_cache_answers_at_once_stays_silent():
    stream = io.StringIO()
    assert prebuilt.announced(lambda: 7, "pool (float32)", "sm_90", "why", "/c", after_s=60, stream=stream) == 7
    assert stream.getvalue() == ""


def test_a_failed_compile_still_ends_its_note_and_raises():
    stream = io.StringIO()

    def compile():
        deadline = time.monotonic() + 10
        while "compiling" not in stream.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
        raise RuntimeError("nvrtc: error")
    with pytest.raises(RuntimeError, match="nvrtc"):
        prebuilt.announced(compile, "x", "sm_90", "why", "/c", after_s=0.0, stream=stream)
    assert "smalltrain: failed to compile x in" in stream.getvalue()


def _nvrtc_stand_in(calls):
    """A compile_using_nvrtc as CuPy's compiler module has it (the watch wraps whatever is there)."""
    def compile_using_nvrtc(source, options=(), arch=None, filename="kern.cu"):
        calls.append(source)
        return b"ptx of " + source.encode()
    return compile_using_nvrtc


def test_cupys_own_compiles_say_so_once_and_count_and_report_their_total(monkeypatch):
    monkeypatch.setattr(prebuilt, "_stats", dict(prebuilt._stats, cupy_kernels=0, cupy_seconds=0.0))
    at_exit = []
    monkeypatch.setattr(prebuilt.atexit, "register", at_exit.append)
    calls, stream = [], io.StringIO()
    compiler = type("compiler", (), {"compile_using_nvrtc": staticmethod(_nvrtc_stand_in(calls))})
    prebuilt.watch_cupy_compiles(compiler, "sm_90 (NVIDIA H100)", "/cache/dir", stream=stream)
    prebuilt.watch_cupy_compiles(compiler, "sm_90 (NVIDIA H100)", "/cache/dir", stream=stream)   # wraps once
    before = prebuilt.compile_seconds()
    assert compiler.compile_using_nvrtc("a + b") == b"ptx of a + b"
    assert compiler.compile_using_nvrtc("a * b") == b"ptx of a * b"
    assert calls == ["a + b", "a * b"]
    (note,) = stream.getvalue().splitlines()
    assert note.startswith("smalltrain: CuPy is compiling its own kernels") and "sm_90 (NVIDIA H100)" in note
    assert "/cache/dir" in note and "CUPY_CACHE_DIR" in note and "left out of the rates" in note
    assert prebuilt.compile_seconds() > before and prebuilt._stats["cupy_kernels"] == 2
    # smalltrain's own modules compile through it too, inside announced(): counted there, not twice
    prebuilt.announced(lambda: compiler.compile_using_nvrtc("ours"), "x", "sm_90", "why", "/c", after_s=60,
                       stream=stream)
    assert prebuilt._stats["cupy_kernels"] == 2
    (report,) = at_exit
    report()
    assert stream.getvalue().splitlines()[-1].startswith("smalltrain: CuPy compiled 2 kernel(s) in ")


class _FakeCupy:
    """Just what loader.family_module touches: a device of some compute capability and RawModule(path=...)."""

    def __init__(self, capability, fail_load=False):
        import types
        self.loaded, self.fail_load = [], fail_load
        fake = self

        class Device:
            def __init__(self, device_id=0):
                self.id, self.compute_capability = device_id, capability

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

        class RawModule:
            def __init__(self, path):
                self.path = path

            def compile(self):
                if fake.fail_load:
                    raise RuntimeError("CUDA_ERROR_NO_BINARY_FOR_GPU")
                fake.loaded.append(self.path)

        props = {"name": b"Fake GPU"}
        self.cuda = types.SimpleNamespace(Device=Device, runtime=types.SimpleNamespace(
            getDeviceProperties=lambda i: props))
        self.RawModule = RawModule


@pytest.fixture
def fake_loader(monkeypatch, tmp_path):
    """loader with a fake CuPy and a manifest of the real sources' digests: (loader, install(capability, ...),
    the sources compiled instead, stderr)."""
    from smalltrain.backend.cuda import loader
    compiled = []
    monkeypatch.setattr(loader, "_compiled", lambda source, options, device_id: compiled.append(source) or "nvrtc")
    monkeypatch.setattr(prebuilt, "ANNOUNCE_AFTER_S", 0.0)
    monkeypatch.setattr(prebuilt, "PREBUILT_DIR", str(tmp_path))
    (tmp_path / "optim.f32.fatbin").write_bytes(b"\x50\xed\x55\xba")
    loader.family_module.cache_clear()

    def install(capability, manifest_source=None, fail_load=False, archs=("80", "90")):
        source = loader.family_source("optim", 1)
        manifest = {"archs": list(archs), "modules": {"optim.f32": {
            "digest": prebuilt.digest(manifest_source or source), "file": "optim.f32.fatbin"}}}
        fake = _FakeCupy(capability, fail_load)
        monkeypatch.setattr(loader, "cupy", lambda: fake)
        monkeypatch.setattr(loader, "_manifest", lambda: manifest)
        loader.family_module.cache_clear()
        return fake
    yield loader, install, compiled
    loader.family_module.cache_clear()


def test_the_loader_loads_the_binary_built_from_this_source(fake_loader, capsys):
    loader, install, compiled = fake_loader
    fake = install("90")
    module = loader.family_module("optim", 1, 0)
    assert fake.loaded == [module.path] and module.path.endswith("optim.f32.fatbin") and compiled == []
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("capability, kwargs, why", [
    ("90", {"manifest_source": "an older optim.cu"}, "is stale"),
    ("75", {}, "not this GPU's sm_75"),
    ("90", {"fail_load": True}, "did not load: RuntimeError: CUDA_ERROR_NO_BINARY_FOR_GPU")])
def test_the_loader_compiles_a_stale_foreign_or_unloadable_binarys_module_and_says_so(fake_loader, capsys,
                                                                                      capability, kwargs, why):
    loader, install, compiled = fake_loader
    install(capability, **kwargs)
    assert loader.family_module("optim", 1, 0) == "nvrtc"
    assert compiled == [loader.family_source("optim", 1)]
    err = capsys.readouterr().err
    assert f"smalltrain: compiling CUDA kernels optim (float32) for sm_{capability} (Fake GPU) with NVRTC" in err
    assert why in err and "smalltrain: compiled optim (float32) in " in err


def test_float64_modules_are_not_shipped_and_compile(fake_loader, capsys):
    loader, install, compiled = fake_loader
    install("90")
    assert loader.family_module("optim", 2, 0) == "nvrtc"
    assert "no prebuilt binary for optim.f64" in capsys.readouterr().err


def test_the_shipped_binaries_were_built_from_the_current_sources():
    """Every kernel family's float32 module is in the manifest with the digest of its source as the loader reads it
    now: a .cu changed without `python -m smalltrain.backend.cuda.build_kernels` fails here (the loader would compile
    it at run time)."""
    from smalltrain.backend.cuda import loader
    manifest = prebuilt.read_manifest()
    assert manifest is not None, "no manifest: run python -m smalltrain.backend.cuda.build_kernels"
    modules = dict(loader.prebuilt_modules())
    assert sorted(manifest["modules"]) == sorted(modules)
    stale = [key for key, source in modules.items() if manifest["modules"][key]["digest"] != prebuilt.digest(source)]
    assert stale == [], f"rebuild: python -m smalltrain.backend.cuda.build_kernels ({stale} changed)"
    assert set(prebuilt.ARCHS) <= set(manifest["archs"])
    for entry in manifest["modules"].values():
        path = os.path.join(prebuilt.PREBUILT_DIR, entry["file"])
        assert os.path.getsize(path) == entry["bytes"]
        with open(path, "rb") as f:
            assert f.read(4) == b"\x50\xed\x55\xba"   # a fatbin's magic number


def _fake_nvcc(tmp_path):
    """A stand-in nvcc: writes a fatbin's magic to its -o file and logs each call (the build's command line is
    what is tested here, not CUDA's compiler)."""
    log = tmp_path / "calls.log"
    script = tmp_path / "nvcc"
    script.write_text("#!/bin/sh\n"
                      'if [ "$1" = --version ]; then echo "Cuda compilation tools, release 13.0"; exit 0; fi\n'
                      f'echo "$@" >> {log}\n'
                      'while [ $# -gt 0 ]; do if [ "$1" = -o ]; then printf "\\120\\355\\125\\272" > "$2"; fi; '
                      "shift; done\n")
    script.chmod(0o755)
    return str(script), log


def test_the_build_writes_binaries_and_a_manifest_and_rebuilds_only_what_changed(tmp_path):
    nvcc, log = _fake_nvcc(tmp_path)
    out = tmp_path / "prebuilt"
    modules = [("a.f32", SOURCE), ("b.f32", SOURCE + "// b\n")]
    manifest = prebuilt.build(modules, str(out), nvcc=nvcc, jobs=1, log=lambda line: None)
    assert sorted(manifest["modules"]) == ["a.f32", "b.f32"] and manifest["archs"] == list(prebuilt.ARCHS)
    assert manifest["modules"]["b.f32"]["digest"] == prebuilt.digest(SOURCE + "// b\n")
    calls = log.read_text().splitlines()
    assert len(calls) == 2 and all("-fatbin" in c and "-gencode=arch=compute_90,code=sm_90" in c for c in calls)
    assert prebuilt.read_manifest(str(out)) == manifest
    (out / "stale.f32.fatbin").write_bytes(b"old")
    manifest = prebuilt.build([("a.f32", SOURCE), ("b.f32", SOURCE + "// changed\n")], str(out), nvcc=nvcc,
                              jobs=1, log=lambda line: None)
    assert len(log.read_text().splitlines()) == 3   # only b rebuilt
    assert manifest["modules"]["b.f32"]["digest"] == prebuilt.digest(SOURCE + "// changed\n")
    assert sorted(p.name for p in out.iterdir()) == ["a.f32.fatbin", "b.f32.fatbin", "manifest.json"]
    prebuilt.build([("a.f32", SOURCE)], str(out), nvcc=nvcc, jobs=1, log=lambda line: None, force=True)
    assert len(log.read_text().splitlines()) == 4


def test_a_failed_build_names_the_module_and_leaves_no_binary(tmp_path):
    script = tmp_path / "nvcc"
    script.write_text('#!/bin/sh\nif [ "$1" = --version ]; then echo v; exit 0; fi\necho "error: bad" >&2; exit 1\n')
    script.chmod(0o755)
    out = tmp_path / "prebuilt"
    with pytest.raises(RuntimeError, match=r"nvcc failed for .*a\.f32\.fatbin:\nerror: bad"):
        prebuilt.build([("a.f32", SOURCE)], str(out), nvcc=str(script), jobs=1, log=lambda line: None)
    assert list(out.iterdir()) == []


@pytest.mark.skipif(not smalltrain.cuda.is_available(), reason="no CUDA device")
def test_cupys_first_compile_on_a_gpu_is_said_on_stderr(tmp_path):
    """From an empty CuPy cache, CuPy's own elementwise kernels compile at first use: the process says so."""
    if cuda_emulator.installed():
        pytest.skip("the emulator compiles nothing with NVRTC")
    code = "import smalltrain; x = smalltrain.ones(5, device='cuda'); print((x * 3 - 1).sum().item())"
    run = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, CUPY_CACHE_DIR=str(tmp_path)),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "10.0", run.stderr
    assert "smalltrain: CuPy is compiling its own kernels" in run.stderr and str(tmp_path) in run.stderr
    assert "smalltrain: CuPy compiled " in run.stderr

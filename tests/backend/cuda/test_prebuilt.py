"""The prebuilt kernel binaries (backend/cuda/prebuilt.py): which binary a device loads, when it compiles instead,
and the note a run-time compilation prints."""
import io
import json
import time

import pytest

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
    assert "stale" in why and "python -m smalltrain.backend.cuda.prebuilt" in why


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

"""Tests for smalltrain.utils.checkpoint: one safetensors file (the library's) with a JSON document, every corruption
refused with the file's name."""
import io
import json
import os
import struct

import numpy as np
import pytest
import safetensors
import safetensors.numpy

from smalltrain.utils.checkpoint import CheckpointError, open_safetensors, write_safetensors

DOCUMENT = {"structure": {"list": [1, 2.5, "x", None, True]}, "note": "ok"}


def sample_arrays():
    rng = np.random.default_rng(0)
    f32 = rng.standard_normal((3, 4)).astype(np.float32)
    f32[0, :3] = [np.nan, -0.0, np.inf]
    return {
        "conv.weight": f32,
        "f64": rng.standard_normal((2, 1, 3)),
        "f16": np.array([1.5, -2.0, 65504.0], dtype=np.float16),
        "i64": np.array([-(2 ** 63), 2 ** 63 - 1, 0], dtype=np.int64),
        "i32": np.arange(-6, 6, dtype=np.int32).reshape(2, 3, 2),
        "i16": np.array([-32768, 7], dtype=np.int16),
        "i8": np.array([-128, 127], dtype=np.int8),
        "u8": np.array([0, 255, 7], dtype=np.uint8),
        "mask": np.array([[True, False], [False, True]]),
        "scalar": np.array(2.5, dtype=np.float32),
        "empty": np.zeros((0, 5), dtype=np.float32),
        "strided": np.arange(20.0).reshape(4, 5)[:, ::2],
        "big_endian": np.arange(4, dtype=">f4"),
    }


def assert_bitwise_equal(loaded, original):
    assert sorted(loaded) == sorted(original)
    for name, array in original.items():
        expected = np.require(array.astype(array.dtype.newbyteorder("=")), requirements="C")
        got = loaded[name]
        assert got.dtype == expected.dtype and got.shape == expected.shape, name
        assert got.tobytes() == expected.tobytes(), name


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    write_safetensors(path, sample_arrays(), DOCUMENT)
    return path


def test_round_trip_is_bitwise_and_one_file(saved):
    with open_safetensors(saved) as reader:
        assert reader.document == DOCUMENT
        assert reader.specs["i32"] == ("I32", (2, 3, 2)) and reader.specs["scalar"] == ("F32", ())
        assert_bitwise_equal(reader.read(), sample_arrays())
    assert os.listdir(saved.parent) == ["ckpt.safetensors"]


def test_file_is_plain_safetensors_with_one_metadata_key(saved):
    assert_bitwise_equal(safetensors.numpy.load_file(str(saved)), sample_arrays())
    with safetensors.safe_open(str(saved), framework="np") as f:
        metadata = f.metadata()
    assert list(metadata) == ["smalltrain"]
    envelope = json.loads(metadata["smalltrain"])
    assert envelope["format"] == "smalltrain.checkpoint" and envelope["document"] == DOCUMENT


def test_reads_a_file_written_by_the_safetensors_library(tmp_path):
    path = tmp_path / "lib.safetensors"
    arrays = {k: np.require(v.astype(v.dtype.newbyteorder("=")), requirements="C") for k, v in sample_arrays().items()}
    safetensors.numpy.save_file(arrays, str(path), metadata={"producer": "someone else"})
    with open_safetensors(path) as reader:
        assert reader.document is None
        assert_bitwise_equal(reader.read(), arrays)


def test_file_objects_round_trip():
    buffer = io.BytesIO()
    write_safetensors(buffer, sample_arrays(), DOCUMENT)
    data = buffer.getvalue()
    with open_safetensors(buffer, data) as reader:
        assert reader.document == DOCUMENT
        assert_bitwise_equal(reader.read(), sample_arrays())


@pytest.mark.parametrize("array, message", [
    (np.array([1 + 2j]), "dtype complex128"),
    (np.array(["x"], dtype=object), "dtype object"),
    (np.array([1], dtype=np.uint16), "dtype uint16"),
    ([1.0, 2.0], "is a list, expected a numpy array"),
])
def test_unsupported_arrays_are_refused_before_writing(tmp_path, array, message):
    with pytest.raises(TypeError, match=message):
        write_safetensors(tmp_path / "bad.safetensors", {"a": array}, DOCUMENT)
    assert os.listdir(tmp_path) == []


def test_non_finite_floats_never_reach_the_json(tmp_path):
    with pytest.raises(ValueError, match="not JSON compliant"):
        write_safetensors(tmp_path / "bad.safetensors", {}, {"lr": float("nan")})
    assert os.listdir(tmp_path) == []


def test_unsupported_dtype_in_a_file_is_named(tmp_path):
    path = tmp_path / "u16.safetensors"
    safetensors.numpy.save_file({"w": np.arange(3, dtype=np.uint16)}, str(path))
    with pytest.raises(CheckpointError, match=r"u16.safetensors: tensor 'w' has dtype U16"):
        with open_safetensors(path):
            pass


def header_and_body(path):
    data = path.read_bytes()
    size = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + size]), data[8 + size:]


def rewrite(path, header, body):
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + body)


def set_envelope(path, change):
    header, body = header_and_body(path)
    envelope = json.loads(header["__metadata__"]["smalltrain"])
    change(envelope)
    header["__metadata__"]["smalltrain"] = json.dumps(envelope) if not isinstance(envelope, str) else envelope
    rewrite(path, header, body)


def test_truncated_file_is_refused_with_its_name(saved):
    for cut in (3, 100, len(saved.read_bytes()) - 1):
        saved.write_bytes(saved.read_bytes()[:cut] if cut != 100 else saved.read_bytes()[:-100])
        with pytest.raises(CheckpointError, match="ckpt.safetensors: not a valid safetensors file"):
            with open_safetensors(saved):
                pass


def test_dtype_that_disagrees_with_the_byte_length_is_refused(saved):
    header, body = header_and_body(saved)
    header["f64"]["dtype"] = "F32"     # 6 float64 take 48 bytes; 6 float32 would take 24
    rewrite(saved, header, body)
    with pytest.raises(CheckpointError, match="ckpt.safetensors"):
        with open_safetensors(saved):
            pass


def test_flipped_bit_in_tensor_data_is_caught_by_the_digest(saved):
    data = bytearray(saved.read_bytes())
    data[-20] ^= 0x01
    saved.write_bytes(bytes(data))
    with open_safetensors(saved) as reader:
        with pytest.raises(CheckpointError, match="ckpt.safetensors: tensor data has sha256 .* file is corrupt"):
            reader.read()


@pytest.mark.parametrize("change, message", [
    (lambda e: e.update(version=99), "unsupported checkpoint format 'smalltrain.checkpoint' version 99"),
    (lambda e: e.pop("sha256"), "must be an object with keys"),
    (lambda e: e.update(extra=1), "must be an object with keys"),
    (lambda e: e.update(sha256=5), "sha256 must be a string"),
])
def test_bad_envelope_is_refused(saved, change, message):
    set_envelope(saved, change)
    with pytest.raises(CheckpointError, match=message) as info:
        with open_safetensors(saved):
            pass
    assert "ckpt.safetensors" in str(info.value)


@pytest.mark.parametrize("text, message", [
    ("{not json", "is not valid JSON"),
    ('{"format": "smalltrain.checkpoint", "version": 2, "sha256": "", "document": NaN}', "bare NaN is not JSON"),
    ("[" * 100000 + "]" * 100000, "is not valid JSON"),
    ("1" * 5000, "is not valid JSON"),
])
def test_metadata_that_is_not_json_is_refused(saved, text, message):
    header, body = header_and_body(saved)
    header["__metadata__"]["smalltrain"] = text
    rewrite(saved, header, body)
    with pytest.raises(CheckpointError, match=message):
        with open_safetensors(saved):
            pass


def test_older_two_file_format_is_named(tmp_path):
    path = tmp_path / "old.safetensors"
    safetensors.numpy.save_file({"w": np.ones(2)}, str(path), metadata={"producer": "smalltrain.checkpoint"})
    with pytest.raises(CheckpointError, match="older two-file format"):
        with open_safetensors(path):
            pass


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        with open_safetensors(tmp_path / "nope.safetensors"):
            pass


def test_failed_write_keeps_the_old_file_and_leaves_no_temp(saved, monkeypatch):
    def failing_save(arrays, metadata=None):
        raise RuntimeError("disk on fire")
    monkeypatch.setattr(safetensors.numpy, "save", failing_save)
    with pytest.raises(RuntimeError, match="disk on fire"):
        write_safetensors(saved, {"w": np.ones(2)}, {"other": 1})
    assert os.listdir(saved.parent) == ["ckpt.safetensors"]
    with open_safetensors(saved) as reader:
        assert reader.document == DOCUMENT

"""Tests for smalltrain.utils.checkpoint: bitwise round trip, real safetensors files, every corruption detected."""
import json
import os
import struct

import numpy as np
import pytest

from smalltrain.utils import checkpoint
from smalltrain.utils.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

META = {"model": {"name": "cnn", "hidden": [32, 64]}, "epoch": 3, "step": 1200, "lr": 0.01, "best": None,
        "rng": {"state": [1, 2, 3], "pos": 624}, "optimizer": {"state": {"0": {"step": 5}}}}


def sample_tensors():
    rng = np.random.default_rng(0)
    f32 = rng.standard_normal((3, 4)).astype(np.float32)
    f32[0, :3] = [np.nan, -0.0, np.inf]
    return {
        "conv.weight": f32,
        "f64": rng.standard_normal((2, 1, 3)),
        "i64": np.array([-(2 ** 63), 2 ** 63 - 1, 0], dtype=np.int64),
        "i32": np.arange(-6, 6, dtype=np.int32).reshape(2, 3, 2),
        "u8": np.array([0, 255, 7], dtype=np.uint8),
        "mask": np.array([[True, False], [False, True]]),
        "scalar": np.array(2.5, dtype=np.float32),
        "scalar_i64": np.array(-7, dtype=np.int64),
        "empty": np.zeros((0, 5), dtype=np.float32),
        "empty_u8": np.zeros((4, 0), dtype=np.uint8),
        "strided": np.arange(20.0).reshape(4, 5)[:, ::2],
        "big_endian": np.arange(4, dtype=">f4"),
    }


def assert_bitwise_equal(loaded, original):
    assert sorted(loaded) == sorted(original)
    for name, array in original.items():
        expected = np.asarray(array).astype(np.asarray(array).dtype.newbyteorder("="))
        got = loaded[name]
        assert got.dtype == expected.dtype and got.shape == expected.shape, name
        assert got.tobytes() == np.ascontiguousarray(expected).tobytes(), name


def no_temp_files(directory):
    return not [n for n in os.listdir(directory) if n.endswith(".tmp")]


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    save_checkpoint(path, sample_tensors(), META)
    return path


def test_round_trip_is_bitwise(saved):
    tensors, meta = load_checkpoint(saved)
    assert_bitwise_equal(tensors, sample_tensors())
    assert meta == META
    tensors["scalar"][...] = 1  # loaded arrays are writable copies
    assert sorted(os.listdir(saved.parent)) == ["ckpt.json", "ckpt.safetensors"]


def test_load_from_json_path(saved):
    tensors, meta = load_checkpoint(saved.with_suffix(".json"))
    assert_bitwise_equal(tensors, sample_tensors())
    assert meta == META


def test_file_is_real_safetensors(saved):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    safetensors = pytest.importorskip("safetensors")
    assert_bitwise_equal(safetensors_numpy.load_file(str(saved)), sample_tensors())
    with safetensors.safe_open(str(saved), framework="np") as f:
        assert f.metadata() == {"producer": "smalltrain.checkpoint"}


def test_reads_file_written_by_safetensors_library(tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    path = tmp_path / "lib.safetensors"
    tensors = {k: np.ascontiguousarray(v, dtype=v.dtype.newbyteorder("="))
               for k, v in sample_tensors().items() if k != "big_endian"}
    safetensors_numpy.save_file(tensors, str(path))
    data = path.read_bytes()
    assert_bitwise_equal(checkpoint._read_safetensors(path, data), tensors)


def test_overwrite_replaces_both_files(saved):
    save_checkpoint(saved, {"w": np.ones(2)}, {"epoch": 4})
    tensors, meta = load_checkpoint(saved)
    assert list(tensors) == ["w"] and meta == {"epoch": 4}


def rewrite(path, data):
    """Replace the tensor file and update its sidecar, so only the structural check can catch the damage."""
    import hashlib

    path.write_bytes(data)
    json_path = path.with_suffix(".json")
    sidecar = json.loads(json_path.read_text())
    sidecar["tensors_bytes"], sidecar["tensors_sha256"] = len(data), hashlib.sha256(data).hexdigest()
    json_path.write_text(json.dumps(sidecar))


def with_header(header, body=b""):
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + body


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda data: data[:5], "fewer than the 8-byte header size"),
        (lambda data: struct.pack("<Q", len(data)) + data[8:], "is larger than the"),
        (lambda data: data[:8] + b"{not json" + data[17:], "not valid JSON"),
        (lambda data: with_header([1, 2]), "expected a JSON object"),
        (lambda data: with_header({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4),
         "out of range"),
        (lambda data: with_header({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8),
         "needs 12"),
        (lambda data: with_header({"a": {"dtype": "X9", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8),
         "unknown or missing dtype"),
        (lambda data: with_header({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 8]}}, b"\0" * 8),
         "not a list of non-negative ints"),
        (lambda data: with_header({"a": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}}, b"\0" * 3),
         "expected 0"),
        (lambda data: with_header({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}, b"\0" * 3),
         "1 unexpected bytes after the last tensor"),
        (lambda data: with_header({"__metadata__": {"k": 1}}), "__metadata__ must map str to str"),
        (lambda data: data[:-3], "out of range"),
    ],
)
def test_corrupt_safetensors_is_detected(saved, damage, message):
    rewrite(saved, damage(saved.read_bytes()))
    with pytest.raises(CheckpointError, match=message) as info:
        load_checkpoint(saved)
    assert str(saved) in str(info.value)


def test_truncated_without_sidecar_update_is_detected(saved):
    saved.write_bytes(saved.read_bytes()[:-4])
    with pytest.raises(CheckpointError, match="ckpt.safetensors"):
        load_checkpoint(saved)


def test_hash_mismatch_is_detected(saved):
    data = bytearray(saved.read_bytes())
    data[-1] ^= 0x01  # a flipped bit in tensor data leaves the structure valid
    saved.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256 .* does not match") as info:
        load_checkpoint(saved)
    assert str(saved) in str(info.value)


def test_mismatched_pair_is_detected(tmp_path, saved):
    other = tmp_path / "other.safetensors"
    save_checkpoint(other, {"w": np.zeros(2)}, {})
    saved.with_suffix(".json").write_bytes(other.with_suffix(".json").read_bytes().replace(b"other.", b"ckpt."))
    with pytest.raises(CheckpointError, match="does not match"):
        load_checkpoint(saved)


def test_missing_files(tmp_path, saved):
    with pytest.raises(CheckpointError, match="missing checkpoint tensor file") as info:
        load_checkpoint(tmp_path / "nope.safetensors")
    assert "nope.safetensors" in str(info.value)
    with pytest.raises(CheckpointError, match="missing checkpoint sidecar"):
        load_checkpoint(tmp_path / "nope.json")
    saved.with_suffix(".json").unlink()
    with pytest.raises(CheckpointError, match="missing checkpoint sidecar") as info:
        load_checkpoint(saved)
    assert "ckpt.json" in str(info.value)


def test_missing_tensor_file_named_by_sidecar(saved):
    saved.unlink()
    with pytest.raises(CheckpointError, match="missing checkpoint tensor file"):
        load_checkpoint(saved.with_suffix(".json"))


@pytest.mark.parametrize(
    "text, message",
    [
        ("{oops", "not valid JSON"),
        ('{"format": "other"}', "not a smalltrain checkpoint sidecar"),
        ('{"format": "smalltrain.checkpoint", "version": 99}', "unsupported checkpoint version"),
        ('{"format": "smalltrain.checkpoint", "version": 1}', "lacks 'tensors_file'"),
    ],
)
def test_corrupt_sidecar_is_detected(saved, text, message):
    saved.with_suffix(".json").write_text(text)
    with pytest.raises(CheckpointError, match=message) as info:
        load_checkpoint(saved)
    assert "ckpt.json" in str(info.value)


def test_sidecar_cannot_point_outside_its_directory(saved):
    json_path = saved.with_suffix(".json")
    sidecar = json.loads(json_path.read_text())
    sidecar["tensors_file"] = "../ckpt.safetensors"
    json_path.write_text(json.dumps(sidecar))
    with pytest.raises(CheckpointError, match="must be a file name"):
        load_checkpoint(json_path)


def test_failed_write_leaves_no_temp_files_and_keeps_old_checkpoint(saved, monkeypatch):
    calls = []

    def failing_bytes(array):
        calls.append(array)
        if len(calls) == 2:
            raise RuntimeError("disk on fire")
        return array.tobytes()

    monkeypatch.setattr(checkpoint, "_tensor_bytes", failing_bytes)
    with pytest.raises(RuntimeError, match="disk on fire"):
        save_checkpoint(saved, {"a": np.ones(3), "b": np.ones(3)}, {"epoch": 9})
    assert no_temp_files(saved.parent)
    _, meta = load_checkpoint(saved)  # the previous pair is intact
    assert meta == META


@pytest.mark.parametrize(
    "tensors, meta, message",
    [
        ({"a": np.array([1 + 2j])}, {}, "dtype complex128"),
        ({"a": np.array(["x"], dtype=object)}, {}, "dtype object"),
        ({"a": [1.0, 2.0]}, {}, "is a list, expected a numpy array"),
        ({"__metadata__": np.ones(1)}, {}, "must be a str other than"),
        ({"a": np.ones(1)}, {"opt": {"state": {0: {}}}}, r"meta\['opt'\]\['state'\] has key 0 of type int"),
        ({"a": np.ones(1)}, {"lr": np.float32(0.1)}, r"meta\['lr'\] is a float32"),
        ({"a": np.ones(1)}, [1], "meta must be a dict"),
    ],
)
def test_unserializable_input_raises_before_writing(tmp_path, tensors, meta, message):
    path = tmp_path / "bad.safetensors"
    with pytest.raises(TypeError, match=message):
        save_checkpoint(path, tensors, meta)
    assert os.listdir(tmp_path) == []


def test_save_rejects_json_path(tmp_path):
    with pytest.raises(ValueError, match="sidecar"):
        save_checkpoint(tmp_path / "x.json", {}, {})


def test_empty_checkpoint_round_trips(tmp_path):
    path = tmp_path / "empty.safetensors"
    save_checkpoint(path, {}, {"note": "nothing"})
    assert load_checkpoint(path) == ({}, {"note": "nothing"})

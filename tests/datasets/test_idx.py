"""Tests for smalltrain.datasets.idx: bitwise round trips of every element type and rank, plain and gzip, the exact
bytes of the format, and every corruption reported with file, offset and problem."""
import gzip
import hashlib
import os

import numpy as np
import pytest

import smalltrain
from smalltrain.datasets import IdxFormatError, read_idx, write_idx
from smalltrain.datasets.idx import encode_idx
from smalltrain.datasets.mnist import BUNDLED_DIR

DTYPES = [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64]
CODES = {np.uint8: 0x08, np.int8: 0x09, np.int16: 0x0B, np.int32: 0x0C, np.float32: 0x0D, np.float64: 0x0E}
SHAPES = {1: (7,), 2: (3, 5), 3: (2, 3, 4), 4: (2, 1, 3, 2)}


def sample(dtype, shape):
    """Distinct values per position, with each type's extremes (and NaN, inf, -0.0 for floats) at the front."""
    n = int(np.prod(shape))
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        values = np.arange(n, dtype=np.int64) * 37 % (int(info.max) - int(info.min) + 1) + int(info.min)
        values[:2] = [info.min, info.max][: min(2, n)]
        return values.astype(dtype).reshape(shape)
    values = (np.arange(n) - n / 2).astype(dtype) * dtype(1.25) ** (np.arange(n) % 24).astype(dtype)
    values[:4] = [np.nan, -0.0, np.inf, -np.inf][: min(4, n)]
    return values.reshape(shape)


def assert_bitwise(got, expected):
    assert got.dtype == np.dtype(expected.dtype) and got.dtype.isnative
    assert got.shape == expected.shape
    assert got.tobytes() == np.ascontiguousarray(expected).tobytes()


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("rank", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_round_trip_every_type_and_rank(tmp_path, dtype, rank, compress):
    x = sample(dtype, SHAPES[rank])
    path = tmp_path / ("x.idx.gz" if compress else "x.idx")
    write_idx(path, x)
    with open(path, "rb") as f:
        assert (f.read(2) == b"\x1f\x8b") == compress
    y = read_idx(path)
    assert_bitwise(y, x)
    assert y.flags.writeable
    assert os.listdir(tmp_path) == [path.name]      # the atomic write left no temporary file


@pytest.mark.parametrize("shape", [(), (0,), (4, 0, 2)], ids=["rank0", "empty", "empty-middle"])
def test_round_trip_degenerate_shapes(tmp_path, shape):
    x = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape) + 5
    write_idx(tmp_path / "x.idx", x)
    assert_bitwise(read_idx(tmp_path / "x.idx"), x)


def test_header_and_payload_are_big_endian_as_specified():
    x = np.array([[1, 2, 3], [-1, 256, 7]], dtype=np.int16)
    data = encode_idx(x)
    assert data[:4] == bytes([0, 0, 0x0B, 2])
    assert data[4:12] == bytes([0, 0, 0, 2, 0, 0, 0, 3])
    assert data[12:] == bytes([0, 1, 0, 2, 0, 3, 0xFF, 0xFF, 1, 0, 0, 7])
    for dtype in DTYPES:
        assert encode_idx(np.zeros(1, dtype))[2] == CODES[dtype]
    assert encode_idx(np.array([1.0], np.float32))[-4:] == bytes.fromhex("3f800000")


def test_compression_is_told_by_magic_not_name(tmp_path):
    x = sample(np.float64, (3, 4))
    write_idx(tmp_path / "gzipped.idx", x, compress=True)
    write_idx(tmp_path / "plain.gz", x, compress=False)
    assert_bitwise(read_idx(tmp_path / "gzipped.idx"), x)
    assert_bitwise(read_idx(tmp_path / "plain.gz"), x)


def test_gzip_output_is_deterministic_and_tensors_are_accepted(tmp_path):
    x = sample(np.int32, (4, 5))
    write_idx(tmp_path / "a.gz", x)
    write_idx(tmp_path / "b.gz", smalltrain.from_numpy(x))
    assert (tmp_path / "a.gz").read_bytes() == (tmp_path / "b.gz").read_bytes()
    big_endian = x.astype(">i4")
    assert encode_idx(big_endian) == encode_idx(x)
    assert encode_idx(x[:, ::2]) == encode_idx(np.ascontiguousarray(x[:, ::2]))


def test_bundled_mnist_decodes_and_reencodes_to_the_published_bytes():
    path = os.path.join(BUNDLED_DIR, "t10k-labels-idx1-ubyte.gz")
    labels = read_idx(path)
    assert labels.dtype == np.uint8 and labels.shape == (10000,)
    with open(path, "rb") as f:
        raw = gzip.decompress(f.read())
    assert encode_idx(labels) == raw
    with open(os.path.join(BUNDLED_DIR, "MD5SUMS.raw")) as f:
        sums = dict(line.split()[::-1] for line in f)
    assert hashlib.md5(raw).hexdigest() == sums["t10k-labels-idx1-ubyte"]


def test_existing_file_is_replaced_whole(tmp_path):
    path = tmp_path / "x.idx"
    write_idx(path, np.arange(1000, dtype=np.int32))
    write_idx(path, np.arange(3, dtype=np.uint8))
    assert_bitwise(read_idx(path), np.arange(3, dtype=np.uint8))
    with pytest.raises(TypeError, match="cannot store dtype int64"):
        write_idx(path, np.arange(3))
    with pytest.raises(TypeError, match="bool"):
        write_idx(path, np.array([True]))
    assert_bitwise(read_idx(path), np.arange(3, dtype=np.uint8))
    assert os.listdir(tmp_path) == ["x.idx"]


GOOD = encode_idx(np.arange(6, dtype=np.int16).reshape(2, 3))   # 4 + 8 header bytes, 12 payload bytes
CORRUPTIONS = [
    ("empty", b"", 0, "truncated header: expected 4 bytes of magic number, got 0"),
    ("short-magic", b"\x00\x00\x08", 0, "truncated header: expected 4 bytes of magic number, got 3"),
    ("bad-magic", b"\x01\x00\x08\x01" + GOOD[4:], 0, "bad magic number 0x01000801"),
    ("unknown-type", b"\x00\x00\x0a\x02" + GOOD[4:], 2, "unknown element type code 0x0A"),
    ("short-dims", GOOD[:10], 4, "2 dimensions need 8 bytes of sizes, got 6"),
    ("short-payload", GOOD[:-3], 12, "truncated payload: shape [2, 3] of int16 needs 12 bytes, got 9"),
    ("no-payload", GOOD[:12], 12, "needs 12 bytes, got 0"),
    ("trailing", GOOD + b"\x00" * 5, 24, "5 trailing bytes after the payload of shape [2, 3]"),
    ("huge-header", b"\x00\x00\x0e\x03" + b"\xff" * 12 + b"\x00" * 8, 16, "got 8"),
]


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("name, data, offset, problem", CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_corruption_names_file_offset_and_problem(tmp_path, name, data, offset, problem, compress):
    path = tmp_path / f"{name}.idx"
    path.write_bytes(gzip.compress(data, mtime=0) if compress else data)
    with pytest.raises(IdxFormatError) as info:
        read_idx(path)
    err = info.value
    assert isinstance(err, ValueError)
    assert err.path == str(path) and err.offset == offset
    message = str(err)
    assert message.startswith(f"{path}: ") and problem in message
    assert f"byte offset {offset}" in message
    assert ("decompressed" in message) == compress


@pytest.mark.parametrize("damage", ["truncated", "flipped"])
def test_corrupt_gzip_stream(tmp_path, damage):
    packed = bytearray(gzip.compress(encode_idx(sample(np.float32, (50, 40))), mtime=0))
    if damage == "truncated":
        packed = packed[: len(packed) // 2]
    else:
        packed[-6] ^= 0xFF          # inside the CRC32/ISIZE trailer
    path = tmp_path / "bad.gz"
    path.write_bytes(bytes(packed))
    with pytest.raises(IdxFormatError, match="corrupt gzip stream") as info:
        read_idx(path)
    assert str(path) in str(info.value)

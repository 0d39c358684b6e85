"""IDX files (the format MNIST ships in): read and write every element type and rank, plain or gzip.

Reading validates everything and reports a bad file by name, byte offset and what was wrong (IdxFormatError).
"""
import gzip
import os
import sys
import zlib

import numpy as np

from ..utils.io import atomic_write

# type code -> big-endian element dtype, as the IDX format defines them
TYPE_CODES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_CODE_OF = {dt.newbyteorder("="): code for code, dt in TYPE_CODES.items()}
_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 24
_PREALLOCATE_MAX = 1 << 30     # larger headers are believed only as far as the data really goes


class IdxFormatError(ValueError):
    """A malformed IDX file; `path` and `offset` (in the decompressed stream for gzip files) say where."""

    def __init__(self, path, offset, problem, compressed=False):
        where = f"offset {offset} of the decompressed data" if compressed else f"offset {offset}"
        super().__init__(f"{path}: {problem} (at byte {where})")
        self.path, self.offset, self.problem = path, offset, problem


class _Reader:
    """Reads in bounded chunks (a lying header cannot make us allocate more than the file holds), counts the
    offset for error messages and feeds an optional hashlib digest."""

    def __init__(self, f, digest):
        self.f, self.digest, self.pos = f, digest, 0

    def read(self, n):
        buf = bytearray()
        while len(buf) < n:
            chunk = self.f.read(min(_CHUNK, n - len(buf)))
            if not chunk:
                break
            buf += chunk
            self.pos += len(chunk)
        if self.digest is not None:
            self.digest.update(buf)
        return buf

    def read_payload(self, n):
        """Like read(n), into one preallocated buffer when n is plausible (no regrowing a 47 MB bytearray)."""
        if n > _PREALLOCATE_MAX:
            return self.read(n)
        buf = np.empty(n, dtype=np.uint8)
        view, got = memoryview(buf), 0
        while got < n:
            k = self.f.readinto(view[got:got + _CHUNK])
            if not k:
                break
            got += k
        self.pos += got
        if self.digest is not None:
            self.digest.update(view[:got])
        return buf[:got]

    def count_rest(self):
        n = 0
        while chunk := self.read(_CHUNK):
            n += len(chunk)
        return n


def _parse(r, path, compressed):
    def fail(offset, problem):
        raise IdxFormatError(path, offset, problem, compressed)

    magic = r.read(4)
    if len(magic) < 4:
        fail(0, f"truncated header: expected 4 bytes of magic number, got {len(magic)}")
    if magic[0] != 0 or magic[1] != 0:
        fail(0, f"bad magic number 0x{bytes(magic).hex()}: an IDX file starts with two zero bytes")
    code, ndim = magic[2], magic[3]
    if code not in TYPE_CODES:
        known = ", ".join(f"0x{c:02X}" for c in TYPE_CODES)
        fail(2, f"unknown element type code 0x{code:02X} (known: {known})")
    dims = r.read(4 * ndim)
    if len(dims) < 4 * ndim:
        fail(4, f"truncated header: {ndim} dimensions need {4 * ndim} bytes of sizes, got {len(dims)}")
    shape = tuple(int(d) for d in np.frombuffer(bytes(dims), dtype=">u4"))
    dtype = TYPE_CODES[code]
    native = dtype.newbyteorder("=")
    header = 4 + 4 * ndim
    expected = int(np.prod(shape, dtype=object)) * dtype.itemsize
    payload = r.read_payload(expected)
    if len(payload) < expected:
        fail(header, f"truncated payload: shape {list(shape)} of {native.name} needs {expected} bytes, "
                     f"got {len(payload)}")
    trailing = r.count_rest()
    if trailing:
        fail(header + expected, f"{trailing} trailing bytes after the payload of shape {list(shape)}")
    array = np.frombuffer(payload, dtype=dtype).reshape(shape)  # writable: the buffer is ours
    if sys.byteorder == "little" and dtype.itemsize > 1:
        array.byteswap(inplace=True)
    return array.view(native)


def _read(path, digest=None):
    """read_idx, optionally feeding every decompressed byte into a hashlib `digest` (one pass for MD5 checks)."""
    path = os.fspath(path)
    with open(path, "rb") as raw:
        compressed = raw.read(2) == _GZIP_MAGIC
        raw.seek(0)
        f = gzip.GzipFile(fileobj=raw, mode="rb") if compressed else raw
        r = _Reader(f, digest)
        try:
            return _parse(r, path, compressed)
        except (EOFError, gzip.BadGzipFile, zlib.error) as e:
            raise IdxFormatError(path, r.pos, f"corrupt gzip stream: {e}", compressed=True) from e


def read_idx(path):
    """Read an IDX file (plain or gzip, told apart by the magic bytes 1f 8b) into a native-endian NumPy array.

    Element types: 0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64; any rank.
    Raises IdxFormatError (a ValueError) naming the file, the byte offset and the problem.
    """
    return _read(path)


def _as_array(array):
    if hasattr(array, "array") and not isinstance(array, np.ndarray):  # a smalltrain Tensor
        array = array.numpy()
    return np.asarray(array)


def encode_idx(array):
    """The bytes of `array` as an (uncompressed) IDX file."""
    array = _as_array(array)
    native = array.dtype.newbyteorder("=")
    if native not in _CODE_OF:
        names = ", ".join(dt.name for dt in _CODE_OF)
        raise TypeError(f"write_idx: IDX cannot store dtype {array.dtype.name} (supported: {names})")
    if array.ndim > 255:
        raise ValueError(f"write_idx: IDX stores at most 255 dimensions, got {array.ndim}")
    if any(d >= 2 ** 32 for d in array.shape):
        raise ValueError(f"write_idx: IDX dimension sizes must be < 2**32, got shape {list(array.shape)}")
    code = _CODE_OF[native]
    header = bytes([0, 0, code, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    return header + np.ascontiguousarray(array, dtype=TYPE_CODES[code]).tobytes()


def write_idx(path, array, compress=None):
    """Write `array` (NumPy array or Tensor) as an IDX file, atomically: a reader never sees a partial file.

    compress=None gzips when the name ends with '.gz'; True/False force it. The gzip header carries no
    timestamp, so the same array always gives the same bytes.
    """
    path = os.fspath(path)
    data = encode_idx(array)
    if compress is None:
        compress = path.endswith(".gz")
    with atomic_write(path, "wb") as f:
        if compress:
            with gzip.GzipFile(filename="", fileobj=f, mode="wb", mtime=0) as gz:
                gz.write(data)
        else:
            f.write(data)

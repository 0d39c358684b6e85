"""The checkpoint container: named NumPy arrays and one JSON document in ONE safetensors file (the library's format).

The document travels in the safetensors `__metadata__` (str -> str) as one JSON string under the key "smalltrain",
with the format version and a sha256 of the tensor data. Writes are atomic (utils.io.atomic_write); reads check the
header (through the library), the dtypes and the document before any tensor is read. Nothing is ever pickled.
"""
import contextlib
import hashlib
import json
import os

import numpy as np
import safetensors
import safetensors.numpy

from smalltrain.utils.io import atomic_write

__all__ = ["CheckpointError", "SafetensorsReader", "open_safetensors", "write_safetensors"]

KEY, FORMAT, VERSION = "smalltrain", "smalltrain.checkpoint", 2
MAX_DOCUMENT_CHARS = 64 << 20   # the library caps the whole header at 100 MB

# the safetensors dtypes smalltrain has tensors for (BF16, unsigned wider than 8 bits, FP8 ... it has none)
DTYPES = {"BOOL": np.dtype(np.bool_), "U8": np.dtype(np.uint8), "I8": np.dtype(np.int8), "I16": np.dtype(np.int16),
          "I32": np.dtype(np.int32), "I64": np.dtype(np.int64), "F16": np.dtype(np.float16),
          "F32": np.dtype(np.float32), "F64": np.dtype(np.float64)}
_NAMES = {v: k for k, v in DTYPES.items()}


class CheckpointError(ValueError):
    """A checkpoint file is truncated, corrupt, of an unsupported format, or does not fit what loads it."""


def _describe(f):
    if isinstance(f, (str, bytes, os.PathLike)):
        return os.fsdecode(f)
    return getattr(f, "name", None) if isinstance(getattr(f, "name", None), str) else f"<{type(f).__name__}>"


def _digest(arrays):
    """sha256 over the arrays' bytes (C order, little-endian) in sorted name order."""
    digest = hashlib.sha256()
    for name in sorted(arrays):
        digest.update(memoryview(arrays[name]))
    return digest.hexdigest()


def _prepare(name, array):
    if not isinstance(array, np.ndarray):
        raise TypeError(f"write_safetensors: tensor {name!r} is a {type(array).__name__}, expected a numpy array")
    dtype = array.dtype.newbyteorder("<")
    if dtype not in _NAMES:
        raise TypeError(f"write_safetensors: tensor {name!r} has dtype {array.dtype}, which smalltrain checkpoints "
                        f"do not hold (supported: {', '.join(str(d) for d in DTYPES.values())})")
    # the library writes the buffer as it lies in memory: a strided view must be made contiguous first
    return np.require(array.astype(dtype, copy=False), requirements="C")


def write_safetensors(f, arrays, document=None, make_dirs=True):
    """Write `arrays` (name -> numpy array) and `document` (strict JSON: no NaN, no non-str keys) to `f`.

    `f` is a path (written atomically: the old file stays whole until the new one is complete) or a binary file
    object. With `document=None` the file is a plain safetensors file without our metadata."""
    arrays = {name: _prepare(name, array) for name, array in arrays.items()}
    metadata = None
    if document is not None:
        envelope = {"format": FORMAT, "version": VERSION, "sha256": _digest(arrays), "document": document}
        metadata = {KEY: json.dumps(envelope, allow_nan=False, separators=(",", ":"))}
    data = safetensors.numpy.save(arrays, metadata=metadata)
    if hasattr(f, "write"):
        f.write(data)
        return
    with atomic_write(f, "wb", make_dirs=make_dirs) as out:
        out.write(data)


class SafetensorsReader:
    """An opened safetensors file: `specs` (name -> (dtype, shape)) and `document` known, tensors read on demand."""

    def __init__(self, name, metadata, specs, read_one):
        self.name, self.metadata, self.specs, self._read_one = name, metadata or {}, specs, read_one
        for tensor, (dtype, _) in specs.items():
            if dtype not in DTYPES:
                raise CheckpointError(f"{name}: tensor {tensor!r} has dtype {dtype}, which smalltrain does not "
                                      f"support (supported: {', '.join(DTYPES)})")
        self.envelope = self._parse_envelope()
        self.document = None if self.envelope is None else self.envelope["document"]

    def error(self, message):
        return CheckpointError(f"{self.name}: {message}")

    def _parse_envelope(self):
        if KEY not in self.metadata:
            if self.metadata.get("producer") == FORMAT:
                raise self.error("checkpoint in the older two-file format (.safetensors + .json sidecar), which "
                                 "this version of smalltrain no longer reads; re-run the training to write a new one")
            return None     # a plain safetensors file of another tool: a flat dict of tensors
        text = self.metadata[KEY]
        if len(text) > MAX_DOCUMENT_CHARS:
            raise self.error(f"metadata {KEY!r} holds {len(text)} characters, more than {MAX_DOCUMENT_CHARS}")
        try:
            envelope = json.loads(text, parse_constant=_refuse_constant)
        except (ValueError, RecursionError) as e:   # JSONDecodeError, NaN, oversized ints, absurd nesting
            raise self.error(f"metadata {KEY!r} is not valid JSON: {e}") from None
        if not isinstance(envelope, dict) or set(envelope) != {"format", "version", "sha256", "document"}:
            raise self.error(f"metadata {KEY!r} must be an object with keys format, version, sha256, document")
        if envelope["format"] != FORMAT or envelope["version"] != VERSION:
            raise self.error(f"unsupported checkpoint format {envelope['format']!r} version {envelope['version']!r}"
                             f" (this smalltrain reads {FORMAT!r} version {VERSION})")
        if not isinstance(envelope["sha256"], str):
            raise self.error("metadata sha256 must be a string")
        return envelope

    def read(self, names=None):
        """Arrays by name (all by default); with our metadata, all of them are checked against the sha256."""
        names = list(self.specs) if names is None else names
        arrays = {name: self._read_one(name) for name in names}
        for name, array in arrays.items():
            dtype, shape = self.specs[name]
            if array.dtype != DTYPES[dtype] or array.shape != shape:   # the library's own promise, kept honest
                raise self.error(f"tensor {name!r} read as {array.dtype} {array.shape}, header says {dtype} {shape}")
        if self.envelope is not None and set(names) == set(self.specs):
            digest = _digest(arrays)
            if digest != self.envelope["sha256"]:
                raise self.error(f"tensor data has sha256 {digest}, the header records {self.envelope['sha256']} "
                                 "(the file is corrupt)")
        return arrays


def _refuse_constant(name):
    raise ValueError(f"bare {name} is not JSON (smalltrain writes non-finite floats as tagged strings)")


def _header_metadata(data):
    """The `__metadata__` of safetensors bytes the library has already validated."""
    size = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + size]).get("__metadata__")


@contextlib.contextmanager
def open_safetensors(f, data=None):
    """A SafetensorsReader over a path (memory-mapped by the library) or over `data`, the bytes read from `f`.

    Raises CheckpointError naming the file for anything the library or our checks refuse."""
    name = _describe(f)
    try:
        if data is None:
            with safetensors.safe_open(os.fspath(f), framework="np") as handle:
                specs = {}
                for key in handle.keys():
                    view = handle.get_slice(key)
                    specs[key] = (view.get_dtype(), tuple(view.get_shape()))
                yield SafetensorsReader(name, handle.metadata(), specs, handle.get_tensor)
        else:
            entries = dict(safetensors.deserialize(data))   # validates the header and every byte range
            specs = {k: (e["dtype"], tuple(e["shape"])) for k, e in entries.items()}

            def read_one(key):
                dtype, shape = specs[key]
                little = np.frombuffer(entries[key]["data"], dtype=DTYPES[dtype].newbyteorder("<"))
                return little.astype(DTYPES[dtype], copy=False).reshape(shape)
            yield SafetensorsReader(name, _header_metadata(data), specs, read_one)
    except safetensors.SafetensorError as e:
        raise CheckpointError(f"{name}: not a valid safetensors file (truncated or corrupt?): {e}") from None

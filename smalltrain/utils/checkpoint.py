"""Checkpoints as a `.safetensors` file of arrays plus a `.json` sidecar holding metadata and the file's sha256.

Both are written atomically, tensors first and the sidecar last: the sidecar is the commit marker. Nothing is pickled.
"""
import hashlib
import json
import math
import os
import struct
from pathlib import Path

import numpy as np

from smalltrain.utils.io import atomic_write

__all__ = ["CheckpointError", "load_checkpoint", "save_checkpoint"]

_FORMAT, _VERSION = "smalltrain.checkpoint", 1

# safetensors dtype names; the file is always little-endian.
_DTYPES = {"BOOL": "|b1", "U8": "|u1", "I8": "|i1", "U16": "<u2", "I16": "<i2", "F16": "<f2", "U32": "<u4",
           "I32": "<i4", "F32": "<f4", "U64": "<u8", "I64": "<i8", "F64": "<f8"}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}


class CheckpointError(ValueError):
    """A checkpoint file is missing, truncated, corrupt, or does not match its sidecar."""


def _sidecar_path(path):
    return path.with_suffix(".json")


def _check_meta(value, where):
    """Reject what JSON would silently change (int dict keys become str) or cannot hold, naming where it is."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"save_checkpoint: {where} has key {key!r} of type {type(key).__name__}; "
                                "JSON object keys must be str")
            _check_meta(item, f"{where}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_meta(item, f"{where}[{i}]")
    elif not (value is None or isinstance(value, (str, bool, int, float))):
        raise TypeError(f"save_checkpoint: {where} is a {type(value).__name__}, which is not JSON "
                        "(use str, int, float, bool, None, list or dict)")


def _prepare_tensors(tensors):
    """Validate and order tensors: largest itemsize first, so every tensor is aligned to its element size."""
    prepared = []
    for name, array in tensors.items():
        if not isinstance(name, str) or name == "__metadata__":
            raise TypeError(f"save_checkpoint: tensor name {name!r} must be a str other than '__metadata__'")
        if not isinstance(array, (np.ndarray, np.generic)):
            raise TypeError(f"save_checkpoint: tensor {name!r} is a {type(array).__name__}, expected a numpy array")
        array = np.asarray(array)
        dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
        if dtype not in _NAMES:
            supported = ", ".join(sorted(str(np.dtype(d)) for d in _DTYPES.values()))
            raise TypeError(f"save_checkpoint: tensor {name!r} has dtype {array.dtype}, which safetensors "
                            f"cannot store (supported: {supported})")
        prepared.append((name, array.astype(dtype, order="C", copy=False)))  # ascontiguousarray makes 0-d 1-d
    prepared.sort(key=lambda item: (-item[1].dtype.itemsize, item[0]))
    return prepared


def _tensor_bytes(array):
    return array.tobytes()


def save_checkpoint(path, tensors, meta):
    """Write `tensors` (name -> numpy array) to `path` (.safetensors) and `meta` (JSON-able dict) beside it.

    The sidecar is `path` with suffix `.json`; it also records the tensor file's name, size and sha256.
    """
    path = Path(path)
    if path.suffix == ".json":
        raise ValueError(f"save_checkpoint: {path} ends in .json, which is the sidecar's name; use .safetensors")
    if not isinstance(meta, dict):
        raise TypeError(f"save_checkpoint: meta must be a dict, got {type(meta).__name__}")
    _check_meta(meta, "meta")
    prepared = _prepare_tensors(tensors)

    header, offset = {}, 0
    for name, array in prepared:
        header[name] = {"dtype": _NAMES[array.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    header["__metadata__"] = {"producer": _FORMAT}
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    header_bytes += b" " * (-len(header_bytes) % 8)  # pad so the data section starts 8-byte aligned

    digest, size = hashlib.sha256(), 0
    with atomic_write(path, "wb") as f:
        for chunk in [struct.pack("<Q", len(header_bytes)), header_bytes]:
            f.write(chunk)
            digest.update(chunk)
            size += len(chunk)
        for _, array in prepared:
            chunk = _tensor_bytes(array)
            f.write(chunk)
            digest.update(chunk)
            size += len(chunk)

    sidecar = {"format": _FORMAT, "version": _VERSION, "tensors_file": path.name, "tensors_bytes": size,
               "tensors_sha256": digest.hexdigest(), "meta": meta}
    with atomic_write(_sidecar_path(path), "w") as f:
        json.dump(sidecar, f, indent=1)
        f.write("\n")


def _read_sidecar(json_path):
    try:
        with open(json_path, encoding="utf-8") as f:
            sidecar = json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"{json_path}: missing checkpoint sidecar (a checkpoint is complete only once its "
                              ".json is written)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{json_path}: corrupt checkpoint sidecar, not valid JSON: {e}") from None
    if not isinstance(sidecar, dict) or sidecar.get("format") != _FORMAT:
        raise CheckpointError(f"{json_path}: not a smalltrain checkpoint sidecar (no \"format\": \"{_FORMAT}\")")
    if sidecar.get("version") != _VERSION:
        raise CheckpointError(f"{json_path}: unsupported checkpoint version {sidecar.get('version')!r}, "
                              f"expected {_VERSION}")
    for key, kind in [("tensors_file", str), ("tensors_bytes", int), ("tensors_sha256", str), ("meta", dict)]:
        if not isinstance(sidecar.get(key), kind):
            raise CheckpointError(f"{json_path}: checkpoint sidecar lacks {key!r} ({kind.__name__})")
    name = sidecar["tensors_file"]
    if os.path.basename(name) != name or name in ("", ".", ".."):
        raise CheckpointError(f"{json_path}: tensors_file {name!r} must be a file name in the same directory")
    return sidecar


def _parse_header(path, data):
    """Validate the safetensors header against the file as the safetensors library does; return (entries, start)."""
    if len(data) < 8:
        raise CheckpointError(f"{path}: truncated safetensors file: {len(data)} bytes, fewer than the 8-byte "
                              "header size")
    (header_size,) = struct.unpack("<Q", data[:8])
    if 8 + header_size > len(data):
        raise CheckpointError(f"{path}: corrupt safetensors file: header size {header_size} at offset 0 is "
                              f"larger than the {len(data) - 8} bytes after it")
    try:
        header = json.loads(data[8:8 + header_size].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: corrupt safetensors header (bytes 8..{8 + header_size}): not valid "
                              f"JSON: {e}") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header: expected a JSON object, got "
                              f"{type(header).__name__}")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CheckpointError(f"{path}: corrupt safetensors header: __metadata__ must map str to str")
    return header, 8 + header_size


def _check_entry(path, name, entry, data_size):
    """Return (dtype, shape, begin, end) of one header entry, or raise naming what is wrong with it."""
    if not isinstance(entry, dict) or entry.get("dtype") not in _DTYPES:
        dtype = entry.get("dtype") if isinstance(entry, dict) else entry
        raise CheckpointError(f"{path}: tensor {name!r}: unknown or missing dtype {dtype!r}")
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if not (isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                            for d in shape)):
        raise CheckpointError(f"{path}: tensor {name!r}: shape {shape!r} is not a list of non-negative ints")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
        raise CheckpointError(f"{path}: tensor {name!r}: data_offsets {offsets!r} is not [begin, end]")
    begin, end = offsets
    if not 0 <= begin <= end <= data_size:
        raise CheckpointError(f"{path}: tensor {name!r}: data_offsets [{begin}, {end}] out of range: the data "
                              f"section holds {data_size} bytes (file truncated?)")
    dtype = np.dtype(_DTYPES[entry["dtype"]])
    if end - begin != math.prod(shape) * dtype.itemsize:
        raise CheckpointError(f"{path}: tensor {name!r}: data_offsets [{begin}, {end}] hold {end - begin} bytes, "
                              f"but {entry['dtype']} shape {shape} needs {math.prod(shape) * dtype.itemsize}")
    return dtype, tuple(shape), begin, end


def _read_safetensors(path, data):
    header, start = _parse_header(path, data)
    data_size = len(data) - start
    entries = {name: _check_entry(path, name, entry, data_size) for name, entry in header.items()}
    position = 0
    for name, (_, _, begin, end) in sorted(entries.items(), key=lambda item: item[1][2:]):
        if begin != position:
            raise CheckpointError(f"{path}: tensor {name!r}: data_offsets start at {begin}, expected {position} "
                                  "(tensors must tile the data section without gaps or overlap)")
        position = end
    if position != data_size:
        raise CheckpointError(f"{path}: {data_size - position} unexpected bytes after the last tensor, at file "
                              f"offset {start + position}")
    tensors = {}
    for name, (dtype, shape, begin, end) in entries.items():
        array = np.frombuffer(data, dtype=dtype, count=math.prod(shape), offset=start + begin).reshape(shape)
        tensors[name] = array.astype(dtype.newbyteorder("="), copy=True)
    return tensors


def load_checkpoint(path):
    """Load a checkpoint from its `.safetensors` or `.json` path; return (tensors, meta).

    Raises CheckpointError, naming the file, if either file is missing, truncated, corrupt, or they do not match.
    """
    path = Path(path)
    if path.suffix == ".json":
        json_path = path
        sidecar = _read_sidecar(json_path)
        tensor_path = path.parent / sidecar["tensors_file"]
    else:
        tensor_path, json_path = path, _sidecar_path(path)
        if not tensor_path.exists():
            raise CheckpointError(f"{tensor_path}: missing checkpoint tensor file")
        sidecar = _read_sidecar(json_path)
    try:
        with open(tensor_path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise CheckpointError(f"{tensor_path}: missing checkpoint tensor file (named by {json_path})") from None
    tensors = _read_safetensors(tensor_path, data)
    if len(data) != sidecar["tensors_bytes"]:
        raise CheckpointError(f"{tensor_path}: size {len(data)} bytes does not match the "
                              f"{sidecar['tensors_bytes']} recorded in {json_path}")
    digest = hashlib.sha256(data).hexdigest()
    if digest != sidecar["tensors_sha256"]:
        raise CheckpointError(f"{tensor_path}: sha256 {digest} does not match {sidecar['tensors_sha256']} "
                              f"recorded in {json_path} (the pair is from different saves, or a file is corrupt)")
    return tensors, sidecar["meta"]

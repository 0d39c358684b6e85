"""Reading files written by `torch.save` (the zip format) without running any code from them.

`<archive>/data.pkl` is unpickled by a restricted Unpickler whose find_class admits only what torch.load admits
with weights_only=True: the tensor-rebuild functions, storage types, dtypes, torch.Size/device, OrderedDict and
plain containers and scalars. Anything else raises UnsafePickleError (a pickle.UnpicklingError) naming the global
before it is ever called. Storages are read from `<archive>/data/<key>` as NumPy arrays; the caller's `make`
turns them into Tensors once the whole pickle has been read.
"""
import _compat_pickle
import io
import math
import pickle
import zipfile
from collections import OrderedDict

import numpy as np

from .. import _dtype
from ..backend import Device
from ..utils.checkpoint import CheckpointError

_STORAGES = {"FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16",
             "LongStorage": "int64", "IntStorage": "int32", "ShortStorage": "int16", "CharStorage": "int8",
             "ByteStorage": "uint8", "BoolStorage": "bool", "UntypedStorage": "uint8"}
_DTYPES = {"float32": "float32", "float": "float32", "float64": "float64", "double": "float64",
           "float16": "float16", "half": "float16", "int64": "int64", "long": "int64", "int32": "int32",
           "int": "int32", "int16": "int16", "short": "int16", "int8": "int8", "uint8": "uint8", "bool": "bool"}
MAX_DEPTH = 100
MAX_EXPANDED_BYTES = 1 << 30   # an expanded (stride-0) view is copied; refuse to blow a few bytes up beyond this


class UnsafePickleError(CheckpointError, pickle.UnpicklingError):
    """The pickle names a global that a weights-only load does not admit; nothing from the file was run."""


class TensorData:
    """A tensor read from the file, not yet a Tensor: its array, saved location and flags."""

    __slots__ = ("array", "location", "requires_grad", "parameter")
    __hash__ = None   # torch tensors in sets are not supported; unhashable makes that an error, not a surprise

    def __init__(self, array, location, requires_grad, parameter=False):
        self.array, self.location, self.requires_grad, self.parameter = array, location, requires_grad, parameter


class TorchObject:
    """A storage type or tensor class named by the pickle: immutable, so a BUILD opcode cannot alter it."""

    __slots__ = ("kind", "value")

    def __init__(self, kind, value):
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "value", value)

    def __setattr__(self, name, value):
        raise AttributeError("read-only")


def _require(ok, message):
    if not ok:
        raise pickle.UnpicklingError(message)


def _ints(value, what):
    _require(isinstance(value, (tuple, list)) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                      for v in value), f"{what} must be a tuple of ints >= 0")
    return tuple(value)


class _Unpickler(pickle.Unpickler):
    def __init__(self, data, archive, prefix, little_endian, source, encoding):
        super().__init__(io.BytesIO(data), encoding=encoding)
        self.archive, self.prefix, self.source = archive, prefix, source
        self.byteorder = "<" if little_endian else ">"
        self.storages = {}
        # fresh closures and immutable values only: BUILD on a shared function or class could alter it for good
        rebuild_v2 = lambda *a: self.rebuild_tensor_v2(*a)  # noqa: E731
        rebuild_v3 = lambda *a: self.rebuild_tensor_v3(*a)  # noqa: E731
        rebuild_v1 = lambda *a: self.rebuild_tensor(*a)  # noqa: E731
        self.rebuilders = {rebuild_v1, rebuild_v2, rebuild_v3}
        self.allowed = {
            "collections.OrderedDict": OrderedDict, "builtins.set": set, "builtins.frozenset": frozenset,
            "builtins.complex": complex, "builtins.bytearray": lambda *a: bytearray(self.encoded(*a)),
            "_codecs.encode": lambda *a: self.encoded(*a), "torch.Size": lambda dims=(): _ints(dims, "torch.Size"),
            "torch.device": lambda *a: Device(*a), "torch.Tensor": TorchObject("class", "Tensor"),
            "torch.nn.parameter.Parameter": TorchObject("class", "Parameter"),
            "torch._utils._rebuild_tensor_v2": rebuild_v2, "torch._utils._rebuild_tensor_v3": rebuild_v3,
            "torch._utils._rebuild_tensor": rebuild_v1,
            "torch._utils._rebuild_parameter": lambda data, requires_grad, hooks: self.parameter(data, requires_grad),
            "torch._utils._rebuild_parameter_with_state": lambda *a: self.parameter_with_state(*a),
            "torch._tensor._rebuild_from_type_v2": lambda *a: self.rebuild_from_type(*a),
        }

    def find_class(self, module, name):
        # protocol 2 pickles spell Python 2 names (__builtin__, commands): name what would really be imported
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        module = "torch" if module == "torch.storage" else module
        full = f"{module}.{name}"
        if full in self.allowed:
            return self.allowed[full]
        if module == "torch" and name in _STORAGES:
            return TorchObject("storage", np.dtype(_STORAGES[name]))
        if module == "torch" and name in _DTYPES:
            return _dtype.dtype(_DTYPES[name], _DTYPES[name])   # a fresh one, equal to smalltrain's
        if module == "torch" and (name.endswith("Storage") or name in ("bfloat16", "complex64", "complex128")):
            raise CheckpointError(f"{self.source}: {full} holds an element type smalltrain does not support; in "
                                  "PyTorch convert the tensors (e.g. tensor.float()) and save again")
        raise UnsafePickleError(f"{self.source}: refusing to load the global {full}: smalltrain.load admits only "
                                "tensors, storages, dtypes, OrderedDict and plain containers and scalars (torch's "
                                "weights_only rule); nothing from the file was run")

    def encoded(self, text=b"", encoding="latin1", *rest):
        # protocol 2 pickles bytes as _codecs.encode(str, 'latin1'); bytearray(int) would allocate at will
        _require(not rest and isinstance(text, (str, bytes)) and encoding in ("latin1", "latin-1"),
                 "_codecs.encode/bytearray: only (str, 'latin1') is supported")
        return text.encode("latin1") if isinstance(text, str) else bytes(text)

    def persistent_load(self, pid):
        _require(isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage", f"unsupported persistent id "
                 f"{pid!r:.80}")
        _, storage_type, key, location, numel = pid
        _require(isinstance(storage_type, TorchObject) and storage_type.kind == "storage" and isinstance(key, str)
                 and isinstance(location, str) and isinstance(numel, int) and numel >= 0,
                 f"malformed storage record {pid!r:.120}")
        if key not in self.storages:
            dtype = storage_type.value.newbyteorder(self.byteorder)
            name = f"{self.prefix}/data/{key}"
            try:
                info = self.archive.getinfo(name)
            except KeyError:
                raise CheckpointError(f"{self.source}: storage record {name} is missing") from None
            if info.compress_type != zipfile.ZIP_STORED or info.file_size != numel * dtype.itemsize:
                raise CheckpointError(f"{self.source}: storage record {name} holds {info.file_size} bytes "
                                      f"(compression {info.compress_type}); {numel} x {dtype} needs "
                                      f"{numel * dtype.itemsize}, stored")
            array = np.frombuffer(self.archive.read(name), dtype=dtype)
            self.storages[key] = TorchObject("storage data", (array, location))
        return self.storages[key]

    def view(self, storage, offset, size, stride, dtype=None):
        """A copy of the strided view a tensor is of its storage, bounds-checked as torch does."""
        _require(isinstance(storage, TorchObject) and storage.kind == "storage data",
                 "a tensor must be rebuilt from a storage")
        array, location = storage.value
        if dtype is not None:   # an untyped (byte) storage viewed as `dtype`
            _require(isinstance(dtype, _dtype.dtype) and array.size % dtype.itemsize == 0,
                     "malformed dtype for an untyped storage")
            array = array.view(dtype.np.newbyteorder(self.byteorder))
        size, stride = _ints(size, "size"), _ints(stride, "stride")
        _require(isinstance(offset, int) and offset >= 0 and len(size) == len(stride), "malformed tensor view")
        numel = math.prod(size)
        native = array.dtype.newbyteorder("=")
        if numel == 0:
            return np.empty(size, dtype=native), location
        last = offset + sum((n - 1) * s for n, s in zip(size, stride))
        if last >= array.size:
            raise CheckpointError(f"{self.source}: a tensor of size {list(size)}, stride {list(stride)} at offset "
                                  f"{offset} runs past its storage of {array.size} elements")
        if numel > array.size and numel * array.itemsize > MAX_EXPANDED_BYTES:
            raise CheckpointError(f"{self.source}: an expanded tensor of {numel} elements over a storage of "
                                  f"{array.size}: too large to materialize")
        strided = np.lib.stride_tricks.as_strided(array[offset:], shape=size,
                                                  strides=[s * array.itemsize for s in stride], writeable=False)
        return np.array(strided, dtype=native, order="C"), location

    def rebuild_tensor_v2(self, storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None):
        _require(isinstance(requires_grad, bool), "requires_grad must be a bool")
        return TensorData(*self.view(storage, offset, size, stride), requires_grad)

    def rebuild_tensor_v3(self, storage, offset, size, stride, requires_grad, hooks, dtype, metadata=None):
        _require(isinstance(requires_grad, bool), "requires_grad must be a bool")
        return TensorData(*self.view(storage, offset, size, stride, dtype), requires_grad)

    def rebuild_tensor(self, storage, offset, size, stride):
        return TensorData(*self.view(storage, offset, size, stride), False)

    def parameter(self, data, requires_grad):
        _require(isinstance(data, TensorData) and isinstance(requires_grad, bool), "malformed Parameter")
        return TensorData(data.array, data.location, requires_grad, parameter=True)

    def parameter_with_state(self, data, requires_grad, hooks, state):
        if state:
            raise CheckpointError(f"{self.source}: a Parameter with Python attributes ({sorted(state)!r:.80}) is "
                                  "not supported")
        return self.parameter(data, requires_grad)

    def rebuild_from_type(self, func, new_type, args, state):
        _require(func in self.rebuilders and isinstance(new_type, TorchObject) and new_type.kind == "class"
                 and isinstance(args, tuple), "malformed _rebuild_from_type_v2")
        if state:
            raise CheckpointError(f"{self.source}: a tensor with Python attributes is not supported")
        data = func(*args)
        return self.parameter(data, data.requires_grad) if new_type.value == "Parameter" else data


def _to_tensors(value, make, depth=0, seen=None):
    """Replace the TensorData placeholders of an unpickled object by Tensors (containers in place, tuples anew)."""
    seen = set() if seen is None else seen
    if depth > MAX_DEPTH:
        raise ValueError(f"nesting deeper than {MAX_DEPTH} levels (or a cycle)")
    if isinstance(value, TensorData):
        return make(value.array, value.location, value.requires_grad, value.parameter)
    if isinstance(value, (dict, list)) and id(value) not in seen:
        seen.add(id(value))
        keys = value.keys() if isinstance(value, dict) else range(len(value))
        for key in list(keys):
            value[key] = _to_tensors(value[key], make, depth + 1, seen)
    elif isinstance(value, tuple):
        return tuple(_to_tensors(item, make, depth + 1, seen) for item in value)
    elif isinstance(value, TorchObject):
        raise ValueError(f"holds a bare torch {value.kind} object (not a tensor), which smalltrain has no type for")
    elif not (value is None or isinstance(value, (bool, int, float, complex, str, bytes, bytearray, set, frozenset,
                                                  Device, _dtype.dtype))):
        raise ValueError(f"holds a {type(value).__name__}, which smalltrain has no type for")
    return value


def load_torch_zip(f, source, make, encoding="utf-8"):
    """The object a `torch.save` zip file holds, its tensors made by `make(array, location, requires_grad,
    parameter)` once the whole pickle has been read; CheckpointError naming `source` if it is corrupt."""
    try:
        archive = zipfile.ZipFile(f)
    except (zipfile.BadZipFile, EOFError) as e:
        raise CheckpointError(f"{source}: corrupt torch.save zip file: {e}") from None
    with archive:
        pickles = [n for n in archive.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pickles) != 1:
            raise CheckpointError(f"{source}: a torch.save file has one <archive>/data.pkl, found {len(pickles)}")
        prefix = pickles[0][:-len("/data.pkl")]
        try:
            info = archive.getinfo(pickles[0])
            if info.compress_type != zipfile.ZIP_STORED:   # torch stores records; inflating one could bomb
                raise CheckpointError(f"{source}: {pickles[0]} is compressed, torch.save stores it as is")
            names = set(archive.namelist())
            byteorder = archive.read(f"{prefix}/byteorder") if f"{prefix}/byteorder" in names else b"little"
            if byteorder not in (b"little", b"big"):
                raise CheckpointError(f"{source}: byteorder record is {byteorder[:20]!r}, not little or big")
            unpickler = _Unpickler(archive.read(pickles[0]), archive, prefix, byteorder == b"little", source,
                                   encoding)
            obj = unpickler.load()
        except CheckpointError:
            raise
        except (pickle.UnpicklingError, zipfile.BadZipFile, EOFError, ValueError, TypeError, KeyError, IndexError,
                AttributeError, RuntimeError, RecursionError, OverflowError) as e:
            raise CheckpointError(f"{source}: corrupt torch.save file ({type(e).__name__}: {e})") from None
    try:
        return _to_tensors(obj, make)
    except ValueError as e:
        raise CheckpointError(f"{source}: {e}") from None

"""A nested object (dicts, lists, tuples, Tensors, Python scalars) as named arrays plus a JSON structure, and back.

Every JSON node is a scalar or a one-tag object: {"dict": [[key, node], ...]}, {"odict": ...}, {"list": [...]},
{"tuple": [...]}, {"float": "nan" | "inf" | "-inf"}, {"tensor": name, "dtype", "shape", "device", "requires_grad",
"parameter"}. Tensors are named by their path ("model/fc.weight"), so a state_dict's file is an ordinary
safetensors file with torch's key names. `check` validates a structure completely before anything is built.
"""
import math
from collections import OrderedDict


from ..backend import to_host
from ..tensor import Tensor
from ..utils.checkpoint import DTYPES

MAX_DEPTH = 100
_DTYPE_NAMES = {str(dtype): tag for tag, dtype in DTYPES.items()}   # "float32" -> "F32"
_CONTAINERS = {"dict": dict, "odict": OrderedDict, "list": list, "tuple": tuple}
_TENSOR_KEYS = {"tensor", "dtype", "shape", "device", "requires_grad", "parameter"}
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class _Flattener:
    def __init__(self, root_name):
        self.root_name, self.arrays = root_name, {}

    def name_for(self, parts):
        name = "/".join(parts) or "tensor"
        unique, n = name, 1
        while unique in self.arrays:   # a key holding "/" can collide with a nested path: keep both
            n += 1
            unique = f"{name}#{n}"
        return unique

    def node(self, value, where, parts, depth):
        if depth > MAX_DEPTH:
            raise ValueError(f"{where}: nesting deeper than {MAX_DEPTH} levels")
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            if math.isfinite(value):
                return float(value)
            return {"float": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
        if isinstance(value, Tensor):
            return self.tensor(value, where, parts)
        if isinstance(value, dict):
            items = []
            for key, item in value.items():
                if isinstance(key, bool) or not isinstance(key, (str, int)):
                    raise TypeError(f"{where}: cannot save a dict key {key!r} of {type(key)} (keys must be str "
                                    "or int)")
                items.append([key if isinstance(key, str) else int(key),
                              self.node(item, f"{where}[{key!r}]", [*parts, str(key)], depth + 1)])
            return {"odict" if isinstance(value, OrderedDict) else "dict": items}
        if isinstance(value, (list, tuple)):
            tag = "tuple" if isinstance(value, tuple) else "list"
            return {tag: [self.node(item, f"{where}[{i}]", [*parts, str(i)], depth + 1)
                          for i, item in enumerate(value)]}
        raise TypeError(f"{where}: cannot save {type(value)} (smalltrain.save takes dicts, lists, tuples, Tensors, "
                        "int, float, bool, str and None)")

    def tensor(self, value, where, parts):
        array = to_host(value.array)
        if str(array.dtype) not in _DTYPE_NAMES:
            raise TypeError(f"{where}: cannot save a tensor of dtype {array.dtype}")
        name = self.name_for(parts)
        self.arrays[name] = array
        from ..nn.parameter import Parameter
        return {"tensor": name, "dtype": str(array.dtype), "shape": list(array.shape), "device": str(value.device),
                "requires_grad": bool(value.requires_grad), "parameter": isinstance(value, Parameter)}


def flatten(obj, root="obj"):
    """(arrays, structure): the tensors of `obj` by name (host arrays) and its JSON structure.

    TypeError names the place of anything that cannot be saved: "obj['opt']['state'][0]: cannot save <class 'set'>".
    """
    flattener = _Flattener(root)
    structure = flattener.node(obj, root, [], 0)
    return flattener.arrays, structure


class _Checker:
    """Walks a structure read from a file; raises ValueError(path: what is wrong) at the first bad node."""

    def __init__(self, specs):
        self.specs, self.used = specs, set()

    def node(self, node, where, depth):
        if depth > MAX_DEPTH:
            raise ValueError(f"{where}: nesting deeper than {MAX_DEPTH} levels")
        if node is None or isinstance(node, (bool, int, float, str)):
            return
        if not isinstance(node, dict) or not node:
            raise ValueError(f"{where}: expected a scalar or a tagged object, got {type(node).__name__}")
        if "tensor" in node:
            return self.tensor(node, where)
        if len(node) != 1:
            raise ValueError(f"{where}: a node has exactly one tag, got {sorted(node)}")
        (tag, body), = node.items()
        if tag == "float":
            if body not in _NON_FINITE:
                raise ValueError(f"{where}: float tag must be 'nan', 'inf' or '-inf', got {body!r}")
        elif tag in ("list", "tuple"):
            if not isinstance(body, list):
                raise ValueError(f"{where}: {tag} body must be a JSON array")
            for i, item in enumerate(body):
                self.node(item, f"{where}[{i}]", depth + 1)
        elif tag in ("dict", "odict"):
            self.mapping(body, where, depth)
        else:
            raise ValueError(f"{where}: unknown tag {tag!r}")

    def mapping(self, body, where, depth):
        if not isinstance(body, list):
            raise ValueError(f"{where}: dict body must be a JSON array of [key, value] pairs")
        seen = set()
        for pair in body:
            if not (isinstance(pair, list) and len(pair) == 2):
                raise ValueError(f"{where}: dict entries must be [key, value] pairs, got {pair!r:.80}")
            key = pair[0]
            if isinstance(key, bool) or not isinstance(key, (str, int)) or key in seen:
                raise ValueError(f"{where}: dict key {key!r:.80} is not a str or int, or repeats")
            seen.add(key)
            self.node(pair[1], f"{where}[{key!r}]", depth + 1)

    def tensor(self, node, where):
        if set(node) != _TENSOR_KEYS:
            raise ValueError(f"{where}: a tensor node has keys {sorted(_TENSOR_KEYS)}, got {sorted(node)}")
        name = node["tensor"]
        if not isinstance(name, str) or name not in self.specs:
            raise ValueError(f"{where}: names tensor {name!r:.80}, which the file does not hold")
        if name in self.used:
            raise ValueError(f"{where}: tensor {name!r} is named twice")
        self.used.add(name)
        dtype, shape = self.specs[name]
        if _DTYPE_NAMES.get(node["dtype"]) != dtype or node["shape"] != list(shape):
            raise ValueError(f"{where}: tensor {name!r} is recorded as {node['dtype']} {node['shape']}, but the "
                             f"safetensors header says {dtype} {list(shape)}")
        device = node["device"]
        if not (isinstance(device, str) and (device in ("cpu", "cuda") or
                                             (device.startswith("cuda:") and device[5:].isdigit()))):
            raise ValueError(f"{where}: tensor device {device!r:.80} is not 'cpu' or 'cuda[:N]'")
        if not (isinstance(node["requires_grad"], bool) and isinstance(node["parameter"], bool)):
            raise ValueError(f"{where}: requires_grad and parameter must be true or false")
        if node["requires_grad"] and node["dtype"] not in ("float16", "float32", "float64"):
            raise ValueError(f"{where}: a {node['dtype']} tensor cannot require grad")


def check(structure, specs, root="obj"):
    """Validate `structure` against `specs` (tensor name -> (safetensors dtype, shape)); ValueError if bad.

    Every tensor the structure names must exist with that dtype and shape, and every tensor of the file must be
    named (an unnamed one means the file was altered)."""
    checker = _Checker(specs)
    checker.node(structure, root, 0)
    unnamed = sorted(set(specs) - checker.used)
    if unnamed:
        raise ValueError(f"tensor {unnamed[0]!r} of the file is not named by the structure ({len(unnamed)} such)")


def build(node, make_tensor):
    """The object `node` describes (already checked); `make_tensor(node)` gives each tensor."""
    if not isinstance(node, dict):
        return node
    if "tensor" in node:
        return make_tensor(node)
    (tag, body), = node.items()
    if tag == "float":
        return _NON_FINITE[body]
    if tag in ("dict", "odict"):
        return _CONTAINERS[tag]((key, build(value, make_tensor)) for key, value in body)
    return _CONTAINERS[tag](build(item, make_tensor) for item in body)


def tensor_nodes(node):
    """Every tensor node under `node` (to refuse tensors where only plain data belongs)."""
    if not isinstance(node, dict):
        return []
    if "tensor" in node:
        return [node]
    (tag, body), = node.items()
    if tag in ("dict", "odict"):
        return [t for _, value in body for t in tensor_nodes(value)]
    return [t for item in body for t in tensor_nodes(item)] if tag in ("list", "tuple") else []


def find_key(node, key):
    """The node stored under `key` of a dict node, or None when `node` is not a dict or lacks it."""
    if isinstance(node, dict) and len(node) == 1 and next(iter(node)) in ("dict", "odict"):
        for k, value in next(iter(node.values())):
            if k == key:
                return value
    return None

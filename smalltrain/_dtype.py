"""smalltrain's dtypes: thin named wrappers over NumPy dtypes, spelled and compared like torch's."""
import numpy as np


class dtype:
    """A tensor element type. `smalltrain.float32 == numpy.float32` holds, so arrays and dtypes mix freely."""

    __slots__ = ("name", "np", "is_floating_point", "is_signed", "itemsize")

    def __init__(self, name, np_dtype):
        self.name = name
        self.np = np.dtype(np_dtype)
        self.is_floating_point = self.np.kind == "f"
        self.is_signed = self.np.kind in "fi"
        self.itemsize = self.np.itemsize

    def __repr__(self):
        return f"smalltrain.{self.name}"

    def __eq__(self, other):
        if isinstance(other, dtype):
            return self.np == other.np
        try:
            return self.np == np.dtype(other)
        except TypeError:
            return NotImplemented

    def __hash__(self):
        return hash(self.np)


float32 = dtype("float32", np.float32)
float64 = dtype("float64", np.float64)
float16 = dtype("float16", np.float16)
int64 = dtype("int64", np.int64)
int32 = dtype("int32", np.int32)
int16 = dtype("int16", np.int16)
int8 = dtype("int8", np.int8)
uint8 = dtype("uint8", np.uint8)
bool_ = dtype("bool", np.bool_)
float = float32  # noqa: A001 - torch's aliases
double = float64
half = float16
long = int64
int = int32  # noqa: A001

_BY_NP = {d.np: d for d in (float32, float64, float16, int64, int32, int16, int8, uint8, bool_)}


def from_numpy_dtype(np_dtype):
    """The smalltrain dtype for a NumPy dtype; TypeError for element types smalltrain does not support."""
    try:
        return _BY_NP[np.dtype(np_dtype)]
    except KeyError:
        raise TypeError(f"unsupported element type {np.dtype(np_dtype)}; expected one of "
                        f"{', '.join(str(k) for k in _BY_NP)}") from None


def to_numpy_dtype(d):
    """Accept a smalltrain dtype, a NumPy dtype or a Python type and return the NumPy dtype."""
    if d is None:
        return None
    if isinstance(d, dtype):
        return d.np
    if d is builtins_float:  # torch reads Python's float as float64
        return np.dtype(np.float64)
    if d is builtins_int:
        return np.dtype(np.int64)
    if d is builtins_bool:
        return np.dtype(np.bool_)
    return from_numpy_dtype(d).np


builtins_float, builtins_int, builtins_bool = type(1.0), type(1), type(True)
_default_float = float32


def get_default_dtype():
    return _default_float


def set_default_dtype(d):
    global _default_float
    if not isinstance(d, dtype) or not d.is_floating_point:
        raise TypeError(f"set_default_dtype: expected a floating point dtype, got {d}")
    _default_float = d


# ---- type promotion, torch's rules ------------------------------------------------------------------------------
# Categories order bool < integer < floating. Across categories the higher one wins outright (int32 + float16 ->
# float16, unlike NumPy's float64); within one, NumPy's lattice agrees with torch's for the dtypes above.
_CATEGORY = {"b": 0, "u": 1, "i": 1, "f": 2}
_promoted = {}


def promote_types(a, b):
    """The smallest NumPy dtype both `a` and `b` (NumPy dtypes) convert to, as torch.promote_types decides."""
    key = (a, b)
    r = _promoted.get(key)
    if r is None:
        a, b = np.dtype(a), np.dtype(b)
        ca, cb = _CATEGORY[a.kind], _CATEGORY[b.kind]
        r = a if ca > cb else b if cb > ca else np.promote_types(a, b)
        _promoted[key] = r
    return r


def _combine(higher, lower):
    # torch's combine_categories: a lower-priority operand only matters when it is of a higher category
    if higher is None:
        return lower
    if lower is None or higher.kind == "f":
        return higher
    if higher.kind == "b" or lower.kind == "f":
        return promote_types(higher, lower)
    return higher


def result_type(*operands):
    """torch.result_type over Tensors, arrays and Python/NumPy scalars (None is skipped), as a NumPy dtype.

    Tensors with dims outrank 0-d tensors, which outrank Python scalars; a lower-ranked operand only counts when
    it is of a higher category (int64 tensor + 2.5 -> float32, float32 tensor + float64 0-d tensor -> float32).
    """
    dim = zero = wrapped = None
    for o in operands:
        if o is None:
            continue
        a = getattr(o, "array", o)
        if isinstance(a, (builtins_bool, np.bool_)):
            d, group = np.dtype(np.bool_), 2
        elif isinstance(a, (builtins_int, np.integer)):
            d, group = np.dtype(np.int64), 2
        elif isinstance(a, (builtins_float, np.floating)):
            d, group = _default_float.np, 2
        else:
            d, group = a.dtype, 0 if a.ndim else 1
        if group == 0:
            dim = d if dim is None else promote_types(dim, d)
        elif group == 1:
            zero = d if zero is None else promote_types(zero, d)
        else:
            wrapped = d if wrapped is None else promote_types(wrapped, d)
    return _combine(dim, _combine(zero, wrapped))

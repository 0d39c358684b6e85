"""Tensor: an n-d array (NumPy on CPU, CuPy on CUDA) plus what autograd needs: requires_grad, .grad, grad_fn.

The raw array is `tensor.array`; `tensor.data` is a detached Tensor over the same memory, as in torch.
Operators and methods are thin calls into smalltrain.ops, where every op and its gradient is written out.
"""
import math

import numpy as np

from . import _dtype
from .backend import CPU, as_device, device_of, hooks, to_device, to_host


class Size(tuple):
    """A shape, as torch.Size: a tuple of ints with a torch-like repr and numel()."""

    def __repr__(self):
        return f"smalltrain.Size({list(self)})"

    def numel(self):
        n = 1
        for s in self:
            n *= s
        return n


class Tensor:
    __slots__ = ("array", "grad", "requires_grad", "_ctx", "_out_idx", "_hooks", "_post_hooks", "_retain", "_view",
                 "_version", "_vc", "__weakref__")
    __array_ufunc__ = None  # make `ndarray + Tensor` defer to Tensor.__radd__

    def __init__(self, data=None, dtype=None, device=None, requires_grad=False):
        from .creation import _to_array
        if data is None:
            data = []
        if dtype is None and not hasattr(data, "dtype"):
            dtype = _dtype.get_default_dtype()  # like torch.Tensor: Python data becomes the default float
        self._init_leaf(_to_array(data, dtype, device), bool(requires_grad))

    def _init_leaf(self, array, requires_grad):
        """Give every slot its initial value: the one place a new Tensor (or subclass) is set up."""
        self.array = array
        self.grad = None
        self.requires_grad = requires_grad
        self._ctx = None
        self._out_idx = 0
        self._hooks = None
        self._post_hooks = None
        self._retain = False
        self._view = None   # (base, fn, base's _version when made) for a view of base's memory: ops/inplace.py
        self._version = None   # a base's count of recorded in-place writes, once a view of it exists
        self._vc = None   # the version counter of the memory, once an op has recorded it (autograd/versions.py)

    @classmethod
    def _wrap(cls, array, requires_grad=False):
        """A Tensor over an existing array without copying or validating (the ops' fast path)."""
        t = object.__new__(cls)
        if isinstance(array, np.generic):  # NumPy reductions return scalars; tensors always hold arrays
            array = np.asarray(array)
        t._init_leaf(array, requires_grad)
        return t

    # ---- attributes ------------------------------------------------------------------------------------------
    @property
    def shape(self):
        return Size(self.array.shape)

    def size(self, dim=None):
        if dim is None:
            return Size(self.array.shape)
        from .ops._util import normalize_dim
        return self.array.shape[normalize_dim("size", dim, self.array.ndim)]

    @property
    def dtype(self):
        return _dtype.from_numpy_dtype(self.array.dtype)

    @property
    def device(self):
        return CPU if type(self.array) is np.ndarray else device_of(self.array)

    @property
    def is_cuda(self):
        return type(self.array) is not np.ndarray

    @property
    def ndim(self):
        return self.array.ndim

    def dim(self):
        return self.array.ndim

    def numel(self):
        return int(self.array.size)

    nelement = numel

    def element_size(self):
        return self.array.itemsize

    def is_floating_point(self):
        return self.array.dtype.kind == "f"

    @property
    def grad_fn(self):
        return self._ctx

    @property
    def is_leaf(self):
        return self._ctx is None

    @property
    def data(self):
        return Tensor._wrap(self.array)

    @data.setter
    def data(self, value):
        if hooks.held is not None:   # an op held back or deferred reads the array it was called with
            hooks.flush()
        self.array = value.array if isinstance(value, Tensor) else value

    @property
    def T(self):
        return _shape.permute(self, *reversed(range(self.array.ndim)))

    @property
    def mT(self):
        return _shape.transpose(self, -2, -1)

    def is_contiguous(self):
        return bool(self.array.flags.c_contiguous)

    def stride(self, dim=None):
        st = tuple(s // self.array.itemsize for s in self.array.strides)
        return st if dim is None else st[dim]

    def data_ptr(self):
        a = self.array
        return a.ctypes.data if isinstance(a, np.ndarray) else a.data.ptr

    # ---- conversions -----------------------------------------------------------------------------------------
    def numpy(self, force=False):
        if self.requires_grad and not force:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() "
                               "instead.")
        if not isinstance(self.array, np.ndarray):
            if not force:
                raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the "
                                "tensor to host memory first.")
            return to_host(self.array)
        return self.array

    def __array__(self, dtype=None, copy=None):
        a = to_host(self.array)
        return a if dtype is None else a.astype(dtype)

    def item(self):
        if self.array.size != 1:
            raise RuntimeError(f"a Tensor with {self.array.size} elements cannot be converted to Scalar")
        return to_host(self.array).reshape(()).item()

    def tolist(self):
        a = to_host(self.array)
        return a.tolist()

    def to(self, *args, **kwargs):
        """to(dtype), to(device), to(device, dtype), to(other); copy=False returns self when nothing changes."""
        dtype = kwargs.pop("dtype", None)
        device = kwargs.pop("device", None)
        copy = kwargs.pop("copy", False)
        kwargs.pop("non_blocking", None)
        if kwargs:
            raise TypeError(f"to() got unexpected keyword arguments {sorted(kwargs)}")
        for a in args:
            if isinstance(a, Tensor):
                dtype, device = a.dtype, a.device
            elif isinstance(a, _dtype.dtype) or (isinstance(a, type) and a in (float, int, bool)):
                dtype = a
            else:
                device = a
        device = None if device is None else as_device(device)
        np_dtype = None if dtype is None else _dtype.to_numpy_dtype(dtype)
        if not copy and (device is None or device == self.device) and (np_dtype is None or
                                                                      np_dtype == self.array.dtype):
            return self
        return _Convert.apply(self, device, np_dtype, copy)

    def cuda(self, device=None):
        return self.to("cuda" if device is None else as_device(device))

    def pin_memory(self):
        """A copy of this CPU tensor in page-locked host memory (torch's name): copies from it to a GPU run at the
        link's full speed. Needs CUDA; RuntimeError for a tensor that is not on the CPU."""
        from .backend import pin
        if not isinstance(self.array, np.ndarray):
            raise RuntimeError(f"cannot pin '{self.device}' memory: only CPU tensors can be pinned")  # noqa: TRY004 - torch raises RuntimeError
        return Tensor._wrap(pin(np.ascontiguousarray(self.array)))

    def is_pinned(self):
        from .backend import is_pinned
        return is_pinned(self.array)

    def cpu(self):
        return self.to("cpu")

    def float(self):
        return self.to(_dtype.float32)

    def double(self):
        return self.to(_dtype.float64)

    def half(self):
        return self.to(_dtype.float16)

    def long(self):
        return self.to(_dtype.int64)

    def int(self):
        return self.to(_dtype.int32)

    def bool(self):
        return self.to(_dtype.bool_)

    def type(self, dtype=None):
        if dtype is None:
            return f"smalltrain.{self.dtype.name}"
        return self.to(dtype)

    def type_as(self, other):
        return self.to(other.dtype)

    def detach(self):
        t = Tensor._wrap(self.array)
        t._vc = _versions.counter(self)   # shared, as torch's: backward still sees writes through the detached one
        return t

    def detach_(self):
        self._ctx = None
        self.requires_grad = False
        return self

    def clone(self):
        return _Convert.apply(self, None, None, True)

    def contiguous(self):
        return _shape.contiguous(self)

    def requires_grad_(self, requires_grad=True):
        if self._ctx is not None and not requires_grad:
            raise RuntimeError("you can only change requires_grad flags of leaf variables.")
        if requires_grad and self.array.dtype.kind not in "fc":
            raise RuntimeError(f"only Tensors of floating point dtype can require gradients (got {self.dtype})")
        self.requires_grad = requires_grad
        return self

    # ---- autograd --------------------------------------------------------------------------------------------
    def _seed_grad(self, gradient, unit=False):
        """The seed gradient as an array; unit=True: ones not made yet (autograd.engine.UNIT_SEED) where no
        gradient is given."""
        if gradient is None:
            if self.array.size != 1:
                raise RuntimeError("grad can be implicitly created only for scalar outputs (got shape "
                                   f"{list(self.array.shape)}); pass backward(gradient=...)")
            if unit:
                from .autograd.engine import UNIT_SEED
                return UNIT_SEED
            from .backend import get_array_module
            return get_array_module(self.array).ones(self.array.shape, self.array.dtype)
        g = gradient.array if isinstance(gradient, Tensor) else np.asarray(gradient)
        if g.shape != self.array.shape:
            raise RuntimeError(f"backward: gradient has shape {list(g.shape)}, expected the tensor's shape "
                               f"{list(self.array.shape)}")
        return g

    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        """Accumulate d(self)/d(leaf) * gradient into every leaf's .grad (only into `inputs` when given)."""
        if not self.requires_grad:
            raise RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn")
        if create_graph:
            raise NotImplementedError("backward(create_graph=True): higher-order gradients are not supported")
        from .autograd.engine import run_backward
        if isinstance(inputs, Tensor):
            inputs = (inputs,)
        run_backward((self,), (self._seed_grad(gradient, unit=True),), bool(retain_graph), inputs)

    def register_hook(self, hook):
        """Call hook(grad) when this tensor's gradient is computed; a returned tensor replaces the gradient."""
        if not self.requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        if self._ctx is None:
            self._hooks = (self._hooks or []) + [hook]
            return _RemovableHandle(self, "_hooks", hook)
        node = self._ctx
        if node.out_hooks is None:
            node.out_hooks = {}
        node.out_hooks.setdefault(self._out_idx, []).append(hook)
        return _RemovableHandle(node.out_hooks, self._out_idx, hook)

    def register_post_accumulate_grad_hook(self, hook):
        """Call hook(tensor) after a gradient was accumulated into this leaf's .grad (DDP uses it)."""
        if self._ctx is not None:
            raise RuntimeError("post accumulate grad hooks cannot be registered on non-leaf tensors")
        self._post_hooks = (self._post_hooks or []) + [hook]
        return _RemovableHandle(self, "_post_hooks", hook)

    def retain_grad(self):
        if self._ctx is None or self._retain:
            return
        self._retain = True

        def keep(g, t=self):
            t.grad = g if t.grad is None else Tensor._wrap(t.grad.array + g.array)
        self.register_hook(keep)

    # ---- Python protocol -------------------------------------------------------------------------------------
    def __repr__(self):
        a = to_host(self.array)
        suffixes = []
        if not isinstance(self.array, np.ndarray):
            suffixes.append(f"device='{self.device}'")
        if a.size == 0:
            body = "[]"
            if a.ndim != 1:
                suffixes.append(f"size={tuple(a.shape)}")
            if a.dtype != _dtype.get_default_dtype().np:
                suffixes.append(f"dtype={self.dtype}")
        else:
            body = _tensor_str(a)
            if a.dtype not in (_dtype.get_default_dtype().np, np.int64, np.bool_):
                suffixes.append(f"dtype={self.dtype}")
        if self._ctx is not None:
            suffixes.append(f"grad_fn={self._ctx!r}")
        elif self.requires_grad:
            suffixes.append("requires_grad=True")
        out = "tensor(" + body
        last = len(out) - out.rfind("\n") + 1
        for suffix in suffixes:  # torch wraps a suffix that would pass 80 columns onto its own line
            if last + len(suffix) + 2 > 80:
                out += ",\n       " + suffix
                last = 7 + len(suffix)
            else:
                out += ", " + suffix
                last += len(suffix) + 2
        return out + ")"

    def __format__(self, spec):
        if self.array.ndim == 0:  # f"{loss:.4f}" works on 0-d tensors, as in torch
            return format(self.item(), spec)
        return object.__format__(repr(self), spec)

    def __deepcopy__(self, memo):
        if self._ctx is not None:
            raise RuntimeError("Only Tensors created explicitly by the user (graph leaves) support the deepcopy "
                               "protocol at the moment.")
        import copy
        new = object.__new__(type(self))
        memo[id(self)] = new
        for name in Tensor.__slots__[:-1]:
            object.__setattr__(new, name, getattr(self, name))
        new.array = self.array.copy()
        new.grad = copy.deepcopy(self.grad, memo)
        new._hooks = new._post_hooks = new._view = new._version = new._vc = None
        if hasattr(self, "__dict__"):  # subclasses (nn.Parameter) may carry attributes of their own
            new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return new

    def __len__(self):
        if self.array.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.array.shape[0]

    def __iter__(self):
        if self.array.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return iter(_shape.unbind(self, 0))

    def __bool__(self):
        if self.array.size != 1:
            raise RuntimeError(f"Boolean value of Tensor with {self.array.size} values is ambiguous")
        return bool(self.item())

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __index__(self):
        if self.array.dtype.kind not in "iu" or self.array.size != 1:
            raise TypeError("only integer tensors of a single element can be converted to an index")
        return int(self.item())

    __hash__ = object.__hash__

    def __getitem__(self, key):
        return _index.getitem(self, key)

    def __setitem__(self, key, value):
        _index.setitem(self, key, value)

    def __getstate__(self):
        raise TypeError("smalltrain tensors are not pickled; save them with smalltrain.save (safetensors)")


def _tensor_str(a):
    """torch's layout for the values: 4 decimals, scientific when magnitudes span > 1e3, `1.` for whole floats."""
    summarize = a.size > 1000
    fmt = _formatter(a)
    return _nd_str(a, 7, summarize, fmt)


def _formatter(a):
    if a.dtype.kind != "f":
        width = max(len(str(v)) for v in (a.min().item(), a.max().item())) if a.dtype.kind != "b" else \
            (5 if not a.all() else 4)
        return lambda v: f"{v}".rjust(width)
    vals = a[np.isfinite(a) & (a != 0)].astype(np.float64)
    if vals.size == 0:
        return lambda v: (f"{v:.0f}" + ("" if math.isinf(v) or math.isnan(v) else "."))
    mags = np.abs(vals)
    lo, hi = mags.min(), mags.max()
    whole = bool(np.all(vals == np.ceil(vals)))
    sci = hi / lo > 1000.0 or hi > 1.0e8 or lo < 1.0e-4
    if sci:
        width = max(len(f"{v:.4e}") for v in (vals.min(), vals.max()))
        return lambda v: f"{v:{width}.4e}"
    if whole:
        width = max(len(f"{v:.0f}") + 1 for v in (vals.min(), vals.max()))
        return lambda v: (f"{v:.0f}" + ("" if math.isinf(v) or math.isnan(v) else ".")).rjust(width)
    width = max(len(f"{v:.4f}") for v in (vals.min(), vals.max()))
    return lambda v: f"{v:.4f}".rjust(width)


def _nd_str(a, indent, summarize, fmt):
    if a.ndim == 0:
        return fmt(a.item())
    n = a.shape[0]
    rows = range(n) if not (summarize and n > 6) else [0, 1, 2, None, n - 3, n - 2, n - 1]
    if a.ndim == 1:
        items = [" ..." if i is None else fmt(a[i].item()) for i in rows]
        per_line = max(1, (80 - indent) // (len(fmt(a[0].item())) + 2))
        lines = [", ".join(items[i:i + per_line]) for i in range(0, len(items), per_line)]
        return "[" + (",\n" + " " * (indent + 1)).join(lines) + "]"
    parts = ["..." if i is None else _nd_str(a[i], indent + 1, summarize, fmt) for i in rows]
    return "[" + ("," + "\n" * (a.ndim - 1) + " " * (indent + 1)).join(parts) + "]"


class _RemovableHandle:
    def __init__(self, owner, key, hook):
        self.owner, self.key, self.hook = owner, key, hook

    def remove(self):
        if isinstance(self.owner, dict):
            hooks = self.owner.get(self.key, [])
            if self.hook in hooks:
                hooks.remove(self.hook)
            return
        hooks = getattr(self.owner, self.key) or []
        setattr(self.owner, self.key, [h for h in hooks if h is not self.hook] or None)


def _binary(fn, swap=False):
    if swap:
        def method(self, other):
            return fn(other, self)   # the ops take Python scalars on either side
    else:
        def method(self, other):
            return fn(self, other)
    return method


def _rmatmul(self, other):
    return _mm.matmul(other if isinstance(other, Tensor) else Tensor._wrap(_util.xp_of(self.array).asarray(other)),
                      self)


def _install_methods():
    """Attach operators and methods; each one is a call into smalltrain.ops."""
    T = Tensor
    e, r, s, i, m = _ew, _red, _shape, _index, _mm
    for name, fn in {"__add__": e.add, "__sub__": e.sub, "__mul__": e.mul, "__truediv__": e.div,
                     "__pow__": e.pow, "__matmul__": m.matmul, "__eq__": e.eq, "__ne__": e.ne, "__lt__": e.lt,
                     "__le__": e.le, "__gt__": e.gt, "__ge__": e.ge, "__and__": e.bitwise_and,
                     "__or__": e.bitwise_or, "__xor__": e.bitwise_xor}.items():
        setattr(T, name, _binary(fn))
    for name, fn in {"__radd__": e.add, "__rsub__": e.sub, "__rmul__": e.mul, "__rtruediv__": e.div,
                     "__rpow__": e.pow, "__rand__": e.bitwise_and, "__ror__": e.bitwise_or,
                     "__rxor__": e.bitwise_xor}.items():
        setattr(T, name, _binary(fn, swap=True))
    T.__rmatmul__ = _rmatmul
    T.__neg__ = e.neg
    T.__abs__ = e.abs
    T.__invert__ = e.bitwise_not
    T.__floordiv__ = lambda a, b: e.div(a, b, rounding_mode="floor")
    T.__rfloordiv__ = lambda a, b: e.div(b, a, rounding_mode="floor")
    T.__mod__ = lambda a, b: T._wrap(_mod(a, b))
    T.__rmod__ = lambda a, b: T._wrap(_mod(b, a))
    for name in ("add", "sub", "mul", "div", "pow", "maximum", "minimum", "exp", "log", "log1p", "sqrt",
                 "rsqrt", "abs", "sin", "cos", "tanh", "cosh", "sinh", "sigmoid", "clamp", "clip", "neg",
                 "sign", "floor", "ceil", "round", "isnan", "isinf", "isfinite", "logical_not", "eq", "ne", "lt",
                 "le", "gt", "ge", "add_", "sub_", "mul_", "div_", "addcmul_", "addcdiv_", "clamp_", "clip_", "copy_",
                 "fill_", "zero_", "allclose", "equal", "logical_and", "logical_or", "logical_xor",
                 "bitwise_not"):
        setattr(T, name, getattr(e, name))
    T.where = lambda a, condition, other: e.where(condition, a, other)
    T.negative, T.multiply, T.divide, T.subtract = e.neg, e.mul, e.div, e.sub
    T.masked_fill = i.masked_fill
    T.gather, T.index_select, T.nonzero = i.gather, i.index_select, i.nonzero
    for name in ("sum", "mean", "var", "std", "max", "min", "amax", "amin", "logsumexp", "argmax", "argmin",
                 "prod", "all", "any", "count_nonzero"):
        setattr(T, name, getattr(r, name))
    for name in ("view", "reshape", "flatten", "unflatten", "permute", "transpose", "t", "squeeze", "unsqueeze",
                 "expand", "expand_as", "repeat", "split", "chunk", "unbind", "flip"):
        setattr(T, name, getattr(s, name))
    for name in ("sort", "argsort", "topk", "unique"):
        setattr(T, name, getattr(_sort, name))
    T.cumsum, T.cumprod = _scan.cumsum, _scan.cumprod
    T.view_as = lambda a, other: s.view(a, *other.array.shape)
    T.reshape_as = T.view_as
    T.swapaxes = T.swapdims = s.transpose
    T.matmul, T.mm, T.bmm = m.matmul, m.mm, m.bmm
    T.relu = lambda a: _act().relu(a)
    T.softmax = lambda a, dim: _act().softmax(a, dim)
    T.log_softmax = lambda a, dim: _act().log_softmax(a, dim)

    def inplace_op(fn, name):
        def method(self, *args, **kwargs):
            if _inplace.recording(self, *args):
                return _inplace.recorded(self, name, lambda x: fn(x, *args, **kwargs))
            return _inplace.write(self, fn(self.detach(), *args, **kwargs).array)
        method.__name__ = name
        return method
    for name in ("exp", "log", "sqrt", "abs", "neg", "sigmoid", "tanh", "pow"):
        setattr(T, name + "_", inplace_op(getattr(e, name), name + "_"))
    T.relu_ = inplace_op(lambda a: _act().relu(a), "relu_")
    T.uniform_ = lambda a, low=0.0, high=1.0, *, generator=None: _init().uniform_(a, low, high, generator=generator)
    T.normal_ = lambda a, mean=0.0, std=1.0, *, generator=None: _init().normal_(a, mean, std, generator=generator)

    # `x += y` is x.add_(y), as in torch: in place, through views, recorded while grad mode is on
    T.__iadd__, T.__isub__, T.__imul__, T.__itruediv__ = e.add_, e.sub_, e.mul_, e.div_


def _mod(a, b):
    x, y, dt = _util.promote("remainder", a, b)
    if dt.kind in "iu":
        _ew.check_int_divisor(y)
    return _util.xp_of(x if hasattr(x, "dtype") else y).mod(x, y)  # Python's sign convention, as torch's


def _act():
    from .ops import activation
    return activation


def _init():
    from .nn import init
    return init


from .autograd.function import Function  # noqa: E402
from .autograd import versions as _versions  # noqa: E402


class _Convert(Function):
    """dtype and device conversion (and clone): the gradient converts back."""

    @staticmethod
    def forward(ctx, x, device, np_dtype, copy):
        a = x.array
        ctx.src_device, ctx.src_dtype = x.device, a.dtype
        out = a
        if device is not None and device != ctx.src_device:
            out = to_device(out, device)
            copy = False
        if np_dtype is not None and out.dtype != np_dtype:
            out = out.astype(np_dtype)
            copy = False
        return out.copy() if copy else out

    @staticmethod
    def backward(ctx, dout):
        g = dout.array
        if g.dtype != ctx.src_dtype:
            g = g.astype(ctx.src_dtype)
        if dout.device != ctx.src_device:
            g = to_device(g, ctx.src_device)
        return g, None, None, None


from .ops import _util, elementwise as _ew, index as _index, matmul as _mm, reduce as _red, shape as _shape  # noqa
from .ops import inplace as _inplace, scan as _scan, sort as _sort  # noqa: E402
_install_methods()

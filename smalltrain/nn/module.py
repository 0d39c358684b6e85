"""`Module`: the base class of every layer and model, with torch.nn.Module's contract: registration through
attribute assignment, parameter/buffer/module iteration, train/eval, device and dtype conversion in place,
state_dict / load_state_dict with torch's keys and error messages, forward hooks and torch's repr."""
import copy
import itertools
import warnings
from collections import OrderedDict

import numpy as np

from .. import _dtype
from ..backend import Device, as_device, to_device
from ..autograd import pending
from ..tensor import Tensor
from .parameter import Buffer, Parameter
from .state_dict import StateDictMixin


def typename(obj):
    """torch.typename: a Tensor's type string, or an object's qualified name (builtins unqualified)."""
    if isinstance(obj, Tensor):
        return obj.type()
    module = getattr(obj, "__module__", "") or ""
    if hasattr(obj, "__qualname__"):
        qualname = obj.__qualname__
    elif hasattr(obj, "__name__"):
        qualname = obj.__name__
    else:
        module, qualname = obj.__class__.__module__ or "", obj.__class__.__qualname__
    return qualname if module in ("", "builtins") else f"{module}.{qualname}"


def _addindent(s_, num_spaces):
    lines = s_.split("\n")
    if len(lines) == 1:
        return s_
    first = lines.pop(0)
    return first + "\n" + "\n".join(num_spaces * " " + line for line in lines)


class RemovableHandle:
    """Returned by register_*_hook: `handle.remove()` (or leaving a `with handle:` block) unregisters the hook."""

    _next_id = 0

    def __init__(self, hooks_dict, extra_dicts=()):
        self.hooks_dict = hooks_dict
        self.extra_dicts = extra_dicts
        self.id = RemovableHandle._next_id
        RemovableHandle._next_id += 1

    def remove(self):
        for d in (self.hooks_dict, *self.extra_dicts):
            d.pop(self.id, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


class Module(StateDictMixin):
    """Base class for all neural network modules; subclasses assign Parameters, buffers and Modules as
    attributes in __init__ (after calling super().__init__()) and define forward()."""

    _version = 1
    training: bool
    call_super_init = False

    def __init__(self, *args, **kwargs):
        if kwargs:
            raise TypeError(f"{type(self).__name__}.__init__() got an unexpected keyword argument "
                            f"'{next(iter(kwargs))}'")
        if args:
            raise TypeError(f"{type(self).__name__}.__init__() takes 1 positional argument but {len(args) + 1} "
                            "were given")
        d = self.__dict__  # plain dict writes: __setattr__'s registration logic is not needed here
        d["training"] = True
        d["_parameters"] = {}
        d["_buffers"] = {}
        d["_non_persistent_buffers_set"] = set()
        d["_modules"] = {}
        d["_forward_pre_hooks"] = OrderedDict()
        d["_forward_pre_hooks_with_kwargs"] = {}
        d["_forward_hooks"] = OrderedDict()
        d["_forward_hooks_with_kwargs"] = {}
        d["_forward_hooks_always_called"] = {}

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f'Module [{type(self).__name__}] is missing the required "forward" function')

    # ---- calling, hooks --------------------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        if self._forward_pre_hooks or self._forward_hooks:
            return self._call_with_hooks(args, kwargs)
        try:
            return self.forward(*args, **kwargs)
        except AttributeError:
            _check_not_numpy(self, args)
            raise

    def _call_with_hooks(self, args, kwargs):
        for hook_id, hook in list(self._forward_pre_hooks.items()):
            if hook_id in self._forward_pre_hooks_with_kwargs:
                r = hook(self, args, kwargs)
                if r is not None:
                    if not (isinstance(r, tuple) and len(r) == 2):
                        raise RuntimeError("forward pre-hook must return None or a tuple of (new_args, new_kwargs),"
                                           f" but got {r}.")
                    args, kwargs = r
            else:
                r = hook(self, args)
                if r is not None:
                    args = r if isinstance(r, tuple) else (r,)
        called, result = set(), None
        # a hooked module takes the plain path: its inputs and output are not fused with the ops beside it
        # (autograd/pending.py), so its hooks see what they would see unfused
        args = tuple(pending.resolve(a) for a in args)
        try:
            result = pending.resolve(self.forward(*args, **kwargs))
            for hook_id, hook in list(self._forward_hooks.items()):
                called.add(hook_id)
                result = self._run_forward_hook(hook_id, hook, args, kwargs, result)
        except Exception:
            for hook_id, hook in list(self._forward_hooks.items()):
                if hook_id in self._forward_hooks_always_called and hook_id not in called:
                    try:
                        self._run_forward_hook(hook_id, hook, args, kwargs, result)
                    except Exception as e:  # noqa: BLE001 - the forward's own error is the one to report
                        warnings.warn("module forward hook with ``always_call=True`` raised an exception that was "
                                      f"silenced as another error was raised in forward: {e}", stacklevel=2)
            raise
        return result

    def _run_forward_hook(self, hook_id, hook, args, kwargs, result):
        if hook_id in self._forward_hooks_with_kwargs:
            r = hook(self, args, kwargs, result)
        else:
            r = hook(self, args, result)
        return result if r is None else r

    def register_forward_pre_hook(self, hook, *, prepend=False, with_kwargs=False):
        """hook(module, args) -> None or new args (with_kwargs: hook(module, args, kwargs) -> None or (args,
        kwargs)), called before forward."""
        handle = RemovableHandle(self._forward_pre_hooks, (self._forward_pre_hooks_with_kwargs,))
        self._forward_pre_hooks[handle.id] = hook
        if with_kwargs:
            self._forward_pre_hooks_with_kwargs[handle.id] = True
        if prepend:
            self._forward_pre_hooks.move_to_end(handle.id, last=False)
        return handle

    def register_forward_hook(self, hook, *, prepend=False, with_kwargs=False, always_call=False):
        """hook(module, args, output) -> None or a new output, called after forward (always_call: also when
        forward raised)."""
        handle = RemovableHandle(self._forward_hooks, (self._forward_hooks_with_kwargs,
                                                       self._forward_hooks_always_called))
        self._forward_hooks[handle.id] = hook
        if with_kwargs:
            self._forward_hooks_with_kwargs[handle.id] = True
        if always_call:
            self._forward_hooks_always_called[handle.id] = True
        if prepend:
            self._forward_hooks.move_to_end(handle.id, last=False)
        return handle

    # ---- registration ----------------------------------------------------------------------------------------
    def _check_name(self, kind, name, own):
        if not isinstance(name, str):
            raise TypeError(f"{kind} name should be a string. Got {typename(name)}")
        if "." in name:
            raise KeyError(f"{kind} name can't contain \".\"" + (f", got: {name}" if kind == "module" else ""))
        if name == "":
            raise KeyError(f"{kind} name can't be empty string \"\"")
        if hasattr(self, name) and name not in own:
            raise KeyError(f"attribute '{name}' already exists")

    def register_parameter(self, name, param):
        if "_parameters" not in self.__dict__:
            raise AttributeError("cannot assign parameter before Module.__init__() call")
        self._check_name("parameter", name, self._parameters)
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"cannot assign '{typename(param)}' object to parameter '{name}' (smalltrain.nn."
                            "Parameter or None required)")
        if param is not None and param.grad_fn is not None:
            raise ValueError(f"Cannot assign non-leaf Tensor to parameter '{name}'. Model parameters must be "
                             f"created explicitly. To express '{name}' as a function of another Tensor, compute "
                             "the value in the forward() method.")
        self._parameters[name] = param

    def register_buffer(self, name, tensor, persistent=True):
        if "_buffers" not in self.__dict__:
            raise AttributeError("cannot assign buffer before Module.__init__() call")
        self._check_name("buffer", name, self._buffers)
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"cannot assign '{typename(tensor)}' object to buffer '{name}' (smalltrain Tensor or "
                            "None required)")
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers_set.discard(name)
        else:
            self._non_persistent_buffers_set.add(name)

    def add_module(self, name, module):
        if not isinstance(module, Module) and module is not None:
            raise TypeError(f"{typename(module)} is not a Module subclass")
        if not isinstance(name, str):
            raise TypeError(f"module name should be a string. Got {typename(name)}")
        if hasattr(self, name) and name not in self._modules:
            raise KeyError(f"attribute '{name}' already exists")
        self._check_name("module", name, self._modules)
        self._modules[name] = module

    register_module = add_module

    def __getattr__(self, name):
        d = self.__dict__
        for key in ("_parameters", "_buffers", "_modules"):
            own = d.get(key)
            if own is not None and name in own:
                return own[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __setattr__(self, name, value):
        d = self.__dict__
        params = d.get("_parameters")
        if isinstance(value, Parameter):
            if params is None:
                raise AttributeError("cannot assign parameters before Module.__init__() call")
            self._remove_from(name, d, self._buffers, self._modules)
            self.register_parameter(name, value)
        elif params is not None and name in params:
            if value is not None:
                raise TypeError(f"cannot assign '{typename(value)}' as parameter '{name}' (smalltrain.nn.Parameter "
                                "or None expected)")
            self.register_parameter(name, value)
        elif isinstance(value, Module):
            if d.get("_modules") is None:
                raise AttributeError("cannot assign module before Module.__init__() call")
            self._remove_from(name, d, self._parameters, self._buffers)
            self._modules[name] = value
        elif name in d.get("_modules", ()):
            if value is not None:
                raise TypeError(f"cannot assign '{typename(value)}' as child module '{name}' (smalltrain.nn.Module "
                                "or None expected)")
            self._modules[name] = value
        elif isinstance(value, Buffer) or name in d.get("_buffers", ()):
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"cannot assign '{typename(value)}' as buffer '{name}' (smalltrain.nn.Buffer, "
                                "smalltrain.Tensor or None expected)")
            if d.get("_buffers") is None:
                raise AttributeError("cannot assign buffer before Module.__init__() call")
            persistent = value.persistent if isinstance(value, Buffer) else \
                name not in self._non_persistent_buffers_set
            self._remove_from(name, d, self._parameters, self._modules)
            self.register_buffer(name, value, persistent)
        else:
            object.__setattr__(self, name, value)

    def _remove_from(self, name, *dicts):
        for dd in dicts:
            dd.pop(name, None)
        self._non_persistent_buffers_set.discard(name)

    def __delattr__(self, name):
        if name in self._parameters:
            del self._parameters[name]
        elif name in self._buffers:
            del self._buffers[name]
            self._non_persistent_buffers_set.discard(name)
        elif name in self._modules:
            del self._modules[name]
        else:
            object.__delattr__(self, name)

    def __dir__(self):
        keys = dir(self.__class__) + list(self.__dict__) + list(self._parameters) + list(self._modules) + \
            list(self._buffers)
        return sorted(k for k in keys if not k[0].isdigit())

    def __deepcopy__(self, memo):
        # Tensors refuse pickling, which deepcopy falls back to; copy registered ones here first
        for t in itertools.chain(self.parameters(), self.buffers()):
            if id(t) not in memo:
                memo[id(t)] = copy.deepcopy(t, memo) if isinstance(t, (Parameter, Buffer)) else \
                    Tensor._wrap(t.array.copy())
        new = object.__new__(type(self))
        memo[id(self)] = new
        new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return new

    # ---- iteration -------------------------------------------------------------------------------------------
    def _named_members(self, get_members, prefix="", recurse=True, remove_duplicate=True):
        seen = set()
        modules = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse else \
            [(prefix, self)]
        for module_prefix, module in modules:
            for k, v in get_members(module):
                if v is None or id(v) in seen:
                    continue
                if remove_duplicate:
                    seen.add(id(v))
                yield module_prefix + ("." if module_prefix else "") + k, v

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        return self._named_members(lambda m: m._parameters.items(), prefix, recurse, remove_duplicate)

    def parameters(self, recurse=True):
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix="", recurse=True, remove_duplicate=True):
        return self._named_members(lambda m: m._buffers.items(), prefix, recurse, remove_duplicate)

    def buffers(self, recurse=True):
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def named_children(self):
        seen = set()
        for name, module in self._modules.items():
            if module is not None and id(module) not in seen:
                seen.add(id(module))
                yield name, module

    def children(self):
        for _, m in self.named_children():
            yield m

    def named_modules(self, memo=None, prefix="", remove_duplicate=True):
        if memo is None:
            memo = set()
        if self in memo:
            return
        if remove_duplicate:
            memo.add(self)
        yield prefix, self
        for name, module in self._modules.items():
            if module is not None:
                yield from module.named_modules(memo, prefix + ("." if prefix else "") + name, remove_duplicate)

    def modules(self):
        for _, m in self.named_modules():
            yield m

    def get_submodule(self, target):
        """The submodule at dotted path `target` ("" is self); AttributeError naming the missing part."""
        mod = self
        for item in target.split(".") if target else ():
            if not hasattr(mod, item):
                raise AttributeError(mod._get_name() + " has no attribute `" + item + "`")
            mod = getattr(mod, item)
            if not isinstance(mod, Module):
                raise AttributeError("`" + item + "` is not an nn.Module")  # noqa: TRY004 - torch's type
        return mod

    def get_parameter(self, target):
        module_path, _, name = target.rpartition(".")
        mod = self.get_submodule(module_path)
        if not hasattr(mod, name):
            raise AttributeError(mod._get_name() + " has no attribute `" + name + "`")
        p = getattr(mod, name)
        if not isinstance(p, Parameter):
            raise AttributeError("`" + name + "` is not an nn.Parameter")  # noqa: TRY004 - torch's type
        return p

    # ---- modes and gradients ---------------------------------------------------------------------------------
    def train(self, mode=True):
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")  # noqa: TRY004 - torch's type
        self.training = mode
        for m in self.children():
            m.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def requires_grad_(self, requires_grad=True):
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none=True):
        """Drop every parameter's .grad (set_to_none=False: zero it in place, keeping the array)."""
        for p in self.parameters():
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad._ctx = None
                    p.grad.requires_grad = False
                    p.grad.array.fill(0)

    def apply(self, fn):
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    # ---- conversion (in place: whoever holds a Parameter, e.g. an optimizer, keeps seeing the new array) ----
    def _apply(self, fn):
        """Replace the array of every parameter, gradient and buffer `a` by fn(a), keeping the Tensor objects."""
        done = set()
        for m in self.modules():
            for t in itertools.chain(m._parameters.values(), m._buffers.values()):
                if t is None or id(t) in done:
                    continue
                done.add(id(t))
                t.array = fn(t.array)
                if t.grad is not None:
                    t.grad.array = fn(t.grad.array)
        return self

    def to(self, *args, **kwargs):
        """to(device), to(dtype), to(device, dtype), to(tensor): only floating point tensors change dtype."""
        device, dtype = _parse_to(args, kwargs)
        np_dtype = None if dtype is None else _dtype.to_numpy_dtype(dtype)
        if np_dtype is not None and np_dtype.kind not in "fc":
            raise TypeError(f"nn.Module.to only accepts floating point or complex dtypes, but got desired "
                            f"dtype={_dtype.from_numpy_dtype(np_dtype)}")

        def convert(a):
            if device is not None:
                a = to_device(a, device)
            if np_dtype is not None and a.dtype.kind in "fc" and a.dtype != np_dtype:
                a = a.astype(np_dtype)
            return a
        return self._apply(convert)

    def cuda(self, device=None):
        return self.to(Device("cuda") if device is None else as_device(device))

    def cpu(self):
        return self.to("cpu")

    def _cast_floats(self, np_dtype):
        return self._apply(lambda a: a.astype(np_dtype) if a.dtype.kind == "f" and a.dtype != np_dtype else a)

    def float(self):
        return self._cast_floats(np.dtype(np.float32))

    def double(self):
        return self._cast_floats(np.dtype(np.float64))

    def half(self):
        return self._cast_floats(np.dtype(np.float16))

    def type(self, dst_type):
        """Cast every parameter and buffer (integer ones too) to dst_type."""
        np_dtype = _dtype.to_numpy_dtype(dst_type)
        return self._apply(lambda a: a if a.dtype == np_dtype else a.astype(np_dtype))

    # ---- repr ------------------------------------------------------------------------------------------------
    def _get_name(self):
        return type(self).__name__

    def extra_repr(self):
        return ""

    def __repr__(self):
        extra = self.extra_repr()
        extra_lines = extra.split("\n") if extra else []
        child_lines = ["(" + key + "): " + _addindent(repr(m), 2) for key, m in self._modules.items()]
        lines = extra_lines + child_lines
        s = self._get_name() + "("
        if lines:
            if len(extra_lines) == 1 and not child_lines:
                s += extra_lines[0]
            else:
                s += "\n  " + "\n  ".join(lines) + "\n"
        return s + ")"


def _parse_to(args, kwargs):
    """(device, dtype) from Module.to's forms; non_blocking and memory_format are accepted and ignored."""
    device, dtype = kwargs.pop("device", None), kwargs.pop("dtype", None)
    kwargs.pop("non_blocking", None)
    kwargs.pop("memory_format", None)
    if kwargs:
        raise TypeError(f"to() got an unexpected keyword argument '{next(iter(kwargs))}'")
    for a in args:
        if isinstance(a, Tensor):
            device, dtype = a.device, a.dtype
        elif isinstance(a, (_dtype.dtype, np.dtype)) or (isinstance(a, type) and issubclass(a, np.generic)):
            dtype = a
        elif isinstance(a, bool):
            continue  # non_blocking
        elif isinstance(a, (str, int, Device)):
            device = a
        else:
            raise TypeError(f"to() received an invalid combination of arguments: {typename(a)}")
    return (None if device is None else as_device(device)), dtype


def _check_not_numpy(module, args):
    """A NumPy array where a Tensor belongs fails deep in forward with an AttributeError; torch raises TypeError."""
    for i, a in enumerate(args):
        if type(a).__module__ == "numpy":
            raise TypeError(f"{type(module).__name__}.forward(): argument {i} must be Tensor, not "
                            f"numpy.{type(a).__name__} (wrap it with smalltrain.from_numpy)") from None

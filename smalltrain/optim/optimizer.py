"""Optimizer, the base of every optimizer (param groups, per-parameter state, state_dict), as torch.optim's.
Subclasses update raw parameter arrays in place with xp ufuncs in the operation order of torch's single-tensor
(foreach=False) code, so trajectories follow torch's to rounding (torch's CPU kernels fuse multiply-adds)."""
import copy
import warnings
from collections import defaultdict
from itertools import chain

import numpy as np

from .. import _dtype
from ..tensor import Tensor
from .hooks import (OptimizerHooks, register_optimizer_step_post_hook,  # noqa: F401 (torch.optim.optimizer's)
                    register_optimizer_step_pre_hook)


class _RequiredParameter:
    """A default that a parameter group must override (torch.optim.optimizer.required)."""

    def __repr__(self):
        return "<required parameter>"


required = _RequiredParameter()


def _typename(obj):
    if isinstance(obj, Tensor):
        return "smalltrain.Tensor"
    module, name = type(obj).__module__, type(obj).__qualname__
    return name if module in (None, "builtins") else f"{module}.{name}"


def _scalar_np_dtype():
    # torch keeps `step` in float64 only when the default dtype is float64
    return np.float64 if _dtype.get_default_dtype() == _dtype.float64 else np.float32


def _step_tensor(value=0.0):
    """The per-parameter step counter: a 0-d float CPU tensor, as torch >= 1.12 (without capturable/fused)."""
    return host_scalar(value, _scalar_np_dtype())


def check_hyper(*checks):
    """Each check is (what, value, ok), in the order torch's constructor tests them: the first one not ok raises
    torch's ValueError(f"Invalid {what}: {value}")."""
    for what, value, ok in checks:
        if not ok:
            raise ValueError(f"Invalid {what}: {value}")


def adam_checks(lr, eps, betas, weight_decay):
    """The checks torch's Adam family (Adam, AdamW, Adamax, NAdam, RAdam) runs first, in its order, for check_hyper
    (an optimizer's own checks follow them)."""
    return (("learning rate", lr, 0.0 <= lr), ("epsilon value", eps, 0.0 <= eps),
            ("beta parameter at index 0", betas[0], 0.0 <= betas[0] < 1.0),
            ("beta parameter at index 1", betas[1], 0.0 <= betas[1] < 1.0),
            ("weight_decay value", weight_decay, 0.0 <= weight_decay))


def switches(name, **given):
    """torch's implementation switches (foreach, fused, capturable, differentiable) as given, for the defaults:
    accepted so that scripts run unchanged, and kept in the groups as torch keeps them. They pick among torch's
    implementations of one update; smalltrain has one per device (the CUDA one fused and capturable already), so
    they change nothing, except differentiable=True, autograd through the step, which smalltrain does not do."""
    if given.get("differentiable"):
        raise NotImplementedError(f"{name}: differentiable=True (autograd through the optimizer step) is not "
                                  "supported by smalltrain")
    if given.get("fused") and given.get("foreach"):
        raise RuntimeError("`fused` and `foreach` cannot be `True` together.")
    return given


def decayed_grad(xp, param, grad, weight_decay, maximize):
    """torch's `grad = -grad if maximize`, then `grad = grad.add(param, alpha=weight_decay)` (L2 decay); a new array
    whenever it differs from `grad`, which is the parameter's own gradient and must not change."""
    if maximize:
        grad = xp.negative(grad)
    if weight_decay != 0:
        grad = xp.add(grad, xp.multiply(param, weight_decay))
    return grad


def lerp_(xp, start, end, weight, tmp):
    """start.lerp_(end, weight) with torch's two branches (the small-weight form is exact at weight 0)."""
    w = start.dtype.type(weight)  # torch rounds the weight to the tensor's type before both branches
    xp.subtract(end, start, out=tmp)
    if abs(w) < 0.5:
        xp.add(start, xp.multiply(tmp, w, out=tmp), out=start)
    else:
        xp.subtract(end, xp.multiply(tmp, start.dtype.type(1) - w, out=tmp), out=start)


def ema_square_(xp, avg, x, decay, tmp):
    """avg.mul_(decay).addcmul_(x, x, value=1 - decay): addcmul computes (value * x) * x."""
    xp.multiply(avg, decay, out=avg)
    xp.multiply(x, 1 - decay, out=tmp)
    xp.add(avg, xp.multiply(tmp, x, out=tmp), out=avg)


def _copy_value(value):
    """A deep copy that also copies Tensors (they refuse to be pickled, so copy.deepcopy cannot)."""
    if isinstance(value, Tensor):
        return Tensor._wrap(value.array.copy())
    if isinstance(value, dict):
        return {k: _copy_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_copy_value(v) for v in value)
    return copy.deepcopy(value)


class Optimizer(OptimizerHooks):
    """Base class: `params` is an iterable of Tensors or of dicts (parameter groups with their own options)."""

    # per-parameter state kept as 0-d CPU tensors, read by the host at every step (torch keeps them on the CPU
    # without capturable/fused); a subclass with more such scalars names them all
    _host_scalars = ("step",)
    # state arrays not shaped like their parameter (LBFGS keeps flat vectors under the first parameter)
    _flat_state = ()

    def __init__(self, params, defaults):
        self.defaults = defaults
        self._init_hooks()
        if isinstance(params, Tensor):
            raise TypeError("params argument given to the optimizer should be an iterable of Tensors or dicts, "
                            "but got " + _typename(params))
        self.state = defaultdict(dict)
        self.param_groups = []
        param_groups = list(params)
        if len(param_groups) == 0:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(param_groups[0], dict):
            param_groups = [{"params": param_groups}]
        for group in param_groups:
            self.add_param_group(group)

    def __repr__(self):
        s = self.__class__.__name__ + " ("
        for i, group in enumerate(self.param_groups):
            s += f"\nParameter Group {i}\n"
            for key in sorted(group.keys()):
                if key != "params":
                    s += f"    {key}: {group[key]}\n"
        return s + ")"

    def step(self, closure=None):
        raise NotImplementedError

    def _closure_loss(self, closure):
        if closure is None:
            return None
        from ..autograd import enable_grad
        with enable_grad():
            return closure()

    def _params_with_grad(self, group, init_state):
        """(parameter array, gradient array, state) of each parameter of `group` that has a gradient, in order; an
        empty state is first filled by init_state(state, param_array, group) (torch's lazy initialization)."""
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if len(state) == 0:
                init_state(state, p.array, group)
            yield p.array, p.grad.array, state

    def zero_grad(self, set_to_none=True):
        """Drop (default) or zero every parameter's .grad; zeroing keeps the gradient arrays' identity."""
        for group in self.param_groups:
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    g._ctx = None
                    g.requires_grad = False
                    g.array.fill(0)

    def add_param_group(self, param_group):
        """Append a group; options it leaves out come from the defaults. A parameter may be in one group only."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group)}")
        params = param_group["params"]
        if isinstance(params, Tensor):
            params = [params]
        elif isinstance(params, set):
            raise TypeError("optimizer parameters need to be organized in ordered collections, but the ordering "
                            "of tensors in sets will change between runs. Please use a list instead.")
        params = list(params)
        names = [p[0] for p in params if isinstance(p, tuple)]
        param_group["params"] = [p[1] if isinstance(p, tuple) else p for p in params]
        if names:
            if len(names) != len(params):
                raise ValueError("all optimizer params should be with/without names. Some param names are missing")
            param_group["param_names"] = names
        for p in param_group["params"]:
            if not isinstance(p, Tensor):
                raise TypeError("optimizer can only optimize Tensors, but one of the params is " + _typename(p))
            if p._ctx is not None and not p._retain:
                raise ValueError("can't optimize a non-leaf Tensor")
        for name, default in self.defaults.items():
            if default is required and name not in param_group:
                raise ValueError(f"parameter group didn't specify a value of required optimization parameter {name}")
            param_group.setdefault(name, default)
        params = param_group["params"]
        if len(params) != len(set(params)):
            warnings.warn("optimizer contains a parameter group with duplicate parameters; in future, this will "
                          "cause an error; see github.com/pytorch/pytorch/issues/40967 for more information",
                          stacklevel=3)
        seen = set()
        for group in self.param_groups:
            seen.update(group["params"])
            if ("param_names" in param_group) != ("param_names" in group):
                txt = "with names" if "param_names" in param_group else "without names"
                raise ValueError("all optimizer param groups should be with/without names. "
                                 f"cannot add param group {txt} to the optimizer")
        if not seen.isdisjoint(params):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(param_group)

    # ---- state_dict ------------------------------------------------------------------------------------------
    def state_dict(self):
        """{'state': {index: {name: value}}, 'param_groups': [{..., 'params': [index, ...]}]}, as torch.

        Unlike torch, state tensors are snapshots (copies), so a saved dict never changes with later steps
        (smalltrain tensors cannot be deep-copied with copy.deepcopy)."""
        from . import fused
        for pre_hook in self._optimizer_state_dict_pre_hooks.values():
            pre_hook(self)
        fused.flush(self)   # steps replayed from a CUDA graph since the last eager step
        index, groups, start = {}, [], 0
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            for i, p in enumerate(group["params"], start):
                index.setdefault(id(p), i)
            packed["params"] = [index[id(p)] for p in group["params"]]
            start += len(packed["params"])
            groups.append(packed)
        state = {(index[id(k)] if isinstance(k, Tensor) else k): _copy_value(v) for k, v in self.state.items()}
        state_dict = {"state": state, "param_groups": groups}
        for post_hook in self._optimizer_state_dict_post_hooks.values():
            result = post_hook(self, state_dict)
            state_dict = state_dict if result is None else result
        return state_dict

    def load_state_dict(self, state_dict):
        """Load what state_dict() returned (values are copied: later steps never write into `state_dict`)."""
        state_dict = dict(state_dict)
        for pre_hook in self._optimizer_load_state_dict_pre_hooks.values():
            result = pre_hook(self, state_dict)
            state_dict = state_dict if result is None else result
        groups = self.param_groups
        saved_groups = _copy_value(state_dict["param_groups"])
        if len(groups) != len(saved_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        if any(len(g["params"]) != len(s["params"]) for g, s in zip(groups, saved_groups)):
            raise ValueError("loaded state dict contains a parameter group that doesn't match the size of "
                             "optimizer's group")
        id_map = dict(zip(chain.from_iterable(g["params"] for g in saved_groups),
                          chain.from_iterable(g["params"] for g in groups)))
        state = defaultdict(dict)
        for k, v in state_dict["state"].items():
            if k in id_map:
                param = id_map[k]
                state[param] = {name: _cast(self, param, value, k, name) for name, value in v.items()}
            else:
                state[k] = v  # state of no current parameter is kept as is, as torch does
        for group, new_group in zip(groups, saved_groups):
            new_group["params"] = group["params"]
            if "param_names" in group and "param_names" not in new_group:
                new_group["param_names"] = group["param_names"]
        self.state = state
        self.param_groups = saved_groups
        self._fill_group_defaults()
        for post_hook in self._optimizer_load_state_dict_post_hooks.values():
            post_hook(self)

    def _fill_group_defaults(self):
        # groups saved by an older or other configuration may lack options that this optimizer reads
        for group in self.param_groups:
            for name, default in self.defaults.items():
                group.setdefault(name, default)


def host_scalar(value, dtype):
    """A 0-d CPU tensor: per-parameter scalar state (`step`, NAdam's `mu_product`), read by the host every step."""
    return Tensor._wrap(np.array(float(value), dtype=dtype))


def _cast(opt, param, value, index, key):
    """A copy of one state value on the parameter's device; float state takes the parameter's dtype, and lists are
    cast item by item. The optimizer's `_host_scalars` stay CPU scalars (`step` in torch's scalar dtype), and a plain
    number, as an older or JSON checkpoint holds it, becomes one."""
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(opt, param, v, index, key) for v in value)
    if key in opt._host_scalars:
        dtype = _scalar_np_dtype() if key == "step" or param.array.dtype.kind != "f" else param.array.dtype
        if isinstance(value, Tensor):
            return host_scalar(value.item(), dtype)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return host_scalar(value, dtype)
        return _copy_value(value)
    if isinstance(value, Tensor):
        a = value.array
        if a.ndim and a.shape != param.array.shape and key not in opt._flat_state:
            raise ValueError(f"load_state_dict: state {key!r} of parameter {index} has shape {list(a.shape)}, but "
                             f"the parameter has shape {list(param.array.shape)}")
        from ..backend import to_device
        a = to_device(a, param.device)
        if param.array.dtype.kind == "f" and a.dtype != param.array.dtype:
            a = a.astype(param.array.dtype)
        return Tensor._wrap(a.copy() if a is value.array else a)
    if isinstance(value, dict):
        return {k: _cast(opt, param, v, index, k) for k, v in value.items()}
    return _copy_value(value)

"""Optimizer hooks with torch's registration API: step pre/post hooks (per optimizer, and global for every
optimizer), and state_dict / load_state_dict pre/post hooks. Optimizer inherits the registration methods."""
import functools
from collections import OrderedDict
from itertools import chain

from ..autograd import versions
from ..ops.inplace import before_write
from ..nn.module import RemovableHandle

_global_step_pre_hooks = OrderedDict()
_global_step_post_hooks = OrderedDict()


def _register(hooks, hook, prepend=False):
    handle = RemovableHandle(hooks)
    hooks[handle.id] = hook
    if prepend:
        hooks.move_to_end(handle.id, last=False)
    return handle


def register_optimizer_step_pre_hook(hook):
    """hook(optimizer, args, kwargs) -> None or (new_args, new_kwargs), before every optimizer's step."""
    return _register(_global_step_pre_hooks, hook)


def register_optimizer_step_post_hook(hook):
    """hook(optimizer, args, kwargs), after every optimizer's step."""
    return _register(_global_step_post_hooks, hook)


def _with_step_hooks(step):
    """step with the pre and post hooks around it; `args` holds the optimizer first, as torch passes it."""
    @functools.wraps(step)
    def wrapper(*args, **kwargs):
        self = args[0]
        for pre_hook in chain(_global_step_pre_hooks.values(), self._optimizer_step_pre_hooks.values()):
            result = pre_hook(self, args, kwargs)
            if result is not None:
                if not (isinstance(result, tuple) and len(result) == 2):
                    raise RuntimeError(f"{step} must return None or a tuple of (new_args, new_kwargs), but got "
                                       f"{result}.")
                args, kwargs = result
        before_write()   # an op deferred or held back may read a parameter the step overwrites
        out = step(*args, **kwargs)
        _count_writes(self)
        for post_hook in chain(self._optimizer_step_post_hooks.values(), _global_step_post_hooks.values()):
            post_hook(self, args, kwargs)
        return out
    wrapper.hooked = True
    return wrapper


def _count_writes(optimizer):
    """The step wrote the parameters that have a gradient in place: count it in their version counters, so that
    a graph recorded before the step fails its backward where it saved a parameter (autograd/versions.py)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p._vc is not None and p.grad is not None:
                versions.bump(p)


class OptimizerHooks:
    """The hook registries of one optimizer and the methods that fill them."""

    def _init_hooks(self):
        self._optimizer_step_pre_hooks = OrderedDict()
        self._optimizer_step_post_hooks = OrderedDict()
        self._optimizer_state_dict_pre_hooks = OrderedDict()
        self._optimizer_state_dict_post_hooks = OrderedDict()
        self._optimizer_load_state_dict_pre_hooks = OrderedDict()
        self._optimizer_load_state_dict_post_hooks = OrderedDict()
        cls = type(self)
        if not getattr(cls.step, "hooked", False):   # as torch: once per class, on its first instance
            cls.step = _with_step_hooks(cls.step)

    def register_step_pre_hook(self, hook):
        """hook(optimizer, args, kwargs) -> None or (new_args, new_kwargs), before each step."""
        return _register(self._optimizer_step_pre_hooks, hook)

    def register_step_post_hook(self, hook):
        """hook(optimizer, args, kwargs), after each step."""
        return _register(self._optimizer_step_post_hooks, hook)

    def register_state_dict_pre_hook(self, hook, prepend=False):
        """hook(optimizer), before state_dict() builds the dict."""
        return _register(self._optimizer_state_dict_pre_hooks, hook, prepend)

    def register_state_dict_post_hook(self, hook, prepend=False):
        """hook(optimizer, state_dict) -> None or a replacement, on what state_dict() returns."""
        return _register(self._optimizer_state_dict_post_hooks, hook, prepend)

    def register_load_state_dict_pre_hook(self, hook, prepend=False):
        """hook(optimizer, state_dict) -> None or a replacement, before load_state_dict() reads it."""
        return _register(self._optimizer_load_state_dict_pre_hooks, hook, prepend)

    def register_load_state_dict_post_hook(self, hook, prepend=False):
        """hook(optimizer), after load_state_dict()."""
        return _register(self._optimizer_load_state_dict_post_hooks, hook, prepend)

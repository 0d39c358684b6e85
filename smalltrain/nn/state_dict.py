"""Module's state_dict / load_state_dict (nn/module.py mixes it in): torch's keys (`features.0.weight`), its
metadata, its one error listing every missing, unexpected and mismatched key, and `assign=`."""
import itertools
from collections import OrderedDict, namedtuple
from collections.abc import Mapping

import numpy as np

from ..backend import to_device
from ..tensor import Size, Tensor
from .parameter import Parameter


class _IncompatibleKeys(namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])):
    def __repr__(self):
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return super().__repr__()

    __str__ = __repr__


def _is_array_like(v):
    return isinstance(v, (Tensor, np.ndarray)) or hasattr(v, "__cuda_array_interface__")


def _copy_into(dst, src):
    """Copy a Tensor's or array's values into `dst`'s array in place (casting dtype, moving across devices)."""
    s = src.array if isinstance(src, Tensor) else src
    if type(s) is not type(dst.array):
        s = to_device(s, dst.device)
    dst.array[...] = s


class StateDictMixin:
    """state_dict and load_state_dict over a Module's _parameters, _buffers and _modules."""

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        for name, p in self._parameters.items():
            if p is not None:
                destination[prefix + name] = p if keep_vars else p.detach()
        for name, b in self._buffers.items():
            if b is not None and name not in self._non_persistent_buffers_set:
                destination[prefix + name] = b if keep_vars else b.detach()

    def state_dict(self, *args, destination=None, prefix="", keep_vars=False):
        """An OrderedDict name -> Tensor (detached, sharing memory) of parameters and persistent buffers, keys
        like `features.0.weight` in registration order, as torch's."""
        if args:  # torch's deprecated positional form: (destination, prefix, keep_vars)
            destination = args[0] if destination is None else destination
            prefix = args[1] if len(args) > 1 and prefix == "" else prefix
            keep_vars = args[2] if len(args) > 2 and keep_vars is False else keep_vars
        if destination is None:
            destination = OrderedDict()
            destination._metadata = OrderedDict()
        if hasattr(destination, "_metadata"):
            destination._metadata[prefix[:-1]] = {"version": self._version}
        self._save_to_state_dict(destination, prefix, keep_vars)
        for name, m in self._modules.items():
            if m is not None:
                m.state_dict(destination=destination, prefix=prefix + name + ".", keep_vars=keep_vars)
        return destination

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        """Copy this module's own entries of `state_dict` (keys starting with `prefix`) into its tensors."""
        persistent = {k: v for k, v in self._buffers.items() if k not in self._non_persistent_buffers_set}
        local_state = {k: v for k, v in itertools.chain(self._parameters.items(), persistent.items())
                       if v is not None}
        assign = local_metadata.get("assign_to_params_buffers", False)
        for name, param in local_state.items():
            key = prefix + name
            if key not in state_dict:
                if strict:
                    missing_keys.append(key)
                continue
            value = state_dict[key]
            if not _is_array_like(value):
                error_msgs.append(f'While copying the parameter named "{key}", expected smalltrain.Tensor or an '
                                  f"array from checkpoint but received {type(value)}")
                continue
            if param.ndim == 0 and len(value.shape) == 1 and value.shape[0] == 1:
                value = value[0]  # torch's compatibility with 1-element checkpoints of scalars
            if tuple(value.shape) != tuple(param.shape):
                error_msgs.append(f"size mismatch for {key}: copying a param with shape {Size(value.shape)} from "
                                  f"checkpoint, the shape in current model is {param.shape}.")
                continue
            try:
                if assign:
                    self._assign(name, param, value)
                else:
                    _copy_into(param, value)
            except Exception as ex:  # noqa: BLE001 - reported with the other problems, as torch does
                error_msgs.append(f'While copying the parameter named "{key}", whose dimensions in the model are '
                                  f"{param.shape} and whose dimensions in the checkpoint are {Size(value.shape)}, "
                                  f"an exception occurred : {ex.args}.")
        if strict:
            for key in state_dict:
                if key.startswith(prefix):
                    parts = key[len(prefix):].split(".", 1)
                    if (parts[0] not in self._modules) if len(parts) > 1 else (parts[0] not in local_state):
                        unexpected_keys.append(key)

    def _assign(self, name, param, value):
        t = value if isinstance(value, Tensor) else Tensor._wrap(value)
        if isinstance(param, Parameter):
            t = t if isinstance(t, Parameter) else Parameter(t, requires_grad=param.requires_grad)
            t.requires_grad = param.requires_grad
        setattr(self, name, t)

    def load_state_dict(self, state_dict, strict=True, assign=False):
        """Copy `state_dict`'s values (Tensors or arrays) into this module's parameters and buffers in place.
        Returns (missing_keys, unexpected_keys); one RuntimeError lists every problem (strict: also every missing
        and unexpected key), in torch's format."""
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict)}.")
        missing, unexpected, errors = [], [], []
        metadata = getattr(state_dict, "_metadata", None)
        state_dict = OrderedDict(state_dict)  # a copy: _load_from_state_dict may add entries

        def load(module, local, prefix=""):
            meta = {} if metadata is None else dict(metadata.get(prefix[:-1], {}))
            if assign:
                meta["assign_to_params_buffers"] = True
            module._load_from_state_dict(local, prefix, meta, True, missing, unexpected, errors)
            for name, child in module._modules.items():
                if child is not None:
                    child_prefix = prefix + name + "."
                    load(child, {k: v for k, v in local.items() if k.startswith(child_prefix)}, child_prefix)
        load(self, state_dict)
        if strict:
            if unexpected:
                errors.insert(0, "Unexpected key(s) in state_dict: {}. ".format(", ".join(f'"{k}"' for k in
                                                                                       unexpected)))
            if missing:
                errors.insert(0, "Missing key(s) in state_dict: {}. ".format(", ".join(f'"{k}"' for k in missing)))
        if errors:
            raise RuntimeError("Error(s) in loading state_dict for {}:\n\t{}".format(type(self).__name__,
                                                                                     "\n\t".join(errors)))
        return _IncompatibleKeys(missing, unexpected)

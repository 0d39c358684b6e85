"""Saving and loading: `smalltrain.save/load` for dicts of tensors, and the trainer's full training state.

Everything goes through utils.checkpoint (safetensors + JSON sidecar, atomic, never pickle).
"""
import numpy as np

from . import random as st_random
from .tensor import Tensor
from .utils.checkpoint import CheckpointError, load_checkpoint, save_checkpoint


def _host(t):
    a = t.array if isinstance(t, Tensor) else t
    return a if isinstance(a, np.ndarray) else a.get()


def save(obj, path):
    """Save a dict of tensors (e.g. a state_dict) as safetensors; values keep dtype and shape bitwise."""
    if not isinstance(obj, dict) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise TypeError("smalltrain.save: expected a dict of str -> Tensor (a state_dict); got "
                        f"{type(obj).__name__}")
    save_checkpoint(path, {k: _host(v) for k, v in obj.items()}, {"kind": "tensors"})


def load(path, map_location=None):
    """Load what `save` wrote, as an ordered dict of CPU tensors (or on `map_location`)."""
    tensors, _ = load_checkpoint(path)
    out = {k: Tensor._wrap(v) for k, v in tensors.items()}
    if map_location is not None:
        out = {k: v.to(map_location) for k, v in out.items()}
    return out


def _split_optimizer_state(state_dict):
    """Tensors of the optimizer state go to safetensors, the rest (numbers, param_groups) to JSON."""
    tensors, scalars = {}, {}
    for idx, st in state_dict["state"].items():
        for name, value in st.items():
            if isinstance(value, Tensor):
                tensors[f"optimizer.state.{idx}.{name}"] = _host(value)
            else:
                scalars.setdefault(str(idx), {})[name] = value
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in state_dict["param_groups"]]
    return tensors, {"scalars": scalars, "param_groups": groups}


def _join_optimizer_state(tensors, meta):
    state = {}
    for key, value in tensors.items():
        if key.startswith("optimizer.state."):
            idx, name = key[len("optimizer.state."):].split(".", 1)
            state.setdefault(int(idx), {})[name] = Tensor._wrap(value)
    for idx, values in meta["scalars"].items():
        state.setdefault(int(idx), {}).update(values)
    groups = [{k: (tuple(v) if k == "betas" else v) for k, v in g.items()} for g in meta["param_groups"]]
    return {"state": state, "param_groups": groups}


def save_training_state(path, model, optimizer, scheduler, meta):
    tensors = {f"model.{k}": _host(v) for k, v in model.state_dict().items()}
    opt_tensors, opt_meta = _split_optimizer_state(optimizer.state_dict())
    tensors.update(opt_tensors)
    meta = dict(meta, optimizer=opt_meta, rng=st_random.get_rng_state(),
                scheduler=scheduler.state_dict() if scheduler is not None else None)
    save_checkpoint(path, tensors, meta)


def load_training_state(path, model, optimizer=None, scheduler=None, expect_model=None):
    """Restore model (and optimizer, scheduler, RNG) from `path`; returns the checkpoint's metadata."""
    tensors, meta = load_checkpoint(path)
    if "model" not in meta or "optimizer" not in meta:
        raise CheckpointError(f"{path}: not a smalltrain training checkpoint (no model/optimizer state)")
    if expect_model is not None and meta["model"] != expect_model:
        raise CheckpointError(f"{path}: checkpoint is for model {meta['model']!r}, but the model is "
                              f"{expect_model!r} (pass --model {meta['model']})")
    state = {k[len("model."):]: Tensor._wrap(v) for k, v in tensors.items() if k.startswith("model.")}
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise CheckpointError(f"{path}: {e}") from None
    if optimizer is not None:
        optimizer.load_state_dict(_join_optimizer_state(tensors, meta["optimizer"]))
    if scheduler is not None and meta.get("scheduler") is not None:
        scheduler.load_state_dict(meta["scheduler"])
    st_random.set_rng_state(meta["rng"])
    return meta

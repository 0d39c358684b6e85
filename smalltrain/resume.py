"""Resuming a run: read and check a checkpoint's metadata before anything is built, and take the run's settings
from it (model, optimizer and its options, schedule, batch size, seed); a flag that contradicts them is refused.

What may change on resume: `--epochs` (to extend the run; the schedule then stretches to the new total, see
`stretch_schedule`), where the run is written (`--out`), and how it runs (device, logging, --compile ...).
"""
import dataclasses
import math
import warnings

from . import models
from .utils.checkpoint import CheckpointError

# the settings that make the run what it is: a resumed run takes them from its checkpoint
LOCKED = ("model", "optimizer", "lr", "momentum", "weight_decay", "scheduler", "batch_size", "seed",
          "limit_train_batches")
_FLAG = {name: "--" + name.replace("_", "-") for name in LOCKED + ("epochs",)}


def checkpoint_meta(path):
    """The metadata of checkpoint `path`, read from its header alone: no tensor loaded, nothing built."""
    from .serialization import read_checkpoint_meta
    return read_checkpoint_meta(path)


def _field(path, meta, key, check, expected):
    if key not in meta or not check(meta[key]):
        got = f"{type(meta[key]).__name__} {meta[key]!r}"[:120] if key in meta else "nothing"
        raise CheckpointError(f"{path}: checkpoint field {key!r} must be {expected}, got {got}")
    return meta[key]


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def validate_meta(path, meta):
    """CheckpointError naming the file and field unless `meta` is a smalltrain training checkpoint's metadata
    whose model config is known and bounded (nothing is built or allocated here)."""
    if not isinstance(meta, dict) or "model" not in meta or "train_config" not in meta:
        raise CheckpointError(f"{path}: not a smalltrain training checkpoint (no model or training settings)")
    name = _field(path, meta, "model", lambda v: v in models.MODELS, f"one of {', '.join(models.MODELS)}")
    config = _field(path, meta, "model_config", lambda v: isinstance(v, dict), "an object")
    try:
        models.validate_config(name, config, where=str(path))
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    epoch = _field(path, meta, "epoch", lambda v: _is_int(v) and 1 <= v <= 10**6, "an int in [1, 1000000]")
    _field(path, meta, "step", lambda v: _is_int(v) and 0 <= v < 2**53, "a non-negative int")
    _field(path, meta, "history", lambda v: isinstance(v, list), "a list")
    train = _field(path, meta, "train_config", lambda v: isinstance(v, dict), "an object")
    names = {f.name for f in dataclasses.fields(_train_config_class())}
    unknown = sorted(set(train) - names)
    if unknown:
        raise CheckpointError(f"{path}: train_config has unknown key(s) {', '.join(unknown)}")
    if train.get("model") != name:
        raise CheckpointError(f"{path}: train_config['model'] is {train.get('model')!r} but the checkpoint holds "
                              f"a {name!r}")
    try:
        _train_config_class()(**{k: train[k] for k in LOCKED if k in train}).validate()
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: train_config: {e}") from None
    return epoch


def _train_config_class():
    from .train import TrainConfig
    return TrainConfig


def resume_config(cfg, explicit):
    """`cfg` with the run's settings taken from the checkpoint `cfg.resume`; ValueError for an explicit flag (a
    name in `explicit`) that contradicts the checkpoint. Returns (config, checkpoint metadata)."""
    path = cfg.resume
    meta = checkpoint_meta(path)
    done = validate_meta(path, meta)
    saved = meta["train_config"]
    taken = {}
    for name in LOCKED:
        if name not in saved:
            continue
        mine, theirs = getattr(cfg, name), saved[name]
        if name in explicit and not _same(mine, theirs):
            raise ValueError(f"{_FLAG[name]} {mine} contradicts the checkpoint {path}, whose run used {name} "
                             f"{theirs}: a resumed run keeps its model, optimizer and its options, learning rate, "
                             f"schedule, batch size and seed (only --epochs may grow); start a new run to change "
                             f"{_FLAG[name]}")
        taken[name] = theirs
    epochs = cfg.epochs if "epochs" in explicit else saved.get("epochs", cfg.epochs)
    if epochs <= done:
        raise ValueError(f"the checkpoint {path} has already trained {done} epoch(s) of a {epochs}-epoch run: "
                         f"pass --epochs N with N > {done} to extend it")
    return dataclasses.replace(cfg, epochs=epochs, **taken), meta


def _same(a, b):
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=0.0)
    return a == b


def stretch_schedule(optimizer, build, steps):
    """The scheduler of a run extended by --epochs. The rule: from the resumed step on, the learning rate is the
    one a run planned with the new total from the start would have (cosine's T_max, one-cycle's length and
    step's step size become those of the new --epochs). The new scheduler is built by `build()` over the
    optimizer's initial learning rates and stepped `steps` times, so the rest of the run is bit for bit the
    rest of that run's schedule."""
    for group in optimizer.param_groups:
        group["lr"] = group.get("initial_lr", group["lr"])
    scheduler = build()
    with warnings.catch_warnings():   # stepped without optimizer steps, on purpose
        warnings.simplefilter("ignore")
        for _ in range(steps):
            scheduler.step()
    return scheduler

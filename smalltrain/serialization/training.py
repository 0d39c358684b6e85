"""The trainer's checkpoints: run metadata, model, optimizer, scheduler and RNG state in ONE smalltrain.save file.

`read_checkpoint_meta` reads the run metadata (model name and config, epoch, step, ...) from the file's header
alone, so that a caller can validate it and build the right model before a single tensor is read.
"""
from .. import random as st_random
from ..utils.checkpoint import CheckpointError, open_safetensors, write_safetensors
from . import structure
from .native import DOCUMENT_FORMAT, read_structure, tensor_maker

TRAINING_FORMAT, TRAINING_VERSION = "smalltrain.training_state", 1


def save_training_state(path, model, optimizer, scheduler, meta):
    """Write everything a resumed run needs to `path` (atomically; the old file stays whole until then).

    `meta` is plain data (dicts, lists, str, numbers, ...: no Tensors), returned by load_training_state and
    read_checkpoint_meta. The file is also readable with `smalltrain.load` (a dict)."""
    if not isinstance(meta, dict):
        raise TypeError(f"save_training_state: meta must be a dict, got {type(meta).__name__}")
    state = {"format": TRAINING_FORMAT, "version": TRAINING_VERSION, "meta": meta,
             "model": model.state_dict(),
             "optimizer": optimizer.state_dict(), "optimizer_type": type(optimizer).__name__,
             "scheduler": None if scheduler is None else scheduler.state_dict(),
             "scheduler_type": None if scheduler is None else type(scheduler).__name__,
             "rng": st_random.get_rng_state()}
    arrays, tree = structure.flatten(state)
    if structure.tensor_nodes(structure.find_key(tree, "meta")):
        raise TypeError("save_training_state: meta holds a Tensor; it must be plain data (str, numbers, lists, "
                        "dicts)")
    write_safetensors(path, arrays, {"format": DOCUMENT_FORMAT, "structure": tree})


def _training_tree(reader):
    """The checked structure of a training checkpoint, or CheckpointError naming the file."""
    tree = read_structure(reader)
    if tree is None or structure.find_key(tree, "format") != TRAINING_FORMAT:
        raise reader.error("not a smalltrain training checkpoint (no training state in it; a file of "
                           "smalltrain.save or of another tool loads with smalltrain.load)")
    version = structure.find_key(tree, "version")
    if version != TRAINING_VERSION:
        raise reader.error(f"training checkpoint version {version!r}, this smalltrain reads {TRAINING_VERSION}")
    for key in ("meta", "model", "optimizer", "rng"):
        if structure.find_key(tree, key) is None:
            raise reader.error(f"training checkpoint lacks {key!r}")
    if structure.tensor_nodes(structure.find_key(tree, "meta")):
        raise reader.error("training checkpoint's meta holds tensors")
    return tree


def _open(path):
    if str(path).endswith(".json"):
        raise CheckpointError(f"{path}: a .json file: the older two-file checkpoint format (.safetensors + .json "
                              "sidecar) is no longer read; pass a checkpoint written by this smalltrain")
    return open_safetensors(path)


def read_checkpoint_meta(path):
    """The `meta` dict a training checkpoint was saved with, from the file's header (no tensor is read).

    CheckpointError (a ValueError) naming the file if it is no valid smalltrain training checkpoint."""
    with _open(path) as reader:
        return structure.build(structure.find_key(_training_tree(reader), "meta"), None)


def _check_types(path, tree, optimizer, scheduler):
    for what, obj in (("optimizer", optimizer), ("scheduler", scheduler)):
        saved = structure.find_key(tree, f"{what}_type")
        if obj is not None and saved is not None and saved != type(obj).__name__:
            raise CheckpointError(f"{path}: the checkpoint holds the state of a {saved} {what}, but the {what} "
                                  f"is a {type(obj).__name__}")


def load_training_state(path, model, optimizer=None, scheduler=None, expect_model=None):
    """Restore model (and optimizer, scheduler, RNG) from `path`; returns the checkpoint's `meta`.

    Everything is validated (file, structure, `expect_model` against meta['model'], optimizer and scheduler
    classes) before any tensor is read; a model whose parameters do not match raises CheckpointError."""
    with _open(path) as reader:
        tree = _training_tree(reader)
        meta = structure.build(structure.find_key(tree, "meta"), None)
        if expect_model is not None and meta.get("model") != expect_model:
            raise CheckpointError(f"{path}: checkpoint is for model {meta.get('model')!r}, but the model is "
                                  f"{expect_model!r} (pass --model {meta.get('model')})")
        _check_types(path, tree, optimizer, scheduler)
        arrays, make = reader.read(), tensor_maker()
        state = structure.build(tree, lambda node: make(arrays[node["tensor"]], "cpu", node["requires_grad"],
                                                        node["parameter"]))
    try:
        model.load_state_dict(state["model"])
    except (RuntimeError, ValueError, KeyError) as e:
        raise CheckpointError(f"{path}: {e}") from None
    if optimizer is not None:
        try:
            optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{path}: optimizer state does not fit the optimizer: {e}") from None
    try:
        if scheduler is not None and state["scheduler"] is not None:
            scheduler.load_state_dict(state["scheduler"])
        st_random.set_rng_state(state["rng"])
    except (ValueError, TypeError, KeyError) as e:
        raise CheckpointError(f"{path}: scheduler or RNG state is malformed: {e}") from None
    return meta

"""`smalltrain.save` / `smalltrain.load` with torch's signatures, in safetensors; `load` also reads torch.save files.

A saved object (any nesting of dicts, lists, tuples, Tensors and Python scalars) is ONE safetensors file: the
tensors under path-like names, the structure as JSON in the file's metadata (serialization/structure.py, through
utils/checkpoint.py). Nothing is pickled, and nothing from a file is ever run. The trainer's checkpoints
(save_training_state, load_training_state, read_checkpoint_meta) are such files too (serialization/training.py).
"""
import io
import os
import pickle

from ..utils.checkpoint import CheckpointError, open_safetensors
from .native import read_object, tensor_maker, write_object
from .torch_zip import UnsafePickleError, load_torch_zip
from .training import load_training_state, read_checkpoint_meta, save_training_state

__all__ = ["CheckpointError", "UnsafePickleError", "load", "load_training_state", "read_checkpoint_meta", "save",
           "save_training_state"]

_ZIP_MAGIC = b"PK\x03\x04"


def save(obj, f, pickle_module=None, pickle_protocol=None, _use_new_zipfile_serialization=True,
         _disable_byteorder_record=False):
    """Save `obj` (dicts with str/int keys, lists, tuples, Tensors, int/float/bool/str/None, nested) to `f`.

    `f` is a path or a binary file object. A path is written atomically (a temporary beside it, fsync'ed, then
    renamed over it; removed on any error) with permissions from the umask; no other file is touched. The file is
    safetensors, whatever its name: `safetensors.torch.load_file` reads a saved state_dict with torch's key names.
    Tensors keep dtype, shape, requires_grad, Parameter-ness and their device's name; a tensor shared by two
    entries is stored twice. The pickle arguments are accepted for compatibility and ignored: nothing is pickled.
    TypeError names the place of anything else: "obj['opt']['state'][0]: cannot save <class 'set'>".
    """
    if not hasattr(f, "write"):
        parent = os.path.dirname(os.path.abspath(os.fspath(f)))
        if not os.path.isdir(parent):
            raise RuntimeError(f"Parent directory {parent} does not exist.")   # as torch.save
    write_object(obj, f, make_dirs=False)


def load(f, map_location=None, pickle_module=None, *, weights_only=True, mmap=None, **pickle_load_args):
    """Load what `save` wrote, a plain safetensors file, or a `torch.save` file (zip format) from a path or file.

    Tensors come back on the CPU, or where `map_location` puts them: 'cpu', 'cuda', 'cuda:0', a smalltrain.device,
    a dict of saved-location renames ({'cuda:1': 'cuda:0'}; locations it does not name load on the CPU), or a
    callable f(tensor, location) returning a Tensor (or None for the CPU one) as torch's (storage, location).
    Unlike torch, map_location=None means the CPU, not the device a tensor was saved from.

    Nothing from the file is ever run: torch files are unpickled with torch's weights_only rule (tensors,
    storages, dtypes, OrderedDict and plain data only; any other global raises UnsafePickleError, a
    pickle.UnpicklingError naming it), whatever `weights_only` says; `weights_only=False` is accepted for
    compatibility. `mmap` is accepted (safetensors files are memory-mapped anyway). The legacy non-zip torch format
    is refused. Corrupt, truncated or inconsistent files raise CheckpointError (a ValueError) naming the file.
    """
    if pickle_module is not None and pickle_module is not pickle:
        raise RuntimeError(f"load: pickle_module={getattr(pickle_module, '__name__', pickle_module)!r} is not "
                           "supported: smalltrain.load never unpickles arbitrary objects")
    encoding = pickle_load_args.pop("encoding", "utf-8")
    if pickle_load_args:
        raise TypeError(f"load() got unexpected keyword arguments {sorted(pickle_load_args)}")
    make = tensor_maker(map_location)
    is_path = not hasattr(f, "read")
    source = os.fsdecode(f) if is_path else getattr(f, "name", f"<{type(f).__name__}>")
    if is_path:
        with open(f, "rb") as file:
            head = file.read(8)
        data = None
    else:
        data = f.read()
        head = data[:8]
    if head.startswith(_ZIP_MAGIC):
        return load_torch_zip(f if is_path else io.BytesIO(data), source, make, encoding)
    if head[:1] == b"\x80" and len(head) > 1 and head[1] <= pickle.HIGHEST_PROTOCOL:
        raise CheckpointError(f"{source}: a pickle file in torch's legacy (pre-1.6, non-zip) format, which smalltrain "
                              "does not read; re-save it with a current torch (torch.save writes the zip format)")
    with open_safetensors(f, data) as reader:
        return read_object(reader, make)

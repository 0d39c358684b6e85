"""smalltrain's own files: an object as ONE safetensors file (arrays + JSON structure), and tensors placed on load.

The document in the file's metadata is {"format": "smalltrain.save", "structure": ...} (structure.py says how a
structure reads); `tensor_maker` turns arrays into Tensors where torch's `map_location` forms put them.
"""
from ..autograd.grad_mode import no_grad
from ..backend import Device, as_device
from ..tensor import Tensor
from ..utils.checkpoint import write_safetensors
from . import structure

DOCUMENT_FORMAT = "smalltrain.save"


def write_object(obj, f, make_dirs=True):
    """Write `obj` to `f` (a path, atomically, or a binary file object); TypeError names what cannot be saved."""
    arrays, tree = structure.flatten(obj)
    write_safetensors(f, arrays, {"format": DOCUMENT_FORMAT, "structure": tree}, make_dirs=make_dirs)


def read_structure(reader):
    """The checked structure of one of our files (open_safetensors' reader), or None for a plain safetensors file.

    CheckpointError naming the file if the structure is malformed or does not match the file's tensors."""
    document = reader.document
    if document is None:
        return None
    if not (isinstance(document, dict) and set(document) == {"format", "structure"}
            and document["format"] == DOCUMENT_FORMAT):
        raise reader.error(f"metadata document must be {{'format': {DOCUMENT_FORMAT!r}, 'structure': ...}}")
    try:
        structure.check(document["structure"], reader.specs)
    except ValueError as e:
        raise reader.error(f"invalid structure: {e}") from None
    return document["structure"]


def read_object(reader, make):
    """Everything the file holds; a plain safetensors file gives a flat dict name -> Tensor."""
    tree = read_structure(reader)
    arrays = reader.read()
    if tree is None:
        return {name: make(array, "cpu", False, False) for name, array in arrays.items()}
    return structure.build(tree, lambda node: make(arrays[node["tensor"]], node["device"], node["requires_grad"],
                                                   node["parameter"]))


def _placement(map_location):
    """f(CPU tensor, saved location) -> tensor where `map_location` (any of torch's forms) puts it."""
    if map_location is None or isinstance(map_location, (str, Device, int)):
        target = as_device(map_location)
        return lambda tensor, location: tensor.to(target)
    if isinstance(map_location, dict):
        renames = {str(k): as_device(v) for k, v in map_location.items()}
        return lambda tensor, location: tensor.to(renames.get(location, Device("cpu")))
    if callable(map_location):
        def call(tensor, location):
            result = map_location(tensor, location)
            if result is None:
                return tensor
            return result if isinstance(result, Tensor) else tensor.to(as_device(result))
        return call
    raise TypeError(f"load: map_location must be None, a device, a str, a dict or a callable, got "
                    f"{type(map_location).__name__}")


def tensor_maker(map_location=None):
    """make(array, saved location, requires_grad, parameter) -> a leaf Tensor (or Parameter) placed as asked."""
    place = _placement(map_location)

    def make(array, location, requires_grad, parameter):
        with no_grad():
            placed = place(Tensor._wrap(array), location)
        if not isinstance(placed, Tensor):
            raise TypeError(f"load: map_location returned {type(placed).__name__}, expected a Tensor")
        if parameter:
            from ..nn.parameter import Parameter
            return Parameter(placed, requires_grad=requires_grad)
        return Tensor._wrap(placed.array, requires_grad=requires_grad)
    return make

"""The convolution tests still here share tests/backend/cuda's fixtures and reference (until they move there): its
conftest's fixtures, loaded from that file, and its cuda_reference.py on the import path."""
import importlib.util
import pathlib
import sys

_SHARED = pathlib.Path(__file__).resolve().parents[1] / "backend" / "cuda"
if str(_SHARED) not in sys.path:
    sys.path.insert(0, str(_SHARED))
_spec = importlib.util.spec_from_file_location("_backend_cuda_conftest", _SHARED / "conftest.py")
_shared = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_shared)
_poison_pool = _shared._poison_pool

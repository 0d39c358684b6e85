"""The kernel loader (backend/cuda/loader.py): a kernel file compiles one module per element type. Skips without
CuPy or a GPU (the emulator stands in)."""
import pytest

cp = pytest.importorskip("cupy")
import smalltrain  # noqa: E402

if not smalltrain.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from smalltrain.backend.cuda import loader  # noqa: E402


def _assert_module_kernels(module, own, other):
    """The compiled module has each kernel named in `own` and none named in `other`."""
    for name in own:
        module.get_function(name)
    for name in other:
        with pytest.raises(Exception):   # (CuPy: CUDADriverError, CUDA_ERROR_NOT_FOUND; the emulator: KeyError)
            module.get_function(name)


def test_a_kernel_file_compiles_one_module_per_element_type():
    """loader.family_source(family, 1 / 2): the module of float32 kernels has none of the float64 ones and the
    reverse (common.cuh ST_INSTANTIATE); kernels of no element type are in both."""
    for dtypes, own, other in ((1, "adam_step_f32", "adam_step_f64"), (2, "adam_step_f64", "adam_step_f32")):
        _assert_module_kernels(loader.compile_module(loader.family_source("optim", dtypes)), [own, "set_hyper"],
                               [other])

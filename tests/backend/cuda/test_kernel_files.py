"""The kernel files (backend/cuda/kernels/*.cu), no GPU needed: every kernel a launcher names exists for float32
and float64, each file carries its header and inlines its includes, every kernel first waits for its
predecessors, and each instantiates its kernels through the element type switch."""
import os
import re

import pytest

from smalltrain.backend.cuda import loader

CUDA_DIR = os.path.dirname(loader.__file__)
CALL = re.compile(r'\b(launch|launch_rows|get)\(\s*"(\w+)",\s*"(\w+)"')
PLAIN = re.compile(r'\bkernel\(\s*"(\w+)",\s*"(\w+)"\)')


def _kernels(family):
    src = loader.read_source(os.path.join(loader.KERNEL_DIR, family + ".cu"))
    return set(re.findall(r'extern "C" __global__ void (\w+)\(', src)) | _macro_kernels(src)


def _macro_kernels(src):
    """Names made by the ST_*(float, f32) / (double, f64) instantiation macros: name_##S -> name_f32, name_f64."""
    names = set()
    for body in re.findall(r"#define ST_\w+\(T, S\)(.*?)\n#undef", src, flags=re.S):
        for stem in re.findall(r"void\s+(?:__launch_bounds__\((?:[^()]|\([^()]*\))*\)[\s\\]*)?(\w+?)_##S\(", body):
            names |= {stem + "_f32", stem + "_f64"}
    return names


def _launcher_calls():
    calls = []
    for name in sorted(os.listdir(CUDA_DIR)):
        if name.endswith(".py"):
            with open(os.path.join(CUDA_DIR, name)) as f:
                text = f.read()
            calls += [(name, fam, kern, True) for _, fam, kern in CALL.findall(text)]
            calls += [(name, fam, kern, False) for fam, kern in PLAIN.findall(text)]
    return calls


def test_every_launched_kernel_exists_for_both_dtypes():
    calls = _launcher_calls()
    assert len(calls) >= 26, calls  # the launchers' literal kernel names
    for module, family, name, per_dtype in calls:
        have = _kernels(family)
        wanted = [f"{name}_f32", f"{name}_f64"] if per_dtype else [name]
        missing = [w for w in wanted if w not in have]
        assert not missing, f"{module} launches {missing} from {family}.cu, which defines {sorted(have)}"


@pytest.mark.parametrize("name", sorted(n for n in os.listdir(loader.KERNEL_DIR) if n.endswith(".cu")))
def test_cu_files_start_with_a_header_and_inline_their_includes(name):
    path = os.path.join(loader.KERNEL_DIR, name)
    with open(path) as f:
        first = f.readline()
    assert first.startswith(f"// {name}: "), first
    src = loader.read_source(path)
    assert '#include "' not in src and "block_sum" in src


@pytest.mark.parametrize("name", sorted(f[:-3] for f in os.listdir(loader.KERNEL_DIR) if f.endswith(".cu")))
def test_every_kernel_first_waits_for_its_predecessors(name):
    """graphs.PDL lets a captured kernel start before the one it depends on has finished: each must wait first
    (ST_GRID_WAIT, common.cuh), or it could read what that one has not yet written."""
    src = loader.read_source(os.path.join(loader.KERNEL_DIR, name + ".cu"))
    bodies = re.findall(r'extern "C" __global__ void[^{]*\{\s*(?:\\\s*)?(\w+)', src)
    assert bodies and bodies.count("ST_GRID_WAIT") == len(bodies) == src.count("__global__"), bodies


def test_each_kernel_file_instantiates_through_the_element_type_switch():
    """Every kernel file instantiates its typed kernels by ST_INSTANTIATE (common.cuh), so that the loader's module
    of one element type (family_source) has no kernel of the other: no (float, f32) / (double, f64) instantiation
    outside it. The loader asks for the float64 module for _f64 names only."""
    for name in sorted(os.listdir(loader.KERNEL_DIR)):
        if not name.endswith(".cu"):
            continue
        src = loader.read_source(os.path.join(loader.KERNEL_DIR, name))
        assert "ST_INSTANTIATE(" in src.split("#define ST_INSTANTIATE", 1)[1], name
        assert re.search(r"^\s*ST_\w+\((float, f32|double, f64)", src, re.M) is None, name
        assert loader.family_source(name[:-3], 1).startswith("#define ST_DTYPES 1\n"), name
    assert (loader.dtypes_of("adam_step_f64"), loader.dtypes_of("adam_step_f32"), loader.dtypes_of("set_hyper")) \
        == (2, 1, 1)

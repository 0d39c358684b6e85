"""CPU-side checks of the CUDA backend (no GPU needed): every kernel a launcher names exists in its .cu file for
float32 and float64, the .cu files carry their header comment, includes are inlined, the launchers import without
CuPy, and the NumPy Philox reference the dropout test relies on reproduces Random123's known-answer vectors."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import cuda_reference as ref
from smalltrain.backend.cuda import loader, ops

CUDA_DIR = os.path.dirname(loader.__file__)
CALL = re.compile(r'\b(launch|launch_rows|get)\(\s*"(\w+)",\s*"(\w+)"')
PLAIN = re.compile(r'\bkernel\(\s*"(\w+)",\s*"(\w+)"\)')


def _kernels(family):
    src = loader.read_source(loader.family_path(family))
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


def test_programmatic_launch_packs_arguments_as_cupy_does():
    import ctypes
    from smalltrain.backend.cuda import graphs

    class Array:   # a device array: its address is data.ptr
        data = type("Pointer", (), {"ptr": 0x7F0000001000})()

    args = (Array(), None, np.int32(-3), np.int64(1 << 40), np.uint64(0), np.float32(0.1), np.float64(0.1), 7, 2.5,
            True)
    values, params = graphs.pack_arguments(args, Array)
    assert [type(v) for v in values] == [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64,
                                         ctypes.c_uint64, ctypes.c_float, ctypes.c_double, ctypes.c_int64,
                                         ctypes.c_double, ctypes.c_bool]
    assert [v.value for v in values] == [0x7F0000001000, None, -3, 1 << 40, 0, np.float32(0.1), 0.1, 7, 2.5, True]
    assert [params[i] for i in range(len(values))] == [ctypes.addressof(v) for v in values]
    with pytest.raises(TypeError, match="expected device arrays.*got str"):
        graphs.pack_arguments(("x",), Array)


def test_launchers_import_without_cupy_and_are_documented():
    code = "import sys, smalltrain.backend.cuda.ops; assert 'cupy' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    for name in ops.__all__:
        assert getattr(ops, name).__doc__, f"{name} has no docstring"


@pytest.mark.parametrize("ctr, key, want", [
    ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    ([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
    ([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0],
     [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]),
])
def test_philox_reference_known_answers(ctr, key, want):
    out = ref.philox4x32_10([np.array([c], np.uint64) for c in ctr], [np.array([k], np.uint64) for k in key])
    assert [int(v[0]) for v in out] == want


def test_dropout_reference_mask_rate():
    mask = ref.dropout_mask(40001, 0.25, seed=3, offset=0)
    assert mask.dtype == np.uint8 and abs(1 - mask.mean() - 0.25) < 0.01
    assert not np.array_equal(mask, ref.dropout_mask(40001, 0.25, seed=3, offset=1))


def test_chain_rows_per_block(monkeypatch):
    """linear.chain_rows on 132 SMs, no GPU needed: the fewest rows per block that leave <= one block per SM, fewer
    where the two row buffers would not fit in 48 KiB of shared memory, None outside the chain kernels' limits."""
    from smalltrain.backend.cuda import linear
    monkeypatch.setattr(linear, "_sm_count", lambda: 132)
    lenet = (256, 120, 84, 10)
    assert [linear.chain_rows(m, lenet, 4) for m in (1, 64, 132, 133, 512, 1056, 5000)] == [1, 1, 1, 2, 4, 8, 8]
    assert linear.chain_rows(512, (1024, 64, 1024), 8) == 2    # 2 x 2 x 1024 x 8 bytes = 32 KiB; 4 rows: 64 KiB
    assert linear.chain_rows(64, (784, 256, 10), 4) == 1                 # the MLP
    assert linear.chain_rows(64, (256, 10), 4) is None                   # one layer: linear_act
    assert linear.chain_rows(64, (8,) * 6, 4) is None                    # five layers
    assert linear.chain_rows(64, (1025, 10, 10), 4) is None              # too wide
    assert linear.chain_rows(0, lenet, 4) is None
    assert linear.chain_rows(200_000, lenet, 4) is None                  # 25,000 blocks x 41,640 weights


def test_wide_layer_rule_and_chunks(monkeypatch):
    """linear._wide and wide_chunks on 132 SMs, no GPU needed: F <= WIDE_MAX_F; whole 256-column slices per chunk,
    as few chunks as give about 2 blocks per SM (chunks x row groups of 32 rows), every column in a chunk."""
    from smalltrain.backend.cuda import linear
    monkeypatch.setattr(linear, "_sm_count", lambda: 132)
    src = loader.read_source(os.path.join(loader.KERNEL_DIR, "linear.cu"))
    for name, value in (("ST_WF", linear.WIDE_MAX_F), ("ST_WROWS", linear._WIDE_ROWS), ("ST_WK", linear._WIDE_SLICE),
                        ("ST_WBC", linear._WIDE_COLS), ("ST_WTHREADS", linear._THREADS)):
        assert f"#define {name} {value}\n" in src, name
    assert linear._wide(64, 18432, 10) and linear._wide(1, 1, 16)
    assert not linear._wide(64, 18432, 17) and not linear._wide(0, 10, 10) and not linear._wide(64, 0, 10)
    assert not linear._wide(32 * 65535 + 1, 10, 10)                      # row groups past the grid's y limit
    assert not linear._wide(2 ** 16, 2 ** 15, 10)                        # x's indices past 32 bits
    assert linear.wide_chunks(64, 18432) == (72, 256)                    # 2 row groups x 72 chunks: 144 blocks
    assert linear.wide_chunks(512, 18432) == (15, 1280)                  # 16 groups: 17 wanted, 5 slices each
    assert linear.wide_chunks(64, 100) == (1, 256)
    assert linear.wide_chunks(100_000, 18432) == (1, 18432)              # 3,125 groups fill the GPU alone
    for m, k in ((64, 18432), (512, 18432), (70, 1000), (600, 5000), (3, 63)):
        chunks, kchunk = linear.wide_chunks(m, k)
        assert kchunk % 256 == 0 and (chunks - 1) * kchunk < k <= chunks * kchunk, (m, k)


def test_pool_tiles_exactly():
    """pool._tiles_exactly, the tiled max_pool2d_backward_act's rule (no GPU needed): kernel == stride, no padding
    or dilation, every input row and column in a window, 32-bit indices."""
    from smalltrain.backend.cuda import pool
    assert pool._tiles_exactly((64, 6, 24, 24), (2, 2), (2, 2), (0, 0), (1, 1), (12, 12))     # LeNet-5's
    assert pool._tiles_exactly((2, 3, 9, 12), (3, 3), (3, 3), (0, 0), (1, 1), (3, 4))
    assert not pool._tiles_exactly((2, 3, 9, 10), (2, 2), (2, 2), (0, 0), (1, 1), (4, 5))      # a row left over
    assert not pool._tiles_exactly((2, 3, 8, 8), (3, 3), (2, 2), (1, 1), (1, 1), (4, 4))       # overlapping
    assert not pool._tiles_exactly((2, 3, 8, 8), (2, 2), (2, 2), (0, 0), (2, 2), (2, 2))       # dilated
    assert not pool._tiles_exactly((2 ** 16, 64, 32, 32), (2, 2), (2, 2), (0, 0), (1, 1), (16, 16))   # 2^32 inputs


def test_every_chain_variant_is_instantiated():
    from smalltrain.backend.cuda import linear
    src = loader.read_source(os.path.join(loader.KERNEL_DIR, "linear.cu"))
    assert f"#define ST_CMAX {linear.CHAIN_MAX_LAYERS}" in src and f"#define ST_CTHREADS {linear._CHAIN_THREADS}" in src
    chains = " ".join(f"ST_CHAIN(T, S, {r})" for r in linear._CHAIN_ROWS)
    assert f"#define ST_CHAINS(T, S) {chains}\nST_INSTANTIATE(ST_CHAINS)" in src


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


def test_chain_backward_staging_choice(monkeypatch):
    """chain_bwd_staged where the row buffers and the weights it reads (each from a 16-byte boundary, the first
    layer's only for dx) fit the opt-in shared memory (H200: 232,448 bytes), else chain_bwd_rows in its 48 KiB."""
    from smalltrain.backend.cuda import linear
    lenet, h200 = (256, 120, 84, 10), 232_448
    weights = 256 * 120 + 120 * 84 + 84 * 10
    assert linear._chain_staged_smem(4, lenet, 4, True) == (2 * 4 * 256 + weights) * 4
    assert linear._chain_staged_smem(4, lenet, 4, False) == (2 * 4 * 256 + weights - 256 * 120) * 4
    # row buffers of 2 x 13 floats, then layers 3, 2, 1, 0 (39, 143, 99, 63 floats) from multiples of 4
    assert linear._chain_staged_smem(1, (7, 9, 11, 13, 3), 4, True) == (28 + 40 + 144 + 100 + 63) * 4
    assert linear._chain_bwd_kernel(4, lenet, 4, True, h200) == ("chain_bwd_staged_r4", 174_752)
    assert linear._chain_bwd_kernel(1, lenet, 4, True, h200) == ("chain_bwd_staged_r1", 168_608)
    assert linear._chain_bwd_kernel(4, lenet, 8, True, h200) == ("chain_bwd_rows_r4", 16_384)   # 341 KiB
    assert linear._chain_bwd_kernel(4, lenet, 4, True, 48 * 1024) == ("chain_bwd_rows_r4", 8_192)
    monkeypatch.setattr(linear, "CHAIN_STAGE", False)
    assert linear._chain_bwd_kernel(1, lenet, 4, True, h200) == ("chain_bwd_rows_r1", 2_048)

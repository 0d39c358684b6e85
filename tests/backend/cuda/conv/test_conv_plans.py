"""The convolution's launch plans and choices on the CPU (no GPU needed): each room's plan on an H200's / H100's 132
SMs (tile.py, wgrad.py, direct.py, igemm.py, fused.py), the kernels each plan names compiled in its kernels/conv/*.cu
file, and the tuning table's overrides reaching the cached plans."""
import os
import re
from types import SimpleNamespace

import numpy as np
import pytest

from smalltrain.backend.cuda import conv, loader
from smalltrain.backend.cuda.conv import direct, fused, igemm, tile, wgrad
from smalltrain.backend.cuda.tuning import override

CONV_DIR = os.path.dirname(conv.__file__)


@pytest.fixture
def sms132(monkeypatch):
    """An H200's (and H100 SXM's) 132 SMs for every room's plans."""
    for room in (direct, igemm, tile, fused, wgrad):
        monkeypatch.setattr(room, "sm_count", lambda: 132)


def _source(family):
    return loader.read_source(loader.family_path(family))


def _defined(family):
    """The kernel names kernels/<family>.cu instantiates for float32 (its ST_DTYPES 1 module, preprocessed names
    found by their stems: NAME##..._##S)."""
    return set(re.findall(r"\b(\w+)_##S\(", _source(family)))


def test_every_literal_kernel_a_room_launches_is_in_its_file():
    """get(FAMILY, "name") / launch(FAMILY, "name") in the rooms: the kernel is instantiated in that FAMILY's file
    (the names built from a plan are checked by the instantiation tests below)."""
    calls = 0
    for name in sorted(os.listdir(CONV_DIR)):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(CONV_DIR, name)) as f:
            text = f.read()
        family = re.search(r'^FAMILY = "([\w/]+)"', text, flags=re.M)
        for fam, kern in re.findall(r'\b(?:get|launch)\((FAMILY|"[\w/]+"), "(\w+)"', text):
            fam = family.group(1) if fam == "FAMILY" else fam.strip('"')
            assert os.path.exists(loader.family_path(fam)), (name, fam)
            assert f"{kern}_##S(" in _source(fam), (name, fam, kern)
            calls += 1
    assert calls >= 7, calls   # im2col, col2im, bias_act_fwd / _bwd / _bwd_rows, wgrad_reduce, tile_arrange


def test_each_conv_kernel_file_has_a_header_and_is_its_own_family():
    """Every kernels/conv/*.cu starts with a comment naming itself, inlines its includes, and instantiates through
    the element-type switch; tile_arranged.cu has only the arranged instances and tile_arrange, tile.cu none of
    them."""
    kdir = os.path.join(loader.KERNEL_DIR, "conv")
    names = sorted(n for n in os.listdir(kdir) if n.endswith(".cu"))
    assert names == ["direct.cu", "epilogue.cu", "igemm.cu", "im2col.cu", "tile.cu", "tile_arranged.cu",
                     "tile_wgrad.cu"]
    for name in names:
        src = _source("conv/" + name[:-3])
        assert src.startswith(f"// conv/{name}:"), name
        assert "#include" not in src and "ST_INSTANTIATE(" in src, name
        assert loader.family_source("conv/" + name[:-3], 1).startswith("#define ST_DTYPES 1\n// conv/"), name
    plain, arranged = _source("conv/tile"), _source("conv/tile_arranged")
    assert "#define SUFFIX\n" in plain and "tile_arrange_##S" not in plain
    assert "#define SUFFIX _arr\n" in arranged and "tile_arrange_##S" in arranged


def test_every_direct_convolution_variant_is_instantiated():
    src = _source("conv/direct")
    assert "wgrad_partial_r##R##_##S(" in src
    for r in direct._WGRAD_R:   # wgrad_partial_r{R}, by the outputs per thread it needs
        assert f"ST_WGRAD(T, S, {r})" in src, r
    assert direct._WGRAD_THREADS * direct._WGRAD_R[-1] >= 8192   # what direct_wgrad_ok admits: o * (k + 1)
    for ob in direct._DIRECT_OB:   # direct_fwd_ob{OB} and direct_dx_cb{CB}, by _direct_ob
        assert f"ST_DIRECT(T, S, {ob})" in src and f"ST_DIRECT_DX(T, S, {ob})" in src, ob


def test_every_tile_conv_variant_is_instantiated():
    common, wsrc = _source("conv/tile"), _source("conv/tile_wgrad")
    assert f"#define ST_TW {tile.TILE_TW}\n" in common and f"#define ST_LF {tile.LINEAR_MAX_F}\n" in common
    assert f"#define ST_UPW_SLICES {fused._UNPOOL_WGRAD_SLICES}\n" in common
    assert f"#define ST_TILE_WG_THREADS {conv.CONV.tile_wg_threads}\n" in wsrc
    for ks in tile._TILE_KS:
        for to in (4, 8):
            assert f"ST_TILE(T, S, {ks}, {to})" in common and f"ST_TILE_WGRAD(T, S, {ks}, {to})" in wsrc, (ks, to)
        assert f"ST_POOLED_WGRAD(T, S, {ks})" in wsrc
    assert "ST_TILE(T, S, 5, 6)" in common


def test_every_implicit_gemm_variant_is_instantiated():
    src = _source("conv/igemm")
    assert f"#define ST_IGKMAX {conv.CONV.igemm_max_k}\n" in src
    assert f"#define ST_IGTHREADS {igemm._IGEMM_THREADS}\n" in src
    for bo, bq in igemm._IGEMM_BQ.items():   # BQ = 4 positions x 256 / (BO / 4) threads
        assert f"ST_IGEMM(T, S, {bo})" in src and bq == 4 * 256 // (bo // 4), bo
    for t in igemm._WG_TILES:
        assert "ST_IGEMM_WGRAD(T, S, {}, {}, {}, {})".format(*t) in src, t
    assert f"#define ST_WGQ {igemm._WGQ}\n" in src


def test_direct_forward_splits_channels_only_where_a_launch_is_underfilled(sms132):
    """_direct_grid's split rule: LeNet-5's second layer at batch 64 (8,192 two-channel items x 4 = 32k threads,
    < 8 warps per SM) sums its 6 input channels over 4 threads; at batch 512 (filled) and for the input gradient
    (no split asked) one thread per item; the split is a power of two no larger than the channel count; without
    room for the partial sums in shared memory, no split."""
    weights, image = 150 * 16 * 4, 6 * 12 * 12 * 4
    grid, parts, splits, smem = direct._direct_grid(64, 8 * 64, weights, image, (6, 2, 4))
    assert (splits, smem) == (4, weights + image + 256 * 2 * 4)
    assert parts == 8 and grid == 64 * 8   # 512 items over 64 threads per item group and block
    assert direct._direct_grid(512, 2 * 64, weights, image, (6, 8, 4))[2] == 1
    assert direct._direct_grid(64, 8 * 64, weights, image)[2] == 1
    assert direct._direct_grid(4, 100, weights, image, (3, 8, 4))[2] == 2
    assert direct._direct_grid(4, 100, weights, image, (1, 8, 4))[2] == 1
    assert direct._direct_grid(4, 100, 40 * 1024, 7 * 1024, (6, 8, 4))[2] == 1   # 47 KiB + 8 KiB partial sums


def test_input_gradient_gathers_only_where_it_fills_the_gpu(sms132):
    """_direct_dx_cb: LeNet-5's second layer at batch 64 (27,648 threads of 2 channels) goes to cuBLAS + col2im,
    at batch 512 (73,728 threads of 8) and MnistCnn's second layer at batch 64 (86,528) to the gather kernel;
    groups > 1 never."""
    assert direct._direct_dx_cb((64, 6, 12, 12), (16, 6, 5, 5), 1, 4) is None
    assert direct._direct_dx_cb((512, 6, 12, 12), (16, 6, 5, 5), 1, 4) == 8
    assert direct._direct_dx_cb((64, 16, 26, 26), (32, 16, 3, 3), 1, 4) == 8
    assert direct._direct_dx_cb((512, 6, 12, 12), (16, 3, 5, 5), 2, 4) is None
    with override(conv.CONV, direct_dx_min_threads_per_sm=0):
        assert direct._direct_dx_cb((64, 6, 12, 12), (16, 6, 5, 5), 1, 4) == 2


def test_into_wgrad_choice(monkeypatch):
    """_into_wgrad (NumPy for the partial rows): tile_conv_wgrad takes a one-channel producer with the same kernel
    size and tile_conv's geometry that needs its weight gradient and kept x and did not pool in its epilogue, and
    where the epilogue's sums fit in the default shared memory."""
    monkeypatch.setattr(fused, "cupy", lambda: np)

    def producer(**over):
        p = SimpleNamespace(x=np.zeros((64, 1, 28, 28), np.float32), x_shape=(64, 1, 28, 28),
                            weight=SimpleNamespace(shape=(16, 1, 3, 3)), stride=(1, 1), dilation=(1, 1), groups=1,
                            pads=(0, 0, 0, 0), needs=(False, True, True), pool=None)
        p.__dict__.update(over)
        return p
    plan = (4, 5, 280, 384, 47104, 2)   # MnistCnn's second layer's dx at batch 64: 140 threads of split 0
    args = fused._into_wgrad(plan, producer(), 3, np.dtype(np.float32))
    assert args[1:5] == (28, 28, 0, 0) and args[5].shape == (384, 16 * 10)
    assert fused._wgrad_epilogue_smem(plan, 3, 4) == 4 * 10 * 140 * 4
    for over in ({"needs": (False, False, True)}, {"x": None}, {"x_shape": (64, 2, 28, 28)},
                 {"weight": SimpleNamespace(shape=(16, 1, 5, 5))}, {"stride": (2, 2)}, {"groups": 2},
                 {"pool": (np.zeros((64, 16, 13, 13), np.int64),)}):
        assert fused._into_wgrad(plan, producer(**over), 3, np.dtype(np.float32)) is None, over
    assert fused._into_wgrad(plan, producer(), 3, np.dtype(np.float64)) is not None   # 44.8 KB of sums
    assert fused._into_wgrad((8, 5, 560, 384, 47104, 2), producer(), 3, np.dtype(np.float32)) is None   # 89.6 KB


def test_pooled_producer_choice(monkeypatch):
    """A convolution that pooled in its epilogue takes its g from the next convolution (into_ok) or from the linear
    chain reading its output flattened (linear.chain_into_pooled_ok) only where its pooled output's shape is the
    consumer's input, of one dtype and with its pre-activation kept."""
    from smalltrain.backend.cuda import linear_chain as linear
    from smalltrain.backend.cuda.linear_chain import CHAIN

    def producer(**over):   # LeNet-5's second layer at batch 64: [64, 16, 8, 8] pooled to [64, 16, 4, 4]
        p = SimpleNamespace(x_shape=(64, 6, 12, 12), weight=SimpleNamespace(shape=(16, 6, 5, 5), dtype=np.float32),
                            out_hw=(8, 8), activation="gelu", y=object(),
                            pool=(SimpleNamespace(shape=(64, 16, 4, 4)),))
        p.__dict__.update(over)
        return p
    consumer = SimpleNamespace(x_shape=(64, 16, 4, 4))
    head = [np.zeros((120, 256), np.float32), np.zeros((84, 120), np.float32), np.zeros((10, 84), np.float32)]
    chain = SimpleNamespace(x=np.zeros((64, 256), np.float32), weights=head)
    f32 = np.dtype(np.float32)
    monkeypatch.setattr(linear, "_sm_count", lambda: 132)   # (chain_rows)
    assert fused.into_ok(consumer, producer(), f32) and linear.chain_into_pooled_ok(chain, producer())
    assert fused.into_ok(consumer, producer(activation=None, y=None), f32)
    for over in ({"y": None}, {"pool": (SimpleNamespace(shape=(64, 16, 4, 2)),)},
                 {"weight": SimpleNamespace(shape=(16, 6, 5, 5), dtype=np.float64)}):
        assert not fused.into_ok(consumer, producer(**over), f32), over
        assert not linear.chain_into_pooled_ok(chain, producer(**over)), over
    assert fused.into_ok(SimpleNamespace(x_shape=(64, 16, 8, 8)), producer(pool=None), f32)   # not pooled
    assert not linear.chain_into_pooled_ok(SimpleNamespace(x=np.zeros((64, 1024), np.float32), weights=head),
                                           producer(pool=None))
    # batch 512: 4 rows per block in the chain's backward, over CHAIN_INTO_POOLED_MAX_ROWS (1) unless raised
    chain512 = SimpleNamespace(x=np.zeros((512, 256), np.float32), weights=head)
    producer512 = producer(x_shape=(512, 6, 12, 12), pool=(SimpleNamespace(shape=(512, 16, 4, 4)),))
    assert linear.chain_rows(512, [256, 120, 84, 10], 4) == 4
    assert not linear.chain_into_pooled_ok(chain512, producer512)
    with override(CHAIN, into_pooled_max_rows=4):
        assert linear.chain_into_pooled_ok(chain512, producer512)


def test_unpool_wgrad_takes_a_pooled_first_layer_of_one_input_channel(monkeypatch):
    """tile_conv_unpool_wgrad's epilogue takes the weight gradient of a producer that pooled (whose maxima
    pooled_wgrad would read) with one input channel and the consumer's kernel size, where its shared memory fits
    the device's limit once the kernel opts in: the maxima's indices and the producer's x under the block's rows
    prefetched before the plan's tiles, then over the tiles the g and the maxima's offsets of the block's windows,
    the sums of up to 16 slices of a channel's windows, a NaN flag per (channel, tap). LeNet-5 b512's plan: 12 rows
    of 12 windows, 6 channels."""
    monkeypatch.setattr(fused, "cupy", lambda: np)
    first = SimpleNamespace(x=np.zeros((512, 1, 28, 28), np.float32), x_shape=(512, 1, 28, 28),
                            weight=SimpleNamespace(shape=(6, 1, 5, 5)), pads=(0, 0, 0, 0))
    plan = (4, 12, 216, 512, 29184, 3)
    prefetch = 6 * 12 * 12 * 8 + 28 * 28 * 4   # (a multiple of 16)
    assert fused._unpool_wgrad_smem(plan, 6, 12, 5, 4) == prefetch + 29184   # the tiles' the larger
    epilogue = (6 * 12 * 12 + 6 * 16 * 26) * 4 + 6 * 12 * 12 * 4 + 6 * 25   # 216 threads: 16 slices
    assert fused._unpool_wgrad_smem(plan[:4] + (0, 3), 6, 12, 5, 4) == prefetch + epilogue
    assert fused._unpool_wgrad_smem((4, 12, 24, 512, 0, 1), 6, 12, 5, 4) == prefetch + epilogue - 6 * 12 * 26 * 4
    # one row of 11 windows, 3 channels: the prefetch rounded up to 16 bytes (the tiles' 16-byte copies aligned)
    assert fused._unpool_wgrad_smem((4, 1, 24, 512, 0, 1), 3, 11, 5, 4) == 3 * 11 * 8 + 6 * 26 * 4 + 8 + (
        (3 * 11 + 3 * 8 * 26) * 4 + 3 * 11 * 4 + 3 * 25)
    f32, f64 = np.dtype(np.float32), np.dtype(np.float64)
    for optin in (48 * 1024, 227 * 1024):   # the default, and the H100's and H200's once a kernel opts in
        monkeypatch.setattr(fused, "smem_optin_bytes", lambda: optin)
        args, smem = fused._unpool_wgrad(plan, first, 5, f32, 12)
        assert args[1:5] == (28, 28, 0, 0) and args[5].shape == (512, 6 * 26) and smem == prefetch + 29184
    monkeypatch.setattr(fused, "smem_optin_bytes", lambda: 227 * 1024)
    assert fused._unpool_wgrad(plan, first, 5, f64, 12) is not None
    assert fused._unpool_wgrad(plan, first, 3, f32, 12) is None   # another kernel size than the consumer's
    two = SimpleNamespace(x=None, x_shape=(512, 2, 28, 28), weight=SimpleNamespace(shape=(6, 2, 5, 5)),
                          pads=(0, 0, 0, 0))
    assert fused._unpool_wgrad(plan, two, 5, f32, 12) is None      # two input channels: pooled_wgrad
    assert fused._unpool_wgrad(plan, first, 5, f32, 40) is not None   # 12 rows of 40 windows: ~64 KB, opted in
    monkeypatch.setattr(fused, "smem_optin_bytes", lambda: 48 * 1024)
    assert fused._unpool_wgrad(plan, first, 5, f32, 40) is None
    monkeypatch.setattr(fused, "smem_optin_bytes", lambda: 227 * 1024)
    assert fused._unpool_wgrad((4, 40, 216, 512, 29184, 3), first, 5, f32, 120) is None   # ~540 KB


def test_pooled_wgrad_plan(sms132):
    """pooled_wgrad takes a convolution (tile_conv's geometry) that pooled in its epilogue where it needs no input
    gradient (a first layer): threads a multiple of its channels, about two blocks per SM, the staged images, one
    input channel's sums and the NaN flags within the default shared memory; conv2d_backward takes g None only with
    the partial rows and no input gradient."""
    def producer(n=512, **over):   # LeNet-5's first layer
        p = SimpleNamespace(x=object(), x_shape=(n, 1, 28, 28), weight=SimpleNamespace(shape=(6, 1, 5, 5)),
                            stride=(1, 1), dilation=(1, 1), groups=1, needs=(False, True, True),
                            pool=(np.zeros((n, 6, 12, 12), np.int64),))
        p.__dict__.update(over)
        return p
    f32, f64 = np.dtype(np.float32), np.dtype(np.float64)
    # the staged images, one input channel's sums per thread, a NaN flag per (channel, input channel, tap)
    assert fused._pooled_wgrad_plan(producer(), f32) == (252, 2, 256, (2 * 784 + 252 * 26) * 4 + 6 * 25)
    assert fused._pooled_wgrad_plan(producer(64), f32) == (252, 1, 64, (784 + 252 * 26) * 4 + 150)
    assert fused._pooled_wgrad_plan(producer(64), f64) == (126, 1, 64, (784 + 126 * 26) * 8 + 150)
    # LeNet-5's second layer's shapes as a first layer (six input channels), then as the second (its input gradient)
    six = producer(x_shape=(512, 6, 12, 12), weight=SimpleNamespace(shape=(16, 6, 5, 5)),
                   pool=(np.zeros((512, 16, 4, 4), np.int64),))
    assert fused._pooled_wgrad_plan(six, f32) == (256, 2, 256, (2 * 864 + 256 * 26) * 4 + 16 * 150)
    six.needs = (True,) * 3
    assert fused._pooled_wgrad_plan(six, f32) is None
    for over in ({"pool": None}, {"needs": (True, True, True)}, {"needs": (False, False, True)}, {"x": None},
                 {"stride": (2, 2)}, {"weight": SimpleNamespace(shape=(300, 1, 5, 5))}):
        assert fused._pooled_wgrad_plan(producer(**over), f32) is None, over
    big = producer(2, x_shape=(2, 1, 120, 120))   # one image's 57.6 KB staged: over the default 48 KiB
    assert fused._pooled_wgrad_plan(big, f32) is None
    saved = SimpleNamespace(x_shape=(2, 1, 28, 28), weight=np.zeros((6, 1, 5, 5), np.float32), out_hw=(24, 24),
                            groups=1, needs=(True, True, True))
    with pytest.raises(RuntimeError, match="g may be None only with wpartial and no input gradient"):
        conv.conv2d_backward(None, saved, g=None, wpartial=np.zeros((4, 156), np.float32))


def _wgrad_plan(x_shape, w_shape, out_hw, itemsize=4, **geometry):
    saved = SimpleNamespace(x_shape=x_shape, weight=SimpleNamespace(shape=w_shape), out_hw=out_hw,
                            stride=(1, 1), dilation=(1, 1), groups=1, pads=(0, 0, 0, 0))
    saved.__dict__.update(geometry)
    return wgrad.tile_wgrad_plan(saved, itemsize)


def test_tile_wgrad_plans(sms132):
    """tile_wgrad_plan: (channels per thread, rows per tile, row groups, threads, blocks, shared bytes, bias
    threads). MnistCnn's second layer at batch 64: 8 channels a thread, 4-row tiles (two buffers of 23 KB), the 384
    tiles one per block (up to 4 blocks per SM), no bias threads (192 threads, 6 warps, not 4 x 49 = 196, 7 warps);
    at batch 512 the 3,072 tiles 6 per block. LeNet-5's first layer: whole images, the rows over 12 groups, no bias
    threads (120, not 144); its second at b64 keeps them (240 or 248: 8 warps either way)."""
    assert _wgrad_plan((64, 16, 26, 26), (32, 16, 3, 3), (24, 24)) == (
        8, 4, 1, 192, 384, 2 * (32 * 4 * 24 + 16 * 6 * 28) * 4, 0)
    assert _wgrad_plan((512, 16, 26, 26), (32, 16, 3, 3), (24, 24))[4] == 512
    assert _wgrad_plan((512, 1, 28, 28), (6, 1, 5, 5), (24, 24))[:5] == (4, 24, 12, 120, 512)
    assert _wgrad_plan((512, 1, 28, 28), (6, 1, 5, 5), (24, 24))[6] == 0
    assert _wgrad_plan((64, 6, 12, 12), (16, 6, 5, 5), (8, 8))[3::3] == (248, 1)
    for geometry in ({"stride": (2, 2)}, {"dilation": (2, 2)}, {"groups": 2}):
        assert _wgrad_plan((4, 16, 26, 26), (32, 16, 3, 3), (24, 24), **geometry) is None, geometry
    assert _wgrad_plan((4, 16, 26, 26), (32, 16, 7, 7), (20, 20)) is None        # not compiled
    assert _wgrad_plan((4, 64, 26, 26), (32, 64, 3, 3), (24, 24)) is None        # 4 x 193 threads
    with override(conv.CONV, tile_wg_threads=0):   # (how tests leave a convolution to the other dw kernels)
        assert _wgrad_plan((64, 16, 26, 26), (32, 16, 3, 3), (24, 24)) is None


def test_tile_conv_plans(sms132):
    """tile_plan: (channels per thread, rows per block, threads, blocks, shared bytes, channel splits)."""
    # MnistCnn's second layer at batch 64: 4 channels x 4 columns per thread (8 would leave 279 threads per SM), 48
    # threads a row; 4 rows a block (6 full warps, 2.9 blocks per SM) rather than 5 (7.5 warps, a partial last
    # tile) or 2 (as many halo rows staged as output rows)
    to, th, threads, blocks, smem, cs = tile.tile_plan(64, 16, (26, 26), 32, (24, 24), 3, 4)
    assert (to, th, threads, blocks, cs) == (4, 4, 192, 384, 1) and smem == (144 * 32 + 16 * 6 * 28) * 4
    # channel splits where the grid leaves the SMs few threads: its input gradient (no row count within a block's
    # 256 threads gives tile_min_threads = 256, so the rows that waste the least: 4 of 26 a block, 448 blocks of 112
    # threads, 380 per SM) in 2 groups of 16 channels, within 1024 threads per SM; the forward (558) stays whole
    assert conv.CONV.tile_split_threads_per_sm == 1024 and conv.CONV.tile_min_threads == 256
    assert tile.tile_plan(64, 32, (24, 24), 16, (26, 26), 3, 4)[1:] == (4, 224, 448, (288 * 16 + 32 * 6 * 32) * 4, 2)
    assert tile.tile_plan(64, 16, (26, 26), 32, (24, 24), 3, 4)[5] == 1
    with override(conv.CONV, tile_splits=3):   # forced: 3 groups of 10, 11, 11 channels; their sums in smem
        assert tile.tile_plan(64, 32, (24, 24), 16, (26, 26), 3, 4)[4:] == ((288 * 16 + 32 * 6 * 32) * 4, 3)
    with override(conv.CONV, tile_split_threads_per_sm=0, tile_to8_threads_per_sm=256):
        # 8 channels a thread: 24 threads a row, 8 rows (the fewest with 128 threads that divide the 24 rows evenly)
        assert tile.tile_plan(64, 16, (26, 26), 32, (24, 24), 3, 4)[:4] == (8, 8, 192, 192)
    # LeNet-5's first layer at batch 512 with 4 channels a thread: 2 blocks per image, 13 + 11 rows of 12 threads
    # (24 rows would be 288)
    with override(conv.CONV, tile_to6_threads_per_sm=1 << 30, tile_split_threads_per_sm=0):
        assert tile.tile_plan(512, 1, (28, 28), 6, (24, 24), 5, 4)[:4] == (4, 13, 156, 1024)
    # 6 channels a thread where 4 or 8 leave dead ones and KS = 5, their weights in 8 slots a tap: the same layer as
    # one block of 24 rows per image (144 threads); the second layer's input gradient in 7 channel splits of 36
    # threads; 12 channels where 8 a thread was planned (4 dead), not 16 (6 does not divide them), not 3x3
    with override(conv.CONV, tile_to6_threads_per_sm=0):
        assert tile.tile_plan(512, 1, (28, 28), 6, (24, 24), 5, 4) == (6, 24, 144, 512, (25 * 8 + 28 * 28) * 4, 1)
        dx = tile.tile_plan(512, 16, (8, 8), 6, (12, 12), 5, 4)
        assert dx[:4] + dx[5:] == (6, 12, 252, 512, 7)
        assert tile.tile_plan(512, 1, (28, 28), 12, (24, 24), 5, 4)[0] == 6
        assert tile.tile_plan(512, 1, (28, 28), 16, (24, 24), 5, 4)[0] == 8
        assert tile.tile_plan(512, 1, (26, 26), 6, (24, 24), 3, 4)[0] == 4
    # the default, 512 threads per SM: LeNet-5's first layer at batch 512 (558) takes 6, the second layer's input
    # gradient (140) and the first layer at batch 64 (70) keep 4
    assert conv.CONV.tile_to6_threads_per_sm == 512
    assert tile.tile_plan(512, 1, (28, 28), 6, (24, 24), 5, 4)[0] == 6
    assert tile.tile_plan(512, 16, (8, 8), 6, (12, 12), 5, 4)[0] == 4
    assert tile.tile_plan(64, 1, (28, 28), 6, (24, 24), 5, 4)[0] == 4
    # every plan keeps its blocks within 1024 threads and 48 KB, and covers the rows
    with override(conv.CONV, tile_to6_threads_per_sm=1 << 30, tile_split_threads_per_sm=0):
        for n, c, o, hw, ks in [(1, 1, 1, (1, 1), 3), (64, 6, 16, (8, 8), 5), (7, 64, 64, (40, 40), 3),
                                (2, 3, 200, (30, 90), 5)]:
            plan = tile.tile_plan(n, c, (hw[0] + ks - 1, hw[1] + ks - 1), o, hw, ks, 8)
            if plan is not None:
                to, th, threads, blocks, smem, cs = plan
                assert cs == 1 and threads <= 1024 and smem <= 48 * 1024 and blocks * th >= n * hw[0]
                assert blocks % n == 0
    assert tile.tile_plan(64, 16, (26, 26), 32, (24, 24), 7, 4) is None   # not compiled
    # the forward's geometry and taps: stride, dilation, groups, a non-square or uncompiled kernel, under tile_min_k
    x, w = (64, 16, 26, 26), (32, 16, 3, 3)
    assert tile.tile_forward_plan(x, w, (24, 24), (1, 1), (0,) * 4, (1, 1), 1, 4) is not None
    for stride, dilation, groups, w_shape in [((2, 2), (1, 1), 1, w), ((1, 1), (2, 1), 1, w), ((1, 1), (1, 1), 2, w),
                                              ((1, 1), (1, 1), 1, (32, 16, 3, 5)), ((1, 1), (1, 1), 1, (32, 16, 7, 7)),
                                              ((1, 1), (1, 1), 1, (32, 1, 3, 3))]:
        assert tile.tile_forward_plan(x, w_shape, (24, 24), stride, (0,) * 4, dilation, groups, 4) is None


def test_weight_gradient_tile_rule():
    """wgrad_tile: the first tile at least half used, else the least padded one, and how much of it the outputs
    use, for MnistCnn's layers (O=32, K+1=145; O=16, K+1=10) and LeNet-5's (O=16, K+1=151; O=6, K+1=26)."""
    assert igemm.wgrad_tile(32, 145) == ((32, 64, 4, 4), 32 * 145 / (32 * 192))
    assert igemm.wgrad_tile(16, 10) == ((8, 32, 2, 2), 160 / (16 * 32))
    assert igemm.wgrad_tile(16, 151) == ((16, 128, 4, 4), 16 * 151 / (16 * 256))
    assert igemm.wgrad_tile(6, 26) == ((8, 32, 2, 2), 156 / (8 * 32))


def test_weight_gradient_splits(sms132):
    """_wgrad_splits: MnistCnn's second layer at batch 64 (3 tiles of 128 threads) gets 352 splits for ~1024
    threads per SM; few positions give at least 4 slices of 16 per split; a layer whose partial rows would pass
    32-bit indices gets fewer."""
    assert igemm._wgrad_splits(32, 145, 64 * 24 * 24, 3, 128) == -(-1024 * 132 // (3 * 128))
    assert igemm._wgrad_splits(6, 26, 100, 1, 64) == 2            # 7 slices of 16, at least 4 per split
    assert igemm._wgrad_splits(6, 26, 1, 1, 64) == 1
    assert igemm._wgrad_splits(4096, 4097, 1 << 24, 1, 128) == (2 ** 30 - 1) // (4096 * 4097)


def test_weights_are_arranged_where_the_copies_saved_over_an_sm_pay_for_the_launch():
    """_tile_arranges on 132 SMs, with the elements, threads and blocks of the models' plans
    (benchmarks/launch_plans.py): LeNet-5's second layer, 2400 elements staged by 192-thread blocks, is not arranged
    at b64 (64 blocks, one an SM: 12.5 copies) and is at b512 (512 blocks, four an SM: 50); MnistCnn's second layer
    (4608 elements) is for its forward (384 blocks of 192) and its input gradient (448 of 224)."""
    assert conv.CONV.tile_arrange_min_copies == 16
    assert not tile._tile_arranges(2400, 192, 64, 132)
    assert tile._tile_arranges(2400, 192, 512, 132)
    assert tile._tile_arranges(4608, 192, 384, 132) and tile._tile_arranges(4608, 224, 448, 132)
    assert tile._tile_arranges(16 * 192, 192, 132, 132) and not tile._tile_arranges(16 * 192 - 1, 192, 132, 132)
    assert tile._tile_arranges(8 * 192, 192, 133, 132)   # (133 blocks: two an SM on one of them)


def test_tile_linear_epilogue_choice(monkeypatch):
    """tile_linear_ok (the counters stubbed): tile_conv_lin takes the linear layer after MnistCnn's second
    convolution (10 outputs, 192-thread blocks) and declines more than LINEAR_MAX_F outputs, blocks of partial
    warps, more images than counters and counters not made yet (a capture in progress)."""
    made = []
    monkeypatch.setattr(fused, "device_counters", lambda name, size: made.append((name, size)) or "counters")
    plan = (4, 4, 192, 384, 29184, 1)
    lw = SimpleNamespace(shape=(10, 18432))
    assert fused.tile_linear_ok(plan, 64, lw) == "counters"
    assert made == [("tile_conv_lin", fused._LINEAR_IMAGES)]
    assert fused.tile_linear_ok(plan, 64, SimpleNamespace(shape=(tile.LINEAR_MAX_F, 18432))) == "counters"
    assert fused.tile_linear_ok(plan, 64, SimpleNamespace(shape=(tile.LINEAR_MAX_F + 1, 18432))) is None
    assert fused.tile_linear_ok((4, 1, 48, 1536, 8000, 1), 64, lw) is None             # 48-thread blocks
    assert fused.tile_linear_ok(plan, fused._LINEAR_IMAGES + 1, lw) is None
    monkeypatch.setattr(fused, "device_counters", lambda name, size: None)
    assert fused.tile_linear_ok(plan, 64, lw) is None


def test_tile_pool_epilogue_choice(sms132):
    """tile_pool_ok: 2x2 windows at stride 2 without padding or dilation over an output of even rows and columns
    (LeNet-5's 24 x 24 and 8 x 8); the plan for it has an even number of rows per block (LeNet-5's first layer:
    12, where the plain plan takes 13)."""
    pool = ((2, 2), (2, 2), (0, 0), (1, 1))
    assert fused.tile_pool_ok(pool, (24, 24)) and fused.tile_pool_ok(pool, (8, 8))
    assert not fused.tile_pool_ok(pool, (9, 8)) and not fused.tile_pool_ok(pool, (8, 9))
    assert not fused.tile_pool_ok(((3, 3), (3, 3), (0, 0), (1, 1)), (24, 24))
    assert not fused.tile_pool_ok(((2, 2), (1, 1), (0, 0), (1, 1)), (24, 24))
    assert not fused.tile_pool_ok(((2, 2), (2, 2), (1, 1), (1, 1)), (24, 24))
    assert not fused.tile_pool_ok(((2, 2), (2, 2), (0, 0), (2, 2)), (24, 24))
    assert tile.tile_plan(64, 1, (28, 28), 6, (24, 24), 5, 4)[1] == 13
    assert tile.tile_plan(64, 1, (28, 28), 6, (24, 24), 5, 4, even_rows=True)[1] == 12
    assert tile.tile_plan(64, 6, (12, 12), 16, (8, 8), 5, 4, even_rows=True)[1] == 8


def test_overrides_reach_the_cached_plans(sms132):
    """tile_conv's and tile_wgrad's plans are cached; an override of the table drops them on entering and leaving
    the block, so a plan never outlives the entries it was made from."""
    args = (64, 16, (26, 26), 32, (24, 24), 3, 4)
    before, wg = tile.tile_plan(*args), _wgrad_plan((64, 16, 26, 26), (32, 16, 3, 3), (24, 24))
    with override(conv.CONV, tile_rows=2, tile_wg_rows=2):
        assert tile.tile_plan(*args)[1] == 2
        assert _wgrad_plan((64, 16, 26, 26), (32, 16, 3, 3), (24, 24))[1] == 2
    assert tile.tile_plan(*args) == before and _wgrad_plan((64, 16, 26, 26), (32, 16, 3, 3), (24, 24)) == wg


def test_the_table_has_a_reason_for_every_entry_and_is_frozen():
    entries = conv.CONV.entries()
    assert len(entries) >= 25 and all(reason and "\n" not in reason for _, reason in entries.values())
    with pytest.raises(AttributeError, match="frozen"):
        conv.CONV.tile_rows = 2

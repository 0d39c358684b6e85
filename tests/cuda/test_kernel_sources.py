"""CPU-side checks of the CUDA convolution's launch plans and kernel instances (no GPU needed)."""
import os
import re

import pytest

from smalltrain.backend.cuda import loader


def test_every_direct_convolution_variant_is_instantiated():
    # conv._weight_grad picks wgrad_partial_r{R}_{f32,f64} by the outputs per thread it needs
    from smalltrain.backend.cuda import conv
    src = loader.read_source(os.path.join(loader.KERNEL_DIR, "conv.cu"))
    assert "wgrad_partial_r##R##_##S(" in src
    for r in conv._WGRAD_R:
        assert f"ST_WGRAD(T, S, {r})" in src, r
    assert conv._WGRAD_THREADS * conv._WGRAD_R[-1] >= 8192   # what _direct admits: o * (k + 1) <= that product
    for ob in conv._DIRECT_OB:   # direct_fwd_ob{OB}_{f32,f64}, chosen by _direct_ob
        assert f"ST_DIRECT(T, S, {ob})" in src, ob
    for cb in conv._DIRECT_OB:   # direct_dx_cb{CB}: the forward's rule
        assert f"ST_DIRECT_DX(T, S, {cb})" in src, cb


def test_direct_forward_splits_channels_only_where_a_launch_is_underfilled(monkeypatch):
    """_direct_grid's split rule on an H200-sized GPU (132 SMs), no GPU needed: LeNet-5's second layer at batch
    64 (8,192 two-channel items x 4 = 32k threads, < 8 warps per SM) sums its 6 input channels over 4 threads;
    at batch 512 (filled) and for the input gradient (no split asked) one thread per item; the split is a power of
    two no larger than the channel count; without room for the partial sums in shared memory, no split."""
    from smalltrain.backend.cuda import conv
    monkeypatch.setattr(conv, "_sm_count", lambda: 132)
    weights, image = 150 * 16 * 4, 6 * 12 * 12 * 4
    grid, parts, splits, smem = conv._direct_grid(64, 8 * 64, weights, image, (6, 2, 4))
    assert (splits, smem) == (4, weights + image + 256 * 2 * 4)
    assert parts == 8 and grid == 64 * 8   # 512 items over 64 threads per item group and block
    assert conv._direct_grid(512, 2 * 64, weights, image, (6, 8, 4))[2] == 1
    assert conv._direct_grid(64, 8 * 64, weights, image)[2] == 1
    assert conv._direct_grid(4, 100, weights, image, (3, 8, 4))[2] == 2
    assert conv._direct_grid(4, 100, weights, image, (1, 8, 4))[2] == 1
    assert conv._direct_grid(4, 100, 40 * 1024, 7 * 1024, (6, 8, 4))[2] == 1   # 47 KiB + 8 KiB partial sums


def test_input_gradient_gathers_only_where_it_fills_the_gpu(monkeypatch):
    """_direct_dx_cb on 132 SMs, no GPU needed: LeNet-5's second layer at batch 64 (27,648 threads of 2 channels)
    goes to cuBLAS + col2im, at batch 512 (73,728 threads of 8) and MnistCnn's second layer at batch 64 (86,528)
    to the gather kernel; groups > 1 never."""
    from smalltrain.backend.cuda import conv
    monkeypatch.setattr(conv, "_sm_count", lambda: 132)
    assert conv._direct_dx_cb((64, 6, 12, 12), (16, 6, 5, 5), 1, 4) is None
    assert conv._direct_dx_cb((512, 6, 12, 12), (16, 6, 5, 5), 1, 4) == 8
    assert conv._direct_dx_cb((64, 16, 26, 26), (32, 16, 3, 3), 1, 4) == 8
    assert conv._direct_dx_cb((512, 6, 12, 12), (16, 3, 5, 5), 2, 4) is None
    monkeypatch.setattr(conv, "DIRECT_DX_MIN_THREADS_PER_SM", 0)
    assert conv._direct_dx_cb((64, 6, 12, 12), (16, 6, 5, 5), 1, 4) == 2


def test_every_tile_conv_variant_is_instantiated():
    from smalltrain.backend.cuda import conv
    src = loader.read_source(os.path.join(loader.KERNEL_DIR, "conv.cu"))
    assert f"#define ST_TW {conv._TILE_TW}\n" in src
    for ks in conv._TILE_KS:
        for to in (4, 8):
            assert f"ST_TILE(T, S, {ks}, {to})" in src and f"ST_TILE_WGRAD(T, S, {ks}, {to})" in src, (ks, to)


def test_into_wgrad_choice(monkeypatch):
    """_into_wgrad on the CPU (NumPy for the partial rows): tile_conv_wgrad takes a one-channel producer with the
    same kernel size and tile_conv's geometry that needs its weight gradient and kept x and did not pool in its
    epilogue, and where the epilogue's sums fit in the default shared memory."""
    from types import SimpleNamespace

    import numpy as np

    from smalltrain.backend.cuda import conv
    monkeypatch.setattr(conv, "cupy", lambda: np)

    def producer(**over):
        p = SimpleNamespace(x=np.zeros((64, 1, 28, 28), np.float32), x_shape=(64, 1, 28, 28),
                            weight=SimpleNamespace(shape=(16, 1, 3, 3)), stride=(1, 1), dilation=(1, 1), groups=1,
                            pads=(0, 0, 0, 0), needs=(False, True, True), pool=None)
        p.__dict__.update(over)
        return p
    plan = (4, 5, 280, 384, 47104, 2)   # MnistCnn's second layer's dx at batch 64: 140 threads of split 0
    args = conv._into_wgrad(plan, producer(), 3, np.dtype(np.float32))
    assert args[1:5] == (28, 28, 0, 0) and args[5].shape == (384, 16 * 10)
    assert conv._wgrad_epilogue_smem(plan, 3, 4) == 4 * 10 * 140 * 4
    for over in ({"needs": (False, False, True)}, {"x": None}, {"x_shape": (64, 2, 28, 28)},
                 {"weight": SimpleNamespace(shape=(16, 1, 5, 5))}, {"stride": (2, 2)}, {"groups": 2},
                 {"pool": (np.zeros((64, 16, 13, 13), np.int64),)}):
        assert conv._into_wgrad(plan, producer(**over), 3, np.dtype(np.float32)) is None, over
    assert conv._into_wgrad(plan, producer(), 3, np.dtype(np.float64)) is not None   # 44.8 KB of sums
    assert conv._into_wgrad((8, 5, 560, 384, 47104, 2), producer(), 3, np.dtype(np.float32)) is None   # 89.6 KB
    monkeypatch.setattr(conv, "INTO_WGRAD", False)
    assert conv._into_wgrad(plan, producer(), 3, np.dtype(np.float32)) is None


def test_pooled_producer_choice(monkeypatch):
    """On the CPU: a convolution that pooled in its epilogue takes its g from the next convolution (conv._into_ok)
    only with INTO_POOLED on, its pooled output's shape the consumer's input, one dtype and its pre-activation kept
    (the linear chain's side: tests/backend/cuda/test_linear_chain.py)."""
    from types import SimpleNamespace

    import numpy as np

    from smalltrain.backend.cuda import conv

    def producer(**over):   # LeNet-5's second layer at batch 64: [64, 16, 8, 8] pooled to [64, 16, 4, 4]
        p = SimpleNamespace(x_shape=(64, 6, 12, 12), weight=SimpleNamespace(shape=(16, 6, 5, 5), dtype=np.float32),
                            out_hw=(8, 8), activation="gelu", y=object(),
                            pool=(SimpleNamespace(shape=(64, 16, 4, 4)),))
        p.__dict__.update(over)
        return p
    consumer = SimpleNamespace(x_shape=(64, 16, 4, 4))
    f32 = np.dtype(np.float32)
    monkeypatch.setattr(conv, "INTO_POOLED", True)
    assert conv._into_ok(consumer, producer(), f32)
    assert conv._into_ok(consumer, producer(activation=None, y=None), f32)
    for over in ({"y": None}, {"pool": (SimpleNamespace(shape=(64, 16, 4, 2)),)},
                 {"weight": SimpleNamespace(shape=(16, 6, 5, 5), dtype=np.float64)}):
        assert not conv._into_ok(consumer, producer(**over), f32), over
    assert conv._into_ok(SimpleNamespace(x_shape=(64, 16, 8, 8)), producer(pool=None), f32)   # not pooled
    monkeypatch.setattr(conv, "INTO_POOLED", False)
    assert not conv._into_ok(consumer, producer(), f32)


def test_unpool_wgrad_takes_a_pooled_first_layer_of_one_input_channel(monkeypatch):
    """On the CPU: tile_conv_unpool_wgrad's epilogue takes the weight gradient of a producer that pooled (whose
    maxima pooled_wgrad would read) with one input channel and the consumer's kernel size, UNPOOL_WGRAD on, where its
    shared memory fits the limit given (the device's once the kernel opts in): the maxima's indices and the
    producer's x under the block's rows prefetched before the plan's tiles, then over the tiles the g and the
    maxima's offsets of the block's windows, the sums of up to 16 slices of a channel's windows, a NaN flag per
    (channel, tap). LeNet-5 b512's plan: 12 rows of 12 windows, 6 channels."""
    from types import SimpleNamespace

    from smalltrain.backend.cuda import conv
    first = SimpleNamespace(x_shape=(512, 1, 28, 28), weight=SimpleNamespace(shape=(6, 1, 5, 5)))
    plan = (4, 12, 216, 512, 29184, 3)
    prefetch = 6 * 12 * 12 * 8 + 28 * 28 * 4   # (a multiple of 16)
    assert conv._unpool_wgrad_smem(plan, 6, 12, 5, 4) == prefetch + 29184   # the tiles' the larger
    epilogue = (6 * 12 * 12 + 6 * 16 * 26) * 4 + 6 * 12 * 12 * 4 + 6 * 25   # 216 threads: 16 slices
    assert conv._unpool_wgrad_smem(plan[:4] + (0, 3), 6, 12, 5, 4) == prefetch + epilogue
    assert conv._unpool_wgrad_smem((4, 12, 24, 512, 0, 1), 6, 12, 5, 4) == prefetch + epilogue - 6 * 12 * 26 * 4
    # one row of 11 windows, 3 channels: the prefetch rounded up to 16 bytes (the tiles' 16-byte copies aligned)
    assert conv._unpool_wgrad_smem((4, 1, 24, 512, 0, 1), 3, 11, 5, 4) == 3 * 11 * 8 + 6 * 26 * 4 + 8 + (
        (3 * 11 + 3 * 8 * 26) * 4 + 3 * 11 * 4 + 3 * 25)
    monkeypatch.setattr(conv, "UNPOOL_WGRAD", True)
    optin, default = 227 * 1024, 48 * 1024   # (the H100's and H200's limit once a kernel opts in)
    assert conv._unpool_wgrad_ok(plan, first, 5, 4, 12, default)
    assert conv._unpool_wgrad_ok(plan, first, 5, 8, 12, optin)
    assert not conv._unpool_wgrad_ok(plan, first, 3, 4, 12, optin)   # another kernel size than the consumer's
    two = SimpleNamespace(x_shape=(512, 2, 28, 28), weight=SimpleNamespace(shape=(6, 2, 5, 5)))
    assert not conv._unpool_wgrad_ok(plan, two, 5, 4, 12, optin)      # two input channels: pooled_wgrad
    wider = (4, 12, 216, 512, 29184, 3)   # 12 rows of 40 windows, 6 channels: ~64 KB, with opting in
    assert conv._unpool_wgrad_ok(wider, first, 5, 4, 40, optin)
    assert not conv._unpool_wgrad_ok(wider, first, 5, 4, 40, default)
    wide = (4, 40, 216, 512, 29184, 3)   # 40 rows of 120 windows: ~540 KB
    assert not conv._unpool_wgrad_ok(wide, first, 5, 4, 120, optin)
    monkeypatch.setattr(conv, "UNPOOL_WGRAD", False)
    assert not conv._unpool_wgrad_ok(plan, first, 5, 4, 12, optin)


def test_pooled_wgrad_plan(monkeypatch):
    """On the CPU: pooled_wgrad takes a convolution (tile_conv's geometry) that pooled in its epilogue, with
    POOLED_WGRAD on, where it needs no input gradient (a first layer): threads a multiple of its channels, about
    two blocks per SM, the staged images, one input channel's sums and the NaN flags within the default shared
    memory; conv2d_backward takes g None only with the partial rows and no input gradient."""
    from types import SimpleNamespace

    import numpy as np

    from smalltrain.backend.cuda import conv
    monkeypatch.setattr(conv, "_sm_count", lambda: 132)

    def producer(n=512, **over):   # LeNet-5's first layer
        p = SimpleNamespace(x=object(), x_shape=(n, 1, 28, 28), weight=SimpleNamespace(shape=(6, 1, 5, 5)),
                            stride=(1, 1), dilation=(1, 1), groups=1, needs=(False, True, True),
                            pool=(np.zeros((n, 6, 12, 12), np.int64),))
        p.__dict__.update(over)
        return p
    f32, f64 = np.dtype(np.float32), np.dtype(np.float64)
    monkeypatch.setattr(conv, "POOLED_WGRAD", False)
    assert conv._pooled_wgrad_plan(producer(), f32) is None
    monkeypatch.setattr(conv, "POOLED_WGRAD", True)
    # the staged images, one input channel's sums per thread, a NaN flag per (channel, input channel, tap)
    assert conv._pooled_wgrad_plan(producer(), f32) == (252, 2, 256, (2 * 784 + 252 * 26) * 4 + 6 * 25)
    assert conv._pooled_wgrad_plan(producer(64), f32) == (252, 1, 64, (784 + 252 * 26) * 4 + 150)
    assert conv._pooled_wgrad_plan(producer(64), f64) == (126, 1, 64, (784 + 126 * 26) * 8 + 150)
    # LeNet-5's second layer's shapes as a first layer (six input channels), then as the second (its input gradient)
    six = producer(x_shape=(512, 6, 12, 12), weight=SimpleNamespace(shape=(16, 6, 5, 5)),
                   pool=(np.zeros((512, 16, 4, 4), np.int64),))
    assert conv._pooled_wgrad_plan(six, f32) == (256, 2, 256, (2 * 864 + 256 * 26) * 4 + 16 * 150)
    six.needs = (True,) * 3
    assert conv._pooled_wgrad_plan(six, f32) is None
    for over in ({"pool": None}, {"needs": (True, True, True)}, {"needs": (False, False, True)}, {"x": None},
                 {"stride": (2, 2)}, {"weight": SimpleNamespace(shape=(300, 1, 5, 5))}):
        assert conv._pooled_wgrad_plan(producer(**over), f32) is None, over
    big = producer(2, x_shape=(2, 1, 120, 120))   # one image's 57.6 KB staged: over the default 48 KiB
    assert conv._pooled_wgrad_plan(big, f32) is None
    saved = SimpleNamespace(x_shape=(2, 1, 28, 28), weight=np.zeros((6, 1, 5, 5), np.float32), out_hw=(24, 24),
                            groups=1, needs=(True, True, True))
    with pytest.raises(RuntimeError, match="g may be None only with wpartial and no input gradient"):
        conv.conv2d_backward(None, saved, g=None, wpartial=np.zeros((4, 156), np.float32))


def test_tile_wgrad_plans(monkeypatch):
    """_tile_wgrad_plan on 132 SMs, no GPU needed: (channels per thread, rows per tile, row groups, threads, blocks,
    shared bytes)."""
    from types import SimpleNamespace

    from smalltrain.backend.cuda import conv
    monkeypatch.setattr(conv, "_sm_count", lambda: 132)

    def plan(x_shape, w_shape, out_hw, itemsize=4, **geometry):
        saved = SimpleNamespace(x_shape=x_shape, weight=SimpleNamespace(shape=w_shape), out_hw=out_hw,
                                stride=(1, 1), dilation=(1, 1), groups=1, pads=(0, 0, 0, 0))
        saved.__dict__.update(geometry)
        return conv._tile_wgrad_plan(saved, itemsize)
    # with the bias threads (one per channel group): MnistCnn's second layer at batch 64: 4 x 49 threads of 8
    # channels, 4-row tiles (two buffers of 23 KB), the 384 tiles one per block (up to 4 blocks per SM); at batch 512
    # the 3,072 tiles 6 per block
    monkeypatch.setattr(conv, "TILE_WG_BIAS_SPREAD", False)
    assert plan((64, 16, 26, 26), (32, 16, 3, 3), (24, 24)) == (8, 4, 1, 196, 384, 2 * (32 * 4 * 24 + 16 * 6 * 28) * 4,
                                                                1)
    assert plan((512, 16, 26, 26), (32, 16, 3, 3), (24, 24))[4] == 512
    # LeNet-5's first layer: 2 x 6 threads of 4 channels, whole images, the rows over 12 groups
    assert plan((512, 1, 28, 28), (6, 1, 5, 5), (24, 24))[:5] == (4, 24, 12, 144, 512)
    for geometry in ({"stride": (2, 2)}, {"dilation": (2, 2)}, {"groups": 2}):
        assert plan((4, 16, 26, 26), (32, 16, 3, 3), (24, 24), **geometry) is None, geometry
    assert plan((4, 16, 26, 26), (32, 16, 7, 7), (20, 20)) is None        # not compiled
    assert plan((4, 64, 26, 26), (32, 64, 3, 3), (24, 24)) is None        # 4 x 193 threads
    # TILE_WG_BIAS_SPREAD: without the bias threads where that saves a warp (MnistCnn's second layer: 192 threads,
    # 6 warps, not 196; LeNet-5's first: 120, not 144), not where it does not (LeNet-5's second at b64: 240 or 248,
    # 8 warps either way)
    monkeypatch.setattr(conv, "TILE_WG_BIAS_SPREAD", True)
    assert plan((64, 16, 26, 26), (32, 16, 3, 3), (24, 24))[3::3] == (192, 0)
    assert plan((512, 1, 28, 28), (6, 1, 5, 5), (24, 24))[3::3] == (120, 0)
    assert plan((64, 6, 12, 12), (16, 6, 5, 5), (8, 8))[3::3] == (248, 1)
    monkeypatch.setattr(conv, "TILE_WGRAD", False)
    assert plan((64, 16, 26, 26), (32, 16, 3, 3), (24, 24)) is None


def test_tile_conv_plans(monkeypatch):
    """_tile_plan on 132 SMs, no GPU needed: (channels per thread, rows per block, threads, blocks, shared bytes,
    channel splits)."""
    from smalltrain.backend.cuda import conv
    monkeypatch.setattr(conv, "_sm_count", lambda: 132)
    # MnistCnn's second layer at batch 64: 4 channels x 4 columns per thread (8 would leave 279 threads per SM), 48
    # threads a row; 4 rows a block (6 full warps, 2.9 blocks per SM) rather than 5 (7.5 warps, a partial last
    # tile) or 2 (as many halo rows staged as output rows)
    to, th, threads, blocks, smem, cs = conv._tile_plan(64, 16, (26, 26), 32, (24, 24), 3, 4)
    assert (to, th, threads, blocks, cs) == (4, 4, 192, 384, 1) and smem == (144 * 32 + 16 * 6 * 28) * 4
    # channel splits where the grid leaves the SMs few threads: its input gradient (no row count within a block's
    # 256 threads gives _TILE_MIN_THREADS = 256, so the rows that waste the least: 4 of 26 a block, 448 blocks of 112
    # threads, 380 per SM) in 2 groups of 16 channels, within 1024 threads per SM (the default); the forward (558)
    # stays whole
    assert conv._TILE_SPLIT_THREADS_PER_SM == 1024 and conv._TILE_MIN_THREADS == 256
    assert conv._tile_plan(64, 32, (24, 24), 16, (26, 26), 3, 4)[1:] == (4, 224, 448, (288 * 16 + 32 * 6 * 32) * 4, 2)
    assert conv._tile_plan(64, 16, (26, 26), 32, (24, 24), 3, 4)[5] == 1
    monkeypatch.setattr(conv, "_TILE_SPLITS", 3)   # forced: 3 groups of 10, 11, 11 channels; their sums in smem
    assert conv._tile_plan(64, 32, (24, 24), 16, (26, 26), 3, 4)[4:] == ((288 * 16 + 32 * 6 * 32) * 4, 3)
    monkeypatch.setattr(conv, "_TILE_SPLITS", None)
    monkeypatch.setattr(conv, "_TILE_SPLIT_THREADS_PER_SM", 0)
    monkeypatch.setattr(conv, "_TILE_TO8_THREADS_PER_SM", 256)
    # 8 channels a thread: 24 threads a row, 8 rows (the fewest with 128 threads that divide the 24 rows evenly)
    assert conv._tile_plan(64, 16, (26, 26), 32, (24, 24), 3, 4)[:4] == (8, 8, 192, 192)
    monkeypatch.setattr(conv, "_TILE_TO8_THREADS_PER_SM", 1024)
    # LeNet-5's first layer at batch 512 with 4 channels a thread: 2 blocks per image, 13 + 11 rows of 12 threads (24
    # rows would be 288)
    monkeypatch.setattr(conv, "TILE_TO6", False)
    assert conv._tile_plan(512, 1, (28, 28), 6, (24, 24), 5, 4)[:4] == (4, 13, 156, 1024)
    # TILE_TO6: 6 channels a thread where 4 or 8 leave dead ones and KS = 5, their weights in 8 slots a tap: the
    # same layer as one block of 24 rows per image (144 threads); the second layer's input gradient in 7 channel
    # splits of 36 threads; 12 channels where 8 a thread was planned (4 dead), not 16 (6 does not divide them), not
    # 3x3, not below _TILE_TO6_THREADS_PER_SM
    monkeypatch.setattr(conv, "TILE_TO6", True)
    monkeypatch.setattr(conv, "_TILE_TO6_THREADS_PER_SM", 0)
    monkeypatch.setattr(conv, "_TILE_SPLIT_THREADS_PER_SM", 1024)
    assert conv._tile_plan(512, 1, (28, 28), 6, (24, 24), 5, 4) == (6, 24, 144, 512, (25 * 8 + 28 * 28) * 4, 1)
    assert conv._tile_plan(512, 16, (8, 8), 6, (12, 12), 5, 4)[:4] + conv._tile_plan(
        512, 16, (8, 8), 6, (12, 12), 5, 4)[5:] == (6, 12, 252, 512, 7)
    assert conv._tile_plan(512, 1, (28, 28), 12, (24, 24), 5, 4)[0] == 6
    assert conv._tile_plan(512, 1, (28, 28), 16, (24, 24), 5, 4)[0] == 8
    assert conv._tile_plan(512, 1, (26, 26), 6, (24, 24), 3, 4)[0] == 4
    # the default, 512 threads per SM: LeNet-5's first layer at batch 512 (558) takes 6, the second layer's input
    # gradient (140) and the first layer at batch 64 (70) keep 4
    monkeypatch.setattr(conv, "_TILE_TO6_THREADS_PER_SM", 512)
    assert conv._tile_plan(512, 1, (28, 28), 6, (24, 24), 5, 4)[0] == 6
    assert conv._tile_plan(512, 16, (8, 8), 6, (12, 12), 5, 4)[0] == 4
    assert conv._tile_plan(64, 1, (28, 28), 6, (24, 24), 5, 4)[0] == 4
    monkeypatch.setattr(conv, "_TILE_TO6_THREADS_PER_SM", 1024)
    assert conv._tile_plan(512, 1, (28, 28), 6, (24, 24), 5, 4)[0] == 4
    monkeypatch.setattr(conv, "TILE_TO6", False)
    monkeypatch.setattr(conv, "_TILE_SPLIT_THREADS_PER_SM", 0)
    # every plan keeps its blocks within 1024 threads and 48 KB, and covers the rows
    for n, c, o, hw, ks in [(1, 1, 1, (1, 1), 3), (64, 6, 16, (8, 8), 5), (7, 64, 64, (40, 40), 3),
                            (2, 3, 200, (30, 90), 5)]:
        plan = conv._tile_plan(n, c, (hw[0] + ks - 1, hw[1] + ks - 1), o, hw, ks, 8)
        if plan is not None:
            to, th, threads, blocks, smem, cs = plan
            assert cs == 1 and threads <= 1024 and smem <= 48 * 1024 and blocks * th >= n * hw[0] and blocks % n == 0
    assert conv._tile_plan(64, 16, (26, 26), 32, (24, 24), 7, 4) is None   # not compiled
    # the forward's geometry and taps: stride, dilation, groups, a non-square or uncompiled kernel, under TILE_MIN_K
    x, w = (64, 16, 26, 26), (32, 16, 3, 3)
    assert conv._tile_forward_plan(x, w, (24, 24), (1, 1), (0,) * 4, (1, 1), 1, 4) is not None
    for stride, dilation, groups, w_shape in [((2, 2), (1, 1), 1, w), ((1, 1), (2, 1), 1, w), ((1, 1), (1, 1), 2, w),
                                              ((1, 1), (1, 1), 1, (32, 16, 3, 5)), ((1, 1), (1, 1), 1, (32, 16, 7, 7)),
                                              ((1, 1), (1, 1), 1, (32, 1, 3, 3))]:
        assert conv._tile_forward_plan(x, w_shape, (24, 24), stride, (0,) * 4, dilation, groups, 4) is None
    monkeypatch.setattr(conv, "TILE_CONV", False)
    assert conv._tile_plan(64, 16, (26, 26), 32, (24, 24), 3, 4) is None


def test_every_implicit_gemm_variant_is_instantiated():
    from smalltrain.backend.cuda import conv
    src = loader.read_source(os.path.join(loader.KERNEL_DIR, "conv.cu"))
    assert f"#define ST_IGKMAX {conv.IGEMM_MAX_K}\n" in src
    for bo, bq in conv._IGEMM_BQ.items():   # BQ = 4 positions x 256 / (BO / 4) threads
        assert f"ST_IGEMM(T, S, {bo})" in src and bq == 4 * 256 // (bo // 4), bo
    for tile in conv._WG_TILES:
        assert "ST_IGEMM_WGRAD(T, S, {}, {}, {}, {})".format(*tile) in src, tile
    assert f"#define ST_WGQ {conv._WGQ}\n" in src


def test_weight_gradient_tile_rule():
    """_wgrad_tile, no GPU needed: the first tile at least half used, else the least padded one, and how much of
    it the outputs use, for MnistCnn's layers (O=32, K+1=145; O=16, K+1=10) and LeNet-5's (O=16, K+1=151;
    O=6, K+1=26)."""
    from smalltrain.backend.cuda import conv
    assert conv._wgrad_tile(32, 145) == ((32, 64, 4, 4), 32 * 145 / (32 * 192))
    assert conv._wgrad_tile(16, 10) == ((8, 32, 2, 2), 160 / (16 * 32))
    assert conv._wgrad_tile(16, 151) == ((16, 128, 4, 4), 16 * 151 / (16 * 256))
    assert conv._wgrad_tile(6, 26) == ((8, 32, 2, 2), 156 / (8 * 32))


def test_weight_gradient_splits(monkeypatch):
    """_wgrad_splits on 132 SMs, no GPU needed: MnistCnn's second layer at batch 64 (3 tiles of 128 threads) gets
    352 splits for ~1024 threads per SM; few positions give at least 4 slices of 16 per split; a layer whose
    partial rows would pass 32-bit indices gets fewer."""
    from smalltrain.backend.cuda import conv
    monkeypatch.setattr(conv, "_sm_count", lambda: 132)
    assert conv._wgrad_splits(32, 145, 64 * 24 * 24, 3, 128) == -(-1024 * 132 // (3 * 128))
    assert conv._wgrad_splits(6, 26, 100, 1, 64) == 2            # 7 slices of 16, at least 4 per split
    assert conv._wgrad_splits(6, 26, 1, 1, 64) == 1
    assert conv._wgrad_splits(4096, 4097, 1 << 24, 1, 128) == (2 ** 30 - 1) // (4096 * 4097)


def test_instances_only_some_runs_use_are_a_module_of_their_own():
    """loader._PARTS: a kernel named with a part's marker before its element type is asked for from that part's
    module (its macro defined first); conv.cu's arranged instances are the ST_ARRANGED part, tile_arrange itself is
    in the main module. tests/cuda/test_kernels.py compiles both and checks which kernels each has."""
    assert [loader.part_of(name) for name in ("tile_conv_pool_k5_to4_arr_f32", "tile_conv_lin_ce_k3_to4_arr_f64",
                                              "tile_conv_pool_k5_to4_f32", "tile_arrange_f32", "set_hyper")] \
        == ["ST_ARRANGED", "ST_ARRANGED", None, None, None]
    assert loader.family_parts("conv") == [None, "ST_ARRANGED"] and loader.family_parts("optim") == [None]
    assert loader.family_source("conv", 2, "ST_ARRANGED").startswith("#define ST_DTYPES 2\n#define ST_ARRANGED 1\n")
    assert loader.family_source("conv", 2).startswith("#define ST_DTYPES 2\n//")


def test_weights_are_arranged_where_the_copies_saved_over_an_sm_pay_for_the_launch():
    """conv._tile_arranges on an H200's / H100's 132 SMs, with the elements, threads and blocks of the models' plans
    (benchmarks/launch_plans.py): LeNet-5's second layer, 2400 elements staged by 192-thread blocks, is not arranged at
    b64 (64 blocks, one an SM: 12.5 copies) and is at b512 (512 blocks, four an SM: 50); MnistCnn's second layer
    (4608 elements) is for its forward (384 blocks of 192) and its input gradient (448 of 224)."""
    from smalltrain.backend.cuda import conv
    assert conv.TILE_ARRANGE_MIN_COPIES == 16
    assert not conv._tile_arranges(2400, 192, 64, 132)
    assert conv._tile_arranges(2400, 192, 512, 132)
    assert conv._tile_arranges(4608, 192, 384, 132) and conv._tile_arranges(4608, 224, 448, 132)
    assert conv._tile_arranges(16 * 192, 192, 132, 132) and not conv._tile_arranges(16 * 192 - 1, 192, 132, 132)
    assert conv._tile_arranges(8 * 192, 192, 133, 132)   # (133 blocks: two an SM on one of them)


def test_tile_linear_epilogue_choice(monkeypatch):
    """_tile_linear_ok on the CPU (the counters stubbed): tile_conv_lin takes the linear layer after MnistCnn's
    second convolution (10 outputs, 192-thread blocks) and declines more than TILE_LINEAR_MAX_F outputs, blocks of
    partial warps, more images than counters, TILE_LINEAR off and counters not made yet (a capture in progress)."""
    from types import SimpleNamespace

    from smalltrain.backend.cuda import conv
    made = []
    monkeypatch.setattr(conv, "device_counters", lambda name, size: made.append((name, size)) or "counters")
    plan = (4, 4, 192, 384, 29184, 1)
    lw = SimpleNamespace(shape=(10, 18432))
    assert conv._tile_linear_ok(plan, 64, lw) == "counters"
    assert made == [("tile_conv_lin", conv._TILE_LINEAR_IMAGES)]
    assert conv._tile_linear_ok(plan, 64, SimpleNamespace(shape=(conv.TILE_LINEAR_MAX_F, 18432))) == "counters"
    assert conv._tile_linear_ok(plan, 64, SimpleNamespace(shape=(conv.TILE_LINEAR_MAX_F + 1, 18432))) is None
    assert conv._tile_linear_ok((4, 1, 48, 1536, 8000, 1), 64, lw) is None             # 48-thread blocks
    assert conv._tile_linear_ok(plan, conv._TILE_LINEAR_IMAGES + 1, lw) is None
    monkeypatch.setattr(conv, "device_counters", lambda name, size: None)
    assert conv._tile_linear_ok(plan, 64, lw) is None
    monkeypatch.setattr(conv, "device_counters", lambda name, size: "counters")
    monkeypatch.setattr(conv, "TILE_LINEAR", False)
    assert conv._tile_linear_ok(plan, 64, lw) is None


def test_tile_pool_epilogue_choice(monkeypatch):
    """_tile_pool_ok (no GPU needed): 2x2 windows at stride 2 without padding or dilation over an output of even
    rows and columns (LeNet-5's 24 x 24 and 8 x 8); the plan for it has an even number of rows per block (LeNet-5's
    first layer: 12, where the plain plan takes 13)."""
    from smalltrain.backend.cuda import conv
    monkeypatch.setattr(conv, "_sm_count", lambda: 132)
    pool = ((2, 2), (2, 2), (0, 0), (1, 1))
    assert conv._tile_pool_ok(pool, (24, 24)) and conv._tile_pool_ok(pool, (8, 8))
    assert not conv._tile_pool_ok(pool, (9, 8)) and not conv._tile_pool_ok(pool, (8, 9))
    assert not conv._tile_pool_ok(((3, 3), (3, 3), (0, 0), (1, 1)), (24, 24))
    assert not conv._tile_pool_ok(((2, 2), (1, 1), (0, 0), (1, 1)), (24, 24))
    assert not conv._tile_pool_ok(((2, 2), (2, 2), (1, 1), (1, 1)), (24, 24))
    assert not conv._tile_pool_ok(((2, 2), (2, 2), (0, 0), (2, 2)), (24, 24))
    assert conv._tile_plan(64, 1, (28, 28), 6, (24, 24), 5, 4)[1] == 13
    assert conv._tile_plan(64, 1, (28, 28), 6, (24, 24), 5, 4, even_rows=True)[1] == 12
    assert conv._tile_plan(64, 6, (12, 12), 16, (8, 8), 5, 4, even_rows=True)[1] == 8
    monkeypatch.setattr(conv, "TILE_POOL", False)
    assert not conv._tile_pool_ok(pool, (24, 24))


def test_tile_plans_key_their_cache_on_every_knob_they_read():
    """On the CPU: tile_conv's and tile_wgrad's plans are cached per _tile_knobs(); every module setting a plan
    function reads (its nested helpers included) is in that tuple, but for the kernels' compile-time constants (the
    kernel sizes and columns a thread the kernels are compiled for, the 32-bit index limit). A knob added to a plan
    and not to _tile_knobs would let a test's or benchmark's change of it reuse a stale plan."""
    import types

    from smalltrain.backend.cuda import conv

    def names(code):   # the globals a function and its nested functions read
        out = set(code.co_names)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                out |= names(const)
        return out
    setting = re.compile(r"^_?[A-Z][A-Z0-9_]*$")
    keyed = names(conv._tile_knobs.__code__)
    constants = {"_FITS32", "_TILE_KS", "_TILE_TW"}
    for plan in (conv._tile_conv_plan, conv._tile_wgrad_plan_for):
        read = {n for n in names(plan.__wrapped__.__code__) if setting.match(n) and hasattr(conv, n)}
        assert read & keyed, plan.__name__   # (it reads knobs at all: the walk found them)
        assert read - keyed <= constants, (plan.__name__, sorted(read - keyed - constants))

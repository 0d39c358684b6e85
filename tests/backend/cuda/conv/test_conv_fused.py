"""tile_conv's epilogues (backend/cuda/conv/fused.py): the linear layer and the pooling in the forward, and the
input gradient written as the producer's g (its weight gradient, its pooling's backward, pooled_wgrad). Skips
without CuPy or a GPU (or the emulator)."""

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
import smalltrain  # noqa: E402

if not smalltrain.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import cuda_reference as ref  # noqa: E402

from smalltrain.backend.cuda import conv as conv_kernels  # noqa: E402
from smalltrain.backend.cuda import ops  # noqa: E402
from smalltrain.backend.cuda.conv import fused as conv_fused  # noqa: E402
from smalltrain.backend.cuda.conv import tile as conv_tile  # noqa: E402
from smalltrain.testing import assert_close  # noqa: E402
from conv_cases import (DTYPES, _force_tile_plan, _pads,  # noqa: E402
                        g)


TILE_LINEAR_CASES = [   # (x shape, w shape, padding, activation, F, biases, rows per block or None: as planned)
    ((64, 16, 26, 26), (32, 16, 3, 3), 0, "relu", 10, True, None),   # MnistCnn's conv2 + classifier: vector loads
    ((2, 4, 9, 13), (5, 4, 3, 3), 1, "gelu", 16, True, 4),   # 13 columns: scalar loads; rows past the image
    ((2, 6, 12, 12), (16, 6, 5, 5), 0, None, 1, False, 4),   # 5x5, one output, no biases
    ((3, 4, 9, 16), (5, 4, 3, 3), 1, "relu", 7, True, 4),    # an odd batch, 7 outputs
]


def _linear_reference(x, w, b, padding, activation, lw, lb):
    pre, _ = ref.conv2d(x, w, b, (1, 1), _pads(padding, w.shape[2:], (1, 1)), (1, 1), 1)
    flat = ref.act(pre, activation).reshape(x.shape[0], -1)
    return flat @ lw.T + (0 if lb is None else lb)


@pytest.mark.parametrize("plan", ["as planned", "2 channel splits", "unaligned weight"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", TILE_LINEAR_CASES)
def test_tile_conv_linear_epilogue(case, dtype, plan, rng, monkeypatch, tune):
    """conv2d_forward's `linear`: tile_conv_lin's epilogue gives flatten(act(conv(x))) @ lw^T + lb beside the
    convolution's output, against the float64 reference: with the input channels split over 2 thread groups (the
    idle groups' threads still join the block sums), and with lw at an address no vector load may read (scalar
    loads). The same bits on a second call (its counters reset), and none left above zero."""
    shape, w_shape, padding, activation, f, bias, rows = case
    tune(tile_min_k=0)
    tune(tile_to8_threads_per_sm=1 << 30)   # 4 channels a thread: whole warps
    if rows is not None:
        tune(tile_rows=rows)
    if plan == "2 channel splits":
        tune(tile_splits=2)
    x = rng.standard_normal(shape).astype(dtype)
    w = (rng.standard_normal(w_shape) * 0.3).astype(dtype)
    b = rng.standard_normal(w_shape[0]).astype(dtype) if bias else None
    out_hw = [s + 2 * padding - w_shape[2] + 1 for s in shape[2:]]
    k = w_shape[0] * out_hw[0] * out_hw[1]
    lw = (rng.standard_normal((f, k)) / np.sqrt(k)).astype(dtype)
    lb = rng.standard_normal(f).astype(dtype) if bias else None
    glw = g(lw)
    if plan == "unaligned weight":   # contiguous, one element past an aligned address
        glw = cp.empty(f * k + 1, dtype=dtype)[1:].reshape(f, k)
        glw[...] = g(lw)
    args = (g(x), g(w), None if b is None else g(b), 1, padding, 1, 1, activation)
    lin = (glw, None if lb is None else g(lb))
    out, saved, logits = conv_kernels.conv2d_forward(*args, linear=lin)
    plan_threads = conv_tile.tile_plan(shape[0], shape[1], shape[2:], w_shape[0], out_hw, w_shape[2],
                                       np.dtype(dtype).itemsize)[2]
    if plan_threads % 32:   # float64 MnistCnn as planned: blocks of 48 threads (one row), declined, as in the next test
        assert logits is None
        return
    assert logits is not None and logits.shape == (shape[0], f)
    tol = ref.tol(dtype)
    want = _linear_reference(x, w, b, padding, activation, lw, lb)
    assert_close(logits, want, tol * max(1, np.sqrt(k) / 8), name="logits")
    assert_close(logits, cp.asnumpy(out).reshape(shape[0], -1).astype(np.float64) @ lw.T + (0 if lb is None else lb),
                 tol * max(1, np.sqrt(k) / 8), name="logits against the output it wrote")
    assert cp.array_equal(conv_kernels.conv2d_forward(*args, linear=lin)[2], logits)
    assert int(conv_fused.device_counters("tile_conv_lin", conv_fused._LINEAR_IMAGES).max()) == 0


def test_tile_conv_linear_epilogue_declines_what_it_cannot_take(rng, tune):
    """17 outputs (over ST_LF), blocks of partial warps: logits None (the caller runs the linear layer), the
    convolution's output unchanged."""
    x = g(rng.standard_normal((2, 4, 9, 13)).astype(np.float32))
    w = g(rng.standard_normal((5, 4, 3, 3)).astype(np.float32))
    tune(tile_min_k=0)
    tune(tile_to8_threads_per_sm=1 << 30)
    tune(tile_rows=4)   # 32 threads a block
    plain, _ = conv_kernels.conv2d_forward(x, w, None, 1, 1)
    for f, rows in [(17, 4), (3, 3)]:   # 3 rows: 24 threads
        tune(tile_rows=rows)
        lw = g(np.ones((f, 5 * 9 * 13), np.float32))
        out, _, logits = conv_kernels.conv2d_forward(x, w, None, 1, 1, linear=(lw, None))
        assert logits is None, (f, rows)
        assert cp.array_equal(out, plain)


def test_tile_conv_linear_epilogue_replays_as_a_cuda_graph(rng):
    """MnistCnn's conv2 + classifier captured once (counters made by the eager warm-up), replayed on new inputs
    twice: the logits of each, so the counters start from zero on every replay."""
    x = g(rng.standard_normal((8, 16, 26, 26)).astype(np.float32))
    w = g((rng.standard_normal((32, 16, 3, 3)) * 0.3).astype(np.float32))
    b = g(rng.standard_normal(32).astype(np.float32))
    lw = rng.standard_normal((10, 32 * 24 * 24)).astype(np.float32) / 100
    lb = rng.standard_normal(10).astype(np.float32)
    lin = (g(lw), g(lb))
    assert conv_kernels.conv2d_forward(x, w, b, activation="relu", linear=lin)[2] is not None   # eager warm-up
    cp.cuda.Device().synchronize()
    stream, pool = cp.cuda.Stream(non_blocking=True), cp.cuda.MemoryPool()
    with stream, cp.cuda.using_allocator(pool.malloc):
        stream.begin_capture()
        _, _, logits = conv_kernels.conv2d_forward(x, w, b, activation="relu", linear=lin)
        graph = stream.end_capture()
        for _ in range(2):
            new = rng.standard_normal((8, 16, 26, 26)).astype(np.float32)
            x.set(new, stream=stream)
            graph.launch(stream)
            stream.synchronize()
            want = _linear_reference(new.astype(np.float64), cp.asnumpy(w).astype(np.float64), cp.asnumpy(b), 0,
                                     "relu", lw.astype(np.float64), lb)
            assert_close(logits, want, 1e-5 * np.sqrt(32 * 24 * 24) / 8, name="replayed logits")


@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_conv_act_pool_backward(activation, dtype, rng):
    """max_pool2d_backward_act (the pooling's gradient times the activation's derivative, in the convolution's
    [O, N*P] layout) then conv2d_backward from that g: the gradients of pool(act(conv(x)))."""
    x = rng.standard_normal((3, 2, 9, 10)).astype(dtype)
    w = (rng.standard_normal((5, 2, 3, 3)) * 0.5).astype(dtype)
    b = rng.standard_normal(5).astype(dtype)
    out, csaved = ops.conv2d_forward(g(x), g(w), g(b), 1, 1, 1, 1, activation)
    pooled, _, psaved = ops.max_pool2d_forward(out, 3, 2, 1)
    dpool = rng.standard_normal(pooled.shape).astype(dtype)
    gact = ops.max_pool2d_backward_act(g(dpool), psaved, csaved.y, csaved.bias, activation)
    dx, dw, db = ops.conv2d_backward(None, csaved, g=gact)
    pre, _ = ref.conv2d(x, w, b, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    dout = ops.max_pool2d_backward(g(dpool), psaved).get()   # checked against torch in test_max_pool2d
    dpre = ref.act_grad(dout, pre, activation)
    tol = ref.tol(dtype)
    assert gact.shape == (5, 3 * 90)
    assert_close(gact, dpre.transpose(1, 0, 2, 3).reshape(5, -1), tol, name="g")
    rdx, rdw, rdb = ref.conv2d_grads(x, w, dpre, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    for name, got, want in (("dx", dx, rdx), ("dw", dw, rdw), ("db", db, rdb)):
        assert_close(got, want, tol, name=name)
    with pytest.raises(RuntimeError, match=r"y of shape \[5, 270\]"):
        ops.max_pool2d_backward_act(g(dpool), psaved, cp.zeros((5, 9), dtype), csaved.bias, "relu")
    with pytest.raises(RuntimeError, match=r"g of shape \[5, 270\]"):
        ops.conv2d_backward(None, csaved, g=gact[:, :9])


TILE_WGRAD_CASES = [  # producer x, producer weight, its padding, its activation, consumer weight, its padding
    ((4, 1, 28, 28), (16, 1, 3, 3), 0, "relu", (32, 16, 3, 3), 0),           # MnistCnn's two layers
    ((2, 1, 12, 11), (6, 1, 5, 5), 2, "gelu", (5, 6, 5, 5), 1),              # 5x5, padded; 11 columns: a partial group
    ((3, 1, 9, 10), (5, 1, 3, 3), 1, None, (4, 5, 3, 3), (1, 0, 2, 1)),      # no activation; asymmetric padding
]


@pytest.mark.parametrize("plan", ["as planned", "row tiles", "2 channel splits", "8 channels"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", TILE_WGRAD_CASES)
def test_tile_conv_wgrad_epilogue(case, dtype, plan, rng, monkeypatch, tune):
    """A one-channel producer's weight and bias gradients in the consumer's input-gradient epilogue
    (tile_conv_wgrad): against the float64 reference, and those of the producer's own kernels (no producer offered:
    dx, then the producer's own backward, the sums in another order)."""
    xs, w1s, p1, act, w2s, p2 = case
    _force_tile_plan(tune, plan)
    x = rng.standard_normal(xs).astype(dtype)
    w1 = (rng.standard_normal(w1s) / np.sqrt(np.prod(w1s[1:]))).astype(dtype)
    w2 = (rng.standard_normal(w2s) / np.sqrt(np.prod(w2s[1:]))).astype(dtype)
    b1, b2 = rng.standard_normal(w1s[0]).astype(dtype), rng.standard_normal(w2s[0]).astype(dtype)
    out1, s1 = ops.conv2d_forward(g(x), g(w1), g(b1), 1, p1, 1, 1, act)
    out2, s2 = ops.conv2d_forward(out1, g(w2), g(b2), 1, p2, 1, 1, None)
    dout = rng.standard_normal(out2.shape).astype(dtype)
    handed, dw2, db2 = ops.conv2d_backward(g(dout), s2, into=s1)
    fused = isinstance(handed, conv_kernels.ProducerGrad) and handed.wpartial is not None
    assert fused or dtype == np.float64   # float64: the tiles or the sums may not fit in shared memory
    if not isinstance(handed, conv_kernels.ProducerGrad):
        return
    _, dw1, db1 = ops.conv2d_backward(None, s1, g=handed.g, wpartial=handed.wpartial)
    dx2, _, _ = ops.conv2d_backward(g(dout), s2)   # no producer offered: dx [N, C, H, W]
    _, own_dw1, own_db1 = ops.conv2d_backward(dx2, s1)
    tol = ref.tol(dtype)
    assert_close(dw1, own_dw1, tol, name="dw vs the producer's own kernels")
    assert_close(db1, own_db1, tol, name="db vs the producer's own kernels")
    geom1 = ((1, 1), _pads(p1, w1s[2:], (1, 1)), (1, 1), 1)
    geom2 = ((1, 1), _pads(p2, w2s[2:], (1, 1)), (1, 1), 1)
    pre1, _ = ref.conv2d(x, w1, b1, *geom1)
    h = ref.act(pre1, act)
    rdh, _, _ = ref.conv2d_grads(h, w2, dout, *geom2)
    _, rdw1, rdb1 = ref.conv2d_grads(x, w1, ref.act_grad(rdh, pre1, act), *geom1)
    assert_close(dw1, rdw1, tol, name="dw")
    assert_close(db1, rdb1, tol, name="db")


POOL_2X2 = ((2, 2), (2, 2), (0, 0), (1, 1))   # conv2d_forward's pool: kernel, stride, padding, dilation
TILE_POOL_CASES = [  # x, weight, padding, rows per block (None: planned), a NaN in x
    ((5, 1, 28, 28), (6, 1, 5, 5), 0, None, False),   # LeNet-5's first layer (planned 12 rows, not 13)
    ((3, 6, 12, 12), (16, 6, 5, 5), 0, None, True),   # its second (channel splits), a NaN
    ((2, 3, 10, 14), (5, 3, 3, 3), 1, 4, False),      # 10 x 14 outputs: a partial last tile, a partial channel group
    ((2, 4, 12, 10), (3, 4, 3, 3), 0, 2, True),       # 10 x 8 outputs, 2 rows per block, a NaN
]


@pytest.mark.parametrize("to6", [False, True], ids=["to4", "to6"])
@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", TILE_POOL_CASES)
def test_tile_conv_pool_epilogue(case, dtype, activation, to6, rng, monkeypatch, tune):
    """tile_conv's 2x2 max-pooling epilogue: the pooled output against the float64 reference, and bit-equal (values,
    indices, the backward's g) to the unfused path on the same plan (max_pool2d_forward on the convolution's output:
    ties of ReLU's zeros go to the first maximum, a NaN wins). to6: 6 channels a thread (LeNet-5's first layer's
    plan at batch 512)."""
    tune(tile_to6_threads_per_sm=0 if to6 else 1 << 30)   # 6 channels a thread on the small cases too, or never
    x_shape, w_shape, pad, rows, nan = case
    x = rng.standard_normal(x_shape).astype(dtype)
    if nan:
        x[1, 0, 3, 4] = np.nan
    w = (rng.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(dtype)
    b = rng.standard_normal(w_shape[0]).astype(dtype)
    plan_rows = rows if rows is not None else conv_tile.tile_forward_plan(
        x_shape, w_shape, (x_shape[2] + 2 * pad - w_shape[2] + 1, x_shape[3] + 2 * pad - w_shape[3] + 1), (1, 1),
        (pad,) * 4, (1, 1), 1, np.dtype(dtype).itemsize, even_rows=True)[1]
    assert plan_rows % 2 == 0
    tune(tile_rows=plan_rows)   # the unfused run below on the same plan
    out, saved = ops.conv2d_forward(g(x), g(w), g(b), 1, pad, 1, 1, activation, pool=POOL_2X2)
    assert saved.pool is not None and out.shape == saved.pool[0].shape and saved.pool[0].dtype == cp.int64
    pre, _ = ref.conv2d(x, w, b, (1, 1), (pad,) * 4, (1, 1), 1)
    n, o, h, wd = pre.shape
    windows = ref.act(pre, activation).reshape(n, o, h // 2, 2, wd // 2, 2)
    with np.errstate(invalid="ignore"):
        assert_close(out, windows.max(axis=(3, 5)), ref.tol(dtype), name="pooled")
    if nan:
        assert cp.isnan(out).any()
    plain, plain_saved = ops.conv2d_forward(g(x), g(w), g(b), 1, pad, 1, 1, activation)
    assert plain_saved.pool is None and plain.shape == pre.shape
    pooled, idx, psaved = ops.max_pool2d_forward(plain, 2, 2)
    assert cp.array_equal(out, pooled, equal_nan=True) and cp.array_equal(saved.pool[0], idx)
    assert saved.pool[1:] == psaved[1:]
    dpool = g(rng.standard_normal(out.shape).astype(dtype))
    fused_g = ops.max_pool2d_backward_act(dpool, saved.pool, saved.y, saved.bias, activation)
    plain_g = ops.max_pool2d_backward_act(dpool, psaved, plain_saved.y, plain_saved.bias, activation)
    assert cp.array_equal(fused_g, plain_g, equal_nan=True)


INTO_POOL_CASES = [  # producer x, producer weight, its padding, its activation, consumer weight, its padding, NaN
    ((3, 1, 28, 28), (6, 1, 5, 5), 2, "gelu", (16, 6, 5, 5), 0, False),   # LeNet-5's; 14 columns: a partial group
    ((2, 2, 10, 14), (3, 2, 3, 3), 1, "gelu", (4, 3, 3, 3), 1, True),     # 14 producer columns: no vector stores
    ((2, 3, 12, 12), (4, 3, 5, 5), 0, "relu", (6, 4, 3, 3), 0, False),
    ((2, 2, 8, 8), (5, 2, 3, 3), 1, None, (4, 5, 3, 3), (1, 0, 2, 1), False),   # no activation, asymmetric padding
]


def _pooled_pair(case, dtype, rng, nan_at, needs=(True, True, True)):
    """A producer convolution pooled in its epilogue and a consumer convolution of its pooled output, from a case
    (x, w1, padding, activation, w2, padding, NaN): (x, w1, b1, w2, saved1, saved2, dout of the consumer)."""
    xs, w1s, p1, act, w2s, p2, nan = case
    x = rng.standard_normal(xs).astype(dtype)
    if nan:
        x[nan_at] = np.nan
    w1 = (rng.standard_normal(w1s) / np.sqrt(np.prod(w1s[1:]))).astype(dtype)
    w2 = (rng.standard_normal(w2s) / np.sqrt(np.prod(w2s[1:]))).astype(dtype)
    b1, b2 = rng.standard_normal(w1s[0]).astype(dtype), rng.standard_normal(w2s[0]).astype(dtype)
    out1, s1 = ops.conv2d_forward(g(x), g(w1), g(b1), 1, p1, 1, 1, act, needs_input_grad=needs, pool=POOL_2X2)
    assert s1.pool is not None
    out2, s2 = ops.conv2d_forward(out1, g(w2), g(b2), 1, p2, 1, 1, None)
    return x, w1, b1, w2, s1, s2, g(rng.standard_normal(out2.shape).astype(dtype))


def _pooled_producer_grads(case, x, w1, b1, w2, dout):
    """The float64 reference (dw, db) of the producer in _pooled_pair: its output's 2x2 max pooling routes the
    consumer's input gradient to each window's first maximum."""
    _, w1s, p1, act, w2s, p2, _ = case
    geom1 = ((1, 1), _pads(p1, w1s[2:], (1, 1)), (1, 1), 1)
    geom2 = ((1, 1), _pads(p2, w2s[2:], (1, 1)), (1, 1), 1)
    pre1, _ = ref.conv2d(x, w1, b1, *geom1)
    n, o, h, wd = pre1.shape
    windows = ref.act(pre1, act).reshape(n, o, h // 2, 2, wd // 2, 2).transpose(0, 1, 2, 4, 3, 5)
    windows = windows.reshape(n, o, h // 2, wd // 2, 4)
    rdh, _, _ = ref.conv2d_grads(windows.max(axis=-1), w2, dout.get(), *geom2)
    first = windows.argmax(axis=-1)   # the first maximum, as torch's (no ties in these random values)
    unpooled = (np.arange(4) == first[..., None]) * rdh[..., None]
    dh1 = unpooled.reshape(n, o, h // 2, wd // 2, 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(n, o, h, wd)
    _, rdw1, rdb1 = ref.conv2d_grads(x, w1, ref.act_grad(dh1, pre1, act), *geom1)
    return rdw1, rdb1


@pytest.mark.parametrize("to6", [False, True], ids=["to4", "to6"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", INTO_POOL_CASES)
def test_tile_conv_into_a_pooled_producer(case, dtype, to6, rng, monkeypatch, tune):
    """The consumer's input gradient written as the g of a producer that pooled in its epilogue (tile_conv_pool):
    through the pooling's backward in tile_conv_unpool's epilogue, bit-equal to the consumer's plain dx, then
    max_pool2d_backward_act (NaNs included), and the producer's gradients from it within rounding of the float64
    reference; the producer's weight gradient is not taken in the epilogue (it pooled). to6: TILE_TO6 (LeNet-5's
    layers: both kernels with 6 channels a thread)."""
    act, nan = case[3], case[6]
    tune(tile_to6_threads_per_sm=0 if to6 else 1 << 30)   # 6 channels a thread on the small cases too, or never
    tune(tile_dx_min_threads_per_sm=0)
    x, w1, b1, w2, s1, s2, dout = _pooled_pair(case, dtype, rng, (1, 0, 3, 5))
    handed, _, _ = ops.conv2d_backward(dout, s2, into=s1)
    assert isinstance(handed, conv_kernels.ProducerGrad) and handed.wpartial is None
    plain_dx, _, _ = ops.conv2d_backward(dout, s2)
    plain_g = ops.max_pool2d_backward_act(plain_dx, s1.pool, s1.y, s1.bias, act)
    assert handed.g.shape == plain_g.shape and cp.array_equal(handed.g, plain_g, equal_nan=True)
    assert bool(cp.isnan(handed.g).any()) == nan   # GELU's derivative at the NaNs
    if nan:
        return
    _, dw1, db1 = ops.conv2d_backward(None, s1, g=handed.g)
    rdw1, rdb1 = _pooled_producer_grads(case, x, w1, b1, w2, dout)
    tol = ref.tol(dtype)
    assert_close(dw1, rdw1, tol, name="dw")
    assert_close(db1, rdb1, tol, name="db")


POOLED_WGRAD_CASES = [  # first layer's x, its weight, padding, activation; the second's weight, padding; a NaN
    ((5, 1, 28, 28), (6, 1, 5, 5), 0, "gelu", (16, 6, 5, 5), 0, False),   # LeNet-5's two layers
    ((3, 1, 14, 18), (4, 1, 5, 5), 2, "relu", (5, 4, 3, 3), 0, True),      # padded, 7 x 9 windows, a NaN
    ((2, 1, 12, 12), (3, 1, 5, 5), 2, None, (4, 3, 3, 3), 0, False),
    ((3, 1, 14, 18), (4, 1, 3, 3), 1, "relu", (5, 4, 3, 3), 1, True),      # both 3 x 3: the fused epilogue, a NaN
    ((2, 1, 12, 10), (3, 1, 5, 5), 2, "gelu", (4, 3, 5, 5), 2, True),      # 6 x 5 windows (3 tiles of 2 rows), an inf
    ((2, 3, 12, 12), (4, 3, 5, 5), 2, "relu", (5, 4, 5, 5), 2, False),     # three input channels: pooled_wgrad only
]


@pytest.mark.parametrize("splits", [None, 1], ids=["planned_splits", "1split"])
@pytest.mark.parametrize("rows", [None, 2], ids=["planned", "2rows"])
@pytest.mark.parametrize("to6", [False, True], ids=["to4", "to6"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", POOLED_WGRAD_CASES)
def test_pooled_wgrad_from_the_maxima(case, dtype, to6, rows, splits, rng, conv_launches, tune):
    """A first layer that pooled in its epilogue: its weight and bias gradients from its g at the windows' maxima
    only, where the layers' kernels are the same size in tile_conv_unpool_wgrad's epilogue (no g written), else the
    second layer's input gradient writes that g (tile_conv_unpool, compact) and pooled_wgrad sums them: against the
    same gradients from its full g ("dense": the second layer's dx, the pooling's backward, tile_wgrad) and the
    float64 reference; with a non-finite x, NaN exactly where those are (the taps that read it from a position whose
    g is 0). to6: 6 channels a thread; rows: the input gradient's rows per block (2: several tiles an image, the last
    one partial); splits: its channel splits (1: a block of CG*TH*OG threads, fewer than an eighth of the O*TH*Wo
    windows where O*Wo > 8*CG*OG, e.g. 4 channels of 9 windows a row: the epilogue's spread pass takes two turns of
    8 a thread)."""
    tune(tile_to6_threads_per_sm=0 if to6 else 1 << 30)   # 6 channels a thread on the small cases too, or never
    tune(tile_dx_min_threads_per_sm=0)
    tune(tile_rows=rows)
    tune(tile_splits=splits)
    tune(tile_min_k=0)   # a 3 x 3 first layer's forward pooled in its epilogue too
    x, w1, b1, w2, s1, s2, dout = _pooled_pair(case, dtype, rng, (1, 0, 4, 6), needs=(False, True, True))
    if case[4][2:] == case[1][2:] and case[6]:   # an inf instead of the NaN where both kernels are the same size
        x[1, 0, 4, 6] = np.inf
        s1.x[1, 0, 4, 6] = np.inf
    fused = case[4][2:] == case[1][2:] and case[0][1] == 1   # tile_conv_unpool_wgrad: one input channel
    launched = conv_launches
    grads = {}
    handed, _, _ = ops.conv2d_backward(dout, s2, into=s1)
    assert isinstance(handed, conv_kernels.ProducerGrad)
    assert handed.g is None and handed.wpartial is not None
    assert any(name.startswith("tile_conv_unpool_wgrad") for name in launched) == fused, launched
    assert any(name.startswith("pooled_wgrad") for name in launched) == (not fused), launched
    launched.clear()
    _, dw1, db1 = ops.conv2d_backward(None, s1, g=handed.g, wpartial=handed.wpartial)
    assert launched == ["wgrad_reduce"], launched
    grads["fused"] = (dw1.get(), db1.get())
    dx2, _, _ = ops.conv2d_backward(dout, s2)   # no producer offered: dx, then the producer's pooling backward
    _, dw1, db1 = ops.conv2d_backward(None, s1, dpool=dx2)
    grads["dense"] = (dw1.get(), db1.get())
    tol = ref.tol(dtype)
    for setting in ("fused",):
        for got, want in zip(grads[setting], grads["dense"]):
            assert np.array_equal(np.isnan(got), np.isnan(want)), setting
            assert_close(got[~np.isnan(got)], want[~np.isnan(want)], tol, name=f"{setting} vs tile_wgrad")
    if case[6]:   # the taps that pair the NaN (or inf) with any position, winner or not (0 * NaN), as the dense sum
        assert np.isnan(grads["fused"][0]).any()
        assert not np.isnan(grads["fused"][1]).any() or case[3] != "relu"   # (GELU's derivative at inf is NaN)
        return
    rdw1, rdb1 = _pooled_producer_grads(case, x, w1, b1, w2, dout)
    assert_close(grads["fused"][0], rdw1, tol, name="dw")
    assert_close(grads["fused"][1], rdb1, tol, name="db")


POOLED_GRADIENT_CASES = [  # producer x, its weight, padding, activation; consumer weight, padding, activation; NaN
    ((5, 1, 28, 28), (6, 1, 5, 5), 0, "gelu", (16, 6, 5, 5), 0, "gelu", False),   # LeNet-5's two layers
    ((3, 1, 12, 16), (4, 1, 5, 5), 2, "relu", (5, 4, 3, 3), 1, "relu", True),     # 3 x 4 windows, a NaN
    ((2, 2, 12, 12), (3, 2, 5, 5), 2, None, (4, 3, 3, 3), 1, "gelu", True),       # two input channels
    ((2, 1, 12, 12), (3, 1, 5, 5), 2, "gelu", (4, 3, 5, 5), 2, None, False),      # no consumer activation
]


@pytest.mark.parametrize("producer_needs_dx", [False, True], ids=["first_layer", "inner_layer"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", POOLED_GRADIENT_CASES)
def test_input_gradient_from_the_pooled_gradient(case, dtype, producer_needs_dx, rng, conv_launches, tune):
    """A convolution that pooled in its epilogue, reading a producer that pooled too: conv2d_backward from its pooled
    output's gradient (dpool) bit-equal to conv2d_backward from the g that the pooling's backward makes of it (NaNs
    and the non-finite maxima's neighbours included), the input gradient through tile_conv_unpool or
    tile_conv_unpool_wgrad. A dpool of the wrong shape or with a g is refused before any kernel runs."""
    xs, w1s, p1, act1, w2s, p2, act2, nan = case
    tune(tile_dx_min_threads_per_sm=0)
    x = rng.standard_normal(xs).astype(dtype)
    if nan:
        x[1, 0, 5, 6] = np.nan
    w1 = (rng.standard_normal(w1s) / np.sqrt(np.prod(w1s[1:]))).astype(dtype)
    w2 = (rng.standard_normal(w2s) / np.sqrt(np.prod(w2s[1:]))).astype(dtype)
    b1, b2 = g(rng.standard_normal(w1s[0]).astype(dtype)), g(rng.standard_normal(w2s[0]).astype(dtype))
    needs1 = (producer_needs_dx, True, True)
    out1, s1 = ops.conv2d_forward(g(x), g(w1), b1, 1, p1, 1, 1, act1, needs_input_grad=needs1, pool=POOL_2X2)
    out2, s2 = ops.conv2d_forward(out1, g(w2), b2, 1, p2, 1, 1, act2, pool=POOL_2X2)
    assert s1.pool is not None and s2.pool is not None
    dpool = g(rng.standard_normal(out2.shape).astype(dtype))
    launched = conv_launches
    g2 = ops.max_pool2d_backward_act(dpool, s2.pool, s2.y, s2.bias, s2.activation)
    results = {}
    for given in ("dpool", "g"):
        launched.clear()
        if given == "dpool":
            handed, dw2, db2 = ops.conv2d_backward(None, s2, into=s1, dpool=dpool)
        else:
            handed, dw2, db2 = ops.conv2d_backward(None, s2, into=s1, g=g2)
        assert isinstance(handed, conv_kernels.ProducerGrad)
        assert any(name.startswith("tile_conv_unpool") for name in launched), launched
        results[given == "dpool"] = [a for a in (handed.g, handed.wpartial, dw2, db2) if a is not None]
    assert len(results[True]) == len(results[False]) >= 3
    for got, want in zip(results[True], results[False]):
        assert got.shape == want.shape and bool(cp.array_equal(got, want, equal_nan=True))
    if act2 is not None:   # the NaN reaches the consumer's y: the pooling backward takes its non-finite maxima path too
        assert bool(cp.isnan(s2.y).any()) == nan
    with pytest.raises(RuntimeError, match="expected dpool of shape"):
        ops.conv2d_backward(None, s2, into=s1, dpool=dpool[:, :, :1])
    with pytest.raises(RuntimeError, match="dpool comes alone"):
        ops.conv2d_backward(None, s2, g=cp.zeros((w2s[0], 1), dtype), dpool=dpool)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [TILE_WGRAD_CASES[0], POOLED_WGRAD_CASES[2]], ids=["wgrad", "unpool_wgrad"])
def test_tile_conv_arranged_weights_into_the_producer(case, dtype, rng, monkeypatch, tune):
    """TILE_ARRANGE with the input gradient written into its producer (tile_conv_wgrad; tile_conv_unpool_wgrad,
    where the producer pooled): the g handed over, the producer's partial rows and the consumer's own gradients
    bit-equal to tile_conv's own staging of w."""
    tune(tile_dx_min_threads_per_sm=0)
    tune(tile_arrange_min_copies=0)
    pooled = len(case) == 7
    got = {}
    for on in (False, True):
        tune(tile_arrange_min_copies=0 if on else 1 << 30)
        r = np.random.default_rng(3)
        if pooled:
            _, _, _, _, s1, s2, dout = _pooled_pair(case, dtype, r, (1, 0, 4, 6), needs=(False, True, True))
        else:
            xs, w1s, p1, act, w2s, p2 = case
            w1 = g((r.standard_normal(w1s) / np.sqrt(np.prod(w1s[1:]))).astype(dtype))
            w2 = g((r.standard_normal(w2s) / np.sqrt(np.prod(w2s[1:]))).astype(dtype))
            out1, s1 = ops.conv2d_forward(g(r.standard_normal(xs).astype(dtype)), w1,
                                          g(r.standard_normal(w1s[0]).astype(dtype)), 1, p1, 1, 1, act)
            out2, s2 = ops.conv2d_forward(out1, w2, g(r.standard_normal(w2s[0]).astype(dtype)), 1, p2, 1, 1, None)
            dout = g(r.standard_normal(out2.shape).astype(dtype))
        assert (s2.arranged_dx is not None) == on or dtype == np.float64
        handed, dw2, db2 = ops.conv2d_backward(dout, s2, into=s1)
        if not isinstance(handed, conv_kernels.ProducerGrad):   # float64: a tile may not fit in shared memory
            assert dtype == np.float64
            return
        got[on] = [a for a in (handed.g, handed.wpartial, dw2, db2) if a is not None]
    assert len(got[True]) == len(got[False]) >= 3
    for a, own in zip(got[True], got[False]):
        assert bool(cp.array_equal(a, own))


def test_tile_conv_pool_declines_other_poolings():
    """3x3 windows, stride 1, padding, odd output sizes: no pooling epilogue (the caller pools)."""
    x, w = cp.ones((2, 3, 11, 11), cp.float32), cp.ones((4, 3, 3, 3), cp.float32)
    for pool in (((3, 3), (3, 3), (0, 0), (1, 1)), ((2, 2), (1, 1), (0, 0), (1, 1)),
                 ((2, 2), (2, 2), (1, 1), (1, 1))):
        out, saved = ops.conv2d_forward(x, w, None, 1, 0, 1, 1, "relu", pool=pool)
        assert saved.pool is None and out.shape == (2, 4, 9, 9)
    out, saved = ops.conv2d_forward(x, w, None, 1, 0, 1, 1, "relu", pool=POOL_2X2)   # 9 x 9: odd
    assert saved.pool is None

"""CUDA convolution launchers against NumPy float64 references (tests/backend/cuda/cuda_reference.py). Skips
without CuPy or a GPU.

float32 tolerance: max|err| <= 1e-5 * max(1, max|ref|). The convolution GEMMs must run in full float32:
CuPy uses TF32 only when CUPY_TF32=1, and tests/backend/cuda/test_blas.py test_tf32_is_off fails if it is set.
"""
import numpy as np
import pytest

cp = pytest.importorskip("cupy")
import smalltrain  # noqa: E402

if not smalltrain.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import cuda_reference as ref  # noqa: E402

from smalltrain.backend.cuda import conv as conv_kernels  # noqa: E402
from smalltrain.backend.cuda import ops  # noqa: E402
from smalltrain.testing import assert_close  # noqa: E402

DTYPES = [np.float32, np.float64]


def g(a):
    return cp.asarray(a)


# --- convolution ------------------------------------------------------------------------------------------------

CONV_CASES = [  # x shape, out channels, kernel, stride, padding, dilation, groups, activation, bias
    ((3, 4, 11, 9), 5, (3, 3), 1, 1, 1, 1, None, True),
    ((2, 6, 10, 13), 4, (3, 2), (2, 1), (1, 0), (1, 2), 2, "relu", True),
    ((2, 3, 9, 9), 6, (5, 5), 2, 2, 1, 3, "gelu", True),
    ((1, 2, 7, 8), 3, (3, 3), 1, "same", 2, 1, "gelu_tanh", False),
    ((3, 1, 28, 28), 6, (5, 5), 1, 0, 1, 1, "relu", True),
    ((2, 3, 8, 7), 5, (2, 3), (3, 2), (1, 0, 2, 1), 1, 1, None, True),
    # the direct path's limits: 8 outputs per thread (32 * 251 of them), padding before the first image's rows,
    # more position tiles than blocks (each block sums several), MnistCnn's second layer
    ((3, 10, 12, 12), 32, (5, 5), 1, 2, 1, 1, "gelu", True),
    ((256, 1, 28, 28), 6, (5, 5), 1, 0, 1, 1, "gelu", True),
    ((4, 16, 26, 26), 32, (3, 3), 1, 0, 1, 1, "relu", True),
    # more images than the direct kernels stage one by one (8 per SM): their grid-stride layout
    ((1100, 2, 6, 5), 3, (3, 2), 1, (1, 0), 1, 1, "gelu", True),
    # past the direct kernels' C*KH*KW (the implicit GEMM's reduction slices, 16 and 32 channel tiles), and past
    # the implicit GEMM's tap table (im2col)
    ((2, 40, 9, 8), 40, (3, 3), (2, 1), (1, 2), (1, 2), 1, "gelu", True),
    ((3, 30, 7, 7), 6, (3, 3), 1, "same", 1, 1, "relu", False),
    ((1, 130, 5, 5), 3, (3, 3), 1, 0, 1, 1, None, True),
]


def _pads(padding, kernel, dilation):
    if padding == "same":
        out = []
        for k, d in zip(kernel, dilation):
            total = d * (k - 1)
            out += [total // 2, total - total // 2]
        return tuple(out)
    if isinstance(padding, int):
        return (padding,) * 4
    if len(padding) == 2:
        return (padding[0], padding[0], padding[1], padding[1])
    return tuple(padding)


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


@pytest.mark.parametrize("path", ["direct", "im2col", "direct_bwd", "igemm", "igemm_dw", "tiled_dw"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d(case, dtype, path, rng, record_kernels, monkeypatch):
    """direct: every kernel of the direct path where it fits, the implicit-GEMM forward where not; im2col: none of
    them; direct_bwd: the forward through im2col + GEMM, dx by the direct gather kernel (larger convolutions than
    the direct forward takes), dw by cuBLAS; igemm: the forward by the implicit GEMM, the backward as direct_bwd
    with dw by the implicit GEMM from x; igemm_dw / tiled_dw: as direct, with every dw from x by the implicit GEMM /
    the tiled kernel where it fits."""
    shape, o, kernel, stride, padding, dilation, groups, activation, bias = case
    monkeypatch.setattr(conv_kernels, "TILE_CONV", False)   # test_tile_conv and test_tile_wgrad check the kernels
    monkeypatch.setattr(conv_kernels, "TILE_WGRAD", False)  # that come first
    monkeypatch.setattr(conv_kernels, "DIRECT_DX_MIN_THREADS_PER_SM", 0)   # the gather kernel on these small cases
    if path == "igemm_dw":
        monkeypatch.setattr(conv_kernels, "IGEMM_WGRAD_MIN_USE", 0)
    if path == "tiled_dw":
        monkeypatch.setattr(conv_kernels, "IGEMM_WGRAD_MIN_USE", 2)
    if path == "im2col":
        monkeypatch.setattr(conv_kernels, "DIRECT_MAX_K", 0)
    if path in ("im2col", "direct_bwd"):
        monkeypatch.setattr(conv_kernels, "IGEMM_MAX_K", 0)
    launched = record_kernels(conv_kernels, "get")
    took_dx = []
    if path in ("direct_bwd", "igemm"):
        monkeypatch.setattr(conv_kernels, "DIRECT_MAX_MACS", 0)
        real = conv_kernels._direct_dx
        monkeypatch.setattr(conv_kernels, "_direct_dx", lambda *a: took_dx.append(real(*a)) or took_dx[-1])
    x = rng.standard_normal(shape).astype(dtype)
    w = (rng.standard_normal((o, shape[1] // groups) + kernel) * 0.5).astype(dtype)
    b = rng.standard_normal(o).astype(dtype) if bias else None
    out, saved = ops.conv2d_forward(g(x), g(w), None if b is None else g(b), stride, padding, dilation, groups,
                                    activation)
    # groups == 1 and C*KH*KW <= 256 take the direct kernels (they keep x, not cols) when their shared-memory
    # tiles fit (all these cases in float32; not 32 x 250 in float64), everything else im2col
    w_shape, itemsize = (o, shape[1] // groups) + kernel, np.dtype(dtype).itemsize
    fits = conv_kernels._direct(shape, w_shape, saved.out_hw, groups, itemsize)
    wgrad_fits = conv_kernels._direct_wgrad(shape, w_shape, saved.out_hw, groups, itemsize)
    small = groups == 1 and shape[1] * kernel[0] * kernel[1] <= 256   # C*KH*KW within DIRECT_MAX_K
    # float32: every small case fits (the direct forward's work limit is 0 on the direct_bwd and igemm paths)
    direct = path in ("direct", "igemm_dw", "tiled_dw")
    assert not direct or fits == small or dtype == np.float64
    assert path == "im2col" or wgrad_fits == (small and direct) or dtype == np.float64
    # the implicit GEMM takes the forward where the direct kernel does not and its tap table fits
    igemm = (path == "igemm" or (direct and not fits)) and conv_kernels._igemm(
        shape, w_shape, saved.out_hw, groups, _pair(dilation))
    assert any(name.startswith("igemm_fwd") for name in launched) == igemm, launched
    assert path != "igemm" or igemm == (groups == 1 and shape[1] * kernel[0] * kernel[1] <= 1024)
    # x is kept where no cols matrix was made or the tiled weight gradient reads it, else cols
    assert (saved.x is not None) == (wgrad_fits or igemm), (saved.x is None, saved.cols is None)
    assert (saved.cols is None) == (saved.x is not None)
    geom = (_pair(stride), _pads(padding, kernel, _pair(dilation)), _pair(dilation), groups)
    pre, _ = ref.conv2d(x, w, b, *geom)
    tol = ref.tol(dtype)
    assert out.dtype == dtype
    assert_close(out, ref.act(pre, activation), tol, name="conv2d forward")
    dout = rng.standard_normal(pre.shape).astype(dtype)
    launched.clear()
    dx, dw, db = ops.conv2d_backward(g(dout), saved)
    # dw from x where the forward kept it: the tiled kernel within its rule where the implicit GEMM's tiles are
    # less than half used (igemm_dw: never, tiled_dw: always), else the implicit GEMM (every case here fits it);
    # cuBLAS over the kept cols otherwise
    use = conv_kernels._wgrad_tile(o, shape[1] // groups * kernel[0] * kernel[1] + 1)[1]
    tiled = wgrad_fits and path != "igemm_dw" and (use < 0.5 or path == "tiled_dw")
    assert any(name.startswith("wgrad_partial") for name in launched) == tiled, launched
    assert any(name.startswith("igemm_wgrad") for name in launched) == (saved.x is not None and not tiled), launched
    rdx, rdw, rdb = ref.conv2d_grads(x, w, ref.act_grad(dout, pre, activation), *geom)
    assert_close(dx, rdx, tol, name="dx")
    if path in ("direct_bwd", "igemm"):   # float32: the gather kernel took dx of the small cases
        assert (took_dx[0] is not None) == small or dtype == np.float64
    assert_close(dw, rdw, tol, name="dw")
    if bias:
        assert_close(db, rdb, tol, name="db")
    else:
        assert db is None


@pytest.mark.parametrize("tile", conv_kernels._WG_TILES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [CONV_CASES[0], CONV_CASES[3], CONV_CASES[5], CONV_CASES[8], CONV_CASES[10]])
def test_conv2d_weight_gradient_by_each_implicit_gemm_tile(case, dtype, tile, rng, monkeypatch):
    """Every igemm_wgrad tile on shapes that leave partial tiles, padding, strides and dilation, with and without
    bias (the bias column of the tap table), dw and db against the float64 reference."""
    shape, o, kernel, stride, padding, dilation, groups, activation, bias = case
    monkeypatch.setattr(conv_kernels, "IGEMM_WGRAD_MIN_USE", 0)
    monkeypatch.setattr(conv_kernels, "TILE_WGRAD", False)
    monkeypatch.setattr(conv_kernels, "_WG_TILE", tile)
    x = rng.standard_normal(shape).astype(dtype)
    w = (rng.standard_normal((o, shape[1]) + kernel) * 0.5).astype(dtype)
    b = rng.standard_normal(o).astype(dtype) if bias else None
    out, saved = ops.conv2d_forward(g(x), g(w), None if b is None else g(b), stride, padding, dilation, groups,
                                    activation)
    assert conv_kernels._wgrad_kernel(saved, np.dtype(dtype).itemsize) == "igemm"
    geom = (_pair(stride), _pads(padding, kernel, _pair(dilation)), _pair(dilation), groups)
    _check_weight_grads(x, w, b, saved, geom, activation, rng)


def _check_weight_grads(x, w, b, saved, geom, activation, rng):
    """dw and db (None without a bias) of conv2d_backward from `saved` against the float64 reference."""
    pre, _ = ref.conv2d(x, w, b, *geom)
    dout = rng.standard_normal(pre.shape).astype(x.dtype)
    _, dw, db = ops.conv2d_backward(g(dout), saved)
    _, rdw, rdb = ref.conv2d_grads(x, w, ref.act_grad(dout, pre, activation), *geom)
    assert_close(dw, rdw, ref.tol(x.dtype), name="dw")
    assert (db is None) == (b is None)
    if b is not None:
        assert_close(db, rdb, ref.tol(x.dtype), name="db")


TILE_CASES = [  # x shape, out channels, kernel size, padding, activation, bias
    ((4, 16, 26, 26), 32, 3, 0, "relu", True),        # MnistCnn's second layer (dx: 26 columns, 7 column groups)
    ((3, 1, 28, 28), 6, 5, 0, "gelu", True),          # LeNet-5's first (6 of 8 channels used)
    ((5, 6, 12, 12), 16, 5, 0, "gelu", True),         # LeNet-5's second (2 column groups)
    ((2, 3, 9, 13), 5, 3, 1, None, False),            # 13 columns: a partial column group; 5 channels
    ((2, 4, 7, 10), 3, 3, (1, 0, 2, 1), "gelu_tanh", True),   # asymmetric padding
    ((1, 2, 6, 5), 9, 5, "same", "relu", True),       # padding past the kernel's reach on the bottom/right
    ((2, 3, 11, 6), 4, 5, 4, None, True),             # padding larger than the dx correlation's own (pt < 0)
    ((2, 6, 10, 9), 18, 5, 2, "relu", True),          # 18 channels: three groups of 6 (TILE_TO6), 9 columns
]


def _force_tile_plan(monkeypatch, plan):
    """tile_conv on every case (the kernel's values, not where it pays), its plan as planned or with one choice
    forced: "4 channels" / "8 channels" per thread, "6 channels" where that leaves no dead channel (TILE_TO6),
    "row tiles" (3 rows per block: 9 of 12, 26 of 28 ... the last partial), "K channel splits"."""
    monkeypatch.setattr(conv_kernels, "TILE_MIN_K", 0)
    monkeypatch.setattr(conv_kernels, "TILE_DX_MIN_THREADS_PER_SM", 0)
    if plan == "4 channels":
        monkeypatch.setattr(conv_kernels, "_TILE_TO8_THREADS_PER_SM", 1 << 30)
    if plan == "8 channels":
        monkeypatch.setattr(conv_kernels, "_TILE_TO8_THREADS_PER_SM", 0)
    if plan == "6 channels":
        monkeypatch.setattr(conv_kernels, "TILE_TO6", True)
        monkeypatch.setattr(conv_kernels, "_TILE_TO6_THREADS_PER_SM", 0)
    if plan == "row tiles":
        monkeypatch.setattr(conv_kernels, "_TILE_ROWS", 3)
    if plan.endswith("channel splits"):
        monkeypatch.setattr(conv_kernels, "_TILE_SPLITS", int(plan[0]))


@pytest.mark.parametrize("plan", ["as planned", "4 channels", "8 channels", "6 channels", "row tiles",
                                  "2 channel splits", "3 channel splits"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", TILE_CASES)
def test_tile_conv(case, dtype, plan, rng, record_kernels, monkeypatch):
    """tile_conv takes the forward and dx of stride-1, undilated 3x3 and 5x5 convolutions (whatever the padding),
    against the float64 reference, on its own choices and with each forced: 4, 8 or 6 channels per thread, blocks
    of few rows (several row tiles per image, the last one partial), the input channels split over 2 or 3 thread
    groups (uneven where C is not a multiple; one group where C is 1). dw by the implicit GEMM from the kept x."""
    shape, o, ks, padding, activation, bias = case
    _force_tile_plan(monkeypatch, plan)
    launched = record_kernels(conv_kernels, "get")
    x = rng.standard_normal(shape).astype(dtype)
    w = (rng.standard_normal((o, shape[1], ks, ks)) * 0.5).astype(dtype)
    b = rng.standard_normal(o).astype(dtype) if bias else None
    out, saved = ops.conv2d_forward(g(x), g(w), None if b is None else g(b), 1, padding, 1, 1, activation)
    # (and tile_arrange first where TILE_ARRANGE makes the weights' layouts)
    assert [n for n in launched if n.startswith("tile_conv")] == [n for n in launched if n != "tile_arrange"], launched
    to = int([n for n in launched if n != "tile_arrange"][0].split("_to")[1].split("_")[0])   # (an _arr suffix)
    assert plan not in ("4 channels", "8 channels") or to == int(plan[0])

    def six(channels):   # the channel counts TILE_TO6 takes: 6 per thread, none dead where 4 would leave some
        return plan == "6 channels" and ks == 5 and channels % 6 == 0 and channels % 4 != 0
    assert (to == 6) == six(o), (to, o)
    geom = ((1, 1), _pads(padding, (ks, ks), (1, 1)), (1, 1), 1)
    pre, _ = ref.conv2d(x, w, b, *geom)
    tol = ref.tol(dtype)
    assert_close(out, ref.act(pre, activation), tol, name="conv2d forward")
    assert saved.x is not None and saved.cols is None
    dout = rng.standard_normal(pre.shape).astype(dtype)
    launched.clear()
    dx, dw, db = ops.conv2d_backward(g(dout), saved)
    # dx by tile_conv where its tiles fit in shared memory: all of these in float32; in float64 not the weights of
    # MnistCnn's second layer beside a row of g's 32 channels
    dx_plan = conv_kernels._tile_plan(shape[0], o, saved.out_hw, shape[1], shape[2:], ks, np.dtype(dtype).itemsize)
    assert dx_plan is not None or dtype == np.float64
    assert sum(n.startswith("tile_conv") for n in launched) == (dx_plan is not None), launched
    assert dx_plan is None or any(n.startswith("tile_conv_k5_to6") for n in launched) == six(shape[1]), launched
    rdx, rdw, rdb = ref.conv2d_grads(x, w, ref.act_grad(dout, pre, activation), *geom)
    assert_close(dx, rdx, tol, name="dx")
    assert_close(dw, rdw, tol, name="dw")
    if bias:
        assert_close(db, rdb, tol, name="db")


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
def test_tile_conv_linear_epilogue(case, dtype, plan, rng, monkeypatch):
    """conv2d_forward's `linear`: tile_conv_lin's epilogue gives flatten(act(conv(x))) @ lw^T + lb beside the
    convolution's output, against the float64 reference: with the input channels split over 2 thread groups (the
    idle groups' threads still join the block sums), and with lw at an address no vector load may read (scalar
    loads). The same bits on a second call (its counters reset), and none left above zero."""
    shape, w_shape, padding, activation, f, bias, rows = case
    monkeypatch.setattr(conv_kernels, "TILE_MIN_K", 0)
    monkeypatch.setattr(conv_kernels, "_TILE_TO8_THREADS_PER_SM", 1 << 30)   # 4 channels a thread: whole warps
    if rows is not None:
        monkeypatch.setattr(conv_kernels, "_TILE_ROWS", rows)
    if plan == "2 channel splits":
        monkeypatch.setattr(conv_kernels, "_TILE_SPLITS", 2)
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
    plan_threads = conv_kernels._tile_plan(shape[0], shape[1], shape[2:], w_shape[0], out_hw, w_shape[2],
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
    assert int(conv_kernels.device_counters("tile_conv_lin", conv_kernels._TILE_LINEAR_IMAGES).max()) == 0


def test_tile_conv_linear_epilogue_declines_what_it_cannot_take(rng, monkeypatch):
    """17 outputs (over ST_LF), blocks of partial warps, TILE_LINEAR off: logits None (the caller runs the linear
    layer), the convolution's output unchanged."""
    x = g(rng.standard_normal((2, 4, 9, 13)).astype(np.float32))
    w = g(rng.standard_normal((5, 4, 3, 3)).astype(np.float32))
    monkeypatch.setattr(conv_kernels, "TILE_MIN_K", 0)
    monkeypatch.setattr(conv_kernels, "_TILE_TO8_THREADS_PER_SM", 1 << 30)
    monkeypatch.setattr(conv_kernels, "_TILE_ROWS", 4)   # 32 threads a block
    plain, _ = conv_kernels.conv2d_forward(x, w, None, 1, 1)
    for f, rows, on in [(17, 4, True), (3, 3, True), (3, 4, False)]:   # 3 rows: 24 threads
        monkeypatch.setattr(conv_kernels, "_TILE_ROWS", rows)
        monkeypatch.setattr(conv_kernels, "TILE_LINEAR", on)
        lw = g(np.ones((f, 5 * 9 * 13), np.float32))
        out, _, logits = conv_kernels.conv2d_forward(x, w, None, 1, 1, linear=(lw, None))
        assert logits is None, (f, rows, on)
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


@pytest.mark.parametrize("plan", ["as planned", "4 channels", "8 channels", "rows split", "one block, 2-row tiles",
                                  "no bias threads", "no bias threads, rows split", "vector copies",
                                  "vector copies, one block, 2-row tiles"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", TILE_CASES)
def test_tile_wgrad(case, dtype, plan, rng, monkeypatch):
    """tile_wgrad's dw and db (and no db without a bias) against the float64 reference on tile_conv's cases, as
    planned and with each choice forced: 4 or 8 channels per thread, the rows of a tile split over 2 or 3 thread
    groups (their sums added at the end), one block walking every tile of 2 rows through both staging buffers (the
    last tile of an odd row count partial), the bias summed without bias threads (TILE_WG_BIAS_SPREAD) by slices of
    the other threads, alone and beside a row split, the rows staged 16 or 8 bytes a copy where aligned
    (TILE_WG_VEC_STAGE), alone and through both buffers. The forced choices run with the bias threads and element
    copies unless they name the other; "as planned" with the defaults."""
    shape, o, ks, padding, activation, bias = case
    if plan != "as planned":   # the forced choices with the bias threads and element copies unless they name them
        monkeypatch.setattr(conv_kernels, "TILE_WG_BIAS_SPREAD", False)
        monkeypatch.setattr(conv_kernels, "TILE_WG_VEC_STAGE", plan.startswith("vector copies"))
    if plan == "4 channels":
        monkeypatch.setattr(conv_kernels, "_TILE_WG_TO8_THREADS", 1 << 30)
    if plan == "8 channels":
        monkeypatch.setattr(conv_kernels, "_TILE_WG_TO8_THREADS", 0)
    if plan == "rows split":
        monkeypatch.setattr(conv_kernels, "_TILE_WG_ROWS", 6)
        monkeypatch.setattr(conv_kernels, "_TILE_WG_SPLIT", 3)
    if plan.endswith("one block, 2-row tiles"):
        monkeypatch.setattr(conv_kernels, "_TILE_WG_ROWS", 2)
        monkeypatch.setattr(conv_kernels, "_TILE_WG_GRID", 1)
    if plan.startswith("no bias threads"):
        monkeypatch.setattr(conv_kernels, "TILE_WG_BIAS_SPREAD", "always")
    if plan == "no bias threads, rows split":
        monkeypatch.setattr(conv_kernels, "_TILE_WG_ROWS", 6)
        monkeypatch.setattr(conv_kernels, "_TILE_WG_SPLIT", 2)
    x = rng.standard_normal(shape).astype(dtype)
    w = (rng.standard_normal((o, shape[1], ks, ks)) * 0.5).astype(dtype)
    b = rng.standard_normal(o).astype(dtype) if bias else None
    _, saved = ops.conv2d_forward(g(x), g(w), None if b is None else g(b), 1, padding, 1, 1, activation)
    tile = conv_kernels._tile_wgrad_plan(saved, np.dtype(dtype).itemsize)
    if tile is None:   # only MnistCnn's second layer at 4 channels a thread: 8 x 49 threads, over a block's 256
        assert plan == "4 channels" and -(-o // 4) * (shape[1] * ks + 1) > 256
        return
    to, th, rs, threads, grid, _, wb = tile
    assert plan not in ("4 channels", "8 channels") or to == int(plan[0])
    # no bias threads wherever each channel keeps a thread: C*KS*RS >= TO (LeNet-5's first layer: 5 taps of 4 or 8)
    assert plan == "as planned" or wb == (0 if plan.startswith("no bias threads") and shape[1] * ks * rs >= to else 1)
    # the forced split where 3 row groups fit in a block (threads, and their sums in shared memory)
    base, itemsize = threads // rs, np.dtype(dtype).itemsize
    split_fits = 3 * base <= 256 and 3 * base * to * ks * itemsize <= 48 * 1024
    assert plan != "rows split" or (th <= 6 and (rs == 3) == split_fits)
    assert not plan.endswith("one block, 2-row tiles") or (grid == 1 and th <= 2)
    assert conv_kernels._wgrad_kernel(saved, np.dtype(dtype).itemsize) == "tile"
    _check_weight_grads(x, w, b, saved, ((1, 1), _pads(padding, (ks, ks), (1, 1)), (1, 1), 1), activation, rng)


@pytest.mark.parametrize("dtype", DTYPES)
def test_tile_wgrad_vector_copies_are_bit_equal(dtype, rng, monkeypatch):
    """TILE_WG_VEC_STAGE: the same dw and db bits as element copies on every tile case (only the staging changes),
    with the widths _copy_bytes gives: MnistCnn's second layer's g rows (24 wide) 16 bytes a copy, its x rows (26
    wide) 8 in float32 and 16 in float64; 13-wide rows one element (its itemsize)."""
    widths = []
    real = conv_kernels._copy_bytes
    monkeypatch.setattr(conv_kernels, "_copy_bytes", lambda *a: widths.append(real(*a)) or widths[-1])
    for shape, o, ks, padding, activation, bias in TILE_CASES:
        x = g(rng.standard_normal(shape).astype(dtype))
        w = g((rng.standard_normal((o, shape[1], ks, ks)) * 0.5).astype(dtype))
        b = g(rng.standard_normal(o).astype(dtype)) if bias else None
        out, saved = ops.conv2d_forward(x, w, b, 1, padding, 1, 1, activation)
        if conv_kernels._tile_wgrad_plan(saved, np.dtype(dtype).itemsize) is None:
            continue
        n, _, ho, wo = out.shape
        grad = g(rng.standard_normal((o, n * ho * wo)).astype(dtype))   # the output's g, [O, N*P]
        grads = {}
        for on in (False, True):
            monkeypatch.setattr(conv_kernels, "TILE_WG_VEC_STAGE", on)
            widths.clear()
            grads[on] = conv_kernels._tile_weight_grad(
                x, grad, saved, bias, conv_kernels._tile_wgrad_plan(saved, np.dtype(dtype).itemsize))
        assert len(widths) == 2, widths   # g's, then x's
        if shape == (4, 16, 26, 26):
            assert widths == [16, 8 if dtype == np.float32 else 16]
        if shape[3] == 13:
            assert widths == [np.dtype(dtype).itemsize] * 2
        for got, want in zip(grads[True], grads[False]):
            assert (got is None) == (want is None) and (got is None or bool(cp.array_equal(got, want)))


def test_tile_wgrad_is_bit_repeatable(rng):
    """A fixed tile order per block and a fixed reduction: the same bits on every call (MnistCnn's second layer)."""
    x = cp.asarray(rng.standard_normal((8, 16, 26, 26)), dtype=cp.float32)
    w = cp.asarray(rng.standard_normal((32, 16, 3, 3)), dtype=cp.float32)
    out, saved = ops.conv2d_forward(x, w, cp.zeros(32, dtype=cp.float32), activation="relu")
    dout = cp.asarray(rng.standard_normal(out.shape), dtype=cp.float32)
    assert conv_kernels._wgrad_kernel(saved, 4) == "tile"
    first = ops.conv2d_backward(dout, saved)
    for _ in range(3):
        again = ops.conv2d_backward(dout, saved)
        assert all(bool(cp.array_equal(a, b)) for a, b in zip(first, again))


@pytest.mark.parametrize("rows", [1, 37, 528, 1100])   # one row; a partial batch; LeNet-5's first layer; 3 batches
def test_wgrad_reduce_sums_the_rows_in_its_fixed_order(rows, rng):
    """wgrad_reduce's sums bit-equal to the order it promises (conv.cu): thread group r adds rows r, r + G, ... in
    order, then the G groups' sums in group order; dw and db split at each channel's K + 1 columns."""
    o, w_shape = 6, (6, 1, 5, 5)
    partial = rng.standard_normal((rows, o * 26)).astype(np.float32)
    dw, db = conv_kernels._reduce_partials(g(partial), g(np.zeros(w_shape, np.float32)), g(np.zeros(o, np.float32)))
    groups = max(1, min(32, -(-rows // conv_kernels._WR_ROWS)))
    sums = []
    for r in range(groups):
        acc = np.zeros(o * 26, np.float32)
        for s in range(r, rows, groups):
            acc = acc + partial[s]
        sums.append(acc)
    want = sums[0]
    for extra in sums[1:]:
        want = want + extra
    want = want.reshape(o, 26)
    assert np.array_equal(cp.asnumpy(dw).reshape(o, 25), want[:, :25]) and np.array_equal(cp.asnumpy(db), want[:, 25])


@pytest.mark.parametrize("on_main", [False, True], ids=["wgrad_beside", "dx_beside"])
@pytest.mark.parametrize("x_shape, w_shape, stride, wgrad", [
    ((8, 16, 26, 26), (32, 16, 3, 3), 1, "tile"),      # MnistCnn's second layer
    ((4, 6, 14, 14), (16, 6, 5, 5), 2, None),          # strided: another weight-gradient kernel
])
def test_weight_grad_beside_input_grad_gives_the_same_bits(x_shape, w_shape, stride, wgrad, on_main, rng,
                                                           monkeypatch):
    """conv2d_backward with the weight gradient on the side stream (WGRAD_BESIDE_MAX_OUTPUTS), or with
    WGRAD_ON_MAIN the input gradient there, returns what it returns on one stream, bit for bit, eagerly and as a
    CUDA graph replayed on new output gradients (the fork and the join are captured as edges; a missing join would
    let the replay's result be read before the side stream wrote it)."""
    monkeypatch.setattr(conv_kernels, "WGRAD_ON_MAIN", on_main)
    x = cp.asarray(rng.standard_normal(x_shape), dtype=cp.float32)
    w = cp.asarray(rng.standard_normal(w_shape) * 0.2, dtype=cp.float32)
    out, saved = ops.conv2d_forward(x, w, cp.asarray(rng.standard_normal(w_shape[0]), dtype=cp.float32),
                                    stride=stride, activation="relu")
    if wgrad is not None:
        assert conv_kernels._wgrad_kernel(saved, 4) == wgrad
    douts = [cp.asarray(rng.standard_normal(out.shape), dtype=cp.float32) for _ in range(3)]
    monkeypatch.setattr(conv_kernels, "WGRAD_BESIDE_MAX_OUTPUTS", 0)
    alone = [ops.conv2d_backward(d, saved) for d in douts]
    monkeypatch.setattr(conv_kernels, "WGRAD_BESIDE_MAX_OUTPUTS", 1 << 40)
    for d, want in zip(douts, alone):
        got = ops.conv2d_backward(d, saved)
        assert all(a is not None and bool(cp.array_equal(a, b)) for a, b in zip(got, want))
    static = douts[0].copy()
    cp.cuda.Device().synchronize()
    graph = smalltrain.cuda.CUDAGraph()
    with smalltrain.cuda.graph(graph):
        got = ops.conv2d_backward(static, saved)
    for d, want in zip(douts[1:], alone[1:]):
        static[...] = d
        graph.replay()
        smalltrain.cuda.synchronize()
        assert all(bool(cp.array_equal(a, b)) for a, b in zip(got, want))


def test_tile_conv_leaves_other_geometries_to_the_other_kernels(rng, record_kernels, monkeypatch):
    """Strided, dilated, grouped and non-square convolutions do not launch tile_conv (nor do kernel sizes it is not
    compiled for), and its forward writes y (the sum before bias) exactly where an activation needs it."""
    launched = record_kernels(conv_kernels, "get")
    for kwargs, w_shape in [({"stride": 2}, (4, 3, 3, 3)), ({"dilation": 2}, (4, 3, 3, 3)),
                            ({"groups": 3}, (6, 1, 3, 3)), ({}, (4, 3, 3, 2)), ({}, (4, 3, 2, 2)), ({}, (4, 3, 7, 7))]:
        x = cp.asarray(rng.standard_normal((2, 3, 9, 9)), dtype=cp.float32)
        w = cp.asarray(rng.standard_normal(w_shape), dtype=cp.float32)
        launched.clear()
        _, saved = ops.conv2d_forward(x, w, None, **kwargs)
        ops.conv2d_backward(cp.ones((2, w_shape[0]) + saved.out_hw, dtype=cp.float32), saved)
        assert not any(n.startswith("tile_conv") for n in launched), (kwargs, w_shape, launched)
    x = cp.asarray(rng.standard_normal((2, 3, 9, 9)), dtype=cp.float32)
    w = cp.asarray(rng.standard_normal((4, 3, 3, 3)), dtype=cp.float32)
    b = cp.asarray(rng.standard_normal(4), dtype=cp.float32)
    launched.clear()
    _, saved = ops.conv2d_forward(x, w, b, activation="relu")
    assert launched == ["tile_conv_k3_to4"] and saved.y is not None
    assert_close(saved.y.reshape(4, 2, 7, 7).transpose(1, 0, 2, 3) + b[None, :, None, None],
                 ops.conv2d_forward(x, w, b)[0], 1e-5, name="y + b")
    _, saved = ops.conv2d_forward(x, w, b)
    assert saved.y is None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, o, kernel", [((64, 6, 12, 12), 16, (5, 5)), ((3, 10, 12, 12), 8, (3, 3)),
                                              ((2, 3, 8, 7), 5, (2, 3))])
def test_direct_forward_split_over_channels(shape, o, kernel, dtype, rng, monkeypatch):
    """The staged direct forward with each item's input channels summed by several threads (LeNet-5's second
    layer at batch 64, 10 channels over 4 threads, 3 over 2): the split is taken and the values are right. The
    launch is planned for an H200's 132 SMs whatever the GPU, so that the same cases split everywhere."""
    monkeypatch.setattr(conv_kernels, "_sm_count", lambda: 132)
    monkeypatch.setattr(conv_kernels, "TILE_CONV", False)
    real, splits = conv_kernels._direct_grid, []
    monkeypatch.setattr(conv_kernels, "_direct_grid", lambda *a: splits.append(real(*a)[2]) or real(*a))
    x = rng.standard_normal(shape).astype(dtype)
    w = (rng.standard_normal((o, shape[1]) + kernel) * 0.5).astype(dtype)
    b = rng.standard_normal(o).astype(dtype)
    out, _ = ops.conv2d_forward(g(x), g(w), g(b), 1, 0, 1, 1, "gelu")
    assert splits and splits[0] > 1, splits
    pre, _ = ref.conv2d(x, w, b, (1, 1), (0, 0, 0, 0), (1, 1), 1)
    assert_close(out, ref.act(pre, "gelu"), ref.tol(dtype), name="conv2d forward")


# --- linear (small tiled kernels / wide kernels / cuBLAS + epilogue) ------------------------------------------------


@pytest.mark.parametrize("p", [1, 63, 64, 577])   # below and above BIAS_ACT_ROWS_MIN_P: both kernels
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_act_backward_both_kernels(p, activation, dtype, rng):
    """g [O, N, P] = dout [N, O, P] * act'(y + b) with distinct sizes (N 3, O 5) so that a transposed index shows."""
    n, o = 3, 5
    dout = rng.standard_normal((n, o, p)).astype(dtype)
    y = rng.standard_normal((o, n, p)).astype(dtype)
    b = rng.standard_normal(o).astype(dtype)
    assert (p >= conv_kernels.BIAS_ACT_ROWS_MIN_P) == (p >= 64)
    for bias in (b, None):
        g_out = cp.empty((o, n * p), dtype=dtype)
        conv_kernels.bias_act_backward(g(dout), g(y), None if bias is None else g(bias), g_out, n, o, p,
                                       conv_kernels.ACTIVATIONS[activation])
        pre = y + (0 if bias is None else bias[:, None, None])
        want = ref.act_grad(dout.transpose(1, 0, 2), pre, activation).reshape(o, n * p)
        assert_close(g_out.get(), want, rtol=ref.tol(dtype), name=f"g (p={p}, {activation})")


def test_conv2d_saves_only_what_backward_needs(rng):
    x, w = g(rng.standard_normal((2, 3, 6, 6))), g(rng.standard_normal((4, 3, 3, 3)))
    _, saved = ops.conv2d_forward(x, w, None, needs_input_grad=(True, False, False))
    assert saved.cols is None and saved.y is None
    dx, dw, db = ops.conv2d_backward(g(rng.standard_normal((2, 4, 4, 4))), saved)
    assert dx is not None and dw is None and db is None


CONV_ERRORS = [  # x shape, x dtype, w shape, w dtype, kwargs, exception, message
    ((2, 3, 8, 8), "f4", (4, 2, 3, 3), "f4", {}, RuntimeError, "expected input with 2 channels"),
    ((3, 8, 8), "f4", (4, 3, 3, 3), "f4", {}, RuntimeError, "4-D"),
    ((2, 3, 8, 8), "f4", (4, 3, 3, 3), "f8", {}, RuntimeError, "dtype"),
    ((2, 3, 8, 8), "i4", (4, 3, 3, 3), "i4", {}, TypeError, "float32 and float64"),
    ((2, 3, 4, 4), "f4", (4, 3, 5, 5), "f4", {}, RuntimeError, "Kernel size can't be greater"),
    ((2, 3, 8, 8), "f4", (4, 3, 3, 3), "f4", {"stride": 0}, RuntimeError, "stride"),
    ((2, 3, 8, 8), "f4", (4, 3, 3, 3), "f4", {"padding": "same", "stride": 2}, RuntimeError, "strided"),
    ((2, 3, 8, 8), "f4", (4, 3, 3, 3), "f4", {"activation": "tanh"}, ValueError, "activation"),
    ((2, 4, 8, 8), "f4", (4, 2, 3, 3), "f4", {"groups": 3}, RuntimeError, "groups"),
]


@pytest.mark.parametrize("xs, xd, ws, wd, kwargs, exc, msg", CONV_ERRORS)
def test_conv2d_errors(xs, xd, ws, wd, kwargs, exc, msg):
    with pytest.raises(exc, match=msg):
        ops.conv2d_forward(cp.ones(xs, dtype=xd), cp.ones(ws, dtype=wd), None, **kwargs)


def test_conv2d_rejects_host_arrays_and_bad_bias():
    with pytest.raises(TypeError, match="cupy.ndarray"):
        ops.conv2d_forward(np.ones((1, 1, 4, 4), "f4"), cp.ones((1, 1, 3, 3), "f4"))
    with pytest.raises(RuntimeError, match="bias"):
        ops.conv2d_forward(cp.ones((1, 1, 4, 4), "f4"), cp.ones((2, 1, 3, 3), "f4"), cp.ones(3, "f4"))


# --- pooling (torch float64 on the CPU as the oracle) ---------------------------------------------------------


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
def test_tile_conv_wgrad_epilogue(case, dtype, plan, rng, monkeypatch):
    """A one-channel producer's weight and bias gradients in the consumer's input-gradient epilogue
    (tile_conv_wgrad): against the float64 reference, and those of the producer's own kernels (INTO_WGRAD off, the
    sums in another order); the g written for the producer is bit-equal either way."""
    xs, w1s, p1, act, w2s, p2 = case
    _force_tile_plan(monkeypatch, plan)
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
    monkeypatch.setattr(conv_kernels, "INTO_WGRAD", False)
    own, _, _ = ops.conv2d_backward(g(dout), s2, into=s1)
    assert own.wpartial is None and cp.array_equal(own.g, handed.g)
    _, own_dw1, own_db1 = ops.conv2d_backward(None, s1, g=own.g)
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
def test_tile_conv_pool_epilogue(case, dtype, activation, to6, rng, monkeypatch):
    """tile_conv's 2x2 max-pooling epilogue: the pooled output against the float64 reference, and bit-equal (values,
    indices, the backward's g) to the unfused path on the same plan (max_pool2d_forward on the convolution's output:
    ties of ReLU's zeros go to the first maximum, a NaN wins); with TILE_POOL off saved.pool is None. to6:
    TILE_TO6 (LeNet-5's first layer with 6 channels a thread)."""
    monkeypatch.setattr(conv_kernels, "TILE_TO6", to6)
    monkeypatch.setattr(conv_kernels, "_TILE_TO6_THREADS_PER_SM", 0)   # on the small cases too
    x_shape, w_shape, pad, rows, nan = case
    x = rng.standard_normal(x_shape).astype(dtype)
    if nan:
        x[1, 0, 3, 4] = np.nan
    w = (rng.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(dtype)
    b = rng.standard_normal(w_shape[0]).astype(dtype)
    plan_rows = rows if rows is not None else conv_kernels._tile_forward_plan(
        x_shape, w_shape, (x_shape[2] + 2 * pad - w_shape[2] + 1, x_shape[3] + 2 * pad - w_shape[3] + 1), (1, 1),
        (pad,) * 4, (1, 1), 1, np.dtype(dtype).itemsize, even_rows=True)[1]
    assert plan_rows % 2 == 0
    monkeypatch.setattr(conv_kernels, "_TILE_ROWS", plan_rows)   # the unfused run below on the same plan
    out, saved = ops.conv2d_forward(g(x), g(w), g(b), 1, pad, 1, 1, activation, pool=POOL_2X2)
    assert saved.pool is not None and out.shape == saved.pool[0].shape and saved.pool[0].dtype == cp.int64
    pre, _ = ref.conv2d(x, w, b, (1, 1), (pad,) * 4, (1, 1), 1)
    n, o, h, wd = pre.shape
    windows = ref.act(pre, activation).reshape(n, o, h // 2, 2, wd // 2, 2)
    with np.errstate(invalid="ignore"):
        assert_close(out, windows.max(axis=(3, 5)), ref.tol(dtype), name="pooled")
    if nan:
        assert cp.isnan(out).any()
    monkeypatch.setattr(conv_kernels, "TILE_POOL", False)
    plain, plain_saved = ops.conv2d_forward(g(x), g(w), g(b), 1, pad, 1, 1, activation, pool=POOL_2X2)
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
def test_tile_conv_into_a_pooled_producer(case, dtype, to6, rng, monkeypatch):
    """The consumer's input gradient written as the g of a producer that pooled in its epilogue (tile_conv_pool):
    through the pooling's backward in tile_conv_unpool's epilogue, bit-equal to the consumer's plain dx, then
    max_pool2d_backward_act (NaNs included), and the producer's gradients from it within rounding of the float64
    reference; the producer's weight gradient is not taken in the epilogue (it pooled). to6: TILE_TO6 (LeNet-5's
    layers: both kernels with 6 channels a thread)."""
    act, nan = case[3], case[6]
    monkeypatch.setattr(conv_kernels, "TILE_TO6", to6)
    monkeypatch.setattr(conv_kernels, "_TILE_TO6_THREADS_PER_SM", 0)   # on the small cases too
    monkeypatch.setattr(conv_kernels, "TILE_DX_MIN_THREADS_PER_SM", 0)
    monkeypatch.setattr(conv_kernels, "INTO_POOLED", True)
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
def test_pooled_wgrad_from_the_maxima(case, dtype, to6, rows, splits, rng, record_kernels, monkeypatch):
    """A first layer that pooled in its epilogue: its weight and bias gradients from its g at the windows' maxima
    only, where the layers' kernels are the same size in tile_conv_unpool_wgrad's epilogue (UNPOOL_WGRAD: no g
    written), else the second layer's input gradient writes that g (tile_conv_unpool, compact) and pooled_wgrad sums
    them: each against the same gradients from its full g (POOLED_WGRAD off, tile_wgrad) and the float64 reference;
    with a non-finite x, NaN exactly where those are (the taps that read it from a position whose g is 0). to6:
    TILE_TO6; rows: the input gradient's rows per block (2: several tiles an image, the last one partial); splits:
    its channel splits (1: a block of CG*TH*OG threads, fewer than an eighth of the O*TH*Wo windows where
    O*Wo > 8*CG*OG, e.g. 4 channels of 9 windows a row: the epilogue's spread pass takes two turns of 8 a thread).
    "reduced": tile_conv_unpool_wgrad's last block adds the partial rows itself (UNPOOL_WGRAD_REDUCE_MAX_BLOCKS):
    the gradients come in the ProducerGrad and no wgrad_reduce runs."""
    monkeypatch.setattr(conv_kernels, "TILE_TO6", to6)
    monkeypatch.setattr(conv_kernels, "_TILE_TO6_THREADS_PER_SM", 0)   # on the small cases too
    monkeypatch.setattr(conv_kernels, "TILE_DX_MIN_THREADS_PER_SM", 0)
    monkeypatch.setattr(conv_kernels, "INTO_POOLED", True)
    monkeypatch.setattr(conv_kernels, "_TILE_ROWS", rows)
    monkeypatch.setattr(conv_kernels, "_TILE_SPLITS", splits)
    monkeypatch.setattr(conv_kernels, "TILE_MIN_K", 0)   # a 3 x 3 first layer's forward pooled in its epilogue too
    x, w1, b1, w2, s1, s2, dout = _pooled_pair(case, dtype, rng, (1, 0, 4, 6), needs=(False, True, True))
    if case[4][2:] == case[1][2:] and case[6]:   # an inf instead of the NaN where both kernels are the same size
        x[1, 0, 4, 6] = np.inf
        s1.x[1, 0, 4, 6] = np.inf
    fused = case[4][2:] == case[1][2:] and case[0][1] == 1   # tile_conv_unpool_wgrad: one input channel
    launched = record_kernels(conv_kernels, "get")
    grads = {}
    for setting in ("fused", "reduced", "pooled_wgrad", "dense"):
        monkeypatch.setattr(conv_kernels, "POOLED_WGRAD", setting != "dense")
        monkeypatch.setattr(conv_kernels, "UNPOOL_WGRAD", setting in ("fused", "reduced"))
        monkeypatch.setattr(conv_kernels, "UNPOOL_WGRAD_REDUCE_MAX_BLOCKS", 1 << 20 if setting == "reduced" else 0)
        reduced = setting == "reduced" and fused
        launched.clear()
        handed, _, _ = ops.conv2d_backward(dout, s2, into=s1)
        assert isinstance(handed, conv_kernels.ProducerGrad)
        assert (handed.g is None and handed.wpartial is not None) == (setting != "dense" and not reduced)
        assert (handed.wgrad is not None) == reduced
        unpool_wgrad = any(name.startswith("tile_conv_unpool_wgrad") for name in launched)
        assert unpool_wgrad == (setting in ("fused", "reduced") and fused), launched
        assert any(name.startswith("pooled_wgrad") for name in launched) == (
            setting == "pooled_wgrad" or (setting in ("fused", "reduced") and not fused))
        launched.clear()
        _, dw1, db1 = ops.conv2d_backward(None, s1, g=handed.g, wpartial=handed.wpartial, dwdb=handed.wgrad)
        assert any(name.startswith("wgrad_reduce") for name in launched) == (not reduced), launched
        grads[setting] = (dw1.get(), db1.get())
    tol = ref.tol(dtype)
    for setting in ("fused", "reduced", "pooled_wgrad"):
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


@pytest.mark.parametrize("bias_grad", [True, False], ids=["db", "no_db"])
@pytest.mark.parametrize("batch, rows", [(3, None), (40, 2)], ids=["few_blocks", "many_blocks"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_unpool_wgrad_last_block_adds_the_partial_rows(dtype, batch, rows, bias_grad, rng, record_kernels,
                                                       monkeypatch):
    """LeNet-5's two layers: where tile_conv_unpool_wgrad has at most UNPOOL_WGRAD_REDUCE_MAX_BLOCKS blocks, its last
    block adds the partial rows into the first layer's dw (and db where wanted: none without, the kernel's db
    pointer null) itself, within rounding of wgrad_reduce over the same rows, and no wgrad_reduce runs; over the
    limit the rows are handed on as before. few_blocks: 3 blocks of 504 threads, the 156 outputs' rows added in 3
    groups; many_blocks: 2 rows a block, 240 blocks of 96 threads, each thread adding two outputs' rows in 15
    batches."""
    monkeypatch.setattr(conv_kernels, "TILE_DX_MIN_THREADS_PER_SM", 0)
    monkeypatch.setattr(conv_kernels, "INTO_POOLED", True)
    monkeypatch.setattr(conv_kernels, "_TILE_ROWS", rows)
    case = ((batch, 1, 28, 28), (6, 1, 5, 5), 0, "gelu", (16, 6, 5, 5), 0, False)
    x, w1, b1, w2, s1, s2, dout = _pooled_pair(case, dtype, rng, (0, 0, 0, 0), needs=(False, True, bias_grad))
    launched = record_kernels(conv_kernels, "get")
    grads = {}
    for limit in (1 << 20, 0, 1):   # over the blocks, off, under the blocks
        monkeypatch.setattr(conv_kernels, "UNPOOL_WGRAD_REDUCE_MAX_BLOCKS", limit)
        launched.clear()
        handed, _, _ = ops.conv2d_backward(dout, s2, into=s1)
        assert any(name.startswith("tile_conv_unpool_wgrad") for name in launched), launched
        assert (handed.wgrad is not None) == (limit == 1 << 20) and (handed.wpartial is None) == (limit == 1 << 20)
        launched.clear()
        _, dw1, db1 = ops.conv2d_backward(None, s1, g=handed.g, wpartial=handed.wpartial, dwdb=handed.wgrad)
        assert any(name.startswith("wgrad_reduce") for name in launched) == (limit != 1 << 20), launched
        assert (db1 is None) == (not bias_grad)
        grads[limit] = [a.get() for a in (dw1, db1) if a is not None]
        if handed.wgrad is not None:   # the gradients come alone, before any kernel runs
            launched.clear()
            with pytest.raises(RuntimeError, match="dwdb comes alone"):
                ops.conv2d_backward(None, s1, g=handed.wgrad[0], dwdb=handed.wgrad)
            assert not launched
    for got, want in zip(grads[1 << 20], grads[0]):
        assert_close(got, want, ref.tol(dtype), name="the last block's sums against wgrad_reduce's")
    for got, want in zip(grads[1], grads[0]):
        assert np.array_equal(got, want)
    rdw1, rdb1 = _pooled_producer_grads(case, x, w1, b1, w2, dout)
    assert_close(grads[1 << 20][0], rdw1, ref.tol(dtype), name="dw")
    if bias_grad:
        assert_close(grads[1 << 20][1], rdb1, ref.tol(dtype), name="db")


POOLED_GRADIENT_CASES = [  # producer x, its weight, padding, activation; consumer weight, padding, activation; NaN
    ((5, 1, 28, 28), (6, 1, 5, 5), 0, "gelu", (16, 6, 5, 5), 0, "gelu", False),   # LeNet-5's two layers
    ((3, 1, 12, 16), (4, 1, 5, 5), 2, "relu", (5, 4, 3, 3), 1, "relu", True),     # 3 x 4 windows, a NaN
    ((2, 2, 12, 12), (3, 2, 5, 5), 2, None, (4, 3, 3, 3), 1, "gelu", True),       # two input channels
    ((2, 1, 12, 12), (3, 1, 5, 5), 2, "gelu", (4, 3, 5, 5), 2, None, False),      # no consumer activation
]


@pytest.mark.parametrize("producer_needs_dx", [False, True], ids=["first_layer", "inner_layer"])
@pytest.mark.parametrize("unpool_wgrad", [False, True], ids=["pooled_wgrad", "unpool_wgrad"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", POOLED_GRADIENT_CASES)
def test_input_gradient_from_the_pooled_gradient(case, dtype, unpool_wgrad, producer_needs_dx, rng,
                                                 record_kernels, monkeypatch):
    """A convolution that pooled in its epilogue, reading a producer that pooled too: conv2d_backward from its pooled
    output's gradient (dpool) bit-equal to conv2d_backward from the g that the pooling's backward makes of it (NaNs
    and the non-finite maxima's neighbours included), the input gradient through tile_conv_unpool or
    tile_conv_unpool_wgrad. A dpool of the wrong shape or with a g is refused before any kernel runs."""
    xs, w1s, p1, act1, w2s, p2, act2, nan = case
    monkeypatch.setattr(conv_kernels, "TILE_DX_MIN_THREADS_PER_SM", 0)
    monkeypatch.setattr(conv_kernels, "INTO_POOLED", True)
    monkeypatch.setattr(conv_kernels, "UNPOOL_WGRAD", unpool_wgrad)
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
    launched = record_kernels(conv_kernels, "get")
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
@pytest.mark.parametrize("x_shape, w_shape, pad, widths", [
    # the forward's bytes a copy (float32 without and with TILE_VEC_STAGE_8, float64)
    ((4, 6, 12, 12), (16, 6, 5, 5), 0, (16, 16, 16)),   # LeNet-5's second layer: forward and input gradient
    ((2, 3, 12, 16), (4, 3, 5, 5), 2, (4, 8, 16)),      # left padding 2
    ((2, 16, 26, 26), (32, 16, 3, 3), 0, (4, 8, 16)),   # MnistCnn's second layer: 26-wide rows
    ((2, 3, 9, 25), (4, 3, 3, 3), 0, (4, 4, 8)),        # 25-wide rows: element copies
])
def test_tile_conv_stages_vectors_where_aligned(x_shape, w_shape, pad, widths, dtype, rng, monkeypatch):
    """TILE_VEC_STAGE (and TILE_VEC_STAGE_8, float32): tile_conv's input rows staged 16 (8) bytes a copy where the
    strides, row width and left padding allow it (_tile_vec_stage), else an element a copy: the forward and the
    input gradient bit-equal to both knobs off."""
    monkeypatch.setattr(conv_kernels, "TILE_DX_MIN_THREADS_PER_SM", 0)
    x = g(rng.standard_normal(x_shape).astype(dtype))
    w = g((rng.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(dtype))
    b = g(rng.standard_normal(w_shape[0]).astype(dtype))
    taken = []
    real = conv_kernels._tile_vec_stage
    monkeypatch.setattr(conv_kernels, "_tile_vec_stage", lambda *a: taken.append(real(*a)) or taken[-1])
    results = {}
    settings = ((False, False), (True, False), (True, True))
    for setting in settings:
        monkeypatch.setattr(conv_kernels, "TILE_VEC_STAGE", setting[0])
        monkeypatch.setattr(conv_kernels, "TILE_VEC_STAGE_8", setting[1])
        taken.clear()
        out, saved = ops.conv2d_forward(x, w, b, 1, pad, 1, 1, "gelu")
        dout = g(np.random.default_rng(1).standard_normal(out.shape).astype(dtype))
        results[setting] = (out,) + tuple(ops.conv2d_backward(dout, saved))
        # the forward (the input gradient's left padding is KS - 1 - pad, its rows the output's)
        itemsize = np.dtype(dtype).itemsize
        want = itemsize if not setting[0] else widths[2] if dtype == np.float64 else widths[int(setting[1])]
        assert taken and taken[0] == want, (setting, taken)
        # the input gradient too, where tile_conv takes it
        assert setting[0] or all(t == itemsize for t in taken), taken
    for setting in settings[1:]:
        for got, off in zip(results[setting], results[settings[0]]):
            assert bool(cp.array_equal(got, off))


WEIGHT_STAGING_CASES = [   # x, w of a convolution with padding 1 whose forward and input gradient tile_conv takes
    ((2, 16, 26, 26), (32, 16, 3, 3)),   # MnistCnn's second layer (forward: 32 slots a tap)
    ((4, 6, 14, 14), (16, 6, 5, 5)),     # LeNet-5's second layer
    ((2, 1, 16, 16), (6, 1, 5, 5)),      # six channels a thread (TO = 6: 8 slots a group, two of them zeros)
    ((2, 5, 12, 8), (7, 5, 3, 3)),       # 7 channels: a zero slot past O; 45 taps, runs of 6 and 3
]


def _staging_case_pass(x_shape, w_shape, dtype, rng, inputs):
    """One forward (padding 1, ReLU) and backward of a WEIGHT_STAGING_CASES convolution: (its saved state, [out, dx,
    dw, db]). x, w, b and the output gradient are drawn from rng on the first call and kept in `inputs` (a dict) for
    the next, so that passes under different knobs see the same values."""
    if not inputs:
        inputs["x"] = g(rng.standard_normal(x_shape).astype(dtype))
        inputs["w"] = g((rng.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(dtype))
        inputs["b"] = g(rng.standard_normal(w_shape[0]).astype(dtype))
    out, saved = ops.conv2d_forward(inputs["x"], inputs["w"], inputs["b"], 1, 1, 1, 1, "relu")
    if "dout" not in inputs:
        inputs["dout"] = g(rng.standard_normal(out.shape).astype(dtype))
    return saved, [out, *ops.conv2d_backward(inputs["dout"], saved)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("x_shape, w_shape", WEIGHT_STAGING_CASES)
def test_tile_conv_weight_runs_are_bit_equal(x_shape, w_shape, dtype, rng, monkeypatch):
    """TILE_WEIGHT_RUN: tile_conv's weights staged by runs of consecutive taps (_tile_weight_run) land in the same
    slots as tap by tap, so the forward and the input gradient are bit-equal to runs of 1, and some run is longer."""
    monkeypatch.setattr(conv_kernels, "TILE_DX_MIN_THREADS_PER_SM", 0)
    monkeypatch.setattr(conv_kernels, "TILE_ARRANGE", False)   # (tile_conv then stages w itself)
    monkeypatch.setattr(conv_kernels, "_TILE_TO6_THREADS_PER_SM", 0)
    taken = []
    real = conv_kernels._tile_weight_run
    monkeypatch.setattr(conv_kernels, "_tile_weight_run", lambda *a: taken.append(real(*a)) or taken[-1])
    results, inputs = {}, {}
    for run in (1, 3, 8):
        monkeypatch.setattr(conv_kernels, "TILE_WEIGHT_RUN", run)
        taken.clear()
        _, results[run] = _staging_case_pass(x_shape, w_shape, dtype, rng, inputs)
        assert taken and all(1 <= t <= run for t in taken), (run, taken)   # the forward (and dx where tiled)
        if run == 8:
            assert max(taken) > 1, taken
    for run in (3, 8):
        for got, one in zip(results[run], results[1]):
            assert bool(cp.array_equal(got, one))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("x_shape, w_shape", WEIGHT_STAGING_CASES)
def test_tile_conv_arranged_weights_are_bit_equal(x_shape, w_shape, dtype, rng, monkeypatch, record_kernels):
    """TILE_ARRANGE: the forward launches tile_arrange once, for its own layout and the input gradient's, and
    tile_conv stages those 16 bytes a copy: the forward and the input gradient bit-equal to tile_conv's own staging
    of w (the layouts hold the same values in the same slots)."""
    monkeypatch.setattr(conv_kernels, "TILE_DX_MIN_THREADS_PER_SM", 0)
    monkeypatch.setattr(conv_kernels, "_TILE_TO6_THREADS_PER_SM", 0)
    monkeypatch.setattr(conv_kernels, "TILE_ARRANGE_MIN_COPIES", 0)
    launched = record_kernels(conv_kernels, "get")
    results, inputs = {}, {}
    for on in (False, True):
        monkeypatch.setattr(conv_kernels, "TILE_ARRANGE", on)
        launched.clear()
        saved, results[on] = _staging_case_pass(x_shape, w_shape, dtype, rng, inputs)
        assert launched.count("tile_arrange") == int(on), launched
        tiled_dx = conv_kernels._tile_dx_plan(saved, inputs["dout"]) is not None
        assert (saved.arranged_dx is not None) == (on and tiled_dx)
    for got, own in zip(results[True], results[False]):
        assert bool(cp.array_equal(got, own))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [TILE_WGRAD_CASES[0], POOLED_WGRAD_CASES[2]], ids=["wgrad", "unpool_wgrad"])
def test_tile_conv_arranged_weights_into_the_producer(case, dtype, rng, monkeypatch):
    """TILE_ARRANGE with the input gradient written into its producer (tile_conv_wgrad; tile_conv_unpool_wgrad,
    where the producer pooled): the g handed over, the producer's partial rows and the consumer's own gradients
    bit-equal to tile_conv's own staging of w."""
    monkeypatch.setattr(conv_kernels, "TILE_DX_MIN_THREADS_PER_SM", 0)
    monkeypatch.setattr(conv_kernels, "TILE_ARRANGE_MIN_COPIES", 0)
    pooled = len(case) == 7
    got = {}
    for on in (False, True):
        monkeypatch.setattr(conv_kernels, "TILE_ARRANGE", on)
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


# --- activations ------------------------------------------------------------------------------------------------


# --- softmax and cross-entropy --------------------------------------------------------------------------------


# --- batch norm -------------------------------------------------------------------------------------------------


def _assert_module_kernels(module, own, other):
    """The compiled module has each kernel named in `own` and none named in `other`."""
    for name in own:
        module.get_function(name)
    for name in other:
        with pytest.raises(Exception):   # (CuPy: CUDADriverError, CUDA_ERROR_NOT_FOUND; the emulator: KeyError)
            module.get_function(name)


def test_the_arranged_instances_are_a_module_of_their_own():
    """conv.cu with ST_ARRANGED (loader._PARTS) has the tile kernels' _arr instances and nothing else; without it,
    every other kernel and no _arr instance."""
    from smalltrain.backend.cuda import loader
    _assert_module_kernels(loader.compile_module(loader.family_source("conv", 1)),
                           ["tile_conv_pool_k5_to4_f32", "tile_arrange_f32", "wgrad_reduce_f32"],
                           ["tile_conv_pool_k5_to4_arr_f32"])
    _assert_module_kernels(loader.compile_module(loader.family_source("conv", 1, "ST_ARRANGED")),
                           ["tile_conv_pool_k5_to4_arr_f32", "tile_conv_lin_ce_k3_to4_arr_f32"],
                           ["tile_conv_pool_k5_to4_f32", "tile_arrange_f32", "wgrad_reduce_f32"])


def test_a_kernel_file_compiles_one_module_per_element_type():
    """loader.family_source(family, 1 / 2): the module of float32 kernels has none of the float64 ones and the
    reverse (common.cuh ST_INSTANTIATE); kernels of no element type are in both."""
    from smalltrain.backend.cuda import loader
    for dtypes, own, other in ((1, "adam_step_f32", "adam_step_f64"), (2, "adam_step_f64", "adam_step_f32")):
        _assert_module_kernels(loader.compile_module(loader.family_source("optim", dtypes)), [own, "set_hyper"],
                               [other])

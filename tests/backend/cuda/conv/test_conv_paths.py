"""The convolution's dispatch (backend/cuda/conv/__init__.py) and its direct, implicit-GEMM and im2col rooms
(direct.py, igemm.py, im2col.py, epilogue.py) against NumPy float64 references: every path forced on small cases by
the CONV tuning table, errors, what the forward saves. Skips without CuPy or a GPU (or the emulator)."""
import os

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
import smalltrain  # noqa: E402

if not smalltrain.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import cuda_reference as ref  # noqa: E402

from smalltrain.backend.cuda import conv as conv_kernels  # noqa: E402
from smalltrain.backend.cuda import ops  # noqa: E402
from smalltrain.backend.cuda.conv import direct as conv_direct  # noqa: E402
from smalltrain.backend.cuda.conv import igemm as conv_igemm  # noqa: E402
from smalltrain.backend.cuda.conv import wgrad as conv_wgrad  # noqa: E402
from smalltrain.testing import assert_close  # noqa: E402
from conv_cases import (CONV_CASES, DTYPES, _check_weight_grads, _pads,  # noqa: E402
                        _pair, g)


def test_tf32_is_off():
    assert os.environ.get("CUPY_TF32", "0") == "0", "CUPY_TF32=1 makes cupy.matmul round float32 inputs to TF32 " \
        "(~1e-3 relative error); unset it for these 1e-5 checks"


# --- convolution ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["direct", "im2col", "direct_bwd", "igemm", "igemm_dw", "tiled_dw"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d(case, dtype, path, rng, conv_launches, monkeypatch, tune):
    """direct: every kernel of the direct path where it fits, the implicit-GEMM forward where not; im2col: none of
    them; direct_bwd: the forward through im2col + GEMM, dx by the direct gather kernel (larger convolutions than
    the direct forward takes), dw by cuBLAS; igemm: the forward by the implicit GEMM, the backward as direct_bwd
    with dw by the implicit GEMM from x; igemm_dw / tiled_dw: as direct, with every dw from x by the implicit GEMM /
    the tiled kernel where it fits."""
    shape, o, kernel, stride, padding, dilation, groups, activation, bias = case
    # test_tile_conv and test_tile_wgrad check the kernels that come first: none of tile_conv or tile_wgrad here
    tune(tile_min_k=1 << 30, tile_dx_min_threads_per_sm=1 << 30, tile_wg_threads=0)
    tune(direct_dx_min_threads_per_sm=0)   # the gather kernel on these small cases
    if path == "igemm_dw":
        tune(igemm_wgrad_min_use=0)
    if path == "tiled_dw":
        tune(igemm_wgrad_min_use=2)
    if path == "im2col":
        tune(direct_max_k=0)
    if path in ("im2col", "direct_bwd"):
        tune(igemm_max_k=0)
    launched = conv_launches
    took_dx = []
    if path in ("direct_bwd", "igemm"):
        tune(direct_max_macs=0)
        real = conv_kernels.direct_dx
        monkeypatch.setattr(conv_kernels, "direct_dx", lambda *a: took_dx.append(real(*a)) or took_dx[-1])
    x = rng.standard_normal(shape).astype(dtype)
    w = (rng.standard_normal((o, shape[1] // groups) + kernel) * 0.5).astype(dtype)
    b = rng.standard_normal(o).astype(dtype) if bias else None
    out, saved = ops.conv2d_forward(g(x), g(w), None if b is None else g(b), stride, padding, dilation, groups,
                                    activation)
    # groups == 1 and C*KH*KW <= 256 take the direct kernels (they keep x, not cols) when their shared-memory
    # tiles fit (all these cases in float32; not 32 x 250 in float64), everything else im2col
    w_shape, itemsize = (o, shape[1] // groups) + kernel, np.dtype(dtype).itemsize
    fits = conv_direct.direct_ok(shape, w_shape, saved.out_hw, groups, itemsize)
    wgrad_fits = conv_direct.direct_wgrad_ok(shape, w_shape, saved.out_hw, groups, itemsize)
    small = groups == 1 and shape[1] * kernel[0] * kernel[1] <= 256   # C*KH*KW within DIRECT_MAX_K
    # float32: every small case fits (the direct forward's work limit is 0 on the direct_bwd and igemm paths)
    direct = path in ("direct", "igemm_dw", "tiled_dw")
    assert not direct or fits == small or dtype == np.float64
    assert path == "im2col" or wgrad_fits == (small and direct) or dtype == np.float64
    # the implicit GEMM takes the forward where the direct kernel does not and its tap table fits
    igemm = (path == "igemm" or (direct and not fits)) and conv_igemm.igemm_ok(
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
    use = conv_igemm.wgrad_tile(o, shape[1] // groups * kernel[0] * kernel[1] + 1)[1]
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


IGEMM_TILE_CASES = [  # x shape, out channels, kernel, stride, padding, dilation, groups, activation, bias; its tile
    (((2, 16, 9, 7), 32, (3, 3), 1, 1, 1, 1, "relu", True), (32, 64, 4, 4)),       # 32 x 145: the largest tile
    (((3, 16, 8, 6), 16, (3, 3), 2, 0, 1, 1, None, False), (16, 128, 4, 4)),       # 16 x 145
    (((2, 1, 12, 11), 6, (5, 5), 1, 2, 2, 1, "gelu", True), (8, 32, 2, 2)),        # 6 x 26, dilated
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case, tile", IGEMM_TILE_CASES)
def test_conv2d_weight_gradient_by_each_implicit_gemm_tile(case, tile, dtype, rng, tune):
    """Every igemm_wgrad tile (each case's channels and taps choose one) on shapes that leave partial tiles,
    padding, strides and dilation, with and without bias (the bias column of the tap table), dw and db against the
    float64 reference."""
    shape, o, kernel, stride, padding, dilation, groups, activation, bias = case
    assert conv_igemm.wgrad_tile(o, shape[1] * kernel[0] * kernel[1] + 1)[0] == tile
    assert {t for _, t in IGEMM_TILE_CASES} == set(conv_igemm._WG_TILES)
    tune(igemm_wgrad_min_use=0, tile_wg_threads=0)
    x = rng.standard_normal(shape).astype(dtype)
    w = (rng.standard_normal((o, shape[1]) + kernel) * 0.5).astype(dtype)
    b = rng.standard_normal(o).astype(dtype) if bias else None
    out, saved = ops.conv2d_forward(g(x), g(w), None if b is None else g(b), stride, padding, dilation, groups,
                                    activation)
    assert conv_wgrad.wgrad_kernel(saved, np.dtype(dtype).itemsize) == "igemm"
    geom = (_pair(stride), _pads(padding, kernel, _pair(dilation)), _pair(dilation), groups)
    _check_weight_grads(x, w, b, saved, geom, activation, rng)


@pytest.mark.parametrize("x_shape, w_shape, stride, wgrad", [
    ((8, 16, 26, 26), (32, 16, 3, 3), 1, "tile"),      # MnistCnn's second layer
    ((4, 6, 14, 14), (16, 6, 5, 5), 2, None),          # strided: another weight-gradient kernel
])
def test_weight_grad_beside_input_grad_gives_the_same_bits(x_shape, w_shape, stride, wgrad, rng, tune):
    """conv2d_backward with the weight gradient on the side stream (CONV.wgrad_beside_max_outputs) returns what it
    returns on one stream, bit for bit, eagerly and as a CUDA graph replayed on new output gradients (the fork and
    the join are captured as edges; a missing join would let the replay's result be read before the side stream
    wrote it)."""
    x = cp.asarray(rng.standard_normal(x_shape), dtype=cp.float32)
    w = cp.asarray(rng.standard_normal(w_shape) * 0.2, dtype=cp.float32)
    out, saved = ops.conv2d_forward(x, w, cp.asarray(rng.standard_normal(w_shape[0]), dtype=cp.float32),
                                    stride=stride, activation="relu")
    if wgrad is not None:
        assert conv_wgrad.wgrad_kernel(saved, 4) == wgrad
    douts = [cp.asarray(rng.standard_normal(out.shape), dtype=cp.float32) for _ in range(3)]
    tune(wgrad_beside_max_outputs=0)
    alone = [ops.conv2d_backward(d, saved) for d in douts]
    tune(wgrad_beside_max_outputs=1 << 40)
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


def test_tile_conv_leaves_other_geometries_to_the_other_kernels(rng, conv_launches, monkeypatch):
    """Strided, dilated, grouped and non-square convolutions do not launch tile_conv (nor do kernel sizes it is not
    compiled for), and its forward writes y (the sum before bias) exactly where an activation needs it."""
    launched = conv_launches
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
def test_direct_forward_split_over_channels(shape, o, kernel, dtype, rng, monkeypatch, tune):
    """The staged direct forward with each item's input channels summed by several threads (LeNet-5's second
    layer at batch 64, 10 channels over 4 threads, 3 over 2): the split is taken and the values are right. The
    launch is planned for an H200's 132 SMs whatever the GPU, so that the same cases split everywhere."""
    monkeypatch.setattr(conv_direct, "sm_count", lambda: 132)
    tune(tile_min_k=1 << 30, tile_dx_min_threads_per_sm=1 << 30)
    real, splits = conv_direct._direct_grid, []
    monkeypatch.setattr(conv_direct, "_direct_grid", lambda *a: splits.append(real(*a)[2]) or real(*a))
    x = rng.standard_normal(shape).astype(dtype)
    w = (rng.standard_normal((o, shape[1]) + kernel) * 0.5).astype(dtype)
    b = rng.standard_normal(o).astype(dtype)
    out, _ = ops.conv2d_forward(g(x), g(w), g(b), 1, 0, 1, 1, "gelu")
    assert splits and splits[0] > 1, splits
    pre, _ = ref.conv2d(x, w, b, (1, 1), (0, 0, 0, 0), (1, 1), 1)
    assert_close(out, ref.act(pre, "gelu"), ref.tol(dtype), name="conv2d forward")


@pytest.mark.parametrize("p", [1, 63, 64, 577])   # below and above BIAS_ACT_ROWS_MIN_P: both kernels
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_act_backward_both_kernels(p, activation, dtype, rng):
    """g [O, N, P] = dout [N, O, P] * act'(y + b) with distinct sizes (N 3, O 5) so that a transposed index shows."""
    n, o = 3, 5
    dout = rng.standard_normal((n, o, p)).astype(dtype)
    y = rng.standard_normal((o, n, p)).astype(dtype)
    b = rng.standard_normal(o).astype(dtype)
    assert (p >= conv_kernels.CONV.bias_act_rows_min_p) == (p >= 64)
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

"""tile_conv (backend/cuda/conv/tile.py): its plans forced one choice at a time, its staging (vectors, weight
runs, arranged weights) bit-equal to the plain one. Skips without CuPy or a GPU (or the emulator)."""

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
import smalltrain  # noqa: E402

if not smalltrain.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import cuda_reference as ref  # noqa: E402

from smalltrain.backend.cuda import ops  # noqa: E402
from smalltrain.backend.cuda.conv import tile as conv_tile  # noqa: E402
from smalltrain.testing import assert_close  # noqa: E402
from conv_cases import (DTYPES, TILE_CASES, _force_tile_plan, _pads,  # noqa: E402
                        g)


@pytest.mark.parametrize("plan", ["as planned", "4 channels", "8 channels", "6 channels", "row tiles",
                                  "2 channel splits", "3 channel splits"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", TILE_CASES)
def test_tile_conv(case, dtype, plan, rng, conv_launches, monkeypatch, tune):
    """tile_conv takes the forward and dx of stride-1, undilated 3x3 and 5x5 convolutions (whatever the padding),
    against the float64 reference, on its own choices and with each forced: 4, 8 or 6 channels per thread, blocks
    of few rows (several row tiles per image, the last one partial), the input channels split over 2 or 3 thread
    groups (uneven where C is not a multiple; one group where C is 1). dw by the implicit GEMM from the kept x."""
    shape, o, ks, padding, activation, bias = case
    _force_tile_plan(tune, plan)
    launched = conv_launches
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
    dx_plan = conv_tile.tile_plan(shape[0], o, saved.out_hw, shape[1], shape[2:], ks, np.dtype(dtype).itemsize)
    assert dx_plan is not None or dtype == np.float64
    assert sum(n.startswith("tile_conv") for n in launched) == (dx_plan is not None), launched
    assert dx_plan is None or any(n.startswith("tile_conv_k5_to6") for n in launched) == six(shape[1]), launched
    rdx, rdw, rdb = ref.conv2d_grads(x, w, ref.act_grad(dout, pre, activation), *geom)
    assert_close(dx, rdx, tol, name="dx")
    assert_close(dw, rdw, tol, name="dw")
    if bias:
        assert_close(db, rdb, tol, name="db")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("x_shape, w_shape, pad, widths", [
    # the forward's bytes a copy (float32, float64)
    ((4, 6, 12, 12), (16, 6, 5, 5), 0, (16, 16)),   # LeNet-5's second layer: forward and input gradient
    ((2, 3, 12, 16), (4, 3, 5, 5), 2, (8, 16)),     # left padding 2
    ((2, 16, 26, 26), (32, 16, 3, 3), 0, (8, 16)),  # MnistCnn's second layer: 26-wide rows
    ((2, 3, 9, 25), (4, 3, 3, 3), 0, (4, 8)),       # 25-wide rows: element copies
])
def test_tile_conv_stages_vectors_where_aligned(x_shape, w_shape, pad, widths, dtype, rng, monkeypatch, tune):
    """tile_conv's input rows staged 16 (float32 also 8) bytes a copy where the strides, row width and left padding
    allow it (_tile_vec_stage), else an element a copy: the copies each case takes, and the forward and the
    gradients against the float64 reference."""
    tune(tile_dx_min_threads_per_sm=0)
    x = rng.standard_normal(x_shape).astype(dtype)
    w = (rng.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(dtype)
    b = rng.standard_normal(w_shape[0]).astype(dtype)
    taken = []
    real = conv_tile._tile_vec_stage
    monkeypatch.setattr(conv_tile, "_tile_vec_stage", lambda *a: taken.append(real(*a)) or taken[-1])
    out, saved = ops.conv2d_forward(g(x), g(w), g(b), 1, pad, 1, 1, "gelu")
    assert taken and taken[0] == widths[dtype == np.float64], taken
    geom = ((1, 1), _pads(pad, (w_shape[2], w_shape[3]), (1, 1)), (1, 1), 1)
    pre, _ = ref.conv2d(x, w, b, *geom)
    assert_close(out, ref.act(pre, "gelu"), ref.tol(dtype), name="conv2d forward")
    dout = rng.standard_normal(pre.shape).astype(dtype)
    dx, dw, db = ops.conv2d_backward(g(dout), saved)
    rdx, rdw, rdb = ref.conv2d_grads(x, w, ref.act_grad(dout, pre, "gelu"), *geom)
    for got, want, name in ((dx, rdx, "dx"), (dw, rdw, "dw"), (db, rdb, "db")):
        assert_close(got, want, ref.tol(dtype), name=name)


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
def test_tile_conv_weight_runs_are_bit_equal(x_shape, w_shape, dtype, rng, monkeypatch, tune):
    """TILE_WEIGHT_RUN: tile_conv's weights staged by runs of consecutive taps (_tile_weight_run) land in the same
    slots as tap by tap, so the forward and the input gradient are bit-equal to runs of 1, and some run is longer."""
    tune(tile_dx_min_threads_per_sm=0)
    tune(tile_arrange_min_copies=1 << 30)   # (tile_conv then stages w itself)
    tune(tile_to6_threads_per_sm=0)
    taken = []
    real = conv_tile._tile_weight_run
    monkeypatch.setattr(conv_tile, "_tile_weight_run", lambda *a: taken.append(real(*a)) or taken[-1])
    results, inputs = {}, {}
    for run in (1, 3, 8):
        tune(tile_weight_run=run)
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
def test_tile_conv_arranged_weights_are_bit_equal(x_shape, w_shape, dtype, rng, monkeypatch, conv_launches, tune):
    """TILE_ARRANGE: the forward launches tile_arrange once, for its own layout and the input gradient's, and
    tile_conv stages those 16 bytes a copy: the forward and the input gradient bit-equal to tile_conv's own staging
    of w (the layouts hold the same values in the same slots)."""
    tune(tile_dx_min_threads_per_sm=0)
    tune(tile_to6_threads_per_sm=0)
    tune(tile_arrange_min_copies=0)
    launched = conv_launches
    results, inputs = {}, {}
    for on in (False, True):
        tune(tile_arrange_min_copies=0 if on else 1 << 30)
        launched.clear()
        saved, results[on] = _staging_case_pass(x_shape, w_shape, dtype, rng, inputs)
        assert launched.count("tile_arrange") == int(on), launched
        tiled_dx = conv_tile.tile_dx_plan(saved.x_shape, saved.weight.shape, saved.stride, saved.dilation,
                                           saved.groups, saved.out_hw, np.dtype(dtype).itemsize) is not None
        assert (saved.arranged_dx is not None) == (on and tiled_dx)
    for got, own in zip(results[True], results[False]):
        assert bool(cp.array_equal(got, own))

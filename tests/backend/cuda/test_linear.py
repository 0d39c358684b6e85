"""CUDA linear layers (backend/cuda/linear.py): the small tile kernels, the wide kernels and cuBLAS
with the epilogue against float64 NumPy, each backward after each forward path; the wide rule and chunking."""
import os

import cuda_reference as ref
import numpy as np
import pytest

import smalltrain
from smalltrain.backend.cuda import cupy, loader, ops
from smalltrain.backend.cuda import linear as linear_kernels
from smalltrain.backend.cuda.linear import LINEAR
from smalltrain.backend.cuda.tuning import override
from smalltrain.testing import assert_close

GPU = smalltrain.cuda.is_available()
cp = cupy() if GPU else None
gpu = pytest.mark.skipif(not GPU, reason="no CUDA device")
DTYPES = [np.float32, np.float64]


def g(a):
    return cp.asarray(a)


LINEAR_CASES = [  # M, K, F, activation, bias, needs (input, weight, bias)
    (64, 256, 120, "gelu", True, (True, True, True)),     # LeNet-5's first fully connected layer
    (33, 65, 31, "relu", True, (True, True, True)),       # partial tiles on every side
    (1, 7, 3, "gelu_tanh", False, (True, True, False)),
    (40, 50, 10, None, True, (False, True, True)),        # the first layer: no dx
    (20, 30, 9, "gelu", True, (True, False, True)),       # frozen weight: db only (the tile of column K)
    (64, 3000, 10, None, True, (True, True, True)),       # a reduction past small_max_l forward: wide or cuBLAS
    (64, 18432, 10, None, True, (True, True, True)),      # MnistCnn's classifier
    (70, 1000, 16, "gelu", True, (True, True, True)),     # wide_max_f outputs, a partial row group
    (600, 5000, 7, "relu", True, (True, True, True)),     # 19 row groups, several chunks each
    (5, 127, 3, "relu", False, (True, True, False)),      # K + 1 a multiple of 64 without db
    (3, 63, 1, "gelu_tanh", True, (False, False, True)),  # db only, column K alone in the last block
]


# the path each direction takes: small kernels where they fit (else wide for F <= 16, else cuBLAS), wide kernels
# where F <= 16 (else cuBLAS), or cuBLAS; forward and backward mixed, so that each backward reads each forward's y
LINEAR_MODES = {"small": {}, "wide": {"small_max_l": 0}, "cublas": {"small_max_l": 0, "wide_max_f": 0}}
LINEAR_PATHS = [("small", "small"), ("wide", "wide"), ("cublas", "cublas"), ("small", "cublas"), ("cublas", "small"),
                ("cublas", "wide"), ("wide", "small")]


@gpu
@pytest.mark.parametrize("path", LINEAR_PATHS, ids=["-".join(p) for p in LINEAR_PATHS])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", LINEAR_CASES)
def test_linear_act(case, dtype, path, rng):
    m, k, f, activation, bias, needs = case
    x = rng.standard_normal((m, k)).astype(dtype)
    w = (rng.standard_normal((f, k)) / np.sqrt(k)).astype(dtype)
    b = rng.standard_normal(f).astype(dtype) if bias else None
    with override(LINEAR, **LINEAR_MODES[path[0]]):
        out, saved = ops.linear_act_forward(g(x), g(w), None if b is None else g(b), activation)
    pre = x.astype(np.float64) @ w.astype(np.float64).T + (0 if b is None else b)
    tol = ref.tol(dtype) * max(1, np.sqrt(k) / 64)
    assert out.dtype == dtype and out.shape == (m, f)
    assert_close(out, ref.act(pre, activation), tol, name="linear forward")
    dout = rng.standard_normal((m, f)).astype(dtype)
    with override(LINEAR, **LINEAR_MODES[path[1]]):
        dx, dw, db = ops.linear_act_backward(g(dout), saved, needs)
    gpre = ref.act_grad(dout, pre, activation)
    for name, got, want, need in (("dx", dx, gpre @ w.astype(np.float64), needs[0]),
                                  ("dw", dw, gpre.T @ x.astype(np.float64), needs[1]),
                                  ("db", db, gpre.sum(0), needs[2] and bias)):
        if need:
            assert_close(got, want, tol * max(1, np.sqrt(max(m, f)) / 8), name=name)
        else:
            assert got is None, name


@gpu
def test_wide_linear_is_deterministic_and_leaves_its_counters_at_zero(rng):
    # the last block of each row group adds the chunks' partials in chunk order: bit-equal results on every call,
    # for any grid; and each launch resets its tickets, so that launches of other row counts start from zero
    w = g(rng.standard_normal((10, 9000)).astype(np.float32))
    b = g(rng.standard_normal(10).astype(np.float32))
    for m in (64, 1000, 3, 64):
        assert linear_kernels.wide_chunks(m, 9000)[0] > 1
        x = g(rng.standard_normal((m, 9000)).astype(np.float32))
        with override(LINEAR, small_max_l=0):
            first = ops.linear_act_forward(x, w, b, "relu")[0]
            again = ops.linear_act_forward(x, w, b, "relu")[0]
        assert cp.array_equal(first, again)
        want = np.maximum(cp.asnumpy(x).astype(np.float64) @ cp.asnumpy(w).astype(np.float64).T + cp.asnumpy(b), 0)
        assert_close(first, want, 1e-4, name=f"wide forward, {m} rows")
        assert int(linear_kernels._tickets().max()) == 0   # every ticket reset for the next launch


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [((3, 16, 26, 26), (32, 16, 3, 3), "relu", 10),   # MnistCnn's conv2 + classifier
                                  ((2, 3, 6, 5), (4, 3, 3, 3), "gelu", 16),          # P = 12: o's rows cut a block
                                  ((2, 3, 6, 5), (4, 3, 3, 3), None, 1),
                                  ((2, 3, 7, 7), (5, 3, 3, 3), "relu", 3),
                                  ((2, 3, 6, 5), (4, 3, 3, 3), "gelu_tanh", 17)])    # not wide: two kernels
def test_linear_backward_into_conv(case, dtype, rng):
    """A linear layer over a convolution's activated output flattened: its backward hands the convolution's g
    [O, N*P] = (dout @ W reshaped [N, O, P]) * act'(pre-activation), transposed, and dw, db, against float64."""
    x_shape, w_shape, activation, f = case
    x, w = g(rng.standard_normal(x_shape).astype(dtype)), g((rng.standard_normal(w_shape) * 0.3).astype(dtype))
    b = g(rng.standard_normal(w_shape[0]).astype(dtype))
    out, csaved = ops.conv2d_forward(x, w, b, activation=activation)
    n, o, oh, ow = out.shape
    lw = g((rng.standard_normal((f, o * oh * ow)) / 30).astype(dtype))
    lb = g(rng.standard_normal(f).astype(dtype))
    y, lsaved = ops.linear_act_forward(out.reshape(n, -1), lw, lb)
    dout = rng.standard_normal((n, f)).astype(dtype)
    gc, dw, db = linear_kernels.linear_backward_into_conv(g(dout), lsaved, csaved)
    pre = cp.asnumpy(out if activation is None else csaved.y.reshape(o, n, oh * ow).transpose(1, 0, 2)
                     + b[None, :, None]).reshape(n, -1)
    dflat = dout.astype(np.float64) @ cp.asnumpy(lw).astype(np.float64)
    want = ref.act_grad(dflat, pre, activation).reshape(n, o, -1).transpose(1, 0, 2).reshape(o, -1)
    tol = ref.tol(dtype) * 4
    assert gc.shape == (o, n * oh * ow) and gc.dtype == dtype
    assert_close(gc, want, tol, name="g")
    flat = cp.asnumpy(out).reshape(n, -1).astype(np.float64)
    assert_close(dw, dout.astype(np.float64).T @ flat, tol * 8, name="dw")
    assert_close(db, dout.astype(np.float64).sum(0), tol, name="db")
    assert linear_kernels.linear_backward_into_conv(g(dout), lsaved, csaved, (False, True, True))[0] is None
    # without the pre-activation: relu's derivative from the output on the wide path, else a clear error
    keep = linear_kernels.into_conv_needs_pre_activation(n, lw.shape[1], f, activation)
    assert keep == (activation is not None and not (activation == "relu" and f <= LINEAR.wide_max_f))
    _, bare = ops.conv2d_forward(x, w, b, activation=activation, keep_pre_activation=False)
    assert bare.y is None
    if keep:
        with pytest.raises(RuntimeError, match="did not keep its output before the activation"):
            linear_kernels.linear_backward_into_conv(g(dout), lsaved, bare)
    else:
        assert cp.array_equal(linear_kernels.linear_backward_into_conv(g(dout), lsaved, bare)[0], gc)
    if activation is not None:
        with pytest.raises(RuntimeError, match="pass g instead of grad_output"):
            ops.conv2d_backward(out, bare)
    with pytest.raises(RuntimeError, match=r"expected grad_output of shape"):
        linear_kernels.linear_backward_into_conv(g(dout[:1]), lsaved, csaved)


@gpu
def test_linear_act_errors():
    x, w = cp.ones((4, 5), cp.float32), cp.ones((3, 5), cp.float32)
    with pytest.raises(RuntimeError, match=r"expected weight \[F, 5\]"):
        ops.linear_act_forward(x, cp.ones((3, 4), cp.float32))
    with pytest.raises(RuntimeError, match="dtype"):
        ops.linear_act_forward(x, w.astype(cp.float64))
    _, saved = ops.linear_act_forward(x, w, cp.ones(3, cp.float32), "relu")
    with pytest.raises(RuntimeError, match=r"grad_output of shape \[4, 3\]"):
        ops.linear_act_backward(cp.ones((4, 4), cp.float32), saved)


def test_wide_layer_rule_and_chunks(monkeypatch):
    """linear._wide and wide_chunks on 132 SMs, no GPU needed: F <= LINEAR.wide_max_f; whole 256-column slices per
    chunk, as few chunks as give about 2 blocks per SM (chunks x row groups of 32 rows), every column in a chunk."""
    linear = linear_kernels
    monkeypatch.setattr(linear, "_sm_count", lambda: 132)
    src = loader.read_source(os.path.join(loader.KERNEL_DIR, "linear_wide.cu"))
    for name, value in (("ST_WF", linear._WIDE_F), ("ST_WROWS", linear._WIDE_ROWS), ("ST_WK", linear._WIDE_SLICE),
                        ("ST_WBC", linear._WIDE_COLS), ("ST_WTHREADS", linear._THREADS)):
        assert f"#define {name} {value}\n" in src, name
    assert LINEAR.wide_max_f <= linear._WIDE_F
    tiles = loader.read_source(os.path.join(loader.KERNEL_DIR, "linear_tile.cuh"))
    assert f"#define ST_LT {linear._TILE} " in tiles
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
    with override(LINEAR, wide_max_f=0):
        assert not linear._wide(64, 18432, 10)

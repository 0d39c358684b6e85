"""CUDA launchers for conv, linear layers and chains, pooling, activations, softmax / cross-entropy and batch norm
against NumPy float64 references (tests/cuda/cuda_reference.py); torch float64 on the CPU is the oracle for pooling
and for the gradients of cross-entropy and batch norm. Skips without CuPy or a GPU.

float32 tolerance: max|err| <= 1e-5 * max(1, max|ref|). The convolution GEMMs must run in full float32:
CuPy uses TF32 only when CUPY_TF32=1, and test_tf32_is_off fails if it is set.
"""

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
import smalltrain  # noqa: E402

if not smalltrain.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import cuda_reference as ref  # noqa: E402

from smalltrain.backend.cuda import conv as conv_kernels  # noqa: E402
from smalltrain.backend.cuda import linear as linear_kernels  # noqa: E402
from smalltrain.backend.cuda import ops  # noqa: E402
from smalltrain.testing import assert_close  # noqa: E402

DTYPES = [np.float32, np.float64]


def g(a):
    return cp.asarray(a)


POOL_2X2 = ((2, 2), (2, 2), (0, 0), (1, 1))   # conv2d_forward's pool: kernel, stride, padding, dilation


# --- linear (small tiled kernels / wide kernels / cuBLAS + epilogue) ------------------------------------------------

LINEAR_CASES = [  # M, K, F, activation, bias, needs (input, weight, bias)
    (64, 256, 120, "gelu", True, (True, True, True)),     # LeNet-5's first fully connected layer
    (33, 65, 31, "relu", True, (True, True, True)),       # partial tiles on every side
    (1, 7, 3, "gelu_tanh", False, (True, True, False)),
    (40, 50, 10, None, True, (False, True, True)),        # the first layer: no dx
    (20, 30, 9, "gelu", True, (True, False, True)),       # frozen weight: db only (the tile of column K)
    (64, 3000, 10, None, True, (True, True, True)),       # a reduction past SMALL_MAX_L forward: wide or cuBLAS
    (64, 18432, 10, None, True, (True, True, True)),      # MnistCnn's classifier
    (70, 1000, 16, "gelu", True, (True, True, True)),     # WIDE_MAX_F outputs, a partial row group
    (600, 5000, 7, "relu", True, (True, True, True)),     # 19 row groups, several chunks each
    (5, 127, 3, "relu", False, (True, True, False)),      # K + 1 a multiple of 64 without db
    (3, 63, 1, "gelu_tanh", True, (False, False, True)),  # db only, column K alone in the last block
]

# the path each direction takes: small kernels where they fit (else wide for F <= 16, else cuBLAS), wide kernels
# where F <= 16 (else cuBLAS), or cuBLAS; forward and backward mixed, so that each backward reads each forward's y
LINEAR_MODES = {"small": {"SMALL_MAX_L": 2048, "WIDE_MAX_F": 16}, "wide": {"SMALL_MAX_L": 0, "WIDE_MAX_F": 16},
                "cublas": {"SMALL_MAX_L": 0, "WIDE_MAX_F": 0}}
LINEAR_PATHS = [("small", "small"), ("wide", "wide"), ("cublas", "cublas"), ("small", "cublas"), ("cublas", "small"),
                ("cublas", "wide"), ("wide", "small")]


def _linear_mode(monkeypatch, mode):
    for name, value in LINEAR_MODES[mode].items():
        monkeypatch.setattr(linear_kernels, name, value)


@pytest.mark.parametrize("path", LINEAR_PATHS, ids=["-".join(p) for p in LINEAR_PATHS])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", LINEAR_CASES)
def test_linear_act(case, dtype, path, rng, monkeypatch):
    m, k, f, activation, bias, needs = case
    x = rng.standard_normal((m, k)).astype(dtype)
    w = (rng.standard_normal((f, k)) / np.sqrt(k)).astype(dtype)
    b = rng.standard_normal(f).astype(dtype) if bias else None
    _linear_mode(monkeypatch, path[0])
    out, saved = ops.linear_act_forward(g(x), g(w), None if b is None else g(b), activation)
    _linear_mode(monkeypatch, path[1])
    pre = x.astype(np.float64) @ w.astype(np.float64).T + (0 if b is None else b)
    tol = ref.tol(dtype) * max(1, np.sqrt(k) / 64)
    assert out.dtype == dtype and out.shape == (m, f)
    assert_close(out, ref.act(pre, activation), tol, name="linear forward")
    dout = rng.standard_normal((m, f)).astype(dtype)
    dx, dw, db = ops.linear_act_backward(g(dout), saved, needs)
    gpre = ref.act_grad(dout, pre, activation)
    for name, got, want, need in (("dx", dx, gpre @ w.astype(np.float64), needs[0]),
                                  ("dw", dw, gpre.T @ x.astype(np.float64), needs[1]),
                                  ("db", db, gpre.sum(0), needs[2] and bias)):
        if need:
            assert_close(got, want, tol * max(1, np.sqrt(max(m, f)) / 8), name=name)
        else:
            assert got is None, name


def test_wide_linear_is_deterministic_and_leaves_its_counters_at_zero(rng, monkeypatch):
    # the last block of each row group adds the chunks' partials in chunk order: bit-equal results on every call,
    # for any grid; and each launch resets its tickets, so that launches of other row counts start from zero
    monkeypatch.setattr(linear_kernels, "SMALL_MAX_L", 0)
    w = g(rng.standard_normal((10, 9000)).astype(np.float32))
    b = g(rng.standard_normal(10).astype(np.float32))
    for m in (64, 1000, 3, 64):
        assert linear_kernels.wide_chunks(m, 9000)[0] > 1
        x = g(rng.standard_normal((m, 9000)).astype(np.float32))
        first = ops.linear_act_forward(x, w, b, "relu")[0]
        again = ops.linear_act_forward(x, w, b, "relu")[0]
        assert cp.array_equal(first, again)
        want = np.maximum(cp.asnumpy(x).astype(np.float64) @ cp.asnumpy(w).astype(np.float64).T + cp.asnumpy(b), 0)
        assert_close(first, want, 1e-4, name=f"wide forward, {m} rows")
        assert int(linear_kernels._tickets().max()) == 0   # every ticket reset for the next launch


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
    assert keep == (activation is not None and not (activation == "relu" and f <= linear_kernels.WIDE_MAX_F))
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


def test_linear_act_errors():
    x, w = cp.ones((4, 5), cp.float32), cp.ones((3, 5), cp.float32)
    with pytest.raises(RuntimeError, match=r"expected weight \[F, 5\]"):
        ops.linear_act_forward(x, cp.ones((3, 4), cp.float32))
    with pytest.raises(RuntimeError, match="dtype"):
        ops.linear_act_forward(x, w.astype(cp.float64))
    _, saved = ops.linear_act_forward(x, w, cp.ones(3, cp.float32), "relu")
    with pytest.raises(RuntimeError, match=r"grad_output of shape \[4, 3\]"):
        ops.linear_act_backward(cp.ones((4, 4), cp.float32), saved)


CHAIN_CASES = [  # M, widths, activations, biases, needs per layer (weight, bias), need dx
    (64, (256, 120, 84, 10), ("gelu", "gelu", None), (True, True, True), None, True),   # LeNet-5's head, 1 row
    (512, (256, 120, 84, 10), ("gelu", "gelu", None), (True, True, True), None, True),  # 4 rows per block
    (2000, (17, 33, 5), ("gelu_tanh", "relu"), (False, True), None, False),             # 8 rows, no dx
    (3, (1024, 64, 1024), ("relu", None), (True, True), ((False, True), (True, False)), True),   # widest; db only
    (5, (7, 9, 11, 13, 3), (None, "relu", "gelu", None), (True,) * 4, ((True, True), (False, False), (True, True),
                                                                        (False, True)), True),   # a frozen layer
]


@pytest.mark.parametrize("stage", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CHAIN_CASES)
def test_linear_chain(case, dtype, stage, rng, monkeypatch):
    """The chain kernels against the float64 layers one by one: output, dx and every layer's dw, db, with some
    gradients not asked for (None back), at 1, 2, 4 and 8 rows per block (the widest chain in float64: 2 rows, the
    shared-memory bound), the backward with its weights staged in shared memory where they fit and without."""
    monkeypatch.setattr(linear_kernels, "CHAIN_STAGE", stage)
    m, widths, acts, biases, needs, need_x = case
    layers, pre, h = [], [], [rng.standard_normal((m, widths[0])).astype(dtype)]
    for i, act in enumerate(acts):
        w = (rng.standard_normal((widths[i + 1], widths[i])) / np.sqrt(widths[i])).astype(dtype)
        b = rng.standard_normal(widths[i + 1]).astype(dtype) if biases[i] else None
        layers.append((w, b, act))
        pre.append(h[-1].astype(np.float64) @ w.astype(np.float64).T + (0 if b is None else b))
        h.append(ref.act(pre[-1], act))
    assert linear_kernels.chain_rows(m, widths, np.dtype(dtype).itemsize) is not None
    out, saved = ops.linear_chain_forward(g(h[0]), [(g(w), None if b is None else g(b), a) for w, b, a in layers])
    tol = ref.tol(dtype)
    assert out.dtype == dtype and out.shape == (m, widths[-1])
    assert_close(out, h[-1], tol, name="chain forward")
    dout = rng.standard_normal((m, widths[-1])).astype(dtype)
    dx, grads = ops.linear_chain_backward(g(dout), saved, need_x, needs)
    gpre = ref.act_grad(dout, pre[-1], acts[-1])
    for i in range(len(acts) - 1, -1, -1):
        need_w, need_b = (True, True) if needs is None else needs[i]
        dw, db = grads[i]
        scale = tol * max(1, np.sqrt(max(m, widths[i + 1])) / 8)
        if need_w:
            assert_close(dw, gpre.T @ h[i].astype(np.float64), scale, name=f"dw{i}")
        else:
            assert dw is None
        if need_b and biases[i]:
            assert_close(db, gpre.sum(0), scale, name=f"db{i}")
        else:
            assert db is None
        dh = gpre @ layers[i][0].astype(np.float64)
        gpre = ref.act_grad(dh, pre[i - 1], acts[i - 1]) if i else dh
    if need_x:
        assert_close(dx, gpre, tol * max(1, np.sqrt(widths[1]) / 8), name="dx")
    else:
        assert dx is None


CHAIN_INTO_POOL_CASES = [  # x, conv weight, its activation, rows (batch), the chain's widths after the first
    ((64, 6, 12, 12), (16, 6, 5, 5), "gelu", (120, 84, 10)),   # LeNet-5's second layer and head, 1 row per block
    ((512, 6, 12, 12), (16, 6, 5, 5), "relu", (120, 84, 10)),  # 4 rows per block
    ((3, 2, 8, 12), (5, 2, 3, 3), None, (7, 3)),               # 3 x 5 pooled: odd rows, no activation
]


@pytest.mark.parametrize("stage", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CHAIN_INTO_POOL_CASES)
def test_linear_chain_into_a_pooled_convolution(case, dtype, stage, rng, monkeypatch):
    """The chain's dx written as the g of the convolution whose pooled output (tile_conv_pool) the chain reads
    flattened (linear.cu chain_dx_unpooled): bit-equal to the plain dx, then max_pool2d_backward_act; the chain's
    weight gradients unchanged; none of it where INTO_PRODUCER is off or the chain's input is not that output."""
    monkeypatch.setattr(linear_kernels, "CHAIN_STAGE", stage)
    monkeypatch.setattr(linear_kernels, "CHAIN_INTO_POOLED_MAX_ROWS", 8)   # the 4-row case too
    xs, ws, act, widths = case
    x = rng.standard_normal(xs).astype(dtype)
    w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(dtype)
    b = rng.standard_normal(ws[0]).astype(dtype)
    pooled, csaved = ops.conv2d_forward(g(x), g(w), g(b), 1, 0, 1, 1, act, pool=POOL_2X2)
    assert csaved.pool is not None
    m, d0 = pooled.shape[0], pooled[0].size
    layers, k = [], d0
    for i, f in enumerate(widths):
        lw = (rng.standard_normal((f, k)) / np.sqrt(k)).astype(dtype)
        layers.append((g(lw), g(rng.standard_normal(f).astype(dtype)), "gelu" if i < len(widths) - 1 else None))
        k = f
    _, saved = ops.linear_chain_forward(pooled.reshape(m, d0), layers)
    dout = g(rng.standard_normal((m, widths[-1])).astype(dtype))
    handed, grads = ops.linear_chain_backward(dout, saved, into=csaved)
    assert isinstance(handed, conv_kernels.ProducerGrad) and handed.wpartial is None
    plain, plain_grads = ops.linear_chain_backward(dout, saved)
    want = ops.max_pool2d_backward_act(plain.reshape(pooled.shape), csaved.pool, csaved.y, csaved.bias, act)
    assert handed.g.shape == want.shape and cp.array_equal(handed.g, want)
    for (dw, db), (pw, pb) in zip(grads, plain_grads):
        assert cp.array_equal(dw, pw) and cp.array_equal(db, pb)
    _, other = ops.conv2d_forward(g(x[:-1]), g(w), g(b), 1, 0, 1, 1, act, pool=POOL_2X2)   # one image fewer
    assert other.pool is not None
    assert not isinstance(ops.linear_chain_backward(dout, saved, into=other)[0], conv_kernels.ProducerGrad)
    for knob in ("INTO_PRODUCER",):   # (linear.py reads it from the conv package)
        monkeypatch.setattr(conv_kernels, knob, False)
        assert not isinstance(ops.linear_chain_backward(dout, saved, into=csaved)[0], conv_kernels.ProducerGrad)


def test_linear_chain_errors():
    x = cp.ones((4, 5), cp.float32)
    w1, w2 = cp.ones((3, 5), cp.float32), cp.ones((2, 3), cp.float32)
    with pytest.raises(RuntimeError, match=r"layer 1 expected weight \[F, 3\]"):
        ops.linear_chain_forward(x, [(w1, None, None), (cp.ones((2, 4), cp.float32), None, None)])
    with pytest.raises(RuntimeError, match="dtype"):
        ops.linear_chain_forward(x, [(w1, None, None), (w2.astype(cp.float64), None, None)])
    with pytest.raises(ValueError, match="activation"):
        ops.linear_chain_forward(x, [(w1, None, "tanh"), (w2, None, None)])
    with pytest.raises(RuntimeError, match="does not fit the chain kernels"):
        ops.linear_chain_forward(cp.ones((4, 2000), cp.float32), [(cp.ones((3, 2000), cp.float32), None, None),
                                                                   (w2, None, None)])
    _, saved = ops.linear_chain_forward(x, [(w1, None, "relu"), (w2, cp.ones(2, cp.float32), None)])
    with pytest.raises(RuntimeError, match=r"grad_output of shape \[4, 2\]"):
        ops.linear_chain_backward(cp.ones((4, 3), cp.float32), saved)


MAX_POOL_CASES = [  # x shape, kernel, stride, padding, dilation, ceil_mode, with a NaN
    ((2, 3, 11, 9), 2, None, 0, 1, False, False),
    ((2, 3, 11, 9), 3, 2, 1, 1, True, False),
    ((2, 2, 13, 10), 3, (2, 1), (1, 0), (2, 1), False, False),
    ((1, 4, 9, 9), 2, 2, 0, 1, True, False),
    ((3, 7, 8), (3, 2), (2, 2), (1, 1), 1, False, True),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", MAX_POOL_CASES)
def test_max_pool2d(case, dtype, rng):
    torch = pytest.importorskip("torch")
    shape, kernel, stride, padding, dilation, ceil_mode, nan = case
    x = rng.standard_normal(shape).astype(dtype)
    if nan:
        x.reshape(-1)[[5, 17, 18]] = np.nan
    out, idx, saved = ops.max_pool2d_forward(g(x), kernel, stride, padding, dilation, ceil_mode)
    tx = torch.tensor(x.astype(np.float64), requires_grad=True)
    tout, tidx = torch.nn.functional.max_pool2d(tx, kernel, stride, padding, dilation, ceil_mode, return_indices=True)
    assert_close(out, tout.detach(), ref.tol(dtype), name="max_pool2d forward")
    np.testing.assert_array_equal(idx.get(), tidx.numpy())
    dout = rng.standard_normal(tuple(tout.shape)).astype(dtype)
    tout.backward(torch.tensor(dout.astype(np.float64)))
    assert_close(ops.max_pool2d_backward(g(dout), saved), tx.grad, ref.tol(dtype), name="max_pool2d dx")


AVG_POOL_CASES = [  # x shape, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override
    ((2, 3, 11, 9), 3, 2, 1, True, True, None),
    ((2, 3, 11, 9), 3, 2, 1, True, False, None),
    ((2, 3, 10, 7), 2, None, 0, False, True, None),
    ((1, 2, 9, 12), (3, 2), (2, 1), (1, 1), False, False, None),
    ((4, 7, 7), 3, 1, 1, False, True, 5),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", AVG_POOL_CASES)
def test_avg_pool2d(case, dtype, rng):
    torch = pytest.importorskip("torch")
    shape, kernel, stride, padding, ceil_mode, cip, divisor = case
    x = rng.standard_normal(shape).astype(dtype)
    out, saved = ops.avg_pool2d_forward(g(x), kernel, stride, padding, ceil_mode, cip, divisor)
    tx = torch.tensor(x.astype(np.float64), requires_grad=True)
    tout = torch.nn.functional.avg_pool2d(tx, kernel, stride, padding, ceil_mode, cip, divisor)
    assert_close(out, tout.detach(), ref.tol(dtype), name="avg_pool2d forward")
    dout = rng.standard_normal(tuple(tout.shape)).astype(dtype)
    tout.backward(torch.tensor(dout.astype(np.float64)))
    assert_close(ops.avg_pool2d_backward(g(dout), saved), tx.grad, ref.tol(dtype), name="avg_pool2d dx")


@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,pool", [((4, 6, 24, 24), (2, 2, 0)), ((3, 16, 8, 8), (2, 2, 0)),   # LeNet-5's
                                        ((2, 3, 9, 12), (3, 3, 0)), ((2, 3, 9, 10), (2, 2, 0)),    # 9 rows: gather
                                        ((2, 3, 8, 8), (3, 2, 1))])                                 # overlapping
def test_pool_backward_act_by_windows_equals_the_gather(shape, pool, activation, dtype, rng, record_kernels,
                                                        monkeypatch):
    """Where the windows tile the input, max_pool2d_backward_act runs a thread per window (the tiled kernel):
    bit-equal to the gather kernel on the same inputs (ties and the activation's derivative included); elsewhere
    the gather runs."""
    from smalltrain.backend.cuda import pool as pool_kernels
    n, c, h, w = shape
    x = rng.standard_normal(shape).astype(dtype)
    x[..., ::3, ::2] = x[..., 1::3, ::2][..., : x[..., ::3, ::2].shape[-2], :]   # equal values: ties in windows
    yh = rng.standard_normal((c, n * h * w)).astype(dtype)
    # two windows whose maximum's pre-activation is not finite (NaN, +inf), where the others' are read too
    # (common.cuh pooled_act_grad): the NaNs and infs around them as the gather gives them
    x[0, 0, 1, 1] = x[0, 0, 0, 3] = 1e30
    for (r, col), v in (((1, 1), np.nan), ((0, 0), np.inf), ((0, 1), -np.inf), ((0, 3), np.inf), ((1, 2), np.nan)):
        yh[0, r * w + col] = v
    y = g(yh)
    bias = g(rng.standard_normal(c).astype(dtype))
    k, s, p = pool
    pooled, _, saved = ops.max_pool2d_forward(g(x), k, s, p)
    dpool = g(rng.standard_normal(pooled.shape).astype(dtype))
    launched = record_kernels(pool_kernels, "launch")
    tiled = ops.max_pool2d_backward_act(dpool, saved, y if activation else None, bias, activation)
    monkeypatch.setattr(pool_kernels, "POOL_TILED", False)
    gathered = ops.max_pool2d_backward_act(dpool, saved, y if activation else None, bias, activation)
    exact = k == s and p == 0 and h % k == 0 and w % k == 0
    assert launched == ["max_pool2d_bwd_act_tiled" if exact else "max_pool2d_bwd_act", "max_pool2d_bwd_act"]
    assert cp.array_equal(tiled, gathered, equal_nan=True)
    assert bool(cp.isnan(tiled).any()) == (activation == "gelu")   # ReLU's derivative passes or zeroes a NaN


@pytest.mark.parametrize("kwargs, exc, msg", [
    ({"kernel_size": 3, "padding": 2}, RuntimeError, "half of effective kernel size"),
    ({"kernel_size": 0}, RuntimeError, "kernel_size"),
    ({"kernel_size": 2, "stride": 0}, RuntimeError, "stride"),
    ({"kernel_size": 9}, RuntimeError, "Output size is too small"),
])
def test_pool_errors(kwargs, exc, msg):
    x = cp.ones((1, 2, 5, 5), dtype=cp.float32)
    with pytest.raises(exc, match=msg):
        ops.max_pool2d_forward(x, **kwargs)
    with pytest.raises(exc, match=msg):
        ops.avg_pool2d_forward(x, **kwargs)
    with pytest.raises(RuntimeError, match="divisor must be not zero"):
        ops.avg_pool2d_forward(x, 2, divisor_override=0)


# --- activations ------------------------------------------------------------------------------------------------

def _act_input(rng, dtype):
    x = (rng.standard_normal(1031) * 3).astype(dtype)  # 1031: not a multiple of the block
    x[:4] = [0.0, -0.0, np.nan, -1e-30]
    return x


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["relu", "gelu", "gelu_tanh"])
def test_activation(name, dtype, rng):
    x = _act_input(rng, dtype).reshape(1031, 1)
    dout = rng.standard_normal(x.shape).astype(dtype)
    if name == "relu":
        out, saved = ops.relu_forward(g(x))
        dx = ops.relu_backward(g(dout), saved)
    else:
        out, saved = ops.gelu_forward(g(x), "tanh" if name == "gelu_tanh" else "none")
        dx = ops.gelu_backward(g(dout), saved)
    assert out.shape == x.shape and out.dtype == dtype
    assert_close(out, ref.act(x, name), ref.tol(dtype), name=f"{name} forward")
    assert_close(dx, ref.act_grad(dout, x, name), ref.tol(dtype), name=f"{name} backward")


def test_activation_errors():
    with pytest.raises(RuntimeError, match="approximate"):
        ops.gelu_forward(cp.ones(3, cp.float32), "fast")
    with pytest.raises(TypeError, match="float32 and float64"):
        ops.relu_forward(cp.ones(3, cp.int64))
    with pytest.raises(RuntimeError, match="shape"):
        ops.relu_backward(cp.ones(4, cp.float32), cp.ones(3, cp.float32))


# --- softmax and cross-entropy --------------------------------------------------------------------------------

SOFTMAX_CASES = [((7, 33), -1, 1.0), ((3, 5, 4), 1, 1.0), ((2, 3, 70), 0, 1.0), ((1000, 10), 1, 30.0),
                 ((40,), 0, 1.0), ((2, 1, 3), 1, 1.0)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("case", SOFTMAX_CASES)
def test_softmax(case, log, dtype, rng):
    shape, dim, scale = case
    x = (rng.standard_normal(shape) * scale).astype(dtype)
    dout = rng.standard_normal(shape).astype(dtype)
    fwd, bwd = (ops.log_softmax_forward, ops.log_softmax_backward) if log else (ops.softmax_forward,
                                                                                ops.softmax_backward)
    out, saved = fwd(g(x), dim)
    r = ref.log_softmax(x, dim)
    want = r if log else np.exp(r)
    assert_close(out, want, ref.tol(dtype), name="softmax forward")
    d = dout.astype(np.float64)
    if log:
        rdx = d - np.exp(r) * d.sum(axis=dim, keepdims=True)
    else:
        rdx = want * (d - (d * want).sum(axis=dim, keepdims=True))
    assert_close(bwd(g(dout), saved), rdx, ref.tol(dtype), name="softmax backward")


def test_softmax_nan_row_and_dim_error():
    x = cp.asarray(np.array([[1.0, np.nan, 2.0], [1.0, 2.0, 3.0]], dtype=np.float32))
    out, _ = ops.log_softmax_forward(x, 1)
    out = out.get()
    assert np.isnan(out[0]).all() and np.isfinite(out[1]).all()
    with pytest.raises(IndexError, match="Dimension out of range"):
        ops.softmax_forward(x, 2)


CE_CASES = [  # logits shape, weighted, some ignored, label_smoothing, reduction
    ((9, 10), False, False, 0.0, "mean"),
    ((9, 10), True, True, 0.1, "mean"),
    ((4, 7, 3, 5), False, True, 0.2, "none"),
    ((4, 7, 3, 5), True, True, 0.0, "sum"),
    ((5, 40), True, True, 0.3, "mean"),
    ((10,), True, False, 0.3, "sum"),
    ((6, 3), False, True, 0.0, "none"),
    ((300, 10), True, True, 0.1, "mean"),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CE_CASES)
def test_cross_entropy(case, dtype, rng):
    torch = pytest.importorskip("torch")
    shape, weighted, ignored, ls, reduction = case
    c = shape[0] if len(shape) == 1 else shape[1]
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    t = np.array(rng.integers(0, c)) if len(shape) == 1 else rng.integers(0, c, (shape[0],) + shape[2:])
    if ignored:
        t.reshape(-1)[::4] = -100
    w = (rng.random(c) + 0.5).astype(dtype) if weighted else None
    loss, saved = ops.cross_entropy_forward(g(x), g(t), None if w is None else g(w), -100, reduction, ls)
    assert_close(loss, ref.cross_entropy(x, t, w, -100, ls, reduction), ref.tol(dtype), name="cross_entropy")
    tx = torch.tensor(x.astype(np.float64), requires_grad=True)
    tw = None if w is None else torch.tensor(w.astype(np.float64))
    tl = torch.nn.functional.cross_entropy(tx, torch.tensor(t), tw, ignore_index=-100, reduction=reduction,
                                           label_smoothing=ls)
    dout = rng.standard_normal(tuple(tl.shape)).astype(dtype)
    tl.backward(torch.tensor(dout.astype(np.float64)))
    dx = ops.cross_entropy_backward(g(dout), saved)
    assert_close(dx, tx.grad, ref.tol(dtype), name="cross_entropy dx")


def test_cross_entropy_all_ignored_is_nan_and_unchecked_targets_do_not_crash():
    x = cp.asarray(np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32))
    for ls in (0.0, 0.2):   # torch: the loss is 0/0, the gradient exactly 0
        loss, saved = ops.cross_entropy_forward(x, cp.full(3, -100, dtype=cp.int64), label_smoothing=ls)
        assert np.isnan(float(loss))
        assert (ops.cross_entropy_backward(cp.ones((), cp.float32), saved).get() == 0).all()
    loss, saved = ops.cross_entropy_forward(x, cp.asarray(np.array([1, -100, 2])), reduction="none")
    dx = ops.cross_entropy_backward(cp.asarray(np.array([1.0, np.nan, 1.0], np.float32)), saved).get()
    assert (dx[1] == 0).all() and np.isfinite(dx).all()   # an ignored row stays 0 whatever its upstream gradient
    loss, _ = ops.cross_entropy_forward(x, cp.asarray(np.array([1, 9, 2])), reduction="none", check_target=False)
    loss = loss.get()
    assert np.isfinite(loss[[0, 2]]).all() and np.isnan(loss[1])


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_cross_entropy_bad_target_flag_is_cleared_after_the_error(reduction):
    """The forward kernel flags a bad target; the launcher raises and clears the flag, so the next call with good
    targets (ignored ones included, which must not set it) returns values, for every reduction."""
    x = cp.asarray(np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32))
    for bad in ([0, 5, 1, 2], [-1, 0, 1, 2], [0, 1, 2, 7]):
        with pytest.raises(IndexError, match=f"Target {[v for v in bad if not 0 <= v < 5][0]} is out of bounds"):
            ops.cross_entropy_forward(x, cp.asarray(np.array(bad)), reduction=reduction)
        loss, _ = ops.cross_entropy_forward(x, cp.asarray(np.array([0, -100, 4, 2])), reduction=reduction)
        assert np.isfinite(loss.get()).all()


# one block; partly and fully used; many blocks (125); more blocks (1125) than the last block has threads, which then
# add several blocks' sums each (9000 rows: 70,000 took ~29 s a case under the emulator's AddressSanitizer in CI)
@pytest.mark.parametrize("rows", [1, 7, 8, 9, 1000, 9_000])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_entropy_forward_and_reduction_in_one_launch(rows, reduction, rng):
    """The last block adds the blocks' sums (a ticket counter, reset after each launch); the loss matches the
    float64 reference and the separate-reduction path up to rounding, and repeats bit for bit."""
    x = rng.standard_normal((rows, 10)).astype(np.float32)
    t = rng.integers(0, 10, rows)
    t[::5] = -100
    want = ref.cross_entropy(x, t, None, -100, 0.0, reduction)
    loss, _ = ops.cross_entropy_forward(g(x), g(t), reduction=reduction)
    again, _ = ops.cross_entropy_forward(g(x), g(t), reduction=reduction)
    assert_close(loss.get(), want, 1e-5, name="loss")
    assert np.array_equal(loss.get(), again.get(), equal_nan=True)   # one row, ignored: 'mean' is NaN
    from smalltrain.backend.cuda import _common
    assert int(_common.device_counters("cross_entropy", 1)[0]) == 0


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("shape,weighted,smoothing", [((64, 10), False, 0.0), ((7, 5, 3), True, 0.1),
                                                      ((3, 4), True, 0.0), ((512, 10), True, 0.0)])
def test_cross_entropy_writes_the_unit_gradient_for_small_inputs(shape, weighted, smoothing, reduction, rng,
                                                                 monkeypatch):
    """Up to CE_UNIT_MAX elements the forward's last block also writes backward's dx for a loss gradient of 1:
    bit-equal to cross_entropy_backward with ones (ignored rows exactly 0); larger inputs and 'none' write none."""
    from smalltrain.backend.cuda import loss as loss_kernels
    x = rng.standard_normal(shape).astype(np.float32)
    t = rng.integers(0, shape[1], (shape[0],) + shape[2:])
    t.reshape(-1)[::4] = -100
    w = g(rng.uniform(0.5, 2, shape[1]).astype(np.float32)) if weighted else None
    loss, saved = ops.cross_entropy_forward(g(x), g(t), w, reduction=reduction, label_smoothing=smoothing)
    assert_close(loss, ref.cross_entropy(x, t, None if w is None else w.get(), -100, smoothing, reduction), 1e-5,
                 name="loss")
    want = ops.cross_entropy_backward(cp.ones((), cp.float32), saved)
    assert saved.unit is not None and cp.array_equal(saved.unit, want)
    assert float(cp.abs(want).max()) > 0 and not cp.isnan(want).any()
    _, none = ops.cross_entropy_forward(g(x), g(t), w, reduction="none")
    assert none.unit is None
    monkeypatch.setattr(loss_kernels, "CE_UNIT_MAX", x.size - 1)
    assert ops.cross_entropy_forward(g(x), g(t), w, reduction=reduction)[1].unit is None


def test_loss_backward_without_a_gradient_runs_no_kernel_after_cross_entropy(rng):
    """F.cross_entropy(...).backward() takes the forward's unit gradient (autograd.engine.UNIT_SEED): the same
    gradients as backward with an explicit 1, and a retained graph's second pass scales again."""
    import smalltrain as st
    from smalltrain.nn import functional as F
    x0 = rng.standard_normal((64, 10)).astype(np.float32)
    t = st.tensor(rng.integers(0, 10, 64), device="cuda")
    grads = []
    for seed in (None, st.tensor(np.float32(1.0), device="cuda")):
        x = st.tensor(x0, device="cuda", requires_grad=True)
        loss = F.cross_entropy(x * 2, t)
        unit = loss.grad_fn.kernel_saved.unit
        loss.backward(seed, retain_graph=True)
        assert (loss.grad_fn.kernel_saved.unit is None) == (seed is None) and unit is not None
        grads.append(x.grad.cpu().numpy().copy())
        loss.backward(seed)
        assert np.array_equal(x.grad.cpu().numpy(), 2 * grads[-1])
    assert np.array_equal(grads[0], grads[1])


def test_cross_entropy_replays_as_a_cuda_graph(rng):
    """Forward + backward captured once (the host-side target check must skip itself while capturing), then
    replayed on new logits written into the same buffer."""
    x = g(rng.standard_normal((33, 10)).astype(np.float32))
    t = g(rng.integers(0, 10, 33))
    loss, saved = ops.cross_entropy_forward(x, t)  # eager warm-up: every kernel compiled before capture
    ops.cross_entropy_backward(cp.ones((), cp.float32), saved)
    cp.cuda.Device().synchronize()  # the non-blocking stream below does not wait for the warm-up's null-stream work
    stream, pool = cp.cuda.Stream(non_blocking=True), cp.cuda.MemoryPool()
    with stream, cp.cuda.using_allocator(pool.malloc):
        stream.begin_capture()
        loss, saved = ops.cross_entropy_forward(x, t)
        dx = ops.cross_entropy_backward(cp.ones((), cp.float32), saved)
        graph = stream.end_capture()
        new = rng.standard_normal((33, 10)).astype(np.float32)
        x.set(new, stream=stream)
        graph.launch(stream)
    stream.synchronize()
    target = t.get()
    assert_close(loss, ref.cross_entropy(new, target, None, -100, 0.0, "mean"), 1e-5, name="loss")
    want = np.exp(ref.log_softmax(new, 1))
    want[np.arange(33), target] -= 1
    assert_close(dx, want / 33, 1e-5, name="dx")


@pytest.mark.parametrize("x_shape, target, kwargs, exc, msg", [
    ((3, 4), np.array([0, 4, 1]), {}, IndexError, "Target 4 is out of bounds"),
    ((3, 4), np.array([0, 1]), {}, ValueError, "batch_size"),
    ((3, 4), np.zeros((3, 4), np.float32), {}, NotImplementedError, "probability targets"),
    ((3, 4), np.array([0, 1, 2], np.int32), {}, RuntimeError, "int64"),
    ((3, 4), np.array([0, 1, 2]), {"weight": np.ones(5, np.float32)}, RuntimeError, "weight tensor"),
    ((3, 4), np.array([0, 1, 2]), {"reduction": "avg"}, ValueError, "not a valid value"),
    ((3, 4), np.array([0, 1, 2]), {"label_smoothing": 1.5}, RuntimeError, "label_smoothing"),
    ((3, 4, 2), np.array([[0, 1], [1, 2]]), {}, RuntimeError, "Expected target size"),
])
def test_cross_entropy_errors(x_shape, target, kwargs, exc, msg):
    kwargs = {k: g(v) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()}
    with pytest.raises(exc, match=msg):
        ops.cross_entropy_forward(cp.zeros(x_shape, cp.float32), g(target), **kwargs)


# --- batch norm -------------------------------------------------------------------------------------------------

BN_CASES = [((6, 5), True, True), ((4, 3, 7, 9), True, True), ((2, 4, 33), False, True), ((4, 3, 7, 9), True, False),
            ((5, 2, 3), False, False)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("case", BN_CASES)
def test_batch_norm(case, training, dtype, rng):
    torch = pytest.importorskip("torch")
    shape, affine, track = case
    if not training and not track:
        pytest.skip("eval mode needs running statistics")
    c = shape[1]
    x = (rng.standard_normal(shape) * 2 + 1).astype(dtype)
    w, b = ((rng.standard_normal(c).astype(dtype), rng.standard_normal(c).astype(dtype)) if affine else (None, None))
    rm, rv = ((rng.standard_normal(c).astype(dtype), (rng.random(c) + 0.5).astype(dtype)) if track else (None, None))
    grm, grv = (g(rm), g(rv)) if track else (None, None)
    y, saved = ops.batch_norm_forward(g(x), grm, grv, None if w is None else g(w), None if b is None else g(b),
                                      training, 0.1, 1e-5)
    ry, rrm, rrv = ref.batch_norm(x, rm, rv, w, b, training, 0.1, 1e-5)
    tol = ref.tol(dtype)
    assert_close(y, ry, tol, name="batch_norm forward")
    if track:
        assert_close(grm, rrm, tol, name="running_mean")
        assert_close(grv, rrv, tol, name="running_var")
    t64 = lambda a: None if a is None else torch.tensor(a.astype(np.float64), requires_grad=True)  # noqa: E731
    tx, tw, tb = t64(x), t64(w), t64(b)
    ty = torch.nn.functional.batch_norm(tx, None if rm is None else torch.tensor(rm.astype(np.float64)),
                                        None if rv is None else torch.tensor(rv.astype(np.float64)), tw, tb,
                                        training, 0.1, 1e-5)
    dout = rng.standard_normal(shape).astype(dtype)
    ty.backward(torch.tensor(dout.astype(np.float64)))
    dx, dw, db = ops.batch_norm_backward(g(dout), saved)
    assert_close(dx, tx.grad, tol, name="batch_norm dx")
    if affine:
        assert_close(dw, tw.grad, tol, name="batch_norm dweight")
        assert_close(db, tb.grad, tol, name="batch_norm dbias")
    else:
        assert dw is None


def test_batch_norm_errors():
    x = cp.ones((1, 3), cp.float32)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        ops.batch_norm_forward(x, None, None)
    with pytest.raises(RuntimeError, match="shape"):
        ops.batch_norm_forward(cp.ones((4, 3), cp.float32), cp.zeros(2, cp.float32), cp.ones(2, cp.float32))
    with pytest.raises(RuntimeError, match="evaluation mode"):
        ops.batch_norm_forward(cp.ones((4, 3), cp.float32), None, None, training=False)


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
    from smalltrain.backend.cuda import loader
    for dtypes, own, other in ((1, "adam_step_f32", "adam_step_f64"), (2, "adam_step_f64", "adam_step_f32")):
        _assert_module_kernels(loader.compile_module(loader.family_source("optim", dtypes)), [own, "set_hyper"],
                               [other])

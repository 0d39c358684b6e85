"""CUDA chains of linear layers (backend/cuda/linear_chain.py) against the float64 layers one by one, the
hand-off of dx to a pooled convolution, and the chain's launch plans (rows per block, staging, hand-off)."""
import os

import cuda_reference as ref
import numpy as np
import pytest

import smalltrain
from smalltrain.backend.cuda import conv as conv_kernels
from smalltrain.backend.cuda import cupy, loader, ops
from smalltrain.backend.cuda import linear_chain as chain_kernels
from smalltrain.backend.cuda.linear_chain import CHAIN
from smalltrain.backend.cuda.tuning import override
from smalltrain.testing import assert_close

GPU = smalltrain.cuda.is_available()
cp = cupy() if GPU else None
gpu = pytest.mark.skipif(not GPU, reason="no CUDA device")
DTYPES = [np.float32, np.float64]


def g(a):
    return cp.asarray(a)


CHAIN_CASES = [  # M, widths, activations, biases, needs per layer (weight, bias), need dx
    (64, (256, 120, 84, 10), ("gelu", "gelu", None), (True, True, True), None, True),   # LeNet-5's head, 1 row
    (512, (256, 120, 84, 10), ("gelu", "gelu", None), (True, True, True), None, True),  # 4 rows per block
    (2000, (17, 33, 5), ("gelu_tanh", "relu"), (False, True), None, False),             # 8 rows, no dx
    (3, (1024, 64, 1024), ("relu", None), (True, True), ((False, True), (True, False)), True),   # widest; db only
    (5, (7, 9, 11, 13, 3), (None, "relu", "gelu", None), (True,) * 4, ((True, True), (False, False), (True, True),
                                                                        (False, True)), True),   # a frozen layer
]


# the chain's backward with its weights staged in shared memory where they fit (the default), and never
STAGING = {"staged": {}, "rows": {"staged_max_smem": 0}}


@gpu
@pytest.mark.parametrize("stage", list(STAGING))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CHAIN_CASES)
def test_linear_chain(case, dtype, stage, rng):
    """The chain kernels against the float64 layers one by one: output, dx and every layer's dw, db, with some
    gradients not asked for (None back), at 1, 2, 4 and 8 rows per block (the widest chain in float64: 2 rows, the
    shared-memory bound), the backward with its weights staged in shared memory where they fit and without."""
    m, widths, acts, biases, needs, need_x = case
    layers, pre, h = [], [], [rng.standard_normal((m, widths[0])).astype(dtype)]
    for i, act in enumerate(acts):
        w = (rng.standard_normal((widths[i + 1], widths[i])) / np.sqrt(widths[i])).astype(dtype)
        b = rng.standard_normal(widths[i + 1]).astype(dtype) if biases[i] else None
        layers.append((w, b, act))
        pre.append(h[-1].astype(np.float64) @ w.astype(np.float64).T + (0 if b is None else b))
        h.append(ref.act(pre[-1], act))
    assert chain_kernels.chain_rows(m, widths, np.dtype(dtype).itemsize) is not None
    out, saved = ops.linear_chain_forward(g(h[0]), [(g(w), None if b is None else g(b), a) for w, b, a in layers])
    tol = ref.tol(dtype)
    assert out.dtype == dtype and out.shape == (m, widths[-1])
    assert_close(out, h[-1], tol, name="chain forward")
    dout = rng.standard_normal((m, widths[-1])).astype(dtype)
    with override(CHAIN, **STAGING[stage]):
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


POOL_2X2 = ((2, 2), (2, 2), (0, 0), (1, 1))   # conv2d_forward's pool: kernel, stride, padding, dilation
CHAIN_INTO_POOL_CASES = [  # x, conv weight, its activation, rows (batch), the chain's widths after the first
    ((64, 6, 12, 12), (16, 6, 5, 5), "gelu", (120, 84, 10)),   # LeNet-5's second layer and head, 1 row per block
    ((512, 6, 12, 12), (16, 6, 5, 5), "relu", (120, 84, 10)),  # 4 rows per block
    ((3, 2, 8, 12), (5, 2, 3, 3), None, (7, 3)),               # 3 x 5 pooled: odd rows, no activation
]


@gpu
@pytest.mark.parametrize("stage", list(STAGING))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CHAIN_INTO_POOL_CASES)
def test_linear_chain_into_a_pooled_convolution(case, dtype, stage, rng):
    """The chain's dx written as the g of the convolution whose pooled output (tile_conv_pool) the chain reads
    flattened (linear_chain.cu chain_dx_unpooled): bit-equal to the plain dx, then max_pool2d_backward_act; the
    chain's weight gradients unchanged; none of it where the chain's input is not that output."""
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
    with override(CHAIN, into_pooled_max_rows=8, **STAGING[stage]):   # the 4-row case too
        handed, grads = ops.linear_chain_backward(dout, saved, into=csaved)
        plain, plain_grads = ops.linear_chain_backward(dout, saved)
    assert isinstance(handed, conv_kernels.ProducerGrad) and handed.wpartial is None
    want = ops.max_pool2d_backward_act(plain.reshape(pooled.shape), csaved.pool, csaved.y, csaved.bias, act)
    assert handed.g.shape == want.shape and cp.array_equal(handed.g, want)
    for (dw, db), (pw, pb) in zip(grads, plain_grads):
        assert cp.array_equal(dw, pw) and cp.array_equal(db, pb)
    _, other = ops.conv2d_forward(g(x[:-1]), g(w), g(b), 1, 0, 1, 1, act, pool=POOL_2X2)   # one image fewer
    assert other.pool is not None
    with override(CHAIN, into_pooled_max_rows=8):
        assert not isinstance(ops.linear_chain_backward(dout, saved, into=other)[0], conv_kernels.ProducerGrad)


@gpu
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


def test_chain_rows_per_block(monkeypatch):
    """chain_rows on 132 SMs, no GPU needed: the fewest rows per block that leave <= one block per SM, fewer where
    the two row buffers would not fit in 48 KiB of shared memory, None outside the chain kernels' limits."""
    chain = chain_kernels
    monkeypatch.setattr(chain, "_sm_count", lambda: 132)
    lenet = (256, 120, 84, 10)
    assert [chain.chain_rows(m, lenet, 4) for m in (1, 64, 132, 133, 512, 1056, 5000)] == [1, 1, 1, 2, 4, 8, 8]
    assert chain.chain_rows(512, (1024, 64, 1024), 8) == 2    # 2 x 2 x 1024 x 8 bytes = 32 KiB; 4 rows: 64 KiB
    assert chain.chain_rows(64, (784, 256, 10), 4) == 1                 # the MLP
    assert chain.chain_rows(64, (256, 10), 4) is None                   # one layer: linear_act
    assert chain.chain_rows(64, (8,) * 6, 4) is None                    # five layers
    assert chain.chain_rows(64, (1025, 10, 10), 4) is None              # too wide
    assert chain.chain_rows(0, lenet, 4) is None
    assert chain.chain_rows(200_000, lenet, 4) is None                  # 25,000 blocks x 41,640 weights
    with override(CHAIN, max_layers=0):
        assert chain.chain_rows(64, lenet, 4) is None                   # the layers one by one


def test_every_chain_variant_is_instantiated():
    chain = chain_kernels
    src = loader.read_source(os.path.join(loader.KERNEL_DIR, "linear_chain.cu"))
    assert f"#define ST_CMAX {chain._SLOTS}" in src and f"#define ST_CTHREADS {chain._CHAIN_THREADS}" in src
    assert CHAIN.max_layers <= chain._SLOTS
    chains = " ".join(f"ST_CHAIN(T, S, {r})" for r in chain._CHAIN_ROWS)
    assert f"#define ST_CHAINS(T, S) {chains}\nST_INSTANTIATE(ST_CHAINS)" in src


def test_chain_backward_staging_choice():
    """chain_bwd_staged where the row buffers and the weights it reads (each from a 16-byte boundary, the first
    layer's only for dx) fit the opt-in shared memory (H200: 232,448 bytes), else chain_bwd_rows in its 48 KiB."""
    chain = chain_kernels
    lenet, h200 = (256, 120, 84, 10), 232_448
    weights = 256 * 120 + 120 * 84 + 84 * 10
    assert chain._chain_staged_smem(4, lenet, 4, True) == (2 * 4 * 256 + weights) * 4
    assert chain._chain_staged_smem(4, lenet, 4, False) == (2 * 4 * 256 + weights - 256 * 120) * 4
    # row buffers of 2 x 13 floats, then layers 3, 2, 1, 0 (39, 143, 99, 63 floats) from multiples of 4
    assert chain._chain_staged_smem(1, (7, 9, 11, 13, 3), 4, True) == (28 + 40 + 144 + 100 + 63) * 4
    with override(CHAIN, staged_max_smem=h200):
        assert chain._chain_bwd_kernel(4, lenet, 4, True) == ("chain_bwd_staged_r4", 174_752)
        assert chain._chain_bwd_kernel(1, lenet, 4, True) == ("chain_bwd_staged_r1", 168_608)
        assert chain._chain_bwd_kernel(4, lenet, 8, True) == ("chain_bwd_rows_r4", 16_384)   # 341 KiB
    with override(CHAIN, staged_max_smem=48 * 1024):
        assert chain._chain_bwd_kernel(4, lenet, 4, True) == ("chain_bwd_rows_r4", 8_192)


def test_chain_into_pooled_choice(monkeypatch):
    """On the CPU: the chain's backward writes the g of a convolution that pooled in its epilogue where the chain
    reads that pooled output flattened (chain_into_pooled_ok): one dtype, its pre-activation kept, the shapes
    matching, and at most CHAIN.into_pooled_max_rows rows per block in the chain's backward."""
    from types import SimpleNamespace

    def producer(**over):   # LeNet-5's second layer at batch 64: [64, 16, 8, 8] pooled to [64, 16, 4, 4]
        p = SimpleNamespace(x_shape=(64, 6, 12, 12), weight=SimpleNamespace(shape=(16, 6, 5, 5), dtype=np.float32),
                            out_hw=(8, 8), activation="gelu", y=object(),
                            pool=(SimpleNamespace(shape=(64, 16, 4, 4)),))
        p.__dict__.update(over)
        return p
    head = [np.zeros((120, 256), np.float32), np.zeros((84, 120), np.float32), np.zeros((10, 84), np.float32)]
    chain = SimpleNamespace(x=np.zeros((64, 256), np.float32), weights=head)
    monkeypatch.setattr(chain_kernels, "_sm_count", lambda: 132)   # (chain_rows)
    assert chain_kernels.chain_into_pooled_ok(chain, producer())
    for over in ({"y": None}, {"pool": (SimpleNamespace(shape=(64, 16, 4, 2)),)},
                 {"weight": SimpleNamespace(shape=(16, 6, 5, 5), dtype=np.float64)}):
        assert not chain_kernels.chain_into_pooled_ok(chain, producer(**over)), over
    assert not chain_kernels.chain_into_pooled_ok(SimpleNamespace(x=np.zeros((64, 1024), np.float32), weights=head),
                                                  producer(pool=None))
    # batch 512: 4 rows per block in the chain's backward, over into_pooled_max_rows (1) unless raised
    chain512 = SimpleNamespace(x=np.zeros((512, 256), np.float32), weights=head)
    producer512 = producer(x_shape=(512, 6, 12, 12), pool=(SimpleNamespace(shape=(512, 16, 4, 4)),))
    assert chain_kernels.chain_rows(512, [256, 120, 84, 10], 4) == 4
    assert not chain_kernels.chain_into_pooled_ok(chain512, producer512)
    with override(CHAIN, into_pooled_max_rows=4):
        assert chain_kernels.chain_into_pooled_ok(chain512, producer512)

"""CUDA launchers with state or indices: dropout (bit-exact against a NumPy Philox4x32-10), gather / scatter-add,
several copies in one launch, and the fused multi-tensor SGD and Adam steps (against NumPy float64 transcriptions
of torch's algorithms),
including an Adam step captured once as a CUDA graph and replayed. Skips without CuPy or a GPU."""
import numpy as np
import pytest

cp = pytest.importorskip("cupy")
import smalltrain  # noqa: E402

if not smalltrain.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import cuda_reference as ref  # noqa: E402

from smalltrain.backend.cuda import ops  # noqa: E402
from smalltrain.testing import assert_close  # noqa: E402

DTYPES = [np.float32, np.float64]


def g(a):
    return cp.asarray(a)


# --- dropout ----------------------------------------------------------------------------------------------------

def test_dropout_mask_matches_philox_reference():
    n, p, seed, offset = 10007, 0.3, 2 ** 40 + 12345, 2 ** 33 + 3
    mask = ops.dropout_mask((n,), p, seed=seed, offset=offset)
    np.testing.assert_array_equal(mask.get(), ref.dropout_mask(n, p, seed, offset))


@pytest.mark.parametrize("dtype", DTYPES)
def test_dropout_forward_backward(dtype, rng):
    x = rng.standard_normal((37, 29)).astype(dtype)
    p, seed, offset = 0.4, 99, 5
    state = ops.dropout_state(seed, offset)
    out, saved = ops.dropout_forward(g(x), p, state=state)
    keep = ref.dropout_mask(x.size, p, seed, offset).reshape(x.shape).astype(bool)
    scale = dtype(1 / (1 - p))
    np.testing.assert_array_equal(out.get(), np.where(keep, x * scale, 0))
    state[1] += 1  # the caller advancing its state must not change what backward regenerates
    dout = rng.standard_normal(x.shape).astype(dtype)
    np.testing.assert_array_equal(ops.dropout_backward(g(dout), saved).get(), np.where(keep, dout * scale, 0))
    assert abs((1 - keep.mean()) - p) < 5 * np.sqrt(p * (1 - p) / x.size)


def test_dropout_reproducible_edges_and_errors(rng):
    x = g(rng.standard_normal(1001).astype(np.float32))
    a, _ = ops.dropout_forward(x, 0.5, seed=7, offset=0)
    b, _ = ops.dropout_forward(x, 0.5, seed=7, offset=0)
    c, _ = ops.dropout_forward(x, 0.5, seed=7, offset=1)
    assert cp.array_equal(a, b) and not cp.array_equal(a, c)
    assert cp.array_equal(ops.dropout_forward(x, 0.0, seed=1)[0], x)
    assert not ops.dropout_forward(x, 1.0, seed=1)[0].any()
    same, saved = ops.dropout_forward(x, 0.5, training=False)
    assert same is x and saved is None
    with pytest.raises(ValueError, match="between 0 and 1"):
        ops.dropout_forward(x, 1.5, seed=1)
    with pytest.raises(RuntimeError, match="uint64"):
        ops.dropout_forward(x, 0.5, state=cp.zeros(2, cp.int64))


# --- gather / scatter-add -------------------------------------------------------------------------------------

GATHER_CASES = [((4, 6, 5), 1, (4, 3, 5)), ((7, 3), 0, (10, 3)), ((3, 4, 5), -1, (3, 4, 9)),
                ((5, 6, 7), 1, (3, 4, 2)), ((300,), 0, (1000,))]


def _region(shape, dim):
    return tuple(slice(None) if d == dim else slice(0, n) for d, n in enumerate(shape))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", GATHER_CASES)
def test_gather_and_backward(case, dtype, rng):
    x_shape, dim, idx_shape = case
    d = dim % len(x_shape)
    x = rng.standard_normal(x_shape).astype(dtype)
    idx = rng.integers(0, x_shape[d], idx_shape)
    out = ops.gather(g(x), dim, g(idx))
    np.testing.assert_array_equal(out.get(), np.take_along_axis(x[_region(idx_shape, d)], idx, d))
    dout = rng.standard_normal(idx_shape).astype(dtype)
    want = np.zeros(x_shape)
    grids = list(np.indices(idx_shape))
    grids[d] = idx
    np.add.at(want, tuple(grids), dout.astype(np.float64))
    assert_close(ops.gather_backward(g(dout), dim, g(idx), x_shape), want, ref.tol(dtype), name="gather backward")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("idx_shape, inplace", [((5, 20, 4), False), ((3, 10, 2), True)])
def test_scatter_add(idx_shape, inplace, dtype, rng):
    x = rng.standard_normal((5, 8, 4)).astype(dtype)
    idx = rng.integers(0, 8, idx_shape)  # many duplicates: the atomics are exercised
    src = rng.standard_normal((6, 21, 4)).astype(dtype)
    gx = g(x)
    out = ops.scatter_add(gx, 1, g(idx), g(src), inplace=inplace)
    assert (out is gx) == inplace
    want = x.astype(np.float64)
    grids = list(np.indices(idx_shape))
    grids[1] = idx
    np.add.at(want, tuple(grids), src[_region(idx_shape, -1)].astype(np.float64))
    assert_close(out, want, ref.tol(dtype), name="scatter_add")
    if not inplace:
        np.testing.assert_array_equal(gx.get(), x)


def test_index_errors():
    x = cp.ones((3, 4), cp.float32)
    with pytest.raises(RuntimeError, match="out of bounds for dimension 1 with size 4"):
        ops.gather(x, 1, g(np.array([[0, 4]])))
    with pytest.raises(RuntimeError, match="int64"):
        ops.gather(x, 1, cp.zeros((3, 1), cp.int32))
    with pytest.raises(RuntimeError, match="same number of dimensions"):
        ops.gather(x, 1, cp.zeros(3, cp.int64))
    with pytest.raises(IndexError, match="Dimension out of range"):
        ops.gather(x, 2, cp.zeros((3, 1), cp.int64))
    with pytest.raises(RuntimeError, match="dtype"):
        ops.scatter_add(x, 0, cp.zeros((1, 4), cp.int64), cp.ones((1, 4), cp.float64))
    out = ops.gather(x, 1, g(np.array([[0, 7]])), check_bounds=False).get()
    assert out[0, 0] == 1 and np.isnan(out[0, 1])


# --- optimizers -------------------------------------------------------------------------------------------------

SHAPES = [(5000,), (3, 7), (1,), (4097,), (64, 65)]  # several cross the 4096-element chunk boundary
SGD_CASES = [{"momentum": 0.0}, {"momentum": 0.9, "dampening": 0.1},
             {"momentum": 0.9, "nesterov": True, "weight_decay": 0.01},
             {"momentum": 0.5, "maximize": True, "weight_decay": 0.1}]


def _params(rng, dtype, shapes=SHAPES):
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def test_copy_many_copies_every_pair_in_launches_of_four(rng):
    """Six copies, so two launches: float32 and int64 arrays, sizes with a tail of fewer than 16 bytes, bytes at an
    odd offset (no 16-byte vectors there), an empty pair and NaNs with payloads: each destination equals its source
    bit for bit, and the bytes around the offset one stay as they were."""
    from smalltrain.backend.cuda import index
    nan_bits = np.array([0x7FC00001, 0xFFFFFFFF, 0x7F800001], np.uint32).view(np.float32)
    raw_src = g(rng.integers(0, 256, 1001).astype(np.uint8))
    raw_dst = cp.zeros(1001, np.uint8)
    srcs = [g(rng.standard_normal((64, 1, 28, 28)).astype(np.float32)), g(rng.integers(0, 10, 64)), g(nan_bits),
            raw_src[1:], g(np.zeros(0)), g(rng.standard_normal(33))]
    dsts = [cp.zeros(s.shape, s.dtype) for s in srcs[:3]] + [raw_dst[1:]] + \
        [cp.zeros(s.shape, s.dtype) for s in srcs[4:]]
    index.copy_many(list(zip(dsts, srcs)))
    for d, s in zip(dsts, srcs):
        np.testing.assert_array_equal(d.view(np.uint8).get(), s.view(np.uint8).get())
    assert int(raw_dst[0]) == 0


def test_copy_many_errors():
    from smalltrain.backend.cuda import index
    a = cp.zeros((4, 4), np.float32)
    with pytest.raises(RuntimeError, match=r"expected C-contiguous arrays, got src\[0\] of shape \[4, 2\]"):
        index.copy_many([(cp.zeros((4, 2), np.float32), a[:, ::2])])
    with pytest.raises(RuntimeError, match=r"dst\[1\] and src\[1\] of the same size in bytes, got 64 and 32"):
        index.copy_many([(a, a.copy()), (a, cp.zeros(4, np.float64))])
    with pytest.raises(TypeError, match=r"expected src\[0\] to be a cupy.ndarray on a CUDA device, got ndarray"):
        index.copy_many([(a, np.zeros((4, 4), np.float32))])
    assert index.copy_many([(a, a.copy() + 1)], updatable=True) is None   # outside a capture: nothing launched
    assert float(a.sum()) == 0


def test_copy_many_as_graph_nodes_copies_the_sources_each_replay_was_given(rng):
    """copy_many(updatable=True) captured at a graph's head: five pairs, so two nodes; before each replay
    copy_sources sets new sources (a float32 batch, int64 targets, bytes at an odd offset, float64 values, an empty
    pair) or None (nothing copied into that slot). Each replay's destinations equal its own sources bit for bit;
    three replays queued without a sync add their own batches into an accumulator."""
    from smalltrain.backend.cuda import graphs, index

    def sources():
        raw = g(rng.integers(0, 256, 1001).astype(np.uint8))
        return [g(rng.standard_normal((64, 1, 28, 28)).astype(np.float32)), g(rng.integers(0, 10, 64)), raw[1:],
                g(rng.standard_normal(33)), g(np.zeros(0))]
    first = sources()
    raw_dst = cp.zeros(1001, np.uint8)
    dsts = [cp.zeros_like(s) for s in first[:2]] + [raw_dst[1:]] + [cp.zeros_like(s) for s in first[3:]]
    acc = cp.zeros_like(dsts[0])
    cuda_graph = graphs.CUDAGraph()
    with graphs.graph(cuda_graph):
        nodes = index.copy_many([(d, d) for d in dsts], updatable=True)
        with pytest.raises(RuntimeError, match="capture has not ended"):
            index.copy_sources(nodes[0], first[:4])
        acc += dsts[0]
    assert len(nodes) == 2
    before = [d.copy() for d in dsts]
    for srcs, skip in ((first, None), (sources(), 2), (sources(), 0)):
        given = [None if k == skip else s for k, s in enumerate(srcs)]
        index.copy_sources(nodes[0], given[:4])
        index.copy_sources(nodes[1], given[4:])
        cuda_graph.replay()
        cp.cuda.get_current_stream().synchronize()
        for k, (d, s) in enumerate(zip(dsts, given)):
            want = before[k] if s is None else s
            np.testing.assert_array_equal(d.view(np.uint8).get(), want.view(np.uint8).get())
        before = [d.copy() for d in dsts]
        assert int(raw_dst[0]) == 0
    acc[...] = 0
    batches = [sources() for _ in range(3)]
    for srcs in batches:
        index.copy_sources(nodes[0], srcs[:4])
        cuda_graph.replay()
    np.testing.assert_array_equal(acc.get(), sum(b[0] for b in batches).get())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kw", SGD_CASES)
def test_sgd_step(kw, dtype, rng):
    params = _params(rng, dtype)
    gp = [g(p) for p in params]
    bufs = [cp.empty_like(p) for p in gp] if kw["momentum"] else None
    rp, rb = [p.astype(np.float64) for p in params], [None] * len(params)
    for step in range(3):
        grads = _params(rng, dtype)
        ops.sgd_step(gp, [g(x) for x in grads], bufs, lr=0.05, first_step=step == 0, **kw)
        for i, gr in enumerate(grads):
            rp[i], rb[i] = ref.sgd(rp[i], gr.astype(np.float64), rb[i], 0.05, kw["momentum"], kw.get("dampening", 0),
                                   kw.get("weight_decay", 0), kw.get("nesterov", False), kw.get("maximize", False),
                                   step == 0)
    for i in range(len(params)):
        assert_close(gp[i], rp[i], ref.tol(dtype), name=f"param {i}")
        if bufs is not None:
            assert_close(bufs[i], rb[i], ref.tol(dtype), name=f"momentum buffer {i}")


ADAM_CASES = [{}, {"amsgrad": True, "weight_decay": 0.01}, {"weight_decay": 0.1, "decoupled_weight_decay": True},
              {"maximize": True, "amsgrad": True}]


def _adam_run(rng, dtype, step_dtype, kw, steps, lr=1e-2, shapes=SHAPES):
    params = _params(rng, dtype, shapes)
    gp = [g(p) for p in params]
    state = [[cp.zeros_like(p) for p in gp] for _ in range(3)]
    step = cp.zeros(1, dtype=step_dtype)
    rs = [[p.astype(np.float64), np.zeros(p.shape), np.zeros(p.shape), np.zeros(p.shape)] for p in params]
    for t in range(1, steps + 1):
        grads = _params(rng, dtype, shapes)
        ops.adam_step(gp, [g(x) for x in grads], state[0], state[1], state[2], step=step, lr=lr, **kw)
        for r, gr in zip(rs, grads):
            r[:] = ref.adam(r[0], gr.astype(np.float64), *r[1:], t, lr, 0.9, 0.999, 1e-8, kw.get("weight_decay", 0),
                            kw.get("amsgrad", False), kw.get("maximize", False),
                            kw.get("decoupled_weight_decay", False))
    return gp, state, step, rs


@pytest.mark.parametrize("dtype, step_dtype", [(np.float32, np.float32), (np.float64, np.float64),
                                               (np.float32, np.float64)])
@pytest.mark.parametrize("kw", ADAM_CASES)
def test_adam_step(kw, dtype, step_dtype, rng):
    gp, (m, v, vmax), step, rs = _adam_run(rng, dtype, step_dtype, kw, steps=5)
    assert float(step[0]) == 5
    tol = ref.tol(dtype)
    for i, (rp, rm, rv, rvmax) in enumerate(rs):
        assert_close(gp[i], rp, tol, name=f"param {i}")
        assert_close(m[i], rm, tol, name=f"exp_avg {i}")
        assert_close(v[i], rv, tol, name=f"exp_avg_sq {i}")
        if kw.get("amsgrad"):
            assert_close(vmax[i], rvmax, tol, name=f"max_exp_avg_sq {i}")


def test_adam_step_count_without_counters_is_a_kernel_of_its_own(rng, monkeypatch):
    """Where the ticket counter does not exist yet (a capture in progress), the count is incremented by its own
    kernel before the update: the same parameters, bit for bit, as with the last block storing it."""
    from smalltrain.backend.cuda import optim as optim_kernels
    seed = int(rng.integers(1 << 30))
    with_ticket = _adam_run(np.random.default_rng(seed), np.float32, np.float32, {}, steps=3)
    monkeypatch.setattr(optim_kernels, "device_counters", lambda name, size: None)
    without = _adam_run(np.random.default_rng(seed), np.float32, np.float32, {}, steps=3)
    assert float(with_ticket[2][0]) == float(without[2][0]) == 3
    for a, b in zip(with_ticket[0], without[0]):
        assert cp.array_equal(a, b)


def test_adam_mixed_dtypes_and_device_hyperparameters(rng):
    """hyper (device [lr, beta1, beta2, eps, weight_decay]) replaces the float arguments: lr=1.0 is ignored."""
    shapes = [(100,), (50,)]
    params = [rng.standard_normal(100).astype(np.float32), rng.standard_normal(50)]
    grads = [rng.standard_normal(100).astype(np.float32), rng.standard_normal(50)]
    gp = [g(p) for p in params]
    m, v = [cp.zeros_like(p) for p in gp], [cp.zeros_like(p) for p in gp]
    step = cp.zeros((), cp.float32)
    ops.adam_step(gp, [g(x) for x in grads], m, v, step=step, lr=1.0,
                  beta1=0.5, hyper=cp.asarray([3e-2, 0.9, 0.999, 1e-8, 0.0]))
    assert float(step) == 1   # two launches, both with t = 1; the second's last block stores it
    for p, gr, out, s in zip(params, grads, gp, shapes):
        want = ref.adam(p.astype(np.float64), gr.astype(np.float64), np.zeros(s), np.zeros(s), None, 1, 3e-2, 0.9,
                        0.999, 1e-8, 0, False, False, False)[0]
        assert out.dtype == p.dtype
        assert_close(out, want, ref.tol(p.dtype), name=str(p.dtype))


def test_adam_step_replays_as_a_cuda_graph(rng):
    """One eager step (builds the address tables), one captured step, three replays with fresh gradients: the
    device-side step count must give each replay its own bias correction."""
    shapes = [(300,), (4100,)]
    params = _params(rng, np.float32, shapes)
    gp = [g(p) for p in params]
    grads = [cp.empty_like(p) for p in gp]
    m, v = [cp.zeros_like(p) for p in gp], [cp.zeros_like(p) for p in gp]
    step = cp.zeros(1, cp.float32)
    rs = [[p.astype(np.float64), np.zeros(p.shape), np.zeros(p.shape), None] for p in params]
    # a non-blocking stream does not wait for the null stream: the zeros above must have landed first
    cp.cuda.Device().synchronize()
    stream = cp.cuda.Stream(non_blocking=True)
    graph = None
    with stream:
        for t in range(1, 5):
            new = _params(rng, np.float32, shapes)
            for dst, src in zip(grads, new):
                dst.set(src, stream=stream)
            if t == 1:
                ops.adam_step(gp, grads, m, v, step=step, lr=1e-2)
            else:
                if graph is None:
                    stream.begin_capture()
                    ops.adam_step(gp, grads, m, v, step=step, lr=1e-2)
                    graph = stream.end_capture()
                graph.launch(stream)
            for r, gr in zip(rs, new):
                r[:] = ref.adam(r[0], gr.astype(np.float64), *r[1:], t, 1e-2, 0.9, 0.999, 1e-8, 0, False, False,
                                False)
    stream.synchronize()
    assert float(step[0]) == 4
    for i, r in enumerate(rs):
        assert_close(gp[i], r[0], 1e-5, name=f"param {i}")


def test_optimizer_errors():
    p = cp.ones(5, cp.float32)
    with pytest.raises(RuntimeError, match="shape"):
        ops.sgd_step([p], [cp.ones(4, cp.float32)], lr=0.1)
    with pytest.raises(RuntimeError, match="C-contiguous"):
        ops.sgd_step([cp.ones((4, 4), cp.float32).T], [cp.ones((4, 4), cp.float32)], lr=0.1)
    with pytest.raises(ValueError, match="Nesterov"):
        ops.sgd_step([p], [p], lr=0.1, nesterov=True)
    with pytest.raises(RuntimeError, match="max_exp_avg_sqs"):
        ops.adam_step([p], [p], [p], [p], step=cp.zeros(1, cp.float32), lr=0.1, amsgrad=True)
    with pytest.raises(TypeError, match="cupy.ndarray"):
        ops.sgd_step([p], [np.ones(5, np.float32)], lr=0.1)
    with pytest.raises(RuntimeError, match="step"):
        ops.adam_step([p], [p], [p], [p], step=cp.zeros(1, cp.int64), lr=0.1)

"""The fused multi-tensor SGD and Adam steps (backend/cuda/optim.py) against NumPy float64 transcriptions of
torch's algorithms, including an Adam step captured once as a CUDA graph and replayed."""
import cuda_reference as ref
import numpy as np
import pytest

import smalltrain
from smalltrain.backend.cuda import cupy, ops
from smalltrain.testing import assert_close

GPU = smalltrain.cuda.is_available()
cp = cupy() if GPU else None
gpu = pytest.mark.skipif(not GPU, reason="no CUDA device")
DTYPES = [np.float32, np.float64]


def g(a):
    return cp.asarray(a)


SHAPES = [(5000,), (3, 7), (1,), (4097,), (64, 65)]  # several cross the 4096-element chunk boundary


SGD_CASES = [{"momentum": 0.0}, {"momentum": 0.9, "dampening": 0.1},
             {"momentum": 0.9, "nesterov": True, "weight_decay": 0.01},
             {"momentum": 0.5, "maximize": True, "weight_decay": 0.1}]


def _params(rng, dtype, shapes=SHAPES):
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


@gpu
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


@gpu
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


@gpu
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


@gpu
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


@gpu
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


@gpu
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

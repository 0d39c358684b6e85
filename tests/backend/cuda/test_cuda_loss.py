"""CUDA softmax, log-softmax and cross-entropy (backend/cuda/loss.py) against float64 references and torch."""
import cuda_reference as ref
import numpy as np
import pytest

import smalltrain
from smalltrain.backend.cuda import cupy, device_checks, ops
from smalltrain.backend.cuda.loss import LOSS
from smalltrain.backend.cuda.tuning import override
from smalltrain.testing import assert_close

GPU = smalltrain.cuda.is_available()
cp = cupy() if GPU else None
gpu = pytest.mark.skipif(not GPU, reason="no CUDA device")
DTYPES = [np.float32, np.float64]


def g(a):
    return cp.asarray(a)


SOFTMAX_CASES = [((7, 33), -1, 1.0), ((3, 5, 4), 1, 1.0), ((2, 3, 70), 0, 1.0), ((1000, 10), 1, 30.0),
                 ((40,), 0, 1.0), ((2, 1, 3), 1, 1.0)]


@gpu
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


@gpu
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


@gpu
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


@gpu
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


@gpu
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_cross_entropy_bad_target_flag_is_cleared_after_the_error(reduction):
    """The forward kernel flags a bad target, read at the next check (device_checks.raise_pending), which raises
    and clears the flag; the next call with good targets (ignored ones included, which must not set it) returns
    values and the check after it passes, for every reduction."""
    x = cp.asarray(np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32))
    for bad in ([0, 5, 1, 2], [-1, 0, 1, 2], [0, 1, 2, 7]):
        ops.cross_entropy_forward(x, cp.asarray(np.array(bad)), reduction=reduction)   # queued, not raised
        with pytest.raises(IndexError, match=f"cross_entropy: Target {[v for v in bad if not 0 <= v < 5][0]} is "
                                             r"out of bounds \(classes 0..4, ignore_index=-100\)"):
            device_checks.raise_pending()
        loss, _ = ops.cross_entropy_forward(x, cp.asarray(np.array([0, -100, 4, 2])), reduction=reduction)
        device_checks.raise_pending()
        assert np.isfinite(loss.get()).all()


# one block; partly and fully used; many blocks (125); more blocks (1125) than the last block has threads, which then
# add several blocks' sums each (9000 rows: 70,000 took ~29 s a case under the emulator's AddressSanitizer in CI)
@gpu
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


@gpu
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("shape,weighted,smoothing", [((64, 10), False, 0.0), ((7, 5, 3), True, 0.1),
                                                      ((3, 4), True, 0.0), ((512, 10), True, 0.0)])
def test_cross_entropy_writes_the_unit_gradient_for_small_inputs(shape, weighted, smoothing, reduction, rng):
    """Up to LOSS.ce_unit_max elements the forward's last block also writes backward's dx for a loss gradient of 1:
    bit-equal to cross_entropy_backward with ones (ignored rows exactly 0); larger inputs and 'none' write none."""
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
    with override(LOSS, ce_unit_max=x.size - 1):
        assert ops.cross_entropy_forward(g(x), g(t), w, reduction=reduction)[1].unit is None


@gpu
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


@gpu
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


@gpu
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
        device_checks.raise_pending()   # (a bad target: found on the GPU, raised at the check)

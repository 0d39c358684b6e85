"""The backward engine against torch: seeding, deep chains without recursion, accumulation across calls, diamonds,
unbroadcasting, graph freeing and retain_graph, tensor hooks, post-accumulate hooks, inputs=, autograd.grad."""
import gc
import weakref

import numpy as np
import pytest
import torch

import smalltrain as st
from smalltrain.autograd import Function
from smalltrain.autograd.engine import Prepared
from smalltrain.testing import assert_close, golden


def pair(values, device="cpu"):
    a = np.asarray(values, np.float32)
    return st.tensor(a, device=device, requires_grad=True), torch.tensor(a, requires_grad=True)


def test_backward_seeds(device):
    xs, xt = pair([1.0, -2.0, 3.0], device)
    (xs * xs).sum().backward()
    (xt * xt).sum().backward()
    assert_close(xs.grad, xt.grad)
    ys, yt = pair([0.5, 2.0], device)
    g = np.array([1.5, -1.0], np.float32)
    (ys.exp() * 2).backward(st.tensor(g, device=device))
    (yt.exp() * 2).backward(torch.tensor(g))
    assert_close(ys.grad, yt.grad)


def test_backward_errors(device):
    x = st.ones(3, device=device, requires_grad=True)
    with pytest.raises(RuntimeError, match="implicitly created only for scalar outputs"):
        (x * 2).backward()
    with pytest.raises(RuntimeError, match=r"gradient has shape \[2\], expected .* \[3\]"):
        (x * 2).backward(st.ones(2, device=device))
    with pytest.raises(RuntimeError, match="does not require grad"):
        st.ones(3, device=device).sum().backward()


def test_deep_chain_has_no_recursion_limit(device):
    x = st.tensor([0.5], device=device, requires_grad=True)
    y = x
    for _ in range(10000):
        y = y * 1.0001
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(force=True), [1.0001 ** 10000], rtol=1e-3)


def test_gradients_accumulate_across_calls(device):
    xs, xt = pair([1.0, 2.0], device)
    for _ in range(3):
        (xs ** 2).sum().backward()
        (xt ** 2).sum().backward()
    assert_close(xs.grad, xt.grad)
    assert xs.grad.tolist() == [6.0, 12.0]


def test_diamonds_and_reuse(device, rng):
    def fn(x):
        y = x * 2
        a, b = y * 3, y.exp()
        z = y + y + y * y      # one node used three times
        return (a + b + z).sum() + (y.tanh() * a).mean()
    golden(fn, fn, rng.uniform(-1, 1, (3, 4)).astype(np.float32), device=device)


@pytest.mark.parametrize("shapes", [((3, 1), (4,)), ((1, 4), (3, 1)), ((), (2, 3)), ((2, 1, 3), (4, 1))], ids=str)
def test_gradients_reduce_to_input_shapes(shapes, device, rng):
    a, b = (rng.uniform(-1, 1, s).astype(np.float32) for s in shapes)
    errors = golden(lambda x, y: x * y + x / (y.abs() + 1), lambda x, y: x * y + x / (y.abs() + 1), a, b,
                    device=device)
    assert set(errors) == {"out0", "grad0", "grad1"}


def test_mixed_dtype_gradients_come_back_in_each_inputs_dtype(device):
    a = st.ones(3, device=device, requires_grad=True)
    b = st.ones(3, dtype=st.float64, device=device, requires_grad=True)
    (a * b).sum().backward()
    assert a.grad.dtype == st.float32 and b.grad.dtype == st.float64


def test_graph_freed_after_backward(device):
    x = st.tensor([1.0, 2.0], device=device, requires_grad=True)
    y = (x * x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.backward()
    xt = torch.tensor([1.0, 2.0], requires_grad=True)
    yt = (xt * xt).sum()
    yt.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        yt.backward()


def test_graph_of_ops_without_saved_tensors_can_run_twice_like_torch(device):
    xs, xt = pair([1.0, 2.0], device)
    ys, yt = (xs + 1).sum(), (xt + 1).sum()
    for _ in range(2):
        ys.backward()
        yt.backward()
    assert_close(xs.grad, xt.grad)


def test_retain_graph(device):
    xs, xt = pair([1.0, 2.0, 3.0], device)
    ys, yt = (xs.exp() * xs).sum(), (xt.exp() * xt).sum()
    ys.backward(retain_graph=True)
    ys.backward()
    yt.backward(retain_graph=True)
    yt.backward()
    assert_close(xs.grad, xt.grad)


def test_backward_frees_intermediate_memory(device):
    x = st.ones(1000, device=device, requires_grad=True)
    y = x * 2
    held = weakref.ref(y.array) if isinstance(y.array, np.ndarray) else None
    z = (y * y).sum()
    del y
    z.backward()
    gc.collect()
    if held is not None:
        assert held() is None    # neither the graph nor the freed node keeps the intermediate array
    assert z.grad_fn is not None and x.grad.tolist()[:2] == [8.0, 8.0]


def test_hooks_against_torch(device):
    logs = {"st": [], "torch": []}

    def run(L, x, key):
        h1 = x.register_hook(lambda g: g * 2)              # leaf: replacement gradient
        y = x * 3
        y.register_hook(lambda g: logs[key].append(g.tolist()))
        h2 = y.register_hook(lambda g: g + 1)              # non-leaf: replacement gradient
        (y * y).sum().backward(retain_graph=True)
        h1.remove()
        h2.remove()
        (y * y).sum().backward()
        return x.grad
    gs, gt = pair([1.0, -1.0], device)
    assert_close(run(st, gs, "st"), run(torch, gt, "torch"))
    assert logs["st"] == logs["torch"]


def test_post_accumulate_grad_hook(device):
    x = st.ones(2, device=device, requires_grad=True)
    seen = []
    handle = x.register_post_accumulate_grad_hook(lambda t: seen.append(t.grad.tolist()))
    (x * 3).sum().backward()
    (x * 3).sum().backward()
    handle.remove()
    (x * 3).sum().backward()
    assert seen == [[3.0, 3.0], [6.0, 6.0]] and x.grad.tolist() == [9.0, 9.0]
    with pytest.raises(RuntimeError, match="non-leaf"):
        (x * 2).register_post_accumulate_grad_hook(print)


def test_retain_grad_and_inputs(device):
    xs, xt = pair([1.0, 2.0], device)
    ws, wt = pair([3.0, -1.0], device)
    hs, ht = xs * ws, xt * wt
    hs.retain_grad()
    ht.retain_grad()
    (hs ** 2).sum().backward(inputs=[ws])
    (ht ** 2).sum().backward(inputs=[wt])
    assert xs.grad is None and xt.grad is None
    assert_close(ws.grad, wt.grad)


def test_autograd_grad_and_backward(device):
    x = st.tensor([1.0, 2.0], device=device, requires_grad=True)
    (gx,) = st.autograd.grad((x ** 3).sum(), x)
    assert gx.tolist() == [3.0, 12.0] and x.grad is None
    a, b = x * 2, x * x
    st.autograd.backward([a.sum(), b.sum()])
    assert x.grad.tolist() == [4.0, 6.0]


def test_no_grad_results_have_no_graph(device):
    x = st.ones(2, device=device, requires_grad=True)
    with st.no_grad():
        y = x * 2
    assert y.grad_fn is None and not y.requires_grad
    assert not x.argmax().requires_grad and not (x > 0).requires_grad


def test_queue_callback_runs_after_backward(device):
    from smalltrain.autograd import engine
    x = st.ones(2, device=device, requires_grad=True)
    order = []
    x.register_post_accumulate_grad_hook(lambda t: order.append("hook"))
    engine.queue_callback(lambda: order.append("callback"))
    (x * 2).sum().backward()
    assert order == ["hook", "callback"]


def test_leaf_gradients_never_alias_each_other_or_the_seed():
    """A leaf may take a fresh backward array as its .grad (no copy), but never one another leaf or the
    caller holds: a + b hands the same array to both leaves, and the seed gradient belongs to the caller."""
    a = st.tensor([1.0, 2.0], requires_grad=True)
    b = st.tensor([3.0, 4.0], requires_grad=True)
    seed = st.tensor([1.0, 1.0])
    (a + b).backward(seed)
    a.grad.array[0] = 100.0
    assert b.grad.tolist() == [1.0, 1.0] and seed.tolist() == [1.0, 1.0]
    w = st.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    x = st.tensor([[1.0, 1.0]], requires_grad=True)
    (x @ w).sum().backward()
    assert w.grad.tolist() == [[1.0, 1.0], [1.0, 1.0]] and x.grad.tolist() == [[3.0, 7.0]]
    (x @ w).sum().backward()   # accumulation into a taken array works like into a copied one
    assert w.grad.tolist() == [[2.0, 2.0], [2.0, 2.0]]


class _Square(Function):
    """x^2 summed, with backward_unit: counts which of its two backward paths the engine took."""
    calls = []

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return (x.array * x.array).sum()

    @staticmethod
    def backward(ctx, dout):
        _Square.calls.append("backward")
        (x,) = ctx.saved_tensors
        return 2 * x.array * dout.array

    @staticmethod
    def backward_unit(ctx):
        _Square.calls.append("unit")
        if getattr(ctx, "decline", False):
            return NotImplemented
        (x,) = ctx.saved_tensors
        return 2 * x.array


def _square(device, decline=False):
    x = st.tensor(np.array([1.0, -2.0, 3.0], np.float32), device=device, requires_grad=True)
    _Square.calls.clear()
    y = _Square.apply(x)
    y.grad_fn.decline = decline
    return x, y


def test_backward_without_a_gradient_asks_the_loss_op_for_its_unit_gradient(device):
    """loss.backward() makes no ones where the root's function has backward_unit; an explicit gradient, a hook on
    the root, and NotImplemented from backward_unit all take backward with the ones materialized."""
    want = np.array([2.0, -4.0, 6.0], np.float32)
    x, y = _square(device)
    y.backward()
    assert _Square.calls == ["unit"] and np.array_equal(x.grad.cpu().numpy(), want)
    x, y = _square(device)
    y.backward(st.tensor(np.float32(1.0), device=device))
    assert _Square.calls == ["backward"] and np.array_equal(x.grad.cpu().numpy(), want)
    x, y = _square(device, decline=True)
    y.backward()
    assert _Square.calls == ["unit", "backward"] and np.array_equal(x.grad.cpu().numpy(), want)
    x, y = _square(device)
    seen = []
    y.register_hook(lambda g: seen.append(g.cpu().numpy().tolist()))
    y.backward()
    assert seen == [1.0] and _Square.calls == ["backward"] and np.array_equal(x.grad.cpu().numpy(), want)
    x, y = _square(device)
    y.backward(retain_graph=True)
    y.backward()
    assert _Square.calls == ["unit", "unit"] and np.array_equal(x.grad.cpu().numpy(), 2 * want)


def test_unit_seed_is_materialized_for_leaves_several_roots_and_functions_without_it(device):
    leaf = st.tensor(np.float32(2.0), device=device, requires_grad=True)
    leaf.backward()
    assert float(leaf.grad.cpu().numpy()) == 1.0
    x = st.tensor(np.array([1.0, 2.0], np.float32), device=device, requires_grad=True)
    (x * 3).sum().backward()   # Sum has no backward_unit: ones as before
    assert np.array_equal(x.grad.cpu().numpy(), [3.0, 3.0])
    v, _ = st.max(x * x, dim=0)   # a root made by a two-output function
    v.backward()
    assert np.array_equal(x.grad.cpu().numpy(), [3.0, 7.0])


class _Cube(Function):
    """x ** 3, taking its input gradient ready-made (kind "dx") from a consumer that is offered it."""

    @staticmethod
    def forward(ctx, x):
        ctx.x = x.array
        return x.array ** 3

    @staticmethod
    def prepared_kind(ctx):
        return "dx"

    @staticmethod
    def backward(ctx, dout):
        if isinstance(dout, Prepared):
            return dout.value
        return dout.array * 3 * ctx.x ** 2


class _Scale(Function):
    """3 * y, handing y's producer (a _Cube) its input gradient directly where the engine offers it."""
    makes_prepared = True

    offers = []   # what the engine offered, per backward (the test reads it)
    keeps = False  # whether forward saves an array (then the engine frees the node right after its backward)

    @staticmethod
    def forward(ctx, y):
        if _Scale.keeps:
            ctx.kept = (y.array,)
        return y.array * 3

    @staticmethod
    def backward(ctx, dout):
        kind = ctx.prepared_for[0]
        _Scale.offers.append(kind)
        if kind == "dx":
            cube = ctx.inputs[0]._ctx
            return Prepared("dx", dout.array * 3 * (3 * cube.x ** 2))
        return dout.array * 3


@pytest.mark.parametrize("keeps", [False, True])
def test_prepared_gradient_goes_to_the_producer_only_where_the_engine_offers_it(device, keeps, monkeypatch):
    """A consumer hands its input's producer a gradient in the producer's own form (engine.Prepared) only where
    the tensor has no other consumer and no hook: the same gradients as the plain path either way. Also where the
    consumer saved arrays, so that the engine frees it (clearing what it offered) right after its backward."""
    monkeypatch.setattr(_Scale, "keeps", keeps)
    x0 = np.array([0.5, -1.5, 2.0], np.float32)

    def run(extra):
        _Scale.offers = []
        x = st.tensor(x0, device=device, requires_grad=True)
        y = _Cube.apply(x)
        out = _Scale.apply(y).sum()
        if extra == "second consumer":
            out = out + y.sum()
        if extra == "hook":
            y.register_hook(lambda g: g)
        if extra == "retain_grad":
            y.retain_grad()
        out.backward()
        return x.grad.cpu().numpy(), _Scale.offers
    want = 9 * x0 ** 2
    grad, offers = run(None)
    assert offers == ["dx"] and np.allclose(grad, want)
    grad, offers = run("second consumer")
    assert offers == [None] and np.allclose(grad, want + 3 * x0 ** 2)
    for extra in ("hook", "retain_grad"):
        grad, offers = run(extra)
        assert offers == [None] and np.allclose(grad, want), extra


def test_a_prepared_gradient_nobody_offered_is_an_error(device):
    class Rogue(Function):
        @staticmethod
        def forward(ctx, y):
            return y.array * 2

        @staticmethod
        def backward(ctx, dout):
            return Prepared("dx", dout.array)
    x = st.tensor(np.ones(2, np.float32), device=device, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"Prepared\('dx'\).*offered None"):
        Rogue.apply(_Cube.apply(x)).sum().backward()


class _Defers(Function):
    """x * w whose backward makes w's gradient "beside the pass" where the engine allows it (engine.takes_plainly):
    it returns an array of NaN at once and queues the join that fills in the values (engine.defer_join), as
    backend/cuda/_common.run_beside(defer=True) leaves a side stream's work for the pass to join."""
    asked = []   # takes_plainly's answers, per backward (the test reads them)

    @staticmethod
    def forward(ctx, x, w):
        ctx.x, ctx.w = x.array, w.array
        return x.array * w.array

    @staticmethod
    def backward(ctx, dout):
        from smalltrain.autograd import engine
        plain = engine.takes_plainly(ctx, (1,))
        _Defers.asked.append(plain)
        dw = (dout.array * ctx.x).sum(keepdims=True).reshape(ctx.w.shape)
        if not plain:
            return dout.array * ctx.w, dw
        pending = np.full_like(dw, np.nan)
        engine.defer_join(lambda: pending.__setitem__(..., dw))
        return dout.array * ctx.w, pending


@pytest.mark.parametrize("case", ["plain", "hook", "post hook", "accumulated", "shared", "callback"])
def test_gradients_made_beside_the_pass_are_joined_before_anything_reads_them(case):
    """A gradient an op makes beside the pass (takes_plainly, defer_join) is complete wherever it is read: after
    backward, in a tensor hook or a post-accumulate hook on the leaf, when added to an existing .grad, when the
    leaf is used twice, and in a queued callback. Where the weight is no leaf the op is told not to defer."""
    from smalltrain.autograd import engine
    _Defers.asked = []
    x = st.tensor(np.array([1.0, 2.0, 3.0], np.float32), requires_grad=True)
    w = st.tensor(np.array([2.0], np.float32), requires_grad=True)
    seen = []
    if case == "hook":
        w.register_hook(lambda g: seen.append(g.numpy().copy()))
    if case == "post hook":
        w.register_post_accumulate_grad_hook(lambda t: seen.append(t.grad.numpy().copy()))
    if case == "accumulated":
        w.grad = st.tensor(np.array([10.0], np.float32))
    out = _Defers.apply(x, w).sum()
    if case == "shared":
        out = out + _Defers.apply(x, w).sum()
    if case == "callback":
        engine.queue_callback(lambda: seen.append(w.grad.numpy().copy()))
    out.backward()
    want = {"accumulated": 16.0, "shared": 12.0}.get(case, 6.0)
    assert w.grad.numpy().tolist() == [want]
    assert _Defers.asked == [True] * (2 if case == "shared" else 1)
    assert [s.tolist() for s in seen] == ([[6.0]] if case in ("hook", "post hook", "callback") else [])
    assert not engine._joins and not engine._pass_only
    _Defers.asked = []
    (_Defers.apply(x, w * 1)).sum().backward()   # w * 1: not a leaf
    assert _Defers.asked == [False]
    assert not engine.takes_plainly(out.grad_fn, (1,))   # no pass in progress


def test_joins_run_when_a_backward_fails(monkeypatch):
    """A node's backward raising still runs the joins queued before it (the pass's finally)."""
    from smalltrain.autograd import engine

    class Fails(Function):
        @staticmethod
        def forward(ctx, y):
            return y.array * 1

        @staticmethod
        def backward(ctx, dout):
            raise ValueError("boom")

    x = st.tensor(np.array([1.0], np.float32), requires_grad=True)
    w = st.tensor(np.array([2.0], np.float32), requires_grad=True)
    joined = []
    real = engine.defer_join
    monkeypatch.setattr(engine, "defer_join", lambda join: real(lambda: (join(), joined.append(True))))
    out = _Defers.apply(Fails.apply(x), w).sum()   # _Defers's backward first, then Fails's
    with pytest.raises(ValueError, match="boom"):
        out.backward()
    assert joined == [True] and w.grad.numpy().tolist() == [1.0]
    assert not engine._joins and not engine._pass_only

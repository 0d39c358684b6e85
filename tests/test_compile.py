"""smalltrain.compile: eager on CPU; on CUDA a captured graph equal to the eager step, recapture and fallback."""
import warnings

import numpy as np
import pytest

import smalltrain
from smalltrain import models
from smalltrain.nn import functional as F

cuda = pytest.mark.skipif(not smalltrain.cuda.is_available(), reason="no CUDA device")


def _setup(device, opt_name="sgd", set_to_none=True, flat=False):
    smalltrain.manual_seed(0)
    model = models.LeNet5().to(device)
    if flat:
        smalltrain.nn.utils.flatten_parameters(model.parameters())
    opt = smalltrain.optim.SGD(model.parameters(), lr=0.05, momentum=0.9) if opt_name == "sgd" else \
        smalltrain.optim.Adam(model.parameters(), lr=1e-3)

    def step(x, y):
        opt.zero_grad(set_to_none=set_to_none)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return model, step


def _batches(n, batch, device):
    rng = np.random.default_rng(0)
    xs = [smalltrain.tensor(rng.standard_normal((batch, 1, 28, 28)).astype(np.float32), device=device)
          for _ in range(n)]
    ys = [smalltrain.tensor(rng.integers(0, 10, batch), device=device) for _ in range(n)]
    return xs, ys


def test_cpu_runs_the_step_eagerly():
    model, step = _setup("cpu")
    compiled = smalltrain.compile(step)
    ref_model, ref_step = _setup("cpu")
    xs, ys = _batches(3, 8, "cpu")
    for x, y in zip(xs, ys):
        a, b = compiled(x, y), ref_step(x, y)
        assert a.item() == b.item()
    assert compiled.stats == {"captures": 0, "replays": 0, "eager": 3}
    for p, q in zip(model.parameters(), ref_model.parameters()):
        assert np.array_equal(p.detach().numpy(), q.detach().numpy())


def test_decorator_form_keeps_the_name():
    @smalltrain.compile
    def train_step(x):
        return x * 2
    assert train_step.__name__ == "train_step"
    assert train_step(smalltrain.tensor([1.0])).item() == 2.0


@cuda
@pytest.mark.parametrize("set_to_none", [True, False], ids=["grads_to_none", "grads_zeroed"])
@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_captured_step_equals_eager_after_100_steps(opt_name, set_to_none, record_kernels):
    """With zero_grad() the captured gradients live in the graph's pool (new arrays on each eager step); with
    set_to_none=False they are zeroed in place: both replay exactly the eager step. The captured step runs the
    cross-entropy in the chain's forward kernel (autograd/held.py), the eager one as a kernel of its own."""
    from smalltrain.backend.cuda import linear_chain as cuda_chain
    eager_model, eager_step = _setup("cuda", opt_name, set_to_none)
    graph_model, graph_step = _setup("cuda", opt_name, set_to_none)
    compiled = smalltrain.compile(graph_step)
    xs, ys = _batches(10, 64, "cuda")
    names = record_kernels(cuda_chain, "get")
    for i in range(100):
        eager_step(xs[i % 10], ys[i % 10])
        loss = compiled(xs[i % 10], ys[i % 10])
    assert compiled.stats["captures"] == 1 and compiled.stats["replays"] == 100 - compiled.warmup
    heads = [n for n in names if n.startswith("chain_fwd")]
    assert heads.count("chain_fwd_ce_r1") == 1 and len(heads) == 100 + compiled.warmup + 1   # eager, capture
    worst = max(float(abs(p.detach().cpu().numpy() - q.detach().cpu().numpy()).max())
                for p, q in zip(eager_model.parameters(), graph_model.parameters()))
    print(f"\n{opt_name}: max |captured - eager| after 100 steps = {worst:.2e}, last loss {loss.item():.4f}")
    assert worst <= 1e-6


@cuda
@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_captured_step_over_flat_parameters_equals_eager(opt_name):
    """nn.utils.flatten_parameters: the captured step writes the gradients into the flat buffer and updates it as
    one array, and after 30 steps equals the eager step of the plain model."""
    from smalltrain.autograd import engine
    eager_model, eager_step = _setup("cuda", opt_name)
    graph_model, graph_step = _setup("cuda", opt_name, flat=True)
    flat = smalltrain.nn.utils.flat_parameters.owner(next(graph_model.parameters()))
    compiled = smalltrain.compile(graph_step)
    xs, ys = _batches(5, 64, "cuda")
    copies = engine.grad_slot_copies[0]
    for i in range(30):
        eager_step(xs[i % 5], ys[i % 5])
        compiled(xs[i % 5], ys[i % 5])
    assert compiled.stats["captures"] == 1 and compiled.stats["replays"] == 30 - compiled.warmup
    assert flat.grads_in_place() and engine.grad_slot_copies[0] == copies
    worst = max(float(abs(p.detach().cpu().numpy() - q.detach().cpu().numpy()).max())
                for p, q in zip(eager_model.parameters(), graph_model.parameters()))
    assert worst <= 1e-6


@cuda
def test_a_captured_step_on_the_driver_keeps_node_priorities_and_launches_programmatically(monkeypatch,
                                                                                         record_kernels):
    """On a real driver the captured step is instantiated with its nodes' stream priorities (the side streams'
    kernels below the main stream's) and, from compute capability 9.0 on, its kernels are launched with
    programmatic stream serialization, each waiting for its predecessors first (ST_GRID_WAIT): only when blocks start
    changes, so after 30 Adam steps the parameters equal those of the eager step."""
    from smalltrain.backend.cuda import _common, cupy, graphs
    import cuda_emulator
    if cuda_emulator.installed():
        pytest.skip("the emulator has no driver to launch kernels or instantiate graphs with attributes")
    launched = []
    real = graphs.ProgrammaticKernel.__call__
    monkeypatch.setattr(graphs.ProgrammaticKernel, "__call__",
                        lambda self, *a, **k: launched.append(self._kern) or real(self, *a, **k))
    names = record_kernels(_common, "kernel")
    eager_model, eager_step = _setup("cuda", "adam")
    graph_model, graph_step = _setup("cuda", "adam")
    compiled = smalltrain.compile(graph_step)
    xs, ys = _batches(10, 64, "cuda")
    for i in range(30):
        eager_step(xs[i % 10], ys[i % 10])
        compiled(xs[i % 10], ys[i % 10])
    assert compiled.stats["captures"] == 1 and compiled.stats["replays"] == 30 - compiled.warmup
    cuda_graph = next(iter(compiled.entries.values()))[0]
    assert type(cuda_graph.graph).__name__ == "_DriverGraph" and cuda_graph.node_priorities
    programmatic = int(cupy().cuda.Device().compute_capability) >= 90
    assert cuda_graph.programmatic == programmatic
    if programmatic:
        assert len(launched) >= 8 and any(n.startswith("adam_step") for n in names), (len(launched), names)
    worst = max(float(abs(p.detach().cpu().numpy() - q.detach().cpu().numpy()).max())
                for p, q in zip(eager_model.parameters(), graph_model.parameters()))
    assert worst <= 1e-6


@cuda
def test_after_capture_hooks_run_once_when_the_capture_ends_and_not_after_a_failed_one():
    from smalltrain.backend.cuda import graphs
    ran = []
    assert graphs.after_capture(ran.append) is False and ran == []   # outside a capture
    x = smalltrain.tensor(np.arange(4, dtype=np.float32), device="cuda")
    g = smalltrain.cuda.CUDAGraph()
    with smalltrain.cuda.graph(g):
        y = x * 2
        assert graphs.after_capture(ran.append) is True
        assert ran == []
    assert ran == [g.stream] and g.capture_end_hooks == []
    g.replay()
    np.testing.assert_array_equal(y.cpu().numpy(), [0, 2, 4, 6])
    with pytest.raises(ValueError, match="inside the capture"):
        with smalltrain.cuda.graph(smalltrain.cuda.CUDAGraph()):
            graphs.after_capture(lambda stream: ran.append("failed"))
            raise ValueError("inside the capture")
    assert ran == [g.stream]


@cuda
def test_a_graph_constant_keeps_its_value_where_the_capture_reuses_memory():
    """graphs.constant's array is written once, when the capture ends, and lives outside the graph's pool: a
    temporary freed earlier in the capture (whose block the pool would hand out next) is written by every replay
    and must not land on it."""
    from smalltrain.backend.cuda import graphs
    assert graphs.constant(np.zeros(4)) is None   # outside a capture
    x = smalltrain.tensor(np.ones(4), device="cuda")
    g = smalltrain.cuda.CUDAGraph()
    with smalltrain.cuda.graph(g):
        t = x * 3   # a temporary of the constant's size, freed before it is made
        del t
        c = graphs.constant(np.arange(4.0))
        y = smalltrain.Tensor._wrap(c) + x
    for _ in range(2):
        g.replay()
        np.testing.assert_array_equal(y.cpu().numpy(), [1, 2, 3, 4])


@cuda
def test_new_shapes_capture_a_second_graph_with_a_warning():
    _, step = _setup("cuda")
    compiled = smalltrain.compile(step)
    xs, ys = _batches(4, 64, "cuda")
    for i in range(5):
        compiled(xs[i % 4], ys[i % 4])
    small_x, small_y = xs[0][:16], ys[0][:16]
    with pytest.warns(UserWarning, match="new input shapes"):
        for _ in range(5):
            compiled(small_x, small_y)
    assert compiled.stats["captures"] == 2


def _input_nodes(compiled):
    return next(iter(compiled.entries.values()))[4]


@cuda
def test_replays_read_new_arguments_contiguous_or_not():
    """Each replay copies its arguments into the static buffers (the contiguous ones by a node at the graph's head
    whose sources the call sets; an elementwise copy for views): the losses equal the eager step's on the same
    batches."""
    model, step = _setup("cuda")
    ref_model, ref_step = _setup("cuda")
    compiled = smalltrain.compile(step)
    xs, ys = _batches(4, 64, "cuda")
    wide = smalltrain.tensor(np.zeros((64, 1, 28, 56), np.float32), device="cuda")
    for i in range(8):
        x = xs[i % 4]
        if i % 2:   # the same values through a strided view
            wide.array[..., ::2] = x.array
            x = smalltrain.Tensor._wrap(wide.array[..., ::2])
            assert not x.array.flags.c_contiguous
        got, want = compiled(x, ys[i % 4]), ref_step(xs[i % 4], ys[i % 4])
        np.testing.assert_allclose(float(got.item()), float(want.item()), rtol=1e-5)
    assert compiled.stats["replays"] >= 4
    assert len(_input_nodes(compiled)) == 1


@cuda
def test_replays_copy_more_arguments_than_a_node_takes_and_keywords_in_any_order():
    """Five tensor arguments, two of them keywords given in either order: each replay returns its own arguments'
    weighted sums (integer values: exact in float32); with the copies in the graph, in two nodes of up to four."""
    rng = np.random.default_rng(0)

    def batch():
        return [smalltrain.tensor(rng.integers(0, 4, 16).astype(np.float32), device="cuda") for _ in range(5)]

    def step(a, b, c, *, d, e):
        return a.sum() + 10 * b.sum() + 100 * c.sum() + 1000 * d.sum() + 10000 * e.sum()
    compiled = smalltrain.compile(step)
    for i in range(8):
        a, b, c, d, e = t = batch()
        got = compiled(a, b, c, e=e, d=d) if i % 2 else compiled(a, b, c, d=d, e=e)
        assert float(got.item()) == sum(10 ** k * float(v.sum().item()) for k, v in enumerate(t))
    assert compiled.stats["replays"] == 8 - compiled.warmup
    assert len(_input_nodes(compiled)) == 2


@cuda
def test_replays_queued_without_a_sync_each_read_their_own_argument():
    """30 calls without a host sync, each output cloned as it comes: each call's argument copy (a node of its own
    replay, whose source the call set) comes after the replay before it, which reads its
    own argument again at its end, after enough work that the host runs far ahead. Each output equals the sum of its
    own call's argument (integer values: exact in float32)."""
    rng = np.random.default_rng(0)
    xs = [smalltrain.tensor(rng.integers(0, 4, (64, 256)).astype(np.float32), device="cuda") for _ in range(4)]

    def step(x):
        with smalltrain.no_grad():
            h = x
            for _ in range(40):   # ~80 launches of work: the host queues calls faster than the GPU replays them
                h = (h * 0.5).tanh()
            return x.sum() + 0 * h.sum()   # x read again after them
    compiled = smalltrain.compile(step)
    outs = [compiled(xs[i % 4]).clone() for i in range(30)]
    assert compiled.stats["replays"] == 30 - compiled.warmup
    got = [float(o.item()) for o in outs]
    assert got == [float(xs[i % 4].sum().item()) for i in range(30)] and len(set(got)) == 4


@cuda
def test_a_host_sync_falls_back_to_eager_with_a_warning():
    model, step = _setup("cuda")

    def syncing_step(x, y):
        loss = step(x, y)
        return loss.item()   # a host sync: cannot be captured
    compiled = smalltrain.compile(syncing_step)
    xs, ys = _batches(2, 64, "cuda")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        values = [compiled(xs[i % 2], ys[i % 2]) for i in range(6)]
    assert any("cannot capture" in str(w.message) for w in caught)
    assert compiled.stats["captures"] == 0 and all(isinstance(v, float) for v in values)


@cuda
@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_a_scheduler_changes_the_captured_learning_rate(opt_name):
    """The learning rate lives on the device and a replay hook refreshes it, so a scheduler stepped between
    replays acts on the graph exactly as on the eager step; Adam's host step counters follow the replays."""
    runs = []
    for compiled_run in (False, True):
        smalltrain.manual_seed(0)
        model = models.LeNet5().to("cuda")
        opt = smalltrain.optim.SGD(model.parameters(), lr=0.05, momentum=0.9) if opt_name == "sgd" else \
            smalltrain.optim.Adam(model.parameters(), lr=1e-3)
        sched = smalltrain.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05 if opt_name == "sgd" else 3e-3,
                                                         total_steps=30)

        def step(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss
        fn = smalltrain.compile(step) if compiled_run else step
        xs, ys = _batches(5, 64, "cuda")
        for i in range(30):
            fn(xs[i % 5], ys[i % 5])
            sched.step()
        if compiled_run:
            assert fn.stats["replays"] == 30 - fn.warmup
        runs.append((model, opt))
    (m0, o0), (m1, o1) = runs
    worst = max(float(abs(p.detach().cpu().numpy() - q.detach().cpu().numpy()).max())
                for p, q in zip(m0.parameters(), m1.parameters()))
    assert worst <= 1e-6, worst
    if opt_name == "adam":
        steps = {float(s["step"]) for s in o1.state_dict()["state"].values()}
        assert steps == {30.0}

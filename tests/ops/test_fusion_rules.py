"""ops/fusion.py: on CUDA a model written the ordinary way (modules or F.* calls) runs conv2d + activation (+ max
pooling), linear + activation (+ more linear layers) and log_softmax + nll_loss as the fused ops, with the forward
and every gradient of the unfused computation (torch's), up to float32 rounding; a placeholder read elsewhere keeps
its value and gradient; on the CPU only activation + max pooling join. The CUDA cases run on the emulator where
there is no GPU."""
import numpy as np
import pytest
import torch

import smalltrain as st
from smalltrain.autograd import held

CUDA = pytest.mark.skipif(not st.cuda.is_available(), reason="no CUDA device")
UNFUSED = {"ReluBackward", "GeluBackward", "MaxPool2dBackward", "LogSoftmaxBackward", "NLLLossBackward",
           "ReshapeBackward"}


def _acts(lib, act):
    nn, F = lib.nn, lib.nn.functional
    module = {"relu": nn.ReLU(), "gelu": nn.GELU(), "gelu_tanh": nn.GELU(approximate="tanh")}[act]
    fn = {"relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}[act]
    return module, fn


def _net(lib, act, pool, style, layers=2):
    """conv(3->4, 3x3) -> act (-> max_pool 2) -> flatten -> linear -> act (-> linear), in modules or F.* calls."""
    nn, F = lib.nn, lib.nn.functional

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)
            self.act, self.fn = _acts(lib, act)
            self.pool = nn.MaxPool2d(2)
            self.flatten = nn.Flatten()
            self.fc1 = nn.Linear(4 * 3 * 3 if pool else 4 * 6 * 6, 8 if layers == 2 else 5)
            if layers == 2:
                self.fc2 = nn.Linear(8, 5)

        def forward(self, x):
            if style == "modules":
                x = self.act(self.conv(x))
                x = self.flatten(self.pool(x) if pool else x)
                return self.fc2(self.act(self.fc1(x))) if layers == 2 else self.fc1(x)
            x = self.fn(self.conv(x))
            if pool:
                x = F.max_pool2d(x, 2)
            x = lib.flatten(x, 1)
            return self.fc2(self.fn(self.fc1(x))) if layers == 2 else self.fc1(x)
    return Net()


def _twins(build, rng):
    """(ours on CUDA, torch's) with the same parameters."""
    ref = build(torch)
    ours = build(st)
    for (name, p), (tname, tp) in zip(ours.named_parameters(), ref.named_parameters()):
        assert name == tname
        p.array[...] = tp.detach().numpy()
    return ours.to("cuda"), ref


def _node_names(t):
    names, todo, seen = set(), [t.grad_fn], set()
    while todo:
        n = todo.pop()
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        names.add(n.name())
        todo += [f for f, _ in n.next_functions]
    return names


def _run(ours, ref, xs, ys, loss):
    """Forward and backward both ways; returns our loss tensor after comparing value and all gradients."""
    x = st.tensor(xs, device="cuda", requires_grad=True)
    y = st.tensor(ys, device="cuda")
    tx = torch.tensor(xs, requires_grad=True)
    out = loss(st, ours(x), y)
    tout = loss(torch, ref(tx), torch.tensor(ys))
    out.backward()
    tout.backward()
    np.testing.assert_allclose(out.detach().cpu().numpy(), tout.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(x.grad.cpu().numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-5)
    for (name, p), (_, tp) in zip(ours.named_parameters(), ref.named_parameters()):
        np.testing.assert_allclose(p.grad.cpu().numpy(), tp.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)
    return out


def _nll(lib, out, y):
    F = lib.nn.functional
    return F.nll_loss(F.log_softmax(out, dim=1), y)


def _data(rng, n=2):
    return rng.standard_normal((n, 3, 8, 8)).astype(np.float32), rng.integers(0, 5, n).astype(np.int64)


@CUDA
@pytest.mark.parametrize("style", ["modules", "functional"])
@pytest.mark.parametrize("act", ["relu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("pool", [True, False])
def test_conv_act_pool_linear_act_and_log_softmax_nll_fuse(style, act, pool, rng):
    ours, ref = _twins(lambda lib: _net(lib, act, pool, style), rng)
    out = _run(ours, ref, *_data(rng), _nll)
    names = _node_names(out)
    assert not names & UNFUSED, names
    assert "CrossEntropyBackward" in names
    assert ("Conv2dActPoolBackward" in names) == pool


@CUDA
@pytest.mark.parametrize("style", ["modules", "functional"])
def test_conv_act_flatten_last_linear_is_one_op(style, rng):
    ours, ref = _twins(lambda lib: _net(lib, "relu", False, style, layers=1), rng)
    out = _run(ours, ref, *_data(rng), lambda lib, o, y: lib.nn.functional.cross_entropy(o, y))
    assert "Conv2dActLinearBackward" in _node_names(out)


@CUDA
@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_linear_act_and_a_run_of_linear_layers(act, rng):
    def build(lib):
        nn = lib.nn
        return nn.Sequential(nn.Linear(6, 7), _acts(lib, act)[0], nn.Linear(7, 5), _acts(lib, act)[0],
                             nn.Linear(5, 3))
    ours, ref = _twins(build, rng)
    xs = rng.standard_normal((4, 6)).astype(np.float32)
    x = st.tensor(xs, device="cuda", requires_grad=True)
    tx = torch.tensor(xs, requires_grad=True)
    out, tout = ours(x), ref(tx)
    names = _node_names(out)
    assert not names & UNFUSED and names & {"LinearChainBackward", "LinearActBackward"}, names
    g = rng.standard_normal((4, 3)).astype(np.float32)
    out.backward(st.tensor(g, device="cuda"))
    tout.backward(torch.tensor(g))
    np.testing.assert_allclose(out.detach().cpu().numpy(), tout.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(x.grad.cpu().numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-5)
    for p, tp in zip(ours.parameters(), ref.parameters()):
        np.testing.assert_allclose(p.grad.cpu().numpy(), tp.grad.numpy(), rtol=1e-4, atol=1e-5)


def _residual(lib):
    nn, F = lib.nn, lib.nn.functional

    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 3, 3, padding=1)
            self.fc = nn.Linear(3 * 4 * 4, 5)

        def forward(self, x):
            h = self.conv(x)                      # read again below, after relu and pooling absorbed it
            y = F.max_pool2d(F.relu(h), 2) + F.max_pool2d(h, 2)
            z = self.fc(lib.flatten(y, 1))
            return F.gelu(z) + z                  # the linear layer's output read again after gelu absorbed it
    return Residual()


@CUDA
def test_a_placeholder_read_elsewhere_keeps_its_value_and_gradient(rng):
    ours, ref = _twins(_residual, rng)
    _run(ours, ref, *_data(rng), _nll)


@CUDA
def test_no_grad_and_inputs_without_grad(rng):
    ours, ref = _twins(lambda lib: _net(lib, "gelu", True, "functional"), rng)
    xs, _ = _data(rng)
    with st.no_grad():
        out = ours(st.tensor(xs, device="cuda"))
    assert out.grad_fn is None
    with torch.no_grad():
        np.testing.assert_allclose(out.cpu().numpy(), ref(torch.tensor(xs)).numpy(), rtol=1e-5, atol=1e-5)


@CUDA
def test_a_hooked_layer_takes_the_plain_path(rng):
    ours, ref = _twins(lambda lib: _net(lib, "relu", True, "modules"), rng)
    seen = []
    ours.conv.register_forward_hook(lambda m, args, out: seen.append(type(out).__name__))
    out = _run(ours, ref, *_data(rng), _nll)
    assert seen == ["Tensor"]
    names = _node_names(out)
    assert {"ReluBackward", "MaxPool2dBackward"} <= names and "Conv2dActPoolBackward" not in names


@pytest.mark.parametrize("act", ["relu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("style", ["modules", "functional"])
def test_on_the_cpu_an_activation_before_max_pooling_pools_first(act, style, rng):
    """On the CPU only the activation + max_pool2d pair joins (ActMaxPool2d: the activation runs on the pooled
    values); values and every gradient are torch's."""
    ref = _net(torch, act, True, style)
    ours = _net(st, act, True, style)
    for p, tp in zip(ours.parameters(), ref.parameters()):
        p.array[...] = tp.detach().numpy()
    xs, ys = _data(rng)
    out = _nll(st, ours(st.tensor(xs)), st.tensor(ys))
    theirs = _nll(torch, ref(torch.tensor(xs)), torch.tensor(ys))
    assert not held.pending()
    names = _node_names(out)
    assert "ActMaxPool2dBackward" in names and "MaxPool2dBackward" not in names   # (the linear layer's act stays)
    assert {"LogSoftmaxBackward", "NLLLossBackward"} <= names   # (fused on CUDA only)
    out.backward()
    theirs.backward()
    np.testing.assert_allclose(out.item(), theirs.item(), rtol=1e-5)
    for (name, p), tp in zip(ours.named_parameters(), ref.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=name)


@CUDA
def test_a_captured_step_equals_the_eager_one(rng):
    xs, ys = _data(rng, 4)

    def make():
        ours, _ = _twins(lambda lib: _net(lib, "gelu", True, "functional"), np.random.default_rng(7))
        opt = st.optim.SGD(ours.parameters(), lr=0.1)

        def step(x, y):
            opt.zero_grad()
            loss = _nll(st, ours(x), y)
            loss.backward()
            opt.step()
            return loss
        return step
    torch.manual_seed(0)
    eager = make()
    torch.manual_seed(0)
    compiled = st.compile(make())
    x, y = st.tensor(xs, device="cuda"), st.tensor(ys, device="cuda")
    a = [float(eager(x, y).item()) for _ in range(5)]
    b = [float(compiled(x, y).item()) for _ in range(5)]
    assert compiled.stats["captures"] == 1 and compiled.stats["replays"] == 2, compiled.stats
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


@CUDA
def test_log_softmax_nll_after_a_chain_runs_in_the_chains_kernel(rng, record_kernels):
    """The chain's launch is held (as in a capture; eager_holds here) beneath the deferred log_softmax, and the
    cross_entropy that nll_loss absorbed it into takes it over: one kernel for the chain and the loss."""
    from smalltrain.backend.cuda import _common
    from smalltrain.backend.cuda import linear_chain as cuda_chain
    names = record_kernels(cuda_chain, "get")

    def build(lib):
        nn = lib.nn
        return nn.Sequential(nn.Linear(24, 16), nn.GELU(), nn.Linear(16, 5))
    ours, ref = _twins(build, rng)
    xs, ys = rng.standard_normal((8, 24)).astype(np.float32), rng.integers(0, 5, 8).astype(np.int64)
    with _common.eager_holds():
        out = _run(ours, ref, xs, ys, _nll)
    assert any(n.startswith("chain_fwd_ce") for n in names), names
    assert "CrossEntropyBackward" in _node_names(out)


def _bn_net(lib, act, style):
    """conv -> BatchNorm2d -> act -> max_pool -> flatten -> linear, in modules or F.* calls."""
    nn, F = lib.nn, lib.nn.functional

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.bn = nn.BatchNorm2d(4)
            self.act, self.fn = _acts(lib, act)
            self.fc = nn.Linear(4 * 4 * 4, 5)

        def forward(self, x):
            if style == "modules":
                return self.fc(lib.flatten(F.max_pool2d(self.act(self.bn(self.conv(x))), 2), 1))
            h = F.batch_norm(self.conv(x), self.bn.running_mean, self.bn.running_var, self.bn.weight, self.bn.bias,
                             self.training)
            return self.fc(lib.flatten(F.max_pool2d(self.fn(h), 2), 1))
    return Net()


def _same_buffers(ours, ref):
    for (name, b), (_, tb) in zip(ours.named_buffers(), ref.named_buffers()):
        np.testing.assert_allclose(b.cpu().numpy(), tb.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


@CUDA
@pytest.mark.parametrize("style", ["modules", "functional"])
@pytest.mark.parametrize("act", ["relu", "gelu"])
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_then_activation_is_one_op(style, act, training, rng):
    ours, ref = _twins(lambda lib: _bn_net(lib, act, style), rng)
    ours.train(training)
    ref.train(training)
    out = _run(ours, ref, *_data(rng, 4), _nll)
    names = _node_names(out)
    assert "BatchNormBackward" in names and not names & {"ReluBackward", "GeluBackward"}, names
    _same_buffers(ours, ref)


def _bn_read_twice(lib):
    nn, F = lib.nn, lib.nn.functional

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm2d(3)
            self.fc = nn.Linear(3 * 8 * 8, 5)

        def forward(self, x):
            h = self.bn(x)                        # read again after relu absorbed it: statistics updated once
            return self.fc(lib.flatten(F.relu(h) + h, 1))
    return Net()


@CUDA
def test_a_batch_norm_read_twice_updates_its_statistics_once(rng):
    ours, ref = _twins(_bn_read_twice, rng)
    _run(ours, ref, *_data(rng, 4), _nll)
    _same_buffers(ours, ref)


@CUDA
def test_a_batch_norm_nobody_reads_still_updates_its_statistics(rng):
    ours, ref = st.nn.BatchNorm2d(3).to("cuda"), torch.nn.BatchNorm2d(3)
    xs = rng.standard_normal((4, 3, 5, 5)).astype(np.float32)
    ours(st.tensor(xs, device="cuda"))   # output dropped at once, as in a statistics-recalibration loop
    ref(torch.tensor(xs))
    _same_buffers(ours, ref)             # (reading a buffer on the host runs what is held first)
    ours(st.tensor(xs, device="cuda"))
    ref(torch.tensor(xs))
    st.cuda.synchronize()
    _same_buffers(ours, ref)

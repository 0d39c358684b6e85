"""Fusion found in models written the ordinary way (ops/fusion.py, autograd/pending.py): on CUDA Conv2d + ReLU/GELU
(+ MaxPool2d, or + Flatten + Linear) and runs of Linear (+ activation) layers, in modules, nn.Sequential or F.* calls,
equal the layers run apart and hand their gradients on as the fused ops do; on the CPU ReLU/GELU + MaxPool2d run
pooled first (the activation deferred: ops/activation.py), in nn.Sequential too."""
import numpy as np
import pytest

import smalltrain as st
from smalltrain import nn
from smalltrain.autograd import pending
from smalltrain.nn import functional as F

cuda = pytest.mark.skipif(not st.cuda.is_available(), reason="no CUDA device")
ACTS = [None, "relu", "gelu", "gelu_tanh"]


def _act(y, act):
    if act == "relu":
        return F.relu(y)
    if act:
        return F.gelu(y, approximate="none" if act == "gelu" else "tanh")
    return y


def _unfused(layer, x, act):
    """act(layer(x)) with the layer run on its own (its deferred op run before the activation sees it)."""
    return _act(pending.resolve(layer(x)), act)


# the ordinary spellings, which ops/fusion.py fuses on CUDA
def layer_act(layer, x, act):
    return _act(layer(x), act)


def layer_act_pool(layer, x, act, pool):
    return pool(_act(layer(x), act))


def layer_act_linear(layer, x, act, flatten, linear):
    return linear(flatten(_act(layer(x), act)))


def chain_act(x, pairs, flatten=False):
    if flatten:
        x = x.flatten(1)
    for layer, act in pairs:
        x = _act(layer(x), act)
    return x


def _grads(layer, x, fn):
    for p in layer.parameters():
        p.grad = None
    x = x.detach().requires_grad_(True)
    out = fn(layer, x)
    (out * out).sum().backward()
    return [out.detach().cpu().numpy(), x.grad.cpu().numpy()] + [p.grad.cpu().numpy() for p in layer.parameters()]


def _layers():
    st.manual_seed(0)
    return [(nn.Linear(7, 5), (4, 3, 7)), (nn.Conv2d(3, 4, 3, padding=1), (2, 3, 6, 5))]


@cuda
@pytest.mark.parametrize("act", ACTS)
def test_cuda_fused_equals_unfused(act):
    for layer, shape in _layers():
        layer = layer.to("cuda")
        x = st.randn(*shape).to("cuda")
        fused = _grads(layer, x, lambda m, v: layer_act(m, v, act))
        plain = _grads(layer, x, lambda m, v: _unfused(m, v, act))
        for name, u, v in zip(["out", "dx", "dw", "db"], fused, plain):
            err = np.abs(u - v).max() / max(np.abs(v).max(), 1e-30)
            assert err <= 1e-6, f"{type(layer).__name__} {act} {name}: {err:.2e}"


@cuda
def test_sequential_fuses_only_unhooked_pairs():
    st.manual_seed(0)
    seq = nn.Sequential(nn.Conv2d(2, 3, 1), nn.GELU(), nn.Flatten(), nn.Linear(12, 2), nn.ReLU()).to("cuda")
    x = st.randn(5, 2, 2, 2).to("cuda")
    fused = seq(x)
    assert fused.grad_fn is not None and "LinearAct" in type(fused.grad_fn).__name__ + fused.grad_fn.name()
    seen = []
    seq[3].register_forward_hook(lambda m, i, o: seen.append(o.shape))
    hooked = seq(x)
    assert seen == [(5, 2)]   # the hooked Linear ran as a module, its hook saw its own output
    np.testing.assert_allclose(hooked.detach().cpu().numpy(), fused.detach().cpu().numpy(), rtol=1e-6, atol=1e-7)


CHAIN = [(8, 6, "relu"), (6, 5, "gelu"), (5, 3, None)]


def _mlp():
    st.manual_seed(0)
    mods = []
    for k, f, act in CHAIN:
        mods.append(nn.Linear(k, f))
        if act:
            mods.append(nn.ReLU() if act == "relu" else nn.GELU())
    return nn.Sequential(*mods)


def _pairs(seq):
    layers = [m for m in seq if isinstance(m, nn.Linear)]
    return [(layer, act) for layer, (_, _, act) in zip(layers, CHAIN)]


def _one_by_one(seq, x):
    for layer, act in _pairs(seq):
        x = _unfused(layer, x, act)
    return x


@cuda
def test_cuda_chain_equals_unfused_and_sequential_takes_it():
    seq, x = _mlp().to("cuda"), st.randn(4, 8).to("cuda")
    assert "LinearChain" in seq(x).grad_fn.name()
    for fn in (lambda m, v: chain_act(v, _pairs(m)), lambda m, v: m(v)):
        fused = _grads(seq, x, fn)
        plain = _grads(seq, x, _one_by_one)
        for name, u, v in zip(["out", "dx", "w0", "b0", "w1", "b1", "w2", "b2"], fused, plain):
            err = np.abs(u - v).max() / max(np.abs(v).max(), 1e-30)
            assert err <= 1e-5, f"{name}: {err:.2e}"


@cuda
def test_sequential_chains_stop_at_hooks_and_other_modules():
    seq = _mlp().to("cuda")
    x = st.randn(4, 8).to("cuda")
    seen = []
    seq[2].register_forward_hook(lambda m, i, o: seen.append(o.shape))   # the second Linear
    out = seq(x)
    assert seen == [(4, 5)] and "LinearAct" in out.grad_fn.name()   # Linear + ReLU, hooked Linear, GELU, Linear
    seq2 = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Dropout(0.0), nn.Linear(6, 5), nn.Linear(5, 3)).to("cuda")
    assert "LinearChain" in seq2(x).grad_fn.name()   # the last two Linears chain; the first pair stays a pair


POOLS = [  # tiling, overlapping + padded, dilated, a partial window
    {"kernel_size": 2}, {"kernel_size": 3, "stride": 2, "padding": 1}, {"kernel_size": 2, "stride": 1, "dilation": 2},
    {"kernel_size": 3, "stride": 2, "ceil_mode": True}]


def _conv_pool(pool_kwargs):
    st.manual_seed(0)
    return nn.Conv2d(3, 4, 3, padding=1), nn.MaxPool2d(**pool_kwargs)


@pytest.mark.parametrize("pool_kwargs", POOLS)
@pytest.mark.parametrize("act", ACTS)
def test_cpu_conv_act_pool_equals_the_unfused_ops(act, pool_kwargs):
    """Pooled first where no window needs padding: bit for bit where windows do not overlap; where they do, the
    derivative multiplies each window's gradient before the sum, not after (float rounding)."""
    conv, pool = _conv_pool(pool_kwargs)
    x = st.randn(2, 3, 9, 8)
    a = _grads(conv, x, lambda m, v: layer_act_pool(m, v, act, pool))
    b = _grads(conv, x, lambda m, v: pool(pending.resolve(_act(m(v), act))))   # the activation run on its own
    overlap = pool.stride != pool.kernel_size or pool.dilation != 1
    for u, v in zip(a, b):
        if overlap and act in ("gelu", "gelu_tanh"):
            np.testing.assert_allclose(u, v, rtol=1e-6, atol=1e-7)
        else:
            np.testing.assert_array_equal(u, v)


def test_sequential_pools_first_on_the_cpu_unless_hooked_or_in_place():
    """An unhooked ReLU/GELU then an unhooked MaxPool2d without indices run as ActMaxPool2d on the CPU."""
    st.manual_seed(0)
    x = st.randn(3, 2, 8, 8).requires_grad_(True)
    for seq, fused in [(nn.Sequential(nn.GELU(), nn.MaxPool2d(2)), True),
                       (nn.Sequential(nn.Conv2d(2, 2, 3), nn.ReLU(), nn.MaxPool2d(2)), True),
                       (nn.Sequential(nn.ReLU(inplace=True), nn.MaxPool2d(2)), False),
                       (nn.Sequential(nn.GELU(), nn.MaxPool2d(2, return_indices=True)), False),
                       (nn.Sequential(nn.GELU(), nn.AvgPool2d(2)), False)]:
        out = seq(x * 1)   # not a leaf: the in-place ReLU may overwrite it
        out = out[0] if isinstance(out, tuple) else out
        assert (out.grad_fn.name() == "ActMaxPool2dBackward") == fused, seq
    seq = nn.Sequential(nn.GELU(), nn.MaxPool2d(2))
    seen = []
    seq[1].register_forward_hook(lambda m, i, o: seen.append(o.shape))
    hooked = seq(x)
    assert seen == [(3, 2, 4, 4)] and hooked.grad_fn.name() == "MaxPool2dBackward"
    np.testing.assert_array_equal(hooked.detach().numpy(), F.max_pool2d(F.gelu(x), 2).detach().numpy())


@cuda
@pytest.mark.parametrize("pool_kwargs", POOLS)
@pytest.mark.parametrize("act", ACTS)
def test_cuda_conv_act_pool_equals_unfused(act, pool_kwargs):
    conv, pool = _conv_pool(pool_kwargs)
    conv = conv.to("cuda")
    x = st.randn(2, 3, 9, 8).to("cuda")
    fused = _grads(conv, x, lambda m, v: layer_act_pool(m, v, act, pool))
    plain = _grads(conv, x, lambda m, v: pool(_unfused(m, v, act)))
    for name, u, v in zip(["out", "dx", "dw", "db"], fused, plain):
        assert u.shape == v.shape, name
        err = np.abs(u - v).max() / max(np.abs(v).max(), 1e-30)
        assert err <= 1e-6, f"{act} {pool_kwargs} {name}: {err:.2e}"


@cuda
def test_sequential_fuses_conv_act_pool_unless_the_pool_is_hooked():
    st.manual_seed(0)
    seq = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten()).to("cuda")
    x = st.randn(3, 1, 8, 8).to("cuda")
    fused = seq[:3](x)
    assert "Conv2dActPool" in type(fused.grad_fn).__name__ + fused.grad_fn.name()
    seen = []
    seq[2].register_forward_hook(lambda m, i, o: seen.append(o.shape))
    hooked = seq[:3](x)
    assert seen == [(3, 2, 3, 3)] and "MaxPool" in type(hooked.grad_fn).__name__ + hooked.grad_fn.name()
    np.testing.assert_allclose(hooked.detach().cpu().numpy(), fused.detach().cpu().numpy(), rtol=1e-6, atol=1e-7)


# (conv, linear outputs, input shape): linear outputs <= 16 take the wide kernel writing the convolution's gradient
# directly, 20 the other linear kernels and then the transpose-and-derivative kernel; the last MnistCnn's second layer
CONV_LINEAR = [((3, 4, 3, 1), 5, (2, 3, 6, 5)), ((3, 4, 3, 1), 20, (2, 3, 6, 5)), ((2, 3, 5, 0), 1, (1, 2, 7, 9)),
               ((16, 32, 3, 0), 10, (3, 16, 26, 26))]


def _conv_linear(spec, features, shape):
    st.manual_seed(0)
    c, o, k, pad = spec
    conv = nn.Conv2d(c, o, k, padding=pad)
    oh, ow = shape[2] + 2 * pad - k + 1, shape[3] + 2 * pad - k + 1
    return nn.Sequential(conv, nn.Linear(o * oh * ow, features)), nn.Flatten()


def _conv_linear_fused(act, flatten):
    return lambda m, v: layer_act_linear(m[0], v, act, flatten, m[1])


def _conv_linear_plain(act, flatten):
    return lambda m, v: m[1](flatten(_unfused(m[0], v, act)))


@cuda
@pytest.mark.parametrize("spec,features,shape", CONV_LINEAR)
@pytest.mark.parametrize("act", ACTS)
def test_cuda_conv_act_linear_equals_unfused(act, spec, features, shape):
    layers, flatten = _conv_linear(spec, features, shape)
    layers = layers.to("cuda")
    x = st.randn(*shape).to("cuda")
    out = layer_act_linear(layers[0], x, act, flatten, layers[1])
    assert "Conv2dActLinear" in out.grad_fn.name()
    fused = _grads(layers, x, _conv_linear_fused(act, flatten))
    plain = _grads(layers, x, _conv_linear_plain(act, flatten))
    for name, u, v in zip(["out", "dx", "conv w", "conv b", "linear w", "linear b"], fused, plain):
        assert u.shape == v.shape, name
        err = np.abs(u - v).max() / max(np.abs(v).max(), 1e-30)
        assert err <= 1e-6, f"{act} {spec} {features} {name}: {err:.2e}"


@cuda
def test_cuda_conv_act_linear_with_a_frozen_convolution():
    """Only the linear layer trains: no gradient of the convolution is computed, the linear layer's are exact."""
    layers, flatten = _conv_linear(*CONV_LINEAR[0])
    layers = layers.to("cuda")
    layers[0].requires_grad_(False)
    x = st.randn(*CONV_LINEAR[0][2]).to("cuda")
    grads = []
    for fn in (_conv_linear_fused("gelu", flatten), _conv_linear_plain("gelu", flatten)):
        layers.zero_grad()
        (fn(layers, x) ** 2).sum().backward()
        assert layers[0].weight.grad is None and layers[0].bias.grad is None
        grads.append([p.grad.cpu().numpy() for p in layers[1].parameters()])
    for u, v in zip(*grads):
        np.testing.assert_allclose(u, v, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
def test_conv_act_linear_of_mismatched_widths_raises_before_running(device):
    conv, linear = nn.Conv2d(3, 4, 3).to(device), nn.Linear(99, 5).to(device)   # the flattened output is 4*4*3
    with pytest.raises(RuntimeError, match=r"48.*99|99.*48"):
        layer_act_linear(conv, st.randn(2, 3, 6, 5).to(device), "relu", nn.Flatten(), linear)


@cuda
def test_sequential_fuses_conv_act_flatten_linear_only_for_a_last_linear():
    st.manual_seed(0)
    seq = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(18, 4)).to("cuda")
    x = st.randn(3, 1, 5, 5).to("cuda")
    fused = seq(x)
    assert "Conv2dActLinear" in fused.grad_fn.name()
    plain = seq[3](seq[2](F.relu(seq[0](x))))
    np.testing.assert_allclose(fused.detach().cpu().numpy(), plain.detach().cpu().numpy(), rtol=1e-6, atol=1e-7)
    seq.append(nn.ReLU()).append(nn.Linear(4, 2).to("cuda"))   # the Linear now starts a chain: that op instead
    assert "LinearChain" in seq(x).grad_fn.name()


@cuda
@pytest.mark.parametrize("act1", ["relu", "gelu", None])
def test_cuda_convolution_hands_the_previous_one_its_g(act1, conv_launches, tune):
    """MnistCnn's layout: Conv2d + act, then Conv2d + ReLU + Flatten + Linear. Where nothing else reads the first
    layer's output, the second layer's backward writes the first's g (autograd.engine.Prepared "conv_g": its input
    gradient times the first activation's derivative, in the first layer's kernels' layout), so no
    transpose-and-derivative kernel runs, and (one input channel) the first layer's weight gradient in the same
    kernel's epilogue. A second consumer of that output, or a hook on it, keeps the plain path; the gradients are
    those of the plain path (bit for bit but the first layer's, summed in another order) and of the unfused
    layers."""
    tune(tile_dx_min_threads_per_sm=0)   # tile_conv's dx at this small batch
    launched = conv_launches
    st.manual_seed(0)
    c1, c2, fc = nn.Conv2d(1, 16, 3).to("cuda"), nn.Conv2d(16, 32, 3).to("cuda"), nn.Linear(32 * 10 * 10, 10)
    fc, flatten = fc.to("cuda"), nn.Flatten()
    params = list(c1.parameters()) + list(c2.parameters()) + list(fc.parameters())
    x = st.randn(8, 1, 14, 14).to("cuda")

    def grads(mode, fused=True):
        for p in params:
            p.grad = None
        launched.clear()
        h = layer_act(c1, x, act1) if fused else _unfused(c1, x, act1)
        if mode == "hook":
            h.register_hook(lambda g: g)
        out = layer_act_linear(c2, h, "relu", flatten, fc) if fused else fc(flatten(_unfused(c2, h, "relu")))
        loss = (out * out).sum()
        if mode == "second consumer":
            loss = loss + (h * 0).sum()
        loss.backward()
        return [p.grad.cpu().numpy() for p in params]
    handed = grads(None)   # the first layer's weight gradient in the second's dx epilogue (tile_conv_wgrad)
    assert not any(n.startswith("bias_act") for n in launched), launched
    assert any(n.startswith("tile_conv_wgrad_k3") for n in launched), launched
    assert "tile_wgrad_k3_to4" not in launched, launched   # the first layer's own (the second's is _to8)
    plain = grads("hook")   # the plain path: the first layer's own tile_wgrad
    assert any(n.startswith("bias_act") for n in launched) and "tile_wgrad_k3_to4" in launched, launched
    for i, (u, v) in enumerate(zip(handed, plain)):   # the first layer's dw and db summed in another order
        if i < 2:
            assert np.abs(u - v).max() <= 1e-6 * max(np.abs(v).max(), 1.0), i
        else:
            assert np.array_equal(u, v), i
    unfused = grads(None, fused=False)
    for u, v in zip(handed, unfused):
        assert np.abs(u - v).max() <= 1e-5 * max(np.abs(v).max(), 1.0)
    for mode in ("second consumer", "hook"):
        other = grads(mode)
        assert any(n.startswith("bias_act") for n in launched), (mode, launched)
        for u, v in zip(other, handed):
            assert np.abs(u - v).max() <= 1e-5 * max(np.abs(v).max(), 1.0), mode


def _lenet_layers():
    """LeNet-5's layers on CUDA, seeded: (conv1, conv2, the three Linear layers, MaxPool2d(2), all parameters, a
    batch of 4 images)."""
    st.manual_seed(0)
    c1, c2 = nn.Conv2d(1, 6, 5).to("cuda"), nn.Conv2d(6, 16, 5).to("cuda")
    fcs = [nn.Linear(256, 120).to("cuda"), nn.Linear(120, 84).to("cuda"), nn.Linear(84, 10).to("cuda")]
    params = list(c1.parameters()) + list(c2.parameters()) + [p for fc in fcs for p in fc.parameters()]
    return c1, c2, fcs, nn.MaxPool2d(2), params, st.randn(4, 1, 28, 28).to("cuda")


@cuda
@pytest.mark.parametrize("act1", ["relu", "gelu", None])
def test_cuda_pooled_convolutions_take_their_g_through_the_pooling(act1, record_kernels, conv_launches, tune):
    """LeNet-5's layout: Conv2d + act + MaxPool2d(2) twice, then Flatten and three Linear layers (one chain). Where
    each convolution pooled in its epilogue (tile_conv_pool) and nothing else reads its pooled output, the next
    layer's backward writes its g through the pooling's backward (Prepared "conv_g": the second convolution's
    tile_conv epilogue for the first, the chain's kernel for the second), so no pooling backward kernel runs, and the
    first layer's weight gradient comes from its g at the maxima in the second layer's input-gradient kernel
    (tile_conv_unpool_wgrad: no dense weight-gradient kernel for it, one wgrad_reduce each); the gradients within
    float32 rounding of the unfused layers. A second consumer of the first pooled output, or a hook on it, keeps
    that hand-off's plain path (the pooling's backward kernel, the first layer's own tile_wgrad)."""
    from smalltrain.backend.cuda import pool as cuda_pool
    tune(tile_dx_min_threads_per_sm=0)   # tile_conv's dx at this small batch
    pooled_bwd = record_kernels(cuda_pool, "launch")
    launched = conv_launches
    c1, c2, fcs, pool, params, x = _lenet_layers()

    def grads(mode, fused=True):
        for p in params:
            p.grad = None
        pooled_bwd.clear()
        launched.clear()
        h = layer_act_pool(c1, x, act1, pool) if fused else pool(_unfused(c1, x, act1))
        if mode == "hook":
            h.register_hook(lambda g: g)
        h2 = layer_act_pool(c2, h, "gelu", pool) if fused else pool(_unfused(c2, h, "gelu"))
        pairs = [(fcs[0], "gelu"), (fcs[1], "gelu"), (fcs[2], None)]
        out = chain_act(h2, pairs, flatten=True) if fused else chain_act(h2.flatten(1), pairs)
        loss = (out * out).sum()
        if mode == "second consumer":
            loss = loss + (h * 0).sum()
        loss.backward()
        return [p.grad.cpu().numpy() for p in params]
    def weight_kernels():
        return sum(n.startswith(("tile_wgrad", "igemm_wgrad", "wgrad_partial")) for n in launched)
    handed = grads(None)
    assert "max_pool2d_bwd_act_tiled" not in pooled_bwd, pooled_bwd
    assert "tile_conv_unpool_wgrad_k5_to4" in launched and "pooled_wgrad_k5" not in launched, launched
    assert weight_kernels() == 1 and launched.count("wgrad_reduce") == 2, launched   # the second layer's
    unfused = grads(None, fused=False)
    for u, v in zip(handed, unfused):
        assert np.abs(u - v).max() <= 1e-5 * max(np.abs(v).max(), 1.0)
    for mode in ("second consumer", "hook"):
        other = grads(mode)
        assert pooled_bwd.count("max_pool2d_bwd_act_tiled") == 1 and weight_kernels() == 2, (mode, pooled_bwd)
        for u, v in zip(other, handed):
            assert np.abs(u - v).max() <= 1e-5 * max(np.abs(v).max(), 1.0), mode


@cuda
@pytest.mark.parametrize("batch", [4, 300])
def test_cuda_weight_gradients_beside_the_pass_are_joined_by_it(batch, monkeypatch, tune):
    """LeNet-5's layout: the chain's weight gradients (chain_wgrad) and the second convolution's (its tile_wgrad
    beside its input gradient, the size limit raised) are queued on side streams and joined at the end of the
    backward pass (hooks.defer_join, autograd's engine.defer_join: two joins), not at once; the gradients are
    bit-equal to the joins at once (the backend's default defer_join: the same kernels in the same order). A hook on
    a weight is no obstacle (the engine joins first). The two works go one on each of the two side streams."""
    from smalltrain.autograd import engine
    from smalltrain.backend import hooks
    from smalltrain.backend.cuda import _common
    tune(wgrad_beside_max_outputs=1 << 30)
    monkeypatch.setattr(_common, "_side", {})   # (the streams this test makes)
    joins = []
    monkeypatch.setattr(hooks, "defer_join", lambda join: (joins.append(join), engine.defer_join(join)))
    c1, c2, fcs, pool, params, _ = _lenet_layers()
    x = st.randn(batch, 1, 28, 28).to("cuda")
    seen = []
    fcs[0].weight.register_hook(lambda g: seen.append(float(g.sum().item())))

    def grads():
        for p in params:
            p.grad = None
        joins.clear()
        seen.clear()
        h = layer_act_pool(c2, layer_act_pool(c1, x, "gelu", pool), "gelu", pool)
        out = chain_act(h, [(fcs[0], "gelu"), (fcs[1], "gelu"), (fcs[2], None)], flatten=True)
        (out * out).sum().backward()
        return [p.grad.cpu().numpy() for p in params], len(joins), seen[:]
    deferred, n_deferred, seen_deferred = grads()
    assert n_deferred == 2
    assert len(_common._side[x.array.device.id][0]) == 2
    monkeypatch.setattr(hooks, "defer_join", lambda join: join())
    at_once, _, seen_at_once = grads()
    assert seen_deferred == seen_at_once and len(seen_at_once) == 1
    for i, (u, v) in enumerate(zip(deferred, at_once)):
        assert np.array_equal(u, v), i
    assert not engine._joins


@cuda
def test_sequential_flattens_inside_the_chain_so_the_pooled_convolution_takes_its_g(record_kernels, tune):
    """nn.Sequential's LeNet-5 (the benchmark's form: MaxPool2d, Flatten, Linear, GELU, ...): the Flatten module is
    done inside the chain op, so the chain's backward writes the second convolution's g through its pooling (no
    pooling backward kernel), as chain_act(..., flatten=True) does; the gradients bit-equal that functional form.
    A hooked Flatten runs as a module (it must see its output), and the pooling's backward kernel runs."""
    from smalltrain.backend.cuda import pool as cuda_pool
    tune(tile_dx_min_threads_per_sm=0)   # the first layer's hand-off at this batch too
    pooled_bwd = record_kernels(cuda_pool, "launch")
    st.manual_seed(0)
    seq = nn.Sequential(nn.Conv2d(1, 6, 5), nn.GELU(), nn.MaxPool2d(2), nn.Conv2d(6, 16, 5), nn.GELU(),
                        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(256, 120), nn.GELU(), nn.Linear(120, 84),
                        nn.GELU(), nn.Linear(84, 10)).to("cuda")
    x = st.randn(4, 1, 28, 28).to("cuda")

    def grads(forward):
        for p in seq.parameters():
            p.grad = None
        pooled_bwd.clear()
        out = forward(x)
        (out * out).sum().backward()
        return [out.detach().cpu().numpy()] + [p.grad.cpu().numpy() for p in seq.parameters()]

    def functional(v):
        v = layer_act_pool(seq[0], v, "gelu", seq[2])
        v = layer_act_pool(seq[3], v, "gelu", seq[5])
        return chain_act(v, [(seq[7], "gelu"), (seq[9], "gelu"), (seq[11], None)], flatten=True)
    reference = grads(functional)
    assert "max_pool2d_bwd_act_tiled" not in pooled_bwd, pooled_bwd
    assert "LinearChain" in seq(x).grad_fn.name()
    sequential = grads(seq)
    assert "max_pool2d_bwd_act_tiled" not in pooled_bwd, pooled_bwd
    for u, v in zip(sequential, reference):
        assert np.array_equal(u, v)
    seen = []
    seq[6].register_forward_hook(lambda m, i, o: seen.append(tuple(o.shape)))
    hooked = grads(seq)
    assert seen == [(4, 256)] and pooled_bwd.count("max_pool2d_bwd_act_tiled") == 1, (seen, pooled_bwd)
    for u, v in zip(hooked, reference):
        assert np.abs(u - v).max() <= 1e-6 * max(np.abs(v).max(), 1.0)


@cuda
def test_cuda_pooled_convolution_hands_a_plain_one_its_g(conv_launches, tune):
    """Conv2d + ReLU, then Conv2d + GELU + MaxPool2d(2): the pooled layer's backward writes the first layer's g (the
    plain 'into' hand-off, as Conv2dActLinear's), so no transpose-and-derivative kernel runs; gradients bit-equal to
    the plain path (a hook on the first layer's output keeps it)."""
    tune(tile_dx_min_threads_per_sm=0)   # tile_conv's dx at this small batch
    launched = conv_launches
    st.manual_seed(0)
    c1, c2, pool = nn.Conv2d(2, 6, 3).to("cuda"), nn.Conv2d(6, 8, 3).to("cuda"), nn.MaxPool2d(2)
    params = list(c1.parameters()) + list(c2.parameters())
    x = st.randn(4, 2, 14, 14).to("cuda")

    def grads(hook=False):
        for p in params:
            p.grad = None
        launched.clear()
        h = layer_act(c1, x, "relu")
        if hook:
            h.register_hook(lambda g: g)
        out = layer_act_pool(c2, h, "gelu", pool)
        (out * out).sum().backward()
        return [p.grad.cpu().numpy() for p in params]
    handed = grads()
    assert not any(n.startswith("bias_act") for n in launched), launched
    plain = grads(hook=True)
    assert any(n.startswith("bias_act") for n in launched), launched
    for u, v in zip(handed, plain):
        assert np.array_equal(u, v)

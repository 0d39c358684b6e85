"""nn.utils.flatten_parameters: parameters and gradients as views into two flat buffers. The gradients and the
training steps equal those of the same model unflattened, bit for bit; on CUDA the kernels write the gradients
into the buffer themselves (no copy), and the fused optimizers update it as one array."""
import numpy as np
import pytest

import smalltrain as st
from smalltrain import models, nn
from smalltrain.autograd import engine
from smalltrain.nn import functional as F
from smalltrain.nn.utils import flatten_parameters


def _pair(model_cls, device):
    """The same model twice (same seed): plain, and flattened."""
    st.manual_seed(0)
    plain = model_cls().to(device)
    st.manual_seed(0)
    flat_model = model_cls().to(device)
    return plain, flat_model, flatten_parameters(flat_model.parameters())


def _batch(device, n=16, seed=0):
    rng = np.random.default_rng(seed)
    x = st.tensor(rng.standard_normal((n, 1, 28, 28)).astype(np.float32), device=device)
    return x, st.tensor(rng.integers(0, 10, n), device=device)


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def _shares(a, flat):
    """Whether array a lies inside the flat buffer (by address)."""
    if isinstance(a, np.ndarray):
        return np.shares_memory(a, flat)
    return flat.data.ptr <= a.data.ptr < flat.data.ptr + flat.nbytes


def test_values_kept_and_parameters_are_views_in_order(device):
    st.manual_seed(0)
    model = models.LeNet5().to(device)
    before = [_host(p.array).copy() for p in model.parameters()]
    model.fc3.weight.grad = st.ones(*model.fc3.weight.shape, device=device)   # a gradient already there is kept
    flat = flatten_parameters(model.parameters())
    params = list(model.parameters())
    # each parameter 256-byte aligned (64 floats), the gaps zero
    assert flat.offsets == [int(o) for o in np.cumsum([0] + [-(-b.size // 64) * 64 for b in before[:-1]])]
    assert flat.data.shape == (flat.offsets[-1] + -(-before[-1].size // 64) * 64,)
    data = _host(flat.data)
    for p, b, off in zip(params, before, flat.offsets):
        assert np.array_equal(_host(p.array), b)
        assert _shares(p.array, flat.data)
        assert np.array_equal(data[off:off + b.size], b.reshape(-1))
        data[off:off + b.size] = 0
    assert not data.any()
    assert _shares(model.fc3.weight.grad.array, flat.grad)
    assert np.all(_host(model.fc3.weight.grad.array) == 1)
    assert flat.intact() and not flat.grads_in_place()   # the other parameters have no gradient yet
    st.manual_seed(1)
    other = models.LeNet5().to(device)
    model.load_state_dict(other.state_dict())   # copies in place: the views stay
    assert flat.intact()
    assert all(np.array_equal(_host(flat.data[off:off + p.array.size]), _host(p.array).reshape(-1))
               for p, off in zip(other.parameters(), flat.offsets))


@pytest.mark.parametrize("model_cls", [models.LeNet5, models.MnistCnn], ids=["lenet5", "cnn"])
def test_gradients_land_in_the_flat_buffer(model_cls, device):
    """The same gradients as the plain model's, each .grad a view into flat.grad; on CUDA every one written there
    by the kernel that makes it (engine.grad_slot_copies unchanged), on the CPU copied there by the engine."""
    plain, flat_model, flat = _pair(model_cls, device)
    x, y = _batch(device)
    F.cross_entropy(plain(x), y).backward()
    copies = engine.grad_slot_copies[0]
    F.cross_entropy(flat_model(x), y).backward()
    assert flat.grads_in_place()
    for p, q in zip(plain.parameters(), flat_model.parameters()):
        assert np.array_equal(_host(p.grad.array), _host(q.grad.array))
    n = len(list(flat_model.parameters()))
    assert engine.grad_slot_copies[0] - copies == (0 if device == "cuda" else n)


@pytest.mark.parametrize("opt", ["sgd", "adam", "adamw-amsgrad"])
@pytest.mark.parametrize("set_to_none", [True, False], ids=["grads_to_none", "grads_zeroed"])
def test_training_equals_the_plain_model(opt, set_to_none, device):
    """Five steps with the flattened and the plain LeNet-5: the same parameters bit for bit. On CUDA the fused
    optimizer's state lives in flat buffers too (one array each for the kernel)."""
    plain, flat_model, flat = _pair(models.LeNet5, device)

    def make(model):
        if opt == "sgd":
            return st.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
        if opt == "adam":
            return st.optim.Adam(model.parameters(), lr=1e-3)
        return st.optim.AdamW(model.parameters(), lr=1e-3, amsgrad=True)
    pairs = [(plain, make(plain)), (flat_model, make(flat_model))]
    for step in range(5):
        x, y = _batch(device, seed=step)
        for model, o in pairs:
            o.zero_grad(set_to_none=set_to_none)
            F.cross_entropy(model(x), y).backward()
            o.step()
    for p, q in zip(plain.parameters(), flat_model.parameters()):
        assert np.array_equal(_host(p.array), _host(q.array))
    assert flat.grads_in_place()
    if device == "cuda":
        o = pairs[1][1]
        names = ("momentum_buffer",) if opt == "sgd" else ("exp_avg", "exp_avg_sq")
        (_, _, flats, _), = o._flat_state.values()
        for name, buf in zip(names, flats):
            assert buf.shape == flat.data.shape
            assert all(_shares(o.state[p][name].array, buf) for p in flat_model.parameters())


def test_loaded_optimizer_state_is_taken_into_the_flat_buffers(device):
    """load_state_dict replaces the state arrays: the next step copies them into new flat buffers and goes on as
    the plain model does."""
    plain, flat_model, _ = _pair(models.LeNet5, device)
    opts = [st.optim.Adam(m.parameters(), lr=1e-3) for m in (plain, flat_model)]
    for step in range(4):
        x, y = _batch(device, seed=step)
        for model, o in zip((plain, flat_model), opts):
            o.zero_grad()
            F.cross_entropy(model(x), y).backward()
            o.step()
        if step == 1:
            opts[1].load_state_dict(opts[1].state_dict())
    for p, q in zip(plain.parameters(), flat_model.parameters()):
        assert np.array_equal(_host(p.array), _host(q.array))


@pytest.mark.parametrize("layer", ["linear", "conv"])
def test_a_parameter_used_twice_and_gradients_accumulated(layer, device):
    """A weight used twice (two linear layers, or two convolutions where the second's input gradient may also make
    the first's weight gradient) gets both gradients added in its view; a second backward without zero_grad adds
    to it. The engine offers the slot of a leaf used once only, so the copies count both uses."""
    st.manual_seed(0)
    shape, xshape = ((4, 4), (3, 4)) if layer == "linear" else ((4, 4, 3, 3), (2, 4, 12, 12))
    w = nn.Parameter(st.randn(*shape, device=device))
    b = nn.Parameter(st.randn(4, device=device))
    w_ref, b_ref = nn.Parameter(st.tensor(_host(w.array).copy(), device=device)), \
        nn.Parameter(st.tensor(_host(b.array).copy(), device=device))
    flat = flatten_parameters([w, b])
    x = st.randn(*xshape, device=device)
    op = F.linear if layer == "linear" else F.conv2d
    copies = engine.grad_slot_copies[0]
    for _ in range(2):
        for ww, bb in ((w, b), (w_ref, b_ref)):
            h = op(op(x, ww, bb).relu(), ww, bb)
            (h * h).sum().backward()
    assert flat.grads_in_place() and engine.grad_slot_copies[0] - copies == 2
    np.testing.assert_allclose(_host(w.grad.array), _host(w_ref.grad.array), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_host(b.grad.array), _host(b_ref.grad.array), rtol=1e-5, atol=1e-5)


def test_autograd_grad_leaves_the_gradient_buffer_alone(device):
    plain, flat_model, flat = _pair(models.LeNet5, device)
    x, y = _batch(device)
    F.cross_entropy(flat_model(x), y).backward()
    kept = _host(flat.grad).copy()
    x2, y2 = _batch(device, seed=1)
    got = st.autograd.grad(F.cross_entropy(flat_model(x2), y2), list(flat_model.parameters()))
    want = st.autograd.grad(F.cross_entropy(plain(x2), y2), list(plain.parameters()))
    assert np.array_equal(_host(flat.grad), kept) and flat.grads_in_place()
    for a, b in zip(got, want):
        assert not _shares(a.array, flat.grad)
        assert np.array_equal(_host(a.array), _host(b.array))


def test_a_replaced_array_detaches_its_parameter(device):
    """vector_to_parameters (or model.to) gives the parameters other arrays: the optimizer then updates the separate
    arrays (the gradients still land in the flat buffer while they fit it); after .double() they no longer fit."""
    plain, flat_model, flat = _pair(models.LeNet5, device)
    fresh = st.tensor(np.concatenate([_host(p.array).reshape(-1) for p in flat_model.parameters()]), device=device)
    nn.utils.vector_to_parameters(fresh, flat_model.parameters())
    assert not flat.intact()
    for step in range(3):
        if step == 2:
            plain.double(), flat_model.double()
        opts = [st.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (plain, flat_model)]
        x, y = _batch(device, seed=step)
        for model, o in zip((plain, flat_model), opts):
            o.zero_grad()
            F.cross_entropy(model(x.double() if step == 2 else x), y).backward()
            o.step()
        for p, q in zip(plain.parameters(), flat_model.parameters()):
            assert _shares(q.grad.array, flat.grad) == (step < 2)
            assert not _shares(q.array, flat.data)
            assert np.array_equal(_host(p.array), _host(q.array))


def test_bad_input_is_refused():
    a, b = nn.Parameter(st.zeros(2)), nn.Parameter(st.zeros(3))
    with pytest.raises(ValueError, match="expected at least one parameter, got none"):
        flatten_parameters([])
    with pytest.raises(TypeError, match="expected Tensors, got numpy.ndarray at position 1"):
        flatten_parameters([a, np.zeros(2)])
    with pytest.raises(ValueError, match="expected leaf tensors, got a non-leaf at position 0"):
        flatten_parameters([a * 2])
    with pytest.raises(TypeError, match="expected one dtype, got float32 at position 0 and float64 at position 1"):
        flatten_parameters([a, nn.Parameter(st.zeros(2, dtype=st.float64))])
    with pytest.raises(TypeError, match="expected floating point parameters, got int64 at position 0"):
        flatten_parameters([st.zeros(2, dtype=st.int64)])
    with pytest.raises(ValueError, match="a parameter appears more than once"):
        flatten_parameters([a, b, a])
    flatten_parameters([a])
    with pytest.raises(ValueError, match="the parameter at position 1 is flattened already"):
        flatten_parameters([b, a])

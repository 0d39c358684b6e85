"""The layers against torch.nn: our initialized weights are loaded into the torch layer, then outputs, input
gradients, parameter gradients and buffers are compared; constructor errors, reprs, init statistics, BatchNorm
running statistics and Dropout's behaviour."""
import inspect
import math

import numpy as np
import pytest
import torch

import smalltrain as st
from smalltrain import nn
from smalltrain.testing import assert_close


def T(n):
    return torch if n is torch.nn else st


def run_pair(build, inputs, device, rtol=1e-5, train=True, seed=0):
    """Build the layer in both frameworks, copy our weights into torch's, compare forward and backward."""
    ours, theirs = build(nn), build(torch.nn)
    theirs.load_state_dict({k: torch.tensor(np.array(v)) for k, v in ours.state_dict().items()})
    ours.to(device).train(train)
    theirs.train(train)
    ts = [st.tensor(x, device=device, requires_grad=x.dtype.kind == "f") for x in inputs]
    tt = [torch.tensor(x, requires_grad=x.dtype.kind == "f") for x in inputs]
    out_s, out_t = ours(*ts), theirs(*tt)
    assert_close(out_s, out_t, rtol, name="output")
    g = np.random.default_rng(seed).standard_normal(tuple(out_t.shape)).astype(np.float32)
    (out_s * st.tensor(g, device=device)).sum().backward()
    (out_t * torch.tensor(g)).sum().backward()
    for k, (a, b) in enumerate(zip(ts, tt)):
        if b.requires_grad:
            assert_close(a.grad, b.grad, rtol, name=f"gradient of input {k}")
    t_params = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        assert_close(p.grad, t_params[name].grad, rtol, name=f"gradient of {name}")
    t_bufs = dict(theirs.named_buffers())
    for name, b in ours.named_buffers():
        assert_close(b, t_bufs[name], rtol, name=f"buffer {name}")
    return ours, theirs


def randn(*shape, seed=1):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


LAYERS = [
    ("linear", lambda n: n.Linear(5, 3), [(4, 5)]),
    ("linear_nobias_3d", lambda n: n.Linear(5, 3, bias=False), [(2, 3, 5)]),
    ("conv", lambda n: n.Conv2d(3, 4, 3), [(2, 3, 7, 6)]),
    ("conv_strided_grouped", lambda n: n.Conv2d(4, 6, (3, 2), stride=2, padding=1, dilation=(1, 2), groups=2),
     [(2, 4, 9, 8)]),
    pytest.param("conv_same_nobias", lambda n: n.Conv2d(2, 3, 4, padding="same", bias=False), [(1, 2, 5, 6)],
                 marks=pytest.mark.filterwarnings("ignore:Using padding='same'")),
    ("conv_reflect", lambda n: n.Conv2d(2, 2, 3, padding=(1, 2), padding_mode="reflect"), [(1, 2, 5, 4)]),
    ("conv_replicate", lambda n: n.Conv2d(2, 2, 3, padding=2, padding_mode="replicate"), [(1, 2, 4, 3)]),
    ("conv_circular_same", lambda n: n.Conv2d(2, 2, (2, 3), padding="same", padding_mode="circular"),
     [(1, 2, 4, 3)]),
    ("maxpool", lambda n: n.MaxPool2d(2), [(2, 3, 6, 6)]),
    ("maxpool_pad", lambda n: n.MaxPool2d(3, stride=2, padding=1), [(1, 2, 7, 5)]),
    ("avgpool", lambda n: n.AvgPool2d(2), [(2, 3, 6, 4)]),
    ("avgpool_pad", lambda n: n.AvgPool2d(3, 2, 1, count_include_pad=False), [(1, 2, 7, 6)]),
    ("adaptive", lambda n: n.AdaptiveAvgPool2d((2, 3)), [(2, 3, 7, 8)]),
    ("adaptive_1", lambda n: n.AdaptiveAvgPool2d(1), [(2, 3, 5, 4)]),
    ("relu", lambda n: n.ReLU(), [(3, 5)]),
    ("leaky", lambda n: n.LeakyReLU(0.2), [(3, 5)]),
    ("gelu", lambda n: n.GELU(), [(3, 5)]),
    ("gelu_tanh", lambda n: n.GELU(approximate="tanh"), [(3, 5)]),
    ("silu", lambda n: n.SiLU(), [(3, 5)]),
    ("sigmoid", lambda n: n.Sigmoid(), [(3, 5)]),
    ("tanh", lambda n: n.Tanh(), [(3, 5)]),
    ("softmax", lambda n: n.Softmax(dim=1), [(3, 5)]),
    ("log_softmax", lambda n: n.LogSoftmax(dim=-1), [(2, 3, 4)]),
    ("flatten", lambda n: n.Flatten(), [(2, 3, 4)]),
    ("flatten_0_1", lambda n: n.Flatten(0, 1), [(2, 3, 4)]),
    ("unflatten", lambda n: n.Unflatten(1, (2, 3)), [(4, 6)]),
    ("identity", lambda n: n.Identity(3, unused=True), [(2, 3)]),
    ("dropout_p0", lambda n: n.Dropout(0.0), [(4, 3)]),
    ("bn1d", lambda n: n.BatchNorm1d(4), [(6, 4)]),
    ("bn1d_3d", lambda n: n.BatchNorm1d(4, momentum=0.3), [(3, 4, 5)]),
    ("bn2d", lambda n: n.BatchNorm2d(3), [(4, 3, 5, 5)]),
    ("bn2d_noaffine", lambda n: n.BatchNorm2d(3, affine=False, eps=1e-3), [(2, 3, 4, 5)]),
    ("bn2d_nostats", lambda n: n.BatchNorm2d(3, track_running_stats=False), [(2, 3, 4, 5)]),
    ("sequential", lambda n: n.Sequential(n.Conv2d(2, 3, 3, padding=1), n.BatchNorm2d(3), n.ReLU(),
                                          n.MaxPool2d(2), n.Flatten(), n.Linear(12, 4)), [(2, 2, 4, 4)]),
    ("layernorm", lambda n: n.LayerNorm(5), [(3, 5)]),
    ("layernorm_2d_nobias", lambda n: n.LayerNorm((3, 4), eps=1e-3, bias=False), [(2, 3, 4)]),
    ("layernorm_noaffine", lambda n: n.LayerNorm([4], elementwise_affine=False), [(2, 3, 4)]),
    ("elu", lambda n: n.ELU(0.5), [(3, 5)]),
    ("hardswish", lambda n: n.Hardswish(), [(3, 5)]),
    ("leaky_default", lambda n: n.LeakyReLU(), [(3, 5)]),
    ("adaptive_max", lambda n: n.AdaptiveMaxPool2d((2, 3)), [(2, 3, 7, 8)]),
    ("adaptive_max_none", lambda n: n.AdaptiveMaxPool2d((None, 2)), [(2, 3, 5, 7)]),
    ("maxpool1d", lambda n: n.MaxPool1d(3, stride=2, padding=1), [(2, 3, 9)]),
    ("avgpool1d", lambda n: n.AvgPool1d(3, 2, 1, count_include_pad=False), [(2, 3, 9)]),
    ("avgpool1d_default", lambda n: n.AvgPool1d(2), [(2, 3, 8)]),
    ("dropout1d_p0", lambda n: n.Dropout1d(0.0), [(2, 3, 4)]),
    ("dropout2d_p0", lambda n: n.Dropout2d(0.0), [(2, 3, 4, 4)]),
    ("mlp_layernorm_gelu", lambda n: n.Sequential(n.Linear(6, 8), n.LayerNorm(8), n.GELU(), n.Dropout(0.0),
                                                  n.Linear(8, 3)), [(4, 6)]),
]


@pytest.mark.parametrize("name, build, shapes", LAYERS)
def test_layer_matches_torch(name, build, shapes, device):
    run_pair(build, [randn(*s, seed=i + 1) for i, s in enumerate(shapes)], device)


def test_layer_reprs_equal_torch(torch_repr):
    for case in LAYERS:
        build = case.values[1] if hasattr(case, "values") else case[1]
        assert torch_repr(build(nn)) == repr(build(torch.nn))


@pytest.mark.parametrize("cls, shape", [("BatchNorm1d", (6, 4)), ("BatchNorm2d", (2, 4, 3, 5))])
def test_batchnorm_scale_without_shift_matches_torch(cls, shape, device):
    if "bias" not in inspect.signature(torch.nn.BatchNorm1d).parameters:
        pytest.skip("this torch's BatchNorm has no bias keyword")
    def build(n):
        return getattr(n, cls)(4, bias=False)
    assert build(nn).bias is None and list(build(nn).state_dict()) == list(build(torch.nn).state_dict())
    assert repr(build(nn)) == repr(build(torch.nn))
    run_pair(build, [randn(*shape, seed=3)], device)


EVAL_LAYERS = [
    ("dropout_eval", lambda n: n.Dropout(0.5), [(4, 3)]),
    ("bn1d_eval", lambda n: n.BatchNorm1d(4), [(6, 4)]),
    ("bn2d_eval_nostats", lambda n: n.BatchNorm2d(3, track_running_stats=False), [(2, 3, 4, 5)]),
    ("dropout1d_eval", lambda n: n.Dropout1d(0.3), [(2, 3, 4)]),
    ("dropout2d_eval", lambda n: n.Dropout2d(0.5, inplace=True), [(2, 3, 4, 4)]),
]


@pytest.mark.parametrize("name, build, shapes", EVAL_LAYERS, ids=[c[0] for c in EVAL_LAYERS])
def test_layer_in_eval_matches_torch(name, build, shapes, device):
    run_pair(build, [randn(*s) for s in shapes], device, train=False)


def _targets(n_classes, shape, seed=3, ignore=None):
    t = np.random.default_rng(seed).integers(0, n_classes, shape).astype(np.int64)
    if ignore is not None:
        t.reshape(-1)[::3] = ignore
    return t


W4 = np.array([0.5, 1.0, 2.0, 0.25], dtype=np.float32)
PROBS = 1 / (1 + np.exp(-randn(3, 4, seed=5)))
TARGETS = np.random.default_rng(6).random((3, 4)).astype(np.float32)
LOG_PROBS = randn(3, 4, seed=7) - np.log(np.exp(randn(3, 4, seed=7)).sum(1, keepdims=True))
LOSSES = [
    ("ce", lambda n: n.CrossEntropyLoss(), [randn(5, 4), _targets(4, (5,))]),
    ("ce_weight_ignore", lambda n: n.CrossEntropyLoss(weight=T(n).tensor(W4), ignore_index=1),
     [randn(6, 4), _targets(4, (6,), ignore=1)]),
    ("ce_smooth_sum", lambda n: n.CrossEntropyLoss(label_smoothing=0.1, reduction="sum"),
     [randn(5, 4), _targets(4, (5,))]),
    ("ce_none", lambda n: n.CrossEntropyLoss(reduction="none"), [randn(5, 4), _targets(4, (5,))]),
    ("ce_spatial", lambda n: n.CrossEntropyLoss(), [randn(2, 4, 3, 2), _targets(4, (2, 3, 2))]),
    ("nll", lambda n: n.NLLLoss(), [randn(5, 4), _targets(4, (5,))]),
    ("nll_weight", lambda n: n.NLLLoss(weight=T(n).tensor(W4), ignore_index=0, reduction="sum"),
     [randn(6, 4), _targets(4, (6,), ignore=0)]),
    ("mse", lambda n: n.MSELoss(), [randn(3, 4), randn(3, 4, seed=9)]),
    ("mse_sum", lambda n: n.MSELoss(reduction="sum"), [randn(3, 4), randn(3, 4, seed=9)]),
    ("l1", lambda n: n.L1Loss(), [randn(3, 4), randn(3, 4, seed=9)]),
    ("l1_none", lambda n: n.L1Loss(reduction="none"), [randn(3, 4), randn(3, 4, seed=9)]),
    pytest.param("l1_legacy_reduce", lambda n: n.L1Loss(size_average=False), [randn(3, 4), randn(3, 4, seed=9)],
                 marks=pytest.mark.filterwarnings("ignore:size_average and reduce args")),
    ("bce", lambda n: n.BCELoss(), [PROBS, TARGETS]),
    ("bce_weight_sum", lambda n: n.BCELoss(weight=T(n).tensor(W4), reduction="sum"), [PROBS, TARGETS]),
    ("bce_logits", lambda n: n.BCEWithLogitsLoss(), [randn(3, 4), TARGETS]),
    ("bce_logits_weights", lambda n: n.BCEWithLogitsLoss(weight=T(n).tensor(W4), reduction="none",
                                                         pos_weight=T(n).tensor(W4[::-1].copy())),
     [randn(3, 4), TARGETS]),
    ("smooth_l1", lambda n: n.SmoothL1Loss(), [randn(3, 4), randn(3, 4, seed=9)]),
    ("smooth_l1_beta", lambda n: n.SmoothL1Loss(reduction="sum", beta=0.5), [randn(3, 4), randn(3, 4, seed=9)]),
    ("huber", lambda n: n.HuberLoss(), [randn(3, 4), randn(3, 4, seed=9)]),
    ("huber_delta", lambda n: n.HuberLoss(reduction="none", delta=0.3), [randn(3, 4), randn(3, 4, seed=9)]),
    ("kldiv_batchmean", lambda n: n.KLDivLoss(reduction="batchmean"), [LOG_PROBS, PROBS]),
    ("kldiv_log_target", lambda n: n.KLDivLoss(reduction="sum", log_target=True), [LOG_PROBS, LOG_PROBS[::-1].copy()]),
]


@pytest.mark.parametrize("name, build, inputs", LOSSES)
def test_loss_matches_torch(name, build, inputs, device):
    ours, _ = run_pair(build, inputs, device)
    assert ours.reduction == build(torch.nn).reduction
    assert repr(ours) == repr(build(torch.nn))


@pytest.mark.parametrize("build", [
    lambda n: n.Embedding(10, 3),
    lambda n: n.Embedding(10, 3, padding_idx=-2),
    lambda n: n.Embedding(10, 3, max_norm=1.0, norm_type=1.0, scale_grad_by_freq=True),
    lambda n: n.ELU(alpha=0.3, inplace=True),
    lambda n: n.Hardswish(inplace=True),
    lambda n: n.Dropout1d(0.25, inplace=True),
    lambda n: n.MaxPool1d(2, return_indices=True, ceil_mode=True, dilation=2),
    lambda n: n.AvgPool1d((3,), ceil_mode=True),
    lambda n: n.AdaptiveMaxPool2d(4, return_indices=True),
    lambda n: n.LayerNorm((2, 3), elementwise_affine=False, bias=False),
    lambda n: n.KLDivLoss(log_target=True),
])
def test_more_reprs_equal_torch(build):
    assert repr(build(nn)) == repr(build(torch.nn))


EMBEDDINGS = [
    ("plain", lambda n: n.Embedding(6, 4), {}),
    ("padding", lambda n: n.Embedding(6, 4, padding_idx=2), {}),
    ("freq_max_norm", lambda n: n.Embedding(6, 4, max_norm=1.5, scale_grad_by_freq=True), {}),
]


@pytest.mark.parametrize("name, build, kw", EMBEDDINGS, ids=[e[0] for e in EMBEDDINGS])
def test_embedding_matches_torch(name, build, kw, device):
    idx = np.array([[0, 2, 5, 2], [2, 2, 1, 0]])
    ours, theirs = run_pair(build, [idx], device)
    assert_close(ours.weight, theirs.weight, name="weight after max_norm")


def test_embedding_init_and_from_pretrained():
    st.manual_seed(0)
    w = nn.Embedding(2000, 50, padding_idx=3).weight.detach().numpy()
    assert not w[3].any() and abs(w.std() - 1) < 0.02 and abs(w.mean()) < 0.02   # N(0, 1), the padding row zero
    pre = st.tensor(randn(4, 3))
    frozen = nn.Embedding.from_pretrained(pre)
    assert not frozen.weight.requires_grad and np.array_equal(frozen.weight.detach().numpy(), pre.numpy())
    assert nn.Embedding.from_pretrained(pre, freeze=False, padding_idx=1).weight.requires_grad


def test_dropout2d_module_zeroes_whole_channels():
    m = nn.Dropout2d(0.5)
    x = st.ones(20, 30, 3, 3, requires_grad=True)
    a = m(x).detach().numpy()
    assert (a == a[:, :, :1, :1]).all() and 0.3 < (a[:, :, 0, 0] == 0).mean() < 0.7
    m.eval()
    assert m(x) is x


# ---- constructor and input errors: same exception type (and message where torch's is deterministic) ----------
CTOR_ERRORS = [
    (lambda n: n.Conv2d(3, 16, 3, groups=2), ValueError, "in_channels must be divisible by groups"),
    (lambda n: n.Conv2d(4, 6, 3, groups=4), ValueError, "out_channels must be divisible by groups"),
    (lambda n: n.Conv2d(3, 6, 3, groups=0), ValueError, "groups must be a positive integer"),
    (lambda n: n.Conv2d(3, 6, 3, padding="full"), ValueError, "Invalid padding string 'full', should be one of"),
    (lambda n: n.Conv2d(3, 6, 3, stride=2, padding="same"), ValueError,
     "padding='same' is not supported for strided convolutions"),
    (lambda n: n.Conv2d(3, 6, 3, padding_mode="bogus"), ValueError, "padding_mode must be one of"),
    (lambda n: n.Conv2d(3, -1, 3), RuntimeError,
     r"Trying to create tensor with negative dimension -1: \[-1, 3, 3, 3\]"),
    (lambda n: n.Linear(-2, 3), RuntimeError, r"Trying to create tensor with negative dimension -2: \[3, -2\]"),
    (lambda n: n.BatchNorm2d(-1), RuntimeError, "negative dimension -1"),
    (lambda n: n.Dropout(1.5), ValueError, "dropout probability has to be between 0 and 1, but got 1.5"),
    (lambda n: n.Dropout(-0.1), ValueError, "dropout probability has to be between 0 and 1, but got -0.1"),
    (lambda n: n.Unflatten(1, 6), TypeError, "unflattened_size must be a tuple of ints, but found type int"),
    (lambda n: n.Unflatten(1, (2, 3.0)), TypeError, "found element of type float at pos 1"),
    (lambda n: n.BatchNorm2d(3)(T(n).zeros(2, 3, 4)), ValueError, r"expected 4D input \(got 3D input\)"),
    (lambda n: n.BatchNorm1d(3)(T(n).zeros(2, 3, 4, 4)), ValueError, r"expected 2D or 3D input \(got 4D input\)"),
    (lambda n: n.Sequential(n.ReLU())[1], IndexError, "index 1 is out of range"),
    (lambda n: n.Dropout2d(1.5), ValueError, "dropout probability has to be between 0 and 1, but got 1.5"),
    (lambda n: n.Dropout1d(-0.5), ValueError, "dropout probability has to be between 0 and 1, but got -0.5"),
    (lambda n: n.Dropout1d()(T(n).zeros(2, 3, 4, 5)), RuntimeError, "Expected 2D or 3D input"),
    (lambda n: n.Embedding(5, 3, padding_idx=5), AssertionError, "Padding_idx must be within num_embeddings"),
    (lambda n: n.Embedding(5, 3, padding_idx=-6), AssertionError, "Padding_idx must be within num_embeddings"),
    (lambda n: n.Embedding(5, 3, _weight=T(n).zeros(4, 3)), AssertionError, "Shape of weight does not match"),
    (lambda n: n.Embedding.from_pretrained(T(n).zeros(4)), AssertionError, "expected to be 2-dimensional"),
    (lambda n: n.Embedding(5, 3)(T(n).tensor([5])), IndexError, "index out of range in self"),
    (lambda n: n.LayerNorm(4)(T(n).zeros(2, 5)), RuntimeError, r"normalized_shape=\[4\]"),
    (lambda n: n.SmoothL1Loss(beta=-1.0)(T(n).zeros(2), T(n).zeros(2)), RuntimeError, "negative values for beta"),
    (lambda n: n.HuberLoss(delta=-1.0)(T(n).zeros(2), T(n).zeros(2)), RuntimeError, "non-positive values for delta"),
    (lambda n: n.BCELoss()(T(n).zeros(2), T(n).zeros(3)), ValueError, "different to the input size"),
    (lambda n: n.BCEWithLogitsLoss()(T(n).zeros(2), T(n).zeros(3)), ValueError, r"Target size .* must be the same"),
    (lambda n: n.AdaptiveMaxPool2d(2)(T(n).zeros(2, 2)), RuntimeError, "Expected 3D or 4D tensor"),
    (lambda n: n.Conv2d(1, 1, 3, padding=3, padding_mode="reflect")(T(n).zeros(1, 1, 3, 3)), RuntimeError,
     "Padding size should be less than the corresponding input dimension"),
]


@pytest.mark.parametrize("fn, exc, pattern", CTOR_ERRORS)
def test_errors_match_torch(fn, exc, pattern):
    with pytest.raises(exc, match=pattern):
        fn(torch.nn)
    with pytest.raises(exc, match=pattern):
        fn(nn)


# ---- default initialization follows torch's formulas ----------------------------------------------------------
@pytest.mark.parametrize("build, fan_in", [(lambda n: n.Linear(400, 300), 400),
                                           (lambda n: n.Conv2d(16, 64, 5), 16 * 25),
                                           (lambda n: n.Conv2d(16, 64, 3, groups=4), 4 * 9)])
def test_default_init_statistics(build, fan_in):
    bound = 1 / math.sqrt(fan_in)  # kaiming_uniform(a=sqrt(5)): sqrt(3) * sqrt(2 / (1 + 5)) / sqrt(fan_in)
    for m in (build(nn), build(torch.nn)):
        w = m.weight.detach().numpy()
        assert np.abs(w).max() <= bound and np.abs(w).max() > 0.99 * bound
        assert abs(w.std() / (bound / math.sqrt(3)) - 1) < 0.05 and abs(w.mean()) < 0.05 * bound
        b = m.bias.detach().numpy()
        assert np.abs(b).max() <= bound


def test_init_is_reproducible_with_manual_seed():
    st.manual_seed(7)
    a = nn.Linear(4, 3).weight.array.copy()
    st.manual_seed(7)
    assert np.array_equal(nn.Linear(4, 3).weight.array, a)


# ---- BatchNorm running statistics -----------------------------------------------------------------------------
@pytest.mark.parametrize("momentum", [0.1, None, 0.5])
@pytest.mark.parametrize("dims", [2, 4])
def test_batchnorm_running_stats_after_three_steps(momentum, dims, device):
    def build(n):
        return (n.BatchNorm2d if dims == 4 else n.BatchNorm1d)(3, momentum=momentum)
    ours, theirs = build(nn).to(device), build(torch.nn)
    shape = (4, 3, 3, 2) if dims == 4 else (5, 3)
    for step in range(3):
        x = randn(*shape, seed=step) * (step + 1) + step
        ours(st.tensor(x, device=device))
        theirs(torch.tensor(x))
    assert int(ours.num_batches_tracked.item()) == int(theirs.num_batches_tracked) == 3
    assert ours.num_batches_tracked.dtype == st.int64
    assert_close(ours.running_mean, theirs.running_mean)
    assert_close(ours.running_var, theirs.running_var)
    ours.eval(), theirs.eval()
    x = randn(*shape, seed=10)
    with st.no_grad(), torch.no_grad():
        assert_close(ours(st.tensor(x, device=device)), theirs(torch.tensor(x)))
    assert int(ours.num_batches_tracked.item()) == 3  # eval leaves the statistics alone
    ours.reset_running_stats()
    assert int(ours.num_batches_tracked.item()) == 0 and not ours.running_mean.array.any()


# ---- Dropout ----------------------------------------------------------------------------------------------------
def test_dropout_train_statistics_and_eval_identity():
    m = nn.Dropout(0.3)
    x = st.ones(200, 100, requires_grad=True)
    y = m(x)
    a = np.array(y.detach())
    dropped = (a == 0).mean()
    assert abs(dropped - 0.3) < 0.02
    assert np.allclose(a[a != 0], 1 / 0.7)
    y.sum().backward()
    assert np.allclose(np.array(x.grad), a)  # the gradient is the same mask and scale
    m.eval()
    assert m(x) is x or np.array_equal(np.array(m(x).detach()), np.ones((200, 100)))

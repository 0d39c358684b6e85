"""swa_utils against torch.optim.swa_utils: AveragedModel (SWA, EMA by avg_fn and multi_avg_fn, use_buffers) along a
short SGD run of a small batch-norm net, update_bn's recomputed statistics, and SWALR's lr sequence and errors."""
import numpy as np
import pytest
import torch

from _optim_golden import tolerance

import smalltrain
from smalltrain.optim import swa_utils


def _net(lib, device=None):
    nn = lib.nn
    return nn.Sequential(nn.Linear(5, 7), nn.BatchNorm1d(7), nn.ReLU(), nn.Linear(7, 3))


def _pair(device):
    theirs = _net(torch)
    ours = _net(smalltrain)
    ours.load_state_dict({k: smalltrain.tensor(v.numpy().copy()) for k, v in theirs.state_dict().items()})
    return ours.to(device), theirs


def _batches():
    rng = np.random.default_rng(7)
    return [(rng.standard_normal((16, 5)).astype(np.float32), rng.standard_normal((16, 3)).astype(np.float32))
            for _ in range(6)]


def _state(module):
    return {k: (np.asarray(v) if isinstance(v, smalltrain.Tensor) else v.numpy()) for k, v in
            module.state_dict().items()}


def _assert_same_state(ours, theirs, where, device="cpu"):
    a, b = _state(ours), _state(theirs)
    assert a.keys() == b.keys(), where
    for k in a:
        assert a[k].dtype == b[k].dtype, f"{where}: {k}"
        err = float(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)).max()) if a[k].size else 0.0
        assert err <= tolerance(device), f"{where}: {k} differs by {err:.3g}"


AVERAGING = [
    ("swa", lambda su: {}),
    ("swa-use_buffers", lambda su: {"use_buffers": True}),
    ("ema-avg_fn", lambda su: {"avg_fn": su.get_ema_avg_fn(0.9)}),
    ("ema-multi_avg_fn", lambda su: {"multi_avg_fn": su.get_ema_multi_avg_fn(0.8), "use_buffers": True}),
    ("swa-multi_avg_fn", lambda su: {"multi_avg_fn": su.get_swa_multi_avg_fn()}),
]


@pytest.mark.parametrize("name,kwargs", AVERAGING, ids=[a[0] for a in AVERAGING])
def test_averaged_model_matches_torch(name, kwargs, device):
    ours, theirs = _pair(device)
    avg_o = swa_utils.AveragedModel(ours, **kwargs(swa_utils))
    avg_t = torch.optim.swa_utils.AveragedModel(theirs, **kwargs(torch.optim.swa_utils))
    opt_o = smalltrain.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
    opt_t = torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9)
    for i, (x, t) in enumerate(_batches()):
        for lib, model, opt, avg in ((smalltrain, ours, opt_o, avg_o), (torch, theirs, opt_t, avg_t)):
            opt.zero_grad()
            xs = lib.tensor(x) if lib is torch else lib.tensor(x, device=device)
            ts = lib.tensor(t) if lib is torch else lib.tensor(t, device=device)
            ((model(xs) - ts) ** 2).mean().backward()
            opt.step()
            avg.update_parameters(model)
        _assert_same_state(avg_o, avg_t, f"{name} after update {i + 1}", device)
    assert int(avg_o.n_averaged) == int(avg_t.n_averaged) == 6
    x = _batches()[0][0]
    avg_o.eval()
    avg_t.eval()
    out_o = np.asarray(avg_o(smalltrain.tensor(x, device=device)).detach())
    assert np.abs(out_o - avg_t(torch.tensor(x)).detach().numpy()).max() <= 1e-5


def test_update_bn_matches_torch():
    ours, theirs = _pair("cpu")
    batches = _batches()
    loaders = {"torch": [(torch.tensor(x), torch.tensor(t)) for x, t in batches],
               "smalltrain": [smalltrain.tensor(x) for x, _ in batches]}   # items or their first element
    ours.eval()
    theirs.eval()
    swa_utils.update_bn(loaders["smalltrain"], ours)
    torch.optim.swa_utils.update_bn(loaders["torch"], theirs)
    _assert_same_state(ours, theirs, "update_bn")
    assert not ours.training and ours[1].momentum == theirs[1].momentum == 0.1
    assert int(ours[1].num_batches_tracked) == 6


SWALRS = [
    ("cos", {"swa_lr": 0.05}),
    ("linear-list", {"swa_lr": [0.01, 0.2], "anneal_epochs": 4, "anneal_strategy": "linear"}),
    ("no-anneal", {"swa_lr": 0.03, "anneal_epochs": 0}),
]


def _swalr_trace(lib, kwargs, steps=15, resume_at=None):
    def make():
        opt = lib.optim.SGD([{"params": [lib.zeros(2, requires_grad=True)], "lr": lr} for lr in (0.1, 0.02)], lr=0.1)
        return opt, lib.optim.swa_utils.SWALR(opt, **kwargs)
    opt, sched = make()
    trace = [sched.get_last_lr()]
    for i in range(steps):
        if i == resume_at:
            opt_sd, sched_sd = opt.state_dict(), sched.state_dict()
            opt, sched = make()
            opt.load_state_dict(opt_sd)
            sched.load_state_dict(sched_sd)
        opt.step()
        sched.step()
        trace.append(sched.get_last_lr())
    return trace


@pytest.mark.parametrize("name,kwargs", SWALRS, ids=[s[0] for s in SWALRS])
def test_swalr_matches_torch(name, kwargs):
    theirs = _swalr_trace(torch, kwargs)
    for resume_at in (None, 3):
        ours = _swalr_trace(smalltrain, kwargs, resume_at=resume_at)
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert np.abs(np.subtract(a, b)).max() <= 1e-12, f"{name}, resumed at {resume_at}: step {i}"


ERRORS = [
    lambda su, o: su.SWALR(o, swa_lr=0.1, anneal_strategy="exp"),
    lambda su, o: su.SWALR(o, swa_lr=0.1, anneal_epochs=-1),
    lambda su, o: su.SWALR(o, swa_lr=[0.1, 0.2]),
    lambda su, o: su.get_ema_avg_fn(1.5),
    lambda su, o: su.get_ema_multi_avg_fn(-0.1),
]


@pytest.mark.parametrize("case", range(len(ERRORS)))
def test_errors_match_torch(case):
    with pytest.raises(Exception) as theirs:
        ERRORS[case](torch.optim.swa_utils, torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1))
    with pytest.raises(type(theirs.value)) as ours:
        ERRORS[case](swa_utils, smalltrain.optim.SGD([smalltrain.zeros(2, requires_grad=True)], lr=0.1))
    assert str(ours.value) == str(theirs.value)

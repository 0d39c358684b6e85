"""Learning-rate schedulers against torch.optim.lr_scheduler: lr (and momentum/betas) sequences over 100 steps to
1e-12, state_dict round trips mid-way, ReduceLROnPlateau on a fixed metric sequence, and errors/warnings."""
import warnings

import numpy as np
import pytest
import torch

import smalltrain
from smalltrain import optim

STEPS = 100
TOL = 1e-12


class Halve:
    """A callable object: LambdaLR's state_dict keeps its attributes (functions and lambdas are skipped)."""

    def __init__(self):
        self.every = 25

    def __call__(self, epoch):
        return 0.5 ** (epoch // self.every)


def _optimizer(lib, kind, lrs=(0.1, 0.02)):
    groups = [{"params": [lib.zeros(2, requires_grad=True)], "lr": lr} for lr in lrs]
    if kind == "sgd":
        return lib.optim.SGD(groups, lr=0.1, momentum=0.9)
    if kind == "adagrad":  # neither momentum nor betas
        return lib.optim.Adagrad(groups)
    return lib.optim.Adam(groups, lr=1e-3)


def _hyper(opt):
    """What a schedule moves: each group's lr, momentum (SGD) and beta1 (Adam)."""
    return [(g["lr"], g.get("momentum"), g.get("betas", (None,))[0]) for g in opt.param_groups]


def _assert_same(ours, theirs, where):
    assert len(ours) == len(theirs), where
    for a, b in zip(ours, theirs):
        for x, y in zip(a, b):
            assert (x is None) == (y is None), where
            if x is not None:
                assert abs(float(x) - float(y)) <= TOL, f"{where}: ours {x!r}, torch {y!r}"


def _run(lib, make, kind, steps, metrics=None, resume_at=None):
    """Hyperparameters after construction and after each step; with resume_at, the run continues from a fresh
    optimizer and scheduler that loaded both state_dicts (scheduler built first, as torch's docs ask)."""
    S = lib.optim.lr_scheduler
    opt = _optimizer(lib, kind)
    sched = make(S, opt)
    trace = [(_hyper(opt), list(sched.get_last_lr()))]
    for i in range(steps):
        if i == resume_at:
            opt_sd, sched_sd = opt.state_dict(), sched.state_dict()
            opt = _optimizer(lib, kind, lrs=(7.0, 7.0))
            sched = make(S, opt)
            opt.load_state_dict(opt_sd)
            sched.load_state_dict(sched_sd)
        opt.step()
        if metrics is None:
            sched.step()
        else:
            sched.step(metrics[i])
        trace.append((_hyper(opt), list(sched.get_last_lr())))
    return trace


def _cosine_warmup(S, o):
    return S.SequentialLR(o, [S.LinearLR(o, start_factor=0.1, total_iters=20), S.CosineAnnealingLR(o, T_max=80)],
                          milestones=[20])


SCHEDULES = [
    ("StepLR", "sgd", lambda S, o: S.StepLR(o, step_size=7, gamma=0.5)),
    ("MultiStepLR", "sgd", lambda S, o: S.MultiStepLR(o, milestones=[10, 30, 30, 70], gamma=0.3)),
    ("ExponentialLR", "adam", lambda S, o: S.ExponentialLR(o, gamma=0.95)),
    ("CosineAnnealingLR", "sgd", lambda S, o: S.CosineAnnealingLR(o, T_max=100)),
    ("CosineAnnealingLR-restart", "sgd", lambda S, o: S.CosineAnnealingLR(o, T_max=30, eta_min=1e-3)),
    ("LinearLR", "sgd", lambda S, o: S.LinearLR(o, start_factor=0.2, end_factor=0.9, total_iters=40)),
    ("LambdaLR", "sgd", lambda S, o: S.LambdaLR(o, lambda e: 0.97 ** e)),
    ("LambdaLR-list", "adam", lambda S, o: S.LambdaLR(o, [lambda e: 1.0 / (1 + e), Halve()])),
    ("MultiplicativeLR", "sgd", lambda S, o: S.MultiplicativeLR(o, lambda e: 0.99)),
    ("ConstantLR", "sgd", lambda S, o: S.ConstantLR(o, factor=0.25, total_iters=12)),
    ("PolynomialLR", "sgd", lambda S, o: S.PolynomialLR(o, total_iters=60, power=2.0)),
    ("OneCycleLR-cos-momentum", "sgd", lambda S, o: S.OneCycleLR(o, max_lr=[0.5, 0.1], total_steps=100)),
    ("OneCycleLR-betas", "adam", lambda S, o: S.OneCycleLR(o, max_lr=0.01, epochs=10, steps_per_epoch=10,
                                                           pct_start=0.25, div_factor=10.0, final_div_factor=100.0,
                                                           base_momentum=0.8, max_momentum=0.9)),
    ("OneCycleLR-linear-3phase", "sgd", lambda S, o: S.OneCycleLR(o, max_lr=0.3, total_steps=120,
                                                                  anneal_strategy="linear", three_phase=True)),
    ("OneCycleLR-no-momentum", "adam", lambda S, o: S.OneCycleLR(o, max_lr=0.01, total_steps=100,
                                                                 cycle_momentum=False)),
    ("SequentialLR", "sgd", _cosine_warmup),
    ("SequentialLR-3", "adam", lambda S, o: S.SequentialLR(
        o, [S.ConstantLR(o, factor=0.5, total_iters=10), S.ExponentialLR(o, gamma=0.9),
            S.StepLR(o, step_size=5, gamma=0.7)], milestones=[10, 50])),
    ("ChainedScheduler", "sgd", lambda S, o: S.ChainedScheduler([S.ConstantLR(o, factor=0.5, total_iters=5),
                                                                 S.ExponentialLR(o, gamma=0.97)])),
    # the cosine recurrence scales the current lr, so composed with another schedule it departs from the closed form
    ("ChainedScheduler-cosine", "adam", lambda S, o: S.ChainedScheduler([S.CosineAnnealingLR(o, T_max=40),
                                                                         S.ExponentialLR(o, gamma=0.98)])),
    ("CosineAnnealingWarmRestarts", "sgd", lambda S, o: S.CosineAnnealingWarmRestarts(o, T_0=15)),
    ("CosineAnnealingWarmRestarts-mult", "adam", lambda S, o: S.CosineAnnealingWarmRestarts(o, T_0=5, T_mult=2,
                                                                                            eta_min=1e-4)),
    ("CyclicLR-triangular", "sgd", lambda S, o: S.CyclicLR(o, base_lr=0.01, max_lr=[0.1, 0.05], step_size_up=8)),
    ("CyclicLR-triangular2", "adam", lambda S, o: S.CyclicLR(o, base_lr=[1e-4, 1e-3], max_lr=1e-2, step_size_up=6,
                                                             step_size_down=10, mode="triangular2",
                                                             base_momentum=0.7, max_momentum=0.95)),
    ("CyclicLR-exp_range", "sgd", lambda S, o: S.CyclicLR(o, base_lr=0.01, max_lr=0.2, step_size_up=12,
                                                          mode="exp_range", gamma=0.98)),
    ("CyclicLR-scale_fn", "adam", lambda S, o: S.CyclicLR(o, base_lr=1e-3, max_lr=1e-2, step_size_up=5,
                                                          scale_fn=Halve(), scale_mode="iterations",
                                                          cycle_momentum=False)),
    ("SequentialLR-warm-restarts", "sgd", lambda S, o: S.SequentialLR(
        o, [S.LinearLR(o, start_factor=0.1, total_iters=10), S.CosineAnnealingWarmRestarts(o, T_0=20)],
        milestones=[10])),
]


@pytest.mark.parametrize("name,kind,make", SCHEDULES, ids=[s[0] for s in SCHEDULES])
def test_sequence_matches_torch(name, kind, make):
    with warnings.catch_warnings(record=True) as ours_warned:
        warnings.simplefilter("always")
        ours = _run(smalltrain, make, kind, STEPS)
    with warnings.catch_warnings(record=True) as torch_warned:
        warnings.simplefilter("always")
        theirs = _run(torch, make, kind, STEPS)
    # the usual order (optimizer.step(), then scheduler.step()) warns as often as torch's: not at all
    assert [str(w.message)[:40] for w in ours_warned] == [str(w.message)[:40] for w in torch_warned] == []
    for i, ((oh, olr), (th, tlr)) in enumerate(zip(ours, theirs)):
        _assert_same(oh, th, f"{name}: groups after step {i}")
        _assert_same([olr], [tlr], f"{name}: get_last_lr() after step {i}")


@pytest.mark.parametrize("name,kind,make", SCHEDULES, ids=[s[0] for s in SCHEDULES])
def test_state_dict_round_trip_matches_torch(name, kind, make):
    ours, theirs = _run(smalltrain, make, kind, STEPS, resume_at=50), _run(torch, make, kind, STEPS)
    for i, ((oh, olr), (th, tlr)) in enumerate(zip(ours, theirs)):
        _assert_same(oh, th, f"{name} resumed at 50: groups after step {i}")
        _assert_same([olr], [tlr], f"{name} resumed at 50: get_last_lr() after step {i}")


def _metrics():
    rng = np.random.default_rng(3)
    m = np.concatenate([np.linspace(1.0, 0.5, 20), np.full(15, 0.5), 0.5 + 1e-5 * rng.standard_normal(25),
                        np.linspace(0.5, 0.2, 10), np.full(30, 0.2)])
    return m + np.where(rng.random(STEPS) < 0.1, 0.05, 0.0)


PLATEAUS = [
    ("min-rel", {}),
    ("min-abs-cooldown", {"patience": 3, "threshold": 1e-3, "threshold_mode": "abs", "cooldown": 4, "factor": 0.5}),
    ("max-rel", {"mode": "max", "patience": 2, "factor": 0.7}),
    ("max-abs-min_lr-list", {"mode": "max", "threshold_mode": "abs", "patience": 1, "min_lr": [0.05, 1e-3],
                             "factor": 0.2}),
    ("eps", {"patience": 0, "factor": 0.5, "eps": 1e-3}),
    ("zero-threshold", {"threshold": 0.0, "patience": 4}),  # an equal metric is not an improvement
]


@pytest.mark.parametrize("name,kwargs", PLATEAUS, ids=[p[0] for p in PLATEAUS])
@pytest.mark.parametrize("resume_at", [None, 40])
def test_reduce_on_plateau_matches_torch(name, kwargs, resume_at):
    m = _metrics()

    def make(S, o):
        return S.ReduceLROnPlateau(o, **kwargs)
    ours = _run(smalltrain, make, "sgd", STEPS, metrics=list(m), resume_at=resume_at)
    theirs = _run(torch, make, "sgd", STEPS, metrics=[float(v) for v in m])
    assert ours[-1][0] != ours[0][0]  # the lr did change: the case tests a reduction
    for i, ((oh, olr), (th, tlr)) in enumerate(zip(ours, theirs)):
        _assert_same(oh, th, f"{name}: groups after step {i}")
        _assert_same([olr], [tlr], f"{name}: get_last_lr() after step {i}")


def test_initial_lr_and_base_lrs_like_torch():
    for lib in (torch, smalltrain):
        opt = _optimizer(lib, "sgd")
        sched = lib.optim.lr_scheduler.StepLR(opt, step_size=3)
        assert [g["initial_lr"] for g in opt.param_groups] == [0.1, 0.02]
        assert sched.base_lrs == [0.1, 0.02] and sched.last_epoch == 0
        assert "optimizer" not in sched.state_dict()


def test_lambda_state_dict_skips_functions_like_torch():
    sd = {}
    for lib in (torch, smalltrain):
        opt = _optimizer(lib, "sgd")
        fn = Halve()
        sched = lib.optim.lr_scheduler.LambdaLR(opt, [lambda e: 1.0, fn])
        sd[lib.__name__] = sched.state_dict()["lr_lambdas"]
        fn.every = 3
        other = Halve()
        sched2 = lib.optim.lr_scheduler.LambdaLR(opt, [lambda e: 1.0, other])
        sched2.load_state_dict(sched.state_dict())
        assert other.every == 3
    assert sd["torch"] == sd["smalltrain"] == [None, {"every": 25}]


ERRORS = [  # (make(S, opt), kind) -> the same exception type and message as torch
    (lambda S, o: S.OneCycleLR(o, max_lr=0.1), "sgd"),
    (lambda S, o: S.OneCycleLR(o, max_lr=0.1, total_steps=0), "sgd"),
    (lambda S, o: S.OneCycleLR(o, max_lr=0.1, epochs=2, steps_per_epoch=0), "sgd"),
    (lambda S, o: S.OneCycleLR(o, max_lr=0.1, total_steps=10, pct_start=1.5), "sgd"),
    (lambda S, o: S.OneCycleLR(o, max_lr=0.1, total_steps=10, anneal_strategy="cosine"), "sgd"),
    (lambda S, o: S.OneCycleLR(o, max_lr=[0.1, 0.2, 0.3], total_steps=10), "sgd"),
    (lambda S, o: S.LinearLR(o, start_factor=0.0), "sgd"),
    (lambda S, o: S.LinearLR(o, end_factor=1.5), "sgd"),
    (lambda S, o: S.ConstantLR(o, factor=2.0), "sgd"),
    (lambda S, o: S.LambdaLR(o, [lambda e: 1.0]), "sgd"),
    (lambda S, o: S.MultiplicativeLR(o, 0.5), "sgd"),
    (lambda S, o: S.ReduceLROnPlateau(o, factor=1.0), "sgd"),
    (lambda S, o: S.ReduceLROnPlateau(o, mode="avg"), "sgd"),
    (lambda S, o: S.ReduceLROnPlateau(o, threshold_mode="pct"), "sgd"),
    (lambda S, o: S.ReduceLROnPlateau(o, min_lr=[0.1]), "sgd"),
    (lambda S, o: S.SequentialLR(o, [S.ExponentialLR(o, 0.9)], milestones=[5]), "sgd"),
    (lambda S, o: S.SequentialLR(o, [S.ReduceLROnPlateau(o), S.ExponentialLR(o, 0.9)], milestones=[5]), "sgd"),
    (lambda S, o: S.SequentialLR(o, [], milestones=[]), "sgd"),
    (lambda S, o: S.StepLR(o, step_size=2, last_epoch=5), "sgd"),
    (lambda S, o: S.StepLR(None, step_size=2), "sgd"),
    (lambda S, o: S.CosineAnnealingWarmRestarts(o, T_0=0), "sgd"),
    (lambda S, o: S.CosineAnnealingWarmRestarts(o, T_0=2.5), "sgd"),
    (lambda S, o: S.CosineAnnealingWarmRestarts(o, T_0=5, T_mult=0), "sgd"),
    (lambda S, o: S.CosineAnnealingWarmRestarts(o, T_0=5, eta_min="0"), "sgd"),
    (lambda S, o: S.CosineAnnealingWarmRestarts(o, T_0=5).step(-1), "sgd"),
    (lambda S, o: S.CyclicLR(o, base_lr=0.01, max_lr=0.1, mode="cosine"), "sgd"),
    (lambda S, o: S.CyclicLR(o, base_lr=0.01, max_lr=0.1), "adagrad"),
    (lambda S, o: S.CyclicLR(o, base_lr=[0.01], max_lr=0.1), "sgd"),
    (lambda S, o: S.OneCycleLR(o, max_lr=0.1, total_steps=10), "adagrad"),
]


@pytest.mark.parametrize("case", range(len(ERRORS)))
def test_errors_match_torch(case):
    make, kind = ERRORS[case]
    with pytest.raises(Exception) as theirs:
        make(torch.optim.lr_scheduler, _optimizer(torch, kind))
    with pytest.raises(type(theirs.value)) as ours:
        make(optim.lr_scheduler, _optimizer(smalltrain, kind))
    if not isinstance(theirs.value, KeyError):  # torch's KeyError carries a long how-to; ours names the group
        assert str(ours.value) == str(theirs.value)


def test_one_cycle_past_total_steps_raises_like_torch():
    for lib in (torch, smalltrain):
        opt = _optimizer(lib, "sgd")
        sched = lib.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=3)
        for _ in range(3):
            opt.step()
            sched.step()
        with pytest.raises(ValueError, match="Tried to step 4 times. The specified number of total steps is 3"):
            sched.step()


def test_warnings_like_torch():
    for lib in (torch, smalltrain):
        opt = _optimizer(lib, "sgd")
        sched = lib.optim.lr_scheduler.StepLR(opt, step_size=2)
        with pytest.warns(UserWarning, match=r"lr_scheduler.step\(\)` before `optimizer.step\(\)"):
            sched.step()
        with pytest.warns(UserWarning, match=r"please use `get_last_lr\(\)`"):
            sched.get_lr()
        opt2 = _optimizer(lib, "sgd")
        sched2 = lib.optim.lr_scheduler.ExponentialLR(opt2, gamma=0.5)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            opt2.step()
            sched2.step()
        with pytest.warns(UserWarning, match="epoch parameter"):
            sched2.step(4)  # the closed form
        assert sched2.get_last_lr() == [0.1 * 0.5 ** 4, 0.02 * 0.5 ** 4]


@pytest.mark.parametrize("T_mult", [1, 2])
def test_warm_restarts_with_fractional_and_jumping_epochs_like_torch(T_mult):
    """step(epoch + i / iters) within epochs, then a jump and plain steps again, as torch's docs show."""
    epochs = [e + i / 4 for e in range(12) for i in range(4)] + [26, None, None, 3.5, None, 40]
    lrs = {}
    for lib in (torch, smalltrain):
        opt = _optimizer(lib, "sgd")
        sched = lib.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=3, T_mult=T_mult, eta_min=1e-3)
        with warnings.catch_warnings():
            warnings.simplefilter("error")   # no deprecation warning for step(epoch) here, as in torch
            trace = []
            for e in epochs:
                opt.step()
                sched.step(e)
                trace.append((_hyper(opt), list(sched.get_last_lr()), sched.last_epoch, sched.T_i))
        lrs[lib.__name__] = trace
    for i, (o, t) in enumerate(zip(lrs["smalltrain"], lrs["torch"], strict=True)):
        _assert_same(o[0], t[0], f"step({epochs[i]})")
        _assert_same([o[1]], [t[1]], f"get_last_lr() after step({epochs[i]})")
        assert o[2:] == t[2:], f"last_epoch, T_i after step({epochs[i]})"


def _warmup_then_decay(S):
    """A user's scheduler, written as torch's docs show: get_lr from last_epoch and base_lrs."""
    class WarmupThenDecay(S._LRScheduler):
        def __init__(self, optimizer, warmup=5, gamma=0.9, last_epoch=-1):
            self.warmup, self.gamma = warmup, gamma
            super().__init__(optimizer, last_epoch)

        def get_lr(self):
            if self.last_epoch < self.warmup:
                return [base * (self.last_epoch + 1) / self.warmup for base in self.base_lrs]
            return [base * self.gamma ** (self.last_epoch - self.warmup) for base in self.base_lrs]
    return WarmupThenDecay


def test_user_subclass_matches_torch():
    traces = {}
    for lib in (torch, smalltrain):
        cls = _warmup_then_decay(lib.optim.lr_scheduler)
        traces[lib.__name__] = _run(lib, lambda S, o, cls=cls: cls(o), "sgd", 30, resume_at=12)
    for i, ((oh, olr), (th, tlr)) in enumerate(zip(traces["smalltrain"], traces["torch"], strict=True)):
        _assert_same(oh, th, f"after step {i}")
        _assert_same([olr], [tlr], f"get_last_lr() after step {i}")

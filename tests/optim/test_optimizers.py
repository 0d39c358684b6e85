"""Every optimizer against torch.optim: 20-step trajectories of a 5-7-3 tanh MLP (CPU and CUDA, float32 and
float64), param groups, state after one step, state_dict round trips, zero_grad, repr, signatures, and
constructor/loading errors (same exception type and message as torch)."""
import inspect

import numpy as np
import pytest
import torch
from _optim_golden import STEPS, assert_trajectory, init_and_batches, ours_params, torch_params, train

import smalltrain
from smalltrain import optim
from smalltrain.testing import assert_close

TRAJECTORIES = [
    ("SGD", {"lr": 0.1}),
    ("SGD", {"lr": 0.1, "momentum": 0.9}),
    ("SGD", {"lr": 0.1, "momentum": 0.9, "dampening": 0.5}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "nesterov": True}),
    ("SGD", {"lr": 0.1, "weight_decay": 0.1}),
    ("SGD", {"lr": 0.05, "momentum": 0.8, "dampening": 0.3, "weight_decay": 0.05}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.1}),
    ("SGD", {"lr": 0.01, "momentum": 0.9, "maximize": True}),
    ("SGD", {"lr": 0.01, "momentum": 0.5, "dampening": 0.1, "weight_decay": 0.2, "maximize": True}),
    ("Adam", {}),
    ("Adam", {"lr": 1e-2}),
    ("Adam", {"lr": 1e-2, "amsgrad": True}),
    ("Adam", {"lr": 1e-2, "weight_decay": 0.1}),
    ("Adam", {"lr": 1e-2, "maximize": True}),
    ("Adam", {"lr": 5e-3, "betas": (0.3, 0.9), "eps": 1e-6, "weight_decay": 0.05, "amsgrad": True, "maximize": True}),
    ("Adam", {"lr": 1e-2, "weight_decay": 0.1, "decoupled_weight_decay": True}),
    ("AdamW", {"lr": 1e-2}),
    ("AdamW", {"lr": 1e-2, "weight_decay": 0.5, "amsgrad": True}),
    ("AdamW", {"lr": 1e-2, "betas": (0.6, 0.95), "weight_decay": 0.3, "maximize": True}),
    ("RMSprop", {}),
    ("RMSprop", {"lr": 1e-2, "centered": True}),
    ("RMSprop", {"lr": 3e-3, "momentum": 0.9}),  # lr=1e-2 makes this net chaotic: FMA-level differences grow
    ("RMSprop", {"lr": 5e-3, "alpha": 0.9, "centered": True, "momentum": 0.5, "weight_decay": 0.1}),
    ("RMSprop", {"lr": 1e-3, "eps": 1e-4, "weight_decay": 0.2, "maximize": True}),
    ("Adadelta", {}),
    ("Adadelta", {"lr": 0.5, "rho": 0.8, "eps": 1e-4}),
    ("Adadelta", {"lr": 2.0, "rho": 0.95, "weight_decay": 0.1, "maximize": True}),
    ("Adagrad", {}),
    ("Adagrad", {"lr": 0.05, "lr_decay": 0.1, "initial_accumulator_value": 0.5}),
    ("Adagrad", {"lr": 0.03, "weight_decay": 0.1, "eps": 1e-3, "maximize": True}),
    ("Adamax", {}),
    ("Adamax", {"lr": 1e-2, "betas": (0.5, 0.9), "eps": 1e-4}),
    ("Adamax", {"lr": 1e-2, "weight_decay": 0.1, "maximize": True}),
    ("NAdam", {}),
    ("NAdam", {"lr": 1e-2, "momentum_decay": 0.05, "betas": (0.8, 0.99)}),
    ("NAdam", {"lr": 1e-2, "weight_decay": 0.1}),
    ("NAdam", {"lr": 1e-2, "weight_decay": 0.1, "decoupled_weight_decay": True, "maximize": True}),
    ("RAdam", {}),
    ("RAdam", {"lr": 1e-2, "betas": (0.9, 0.9)}),  # rho_t > 5 from step 6: both branches of the update
    ("RAdam", {"lr": 1e-2, "weight_decay": 0.1}),
    ("RAdam", {"lr": 1e-2, "betas": (0.7, 0.8), "weight_decay": 0.2, "decoupled_weight_decay": True,
               "maximize": True}),
    ("Rprop", {}),
    ("Rprop", {"lr": 0.05, "etas": (0.3, 1.5), "step_sizes": (1e-3, 0.02)}),  # both clamps bite
    ("Rprop", {"lr": 1e-3, "maximize": True}),
    ("ASGD", {}),
    ("ASGD", {"lr": 0.05, "lambd": 1e-2, "alpha": 0.5, "t0": 5}),  # averaging from step 6
    ("ASGD", {"lr": 0.05, "t0": 3, "weight_decay": 0.1, "maximize": True}),
    ("Adafactor", {}),
    ("Adafactor", {"lr": 0.05, "beta2_decay": -0.5, "eps": (1e-4, 1e-2), "d": 2.0}),
    ("Adafactor", {"lr": 0.02, "weight_decay": 0.1, "maximize": True}),
]


@pytest.mark.parametrize("name,kwargs", TRAJECTORIES, ids=[f"{n}-{k}" for n, k in TRAJECTORIES])
def test_trajectory_matches_torch(name, kwargs, device):
    assert_trajectory(name, kwargs, device=device)


GROUPS = [
    ("SGD", {"lr": 0.01}, [([0, 1], {"lr": 0.1, "momentum": 0.9}), ([2, 3], {"weight_decay": 0.1, "momentum": 0.5,
                                                                                  "nesterov": True})]),
    ("Adam", {"lr": 1e-3}, [([0], {"lr": 1e-2, "amsgrad": True}), ([1, 2], {"betas": (0.5, 0.9)}),
                             ([3], {"weight_decay": 0.2, "maximize": True})]),
    ("AdamW", {"lr": 1e-2}, [([0, 1, 2], {"weight_decay": 0.5}), ([3], {"lr": 3e-2, "weight_decay": 0.0})]),
    ("RMSprop", {"lr": 1e-2}, [([0, 2], {"centered": True}), ([1, 3], {"lr": 1e-3, "momentum": 0.9})]),
    ("Adadelta", {"lr": 1.0}, [([0, 1], {"rho": 0.8}), ([2, 3], {"lr": 0.5, "weight_decay": 0.1, "maximize": True})]),
    # torch's Adagrad starts every group's accumulator from the constructor's initial_accumulator_value
    ("Adagrad", {"initial_accumulator_value": 0.2}, [([0, 3], {"lr_decay": 0.1}),
                                                     ([1, 2], {"lr": 0.05, "initial_accumulator_value": 0.9})]),
    ("Adamax", {"lr": 1e-2}, [([0], {"betas": (0.5, 0.9)}), ([1, 2, 3], {"eps": 1e-3, "weight_decay": 0.1})]),
    ("NAdam", {"lr": 1e-2}, [([0, 1], {"momentum_decay": 0.1}), ([2, 3], {"weight_decay": 0.1,
                                                                          "decoupled_weight_decay": True})]),
    ("RAdam", {"lr": 1e-2}, [([0, 2], {"betas": (0.8, 0.9)}), ([1, 3], {"weight_decay": 0.1, "maximize": True})]),
    ("Rprop", {"lr": 1e-2}, [([0, 1], {"etas": (0.4, 1.1)}), ([2, 3], {"lr": 1e-3, "step_sizes": (1e-4, 1e-2)})]),
    ("ASGD", {"lr": 1e-2}, [([0, 1], {"t0": 4}), ([2, 3], {"lr": 0.05, "lambd": 1e-3, "weight_decay": 0.1})]),
    ("Adafactor", {"lr": 1e-2}, [([0, 1], {"d": 1.5}), ([2, 3], {"eps": (1e-3, 1e-2), "weight_decay": 0.2})]),
]


@pytest.mark.parametrize("name,kwargs,groups", GROUPS, ids=[g[0] for g in GROUPS])
def test_param_groups_match_torch(name, kwargs, groups):
    o, t, _, _ = assert_trajectory(name, kwargs, groups)
    assert len(o.param_groups) == len(t.param_groups)
    for og, tg in zip(o.param_groups, t.param_groups):
        assert {k: v for k, v in og.items() if k != "params"} == {k: v for k, v in tg.items() if k != "params"}


FLOAT64 = [
    ("SGD", {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
    ("Adam", {"lr": 1e-2, "amsgrad": True, "weight_decay": 0.1}),
    ("AdamW", {"lr": 1e-2, "maximize": True}),
    ("RMSprop", {"lr": 1e-2, "centered": True, "momentum": 0.5}),
    ("Adadelta", {"weight_decay": 0.1}),
    ("Adagrad", {"lr": 0.05, "lr_decay": 0.1}),
    ("Adamax", {"lr": 1e-2}),
    ("NAdam", {"lr": 1e-2, "weight_decay": 0.1}),
    ("RAdam", {"lr": 1e-2, "betas": (0.9, 0.9)}),
    ("Rprop", {"lr": 0.05}),
    ("ASGD", {"lr": 0.05, "t0": 5}),
    ("Adafactor", {"weight_decay": 0.1}),
]


@pytest.mark.parametrize("name,kwargs", FLOAT64, ids=[f"{n}-{k}" for n, k in FLOAT64])
def test_float64_trajectory(name, kwargs, device):
    assert_trajectory(name, kwargs, device=device, dtype=np.float64, tol=1e-12)


STATES = [
    ("SGD", {"lr": 0.1, "momentum": 0.9, "dampening": 0.5, "weight_decay": 0.1}),
    ("Adam", {"amsgrad": True}),
    ("RMSprop", {"centered": True, "momentum": 0.9}),
    ("Adadelta", {}),
    ("Adagrad", {"initial_accumulator_value": 0.1}),
    ("Adamax", {}),
    ("NAdam", {}),
    ("RAdam", {}),
    ("Rprop", {}),
    ("ASGD", {"t0": 0}),
    ("Adafactor", {}),
]


@pytest.mark.parametrize("name,kwargs", STATES, ids=[s[0] for s in STATES])
def test_state_matches_torch(name, kwargs):
    """After one step: the same state keys, the first momentum buffer a copy of the (decayed) gradient, step 1."""
    init, xs, ts = init_and_batches()
    ours, theirs = ours_params(init), torch_params(init)
    o, t = getattr(optim, name)(ours, **kwargs), getattr(torch.optim, name)(theirs, **kwargs)
    next(train(smalltrain, o, ours, xs, ts, 1))
    next(train(torch, t, theirs, xs, ts, 1))
    osd, tsd = o.state_dict(), t.state_dict()
    assert list(osd["state"]) == list(tsd["state"]) == [0, 1, 2, 3]
    assert [g["params"] for g in osd["param_groups"]] == [g["params"] for g in tsd["param_groups"]]
    for i in range(4):
        assert set(osd["state"][i]) == set(tsd["state"][i])
        for key, value in tsd["state"][i].items():
            assert_close(osd["state"][i][key], value, 1e-6, name=f"state[{i}][{key!r}]")
    if name == "SGD":  # a copy of grad + weight_decay * param: not the gradient's array, not dampened
        buf = o.state[ours[0]]["momentum_buffer"]
        assert buf.array is not ours[0].grad.array
        assert_close(buf, ours[0].grad.array + np.float32(0.1) * init[0], 1e-6)


def test_step_counter_is_a_float_tensor_like_torch():
    init, xs, ts = init_and_batches()
    ours = ours_params(init)
    o = optim.Adam(ours)
    for _ in train(smalltrain, o, ours, xs, ts, 3):
        pass
    step = o.state[ours[0]]["step"]
    assert isinstance(step, smalltrain.Tensor) and step.shape == () and step.dtype == smalltrain.float32
    assert step.item() == 3.0


def test_grad_none_is_skipped():
    init, xs, ts = init_and_batches()
    ours, theirs = ours_params(init), torch_params(init)
    extra_o, extra_t = smalltrain.ones(4, requires_grad=True), torch.ones(4, requires_grad=True)
    o, t = optim.Adam(ours + [extra_o], lr=1e-2), torch.optim.Adam(theirs + [extra_t], lr=1e-2)
    for _ in zip(train(smalltrain, o, ours, xs, ts, 3), train(torch, t, theirs, xs, ts, 3)):
        pass
    assert extra_o.grad is None and np.array_equal(extra_o.detach().array, np.ones(4, np.float32))
    assert len(o.state) == len(t.state) == 4 and extra_o not in o.state


def _round_trip(name, kwargs):
    init, xs, ts = init_and_batches()
    straight = ours_params(init)
    o = getattr(optim, name)(straight, **kwargs)
    for _ in train(smalltrain, o, straight, xs, ts, STEPS):
        pass
    first = ours_params(init)
    o1 = getattr(optim, name)(first, **kwargs)
    for _ in train(smalltrain, o1, first, xs, ts, 10):
        pass
    sd = o1.state_dict()
    snapshot = {i: {k: np.array(v.array) for k, v in st.items() if isinstance(v, smalltrain.Tensor)}
                for i, st in sd["state"].items()}
    resumed = [smalltrain.tensor(p.detach().array.copy(), requires_grad=True) for p in first]
    o2 = getattr(optim, name)(resumed, **kwargs)
    o2.load_state_dict(sd)
    next(train(smalltrain, o1, first, xs, ts, 1))  # stepping the source after saving must not reach the dict
    for _ in train(smalltrain, o2, resumed, xs[10:], ts[10:], 10):
        pass
    for a, b in zip(resumed, straight):
        assert np.array_equal(a.detach().array, b.detach().array), f"{name}{kwargs}: resumed run differs"
    for i, st in sd["state"].items():  # neither later steps of o1 nor of o2 changed the saved dict
        for k, v in snapshot[i].items():
            assert np.array_equal(st[k].array, v)
    return o2


@pytest.mark.parametrize("name,kwargs", [("SGD", {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
                                         ("Adam", {"lr": 1e-2, "amsgrad": True, "weight_decay": 0.1}),
                                         ("AdamW", {"lr": 1e-2}),
                                         ("RMSprop", {"lr": 1e-2, "centered": True, "momentum": 0.5}),
                                         ("Adadelta", {"weight_decay": 0.1}),
                                         ("Adagrad", {"lr_decay": 0.1, "initial_accumulator_value": 0.2}),
                                         ("Adamax", {"lr": 1e-2}), ("NAdam", {"lr": 1e-2}),
                                         ("RAdam", {"lr": 1e-2, "decoupled_weight_decay": True, "weight_decay": 0.1}),
                                         ("Rprop", {"lr": 0.05}), ("ASGD", {"lr": 0.05, "t0": 5}),
                                         ("Adafactor", {"weight_decay": 0.1})])
def test_state_dict_round_trip_is_bitwise(name, kwargs):
    _round_trip(name, kwargs)


def test_load_state_dict_accepts_plain_step_numbers_and_restores_groups():
    init, xs, ts = init_and_batches()
    ours = ours_params(init)
    o = optim.Adam([{"params": ours[:2], "lr": 0.02}, {"params": ours[2:]}], lr=1e-3)
    next(train(smalltrain, o, ours, xs, ts, 1))
    sd = o.state_dict()
    for st in sd["state"].values():  # what a JSON checkpoint holds
        st["step"] = int(st["step"].item())
    o2 = optim.Adam([{"params": ours[:2]}, {"params": ours[2:]}], lr=5.0)
    o2.load_state_dict(sd)
    assert [g["lr"] for g in o2.param_groups] == [0.02, 1e-3]
    assert o2.param_groups[0]["params"][0] is ours[0]
    step = o2.state[ours[3]]["step"]
    assert isinstance(step, smalltrain.Tensor) and step.item() == 1.0


def test_load_state_dict_errors_match_torch():
    init, _, _ = init_and_batches()
    cases = [([[0, 1, 2, 3]], [[0, 1], [2, 3]]), ([[0, 1], [2, 3]], [[0], [1, 2, 3]])]
    for saved_split, split in cases:
        msgs = []
        for lib, make in ((torch, torch_params), (smalltrain, ours_params)):
            p = make(init)
            src = lib.optim.SGD([{"params": [p[i] for i in idx]} for idx in saved_split], lr=0.1)
            dst = lib.optim.SGD([{"params": [p[i] for i in idx]} for idx in split], lr=0.1)
            with pytest.raises(ValueError) as e:
                dst.load_state_dict(src.state_dict())
            msgs.append(str(e.value))
        assert msgs[0] == msgs[1]
    o = optim.Adam(ours_params(init))
    sd = o.state_dict()
    sd["state"] = {0: {"step": 1, "exp_avg": smalltrain.zeros(3), "exp_avg_sq": smalltrain.zeros(7, 5)}}
    with pytest.raises(ValueError, match=r"state 'exp_avg' of parameter 0 has shape \[3\].*\[7, 5\]"):
        o.load_state_dict(sd)


VALIDATION = [
    ("SGD", {"lr": -0.1}), ("SGD", {"lr": 0.1, "momentum": -0.5}), ("SGD", {"lr": 0.1, "weight_decay": -1e-4}),
    ("SGD", {"lr": 0.1, "nesterov": True}), ("SGD", {"lr": 0.1, "momentum": 0.9, "dampening": 0.1, "nesterov": True}),
    ("Adam", {"lr": -1.0}), ("Adam", {"eps": -1e-8}), ("Adam", {"betas": (1.0, 0.999)}),
    ("Adam", {"betas": (0.9, -0.5)}), ("Adam", {"weight_decay": -0.1}), ("Adam", {"betas": (0, 0.999)}),
    ("AdamW", {"lr": -1e-3}), ("AdamW", {"betas": (0.9, 1.5)}), ("AdamW", {"weight_decay": -1.0}),
    ("RMSprop", {"lr": -1.0}), ("RMSprop", {"eps": -1.0}), ("RMSprop", {"momentum": -1.0}),
    ("RMSprop", {"weight_decay": -1.0}), ("RMSprop", {"alpha": -0.5}),
    ("Adadelta", {"lr": -1.0}), ("Adadelta", {"rho": 1.5}), ("Adadelta", {"rho": -0.1}), ("Adadelta", {"eps": -1.0}),
    ("Adadelta", {"weight_decay": -1.0}),
    ("Adagrad", {"lr": -1.0}), ("Adagrad", {"lr_decay": -0.1}), ("Adagrad", {"weight_decay": -1.0}),
    ("Adagrad", {"initial_accumulator_value": -0.5}), ("Adagrad", {"eps": -1e-10}),
    ("Adamax", {"lr": -1.0}), ("Adamax", {"eps": -1.0}), ("Adamax", {"betas": (1.0, 0.999)}),
    ("Adamax", {"betas": (0.9, 1.0)}), ("Adamax", {"weight_decay": -1.0}),
    ("NAdam", {"lr": -1.0}), ("NAdam", {"eps": -1.0}), ("NAdam", {"betas": (-0.1, 0.999)}),
    ("NAdam", {"betas": (0.9, 2.0)}), ("NAdam", {"weight_decay": -1.0}), ("NAdam", {"momentum_decay": -1e-3}),
    ("RAdam", {"lr": -1.0}), ("RAdam", {"eps": -1.0}), ("RAdam", {"betas": (1.5, 0.999)}),
    ("RAdam", {"betas": (0.9, -1.0)}), ("RAdam", {"weight_decay": -1.0}),
    ("Rprop", {"lr": -1.0}), ("Rprop", {"etas": (1.0, 1.2)}), ("Rprop", {"etas": (0.5, 0.9)}),
    ("Rprop", {"etas": (0.0, 1.2)}), ("ASGD", {"lr": -1.0}), ("ASGD", {"weight_decay": -1.0}),
    ("Adafactor", {"lr": -1.0}), ("Adafactor", {"beta2_decay": 0.5}), ("Adafactor", {"eps": (-1.0, 1e-3)}),
    ("Adafactor", {"eps": (None, -1.0)}), ("Adafactor", {"d": 0.5}), ("Adafactor", {"weight_decay": -1.0}),
    ("SGD", {"lr": -0.1, "momentum": -0.5}), ("Adam", {"lr": -1.0, "eps": -1.0}),  # the first fault is reported
    ("NAdam", {"weight_decay": -1.0, "momentum_decay": -1.0}), ("Adagrad", {"lr_decay": -1.0, "eps": -1.0}),
]


@pytest.mark.parametrize("name,kwargs", VALIDATION, ids=[f"{n}-{k}" for n, k in VALIDATION])
def test_constructor_validation_matches_torch(name, kwargs):
    with pytest.raises(Exception) as theirs:
        getattr(torch.optim, name)([torch.zeros(2, requires_grad=True)], **kwargs)
    with pytest.raises(type(theirs.value)) as ours:
        getattr(optim, name)([smalltrain.zeros(2, requires_grad=True)], **kwargs)
    assert str(ours.value) == str(theirs.value)


def _nonleaf(lib):
    return lib.ones(2, requires_grad=True) * 2


PARAM_ERRORS = [  # (params built from a library, expected exception, message regex)
    (lambda lib: [], ValueError, "empty parameter list"),
    (lambda lib: lib.ones(2, requires_grad=True), TypeError, "should be an iterable of Tensors or dicts"),
    (lambda lib: [1.0], TypeError, "can only optimize Tensors, but one of the params is float"),
    (lambda lib: [_nonleaf(lib)], ValueError, "can't optimize a non-leaf Tensor"),
    (lambda lib: [{"params": {lib.ones(2, requires_grad=True)}}], TypeError, "ordered collections"),
]


@pytest.mark.parametrize("make,exc,regex", PARAM_ERRORS)
def test_param_errors_match_torch(make, exc, regex):
    for lib in (torch, smalltrain):
        with pytest.raises(exc, match=regex):
            lib.optim.SGD(make(lib), lr=0.1)


def test_duplicate_parameters():
    for lib in (torch, smalltrain):
        p, q = lib.ones(2, requires_grad=True), lib.ones(3, requires_grad=True)
        with pytest.raises(ValueError, match="some parameters appear in more than one parameter group"):
            lib.optim.SGD([{"params": [p]}, {"params": [q, p]}], lr=0.1)
        opt = lib.optim.SGD([p], lr=0.1)
        with pytest.raises(ValueError, match="more than one parameter group"):
            opt.add_param_group({"params": p})
        with pytest.raises(TypeError, match="param_group must be a dict"):
            opt.add_param_group([q])
        with pytest.warns(UserWarning, match="duplicate parameters"):
            lib.optim.SGD([q, q], lr=0.1)


def test_named_parameters_like_torch():
    groups = {}
    for lib in (torch, smalltrain):
        named = [("w", lib.ones(2, requires_grad=True)), ("b", lib.ones(1, requires_grad=True))]
        opt = lib.optim.SGD(named, lr=0.1)
        assert all(a is b for a, (_, b) in zip(opt.param_groups[0]["params"], named, strict=True))
        groups[lib.__name__] = opt.state_dict()["param_groups"][0]
        with pytest.raises(ValueError, match="cannot add param group without names"):
            opt.add_param_group({"params": [lib.ones(3, requires_grad=True)]})
    assert groups["smalltrain"]["param_names"] == groups["torch"]["param_names"] == ["w", "b"]
    assert groups["smalltrain"]["params"] == groups["torch"]["params"] == [0, 1]


def test_add_param_group_takes_defaults():
    p, q = smalltrain.ones(2, requires_grad=True), smalltrain.ones(3, requires_grad=True)
    opt = optim.SGD([p], lr=0.1, momentum=0.9)
    opt.add_param_group({"params": q, "lr": 0.5})
    g = opt.param_groups[1]
    assert g["params"] == [q] and g["lr"] == 0.5 and g["momentum"] == 0.9 and g["nesterov"] is False


def test_zero_grad():
    p = smalltrain.ones(3, requires_grad=True)
    opt = optim.SGD([p], lr=0.1)
    (p * p).sum().backward()
    g = p.grad.array
    opt.zero_grad(set_to_none=False)
    assert p.grad.array is g and np.array_equal(g, np.zeros(3, np.float32))
    opt.zero_grad()
    assert p.grad is None


def test_closure_runs_with_grad_and_returns_loss():
    p = smalltrain.tensor([1.0, -2.0], requires_grad=True)
    opt = optim.SGD([p], lr=0.5)

    def closure():
        opt.zero_grad()
        loss = (p * p).sum()
        loss.backward()
        return loss
    with smalltrain.no_grad():
        loss = opt.step(closure)
    assert loss.item() == 5.0
    assert np.array_equal(p.detach().array, np.zeros(2, np.float32))


def test_numpy_float64_hyperparameters_keep_float32():
    init, xs, ts = init_and_batches()
    ours = ours_params(init)
    for opt in (optim.SGD(ours, lr=0.1, momentum=0.9), optim.Adam(ours), optim.RMSprop(ours, centered=True),
                optim.Adadelta(ours), optim.Adagrad(ours, lr_decay=0.1), optim.Adamax(ours), optim.NAdam(ours),
                optim.RAdam(ours, weight_decay=0.1), optim.Rprop(ours), optim.ASGD(ours, t0=0),
                optim.Adafactor(ours)):
        opt.param_groups[0]["lr"] = np.float64(1e-2)
        for _ in train(smalltrain, opt, ours, xs, ts, 2):
            pass
        assert all(p.array.dtype == np.float32 for p in ours)
        assert all(v.array.dtype == np.float32 for st in opt.state.values() for v in st.values())


@pytest.mark.parametrize("name,kwargs", [("SGD", {"lr": 0.1, "momentum": 0.9}), ("Adam", {"amsgrad": True}),
                                         ("AdamW", {}), ("RMSprop", {"centered": True}), ("Adadelta", {}),
                                         ("Adagrad", {"lr_decay": 0.1}), ("Adamax", {}), ("NAdam", {}),
                                         ("RAdam", {"decoupled_weight_decay": True}), ("Rprop", {}),
                                         ("ASGD", {"t0": 10}), ("Adafactor", {"d": 2.0})])
def test_repr_matches_torch(name, kwargs):
    o = getattr(optim, name)([{"params": [smalltrain.ones(2, requires_grad=True)]},
                              {"params": [smalltrain.ones(2, requires_grad=True)], "lr": 0.5}], **kwargs)
    t = getattr(torch.optim, name)([{"params": [torch.ones(2, requires_grad=True)]},
                                    {"params": [torch.ones(2, requires_grad=True)], "lr": 0.5}], **kwargs)
    assert repr(o) == repr(t)


NAMES = ["SGD", "Adam", "AdamW", "RMSprop", "Adadelta", "Adagrad", "Adamax", "NAdam", "RAdam", "Rprop", "ASGD",
         "Adafactor", "LBFGS"]


@pytest.mark.parametrize("name", NAMES)
def test_signature_is_torchs(name):
    """The same arguments in the same order, positional or keyword-only, with the same defaults: a script's call
    binds the same way, torch's implementation switches (foreach, fused, capturable, differentiable) included."""
    ours = inspect.signature(getattr(optim, name)).parameters.values()
    theirs = inspect.signature(getattr(torch.optim, name)).parameters.values()
    assert [(p.name, p.kind, p.default) for p in ours] == [(p.name, p.kind, p.default) for p in theirs]


@pytest.mark.parametrize("name", [n for n in NAMES if n not in ("LBFGS",)])
def test_implementation_switches(name):
    """foreach/fused/capturable only choose among torch's implementations: accepted and kept in the groups as torch
    keeps them; differentiable=True (autograd through the step) is refused."""
    params = inspect.signature(getattr(torch.optim, name)).parameters
    given = {k: True for k in ("foreach", "capturable") if k in params}
    o = getattr(optim, name)([smalltrain.ones(2, requires_grad=True)], **given)
    t = getattr(torch.optim, name)([torch.ones(2, requires_grad=True)], **given)
    assert {k: v for k, v in o.param_groups[0].items() if k != "params"} == \
        {k: v for k, v in t.param_groups[0].items() if k != "params"}
    if "differentiable" in params:
        with pytest.raises(NotImplementedError, match=f"{name}: differentiable=True"):
            getattr(optim, name)([smalltrain.ones(2, requires_grad=True)], differentiable=True)
    if "fused" in params:
        for lib in (torch, smalltrain):
            with pytest.raises(RuntimeError, match="`fused` and `foreach` cannot be `True` together."):
                getattr(lib.optim, name)([lib.ones(2, requires_grad=True)], foreach=True, fused=True)
        o = getattr(optim, name)([smalltrain.ones(2, requires_grad=True)], fused=True)
        assert o.param_groups[0]["fused"] is True

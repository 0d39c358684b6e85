"""Optimizer state dicts move between smalltrain and torch: ours -> torch -> ours mid-run (two parameter groups), and
the continued trajectory still follows torch's uninterrupted one at every step."""
import numpy as np
import pytest
import torch
from _optim_golden import STEPS, init_and_batches, ours_params, tolerance, torch_params, train

import smalltrain
from smalltrain import optim

ROWS = [
    ("SGD", {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    ("SGD", {"lr": 0.05, "momentum": 0.8, "dampening": 0.3, "maximize": True}),
    ("Adam", {"lr": 1e-2, "amsgrad": True, "weight_decay": 0.1}),
    ("AdamW", {"lr": 1e-2, "maximize": True}),
    ("RMSprop", {"lr": 1e-2, "centered": True, "momentum": 0.5}),
    ("Adadelta", {"lr": 0.5, "weight_decay": 0.1}),
    ("Adagrad", {"lr": 0.05, "lr_decay": 0.01, "initial_accumulator_value": 0.1}),
    ("Adamax", {"lr": 1e-2, "betas": (0.8, 0.99)}),
    ("NAdam", {"lr": 1e-2, "weight_decay": 0.1, "decoupled_weight_decay": True}),
    ("RAdam", {"lr": 1e-2, "betas": (0.9, 0.9)}),  # crosses rho_t > 5 in the torch segment
    ("Rprop", {"lr": 0.05, "step_sizes": (1e-4, 0.1)}),
    ("ASGD", {"lr": 0.05, "lambd": 1e-2, "t0": 10}),  # starts averaging in the torch segment
    ("Adafactor", {"lr": 0.05, "weight_decay": 0.1}),
]
SEGMENTS = (7, 14)   # ours for steps 1-7, torch for 8-14, ours again for 15-20


def _two_groups(params, kwargs):
    lr = kwargs.get("lr", 1e-3)
    return [{"params": params[:2]}, {"params": params[2:], "lr": lr / 2}]


def _to_torch(sd):
    """Our state_dict with torch tensors in place of ours (state keys, indices and group options unchanged)."""
    state = {i: {k: torch.tensor(np.asarray(v)) if isinstance(v, smalltrain.Tensor) else v for k, v in st.items()}
             for i, st in sd["state"].items()}
    return {"state": state, "param_groups": [dict(g) for g in sd["param_groups"]]}


def _from_torch(sd):
    state = {i: {k: smalltrain.tensor(v.detach().numpy().copy()) if torch.is_tensor(v) else v
                 for k, v in st.items()} for i, st in sd["state"].items()}
    return {"state": state, "param_groups": [dict(g) for g in sd["param_groups"]]}


def _check(ours, reference, where, device):
    for k, (a, b) in enumerate(zip(ours, reference)):
        got = np.asarray(a.detach(), np.float64) if isinstance(a, smalltrain.Tensor) else a.detach().double().numpy()
        err = float(np.abs(got - b).max())
        assert err <= tolerance(device), f"{where}, parameter {k}: max|ours - torch| = {err:.3g}"


@pytest.mark.parametrize("name,kwargs", ROWS, ids=[f"{n}-{k}" for n, k in ROWS])
def test_state_dict_through_torch_and_back(name, kwargs, device):
    init, xs, ts = init_and_batches()
    straight = torch_params(init)
    t0 = getattr(torch.optim, name)(_two_groups(straight, kwargs), **kwargs)
    reference = [[p.detach().double().numpy().copy() for p in straight] for _ in train(torch, t0, straight, xs, ts,
                                                                                          STEPS)]
    first, second = SEGMENTS
    a = ours_params(init, device)
    oa = getattr(optim, name)(_two_groups(a, kwargs), **kwargs)
    for i in train(smalltrain, oa, a, xs, ts, first, device):
        _check(a, reference[i], f"{name}: ours, step {i + 1}", device)

    b = torch_params([np.asarray(p.detach()) for p in a])
    ob = getattr(torch.optim, name)(_two_groups(b, kwargs), lr=123.0)   # the loaded groups bring the options
    ob.load_state_dict(_to_torch(oa.state_dict()))
    for i in train(torch, ob, b, xs[first:], ts[first:], second - first):
        _check(b, reference[first + i], f"{name}: torch after loading ours, step {first + i + 1}", device)

    c = ours_params([p.detach().numpy() for p in b], device)
    oc = getattr(optim, name)(_two_groups(c, kwargs), lr=123.0)
    oc.load_state_dict(_from_torch(ob.state_dict()))
    assert [g["lr"] for g in oc.param_groups] == [g["lr"] for g in t0.param_groups]
    for i in train(smalltrain, oc, c, xs[second:], ts[second:], STEPS - second, device):
        _check(c, reference[second + i], f"{name}: ours after loading torch's, step {second + i + 1}", device)
    for st in oc.state.values():   # scalar state stays on the host, array state on the parameters' device
        for key, value in st.items():
            assert value.device.type == ("cpu" if key in ("step", "mu_product", "eta", "mu") else device), key


def test_adagrad_state_exists_before_the_first_step_like_torch():
    init, _, _ = init_and_batches()
    o = optim.Adagrad(ours_params(init), initial_accumulator_value=0.3)
    t = torch.optim.Adagrad(torch_params(init), initial_accumulator_value=0.3)
    osd, tsd = o.state_dict(), t.state_dict()
    assert list(osd["state"]) == list(tsd["state"]) == [0, 1, 2, 3]
    for i, st in tsd["state"].items():
        assert set(osd["state"][i]) == set(st) == {"step", "sum"}
        for key, value in st.items():
            assert np.array_equal(np.asarray(osd["state"][i][key]), value.numpy())

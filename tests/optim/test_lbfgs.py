"""LBFGS against torch.optim.LBFGS on a fixed full-batch least-squares problem (the use L-BFGS is made for): the
parameters after every step, the evaluation and iteration counts, the state_dict through torch and back, and the
errors. float64, since L-BFGS's divisions by tiny curvature products amplify float32 rounding near convergence."""
import numpy as np
import pytest
import torch
from _optim_golden import init_and_batches, ours_params, torch_params

import smalltrain
from smalltrain import optim

STEPS = 6


def _data(dtype):
    rng = np.random.default_rng(5)
    return [rng.standard_normal((32, n)).astype(dtype) for n in (5, 7, 7, 3)]


def _closure(lib, opt, params, data, device=None):
    w1, b1, w2, b2 = params
    x, u, v, t = [torch.tensor(d) if lib is torch else smalltrain.tensor(d, device=device) for d in data]

    def closure():
        opt.zero_grad()
        loss = ((x @ w1.T + b1 - u) ** 2).mean() + ((v @ w2.T + b2 - t) ** 2).mean() + \
            0.01 * sum((p * p).sum() for p in params)
        loss.backward()
        return loss
    return closure


def _values(params):
    return [np.asarray(p.detach(), np.float64) if isinstance(p, smalltrain.Tensor) else p.detach().double().numpy()
            for p in params]


def _assert_close(ours, theirs, tol, where):
    for k, (a, b) in enumerate(zip(_values(ours), _values(theirs))):
        err = float(np.abs(a - b).max())
        assert err <= tol, f"{where}, parameter {k}: max|ours - torch| = {err:.3g}"


CONFIGS = [
    {},
    {"lr": 0.5, "max_iter": 5, "history_size": 3},
    {"lr": 0.3, "max_iter": 3, "max_eval": 4},
    {"line_search_fn": "strong_wolfe"},
    {"line_search_fn": "strong_wolfe", "max_iter": 4, "history_size": 2},
]


@pytest.mark.parametrize("kwargs", CONFIGS, ids=[str(c) for c in CONFIGS])
def test_trajectory_matches_torch(kwargs, device):
    init, _, _ = init_and_batches(dtype=np.float64)
    data = _data(np.float64)
    ours, theirs = ours_params(init, device), torch_params(init)
    o, t = optim.LBFGS(ours, **kwargs), torch.optim.LBFGS(theirs, **kwargs)
    co, ct = _closure(smalltrain, o, ours, data, device), _closure(torch, t, theirs, data)
    for i in range(STEPS):
        lo, lt = o.step(co), t.step(ct)
        assert abs(float(lo) - float(lt.detach())) <= 1e-10, f"step {i + 1}: the closure's first loss"
        _assert_close(ours, theirs, 1e-10, f"{kwargs}: step {i + 1}")
        so, st = o.state[ours[0]], t.state[theirs[0]]
        assert (so["func_evals"], so["n_iter"]) == (st["func_evals"], st["n_iter"]), f"step {i + 1}"


def test_float32_first_steps_match_torch():
    init, _, _ = init_and_batches()
    data = _data(np.float32)
    for kwargs in ({"max_iter": 5}, {"max_iter": 5, "line_search_fn": "strong_wolfe"}):
        ours, theirs = ours_params(init), torch_params(init)
        o, t = optim.LBFGS(ours, **kwargs), torch.optim.LBFGS(theirs, **kwargs)
        co, ct = _closure(smalltrain, o, ours, data), _closure(torch, t, theirs, data)
        o.step(co)
        t.step(ct)
        _assert_close(ours, theirs, 1e-5, f"float32 {kwargs}")
        assert all(p.array.dtype == np.float32 for p in ours)


def _to_torch(sd):
    def conv(v):
        if isinstance(v, list):
            return [conv(x) for x in v]
        return torch.tensor(np.asarray(v)) if isinstance(v, smalltrain.Tensor) else v
    return {"state": {i: {k: conv(v) for k, v in st.items()} for i, st in sd["state"].items()},
            "param_groups": [dict(g) for g in sd["param_groups"]]}


def _from_torch(sd):
    def conv(v):
        if isinstance(v, list):
            return [conv(x) for x in v]
        return smalltrain.tensor(v.numpy().copy()) if torch.is_tensor(v) else v
    return {"state": {i: {k: conv(v) for k, v in st.items()} for i, st in sd["state"].items()},
            "param_groups": [dict(g) for g in sd["param_groups"]]}


@pytest.mark.parametrize("kwargs", [{"max_iter": 3, "history_size": 4}, {"max_iter": 2, "line_search_fn":
                                                                          "strong_wolfe"}])
def test_state_dict_through_torch_and_back(kwargs, device):
    """Ours for 2 steps, torch from our state for 2, ours from torch's for 2: torch's uninterrupted run."""
    init, _, _ = init_and_batches(dtype=np.float64)
    data = _data(np.float64)
    straight = torch_params(init)
    t0 = torch.optim.LBFGS(straight, **kwargs)
    c0 = _closure(torch, t0, straight, data)
    reference = []
    for _ in range(6):
        t0.step(c0)
        reference.append([p.detach().clone() for p in straight])
    a = ours_params(init, device)
    oa = optim.LBFGS(a, **kwargs)
    ca = _closure(smalltrain, oa, a, data, device)
    for i in range(2):
        oa.step(ca)
        _assert_close(a, reference[i], 1e-10, f"ours, step {i + 1}")
    b = torch_params([np.asarray(p.detach()) for p in a])
    ob = torch.optim.LBFGS(b, lr=123.0)
    ob.load_state_dict(_to_torch(oa.state_dict()))
    cb = _closure(torch, ob, b, data)
    for i in range(2, 4):
        ob.step(cb)
        _assert_close(b, reference[i], 1e-10, f"torch after loading ours, step {i + 1}")
    c = ours_params([p.detach().numpy() for p in b], device)
    oc = optim.LBFGS(c, lr=123.0)
    oc.load_state_dict(_from_torch(ob.state_dict()))
    assert oc.state[c[0]]["d"].device.type == device
    cc = _closure(smalltrain, oc, c, data, device)
    for i in range(4, 6):
        oc.step(cc)
        _assert_close(c, reference[i], 1e-10, f"ours after loading torch's, step {i + 1}")
    assert oc.state[c[0]]["func_evals"] == t0.state[straight[0]]["func_evals"]


def test_errors_match_torch():
    for lib in (torch, smalltrain):
        p, q = lib.ones(2, requires_grad=True), lib.ones(3, requires_grad=True)
        with pytest.raises(ValueError, match="Invalid learning rate: -1"):
            lib.optim.LBFGS([p], lr=-1)
        with pytest.raises(ValueError, match=r"LBFGS doesn't support per-parameter options \(parameter groups\)"):
            lib.optim.LBFGS([{"params": [p]}, {"params": [q]}])
        opt = lib.optim.LBFGS([p], line_search_fn="armijo")

        def closure():
            opt.zero_grad()
            loss = (p * p).sum()
            loss.backward()
            return loss
        with pytest.raises(RuntimeError, match="only 'strong_wolfe' is supported"):
            opt.step(closure)
        with pytest.raises(TypeError):
            opt.step()
        assert lib.optim.LBFGS([q]).defaults["max_eval"] == 25

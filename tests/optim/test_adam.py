"""Adam's flat CPU path (one buffer per state over a group's parameters) against its per-parameter update,
bitwise: when the parameters with gradients change, and after load_state_dict."""
import numpy as np
import pytest
from _optim_golden import init_and_batches, ours_params, train

import smalltrain
from smalltrain import optim


def _reference_adam(params, grads_per_step, kwargs):
    """The per-parameter update (optim.adam._adam_update) on copies: what the flat CPU path must equal bitwise."""
    from smalltrain.optim.adam import _adam_update, _init_state
    o = optim.Adam([smalltrain.tensor(p, requires_grad=True) for p in params], **kwargs)
    g = o.param_groups[0]
    hyper = (g["lr"], *g["betas"], g["eps"], g["weight_decay"], g["amsgrad"], g["maximize"],
             g["decoupled_weight_decay"])
    arrays, states = [p.copy() for p in params], [{} for _ in params]
    for grads in grads_per_step:
        for a, st, gr in zip(arrays, states, grads):
            if gr is None:
                continue
            if not st:
                _init_state(st, a, False)
            _adam_update(a, gr, st, *hyper)
    return arrays, states


@pytest.mark.parametrize("kwargs", [{"lr": 1e-2}, {"lr": 1e-2, "weight_decay": 0.1},
                                    {"lr": 1e-2, "weight_decay": 0.1, "decoupled_weight_decay": True},
                                    {"lr": 1e-2, "betas": (0.6, 0.95), "maximize": True}])
def test_flat_cpu_adam_equals_the_per_parameter_update_bitwise(kwargs):
    # one flat buffer per state over all parameters: same operations per element, so the same bits; a gradient that
    # is a non-contiguous view (conv2d's weight gradient is one) is read in its logical order
    rng = np.random.default_rng(3)
    shapes = [(4, 3, 2, 2), (4,), (5, 7), (1,), (2, 3)]
    params = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    steps = [[rng.standard_normal(s[::-1]).astype(np.float32).T for s in shapes] for _ in range(6)]
    ours = [smalltrain.tensor(p.copy(), requires_grad=True) for p in params]
    o = optim.Adam(ours, **kwargs)
    for grads in steps:
        for t, g in zip(ours, grads):
            t.grad = smalltrain.tensor(g)
        o.step()
    ref, ref_states = _reference_adam(params, steps, kwargs)
    for t, a, st in zip(ours, ref, ref_states):
        assert np.array_equal(t.detach().array, a)
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert np.array_equal(o.state[t][key].array, st[key].array)
            assert o.state[t][key].array.shape == st[key].array.shape
    assert o.state[ours[0]]["step"].item() == 6.0


def test_flat_cpu_adam_when_the_parameters_with_gradients_change():
    # the flat buffers are rebuilt when the set of parameters with gradients changes; a parameter without a gradient
    # for a while falls behind in steps, and from then on the per-parameter update runs (the counts differ)
    rng = np.random.default_rng(4)
    shapes = [(3, 2), (5,), (2, 2)]
    params = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    steps = []
    for i in range(7):
        steps.append([rng.standard_normal(s).astype(np.float32) if not (k == 1 and 2 <= i < 4) else None
                      for k, s in enumerate(shapes)])
    ours = [smalltrain.tensor(p.copy(), requires_grad=True) for p in params]
    o = optim.Adam(ours, lr=1e-2)
    for grads in steps:
        for t, g in zip(ours, grads):
            t.grad = None if g is None else smalltrain.tensor(g)
        o.step()
    ref, ref_states = _reference_adam(params, steps, {"lr": 1e-2})
    for t, a, st in zip(ours, ref, ref_states):
        assert np.array_equal(t.detach().array, a)
        assert np.array_equal(o.state[t]["step"].array, st["step"].array)


def test_flat_cpu_adam_state_is_live_after_load_state_dict():
    # loading replaces the state tensors: the flat buffers are rebuilt from them, and the loaded tensors (held by
    # the caller through opt.state) are what later steps update
    init, xs, ts = init_and_batches()
    a, b = ours_params(init), ours_params(init)
    oa, ob = optim.Adam(a, lr=1e-2), optim.Adam(b, lr=1e-2)
    for _ in zip(train(smalltrain, oa, a, xs, ts, 3), train(smalltrain, ob, b, xs, ts, 3)):
        pass
    ob.load_state_dict(oa.state_dict())
    for _ in zip(train(smalltrain, oa, a, xs[3:], ts[3:], 4), train(smalltrain, ob, b, xs[3:], ts[3:], 4)):
        pass
    for p, q in zip(a, b):
        assert np.array_equal(p.detach().array, q.detach().array)
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert np.array_equal(oa.state[p][key].array, ob.state[q][key].array)

"""Adafactor's factored second moment on parameters beyond the MLP table's: a conv-shaped one (the last two
dimensions factored per leading index) and a 0-d one (a full variance), fed identical gradients."""
import numpy as np
import torch
from _optim_golden import ours_params, torch_params

import smalltrain
from smalltrain import optim
from smalltrain.testing import assert_close


def test_adafactor_factors_the_last_two_dims_like_torch():
    """A conv-shaped parameter keeps row and column means per leading index; a 0-d one a full variance."""
    rng = np.random.default_rng(6)
    shapes = [(4, 3, 2, 5), ()]
    init = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(5)]
    ours, theirs = ours_params(init), torch_params(init)
    o, t = optim.Adafactor(ours, lr=0.05), torch.optim.Adafactor(theirs, lr=0.05)
    for step in grads:
        for a, b, g in zip(ours, theirs, step):
            a.grad, b.grad = smalltrain.tensor(g), torch.tensor(g)
        o.step()
        t.step()
        for a, b in zip(ours, theirs):
            assert_close(a.detach(), b.detach(), 1e-6)
    for a, b in zip(ours, theirs):
        assert {k: tuple(v.shape) for k, v in o.state[a].items()} == {k: tuple(v.shape) for k, v in t.state[b].items()}

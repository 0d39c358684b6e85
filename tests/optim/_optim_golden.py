"""What the optimizer tables share: a 5-7-3 tanh MLP's initial parameters and batches, a training loop for
smalltrain or torch, and the trajectory check against torch (parameters compared after every step)."""
import numpy as np
import torch

import smalltrain
from smalltrain import optim

SHAPES = [(7, 5), (7,), (3, 7), (3,)]
STEPS = 20
TOL = 1e-6  # max |ours - torch| of float32 parameters at every step (torch's CPU kernels fuse multiply-adds)
# on CUDA the model's matmuls (cuBLAS) also sum in another order than torch's CPU reference; the brief's bound
TOL_CUDA = 1e-5


def tolerance(device, tol=None):
    """The bound of a float32 trajectory on `device` (tol when given, e.g. for float64)."""
    if tol is not None:
        return tol
    return TOL_CUDA if device == "cuda" else TOL


def init_and_batches(seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    init = [(rng.standard_normal(s) * 0.5).astype(dtype) for s in SHAPES]
    xs = rng.standard_normal((STEPS, 8, 5)).astype(dtype)
    ts = rng.standard_normal((STEPS, 8, 3)).astype(dtype)
    return init, xs, ts


def mlp_loss(params, x, t):
    w1, b1, w2, b2 = params
    h = (x @ w1.T + b1).tanh()
    return ((h @ w2.T + b2 - t) ** 2).mean()


def ours_params(init, device="cpu"):
    return [smalltrain.tensor(a.copy(), device=device, requires_grad=True) for a in init]


def torch_params(init):
    return [torch.tensor(a.copy(), requires_grad=True) for a in init]


def grouped(params, groups):
    """groups: None (one plain list) or a list of (param indices, options) pairs."""
    if groups is None:
        return params
    return [dict(opts, params=[params[i] for i in idx]) for idx, opts in groups]


def train(lib, opt, params, xs, ts, steps, device=None):
    """Yield after each of `steps` training steps (the caller compares parameters)."""
    for i in range(steps):
        opt.zero_grad()
        if lib is torch:
            x, t = torch.tensor(xs[i]), torch.tensor(ts[i])
        else:
            x, t = smalltrain.tensor(xs[i], device=device), smalltrain.tensor(ts[i], device=device)
        mlp_loss(params, x, t).backward()
        opt.step()
        yield i


def assert_trajectory(name, kwargs, groups=None, device="cpu", dtype=np.float32, tol=None):
    tol = tolerance(device, tol)
    init, xs, ts = init_and_batches(dtype=dtype)
    ours, theirs = ours_params(init, device), torch_params(init)
    o = getattr(optim, name)(grouped(ours, groups), **kwargs)
    t = getattr(torch.optim, name)(grouped(theirs, groups), **kwargs)
    for i, _ in zip(train(smalltrain, o, ours, xs, ts, STEPS, device), train(torch, t, theirs, xs, ts, STEPS)):
        for k, (a, b) in enumerate(zip(ours, theirs)):
            err = float(np.abs(np.asarray(a.detach(), np.float64) - b.detach().numpy().astype(np.float64)).max())
            assert err <= tol, f"{name}{kwargs}: step {i + 1}, parameter {k}: max|ours - torch| = {err:.3g}"
            assert a.array.dtype == dtype
    return o, t, ours, theirs

"""The bench's model zoo (smalltrain/bench/zoo.py): each model, written once the ordinary PyTorch way, builds in both
libraries and trains to the same values as torch's from the same weights."""
import warnings

import numpy as np
import pytest
import torch

import smalltrain
from smalltrain import bench
from smalltrain.bench.steps import make_step
from smalltrain.bench.zoo import ZOO

DROPOUT = {"examples-net", "mlp-dropout"}   # compared in eval mode: the two libraries draw different masks


def _batch(n=6, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 1, 28, 28)).astype(np.float32), rng.integers(0, 10, n).astype(np.int64)


def _steps(lib, net, name, x, y, steps=2):
    opt = bench.make_optimizer(lib, name, net.parameters())
    loss_fn = getattr(lib.nn.functional, ZOO[name].loss)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
    return losses


@pytest.mark.parametrize("name", list(ZOO))
def test_a_zoo_model_trains_as_torchs_from_the_same_weights(name):
    torch.manual_seed(0)
    theirs = bench.build(torch, name)
    ours = bench.build(smalltrain, name)
    assert repr(ours) == repr(theirs)
    ours.load_state_dict({k: smalltrain.tensor(v.detach().numpy()) for k, v in theirs.state_dict().items()})
    if name in DROPOUT:
        ours.eval()
        theirs.eval()
    x, y = _batch()
    their_losses = _steps(torch, theirs, name, torch.tensor(x), torch.tensor(y))
    our_losses = _steps(smalltrain, ours, name, smalltrain.tensor(x), smalltrain.tensor(y))
    np.testing.assert_allclose(our_losses, their_losses, rtol=1e-5, atol=1e-6)
    assert their_losses[1] != their_losses[0]   # the first step changed the weights
    mine = ours.state_dict()
    for key, value in theirs.state_dict().items():
        _assert_trained_alike(mine[key].numpy(), value.detach().numpy(), key)


def _assert_trained_alike(ours, theirs, key):
    """Weights after the same steps. Adam-type updates move a weight by about lr whatever its gradient's size, so a
    gradient that is zero up to float32 rounding can move one weight by up to lr in one library and not the other:
    a few such weights in 100k are allowed, none elsewhere."""
    off = ~np.isclose(ours, theirs, rtol=1e-4, atol=1e-5)
    assert off.mean() <= 1e-4 and np.abs(ours - theirs).max() <= 5e-3, \
        f"{key}: {off.sum()} of {off.size} weights differ, at most by {np.abs(ours - theirs).max():.3g}"


def test_the_zoo_covers_the_layers_the_bench_promises():
    layers = {type(m).__name__ for name in ZOO for m in bench.build(smalltrain, name).modules()}
    assert {"Conv2d", "BatchNorm2d", "Dropout", "Linear", "MaxPool2d", "GELU", "ReLU"} <= layers
    losses = {ZOO[name].loss for name in ZOO}
    assert losses == {"cross_entropy", "nll_loss"}
    optimizers = {type(bench.make_optimizer(smalltrain, n, bench.build(smalltrain, n).parameters())).__name__
                  for n in ZOO}
    assert optimizers == {"Adam", "AdamW", "Adadelta", "SGD"}
    assert len(ZOO) >= 8


def test_an_unknown_model_is_named_with_the_choices():
    with pytest.raises(ValueError, match="unknown benchmark model 'vit'; expected one of lenet5, cnn, mlp, "):
        bench.build(smalltrain, "vit")


@pytest.mark.skipif(not smalltrain.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("name", list(ZOO))
def test_a_zoo_models_step_is_captured_whole_on_cuda(name):
    """smalltrain.compile captures every zoo model's step as one CUDA graph (no op reads back to the host, which
    would make it warn and run eagerly), and the replays train as the eager step does from the same weights."""
    x, y = _batch(n=4)
    xs, ys = np.stack([x, x[::-1]]), np.stack([y, y[::-1]])
    run_eager = make_step(smalltrain, name, "cuda", xs, ys, "eager")
    run_compiled = make_step(smalltrain, name, "cuda", xs, ys, "compiled")
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # an eager fallback warns: fail on it
        compiled = [float(run_compiled().item()) for _ in range(6)]
    eager = [float(run_eager().item()) for _ in range(6)]
    stats = run_compiled.step.stats
    assert stats["eager"] == 3 and stats["captures"] == 1 and stats["replays"] >= 2, stats
    if name not in DROPOUT:   # (the masks differ between the two runs)
        np.testing.assert_allclose(compiled, eager, rtol=1e-4, atol=1e-5)
    assert np.isfinite(compiled).all()

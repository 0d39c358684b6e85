"""The CUDA kernels other than the convolution's (tests/ops/test_conv_shapes.py) across the shapes small models
use, each through the path its plan picks, forward and gradients against torch: batch_norm 1d/2d in training and
eval (channels 1..256, batch 2..1024, images 1x1..28x28: one block per channel and channels split over blocks),
with and without the activation that joins it; max/avg pooling and adaptive average pooling; log_softmax +
nll_loss (2..1000 classes, batch 1..1024); linear layers (the small, wide and cuBLAS paths). They run on the CPU
CUDA emulator too (all of them in ~16 s on the 2-core CI machine)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import smalltrain
import smalltrain.nn.functional as F
from smalltrain.testing import golden

cuda = pytest.mark.skipif(not smalltrain.cuda.is_available(), reason="no CUDA device")


BN_SHAPES = [(2, 1), (1024, 16), (64, 256), (7, 3, 1, 1), (64, 16, 28, 28), (512, 6, 12, 12), (3, 64, 5, 7),
             (1024, 32, 7, 7), (2, 256, 14, 14), (16, 128, 3, 3)]


@cuda
@pytest.mark.parametrize("shape", BN_SHAPES, ids=str)
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("activation", [None, "relu"])
def test_batch_norm_across_shapes(shape, training, activation, rng):
    c = shape[1]
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    w, b = rng.standard_normal(c).astype(np.float32), rng.standard_normal(c).astype(np.float32)
    rm, rv = rng.standard_normal(c).astype(np.float32), (rng.random(c) + 0.5).astype(np.float32)
    ours_stats = [smalltrain.tensor(rm, device="cuda"), smalltrain.tensor(rv, device="cuda")]
    theirs_stats = [torch.tensor(rm), torch.tensor(rv)]
    act_ours = (lambda t: F.relu(t)) if activation else (lambda t: t)
    act_theirs = (lambda t: TF.relu(t)) if activation else (lambda t: t)
    golden(lambda x, w, b: act_ours(F.batch_norm(x, *ours_stats, w, b, training)),
           lambda x, w, b: act_theirs(TF.batch_norm(x, *theirs_stats, w, b, training)), x, w, b, device="cuda",
           rtol=2e-4)
    for ours, theirs in zip(ours_stats, theirs_stats):   # the running statistics, updated once in training
        np.testing.assert_allclose(ours.cpu().numpy(), theirs.numpy(), rtol=1e-4, atol=1e-5)


POOL_CASES = [  # input shape, kernel, stride, padding
    ((1, 1, 28, 28), 2, 2, 0), ((64, 6, 24, 24), 2, 2, 0), ((7, 16, 13, 13), 3, 2, 1), ((1024, 32, 7, 7), 2, 1, 0),
    ((2, 256, 9, 9), 3, 3, 1), ((16, 64, 14, 14), 4, 2, 2)]


@cuda
@pytest.mark.parametrize("shape,kernel,stride,padding", POOL_CASES, ids=str)
@pytest.mark.parametrize("kind", ["max", "avg"])
def test_pooling_across_shapes(shape, kernel, stride, padding, kind, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    ours, theirs = (F.max_pool2d, TF.max_pool2d) if kind == "max" else (F.avg_pool2d, TF.avg_pool2d)
    golden(lambda x: ours(x, kernel, stride, padding), lambda x: theirs(x, kernel, stride, padding), x,
           device="cuda")


@cuda
@pytest.mark.parametrize("shape,out", [((1, 1, 28, 28), 1), ((64, 64, 7, 7), 1), ((7, 16, 13, 13), (3, 5)),
                                       ((1024, 32, 4, 4), 2), ((2, 256, 9, 9), 4)], ids=str)
def test_adaptive_avg_pooling_across_shapes(shape, out, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    golden(lambda x: F.adaptive_avg_pool2d(x, out), lambda x: TF.adaptive_avg_pool2d(x, out), x, device="cuda")


@cuda
@pytest.mark.parametrize("batch,classes", [(1, 2), (64, 10), (1024, 10), (7, 1000), (512, 100), (3, 33)], ids=str)
def test_log_softmax_nll_loss_across_shapes(batch, classes, rng):
    x = (rng.standard_normal((batch, classes)) * 4).astype(np.float32)
    y = rng.integers(0, classes, batch)
    golden(lambda x, y: F.nll_loss(F.log_softmax(x, dim=1), y), lambda x, y: TF.nll_loss(TF.log_softmax(x, dim=1), y),
           x, y, device="cuda", rtol=1e-4)
    golden(lambda x, y: F.cross_entropy(x, y, reduction="sum"), lambda x, y: TF.cross_entropy(x, y, reduction="sum"),
           x, y, device="cuda", rtol=1e-4)


@cuda
@pytest.mark.parametrize("rows,inputs,outputs", [(1, 784, 10), (64, 784, 256), (1024, 256, 10), (7, 18432, 10),
                                                 (512, 120, 84), (3, 5, 1000), (64, 3136, 128)], ids=str)
@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
def test_linear_across_shapes(rows, inputs, outputs, activation, rng):
    x = rng.standard_normal((rows, inputs)).astype(np.float32)
    w = (rng.standard_normal((outputs, inputs)) / np.sqrt(inputs)).astype(np.float32)
    b = rng.standard_normal(outputs).astype(np.float32)
    act = {None: (lambda t: t, lambda t: t), "relu": (F.relu, TF.relu), "gelu": (F.gelu, TF.gelu)}[activation]
    golden(lambda x, w, b: act[0](F.linear(x, w, b)), lambda x, w, b: act[1](TF.linear(x, w, b)), x, w, b,
           device="cuda", rtol=2e-4)

"""Network-level parity with PyTorch: LeNet-5 and MnistCnn from identical weights on identical MNIST batches."""
import numpy as np
import pytest
import torch
import torch.nn as tnn
import torch.nn.functional as TF

import smalltrain
from smalltrain import models
from smalltrain.nn import functional as F
from smalltrain.testing import max_error


class TorchLeNet5(tnn.Module):
    def __init__(self, activation):
        super().__init__()
        self.act = TF.gelu if activation == "gelu" else TF.relu
        self.conv1, self.pool1 = tnn.Conv2d(1, 6, 5), tnn.MaxPool2d(2)
        self.conv2, self.pool2 = tnn.Conv2d(6, 16, 5), tnn.MaxPool2d(2)
        self.fc1, self.fc2, self.fc3 = tnn.Linear(256, 120), tnn.Linear(120, 84), tnn.Linear(84, 10)

    def forward(self, x):
        x = self.pool1(self.act(self.conv1(x)))
        x = self.pool2(self.act(self.conv2(x)))
        x = x.flatten(1)
        return self.fc3(self.act(self.fc2(self.act(self.fc1(x)))))


class TorchCnn(tnn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = tnn.Conv2d(1, 16, 3), tnn.Conv2d(16, 32, 3)
        self.relu, self.flatten, self.fc = tnn.ReLU(), tnn.Flatten(), tnn.Linear(18432, 10)

    def forward(self, x):
        return self.fc(self.flatten(self.relu(self.conv2(self.relu(self.conv1(x))))))


def _pair(name):
    smalltrain.manual_seed(0)
    ours = models.LeNet5("gelu") if name == "lenet5" else models.MnistCnn()
    theirs = TorchLeNet5("gelu") if name == "lenet5" else TorchCnn()
    state = {k: torch.tensor(v.numpy()) for k, v in ours.state_dict().items()}
    theirs.load_state_dict(state)
    return ours, theirs


@pytest.fixture(scope="module")
def batches():
    from smalltrain.datasets import MNIST
    ds = MNIST(train=True)
    x = (ds.data.numpy()[:640].astype(np.float32) / 255 - 0.1307) / 0.3081
    return x.reshape(10, 64, 1, 28, 28), ds.targets.numpy()[:640].reshape(10, 64)


def _rel(a, b):
    err, scale = max_error(a, b)
    return err / scale


@pytest.mark.parametrize("name, opt", [("lenet5", "adam"), ("cnn", "sgd")])
def test_one_step_parity(name, opt, batches):
    ours, theirs = _pair(name)
    x, y = batches[0][0], batches[1][0]
    logits = ours(smalltrain.tensor(x))
    ref = theirs(torch.tensor(x))
    loss = F.cross_entropy(logits, smalltrain.tensor(y))
    ref_loss = TF.cross_entropy(ref, torch.tensor(y))
    loss.backward()
    ref_loss.backward()
    worst = {"logits": _rel(logits.detach(), ref), "loss": _rel(loss.detach(), ref_loss)}
    tparams = dict(theirs.named_parameters())
    for k, p in ours.named_parameters():
        worst[f"grad {k}"] = _rel(p.grad, tparams[k].grad)
    print(f"\n{name} one-step worst relative errors: " + ", ".join(f"{k} {v:.2e}" for k, v in worst.items()))
    assert max(worst.values()) <= 1e-5, worst


def _optimizers(opt, lr, ours, theirs):
    if opt == "adam":
        return smalltrain.optim.Adam(ours.parameters(), lr=lr), torch.optim.Adam(theirs.parameters(), lr=lr)
    return smalltrain.optim.SGD(ours.parameters(), lr=lr), torch.optim.SGD(theirs.parameters(), lr=lr)


# SGD at lr 0.01: at lr 0.1 the first steps amplify float32 rounding so much that torch's own float32 run drifts
# 9e-5 from its float64 run in 10 steps (measured), more than the 1e-5 bound; that rate is checked below per step.
@pytest.mark.parametrize("name, opt, lr", [("lenet5", "adam", 1e-3), ("cnn", "sgd", 0.01)])
def test_ten_step_trajectory(name, opt, lr, batches):
    ours, theirs = _pair(name)
    o, t = _optimizers(opt, lr, ours, theirs)
    losses = []
    for i in range(10):
        x, y = batches[0][i], batches[1][i]
        o.zero_grad()
        t.zero_grad()
        loss = F.cross_entropy(ours(smalltrain.tensor(x)), smalltrain.tensor(y))
        ref = TF.cross_entropy(theirs(torch.tensor(x)), torch.tensor(y))
        loss.backward()
        ref.backward()
        o.step()
        t.step()
        losses.append((loss.item(), ref.item()))
    loss_err = max(abs(a - b) / max(1.0, abs(b)) for a, b in losses)
    tparams = dict(theirs.named_parameters())
    param_err = max(_rel(p.detach(), tparams[k].detach()) for k, p in ours.named_parameters())
    print(f"\n{name}+{opt} 10 steps: worst loss rel err {loss_err:.2e}, worst parameter rel err {param_err:.2e}")
    assert loss_err <= 1e-5 and param_err <= 1e-5


def test_high_lr_steps_are_as_close_to_float64_as_torchs(batches):
    """MnistCnn, SGD lr 0.1, 10 steps along our float32 trajectory: at each step's parameters our gradients are as
    close to float64's (torch, the same parameters) as torch's float32 gradients are. Per step, not the trajectories
    compared after 10 steps: at this rate the steps amplify rounding chaotically (one ReLU that a rounding flips
    moves the parameters ~1e-5 a few steps later), so which float32 run ends nearer the float64 one depends on the
    CPU's BLAS kernels rather than on the gradients' accuracy."""
    ours, t32 = _pair("cnn")
    t64 = TorchCnn().double()
    opt = smalltrain.optim.SGD(ours.parameters(), lr=0.1)
    worst = [0.0, 0.0]
    for i in range(10):
        state = {k: torch.tensor(v.numpy()) for k, v in ours.state_dict().items()}
        t32.load_state_dict(state)
        t64.load_state_dict({k: v.double() for k, v in state.items()})
        opt.zero_grad()
        F.cross_entropy(ours(smalltrain.tensor(batches[0][i])), smalltrain.tensor(batches[1][i])).backward()
        for m, dt in ((t32, None), (t64, torch.float64)):
            m.zero_grad()
            TF.cross_entropy(m(torch.tensor(batches[0][i], dtype=dt)), torch.tensor(batches[1][i])).backward()
        ref, theirs = dict(t64.named_parameters()), dict(t32.named_parameters())
        for k, p in ours.named_parameters():
            worst[0] = max(worst[0], max_error(p.grad, ref[k].grad)[0])
            worst[1] = max(worst[1], max_error(theirs[k].grad, ref[k].grad)[0])
        opt.step()
    print(f"\nMnistCnn SGD lr 0.1, 10 steps, gradients' distance to float64: ours {worst[0]:.2e}, "
          f"torch float32 {worst[1]:.2e}")
    assert worst[0] <= 2 * worst[1] + 1e-7

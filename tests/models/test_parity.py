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
# 9e-5 from its float64 run in 10 steps (measured), more than the 1e-5 bound; that case is checked below instead.
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


def test_high_lr_trajectory_is_as_close_to_float64_as_torch_is(batches):
    """MnistCnn, SGD lr 0.1: our float32 run stays as close to the float64 trajectory as torch's float32 run."""
    ours, t32 = _pair("cnn")
    t64 = TorchCnn().double()
    t64.load_state_dict({k: v.double() for k, v in t32.state_dict().items()})
    runs = [(ours, smalltrain, F), (t32, torch, TF), (t64, torch, TF)]
    opts = [lib.optim.SGD(m.parameters(), lr=0.1) for m, lib, _ in runs]
    for i in range(10):
        for (m, lib, f), o in zip(runs, opts):
            dt = torch.float64 if m is t64 else None
            x = torch.tensor(batches[0][i], dtype=dt) if lib is torch else smalltrain.tensor(batches[0][i])
            o.zero_grad()
            f.cross_entropy(m(x), lib.tensor(batches[1][i])).backward()
            o.step()
    ref = dict(t64.named_parameters())
    ours_err = max(max_error(p.detach(), ref[k].detach())[0] for k, p in ours.named_parameters())
    torch_err = max(max_error(p.detach(), ref[k].detach())[0] for k, p in t32.named_parameters())
    print(f"\nMnistCnn SGD lr 0.1, 10 steps, distance to float64: ours {ours_err:.2e}, torch float32 {torch_err:.2e}")
    assert ours_err <= 2 * torch_err + 1e-6

"""The bench's model zoo: small MNIST models written the ordinary PyTorch way (modules, nn.Sequential, `F.*` calls
in forward), each with its optimizer and loss. Every builder takes the library (smalltrain or torch) as `torch`, so
the same source builds both sides of a comparison."""
import inspect
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class ZooModel:
    description: str
    build: Callable          # build(torch) -> nn.Module
    optimizer: Callable      # optimizer(torch, params) -> torch.optim.Optimizer
    loss: str = "cross_entropy"   # the F.* loss of the model's output and the labels


def _lenet5(torch):
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(1, 6, 5), nn.GELU(), nn.MaxPool2d(2), nn.Conv2d(6, 16, 5), nn.GELU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(256, 120), nn.GELU(), nn.Linear(120, 84),
                         nn.GELU(), nn.Linear(84, 10))


def _cnn(torch):
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(1, 16, 3), nn.ReLU(), nn.Conv2d(16, 32, 3), nn.ReLU(), nn.Flatten(),
                         nn.Linear(18432, 10))


def _mlp(torch):
    nn = torch.nn
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))


def _examples_net(torch):
    """The PyTorch examples' MNIST Net (examples/mnist/main.py), as written there."""
    nn, F = torch.nn, torch.nn.functional

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 32, 3, 1)
            self.conv2 = nn.Conv2d(32, 64, 3, 1)
            self.dropout1 = nn.Dropout(0.25)
            self.dropout2 = nn.Dropout(0.5)
            self.fc1 = nn.Linear(9216, 128)
            self.fc2 = nn.Linear(128, 10)

        def forward(self, x):
            x = F.relu(self.conv1(x))
            x = F.relu(self.conv2(x))
            x = F.max_pool2d(x, 2)
            x = self.dropout1(x)
            x = torch.flatten(x, 1)
            x = F.relu(self.fc1(x))
            x = self.dropout2(x)
            x = self.fc2(x)
            return F.log_softmax(x, dim=1)
    return Net()


def _bn_cnn(torch):
    """conv-BatchNorm-ReLU-pool twice and a linear layer, as an nn.Sequential."""
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(64 * 7 * 7, 10))


def _strided(torch):
    """3x3 padding-1 convolutions, strided instead of pooled, without bias before BatchNorm (which would cancel it),
    global average pooling in forward."""
    nn, F = torch.nn, torch.nn.functional

    class StridedNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 16, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(16)
            self.conv2 = nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(32)
            self.conv3 = nn.Conv2d(32, 64, 3, stride=2, padding=1, bias=False)
            self.bn3 = nn.BatchNorm2d(64)
            self.fc = nn.Linear(64, 10)

        def forward(self, x):
            x = F.relu(self.bn1(self.conv1(x)))
            x = F.relu(self.bn2(self.conv2(x)))
            x = F.relu(self.bn3(self.conv3(x)))
            x = F.adaptive_avg_pool2d(x, 1)
            return self.fc(torch.flatten(x, 1))
    return StridedNet()


def _mlp_dropout(torch):
    nn, F = torch.nn, torch.nn.functional

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(784, 512)
            self.fc2 = nn.Linear(512, 256)
            self.fc3 = nn.Linear(256, 10)

        def forward(self, x):
            x = torch.flatten(x, 1)
            x = F.dropout(F.relu(self.fc1(x)), p=0.2, training=self.training)
            x = F.dropout(F.relu(self.fc2(x)), p=0.2, training=self.training)
            return self.fc3(x)
    return MLP()


def _lenet_classic(torch):
    """LeCun's LeNet-5: tanh and average pooling, the first convolution padded to keep 28x28, in F.* calls."""
    nn, F = torch.nn, torch.nn.functional

    class LeNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
            self.conv2 = nn.Conv2d(6, 16, 5)
            self.fc1 = nn.Linear(16 * 5 * 5, 120)
            self.fc2 = nn.Linear(120, 84)
            self.fc3 = nn.Linear(84, 10)

        def forward(self, x):
            x = F.avg_pool2d(torch.tanh(self.conv1(x)), 2)
            x = F.avg_pool2d(torch.tanh(self.conv2(x)), 2)
            x = torch.flatten(x, 1)
            x = torch.tanh(self.fc1(x))
            x = torch.tanh(self.fc2(x))
            return self.fc3(x)
    return LeNet()


ZOO = {
    "lenet5": ZooModel("LeNet-5 (GELU), Adam lr 1e-3", _lenet5, lambda torch, p: torch.optim.Adam(p, lr=1e-3)),
    "cnn": ZooModel("MnistCnn (ReLU), SGD lr 0.1", _cnn, lambda torch, p: torch.optim.SGD(p, lr=0.1)),
    "mlp": ZooModel("MLP 784-256-10 (ReLU), Adam lr 1e-3", _mlp, lambda torch, p: torch.optim.Adam(p, lr=1e-3)),
    "examples-net": ZooModel("the PyTorch examples' MNIST Net (dropout, log_softmax + nll_loss), Adadelta lr 1",
                             _examples_net, lambda torch, p: torch.optim.Adadelta(p, lr=1.0), loss="nll_loss"),
    "bn-cnn": ZooModel("conv-BatchNorm-ReLU-pool x2 + linear, SGD nesterov 0.9, weight decay 5e-4", _bn_cnn,
                       lambda torch, p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True,
                                                        weight_decay=5e-4)),
    "strided": ZooModel("3x3 conv-BN-ReLU, strided, global average pool, AdamW", _strided,
                        lambda torch, p: torch.optim.AdamW(p, lr=1e-3, weight_decay=1e-2)),
    "mlp-dropout": ZooModel("MLP 784-512-256-10 with dropout 0.2 (F.dropout), Adam lr 1e-3", _mlp_dropout,
                            lambda torch, p: torch.optim.Adam(p, lr=1e-3)),
    "lenet-classic": ZooModel("LeNet-5 as LeCun's (tanh, average pooling), SGD momentum 0.9", _lenet_classic,
                              lambda torch, p: torch.optim.SGD(p, lr=0.01, momentum=0.9)),
}
ZOO_BATCHES = (64, 512)


def zoo_model(name):
    try:
        return ZOO[name]
    except KeyError:
        raise ValueError(f"unknown benchmark model {name!r}; expected one of {', '.join(ZOO)}") from None


def build(lib, model):
    """The zoo's `model`, built from `lib` (smalltrain or torch: the same code runs on both)."""
    return zoo_model(model).build(lib)


def make_optimizer(lib, model, params, capturable=False):
    """The optimizer of the zoo's `model` over `params`; capturable=True (torch's CUDA graphs) where the optimizer
    class takes it."""
    opt = zoo_model(model).optimizer(lib, list(params))
    if capturable and "capturable" in inspect.signature(type(opt).__init__).parameters:
        for group in opt.param_groups:
            group["capturable"] = True
    return opt

"""One epoch of the default recipe (LeNet-5, GELU, Adam 1e-3, batch 64) in smalltrain and in PyTorch, same machine.

Also times the data path alone (loading, shuffling, batching an epoch without training) to give its share.
Run: python benchmarks/bench_epoch.py
"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from common import environment  # noqa: E402


def smalltrain_epoch():
    from smalltrain.train import TrainConfig, Trainer
    t = Trainer(TrainConfig(epochs=1, out="/tmp/bench_epoch", progress=False, tensorboard=False))
    t0 = time.perf_counter()
    for _ in t.loader:
        pass
    data = time.perf_counter() - t0
    train = t.train_epoch()
    acc = t.evaluate()["test_accuracy"]
    return train["train_time"], data, acc


def torch_epoch():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    from smalltrain.datasets import MNIST
    torch.set_num_threads(os.cpu_count())
    tr, te = MNIST(train=True), MNIST(train=False)
    norm = lambda d: torch.tensor((d.data.numpy().astype(np.float32) / 255 - 0.1307) / 0.3081)[:, None]  # noqa
    train_set = TensorDataset(norm(tr), torch.tensor(tr.targets.numpy()))
    loader = DataLoader(train_set, batch_size=64, shuffle=True)

    class LeNet5(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = nn.Conv2d(1, 6, 5), nn.Conv2d(6, 16, 5)
            self.fc1, self.fc2, self.fc3 = nn.Linear(256, 120), nn.Linear(120, 84), nn.Linear(84, 10)

        def forward(self, x):
            x = F.max_pool2d(F.gelu(self.conv1(x)), 2)
            x = F.max_pool2d(F.gelu(self.conv2(x)), 2).flatten(1)
            return self.fc3(F.gelu(self.fc2(F.gelu(self.fc1(x)))))
    torch.manual_seed(0)
    model = LeNet5()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    t0 = time.perf_counter()
    for _ in loader:
        pass
    data = time.perf_counter() - t0
    t0 = time.perf_counter()
    for x, y in loader:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    train = time.perf_counter() - t0
    with torch.no_grad():
        acc = (model(norm(te)).argmax(1) == torch.tensor(te.targets.numpy())).float().mean().item()
    return train, data, acc


def main():
    import torch
    rows = []
    for name, fn in (("smalltrain", smalltrain_epoch), ("torch", torch_epoch)):
        train, data, acc = fn()
        rows.append((name, train, data, acc))
        print(f"{name}: epoch {train:.1f} s = {60000 / train:,.0f} samples/s; data path alone {data:.2f} s "
              f"({100 * data / train:.1f}% of the epoch); test accuracy {100 * acc:.2f}%")
    print(environment(torch))
    print(f"smalltrain / torch samples/s: {rows[1][1] / rows[0][1]:.2f}x")


if __name__ == "__main__":
    main()

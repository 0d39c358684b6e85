"""One full training step (zero_grad, forward, cross_entropy, backward, optimizer step), ours vs PyTorch.

The same model code runs on both frameworks (the APIs match), on the same device, from real MNIST batches
resident on that device. Prints samples/s and the ratio.
Run: python benchmarks/bench_train.py [--device cpu|cuda] [--config lenet5:64 lenet5:256 cnn:64]
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from common import environment, table, timeit  # noqa: E402


def build(lib, model):
    nn = lib.nn
    if model == "lenet5":
        return nn.Sequential(nn.Conv2d(1, 6, 5), nn.GELU(), nn.MaxPool2d(2), nn.Conv2d(6, 16, 5), nn.GELU(),
                             nn.MaxPool2d(2), nn.Flatten(), nn.Linear(256, 120), nn.GELU(), nn.Linear(120, 84),
                             nn.GELU(), nn.Linear(84, 10))
    if model == "cnn":
        return nn.Sequential(nn.Conv2d(1, 16, 3), nn.ReLU(), nn.Conv2d(16, 32, 3), nn.ReLU(), nn.Flatten(),
                             nn.Linear(18432, 10))
    raise ValueError(model)


def mnist_batches(batch, count):
    from smalltrain.datasets import MNIST
    ds = MNIST(train=True)
    x = (ds.data.numpy()[: batch * count].astype(np.float32) / 255.0 - 0.1307) / 0.3081
    y = ds.targets.numpy()[: batch * count]
    return x.reshape(count, batch, 1, 28, 28), y.reshape(count, batch)


def make_step(lib, model_name, batch, device, xs, ys):
    lib.manual_seed(0)
    model = build(lib, model_name).to(device)
    opt = lib.optim.Adam(model.parameters(), lr=1e-3) if model_name == "lenet5" else \
        lib.optim.SGD(model.parameters(), lr=0.1)
    F = lib.nn.functional
    bx = [lib.tensor(x).to(device) for x in xs]
    by = [lib.tensor(y).to(device) for y in ys]
    state = {"i": 0}

    def step():
        i = state["i"] = (state["i"] + 1) % len(bx)
        opt.zero_grad()
        loss = F.cross_entropy(model(bx[i]), by[i])
        loss.backward()
        opt.step()
    return step


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--config", nargs="*", default=["lenet5:64", "lenet5:256", "cnn:64"])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--no-torch", action="store_true")
    args = p.parse_args()
    import smalltrain
    torch = None
    if not args.no_torch:
        import torch
        if args.device == "cpu":
            torch.set_num_threads(os.cpu_count())
    rows = []
    for cfg in args.config:
        model, batch = cfg.split(":")
        batch = int(batch)
        xs, ys = mnist_batches(batch, 8)
        inner = max(5, 2000 // batch) if args.device != "cpu" else max(3, 640 // batch)
        libs = [("smalltrain", smalltrain)] + ([("torch", torch)] if torch else [])
        rates = {}
        for name, lib in libs:
            step = make_step(lib, model, batch, args.device, xs, ys)
            sync = (lambda lib=lib: lib.cuda.synchronize()) if args.device != "cpu" else None
            t = timeit(step, warmup=10, repeats=args.repeats, inner=inner, sync=sync)
            rates[name] = batch / t
        ratio = f"{rates['smalltrain'] / rates['torch']:.2f}x" if "torch" in rates else "-"
        rows.append((cfg, f"{rates['smalltrain']:,.0f}", f"{rates.get('torch', 0):,.0f}", ratio))
    print(environment(torch))
    print(f"device {args.device}; full training step; median of {args.repeats} runs, 10 warm-up steps excluded")
    print(table(rows, ["model:batch", "smalltrain samples/s", "torch samples/s", "ours / torch"]))


if __name__ == "__main__":
    main()

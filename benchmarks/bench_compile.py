"""Captured training steps (smalltrain.compile) vs eager, and PyTorch eager / torch.compile modes, on CUDA.

Run on a GPU machine: python benchmarks/bench_compile.py [--config lenet5:64 lenet5:512 cnn:64] [--torch-compile]
Data resident on the GPU; median of several timed runs after warm-up (warm-up includes capture/compilation).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from bench_train import build, mnist_batches  # noqa: E402
from common import environment, table, timeit  # noqa: E402


def make(lib, model_name, batch, xs, ys, mode):
    lib.manual_seed(0)
    model = build(lib, model_name).to("cuda")
    opt = lib.optim.Adam(model.parameters(), lr=1e-3) if model_name == "lenet5" else \
        lib.optim.SGD(model.parameters(), lr=0.1)
    if lib.__name__ == "torch" and model_name == "lenet5" and mode == "reduce-overhead":
        opt = lib.optim.Adam(model.parameters(), lr=1e-3, capturable=True)
    F = lib.nn.functional
    bx = [lib.tensor(x).to("cuda") for x in xs]
    by = [lib.tensor(y).to("cuda") for y in ys]

    def step(x, y):
        opt.zero_grad(set_to_none=False)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss
    if lib.__name__ == "smalltrain" and mode == "graph":
        step = lib.compile(step)
    elif lib.__name__ == "torch" and mode != "eager":
        step = lib.compile(step, mode=None if mode == "default" else mode)
    state = {"i": 0}

    def run():
        state["i"] = (state["i"] + 1) % len(bx)
        step(bx[state["i"]], by[state["i"]])
    return run


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", nargs="*", default=["lenet5:64", "lenet5:512", "cnn:64"])
    p.add_argument("--torch-compile", action="store_true", help="also time torch.compile (slow to compile)")
    args = p.parse_args()
    import torch

    import smalltrain
    modes = [("smalltrain", smalltrain, "eager"), ("smalltrain", smalltrain, "graph"), ("torch", torch, "eager")]
    if args.torch_compile:
        modes += [("torch", torch, "default"), ("torch", torch, "reduce-overhead")]
    rows = []
    for cfg in args.config:
        model, batch = cfg.split(":")
        batch = int(batch)
        xs, ys = mnist_batches(batch, 8)
        rates = {}
        for name, lib, mode in modes:
            try:
                run = make(lib, model, batch, xs, ys, mode)
                t = timeit(run, warmup=20, repeats=7, inner=max(20, 4000 // batch), sync=lib.cuda.synchronize)
                rates[f"{name} {mode}"] = batch / t
            except Exception as e:  # report and go on: one failing mode must not hide the others
                print(f"{cfg} {name} {mode}: {type(e).__name__}: {e}", file=sys.stderr)
        best_torch = max((v for k, v in rates.items() if k.startswith("torch")), default=float("nan"))
        for k, v in rates.items():
            rows.append((cfg, k, f"{v:,.0f}", f"{v / best_torch:.2f}x"))
    print(environment(torch))
    print("CUDA, fp32, full training step; median of 7 runs; warm-up of 20 steps (incl. capture) excluded")
    print(table(rows, ["model:batch", "mode", "samples/s", "vs best torch"]))


if __name__ == "__main__":
    main()

"""Functional forward+backward of conv2d, max_pool2d, gelu and cross_entropy at LeNet-5 shapes, ours vs torch CPU.

Run: python benchmarks/bench_ops.py [--batch 64]   (for an unthrottled NumPy BLAS on these machines:
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_ops.py)
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from common import environment, table, timeit  # noqa: E402

import smalltrain  # noqa: E402


def cases(batch):
    rng = np.random.default_rng(0)
    f = np.float32
    return [
        ("conv2d 1->6 k5 28x28", lambda F: F.conv2d, [rng.standard_normal((batch, 1, 28, 28)).astype(f),
                                                       rng.standard_normal((6, 1, 5, 5)).astype(f),
                                                       rng.standard_normal(6).astype(f)]),
        ("conv2d 6->16 k5 12x12", lambda F: F.conv2d, [rng.standard_normal((batch, 6, 12, 12)).astype(f),
                                                        rng.standard_normal((16, 6, 5, 5)).astype(f),
                                                        rng.standard_normal(16).astype(f)]),
        ("max_pool2d 2 on 6x24x24", lambda F: (lambda x: F.max_pool2d(x, 2)),
         [rng.standard_normal((batch, 6, 24, 24)).astype(f)]),
        ("gelu 6x24x24", lambda F: F.gelu, [rng.standard_normal((batch, 6, 24, 24)).astype(f)]),
        ("cross_entropy 10 classes", lambda F: (lambda x, y: F.cross_entropy(x, y)),
         [rng.standard_normal((batch, 10)).astype(f), rng.integers(0, 10, batch)]),
    ]


def bench(lib, F, fn, arrays):
    ts = [lib.tensor(a, requires_grad=a.dtype == np.float32) for a in arrays]

    def step():
        for t in ts:
            t.grad = None
        out = fn(F)(*ts)
        out.sum().backward()
    return timeit(step, warmup=5, repeats=9, inner=20)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=64)
    args = p.parse_args()
    import torch
    import torch.nn.functional as TF
    torch.set_num_threads(os.cpu_count())
    from smalltrain.nn import functional as SF
    rows = []
    for name, fn, arrays in cases(args.batch):
        ours = bench(smalltrain, SF, fn, arrays)
        theirs = bench(torch, TF, fn, arrays)
        rows.append((name, f"{ours * 1e6:.0f}", f"{theirs * 1e6:.0f}", f"{theirs / ours:.2f}x"))
    print(environment(torch))
    print(f"forward+backward, batch {args.batch}, median of 9 runs x 20 calls, 5 warm-up calls excluded")
    print(table(rows, ["op", "smalltrain us", "torch us", "speed vs torch"]))


if __name__ == "__main__":
    main()

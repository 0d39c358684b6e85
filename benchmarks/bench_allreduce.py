"""All-reduce latency at the gradient sizes of LeNet-5 and MnistCnn, and the DDP step overhead, on CPU over MPI.

Run: mpiexec -n 2 python benchmarks/bench_allreduce.py     (rank 0 prints; median of repeats, warm-up excluded)
"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from bench_train import build  # noqa: E402
from common import timeit  # noqa: E402

import smalltrain  # noqa: E402
import smalltrain.distributed as dist  # noqa: E402


def main():
    group = dist.init_process_group("mpi")
    lines = []
    for name in ("lenet5", "cnn"):
        n = sum(p.numel() for p in build(smalltrain, name).parameters())
        buf = smalltrain.ones(n)
        t = timeit(lambda: dist.all_reduce(buf), warmup=20, repeats=15, inner=50)
        lines.append(f"all_reduce {name} gradients: {n} floats = {4 * n / 1024:.0f} KiB: {t * 1e6:.0f} us")
    for name, batch in (("lenet5", 64), ("cnn", 64)):
        rng = np.random.default_rng(group.rank)
        x = smalltrain.tensor(rng.standard_normal((batch, 1, 28, 28)).astype(np.float32))
        y = smalltrain.tensor(rng.integers(0, 10, batch))
        times = {}
        for wrapped in (False, True):
            smalltrain.manual_seed(0)
            model = build(smalltrain, name)
            if wrapped:
                model = smalltrain.nn.parallel.DistributedDataParallel(model)
            opt = smalltrain.optim.SGD(model.parameters(), lr=0.01)

            def step():
                opt.zero_grad()
                smalltrain.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
            dist.barrier()
            times[wrapped] = timeit(step, warmup=3, repeats=7, inner=5)
        lines.append(f"{name} batch {batch}/rank: step {times[False] * 1e3:.1f} ms alone, {times[True] * 1e3:.1f} ms "
                     f"in DDP over {group.world_size} ranks (+{100 * (times[True] / times[False] - 1):.0f}%)")
    if group.rank == 0:
        print(f"{group.world_size} processes, MPI, {os.cpu_count()} cpus; median of repeats after warm-up")
        print("\n".join(lines))
    time.sleep(0.1)


if __name__ == "__main__":
    main()

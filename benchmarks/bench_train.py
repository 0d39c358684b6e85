"""One full training step (zero_grad, forward, cross_entropy, backward, optimizer step), ours vs PyTorch, eager.

The same model code runs on both frameworks (the APIs match), on the same device, from real MNIST batches
resident on that device. Prints samples/s and the ratio to PyTorch. A thin wrapper over smalltrain/bench/:
`smalltrain bench --modes smalltrain-eager torch-eager`, with the CPU as the default device.
Run: python benchmarks/bench_train.py [--device cpu|cuda] [--config lenet5:64 lenet5:256 cnn:64] [--no-torch]
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from smalltrain import bench
from smalltrain.bench import build, make_step, mnist_batches

__all__ = ["build", "main", "make_step", "mnist_batches"]   # bench_allreduce.py imports build from here


def main(argv=None):
    p = bench.parser(prog="bench_train.py")
    p.set_defaults(device="cpu", modes=["smalltrain-eager", "torch-eager"],
                   config=[("lenet5", 64), ("lenet5", 256), ("cnn", 64)])
    return bench.main(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

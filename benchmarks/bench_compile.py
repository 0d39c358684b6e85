"""Captured training steps (smalltrain.compile) vs eager, beside PyTorch eager and torch.compile modes, on CUDA.

A thin wrapper over smalltrain/bench/: `smalltrain bench --device cuda`, with torch.compile and its
reduce-overhead mode only on request (they take minutes to compile).
Run on a GPU machine: python benchmarks/bench_compile.py [--config lenet5:64 lenet5:512 cnn:64] [--torch-compile]
                                                        [--set module.NAME=value ...]
Data resident on the GPU; median of several timed runs after warm-up (warm-up includes capture/compilation).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from common import apply_settings  # noqa: E402
from smalltrain import bench  # noqa: E402


def main(argv=None):
    p = bench.parser(prog="bench_compile.py")
    p.add_argument("--torch-compile", action="store_true", help="also time torch.compile (slow to compile)")
    p.add_argument("--set", action="append", metavar="MODULE.NAME=VALUE",
                   help="set a module-level knob first, e.g. smalltrain.backend.cuda.linear.CHAIN_STAGE=False "
                        "(repeatable; "
                        "modes that run in processes of their own, as on the CPU, do not see it)")
    p.set_defaults(device="cuda")
    args = p.parse_args(argv)
    apply_settings(args.set)
    args.no_torch_compile = args.no_torch_compile or not args.torch_compile
    return bench.main(args)


if __name__ == "__main__":
    sys.exit(main())

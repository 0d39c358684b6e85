"""Where the host time of one eager training step goes: cProfile over N steps, top functions by own time.

Run: python benchmarks/profile_step.py [--device cuda] [--config lenet5:64] [--steps 200] [--sort tottime,cumtime]
The GPU is synchronized once at the end, so on CUDA the profile is the Python dispatch plus launch cost.
"""
import argparse
import cProfile
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from smalltrain.bench import make_step, mnist_batches


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--config", default="lenet5:64")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--sort", default="tottime", help="pstats sort key(s), comma-separated: tottime, cumtime, ...")
    args = p.parse_args()
    import smalltrain
    model, batch = args.config.split(":")
    xs, ys = mnist_batches(int(batch), 8)
    step = make_step(smalltrain, model, args.device, xs, ys)
    sync = smalltrain.cuda.synchronize if args.device != "cpu" else (lambda: None)
    for _ in range(20):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync()
    plain = (time.perf_counter() - t0) / args.steps
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.steps):
        step()
    sync()
    prof.disable()
    print(f"{args.config} on {args.device}: {plain * 1e6:.0f} us per step without the profiler")
    for key in args.sort.split(","):
        pstats.Stats(prof).sort_stats(key).print_stats(args.top)


if __name__ == "__main__":
    main()

"""Per-kernel GPU time of one eager training step, read by Nsight Compute (ncu), summarized by kernel name.

Run on the GPU machine:
  ncu --clock-control none --profile-from-start off --csv --metrics gpu__time_duration.sum \
      python3 benchmarks/kernel_times.py --config lenet5:512 > ncu.csv
  python3 benchmarks/kernel_times.py --summarize ncu.csv
The step is warmed up first; only the profiled step (between cudaProfilerStart/Stop) is read. ncu serializes
kernels, so the sum is the step's GPU work without launch gaps: the floor a CUDA-graph replay approaches.
"""
import argparse
import csv
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def profile(config, steps):
    import smalltrain
    from smalltrain import bench
    from smalltrain.backend.cuda import cupy
    model, batch = config.split(":")
    xs, ys = bench.mnist_batches(int(batch), 2)
    run = bench.make_step(smalltrain, model, "cuda", xs, ys)
    for _ in range(5):
        run()
    smalltrain.cuda.synchronize()
    cp = cupy()
    cp.cuda.profiler.start()
    for _ in range(steps):
        run()
    smalltrain.cuda.synchronize()
    cp.cuda.profiler.stop()


def summarize(path):
    with open(path) as f:
        lines = [line for line in f if line.startswith('"')]
    by_name = defaultdict(lambda: [0, 0.0])
    total = 0.0
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(row["Metric Value"].replace(",", ""))
        scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}.get(row.get("Metric Unit", "nsecond"), 1e-3)
        name = row["Kernel Name"].split("(")[0][:60]
        by_name[name][0] += 1
        by_name[name][1] += value * scale
        total += value * scale
    print(f"{sum(c for c, _ in by_name.values())} kernels, {total:.1f} us of GPU time")
    for name, (count, us) in sorted(by_name.items(), key=lambda kv: -kv[1][1]):
        print(f"{us:9.1f} us  {count:4d}x  {name}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", default="lenet5:512")
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--summarize", metavar="CSV")
    p.add_argument("--set", action="append", metavar="MODULE.NAME=VALUE",
                   help="set a module-level knob first, e.g. smalltrain.backend.cuda.linear.CHAIN_STAGE=False "
                        "(repeatable)")
    args = p.parse_args()
    from common import apply_settings
    apply_settings(args.set)
    if args.summarize:
        summarize(args.summarize)
    else:
        profile(args.config, args.steps)


if __name__ == "__main__":
    main()

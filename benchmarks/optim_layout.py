"""Does a flat parameter buffer pay for the fused optimizer? One Adam launch over a model's parameters as they are
(separate arrays, read through the kernel's table of addresses: smalltrain's fused path) against the same launch
over one flat buffer of the same size (one table entry: what parameters and gradients as views of a flat buffer
would give the kernel).

Both run backend/cuda/optim.adam_step, the kernel of a captured step, with the step counter on the device. The
flat form's results are compared with the separate form's, element for element (the same arithmetic per element,
so bit-equal).

Run (GPU): python3 benchmarks/optim_layout.py [--model lenet5] [--reps 100]
Each time: GPU microseconds per launch, from graph replays of `reps` launches timed by CUDA events, median of 5
(benchmarks/common.py timed).
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from common import environment, timed  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", nargs="+", default=["lenet5", "cnn"])
    p.add_argument("--reps", type=int, default=100)
    args = p.parse_args(argv)
    from smalltrain import models
    from smalltrain.backend.cuda import cupy, optim
    cp = cupy()
    print(environment(None, "cuda"))
    rng = np.random.default_rng(0)
    for name in args.model:
        shapes = [tuple(q.shape) for q in models.build(name).parameters()]
        sizes = [int(np.prod(s)) for s in shapes]
        total = sum(sizes)

        def state():   # params, grads, exp_avg, exp_avg_sq as flat host arrays
            return [rng.standard_normal(total).astype(np.float32) for _ in range(3)] + \
                [np.abs(rng.standard_normal(total)).astype(np.float32)]
        host = state()
        flat = [cp.asarray(a) for a in host]
        parts = []
        for a in host:
            dev = cp.asarray(a)
            parts.append([dev[o:o + n].reshape(s).copy() for o, n, s in
                          zip(np.cumsum([0] + sizes[:-1]), sizes, shapes)])
        step_flat, step_parts = cp.zeros(1, np.float64), cp.zeros(1, np.float64)

        def run_flat():
            optim.adam_step([flat[0]], [flat[1]], [flat[2]], [flat[3]], step=step_flat, lr=1e-3)

        def run_parts():
            optim.adam_step(*parts, step=step_parts, lr=1e-3)
        run_flat()
        run_parts()
        joined = [cp.concatenate([x.ravel() for x in lst]) for lst in parts]
        same = all(bool((a == b).all()) for a, b in zip(flat, joined))
        t_parts = timed(cp, run_parts, args.reps)
        t_flat = timed(cp, run_flat, args.reps)
        print(f"{name}: {len(shapes)} parameters, {total:,} elements; Adam over the separate arrays "
              f"{t_parts:.2f} us, over one flat buffer {t_flat:.2f} us; results equal: {same}")


if __name__ == "__main__":
    main()

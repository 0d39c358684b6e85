"""GPU time of MnistCnn's classifier, Linear(18432, 10) over conv2's activated output (backend/cuda/linear.py): the
wide forward, and the backward two ways on the same inputs: the linear backward then the transpose-and-derivative
kernel that makes conv2's g (the unfused layers), against linear_backward_into_conv (wide_bwd writing g itself,
what Conv2dActLinear runs).

Run (GPU): python3 benchmarks/linear_variants.py [--batches 64,512]
Each figure: GPU microseconds per call from 100 calls captured in one CUDA graph (benchmarks/common.py timed: one
warm-up replay excluded, median of 5 replays).
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from common import timed  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batches", default="64,512")
    args = p.parse_args()
    import cupy as cp

    from smalltrain.backend.cuda import conv, linear
    rng = np.random.default_rng(0)
    for m in (int(b) for b in args.batches.split(",")):
        x4 = cp.asarray(rng.standard_normal((m, 16, 26, 26)).astype(np.float32))
        w = cp.asarray((rng.standard_normal((32, 16, 3, 3)) * 0.2).astype(np.float32))
        b = cp.asarray(rng.standard_normal(32).astype(np.float32))
        out, saved = conv.conv2d_forward(x4, w, b, activation="relu")
        x = out.reshape(m, -1)
        lw = cp.asarray((rng.standard_normal((10, x.shape[1])) / 100).astype(np.float32))
        lb = cp.asarray(rng.standard_normal(10).astype(np.float32))
        t = timed(cp, lambda: linear.linear_act_forward(x, lw, lb))
        print(f"batch {m:<4} wide_fwd (chunks {linear.wide_chunks(m, x.shape[1])[0]}): {t:.2f} us")
        _, lsaved = linear.linear_act_forward(x, lw, lb)
        dout = cp.asarray(rng.standard_normal((m, 10)).astype(np.float32))
        o, p_ = 32, out.shape[2] * out.shape[3]
        g = cp.empty((o, m * p_), cp.float32)

        def unfused():
            dx = linear.linear_act_backward(dout, lsaved)[0]
            conv.bias_act_backward(dx, saved.y, saved.bias, g, m, o, p_, conv.ACTIVATIONS["relu"])

        t_lin = timed(cp, lambda: linear.linear_act_backward(dout, lsaved))
        t_two = timed(cp, unfused)
        t_fused = timed(cp, lambda: linear.linear_backward_into_conv(dout, lsaved, saved))
        unfused()
        diff = float(cp.abs(linear.linear_backward_into_conv(dout, lsaved, saved)[0] - g).max())
        print(f"batch {m:<4} backward to conv2's g: linear backward {t_lin:.2f} + derivative kernel "
              f"{t_two - t_lin:.2f} = {t_two:.2f} us; linear_backward_into_conv {t_fused:.2f} us "
              f"(max diff {diff:.1e})")


if __name__ == "__main__":
    main()

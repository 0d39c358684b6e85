"""What does a dependent kernel launch cost inside a CUDA graph, and how much of it does programmatic dependent
launch (PDL) take away?

A probe for the captured training step, which is a chain of ~8 dependent kernels of 3-35 us on its main stream: the
step takes ~10 us more than its kernels' ncu times at LeNet-5 b64. This script captures chains of identical small
kernels (each reads the previous one's output) into one graph and times a replay per kernel, four ways:
  - cupy: CuPy's launch (cuLaunchKernel), a plain stream-order edge between the kernels;
  - ex: the same through cuLaunchKernelEx without attributes (graphs.launch_ex, the package's PDL path, as a
    control);
  - pdl wait: cuLaunchKernelEx with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION; each kernel waits
    (griddepcontrol.wait) for its predecessor's completion and memory before touching anything;
  - pdl trigger: as pdl wait, and each kernel lets its dependent launch at once (griddepcontrol.launch_dependents
    first), so that the dependent's blocks are resident and waiting when the kernel ends.
Each chain's final output is compared with the cupy chain's (bit-equal where the waits hold).

Run (GPU): python3 benchmarks/pdl_probe.py [--kernels 8] [--sizes 16384 262144 2097152]
Each time: GPU microseconds per kernel, from graph replays of 10 chains timed by CUDA events, median of 7.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from common import environment  # noqa: E402

SOURCE = r"""
extern "C" __global__ void chain_step(const float* __restrict__ in, float* __restrict__ out, int n, int mode) {
    if (mode & 2) asm volatile("griddepcontrol.launch_dependents;");
    if (mode & 1) asm volatile("griddepcontrol.wait;" ::: "memory");
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = in[i] * 1.0001f + 1.0f;
}
"""


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernels", type=int, default=8)
    p.add_argument("--sizes", type=int, nargs="+", default=[16384, 262144, 2097152])
    args = p.parse_args(argv)
    from smalltrain.backend.cuda import cupy, graphs
    cp = cupy()
    print(environment(None, "cuda"))
    kern = cp.RawModule(code=SOURCE, options=("-std=c++17",)).get_function("chain_step")
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    print(f"{'floats':>9} {'blocks':>6}  {'cupy':>8} {'ex':>8} {'pdl wait':>9} {'pdl trigger':>12}   us a kernel")
    for n in args.sizes:
        blocks = min(sms * 4, (n + 255) // 256)
        bufs = [cp.arange(n, dtype=cp.float32) for _ in range(args.kernels + 1)]

        def chain(how):
            for k in range(args.kernels):
                src, dst = bufs[k], bufs[k + 1]
                if how == "cupy":
                    kern((blocks,), (256,), (src, dst, np.int32(n), np.int32(0)))
                    continue
                mode = {"ex": 0, "pdl wait": 1, "pdl trigger": 3}[how]
                graphs.launch_ex(kern, (blocks,), (256,), (src, dst, np.int32(n), np.int32(mode)),
                                 programmatic=mode != 0)   # (on the current stream: the capturing one)

        row, results = [], {}
        for how in ("cupy", "ex", "pdl wait", "pdl trigger"):
            for b in bufs[1:]:
                b.fill(0)
            stream = cp.cuda.Stream(non_blocking=True)
            with stream:
                stream.begin_capture()
                for _ in range(10):
                    chain(how)
                graph = stream.end_capture()
                graph.launch(stream)
                stream.synchronize()
                results[how] = cp.asnumpy(bufs[-1])
                times = []
                for _ in range(7):
                    a, b = cp.cuda.Event(), cp.cuda.Event()
                    a.record(stream)
                    graph.launch(stream)
                    b.record(stream)
                    b.synchronize()
                    times.append(cp.cuda.get_elapsed_time(a, b) * 1e3 / (10 * args.kernels))
            row.append(float(np.median(times)))
        same = all(np.array_equal(results["cupy"], r) for r in results.values())
        print(f"{n:>9} {blocks:>6}  {row[0]:>8.2f} {row[1]:>8.2f} {row[2]:>9.2f} {row[3]:>12.2f}   "
              f"outputs {'bit-equal' if same else 'DIFFER'}")


if __name__ == "__main__":
    main()

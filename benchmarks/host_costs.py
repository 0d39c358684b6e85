"""Host time of the primitives an eager CUDA step is made of, to see where the per-op overhead goes.

Run on a GPU machine: python3 benchmarks/host_costs.py
Each line is the median over 7 repeats of 2000 calls (200 warm-up calls excluded), in microseconds per call,
with the GPU synchronized only between repeats: launches are asynchronous, so this is host time, not GPU time.
The last lines put one whole smalltrain op (Python dispatch, autograd node, launch) beside the same torch op.
"""
import ctypes
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def per_call(fn, calls=2000, repeats=7, sync=None):
    for _ in range(200):
        fn()
    times = []
    for _ in range(repeats):
        if sync:
            sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls)
    if sync:
        sync()
    return float(np.median(times)) * 1e6


def _enter_exit(device):
    with device:
        pass


def main():
    import cupy as cp

    import smalltrain as st
    from smalltrain.backend.cuda import blas, loader
    from smalltrain.backend.cuda._common import get, launch
    sync = cp.cuda.Device().synchronize
    x = cp.random.standard_normal((64, 120), dtype=cp.float32)
    w = cp.random.standard_normal((120, 84), dtype=cp.float32)
    out = cp.empty((64, 120), cp.float32)
    relu = get("activation", "act_fwd", cp.float32)
    lib = blas._get()
    h = lib.handle()
    alpha, beta = lib.scalar("f", 1.0), lib.scalar("f", 0.0)
    prod = cp.empty((64, 84), cp.float32)
    ptrs = (w.data.ptr, x.data.ptr, prod.data.ptr)
    rows = [
        ("cupy.cuda.Device().id", lambda: cp.cuda.Device().id),
        ("cupy.cuda.runtime.getDevice()", lambda: cp.cuda.runtime.getDevice()),
        ("cupy.cuda.get_current_stream().ptr", lambda: cp.cuda.get_current_stream().ptr),
        ("array.data.ptr", lambda: x.data.ptr),
        ("cupy.empty((64, 120))", lambda: cp.empty((64, 120), cp.float32)),
        ("with array.device: (enter + exit)", lambda: _enter_exit(x.device)),
        ("loader.kernel lookup", lambda: loader.kernel("activation", "act_fwd_f32")),
        ("RawKernel launch, 4 args (2 arrays, int64, int32)",
         lambda: relu((60,), (128,), (x, out, np.int64(x.size), np.int32(1)))),
        ("RawKernel launch, 4 args as raw pointers and ints",
         lambda: relu((60,), (128,), (np.uintp(x.data.ptr), np.uintp(out.data.ptr), np.int64(x.size), np.int32(1)))),
        ("launch() helper (lookup + grid + launch)",
         lambda: launch("activation", "act_fwd", cp.float32, x.size, (x, out, np.int64(x.size), np.int32(1)))),
        ("cupy elementwise x * 2 (new array)", lambda: x * 2),
        ("cublasSgemm via ctypes, arguments ready", lambda: lib.cublasSgemm_v2(
            h, 0, 0, 84, 64, 120, alpha, ptrs[0], 84, ptrs[1], 120, beta, ptrs[2], 84)),
        ("blas.gemm(x, w) (layouts, handle, call)", lambda: blas.gemm(x, w)),
    ]
    libc_abs = ctypes.CDLL(None).abs
    rows.append(("ctypes call of libc abs (the FFI floor)", lambda: libc_abs(1)))
    t = st.randn(64, 120, device="cuda")
    tw = st.randn(84, 120, device="cuda", requires_grad=True)
    rows += [
        ("smalltrain relu (op, no grad)", lambda: st.nn.functional.relu(t)),
        ("smalltrain linear (op + autograd node)", lambda: st.nn.functional.linear(t, tw)),
    ]
    try:
        import torch
        tt = torch.randn(64, 120, device="cuda")
        ttw = torch.randn(84, 120, device="cuda", requires_grad=True)
        rows += [("torch relu", lambda: torch.relu(tt)),
                 ("torch linear (op + autograd node)", lambda: torch.nn.functional.linear(tt, ttw))]
    except Exception as e:  # torch is optional here
        print(f"(torch rows skipped: {type(e).__name__}: {e})")
    print(f"host us per call (median of 7 x 2000, 200 warm-up calls excluded); cupy {cp.__version__}")
    for name, fn in rows:
        print(f"{name:48s} {per_call(fn, sync=sync):8.2f}")
    compiled_step_rows(sync)


def compiled_step_rows(sync):
    """The host side of one replayed training step (bench's compiled LeNet-5 b64 step) and of its parts, timed in
    bursts of 10 calls after a sync so that the GPU queue never fills: if the whole step's host time is below its
    GPU time (bench's us/step), the replay is GPU-bound."""
    import smalltrain as st
    from smalltrain import bench
    from smalltrain.compile_ import _copy_into
    xs, ys = bench.mnist_batches(64, 8)
    run = bench.make_step(st, "lenet5", "cuda", xs, ys, mode="compiled")
    for _ in range(10):
        run()
    sync()
    graph, static_args, _, _ = next(e for e in run.step.entries.values() if e != "eager")
    src = static_args[0].array.copy()
    rows = [("compiled LeNet-5 b64 step: whole call", run),
            ("  graph.replay() (hooks + cudaGraphLaunch)", graph.replay),
            ("  one static-input copy (64x1x28x28)", lambda: _copy_into(static_args[0].array, src))]
    print("host us per call, bursts of 10 calls between syncs (median of 21; 10 warm-up steps excluded)")
    for name, fn in rows:
        print(f"{name:48s} {per_call(fn, calls=10, repeats=21, sync=sync):8.2f}")


if __name__ == "__main__":
    main()

"""Shared benchmark plumbing, kept for the scripts that import it: timing (warm-up excluded, median of repeats),
the environment line and the result table live in smalltrain/bench.py (one copy, also behind `smalltrain bench`);
`timed` is the GPU time of a few-microsecond call, from a CUDA graph of many (the kernel-variant scripts)."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from smalltrain.bench import environment, table, timeit

__all__ = ["environment", "table", "timed", "timeit"]


def timed(cp, fn, reps=100, runs=5):
    """GPU microseconds per call of fn: `reps` calls captured into one CUDA graph, the graph replayed `runs` times
    (each timed by CUDA events, after one warm-up replay), the median / reps. A graph, because launching
    these few-microsecond kernels one by one from Python is host-bound (an earlier version of this script timed
    queued launches and measured the host's launch rate instead)."""
    fn()
    stream = cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device().synchronize()
    with stream:
        stream.begin_capture()
        for _ in range(reps):
            fn()
        graph = stream.end_capture()
    graph.launch(stream)
    out = []
    for _ in range(runs):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record(stream)
        graph.launch(stream)
        b.record(stream)
        b.synchronize()
        out.append(cp.cuda.get_elapsed_time(a, b) * 1e3 / reps)
    return float(np.median(out))


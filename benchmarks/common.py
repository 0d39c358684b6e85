"""Shared benchmark plumbing, kept for the scripts that import it: timing (warm-up excluded, median of repeats),
the environment line and the result table live in smalltrain/bench.py (one copy, also behind `smalltrain bench`);
`timed` is the GPU time of a few-microsecond call, from a CUDA graph of many (the kernel-variant scripts);
`apply_settings` sets module-level knobs for an A/B run (`--set smalltrain.backend.cuda.linear.CHAIN_STAGE=False`)."""
import ast
import importlib
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from smalltrain.bench import environment, table, timeit

__all__ = ["apply_settings", "environment", "table", "timed", "timeit"]


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



def apply_settings(settings):
    """Set module attributes from "package.module.NAME=value" strings (value a Python literal); the attribute must
    exist already, so that a misspelled knob fails instead of being ignored."""
    for item in settings or ():
        target, sep, value = item.partition("=")
        module_name, _, name = target.rpartition(".")
        if not sep or not module_name:
            raise SystemExit(f"--set: expected module.NAME=value, got {item!r}")
        module = importlib.import_module(module_name)
        if not hasattr(module, name):
            raise SystemExit(f"--set: {module_name} has no attribute {name!r}")
        setattr(module, name, ast.literal_eval(value))

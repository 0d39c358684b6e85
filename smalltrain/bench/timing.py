"""Timing for the bench: median of interleaved runs, each ended by a device sync, warm-up excluded; and the
wall time since the process started (the first-step and speedrun reports)."""
import os
import statistics
import time


def timeit(fn, warmup=3, repeats=7, inner=1, sync=None):
    """Median seconds per call of fn() over `repeats` timed runs of `inner` calls, after `warmup` calls; `sync`
    (the device's synchronize) ends the warm-up and each timed run."""
    for _ in range(warmup):
        fn()
    if sync:
        sync()
    run = timed_run(fn, inner, sync)
    return statistics.median([run() for _ in range(repeats)])


def timed_run(fn, inner=1, sync=None, pre=0):
    """A callable that calls fn() `inner` times, then `sync` (the device's synchronize), and returns the seconds
    per call. `pre`: calls before the clock starts (then a sync), so that a run measures the mode's steady state
    and not its start after another mode's run (on an H100 the captured LeNet-5 b512 step timed ~9 us slower right
    after torch's runs than after its own)."""
    def run():
        for _ in range(pre):
            fn()
        if pre and sync:
            sync()
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        if sync:
            sync()
        return (time.perf_counter() - t0) / inner
    return run


def median_interleaved(runs, repeats=7, settle=0.0):
    """{key: median seconds per call} of several timed runs side by side (runs[key]() times one run and returns
    seconds per call, as timed_run's callables). The runs go round-robin (run r of every key, then run r + 1), so
    that a drift of the host's speed during the measurement (frequent on shared VMs) reaches every key alike instead
    of whichever ran last. `settle`: seconds of sleep before each run, for CPU runtimes whose idle worker threads
    spin after a call (OpenBLAS's for ~0.1 s, OpenMP's) and would take the cores from the next run."""
    times = {key: [] for key in runs}
    for _ in range(repeats):
        for key, run in runs.items():
            if settle:
                time.sleep(settle)
            times[key].append(run())
    return {key: statistics.median(t) for key, t in times.items()}


def seconds_since_process_start():
    """Wall seconds since this process started (Linux /proc; None elsewhere), at 10 ms resolution."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return None

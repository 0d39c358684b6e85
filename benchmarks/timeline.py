"""The timeline of a captured training step's graph replay: when each kernel starts and ends, on which stream, and
how much of the step no kernel runs.

ncu (kernel_times.py) serializes kernels, so it gives each kernel's time but not how the graph's streams overlap
them; this shows the replays as they run, read by CUPTI through PyTorch's profiler (Kineto), which records every
kernel of the process, CuPy's launches and graph nodes included. Run on the GPU machine:
  python3 benchmarks/timeline.py --config lenet5:512 [--trace tl.json] [--set MODULE.NAME=VALUE ...]
  python3 benchmarks/timeline.py --summarize tl.json
The step is captured and warmed up first (20 calls, untraced); the summary takes the replay of median length among
the traced ones. With PDL a kernel may start before its predecessor ends and wait in its first instruction
(ST_GRID_WAIT): its bar then begins early.
"""
import argparse
import json
import os
import statistics
import sys
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def profile(config, steps, trace):
    import torch
    import smalltrain
    from smalltrain import bench
    model, batch = config.split(":")
    xs, ys = bench.mnist_batches(int(batch), 2)
    run = bench.make_step(smalltrain, model, "cuda", xs, ys, mode="compiled")
    for _ in range(20):
        run()
    smalltrain.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            run()
        smalltrain.cuda.synchronize()
    prof.export_chrome_trace(trace)


def read_trace(path):
    """The trace's GPU activities (kernels, copies, fills) as dicts (start and end in us, stream, name, correlation
    id, grid), sorted by start."""
    with open(path) as f:
        events = json.load(f)
    events = events.get("traceEvents", events) if isinstance(events, dict) else events
    out = []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        args = e.get("args", {})
        grid = args.get("grid", [""])
        out.append({"start": float(e["ts"]), "end": float(e["ts"]) + float(e["dur"]),
                    "stream": str(args.get("stream", e.get("tid"))), "name": e["name"].split("(")[0][:48],
                    "corr": args.get("correlation"), "grid": grid[0] if isinstance(grid, list) else grid})
    return sorted(out, key=lambda a: a["start"])


def replays(acts):
    """The activities grouped by graph launch: a graph's nodes share the launch's correlation id."""
    groups = defaultdict(list)
    for a in acts:
        groups[a["corr"]].append(a)
    return sorted((g for g in groups.values() if len(g) >= 3), key=lambda g: g[0]["start"])


def busy_time(group):
    """How long at least one of the group's activities runs (the union of their intervals)."""
    total, end = 0.0, None
    for a in sorted(group, key=lambda a: a["start"]):
        if end is None or a["start"] > end:
            total += a["end"] - a["start"]
            end = a["end"]
        elif a["end"] > end:
            total += a["end"] - end
            end = a["end"]
    return total


def summarize(path):
    acts = read_trace(path)
    groups = replays(acts)
    if not groups:   # (the activities as they came, to see why)
        for a in acts[:60]:
            print(f"{a['start'] - acts[0]['start']:9.1f} {a['end'] - a['start']:6.1f} {a['stream']:>4} {a['corr']} "
                  f"{a['name']}")
        raise SystemExit(f"{path}: no graph replays (activities sharing a correlation id) in the trace")
    spans = [max(a["end"] for a in g) - g[0]["start"] for g in groups]
    median = statistics.median(spans)
    k = min(range(1, len(groups)), key=lambda k: abs(max(a["end"] for a in groups[k]) - groups[k][0]["start"] -
                                                      median)) if len(groups) > 1 else 0
    g = groups[k]
    t0 = g[0]["start"]
    # what runs between the replay before and this one (a compiled step's input copies), and the replays' period
    in_graph = {id(a) for group in groups for a in group}
    before = [a for a in acts if id(a) not in in_graph and k and groups[k - 1][0]["start"] < a["start"] < t0]
    g = before + g
    streams = {}
    for a in g:
        streams.setdefault(a["stream"], f"s{len(streams)}")
    replay = groups[k]
    print(f"{len(groups)} replays, {len(replay)} activities each; span median {median:.1f} us "
          f"(min {min(spans):.1f}, max {max(spans):.1f})")
    periods = [b[0]["start"] - a[0]["start"] for a, b in zip(groups, groups[1:])]
    print(f"the median replay: busy {busy_time(replay):.1f} us, no kernel running {median - busy_time(replay):.1f} "
          f"us; from one replay's start to the next's: median {statistics.median(periods):.1f} us, before this one "
          f"{t0 - groups[k - 1][0]['start']:.1f} us" if periods else "")
    print(f"{'start':>7} {'end':>7} {'us':>6}  strm  {'grid':>6}  name")
    for a in g:
        print(f"{a['start'] - t0:7.1f} {a['end'] - t0:7.1f} {a['end'] - a['start']:6.1f}  {streams[a['stream']]:>4}  "
              f"{a['grid']:>6}  {a['name']}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", default="lenet5:512")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--trace", default="timeline.json", help="where the traced replays are written (Chrome JSON)")
    p.add_argument("--summarize", metavar="JSON", help="only summarize a trace written before")
    p.add_argument("--set", action="append", metavar="MODULE.NAME=VALUE",
                   help="set a module-level knob first (repeatable)")
    args = p.parse_args()
    from common import apply_settings
    apply_settings(args.set)
    if not args.summarize:
        profile(args.config, args.steps, args.trace)
    summarize(args.summarize or args.trace)


if __name__ == "__main__":
    main()

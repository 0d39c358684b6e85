"""The kernels a training step launches and their plans (grid, block, dynamic shared memory, scalar arguments), recorded
on the CUDA emulator: no GPU needed. It shows what a knob changes before any device time goes into timing it.

  python benchmarks/launch_plans.py --config cnn:64 --tune conv.tile_min_threads=128

prints the step's launches under the defaults, then, with --tune (an entry of a family's tuning table, e.g. the conv
table's: smalltrain/backend/cuda/conv/plan.py CONV) or --set (a module-level name), the launches that differ. Each
setting runs in a process of its own, because plans are cached per process.
  --mode eager (default): one eager step (zero_grad, forward, loss, backward, optimizer step) after a warm-up step.
  --mode compiled: the launches smalltrain.compile's step captures into its CUDA graph (what the bench times).
The emulator reports an H200's 132 SMs, as many as an H100 SXM has, so the plans are the devices' plans. It runs
every kernel thread by thread: LeNet-5 at batch 512 takes a few seconds a step.
"""
import argparse
import difflib
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "tooling"))


def record(config, mode):
    """[(kernel name, grid, block, dynamic shared bytes, scalar arguments)] of one step of `config` ("model:batch")
    in `mode`."""
    import cuda_emulator   # test tooling (tests/tooling), on sys.path above
    cuda_emulator.install()
    import smalltrain
    from smalltrain import bench
    model, batch = config.split(":")
    xs, ys = bench.mnist_batches(int(batch), 2)
    launches, recording = [], [False]
    prepare = cuda_emulator.Kernel._prepare

    def recorded(kernel, grid, block, args, shared_mem):
        if recording[0] and (mode == "eager" or cuda_emulator._capture):
            # the scalar arguments too (rows per tile, row groups, ...: a plan's choices the launch shape may hide);
            # arrays as "*", their addresses differ from run to run
            scalars = tuple(a.item() if isinstance(a, np.generic) else "*" for a in map(cuda_emulator._unwrap, args))
            launches.append((kernel.name, tuple(grid) if isinstance(grid, (tuple, list)) else (grid,),
                             tuple(block) if isinstance(block, (tuple, list)) else (block,), int(shared_mem), scalars))
        return prepare(kernel, grid, block, args, shared_mem)

    cuda_emulator.Kernel._prepare = recorded
    step = bench.make_step(smalltrain, model, "cuda", xs, ys, mode=mode)
    if mode == "eager":
        step()   # the warm-up step: caches and the optimizer's state
    recording[0] = True
    for _ in range(1 if mode == "eager" else 4):   # compiled: warm-up steps, then the capture
        step()
    return launches


def lines(launches):
    return [f"{name} grid {list(grid)} block {list(block)} smem {smem} args ({' '.join(map(str, scalars))})"
            for name, grid, block, smem, scalars in launches]


TABLES = {"conv": ("smalltrain.backend.cuda.conv", "CONV")}   # --tune's families: module, table


def tuned(tunes):
    """A context manager that overrides the tuning entries `tunes` ("family.entry=value" strings)."""
    import ast
    import contextlib
    import importlib

    from smalltrain.backend.cuda.tuning import override
    stack = contextlib.ExitStack()
    for t in tunes:
        key, _, value = t.partition("=")
        family, _, entry = key.partition(".")
        if family not in TABLES or not entry or not value:
            raise SystemExit(f"launch_plans: --tune takes family.entry=value with a family of {sorted(TABLES)}, "
                             f"got {t!r}")
        module, table = TABLES[family]
        stack.enter_context(override(getattr(importlib.import_module(module), table),
                                     **{entry: ast.literal_eval(value)}))
    return stack


def run_recorder(config, mode, settings, tunes=()):
    """lines() of a step recorded in a fresh process under `settings` (module.NAME=value strings) and `tunes`
    (family.entry=value strings)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--config", config, "--mode", mode, "--record-only"]
    for s in settings:
        cmd += ["--set", s]
    for t in tunes:
        cmd += ["--tune", t]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"launch_plans: the recording under {settings or 'the defaults'} failed:\n{out.stderr}")
    return out.stdout.splitlines()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="lenet5:64", help="model:batch, as the bench names them (default lenet5:64)")
    p.add_argument("--mode", choices=("eager", "compiled"), default="eager")
    p.add_argument("--set", action="append", default=[], metavar="MODULE.NAME=VALUE",
                   help="a module-level knob for the second recording (repeatable)")
    p.add_argument("--tune", action="append", default=[], metavar="FAMILY.ENTRY=VALUE",
                   help="a tuning-table entry for the second recording, e.g. conv.tile_min_threads=128 (repeatable)")
    p.add_argument("--record-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.record_only:
        from common import apply_settings
        apply_settings(args.set)
        with tuned(args.tune):
            print("\n".join(lines(record(args.config, args.mode))))
        return 0
    base = run_recorder(args.config, args.mode, [])
    print(f"{args.config} {args.mode}: {len(base)} launches under the defaults")
    print("\n".join(base))
    if args.set or args.tune:
        changed = run_recorder(args.config, args.mode, args.set, args.tune)
        label = " ".join(args.set + args.tune)
        diff = [d for d in difflib.unified_diff(base, changed, "defaults", label, lineterm="", n=0)
                if not d.startswith("@@")]
        print(f"\nunder {label}: {len(changed)} launches, "
              + ("the same plans" if base == changed else "these differ:"))
        if diff:
            print("\n".join(diff))
    return 0


if __name__ == "__main__":
    sys.exit(main())

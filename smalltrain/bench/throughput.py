"""The throughput table: for each MODEL:BATCH config, the training step's samples/s in each mode, median of
interleaved timed runs, beside torch's modes in the same process (CUDA) or in processes of their own (CPU); and the
first-step report: seconds from process start to the first finished (and the first replayed) step."""
import os
import sys

from .processes import ModeProcess
from .report import environment, report_failure, table
from .steps import make_step, mnist_batches
from .timing import median_interleaved, seconds_since_process_start, timed_run

# command-line name -> (library, make_step mode, label in the table)
MODES = {
    "smalltrain-eager": ("smalltrain", "eager", "smalltrain eager"),
    "smalltrain-compiled": ("smalltrain", "compiled", "smalltrain compiled"),
    "torch-eager": ("torch", "eager", "torch eager"),
    "torch-eager-tf32": ("torch", "eager-tf32", "torch eager, TF32 convolutions"),
    "torch-compile": ("torch", "compile", "torch.compile"),
    "torch-reduce-overhead": ("torch", "reduce-overhead", "torch.compile reduce-overhead"),
    "torch-graph": ("torch", "graph", "torch graph (whole step captured)"),
}
TORCH_COMPILE_MODES = ("torch-compile", "torch-reduce-overhead")
CUDA_ONLY_MODES = ("torch-eager-tf32", "torch-graph")
NOT_FP32_MODES = ("torch-eager-tf32",)   # reported, never the "best torch" an fp32 ratio is taken against
# untimed steps before each timed CUDA run (--run-warmup): a run then times its mode's steady state, not its start
# after another mode's run (a captured step timed 2-3% slower right after torch's runs than after its own)
RUN_WARMUP_CUDA = 100
CPU_SETTLE_S = 0.2   # sleep before each timed CPU run: the other mode's idle BLAS / OpenMP threads stop spinning


def _import_torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _synchronizer(lib, device):
    """The device's synchronize for timing, None on the CPU (where every call has finished when it returns)."""
    if not str(device).startswith("cuda"):
        return None
    return lambda: lib.cuda.synchronize(device)


def _warm_run(smalltrain, torch, key, model, batch, device, warmup, inner, pre=0):
    """timed_run of mode `key`'s step in this process (`pre` untimed steps before each run), after its warm-up
    steps."""
    libname, mode, _ = MODES[key]
    lib = smalltrain if libname == "smalltrain" else torch
    step = make_step(lib, model, device, *mnist_batches(batch, 8), mode)
    sync = _synchronizer(lib, device)
    for _ in range(warmup):
        step()
    if sync:
        sync()
    return timed_run(step, inner, sync, pre)


def selected_modes(args):
    """The modes to time, in table order, after --modes, --no-torch and --no-torch-compile; the CUDA-only modes
    only on CUDA (asked for by name on the CPU, an error)."""
    on_cuda = str(getattr(args, "device", None) or "cuda").startswith("cuda")
    if args.modes and not on_cuda:
        asked = [m for m in args.modes if m in CUDA_ONLY_MODES]
        if asked:
            raise ValueError(f"--modes {' '.join(asked)}: CUDA-only modes, got --device {args.device}")
    modes = list(dict.fromkeys(args.modes or [m for m in MODES if on_cuda or m not in CUDA_ONLY_MODES]))
    if args.no_torch:
        modes = [m for m in modes if not m.startswith("torch")]
    if args.no_torch_compile:
        modes = [m for m in modes if m not in TORCH_COMPILE_MODES]
    return modes


def throughput(args):
    """Print the environment line and the throughput table; returns the rows (config, mode, samples/s, ...)."""
    import smalltrain
    device = args.device
    on_cuda = device.startswith("cuda")
    modes = selected_modes(args)
    torch = _import_torch() if any(MODES[m][0] == "torch" for m in modes) else None
    if torch is None and any(MODES[m][0] == "torch" for m in modes):
        print("smalltrain bench: torch is not importable; timing smalltrain only", file=sys.stderr)
        modes = [m for m in modes if MODES[m][0] != "torch"]
    if torch is not None:
        if on_cuda:   # fp32 on both sides: no TF32 in torch's matmuls and convolutions
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        else:
            torch.set_num_threads(os.cpu_count() or 1)
    warmup = args.warmup if args.warmup is not None else (20 if on_cuda else 3)
    run_warmup = args.run_warmup if args.run_warmup is not None else (RUN_WARMUP_CUDA if on_cuda else 0)
    isolate = not on_cuda and not args.same_process
    print(environment(torch, device), flush=True)
    print(f"device {device}, fp32, the full training step (zero_grad, forward, loss, backward, optimizer "
          f"step) on 8 MNIST batches resident on the device; median of {args.repeats} timed runs, interleaved across "
          f"modes" + (", each ended by a device sync" if on_cuda else "") + f"; {warmup} warm-up steps excluded "
          f"(graph capture and torch.compile compilation happen in them)"
          + (f", and {run_warmup} untimed steps before each timed run" if run_warmup else "")
          + ("; on the CPU smalltrain.compile runs the step eagerly" if not on_cuda else "")
          + ("; each mode in a process of its own" if isolate else ""), flush=True)
    rows = []
    for model, batch in args.config:
        steps = args.steps or (max(20, 8192 // batch) if on_cuda else max(3, 512 // batch))
        runs, processes = {}, []
        for key in modes:
            label = MODES[key][2]
            try:   # built and warmed up here, so that a mode failing to compile or run is reported alone
                if isolate:
                    processes.append(ModeProcess(key, model, batch, device, warmup, steps, pre=run_warmup))
                    runs[label] = processes[-1]
                else:
                    runs[label] = _warm_run(smalltrain, torch, key, model, batch, device, warmup, steps,
                                            run_warmup)
            except Exception as e:  # noqa: BLE001 - report and go on: one failing mode must not hide the others
                report_failure(f"{model}:{batch} {label}", e)
        try:
            medians = median_interleaved(runs, args.repeats, settle=0.0 if on_cuda else CPU_SETTLE_S)
        except Exception as e:  # noqa: BLE001 - a mode that warmed up but fails later: report, next config
            report_failure(f"{model}:{batch}", e)
            medians = {}
        finally:
            for process in processes:
                process.close()
        rates = {label: (batch / seconds, seconds) for label, seconds in medians.items()}
        fp32_torch = {MODES[k][2] for k in modes if MODES[k][0] == "torch" and k not in NOT_FP32_MODES}
        best_torch = max((r for label, (r, _) in rates.items() if label in fp32_torch), default=None)
        for label, (rate, seconds) in rates.items():
            ratio = f"{rate / best_torch:.2f}x" if best_torch else "-"
            rows.append((f"{model}:{batch}", label, f"{rate:,.0f}", f"{seconds * 1e6:,.1f}", str(steps), ratio))
    if rows:
        print(table(rows, ["model:batch", "mode", "samples/s", "us/step", "steps/run", "vs best fp32 torch"]))
    return rows


def first_step(args):
    """Print and return the seconds from process start to the end of the first training step (synchronized) of the
    first config in each selected smalltrain mode, and for the compiled mode also to the end of its first replayed
    (captured) step, with the run-time kernel compilation inside that time. Meant as a process's first work: a
    fresh process per measurement gives a new user's first step."""
    import smalltrain
    from ..backend.cuda import prebuilt
    model, batch = args.config[0]
    device = args.device
    sync = _synchronizer(smalltrain, device)
    xs, ys = mnist_batches(batch, 2)
    results = {}
    for key in (m for m in selected_modes(args) if MODES[m][0] == "smalltrain"):
        run = make_step(smalltrain, model, device, xs, ys, MODES[key][1])
        times = []
        while True:
            run()
            if sync:
                sync()
            times.append(seconds_since_process_start())
            stats = getattr(run.step, "stats", {})
            if MODES[key][1] != "compiled" or stats.get("replays", 0) >= 1 or len(times) >= 20 or not sync:
                break
        replayed = getattr(run.step, "stats", {}).get("replays", 0) >= 1
        results[key] = {"first_step_s": times[0], "first_replay_s": times[-1] if replayed else None,
                        "compile_s": prebuilt.compile_seconds()}
        replay = f", its first replayed step at {times[-1]:.2f} s" if replayed else (
            f", no replay in {len(times)} steps (not captured)" if MODES[key][1] == "compiled" and sync else "")
        print(f"first step: {model}:{batch} {MODES[key][2]} on {device}: the first step finished {times[0]:.2f} s "
              f"after process start{replay}; run-time kernel compilation so far {prebuilt.compile_seconds():.1f} s",
              flush=True)
    return results

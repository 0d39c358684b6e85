"""`smalltrain bench`: training-step throughput beside PyTorch, and `--speedrun` (time to 99.0% MNIST accuracy).

Throughput. For each MODEL:BATCH config and each mode (smalltrain eager, smalltrain compiled, and when torch is
importable torch eager, torch.compile(step) and torch.compile(step, mode="reduce-overhead")) the ordinary step

    opt.zero_grad(); loss = F.cross_entropy(model(x), y); loss.backward(); opt.step()

runs on real, normalized MNIST batches resident on the device, rotating over 8 of them. Warm-up steps (graph
capture and torch.compile compilation happen inside them) are excluded; the figure is the median over repeats of
a timed run of several steps, each ended by a device synchronization; the runs of the modes alternate (one of
each in turn), so that a drift of the host's speed reaches all of them alike. On the CPU each mode runs in a process
of its own (ModeProcess), driven from here, with a short pause before each run: two frameworks' thread pools in one
process, or still spinning from the previous run, take the cores from each other. The same model code runs on both
libraries (the APIs match).

Speedrun. Train to the target test accuracy (99.0%) as fast as possible, everything on the device: the train and
test sets are uploaded once (uint8, normalized there; inside the clock), each epoch draws a permutation on the
device, the compiled step gathers its batch from the resident set by a slice of that permutation (the last
partial batch is dropped: one shape, one graph), the scheduler steps once per step outside the compiled step, and
each evaluation runs the full 10k test set in large chunks under no_grad with one host read. Process start,
data loading from disk and a warm-up on a throwaway model (kernel compilation, caches) are reported separately;
the clock runs from the data upload before the first training step to the end of the evaluation that first
reaches the target.

benchmarks/bench_train.py, bench_compile.py, profile_step.py and common.py import their pieces from here.
"""
import argparse
import os
import platform
import statistics
import sys
import time
import traceback

import numpy as np

from .train import MNIST_MEAN, MNIST_STD
from .utils.data.device import take_rows

# ---- models, data and the step, shared by both libraries ------------------------------------------------------

THROUGHPUT_MODELS = {
    "lenet5": "LeNet-5 (GELU), Adam lr 1e-3",
    "cnn": "MnistCnn (ReLU), SGD lr 0.1",
    "mlp": "MLP 784-256-10 (ReLU), Adam lr 1e-3",
}
DEFAULT_CONFIGS = (("lenet5", 64), ("lenet5", 512), ("cnn", 64))
# smalltrain's parameters made views into one flat buffer (nn.utils.flatten_parameters) before its optimizer is made
# (an A/B knob; off, as measured: benchmarks/RESULTS.md, "Lessons")
FLAT_PARAMETERS = False
TRAIN_SIZE = 60000


def build(lib, model):
    """The benchmark's `model`, built from `lib` (smalltrain or torch: the same code runs on both)."""
    nn = lib.nn
    if model == "lenet5":
        return nn.Sequential(nn.Conv2d(1, 6, 5), nn.GELU(), nn.MaxPool2d(2), nn.Conv2d(6, 16, 5), nn.GELU(),
                             nn.MaxPool2d(2), nn.Flatten(), nn.Linear(256, 120), nn.GELU(), nn.Linear(120, 84),
                             nn.GELU(), nn.Linear(84, 10))
    if model == "cnn":
        return nn.Sequential(nn.Conv2d(1, 16, 3), nn.ReLU(), nn.Conv2d(16, 32, 3), nn.ReLU(), nn.Flatten(),
                             nn.Linear(18432, 10))
    if model == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
    raise ValueError(f"unknown benchmark model {model!r}; expected one of {', '.join(THROUGHPUT_MODELS)}")


def make_optimizer(lib, model, params, capturable=False):
    """The optimizer of the benchmark's `model`: SGD lr 0.1 for the CNN, Adam lr 1e-3 otherwise (capturable=True
    for torch's CUDA graphs)."""
    if model == "cnn":
        return lib.optim.SGD(params, lr=0.1)
    return lib.optim.Adam(params, lr=1e-3, **({"capturable": True} if capturable else {}))


def normalize(images):
    """uint8 images (N, 28, 28), NumPy or CuPy, to float32 (N, 1, 28, 28) normalized as the trainer does it
    (ToTensor's /255, then Normalize's (x - mean) / std), computed where the array lives."""
    x = images.astype(np.float32)
    x /= 255
    x -= MNIST_MEAN
    x /= MNIST_STD
    return x.reshape(-1, 1, 28, 28)


def mnist_batches(batch, count=8, data_dir=None):
    """`count` consecutive batches of the MNIST training set as NumPy arrays: float32 (count, batch, 1, 28, 28)
    normalized images and int64 (count, batch) labels (fewer batches when they would not fit in 60k)."""
    from .datasets import MNIST
    if not 1 <= batch <= TRAIN_SIZE:
        raise ValueError(f"batch size must be between 1 and {TRAIN_SIZE}, got {batch}")
    count = max(1, min(count, TRAIN_SIZE // batch))
    ds = MNIST(root=data_dir, train=True)
    n = batch * count
    x = normalize(ds.data.numpy()[:n])
    y = ds.targets.numpy()[:n]
    return x.reshape(count, batch, 1, 28, 28), y.reshape(count, batch)


def make_step(lib, model, device, xs, ys, mode="eager"):
    """A no-argument callable running one training step of `model` (a THROUGHPUT_MODELS name) on the next of the
    batches xs/ys (NumPy, uploaded here to `device`), returning the loss.

    mode: "eager"; with smalltrain "compiled" (smalltrain.compile); with torch "compile" or "reduce-overhead"
    (torch.compile in its default mode or mode="reduce-overhead", with a capturable Adam on CUDA).
    """
    is_torch = lib.__name__ == "torch"
    modes = ("eager", "compile", "reduce-overhead") if is_torch else ("eager", "compiled")
    if mode not in modes:
        raise ValueError(f"unknown mode {mode!r} for {lib.__name__}; expected one of {', '.join(modes)}")
    lib.manual_seed(0)
    net = build(lib, model).to(device)
    if FLAT_PARAMETERS and not is_torch:
        lib.nn.utils.flatten_parameters(net.parameters())
    capturable = is_torch and mode == "reduce-overhead" and str(device).startswith("cuda")
    opt = make_optimizer(lib, model, net.parameters(), capturable)
    F = lib.nn.functional
    bx = [lib.tensor(x).to(device) for x in xs]
    by = [lib.tensor(y).to(device) for y in ys]

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        return loss
    if mode == "compiled":
        step = lib.compile(step)
    elif mode != "eager":
        lib._dynamo.reset()   # a fresh cache per model: the step's code object is shared by every config
        step = lib.compile(step, mode=None if mode == "compile" else mode)
    position = [0]

    def run():
        i = position[0] = (position[0] + 1) % len(bx)
        return step(bx[i], by[i])
    run.step = step   # the (compiled) step itself, for a script that times its parts
    return run


# ---- timing, environment, table -------------------------------------------------------------------------------

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


class ModeProcessError(RuntimeError):
    """A mode that failed in its own process: the message is that process's one-line report."""


class ModeProcess:
    """One mode's training step in a process of its own, driven from here: the CPU bench's way of putting the two
    frameworks side by side without their thread pools in one process (on a 2-core machine torch's LeNet-5 step took
    11.5 ms timed right after ours in one process, 4.1 ms alone). Built and warmed up in the child; each call times
    one run of `inner` steps there and returns the seconds per step. Errors come back as ModeProcessError with the
    child's one-line report."""

    def __init__(self, key, model, batch, device, warmup, inner, timeout=600, pre=0):
        import multiprocessing
        ctx = multiprocessing.get_context("spawn")   # a fresh interpreter: no thread pool inherited
        self.timeout = timeout
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_mode_process_main, args=(child, key, model, batch, device, warmup, inner, pre),
                                daemon=True)
        self.proc.start()
        child.close()
        self._receive()   # "ready" once built and warmed up

    def __call__(self):
        self.conn.send("run")
        return self._receive()

    def _receive(self):
        if not self.conn.poll(self.timeout):
            self.close()
            raise RuntimeError(f"no answer from the benchmark process within {self.timeout} s")
        try:
            status, payload = self.conn.recv()
        except EOFError:
            raise RuntimeError(f"the benchmark process ended (exit code {self.proc.join(5) or self.proc.exitcode})") \
                from None
        if status == "error":
            raise ModeProcessError(payload)
        return payload

    def close(self):
        try:
            self.conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(5)


def _mode_process_main(conn, key, model, batch, device, warmup, inner, pre):
    try:
        import smalltrain
        torch = _import_torch() if MODES[key][0] == "torch" else None
        if torch is not None:
            torch.set_num_threads(os.cpu_count() or 1)
        run = _warm_run(smalltrain, torch, key, model, batch, device, warmup, inner, pre)
        conn.send(("ready", None))
        while conn.recv() == "run":
            conn.send(("ok", run()))
    except Exception as e:  # noqa: BLE001 - the parent reports it, one line, and times the other modes
        conn.send(("error", _one_line(e)))


def _cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cuda_description(device):
    from .backend import as_device
    from .backend.cuda import cupy
    cp = cupy()
    index = as_device(device).index
    name = cp.cuda.runtime.getDeviceProperties(index)["name"]
    name = name.decode() if isinstance(name, bytes) else name
    rt = cp.cuda.runtime.runtimeGetVersion()
    return [f"cupy {cp.__version__}", f"CUDA runtime {rt // 1000}.{rt % 1000 // 10}", f"GPU {name}",
            f"CUPY_TF32={os.environ.get('CUPY_TF32', '(unset)')}"]


def environment(torch=None, device=None):
    """One line of versions and hardware: Python, NumPy, smalltrain, the CPU (and the GPU for a CUDA `device`),
    torch and its thread count when given, NumPy's BLAS when threadpoolctl is installed."""
    from . import __version__
    parts = [f"smalltrain {__version__}", f"python {platform.python_version()}", f"numpy {np.__version__}",
             f"cpu {_cpu_name()} x{os.cpu_count()}",
             f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}"]
    if device is not None and str(device).startswith("cuda"):
        try:
            parts += _cuda_description(device)
        except Exception as e:  # noqa: BLE001 - the line is informational: never fail a benchmark over it
            parts.append(f"GPU unknown ({type(e).__name__})")
    if torch is not None:
        parts.append(f"torch {torch.__version__} threads {torch.get_num_threads()}")
        if device is not None and str(device).startswith("cuda") and torch.cuda.is_available():
            parts.append(f"torch CUDA {torch.version.cuda} cuDNN {torch.backends.cudnn.version()}")
    try:
        import threadpoolctl
        for info in threadpoolctl.threadpool_info():
            if info.get("internal_api") == "openblas" and "numpy" in info.get("filepath", ""):
                parts.append(f"numpy BLAS {info.get('internal_api')} {info.get('version')} "
                             f"{info.get('architecture')} threads {info.get('num_threads')}")
    except ImportError:
        pass
    return ", ".join(parts)


def table(rows, headers):
    """Rows of strings as aligned text columns under a header line and a rule."""
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(str(h).ljust(w) for h, w in zip(headers, widths)).rstrip()
    out = [line, "-" * len(line)]
    out += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(out)


# ---- the throughput table -------------------------------------------------------------------------------------

# command-line name -> (library, make_step mode, label in the table)
MODES = {
    "smalltrain-eager": ("smalltrain", "eager", "smalltrain eager"),
    "smalltrain-compiled": ("smalltrain", "compiled", "smalltrain compiled"),
    "torch-eager": ("torch", "eager", "torch eager"),
    "torch-compile": ("torch", "compile", "torch.compile"),
    "torch-reduce-overhead": ("torch", "reduce-overhead", "torch.compile reduce-overhead"),
}
TORCH_COMPILE_MODES = ("torch-compile", "torch-reduce-overhead")
# untimed steps before each timed CUDA run (--run-warmup). H100, captured LeNet-5 b512 timed beside torch's
# reduce-overhead, two processes each: 3 steps 129.2 / 128.6 us, 100 steps 126.5 / 127.0 (the GPU's clock at 1980 MHz
# during both); without torch in the process 123.4-124.8, though the same code moves 2-6 us between processes
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


def _one_line(e):
    """'Type: first line of the message (at file:line)' for an exception."""
    where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    at = f" (at {os.path.basename(where.filename)}:{where.lineno})" if where else ""
    msg = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {msg}{at}"


def _report_failure(what, e):
    # a ModeProcessError already carries the child's one-line report
    line = str(e) if isinstance(e, ModeProcessError) else _one_line(e)
    print(f"smalltrain bench: {what}: {line}", file=sys.stderr, flush=True)


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
    """The modes to time, in table order, after --modes, --no-torch and --no-torch-compile."""
    modes = list(dict.fromkeys(args.modes or MODES))
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
    print(f"device {device}, fp32, the full training step (zero_grad, forward, cross_entropy, backward, optimizer "
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
                _report_failure(f"{model}:{batch} {label}", e)
        try:
            medians = median_interleaved(runs, args.repeats, settle=0.0 if on_cuda else CPU_SETTLE_S)
        except Exception as e:  # noqa: BLE001 - a mode that warmed up but fails later: report, next config
            _report_failure(f"{model}:{batch}", e)
            medians = {}
        finally:
            for process in processes:
                process.close()
        rates = {label: (batch / seconds, seconds) for label, seconds in medians.items()}
        best_torch = max((r for label, (r, _) in rates.items() if label.startswith("torch")), default=None)
        for label, (rate, seconds) in rates.items():
            ratio = f"{rate / best_torch:.2f}x" if best_torch else "-"
            rows.append((f"{model}:{batch}", label, f"{rate:,.0f}", f"{seconds * 1e6:,.1f}", str(steps), ratio))
    if rows:
        print(table(rows, ["model:batch", "mode", "samples/s", "us/step", "steps/run", "vs best torch"]))
    return rows


# ---- the speedrun ---------------------------------------------------------------------------------------------

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


def load_mnist_arrays(data_dir=None):
    """((train images, labels), (test images, labels)) as host NumPy arrays, images uint8 (N, 28, 28)."""
    from .datasets import MNIST
    out = []
    for train in (True, False):
        ds = MNIST(root=data_dir, train=train)
        out.append((ds.data.numpy(), ds.targets.numpy()))
    return tuple(out)


def upload(host, device):
    """The (images, labels) pairs of `host` on `device` as Tensors: uint8 uploaded, normalized to float32 there."""
    import smalltrain

    from .tensor import Tensor
    out = []
    for images, labels in host:
        x = smalltrain.from_numpy(np.ascontiguousarray(images)).to(device)
        out.append((Tensor._wrap(normalize(x.array)), smalltrain.from_numpy(labels).to(device)))
    return out


def device_randperm(n, device):
    """A random permutation of range(n) drawn on `device` (CuPy's generator on CUDA, seeded by manual_seed)."""
    import smalltrain

    from .backend import as_device
    dev = as_device(device)
    if dev.type != "cuda":
        return smalltrain.randperm(n)
    from .backend.cuda import cupy
    from .tensor import Tensor
    cp = cupy()
    with cp.cuda.Device(dev.index):
        return Tensor._wrap(cp.random.permutation(n).astype(np.int64, copy=False))


def count_correct(model, images, labels, chunk):
    """The number of correct predictions over the whole set, summed on the device (a 0-d tensor: no host read)."""
    from .autograd import no_grad
    model.eval()
    total = None
    with no_grad():
        for i in range(0, images.shape[0], chunk):
            c = (model(images[i:i + chunk]).argmax(1) == labels[i:i + chunk]).sum()
            total = c if total is None else total + c
    model.train()
    return total


def make_recipe(args, model, steps_per_epoch):
    """The optimizer and the scheduler (None for a constant lr) of the speedrun recipe in `args`."""
    from . import optim
    if args.optimizer == "sgd":
        opt = optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, nesterov=args.nesterov,
                        weight_decay=args.weight_decay)
    else:
        opt = optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    if args.schedule == "constant":
        return opt, None
    sched = optim.lr_scheduler.OneCycleLR(opt, max_lr=args.max_lr, total_steps=args.epochs * steps_per_epoch,
                                          pct_start=args.pct_start, div_factor=args.div_factor,
                                          final_div_factor=args.final_div_factor,
                                          cycle_momentum=args.cycle_momentum)
    return opt, sched


def evaluation_steps(epochs, steps_per_epoch, per_epoch, start):
    """The global step counts after which to evaluate: `per_epoch` evenly spaced points in each epoch from epoch
    `start` on (a float: 1.5 is the middle of the second epoch), and always the end of the last epoch."""
    points = {epochs * steps_per_epoch}
    for e in range(epochs):
        for j in range(1, per_epoch + 1):
            s = e * steps_per_epoch + round(j * steps_per_epoch / per_epoch)
            if s >= round(start * steps_per_epoch) and s > 0:   # 3.25 x 117 = 380.25 means step 380
                points.add(s)
    return sorted(points)


def _sync(device):
    if str(device).startswith("cuda"):
        import smalltrain
        smalltrain.cuda.synchronize(device)


def run_speedrun(args, host, max_steps=None, report=None):
    """One attempt of the recipe in `args` on the host arrays `host`: upload, train, evaluate until the target.

    max_steps (the warm-up) stops after that many steps and one evaluation. Returns a dict: reached, time_s (the
    clock at the end of the evaluation that reached the target, else at the end), upload_s, evaluations (dicts:
    epoch, step, time_s, accuracy, eval_s), best accuracy and the compiled step's stats. `report(evaluation)` is
    called after each evaluation.
    """
    import smalltrain

    from . import models
    from .tensor import Tensor
    device, batch = args.device, args.batch_size
    smalltrain.manual_seed(args.seed)
    model = models.build(args.model).to(device)
    n_train = len(host[0][1])
    steps_per_epoch = n_train // batch
    opt, sched = make_recipe(args, model, steps_per_epoch)
    eval_chunk = args.eval_batch_size or (10000 if device.startswith("cuda") else 1000)
    plan = [max_steps] if max_steps else evaluation_steps(args.epochs, steps_per_epoch, args.evals_per_epoch,
                                                          args.eval_start)
    t0 = time.perf_counter()   # the clock: data upload included
    (images, labels), (test_images, test_labels) = upload(host, device)
    _sync(device)
    upload_s = time.perf_counter() - t0

    def train_step(index):
        opt.zero_grad()
        # the targets first: an op between the model and its loss would run the chain's held launch on its own
        # (autograd/held.py), where the loss can take it into the same kernel
        y = take_rows(labels, index)
        loss = smalltrain.nn.functional.cross_entropy(model(take_rows(images, index)), y)
        loss.backward()
        opt.step()
        return loss
    step = smalltrain.compile(train_step, warmup=args.compile_warmup)
    evaluations, done, reached, next_eval = [], 0, False, 0
    n_test = test_labels.shape[0]
    while done < plan[-1] and not (reached and not args.no_stop):
        # this epoch's batches: rows of the permutation, views on the device (copied into the graph's input)
        batches = device_randperm(n_train, device).array[:steps_per_epoch * batch].reshape(steps_per_epoch, batch)
        for k in range(steps_per_epoch):
            step(Tensor._wrap(batches[k]))
            if sched is not None:
                sched.step()
            done += 1
            if done != plan[next_eval]:
                continue
            next_eval += 1
            _sync(device)   # so that the evaluation's own time can be told apart from queued training steps
            te = time.perf_counter()
            correct = count_correct(model, test_images, test_labels, eval_chunk).item()   # the one host read
            now = time.perf_counter()
            record = {"epoch": done / steps_per_epoch, "step": done, "time_s": now - t0,
                      "accuracy": correct / n_test, "eval_s": now - te}
            evaluations.append(record)
            if report:
                report(record)
            if record["accuracy"] >= args.target and not reached:
                reached, reached_at = True, record
                if not args.no_stop:
                    break
            if done >= plan[-1]:
                break
    end_s = time.perf_counter() - t0
    best = max((e["accuracy"] for e in evaluations), default=0.0)
    return {"reached": reached, "time_s": reached_at["time_s"] if reached else end_s,
            "reached_at": reached_at if reached else None, "upload_s": upload_s, "evaluations": evaluations,
            "best_accuracy": best, "steps": done, "steps_per_epoch": steps_per_epoch, "stats": dict(step.stats)}


def _recipe_line(args):
    lr = f"OneCycleLR(max_lr={args.max_lr:g}, pct_start={args.pct_start:g}, div_factor={args.div_factor:g}, " \
         f"final_div_factor={args.final_div_factor:g}, cycle_momentum={args.cycle_momentum})" \
        if args.schedule == "onecycle" else f"constant lr {args.lr:g}"
    opt = "Adam" if args.optimizer == "adam" else \
        f"SGD momentum {args.momentum:g}" + (" nesterov" if args.nesterov else "")
    if args.weight_decay:
        opt += f" weight decay {args.weight_decay:g}"
    return (f"speedrun: {args.model} on {args.device}, batch {args.batch_size} ({TRAIN_SIZE // args.batch_size} "
            f"steps per epoch, last partial batch dropped), {opt}, {lr}, at most {args.epochs} epoch(s), "
            f"{args.evals_per_epoch} evaluation(s) per epoch from epoch {args.eval_start:g} on (and at the end) over "
            f"the 10,000 test images, target {100 * args.target:.2f}%, seed {args.seed}")


def speedrun(args):
    """Print the speedrun's report; returns the result dict of run_speedrun (plus the excluded phases' times)."""
    startup = seconds_since_process_start()
    print(environment(None, args.device), flush=True)
    print(_recipe_line(args), flush=True)
    if startup is not None:
        print(f"startup    {startup:8.3f} s  process start to the benchmark: interpreter and imports (excluded)")
    t = time.perf_counter()
    host = load_mnist_arrays(args.data_dir)
    if args.device.startswith("cuda"):   # page-locked host copies: the timed upload is then one direct copy each
        from .backend import pin
        host = tuple(tuple(pin(a) for a in pair) for pair in host)
    load_s = time.perf_counter() - t
    print(f"data load  {load_s:8.3f} s  MNIST files read and decoded into host memory"
          f"{' (pinned)' if args.device.startswith('cuda') else ''} (excluded)", flush=True)
    t = time.perf_counter()
    warm = run_speedrun(args, host, max_steps=args.warmup)
    warmup_s = time.perf_counter() - t
    print(f"warm-up    {warmup_s:8.3f} s  a throwaway model: data upload, {args.warmup} steps "
          f"({warm['stats'].get('captures', 0)} graph capture(s)), 1 evaluation; kernels compiled, caches filled "
          f"(excluded)",
          flush=True)

    def report(e):
        print(f"eval  epoch {e['epoch']:5.2f}  step {e['step']:6d}  time {e['time_s']:9.4f} s  test accuracy "
              f"{100 * e['accuracy']:6.2f}%  (this evaluation {1e3 * e['eval_s']:.1f} ms)", flush=True)
    result = run_speedrun(args, host, report=report)
    result.update(startup_s=startup, load_s=load_s, warmup_s=warmup_s)
    evals = result["evaluations"]
    if result["reached"]:
        at = result["reached_at"]
        counted = [e for e in evals if e["step"] <= at["step"]]
        print(f"reached {100 * at['accuracy']:.2f}% (target {100 * args.target:.2f}%) in {at['time_s']:.4f} s at "
              f"epoch {at['epoch']:.2f}, step {at['step']}: the clock from the data upload before the first training "
              f"step to the end of that evaluation; data upload {1e3 * result['upload_s']:.1f} ms and "
              f"{len(counted)} evaluation(s) {1e3 * sum(e['eval_s'] for e in counted):.1f} ms included")
    else:
        print(f"did not reach {100 * args.target:.2f}% in {args.epochs} epoch(s): "
              f"best {100 * result['best_accuracy']:.2f}%"
              f" after {result['time_s']:.4f} s")
    s = result["stats"]
    print(f"compiled step: {s.get('captures', 0)} capture(s), {s.get('replays', 0)} replays, {s.get('eager', 0)} "
          f"eager calls")
    return result


# ---- the command line -----------------------------------------------------------------------------------------

def _config(text):
    model, sep, batch = text.partition(":")
    if not sep or model not in THROUGHPUT_MODELS or not batch.isdigit() or not 1 <= int(batch) <= TRAIN_SIZE:
        raise argparse.ArgumentTypeError(f"{text!r}: expected MODEL:BATCH with MODEL one of "
                                         f"{', '.join(THROUGHPUT_MODELS)} and BATCH between 1 and {TRAIN_SIZE} "
                                         f"(e.g. lenet5:64)")
    return model, int(batch)


def _device(text):
    from .backend import Device
    try:
        Device(text)
    except (RuntimeError, TypeError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _number(kind, low=None, high=None, low_open=False):
    def parse(text):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") \
                from None
        if (low is not None and (v < low or (low_open and v == low))) or (high is not None and v > high):
            lo = "" if low is None else f"{'>' if low_open else '>='} {low:g}"
            hi = "" if high is None else f"<= {high:g}"
            raise argparse.ArgumentTypeError(f"{text}: expected a value {' and '.join(p for p in (lo, hi) if p)}")
        return v
    return parse


def add_arguments(p):
    """The `smalltrain bench` options, on an argparse parser (the command's subparser, or a script's own)."""
    from .models import MODELS
    p.add_argument("--device", type=_device, default=None,
                   help="cpu or cuda[:N] (default: cuda when available, else cpu)")
    p.add_argument("--speedrun", action="store_true",
                   help="train to --target test accuracy as fast as possible instead of the throughput table")
    p.add_argument("--warmup", type=_number(int, 1), default=None,
                   help="steps before the clock: per mode in the table (default 20 on CUDA, 3 on the CPU); on the "
                        "throwaway model of the speedrun (default 5: the compiled step captures after "
                        "--compile-warmup)")
    t = p.add_argument_group("throughput table")
    t.add_argument("--config", nargs="+", type=_config, default=list(DEFAULT_CONFIGS), metavar="MODEL:BATCH",
                   help=f"models ({', '.join(f'{k}: {v}' for k, v in THROUGHPUT_MODELS.items())}) and batch sizes "
                        "(default: lenet5:64 lenet5:512 cnn:64)")
    t.add_argument("--modes", nargs="+", choices=list(MODES), default=None, metavar="MODE",
                   help=f"modes to time, of {', '.join(MODES)} (default: all; torch's when importable)")
    t.add_argument("--no-torch", action="store_true", help="time smalltrain only")
    t.add_argument("--no-torch-compile", action="store_true",
                   help="skip torch.compile and its reduce-overhead mode (slow to compile)")
    t.add_argument("--repeats", type=_number(int, 1), default=7, help="timed runs per mode; the median is shown")
    t.add_argument("--same-process", action="store_true",
                   help="on the CPU, time every mode in this process (by default each runs in a process of its own, "
                        "so that the frameworks' thread pools do not compete for the cores)")
    t.add_argument("--run-warmup", type=_number(int, 0), default=None,
                   help="untimed steps (then a sync) before each timed run, so that each run times its mode's "
                        f"steady state rather than its start after another mode's run (default {RUN_WARMUP_CUDA} on "
                        "CUDA, 0 on the CPU)")
    t.add_argument("--steps", type=_number(int, 1), default=None,
                   help="steps per timed run (default: about 8192 samples on CUDA, 512 on the CPU)")
    s = p.add_argument_group("speedrun (--speedrun)")
    s.add_argument("--model", choices=list(MODELS), default="lenet5")
    s.add_argument("--batch-size", type=_number(int, 1, TRAIN_SIZE), default=512)
    s.add_argument("--epochs", type=_number(int, 1), default=4, help="at most this many epochs (and OneCycleLR's "
                                                                      "length)")
    s.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    s.add_argument("--lr", type=_number(float, 0, low_open=True), default=1e-3,
                   help="learning rate with --schedule constant (OneCycleLR sets it from --max-lr)")
    s.add_argument("--momentum", type=_number(float, 0, 1), default=0.9, help="SGD momentum")
    s.add_argument("--nesterov", action="store_true", help="SGD with Nesterov momentum")
    s.add_argument("--weight-decay", type=_number(float, 0), default=0.0)
    s.add_argument("--schedule", choices=["onecycle", "constant"], default="onecycle")
    s.add_argument("--max-lr", type=_number(float, 0, low_open=True), default=1e-2, help="OneCycleLR's peak")
    s.add_argument("--pct-start", type=_number(float, 0, 1, low_open=True), default=0.25,
                   help="OneCycleLR's warm-up fraction")
    s.add_argument("--div-factor", type=_number(float, 0, low_open=True), default=25.0,
                   help="OneCycleLR: initial lr = max_lr / div_factor")
    s.add_argument("--final-div-factor", type=_number(float, 0, low_open=True), default=1e4,
                   help="OneCycleLR: final lr = initial lr / final_div_factor")
    s.add_argument("--no-cycle-momentum", dest="cycle_momentum", action="store_false",
                   help="keep momentum (Adam's beta1) fixed instead of cycling it against the lr")
    s.add_argument("--evals-per-epoch", type=_number(int, 1), default=4)
    s.add_argument("--eval-start", type=_number(float, 0), default=3.25,
                   help="evaluate from this many epochs of training on (a float: 1.5 is the middle of the second "
                        "epoch); the end of the last epoch is always evaluated")
    s.add_argument("--eval-batch-size", type=_number(int, 1), default=None,
                   help="test images per forward (default 10000 on CUDA, 1000 on the CPU)")
    s.add_argument("--target", type=_number(float, 0, 1, low_open=True), default=0.99,
                   help="test accuracy to reach, a fraction (default 0.99)")
    s.add_argument("--seed", type=_number(int, 0), default=0)
    s.add_argument("--compile-warmup", type=_number(int, 0), default=1,
                   help="eager steps before smalltrain.compile captures the step")
    s.add_argument("--no-stop", action="store_true",
                   help="train to the epoch cap after reaching the target (for tuning; the time reported is still "
                        "that of the first evaluation at the target)")
    s.add_argument("--data-dir", default=None, help="MNIST files (default: the bundled copy)")
    return p


def parser(prog="smalltrain bench"):
    """A standalone parser with the bench options (the benchmarks/ scripts use it)."""
    return add_arguments(argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0]))


def main(args):
    """Run `smalltrain bench` with parsed `args`; returns the exit status (1 when nothing could be timed, or the
    speedrun missed its target)."""
    import smalltrain
    if args.device is None:
        args.device = "cuda" if smalltrain.cuda.is_available() else "cpu"
    elif args.device.startswith("cuda") and not smalltrain.cuda.is_available():
        raise RuntimeError(f"--device {args.device}: CUDA is not available here (no GPU, or CuPy not installed); "
                           "use --device cpu")
    if args.speedrun:
        if args.warmup is None:
            args.warmup = args.compile_warmup + 2
        total = args.epochs * (TRAIN_SIZE // args.batch_size)
        if args.warmup > total:
            raise ValueError(f"--warmup {args.warmup}: more steps than the recipe's {total} ({args.epochs} epoch(s) "
                             f"of {TRAIN_SIZE // args.batch_size})")
        return 0 if speedrun(args)["reached"] else 1
    return 0 if throughput(args) else 1

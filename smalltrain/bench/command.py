"""`smalltrain bench`: training-step throughput beside PyTorch (the model zoo, benchmarks/RESULTS.md), the time
from process start to the first step (--first-step), or the time to 99.0% MNIST accuracy (--speedrun). See
docs/bench.md. The command's options and its entry point."""
import argparse

from .speedrun import speedrun
from .steps import TRAIN_SIZE
from .throughput import MODES, RUN_WARMUP_CUDA, first_step, throughput
from .zoo import ZOO, ZOO_BATCHES

DEFAULT_CONFIGS = (("lenet5", 64), ("lenet5", 512), ("cnn", 64))
_DESCRIPTION = ("Training-step throughput of smalltrain eager and compiled beside PyTorch's eager, torch.compile and "
                "whole-step CUDA graph modes; or, with --speedrun, the time to train to 99.0%% MNIST test accuracy. "
                "See docs/bench.md.")


def _config(text):
    model, sep, batch = text.partition(":")
    if not sep or model not in ZOO or not batch.isdigit() or not 1 <= int(batch) <= TRAIN_SIZE:
        raise argparse.ArgumentTypeError(f"{text!r}: expected MODEL:BATCH with MODEL one of "
                                         f"{', '.join(ZOO)} and BATCH between 1 and {TRAIN_SIZE} "
                                         f"(e.g. lenet5:64)")
    return model, int(batch)


def _device(text):
    from ..backend import Device
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
    from ..models import MODELS
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
                   help=f"models of the zoo ({'; '.join(f'{k}: {v.description}' for k, v in ZOO.items())}) and "
                        "batch sizes (default: lenet5:64 lenet5:512 cnn:64)")
    t.add_argument("--zoo", action="store_true",
                   help=f"every zoo model at batch {' and '.join(map(str, ZOO_BATCHES))} (instead of --config)")
    t.add_argument("--first-step", action="store_true",
                   help="instead of the table: seconds from process start to the end of the first step (and of the "
                        "first replayed step, compiled) of the first config, in each smalltrain mode; run it as the "
                        "process's first work")
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
    return add_arguments(argparse.ArgumentParser(prog=prog, description=_DESCRIPTION))


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
    if args.zoo:
        args.config = [(model, batch) for model in ZOO for batch in ZOO_BATCHES]
    if args.first_step:
        return 0 if first_step(args) else 1
    return 0 if throughput(args) else 1

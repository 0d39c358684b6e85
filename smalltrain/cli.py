"""The `smalltrain` command: `train` (the default job: LeNet-5 on the bundled MNIST), `eval`, `bench`.

Settings are checked at parse (a non-finite or absurd value is an argparse error naming the flag). Under
--distributed, an error on one rank ends the whole job with that rank's message instead of leaving the others
waiting.
"""
import argparse
import dataclasses
import json
import sys

from .train import OPTIMIZERS, RANGES, SCHEDULERS, TrainConfig


def _checked(field, convert):
    """An argparse type: `convert`, then TrainConfig's range for `field` (argparse names the flag on error)."""
    ok, what = RANGES[field]

    def parse(text):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value
    parse.__name__ = convert.__name__
    return parse


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each default, except where there is none to show (on/off flags, None)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or action.default == argparse.SUPPRESS \
                or action.help is None:
            return action.help
        return super()._get_help_string(action)


def _train_arguments(t, d):
    t.add_argument("--model", choices=["lenet5", "cnn", "mlp"], default=d.model, help="the network")
    t.add_argument("--device", default=d.device, help="cpu or cuda[:N]")
    t.add_argument("--epochs", type=_checked("epochs", int), default=d.epochs,
                   help="epochs in total; with --resume, a larger value extends the run and stretches its "
                        "schedule to the new total (cosine's T_max, one-cycle's length, step's step size)")
    t.add_argument("--batch-size", type=_checked("batch_size", int), default=d.batch_size,
                   help="batch size per process; with --distributed the global batch is this times the "
                        "number of processes (as with torch's DistributedSampler)")
    t.add_argument("--lr", type=_checked("lr", float), default=d.lr, help="learning rate, in (0, 10]")
    t.add_argument("--optimizer", choices=OPTIMIZERS, default=d.optimizer, help="the optimizer")
    t.add_argument("--momentum", type=_checked("momentum", float), default=d.momentum,
                   help="SGD momentum, in [0, 1)")
    t.add_argument("--weight-decay", type=_checked("weight_decay", float), default=d.weight_decay,
                   help="in [0, 1] (adamw: 0 means its default 1e-2)")
    t.add_argument("--scheduler", choices=SCHEDULERS, default=d.scheduler, help="learning-rate schedule, per step")
    t.add_argument("--seed", type=_checked("seed", int), default=d.seed,
                   help="seeds the initialization and the shuffling")
    t.add_argument("--data-dir", default=None, help="MNIST files (IDX, plain or gzip; torchvision's MNIST/raw "
                                                    "layout works); default: the bundled copy")
    t.add_argument("--out", default=d.out, help="where runs go: each run writes into a new OUT/version_N "
                   "(metrics.jsonl, TensorBoard events, curves.png, checkpoints). With --resume: the "
                   "checkpoint's own run directory, unless --out names an existing run directory")
    t.add_argument("--resume", default=None, metavar="CKPT",
                   help="continue the run of a checkpoint: its model, optimizer and options, lr, schedule, batch "
                        "size and seed come from it (a flag that contradicts them is refused); --epochs may grow")
    t.add_argument("--no-tensorboard", action="store_true", help="do not write TensorBoard event files")
    t.add_argument("--log-every", type=_checked("log_every", int), default=d.log_every,
                   help="log the training loss every N steps")
    t.add_argument("--limit-train-batches", type=_checked("limit_train_batches", int), default=None,
                   metavar="N", help="train on at most N batches per epoch (smoke tests; default: all)")
    t.add_argument("--allow-nonfinite", action="store_true",
                   help="keep training when the loss becomes NaN or infinite (default: stop with an error)")
    t.add_argument("--distributed", action="store_true", help="one process per device under mpiexec/srun")
    t.add_argument("--compile", action="store_true", help="capture the training step as a CUDA graph")


def _parser():
    from . import __version__
    p = argparse.ArgumentParser(prog="smalltrain", description="Train small networks on MNIST, from first "
                                "principles.")
    p.add_argument("--version", action="version", version=f"smalltrain {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", formatter_class=_Formatter,
                       help="train a model on MNIST (defaults: LeNet-5, GELU, Adam 1e-3, batch 64, 3 epochs, CPU)",
                       description="Train a model on MNIST; each run gets its own directory OUT/version_N.")
    _train_arguments(t, TrainConfig())
    e = sub.add_parser("eval", formatter_class=_Formatter, help="test loss and accuracy of a checkpoint")
    e.add_argument("--checkpoint", required=True, help="a .safetensors checkpoint of `smalltrain train`")
    e.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    e.add_argument("--data-dir", default=None, help="MNIST files; default: the bundled copy")
    from .bench import add_arguments as add_bench_arguments
    b = sub.add_parser("bench", help="training throughput side by side with PyTorch (when importable); "
                                     "--speedrun: time to 99%% MNIST test accuracy",
                       description="Training-step throughput of smalltrain eager and compiled beside PyTorch's "
                                   "eager, torch.compile and reduce-overhead modes; or, with --speedrun, the time "
                                   "to train to 99.0% MNIST test accuracy. See docs/bench.md.")
    add_bench_arguments(b)
    return p, t


def _given_flags(argv):
    """The dests of the train flags written on the command line (a resumed run refuses those that contradict
    its checkpoint; the others come from it)."""
    p, t = _parser()
    for action in t._actions:
        action.default = argparse.SUPPRESS
    return set(vars(p.parse_args(argv))) - {"command"}


def _train(args, given):
    cfg = TrainConfig(model=args.model, device=args.device, epochs=args.epochs, batch_size=args.batch_size,
                      lr=args.lr, optimizer=args.optimizer, momentum=args.momentum,
                      weight_decay=args.weight_decay, scheduler=args.scheduler, seed=args.seed,
                      data_dir=args.data_dir, out=args.out, resume=args.resume,
                      tensorboard=not args.no_tensorboard, log_every=args.log_every,
                      limit_train_batches=args.limit_train_batches, distributed=args.distributed,
                      compile=args.compile, allow_nonfinite=args.allow_nonfinite)
    comm = None
    if cfg.distributed:
        from . import distributed
        comm = distributed.init_process_group(backend="nccl" if cfg.device.startswith("cuda") else "mpi")
        if cfg.device.startswith("cuda"):
            cfg = dataclasses.replace(cfg, device=f"cuda:{distributed.get_local_rank()}")
    from .train import Trainer
    explicit = {"tensorboard" if g == "no_tensorboard" else g for g in given}
    summary = Trainer(cfg, comm, explicit=explicit).run()
    if comm is None or comm.rank == 0:
        last = summary["history"][-1] if summary["history"] else {}
        print(f"\ndone: best test accuracy {100 * summary['best_accuracy']:.2f}% after {summary['epochs']} "
              f"epoch(s), {summary['steps']} steps in {summary['time_s']:.1f} s "
              f"({last.get('samples_per_s', 0):,.0f} samples/s in the last epoch)")
        print(f"files: {summary.get('metrics')}, {summary.get('curves')}, tensorboard {summary.get('tensorboard')}, "
              f"checkpoints in {summary['out']}")
    return 0


def _eval(args):
    from . import models
    from .resume import checkpoint_meta, validate_meta
    from .serialization import load_training_state
    from .train import evaluate, load_mnist
    from .utils.data import DataLoader
    meta = checkpoint_meta(args.checkpoint)
    validate_meta(args.checkpoint, meta)   # nothing is built from a config that was not checked
    model = models.build_model(meta["model"], meta["model_config"], args.checkpoint).to(args.device)
    load_training_state(args.checkpoint, model)
    loader = DataLoader(load_mnist(args.data_dir, False), batch_size=1000)
    print(json.dumps({"checkpoint": args.checkpoint, **evaluate(model, loader, args.device)}))
    return 0


def _distributed_group():
    """The default process group when this process is one rank of several, else None."""
    if "smalltrain.distributed" not in sys.modules:
        return None
    from . import distributed
    if not distributed.is_initialized():
        return None
    group = distributed.process_group.default_group()
    return group if group.world_size > 1 else None


def _fail(message, code, error=None):
    """Report an error; as one rank of several, end the whole job with it (the others would wait forever),
    unless every rank raised the same error (then each exits and rank 0 alone prints)."""
    group = _distributed_group()
    if group is None:
        print(f"smalltrain: {message}", file=sys.stderr)
        return code
    if getattr(error, "same_on_every_rank", False):
        if group.rank == 0:
            print(f"smalltrain: {message}", file=sys.stderr)
        return code
    group.abort_job(f"smalltrain: {message}")
    return code


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser()[0].parse_args(argv)
    try:
        if args.command == "train":
            return _train(args, _given_flags(argv))
        if args.command == "eval":
            return _eval(args)
        from .bench import main as bench_main
        return bench_main(args)
    except KeyboardInterrupt as e:
        return _fail(str(e) if str(e) else "interrupted", 130)
    except (ValueError, FileNotFoundError, RuntimeError, OSError) as e:
        return _fail(f"error: {e}", 1, e)


if __name__ == "__main__":
    sys.exit(main())

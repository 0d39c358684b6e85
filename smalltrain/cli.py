"""The `smalltrain` command: `train` (the default job: LeNet-5 on the bundled MNIST), `eval`, `bench`."""
import argparse
import dataclasses
import json
import sys

from .train import OPTIMIZERS, SCHEDULERS, TrainConfig


def _parser():
    p = argparse.ArgumentParser(prog="smalltrain", description="Train small networks on MNIST, from first "
                                "principles.")
    sub = p.add_subparsers(dest="command", required=True)
    d = TrainConfig()
    t = sub.add_parser("train", help="train a model on MNIST (defaults: LeNet-5, GELU, Adam 1e-3, batch 64, "
                                     "3 epochs, CPU)")
    t.add_argument("--model", choices=["lenet5", "cnn", "mlp"], default=d.model)
    t.add_argument("--device", default=d.device, help="cpu (default) or cuda[:N]")
    t.add_argument("--epochs", type=int, default=d.epochs)
    t.add_argument("--batch-size", type=int, default=d.batch_size,
                   help="batch size per process; with --distributed the global batch is this times the "
                        "number of processes (as with torch's DistributedSampler)")
    t.add_argument("--lr", type=float, default=d.lr)
    t.add_argument("--optimizer", choices=OPTIMIZERS, default=d.optimizer)
    t.add_argument("--momentum", type=float, default=d.momentum)
    t.add_argument("--weight-decay", type=float, default=d.weight_decay)
    t.add_argument("--scheduler", choices=SCHEDULERS, default=d.scheduler)
    t.add_argument("--seed", type=int, default=d.seed)
    t.add_argument("--data-dir", default=None, help="MNIST files (IDX, plain or gzip; torchvision's "
                                                    "MNIST/raw layout works); default: the bundled copy")
    t.add_argument("--out", default=d.out, help="run directory: metrics.jsonl, TensorBoard events, curves.png, "
                                               "checkpoints")
    t.add_argument("--resume", default=None, metavar="CKPT", help="continue from a checkpoint")
    t.add_argument("--no-tensorboard", action="store_true")
    t.add_argument("--log-every", type=int, default=d.log_every)
    t.add_argument("--limit-train-batches", type=int, default=None, help=argparse.SUPPRESS)
    t.add_argument("--distributed", action="store_true", help="one process per device under mpiexec/srun")
    t.add_argument("--compile", action="store_true", help="capture the training step as a CUDA graph")
    e = sub.add_parser("eval", help="test loss and accuracy of a checkpoint")
    e.add_argument("--checkpoint", required=True)
    e.add_argument("--device", default="cpu")
    e.add_argument("--data-dir", default=None)
    from .bench import add_arguments as add_bench_arguments
    b = sub.add_parser("bench", help="training throughput side by side with PyTorch (when importable); "
                                     "--speedrun: time to 99%% MNIST test accuracy",
                       description="Training-step throughput of smalltrain eager and compiled beside PyTorch's "
                                   "eager, torch.compile and reduce-overhead modes; or, with --speedrun, the time "
                                   "to train to 99.0% MNIST test accuracy. See docs/bench.md.")
    add_bench_arguments(b)
    return p


def _train(args):
    cfg = TrainConfig(model=args.model, device=args.device, epochs=args.epochs, batch_size=args.batch_size,
                      lr=args.lr, optimizer=args.optimizer, momentum=args.momentum,
                      weight_decay=args.weight_decay, scheduler=args.scheduler, seed=args.seed,
                      data_dir=args.data_dir, out=args.out, resume=args.resume,
                      tensorboard=not args.no_tensorboard, log_every=args.log_every,
                      limit_train_batches=args.limit_train_batches, distributed=args.distributed,
                      compile=args.compile)
    comm = None
    if cfg.distributed:
        from . import distributed
        comm = distributed.init_process_group(backend="nccl" if cfg.device.startswith("cuda") else "mpi")
        if cfg.device.startswith("cuda"):
            cfg = dataclasses.replace(cfg, device=f"cuda:{distributed.get_local_rank()}")
    from .train import Trainer
    summary = Trainer(cfg, comm).run()
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
    from .serialization import load_training_state
    from .train import evaluate, load_mnist
    from .serialization import read_checkpoint_meta
    from .utils.data import DataLoader
    meta = read_checkpoint_meta(args.checkpoint)
    if "model" not in meta:
        raise ValueError(f"{args.checkpoint}: not a smalltrain training checkpoint")
    model = models.build(meta["model"], **meta.get("model_config", {})).to(args.device)
    load_training_state(args.checkpoint, model)
    loader = DataLoader(load_mnist(args.data_dir, False), batch_size=1000)
    print(json.dumps({"checkpoint": args.checkpoint, **evaluate(model, loader, args.device)}))
    return 0


def main(argv=None):
    args = _parser().parse_args(argv)
    try:
        if args.command == "train":
            return _train(args)
        if args.command == "eval":
            return _eval(args)
        from .bench import main as bench_main
        return bench_main(args)
    except KeyboardInterrupt:
        print("smalltrain: interrupted", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, RuntimeError, OSError) as e:
        print(f"smalltrain: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

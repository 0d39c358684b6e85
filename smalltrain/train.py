"""The trainer behind `smalltrain train`: data, model, optimizer, scheduler, the loop, evaluation, logging, checkpoints.

Scripts call `fit(TrainConfig(...))`; the command is a thin layer over it.
"""
import dataclasses
import functools
import json
import math
import os
import sys
import time

import numpy as np

from . import models, optim, random as st_random
from .autograd import no_grad
from .nn import functional as F

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


@dataclasses.dataclass
class TrainConfig:
    model: str = "lenet5"
    device: str = "cpu"
    epochs: int = 3
    batch_size: int = 64
    lr: float = 1e-3
    optimizer: str = "adam"
    momentum: float = 0.0
    weight_decay: float = 0.0
    scheduler: str = "none"
    seed: int = 0
    data_dir: str = None
    out: str = "runs/smalltrain"
    resume: str = None
    tensorboard: bool = True
    log_every: int = 50
    eval_batch_size: int = 1000
    limit_train_batches: int = None   # for tests and smoke runs: stop each epoch early
    progress: bool = True
    distributed: bool = False
    compile: bool = False

    def validate(self):
        checks = [(self.epochs >= 1, f"epochs must be >= 1, got {self.epochs}"),
                  (self.batch_size >= 1, f"batch size must be >= 1, got {self.batch_size}"),
                  (self.lr > 0, f"learning rate must be > 0, got {self.lr}"),
                  (self.log_every >= 1, f"log-every must be >= 1, got {self.log_every}"),
                  (self.model in models.MODELS, f"unknown model {self.model!r}; expected one of "
                                                f"{', '.join(models.MODELS)}"),
                  (self.optimizer in OPTIMIZERS, f"unknown optimizer {self.optimizer!r}; expected one of "
                                                 f"{', '.join(OPTIMIZERS)}"),
                  (self.scheduler in SCHEDULERS, f"unknown scheduler {self.scheduler!r}; expected one of "
                                                 f"{', '.join(SCHEDULERS)}")]
        for ok, msg in checks:
            if not ok:
                raise ValueError(msg)


OPTIMIZERS = ("sgd", "adam", "adamw")
SCHEDULERS = ("none", "step", "cosine", "onecycle")


def make_optimizer(cfg, params):
    if cfg.optimizer == "sgd":
        return optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adam":
        return optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay or 1e-2)


def make_scheduler(cfg, opt, steps_per_epoch):
    sched = optim.lr_scheduler
    if cfg.scheduler == "step":
        return sched.StepLR(opt, step_size=max(1, cfg.epochs // 3) * steps_per_epoch, gamma=0.1)
    if cfg.scheduler == "cosine":
        return sched.CosineAnnealingLR(opt, T_max=cfg.epochs * steps_per_epoch)
    if cfg.scheduler == "onecycle":
        return sched.OneCycleLR(opt, max_lr=cfg.lr, total_steps=cfg.epochs * steps_per_epoch)
    return None


def load_mnist(data_dir, train):
    from .datasets import MNIST
    from .transforms import Compose, Normalize, ToTensor
    return MNIST(root=data_dir, train=train, transform=Compose([ToTensor(), Normalize((MNIST_MEAN,), (MNIST_STD,))]))


class Trainer:
    """Owns one run: build everything from the config (or a checkpoint), then `run()` the epochs."""

    def __init__(self, cfg, comm=None):
        from .utils.data import DataLoader, DeviceDataLoader, DistributedSampler
        cfg.validate()
        self.cfg = cfg
        self.comm = comm                       # a smalltrain.distributed group when distributed
        self.rank = comm.rank if comm else 0
        self.world = comm.world_size if comm else 1
        self.is_main = self.rank == 0
        st_random.manual_seed(cfg.seed)
        self.train_set = load_mnist(cfg.data_dir, True)
        self.test_set = load_mnist(cfg.data_dir, False)
        # one seeded permutation per epoch (sampler.set_epoch) makes a resumed run replay the same batches
        self.sampler = DistributedSampler(self.train_set, num_replicas=self.world, rank=self.rank, shuffle=True,
                                          seed=cfg.seed, drop_last=False)
        # evaluation shards without padding (its only collective is the final all-reduce of sums and counts),
        # so every test image counts exactly once for any number of processes
        test_sampler = range(self.rank, len(self.test_set), self.world) if comm else None
        if str(cfg.device).startswith("cuda"):
            # on a GPU, host-to-device batch copies cost more than the step: keep both sets on the device
            self.loader = DeviceDataLoader(self.train_set, cfg.batch_size, cfg.device, sampler=self.sampler)
            self.test_loader = DeviceDataLoader(self.test_set, cfg.eval_batch_size, cfg.device, sampler=test_sampler)
        else:
            self.loader = DataLoader(self.train_set, batch_size=cfg.batch_size, sampler=self.sampler)
            self.test_loader = DataLoader(self.test_set, batch_size=cfg.eval_batch_size, sampler=test_sampler)
        self.steps_per_epoch = len(self.loader) if cfg.limit_train_batches is None else \
            min(len(self.loader), cfg.limit_train_batches)
        self.model = models.build(cfg.model).to(cfg.device)
        self.module = self.model
        if comm:
            from .nn.parallel import DistributedDataParallel
            self.model = DistributedDataParallel(self.module)
        self.optimizer = make_optimizer(cfg, self.model.parameters())
        self.scheduler = make_scheduler(cfg, self.optimizer, self.steps_per_epoch)
        self.epoch, self.step, self.best_accuracy, self.history = 0, 0, 0.0, []
        if cfg.resume:
            self._restore(cfg.resume)
        self.logger = RunLogger(cfg.out, cfg.tensorboard, self.step) if self.is_main else None

    # ---- the loop --------------------------------------------------------------------------------------------
    def _step(self, x, y):
        """One optimizer step; with --compile it is captured as a CUDA graph (a last partial batch, having
        another shape, gets a graph of its own)."""
        self.optimizer.zero_grad()
        loss = F.cross_entropy(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        return loss

    @property
    def train_step(self):
        if "_train_step" not in self.__dict__:
            if self.cfg.compile:
                from .compile_ import compile as compile_step
                self._train_step = compile_step(self._step, warn_recapture=False)
            else:
                self._train_step = self._step
        return self._train_step

    def train_epoch(self):
        cfg, model, opt = self.cfg, self.model, self.optimizer
        model.train()
        self.sampler.set_epoch(self.epoch)
        start, seen, loss_sum, n_logged = time.perf_counter(), 0, 0.0, 0
        total = self.steps_per_epoch
        for k, (x, y) in enumerate(self.loader):
            if k >= total:
                break
            loss = self.train_step(x.to(cfg.device), y.to(cfg.device))
            if self.scheduler is not None:
                self.scheduler.step()
            self.step += 1
            seen += x.shape[0]
            if (k + 1) % cfg.log_every == 0 or k + 1 == total:
                value = loss.item()   # the only host sync per logging interval
                loss_sum, n_logged = loss_sum + value, n_logged + 1
                rate = seen * self.world / (time.perf_counter() - start)
                if self.logger:
                    self.logger.step(self.epoch + 1, self.step, value, opt.param_groups[0]["lr"])
                    if cfg.progress:
                        _progress(self.epoch + 1, cfg.epochs, k + 1, total, value, rate)
        elapsed = time.perf_counter() - start
        return {"train_loss": loss_sum / max(n_logged, 1), "train_time": elapsed,
                "samples_per_s": seen * self.world / elapsed}

    def _eval_batch(self, x, y):
        return eval_batch(self.module, x, y)

    @property
    def eval_step(self):
        """(summed loss, correct count) of one test batch; with --compile captured as a CUDA graph of its own
        (an uneven last shard, having another shape, gets a second one)."""
        if "_eval_step" not in self.__dict__:
            step = self._eval_batch
            if self.cfg.compile:
                from .compile_ import compile as compile_step
                step = compile_step(step, warn_recapture=False)
            self._eval_step = step
        return self._eval_step

    def evaluate(self):
        return evaluate(self.module, self.test_loader, self.cfg.device, self.comm, step=self.eval_step)

    def run(self):
        t0 = time.perf_counter()
        while self.epoch < self.cfg.epochs:
            train = self.train_epoch()
            test = self.evaluate()
            self.epoch += 1
            record = {"epoch": self.epoch, "step": self.step, **train, **test}
            self.history.append(record)
            self.best_accuracy = max(self.best_accuracy, test["test_accuracy"])
            if self.logger:
                self.logger.epoch(record)
                if self.cfg.progress:
                    print(f"\nepoch {self.epoch}/{self.cfg.epochs}: test loss {test['test_loss']:.4f}, "
                          f"test accuracy {100 * test['test_accuracy']:.2f}%, "
                          f"{train['samples_per_s']:.0f} samples/s", file=sys.stderr, flush=True)
                self.save_checkpoint()
        elapsed = time.perf_counter() - t0
        summary = {"best_accuracy": self.best_accuracy, "epochs": self.epoch, "steps": self.step,
                   "time_s": elapsed, "history": self.history, "out": self.cfg.out}
        if self.logger:
            self.logger.close()
            summary.update(self.logger.files())
        return summary

    # ---- checkpoints -----------------------------------------------------------------------------------------
    def checkpoint_path(self):
        return os.path.join(self.cfg.out, f"checkpoint_epoch{self.epoch}.safetensors")

    def save_checkpoint(self):
        from .serialization import save_training_state
        path = self.checkpoint_path()
        save_training_state(path, self.module, self.optimizer, self.scheduler, {
            "model": self.cfg.model, "model_config": getattr(self.module, "config", {}),
            "epoch": self.epoch, "step": self.step, "best_accuracy": self.best_accuracy,
            "history": self.history, "train_config": dataclasses.asdict(self.cfg)})
        self.last_checkpoint = path
        return path

    def _restore(self, path):
        from .serialization import load_training_state
        meta = load_training_state(path, self.module, self.optimizer, self.scheduler, expect_model=self.cfg.model)
        self.epoch, self.step = meta["epoch"], meta["step"]
        self.best_accuracy, self.history = meta.get("best_accuracy", 0.0), meta.get("history", [])


def eval_batch(model, x, y):
    """The summed cross-entropy and the number of correct predictions of one batch, as device tensors."""
    logits = model(x)
    return F.cross_entropy(logits, y, reduction="sum"), (logits.argmax(1) == y).sum()


@no_grad()
def evaluate(model, loader, device, comm=None, step=None):
    """Test loss and accuracy over the whole loader (sums and counts all-reduced when distributed).

    `step(x, y)` gives one batch's (loss sum, correct count); by default `eval_batch(model, x, y)`, the trainer
    passes a captured one with --compile. Its outputs are added up at once: a graph replay overwrites them."""
    model.eval()
    step = step or functools.partial(eval_batch, model)
    loss_sum, correct, count = 0.0, 0, 0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        batch_loss, batch_correct = step(x, y)
        # sums stay on the device until the end: one host sync per evaluation, not two per batch
        loss_sum = batch_loss.double() + loss_sum
        correct = batch_correct + correct
        count += y.shape[0]
    loss_sum, correct = (float(v.item()) if hasattr(v, "item") else float(v) for v in (loss_sum, correct))
    if comm:
        loss_sum, correct, count = comm.allreduce_scalars([loss_sum, correct, count])
    return {"test_loss": loss_sum / count, "test_accuracy": correct / count, "test_count": int(count)}


def fit(cfg=None, comm=None, **overrides):
    """Train with `cfg` (a TrainConfig) or keyword overrides of the defaults; returns the summary dict."""
    cfg = dataclasses.replace(cfg or TrainConfig(), **overrides)
    return Trainer(cfg, comm).run()


def _progress(epoch, epochs, k, total, loss, rate):
    width = 24
    done = int(width * k / total)
    bar = "#" * done + "." * (width - done)
    end = "\n" if not sys.stderr.isatty() else ""
    print(f"\repoch {epoch}/{epochs} [{bar}] [step {k}/{total}] loss {loss:.4f} {rate:,.0f} samples/s", end=end,
          file=sys.stderr, flush=True)


class RunLogger:
    """metrics.jsonl, TensorBoard scalars and the PNG of the curves, all under the run's --out directory."""

    def __init__(self, out, tensorboard, start_step):
        from .utils.tensorboard import SummaryWriter
        os.makedirs(out, exist_ok=True)
        self.out = out
        self.metrics_path = os.path.join(out, "metrics.jsonl")
        self.png_path = os.path.join(out, "curves.png")
        self.records = _read_records(self.metrics_path, start_step)
        self.writer = SummaryWriter(os.path.join(out, "tensorboard"), purge_step=start_step or None) \
            if tensorboard else None

    def _append(self, record):
        self.records.append(record)
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def step(self, epoch, step, loss, lr):
        self._append({"kind": "step", "epoch": epoch, "step": step, "loss": loss, "lr": lr})
        if self.writer:
            self.writer.add_scalar("Loss/train", loss, step)
            self.writer.add_scalar("lr", lr, step)

    def epoch(self, record):
        self._append({"kind": "epoch", **record})
        if self.writer:
            self.writer.add_scalar("Loss/test", record["test_loss"], record["step"])
            self.writer.add_scalar("Accuracy/test", record["test_accuracy"], record["step"])
            self.writer.flush()
        from .utils.plot import plot_curves
        plot_curves(self.records, self.png_path)

    def close(self):
        if self.writer:
            self.writer.close()

    def files(self):
        return {"metrics": self.metrics_path, "curves": self.png_path,
                "tensorboard": self.writer.log_dir if self.writer else None}


def _read_records(path, start_step):
    """Records of an earlier run being resumed, cut at the resumed step (later ones are rewritten)."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    kept = [r for r in records if r.get("step", 0) <= start_step] if start_step else []
    from .utils.io import atomic_write
    with atomic_write(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in kept)
    return kept


_ = (math, np)

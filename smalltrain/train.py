"""The trainer behind `smalltrain train`: data, model, optimizer, scheduler, the loop, evaluation, logging, checkpoints.

Scripts call `fit(TrainConfig(...))`; the command is a thin layer over it. Resuming is in resume.py, the run
directory and its files in run_dir.py.
"""
import dataclasses
import functools
import math
import os
import sys
import time

from . import models, optim, random as st_random
from .autograd import no_grad
from .backend.cuda.prebuilt import compile_seconds
from .distributed.consistency import check_same_settings
from .nn import functional as F
from .resume import resume_config, stretch_schedule
from .run_dir import RunLogger, choose_run_dir, finite_or_str

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
    out: str = "runs/smalltrain"      # each run writes into a new out/version_N (see run_dir.choose_run_dir)
    resume: str = None
    tensorboard: bool = True
    log_every: int = 50
    eval_batch_size: int = 1000
    limit_train_batches: int = None   # for tests and smoke runs: stop each epoch early
    progress: bool = True
    distributed: bool = False
    compile: bool = False
    allow_nonfinite: bool = False     # keep training when the loss becomes NaN or infinite

    def validate(self):
        """ValueError naming the first setting out of its range (the command line checks the same at parse)."""
        for name, ok, what in _RANGES:
            if not ok(getattr(self, name)):
                raise ValueError(f"{name} must be {what}, got {getattr(self, name)!r}")
        checks = [(self.model in models.MODELS, f"unknown model {self.model!r}; expected one of "
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


def _int_in(lo, hi):
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _float_in(lo, hi, lo_open=False, hi_open=False):
    def ok(v):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return False
        return (lo < v if lo_open else lo <= v) and (v < hi if hi_open else v <= hi)
    return ok


# (field, check, what it must be): shared by TrainConfig.validate and the command line's argument types
_RANGES = [("epochs", _int_in(1, 100_000), "an int in [1, 100000]"),
           ("batch_size", _int_in(1, 65_536), "an int in [1, 65536]"),
           ("eval_batch_size", _int_in(1, 65_536), "an int in [1, 65536]"),
           ("lr", _float_in(0, 10, lo_open=True), "a finite number in (0, 10]"),
           ("momentum", _float_in(0, 1, hi_open=True), "a finite number in [0, 1)"),
           ("weight_decay", _float_in(0, 1), "a finite number in [0, 1]"),
           ("seed", _int_in(0, 2**32 - 1), "an int in [0, 2**32 - 1]"),
           ("log_every", _int_in(1, 10**9), "an int >= 1"),
           ("limit_train_batches", lambda v: v is None or _int_in(1, 10**9)(v), "an int >= 1")]
RANGES = {name: (ok, what) for name, ok, what in _RANGES}


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite (stop before a checkpoint of NaN parameters is written)."""


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

    def __init__(self, cfg, comm=None, explicit=None):
        """`explicit`: the names of the settings the user gave (the command line's flags); a resumed run refuses
        those that contradict its checkpoint. None: those that differ from TrainConfig's defaults."""
        cfg.validate()
        explicit = _non_default(cfg) if explicit is None else set(explicit)
        meta = None
        if cfg.resume:
            cfg, meta = resume_config(cfg, explicit)
        self.cfg = cfg
        self.comm = comm                       # a smalltrain.distributed group when distributed
        self.rank = comm.rank if comm else 0
        self.world = comm.world_size if comm else 1
        self.is_main = self.rank == 0
        st_random.manual_seed(cfg.seed)
        self._make_loaders(cfg, comm)
        if comm:
            check_same_settings(comm, self._settings(meta))
        model_config = meta["model_config"] if meta else {}
        self.model = models.build_model(cfg.model, model_config, cfg.resume or "model config").to(cfg.device)
        self.module = self.model
        if comm:
            from .nn.parallel import DistributedDataParallel
            self.model = DistributedDataParallel(self.module)
        self.optimizer = make_optimizer(cfg, self.model.parameters())
        self.scheduler = make_scheduler(cfg, self.optimizer, self.steps_per_epoch)
        self.epoch, self.step, self.best_accuracy, self.history = 0, 0, 0.0, []
        if cfg.resume:
            self._restore(cfg.resume)
            if self.scheduler is not None and cfg.epochs != meta["train_config"].get("epochs"):
                self.scheduler = stretch_schedule(
                    self.optimizer, lambda: make_scheduler(cfg, self.optimizer, self.steps_per_epoch), self.step)
        self.run_dir, self.logger = None, None
        if self.is_main:
            self.run_dir = choose_run_dir(cfg.out, "out" in explicit, cfg.resume)
            if cfg.progress:
                print(f"run directory: {self.run_dir}", file=sys.stderr, flush=True)
            self.logger = RunLogger(self.run_dir, cfg.tensorboard, self.step)

    def _make_loaders(self, cfg, comm):
        from .utils.data import DataLoader, DeviceDataLoader, DistributedSampler
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

    def _settings(self, meta):
        """What every rank of a distributed run must agree on (the device's index, paths and logging may differ;
        its type not: the CPU's MPI collectives and NCCL's never meet)."""
        per_rank = ("device", "data_dir", "out", "resume", "progress", "tensorboard", "log_every")
        settings = {k: v for k, v in dataclasses.asdict(self.cfg).items() if k not in per_rank}
        settings.update(device_type=str(self.cfg.device).split(":")[0],
                        train_set_size=len(self.train_set), test_set_size=len(self.test_set),
                        steps_per_epoch=self.steps_per_epoch,
                        resume_from=None if meta is None else {"epoch": meta["epoch"], "step": meta["step"]})
        return settings

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
        compiled_before = compile_seconds()   # kernels compiled at run time: kept out of the rates shown
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
                if not math.isfinite(value) and not cfg.allow_nonfinite:
                    raise NonFiniteLossError(
                        f"the training loss became {value} at epoch {self.epoch + 1}, step {self.step} (lr "
                        f"{opt.param_groups[0]['lr']:g}); training stopped before writing a checkpoint. Lower "
                        f"--lr, or pass --allow-nonfinite to continue anyway")
                loss_sum, n_logged = loss_sum + value, n_logged + 1
                rate = seen * self.world / _training_seconds(start, compiled_before)
                if self.logger:
                    self.logger.step(self.epoch + 1, self.step, value, opt.param_groups[0]["lr"])
                    if cfg.progress:
                        _progress(self.epoch + 1, cfg.epochs, k + 1, total, value, rate)
        elapsed = time.perf_counter() - start
        return {"train_loss": loss_sum / max(n_logged, 1), "train_time": elapsed,
                "compile_time": compile_seconds() - compiled_before,
                "samples_per_s": seen * self.world / _training_seconds(start, compiled_before)}

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
                   "time_s": elapsed, "history": self.history, "out": self.run_dir}
        if self.logger:
            self.logger.close()
            summary.update(self.logger.files())
        return summary

    # ---- checkpoints -----------------------------------------------------------------------------------------
    def checkpoint_path(self):
        return os.path.join(self.run_dir, f"checkpoint_epoch{self.epoch}.safetensors")

    def save_checkpoint(self):
        from .serialization import save_training_state
        path = self.checkpoint_path()
        save_training_state(path, self.module, self.optimizer, self.scheduler, {
            "model": self.cfg.model, "model_config": getattr(self.module, "config", {}),
            "epoch": self.epoch, "step": self.step, "best_accuracy": self.best_accuracy,
            "history": finite_or_str(self.history), "train_config": dataclasses.asdict(self.cfg)})
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
    """Train with `cfg` (a TrainConfig) or keyword overrides of the defaults; returns the summary dict (its
    "out" is the run directory)."""
    cfg = dataclasses.replace(cfg or TrainConfig(), **overrides)
    return Trainer(cfg, comm).run()


def _non_default(cfg):
    defaults = TrainConfig()
    return {f.name for f in dataclasses.fields(cfg) if getattr(cfg, f.name) != getattr(defaults, f.name)}


def _training_seconds(start, compiled_before):
    """Seconds since `start` less the run-time kernel compilation since then (a first GPU run compiles what no
    prebuilt binary covers; a rate that counted it would show a fraction of the training speed)."""
    return max(time.perf_counter() - start - (compile_seconds() - compiled_before), 1e-9)


def _progress(epoch, epochs, k, total, loss, rate):
    width = 24
    done = int(width * k / total)
    bar = "#" * done + "." * (width - done)
    end = "\n" if not sys.stderr.isatty() else ""
    print(f"\repoch {epoch}/{epochs} [{bar}] [step {k}/{total}] loss {loss:.4f} {rate:,.0f} samples/s", end=end,
          file=sys.stderr, flush=True)

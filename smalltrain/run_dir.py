"""Where a run writes, and what: one directory per run (`<out>/version_N`, as Lightning does) holding
metrics.jsonl, TensorBoard events, curves.png and the checkpoints; the logger that writes them.

metrics.jsonl is strict JSON: a non-finite number is written as the string "nan", "inf" or "-inf".
"""
import json
import math
import os
import re
import warnings

from .utils.io import atomic_write

_VERSION = re.compile(r"version_(\d+)$")


def is_run_dir(path):
    """Whether `path` holds a run: its metrics.jsonl or a checkpoint."""
    if not os.path.isdir(path):
        return False
    return any(n == "metrics.jsonl" or (n.startswith("checkpoint_epoch") and n.endswith(".safetensors"))
               for n in os.listdir(path))


def new_run_dir(root):
    """Create and return `root/version_N` with N one above the highest existing (0 in a new root); concurrent
    runs cannot get the same directory (os.mkdir fails for the second, which takes the next N)."""
    os.makedirs(root, exist_ok=True)
    taken = [int(m.group(1)) for n in os.listdir(root) if (m := _VERSION.match(n))]
    n = max(taken, default=-1) + 1
    while True:
        path = os.path.join(root, f"version_{n}")
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            n += 1


def choose_run_dir(out, out_given, resume):
    """The directory of this run. A new run: a new `out/version_N`. A resumed run: the checkpoint's directory,
    or `out` when given and already a run directory (resume into it), else a new version under `out`."""
    if resume:
        if not out_given:
            return os.path.dirname(os.path.abspath(resume))
        if is_run_dir(out):
            return out
    elif is_run_dir(out):
        raise ValueError(f"--out {out} is already a run directory (it holds metrics.jsonl or checkpoints); a new "
                         f"run gets a directory of its own under --out: pass its parent (e.g. --out "
                         f"{os.path.dirname(os.path.abspath(out))}), or --resume one of its checkpoints to continue it")
    return new_run_dir(out)


def finite_or_str(value):
    """JSON-safe numbers: NaN and infinities become "nan", "inf", "-inf"; containers are converted through."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: finite_or_str(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_str(v) for v in value]
    return value


def json_line(record):
    return json.dumps(finite_or_str(record), allow_nan=False) + "\n"


def read_records(path, start_step):
    """Records of an earlier run being resumed, cut at the resumed step (later ones are rewritten); a torn last
    line (a run killed mid-write) is dropped with a warning naming the file."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        lines = [(n, line) for n, line in enumerate(f, start=1) if line.strip()]
    records = []
    for k, (number, line) in enumerate(lines):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            if k == len(lines) - 1:
                warnings.warn(f"{path}: line {number} is incomplete (a run stopped while writing it?); it is "
                              "dropped", RuntimeWarning, stacklevel=3)
                break
            raise ValueError(f"{path}: line {number}: not valid JSON: {e}") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}: line {number}: expected a JSON object, got {type(record).__name__}")
        records.append(record)
    kept = [r for r in records if isinstance(r.get("step", 0), int) and r.get("step", 0) <= start_step] \
        if start_step else []
    with atomic_write(path, "w") as f:
        f.writelines(json_line(r) for r in kept)
    return kept


class RunLogger:
    """metrics.jsonl, TensorBoard scalars and the PNG of the curves, all in the run directory."""

    def __init__(self, out, tensorboard, start_step):
        from .utils.tensorboard import SummaryWriter
        os.makedirs(out, exist_ok=True)
        self.out = out
        self.metrics_path = os.path.join(out, "metrics.jsonl")
        self.png_path = os.path.join(out, "curves.png")
        self.records = read_records(self.metrics_path, start_step)
        self.writer = SummaryWriter(os.path.join(out, "tensorboard"), purge_step=start_step or None) \
            if tensorboard else None

    def _append(self, record):
        self.records.append(record)
        with open(self.metrics_path, "a", encoding="utf-8") as f:
            f.write(json_line(record))

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

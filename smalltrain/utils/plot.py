"""Training curves as a PNG: loss (train per logged step, test per epoch) and test accuracy per epoch.

matplotlib is imported inside `plot_curves` only, so importing smalltrain never imports it.
"""
import json
import math
import os

from smalltrain.utils.io import atomic_write

__all__ = ["plot_curves", "read_metrics"]


def read_metrics(path):
    """Read a metrics JSONL file into a list of dicts; blank lines are skipped, a bad line names file and line."""
    records = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {number}: not valid JSON: {e}") from None
            if not isinstance(record, dict):  # a malformed file, not a caller's type error: ValueError
                raise ValueError(  # noqa: TRY004
                    f"{path}: line {number}: expected a JSON object, got {type(record).__name__}")
            records.append(record)
    return records


def _series(records, kind, x_key, y_key):
    """(xs, ys) of the records of `kind` that have both keys; non-finite y becomes NaN (a gap, not a wild axis)."""
    xs, ys = [], []
    for record in records:
        if record.get("kind") == kind and record.get(x_key) is not None and record.get(y_key) is not None:
            y = float(record[y_key])
            xs.append(record[x_key])
            ys.append(y if math.isfinite(y) else math.nan)
    return xs, ys


def _draw_loss(ax, records):
    train = _series(records, "step", "step", "loss")
    test = _series(records, "epoch", "step", "test_loss")
    train_epoch = _series(records, "epoch", "step", "train_loss")
    ax.plot(*train, color="tab:blue", linewidth=1, alpha=0.8, label="train (per logged step)")
    if train_epoch[0]:
        ax.plot(*train_epoch, "s--", color="tab:cyan", markersize=4, label="train (epoch mean)")
    if test[0]:
        ax.plot(*test, "o-", color="tab:orange", markersize=5, label="test (per epoch)")
    if not (train[0] or test[0] or train_epoch[0]):
        ax.text(0.5, 0.5, "no loss records yet", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("Loss")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()


def _draw_accuracy(ax, records):
    from matplotlib.ticker import MaxNLocator, PercentFormatter

    epochs, accuracy = _series(records, "epoch", "epoch", "test_accuracy")
    if epochs:
        ax.plot(epochs, accuracy, "o-", color="tab:green", label="test accuracy")
        finite = [a for a in accuracy if not math.isnan(a)]
        if finite and max(finite) <= 1.0:  # a fraction: show it as a percentage, the axis never above 100%
            ax.yaxis.set_major_formatter(PercentFormatter(1.0))
            low, high = min(finite), max(finite)
            margin = max(0.01, 0.1 * (high - low))
            ax.set_ylim(max(0.0, low - margin), min(1.0, high + margin))
        if finite:
            ax.annotate(f"{finite[-1]:.4g}", (epochs[-1], accuracy[-1]), textcoords="offset points", xytext=(0, -14),
                        ha="center")
        ax.legend(loc="lower right")
        # whole epochs only: one epoch would otherwise get ticks at 0.96, 0.98, 1.00 ...
        ax.set_xlim(min(epochs) - 0.5, max(epochs) + 0.5)
    else:
        ax.text(0.5, 0.5, "no epoch records yet", ha="center", va="center", transform=ax.transAxes)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy")
    ax.set_title("Test accuracy")
    ax.grid(True, alpha=0.3)


def plot_curves(metrics, png_path):
    """Draw the curves of `metrics` (a JSONL path, or an iterable of record dicts) into `png_path`, atomically;
    returns the matplotlib Figure.

    Records: {"kind": "step", "step", "epoch", "loss", "lr"} and
    {"kind": "epoch", "epoch", "step", "test_loss", "test_accuracy", "train_loss"}; other kinds are ignored.
    """
    if isinstance(metrics, (str, os.PathLike)):
        records, source = read_metrics(metrics), os.fspath(metrics)
    else:
        records, source = [r for r in metrics if isinstance(r, dict)], "the given records"
    if not any(r.get("kind") in ("step", "epoch") for r in records):
        raise ValueError(f"plot_curves: no 'step' or 'epoch' records in {source}")

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # A bare Figure with an Agg canvas: no pyplot, so no global state and no GUI backend is ever selected.
    figure = Figure(figsize=(11, 4.5), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    loss_ax, accuracy_ax = figure.subplots(1, 2)
    _draw_loss(loss_ax, records)
    _draw_accuracy(accuracy_ax, records)
    with atomic_write(png_path, "wb") as f:
        figure.savefig(f, format="png")
    return figure

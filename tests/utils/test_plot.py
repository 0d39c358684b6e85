"""Tests for smalltrain.utils.plot: a real, non-blank PNG from JSONL or records, written atomically."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from smalltrain.utils.plot import plot_curves, read_metrics

matplotlib_image = pytest.importorskip("matplotlib.image")

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def make_records(epochs=3, steps_per_epoch=5):
    records, step = [{"kind": "config", "lr": 0.1}], 0
    for epoch in range(1, epochs + 1):
        for _ in range(steps_per_epoch):
            step += 1
            records.append({"kind": "step", "step": step, "epoch": epoch, "loss": 2.0 / step, "lr": 0.1})
        records.append({"kind": "epoch", "epoch": epoch, "step": step, "test_loss": 1.5 / epoch,
                        "test_accuracy": 0.8 + 0.05 * epoch, "train_loss": 1.8 / epoch})
    return records


def assert_real_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 10_000
    image = matplotlib_image.imread(str(path))
    assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 400
    rgb = image[..., :3].reshape(-1, 3)
    assert rgb.std(axis=0).max() > 0.05  # not a blank canvas
    packed = np.round(rgb * 255).astype(np.uint32) @ np.array([1 << 16, 1 << 8, 1], dtype=np.uint32)
    assert len(np.unique(packed)) > 20  # curves, text and colors, not just a frame
    assert not [n for n in os.listdir(path.parent) if n.endswith(".tmp")]


def test_plot_from_jsonl(tmp_path):
    jsonl = tmp_path / "metrics.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in make_records()) + "\n\n")
    png = tmp_path / "out" / "curves.png"
    plot_curves(jsonl, png)
    assert_real_png(png)


def test_plot_from_records_with_gaps(tmp_path):
    records = make_records(epochs=2)
    records[3]["loss"] = float("nan")
    records.append({"kind": "step", "step": 99, "epoch": 3, "loss": float("inf"), "lr": 0.1})
    png = tmp_path / "curves.png"
    plot_curves(iter(records), png)
    assert_real_png(png)


def test_plot_with_steps_only(tmp_path):
    png = tmp_path / "curves.png"
    plot_curves([r for r in make_records(epochs=1) if r["kind"] == "step"], png)
    assert_real_png(png)


def test_plot_overwrites_existing_png(tmp_path):
    png = tmp_path / "curves.png"
    png.write_bytes(b"old")
    plot_curves(make_records(), png)
    assert_real_png(png)


def test_no_records_raises(tmp_path):
    with pytest.raises(ValueError, match="no 'step' or 'epoch' records"):
        plot_curves([{"kind": "config"}], tmp_path / "x.png")
    assert os.listdir(tmp_path) == []


def test_bad_jsonl_line_names_file_and_line(tmp_path):
    jsonl = tmp_path / "metrics.jsonl"
    jsonl.write_text('{"kind": "step", "step": 1, "loss": 1.0}\n{broken\n')
    with pytest.raises(ValueError, match=r"metrics\.jsonl: line 2: not valid JSON"):
        read_metrics(jsonl)


def test_import_does_not_import_matplotlib():
    code = "import sys, smalltrain.utils.plot; assert 'matplotlib' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=os.path.dirname(os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))))


def test_one_epoch_has_whole_epoch_ticks_and_accuracy_capped_at_100_percent(tmp_path):
    """After a 1-epoch run: the epoch axis shows only the tick 1 (not 0.96, 0.98 ...), and an accuracy near 100%
    does not stretch the axis to 102%."""
    records = make_records(epochs=1)
    records[-1]["test_accuracy"] = 0.995
    figure = plot_curves(records, tmp_path / "curves.png")
    accuracy_ax = figure.axes[1]
    low, high = accuracy_ax.get_xlim()
    assert [t for t in accuracy_ax.get_xticks() if low <= t <= high] == [1.0]
    assert accuracy_ax.get_ylim()[1] == 1.0 and accuracy_ax.get_ylim()[0] < 0.995
    assert_real_png(tmp_path / "curves.png")

"""The trainer and the `smalltrain` command end to end on the bundled MNIST: accuracy, files, resume, bad input."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from smalltrain import cli
from smalltrain.train import TrainConfig, fit
from smalltrain.serialization import load as load_checkpoint
from smalltrain.serialization import read_checkpoint_meta

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
MNIST_DIR = os.path.join(os.path.dirname(__file__), "..", "smalltrain", "datasets", "data", "mnist")


def run_cli(*args):
    """Run `python -m smalltrain ...` in a fresh process; returns (exit code, stdout + stderr)."""
    p = subprocess.run([sys.executable, "-m", "smalltrain", *args], capture_output=True, text=True, timeout=600,
                       cwd=os.path.join(os.path.dirname(__file__), ".."))
    return p.returncode, p.stdout + p.stderr


def test_default_recipe_reaches_97_percent_after_one_epoch(tmp_path):
    summary = fit(TrainConfig(epochs=1, out=str(tmp_path), progress=False))
    acc = summary["history"][0]["test_accuracy"]
    print(f"\nLeNet-5 (GELU, Adam 1e-3, batch 64), 1 epoch: test accuracy {100 * acc:.2f}%")
    assert acc >= 0.97
    assert summary["history"][0]["test_count"] == 10000
    # the run directory holds every promised file, and the metrics agree with the summary
    names = os.listdir(tmp_path)
    assert {"metrics.jsonl", "curves.png", "checkpoint_epoch1.safetensors"} <= set(names)
    assert "checkpoint_epoch1.json" not in names   # one file per checkpoint, no sidecar
    records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    epochs = [r for r in records if r["kind"] == "epoch"]
    assert len(epochs) == 1 and epochs[0]["test_accuracy"] == acc
    assert sum(r["kind"] == "step" for r in records) >= 938 // 50
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ea = EventAccumulator(str(tmp_path / "tensorboard"))
    ea.Reload()
    tags = set(ea.Tags()["scalars"])
    assert {"Loss/train", "Loss/test", "Accuracy/test", "lr"} <= tags
    assert ea.Scalars("Accuracy/test")[0].value == pytest.approx(acc, rel=1e-6)
    with open(tmp_path / "curves.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_cnn_with_sgd_reaches_97_percent_after_one_epoch(tmp_path):
    summary = fit(TrainConfig(model="cnn", optimizer="sgd", lr=0.1, epochs=1, out=str(tmp_path), progress=False,
                              tensorboard=False))
    acc = summary["history"][0]["test_accuracy"]
    print(f"\nMnistCnn (SGD lr 0.1, batch 64), 1 epoch: test accuracy {100 * acc:.2f}%")
    assert acc >= 0.97


def _params(path):
    state = load_checkpoint(path)
    tensors = {f"model.{k}": v for k, v in state["model"].items()}
    tensors.update({f"optimizer.{i}.{k}": v for i, s in state["optimizer"]["state"].items() for k, v in s.items()})
    return {k: v.numpy() for k, v in tensors.items()}


def test_resume_is_bitwise_exact(tmp_path):
    # constant lr: a schedule's length follows --epochs, so a 1-epoch run schedules differently from a 2-epoch one
    common = ["--limit-train-batches", "20", "--no-tensorboard", "--log-every", "5", "--momentum", "0.9",
              "--optimizer", "sgd", "--lr", "0.05"]
    assert cli.main(["train", "--epochs", "2", "--out", str(tmp_path / "a"), *common]) == 0
    assert cli.main(["train", "--epochs", "1", "--out", str(tmp_path / "b"), *common]) == 0
    assert cli.main(["train", "--epochs", "2", "--out", str(tmp_path / "b"), "--resume",
                     str(tmp_path / "b" / "checkpoint_epoch1.safetensors"), *common]) == 0
    a = _params(tmp_path / "a" / "checkpoint_epoch2.safetensors")
    b = _params(tmp_path / "b" / "checkpoint_epoch2.safetensors")
    assert a.keys() == b.keys() and len(a) > 10
    for k in a:
        assert a[k].tobytes() == b[k].tobytes(), k
    ja = load_checkpoint(tmp_path / "a" / "checkpoint_epoch2.safetensors")
    jb = load_checkpoint(tmp_path / "b" / "checkpoint_epoch2.safetensors")
    assert ja["meta"]["step"] == jb["meta"]["step"] == 40
    assert ja["scheduler"] == jb["scheduler"]


def test_eval_command_reports_the_checkpoint_accuracy(tmp_path, capsys):
    assert cli.main(["train", "--epochs", "1", "--limit-train-batches", "30", "--no-tensorboard",
                     "--out", str(tmp_path)]) == 0
    meta = read_checkpoint_meta(tmp_path / "checkpoint_epoch1.safetensors")
    capsys.readouterr()
    assert cli.main(["eval", "--checkpoint", str(tmp_path / "checkpoint_epoch1.safetensors")]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["test_accuracy"] == meta["history"][-1]["test_accuracy"]


@pytest.fixture
def bad_data_dir(tmp_path):
    d = tmp_path / "mnist"
    shutil.copytree(MNIST_DIR, d)
    return d


def test_truncated_idx_file_is_a_clear_error(bad_data_dir, tmp_path):
    import gzip
    path = bad_data_dir / "t10k-labels-idx1-ubyte.gz"
    data = gzip.decompress(path.read_bytes())
    path.unlink()
    (bad_data_dir / "t10k-labels-idx1-ubyte").write_bytes(data[:-100])
    code, out = run_cli("train", "--data-dir", str(bad_data_dir), "--out", str(tmp_path / "run"))
    assert code != 0
    assert "t10k-labels-idx1-ubyte" in out and "Traceback" not in out
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_missing_data_dir_is_a_clear_error(tmp_path):
    code, out = run_cli("train", "--data-dir", str(tmp_path / "nowhere"), "--out", str(tmp_path / "run"))
    assert code != 0 and "nowhere" in out and "Traceback" not in out


def test_checkpoint_for_another_model_is_refused(tmp_path):
    assert cli.main(["train", "--model", "mlp", "--epochs", "1", "--limit-train-batches", "2",
                     "--no-tensorboard", "--out", str(tmp_path / "mlp")]) == 0
    code, out = run_cli("train", "--resume", str(tmp_path / "mlp" / "checkpoint_epoch1.safetensors"),
                        "--out", str(tmp_path / "lenet"), "--no-tensorboard")
    assert code != 0 and "'mlp'" in out and "lenet5" in out and "Traceback" not in out


def test_truncated_checkpoint_is_refused(tmp_path):
    assert cli.main(["train", "--epochs", "1", "--limit-train-batches", "2", "--no-tensorboard",
                     "--out", str(tmp_path)]) == 0
    ckpt = tmp_path / "checkpoint_epoch1.safetensors"
    ckpt.write_bytes(ckpt.read_bytes()[:-1000])
    code, out = run_cli("eval", "--checkpoint", str(ckpt))
    assert code != 0 and "checkpoint_epoch1" in out and "Traceback" not in out


def test_unknown_option_exits_non_zero():
    code, out = run_cli("train", "--bogus")
    assert code == 2 and "unrecognized arguments: --bogus" in out
    code, out = run_cli("train", "--model", "resnet")
    assert code == 2 and "invalid choice" in out


def test_lab_script_runs_unchanged(tmp_path):
    """examples/lenet5_lab.py: a PyTorch-style script, with smalltrain imported as torch."""
    root = tmp_path / "data"
    p = subprocess.run([sys.executable, "examples/lenet5_lab.py", "--max-steps", "30", "--root", str(root),
                        "--logdir", str(tmp_path / "runs"), "--custom-gelu"], capture_output=True, text=True,
                       timeout=300, cwd=REPO, env={**os.environ, "PYTHONPATH": REPO})
    assert p.returncode == 0, p.stderr
    acc = float(p.stdout.split("test accuracy ")[1].split("%")[0])
    assert acc > 50.0  # 30 Adam steps already learn most digits; chance is 10%
    assert any(n.startswith("events.out.tfevents") for n in os.listdir(tmp_path / "runs"))
    _ = np


def test_compile_flag_on_cpu_trains_eagerly_and_identically(tmp_path):
    """--compile captures CUDA graphs on a GPU; on the CPU it must run the very same steps eagerly."""
    common = ["train", "--epochs", "1", "--limit-train-batches", "10", "--no-tensorboard"]
    assert cli.main([*common, "--out", str(tmp_path / "eager")]) == 0
    assert cli.main([*common, "--compile", "--out", str(tmp_path / "compiled")]) == 0
    a = _params(tmp_path / "eager" / "checkpoint_epoch1.safetensors")
    b = _params(tmp_path / "compiled" / "checkpoint_epoch1.safetensors")
    assert all(a[k].tobytes() == b[k].tobytes() for k in a)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not __import__("smalltrain").cuda.is_available(), reason="no CUDA device"))])
def test_compiled_evaluation_equals_eager_evaluation(device, tmp_path):
    """--compile captures the evaluation batch as a graph of its own on CUDA (eager on the CPU): same loss, same
    count of correct answers as the eager evaluation of the same model, an uneven last batch included."""
    from smalltrain.train import Trainer, evaluate
    cfg = TrainConfig(epochs=1, device=device, compile=True, limit_train_batches=30, eval_batch_size=768,
                      tensorboard=False, progress=False, out=str(tmp_path))
    trainer = Trainer(cfg)
    trainer.train_epoch()
    first, second = trainer.evaluate(), trainer.evaluate()   # the second one replays the captured graphs
    eager = evaluate(trainer.module, trainer.test_loader, device)
    assert first["test_count"] == second["test_count"] == eager["test_count"] == 10000   # 13 x 768 + 16
    assert first["test_accuracy"] == second["test_accuracy"] == eager["test_accuracy"] > 0.5
    assert first["test_loss"] == pytest.approx(eager["test_loss"], rel=1e-6)
    assert second["test_loss"] == pytest.approx(eager["test_loss"], rel=1e-6)
    stats = getattr(trainer.eval_step, "stats", None)
    if device == "cuda":
        # 768 rows: 3 eager warm-up calls, captured on the 4th, replayed from then on (10 + 13); the 16-row last
        # batch comes twice, still within its warm-up, so it runs eagerly both times
        assert stats == {"captures": 1, "replays": 23, "eager": 5}
    else:
        assert stats == {"captures": 0, "replays": 0, "eager": 28}

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
    assert summary["out"] == str(tmp_path / "version_0")   # each run gets a directory of its own
    tmp_path = tmp_path / "version_0"
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
    b = tmp_path / "b" / "version_0"
    # resumed into the checkpoint's own run directory; the flags repeated are the checkpoint's, so allowed
    assert cli.main(["train", "--epochs", "2", "--resume", str(b / "checkpoint_epoch1.safetensors"), *common]) == 0
    a = tmp_path / "a" / "version_0"
    ja, jb = (load_checkpoint(d / "checkpoint_epoch2.safetensors") for d in (a, b))
    a, b = _params(a / "checkpoint_epoch2.safetensors"), _params(b / "checkpoint_epoch2.safetensors")
    assert a.keys() == b.keys() and len(a) > 10
    for k in a:
        assert a[k].tobytes() == b[k].tobytes(), k
    assert ja["meta"]["step"] == jb["meta"]["step"] == 40
    assert ja["scheduler"] == jb["scheduler"]


def test_eval_command_reports_the_checkpoint_accuracy(tmp_path, capsys):
    assert cli.main(["train", "--epochs", "1", "--limit-train-batches", "30", "--no-tensorboard",
                     "--out", str(tmp_path)]) == 0
    ckpt = tmp_path / "version_0" / "checkpoint_epoch1.safetensors"
    meta = read_checkpoint_meta(ckpt)
    capsys.readouterr()
    assert cli.main(["eval", "--checkpoint", str(ckpt)]) == 0
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
    code, out = run_cli("train", "--resume", str(tmp_path / "mlp" / "version_0" / "checkpoint_epoch1.safetensors"),
                        "--model", "lenet5", "--epochs", "2", "--out", str(tmp_path / "lenet"), "--no-tensorboard")
    assert code == 1 and "--model lenet5 contradicts" in out and "model mlp" in out and "Traceback" not in out
    assert not (tmp_path / "lenet").exists()


def test_truncated_checkpoint_is_refused(tmp_path):
    assert cli.main(["train", "--epochs", "1", "--limit-train-batches", "2", "--no-tensorboard",
                     "--out", str(tmp_path)]) == 0
    ckpt = tmp_path / "version_0" / "checkpoint_epoch1.safetensors"
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
    a = _params(tmp_path / "eager" / "version_0" / "checkpoint_epoch1.safetensors")
    b = _params(tmp_path / "compiled" / "version_0" / "checkpoint_epoch1.safetensors")
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


# ---- resume takes the run's settings from its checkpoint ------------------------------------------------------
QUICK = ["--limit-train-batches", "4", "--no-tensorboard", "--log-every", "1"]


def _records(run_dir):
    """metrics.jsonl as strict JSON (a bare NaN or Infinity fails here)."""
    def refuse(name):
        raise AssertionError(f"bare {name} in metrics.jsonl")
    return [json.loads(line, parse_constant=refuse) for line in open(run_dir / "metrics.jsonl")]


def test_readme_resume_takes_model_and_optimizer_from_the_checkpoint(tmp_path, monkeypatch, capsys):
    """The README's commands as written (the first one limited to 4 batches): a CNN under SGD lr 0.1, then
    --resume with only --epochs: the resumed run is the same CNN under SGD at lr 0.1 (not the default LeNet-5
    under Adam), written into the same run directory, and eval reads its last checkpoint."""
    from smalltrain.train import Trainer
    monkeypatch.chdir(tmp_path)
    assert cli.main("train --model cnn --optimizer sgd --lr 0.1 --epochs 1 --limit-train-batches 4".split()) == 0
    ckpt = "runs/smalltrain/version_0/checkpoint_epoch1.safetensors"
    trainer = Trainer(TrainConfig(resume=ckpt, epochs=3, progress=False, tensorboard=False),
                      explicit={"resume", "epochs"})
    assert type(trainer.module).__name__ == "MnistCnn" and type(trainer.optimizer).__name__ == "SGD"
    assert trainer.optimizer.param_groups[0]["lr"] == 0.1 and trainer.cfg.limit_train_batches == 4
    run = tmp_path / "runs" / "smalltrain" / "version_0"
    assert trainer.run_dir == str(run) and trainer.epoch == 1
    assert cli.main(f"train --resume {ckpt} --epochs 3".split()) == 0
    meta = read_checkpoint_meta(run / "checkpoint_epoch3.safetensors")
    assert meta["train_config"]["optimizer"] == "sgd" and meta["train_config"]["lr"] == 0.1
    assert meta["model"] == "cnn" and meta["step"] == 12
    assert [r["step"] for r in _records(run) if r["kind"] == "epoch"] == [4, 8, 12]
    capsys.readouterr()
    assert cli.main("eval --checkpoint runs/smalltrain/version_0/checkpoint_epoch3.safetensors".split()) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["test_accuracy"] == meta["history"][-1]["test_accuracy"] > 0.5


@pytest.mark.parametrize("flags, message", [
    (["--lr", "0.5"], "--lr 0.5 contradicts the checkpoint"),
    (["--optimizer", "adam"], "--optimizer adam contradicts"),
    (["--batch-size", "32"], "--batch-size 32 contradicts"),
    (["--epochs", "1"], "has already trained 1 epoch(s) of a 1-epoch run: pass --epochs N with N > 1"),
])
def test_resume_refuses_a_flag_that_contradicts_the_checkpoint(tmp_path, capsys, flags, message):
    assert cli.main(["train", "--model", "mlp", "--optimizer", "sgd", "--lr", "0.1", "--epochs", "1",
                     "--out", str(tmp_path), *QUICK]) == 0
    capsys.readouterr()
    ckpt = tmp_path / "version_0" / "checkpoint_epoch1.safetensors"
    args = ["train", "--resume", str(ckpt), *flags] + ([] if "--epochs" in flags else ["--epochs", "2"])
    assert cli.main(args) == 1
    assert message in capsys.readouterr().err
    assert not (tmp_path / "version_0" / "checkpoint_epoch2.safetensors").exists()


def test_resume_with_more_epochs_stretches_the_cosine_schedule(tmp_path):
    """1 epoch of a 1-epoch cosine run (annealed to 0 at step 4), resumed with --epochs 2: the lr of steps 5-8
    is that of a run planned for 2 epochs (T_max 8) from the start, bit for bit; it never stays at 0."""
    common = ["--model", "mlp", "--optimizer", "sgd", "--lr", "0.1", "--scheduler", "cosine", *QUICK]
    assert cli.main(["train", *common, "--epochs", "1", "--out", str(tmp_path / "short")]) == 0
    assert cli.main(["train", *common, "--epochs", "2", "--out", str(tmp_path / "planned")]) == 0
    run = tmp_path / "short" / "version_0"
    assert cli.main(["train", "--resume", str(run / "checkpoint_epoch1.safetensors"), "--epochs", "2",
                     "--log-every", "1"]) == 0
    lrs = [r["lr"] for r in _records(run) if r["kind"] == "step"]
    planned = [r["lr"] for r in _records(tmp_path / "planned" / "version_0") if r["kind"] == "step"]
    assert len(lrs) == len(planned) == 8 and lrs[3] == pytest.approx(0.0, abs=1e-12)
    assert lrs[4:] == planned[4:] and min(lrs[4:-1]) > 0
    assert load_checkpoint(run / "checkpoint_epoch2.safetensors")["scheduler"]["T_max"] == 8


def _edited_meta(monkeypatch, ckpt, **model_config):
    """Serve checkpoint metadata with model_config edited (whatever the file format stores it in)."""
    from smalltrain import resume
    meta = resume.checkpoint_meta(ckpt)
    meta = dict(meta, model_config=dict(meta["model_config"], **model_config))
    monkeypatch.setattr(resume, "checkpoint_meta", lambda path: meta)
    return meta


@pytest.mark.parametrize("edit, message", [
    ({"hidden": [10**7]}, "model_config['hidden'] must be an int in [1, 65536], got 10000000"),
    ({"hidden": [60000, 60000]}, "more than the 50,000,000 allowed"),
    ({"hidden": "wide"}, "model_config['hidden'] must be a list"),
    ({"depth": 3}, "unknown key(s) 'depth'"),
    ({"activation": "swish"}, "model_config['activation'] must be one of"),
])
def test_checkpoint_model_config_is_checked_before_anything_is_built(tmp_path, capsys, monkeypatch, edit, message):
    assert cli.main(["train", "--model", "mlp", "--epochs", "1", "--out", str(tmp_path), *QUICK]) == 0
    ckpt = str(tmp_path / "version_0" / "checkpoint_epoch1.safetensors")
    _edited_meta(monkeypatch, ckpt, **edit)
    from smalltrain import models
    monkeypatch.setattr(models, "build", lambda *a, **k: pytest.fail("a model was built from a bad config"))
    capsys.readouterr()
    for args in (["eval", "--checkpoint", ckpt], ["train", "--resume", ckpt, "--epochs", "2"]):
        assert cli.main(args) == 1
        err = capsys.readouterr().err
        assert ckpt in err and message in err, err


def test_runs_get_directories_of_their_own(tmp_path, capsys):
    for _ in range(2):
        assert cli.main(["train", "--model", "mlp", "--epochs", "1", "--out", str(tmp_path), *QUICK]) == 0
    assert sorted(os.listdir(tmp_path)) == ["version_0", "version_1"]
    assert "run directory: " + str(tmp_path / "version_1") in capsys.readouterr().err
    for run in ("version_0", "version_1"):   # each holds exactly its own run's records
        assert [r["step"] for r in _records(tmp_path / run)] == [1, 2, 3, 4, 4]
    # a run directory as --out for a new run: refused (it would mix two runs), pointing to --resume
    assert cli.main(["train", "--model", "mlp", "--out", str(tmp_path / "version_0"), *QUICK]) == 1
    assert "is already a run directory" in capsys.readouterr().err


def test_torn_last_metrics_line_is_dropped_with_a_warning(tmp_path):
    assert cli.main(["train", "--model", "mlp", "--epochs", "1", "--out", str(tmp_path), *QUICK]) == 0
    run = tmp_path / "version_0"
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"kind": "step", "epo')    # a run killed mid-write
    with pytest.warns(RuntimeWarning, match=r"metrics\.jsonl: line 6 is incomplete"):
        assert cli.main(["train", "--resume", str(run / "checkpoint_epoch1.safetensors"), "--epochs", "2",
                         "--log-every", "1"]) == 0
    assert [r["step"] for r in _records(run)] == [1, 2, 3, 4, 4, 5, 6, 7, 8, 8]


@pytest.mark.parametrize("allow", [False, True])
def test_non_finite_loss_stops_training(tmp_path, allow):
    """A NaN loss stops training before a checkpoint is written, naming the step and the way out; with
    allow_nonfinite the run goes on and metrics.jsonl stays strict JSON ("nan" as a string)."""
    from smalltrain.train import NonFiniteLossError, Trainer
    trainer = Trainer(TrainConfig(model="mlp", epochs=1, limit_train_batches=3, log_every=1, progress=False,
                                  tensorboard=False, out=str(tmp_path), allow_nonfinite=allow))
    trainer.module.net[1].weight.array[0, 0] = np.nan
    if not allow:
        with pytest.raises(NonFiniteLossError, match="loss became nan at epoch 1, step 1 .*--allow-nonfinite"):
            trainer.run()
        assert not any(n.startswith("checkpoint") for n in os.listdir(trainer.run_dir))
        return
    trainer.run()
    records = _records(tmp_path / "version_0")
    assert [r["loss"] for r in records if r["kind"] == "step"] == ["nan"] * 3
    assert records[-1]["test_loss"] == "nan"


def test_rates_leave_out_run_time_kernel_compilation(monkeypatch):
    """The progress line's and the epoch summary's samples/s divide by the time less the kernels compiled meanwhile
    (a first GPU run's NVRTC compiles would otherwise show as a training speed of a few samples/s)."""
    from smalltrain import train
    clock = {"t": 100.0, "compiled": 5.0}
    monkeypatch.setattr(train.time, "perf_counter", lambda: clock["t"])
    monkeypatch.setattr(train, "compile_seconds", lambda: clock["compiled"])
    clock.update(t=130.0, compiled=25.0)   # 30 s went by, 20 of them compiling
    assert train._training_seconds(100.0, 5.0) == 10.0
    clock.update(t=131.0, compiled=25.0)
    assert train._training_seconds(100.0, 5.0) == 11.0


def test_ranks_must_agree_on_the_device_type_not_its_index(tmp_path):
    """The settings the ranks compare at start hold the device's type (cpu / cuda) and not its index: one rank on
    the CPU and one on a GPU would each wait in collectives of another backend."""
    from types import SimpleNamespace

    from smalltrain.distributed.consistency import SettingsMismatch, check_same_settings
    from smalltrain.train import Trainer
    trainer = Trainer(TrainConfig(model="mlp", epochs=1, limit_train_batches=1, progress=False, tensorboard=False,
                                  out=str(tmp_path)))
    cpu = trainer._settings(None)
    assert cpu["device_type"] == "cpu" and "device" not in cpu
    gpu = dict(cpu, device_type="cuda")

    def group(*settings):
        host = SimpleNamespace(allgather_object=lambda mine: [json.dumps(s, sort_keys=True) for s in settings])
        return SimpleNamespace(world_size=len(settings), host=host)
    check_same_settings(group(cpu, dict(cpu)), cpu)
    with pytest.raises(SettingsMismatch, match=r'device_type \(rank 0: "cpu"; rank 1: "cuda"\)'):
        check_same_settings(group(cpu, gpu), cpu)

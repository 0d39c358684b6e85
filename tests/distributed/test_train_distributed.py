"""End to end: `mpiexec -n 2 python -m smalltrain train --distributed` trains on the bundled MNIST for 50 steps per
rank, exits 0, and only rank 0 writes the run directory (one set of records, one checkpoint).

The MLP keeps this test at a few seconds (LeNet-5's evaluation of 10k images costs ~3x more on 2 cores); the conv
layers' gradients under DDP are covered by test_ddp.py."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workers._launch import requires_mpi, run_python


@requires_mpi
def test_train_two_processes_only_rank0_writes(tmp_path):
    out = tmp_path / "run"
    _, log = run_python(["-m", "smalltrain", "train", "--distributed", "--model", "mlp", "--epochs", "1", "--limit-train-batches", "50",
                         "--no-tensorboard", "--out", out], n=2)
    assert log.count("done: best test accuracy") == 1, log       # rank 0 alone reports
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint_epoch1.json", "checkpoint_epoch1.safetensors",
                                                     "curves.png", "metrics.jsonl"]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    # rank 1 appending too would double these lines
    assert [r["kind"] for r in records] == ["step", "epoch"] and records[0]["step"] == 50
    epoch = records[1]
    assert epoch["test_count"] == 10000                           # the two shards' counts were all-reduced
    assert epoch["test_accuracy"] > 0.5                           # 50 steps x 128 samples learn something
    from safetensors.numpy import load_file
    keys = list(load_file(out / "checkpoint_epoch1.safetensors"))
    assert keys and not any("module." in k for k in keys)         # the unwrapped module was saved

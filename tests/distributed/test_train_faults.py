"""The trainer and the process group under faults and misuse, as real MPI jobs, each bounded in time: a failing,
interrupted or stuck rank ends the whole job with its message; ranks that disagree on settings are refused at
start, naming each field and the ranks' values; a torchrun launch is refused with the mpiexec command to use."""
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workers._launch import REPO, _env, requires_mpi, run_worker

TRAIN = [sys.executable, "-m", "smalltrain", "train", "--distributed", "--model", "mlp", "--no-tensorboard"]
BOUND_S = 90   # every job here ends in seconds; the bound only turns a hang into a failure


def mpmd(rank0_args, rank1_args, out):
    """`mpiexec -n 1 smalltrain train ARGS0 : -n 1 smalltrain train ARGS1` (one rank each); (code, output)."""
    cmd = ["mpiexec", "-n", "1", *TRAIN, "--out", str(out), *rank0_args, ":", "-n", "1", *TRAIN, "--out", str(out),
           *rank1_args]
    try:
        p = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=BOUND_S,
                           start_new_session=True)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(cmd)} hung; output:\n{e.stdout}{e.stderr}")
    return p.returncode, p.stdout + p.stderr


@requires_mpi
def test_ranks_with_different_settings_are_refused_at_start(tmp_path):
    """Another --epochs (would wait forever), --lr (would diverge silently) and --limit-train-batches (an MPI
    'Message truncated' abort): one message on rank 0 naming each field and both ranks' values, exit 1."""
    code, out = mpmd(["--epochs", "1", "--lr", "0.001", "--limit-train-batches", "2"],
                     ["--epochs", "2", "--lr", "0.01", "--limit-train-batches", "3"], tmp_path)
    assert code == 1, out
    assert "the ranks' settings differ: epochs (rank 0: 1; rank 1: 2)" in out, out
    assert "lr (rank 0: 0.001; rank 1: 0.01)" in out and "limit_train_batches (rank 0: 2; rank 1: 3)" in out, out
    assert out.count("settings differ") == 1 and "Traceback" not in out and "truncated" not in out, out
    assert not any(tmp_path.iterdir())   # refused before anything was written


@requires_mpi
def test_resume_on_one_rank_only_is_refused(tmp_path):
    code, _ = mpmd(["--epochs", "1", "--limit-train-batches", "2"], ["--epochs", "1", "--limit-train-batches", "2"],
                   tmp_path / "first")
    assert code == 0
    ckpt = tmp_path / "first" / "version_0" / "checkpoint_epoch1.safetensors"
    code, out = mpmd(["--epochs", "2", "--resume", str(ckpt)], ["--epochs", "2", "--limit-train-batches", "2"],
                     tmp_path / "second")
    assert code == 1 and "resume_from (rank 0: {\"epoch\": 1, \"step\": 2}; rank 1: null)" in out, out


@requires_mpi
def test_an_error_the_cli_catches_on_one_rank_ends_the_job(tmp_path):
    """Rank 1's --data-dir does not exist: its error is printed and the job ends; rank 0 does not wait."""
    start = time.monotonic()
    code, out = mpmd(["--epochs", "1"], ["--epochs", "1", "--data-dir", str(tmp_path / "nowhere")], tmp_path / "run")
    assert code != 0, out
    assert "[rank 1] smalltrain: error: MNIST: train-images-idx3-ubyte[.gz] not found" in out, out
    assert "nowhere" in out and "done:" not in out, out
    assert time.monotonic() - start < BOUND_S


@requires_mpi
def test_an_error_on_rank_0_while_rank_1_trains_ends_the_job(tmp_path):
    """Rank 0 cannot write its run directory (as on a full or read-only disk) after the ranks agreed and rank 1
    went on into training: rank 0's message, the job ends, rank 1 does not wait."""
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    code, out = mpmd(["--epochs", "1", "--out", str(blocker / "runs")], ["--epochs", "1"], tmp_path / "run")
    assert code != 0, out
    assert "[rank 0] smalltrain: error: [Errno 20] Not a directory" in out and "done:" not in out, out


@requires_mpi
@pytest.mark.parametrize("signame, message", [("SIGTERM", "terminated by SIGTERM"), ("SIGINT", "interrupted")])
def test_a_signal_on_one_rank_ends_the_job(tmp_path, signame, message):
    code, out = run_worker("signal_cli.py", signame, tmp_path, n=2, timeout=BOUND_S, check=False)
    assert code != 0, out
    assert f"[rank 1] smalltrain: {message}" in out and "done:" not in out, out


@requires_mpi
def test_a_collective_honours_the_group_timeout(tmp_path):
    start = time.monotonic()
    code, out = run_worker("timeout.py", tmp_path, 2, n=2, timeout=BOUND_S, check=False)
    assert code != 0, out
    assert "[rank 0] smalltrain.distributed: all_reduce of 3 x float32 did not complete within the process " \
           "group's timeout of 2 s (rank 0 of 2 waited" in out, out
    assert not list(tmp_path.iterdir()) and time.monotonic() - start < 50, out


@requires_mpi
def test_torchrun_launch_is_refused_with_the_mpiexec_command(tmp_path):
    """What `torchrun --nproc_per_node 2 -m smalltrain train --distributed` gives each process: RANK, WORLD_SIZE,
    LOCAL_RANK, no MPI job of that size. Each process would train alone into the same directory: refused."""
    env = dict(_env(), RANK="0", WORLD_SIZE="2", LOCAL_RANK="0")
    p = subprocess.run([*TRAIN, "--out", str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=BOUND_S)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert "started by torchrun" in out and "Start the job with MPI instead: mpiexec -n 2 smalltrain train " \
           "--distributed --model mlp" in out, out
    assert not any(tmp_path.iterdir()) and "Traceback" not in out

"""Tests for smalltrain.distributed: collectives with real values on 2 MPI processes and on 1 (no launcher), the
validation errors, the crash that must end the job, the default-group queries; NCCL cases skip without CUDA."""
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workers._launch import mpi_missing, requires_mpi, run_worker
from workers.collectives import make_inputs

import smalltrain
import smalltrain.distributed as dist

REDUCE = {"SUM": lambda xs: np.sum(xs, axis=0), "AVG": lambda xs: np.mean(xs, axis=0),
          "MAX": lambda xs: np.max(xs, axis=0), "MIN": lambda xs: np.min(xs, axis=0)}

# error rows: each bad call raises this type on every rank, with this in its message
ERRORS = {
    "all_gather_len": ("RuntimeError", "must be a list of world size"),
    "all_gather_shape": ("RuntimeError", r"invalid tensor size at index 0 \(expected \[3\], got \[2\]\)"),
    "all_gather_dtype": ("ValueError", "same dtype"),
    "broadcast_src": ("RuntimeError", "invalid root rank"),
    "op_str": ("TypeError", "ReduceOp"),
    "not_tensor": ("TypeError", "of type Tensor, but got list"),
    "avg_int": ("RuntimeError", "AVG needs a floating-point tensor, got dtype int64"),
    "reduce_scatter_len": ("RuntimeError", "must be a list of world size"),
    "init_twice": ("ValueError", "twice"),
}


def expected_results(world):
    xs = [make_inputs(r) for r in range(world)]
    exp = {}
    for name in ("f32", "f64", "i64", "noncontig", "scalar"):
        for op, fn in REDUCE.items():
            if not (op == "AVG" and name == "i64"):
                exp[f"all_reduce/{name}/{op}"] = fn(np.stack([x[name] for x in xs]))
    for src in range(world):
        for name in ("f32", "i64", "noncontig"):
            exp[f"broadcast/{name}/{src}"] = xs[src][name]
    exp["all_gather"] = np.stack([x["gather"] for x in xs])
    for op in ("SUM", "AVG", "MAX"):
        # rank r receives op over ranks of their input_list[r]; here input_list[i] = scatter[i % 2]
        exp[f"reduce_scatter/{op}"] = [REDUCE[op](np.stack([x["scatter"][r % 2] for x in xs])) for r in range(world)]
    return exp


def check_collectives(out, world, backend="mpi"):
    exp = expected_results(world)
    for r in range(world):
        got = np.load(out / f"rank{r}.npz")
        info = json.loads((out / f"rank{r}.json").read_text())
        assert sorted(got.files) == sorted(exp)
        for key, want in exp.items():
            want = want[r] if key.startswith("reduce_scatter") else want
            g = got[key]
            assert g.shape == np.shape(want) and g.dtype == np.asarray(want).dtype, key
            # float32 sums of 2 values are exact up to rounding of the result; averages divide once
            np.testing.assert_allclose(g, want, rtol=1e-6, atol=1e-7, err_msg=f"rank {r}: {key}")
        assert info["rank"] == info["get_rank"] == r and info["world"] == info["get_world_size"] == world
        assert info["local_rank"] == r and info["backend"] == backend and info["initialized"]
        assert info["scalars"] == [1.5 * world * (world + 1) / 2, world * (world + 1) // 2, 10 * world]
        assert info["scalar_types"] == ["float", "int", "int"]
        assert info["objects"] == [{"rank": i} for i in range(world)]
        assert info["broadcast_objects"] == [f"from {world - 1}", world - 1]
        for name, (etype, pattern) in ERRORS.items():
            got_type, msg = info["errors"][name]
            assert got_type == etype, (name, got_type, msg)
            assert __import__("re").search(pattern, msg), (name, msg)


@requires_mpi
def test_collectives_two_processes(tmp_path):
    run_worker("collectives.py", tmp_path, n=2)
    check_collectives(tmp_path, 2)


@requires_mpi
def test_collectives_world_size_one_without_launcher(tmp_path):
    run_worker("collectives.py", tmp_path, launcher=False)
    check_collectives(tmp_path, 1)


@requires_mpi
def test_a_rank_that_raises_ends_the_job(tmp_path):
    start = time.monotonic()
    rc, out = run_worker("fail.py", tmp_path, n=2, timeout=60, check=False)
    assert rc != 0, out
    assert "[rank 1] Traceback" in out and "[rank 1] ValueError: deliberate failure on rank 1" in out, out
    assert "[rank 0]" not in out, out        # rank 0 was waiting in a collective: it is killed, not failing
    assert not (tmp_path / "rank0_finished").exists()
    assert time.monotonic() - start < 60


@requires_mpi
def test_rank_and_local_rank_under_mpiexec(tmp_path):
    run_worker("ranks.py", tmp_path, n=2)
    infos = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [i["rank"] for i in infos] == [0, 1] and [i["world"] for i in infos] == [2, 2]
    # before init the launcher's variable is used, after init MPI's shared-memory split: both agree here
    assert [i["env_local_rank"] for i in infos] == [0, 1] and [i["local_rank"] for i in infos] == [0, 1]
    assert all(i["hook_installed"] and i["hook_restored"] for i in infos)
    assert all(i["backend"] == i["expected_backend"] for i in infos)
    # two ranks on one node share its cores: each gets its usable cores / 2 BLAS threads instead of
    # oversubscribing them (under Open MPI's default binding of -n 2, one core each: 1 thread)
    if "OPENBLAS_NUM_THREADS" not in os.environ and "OMP_NUM_THREADS" not in os.environ:
        assert all(i["blas_threads"] == [max(1, i["usable_cores"] // 2)] for i in infos), infos


cuda = pytest.mark.skipif(not smalltrain.cuda.is_available(), reason="no CUDA device")


@cuda
def test_nccl_collectives_world_size_one_without_launcher(tmp_path):
    run_worker("collectives.py", tmp_path, "nccl", launcher=False)
    check_collectives(tmp_path, 1, backend="nccl")


@cuda
@requires_mpi
def test_nccl_collectives_under_mpiexec_one_process(tmp_path):
    run_worker("collectives.py", tmp_path, "nccl", n=1)
    check_collectives(tmp_path, 1, backend="nccl")


@cuda
@requires_mpi
def test_nccl_two_processes(tmp_path):
    """Two GPUs: the collectives over NCCL; one GPU: both ranks refuse to share it, with a message, not a hang."""
    rc, out = run_worker("collectives.py", tmp_path, "nccl", n=2, check=False)
    if smalltrain.cuda.device_count() >= 2:
        assert rc == 0, out
        check_collectives(tmp_path, 2, backend="nccl")
    else:
        assert rc != 0 and "would share GPU" in out and "NCCL needs one GPU per process" in out, out


# ---- in this process: nothing here initializes MPI --------------------------------------------------------------
UNINITIALIZED = [
    (lambda: dist.get_rank(), ValueError, "Default process group has not been initialized"),
    (lambda: dist.get_world_size(), ValueError, "Default process group has not been initialized"),
    (lambda: dist.barrier(), ValueError, "Default process group has not been initialized"),
    (lambda: dist.all_reduce(smalltrain.ones(3)), ValueError, "Default process group has not been initialized"),
    (lambda: dist.broadcast(smalltrain.ones(3)), ValueError, "Default process group has not been initialized"),
    (lambda: dist.init_process_group("gloo"), ValueError, "unknown backend 'gloo'"),
    (lambda: dist.init_process_group("mpi", init_method="tcp://1.2.3.4:5"), ValueError, "not supported"),
]


@pytest.mark.parametrize("fn, exc, pattern", UNINITIALIZED)
def test_errors_without_a_process_group(fn, exc, pattern):
    assert not dist.is_initialized()
    with pytest.raises(exc, match=pattern):
        fn()
    assert not dist.is_initialized()


@pytest.mark.parametrize("var, value, want", [("OMPI_COMM_WORLD_LOCAL_RANK", "3", 3), ("MPI_LOCALRANKID", "1", 1),
                                              ("SLURM_LOCALID", "2", 2), ("LOCAL_RANK", "5", 5), (None, None, 0)])
def test_get_local_rank_from_the_launchers_environment(monkeypatch, var, value, want):
    for v in ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "LOCAL_RANK"):
        monkeypatch.delenv(v, raising=False)
    if var:
        monkeypatch.setenv(var, value)
    assert dist.get_local_rank() == want


def test_reduce_op_names():
    assert [op.name for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.MAX, dist.ReduceOp.MIN)] == \
        ["SUM", "AVG", "MAX", "MIN"]


def test_skip_reason_names_what_is_missing():
    reason = mpi_missing()
    assert reason is None or "mpiexec" in reason or "mpi4py" in reason
    _ = os


def test_timeout_from_argument_environment_or_default(monkeypatch):
    import datetime

    from smalltrain.distributed.mpi_backend import DEFAULT_TIMEOUT_S, resolve_timeout
    monkeypatch.delenv("SMALLTRAIN_DIST_TIMEOUT", raising=False)
    assert resolve_timeout(None) == DEFAULT_TIMEOUT_S == 300.0
    assert resolve_timeout(datetime.timedelta(minutes=2)) == 120.0 and resolve_timeout(7) == 7.0
    monkeypatch.setenv("SMALLTRAIN_DIST_TIMEOUT", "45")
    assert resolve_timeout(None) == 45.0 and resolve_timeout(3) == 3.0   # the argument wins
    for bad, where in [(0, "timeout=..."), (float("nan"), "timeout=..."), ("soon", "timeout=...")]:
        with pytest.raises(ValueError, match=f"init_process_group\\({where}\\)"):
            resolve_timeout(bad)
    monkeypatch.setenv("SMALLTRAIN_DIST_TIMEOUT", "-1")
    with pytest.raises(ValueError, match=r"\$SMALLTRAIN_DIST_TIMEOUT: the timeout must be a positive"):
        resolve_timeout(None)


def test_settings_mismatch_names_every_field_and_the_ranks_values():
    from smalltrain.distributed.consistency import SettingsMismatch, check_same_settings

    class ThreeRanks:   # what allgather_object would return on every rank
        world_size = 3

        class host:
            @staticmethod
            def allgather_object(mine):
                import json
                ranks = [{"epochs": 1, "lr": 0.1}, {"epochs": 2, "lr": 0.1}, {"epochs": 1, "lr": 0.2, "seed": 3}]
                return [json.dumps(r, sort_keys=True) for r in ranks]

    with pytest.raises(SettingsMismatch) as info:
        check_same_settings(ThreeRanks, {})
    assert str(info.value).startswith("the ranks' settings differ: epochs (ranks 0,2: 1; rank 1: 2), lr (ranks "
                                      "0,1: 0.1; rank 2: 0.2), seed (ranks 0,1: null; rank 2: 3);")

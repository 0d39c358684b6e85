"""`smalltrain bench`: the throughput table and the speedrun, run for real on the CPU at tiny sizes."""
import importlib.util
import os
import re
import sys

import numpy as np
import pytest

import smalltrain
from smalltrain import bench, cli

HAS_TORCH = importlib.util.find_spec("torch") is not None
BENCHMARKS = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")


def _rows(out):
    """The table's rows after its header and rule, as lists of columns (split on runs of 2+ spaces)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("model:batch"))
    return [re.split(r"\s{2,}", line.strip()) for line in lines[start + 2:] if line.strip()]


FAST = ["--device", "cpu", "--repeats", "2", "--warmup", "1", "--steps", "2"]


def test_throughput_table_on_cpu(capsys):
    assert cli.main(["bench", "--config", "lenet5:16", "--no-torch-compile", *FAST]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"smalltrain {smalltrain.__version__}, python ")
    assert "median of 2 timed runs" in out and "1 warm-up steps excluded" in out
    assert "each mode in a process of its own" in out
    rows = _rows(out)
    modes = [r[1] for r in rows]
    assert modes == ["smalltrain eager", "smalltrain compiled"] + (["torch eager"] if HAS_TORCH else [])
    for config, _, rate, us, steps, ratio in rows:
        assert config == "lenet5:16" and steps == "2"
        samples_per_s, us_per_step = float(rate.replace(",", "")), float(us.replace(",", ""))
        # samples/s is printed rounded to an integer: allow that rounding (0.5 / rate) on top of 0.1%
        assert samples_per_s > 0 and samples_per_s * us_per_step * 1e-6 == \
            pytest.approx(16, rel=0.5 / samples_per_s + 1e-3)
        if HAS_TORCH:
            assert ratio.endswith("x") and float(ratio[:-1]) > 0
        else:
            assert ratio == "-"
    if HAS_TORCH:
        assert rows[-1][5] == "1.00x"   # torch eager is the only, hence the best, torch mode
        assert "torch " in out.splitlines()[0]


def test_failing_mode_is_reported_and_the_others_run(capsys, monkeypatch):
    real = bench.make_step

    def make_step(lib, model, device, xs, ys, mode="eager"):
        if mode == "compiled":
            raise RuntimeError("simulated capture failure\nsecond line")
        return real(lib, model, device, xs, ys, mode)
    monkeypatch.setattr(bench.throughput, "make_step", make_step)   # seen in this process only: --same-process
    assert cli.main(["bench", "--config", "mlp:8", "--no-torch", "--same-process", *FAST]) == 0
    captured = capsys.readouterr()
    assert "mlp:8 smalltrain compiled: RuntimeError: simulated capture failure (at test_bench.py:" in captured.err
    assert "second line" not in captured.err
    assert [r[1] for r in _rows(captured.out)] == ["smalltrain eager"]
    assert _rows(captured.out)[0][5] == "-"   # no torch mode, no ratio


def test_median_interleaved_alternates_and_times_each_run(monkeypatch):
    calls, clock, slept = [], [0.0], []
    monkeypatch.setattr(bench.timing.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(bench.timing.time, "sleep", slept.append)

    def fn(key, cost):
        def call():
            calls.append(key)
            clock[0] += cost
        return call
    synced = []
    runs = {"a": bench.timed_run(fn("a", 2.0), 2, lambda: synced.append("a")), "b": bench.timed_run(fn("b", 0.5), 2)}
    assert bench.median_interleaved(runs, repeats=3, settle=0.25) == {"a": 2.0, "b": 0.5}
    assert calls == ["a", "a", "b", "b"] * 3   # the timed runs alternate
    assert synced == ["a"] * 3 and slept == [0.25] * 6   # a sync after each of a's runs, a settle before every run


def test_a_timed_run_makes_its_untimed_steps_and_syncs_before_the_clock(monkeypatch):
    calls, clock = [], [0.0]
    monkeypatch.setattr(bench.timing.time, "perf_counter", lambda: clock[0])

    def step():
        calls.append("step")
        clock[0] += 3.0

    run = bench.timed_run(step, 2, lambda: calls.append("sync"), pre=2)
    assert run() == 3.0   # the two untimed steps are not in the per-step time
    assert calls == ["step", "step", "sync", "step", "step", "sync"]
    calls.clear()
    assert bench.timed_run(step, 1, lambda: calls.append("sync"))() == 3.0 and calls == ["step", "sync"]


def test_a_mode_in_its_own_process_times_steps_and_reports_errors():
    run = bench.ModeProcess("smalltrain-eager", "mlp", 8, "cpu", warmup=1, inner=2)
    try:
        times = [run(), run()]   # seconds per step, timed in the child: a positive float per call
        assert all(isinstance(t, float) and t > 0 for t in times)
    finally:
        run.close()
    assert not run.proc.is_alive()
    with pytest.raises(bench.ModeProcessError, match=r"^ValueError: unknown benchmark model 'nosuchmodel'; .* "
                                                     r"\(at zoo\.py:\d+\)$"):
        bench.ModeProcess("smalltrain-eager", "nosuchmodel", 8, "cpu", warmup=1, inner=2)


def test_mode_selection():
    args = bench.parser().parse_args(["--no-torch-compile", "--device", "cuda"])
    assert bench.selected_modes(args) == ["smalltrain-eager", "smalltrain-compiled", "torch-eager", "torch-eager-tf32",
                                          "torch-graph"]
    args = bench.parser().parse_args(["--no-torch-compile", "--device", "cpu"])
    assert bench.selected_modes(args) == ["smalltrain-eager", "smalltrain-compiled", "torch-eager"]
    args = bench.parser().parse_args(["--modes", "torch-graph", "--device", "cpu"])
    with pytest.raises(ValueError, match="--modes torch-graph: CUDA-only modes, got --device cpu"):
        bench.selected_modes(args)
    args = bench.parser().parse_args(["--modes", "torch-compile", "smalltrain-eager", "--no-torch"])
    assert bench.selected_modes(args) == ["smalltrain-eager"]
    args = bench.parser().parse_args([])
    assert bench.selected_modes(args) == list(bench.MODES)
    assert args.config == [("lenet5", 64), ("lenet5", 512), ("cnn", 64)]


def test_mnist_batches_are_the_trainers_normalized_samples():
    from smalltrain.train import load_mnist
    xs, ys = bench.mnist_batches(4, 2)
    assert xs.shape == (2, 4, 1, 28, 28) and xs.dtype == np.float32 and ys.shape == (2, 4) and ys.dtype == np.int64
    ds = load_mnist(None, True)
    for i in (0, 5):
        img, label = ds[i]
        np.testing.assert_array_equal(xs.reshape(8, 1, 28, 28)[i], img.numpy())
        assert ys.reshape(8)[i] == label
    assert bench.mnist_batches(30000, 8)[0].shape[0] == 2   # as many batches as fit in the 60k


def test_make_step_trains_the_same_model_in_both_libraries():
    xs, ys = bench.mnist_batches(32, 2)
    step = bench.make_step(smalltrain, "lenet5", "cpu", xs, ys)
    losses = [float(step().item()) for _ in range(30)]
    assert 2.0 < losses[0] < 2.6 and np.mean(losses[-4:]) < losses[0] - 0.5   # ln(10) at first, then learning
    with pytest.raises(ValueError, match="unknown mode 'graph' for smalltrain"):
        bench.make_step(smalltrain, "lenet5", "cpu", xs, ys, mode="graph")
    if HAS_TORCH:
        import torch
        n_ours = sum(p.numel() for p in bench.build(smalltrain, "lenet5").parameters())
        assert n_ours == sum(p.numel() for p in bench.build(torch, "lenet5").parameters()) == 44426
        step = bench.make_step(torch, "cnn", "cpu", xs, ys)
        assert 2.0 < float(step().item()) < 2.6


def test_evaluation_steps():
    assert bench.evaluation_steps(3, 100, 2, 2.0) == [200, 250, 300]
    assert bench.evaluation_steps(2, 10, 4, 0) == [2, 5, 8, 10, 12, 15, 18, 20]   # round(2.5) == 2
    assert bench.evaluation_steps(1, 10, 1, 5.0) == [10]                         # the end is always evaluated
    assert bench.evaluation_steps(2, 9, 3, 1.5) == [15, 18]


def test_device_data_helpers_on_cpu():
    smalltrain.manual_seed(3)
    perm = bench.device_randperm(50, "cpu")
    assert sorted(perm.numpy().tolist()) == list(range(50))
    data = smalltrain.arange(50 * 3, dtype=smalltrain.float32).reshape(50, 3)
    idx = perm[10:20]
    np.testing.assert_array_equal(bench.take_rows(data, idx).numpy(), data.numpy()[perm.numpy()[10:20]])
    (x, y), = bench.upload([(np.full((2, 28, 28), 255, np.uint8), np.array([3, 4]))], "cpu")
    assert x.shape == (2, 1, 28, 28) and x.dtype == smalltrain.float32 and y.tolist() == [3, 4]
    np.testing.assert_allclose(x.numpy(), (1 - 0.1307) / 0.3081, rtol=1e-6)


SPEEDRUN = ["bench", "--speedrun", "--device", "cpu", "--model", "mlp", "--epochs", "1", "--batch-size", "256",
            "--eval-start", "0", "--evals-per-epoch", "4"]


def test_speedrun_reaches_a_low_target(capsys):
    assert cli.main([*SPEEDRUN, "--target", "0.9"]) == 0
    out = capsys.readouterr().out
    assert "speedrun: mlp on cpu, batch 256 (234 steps per epoch, last partial batch dropped), Adam, OneCycleLR(" \
           in out
    for phase in ("startup", "data load", "warm-up"):
        assert re.search(rf"^{phase} +\d+\.\d+ s .*\(excluded\)$", out, re.MULTILINE), phase
    evals = re.findall(r"^eval  epoch +([\d.]+)  step +(\d+)  time +([\d.]+) s  test accuracy +([\d.]+)%", out,
                       re.MULTILINE)
    assert evals and [e[1] for e in evals] == ["58", "117", "176", "234"][:len(evals)]
    accuracies = [float(e[3]) for e in evals]
    assert accuracies[-1] >= 90 and all(a < 90 for a in accuracies[:-1])   # it stops at the first >= 90%
    times = [float(e[2]) for e in evals]
    assert times == sorted(times)
    reached = re.search(r"^reached ([\d.]+)% \(target 90\.00%\) in ([\d.]+) s at epoch ([\d.]+), step (\d+)", out,
                        re.MULTILINE)
    assert reached and float(reached[1]) == accuracies[-1] and float(reached[2]) == pytest.approx(times[-1], abs=1e-4)
    assert reached[4] == evals[-1][1]
    assert re.search(rf"^compiled step: 0 capture\(s\), 0 replays, {evals[-1][1]} eager calls$", out, re.MULTILINE)


def test_speedrun_result_and_a_missed_target(capsys):
    args = bench.parser().parse_args([*SPEEDRUN[1:], "--target", "0.999", "--evals-per-epoch", "2",
                                      "--optimizer", "sgd", "--schedule", "constant", "--lr", "0.05"])
    args.device = "cpu"
    host = bench.load_mnist_arrays()
    seen = []
    result = bench.run_speedrun(args, host, report=seen.append)
    assert not result["reached"] and result["reached_at"] is None and result["steps"] == 234
    assert [e["step"] for e in result["evaluations"]] == [117, 234] and seen == result["evaluations"]
    assert 0.85 < result["best_accuracy"] < 0.999 and result["time_s"] >= result["evaluations"][-1]["time_s"]
    assert result["stats"] == {"captures": 0, "replays": 0, "eager": 234}
    warm = bench.run_speedrun(args, host, max_steps=3)
    assert warm["steps"] == 3 and len(warm["evaluations"]) == 1
    assert bench.main(args) == 1
    assert "did not reach 99.90% in 1 epoch(s): best " in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--config", "lenet5"], "argument --config: 'lenet5': expected MODEL:BATCH with MODEL one of lenet5, cnn, mlp"),
    (["--config", "resnet:64"], "expected MODEL:BATCH"),
    (["--config", "cnn:0"], "BATCH between 1 and 60000"),
    (["--modes", "jax"], "argument --modes: invalid choice: 'jax'"),
    (["--device", "tpu"], "argument --device: device: expected 'cpu' or 'cuda[:N]', got 'tpu'"),
    (["--speedrun", "--target", "99"], "argument --target: 99: expected a value > 0 and <= 1"),
    (["--speedrun", "--batch-size", "0"], "argument --batch-size: 0: expected a value >= 1 and <= 60000"),
    (["--speedrun", "--epochs", "two"], "argument --epochs: 'two' is not an integer"),
    (["--speedrun", "--max-lr", "0"], "argument --max-lr: 0: expected a value > 0"),
    (["--speedrun", "--model", "vit"], "argument --model: invalid choice: 'vit'"),
])
def test_argument_errors(capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", *argv])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(smalltrain.cuda.is_available(), reason="CUDA is available here")
def test_cuda_unavailable_is_a_clear_error(capsys):
    assert cli.main(["bench", "--device", "cuda", "--config", "mlp:8"]) == 1
    assert "smalltrain: error: --device cuda: CUDA is not available here" in capsys.readouterr().err


def test_benchmark_scripts_are_thin_wrappers(capsys, monkeypatch):
    monkeypatch.syspath_prepend(BENCHMARKS)
    for name in ("common", "bench_train", "bench_compile", "profile_step"):
        sys.modules.pop(name, None)
    import bench_compile  # noqa: F401 - imports cleanly
    import bench_train
    import common
    import profile_step  # noqa: F401
    assert (common.timeit, common.table, common.environment) == (bench.timeit, bench.table, bench.environment)
    assert (bench_train.build, bench_train.make_step, bench_train.mnist_batches) == \
        (bench.build, bench.make_step, bench.mnist_batches)
    assert bench_train.main(["--config", "mlp:8", "--no-torch", "--repeats", "1", "--steps", "1", "--warmup",
                             "1"]) == 0
    assert [r[1] for r in _rows(capsys.readouterr().out)] == ["smalltrain eager"]

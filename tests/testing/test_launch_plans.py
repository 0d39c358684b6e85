"""benchmarks/launch_plans.py, the emulator's record of the kernels a training step launches: MnistCnn b64's eager
step under the defaults and under an older tile_conv tuning entry, in processes of their own, with the one plan
that entry changes reported. Needs g++ for the emulator (skips without)."""
import os
import subprocess
import sys

import pytest

from smalltrain.backend.cuda.conv import tile as conv_tile
import cuda_emulator

if not cuda_emulator.available():
    pytest.skip("no g++ to compile kernels for the emulator", allow_module_level=True)

SMS = cuda_emulator.H200_ATTRIBUTES["MultiProcessorCount"]   # the emulator's device (this process has none)
SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "launch_plans.py")


def test_a_tuning_entry_that_changes_one_plan_reports_that_plan():
    run = subprocess.run([sys.executable, SCRIPT, "--config", "cnn:64", "--tune", "conv.tile_min_threads=128"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    head, _, diff = run.stdout.partition("\nunder ")
    base = head.splitlines()
    # conv1 forward, conv2's weights arranged for its kernels (where the layouts pay: 4608 elements each, the
    # forward's 384 blocks of 192 threads, the input gradient's 448 of 224 or, under the entry, 384 of 280),
    # conv2 with the linear layer, the loss, the linear layer's backward, conv2's weight gradient and its reduction,
    # conv2's input gradient with conv1's weight gradient and its reduction, SGD
    arranged = conv_tile._tile_arranges(4608, 192, 384, SMS)
    assert conv_tile._tile_arranges(4608, 224, 448, SMS) == conv_tile._tile_arranges(4608, 280, 384, SMS) \
        == arranged
    arr = "_arr" if arranged else ""   # (the instances that stage the arranged copies)
    names = ["direct_fwd_ob8_f32"] + ["tile_arrange_f32"] * arranged + [
        f"tile_conv_lin_k3_to4{arr}_f32", "cross_entropy_fwd_reduce_f32", "wide_bwd_f32", "tile_wgrad_k3_to8_f32",
        "wgrad_reduce_f32", f"tile_conv_wgrad_k3_to4{arr}_f32", "wgrad_reduce_f32", "sgd_step_f32"]
    assert base[0] == f"cnn:64 eager: {len(names)} launches under the defaults"
    assert [line.split()[0] for line in base[1:]] == names
    # its input gradient: 448 blocks of 4 rows (the 17th scalar argument) in 2 channel splits, 224 threads, g's
    # 24-wide rows staged 8 bytes a copy, the weights by runs of taps (the last two; 16 slots a tap; the _arr
    # instances ignore the run)
    conv = ("tile_conv_wgrad_k3_to4" + arr + "_f32 grid [{}] block [{}] smem {} args (* * * * * 64 32 24 24 576 36864 "
            "16 26 26 2 2 {} 2 1 1 1 0 0 0 0 0 0 0 * 28 28 0 0 * 8 {run})")
    runs = {threads: conv_tile._tile_weight_run(threads, 16, 4) for threads in (224, 280)}
    assert conv.format(448, 224, 43008, 4, run=runs[224]) in base
    changed = [line for line in diff.splitlines() if line[:1] in "+-" and not line.startswith(("---", "+++"))]
    assert changed == ["-" + conv.format(448, 224, 43008, 4, run=runs[224]), "-wgrad_reduce_f32 grid [5] block [896] "
                       "smem 0 args (* * * 448 16 9)", "+" + conv.format(384, 280, 47104, 5, run=runs[280]),
                       "+wgrad_reduce_f32 grid [5] block [768] smem 0 args (* * * 384 16 9)"]


def test_a_tuning_entry_that_changes_nothing_says_so():
    run = subprocess.run([sys.executable, SCRIPT, "--config", "cnn:64", "--tune", "conv.tile_wg_grid=None"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    launches = 9 + conv_tile._tile_arranges(4608, 192, 384, SMS)
    assert run.stdout.rstrip().endswith(f"under conv.tile_wg_grid=None: {launches} "
                                        "launches, the same plans")


def test_an_unknown_knob_fails_with_its_name():
    run = subprocess.run([sys.executable, SCRIPT, "--config", "cnn:64", "--set",
                          "smalltrain.backend.cuda.conv.NO_SUCH_KNOB=1"], capture_output=True, text=True, timeout=600)
    assert run.returncode != 0 and "has no attribute 'NO_SUCH_KNOB'" in run.stdout + run.stderr


def test_an_unknown_tuning_entry_fails_with_its_name():
    run = subprocess.run([sys.executable, SCRIPT, "--config", "cnn:64", "--tune", "conv.no_such_entry=1"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode != 0 and "no entries ['no_such_entry']" in run.stdout + run.stderr

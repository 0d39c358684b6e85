"""`smalltrain bench`: the training step's throughput over a zoo of small models written the ordinary PyTorch way,
beside PyTorch's modes in the same run; the time from process start to the first step; and the speedrun (time to
99.0% MNIST test accuracy).

    zoo.py         the models, their optimizers and losses, built from either library
    steps.py       the step in each mode (smalltrain eager / compiled; torch eager, TF32, torch.compile, graph)
    timing.py      medians of interleaved timed runs, warm-up excluded; time since process start
    processes.py   a mode in a process of its own (the CPU bench)
    throughput.py  the table and the first-step report
    speedrun.py    train to the target accuracy, everything on the device
    report.py      the environment line, tables, failure lines
    command.py     the options and the entry point

benchmarks/*.py import their pieces from here.
"""
from .command import DEFAULT_CONFIGS, add_arguments, main, parser
from .processes import ModeProcess
from .report import ModeProcessError, environment, table
from .speedrun import (count_correct, device_randperm, evaluation_steps, load_mnist_arrays, make_recipe,
                       run_speedrun, take_rows, upload)
from .steps import TRAIN_SIZE, make_step, mnist_batches, normalize
from .throughput import MODES, first_step, selected_modes
from .timing import median_interleaved, seconds_since_process_start, timed_run, timeit
from .zoo import ZOO, ZOO_BATCHES, build, make_optimizer

__all__ = ["DEFAULT_CONFIGS", "MODES", "ModeProcess", "ModeProcessError", "TRAIN_SIZE", "ZOO", "ZOO_BATCHES",
           "add_arguments", "build", "count_correct", "device_randperm", "environment", "evaluation_steps",
           "first_step", "load_mnist_arrays", "main", "make_optimizer", "make_recipe", "make_step",
           "median_interleaved", "mnist_batches", "normalize", "parser", "run_speedrun", "seconds_since_process_start",
           "selected_modes", "table", "take_rows", "timed_run", "timeit", "upload"]

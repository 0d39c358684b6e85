"""NCCL collectives honour the process group's timeout (distributed/nccl_watchdog.py): the watchdog's logic on the
CPU, and a real NCCL all-reduce that cannot complete, which must end the job with its message instead of hanging."""
import sys
import threading
import time
from pathlib import Path

import cuda_emulator
import pytest

import smalltrain
from smalltrain.distributed.nccl_watchdog import Watchdog

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workers._launch import requires_mpi, run_worker

BOUND_S = 90   # the job ends in seconds; the bound only turns a hang into a failure


class _Event:
    """What the watchdog reads of a CUDA event: whether the work before it has finished (set by the test)."""

    def __init__(self, done=False):
        self.done = done


def test_a_collective_past_the_timeout_is_reported_once_with_what_where_and_how_long():
    fired = []
    ended = threading.Event()
    dog = Watchdog(1, 2, 0.2, lambda message: (fired.append(message), ended.set()))
    dog.watch("all_reduce", _Event(done=True))
    dog.watch("broadcast", _Event())
    assert ended.wait(10), "the watchdog never fired"
    dog.stop()
    (message,) = fired
    assert message.startswith("smalltrain.distributed: NCCL broadcast did not complete within the process "
                              "group's timeout of 0.2 s (rank 1 of 2 waited ")
    assert "init_process_group(timeout=...)" in message and "SMALLTRAIN_DIST_TIMEOUT" in message


def test_collectives_that_complete_in_time_are_forgotten_and_never_fire():
    fired = []
    dog = Watchdog(0, 2, 0.3, fired.append)
    events = [_Event() for _ in range(3)]
    for i, e in enumerate(events):
        dog.watch(f"all_reduce {i}", e)
    for e in events:
        e.done = True
    deadline = time.monotonic() + 10
    while dog.pending() and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.5)   # past the timeout: nothing fires for finished work
    dog.stop()
    assert dog.pending() == 0 and fired == []


@pytest.mark.skipif(not smalltrain.cuda.is_available(), reason="no CUDA device")
@requires_mpi
def test_an_nccl_collective_that_cannot_complete_ends_the_job_with_its_message(tmp_path):
    """Two GPUs: rank 1 never joins; one GPU: the all-reduce waits behind a spinning kernel. Either way rank 0's
    watchdog names the collective after the 2 s timeout and aborts, long before anything would finish."""
    if cuda_emulator.installed():
        pytest.skip("the emulator has no NCCL kernels to wait on, nor a kernel of its own to spin")
    n = 2 if smalltrain.cuda.device_count() >= 2 else 1
    start = time.monotonic()
    code, out = run_worker("nccl_timeout.py", tmp_path, 2, n=n, timeout=BOUND_S, check=False)
    assert code != 0, out
    assert "[rank 0] smalltrain.distributed: NCCL all_reduce did not complete within the process group's timeout " \
           f"of 2 s (rank 0 of {n} waited" in out, out
    assert not list(tmp_path.iterdir()) and time.monotonic() - start < 25, out

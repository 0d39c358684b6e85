"""A watchdog over the NCCL collectives of a process group, so that they honour init_process_group(timeout=).

An NCCL collective is a kernel that waits on the GPU for every rank to join. If a rank failed, stopped or took
another path, the others' kernels wait forever, and so does any host code that then synchronizes with the GPU:
there is no call to poll, as MpiBackend polls MPI's requests. So each collective records a CUDA event after
it (`watch`), and a daemon thread queries the oldest event not yet reached; once it is older than the timeout,
the thread says which collective, on which rank, waited how long, and calls `on_timeout` (the backend aborts
the communicator, which ends its waiting kernels, then the whole job), as torch's NCCL watchdog does.

A collective inside a captured CUDA graph is watched per replay: an event recorded after each replay covers it.
"""
import collections
import threading
import time

from .mpi_backend import TIMEOUT_ENV

POLL_S = 0.05   # how often the thread looks: well below any sensible timeout, a negligible load


class Watchdog:
    def __init__(self, rank, size, timeout, on_timeout, device_id=None):
        """on_timeout(message): called once, from the watchdog's thread, when a collective overruns `timeout`
        seconds; it should end the process (see NcclBackend). device_id: the GPU of the events (the thread makes it
        current for its queries)."""
        self.rank, self.size, self.timeout = rank, size, float(timeout)
        self.on_timeout, self.device_id = on_timeout, device_id
        self._pending = collections.deque()   # (what, event, start), oldest first
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None

    def watch(self, what, event):
        """Watch the CUDA event `event`, recorded just after the collective `what` was queued."""
        with self._lock:
            self._pending.append((what, event, time.monotonic()))
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="smalltrain-nccl-watchdog", daemon=True)
            self._thread.start()

    def pending(self):
        """How many watched collectives have not been seen complete yet."""
        with self._lock:
            return len(self._pending)

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _oldest_waiting(self):
        with self._lock:
            while self._pending and self._pending[0][1].done:
                self._pending.popleft()
            return self._pending[0] if self._pending else None

    def _run(self):
        if self.device_id is not None:
            from ..backend import cuda
            cuda.cupy().cuda.Device(self.device_id).use()   # (this thread's CUDA calls go to the group's GPU)
        while not self._stop.wait(POLL_S):
            oldest = self._oldest_waiting()
            if oldest is None:
                continue
            what, _, start = oldest
            waited = time.monotonic() - start
            if waited > self.timeout:
                self.on_timeout(
                    f"smalltrain.distributed: NCCL {what} did not complete within the process group's timeout of "
                    f"{self.timeout:g} s (rank {self.rank} of {self.size} waited {waited:.1f} s): another rank "
                    f"failed, stopped, or is running a different program or settings; aborting the job (raise the "
                    f"limit with init_process_group(timeout=...) or ${TIMEOUT_ENV})")
                return

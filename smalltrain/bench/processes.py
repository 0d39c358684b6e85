"""One bench mode's training step in a process of its own, driven from the parent: the CPU bench's way of putting
two frameworks side by side without their thread pools competing in one process."""
import os

from .report import ModeProcessError, one_line


class ModeProcess:
    """One mode's training step in a process of its own, driven from here: the CPU bench's way of putting the two
    frameworks side by side without their thread pools in one process (on a 2-core machine torch's LeNet-5 step took
    11.5 ms timed right after ours in one process, 4.1 ms alone). Built and warmed up in the child; each call times
    one run of `inner` steps there and returns the seconds per step. Errors come back as ModeProcessError with the
    child's one-line report."""

    def __init__(self, key, model, batch, device, warmup, inner, timeout=600, pre=0):
        import multiprocessing
        ctx = multiprocessing.get_context("spawn")   # a fresh interpreter: no thread pool inherited
        self.timeout = timeout
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_mode_process_main, args=(child, key, model, batch, device, warmup, inner, pre),
                                daemon=True)
        self.proc.start()
        child.close()
        self._receive()   # "ready" once built and warmed up

    def __call__(self):
        self.conn.send("run")
        return self._receive()

    def _receive(self):
        if not self.conn.poll(self.timeout):
            self.close()
            raise RuntimeError(f"no answer from the benchmark process within {self.timeout} s")
        try:
            status, payload = self.conn.recv()
        except EOFError:
            raise RuntimeError(f"the benchmark process ended (exit code {self.proc.join(5) or self.proc.exitcode})") \
                from None
        if status == "error":
            raise ModeProcessError(payload)
        return payload

    def close(self):
        try:
            self.conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(5)


def _mode_process_main(conn, key, model, batch, device, warmup, inner, pre):
    from .throughput import MODES, _import_torch, _warm_run
    try:
        import smalltrain
        torch = _import_torch() if MODES[key][0] == "torch" else None
        if torch is not None:
            torch.set_num_threads(os.cpu_count() or 1)
        run = _warm_run(smalltrain, torch, key, model, batch, device, warmup, inner, pre)
        conn.send(("ready", None))
        while conn.recv() == "run":
            conn.send(("ok", run()))
    except Exception as e:  # noqa: BLE001 - the parent reports it, one line, and times the other modes
        conn.send(("error", one_line(e)))

"""The CPU emulator of our CUDA C (tests/tooling/cuda_emulator.py): barriers, shared memory, shuffles and
atomics give a GPU's results; a missing barrier, a deadlock, a wrong argument width, an unrequested shared memory
size and (with ASan) a write past an array are reported; and the suite's CUDA tests pass on it where no GPU is
present. Needs g++ (skips without)."""
import os
import subprocess
import sys

import numpy as np
import pytest

import cuda_emulator
import smalltrain

if not cuda_emulator.available():
    pytest.skip("no g++ to compile kernels for the emulator", allow_module_level=True)

TOOLING = os.path.dirname(os.path.abspath(cuda_emulator.__file__))   # for a child process outside pytest

SOURCE = r"""
#include <math.h>
typedef long long i64;
// one block: out[0] = sum of x[0..n) by a shared-memory tree (n <= blockDim.x, a power of two)
extern "C" __global__ void block_sum(const float* x, float* out, int n) {
    __shared__ float s[1024];
    s[threadIdx.x] = threadIdx.x < n ? x[threadIdx.x] : 0.f;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) s[threadIdx.x] += s[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = s[0];
}
// each thread reads its right neighbour's write: correct only with the barrier
extern "C" __global__ void neighbour(float* out, int with_barrier) {
    __shared__ float s[1024];
    s[threadIdx.x] = (float)threadIdx.x;
    if (with_barrier) __syncthreads();
    out[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}
// warp sums by shuffles, then an atomicAdd per warp into out[0]; double: 8-byte shuffles
extern "C" __global__ void warp_sums(const double* x, double* warp_out, double* total) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    double v = x[t];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (threadIdx.x % 32 == 0) {
        warp_out[t / 32] = v;
        atomicAdd(total, v);
    }
}
// out[t] = lane src (modulo width) of t's segment of `width` lanes: __shfl_sync's broadcast
extern "C" __global__ void broadcast(float* out, int src, int width) {
    out[threadIdx.x] = __shfl_sync(0xffffffffu, (float)threadIdx.x, src, width);
}
// threads 0..31 wait at one barrier, the rest at another: a deadlock on a GPU
extern "C" __global__ void divergent(float* out) {
    if (threadIdx.x < 32) {
        __syncthreads();
    } else {
        __syncthreads();
    }
    out[threadIdx.x] = 1.f;
}
// dynamic shared memory: what the block finds there before writing it (poisoned), then a round trip
extern "C" __global__ void dynamic(float* first, float* out, i64 n) {
    extern __shared__ float buf[];
    first[threadIdx.x] = buf[threadIdx.x];
    buf[threadIdx.x] = 2.f * threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = buf[n - 1 - threadIdx.x];
}
"""


@pytest.fixture(scope="module")
def module():
    return cuda_emulator.Module(SOURCE, "emulator_test")


def test_shared_memory_tree_sum(module):
    x = np.arange(1, 257, dtype=np.float32)
    out = np.zeros(3, np.float32)
    module.get_function("block_sum")((3,), (256,), (x, out, np.int32(200)))
    assert out.tolist() == [200 * 201 / 2] * 3


def test_a_missing_barrier_reads_stale_shared_memory(module):
    """Threads run in order up to a barrier, so a read of a later thread's write without one sees the old value:
    the race shows every time instead of by chance."""
    kern = module.get_function("neighbour")
    out = np.full(64, -1, np.float32)
    kern((1,), (64,), (out, np.int32(1)))
    assert out.tolist() == [float((t + 1) % 64) for t in range(64)]
    out[:] = -1
    kern((1,), (64,), (out, np.int32(0)))
    assert out[:63].tolist() != [float(t + 1) for t in range(63)]


def test_warp_shuffles_and_atomics(module):
    x = np.random.default_rng(0).standard_normal(128 * 3)
    warp_out, total = np.zeros(12), np.zeros(1)
    module.get_function("warp_sums")((3,), (128,), (x, warp_out, total))
    np.testing.assert_allclose(warp_out, x.reshape(12, 32).sum(1), rtol=1e-12)
    np.testing.assert_allclose(total[0], x.sum(), rtol=1e-12)


@pytest.mark.parametrize("src, width", [(5, 32), (37, 32), (3, 8)])
def test_shuffle_from_a_lane(module, src, width):
    """__shfl_sync as on the GPU: every lane gets lane src % width of its own segment of width lanes."""
    out = np.full(64, -1, np.float32)
    module.get_function("broadcast")((1,), (64,), (out, np.int32(src), np.int32(width)))
    t = np.arange(64)
    assert out.tolist() == (t - t % width + src % width).astype(np.float32).tolist()


def test_threads_at_different_barriers_are_a_deadlock(module):
    with pytest.raises(RuntimeError, match=r"divergent: deadlock in block \(0, 0, 0\): .*__syncthreads on line"):
        module.get_function("divergent")((1,), (64,), (np.zeros(64, np.float32),))


def test_dynamic_shared_memory_is_poisoned_and_sized_as_on_the_gpu(module):
    kern = module.get_function("dynamic")
    first, out = np.zeros(32, np.float32), np.zeros(32, np.float32)
    kern((1,), (32,), (first, out, np.int64(32)), shared_mem=32 * 4)
    assert np.isnan(first).all() and out.tolist() == [2.0 * (31 - t) for t in range(32)]
    with pytest.raises(RuntimeError, match="over 49152 it must opt in"):
        kern((1,), (32,), (first, out, np.int64(32)), shared_mem=64 * 1024)
    kern.max_dynamic_shared_size_bytes = 64 * 1024
    kern((1,), (32,), (first, out, np.int64(32)), shared_mem=64 * 1024)


def test_arguments_are_checked_before_the_kernel_runs(module):
    kern = module.get_function("dynamic")
    first, out = np.zeros(32, np.float32), np.zeros(32, np.float32)
    with pytest.raises(TypeError, match=r"argument 2 is int32 \(4 bytes\), but the parameter is 8 bytes"):
        kern((1,), (32,), (first, out, np.int32(32)))
    with pytest.raises(TypeError, match="expected 3 arguments, got 2"):
        kern((1,), (32,), (first, out))
    with pytest.raises(TypeError, match="must be a NumPy array or a NumPy scalar"):
        kern((1,), (32,), (first, out, 32))
    with pytest.raises(ValueError, match="block must be 1 to 3 positive sizes"):
        kern((1,), (0,), (first, out, np.int64(32)))
    with pytest.raises(KeyError, match="no kernel named 'nope'"):
        cuda_emulator.Module(SOURCE, "emulator_test").get_function("nope")


def test_an_updatable_node_takes_new_arguments_for_the_later_replays(module):
    """Kernel.capture_updatable (graphs.updatable_launch's emulated form): the node's set() replaces an array or an
    integer argument for the replays after it, is refused while the capture is open, and keeps each cell's kind."""
    kern = module.get_function("block_sum")
    x, ones, out = np.arange(1, 257, dtype=np.float32), np.ones(256, np.float32), np.zeros(1, np.float32)
    with pytest.raises(RuntimeError, match="an updatable node outside a capture"):
        kern.capture_updatable((1,), (256,), (x, out, np.int32(256)))
    stream = cuda_emulator._Stream()
    stream.begin_capture()
    node = kern.capture_updatable((1,), (256,), (x, out, np.int32(256)))
    with pytest.raises(RuntimeError, match="capture has not ended"):
        node.set({0: ones})
    graph = stream.end_capture()
    graph.launch()
    assert out[0] == 256 * 257 / 2
    node.set({0: ones, 2: 100})
    graph.launch()
    assert out[0] == 100
    with pytest.raises(TypeError, match="argument 2 was int32, not an array"):
        node.set({2: x})
    with pytest.raises(TypeError, match="cannot set a uint64 cell to float"):
        node.set({0: 1.5})


TINY = 'extern "C" __global__ void fill(float* out) { out[threadIdx.x] = 3.f; }'


def test_the_kernel_cache_is_private_to_the_user(tmp_path, monkeypatch):
    """Compiled libraries are loaded and run, so their folder is the user's alone: the default one is made 0700
    under $XDG_CACHE_HOME, and its libraries land there whole (no staged file is left)."""
    monkeypatch.delenv("SMALLTRAIN_EMULATOR_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    out = np.zeros(4, np.float32)
    cuda_emulator.Module(TINY, "private").get_function("fill")((1,), (4,), (out,))
    assert out.tolist() == [3.0] * 4
    folder = tmp_path / "cache" / "smalltrain" / "emulator"
    assert folder.stat().st_mode & 0o777 == 0o700
    names = sorted(p.suffix for p in folder.iterdir())
    assert names == [".cpp", ".so"]


def test_a_kernel_cache_others_may_write_to_is_refused(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("SMALLTRAIN_EMULATOR_CACHE", str(shared))
    with pytest.raises(PermissionError, match=r"kernel cache .*shared' has mode 0777, writable by group or others"):
        cuda_emulator.Module(TINY, "planted")
    assert list(shared.iterdir()) == []


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="chown to another user needs root")
def test_a_kernel_cache_owned_by_another_user_is_refused(tmp_path, monkeypatch):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)   # nobody
    monkeypatch.setenv("SMALLTRAIN_EMULATOR_CACHE", str(theirs))
    with pytest.raises(PermissionError, match=r"kernel cache .*theirs' is owned by uid 65534, not by this user"):
        cuda_emulator.Module(TINY, "planted")


def test_a_failed_build_leaves_no_file_behind(tmp_path):
    target = tmp_path / "lib.so"

    def fail(staged):
        with open(staged, "w") as f:
            f.write("half")
        raise RuntimeError("g++ failed")
    with pytest.raises(RuntimeError, match="g\\+\\+ failed"):
        cuda_emulator._replace_atomically(str(target), fail)
    assert list(tmp_path.iterdir()) == []


def _asan_runtime():
    """The path of g++'s AddressSanitizer runtime, or None."""
    try:
        path = subprocess.run(["g++", "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return None
    return path if os.path.isabs(path) and os.path.exists(path) else None


# Minutes each on the emulator (scalar kernels, many steps or float64 gradchecks through many launches); they run
# on the GPU machine. Everything else of the suite runs on the emulator.
SLOW_ON_THE_EMULATOR = [
    "tests/ops/test_matmul.py::test_linear_chain_gradcheck",
    "tests/test_compile.py::test_captured_step_equals_eager_after_100_steps",
    "tests/test_compile.py::test_a_scheduler_changes_the_captured_learning_rate",
    "tests/test_train.py::test_compiled_evaluation_equals_eager_evaluation",
    "tests/test_train.py::test_cnn_with_sgd_reaches_97_percent_after_one_epoch",
]


class _EmulatedPytest:
    """pytest `args` in a process of its own on the emulated device (the emulator takes the place of CuPy for the
    whole process: tests/conftest.py installs it), started at once; with `asan`, the kernels built with
    AddressSanitizer and its runtime preloaded, so that a read or write past a device or shared memory array stops
    the run with a report naming the kernel. Its output goes to files in `folder` (not pipes, which would fill while
    another run is awaited)."""

    def __init__(self, args, asan, folder):
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, SMALLTRAIN_CUDA_EMULATOR="1")
        if asan:
            env.update(SMALLTRAIN_EMULATOR_ASAN="1", LD_PRELOAD=asan, ASAN_OPTIONS="detect_leaks=0")
        self.out, self.err = (open(os.path.join(folder, name), "w+") for name in ("stdout", "stderr"))
        self.process = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                                        cwd=root, env=env, stdout=self.out, stderr=self.err, text=True)

    def assert_passed(self):
        """Waits for the run (an hour at most) and asserts that it passed."""
        try:
            code = self.process.wait(timeout=3600)
            self.out.seek(0)
            self.err.seek(0)
            stdout, stderr = self.out.read(), self.err.read()
        finally:
            self.stop()
        assert code == 0, stdout[-6000:] + stderr[-6000:]
        assert " passed" in stdout and " failed" not in stdout

    def stop(self):
        """Kills the run if it is still going (a test that never awaited it, a timeout) and closes its files."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.out.close()
        self.err.close()


def _emulated_runs():
    """The emulated runs by the test that asserts each: tests/backend/cuda under AddressSanitizer (where g++ has
    it), and every other test but SLOW_ON_THE_EMULATOR without it (matplotlib's import exits the process under
    ASan's preloaded runtime)."""
    deselect = [a for t in SLOW_ON_THE_EMULATOR for a in ("--deselect", t)]
    return {"test_the_kernel_tests_pass_on_the_emulator": (["tests/backend/cuda"], _asan_runtime()),
            "test_the_rest_of_the_suite_passes_on_the_emulator": (
                ["tests", "--ignore", "tests/backend/cuda", "--ignore", "tests/testing/test_cuda_emulator.py",
                 *deselect],
                None)}


@pytest.fixture(scope="module")
def emulated_run(request, tmp_path_factory):
    """emulated_run(name): the started run of the test `name` (_emulated_runs). The first call starts every selected
    test's run at once: each is one process on one core (CI's machine has two) and this process only waits for
    them, which one after the other took most of CI's time. Under pytest-xdist, only the asking test's (another
    worker may take the other). Runs not awaited are stopped at the module's end."""
    runs, started = _emulated_runs(), {}
    selected = {item.name for item in request.session.items}

    def start(name):
        started[name] = _EmulatedPytest(*runs[name], tmp_path_factory.mktemp(name))

    def get(name):
        if not started and not os.environ.get("PYTEST_XDIST_WORKER"):
            for n in runs.keys() & selected:
                start(n)
        if name not in started:
            start(name)
        return started[name]
    yield get
    for run in started.values():
        run.stop()


def test_nccl_is_a_world_of_one():
    """The emulated cupy.cuda.nccl (what distributed/nccl_backend.py runs on there): a communicator of one process
    copies each collective's input to its output (half of the float64 buffer here, by the count); more processes
    are not emulated."""
    nccl = cuda_emulator._fake_nccl()
    with pytest.raises(cuda_emulator.NotEmulated, match="NCCL across 2 processes"):
        nccl.NcclCommunicator(2, nccl.get_unique_id(), 0)
    comm = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
    send, recv = np.arange(1.0, 7.0), np.zeros(6)
    comm.allReduce(send.ctypes.data, recv.ctypes.data, 3, nccl.NCCL_FLOAT64, nccl.NCCL_SUM, 0)
    assert recv.tolist() == [1.0, 2.0, 3.0, 0.0, 0.0, 0.0]
    comm.allGather(send.ctypes.data, recv.ctypes.data, 6, nccl.NCCL_FLOAT64, 0)
    assert np.array_equal(recv, send)


@pytest.mark.skipif(smalltrain.cuda.is_available(), reason="a GPU runs the CUDA tests itself")
def test_the_kernel_tests_pass_on_the_emulator(emulated_run):
    """tests/backend/cuda: the launchers and their kernels against float64 and torch references, under AddressSanitizer
    where g++ has it."""
    emulated_run("test_the_kernel_tests_pass_on_the_emulator").assert_passed()


@pytest.mark.skipif(smalltrain.cuda.is_available(), reason="a GPU runs the CUDA tests itself")
def test_the_rest_of_the_suite_passes_on_the_emulator(emulated_run):
    """Every other test with its CUDA cases on the emulated device (Tensor ops, modules, fusions and their
    hand-offs, captured steps, the trainer), but SLOW_ON_THE_EMULATOR."""
    emulated_run("test_the_rest_of_the_suite_passes_on_the_emulator").assert_passed()


OOB = r"""
import numpy as np
import cuda_emulator
m = cuda_emulator.Module('extern "C" __global__ void past_the_end(float* out) { out[threadIdx.x] = 1.f; }', "oob")
m.get_function("past_the_end")((1,), (40,), (np.zeros(32, np.float32),))
print("not caught")
"""


@pytest.mark.skipif(_asan_runtime() is None, reason="g++ has no AddressSanitizer runtime here")
def test_asan_stops_a_write_past_a_device_array():
    env = dict(os.environ, SMALLTRAIN_EMULATOR_ASAN="1", LD_PRELOAD=_asan_runtime(), ASAN_OPTIONS="detect_leaks=0",
               PYTHONPATH=os.pathsep.join(filter(None, (TOOLING, os.environ.get("PYTHONPATH")))))
    run = subprocess.run([sys.executable, "-c", OOB], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0 and "not caught" not in run.stdout
    assert "heap-buffer-overflow" in run.stderr and "past_the_end" in run.stderr

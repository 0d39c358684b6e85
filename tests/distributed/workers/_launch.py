"""Test helper: run a worker script under `mpiexec -n N` (or a plain `python`) with a timeout, capture its output,
and read back the files it wrote; MPI tests skip with the reason when mpiexec or mpi4py is missing."""
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

WORKERS = Path(__file__).resolve().parent
REPO = WORKERS.parents[2]
TIMEOUT_S = 120


def mpi_missing():
    """Why MPI tests cannot run here, or None."""
    if shutil.which("mpiexec") is None:
        return "mpiexec is not on PATH (pip install mpich)"
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed (pip install mpi4py)"
    return None


requires_mpi = pytest.mark.skipif(mpi_missing() is not None, reason=str(mpi_missing()))


def _env():
    """The caller's environment minus any launcher's identity variables (the worker must see only its own
    mpiexec), with the repository and the test tooling (the CUDA emulator) importable and one BLAS thread per rank
    (two ranks share two cores)."""
    prefixes = ("PMI_", "PMIX_", "OMPI_COMM_WORLD_", "OMPI_MCA_ess", "OMPI_MCA_orte", "MPI_LOCAL", "HYDI_",
                "SLURM_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    paths = [str(REPO), str(REPO / "tests" / "tooling")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"
    env["OMP_NUM_THREADS"] = env["OPENBLAS_NUM_THREADS"] = "1"
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # Open MPI refuses root (containers, CI) without these
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env


def run_worker(script, *args, n=2, launcher=True, timeout=TIMEOUT_S, check=True):
    """Run workers/<script> (n ranks under mpiexec, or one plain process); returns (returncode, output)."""
    return run_python([str(WORKERS / script), *map(str, args)], n=n, launcher=launcher, timeout=timeout,
                      check=check)


def run_python(argv, n=2, launcher=True, timeout=TIMEOUT_S, check=True):
    """`mpiexec -n N python ARGV...` from the repository root; returns (returncode, stdout and stderr together).

    On timeout the whole process group (mpiexec, its proxies, the ranks) is killed and the test fails."""
    cmd = [sys.executable, *map(str, argv)]
    if launcher:
        cmd = ["mpiexec", "-n", str(n)] + cmd
    proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} did not finish within {timeout} s (hung?); output:\n{out}")
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited with {proc.returncode}; output:\n{out}")
    return proc.returncode, out

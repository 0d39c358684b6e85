"""The launchers' namespace (backend/cuda/ops.py): importable without CuPy, every launcher documented."""
import os
import subprocess
import sys

from smalltrain.backend.cuda import ops


def test_launchers_import_without_cupy_and_are_documented():
    code = "import sys, smalltrain.backend.cuda.ops; assert 'cupy' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    for name in ops.__all__:
        assert getattr(ops, name).__doc__, f"{name} has no docstring"

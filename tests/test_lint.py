"""The checkout's style, checked with the suite so that CI enforces it: ruff's pycodestyle and pyflakes rules
(pyproject's [tool.ruff]: undefined names, unused imports, lines over 120 columns) over every Python file."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_python_sources_pass_ruff():
    pytest.importorskip("ruff", reason="ruff comes with the test extra: pip install '.[test]'")
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


"""The checkout's style, checked with the suite so that CI enforces it: ruff's pycodestyle and pyflakes rules
(pyproject's [tool.ruff]: undefined names, unused imports, lines over 120 columns) over every Python file, and the
same 120 columns over the CUDA C sources and headers, which ruff does not read."""
import glob
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_COLUMNS = 120


def test_python_sources_pass_ruff():
    pytest.importorskip("ruff", reason="ruff comes with the test extra: pip install '.[test]'")
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


def test_cuda_sources_keep_to_the_line_length():
    sources = [p for ext in ("cu", "cuh", "h") for p in glob.glob(os.path.join(ROOT, "smalltrain", "**", f"*.{ext}"),
                                                                  recursive=True)]
    assert any(p.endswith("conv/tile.cu") for p in sources), sources   # the glob found the kernels, in subfolders too
    long_lines = []
    for path in sources:
        with open(path, encoding="utf-8") as f:
            long_lines += [f"{os.path.relpath(path, ROOT)}:{i}: {len(line.rstrip(chr(10)))} columns"
                           for i, line in enumerate(f, 1) if len(line.rstrip("\n")) > MAX_COLUMNS]
    assert long_lines == []

"""Shared benchmark plumbing, kept for the scripts that import it: timing (warm-up excluded, median of repeats),
the environment line and the result table live in smalltrain/bench.py (one copy, also behind `smalltrain bench`)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from smalltrain.bench import environment, table, timeit

__all__ = ["environment", "table", "timeit"]

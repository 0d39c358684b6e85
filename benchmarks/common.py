"""Shared benchmark plumbing for the scripts in this folder: timing (warm-up excluded, median of repeats), the
environment line and the result table come from smalltrain/bench/ (one copy, also behind `smalltrain bench`);
`apply_settings` sets a module-level value for an A/B run (`--set package.module.NAME=value`)."""
import ast
import importlib
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from smalltrain.bench import environment, table, timeit

__all__ = ["apply_settings", "environment", "table", "timeit"]


def apply_settings(settings):
    """Set module attributes from "package.module.NAME=value" strings (value a Python literal); the attribute must
    exist already, so that a misspelled knob fails instead of being ignored."""
    for item in settings or ():
        target, sep, value = item.partition("=")
        module_name, _, name = target.rpartition(".")
        if not sep or not module_name:
            raise SystemExit(f"--set: expected module.NAME=value, got {item!r}")
        module = importlib.import_module(module_name)
        if not hasattr(module, name):
            raise SystemExit(f"--set: {module_name} has no attribute {name!r}")
        setattr(module, name, ast.literal_eval(value))

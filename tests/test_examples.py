"""The PyTorch-style example scripts run end to end on a slice of MNIST, each in its own process, and report a
finite loss and an accuracy above chance (10%)."""
import inspect
import math
import os
import re
import subprocess
import sys

import pytest

import smalltrain

ROOT = os.path.join(os.path.dirname(__file__), "..")


def _has_adadelta():
    return hasattr(smalltrain.optim, "Adadelta")


def _loads_nested_checkpoints():
    return "weights_only" in inspect.signature(smalltrain.load).parameters


EXAMPLES = [
    pytest.param("mnist_mlp.py", ["--limit", "512", "--epochs", "1"], id="mlp"),
    pytest.param("mnist_cnn.py", ["--limit", "256", "--epochs", "1", "--log-interval", "100"], id="cnn",
                 marks=pytest.mark.skipif(not _has_adadelta(), reason="needs optim.Adadelta")),
    pytest.param("mnist_bn_augment.py", ["--limit", "512", "--epochs", "1"], id="bn_augment"),
    pytest.param("mnist_checkpoint.py", ["--limit", "512", "--epochs", "1"], id="checkpoint",
                 marks=pytest.mark.skipif(not _loads_nested_checkpoints(),
                                          reason="needs smalltrain.save/load of nested dicts (weights_only=)")),
]


@pytest.mark.parametrize("script, args", EXAMPLES)
def test_example_trains_on_a_slice(script, args, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.path.abspath(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", script), *args, "--data",
                          str(tmp_path / "data")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    match = re.search(r"^final: loss=(\S+) accuracy=(\S+)$", out.stdout, re.MULTILINE)
    assert match, out.stdout[-2000:]
    loss, accuracy = float(match.group(1)), float(match.group(2))
    assert math.isfinite(loss) and loss > 0
    assert accuracy > 0.2, f"{script}: accuracy {accuracy} is not above chance"

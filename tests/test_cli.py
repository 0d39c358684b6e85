"""Tests for smalltrain/cli.py's parsing: --help shows every flag with its default, --version, and values that
are not finite or out of range are argparse errors (exit 2) naming the flag, before anything runs."""
import pytest

import smalltrain
from smalltrain import cli


def _help(capsys, *argv):
    with pytest.raises(SystemExit) as e:
        cli.main([*argv, "--help"])
    assert e.value.code == 0
    return " ".join(capsys.readouterr().out.split())   # argparse wraps lines: compare with single spaces


def test_train_help_lists_every_flag_with_its_default(capsys):
    text = _help(capsys, "train")
    for flag, default in [("--model", "lenet5"), ("--epochs", "3"), ("--batch-size", "64"), ("--lr", "0.001"),
                          ("--optimizer", "adam"), ("--momentum", "0.0"), ("--scheduler", "none"), ("--seed", "0"),
                          ("--out", "runs/smalltrain"), ("--log-every", "50")]:
        assert flag in text and f"(default: {default})" in text, flag
    for flag in ("--limit-train-batches", "--allow-nonfinite", "--resume", "--data-dir", "--distributed"):
        assert flag in text
    assert "OUT/version_N" in text and "(default: False)" not in text


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"smalltrain {smalltrain.__version__}"


@pytest.mark.parametrize("flag, value, expected", [
    ("--lr", "inf", "a finite number in (0, 10]"),
    ("--lr", "1e30", "a finite number in (0, 10]"),
    ("--lr", "nan", "a finite number in (0, 10]"),
    ("--lr", "0", "a finite number in (0, 10]"),
    ("--lr", "-0.1", "a finite number in (0, 10]"),
    ("--momentum", "nan", "a finite number in [0, 1)"),
    ("--momentum", "1", "a finite number in [0, 1)"),
    ("--weight-decay", "-1", "a finite number in [0, 1]"),
    ("--epochs", "0", "an int in [1, 100000]"),
    ("--batch-size", "0", "an int in [1, 65536]"),
    ("--batch-size", "1.5", "an int in [1, 65536]"),
    ("--seed", "-1", "an int in [0, 2**32 - 1]"),
    ("--limit-train-batches", "0", "an int >= 1"),
    ("--log-every", "0", "an int >= 1"),
])
def test_bad_values_are_refused_at_parse_naming_the_flag(capsys, flag, value, expected):
    with pytest.raises(SystemExit) as e:
        cli.main(["train", flag, value])
    assert e.value.code == 2
    assert f"argument {flag}: expected {expected}, got '{value}'" in capsys.readouterr().err


@pytest.mark.parametrize("field, value", [("lr", float("inf")), ("lr", 1e30), ("momentum", float("nan")),
                                          ("batch_size", 0), ("epochs", True)])
def test_train_config_checks_the_same_ranges(field, value):
    from smalltrain.train import TrainConfig
    with pytest.raises(ValueError, match=f"{field} must be"):
        TrainConfig(**{field: value}).validate()

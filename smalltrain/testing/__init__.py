"""Numerical verification, public so users test their own ops the way smalltrain tests its own."""
from .compare import assert_close, max_error
from .gradcheck import gradcheck
from .golden import golden, golden_error

__all__ = ["assert_close", "max_error", "gradcheck", "golden", "golden_error"]

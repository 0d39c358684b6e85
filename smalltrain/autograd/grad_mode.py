"""Gradient recording switch: `no_grad` / `enable_grad` / `set_grad_enabled`, as context managers and decorators."""
import functools


class _State:
    enabled = True


_state = _State()


def is_grad_enabled():
    return _state.enabled


class set_grad_enabled:
    """Set gradient recording on or off for a `with` block or a decorated function."""

    def __init__(self, mode=True):
        self.mode = bool(mode)
        self.prev = _state.enabled
        _state.enabled = self.mode  # like torch, the plain call takes effect at once

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _state.enabled = self.prev
        return False

    def __call__(self, fn):
        _state.enabled = self.prev  # used as a decorator: undo the immediate effect
        mode = self.mode

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            prev = _state.enabled
            _state.enabled = mode
            try:
                return fn(*args, **kwargs)
            finally:
                _state.enabled = prev
        return wrapper


class _GradMode:
    mode = True

    def __enter__(self):
        self.prev = _state.enabled
        _state.enabled = self.mode
        return self

    def __exit__(self, *exc):
        _state.enabled = self.prev
        return False

    def __call__(self, fn):
        mode = self.mode

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            prev = _state.enabled
            _state.enabled = mode
            try:
                return fn(*args, **kwargs)
            finally:
                _state.enabled = prev
        return wrapper


class no_grad(_GradMode):
    """Disable graph recording: results of ops have no grad_fn and require no grad."""
    mode = False


class enable_grad(_GradMode):
    """Re-enable graph recording inside a no_grad region."""
    mode = True


class inference_mode(no_grad):
    def __init__(self, mode=True):
        self.mode = not mode

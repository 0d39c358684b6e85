"""Gradient recording switch: `no_grad` / `enable_grad` / `set_grad_enabled`, as context managers and decorators."""
import functools
import threading


class _State(threading.local):
    enabled = True   # per thread, as torch's grad mode: a loader thread under no_grad leaves training alone


_state = _State()


def is_grad_enabled():
    return _state.enabled


def _with_mode(fn, mode):
    """fn wrapped so that each call runs with grad mode `mode` and restores the caller's mode after: the decorator
    form of every grad-mode class."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        prev = _state.enabled
        _state.enabled = mode
        try:
            return fn(*args, **kwargs)
        finally:
            _state.enabled = prev
    return wrapper


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
        return _with_mode(fn, self.mode)


class _GradMode:
    """Context manager and decorator; `@no_grad` and `@no_grad()` both work, as in torch."""

    mode = True

    def __new__(cls, orig_func=None):
        if orig_func is None:
            return super().__new__(cls)
        return cls()(orig_func)   # used bare as a decorator

    def __enter__(self):
        self.__dict__.setdefault("_prev", []).append(_state.enabled)   # a stack: one instance may nest
        _state.enabled = self.mode
        return self

    def __exit__(self, *exc):
        _state.enabled = self._prev.pop()
        return False

    def __call__(self, fn):
        return _with_mode(fn, self.mode)


class no_grad(_GradMode):
    """Disable graph recording: results of ops have no grad_fn and require no grad."""
    mode = False


class enable_grad(_GradMode):
    """Re-enable graph recording inside a no_grad region."""
    mode = True


class inference_mode(no_grad):
    """Like no_grad (smalltrain has no separate inference tensors); inference_mode(False) records."""

    def __new__(cls, mode=True):
        if callable(mode):
            return cls()(mode)
        return object.__new__(cls)

    def __init__(self, mode=True):
        self.mode = not mode if not callable(mode) else False

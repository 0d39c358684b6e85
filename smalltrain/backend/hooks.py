"""The few calls the backend makes up into autograd, as replaceable hooks: the backend is the ground floor and imports
nothing above it, so autograd installs its implementations here when it is imported (autograd/handoff.py).

The defaults are what the backend does with no autograd above it: no gradient slot to write into (claim_grad),
work queued beside the current stream joined at once (defer_join), and nothing held back (hold runs the launch).
"""

# The launch held back now (autograd/held.py's Held record), or None. It lives here, not in autograd, so that every
# kernel launch (cuda/_common.get) can see whether one is held with a single attribute read.
held = None


def claim_grad(array):
    """The array to write the gradient of the leaf input `array` into (a view of a flat gradient buffer the running
    backward pass offers), or None: the launcher then allocates one."""
    return None


def defer_join(join):
    """Run join() (the current stream waiting for a side stream) later, at the end of the running backward pass, so
    that the side stream's work also runs beside the pass's later work; by default, now."""
    join()


def hold(out, launch, info=None):
    """Hold `launch` (which writes the array `out`) for the op after it, which may take it over (info: what it
    needs to); by default nothing is held: the launch runs now."""
    launch()


def flush():
    """Run the launch held back, if any (before work that must follow it)."""


def drop():
    """Forget the launch held back without running it (a capture that failed)."""


_NAMES = ("claim_grad", "defer_join", "hold", "flush", "drop")


def install(**hooks):
    """Replace hooks by name (autograd/handoff.py, at import)."""
    unknown = sorted(set(hooks) - set(_NAMES))
    if unknown:
        raise TypeError(f"hooks.install: no hooks named {unknown}; the hooks are {list(_NAMES)}")
    globals().update(hooks)

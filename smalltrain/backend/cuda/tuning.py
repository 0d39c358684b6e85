"""Shape-tuning tables: the numbers a kernel family's launch plans are tuned by, one frozen table per family.

A family declares its table once, beside its launch code, each entry with a one-line reason:

    CONV = Tuning("conv", direct_max_k=(256, "C*KH*KW up to which the direct kernels beat im2col + GEMM"), ...)

and reads it as attributes (`CONV.direct_max_k`). Nothing assigns to a table; a test or a benchmark that needs
another setting (a path forced on small inputs, a partial last tile) overrides entries for a `with` block:

    with override(CONV, direct_max_k=0):
        ...

Plans cached from the table are dropped on entering and leaving the block (`Tuning.watch`).
"""
import contextlib


class Tuning:
    """A kernel family's tunable numbers: name -> value, each with its reason. Frozen: change it through
    `override` only."""

    def __init__(self, family, **entries):
        for name, entry in entries.items():
            if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], str) and entry[1]):
                raise TypeError(f"Tuning({family!r}): entry {name!r} must be (value, reason), got {entry!r}")
        object.__setattr__(self, "_family", family)
        object.__setattr__(self, "_values", {name: value for name, (value, _) in entries.items()})
        object.__setattr__(self, "_reasons", {name: reason for name, (_, reason) in entries.items()})
        object.__setattr__(self, "_watchers", [])

    def __getattr__(self, name):
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"the {self._family} tuning table has no entry {name!r}") from None

    def __setattr__(self, name, value):
        raise AttributeError(f"the {self._family} tuning table is frozen: use tuning.override({self._family}, "
                             f"{name}=...) in a with block")

    def __repr__(self):
        return f"Tuning({self._family!r}, {self._values!r})"

    def entries(self):
        """{name: (value, reason)} for every entry."""
        return {name: (value, self._reasons[name]) for name, value in self._values.items()}

    def watch(self, clear):
        """Call `clear()` whenever an override starts or ends (e.g. a plan cache's cache_clear); returns `clear`,
        so it also serves as a decorator."""
        self._watchers.append(clear)
        return clear

    def _changed(self):
        for clear in self._watchers:
            clear()


@contextlib.contextmanager
def override(table, **values):
    """Set entries of `table` for the duration of the block (tests, benchmarks); the old values come back after."""
    unknown = sorted(set(values) - set(table._values))
    if unknown:
        raise KeyError(f"the {table._family} tuning table has no entries {unknown}; it has {sorted(table._values)}")
    old = {name: table._values[name] for name in values}
    table._values.update(values)
    table._changed()
    try:
        yield table
    finally:
        table._values.update(old)
        table._changed()

"""Argument helpers the layers share: torch's _single/_pair (an int or a sequence -> a tuple of n)."""
import collections.abc
from itertools import repeat


def _ntuple(n, name="parse"):
    def parse(x):
        if isinstance(x, collections.abc.Iterable) and not isinstance(x, str):
            return tuple(x)
        return tuple(repeat(x, n))
    parse.__name__ = name
    return parse


_single = _ntuple(1, "_single")
_pair = _ntuple(2, "_pair")


def _reverse_repeat_tuple(t, n):
    """(1, 2) with n=2 -> (2, 2, 1, 1): conv padding in the order F.pad takes it (last dim first)."""
    return tuple(x for x in reversed(t) for _ in range(n))

"""Golden tests for smalltrain.ops.sort against torch: sort/argsort (descending, stable ties, NaN order), topk
(largest, smallest, k = 0 and the whole dim, gradients routed to the indices), unique, and error rows."""
import numpy as np
import pytest
import torch

import smalltrain as st
from smalltrain.testing import golden, golden_error


def both(fn, *inputs, device="cpu", **kw):
    return golden(lambda *a: fn(st, *a), lambda *a: fn(torch, *a), *inputs, device=device, **kw)


def distinct(rng, shape):
    return rng.permutation(np.prod(shape)).reshape(shape).astype(np.float32) / 7 - 2


def with_ties_and_nan(rng, shape):
    a = rng.integers(-2, 3, shape).astype(np.float32)
    a.flat[1] = np.nan
    return a


CASES = {  # name: (fn(lib, x), input maker, shape, differentiable)
    "sort_last": (lambda L, x: L.sort(x), distinct, (3, 5), True),
    "sort_dim0_desc": (lambda L, x: x.sort(0, descending=True), distinct, (4, 3), True),
    "sort_ties_stable": (lambda L, x: L.sort(x, dim=1, stable=True), with_ties_and_nan, (3, 6), False),
    "sort_ties_desc": (lambda L, x: L.sort(x, dim=-1, descending=True, stable=True), with_ties_and_nan, (2, 7), False),
    "sort_1d": (lambda L, x: L.sort(x).values, distinct, (6,), True),
    "argsort": (lambda L, x: L.argsort(x, 1, descending=True), distinct, (3, 4), False),
    "argsort_ties": (lambda L, x: x.argsort(dim=0, stable=True), with_ties_and_nan, (5, 2), False),
    "topk": (lambda L, x: L.topk(x, 2), distinct, (3, 5), True),
    "topk_smallest_dim0": (lambda L, x: x.topk(3, dim=0, largest=False), distinct, (4, 3), True),
    "topk_k0": (lambda L, x: L.topk(x, 0), distinct, (2, 3), False),
    "topk_all": (lambda L, x: L.topk(x, 3, 1), distinct, (2, 3, 2), False),
    "topk_nan": (lambda L, x: L.topk(x, 2), lambda rng, s: np.array([1.0, np.nan, 3.0, -1.0], np.float32), (4,),
                 False),
    "topk_3d_grad": (lambda L, x: L.topk(x * 2, 2, dim=1).values * 3, distinct, (2, 4, 3), True),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_sort_golden(name, device, rng):
    fn, make, shape, grad = CASES[name]
    both(fn, make(rng, shape), device=device, grad=grad)


def test_topk_namedtuple_fields(device):
    x = st.tensor([[1.0, 5.0, 3.0]], device=device)
    r = x.topk(2)
    assert r.values.tolist() == [[5.0, 3.0]] and r.indices.tolist() == [[1, 2]]
    values, indices = x.sort(descending=True)
    assert indices.dtype == st.int64 and values.tolist() == [[5.0, 3.0, 1.0]]


UNIQUE = {
    "plain": lambda L, x: L.unique(x),
    "inverse_counts": lambda L, x: L.unique(x, return_inverse=True, return_counts=True),
    "counts": lambda L, x: x.unique(return_counts=True),
    "dim0": lambda L, x: L.unique(x, dim=0, return_inverse=True, return_counts=True),
}


@pytest.mark.parametrize("name", sorted(UNIQUE))
def test_unique_golden(name, device):
    x = np.array([[3, 1, 2], [1, 1, 0], [3, 1, 2], [0, 5, 5]])
    both(UNIQUE[name], x, device=device, grad=False)


ERRORS = [
    (lambda L, x: L.topk(x, 4), r"topk"),
    (lambda L, x: L.sort(x, 2), r"sort"),
    (lambda L, x: L.topk(x, 1, dim=3), r"topk"),
]


@pytest.mark.parametrize("k", range(len(ERRORS)))
def test_sort_errors(k, device):
    fn, match = ERRORS[k]
    golden_error(lambda x: fn(st, x), lambda x: fn(torch, x), np.ones((2, 3), np.float32), match=match,
                 device=device)

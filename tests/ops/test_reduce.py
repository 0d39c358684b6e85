"""Golden tests for smalltrain.ops.reduce against torch: every reduction over dims x keepdim, tuple dims, ties (max(dim)
routes to the index, max()/amax split evenly), NaN, empty dims where torch allows them, integer dtypes, error rows
and float64 gradchecks."""
import numpy as np
import pytest
import torch

import smalltrain as st
from smalltrain.testing import golden, golden_error, gradcheck

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")


def both(fn, *inputs, device="cpu", **kw):
    return golden(lambda *a: fn(st, *a), lambda *a: fn(torch, *a), *inputs, device=device, **kw)


def kw(dim, keepdim):
    return {} if dim is None else {"dim": dim, "keepdim": keepdim}


# name: fn(x, dim, keepdim) with dim None meaning "no dim argument"
REDUCE = {
    "sum": lambda x, d, k: x.sum(**kw(d, k)),
    "mean": lambda x, d, k: x.mean(**kw(d, k)),
    "var": lambda x, d, k: x.var(**kw(d, k)),
    "var_biased": lambda x, d, k: x.var(**kw(d, k), unbiased=False),
    "var_correction2": lambda x, d, k: x.var(**kw(d, k), correction=2),
    "std": lambda x, d, k: x.std(**kw(d, k)),
    "std_correction0": lambda x, d, k: x.std(**kw(d, k), correction=0),
    "amax": lambda x, d, k: x.amax(**kw(d, k)),
    "amin": lambda x, d, k: x.amin(**kw(d, k)),
    "logsumexp": lambda x, d, k: x.logsumexp(**kw(d, k)) if d is not None else x.logsumexp(tuple(range(x.ndim))),
    "max": lambda x, d, k: x.max(**kw(d, k)),
    "min": lambda x, d, k: x.min(**kw(d, k)),
    "argmax": lambda x, d, k: x.argmax(**kw(d, k)),
    "argmin": lambda x, d, k: x.argmin(**kw(d, k)),
}
SINGLE_DIM = {"max", "min", "argmax", "argmin"}
DIMS = [None, 0, 1, -1, (0, 2), (2, 0, 1), [1]]


def values(rng, name, shape):
    if name in ("amax", "amin", "max", "min", "argmax", "argmin"):
        return rng.integers(-2, 3, shape).astype(np.float32)   # many ties
    return rng.uniform(-2, 2, shape).astype(np.float32)


CASES = [(name, dim, keepdim) for name in sorted(REDUCE) for dim in DIMS for keepdim in (False, True)
         if not (name in SINGLE_DIM and isinstance(dim, (tuple, list))) and not (dim is None and keepdim)]


@pytest.mark.parametrize("name,dim,keepdim", CASES, ids=[f"{n}-{d}-{k}" for n, d, k in CASES])
def test_reduce_dims(name, dim, keepdim, device, rng):
    both(lambda L, x: REDUCE[name](x, dim, keepdim), values(rng, name, (3, 4, 5)), device=device)


def test_max_dim_routes_gradient_to_returned_index(device):
    x = np.array([[3.0, 1.0, 3.0, 2.0], [0.0, 5.0, 5.0, 5.0]], np.float32)
    both(lambda L, x: x.max(1), x, device=device)
    both(lambda L, x: x.min(0), x, device=device)
    both(lambda L, x: [x.max(), x.amax(1), x.min(), x.amin((0, 1))], x, device=device)   # ties split evenly
    values, indices = st.tensor(x).max(dim=1)
    assert indices.tolist() == [0, 1] and values.tolist() == [3.0, 5.0]
    r = st.tensor(x).max(1, keepdim=True)
    assert r.values.shape == (2, 1) and r.indices.dtype == st.int64


@pytest.mark.parametrize("name", sorted(REDUCE))
def test_reduce_nan(name, device):
    x = np.array([[1.0, np.nan, 3.0], [2.0, 2.0, -1.0], [np.nan, np.nan, 0.5], [np.inf, 1.0, -np.inf]], np.float32)
    both(lambda L, x: REDUCE[name](x, 1, False), x, device=device)
    both(lambda L, x: REDUCE[name](x, None, False), x, device=device)


@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("name", ["sum", "mean", "var", "std", "logsumexp", "amax", "amin", "max", "min", "argmax"])
def test_reduce_empty(name, dim, device):
    x = np.zeros((0, 3), np.float32)
    def fn(L, x):
        return REDUCE[name](x, dim, False)
    if name in ("amax", "amin", "max", "min", "argmax") and dim == 0:
        golden_error(lambda *a: fn(st, *a), lambda *a: fn(torch, *a), x, match="non-zero size", device=device)
    else:
        both(fn, x, device=device)


def test_reduce_scalar_and_empty_whole(device):
    both(lambda L, x: [x.sum(), x.sum(0), x.max(0)[0], x.amax(0), x.logsumexp(0), x.mean(), x.argmax(0)],
         np.array(2.5, np.float32), device=device)
    both(lambda L, x: [x.sum(), x.mean(), x.sum(dim=()), x.mean(())], np.zeros((0, 3), np.float32), device=device)


def test_integer_and_bool_reductions(device, rng):
    i = rng.integers(-5, 5, (3, 4)).astype(np.int32)
    both(lambda L, x: [x.sum(), x.sum(1), x.max(), x.max(0)[0], x.amin(1), x.argmax(1), x.sum(dtype=L.float64),
                       x.mean(dtype=L.float32), x.logsumexp(1), x.prod(1), x.count_nonzero(0)], i, device=device)
    b = rng.random((3, 4)) > 0.5
    both(lambda L, x: [x.sum(), x.sum(0), x.all(1), x.any(0), x.all(), x.any()], b, device=device)


def test_var_std_signatures(device, rng):
    x = rng.uniform(-1, 1, (4, 3)).astype(np.float32)
    both(lambda L, x: [x.var(0, True), x.var(False), x.std(1, False, True), L.var(x, dim=1, correction=0),
                       L.std(x), x.var(dim=(0, 1), keepdim=True)], x, device=device)
    # a constant row: torch's std gradient is 0 there, not inf * 0
    both(lambda L, x: x.std(1), np.array([[1.0, 1.0, 1.0], [1.0, 2.0, 4.0]], np.float32), device=device)
    both(lambda L, x: x.var(1), np.array([[3.0], [1.0]], np.float32), device=device)   # one element: nan


def test_functional_spellings(device, rng):
    x = rng.uniform(-1, 1, (3, 4)).astype(np.float32)
    y = rng.uniform(-1, 1, (3, 4)).astype(np.float32)
    both(lambda L, x, y: [L.sum(x, 1), L.mean(x, (0, 1)), L.amax(x, 0), L.amin(x, 1), L.logsumexp(x, 1),
                          L.max(x, 1)[0], L.min(x), L.max(x, y), L.min(x, y), L.argmax(x), L.argmin(x, 0)], x, y,
         device=device)


ERRORS = [
    (lambda L, x: x.sum(3), (3, 4, 5), r"out of range"),
    (lambda L, x: x.mean(-4), (3, 4, 5), r"out of range"),
    (lambda L, x: x.sum((0, 0)), (3, 4), r"appears multiple times"),
    (lambda L, x: x.amax((1, -1)), (3, 4), r"appears multiple times"),
    (lambda L, x: x.max(), (0, 3), r"numel\(\) == 0"),
    (lambda L, x: x.amax(), (0, 3), r"numel\(\) == 0"),
    (lambda L, x: x.argmax(), (0, 3), r"numel\(\) == 0"),
    (lambda L, x: x.min(0), (0, 3), r"non-zero size"),
    (lambda L, x: x.max(2), (3, 4), r"out of range"),
    (lambda L, x: x.long().mean(), (3, 4), r"could not infer output dtype"),
    (lambda L, x: x.long().var(), (3, 4), r"floating point"),
    (lambda L, x: x.long().std(0), (3, 4), r"floating point"),
    (lambda L, x: x.argmax(5), (3, 4), r"out of range"),
]


@pytest.mark.parametrize("fn,shape,match", ERRORS, ids=[f"{e[2]}-{i}" for i, e in enumerate(ERRORS)])
def test_errors(fn, shape, match, device):
    golden_error(lambda *a: fn(st, *a), lambda *a: fn(torch, *a), np.ones(shape, np.float32), match=match,
                 device=device)


GRADCHECK = {
    "sum": lambda x: x.sum((0, 2)), "mean": lambda x: x.mean(1, keepdim=True), "var": lambda x: x.var(0),
    "std": lambda x: x.std((1, 2)), "max_dim": lambda x: x.max(1)[0], "min_dim": lambda x: x.min(-1, True)[0],
    "amax": lambda x: x.amax((0, 1)), "amin": lambda x: x.amin(2), "max_all": lambda x: x.max(),
    "logsumexp": lambda x: x.logsumexp(1), "mean_all": lambda x: x.mean(), "var_keep": lambda x: x.var(2, True),
}


@pytest.mark.parametrize("name", sorted(GRADCHECK))
def test_gradcheck(name, rng):
    x = st.tensor(rng.permutation(24).reshape(2, 3, 4) / 7.0, requires_grad=True)   # distinct: no ties
    assert gradcheck(GRADCHECK[name], (x,))

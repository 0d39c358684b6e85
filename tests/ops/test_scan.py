"""Golden tests for smalltrain.ops.scan against torch: cumsum and cumprod forward, dtypes and gradients, including
cumprod through zeros (one, several, at the start and end of a slice)."""
import numpy as np
import pytest
import torch

import smalltrain as st
from smalltrain.testing import golden, gradcheck


def both(fn, *inputs, device="cpu", **kw):
    return golden(lambda *a: fn(st, *a), lambda *a: fn(torch, *a), *inputs, device=device, **kw)


def zeros_inside(rng, shape):
    a = rng.uniform(0.5, 2.0, shape).astype(np.float32) * rng.choice([-1, 1], shape)
    a[0, 2] = 0.0                  # one zero mid-slice
    a[1, 0] = a[1, 3] = 0.0        # a leading zero and a second one
    a[2, -1] = 0.0                 # a zero at the end
    return a.astype(np.float32)


CASES = {
    "cumsum_1": (lambda L, x: L.cumsum(x, 1), lambda rng, s: rng.standard_normal(s).astype(np.float32), (3, 5)),
    "cumsum_0": (lambda L, x: x.cumsum(0), lambda rng, s: rng.standard_normal(s).astype(np.float32), (4, 2, 3)),
    "cumsum_neg": (lambda L, x: x.cumsum(-1) * 2, lambda rng, s: rng.standard_normal(s).astype(np.float32), (2, 6)),
    "cumprod": (lambda L, x: L.cumprod(x, 1), lambda rng, s: rng.uniform(0.5, 1.5, s).astype(np.float32), (3, 5)),
    "cumprod_zeros": (lambda L, x: x.cumprod(1), zeros_inside, (3, 5)),
    "cumprod_zeros_dim0": (lambda L, x: x.t().cumprod(0), zeros_inside, (3, 5)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_scan_golden(name, device, rng):
    fn, make, shape = CASES[name]
    both(fn, make(rng, shape), device=device)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.bool_, np.uint8])
def test_cumsum_integer_dtypes(dtype, device):
    x = np.array([[1, 0, 1], [1, 1, 0]]).astype(dtype)
    both(lambda L, t: (L.cumsum(t, 1), L.cumprod(t, 0), t.cumsum(0, dtype=L.float64)), x, device=device, grad=False)


def test_cumprod_gradcheck():
    rng = np.random.default_rng(0)
    x = zeros_inside(rng, (3, 5)).astype(np.float64)
    assert gradcheck(lambda t: st.cumprod(t, 1), (st.tensor(x, requires_grad=True),))

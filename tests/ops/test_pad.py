"""Golden tests of smalltrain/ops/pad.py against torch: constant padding from the last dim backward, negative pads
(crops), fill values, edge shapes, non-contiguous input, torch's errors, float64 gradcheck."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import smalltrain as st
from smalltrain.ops.pad import pad
from smalltrain.testing import golden, gradcheck

CASES = [
    # (input shape, pad, value)
    ((3, 4), (1, 1), None),
    ((3, 4), (0, 2), None),
    ((3, 4), (2, 0, 1, 3), 1.5),
    ((2, 3, 4), (1, 1, 1, 1, 1, 1), -2.0),
    ((2, 3, 4, 5), (1, 2), None),
    ((2, 3, 4, 5), (1, 0, 0, 2), 0.25),
    ((3, 5), (-1, 2), None),              # crop the left, pad the right
    ((3, 5), (-2, -1, 1, 0), 7.0),
    ((3, 5), (-3, -2), None),             # cropped to nothing
    ((3, 5), (0, 0, -3, 0), None),
    ((3, 4), (1, 1), float("nan")),
    ((3, 4), (1, 1), -float("inf")),
    ((3, 4), (), None),
    ((1, 1), (1, 1, 1, 1), None),
    ((0, 3), (1, 1, 2, 0), 3.0),
    ((5,), (3, 2), None),
]


@pytest.mark.parametrize("shape,pads,value", CASES)
def test_pad_golden(shape, pads, value, device, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    golden(lambda t: pad(t, pads, value=value), lambda t: TF.pad(t, pads, value=value), x, device=device)


def test_pad_noncontiguous_int_and_scalar(device, rng):
    x = rng.standard_normal((4, 3)).astype(np.float32)
    golden(lambda t: pad(t.transpose(0, 1), (1, 2, 0, 1)), lambda t: TF.pad(t.transpose(0, 1), (1, 2, 0, 1)), x,
           device=device)
    ints = np.arange(6).reshape(2, 3)
    golden(lambda t: pad(t, [1, 1], value=2.7), lambda t: TF.pad(t, [1, 1], value=2.7), ints, device=device)
    golden(lambda t: pad(t, ()), lambda t: TF.pad(t, ()), np.array(1.5, np.float32), device=device)


ERRORS = [
    (lambda: pad(st.randn(3, 5), (1,)), RuntimeError, "divisible by 2"),
    (lambda: pad(st.randn(3, 5), (1, 1, 1, 1, 1, 1)), RuntimeError, "padding length 6 and input of dimension 2"),
    (lambda: pad(st.randn(3, 5), (-3, -3)), RuntimeError, "length must be non-negative"),
    (lambda: pad(st.randn(3, 5), (-6, 2)), RuntimeError, "length must be non-negative"),
    (lambda: pad(st.randn(3, 5), (1.0, 1)), TypeError, "tuple of ints.*float at pos 0"),
    (lambda: pad(st.randn(3, 5), (1, 1), mode="foo"), NotImplementedError, "Unrecognised padding mode foo"),
    (lambda: pad(st.randn(1, 3, 5), (1, 1), mode="reflect"), NotImplementedError, "reflect"),
]


@pytest.mark.parametrize("call,exc,match", ERRORS)
def test_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_torch_raises_the_same_types():
    for call, exc in [(lambda: TF.pad(torch.randn(3, 5), (1,)), RuntimeError),
                      (lambda: TF.pad(torch.randn(3, 5), (-3, -3)), RuntimeError),
                      (lambda: TF.pad(torch.randn(3, 5), (1.0, 1)), TypeError),
                      (lambda: TF.pad(torch.randn(3, 5), (1, 1), mode="foo"), NotImplementedError)]:
        with pytest.raises(exc):
            call()


@pytest.mark.parametrize("pads", [(1, 2, 0, 1), (-1, 1, 2, -1)])
def test_gradcheck(pads, device, rng):
    x = st.tensor(rng.standard_normal((2, 3, 4)), dtype=st.float64, device=device, requires_grad=True)
    assert gradcheck(lambda t: pad(t, pads, value=0.5), (x,))

"""Golden tests for smalltrain.ops.conv.conv2d against torch.nn.functional.conv2d: values, gradients, errors."""
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import smalltrain
from smalltrain.ops.conv import conv2d
from smalltrain.ops.pool import max_pool2d
from _layouts import as_is as _as_is, batch_inner as _batch_inner, transposed as _transposed
from smalltrain.testing import golden, golden_error, gradcheck
import cuda_emulator


def _normal(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


# id, input shape, weight shape, bias?, kwargs, layout of the input as smalltrain sees it
CASES = [
    ("basic", (2, 3, 7, 9), (4, 3, 3, 2), True, {}, _as_is),
    ("stride2", (2, 3, 9, 8), (5, 3, 3, 3), True, {"stride": 2}, _as_is),
    ("stride_pad_tuples", (2, 2, 8, 11), (3, 2, 2, 3), True, {"stride": (2, 3), "padding": (1, 2)}, _as_is),
    ("dilation", (1, 3, 9, 10), (2, 3, 3, 2), True, {"dilation": (2, 3), "padding": 1}, _as_is),
    ("groups2", (2, 4, 6, 7), (6, 2, 3, 3), True, {"groups": 2, "padding": 1}, _as_is),
    ("depthwise", (2, 3, 5, 6), (6, 1, 3, 3), True, {"groups": 3}, _as_is),
    ("groups_all", (3, 6, 9, 8), (4, 3, 2, 3), True,
     {"groups": 2, "stride": (2, 1), "padding": (1, 2), "dilation": (1, 2)}, _as_is),
    ("same_odd", (2, 3, 6, 7), (4, 3, 3, 5), True, {"padding": "same"}, _as_is),
    ("same_even_asym", (2, 3, 6, 7), (4, 3, 2, 4), True, {"padding": "same"}, _as_is),
    ("same_dilated_asym", (1, 2, 7, 6), (3, 2, 2, 2), True, {"padding": "same", "dilation": (1, 3)}, _as_is),
    ("valid", (2, 3, 6, 5), (2, 3, 3, 2), True, {"padding": "valid"}, _as_is),
    ("no_bias", (2, 3, 7, 6), (4, 3, 3, 3), False, {"padding": 1}, _as_is),
    ("empty_batch", (0, 3, 5, 5), (2, 3, 3, 3), True, {}, _as_is),
    ("all_ones_dims", (1, 1, 1, 1), (1, 1, 1, 1), True, {}, _as_is),
    ("h_is_1", (3, 2, 1, 5), (2, 2, 1, 3), True, {"padding": (0, 1)}, _as_is),
    ("kernel_1x1", (2, 5, 4, 3), (3, 5, 1, 1), True, {}, _as_is),
    ("kernel_is_input", (2, 3, 4, 5), (2, 3, 4, 5), True, {}, _as_is),
    ("stride_over_kernel", (2, 2, 9, 10), (3, 2, 2, 2), True, {"stride": 4}, _as_is),
    ("unbatched", (3, 6, 7), (4, 3, 3, 3), True, {"padding": 1}, _as_is),
    ("unbatched_same", (2, 5, 4), (3, 2, 2, 3), False, {"padding": "same"}, _as_is),
    ("noncontig", (2, 3, 7, 6), (4, 3, 3, 2), True, {"padding": (1, 0), "stride": (1, 2)}, _transposed),
    ("batch_inner", (4, 3, 7, 6), (5, 3, 3, 3), True, {"padding": 1}, _batch_inner),
    ("batch_inner_groups", (3, 4, 6, 6), (4, 2, 2, 2), True, {"groups": 2, "stride": 2}, _batch_inner),
    ("lenet_conv2", (5, 6, 12, 12), (16, 6, 5, 5), True, {}, _as_is),
    # more than 2 * cpu.GEMM_SPLIT output pixels (17 * 26 * 25 = 11050): the forward GEMM and the weight gradient's
    # run in three uneven pieces on the CPU
    ("long_gemm_pieces", (17, 1, 28, 27), (6, 1, 3, 3), True, {}, _batch_inner),
    ("long_gemm_pieces_2ch", (9, 2, 33, 31), (3, 2, 2, 2), False, {"padding": 1}, _as_is),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_conv2d_golden(case, device, rng):
    _, xs, ws, has_bias, kw, layout = case
    inputs = [rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)]
    if has_bias:
        inputs.append(rng.standard_normal(ws[0]).astype(np.float32))
    with warnings.catch_warnings():  # torch warns that 'same' with an even kernel pads a copy: so do we
        warnings.simplefilter("ignore", UserWarning)
        golden(lambda x, w, *b: conv2d(layout(x), w, *b, **kw), lambda x, w, *b: F.conv2d(x, w, *b, **kw),
               *inputs, device=device)


def test_conv2d_float64_and_weight_noncontiguous(device, rng):
    x = rng.standard_normal((2, 3, 6, 5))
    w = rng.standard_normal((4, 3, 2, 3))
    golden(lambda x, w: conv2d(x, _transposed(w), padding=1), lambda x, w: F.conv2d(x, w, padding=1), x, w,
           device=device)


def test_conv2d_integer_input(device, rng):
    x = rng.integers(-5, 5, (2, 3, 5, 6))
    w = rng.integers(-3, 3, (2, 3, 3, 2))
    ours, theirs = (lambda x, w: conv2d(x, w, stride=(2, 1))), (lambda x, w: F.conv2d(x, w, stride=(2, 1)))
    if device == "cpu":
        golden(ours, theirs, x, w, device=device)
        return
    # torch convolves integers on the CPU only: on CUDA it raises, and so must we, naming the op and the dtype
    if cuda_emulator.installed():
        pytest.skip("the reference is torch's CUDA error, and this torch has no CUDA (the CPU emulator is ours)")
    golden_error(ours, lambda x, w: theirs(x.cuda(), w.cuda()), x, w, match=r"conv2d.*int64", device=device)


def test_conv2d_two_convs_alive_at_once(device, rng):
    """Two same-shaped convs in one graph: each keeps its own saved columns until backward (scratch reuse)."""
    a, b = _normal(rng, (3, 2, 6, 5)), _normal(rng, (3, 2, 6, 5))
    w = _normal(rng, (4, 2, 3, 2))
    golden(lambda a, b, w: conv2d(a, w) * conv2d(b, w), lambda a, b, w: F.conv2d(a, w) * F.conv2d(b, w), a, b, w,
           device=device)


def test_conv_pool_conv_chain(device, rng):
    """The batch-inner view one conv returns feeds pool and the next conv; the gradients flow back through."""
    x = rng.standard_normal((6, 1, 14, 13)).astype(np.float32)
    w1 = rng.standard_normal((4, 1, 3, 3)).astype(np.float32)
    w2 = rng.standard_normal((5, 4, 2, 2)).astype(np.float32)
    b2 = rng.standard_normal(5).astype(np.float32)
    golden(lambda x, w1, w2, b2: conv2d(max_pool2d(conv2d(x, w1), 2), w2, b2),
           lambda x, w1, w2, b2: F.conv2d(F.max_pool2d(F.conv2d(x, w1), 2), w2, b2), x, w1, w2, b2,
           device=device)


@pytest.mark.parametrize("kw", [{"stride": (2, 1), "padding": (1, 0), "dilation": (1, 2), "groups": 2},
                                {"padding": "same"}], ids=["strided_grouped", "same"])
def test_conv2d_gradcheck(kw, rng):
    x = smalltrain.tensor(rng.standard_normal((2, 2, 5, 4)), requires_grad=True)
    w = smalltrain.tensor(rng.standard_normal((4, 2 // kw.get("groups", 1), 3, 2)), requires_grad=True)
    b = smalltrain.tensor(rng.standard_normal(4), requires_grad=True)
    assert gradcheck(lambda x, w, b: conv2d(x, w, b, **kw), (x, w, b))


# id, input shape, weight shape, bias shape, kwargs, exception, message regex
ERRORS = [
    ("channels", (2, 1, 28, 28), (16, 3, 3, 3), None, {}, RuntimeError,
     r"conv2d: expected input with 3 channels \(weight \[16, 3, 3, 3\], groups=1\), got input \[2, 1, 28, 28\]"),
    ("rank2", (8, 8), (4, 3, 3, 3), None, {}, RuntimeError, r"conv2d: expected 3D .* or 4D .*size: \[8, 8\]"),
    ("rank5", (1, 2, 3, 8, 8), (4, 3, 3, 3), None, {}, RuntimeError, r"conv2d: expected 3D .*\[1, 2, 3, 8, 8\]"),
    ("weight_rank", (2, 3, 8, 8), (4, 3, 3), None, {}, RuntimeError, r"conv2d: expected a 4D weight"),
    ("stride0", (2, 3, 8, 8), (4, 3, 3, 3), None, {"stride": 0}, RuntimeError, r"conv2d: non-positive stride"),
    ("stride_neg", (2, 3, 8, 8), (4, 3, 3, 3), None, {"stride": (1, -1)}, RuntimeError,
     r"conv2d: non-positive stride"),
    ("stride_len3", (2, 3, 8, 8), (4, 3, 3, 3), None, {"stride": (1, 1, 1)}, RuntimeError,
     r"conv2d: expected stride to be a single integer value or a list of 2 values"),
    ("stride_float", (2, 3, 8, 8), (4, 3, 3, 3), None, {"stride": 1.5}, TypeError, r"conv2d: stride"),
    ("padding_neg", (2, 3, 8, 8), (4, 3, 3, 3), None, {"padding": -1}, RuntimeError,
     r"conv2d: negative padding"),
    ("padding_str", (2, 3, 8, 8), (4, 3, 3, 3), None, {"padding": "full"}, RuntimeError,
     r"conv2d: Invalid padding string: 'full'"),
    ("same_strided", (2, 3, 8, 8), (4, 3, 3, 3), None, {"padding": "same", "stride": 2}, RuntimeError,
     r"conv2d: padding='same' is not supported for strided convolutions"),
    ("dilation0", (2, 3, 8, 8), (4, 3, 3, 3), None, {"dilation": 0}, RuntimeError,
     r"conv2d: non-positive dilation"),
    ("groups0", (2, 3, 8, 8), (4, 3, 3, 3), None, {"groups": 0}, RuntimeError, r"conv2d: non-positive groups"),
    ("groups_out", (2, 6, 8, 8), (5, 3, 3, 3), None, {"groups": 2}, RuntimeError,
     r"conv2d: Given groups=2, expected weight to be divisible by 2 at dimension 0.*\[5, 3, 3, 3\]"),
    ("groups_in", (2, 3, 8, 8), (4, 1, 3, 3), None, {"groups": 2}, RuntimeError,
     r"conv2d: expected input with 2 channels \(weight \[4, 1, 3, 3\], groups=2\), got input \[2, 3, 8, 8\]"),
    ("no_out_channels", (2, 3, 8, 8), (0, 3, 3, 3), None, {}, RuntimeError, r"conv2d: Given groups=1"),
    ("kernel_too_big", (1, 3, 2, 2), (4, 3, 3, 3), None, {}, RuntimeError,
     r"conv2d: Calculated padded input size per channel: \(2 x 2\). Kernel size: \(3 x 3\)"),
    ("kernel_too_big_padded", (1, 3, 2, 2), (4, 3, 5, 5), None, {"padding": 1}, RuntimeError,
     r"padded input size per channel: \(4 x 4\). Kernel size: \(5 x 5\)"),
    ("dilated_too_big", (1, 3, 5, 5), (4, 3, 3, 3), None, {"dilation": 3}, RuntimeError,
     r"Kernel size: \(7 x 7\)"),
    ("bias_shape", (2, 3, 8, 8), (4, 3, 3, 3), (3,), {}, RuntimeError,
     r"conv2d: expected bias to be 1-dimensional with 4 elements.*got bias of size \[3\]"),
    ("bias_2d", (2, 3, 8, 8), (4, 3, 3, 3), (4, 1), {}, RuntimeError, r"got bias of size \[4, 1\]"),
]


@pytest.mark.parametrize("case", ERRORS, ids=[c[0] for c in ERRORS])
def test_conv2d_errors(case, device):
    _, xs, ws, bs, kw, exc, msg = case
    x, w = np.zeros(xs, np.float32), np.zeros(ws, np.float32)
    b = None if bs is None else np.zeros(bs, np.float32)
    with pytest.raises(exc):  # the exception type torch raises for the same call
        F.conv2d(torch.tensor(x), torch.tensor(w), None if b is None else torch.tensor(b), **kw)
    args = [smalltrain.tensor(a, device=device) for a in (x, w)]
    args.append(None if b is None else smalltrain.tensor(b, device=device))
    with pytest.raises(exc, match=msg):
        conv2d(*args, **kw)


def test_conv2d_dtype_mismatch(device):
    x = np.zeros((1, 3, 5, 5))
    w = np.zeros((2, 3, 3, 3), np.float32)
    with pytest.raises(RuntimeError):
        F.conv2d(torch.tensor(x), torch.tensor(w))
    with pytest.raises(RuntimeError, match=r"conv2d: expected weight to have the input's dtype float64, got float32"):
        conv2d(smalltrain.tensor(x, device=device), smalltrain.tensor(w, device=device))

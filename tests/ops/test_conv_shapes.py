"""conv2d on CUDA across the shapes small models use, each through the path its plan chooses: input and output
channels 1..256, kernels 1..7, stride 1 and 2, no padding, k // 2 and 'same', batch 1..1024; forward, input, weight
and bias gradients against torch. A covering set (every value of each dimension meets several of the others), not
the full product. On the CPU CUDA emulator only the cases small enough to emulate in seconds run."""
import numpy as np
import pytest
import torch.nn.functional as F

import smalltrain
from smalltrain.ops.conv import conv2d
from smalltrain.testing import golden
import cuda_emulator

CHANNELS_IN = [1, 3, 16, 64, 256]
CHANNELS_OUT = [1, 6, 32, 128, 256]
BATCHES = [1, 7, 64, 1024]
EMULATED_MAX_MACS = 30_000_000


def _cases():
    cases = []
    for i in range(35):
        k = 1 + i % 7
        stride = 1 + (i // 7) % 2
        padding = [0, k // 2, "same"][i % 3]
        if padding == "same" and stride == 2:   # torch refuses 'same' for strided convolutions
            padding = k // 2
        cin, cout, n = CHANNELS_IN[i % 5], CHANNELS_OUT[(i + i // 5) % 5], BATCHES[(i + i // 7) % 4]
        # images as large as keeps a case's work (and torch's reference on the CPU) near 1e8 multiply-adds
        side = max(k, min(28, int((1e8 / (n * cin * cout * k * k)) ** 0.5)))
        cases.append(((n, cin, side, side), (cout, cin, k, k), stride, padding))
    return cases


def _macs(x_shape, w_shape, stride, padding):
    n, c, h, w = x_shape
    o, _, k, _ = w_shape
    pad = (k - 1) if padding == "same" else 2 * padding
    ho = (h + pad - k) // stride + 1
    return n * o * ho * ho * c * k * k


@pytest.mark.skipif(not smalltrain.cuda.is_available(), reason="no CUDA device")
@pytest.mark.filterwarnings("ignore:Using padding=.same. with even kernel lengths")
@pytest.mark.parametrize("x_shape,w_shape,stride,padding", _cases(), ids=lambda v: str(v).replace(" ", ""))
def test_conv2d_holds_across_shapes(x_shape, w_shape, stride, padding, rng):
    if cuda_emulator.installed() and _macs(x_shape, w_shape, stride, padding) > EMULATED_MAX_MACS:
        pytest.skip("too large to emulate in seconds: runs on a GPU")
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = (rng.standard_normal(w_shape) / np.sqrt(w_shape[1] * w_shape[2] * w_shape[3])).astype(np.float32)
    b = rng.standard_normal(w_shape[0]).astype(np.float32)
    # float32 sums of up to 1024 * 28 * 28 terms (the weight gradient) on both sides: 2e-4 of the largest value
    golden(lambda x, w, b: conv2d(x, w, b, stride=stride, padding=padding),
           lambda x, w, b: F.conv2d(x, w, b, stride=stride, padding=padding), x, w, b, device="cuda", rtol=2e-4)

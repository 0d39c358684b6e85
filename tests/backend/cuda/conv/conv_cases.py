"""Shared cases and helpers of the convolution kernel tests (tests/backend/cuda/conv/test_conv_*.py)."""
import numpy as np
import pytest

cp = pytest.importorskip("cupy")
import cuda_reference as ref  # noqa: E402

from smalltrain.backend.cuda import ops  # noqa: E402
from smalltrain.testing import assert_close  # noqa: E402

DTYPES = [np.float32, np.float64]


def g(a):
    return cp.asarray(a)


CONV_CASES = [  # x shape, out channels, kernel, stride, padding, dilation, groups, activation, bias
    ((3, 4, 11, 9), 5, (3, 3), 1, 1, 1, 1, None, True),
    ((2, 6, 10, 13), 4, (3, 2), (2, 1), (1, 0), (1, 2), 2, "relu", True),
    ((2, 3, 9, 9), 6, (5, 5), 2, 2, 1, 3, "gelu", True),
    ((1, 2, 7, 8), 3, (3, 3), 1, "same", 2, 1, "gelu_tanh", False),
    ((3, 1, 28, 28), 6, (5, 5), 1, 0, 1, 1, "relu", True),
    ((2, 3, 8, 7), 5, (2, 3), (3, 2), (1, 0, 2, 1), 1, 1, None, True),
    # the direct path's limits: 8 outputs per thread (32 * 251 of them), padding before the first image's rows,
    # more position tiles than blocks (each block sums several), MnistCnn's second layer
    ((3, 10, 12, 12), 32, (5, 5), 1, 2, 1, 1, "gelu", True),
    ((256, 1, 28, 28), 6, (5, 5), 1, 0, 1, 1, "gelu", True),
    ((4, 16, 26, 26), 32, (3, 3), 1, 0, 1, 1, "relu", True),
    # more images than the direct kernels stage one by one (8 per SM): their grid-stride layout
    ((1100, 2, 6, 5), 3, (3, 2), 1, (1, 0), 1, 1, "gelu", True),
    # past the direct kernels' C*KH*KW (the implicit GEMM's reduction slices, 16 and 32 channel tiles), and past
    # the implicit GEMM's tap table (im2col)
    ((2, 40, 9, 8), 40, (3, 3), (2, 1), (1, 2), (1, 2), 1, "gelu", True),
    ((3, 30, 7, 7), 6, (3, 3), 1, "same", 1, 1, "relu", False),
    ((1, 130, 5, 5), 3, (3, 3), 1, 0, 1, 1, None, True),
]


def _pads(padding, kernel, dilation):
    if padding == "same":
        out = []
        for k, d in zip(kernel, dilation):
            total = d * (k - 1)
            out += [total // 2, total - total // 2]
        return tuple(out)
    if isinstance(padding, int):
        return (padding,) * 4
    if len(padding) == 2:
        return (padding[0], padding[0], padding[1], padding[1])
    return tuple(padding)


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)




def _check_weight_grads(x, w, b, saved, geom, activation, rng):
    """dw and db (None without a bias) of conv2d_backward from `saved` against the float64 reference."""
    pre, _ = ref.conv2d(x, w, b, *geom)
    dout = rng.standard_normal(pre.shape).astype(x.dtype)
    _, dw, db = ops.conv2d_backward(g(dout), saved)
    _, rdw, rdb = ref.conv2d_grads(x, w, ref.act_grad(dout, pre, activation), *geom)
    assert_close(dw, rdw, ref.tol(x.dtype), name="dw")
    assert (db is None) == (b is None)
    if b is not None:
        assert_close(db, rdb, ref.tol(x.dtype), name="db")


TILE_CASES = [  # x shape, out channels, kernel size, padding, activation, bias
    ((4, 16, 26, 26), 32, 3, 0, "relu", True),        # MnistCnn's second layer (dx: 26 columns, 7 column groups)
    ((3, 1, 28, 28), 6, 5, 0, "gelu", True),          # LeNet-5's first (6 of 8 channels used)
    ((5, 6, 12, 12), 16, 5, 0, "gelu", True),         # LeNet-5's second (2 column groups)
    ((2, 3, 9, 13), 5, 3, 1, None, False),            # 13 columns: a partial column group; 5 channels
    ((2, 4, 7, 10), 3, 3, (1, 0, 2, 1), "gelu_tanh", True),   # asymmetric padding
    ((1, 2, 6, 5), 9, 5, "same", "relu", True),       # padding past the kernel's reach on the bottom/right
    ((2, 3, 11, 6), 4, 5, 4, None, True),             # padding larger than the dx correlation's own (pt < 0)
    ((2, 6, 10, 9), 18, 5, 2, "relu", True),          # 18 channels: three groups of 6 (TILE_TO6), 9 columns
]


def _force_tile_plan(tune, plan):
    """tile_conv on every case (the kernel's values, not where it pays), its plan as planned or with one choice
    forced: "4 channels" / "8 channels" per thread, "6 channels" where that leaves no dead channel (TILE_TO6),
    "row tiles" (3 rows per block: 9 of 12, 26 of 28 ... the last partial), "K channel splits"."""
    tune(tile_min_k=0)
    tune(tile_dx_min_threads_per_sm=0)
    if plan == "4 channels":
        tune(tile_to8_threads_per_sm=1 << 30)
    if plan == "8 channels":
        tune(tile_to8_threads_per_sm=0)
    if plan == "6 channels":
        tune(tile_to6_threads_per_sm=0)
    if plan == "row tiles":
        tune(tile_rows=3)
    if plan.endswith("channel splits"):
        tune(tile_splits=int(plan[0]))



"""CUDA linear layer with the bias and an activation fused: out = act(x @ W^T + b), and its backward.

Small layers (every reduction at most LINEAR.small_max_l long, every product at most LINEAR.small_max_macs
multiply-adds, at most LINEAR.small_max_blocks output tiles: LeNet-5's fully connected layers up to batch 512) run
kernels/linear.cu: the forward is one tiled GEMM with the bias and activation in its epilogue, the backward one launch
computing dx, dw and db (db as the bias column of dw), g = dout * act'(y + b) formed while the tiles load. That is 1
launch instead of 2-3 forward and 1 instead of 4-6 backward (cuBLAS adds a split-K reduction kernel to most of these
shapes), which is most of the time of a small layer on a GPU.

Larger layers go through cuBLAS: the GEMM writes y^T = W @ x^T as [F, M]; the convolution's epilogue kernels
(kernels/conv.cu, bias_act_* with N = M rows, O = F features, P = 1) then transpose it to [M, F] adding the bias and
applying the activation in one pass, and in backward turn dout into g^T = (dout * act'(y + b))^T, from which
dW = g^T @ x, dx = (g^T)^T @ W and db = the row sums of g^T.

Wide layers (at most LINEAR.wide_max_f outputs over a reduction too long for the small kernels, such as MnistCnn's
Linear(18432, 10)) run kernels/linear_wide.cu: forward one launch (blocks over chunks of the reduction; the last block
of each row group adds the chunks' partial sums in order, then the bias and activation), backward one launch (a
thread per input column writes dx and sums dw and, as column K, db). cuBLAS needs 3 launches forward and 5 backward
for these shapes.

Chains of such layers run as one launch each way: linear_chain.py.
"""
from dataclasses import dataclass

from . import cupy
from ._common import check_array, check_dtype, contiguous, device_counters, get, grad_array, i32, i64, launch, ptr
from .blas import gemm, sum_rows
from .conv import ACTIVATIONS, _sm_count, bias_act_backward, check_affine
from .tuning import Tuning

_TILE = 16            # output tile side (linear_tile.cuh ST_LT)
_THREADS = 256        # threads per block of the tile and wide kernels (ST_LTHREADS, ST_WTHREADS)
_FITS32 = 1 << 31
_WIDE_F = 16          # the most outputs the wide kernels hold (linear_wide.cu ST_WF)
_WIDE_ROWS = 32       # rows per row group of wide_fwd (ST_WROWS)
_WIDE_SLICE = 256     # reduction columns wide_fwd stages at a time (ST_WK)
_WIDE_COLS = 64       # columns per block of wide_bwd (ST_WBC)
_MAX_GRID_Y = 65535

LINEAR = Tuning(
    "linear",
    small_max_l=(2048, "the longest reduction the small tile kernels take: past it their 4 groups per block each walk "
                       "a long serial loop"),
    small_max_macs=(1 << 25, "the most multiply-adds of a layer the small tile kernels take (then cuBLAS's tiles win)"),
    small_max_blocks=(1024, "the most output tiles of the small kernels' grid (LeNet-5's first layer backward at "
                            "batch 512 has 648)"),
    wide_max_f=(_WIDE_F, "the most outputs of a layer the wide kernels take (at most ST_WF); 0 sends wide layers to "
                         "cuBLAS"),
)


@dataclass
class LinearSaved:
    """x [M, K], weight [F, K] (references), bias, y [M, F]: x @ W^T before the bias, kept when an activation needs
    it (a transposed view of the cuBLAS path's [F, M] result, or the small kernel's own [M, F])."""
    x: object
    weight: object
    bias: object
    y: object
    activation: object


def _small(reduction, blocks, m, k, f):
    """Whether the small tile kernels (kernels/linear.cu) take a direction whose longest reduction is `reduction`
    and whose grid has `blocks` tiles (see the docstring). A block's four groups split the reduction, so a short
    reduction over many tiles (MnistCnn's Linear(18432, 10) backward: 10 long, 5,761 tiles) leaves most threads idle:
    cuBLAS then."""
    return (0 < reduction <= LINEAR.small_max_l and m * k * f <= LINEAR.small_max_macs and m > 0 and k > 0 and f > 0
            and blocks <= LINEAR.small_max_blocks and (m + 1) * (k + 1) < _FITS32 and m * f < _FITS32
            and f * (k + 1) < _FITS32)


def _tiles(rows, cols):
    return -(-rows // _TILE) * -(-cols // _TILE)


def _dw_tiles(f, k, need_w, need_b):
    """Tiles of [dw | db] [F, K + 1] that linear_tile.cuh's dw_tile covers: column K (db) only without dw, no
    column K without db."""
    cols = (k if need_w else 0) + (1 if need_b else 0)
    return _tiles(f, cols) if cols else 0


def _wide(m, k, f):
    """Whether the wide kernels take an [M, K] x [F, K]^T layer (see the docstring)."""
    return (0 < f <= min(LINEAR.wide_max_f, _WIDE_F) and m > 0 and k > 0 and -(-m // _WIDE_ROWS) <= _MAX_GRID_Y
            and (m + 1) * (k + 1) < _FITS32 and f * (k + 1) < _FITS32)


def wide_chunks(m, k):
    """wide_fwd's (chunks, columns per chunk): whole ST_WK slices per chunk, as few as give the grid (chunks x row
    groups) about two blocks per SM, so that the partial sums stay small (chunks x M x F)."""
    groups, slices = -(-m // _WIDE_ROWS), -(-k // _WIDE_SLICE)
    wanted = max(1, -(-2 * _sm_count() // groups))
    kchunk = -(-slices // min(slices, wanted)) * _WIDE_SLICE
    return -(-k // kchunk), kchunk


def _tickets():
    """The current device's wide_fwd counters (one per row group), or None (see _common.device_counters)."""
    return device_counters("wide_fwd", _MAX_GRID_Y)


def linear_act_forward(x, w, b=None, activation=None):
    """act(x @ w^T + b) for x [M, K], w [F, K], b [F] or None (cupy float arrays of one dtype and device);
    activation None, 'relu', 'gelu' or 'gelu_tanh'. Returns (out [M, F], LinearSaved)."""
    op = "linear"
    check_affine(op, x, w, b, 2, activation, bias_ndim=1)
    m, k = x.shape
    f = w.shape[0]
    if w.shape[1] != k or (b is not None and b.shape[0] != f):
        raise RuntimeError(f"{op}: expected weight [F, {k}] and bias [F], got weight {list(w.shape)}"
                           f"{'' if b is None else f' and bias {list(b.shape)}'}")
    act = ACTIVATIONS[activation]
    cp = cupy()
    with x.device:
        if _small(k, _tiles(m, f), m, k, f):
            x, w = contiguous(x), contiguous(w)
            out = cp.empty((m, f), dtype=x.dtype)
            y = cp.empty((m, f), dtype=x.dtype) if act else None
            get("linear", "linear_fwd", x.dtype)((_tiles(m, f),), (_THREADS,), (x, w, ptr(b), out, ptr(y), i32(m),
                                                                               i32(k), i32(f), i32(act)))
        elif _wide(m, k, f) and (tickets := _tickets()) is not None:
            x, w = contiguous(x), contiguous(w)
            chunks, kchunk = wide_chunks(m, k)
            out = cp.empty((m, f), dtype=x.dtype)
            y = cp.empty((m, f), dtype=x.dtype) if act else None
            part = cp.empty((chunks, m, f), dtype=x.dtype)
            get("linear_wide", "wide_fwd", x.dtype)((chunks, -(-m // _WIDE_ROWS)), (_THREADS,), (
                x, w, ptr(b), out, ptr(y), part, tickets, i32(m), i32(k), i32(f), i32(act), i32(kchunk)))
        else:
            yT = gemm(w, x.T)
            out = cp.empty((m, f), dtype=x.dtype)
            launch("conv/epilogue", "bias_act_fwd", x.dtype, out.size,
                   (yT, ptr(b), out, i64(m), i64(f), i64(1), i32(act)))
            y = yT.T if act else None
    return out, LinearSaved(x, w, b, y, activation)


def linear_act_backward(dout, saved, needs=(True, True, True)):
    """(dx [M, K], dw [F, K], db [F]) from dout [M, F]; None where `needs` (input, weight, bias) says so."""
    x, w = saved.x, saved.weight
    m, f = x.shape[0], w.shape[0]
    _check_grad_output(dout, m, f, x.dtype)
    need_x, need_w = needs[0], needs[1]
    need_b = len(needs) > 2 and needs[2] and saved.bias is not None
    act = ACTIVATIONS[saved.activation]
    cp = cupy()
    with dout.device:
        dout = contiguous(dout)
        k = x.shape[1]
        if _small(max(m, f), _tiles(m, k) + _tiles(f, k + 1), m, k, f):
            return _small_backward(dout, saved, m, k, f, need_x, need_w, need_b, act)
        if _wide(m, k, f):
            return _wide_backward(dout, saved, m, k, f, need_x, need_w, need_b, act)
        y = saved.y
        gT = cp.empty((f, m), dtype=x.dtype)
        bias_act_backward(dout, None if y is None else contiguous(y.T), saved.bias, gT, m, f, 1, act)
        dx = gemm(gT.T, w) if need_x else None
        dw = gemm(gT, x, out=grad_array(w)) if need_w else None
        db = sum_rows(gT, 1) if need_b else None
    return dx, dw, db


def _check_grad_output(dout, m, f, dtype):
    op = "linear_backward"
    check_array(op, "grad_output", dout, 2)
    if tuple(dout.shape) != (m, f):
        raise RuntimeError(f"{op}: expected grad_output of shape {[m, f]}, got {list(dout.shape)}")
    check_dtype(op, "grad_output", dout, dtype)


def _small_backward(dout, saved, m, k, f, need_x, need_w, need_b, act):
    """dx, dw, db in one launch of linear_bwd (blocks for dx tiles first, then dw tiles with db as column K)."""
    cp = cupy()
    x, w, y = saved.x, saved.weight, saved.y
    dx = cp.empty((m, k), dtype=x.dtype) if need_x else None
    dw = grad_array(w) if need_w else None
    db = grad_array(saved.bias) if need_b else None
    blocks_dx = _tiles(m, k) if need_x else 0
    blocks = blocks_dx + _dw_tiles(f, k, need_w, need_b)
    if blocks == 0:
        return dx, dw, db
    ysm, ysf = _y_strides(y, x.dtype.itemsize)
    get("linear", "linear_bwd", x.dtype)((blocks,), (_THREADS,), (dout, ptr(y), ptr(saved.bias), contiguous(x),
                                                                 contiguous(w), ptr(dx), ptr(dw), ptr(db), i32(m),
                                                                 i32(k), i32(f), i32(ysm), i32(ysf), i32(act),
                                                                 i32(blocks_dx)))
    return dx, dw, db


def _y_strides(y, item):
    return (y.strides[0] // item, y.strides[1] // item) if y is not None else (0, 0)


def _wide_backward(dout, saved, m, k, f, need_x, need_w, need_b, act, conv=None):
    """dx, dw, db in one launch of wide_bwd (a thread per column of [x | 1]; column K is db). With `conv` (the
    Conv2dSaved of the convolution whose activated output x is, flattened), dx is that convolution's g [O, M*P]
    instead (see linear_backward_into_conv)."""
    cp = cupy()
    x, w, y = saved.x, saved.weight, saved.y
    p, yc, bc, actc = 0, None, None, 0
    if conv is not None:
        p, yc, bc, actc = k // conv.weight.shape[0], conv.y, conv.bias, ACTIVATIONS[conv.activation]
    dx = cp.empty((m, k) if conv is None else (k // p, m * p), dtype=x.dtype) if need_x else None
    dw = grad_array(w) if need_w else None
    db = grad_array(saved.bias) if need_b else None
    if dx is None and dw is None and db is None:
        return dx, dw, db
    ysm, ysf = _y_strides(y, x.dtype.itemsize)
    blocks = -(-(k + 1 if need_b else k) // _WIDE_COLS)
    get("linear_wide", "wide_bwd", x.dtype)((blocks,), (_THREADS,), (dout, ptr(y), ptr(saved.bias), contiguous(x),
                                                               contiguous(w), ptr(dx), ptr(dw), ptr(db), i32(m),
                                                               i32(k), i32(f), i32(ysm), i32(ysf), i32(act),
                                                               i32(p), ptr(yc), ptr(bc), i32(actc)))
    return dx, dw, db


def into_conv_needs_pre_activation(m, k, f, activation):
    """Whether linear_backward_into_conv reads the convolution's output before its activation (conv2d_forward's
    keep_pre_activation) for a [M, K] x [F, K]^T layer: not for relu on the wide path, which takes relu's derivative
    from x itself (x > 0 exactly where the pre-activation is)."""
    return activation is not None and not (activation == "relu" and _wide(m, k, f))


def linear_backward_into_conv(dout, saved, conv, needs=(True, True, True)):
    """The backward of a linear layer whose input x [N, O*P] is a convolution's activated output [N, O, P]
    flattened (conv: that convolution's Conv2dSaved): (g [O, N*P], dw, db) with g the gradient of the convolution's
    output before its activation, in the layout conv2d_backward(None, conv, g=g) takes. Wide layers (MnistCnn's
    Linear(18432, 10)) write g directly from wide_bwd, so no transpose-and-derivative kernel runs between the two
    layers; other shapes run linear_act_backward and then that kernel. g is None where needs[0] is false."""
    x = saved.x
    m, k = x.shape
    o = conv.weight.shape[0]
    n, p = conv.x_shape[0], conv.out_hw[0] * conv.out_hw[1]
    if (m, k) != (n, o * p):
        raise RuntimeError(f"linear_backward_into_conv: expected the linear layer's input to be the convolution's "
                           f"output [{n}, {o} * {p}] flattened, got {list(x.shape)}")
    need_b = len(needs) > 2 and needs[2] and saved.bias is not None
    f = saved.weight.shape[0]
    if conv.y is None and into_conv_needs_pre_activation(m, k, f, conv.activation):
        raise RuntimeError("linear_backward_into_conv: the convolution did not keep its output before the activation, "
                           "which this layer's shape needs (see into_conv_needs_pre_activation)")
    if _wide(m, k, f):
        _check_grad_output(dout, m, f, x.dtype)
        with dout.device:
            return _wide_backward(contiguous(dout), saved, m, k, f, needs[0], needs[1], need_b,
                                  ACTIVATIONS[saved.activation], conv)
    dx, dw, db = linear_act_backward(dout, saved, needs)
    g = None
    if dx is not None:
        with dx.device:
            g = cupy().empty((o, n * p), dtype=dx.dtype)
            bias_act_backward(dx, conv.y, conv.bias, g, n, o, p, ACTIVATIONS[conv.activation])
    return g, dw, db

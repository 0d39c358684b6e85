"""CUDA linear layer with the bias and an activation fused: out = act(x @ W^T + b), and its backward.

Small layers (every reduction at most SMALL_MAX_L long, every product at most SMALL_MAX_MACS multiply-adds, at
most SMALL_MAX_BLOCKS output tiles: LeNet-5's fully connected layers up to batch 512) run kernels/linear.cu: the
forward is one tiled GEMM with the bias and activation in its epilogue, the backward one launch computing dx, dw
and db (db as the bias column of dw), g = dout * act'(y + b) formed while the tiles load. That is 1 launch instead
of 2-3 forward and 1 instead of 4-6 backward (cuBLAS adds a split-K reduction kernel to most of these shapes),
which is most of the time of a small layer on a GPU.

Larger layers go through cuBLAS: the GEMM writes y^T = W @ x^T as [F, M]; the convolution's epilogue kernels
(kernels/conv.cu, bias_act_* with N = M rows, O = F features, P = 1) then transpose it to [M, F] adding the bias and
applying the activation in one pass, and in backward turn dout into g^T = (dout * act'(y + b))^T, from which
dW = g^T @ x, dx = (g^T)^T @ W and db = the row sums of g^T.

Wide layers (at most WIDE_MAX_F outputs over a reduction too long for the small kernels, such as MnistCnn's
Linear(18432, 10)) run kernels/linear.cu's wide_* kernels: forward one launch (blocks over chunks of the reduction;
the last block of each row group adds the chunks' partial sums in order, then the bias and activation), backward
one launch (a thread per input column writes dx and sums dw and, as column K, db). cuBLAS needs 3 launches
forward and 5 backward for these shapes.

Chains of small layers (up to CHAIN_MAX_LAYERS Linear + activation layers of widths up to CHAIN_MAX_WIDTH, such as
LeNet-5's 256-120-84-10 head) run as one launch forward and two backward (kernels/linear.cu, chain_*): each block
carries a few rows through every layer in shared memory, so the layers need no launch, no global round trip and
no autograd node between them; the weight gradients of all layers are one grid of the same tiles linear_bwd uses.
"""
from dataclasses import dataclass

from . import conv as conv_kernels
from . import cupy
from ._common import (SMEM_DEFAULT_BYTES, check_array, check_dtype, contiguous, device_counters, get, grad_array,
                      i32, i32s, i64, launch, launch_or_hold, ptr, run_beside, smem_optin_bytes, with_smem)
from .blas import gemm, sum_rows
from .conv import ACTIVATIONS, ProducerGrad, _sm_count, bias_act_backward, check_affine

# the small-layer kernels' limits; tests set them to 0 to compare the cuBLAS path on the same inputs
SMALL_MAX_L = 2048
SMALL_MAX_MACS = 1 << 25
SMALL_MAX_BLOCKS = 1024   # LeNet-5's first layer backward at batch 512 has 648
_TILE = 16            # output tile side of kernels/linear.cu (ST_LT)
_THREADS = 256
_FITS32 = 1 << 31

# the wide kernels' limits (kernels/linear.cu ST_WF, ST_WROWS, ST_WK, ST_WBC); tests set WIDE_MAX_F to 0 for cuBLAS
WIDE_MAX_F = 16
_WIDE_ROWS = 32
_WIDE_SLICE = 256
_WIDE_COLS = 64
_MAX_GRID_Y = 65535

# the chain kernels' limits (kernels/linear.cu ST_CMAX, and what keeps a chain cheaper than its layers: every block
# reads all the weights, so blocks x weights is bounded); tests set CHAIN_MAX_LAYERS to 0 to compare the layers
CHAIN_MAX_LAYERS = 4
CHAIN_MAX_WIDTH = 1024
CHAIN_MAX_READS = 1 << 26
_CHAIN_ROWS = (1, 2, 4, 8)   # rows per block the chain kernels are compiled for
_CHAIN_THREADS = 512
_SMEM_BYTES = SMEM_DEFAULT_BYTES
# the chain's backward copies the weights it reads into shared memory first (chain_bwd_staged) where they fit the
# block's opt-in shared memory; tests turn it off for the unstaged kernel
CHAIN_STAGE = True
# the chain's backward writes a pooled convolution's g where its input is that one's pooled output flattened
# (chain_into_pooled_ok; with conv.INTO_POOLED): off, the convolution's own pooling backward kernel runs instead
# (benchmarks: that hand-off timed alone)
CHAIN_INTO_POOLED = True
# ... where the chain's backward takes at most this many rows per block (chain_rows): its blocks, one per SM, run
# the hand-off's epilogue row after row. H100, LeNet-5's captured step (twentieth session, two calls, us with / without
# it): b64, 1 row per block, 85.3 / 85.2 against 86.0 / 89.5 and 87.4 / 89.9 against 89.4 / 90.3; b512, 4 rows,
# 169.9 / 171.2 against 165.4 / 165.8 and 166.4 / 162.5 against 160.0 / 158.5 (ncu: chain_bwd_staged 15.2 -> 22.8
# us, the pooling backward kernel it saves 5.4). Tests raise it for the 4-row case
CHAIN_INTO_POOLED_MAX_ROWS = 1
# chain_wgrad on the side stream, joined at the end of the backward pass (_common.run_beside's defer), where the
# engine allows it (linear_chain_backward's wgrad_beside): beside the convolutions' backward after it. H100,
# twenty-first session, LeNet-5's captured step, two rounds, us (both deferred joins against neither): b64 83.2 /
# 82.5 against 86.7 / 88.7; b512 166.1 / 166.2 against 162.5 / 163.9, but 155.5 / 155.4 with the second
# convolution's weight gradient beside too (conv.WGRAD_BESIDE_MAX_OUTPUTS, now its default)
CHAIN_WGRAD_BESIDE = True


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
    """Whether kernels/linear.cu takes a direction whose longest reduction is `reduction` and whose grid has
    `blocks` tiles (see the docstring). A block's four groups split the reduction, so a short reduction over many
    tiles (MnistCnn's Linear(18432, 10) backward: 10 long, 5,761 tiles) leaves most threads idle: cuBLAS then."""
    return (0 < reduction <= SMALL_MAX_L and m * k * f <= SMALL_MAX_MACS and m > 0 and k > 0 and f > 0
            and blocks <= SMALL_MAX_BLOCKS and (m + 1) * (k + 1) < _FITS32 and m * f < _FITS32
            and f * (k + 1) < _FITS32)


def _tiles(rows, cols):
    return -(-rows // _TILE) * -(-cols // _TILE)


def _dw_tiles(f, k, need_w, need_b):
    """Tiles of [dw | db] [F, K + 1] that kernels/linear.cu's dw_tile covers: column K (db) only without dw, no
    column K without db."""
    cols = (k if need_w else 0) + (1 if need_b else 0)
    return _tiles(f, cols) if cols else 0


def _wide(m, k, f):
    """Whether the wide kernels take an [M, K] x [F, K]^T layer (see the docstring)."""
    return (0 < f <= WIDE_MAX_F and m > 0 and k > 0 and -(-m // _WIDE_ROWS) <= _MAX_GRID_Y
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
            get("linear", "wide_fwd", x.dtype)((chunks, -(-m // _WIDE_ROWS)), (_THREADS,), (
                x, w, ptr(b), out, ptr(y), part, tickets, i32(m), i32(k), i32(f), i32(act), i32(kchunk)))
        else:
            yT = gemm(w, x.T)
            out = cp.empty((m, f), dtype=x.dtype)
            launch("conv", "bias_act_fwd", x.dtype, out.size, (yT, ptr(b), out, i64(m), i64(f), i64(1), i32(act)))
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
    get("linear", "wide_bwd", x.dtype)((blocks,), (_THREADS,), (dout, ptr(y), ptr(saved.bias), contiguous(x),
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


@dataclass
class ChainSaved:
    """What a chain's backward reads: the input x [M, d0], per layer its weight, bias, activation code, z (the
    pre-activation with the bias, where an activation needs it) and h (its output; the input of the next layer)."""
    x: object
    weights: list
    biases: list
    acts: list
    z: list
    h: list


def chain_rows(m, widths, itemsize):
    """Rows per block for a chain of these widths [d0, ..., dL] over m rows, or None where the chain kernels do not
    take it: 2..CHAIN_MAX_LAYERS layers, widths 1..CHAIN_MAX_WIDTH, m >= 1, the rows' two [R][WMAX] buffers in
    shared memory and blocks x weights <= CHAIN_MAX_READS. R: the fewest rows that leave at most one block per SM
    (each block reads every weight once, whatever its rows)."""
    layers = len(widths) - 1
    if not (2 <= layers <= CHAIN_MAX_LAYERS and m >= 1 and all(1 <= d <= CHAIN_MAX_WIDTH for d in widths)):
        return None
    wmax = max(widths)
    fitting = [r for r in _CHAIN_ROWS if _chain_smem(r, widths, itemsize) <= _SMEM_BYTES]
    if not fitting or m * wmax >= _FITS32:
        return None
    rows = next((r for r in fitting if -(-m // r) <= _sm_count()), fitting[-1])
    weights = sum(widths[i] * widths[i + 1] for i in range(layers))
    return rows if -(-m // rows) * weights <= CHAIN_MAX_READS else None


def _chain_smem(rows, widths, itemsize):
    return 2 * rows * max(widths) * itemsize   # the chain kernels' two [R][WMAX] row buffers


def _chain_staged_smem(rows, widths, itemsize, need_x):
    """chain_bwd_staged's shared memory: the row buffers, then the weights it reads (the first layer's only for
    dx), last layer first, each from a 16-byte boundary (linear.cu chain_weight_slots)."""
    per16 = 16 // itemsize
    total = 2 * rows * max(widths)
    for i in range(len(widths) - 2, -1 if need_x else 0, -1):
        total = -(-total // per16) * per16 + widths[i] * widths[i + 1]
    return total * itemsize


def _chain_bwd_kernel(rows, widths, itemsize, need_x, optin):
    """(kernel name, shared memory) of the chain's backward: chain_bwd_staged where CHAIN_STAGE is on and its
    shared memory fits `optin` bytes (LeNet-5's head in float32: 170 KiB at 4 rows), else chain_bwd_rows."""
    staged = _chain_staged_smem(rows, widths, itemsize, need_x)
    if CHAIN_STAGE and staged <= optin:
        return f"chain_bwd_staged_r{rows}", staged
    return f"chain_bwd_rows_r{rows}", _chain_smem(rows, widths, itemsize)


def _padded(values, fill):
    return list(values) + [fill] * (CHAIN_MAX_LAYERS - len(values))


def _width_args(widths):
    """d0 .. d4 as the kernels take them (0 past the chain's last layer)."""
    return i32s(tuple(widths) + (0,) * (CHAIN_MAX_LAYERS + 1 - len(widths)))


def _chain_params(ws, bs, zs, hs, widths, acts):
    """The kernels' fixed parameter list (ST_CHAIN_PARAMS): 4 weights, biases, z, h; 5 widths; 4 activations."""
    return (tuple(ptr(a) for a in _padded(ws, None) + _padded(bs, None) + _padded(zs, None) + _padded(hs, None))
            + _width_args(widths) + i32s(tuple(_padded(acts, 0))))


def linear_chain_forward(x, layers, save=True, hold=False):
    """act_L(... act_1(x @ w_1^T + b_1) ...) for x [M, d0] and layers [(w [d_{l+1}, d_l], b [d_{l+1}] or None,
    activation), ...] (cupy float arrays of one dtype and device); the chain must fit (chain_rows). save: keep
    what the backward reads. hold: the launch may be held back for the op after it (_common.launch_or_hold; the
    caller then ties the output to it, held.mark): a cross-entropy of the output then runs in its epilogue
    (chain_fwd_ce). Returns (out [M, dL], ChainSaved or None)."""
    op = "linear_chain"
    widths = [x.shape[1] if x.ndim == 2 else -1]
    for i, (w, b, activation) in enumerate(layers):
        check_affine(op, x, w, b, 2, activation, bias_ndim=1)
        if w.shape[1] != widths[-1] or (b is not None and b.shape[0] != w.shape[0]):
            raise RuntimeError(f"{op}: layer {i} expected weight [F, {widths[-1]}] and bias [F], got weight "
                               f"{list(w.shape)}{'' if b is None else f' and bias {list(b.shape)}'}")
        widths.append(w.shape[0])
    m = x.shape[0]
    rows = chain_rows(m, widths, x.dtype.itemsize)
    if rows is None:
        raise RuntimeError(f"{op}: a chain of widths {widths} over {m} rows does not fit the chain kernels "
                           f"(see chain_rows); run its layers one by one")
    cp = cupy()
    acts = [ACTIVATIONS[a] for _, _, a in layers]
    with x.device:
        x = contiguous(x)
        ws = [contiguous(w) for w, _, _ in layers]
        bs = [None if b is None else contiguous(b) for _, b, _ in layers]
        out = cp.empty((m, widths[-1]), dtype=x.dtype)
        zs = [cp.empty((m, widths[i + 1]), dtype=x.dtype) if save and acts[i] else None for i in range(len(layers))]
        hs = [cp.empty((m, widths[i + 1]), dtype=x.dtype) if save else None for i in range(len(layers) - 1)] + [out]
        blocks, smem = -(-m // rows), _chain_smem(rows, widths, x.dtype.itemsize)
        args = (x,) + _chain_params(ws, bs, zs, hs, widths, acts) + (i32(m), i32(len(layers)), i32(max(widths)))

        def launch(ce):
            get("linear", f"chain_fwd_r{rows}" if ce is None else f"chain_fwd_ce_r{rows}", x.dtype)(
                (blocks,), (_CHAIN_THREADS,), args + (ce or ()), shared_mem=smem)
        launch_or_hold(hold, out, launch, blocks, x.dtype, x.device)
    return out, (ChainSaved(x, ws, bs, acts, zs, hs) if save else None)


def chain_into_pooled_ok(saved, into):
    """Whether linear_chain_backward can write dx as `into`'s g: `into` (a Conv2dSaved) pooled in its epilogue
    (conv2d_forward's pool, tile_conv_pool) an output whose flattened rows are the chain's input and
    conv.producer_output allows it; the g's indices fit 32 bits; conv.INTO_PRODUCER and CHAIN_INTO_POOLED on; the
    chain's backward at most CHAIN_INTO_POOLED_MAX_ROWS rows per block."""
    if not (conv_kernels.INTO_PRODUCER and CHAIN_INTO_POOLED) or into is None or into.pool is None:
        return False
    x = saved.x
    rows = chain_rows(x.shape[0], [x.shape[1]] + [w.shape[0] for w in saved.weights], x.dtype.itemsize)
    if rows is None or rows > CHAIN_INTO_POOLED_MAX_ROWS:
        return False
    made = conv_kernels.producer_output(into, saved.x.dtype)
    return made is not None and (made[0], made[1] * made[2] * made[3]) == tuple(saved.x.shape) \
        and 4 * saved.x.size < _FITS32


def linear_chain_backward(dout, saved, need_x=True, needs=None, into=None, wgrad_beside=False):
    """(dx [M, d0] or None, [(dw_l, db_l), ...]) from dout [M, dL]; needs: per layer (weight, bias) flags (default
    all), a gradient is None where its flag is off or the layer has no bias. into: the Conv2dSaved of the
    convolution whose pooled output is x flattened; where chain_into_pooled_ok, dx is returned as a ProducerGrad
    instead, that convolution's g [C, M*4*P] through its pooling's and activation's backward (linear.cu
    chain_dx_unpooled).
    wgrad_beside: the weight gradients may be made beside the rest of the backward pass, joined by the pass
    (autograd.engine.takes_plainly said so; with CHAIN_WGRAD_BESIDE): chain_wgrad goes on the side stream."""
    op = "linear_chain_backward"
    x, ws, bs = saved.x, saved.weights, saved.biases
    m, layers = x.shape[0], len(ws)
    widths = [x.shape[1]] + [w.shape[0] for w in ws]
    check_array(op, "grad_output", dout, 2)
    if tuple(dout.shape) != (m, widths[-1]):
        raise RuntimeError(f"{op}: expected grad_output of shape {[m, widths[-1]]}, got {list(dout.shape)}")
    check_dtype(op, "grad_output", dout, x.dtype)
    needs = [(True, True)] * layers if needs is None else list(needs)
    cp = cupy()
    rows = chain_rows(m, widths, x.dtype.itemsize)
    pooled = need_x and chain_into_pooled_ok(saved, into)
    pool_args = (ptr(None),) * 3 + i32s((0, 0, 0))
    with dout.device:
        dout = contiguous(dout)
        dx = cp.empty((m, widths[0]), dtype=x.dtype) if need_x and not pooled else None
        if pooled:
            _, c, ph, pw = into.pool[0].shape
            act = ACTIVATIONS[into.activation]
            dx = cp.empty((c, m * 4 * ph * pw), dtype=x.dtype)
            pool_args = (into.pool[0], ptr(into.y if act else None), ptr(into.bias if act else None)) + i32s(
                (act, c, pw))
        gs = [cp.empty((m, widths[i + 1]), dtype=x.dtype) for i in range(layers)]
        name, smem = _chain_bwd_kernel(rows, widths, x.dtype.itemsize, need_x, smem_optin_bytes())
        with_smem(get("linear", name, x.dtype), smem)(
            (-(-m // rows),), (_CHAIN_THREADS,), (dout,) + _chain_params(ws, bs, saved.z, saved.h, widths, saved.acts)
            + tuple(ptr(g) for g in _padded(gs, None)) + (ptr(dx), i32(m), i32(layers), i32(max(widths)))
            + pool_args, shared_mem=smem)
        grads, starts, total = [], [], 0
        for i in range(layers):
            need_w, need_b = needs[i][0], needs[i][1] and bs[i] is not None
            grads.append((grad_array(ws[i]) if need_w else None, grad_array(bs[i]) if need_b else None))
            starts.append(total)
            total += _dw_tiles(widths[i + 1], widths[i], need_w, need_b)
        if total:
            ins = [x] + saved.h[:-1]
            starts = _padded(starts[1:], total)[:CHAIN_MAX_LAYERS - 1]
            dws, dbs = [dw for dw, _ in grads], [db for _, db in grads]
            beside = wgrad_beside and CHAIN_WGRAD_BESIDE

            def weight_grads():
                get("linear", "chain_wgrad", x.dtype)(
                    (total,), (_THREADS,), tuple(ptr(a) for a in _padded(gs, None) + _padded(ins, None)
                                                  + _padded(dws, None) + _padded(dbs, None))
                    + _width_args(widths) + i32s(tuple(starts)) + (i32(m),))

            run_beside(weight_grads, lambda: None, beside, defer=True)
    return (ProducerGrad(dx) if pooled else dx), grads

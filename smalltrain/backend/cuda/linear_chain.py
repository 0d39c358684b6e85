"""Chains of small linear layers, act_L(... act_1(x @ w_1^T + b_1) ...), as one launch forward and two backward
(kernels/linear_chain.cu, chain_*): up to CHAIN.max_layers Linear + activation layers of widths up to CHAIN.max_width,
such as LeNet-5's 256-120-84-10 head. Each block carries a few rows through every layer in shared memory, so the
layers need no launch, no global round trip and no autograd node between them; the weight gradients of all layers
are one grid of the tiles linear.py's small layers use.
"""
from dataclasses import dataclass

from . import cupy
from ._common import (SMEM_DEFAULT_BYTES, check_array, check_dtype, contiguous, get, grad_array, i32, i32s,
                      launch_or_hold, ptr, run_beside, smem_optin_bytes, with_smem)
from .conv import ACTIVATIONS, ProducerGrad, _sm_count, check_affine, producer_output
from .linear import _FITS32, _THREADS, _dw_tiles
from .tuning import Tuning

_SLOTS = 4                   # the layers the kernels' fixed parameter lists hold (linear_chain.cu ST_CMAX)
_CHAIN_ROWS = (1, 2, 4, 8)   # rows per block the chain kernels are compiled for
_CHAIN_THREADS = 512         # (ST_CTHREADS)
_SMEM_BYTES = SMEM_DEFAULT_BYTES

CHAIN = Tuning(
    "linear_chain",
    max_layers=(_SLOTS, "the most layers one chain takes (at most ST_CMAX; ops/matmul.py splits longer runs); 0 "
                        "runs every layer on its own"),
    max_width=(1024, "the widest layer a chain takes"),
    max_reads=(1 << 26, "the most blocks x weights a chain reads: every block reads all the weights, so past this the "
                        "layers one by one are cheaper"),
    staged_max_smem=(None, "the most shared memory chain_bwd_staged may take (None: the device's opt-in maximum); a "
                           "chain whose weights do not fit runs chain_bwd_rows"),
    into_pooled_max_rows=(1, "the most rows per block with which the chain's backward writes a pooled convolution's "
                             "g: its blocks, one per SM, run that epilogue row after row, and at 4 rows that costs "
                             "more than the pooling's backward kernel it saves"),
)


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
    take it: 2..CHAIN.max_layers layers, widths 1..CHAIN.max_width, m >= 1, the rows' two [R][WMAX] buffers in
    shared memory and blocks x weights <= CHAIN.max_reads. R: the fewest rows that leave at most one block per SM
    (each block reads every weight once, whatever its rows)."""
    layers = len(widths) - 1
    if not (2 <= layers <= min(CHAIN.max_layers, _SLOTS) and m >= 1
            and all(1 <= d <= CHAIN.max_width for d in widths)):
        return None
    wmax = max(widths)
    fitting = [r for r in _CHAIN_ROWS if _chain_smem(r, widths, itemsize) <= _SMEM_BYTES]
    if not fitting or m * wmax >= _FITS32:
        return None
    rows = next((r for r in fitting if -(-m // r) <= _sm_count()), fitting[-1])
    weights = sum(widths[i] * widths[i + 1] for i in range(layers))
    return rows if -(-m // rows) * weights <= CHAIN.max_reads else None


def _chain_smem(rows, widths, itemsize):
    return 2 * rows * max(widths) * itemsize   # the chain kernels' two [R][WMAX] row buffers


def _chain_staged_smem(rows, widths, itemsize, need_x):
    """chain_bwd_staged's shared memory: the row buffers, then the weights it reads (the first layer's only for
    dx), last layer first, each from a 16-byte boundary (linear_chain.cu chain_weight_slots)."""
    per16 = 16 // itemsize
    total = 2 * rows * max(widths)
    for i in range(len(widths) - 2, -1 if need_x else 0, -1):
        total = -(-total // per16) * per16 + widths[i] * widths[i + 1]
    return total * itemsize


def _chain_bwd_kernel(rows, widths, itemsize, need_x):
    """(kernel name, shared memory) of the chain's backward: chain_bwd_staged where its shared memory fits
    CHAIN.staged_max_smem (by default the block's opt-in maximum: LeNet-5's head in float32 takes 170 KiB at 4 rows),
    else chain_bwd_rows."""
    staged = _chain_staged_smem(rows, widths, itemsize, need_x)
    limit = CHAIN.staged_max_smem
    if staged <= (smem_optin_bytes() if limit is None else limit):
        return f"chain_bwd_staged_r{rows}", staged
    return f"chain_bwd_rows_r{rows}", _chain_smem(rows, widths, itemsize)


def _padded(values, fill):
    return list(values) + [fill] * (_SLOTS - len(values))


def _width_args(widths):
    """d0 .. d4 as the kernels take them (0 past the chain's last layer)."""
    return i32s(tuple(widths) + (0,) * (_SLOTS + 1 - len(widths)))


def _chain_params(ws, bs, zs, hs, widths, acts):
    """The kernels' fixed parameter list (ST_CHAIN_PARAMS): 4 weights, biases, z, h; 5 widths; 4 activations."""
    return (tuple(ptr(a) for a in _padded(ws, None) + _padded(bs, None) + _padded(zs, None) + _padded(hs, None))
            + _width_args(widths) + i32s(tuple(_padded(acts, 0))))


def linear_chain_forward(x, layers, save=True, hold=False):
    """act_L(... act_1(x @ w_1^T + b_1) ...) for x [M, d0] and layers [(w [d_{l+1}, d_l], b [d_{l+1}] or None,
    activation), ...] (cupy float arrays of one dtype and device); the chain must fit (chain_rows). save: keep
    what the backward reads. hold: the launch may be held back for the op after it (_common.launch_or_hold; the
    caller then ties the output to it, autograd.held.mark): a cross-entropy of the output then runs in its epilogue
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
            get("linear_chain", f"chain_fwd_r{rows}" if ce is None else f"chain_fwd_ce_r{rows}", x.dtype)(
                (blocks,), (_CHAIN_THREADS,), args + (ce or ()), shared_mem=smem)
        launch_or_hold(hold, out, launch, blocks, x.dtype, x.device)
    return out, (ChainSaved(x, ws, bs, acts, zs, hs) if save else None)


def chain_into_pooled_ok(saved, into):
    """Whether linear_chain_backward can write dx as `into`'s g: `into` (a Conv2dSaved) pooled in its epilogue
    (conv2d_forward's pool, tile_conv_pool) an output whose flattened rows are the chain's input and
    conv.producer_output allows it; the g's indices fit 32 bits; the chain's backward at most
    CHAIN.into_pooled_max_rows rows per block."""
    if into is None or into.pool is None:
        return False
    x = saved.x
    rows = chain_rows(x.shape[0], [x.shape[1]] + [w.shape[0] for w in saved.weights], x.dtype.itemsize)
    if rows is None or rows > CHAIN.into_pooled_max_rows:
        return False
    made = producer_output(into, saved.x.dtype)
    return made is not None and (made[0], made[1] * made[2] * made[3]) == tuple(saved.x.shape) \
        and 4 * saved.x.size < _FITS32


def linear_chain_backward(dout, saved, need_x=True, needs=None, into=None, wgrad_beside=False):
    """(dx [M, d0] or None, [(dw_l, db_l), ...]) from dout [M, dL]; needs: per layer (weight, bias) flags (default
    all), a gradient is None where its flag is off or the layer has no bias. into: the Conv2dSaved of the
    convolution whose pooled output is x flattened; where chain_into_pooled_ok, dx is returned as a ProducerGrad
    instead, that convolution's g [C, M*4*P] through its pooling's and activation's backward (linear_chain.cu
    chain_dx_unpooled).
    wgrad_beside: the weight gradients may be made beside the rest of the backward pass, joined by the pass
    (autograd.engine.takes_plainly said so): chain_wgrad then goes on a side stream, beside the convolutions'
    backward after it."""
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
        name, smem = _chain_bwd_kernel(rows, widths, x.dtype.itemsize, need_x)
        with_smem(get("linear_chain", name, x.dtype), smem)(
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
            starts = _padded(starts[1:], total)[:_SLOTS - 1]
            dws, dbs = [dw for dw, _ in grads], [db for _, db in grads]

            def weight_grads():
                get("linear_chain", "chain_wgrad", x.dtype)(
                    (total,), (_THREADS,), tuple(ptr(a) for a in _padded(gs, None) + _padded(ins, None)
                                                  + _padded(dws, None) + _padded(dbs, None))
                    + _width_args(widths) + i32s(tuple(starts)) + (i32(m),))

            run_beside(weight_grads, lambda: None, wgrad_beside, defer=True)
    return (ProducerGrad(dx) if pooled else dx), grads

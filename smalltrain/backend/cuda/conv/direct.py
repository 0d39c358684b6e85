"""The direct kernels (kernels/conv/direct.cu) for small groups == 1 convolutions (C*KH*KW up to
CONV.direct_max_k, LeNet-5's sizes): the forward as one kernel with bias and activation fused (direct_fwd), the
input gradient as one gather (direct_dx), the weight and bias gradients from x as position tiles (wgrad_partial)
summed by wgrad_reduce. No cols matrix is written. Layouts: x [N, C, H, W], w [O, C, KH, KW], g [O, N*OH*OW]."""
from .. import cupy
from .._common import get, i32, ptr
from .epilogue import reduce_partials
from .plan import CONV, FITS32, SMEM_BYTES, int_args, sm_count

FAMILY = "conv/direct"
_DIRECT_OB = (2, 8)           # output channels per thread direct_fwd is compiled for (ST_DIRECT)
_WGRAD_R = (1, 2, 4, 8)       # outputs per thread wgrad_partial is compiled for (ST_WGRAD)
_MAX_SPLITS = 4               # threads summing one staged item's channels (direct_fwd's CS)
_THREADS = 256                # direct_fwd's and direct_dx's blocks
_WGRAD_THREADS = 1024         # wgrad_partial's threads per block at most (its __launch_bounds__)


def direct_wgrad_ok(x_shape, w_shape, out_hw, groups, itemsize):
    """Whether wgrad_partial takes this convolution's dw and db (from x): groups == 1, a small C*KH*KW, at most
    CONV.direct_max_macs multiply-adds, its tiles in shared memory, a non-empty batch and 32-bit indices."""
    n, c, h, w = x_shape
    o, cg, kh, kw = w_shape
    k, np_ = cg * kh * kw, n * out_hw[0] * out_hw[1]
    return (groups == 1 and 0 < k <= CONV.direct_max_k and np_ > 0 and o * k * np_ <= CONV.direct_max_macs
            and o * (k + 1) <= _WGRAD_THREADS * _WGRAD_R[-1]
            and n * c * h * w < FITS32 and o * np_ < FITS32 and _wgrad_tile_positions(o, k, itemsize) is not None)


def direct_ok(x_shape, w_shape, out_hw, groups, itemsize):
    """Whether direct_fwd takes this forward: the weight gradient's rule (direct_wgrad_ok) and the forward's
    weights in shared memory."""
    o, cg, kh, kw = w_shape
    return (direct_wgrad_ok(x_shape, w_shape, out_hw, groups, itemsize)
            and _direct_smem(o, cg * kh * kw, itemsize) <= SMEM_BYTES)


def _direct_ob(positions, o):
    """Channels per thread of the direct kernels (o output channels of direct_fwd, or input channels of direct_dx,
    over `positions` positions): 8, unless that leaves fewer than ~2 threads per core of the GPU (LeNet-5's second
    layer at batch 64: 8,192 threads, latency-bound), then 2."""
    return 8 if positions * -(-o // 8) >= 2 * 128 * sm_count() else 2


def _direct_smem(o, k, itemsize, ob=_DIRECT_OB[-1]):
    return k * -(-o // ob) * ob * itemsize   # the weights as [K][O rounded up to ob]


def _direct_grid(n, items, weight_bytes, image_bytes, split=None):
    """(grid, parts per image, splits, shared memory) of a direct kernel over n images of `items` thread items
    each.

    Staged (parts >= 1, see direct.cu) when the image's input fits in shared memory beside the weights and the batch
    is at most ~8 images per SM: parts blocks per image, enough for ~4 blocks per SM but no more than the image's
    items fill. Else parts = 0 and a grid-stride loop over the batch (each block stages only the weights, which a
    block per image would restage thousands of times for a large evaluation batch).

    split = (summed channels, outputs per item, itemsize), for direct_fwd only: a staged launch that would leave
    fewer than 8 warps per SM sums each item's input channels over up to _MAX_SPLITS threads (a power of two, up to
    ~32 warps per SM), the partial sums meeting in shared memory after the image. Not for direct_dx (the same split
    over output channels made it slower) nor for filled launches."""
    if weight_bytes + image_bytes <= SMEM_BYTES and n <= 8 * sm_count():
        splits, red = 1, 0
        if split is not None and n * items < 256 * sm_count():
            reduced, per_thread, itemsize = split
            splits = min(_MAX_SPLITS, reduced, (1024 * sm_count()) // (n * items))
            splits = 1 << (splits.bit_length() - 1)   # a power of two, so that it divides the 256 threads
            red = 256 * per_thread * itemsize if splits > 1 else 0
            if weight_bytes + image_bytes + red > SMEM_BYTES:
                splits, red = 1, 0
        parts = max(1, min(-(-4 * sm_count() // n), -(-items // (256 // splits))))
        return n * parts, parts, splits, weight_bytes + image_bytes + red
    return min(-(-(n * items) // 256), 8 * sm_count()), 0, 1, weight_bytes


def direct_forward(x, w, b, out, y, out_hw, stride, pads, dilation, act):
    """out [N, O, OH, OW] = act(conv(x, w) + b) by direct_fwd, and y [O, N*OH*OW] (the sum before the bias) where
    given."""
    n = x.shape[0]
    o, cg, kh, kw = w.shape
    p = out_hw[0] * out_hw[1]
    ob = _direct_ob(n * p, o)
    weights = _direct_smem(o, cg * kh * kw, x.dtype.itemsize, ob)
    image = cg * x.shape[2] * x.shape[3] * x.dtype.itemsize
    grid, parts, splits, smem = _direct_grid(n, -(-o // ob) * p, weights, image, (cg, ob, x.dtype.itemsize))
    get(FAMILY, f"direct_fwd_ob{ob}", x.dtype)(
        (grid,), (_THREADS,), (x, w, ptr(b), out, ptr(y)) + int_args(x.shape, w.shape, out_hw, stride, pads, dilation)
        + (i32(act), i32(parts), i32(splits)),
        shared_mem=smem)


def _dx_smem(o, c, kk, itemsize, cb):
    return o * kk * -(-c // cb) * cb * itemsize   # the weights as [O*KH*KW][C rounded up to cb]


def _direct_dx_cb(x_shape, w_shape, groups, itemsize):
    """Input channels per thread of direct_dx for this convolution, or None where the GEMM + col2im path takes
    dx: groups > 1, C*KH*KW above CONV.direct_max_k, more than CONV.direct_dx_max_macs multiply-adds, a weight table
    too large for shared memory, or fewer than CONV.direct_dx_min_threads_per_sm threads per SM (a latency-bound
    gather)."""
    n, c, h, wd = x_shape
    o, _, kh, kw = w_shape
    cb = _direct_ob(n * h * wd, c)   # by the forward's rule
    if (groups != 1 or not 0 < c * kh * kw <= CONV.direct_max_k
            or n * c * h * wd * o * kh * kw > CONV.direct_dx_max_macs
            or _dx_smem(o, c, kh * kw, itemsize, cb) > SMEM_BYTES or n * c * h * wd >= FITS32
            or n * h * wd * -(-c // cb) < CONV.direct_dx_min_threads_per_sm * sm_count()):
        return None
    return cb


def direct_dx(g, saved):
    """dx [N, C, H, W] from g [O, N*OH*OW] by direct_dx, or None where that kernel does not take the convolution
    (_direct_dx_cb): the caller then takes the GEMM + col2im path."""
    n, c, h, wd = saved.x_shape
    o, _, kh, kw = saved.weight.shape
    cb = _direct_dx_cb(saved.x_shape, saved.weight.shape, saved.groups, g.dtype.itemsize)
    if cb is None or g.size >= FITS32:
        return None
    smem = _dx_smem(o, c, kh * kw, g.dtype.itemsize, cb)
    dx = cupy().empty(tuple(saved.x_shape), dtype=g.dtype)
    if dx.size == 0:
        return dx
    p = saved.out_hw[0] * saved.out_hw[1]
    grid, parts, _, smem = _direct_grid(n, -(-c // cb) * h * wd, smem, o * p * g.dtype.itemsize)
    get(FAMILY, f"direct_dx_cb{cb}", g.dtype)(
        (grid,), (_THREADS,), (g, saved.weight, dx) + int_args(saved.x_shape, saved.weight.shape, saved.out_hw,
                                                                saved.stride, saved.pads, saved.dilation)
        + (i32(parts),),
        shared_mem=smem)
    return dx


def _wgrad_tile_positions(o, k, itemsize):
    """Positions per wgrad_partial tile: the largest of 128, 64, 32 whose shared memory fits in one block."""
    for tq in (128, 64, 32):
        if _wgrad_smem(o, k, tq, itemsize) <= SMEM_BYTES:
            return tq
    return None


def _wgrad_smem(o, k, tq, itemsize):
    return (o + k) * (tq + 1) * itemsize + (3 * k + 3 * tq) * 4   # g and cols tiles, then the int offset tables


def direct_weight_grad(x, g, saved, with_bias):
    """(dw [O, C, KH, KW], db [O] or None) from the input x and g [O, N*OH*OW] (the output gradient after the
    activation's derivative): wgrad_partial over S blocks of position tiles, then wgrad_reduce over the S partial
    rows in a fixed order."""
    o, cg, kh, kw = saved.weight.shape
    k, m = cg * kh * kw, o * (cg * kh * kw + 1)
    tq = _wgrad_tile_positions(o, k, g.dtype.itemsize)
    tiles = -(-g.shape[1] // tq)
    blocks = min(tiles, 4 * sm_count())
    threads = min(_WGRAD_THREADS, max(256, -(-m // 32) * 32))   # at least 256 to build the tiles
    r = next(v for v in _WGRAD_R if v * threads >= m)
    partial = cupy().empty((blocks, m), dtype=g.dtype)
    args = (x, g, partial) + int_args(x.shape, saved.weight.shape, saved.out_hw, saved.stride, saved.pads,
                                      saved.dilation) + (i32(tq), i32(with_bias))
    get(FAMILY, f"wgrad_partial_r{r}", g.dtype)((blocks,), (threads,), args,
                                                shared_mem=_wgrad_smem(o, k, tq, g.dtype.itemsize))
    return reduce_partials(partial, saved.weight, saved.bias if with_bias else None)

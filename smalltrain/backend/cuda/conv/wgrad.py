"""The weight and bias gradients from the input x the forward kept: which kernel takes them (wgrad_kernel: tile_wgrad
for tile_conv's geometry, else igemm_wgrad or the direct path's wgrad_partial, else None for cuBLAS over a cols
matrix), and tile_wgrad itself (kernels/conv/tile_wgrad.cu): persistent blocks over row tiles of g [O, N*Ho*Wo] and
x [N, C, H, W], double-buffered, into partial rows that wgrad_reduce sums."""
from ... import metadata_cache
from .. import cupy
from .._common import get, i32s
from .direct import direct_wgrad_ok
from .epilogue import reduce_partials
from .igemm import igemm_wgrad_ok, wgrad_tile
from .plan import CONV, FITS32, SMEM_BYTES, sm_count
from .tile import TILE_TW, copy_bytes, tile_geometry


def tile_wgrad_plan(saved, itemsize):
    """_tile_wgrad_plan for this convolution, cached per geometry and the SM count."""
    return _tile_wgrad_plan(tuple(saved.x_shape), tuple(saved.weight.shape), tuple(saved.out_hw),
                            tuple(saved.stride), tuple(saved.dilation), saved.groups, itemsize, sm_count())


@CONV.watch
def _clear_plans():
    _tile_wgrad_plan.cache_clear()


@metadata_cache
def _tile_wgrad_plan(x_shape, w_shape, out_hw, stride, dilation, groups, itemsize, sms):
    """(TO, TH, RS, threads, grid, shared memory, WB) of tile_wgrad for this convolution, or None where it does not
    take it (not tile_conv's geometry or kernel sizes, a block of over CONV.tile_wg_threads threads, tiles too large
    for the shared memory, 32-bit indices). TO: 8 channels per thread where that makes CONV.tile_wg_to8_threads
    threads (MnistCnn's second layer: 4 x 49), else 4. TH: the most rows whose two tile buffers fit, evened out over
    the image. RS: threads per row group, the largest divisor of TH within CONV.tile_wg_threads (LeNet-5's first
    layer: 12 of 2 x 6 threads). The grid spreads the tiles evenly over up to CONV.tile_wg_blocks_per_sm blocks per
    SM. WB: 1 with a bias thread per channel group, 0 without (the kernel's other threads sum the bias) where that
    saves a warp and every channel keeps a thread to sum it."""
    n, c, h, wd = x_shape
    o, cg, kh, kw = w_shape
    ho, wo = out_hw
    if (not tile_geometry(stride, dilation, groups, w_shape) or min(n, c, o, ho, wo) <= 0
            or n * c * h * wd >= FITS32 or o * n * ho * wo >= FITS32):
        return None
    ci = c * kh + 1
    to = 8 if -(-o // 8) * ci >= CONV.tile_wg_to8_threads else 4
    op = -(-o // to) * to
    base = op // to * ci
    if base > CONV.tile_wg_threads:
        return None
    gw = -(-wo // TILE_TW) * TILE_TW

    def buffers(t):   # two tiles of g [OP][t][GW] and x [C][t + KS - 1][GW + 4]
        return 2 * (op * t * gw + c * (t + kh - 1) * (gw + 4)) * itemsize
    fits = [t for t in range(1, ho + 1) if buffers(t) <= SMEM_BYTES]
    if CONV.tile_wg_rows is not None:
        fits = [t for t in fits if t <= CONV.tile_wg_rows]
    if not fits:
        return None
    th = fits[-1] if CONV.tile_wg_rows is not None else -(-ho // -(-ho // fits[-1]))
    forced = CONV.tile_wg_split
    splits = [d for d in range(1, max(th, forced or 1) + 1) if base * d <= CONV.tile_wg_threads
              and (d == 1 or base * d * to * kh * itemsize <= SMEM_BYTES)]   # the row groups' sums meet in smem
    rs = [d for d in splits if th % d == 0][-1] if forced not in splits else forced
    tiles = n * -(-ho // th)
    grid = -(-tiles // -(-tiles // (CONV.tile_wg_blocks_per_sm * sms)))
    grid = grid if CONV.tile_wg_grid is None else min(CONV.tile_wg_grid, tiles)
    if o * (cg * kh * kw + 1) * grid >= FITS32:
        return None
    red = base * rs * to * kh * itemsize if rs > 1 else 0
    spread = op // to * (ci - 1) * rs
    if -(-spread // 32) < -(-base * rs // 32) and spread >= op:
        return to, th, rs, spread, grid, max(buffers(th), red, spread * itemsize), 0
    return to, th, rs, base * rs, grid, max(buffers(th), red), 1


def tile_weight_grad(x, g, saved, with_bias, plan):
    """(dw, db or None) by tile_wgrad (its partial rows, one per block) and wgrad_reduce."""
    to, th, rs, threads, grid, smem, wb = plan
    n, c, h, wd = saved.x_shape
    o, _, ks, _ = saved.weight.shape
    partial = cupy().empty((grid, o * (c * ks * ks + 1)), dtype=g.dtype)
    # the rows of g (no padding) and of x (the left padding) staged 16 or 8 bytes a copy where aligned
    gb = copy_bytes(g, saved.out_hw[1], 0, (saved.out_hw[0] * saved.out_hw[1],))
    xb = copy_bytes(x, wd, saved.pads[2], (c * h * wd, h * wd))
    get("conv/tile_wgrad", f"tile_wgrad_k{ks}_to{to}", g.dtype)(
        (grid,), (threads,), (x, g, partial) + i32s((n, c, h, wd, o) + tuple(saved.out_hw) + (
            saved.pads[0], saved.pads[2], th, rs, wb, gb, xb)),
        shared_mem=smem)
    return reduce_partials(partial, saved.weight, saved.bias if with_bias else None)


def wgrad_kernel(saved, itemsize):
    """Which kernel computes dw (and db) from the input x the forward kept: 'tile' (tile_wgrad) where its plan fits,
    else 'igemm' (igemm_wgrad) where its best tile is at least CONV.igemm_wgrad_min_use used (O*(K+1) over the
    tiles' area) or wgrad_partial does not take the convolution, else 'tiled' (wgrad_partial, direct_wgrad_ok);
    None for cuBLAS over the cols matrix (kept by the forward, or made from x)."""
    if saved.x is None:
        return None
    if tile_wgrad_plan(saved, itemsize) is not None:
        return "tile"
    tiled = direct_wgrad_ok(saved.x_shape, saved.weight.shape, saved.out_hw, saved.groups, itemsize)
    if igemm_wgrad_ok(saved.x_shape, saved.weight.shape, saved.out_hw, saved.groups, saved.dilation):
        o, cg, kh, kw = saved.weight.shape
        _, use = wgrad_tile(o, cg * kh * kw + 1)
        if use >= CONV.igemm_wgrad_min_use or not tiled:
            return "igemm"
    return "tiled" if tiled else None

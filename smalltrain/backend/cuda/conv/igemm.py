"""The implicit-GEMM kernels (kernels/conv/igemm.cu) for the groups == 1 convolutions the direct and tile kernels
leave (MnistCnn's second layer's sizes): the forward (igemm_fwd, x gathered while staging, bias and activation in
the epilogue) and the weight and bias gradients (igemm_wgrad into partial rows, then wgrad_reduce). No cols matrix.
Layouts: x [N, C, H, W], w [O, C, KH, KW], g [O, N*OH*OW]."""
from .. import cupy
from .._common import get, i32, ptr
from .epilogue import reduce_partials
from .plan import CONV, FITS32, int_args, sm_count

FAMILY = "conv/igemm"
_IGEMM_BQ = {16: 256, 32: 128}   # positions per block tile for BO output channels (igemm_fwd)
_IGEMM_THREADS = 256             # igemm_fwd's blocks (ST_IGTHREADS)
_WG_TILES = ((32, 64, 4, 4), (16, 128, 4, 4), (8, 32, 2, 2))   # (BO, BK, TO, TK) igemm_wgrad is compiled for
_WGQ = 16                        # positions per slice (ST_WGQ)


def _igemm_fits(x_shape, w_shape, out_hw, groups, dilation):
    """What both implicit-GEMM kernels need: groups == 1, a non-empty output and reduction, 32-bit indices into x
    and g, and tap offsets that pack into 16 bits each."""
    n, c, h, w = x_shape
    o, cg, kh, kw = w_shape
    np_ = n * out_hw[0] * out_hw[1]
    return (groups == 1 and np_ > 0 and cg * kh * kw > 0 and n * c * h * w < FITS32 and o * np_ < FITS32
            and dilation[0] * (kh - 1) < 1 << 15 and dilation[1] * (kw - 1) < 1 << 15)


def igemm_ok(x_shape, w_shape, out_hw, groups, dilation):
    """Whether igemm_fwd takes this forward: _igemm_fits and C*KH*KW up to CONV.igemm_max_k (its tap table in
    shared memory)."""
    _, cg, kh, kw = w_shape
    return cg * kh * kw <= CONV.igemm_max_k and _igemm_fits(x_shape, w_shape, out_hw, groups, dilation)


def igemm_forward(x, w, b, out, y, out_hw, stride, pads, dilation, act):
    """out [N, O, OH, OW] = act(conv(x, w) + b) by igemm_fwd, and y [O, N*OH*OW] (before the bias) where given."""
    n = x.shape[0]
    o = w.shape[0]
    bo = 16 if o <= 16 else 32
    blocks = -(-o // bo) * -(-(n * out_hw[0] * out_hw[1]) // _IGEMM_BQ[bo])
    get(FAMILY, f"igemm_fwd_bo{bo}", x.dtype)(
        (blocks,), (_IGEMM_THREADS,), (x, w, ptr(b), out, ptr(y)) + int_args(x.shape, w.shape, out_hw, stride, pads,
                                                                            dilation) + (i32(act),))


def igemm_wgrad_ok(x_shape, w_shape, out_hw, groups, dilation):
    """Whether igemm_wgrad takes this weight gradient: _igemm_fits and a partial row of O*(C*KH*KW + 1) within
    32-bit indices (its tap table holds only a tile's taps: no bound on C*KH*KW)."""
    o, cg, kh, kw = w_shape
    return o * (cg * kh * kw + 1) < FITS32 and _igemm_fits(x_shape, w_shape, out_hw, groups, dilation)


def wgrad_tile(o, kb):
    """igemm_wgrad's tile (BO, BK, TO, TK) for o channels x kb taps (the bias one of them), and the fraction of
    its tiles' area the outputs use: the first of _WG_TILES (the most work per thread first) whose area is at least
    half used, else the one of least waste."""
    best = None
    for tile in _WG_TILES:
        use = o * kb / (-(-o // tile[0]) * tile[0] * -(-kb // tile[1]) * tile[1])
        if use >= 0.5:
            return tile, use
        if best is None or use > best[1]:
            best = (tile, use)
    return best


def _wgrad_splits(o, kb, positions, tiles, threads):
    """igemm_wgrad's partial rows: enough blocks (tiles x splits) for CONV.wg_threads_per_sm threads per SM, at
    least CONV.wg_min_slices slices of positions per split, and splits x o x kb within 32-bit indices."""
    slices = -(-positions // _WGQ)
    return max(1, min(-(-slices // CONV.wg_min_slices), -(-CONV.wg_threads_per_sm * sm_count() // (tiles * threads)),
                      (FITS32 - 1) // (o * kb)))


def igemm_weight_grad(x, g, saved, with_bias):
    """(dw, db or None) by igemm_wgrad: block tiles of BO channels x BK taps (the bias a tap, wgrad_tile), the
    positions split over S partial rows (_wgrad_splits); then wgrad_reduce over the S rows in a fixed order."""
    o, cg, kh, kw = saved.weight.shape
    kb = cg * kh * kw + 1
    (bo, bk, to, tk), _ = wgrad_tile(o, kb)
    tiles, threads = -(-o // bo) * -(-kb // bk), (bo // to) * (bk // tk)
    splits = _wgrad_splits(o, kb, g.shape[1], tiles, threads)
    partial = cupy().empty((splits, o * kb), dtype=g.dtype)
    get(FAMILY, f"igemm_wgrad_{bo}x{bk}", g.dtype)(
        (splits * tiles,), (threads,), (x, g, partial) + int_args(
            x.shape, saved.weight.shape, saved.out_hw, saved.stride, saved.pads, saved.dilation)
        + (i32(splits), i32(with_bias)))
    return reduce_partials(partial, saved.weight, saved.bias if with_bias else None)

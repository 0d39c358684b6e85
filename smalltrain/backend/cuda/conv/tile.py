"""tile_conv (kernels/conv/tile.cu, tile_arranged.cu): stride-1, undilated, groups == 1 convolutions with a square
3x3 or 5x5 kernel, forward and input gradient (the correlation of g with the flipped kernel), from an input tile
and all the weights staged in shared memory, each thread a register tile of TO channels x 4 columns. Its plan
(channels per thread, rows per block, channel splits), the launch with each epilogue (plain, linear, pool, into a
producer: fused.py decides which), the weights arranged beforehand in its shared layout (tile_arrange) where that
pays, and the bytes per staging copy. Layouts: the input read as [N, C, H, W] with image and channel strides; w [O, C,
KS, KS]; out [N, O, Ho, Wo], or a producer's g [O, N*Ho*Wo] ("into")."""
from ... import metadata_cache
from .. import cupy
from .._common import get, i32, i32s, ptr, with_smem
from .plan import CONV, FITS32, SMEM_BYTES, sm_count

_TILE_KS = (3, 5)             # kernel sizes tile_conv is compiled for (ST_TILE)
TILE_TW = 4                   # output columns per thread (ST_TW)
LINEAR_MAX_F = 16             # the linear epilogue's outputs at most (ST_LF)
_ARRANGE_THREADS = 256        # tile_arrange's blocks


def tile_slots(o, to):
    """OP, the slots of one tap's weights in tile_conv's shared memory: o channels in groups of TO, each in TS slots
    (TO rounded up to 4)."""
    return -(-o // to) * (-(-to // 4) * 4)


def _tile_weight_bytes(c, ks, o, to, itemsize):
    """tile_conv's staged weights in shared memory, [C*KS*KS][OP] (tile_slots)."""
    return c * ks * ks * tile_slots(o, to) * itemsize


def tile_geometry(stride, dilation, groups, w_shape):
    """Whether tile_conv's and tile_wgrad's geometry holds: stride 1, no dilation, groups == 1, a square kernel of a
    size they are compiled for (_TILE_KS)."""
    return (tuple(stride) == (1, 1) and tuple(dilation) == (1, 1) and groups == 1 and w_shape[2] == w_shape[3]
            and w_shape[2] in _TILE_KS)


def tile_plan(n, c, in_hw, o, out_hw, ks, itemsize, even_rows=False):
    """_tile_conv_plan, cached per shapes and the SM count (an eager step plans each convolution 2-3 times)."""
    return _tile_conv_plan(n, c, tuple(in_hw), o, tuple(out_hw), ks, itemsize, sm_count(), even_rows)


@CONV.watch
def _clear_plans():
    _tile_conv_plan.cache_clear()


@metadata_cache
def _tile_conv_plan(n, c, in_hw, o, out_hw, ks, itemsize, sms, even_rows=False):
    """(TO, TH, threads, blocks, shared memory, CS) of tile_conv over n images of c input channels in_hw to o output
    channels out_hw with a ks x ks kernel, or None where it does not take the convolution (ks not compiled, nothing
    to do, indices past 32 bits, a row of tiles over 1024 threads or one row's input and the weights over the shared
    memory). TO: 8 channels per thread where that leaves CONV.tile_to8_threads_per_sm threads per SM, else 4; 6
    instead (KS = 5) where that computes no dead channel and 4 or 8 would and the grid keeps
    CONV.tile_to6_threads_per_sm threads per SM (its weights take 8 slots a tap in shared memory). TH, the output
    rows per block: of the row counts whose block fits (CONV.tile_threads threads, the shared memory), those giving
    CONV.tile_blocks_per_sm blocks per SM of CONV.tile_min_threads threads (else those of that many threads, else
    all), the one wasting the least: lanes of partial warps, staged halo rows, rows of a partial last tile
    (CONV.tile_rows, if set: the most rows up to it that fit); even_rows: an even TH only (the pooling epilogue's row
    pairs). CS: the input channels' splits over thread groups."""
    ho, wo = out_hw
    if (ks not in _TILE_KS or min(n, c, o, ho, wo) <= 0 or n * c * in_hw[0] * in_hw[1] >= FITS32
            or n * o * ho * wo >= FITS32):
        return None
    cg = -(-wo // TILE_TW)
    to = 8 if n * ho * cg * -(-o // 8) >= CONV.tile_to8_threads_per_sm * sms else 4
    if ks == 5 and o % to and o % 6 == 0 and n * ho * cg * (o // 6) >= CONV.tile_to6_threads_per_sm * sms:
        to = 6
    og = -(-o // to)
    per_row = og * cg
    weights = _tile_weight_bytes(c, ks, o, to, itemsize)
    row_bytes = c * (cg * TILE_TW + 4) * itemsize
    fits = [t for t in range(1, min(ho, max(1, CONV.tile_threads // per_row)) + 1)
            if weights + (t + ks - 1) * row_bytes <= SMEM_BYTES and per_row * t <= 1024]
    if even_rows:
        fits = [t for t in fits if t % 2 == 0]
    if CONV.tile_rows is not None:
        fits = [t for t in fits if t <= CONV.tile_rows][-1:]
    if not fits:
        return None
    spread = [t for t in fits
              if n * -(-ho // t) >= CONV.tile_blocks_per_sm * sms and per_row * t >= CONV.tile_min_threads]
    full = [t for t in fits if per_row * t >= CONV.tile_min_threads]

    def useful(t):   # the fractions of the block's lanes that are threads, of the staged rows that are outputs
        return (per_row * t / (32 * -(-per_row * t // 32)) * t / (t + ks - 1)   # and of the tiles' rows that exist
                * ho / (-(-ho // t) * t), t)
    th = max(spread or full or fits, key=useful)
    tiles = -(-ho // th)
    # channel splits: the most (up to c, at least 2 channels each unless forced) that keep the grid's threads per SM
    # within CONV.tile_split_threads_per_sm and a block within CONV.tile_split_max_threads (CONV.tile_splits, if
    # set: that many)
    threads = og * th * cg

    def reduction(split):   # the shared memory the other groups' sums pass through
        return (split - 1) * threads * to * TILE_TW * itemsize
    most = CONV.tile_split_max_threads if itemsize == 4 else CONV.tile_threads   # float64: ~160 registers a thread
    cs = 1
    for split in range(2, c // 2 + 1):
        if (n * tiles * threads * split > CONV.tile_split_threads_per_sm * sms or threads * split > most
                or reduction(split) > SMEM_BYTES):
            break
        cs = split
    if CONV.tile_splits is not None:
        cs = max([1] + [k for k in range(2, min(CONV.tile_splits, c) + 1)
                        if threads * k <= most and reduction(k) <= SMEM_BYTES])
    smem = max(weights + (th + ks - 1) * row_bytes, reduction(cs))
    return to, th, threads * cs, n * tiles, smem, cs


def tile_forward_plan(x_shape, w_shape, out_hw, stride, pads, dilation, groups, itemsize, even_rows=False):
    """tile_conv's plan (tile_plan) for this forward, or None: it needs tile_geometry and CONV.tile_min_k taps."""
    o, cg, kh, kw = w_shape
    if not tile_geometry(stride, dilation, groups, w_shape) or cg * kh * kw < CONV.tile_min_k:
        return None
    return tile_plan(x_shape[0], cg, x_shape[2:], o, out_hw, kh, itemsize, even_rows)


def tile_dx_plan(x_shape, w_shape, stride, dilation, groups, out_hw, itemsize):
    """tile_conv's plan for the input gradient of a convolution of x_shape by w_shape (its output out_hw), or None:
    tile_forward_plan's rules but the taps' on the transposed geometry, 32-bit indices and
    CONV.tile_dx_min_threads_per_sm."""
    n, c, h, wd = x_shape
    o, _, kh, kw = w_shape
    if not tile_geometry(stride, dilation, groups, w_shape):
        return None
    plan = tile_plan(n, o, out_hw, c, (h, wd), kh, itemsize)
    if (plan is None or n * o * out_hw[0] * out_hw[1] >= FITS32
            or plan[2] * plan[3] < CONV.tile_dx_min_threads_per_sm * sm_count()):
        return None
    return plan


def tile_conv(plan, inp, w, b, out, y, in_chw, in_strides, pads, transposed, act, into_nchw=None, lin=None,
              pool_idx=None, wgrad=None, compact=False, arranged=None, smem=None):
    """Launch tile_conv by `plan` (tile_plan): `inp` read as [N, C, H, W] with image and channel strides
    in_strides, written to out [N, O, Ho, Wo] (and y [O, N, Ho*Wo] where given); pads = (top, bottom, left, right)
    of the correlation; transposed: the weights read as the input gradient's (flipped, [C][O] swapped).
    into_nchw (with transposed): the result's shape (N, O, Ho, Wo), written to out [O, N*Ho*Wo] times
    act'(y + b), y and b read ("into"). lin (forward): (lw [F, O*Ho*Wo], lb or None, logits [N, F], partials
    [blocks, F], counters, F) for tile_conv_lin's linear epilogue. pool_idx (forward): int64 [N, O, Ho/2, Wo/2] for
    tile_conv_pool, out then the pooled output of that shape; with into_nchw: the producer's pooling indices [N, O,
    Ho, Wo], out then its g [O, N*4*Ho*Wo], through the pooling's backward (tile_conv_unpool), or with compact only
    its values at the windows' maxima, [O, N*Ho*Wo], for pooled_wgrad. wgrad (with into_nchw): (the producer's x [N,
    1, H, W], H, W, its top and left padding, partial rows [blocks, O*(KS*KS + 1)]) for tile_conv_wgrad's epilogue;
    with pool_idx and compact too, for tile_conv_unpool_wgrad's, out then None (no g is written). arranged: w in the
    kernel's shared-memory layout (tile_arrange, for this plan and direction), read instead of w (which still gives
    KS). smem: the epilogue's shared memory where it needs more than the plan's (fused.py)."""
    to, th, threads, blocks, plan_smem, cs = plan
    n, o, ho, wo = out.shape if into_nchw is None else into_nchw
    pool_fwd = pool_idx is not None and into_nchw is None
    if pool_fwd:
        ho, wo = 2 * ho, 2 * wo
    smem = plan_smem if smem is None else smem
    name, lin_args = "tile_conv", (ptr(None),) * 5 + (i32(0),)
    if lin is not None:   # its block sums and ticket pass through the shared memory after the tiles
        name = "tile_conv_lin"
        lin_args = (lin[0], ptr(lin[1]), lin[2], lin[3], lin[4], i32(lin[5]))
        smem = max(smem, threads // 32 * LINEAR_MAX_F * out.dtype.itemsize + 4)
    elif pool_fwd:   # split 0's outputs pass through the shared memory, [threads][TO][4]
        name = "tile_conv_pool"
        smem = max(smem, threads // cs * to * TILE_TW * out.dtype.itemsize)
    elif pool_idx is not None and wgrad is not None:   # into a pooled producer's weight gradient
        name = "tile_conv_unpool_wgrad"
    elif pool_idx is not None:   # into a producer that pooled
        name = "tile_conv_unpool"
    elif wgrad is not None:   # split 0's sums per (channel, tap) pass through the shared memory
        name = "tile_conv_wgrad"
    wgrad_args = (ptr(None),) + i32s((0, 0, 0, 0)) + (ptr(None),) if wgrad is None else \
        (wgrad[0],) + i32s(wgrad[1:5]) + (wgrad[5],)
    family, arr = ("conv/tile", "") if arranged is None else ("conv/tile_arranged", "_arr")
    with_smem(get(family, f"{name}_k{w.shape[3]}_to{to}{arr}", inp.dtype), smem)(
        (blocks,), (threads,), (inp, w if arranged is None else arranged, ptr(b), ptr(out), ptr(y)) + i32s(
            (n,) + tuple(in_chw) + tuple(in_strides) + (o, ho, wo, pads[0], pads[2], th, cs, int(transposed),
                                                        (2 if compact else 1) if into_nchw is not None else 0,
                                                        act)) + lin_args
        + (ptr(pool_idx),) + wgrad_args + i32s((_tile_vec_stage(inp, in_chw, in_strides, pads),
                                                  _tile_weight_run(threads, o, to))),
        shared_mem=smem)


def _tile_weight_run(threads, o, to):
    """The consecutive taps of one weight slot that neighbouring threads of tile_conv stage: the largest run up to
    CONV.tile_weight_run such that the block's threads are a multiple of the slots (tile_slots of o output channels
    in groups of `to`) times the run, else 1. Fewer sectors a warp than a tap each, at the cost of bank conflicts."""
    slots = tile_slots(o, to)
    return max(r for r in range(1, max(1, CONV.tile_weight_run) + 1) if threads % (slots * r) == 0 or r == 1)


def _tile_arranges(elements, threads, blocks, sms=None):
    """Whether a layout of `elements` staged by `blocks` blocks of `threads` threads is worth tile_arrange's launch:
    the copies a thread saves, times the blocks an SM runs one after another or side by side (they share its
    load/store pipe), reach CONV.tile_arrange_min_copies. sms: the device's SMs (default: the current device's)."""
    return elements * -(-blocks // (sms or sm_count())) >= CONV.tile_arrange_min_copies * threads


def tile_arrange(w, fwd, dx):
    """w [O, C, KS, KS] in tile_conv's shared-memory layouts (tile_arrange, one launch) for the plans fwd (its
    forward) and dx (its input gradient), each a plan or None: a layout is made where _tile_arranges says it pays.
    Returns (the forward's or None, (the input gradient's TO, its layout) or None)."""
    o, c, ks, _ = w.shape
    kk = ks * ks

    def size(plan, channels, taps):   # the layout's elements, [taps*KK][slots], or 0 where none is made
        if plan is None:
            return 0
        elements = taps * kk * tile_slots(channels, plan[0])
        return elements if _tile_arranges(elements, plan[2], plan[3]) else 0
    nf, nd = size(fwd, o, c), size(dx, c, o)
    if not nf + nd:
        return None, None
    # one buffer: the input gradient's part starts 16-byte aligned (slots are a multiple of 4)
    buf = cupy().empty(nf + nd, dtype=w.dtype)
    fa, da = (buf[:nf] if nf else None), (buf[nf:] if nd else None)
    get("conv/tile_arranged", "tile_arrange", w.dtype)((-(-max(nf, nd) // _ARRANGE_THREADS),), (_ARRANGE_THREADS,), (
        w, ptr(fa), i32(fwd[0] if nf else 4), ptr(da), i32(dx[0] if nd else 4), i32(o), i32(c), i32(kk)))
    return fa, ((dx[0], da) if nd else None)


def _tile_vec_stage(inp, in_chw, in_strides, pads):
    """The bytes per copy tile_conv stages `inp` with (read as [N, C, H, W] with image and channel strides
    in_strides, the correlation's pads (top, bottom, left, right)): copy_bytes."""
    return copy_bytes(inp, in_chw[2], pads[2], in_strides)


def copy_bytes(arr, width, left, strides):
    """The bytes per cp.async copy a kernel can stage rows of `arr` with (rows `width` wide, `left` columns of zero
    padding before each in shared memory, whose rows are a multiple of 4 elements wide; strides: the element
    strides between rows' planes): 16, or 8 (float32: two elements), where arr is that many bytes aligned and the
    width, the padding and the strides are multiples of that many bytes' elements (a copy then lies wholly inside a
    row or wholly in the padding), else arr's itemsize (an element a copy)."""
    for size in (16, 8):
        v = size // arr.dtype.itemsize
        if (size == 16 or arr.dtype.itemsize == 4) and arr.data.ptr % size == 0 and width % v == 0 \
                and left % v == 0 and all(s % v == 0 for s in strides):
            return size
    return arr.dtype.itemsize

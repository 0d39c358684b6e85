"""What tile_conv's epilogues take beyond the plain convolution: the forward's 2x2 max pooling (tile_conv_pool) and
small linear layer (tile_conv_lin); and the input gradient written as the producing convolution's g ("into",
ProducerGrad), through its activation's derivative, its pooling's backward where it pooled in its epilogue, and its
weight and bias gradients' partial rows where the epilogue can sum them (tile_conv_wgrad, tile_conv_unpool_wgrad) or
pooled_wgrad (kernels/conv/tile_wgrad.cu) from the g at the pooling windows' maxima."""
import math

from .. import cupy
from .._common import device_counters, get, i32s, smem_optin_bytes
from .plan import ACTIVATIONS, CONV, FITS32, SMEM_BYTES, ProducerGrad, sm_count
from .tile import LINEAR_MAX_F, tile_conv, tile_dx_plan, tile_geometry

_LINEAR_IMAGES = 1 << 16      # the linear epilogue's per-image counters (device_counters)
_UNPOOL_WGRAD_SLICES = 16     # tile_conv_unpool_wgrad's slices of a channel's windows at most (ST_UPW_SLICES)


def tile_pool_ok(pool, out_hw):
    """Whether tile_conv's pooling epilogue (tile_conv_pool) takes this max pooling of the convolution's out_hw
    output: 2x2 windows at stride 2, no padding or dilation, even OH and OW (the windows tile the output; the plan
    then takes an even number of rows per block)."""
    kernel, stride, pad, dil = (tuple(v) for v in pool)
    return (kernel == (2, 2) and stride == (2, 2) and pad == (0, 0) and dil == (1, 1)
            and out_hw[0] % 2 == 0 and out_hw[1] % 2 == 0)


def tile_linear_ok(plan, n, lw):
    """The per-image counters for tile_conv's linear epilogue (tile_conv_lin) with this forward plan and linear
    weight lw [F, K], or None where it does not take it: F over LINEAR_MAX_F, a block of partial warps (its warp
    sums), more images than counters, indices past 32 bits, or counters not made yet while a CUDA graph is
    captured."""
    f, k = lw.shape
    if (not 0 < f <= LINEAR_MAX_F or plan[2] % 32 or n > _LINEAR_IMAGES or f * k >= FITS32
            or plan[3] * f >= FITS32):
        return None
    return device_counters("tile_conv_lin", _LINEAR_IMAGES)


def producer_output(into, dtype):
    """The shape of the output `into` (a Conv2dSaved) made, its pooled output's where it pooled in its epilogue,
    where the next layer may write its g (conv2d_backward's `into`, linear_chain_backward's): of `dtype`, and the
    output before the bias kept where its activation's derivative needs it; else None."""
    if into is None or into.weight.dtype != dtype:
        return None
    if into.activation is not None and into.y is None:
        return None
    if into.pool is not None:
        return tuple(into.pool[0].shape)
    return (into.x_shape[0], into.weight.shape[0]) + tuple(into.out_hw)


def into_ok(saved, into, dtype):
    """Whether conv2d_backward can write its input gradient as `into`'s g: producer_output allows it, `into` made x,
    and computes no g itself."""
    return producer_output(into, dtype) == tuple(saved.x_shape)


def _wgrad_epilogue_smem(plan, ks, itemsize):
    """tile_conv_wgrad's sums in shared memory: [TO][KS*KS + 1][threads of split 0]."""
    to, _, threads, _, _, cs = plan
    return to * (ks * ks + 1) * (threads // cs) * itemsize


def _unpool_wgrad_smem(plan, o, wo, ks, itemsize):
    """tile_conv_unpool_wgrad's shared memory: first what it prefetches for its epilogue (tile_common.cuh
    st_unpool_prefetch_bytes: the producer's pooling indices of the block's rows [O][TH][Wo] (int64) and its x under
    them [2*TH + KS - 1][2*Wo + KS - 1], rounded up to 16 bytes), then the most of the plan's (the tiles, the splits'
    sums) and the epilogue's: the g at the maxima [O][TH][Wo], the slices' sums [O][S][KS*KS + 1] (S: the block's
    threads per channel, 1 to _UNPOOL_WGRAD_SLICES), the maxima's offsets (int) [O][TH][Wo], the NaN taps [O][KS*KS]
    (bytes)."""
    th, threads = plan[1], plan[2]
    slices = max(1, min(threads // o, _UNPOOL_WGRAD_SLICES))
    prefetch = -(-(o * th * wo * 8 + (2 * th + ks - 1) * (2 * wo + ks - 1) * itemsize) // 16) * 16
    epilogue = (o * th * wo + o * slices * (ks * ks + 1)) * itemsize + o * th * wo * 4 + o * ks * ks
    return prefetch + max(plan[4], epilogue)


def _unpool_wgrad(plan, into, ks, dtype, out_w):
    """tile_conv_unpool_wgrad's arguments (tile_conv's wgrad) and shared memory, or None where its epilogue does not
    take the weight gradient of `into`, a producer that pooled in its epilogue to out_w columns and whose g
    pooled_wgrad would take from the maxima (decided by the caller): one input channel, the same KS x KS kernel and
    the kernel's shared memory within the device's opt-in limit. The partial rows [blocks, O*(KS*KS + 1)]: one per
    block of the plan."""
    o = into.weight.shape[0]
    smem = _unpool_wgrad_smem(plan, o, out_w, ks, dtype.itemsize)
    if into.x_shape[1] != 1 or tuple(into.weight.shape[2:]) != (ks, ks) or smem > smem_optin_bytes():
        return None
    partial = cupy().empty((plan[3], o * (ks * ks + 1)), dtype=dtype)
    return (into.x,) + tuple(into.x_shape[2:]) + (into.pads[0], into.pads[2], partial), smem


def _into_wgrad(plan, into, ks, dtype):
    """tile_conv_wgrad's arguments (tile_conv's wgrad) for the input gradient written as `into`'s g, or None where
    its epilogue does not take `into`'s weight gradient: `into` needs no weight gradient or kept no x, or has not one
    input channel, the same KS x KS kernel and tile_conv's geometry, pooled in its epilogue (the g is written through
    the pooling), or the sums' shared memory is over the default limit. The partial rows: one per block of the
    plan."""
    if (not into.needs[1] or into.x is None or into.x_shape[1] != 1 or into.pool is not None
            or tuple(into.weight.shape[2:]) != (ks, ks)
            or not tile_geometry(into.stride, into.dilation, into.groups, into.weight.shape)
            or max(plan[4], _wgrad_epilogue_smem(plan, ks, dtype.itemsize)) > SMEM_BYTES):
        return None
    partial = cupy().empty((plan[3], into.weight.shape[0] * (ks * ks + 1)), dtype=dtype)
    return (into.x,) + tuple(into.x_shape[2:]) + (into.pads[0], into.pads[2], partial)


def _pooled_wgrad_plan(into, dtype):
    """(threads, images per block, blocks, shared memory) for pooled_wgrad on `into`'s compact g, or None where it
    does not take `into`: `into` not pooled in its epilogue, needing its input gradient or not its weight gradient,
    without its x, not tile_conv's geometry, over 256 channels, or the images or sums over the default shared
    memory. About two blocks per SM; threads a multiple of the channels."""
    if (into.pool is None or into.needs[0] or not into.needs[1]
            or into.x is None or not tile_geometry(into.stride, into.dilation, into.groups, into.weight.shape)
            or into.weight.shape[0] > 256):
        return None
    n, c, h, wd = into.x_shape
    o, ks = into.weight.shape[0], into.weight.shape[2]
    threads = CONV.pooled_wgrad_threads.get(dtype.itemsize, 128) // o * o or o
    per_block = max(1, -(-n // (2 * sm_count())))

    def smem(images):   # the staged images, one input channel's sums, a NaN-tap flag per (channel, input channel, tap)
        return (images * c * h * wd + threads * (ks * ks + 1)) * dtype.itemsize + o * c * ks * ks
    while per_block > 1 and smem(per_block) > SMEM_BYTES:
        per_block //= 2
    if smem(per_block) > SMEM_BYTES or into.pool[0].size >= FITS32 or n * c * h * wd >= FITS32:
        return None
    return threads, per_block, -(-n // per_block), smem(per_block)


def _pooled_wgrad(gw, into, plan):
    """pooled_wgrad's partial rows [blocks, O*(C*KS*KS + 1)] (wgrad_reduce's) of `into` from gw [O, N*P], its g at
    its pooling's P windows' maxima per image, by _pooled_wgrad_plan's plan."""
    threads, per_block, blocks, smem = plan
    n, c, h, wd = into.x_shape
    pidx = into.pool[0]
    o, ks = into.weight.shape[0], into.weight.shape[2]
    partial = cupy().empty((blocks, o * (c * ks * ks + 1)), dtype=gw.dtype)
    get("conv/tile_wgrad", f"pooled_wgrad_k{ks}", gw.dtype)((blocks,), (threads,), (gw, pidx, into.x, partial) + i32s(
        (n, c, o, h, wd, into.out_hw[1], pidx.shape[2] * pidx.shape[3], into.pads[0], into.pads[2], per_block)),
        shared_mem=smem)
    return partial


def tile_dx(g, saved, into=None):
    """dx [N, C, H, W] from g [O, N*OH*OW] by tile_conv (the full correlation of g with the flipped kernel), or
    None where it does not take the convolution (tile_dx_plan). With `into` (the Conv2dSaved of the convolution
    whose output x is, fitting into_ok), dx is written as that convolution's g [C, N*H*W], times its activation's
    derivative, and returned as a ProducerGrad (with that convolution's weight gradient partials where _into_wgrad
    takes it); where that convolution pooled in its epilogue (into.pool), through the pooling's backward: g [C,
    N*4*H*W], or where _pooled_wgrad_plan takes it only the partial rows (g None), from the g at the windows'
    maxima, or not even that where tile_conv_unpool_wgrad sums them itself."""
    n, c, h, wd = saved.x_shape
    o, _, kh, kw = saved.weight.shape
    dtype = g.dtype
    plan = tile_dx_plan(saved.x_shape, saved.weight.shape, saved.stride, saved.dilation, saved.groups,
                        saved.out_hw, dtype.itemsize)
    if plan is None:
        return None
    pooled = into is not None and into.pool is not None
    pooled_plan = _pooled_wgrad_plan(into, dtype) if pooled else None   # then only the maxima's g is written
    shape = (c, n * h * wd * (4 if pooled and pooled_plan is None else 1)) if into is not None \
        else tuple(saved.x_shape)
    if math.prod(shape) >= FITS32:
        return None
    unpool_wgrad = _unpool_wgrad(plan, into, kh, dtype, wd) if pooled_plan is not None else None
    dx = cupy().empty(shape, dtype=dtype) if unpool_wgrad is None else None
    p = saved.out_hw[0] * saved.out_hw[1]
    pads = (kh - 1 - saved.pads[0], 0, kw - 1 - saved.pads[2], 0)
    # the forward's arrangement of the weights for this plan (an override since may have changed its TO)
    arranged = saved.arranged_dx[1] if saved.arranged_dx is not None and saved.arranged_dx[0] == plan[0] else None
    if into is None:
        tile_conv(plan, g, saved.weight, None, dx, None, (o,) + tuple(saved.out_hw), (p, n * p), pads, True, 0,
                  arranged=arranged)
        return dx
    # y and b are the producer's, read; the output in its g layout ("into")
    act = ACTIVATIONS[into.activation]
    if unpool_wgrad is not None:
        wgrad, smem = unpool_wgrad
    else:
        wgrad = _into_wgrad(plan, into, kh, dtype)
        smem = None if wgrad is None else max(plan[4], _wgrad_epilogue_smem(plan, kh, dtype.itemsize))
    tile_conv(plan, g, saved.weight, into.bias if act else None, dx, into.y if act else None,
              (o,) + tuple(saved.out_hw), (p, n * p), pads, True, act, tuple(saved.x_shape),
              pool_idx=into.pool[0] if pooled else None, wgrad=wgrad, compact=pooled_plan is not None,
              arranged=arranged, smem=smem)
    if pooled_plan is not None:   # the producer needs no g, only its weight and bias gradients' partial rows
        return ProducerGrad(None, wgrad[5] if unpool_wgrad is not None else _pooled_wgrad(dx, into, pooled_plan))
    return ProducerGrad(dx, None if wgrad is None else wgrad[5])

"""The convolution family's shared ground: its tuning table (CONV: every number a launch plan is tuned by, read as
attributes, changed only by tuning.override), the state a forward saves for its backward (Conv2dSaved, ProducerGrad),
the argument checks and the geometry (torch's errors), and the packed launch arguments every kernel file takes."""
import functools
import operator
from dataclasses import dataclass

from ... import metadata_cache
from ...conv_geometry import conv_padding
from .._common import (SMEM_DEFAULT_BYTES, check_array, check_dtype, check_float, device_attribute, i32s, i64, pair,
                       same_device)
from ..tuning import Tuning

ACTIVATIONS = {None: 0, "relu": 1, "gelu": 2, "gelu_tanh": 3}
SMEM_BYTES = SMEM_DEFAULT_BYTES   # the plans' per-block shared memory (no opt-in needed)
FITS32 = 1 << 30                  # sizes below this take the kernels' 32-bit indices

CONV = Tuning(
    "conv",
    direct_max_k=(256, "C*KH*KW up to which the direct kernels take a groups == 1 convolution"),
    direct_max_macs=(1 << 27, "multiply-adds up to which direct_fwd beats im2col + cuBLAS"),
    direct_dx_max_macs=(1 << 28, "multiply-adds up to which direct_dx beats cuBLAS + col2im"),
    direct_dx_min_threads_per_sm=(512, "direct_dx's threads per SM at least: fewer wait on latency"),
    igemm_max_k=(1024, "C*KH*KW up to which igemm_fwd takes the forward (its tap table: ST_IGKMAX at most)"),
    igemm_wgrad_min_use=(0.5, "igemm_wgrad's tile fill at least, else the tiled wgrad_partial where it fits"),
    wg_min_slices=(4, "igemm_wgrad's position slices per split at least"),
    wg_threads_per_sm=(1024, "igemm_wgrad's splits: enough blocks for this many threads per SM"),
    wr_rows=(16, "wgrad_reduce's partial rows per thread"),
    tile_min_k=(16, "tile_conv's forward needs at least this many taps C*KH*KW (else direct_fwd wins)"),
    tile_dx_min_threads_per_sm=(128, "tile_conv's input gradient needs this many threads per SM"),
    tile_threads=(256, "tile_conv's threads per block at most, before channel splits"),
    tile_blocks_per_sm=(2, "tile_conv's rows per block chosen for at least this many blocks per SM ..."),
    tile_min_threads=(256, "... of at least this many threads where the rows allow"),
    tile_to8_threads_per_sm=(1024, "8 channels per thread where that leaves this many threads per SM, else 4"),
    tile_to6_threads_per_sm=(512, "6 channels (KS = 5, O % 6 == 0, no dead channel) where this many threads per SM"),
    tile_split_threads_per_sm=(1024, "tile_conv's channel splits while the grid keeps at most this many per SM"),
    tile_split_max_threads=(512, "... and a float32 block at most this many threads"),
    tile_weight_run=(4, "consecutive taps of one weight slot that neighbouring threads stage"),
    tile_arrange_min_copies=(16, "tile_arrange pays where a thread's saved copies times blocks per SM reach this"),
    tile_rows=(None, "tile_conv's rows per block if set (tests: partial last tiles), else planned"),
    tile_splits=(None, "tile_conv's channel splits if set (tests), else planned"),
    tile_wg_threads=(256, "tile_wgrad's threads per block at most (ST_TILE_WG_THREADS at most)"),
    tile_wg_blocks_per_sm=(4, "tile_wgrad's tiles spread over at most this many blocks per SM"),
    tile_wg_to8_threads=(128, "tile_wgrad: 8 channels per thread where that makes a block of this many threads"),
    tile_wg_rows=(None, "tile_wgrad's rows per tile if set (tests: partial tiles), else the most that fit"),
    tile_wg_grid=(None, "tile_wgrad's blocks if set (tests: one block walking every tile), else planned"),
    tile_wg_split=(None, "tile_wgrad's row groups if set and they fit (tests), else the largest divisor"),
    pooled_wgrad_threads=({4: 256, 8: 128}, "pooled_wgrad's threads per block by itemsize (its sums' smem)"),
    wgrad_beside_max_outputs=(1 << 21, "N*O*OH*OW up to which dw runs on a side stream beside dx"),
    bias_act_rows_min_p=(64, "bias_act_bwd_rows (a block per row) from rows of this many positions"),
)


@dataclass
class Conv2dSaved:
    """What conv2d_backward needs. cols: the im2col matrix [C*KH*KW, N*OH*OW] (kept only for the weight gradient,
    None where a kernel reads x instead); weight (a reference to the parameter, no copy); y: the GEMM result [O,
    N*OH*OW] before bias (kept only when an activation was fused, to recompute its derivative); bias; the geometry;
    needs = (input, weight, bias) grads."""
    x_shape: tuple
    weight: object
    bias: object
    cols: object
    y: object
    stride: tuple
    pads: tuple
    dilation: tuple
    groups: int
    out_hw: tuple
    activation: object
    needs: tuple
    x: object = None   # the input (a reference), kept instead of cols where a kernel reads it for the weight gradient
    pool: object = None   # the fused pooling's saved state (pool.max_pool2d_forward's) where tile_conv_pool ran
    # (TO, the weights in tile_conv's layout for the input gradient at that TO) where the forward arranged them
    # (tile._tile_arrange), else None
    arranged_dx: object = None


@dataclass
class ProducerGrad:
    """conv2d_backward's (or linear_chain_backward's) input gradient written for the convolution that made its
    input (`into`): that convolution's g [C, N*H*W] (its activation's derivative applied, and its pooling's
    backward where it pooled in its epilogue) and, where tile_conv's epilogue computed them too, its weight and
    bias gradients' partial rows for wgrad_reduce (else None): conv2d_backward(None, into, g=g, wpartial=wpartial)."""
    g: object
    wpartial: object = None


def sm_count():
    return device_attribute("MultiProcessorCount")


def check_affine(op, x, w, b, ndim, activation, bias_ndim=None):
    """The checks shared by the layers with a bias + activation epilogue (conv2d here, linear.py): input and
    weight ndim-D cupy arrays of one float dtype, the bias of that dtype, one device, a known activation."""
    check_array(op, "input", x, ndim)
    check_array(op, "weight", w, ndim)
    check_float(op, "input", x)
    check_dtype(op, "weight", w, x.dtype)
    if b is not None:
        check_array(op, "bias", b, bias_ndim)
        check_dtype(op, "bias", b, x.dtype)
    same_device(op, x, w, b)
    if activation not in ACTIVATIONS:
        raise ValueError(f"{op}: activation must be one of {list(ACTIVATIONS)}, got {activation!r}")


def validate(x, w, b, stride, padding, dilation, groups, activation):
    """The arrays' checks (every call), then the geometry's (cached per shapes and arguments)."""
    check_affine("conv2d", x, w, b, 4, activation)
    return _geometry(x.shape, w.shape, None if b is None else b.shape, stride, padding, dilation, groups)


def _pads(padding, stride, dilation, kernel):
    """(top, bottom, left, right) from an int, (ph, pw), (top, bottom, left, right), 'valid' or 'same'."""
    if isinstance(padding, (tuple, list)) and len(padding) == 4:   # already resolved by the caller (ops/conv.py)
        pads = tuple(operator.index(p) for p in padding)
        if min(pads) < 0:
            raise RuntimeError(f"conv2d: negative padding is not supported, got padding={list(pads)}")
        return pads
    return conv_padding(padding, stride, dilation, kernel)


@metadata_cache
def _geometry(x_shape, w_shape, b_shape, stride, padding, dilation, groups):
    """(stride, pads, dilation, groups, out_hw) normalized, for 4-D input and weight shapes; errors as torch's."""
    op = "conv2d"
    stride, dilation = pair(op, "stride", stride), pair(op, "dilation", dilation)
    if min(stride) <= 0 or min(dilation) <= 0:
        raise RuntimeError(f"{op}: stride and dilation must be positive, got stride={list(stride)}, "
                           f"dilation={list(dilation)}")
    groups = operator.index(groups)
    o, cg, kh, kw = w_shape
    if groups <= 0 or o % groups:
        raise RuntimeError(f"{op}: Given groups={groups}, expected weight to be divisible by {groups} at dimension 0, "
                           f"but got weight of size {list(w_shape)}")
    if x_shape[1] != cg * groups:
        raise RuntimeError(f"{op}: expected input with {cg * groups} channels (weight {list(w_shape)}, "
                           f"groups={groups}), got input {list(x_shape)}")
    if b_shape is not None and tuple(b_shape) != (o,):
        raise RuntimeError(f"{op}: expected bias to be 1-dimensional with {o} elements (weight {list(w_shape)}), "
                           f"but got bias of size {list(b_shape)}")
    pads = _pads(padding, stride, dilation, (kh, kw))
    padded = (x_shape[2] + pads[0] + pads[1], x_shape[3] + pads[2] + pads[3])
    extent = (dilation[0] * (kh - 1) + 1, dilation[1] * (kw - 1) + 1)
    if padded[0] < extent[0] or padded[1] < extent[1]:
        raise RuntimeError(f"{op}: Calculated padded input size per channel: ({padded[0]} x {padded[1]}). Kernel "
                           f"size: ({extent[0]} x {extent[1]}). Kernel size can't be greater than actual input size")
    out_hw = tuple((p - e) // s + 1 for p, e, s in zip(padded, extent, stride))
    return stride, pads, dilation, groups, out_hw


@functools.lru_cache(maxsize=1024)   # per geometry: packing 14 int64 arguments costs more than the launch itself
def geometry_args(n, c, h, w, kh, kw, out_hw, stride, pads, dilation):
    """The 64-bit geometry arguments of im2col and col2im."""
    return (i64(n), i64(c), i64(h), i64(w), i64(kh), i64(kw), i64(out_hw[0]), i64(out_hw[1]), i64(stride[0]),
            i64(stride[1]), i64(pads[0]), i64(pads[2]), i64(dilation[0]), i64(dilation[1]))


def int_args(x_shape, w_shape, out_hw, stride, pads, dilation):
    """The 32-bit geometry arguments of the direct and implicit-GEMM kernels."""
    n, c, h, w = x_shape
    return i32s((n, c, h, w, w_shape[0], w_shape[2], w_shape[3], out_hw[0], out_hw[1], stride[0], stride[1], pads[0],
                 pads[2], dilation[0], dilation[1]))

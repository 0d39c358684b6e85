"""CUDA 2-D convolution: im2col / col2im kernels (kernels/conv.cu), cuBLAS GEMMs (blas.py, capturable) over the whole
batch, and a fused epilogue (transpose to [N, O, OH, OW], bias, optional relu / gelu).

Small convolutions (groups == 1, C*KH*KW <= DIRECT_MAX_K, work <= DIRECT_MAX_MACS: LeNet-5's) skip the cols matrix:
the forward is one direct kernel with the bias and activation fused, the weight and bias gradients are one tiled
kernel plus a fixed-order reduction, the input gradient one gather kernel. That is 1 launch instead of 3-4 for the
forward, 2 instead of 4 for dw and db and 1 instead of 2-3 (GEMM, its split-K reduction, col2im) for dx, and no
C*KH*KW-times-the-input matrix written and read back. Larger groups == 1 convolutions (MnistCnn's second layer)
run the forward as one implicit-GEMM kernel with the same epilogue (igemm_fwd), keeping x, and dw and db as an
implicit GEMM from x too (igemm_wgrad + the same reduction): no cols matrix either way. Before all of these,
stride-1 undilated square 3x3 / 5x5 convolutions run the forward, and where it fills the GPU the input gradient,
by tile_conv: an input tile and the weights staged in shared memory, register tiles of 4 channels x 4 columns
(TILE_CONV and the limits below), and dw and db by tile_wgrad (persistent blocks over row tiles of g and x,
double-buffered) + the same reduction.
"""
import functools
import math
import operator
from dataclasses import dataclass

from . import cupy
from .. import metadata_cache
from ._common import (SMEM_DEFAULT_BYTES, check_array, check_dtype, check_float, check_shape, contiguous,
                      device_attribute, device_counters, get, grad_array, i32, i32s, i64, launch, launch_or_hold, pair,
                      ptr, run_beside, same_device, smem_optin_bytes, with_smem)
from .blas import gemm, sum_rows
from .loader import MAX_BLOCKS

ACTIVATIONS = {None: 0, "relu": 1, "gelu": 2, "gelu_tanh": 3}

# groups == 1 convolutions with C*KH*KW up to DIRECT_MAX_K and at most DIRECT_MAX_MACS multiply-adds
# (O * C*KH*KW * N*OH*OW) run the direct kernels; tests set DIRECT_MAX_K to 0 to compare the im2col + GEMM path
# on the same inputs. The work bound is where cuBLAS's GEMM over the cols matrix starts to win on the H200:
# LeNet-5's layers at batch 512 (44M and 79M) run faster direct, MnistCnn's second layer at batch 64 (170M) not
DIRECT_MAX_K = 256
DIRECT_MAX_MACS = 1 << 27
# the weight gradient's tiled kernel (wgrad_partial + wgrad_reduce, from x) takes the convolutions of the direct
# forward's rule whatever their shared memory (the implicit-GEMM forward's too) where the implicit-GEMM weight
# gradient below would leave its tiles mostly empty (MnistCnn's first layer)
# larger groups == 1 convolutions (C*KH*KW up to IGEMM_MAX_K) run the forward as an implicit GEMM (igemm_fwd) and
# keep x. H200, MnistCnn's second layer at batch 64: 30 us against 48 us for im2col + GEMM + epilogue. Tests set
# IGEMM_MAX_K to 0 for im2col + GEMM
IGEMM_MAX_K = 1024            # conv.cu ST_IGKMAX
_IGEMM_BQ = {16: 256, 32: 128}   # positions per block tile for BO output channels (conv.cu igemm_fwd)
# the weight gradient as an implicit GEMM (igemm_wgrad + wgrad_reduce, from x, no cols matrix) where its tile is
# at least IGEMM_WGRAD_MIN_USE used (else the tiled kernel, where it fits). H200 (benchmarks/conv_variants.py):
# MnistCnn's second layer at batch 64, 31 + 4 us against im2col 29 us + cuBLAS 41 us; LeNet-5's second layer
# 3 us faster than the tiled kernel at batch 64, 15 us at 512; its first layer (8 x 32 tiles) 2 / 15 us faster.
# Tests set it to 0 (always) or 2 (never where the tiled kernel fits)
IGEMM_WGRAD_MIN_USE = 0.5
_WG_TILES = ((32, 64, 4, 4), (16, 128, 4, 4), (8, 32, 2, 2))   # (BO, BK, TO, TK): ST_IGEMM_WGRAD in conv.cu
_WG_TILE = None               # one of _WG_TILES for every layer (benchmarks/conv_variants.py), None: _wgrad_tile
_WGQ = 16                     # positions per slice (conv.cu ST_WGQ)
_WG_MIN_SLICES = 4            # slices per split at least: fewer partial rows where the positions are few
_WG_THREADS_PER_SM = 1024     # splits: enough blocks for this many threads per SM (8 of 128, 16 of 64 threads)
_WR_ROWS = 16                 # partial rows per thread of wgrad_reduce (loads in flight at once: ST_WR_BATCH)
# the input gradient's gather kernel has no cols matrix to write and col2im to run, which costs more than the GEMM
# it replaces: it takes the same small-C*KH*KW convolutions up to twice the work (MnistCnn's second layer at b64)
# where it has at least DIRECT_DX_MIN_THREADS_PER_SM threads per SM. With fewer it waits on latency: H200, LeNet-5's
# second layer at batch 64 (27,648 threads) backward 33.2 us with it, 22.6 us by cuBLAS + col2im; at batch 512
# (73,728) the same either way; MnistCnn's second layer (86,528) 73.0 against 81.0 (benchmarks/conv_variants.py).
# Tests set it to 0 to run the gather kernel on small cases
DIRECT_DX_MAX_MACS = 1 << 28
DIRECT_DX_MIN_THREADS_PER_SM = 512
# stride-1, undilated, groups == 1 convolutions with a square kernel of a size in _TILE_KS run the forward and the
# input gradient by tile_conv (conv.cu) where its tiles fit in shared memory: an input tile and all the weights
# staged, each thread TO channels x 4 columns, 3-6 FMAs per shared load (igemm_fwd: 2). H200, MnistCnn's second
# layer at batch 64: forward 22.5 us against 28.8 by igemm_fwd; LeNet-5's second at batch 512 13.7 against 21.7. It
# comes before the direct and implicit-GEMM kernels; tests and benchmarks set TILE_CONV = False for those.
TILE_CONV = True
_TILE_KS = (3, 5)             # kernel sizes tile_conv is compiled for (ST_TILE in conv.cu)
_TILE_TW = 4                  # output columns per thread (conv.cu ST_TW)
_TILE_THREADS = 256           # threads per block at most (fewer where the rows' tiles are spread, below)
_TILE_BLOCKS_PER_SM = 2       # rows per block chosen for at least this many blocks per SM ...
_TILE_MIN_THREADS = 256       # ... of at least this many threads where the rows allow. H200, captured steps with 64 /
                              # 128: MnistCnn b64 132.7 / 129.9-130.1 us (its conv2 input gradient: 5-row tiles, 384
                              # blocks of 280 threads, for 4-row ones, 448 of 224); LeNet-5's plans are the same.
# H100, thirty-third session, three rounds alternating, 256 against 128: MnistCnn b64 105.6 / 106.4 / 105.8 against
# 108.3 / 108.3 / 108.2 us, where no row count of that input gradient reaches 256 threads (a block holds at most 256),
# so the least wasteful rows take it: 4 again, 448 blocks of 224 (the kernels have changed since the H200 figures);
# LeNet-5's plans are the same at b64 and b512
_TILE_TO8_THREADS_PER_SM = 1024  # 8 channels per thread where that leaves this many threads per SM, else 4
# ... or 6 where that computes no dead channel and 4 or 8 would (LeNet-5's 6-channel first layer and its input
# gradient into it: a quarter of those kernels' products are padding at 4 or 8) and the grid keeps
# _TILE_TO6_THREADS_PER_SM threads per SM before channel splits (0: always); KS = 5 only (conv.cu ST_TILE). H100,
# LeNet-5's captured step (two rounds, twentieth session): b512 169.9 / 171.2 us with it off, 180.9 / 183.3 with 0
# (the second layer's input gradient, 140 threads per SM at 4 channels a thread, then has half as many), 166.4 / 164.4
# with 512 (only the first layer's forward at b512, 558 threads per SM, takes 6); b64 85.3 / 85.2, 87.6 / 86.4 with 512
# (no plan changes there). The next call: b512 166.4 / 162.5 on, 166.0 / 165.1 off; ncu, the two forwards 31.0 us
# (16.2 at 6 channels + 14.8) against 34.4. Tests set the threshold to 0 to run the 6-channel kernels on small cases
TILE_TO6 = True
_TILE_TO6_THREADS_PER_SM = 512
# tile_conv stages its input rows 16 bytes a copy where the input's image and channel strides, its row width and the
# left padding are multiples of 16 bytes' elements and it starts 16-byte aligned (_tile_vec_stage; LeNet-5's and
# MnistCnn's layers but MnistCnn's 26-wide second-layer input), else an element a copy. H100, the captured step (two
# rounds, twenty-fourth session), us off / on: LeNet-5 b64 80.5 / 80.4 against 78.9 / 78.7, b512 151.0 / 150.8
# against 147.2 / 146.9, MnistCnn b64 129.3 / 128.1 against 127.0 / 129.6
TILE_VEC_STAGE = True
# ... else (float32) 8 bytes a copy where the same holds for 8 bytes: MnistCnn's second layer's forward (26-wide rows)
# and its input gradient (24-wide rows of g, 2 columns of left padding). ncu's source page (H100, thirty-fourth
# session, eager step): the element copies of x are 12-18% of those kernels' instructions. H100, thirty-fourth
# session, the captured step, two rounds beside the tree before (05c257d), us: MnistCnn b64 100.4 / 100.6 with this,
# TILE_WG_VEC_STAGE and TILE_WG_BIAS_SPREAD, against 105.3 / 105.3; LeNet-5 b512 121.3 / 121.3 against 123.9 /
# 124.1, b64 57.2 / 57.2 against 57.1 / 57.0. Each alone: MnistCnn 105.0 / 105.0 (this), 105.1 / 105.0
# (TILE_WG_VEC_STAGE), 111.5 / 110.0 (TILE_WG_BIAS_SPREAD); all three off 110.1 / 110.1: element copies then
# passed through a per-copy width branch. With common.cuh st_stage_window (a loop per width; H100, thirty-fifth
# session, three rounds beside ab2f61c): all three off 107.9 / 108.1 / 107.3 against 111.0 / 111.2 / 110.4; the
# defaults 98.0 / 98.0 / 98.1 against 100.7 / 100.6 / 100.6
TILE_VEC_STAGE_8 = True
# tile_conv stages its weights an element a copy into a [tap][channel] layout, a transpose of w's: neighbouring
# threads copying one tap's channels read elements a row of w apart (MnistCnn's second layer: 32 sectors a warp).
# With TILE_WEIGHT_RUN > 1 they take runs of up to that many consecutive taps of one channel instead (the largest run
# that divides the block's threads by the channels' slots, _tile_weight_run): fewer sectors a warp, at the cost of
# shared-memory bank conflicts between a run's words. 1: one tap a thread's neighbours. H100, thirty-sixth session,
# the captured step, three rounds, us, 1 / 4 / 8: MnistCnn b64 98.6, 98.6, 98.7 / 98.2, 98.0, 97.9 / 98.9, 99.2,
# 99.0 (its forward's runs 3 and 6, its input gradient's 2 and 7); LeNet-5 b64 and b512 within their spread. The
# copies' count, not their sectors, is what they cost (the thirty-fifth session's source page: the MIO queue)
TILE_WEIGHT_RUN = 4
# ... unless its weights are arranged in that layout beforehand (TILE_ARRANGE): then a block stages them by 16-byte
# copies, a quarter of the copies. A convolution's forward then launches tile_arrange first (one small kernel, conv.cu),
# which writes the layouts of its forward and of its input gradient from the weights as they are at that moment (what
# its backward uses too), where the copies saved pay for that launch (_tile_arranges): the copies a thread saves, times
# the blocks an SM runs, reach TILE_ARRANGE_MIN_COPIES. The saving is per block, the launch once: LeNet-5 b64's second
# layer (12.5 elements a thread, 64 blocks, one an SM) lost 1.3 us a step with it, b512's (four an SM) gains 1.0 and
# MnistCnn's (24 x 3 and 20.6 x 4) 2.7 (H100, the captured step, three rounds; RESULTS.md, thirty-sixth and
# thirty-seventh sessions, with the probe that bounded the gain at 2 / 5 / 6 us)
TILE_ARRANGE = True
TILE_ARRANGE_MIN_COPIES = 16
# where it loses (H200, benchmarks/conv_variants.py): forwards of fewer than TILE_MIN_K taps C*KH*KW (MnistCnn's
# first layer, 9 taps: 10.8 us against 5.5 by direct_fwd) and input gradients of fewer than
# TILE_DX_MIN_THREADS_PER_SM threads per SM (LeNet-5's second layer at batch 64, 35: its backward 29.2 us against
# 22.9 with cuBLAS + col2im; at batch 512, 279: 60.1 against 65.9)
TILE_MIN_K = 16
TILE_DX_MIN_THREADS_PER_SM = 128
_TILE_ROWS = None             # rows per block if set (tests: partial last tiles; benchmarks), else planned
# channel splits while the grid keeps at most this many threads per SM (0: none). H200, captured steps with 0 / 1024 /
# 2048: LeNet-5 b64 92.4 / 91.1 / 91.9 us, b512 190.7 / 187.1 / 192.5, MnistCnn b64 144.2 / 142.4 / 147.1
_TILE_SPLIT_THREADS_PER_SM = 1024
_TILE_SPLIT_MAX_THREADS = 512     # ... and a float32 block at most this many (float64: _TILE_THREADS)
_TILE_SPLITS = None           # channel splits if set (tests, benchmarks), else planned
# the weight and bias gradients of the convolutions tile_conv takes (geometry and kernel sizes) by tile_wgrad where
# its plan fits (_tile_wgrad_plan): persistent blocks over tiles of TH output rows, double-buffered staging, then
# wgrad_reduce. Tests set TILE_WGRAD = False for the other dw kernels, and the _TILE_WG_* overrides
_TILE_WG_THREADS = 256        # threads per block at most (also keeps the float64 kernels' registers within a block)
_TILE_WG_BLOCKS_PER_SM = 4    # the grid: tiles spread evenly over at most this many blocks per SM (H200: MnistCnn's
                              # second layer backward 63.2 us with 4, 68.9 with 2; LeNet-5's first at b512 53.1, 57.2)
_TILE_WG_TO8_THREADS = 128    # 8 channels per thread where that makes a block of at least this many threads
_TILE_WG_ROWS = None          # rows per tile if set (tests: partial tiles), else the most the shared memory holds
_TILE_WG_GRID = None          # blocks if set (tests: one block walking every tile)
_TILE_WG_SPLIT = None         # row groups if set and they fit (tests), else the largest divisor of TH that fits
# tile_wgrad without its bias threads (one per channel group, ci == C*KS) where dropping them saves a warp: the other
# threads then sum each channel's staged g in slices (conv.cu WB == 0). MnistCnn's second layer: 4 x (48 + 1) = 196
# threads, 7 warps, the last with 4 live lanes (one warp in seven issuing for 4 threads; ncu, thirty-third session:
# 24.5 us alone for 170M multiply-adds), 6 full warps without. LeNet-5's second layer: 124 or 120, 4 warps either
# way. H100, thirty-fourth session, three rounds: MnistCnn b64 108.1 / 108.1 / 107.9 us against 105.3 x 3 with the
# bias threads (its slices' loads then had 16-way bank conflicts; now interleaved 4-vectors), LeNet-5 the same.
# With the interleaved slices it pays only beside vector staging (TILE_VEC_STAGE_8's figures). Tests set "always":
# wherever every channel keeps a thread to sum it
TILE_WG_BIAS_SPREAD = True
# tile_wgrad stages the rows of g and x 16 or 8 bytes a copy where they are aligned (_copy_bytes), else an element a
# copy. ncu's source page (H100, thirty-fourth session, eager step): MnistCnn's second layer's element copies were 23%
# of tile_wgrad's instructions (~40 a copy, 64-bit address arithmetic); its g rows take 16 bytes, x's 26-wide rows 8.
# Timed with TILE_VEC_STAGE_8 (its figures)
TILE_WG_VEC_STAGE = True
TILE_WGRAD = True
# conv2d_backward writes its input gradient as the previous convolution's g where its caller passes `into`
INTO_PRODUCER = True
# ... and, where that producer has one input channel and tile_conv's geometry, tile_conv's epilogue also computes
# its weight and bias gradients' partial sums (kernels/conv.cu tile_conv_wgrad), so that its tile_wgrad does not
# read the g written for it again (MnistCnn's first layer). Tests set it False for the producer's own kernels
INTO_WGRAD = True
# ... and where that producer pooled in its epilogue (tile_conv_pool), through the pooling's backward: the g written
# by the next convolution's tile_conv epilogue or by the linear chain's backward kernel (linear.py
# chain_into_pooled_ok), so that no pooling backward kernel runs (LeNet-5's two); also Conv2dActPool's own input
# gradient as a producer's g. Alone it loses (H100, LeNet-5's captured step: b64 85.1 / 89.1 -> 99.7 / 103.4 us,
# b512 172.4 / 173.7 -> 184.8 / 188.4): the full-resolution g the first layer gets costs more than the pooling
# backward it saves; with POOLED_WGRAD it gains (below). Tests set it False for the pooling backward kernels
INTO_POOLED = True
# ... and where that pooled producer needs no input gradient (a first layer), only its g at the pooling windows'
# maxima is written (tile_conv_unpool's compact form), and its weight and bias gradients come from that by
# pooled_wgrad: a quarter of tile_wgrad's products, no full-resolution g (LeNet-5's first layer). With INTO_POOLED
# (which it needs), against both off (H100, two rounds): b64 90.0 / 84.4 us, b512 164.1 / 165.0.
POOLED_WGRAD = True
# ... and where that first layer has one input channel and the same KS x KS kernel, tile_conv_unpool_wgrad's epilogue
# sums its weight and bias gradients' partial rows from those maxima itself (kernels/conv.cu UNPOOL_WGRAD), so that
# neither the compact g nor pooled_wgrad's kernel is needed (LeNet-5's first layer). H100, twenty-second session: ncu
# at b512 40.9 us against 36.1 + 12.4 (tile_conv_unpool, pooled_wgrad), at b64 21.8 against 17.7 + 6.3; the captured
# step, two rounds each in two calls, b512 145.7 / 147.8 and 151.0 / 145.4 us against 149.5 / 148.5 and 150.4 /
# 149.6 off, b64 and MnistCnn within the calls' spread. Tests set it False for those
UNPOOL_WGRAD = True
_UNPOOL_WGRAD_SLICES = 16     # its slices of a channel's windows at most (conv.cu ST_UPW_SLICES)
# ... and where that kernel has at most UNPOOL_WGRAD_REDUCE_MAX_BLOCKS blocks, the block that finishes last adds their
# partial rows into dw and db itself (conv.cu; ProducerGrad.wgrad), so that no wgrad_reduce launch follows it on the
# step's main stream. 0 (off): timed on an H100 (twenty-ninth session), the last block's pass costs 2.7 us of the
# ~3.5 us wgrad_reduce launch it replaces (ncu, LeNet-5 b64: 18.3 against 15.6 us), and the captured step moved
# within its spread at b64 (72.1-73.4 us at 128 against 72.7-73.4 off); at 1024, b512 lost 10 us (151 against 141)
UNPOOL_WGRAD_REDUCE_MAX_BLOCKS = 0
_POOLED_WGRAD_THREADS = {4: 256, 8: 128}   # per block by itemsize (the sums' shared memory, [threads][KS*KS + 1])
# conv2d_forward's `linear`: tile_conv's epilogue also computes a following linear layer of at most
# TILE_LINEAR_MAX_F outputs (kernels/conv.cu ST_LF) on the flattened output, over at most _TILE_LINEAR_IMAGES images
# (its per-image counters), so that the layer's own kernel does not read the output again. Tests set TILE_LINEAR =
# False for the linear layer's kernels
TILE_LINEAR = True
# ... and, where a cross-entropy of the logits follows in a captured step, the loss in that kernel too
# (tile_conv_lin_ce, _common.HOLD). Off: H100, MnistCnn's captured step at b64, 131.7 / 132.0 us with it against
# 125.1 / 127.3 without (twenty-eighth session), though the fused kernel, held to tile_conv_lin's occupancy since
# (conv.cu ST_TILE_LIN_CE_BOUND_*), takes 33.5 us under ncu against 26.0 + 6.6 for the two
TILE_LINEAR_HOLD = False
TILE_LINEAR_MAX_F = 16
_TILE_LINEAR_IMAGES = 1 << 16
# conv2d_forward's `pool`: tile_conv's epilogue also takes a 2x2, stride-2 max pooling whose windows tile the output
# (kernels/conv.cu tile_conv_pool; the plan's rows per block even); tests set it False for the pooling kernel
TILE_POOL = True
# conv2d_backward queues the weight gradient on a side stream beside the input gradient (_common.run_beside) where
# the output has at most this many elements (N*O*OH*OW). H200, captured steps (kernels of the eleventh session):
# LeNet-5 b64's second layer (65,536) 98.3 -> 94.0 us per step; b512's (524,288) and MnistCnn b64's (1,179,648)
# lost (209.6 -> 234.8, 147.7 -> 158.8 us): their kernels then filled the GPU alone. With today's kernels and the
# join deferred (below), b512's gains: H100, twenty-first session, two rounds, 155.5 / 155.4 us against 166.1 /
# 166.2 at the limit 2^17 (and 162.5 / 163.9 with neither deferred join); b64 unchanged (83.3 / 82.6 against 83.2 /
# 82.5). MnistCnn b64's second layer (1,179,648), H100, thirty-first session, two rounds: 110.1 / 111.6 us beside
# against 115.7 / 114.2 at 2^20. 0: never.
WGRAD_BESIDE_MAX_OUTPUTS = 1 << 21
# ... and joined at the end of the backward pass where the engine allows it (conv2d_backward's wgrad_beside,
# _common.run_beside's defer), so that it also runs beside the layers' backward after this one
WGRAD_BESIDE_DEFER = True
# ... or the other way round: the weight gradient on the current stream, whose blocks a replay with node priorities
# dispatches first, and the input gradient beside it, joined at once (the layer before reads it). MnistCnn's
# timeline (thirty-first session): its input gradient on the main stream ended at 85.5 us, its weight gradient's
# blocks that found no room beside it started late and ended at 101.6. H100, that session, two rounds, us off / on:
# MnistCnn b64 106.5, 107.1 / 104.2, 104.7; LeNet-5 b512 120.8, 124.5 / 123.0, 124.7 (its input gradient is the
# longer kernel there). Thirty-third session, H100, three rounds: MnistCnn 107.4 / 107.6 / 107.4 against 108.2 / 107.5 /
# 107.7 off, LeNet-5 b64 66.9 / 66.4 / 66.2 against 57.3 / 56.8 / 56.9 (b512 within its spread); a rule putting it
# first only where the input has at most 1.5x the output's positions (MnistCnn's second layer: 676 / 576), with
# fewer tile_wgrad rows, made MnistCnn 110.7-110.8. Off: no case gains
WGRAD_ON_MAIN = False
# bias_act_bwd_rows (a block per row of P elements) where P is at least this; the element-wise kernel below it
BIAS_ACT_ROWS_MIN_P = 64
_DIRECT_OB = (2, 8)           # output channels per thread direct_fwd is compiled for (ST_DIRECT in conv.cu)
_WGRAD_THREADS = 1024
_ARRANGE_THREADS = 256
_WGRAD_R = (1, 2, 4, 8)       # outputs per thread the weight-gradient kernel is compiled for
_SMEM_BYTES = SMEM_DEFAULT_BYTES   # the plans' per-block limit (no opt-in needed)
_MAX_SPLITS = 4               # threads summing one staged item's channels (conv.cu's CS)
_FITS32 = 1 << 30


@dataclass
class Conv2dSaved:
    """What conv2d_backward needs. cols: the im2col matrix [C*KH*KW, N*OH*OW] (kept only for the weight gradient,
    None on the direct path, which keeps x instead);
    weight (a reference to the parameter, no copy); y: the GEMM result [O, N*OH*OW] before bias (kept only when an
    activation was fused, to recompute its derivative); bias; the geometry; needs = (input, weight, bias) grads."""
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
    x: object = None   # the input (a reference), kept instead of cols by the direct path for the weight gradient
    pool: object = None   # the fused pooling's saved state (pool.max_pool2d_forward's) where tile_conv_pool ran
    # (TO, the weights in tile_conv's layout for the input gradient at that TO) where the forward arranged them
    # (_tile_arrange), else None
    arranged_dx: object = None


@dataclass
class ProducerGrad:
    """conv2d_backward's (or linear_chain_backward's) input gradient written for the convolution that made its
    input (`into`): that convolution's g [C, N*H*W] (its activation's derivative applied, and its pooling's
    backward where it pooled in its epilogue) and, where tile_conv's epilogue computed them too, its weight and
    bias gradients' partial rows for wgrad_reduce (else None): conv2d_backward(None, into, g=g, wpartial=wpartial);
    or wgrad, those gradients themselves (dw, db or None), where that kernel also added the rows
    (UNPOOL_WGRAD_REDUCE_MAX_BLOCKS): conv2d_backward(None, into, dwdb=wgrad)."""
    g: object
    wpartial: object = None
    wgrad: object = None


def _pads(padding, stride, dilation, kernel):
    """(top, bottom, left, right) from an int, (ph, pw), (top, bottom, left, right), 'valid' or 'same'."""
    if isinstance(padding, (tuple, list)) and len(padding) == 4:   # already resolved by smalltrain.ops.conv
        pads = tuple(operator.index(p) for p in padding)
        if min(pads) < 0:
            raise RuntimeError(f"conv2d: negative padding is not supported, got padding={list(pads)}")
        return pads
    from ...ops.conv import _padding   # one set of rules for 'same', 'valid' and ints on both devices
    return _padding(padding, stride, dilation, kernel)


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


def _validate(x, w, b, stride, padding, dilation, groups, activation):
    """The arrays' checks (every call), then the geometry's (cached per shapes and arguments)."""
    check_affine("conv2d", x, w, b, 4, activation)
    return _geometry(x.shape, w.shape, None if b is None else b.shape, stride, padding, dilation, groups)


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
def _geometry_args(n, c, h, w, kh, kw, out_hw, stride, pads, dilation):
    return (i64(n), i64(c), i64(h), i64(w), i64(kh), i64(kw), i64(out_hw[0]), i64(out_hw[1]), i64(stride[0]),
            i64(stride[1]), i64(pads[0]), i64(pads[2]), i64(dilation[0]), i64(dilation[1]))


def im2col(x, kernel_size, stride, pads, dilation, out_hw):
    """x [N, C, H, W] -> cols [C*KH*KW, N*OH*OW] (row (c*KH + i)*KW + j, column (n*OH + oh)*OW + ow).

    pads = (top, bottom, left, right); arguments already validated (conv2d_forward does that).
    """
    x = contiguous(x)
    n, c, h, w = x.shape
    kh, kw = kernel_size
    cols = cupy().empty((c * kh * kw, n * out_hw[0] * out_hw[1]), dtype=x.dtype)
    launch("conv", "im2col", x.dtype, n * out_hw[0] * out_hw[1],   # one thread per column
           (x, cols) + _geometry_args(n, c, h, w, kh, kw, out_hw, stride, pads, dilation))
    return cols


def col2im(cols, x_shape, kernel_size, stride, pads, dilation, out_hw):
    """The adjoint of im2col: dcols [C*KH*KW, N*OH*OW] -> dx [N, C, H, W] (overlaps summed, deterministic)."""
    cols = contiguous(cols)
    n, c, h, w = x_shape
    kh, kw = kernel_size
    dx = cupy().empty(tuple(x_shape), dtype=cols.dtype)
    launch("conv", "col2im", cols.dtype, dx.size,
           (cols, dx) + _geometry_args(n, c, h, w, kh, kw, out_hw, stride, pads, dilation))
    return dx


def conv2d_forward(x, w, b=None, stride=1, padding=0, dilation=1, groups=1, activation=None,
                   needs_input_grad=(True, True, True), keep_pre_activation=True, linear=None, pool=None, hold=False):
    """out = act(conv2d(x, w, b)), torch's conv2d followed by the activation: one direct or implicit-GEMM kernel
    where they take the convolution, else im2col + GEMM + epilogue.

    x [N, C, H, W], w [O, C/groups, KH, KW], b [O] or None: cupy float32/float64 arrays of one dtype on one device
    (non-contiguous inputs are copied). padding: int, (ph, pw), (top, bottom, left, right), 'valid' or 'same'.
    activation: None, 'relu', 'gelu' (erf) or 'gelu_tanh'. needs_input_grad (input, weight, bias) decides what is
    saved; keep_pre_activation=False: the output before the activation is not kept where a kernel writes it only for
    the backward (a caller that derives the activation's derivative otherwise; conv2d_backward then takes g only).
    Returns (out [N, O, OH, OW], Conv2dSaved). float32 GEMMs are full float32 unless CUPY_TF32=1 is set.
    linear=(lw [F, O*OH*OW], lb [F] or None) of x's dtype and device (the caller checks them): returns (out, saved,
    logits) with logits = flatten(out) @ lw^T + lb [N, F] where tile_conv's epilogue computes it (_tile_linear_ok),
    else None (the caller runs the linear layer). hold (with linear): that launch may be held back for the op after
    it (_common.launch_or_hold; the caller then ties the logits to it, held.mark): a cross-entropy of the logits
    then runs in its epilogue (tile_conv_lin_ce).
    pool=(kernel, stride, padding, dilation) pairs of a max pooling after the activation: where tile_conv's epilogue
    takes it (_tile_pool_ok) `out` is the pooled output [N, O, OH/2, OW/2] and saved.pool what
    pool.max_pool2d_backward_act reads (max_pool2d_forward's saved); else saved.pool is None and out unpooled.
    """
    stride, pads, dilation, groups, out_hw = _validate(x, w, b, stride, padding, dilation, groups, activation)
    needs = tuple(bool(v) for v in needs_input_grad) + (True,) * (3 - len(needs_input_grad))
    cp = cupy()
    with x.device:
        x, w, b = contiguous(x), contiguous(w), contiguous(b)
        n = x.shape[0]
        o, cg, kh, kw = w.shape
        p = out_hw[0] * out_hw[1]
        act = ACTIVATIONS[activation]
        keep_y = act and keep_pre_activation
        plan_args = (x.shape, w.shape, out_hw, stride, pads, dilation, groups, x.dtype.itemsize)
        # the pooling in tile_conv's epilogue where it takes it (a plan of even rows): out is then the pooled output
        # and pool_saved max_pool2d_forward's saved, its indices written by the epilogue; else the plain plan
        tile = _tile_forward_plan(*plan_args, even_rows=True) if pool is not None and _tile_pool_ok(pool, out_hw) \
            else None
        pool_saved = None
        if tile is not None:
            pool_hw = (out_hw[0] // 2, out_hw[1] // 2)
            out = cp.empty((n, o) + pool_hw, dtype=x.dtype)
            pool_saved = (cp.empty((n, o) + pool_hw, dtype=cp.int64), (n, o) + tuple(out_hw), x.dtype,
                          ((2, 2), (2, 2), (0, 0), (1, 1), pool_hw))
        else:
            tile = _tile_forward_plan(*plan_args)
            out = cp.empty((n, o, out_hw[0], out_hw[1]), dtype=x.dtype)
        arranged_dx = None
        direct = tile is None and _direct(x.shape, w.shape, out_hw, groups, x.dtype.itemsize)
        igemm = tile is None and not direct and _igemm(x.shape, w.shape, out_hw, groups, dilation)
        # x is kept (cols not) where the weight gradient's tiled kernel reads it or no cols matrix is made
        keep_x = (tile is not None or direct or igemm
                  or _direct_wgrad(x.shape, w.shape, out_hw, groups, x.dtype.itemsize))
        logits = None
        if tile is not None:
            cols = None
            y = cp.empty((o, n * p), dtype=x.dtype) if keep_y else None
            lin = None
            if linear is not None and (counters := _tile_linear_ok(tile, n, linear[0])) is not None:
                f = linear[0].shape[0]
                logits = cp.empty((n, f), dtype=x.dtype)
                lin = (contiguous(linear[0]), contiguous(linear[1]), logits, cp.empty((tile[3], f), dtype=x.dtype),
                       counters, f)
            args = (tile, x, w, b, out, y, x.shape[1:], (x.shape[1] * x.shape[2] * x.shape[3], x.shape[2] * x.shape[3]),
                    pads, False, act)
            arranged = None
            if TILE_ARRANGE:
                dx_plan = _tile_dx_plan_for(x.shape, w.shape, stride, dilation, groups, out_hw, x.dtype.itemsize) \
                    if needs[0] else None
                arranged, arranged_dx = _tile_arrange(w, tile, dx_plan)
            kw = {"lin": lin, "pool_idx": None if pool_saved is None else pool_saved[0], "arranged": arranged}
            if lin is None:
                _tile_conv(*args, **kw)
            else:
                launch_or_hold(hold and TILE_LINEAR_HOLD, logits, lambda ce: _tile_conv(*args, ce=ce, **kw), n,
                               x.dtype, x.device)
        elif direct:
            cols = None
            y = cp.empty((o, n * p), dtype=x.dtype) if keep_y else None
            ob = _direct_ob(n * p, o)
            weights = _direct_smem(o, cg * kh * kw, x.dtype.itemsize, ob)
            image = cg * x.shape[2] * x.shape[3] * x.dtype.itemsize
            grid, parts, splits, smem = _direct_grid(n, -(-o // ob) * p, weights, image, (cg, ob, x.dtype.itemsize))
            get("conv", f"direct_fwd_ob{ob}", x.dtype)(
                (grid,), (256,), (x, w, ptr(b), out, ptr(y)) + _int_args(x.shape, w.shape, out_hw, stride, pads,
                                                                        dilation) + (i32(act), i32(parts),
                                                                                     i32(splits)),
                shared_mem=smem)
        elif igemm:
            cols = None
            y = cp.empty((o, n * p), dtype=x.dtype) if keep_y else None
            bo = 16 if o <= 16 else 32
            blocks = -(-o // bo) * -(-(n * p) // _IGEMM_BQ[bo])
            get("conv", f"igemm_fwd_bo{bo}", x.dtype)(
                (blocks,), (256,), (x, w, ptr(b), out, ptr(y)) + _int_args(x.shape, w.shape, out_hw, stride, pads,
                                                                          dilation)
                + (i32(act),))
        else:
            cols = im2col(x, (kh, kw), stride, pads, dilation, out_hw)
            if groups == 1:
                y = gemm(w.reshape(o, cg * kh * kw), cols)
            else:
                y = gemm(w.reshape(groups, o // groups, cg * kh * kw), cols.reshape(groups, cg * kh * kw, n * p))
            y = contiguous(y.reshape(o, n * p))
            launch("conv", "bias_act_fwd", x.dtype, out.size, (y, ptr(b), out, i64(n), i64(o), i64(p), i32(act)))
    saved = Conv2dSaved(tuple(x.shape), w, b, cols if needs[1] and not keep_x else None,
                        y if keep_y else None, stride, pads, dilation, groups, out_hw, activation, needs[:3],
                        x if keep_x and needs[1] else None, pool_saved, arranged_dx)
    return (out, saved) if linear is None else (out, saved, logits)


def bias_act_backward(dout, y, b, g, n, o, p, act):
    """g [O, N, P] = dout [N, O, P] * act'(y + b[o]) (y [O, N, P], b [O] or None; y unread without an activation):
    a block per row of g where the rows are long (BIAS_ACT_ROWS_MIN_P), one thread per element otherwise."""
    args = (dout, ptr(y), ptr(b), g, i64(n), i64(o), i64(p), i32(act))
    if p >= BIAS_ACT_ROWS_MIN_P:
        get("conv", "bias_act_bwd_rows", g.dtype)((min(n * o, MAX_BLOCKS),), (128,), args)
    else:
        launch("conv", "bias_act_bwd", g.dtype, g.size, args)


def _tile_knobs():
    """The module settings tile_conv's and tile_wgrad's plans depend on (tests and benchmarks change them) and the
    SM count: part of the plans' cache keys."""
    return (TILE_CONV, TILE_WGRAD, _TILE_THREADS, _TILE_BLOCKS_PER_SM, _TILE_MIN_THREADS, _TILE_TO8_THREADS_PER_SM,
            _TILE_ROWS, _TILE_SPLIT_THREADS_PER_SM, _TILE_SPLIT_MAX_THREADS, _TILE_SPLITS, _TILE_WG_THREADS,
            _TILE_WG_BLOCKS_PER_SM, _TILE_WG_TO8_THREADS, _TILE_WG_ROWS, _TILE_WG_GRID, _TILE_WG_SPLIT,
            TILE_WG_BIAS_SPREAD, _SMEM_BYTES, TILE_TO6, _TILE_TO6_THREADS_PER_SM, _sm_count())


def _tile_plan(n, c, in_hw, o, out_hw, ks, itemsize, even_rows=False):
    """_tile_conv_plan, cached per shapes and _tile_knobs (an eager step plans each convolution 2-3 times)."""
    return _tile_conv_plan(n, c, tuple(in_hw), o, tuple(out_hw), ks, itemsize, _tile_knobs(), even_rows)


def _tile_slots(o, to):
    """OP, the slots of one tap's weights in tile_conv's shared memory: o channels in groups of TO, each in TS slots
    (TO rounded up to 4, conv.cu)."""
    return -(-o // to) * (-(-to // 4) * 4)


def _tile_weight_bytes(c, ks, o, to, itemsize):
    """tile_conv's staged weights in shared memory, [C*KS*KS][OP] (_tile_slots)."""
    return c * ks * ks * _tile_slots(o, to) * itemsize


@metadata_cache
def _tile_conv_plan(n, c, in_hw, o, out_hw, ks, itemsize, knobs, even_rows=False):
    """(TO, TH, threads, blocks, shared memory, CS) of tile_conv over n images of c input channels in_hw to o output
    channels out_hw with a ks x ks kernel, or None where it does not take the convolution (TILE_CONV off, ks not
    compiled, nothing to do, indices past 32 bits, a row of tiles over 1024 threads or one row's input and the weights
    over the shared memory). TO: 8 channels per thread where that leaves _TILE_TO8_THREADS_PER_SM threads per SM,
    else 4; 6 instead where TILE_TO6 allows it (its weights take 8 slots a tap in shared memory). TH, the output rows
    per block: of the row counts whose block fits (_TILE_THREADS threads, the shared memory), those giving
    _TILE_BLOCKS_PER_SM blocks per SM of _TILE_MIN_THREADS threads (else those of that many threads, else all), the
    one wasting the least: lanes of partial warps, staged halo rows, rows of a partial last tile (_TILE_ROWS, if set:
    the most rows up to it that fit); even_rows: an even TH only (the pooling epilogue's row pairs). CS: the input
    channels' splits over thread groups."""
    ho, wo = out_hw
    if (not TILE_CONV or ks not in _TILE_KS or min(n, c, o, ho, wo) <= 0 or n * c * in_hw[0] * in_hw[1] >= _FITS32
            or n * o * ho * wo >= _FITS32):
        return None
    cg, sms = -(-wo // _TILE_TW), knobs[-1]
    to = 8 if n * ho * cg * -(-o // 8) >= _TILE_TO8_THREADS_PER_SM * sms else 4
    if (TILE_TO6 and ks == 5 and o % to and o % 6 == 0
            and n * ho * cg * (o // 6) >= _TILE_TO6_THREADS_PER_SM * sms):
        to = 6
    og = -(-o // to)
    per_row = og * cg
    weights = _tile_weight_bytes(c, ks, o, to, itemsize)
    row_bytes = c * (cg * _TILE_TW + 4) * itemsize
    fits = [t for t in range(1, min(ho, max(1, _TILE_THREADS // per_row)) + 1)
            if weights + (t + ks - 1) * row_bytes <= _SMEM_BYTES and per_row * t <= 1024]
    if even_rows:
        fits = [t for t in fits if t % 2 == 0]
    if _TILE_ROWS is not None:
        fits = [t for t in fits if t <= _TILE_ROWS][-1:]
    if not fits:
        return None
    spread = [t for t in fits if n * -(-ho // t) >= _TILE_BLOCKS_PER_SM * sms and per_row * t >= _TILE_MIN_THREADS]
    full = [t for t in fits if per_row * t >= _TILE_MIN_THREADS]

    def useful(t):   # the fractions of the block's lanes that are threads, of the staged rows that are outputs
        return (per_row * t / (32 * -(-per_row * t // 32)) * t / (t + ks - 1)   # and of the tiles' rows that exist
                * ho / (-(-ho // t) * t), t)
    th = max(spread or full or fits, key=useful)
    tiles = -(-ho // th)
    # channel splits: the most (up to c, at least 2 channels each unless forced) that keep the grid's threads per SM
    # within _TILE_SPLIT_THREADS_PER_SM and a block within _TILE_SPLIT_MAX_THREADS (_TILE_SPLITS, if set: that many)
    threads = og * th * cg

    def reduction(split):   # the shared memory the other groups' sums pass through
        return (split - 1) * threads * to * _TILE_TW * itemsize
    most = _TILE_SPLIT_MAX_THREADS if itemsize == 4 else _TILE_THREADS   # float64: ~160 registers a thread
    cs = 1
    for split in range(2, c // 2 + 1):
        if (n * tiles * threads * split > _TILE_SPLIT_THREADS_PER_SM * sms or threads * split > most
                or reduction(split) > _SMEM_BYTES):
            break
        cs = split
    if _TILE_SPLITS is not None:
        cs = max([1] + [k for k in range(2, min(_TILE_SPLITS, c) + 1)
                        if threads * k <= most and reduction(k) <= _SMEM_BYTES])
    smem = max(weights + (th + ks - 1) * row_bytes, reduction(cs))
    return to, th, threads * cs, n * tiles, smem, cs


def _tile_geometry(stride, dilation, groups, w_shape):
    """Whether tile_conv's and tile_wgrad's geometry holds: stride 1, no dilation, groups == 1, a square kernel of a
    size they are compiled for (_TILE_KS)."""
    return (tuple(stride) == (1, 1) and tuple(dilation) == (1, 1) and groups == 1 and w_shape[2] == w_shape[3]
            and w_shape[2] in _TILE_KS)


def _tile_forward_plan(x_shape, w_shape, out_hw, stride, pads, dilation, groups, itemsize, even_rows=False):
    """tile_conv's plan (_tile_plan) for this forward, or None: it needs _tile_geometry and TILE_MIN_K taps."""
    o, cg, kh, kw = w_shape
    if not _tile_geometry(stride, dilation, groups, w_shape) or cg * kh * kw < TILE_MIN_K:
        return None
    return _tile_plan(x_shape[0], cg, x_shape[2:], o, out_hw, kh, itemsize, even_rows)


def _tile_pool_ok(pool, out_hw):
    """Whether tile_conv's pooling epilogue (kernels/conv.cu tile_conv_pool) takes this max pooling of the
    convolution's out_hw output: TILE_POOL on, 2x2 windows at stride 2, no padding or dilation, even OH and OW
    (the windows tile the output; the plan then takes an even number of rows per block)."""
    kernel, stride, pad, dil = (tuple(v) for v in pool)
    return (TILE_POOL and kernel == (2, 2) and stride == (2, 2) and pad == (0, 0) and dil == (1, 1)
            and out_hw[0] % 2 == 0 and out_hw[1] % 2 == 0)


def _tile_linear_ok(plan, n, lw):
    """The per-image counters for tile_conv's linear epilogue (conv.cu, tile_conv_lin) with this forward plan and
    linear weight lw [F, K], or None where it does not take it: TILE_LINEAR off, F over TILE_LINEAR_MAX_F, a block
    of partial warps (its warp sums), more images than counters, indices past 32 bits, or counters not made yet
    while a CUDA graph is captured."""
    f, k = lw.shape
    if (not TILE_LINEAR or not 0 < f <= TILE_LINEAR_MAX_F or plan[2] % 32 or n > _TILE_LINEAR_IMAGES
            or f * k >= _FITS32 or plan[3] * f >= _FITS32):
        return None
    return device_counters("tile_conv_lin", _TILE_LINEAR_IMAGES)


def _tile_conv(plan, inp, w, b, out, y, in_chw, in_strides, pads, transposed, act, into_nchw=None, lin=None,
               pool_idx=None, wgrad=None, compact=False, ce=None, reduce=None, arranged=None):
    """Launch tile_conv by `plan` (_tile_plan): `inp` read as [N, C, H, W] with image and channel strides
    in_strides, written to out [N, O, Ho, Wo] (and y [O, N, Ho*Wo] where given); pads = (top, bottom, left, right)
    of the correlation; transposed: the weights read as the input gradient's (flipped, [C][O] swapped).
    into_nchw (with transposed): the result's shape (N, O, Ho, Wo), written to out [O, N*Ho*Wo] times
    act'(y + b), y and b read (conv.cu, "into"). lin (forward): (lw [F, O*Ho*Wo], lb or None, logits [N, F],
    partials [blocks, F], counters, F) for tile_conv_lin's linear epilogue (_tile_linear_ok), with ce (the
    cross-entropy's arguments, HeldHead.with_cross_entropy) the loss of the logits after it (tile_conv_lin_ce).
    pool_idx (forward, _tile_pool_ok): int64 [N, O, Ho/2, Wo/2] for tile_conv_pool, out then the pooled output of
    that shape; with into_nchw: the producer's pooling indices [N, O, Ho, Wo] (it pooled in tile_conv_pool), out
    then its g [O, N*4*Ho*Wo], through the pooling's backward (tile_conv_unpool), or with compact only its values
    at the windows' maxima, [O, N*Ho*Wo], for pooled_wgrad. wgrad (with into_nchw, _into_wgrad): (the producer's
    x [N, 1, H, W], H, W, its top and left padding, partial rows [blocks, O*(KS*KS + 1)]) for tile_conv_wgrad's
    epilogue; with pool_idx and compact too (_unpool_wgrad), for
    tile_conv_unpool_wgrad's, out then None (no g is written); and with reduce (_unpool_wgrad_reduce: dw, db or
    None, a counter) its last block adds the partial rows into dw and db too. arranged: w in the kernel's
    shared-memory layout (_tile_arrange, for this plan and direction), read instead of w (which still gives KS)."""
    to, th, threads, blocks, smem, cs = plan
    n, o, ho, wo = out.shape if into_nchw is None else into_nchw
    pool_fwd = pool_idx is not None and into_nchw is None
    if pool_fwd:
        ho, wo = 2 * ho, 2 * wo
    name, lin_args = "tile_conv", (ptr(None),) * 5 + (i32(0),)
    if lin is not None:   # its block sums and ticket pass through the shared memory after the tiles
        name = "tile_conv_lin" if ce is None else "tile_conv_lin_ce"
        lin_args = (lin[0], ptr(lin[1]), lin[2], lin[3], lin[4], i32(lin[5]))
        # (with the cross-entropy: 16 bytes for the ticket, then block_sum's one value per warp)
        smem = max(smem, threads // 32 * (TILE_LINEAR_MAX_F + (ce is not None)) * out.dtype.itemsize
                   + (4 if ce is None else 16))
    elif pool_fwd:   # split 0's outputs pass through the shared memory, [threads][TO][4]
        name = "tile_conv_pool"
        smem = max(smem, threads // cs * to * _TILE_TW * out.dtype.itemsize)
    elif pool_idx is not None and wgrad is not None:   # into a pooled producer's weight gradient (_unpool_wgrad)
        name = "tile_conv_unpool_wgrad"
        smem = _unpool_wgrad_smem(plan, o, wo, w.shape[3], inp.dtype.itemsize)
        if reduce is not None:   # dw, db and the ticket's counter in the linear epilogue's slots (conv.cu)
            lin_args = (ptr(None), ptr(None), reduce[0], ptr(reduce[1]), reduce[2], i32(0))
    elif pool_idx is not None:   # into a producer that pooled
        name = "tile_conv_unpool"
    elif wgrad is not None:   # split 0's sums per (channel, tap) pass through the shared memory
        name = "tile_conv_wgrad"
        smem = max(smem, _wgrad_epilogue_smem(plan, w.shape[3], inp.dtype.itemsize))
    wgrad_args = (ptr(None),) + i32s((0, 0, 0, 0)) + (ptr(None),) if wgrad is None else \
        (wgrad[0],) + i32s(wgrad[1:5]) + (wgrad[5],)
    arr = "" if arranged is None else "_arr"   # (the instance that stages the arranged copy)
    with_smem(get("conv", f"{name}_k{w.shape[3]}_to{to}{arr}", inp.dtype), smem)(
        (blocks,), (threads,), (inp, w if arranged is None else arranged, ptr(b), ptr(out), ptr(y)) + i32s(
            (n,) + tuple(in_chw) + tuple(in_strides) + (o, ho, wo, pads[0], pads[2], th, cs, int(transposed),
                                                        (2 if compact else 1) if into_nchw is not None else 0,
                                                        act)) + lin_args
        + (ptr(pool_idx),) + wgrad_args + i32s((_tile_vec_stage(inp, in_chw, in_strides, pads),
                                                  _tile_weight_run(threads, o, to))) + (ce or ()),
        shared_mem=smem)


def _tile_weight_run(threads, o, to):
    """The consecutive taps of one weight slot that neighbouring threads of tile_conv stage (TILE_WEIGHT_RUN): the
    largest run up to it such that the block's threads are a multiple of the slots (_tile_slots of o output channels
    in groups of `to`) times the run, else 1."""
    slots = _tile_slots(o, to)
    return max(r for r in range(1, max(1, TILE_WEIGHT_RUN) + 1) if threads % (slots * r) == 0 or r == 1)


def _tile_arranges(elements, threads, blocks, sms=None):
    """Whether a layout of `elements` staged by `blocks` blocks of `threads` threads is worth tile_arrange's launch:
    the copies a thread saves, times the blocks an SM runs one after another or side by side (they share its
    load/store pipe), reach TILE_ARRANGE_MIN_COPIES. sms: the device's SMs (default: the current device's)."""
    return elements * -(-blocks // (sms or _sm_count())) >= TILE_ARRANGE_MIN_COPIES * threads


def _tile_arrange(w, fwd, dx):
    """w [O, C, KS, KS] in tile_conv's shared-memory layouts (TILE_ARRANGE, which the caller checks; conv.cu
    tile_arrange, one launch) for the plans fwd (its forward) and dx (its input gradient), each a plan or None: a
    layout is made where _tile_arranges says it pays. Returns (the forward's or None, (the input gradient's TO, its
    layout) or None)."""
    o, c, ks, _ = w.shape
    kk = ks * ks

    def size(plan, channels, taps):   # the layout's elements, [taps*KK][slots], or 0 where none is made
        if plan is None:
            return 0
        elements = taps * kk * _tile_slots(channels, plan[0])
        return elements if _tile_arranges(elements, plan[2], plan[3]) else 0
    nf, nd = size(fwd, o, c), size(dx, c, o)
    if not nf + nd:
        return None, None
    # one buffer: the input gradient's part starts 16-byte aligned (slots are a multiple of 4)
    buf = cupy().empty(nf + nd, dtype=w.dtype)
    fa, da = (buf[:nf] if nf else None), (buf[nf:] if nd else None)
    get("conv", "tile_arrange", w.dtype)((-(-max(nf, nd) // _ARRANGE_THREADS),), (_ARRANGE_THREADS,), (
        w, ptr(fa), i32(fwd[0] if nf else 4), ptr(da), i32(dx[0] if nd else 4), i32(o), i32(c), i32(kk)))
    return fa, ((dx[0], da) if nd else None)


def _tile_vec_stage(inp, in_chw, in_strides, pads):
    """The bytes per copy tile_conv stages `inp` with (read as [N, C, H, W] with image and channel strides
    in_strides, the correlation's pads (top, bottom, left, right)): _copy_bytes with TILE_VEC_STAGE and
    TILE_VEC_STAGE_8, its itemsize (an element a copy) where neither applies."""
    return _copy_bytes(inp, in_chw[2], pads[2], in_strides, TILE_VEC_STAGE, TILE_VEC_STAGE_8)


def _copy_bytes(arr, width, left, strides, vec16, vec8):
    """The bytes per cp.async copy a kernel can stage rows of `arr` with (rows `width` wide, `left` columns of zero
    padding before each in shared memory, whose rows are a multiple of 4 elements wide; strides: the element
    strides between rows' planes): 16 (vec16 on) or 8 (vec8 on, float32: two elements) where arr is that many bytes
    aligned and the width, the padding and the strides are multiples of that many bytes' elements (a copy then lies
    wholly inside a row or wholly in the padding), else arr's itemsize (an element a copy)."""
    for size, on in ((16, vec16), (8, vec8 and arr.dtype.itemsize == 4)):
        v = size // arr.dtype.itemsize
        if on and arr.data.ptr % size == 0 and width % v == 0 and left % v == 0 and all(s % v == 0 for s in strides):
            return size
    return arr.dtype.itemsize


def _wgrad_epilogue_smem(plan, ks, itemsize):
    """tile_conv_wgrad's sums in shared memory: [TO][KS*KS + 1][threads of split 0]."""
    to, _, threads, _, _, cs = plan
    return to * (ks * ks + 1) * (threads // cs) * itemsize


def _unpool_wgrad_smem(plan, o, wo, ks, itemsize):
    """tile_conv_unpool_wgrad's shared memory: first what it prefetches for its epilogue (conv.cu
    st_unpool_prefetch_bytes: the producer's pooling indices of the block's rows [O][TH][Wo] (int64) and its x under
    them [2*TH + KS - 1][2*Wo + KS - 1], rounded up to 16 bytes), then the most of the plan's (the tiles, the splits'
    sums) and the epilogue's: the g at the maxima [O][TH][Wo], the slices' sums [O][S][KS*KS + 1] (S: the block's
    threads per channel, 1 to _UNPOOL_WGRAD_SLICES, conv.cu st_unpool_wgrad_slices), the maxima's offsets (int)
    [O][TH][Wo], the NaN taps [O][KS*KS] (bytes)."""
    th, threads = plan[1], plan[2]
    slices = max(1, min(threads // o, _UNPOOL_WGRAD_SLICES))
    prefetch = -(-(o * th * wo * 8 + (2 * th + ks - 1) * (2 * wo + ks - 1) * itemsize) // 16) * 16
    epilogue = (o * th * wo + o * slices * (ks * ks + 1)) * itemsize + o * th * wo * 4 + o * ks * ks
    return prefetch + max(plan[4], epilogue)


def _unpool_wgrad_ok(plan, into, ks, itemsize, out_w, optin):
    """Whether tile_conv_unpool_wgrad's epilogue takes the weight gradient of `into`, a producer that pooled in its
    epilogue to out_w columns and whose g pooled_wgrad would take from the maxima (_pooled_wgrad_plan, decided by
    the caller): UNPOOL_WGRAD on, one input channel, the same KS x KS kernel as `plan`'s and the kernel's shared
    memory with the epilogue's within `optin` bytes (the device's limit once a kernel opts in)."""
    return (UNPOOL_WGRAD and into.x_shape[1] == 1 and tuple(into.weight.shape[2:]) == (ks, ks)
            and _unpool_wgrad_smem(plan, into.weight.shape[0], out_w, ks, itemsize) <= optin)


def _unpool_wgrad(plan, into, ks, dtype, out_w):
    """tile_conv_unpool_wgrad's arguments (_tile_conv's wgrad) where _unpool_wgrad_ok, else None; the partial rows
    [blocks, O*(KS*KS + 1)]: one per block of the plan."""
    if not _unpool_wgrad_ok(plan, into, ks, dtype.itemsize, out_w, smem_optin_bytes()):
        return None
    partial = cupy().empty((plan[3], into.weight.shape[0] * (ks * ks + 1)), dtype=dtype)
    return (into.x,) + tuple(into.x_shape[2:]) + (into.pads[0], into.pads[2], partial)


def _unpool_wgrad_reduce(plan, into, dtype):
    """(dw, db or None, counter) for tile_conv_unpool_wgrad's last block to add its partial rows into (_tile_conv's
    reduce), where the plan has at most UNPOOL_WGRAD_REDUCE_MAX_BLOCKS blocks and the counter exists (a capture
    before it does takes wgrad_reduce), else None. db where `into` has a bias and needs its gradient."""
    counter = device_counters("tile_conv_unpool_wgrad", 1) if plan[3] <= UNPOOL_WGRAD_REDUCE_MAX_BLOCKS else None
    if counter is None:
        return None
    want_b = into.needs[2] and into.bias is not None
    return grad_array(into.weight), grad_array(into.bias) if want_b else None, counter


def _into_wgrad(plan, into, ks, dtype):
    """tile_conv_wgrad's arguments (_tile_conv's wgrad) for the input gradient written as `into`'s g, or None where
    its epilogue does not take `into`'s weight gradient: INTO_WGRAD off, `into` needs no weight gradient or kept no
    x, or has not one input channel, the same KS x KS kernel and tile_conv's geometry, pooled in its epilogue (the
    g is written through the pooling), or the sums' shared memory is over the default limit. The partial rows: one
    per block of the plan."""
    if (not INTO_WGRAD or not into.needs[1] or into.x is None or into.x_shape[1] != 1 or into.pool is not None
            or tuple(into.weight.shape[2:]) != (ks, ks)
            or not _tile_geometry(into.stride, into.dilation, into.groups, into.weight.shape)
            or max(plan[4], _wgrad_epilogue_smem(plan, ks, dtype.itemsize)) > _SMEM_BYTES):
        return None
    partial = cupy().empty((plan[3], into.weight.shape[0] * (ks * ks + 1)), dtype=dtype)
    return (into.x,) + tuple(into.x_shape[2:]) + (into.pads[0], into.pads[2], partial)


def _tile_dx_plan(saved, g):
    """tile_conv's plan for the input gradient of `saved` from g, or None where it does not take it
    (_tile_dx_plan_for)."""
    return _tile_dx_plan_for(saved.x_shape, saved.weight.shape, saved.stride, saved.dilation, saved.groups,
                             saved.out_hw, g.dtype.itemsize)


def _tile_dx_plan_for(x_shape, w_shape, stride, dilation, groups, out_hw, itemsize):
    """tile_conv's plan for the input gradient of a convolution of x_shape by w_shape (its output out_hw), or None:
    _tile_forward_plan's rules but the taps' on the transposed geometry, 32-bit indices and
    TILE_DX_MIN_THREADS_PER_SM."""
    n, c, h, wd = x_shape
    o, _, kh, kw = w_shape
    if not _tile_geometry(stride, dilation, groups, w_shape):
        return None
    plan = _tile_plan(n, o, out_hw, c, (h, wd), kh, itemsize)
    if (plan is None or n * o * out_hw[0] * out_hw[1] >= _FITS32
            or plan[2] * plan[3] < TILE_DX_MIN_THREADS_PER_SM * _sm_count()):
        return None
    return plan


def _tile_dx(g, saved, into=None):
    """dx [N, C, H, W] from g [O, N*OH*OW] by tile_conv (the full correlation of g with the flipped kernel), or
    None where it does not take the convolution (_tile_dx_plan). With `into` (the Conv2dSaved of the convolution
    whose output x is, fitting _into_ok), dx is written as that convolution's g [C, N*H*W], times its activation's
    derivative, and returned as a ProducerGrad (with that convolution's weight gradient partials where _into_wgrad
    takes it); where that convolution pooled in its epilogue (into.pool), through the pooling's backward: g [C,
    N*4*H*W], or where _pooled_wgrad_plan takes it only the partial rows (g None), from the g at the windows'
    maxima."""
    n, c, h, wd = saved.x_shape
    o, _, kh, kw = saved.weight.shape
    plan = _tile_dx_plan(saved, g)
    if plan is None:
        return None
    dtype = g.dtype
    pooled = into is not None and into.pool is not None
    pooled_plan = _pooled_wgrad_plan(into, dtype) if pooled else None   # then only the maxima's g is written
    shape = (c, n * h * wd * (4 if pooled and pooled_plan is None else 1)) if into is not None \
        else tuple(saved.x_shape)
    if math.prod(shape) >= _FITS32:
        return None
    # ... or not even that, its weight gradient taken in the epilogue
    unpool_wgrad = _unpool_wgrad(plan, into, kh, dtype, wd) if pooled_plan is not None else None
    reduce = _unpool_wgrad_reduce(plan, into, dtype) if unpool_wgrad is not None else None
    dx = cupy().empty(shape, dtype=dtype) if unpool_wgrad is None else None
    p = saved.out_hw[0] * saved.out_hw[1]
    pads = saved.pads
    # the forward's arrangement of the weights for this plan (a knob changed since may have changed its TO)
    arranged = saved.arranged_dx[1] if saved.arranged_dx is not None and saved.arranged_dx[0] == plan[0] else None
    if into is None:
        _tile_conv(plan, g, saved.weight, None, dx, None, (o,) + tuple(saved.out_hw), (p, n * p),
                   (kh - 1 - pads[0], 0, kw - 1 - pads[2], 0), True, 0, arranged=arranged)
    else:   # y and b are the producer's, read; the output in its g layout (conv.cu, "into")
        act = ACTIVATIONS[into.activation]
        wgrad = _into_wgrad(plan, into, kh, dtype) if unpool_wgrad is None else unpool_wgrad
        _tile_conv(plan, g, saved.weight, into.bias if act else None, dx, into.y if act else None,
                   (o,) + tuple(saved.out_hw), (p, n * p), (kh - 1 - pads[0], 0, kw - 1 - pads[2], 0), True, act,
                   tuple(saved.x_shape), pool_idx=into.pool[0] if pooled else None, wgrad=wgrad,
                   compact=pooled_plan is not None, reduce=reduce, arranged=arranged)
        if reduce is not None:   # the producer's weight and bias gradients themselves
            return ProducerGrad(None, wgrad=reduce[:2])
        if pooled_plan is not None:   # the producer needs no g, only its weight and bias gradients' partial rows
            return ProducerGrad(None, wgrad[5] if unpool_wgrad is not None else _pooled_wgrad(dx, into, pooled_plan))
        return ProducerGrad(dx, None if wgrad is None else wgrad[5])
    return dx


def _pooled_wgrad_plan(into, dtype):
    """(threads, images per block, blocks, shared memory) for pooled_wgrad on `into`'s compact g, or None where it
    does not take `into`: POOLED_WGRAD off, `into` not pooled in its epilogue, needing its input gradient or not its
    weight gradient, without its x, not tile_conv's geometry, over 256 channels, or the images or sums over the
    default shared memory. About two blocks per SM; threads a multiple of the channels."""
    if (not POOLED_WGRAD or into.pool is None or into.needs[0] or not into.needs[1]
            or into.x is None or not _tile_geometry(into.stride, into.dilation, into.groups, into.weight.shape)
            or into.weight.shape[0] > 256):
        return None
    n, c, h, wd = into.x_shape
    o, ks = into.weight.shape[0], into.weight.shape[2]
    threads = _POOLED_WGRAD_THREADS.get(dtype.itemsize, 128) // o * o or o
    per_block = max(1, -(-n // (2 * _sm_count())))

    def smem(images):   # the staged images, one input channel's sums, a NaN-tap flag per (channel, input channel, tap)
        return (images * c * h * wd + threads * (ks * ks + 1)) * dtype.itemsize + o * c * ks * ks
    while per_block > 1 and smem(per_block) > _SMEM_BYTES:
        per_block //= 2
    if smem(per_block) > _SMEM_BYTES or into.pool[0].size >= _FITS32 or n * c * h * wd >= _FITS32:
        return None
    return threads, per_block, -(-n // per_block), smem(per_block)


def _pooled_wgrad(gw, into, plan):
    """pooled_wgrad's partial rows [blocks, O*(C*KS*KS + 1)] (wgrad_reduce's) of `into` from gw [O, N*P], its g at
    its pooling's P windows' maxima per image (kernels/conv.cu pooled_wgrad), by _pooled_wgrad_plan's plan."""
    threads, per_block, blocks, smem = plan
    n, c, h, wd = into.x_shape
    pidx = into.pool[0]
    o, ks = into.weight.shape[0], into.weight.shape[2]
    partial = cupy().empty((blocks, o * (c * ks * ks + 1)), dtype=gw.dtype)
    get("conv", f"pooled_wgrad_k{ks}", gw.dtype)((blocks,), (threads,), (gw, pidx, into.x, partial) + i32s(
        (n, c, o, h, wd, into.out_hw[1], pidx.shape[2] * pidx.shape[3], into.pads[0], into.pads[2], per_block)),
        shared_mem=smem)
    return partial


def producer_output(into, dtype):
    """The shape of the output `into` (a Conv2dSaved) made, its pooled output's where it pooled in its epilogue,
    where the next layer may write its g (conv2d_backward's `into`, linear_chain_backward's): of `dtype`, INTO_POOLED
    on where it pooled, and the output before the bias kept where its activation's derivative needs it; else None."""
    if into is None or into.weight.dtype != dtype or (into.pool is not None and not INTO_POOLED):
        return None
    if into.activation is not None and into.y is None:
        return None
    if into.pool is not None:
        return tuple(into.pool[0].shape)
    return (into.x_shape[0], into.weight.shape[0]) + tuple(into.out_hw)


def _into_ok(saved, into, dtype):
    """Whether conv2d_backward can write its input gradient as `into`'s g: producer_output allows it, `into` made x,
    and computes no g itself."""
    return producer_output(into, dtype) == tuple(saved.x_shape)


def _tile_wgrad_plan(saved, itemsize):
    """_tile_wgrad_plan_for this convolution, cached per geometry and _tile_knobs."""
    return _tile_wgrad_plan_for(tuple(saved.x_shape), tuple(saved.weight.shape), tuple(saved.out_hw),
                                tuple(saved.stride), tuple(saved.dilation), saved.groups, itemsize, _tile_knobs())


@metadata_cache
def _tile_wgrad_plan_for(x_shape, w_shape, out_hw, stride, dilation, groups, itemsize, knobs):
    """(TO, TH, RS, threads, grid, shared memory, WB) of tile_wgrad for this convolution, or None where it does not take
    it (TILE_WGRAD off, not tile_conv's geometry or kernel sizes, a block of over _TILE_WG_THREADS threads, tiles too
    large for the shared memory, 32-bit indices). TO: 8 channels per thread where that makes _TILE_WG_TO8_THREADS
    threads (MnistCnn's second layer: 4 x 49), else 4. TH: the most rows whose two tile buffers fit, evened out over
    the image. RS: threads per row group, the largest divisor of TH within _TILE_WG_THREADS (LeNet-5's first layer:
    12 of 2 x 6 threads). The grid spreads the tiles evenly over up to _TILE_WG_BLOCKS_PER_SM blocks per SM. WB: 1
    with a bias thread per channel group, 0 without (the kernel's other threads sum the bias; TILE_WG_BIAS_SPREAD)."""
    n, c, h, wd = x_shape
    o, cg, kh, kw = w_shape
    ho, wo = out_hw
    if (not TILE_WGRAD or not _tile_geometry(stride, dilation, groups, w_shape) or min(n, c, o, ho, wo) <= 0
            or n * c * h * wd >= _FITS32 or o * n * ho * wo >= _FITS32):
        return None
    ci = c * kh + 1
    to = 8 if -(-o // 8) * ci >= _TILE_WG_TO8_THREADS else 4
    op = -(-o // to) * to
    base = op // to * ci
    if base > _TILE_WG_THREADS:
        return None
    gw = -(-wo // _TILE_TW) * _TILE_TW

    def buffers(t):   # two tiles of g [OP][t][GW] and x [C][t + KS - 1][GW + 4]
        return 2 * (op * t * gw + c * (t + kh - 1) * (gw + 4)) * itemsize
    fits = [t for t in range(1, ho + 1) if buffers(t) <= _SMEM_BYTES]
    if _TILE_WG_ROWS is not None:
        fits = [t for t in fits if t <= _TILE_WG_ROWS]
    if not fits:
        return None
    th = fits[-1] if _TILE_WG_ROWS is not None else -(-ho // -(-ho // fits[-1]))
    splits = [d for d in range(1, max(th, _TILE_WG_SPLIT or 1) + 1) if base * d <= _TILE_WG_THREADS
              and (d == 1 or base * d * to * kh * itemsize <= _SMEM_BYTES)]   # the row groups' sums meet in smem
    rs = [d for d in splits if th % d == 0][-1] if _TILE_WG_SPLIT not in splits else _TILE_WG_SPLIT
    tiles = n * -(-ho // th)
    grid = -(-tiles // -(-tiles // (_TILE_WG_BLOCKS_PER_SM * knobs[-1])))
    grid = grid if _TILE_WG_GRID is None else min(_TILE_WG_GRID, tiles)
    if o * (cg * kh * kw + 1) * grid >= _FITS32:
        return None
    red = base * rs * to * kh * itemsize if rs > 1 else 0
    # without the bias threads (TILE_WG_BIAS_SPREAD) where that saves a warp and every channel keeps a thread to sum it
    spread = op // to * (ci - 1) * rs
    fewer_warps = -(-spread // 32) < -(-base * rs // 32)
    if TILE_WG_BIAS_SPREAD and (fewer_warps or TILE_WG_BIAS_SPREAD == "always") and spread >= op:
        return to, th, rs, spread, grid, max(buffers(th), red, spread * itemsize), 0
    return to, th, rs, base * rs, grid, max(buffers(th), red), 1


def _tile_weight_grad(x, g, saved, with_bias, plan):
    """(dw, db or None) by tile_wgrad (its partial rows, one per block) and wgrad_reduce."""
    to, th, rs, threads, grid, smem, wb = plan
    n, c, h, wd = saved.x_shape
    o, _, ks, _ = saved.weight.shape
    partial = cupy().empty((grid, o * (c * ks * ks + 1)), dtype=g.dtype)
    # the rows of g (no padding) and of x (the left padding) staged 16 or 8 bytes a copy where aligned
    gb = _copy_bytes(g, saved.out_hw[1], 0, (saved.out_hw[0] * saved.out_hw[1],), TILE_WG_VEC_STAGE, TILE_WG_VEC_STAGE)
    xb = _copy_bytes(x, wd, saved.pads[2], (c * h * wd, h * wd), TILE_WG_VEC_STAGE, TILE_WG_VEC_STAGE)
    get("conv", f"tile_wgrad_k{ks}_to{to}", g.dtype)(
        (grid,), (threads,), (x, g, partial) + i32s((n, c, h, wd, o) + tuple(saved.out_hw) + (
            saved.pads[0], saved.pads[2], th, rs, wb, gb, xb)),
        shared_mem=smem)
    return _reduce_partials(partial, saved.weight, saved.bias if with_bias else None)


def _direct(x_shape, w_shape, out_hw, groups, itemsize):
    """Whether the direct kernels take this convolution (see the module docstring): the weight gradient's rule
    (_direct_wgrad) and the forward's weights in shared memory."""
    o, cg, kh, kw = w_shape
    return (_direct_wgrad(x_shape, w_shape, out_hw, groups, itemsize)
            and _direct_smem(o, cg * kh * kw, itemsize) <= _SMEM_BYTES)


def _igemm_fits(x_shape, w_shape, out_hw, groups, dilation):
    """What both implicit-GEMM kernels need: groups == 1, a non-empty output and reduction, 32-bit indices into x
    and g, and tap offsets that pack into 16 bits each."""
    n, c, h, w = x_shape
    o, cg, kh, kw = w_shape
    np_ = n * out_hw[0] * out_hw[1]
    return (groups == 1 and np_ > 0 and cg * kh * kw > 0 and n * c * h * w < _FITS32 and o * np_ < _FITS32
            and dilation[0] * (kh - 1) < 1 << 15 and dilation[1] * (kw - 1) < 1 << 15)


def _igemm(x_shape, w_shape, out_hw, groups, dilation):
    """Whether igemm_fwd takes this forward: _igemm_fits and C*KH*KW up to IGEMM_MAX_K (its tap table in shared
    memory)."""
    _, cg, kh, kw = w_shape
    return cg * kh * kw <= IGEMM_MAX_K and _igemm_fits(x_shape, w_shape, out_hw, groups, dilation)


def _direct_wgrad(x_shape, w_shape, out_hw, groups, itemsize):
    """Whether _weight_grad takes this convolution's dw and db (from x): groups == 1, a small C*KH*KW, at most
    DIRECT_MAX_MACS multiply-adds, its tiles in shared memory, a non-empty batch and 32-bit indices."""
    n, c, h, w = x_shape
    o, cg, kh, kw = w_shape
    k, np_ = cg * kh * kw, n * out_hw[0] * out_hw[1]
    return (groups == 1 and 0 < k <= DIRECT_MAX_K and np_ > 0 and o * k * np_ <= DIRECT_MAX_MACS
            and o * (k + 1) <= _WGRAD_THREADS * _WGRAD_R[-1]
            and n * c * h * w < _FITS32 and o * np_ < _FITS32 and _tile(o, k, itemsize) is not None)


def _direct_ob(positions, o):
    """Channels per thread of the direct kernels (o output channels of direct_fwd, or input channels of direct_dx,
    over `positions` positions): 8, unless that leaves fewer than ~2 threads per core of the GPU (LeNet-5's second
    layer at batch 64: 8,192 threads, latency-bound), then 2."""
    return 8 if positions * -(-o // 8) >= 2 * 128 * _sm_count() else 2


def _dx_smem(o, c, kk, itemsize, cb):
    return o * kk * -(-c // cb) * cb * itemsize   # the weights as [O*KH*KW][C rounded up to cb]


def _direct_dx_cb(x_shape, w_shape, groups, itemsize):
    """Input channels per thread of direct_dx for this convolution, or None where the GEMM + col2im path takes
    dx: groups > 1, C*KH*KW above DIRECT_MAX_K, more than DIRECT_DX_MAX_MACS multiply-adds, a weight table too
    large for shared memory, or fewer than DIRECT_DX_MIN_THREADS_PER_SM threads per SM (a latency-bound gather)."""
    n, c, h, wd = x_shape
    o, _, kh, kw = w_shape
    cb = _direct_ob(n * h * wd, c)   # by the forward's rule
    if (groups != 1 or not 0 < c * kh * kw <= DIRECT_MAX_K or n * c * h * wd * o * kh * kw > DIRECT_DX_MAX_MACS
            or _dx_smem(o, c, kh * kw, itemsize, cb) > _SMEM_BYTES or n * c * h * wd >= _FITS32
            or n * h * wd * -(-c // cb) < DIRECT_DX_MIN_THREADS_PER_SM * _sm_count()):
        return None
    return cb


def _direct_dx(g, saved):
    """dx [N, C, H, W] from g [O, N*OH*OW] by direct_dx, or None where that kernel does not take the convolution
    (_direct_dx_cb): the caller then takes the GEMM + col2im path."""
    n, c, h, wd = saved.x_shape
    o, _, kh, kw = saved.weight.shape
    cb = _direct_dx_cb(saved.x_shape, saved.weight.shape, saved.groups, g.dtype.itemsize)
    if cb is None or g.size >= _FITS32:
        return None
    smem = _dx_smem(o, c, kh * kw, g.dtype.itemsize, cb)
    dx = cupy().empty(tuple(saved.x_shape), dtype=g.dtype)
    if dx.size == 0:
        return dx
    p = saved.out_hw[0] * saved.out_hw[1]
    grid, parts, _, smem = _direct_grid(n, -(-c // cb) * h * wd, smem, o * p * g.dtype.itemsize)
    get("conv", f"direct_dx_cb{cb}", g.dtype)(
        (grid,), (256,), (g, saved.weight, dx) + _int_args(saved.x_shape, saved.weight.shape, saved.out_hw,
                                                            saved.stride, saved.pads, saved.dilation) + (i32(parts),),
        shared_mem=smem)
    return dx


def _direct_grid(n, items, weight_bytes, image_bytes, split=None):
    """(grid, parts per image, splits, shared memory) of a direct kernel over n images of `items` thread items
    each.

    Staged (parts >= 1, see conv.cu) when the image's input fits in shared memory beside the weights and the batch
    is at most ~8 images per SM: parts blocks per image, enough for ~4 blocks per SM but no more than the image's
    items fill. Else parts = 0 and a grid-stride loop over the batch (each block stages only the weights, which a
    block per image would restage thousands of times for a large evaluation batch).

    split = (summed channels, outputs per item, itemsize), for direct_fwd only: a staged launch that would leave
    fewer than 8 warps per SM sums each item's input channels over up to _MAX_SPLITS threads (a power of two, up to
    ~32 warps per SM), the partial sums meeting in shared memory after the image. H200, LeNet-5 conv2 at batch 64:
    19.6 -> 12.4 us. Not for direct_dx (the same split over output channels made it slower: 20.8 -> 24.3 us) nor
    for filled launches (batch 512: slower)."""
    if weight_bytes + image_bytes <= _SMEM_BYTES and n <= 8 * _sm_count():
        splits, red = 1, 0
        if split is not None and n * items < 256 * _sm_count():
            reduced, per_thread, itemsize = split
            splits = min(_MAX_SPLITS, reduced, (1024 * _sm_count()) // (n * items))
            splits = 1 << (splits.bit_length() - 1)   # a power of two, so that it divides the 256 threads
            red = 256 * per_thread * itemsize if splits > 1 else 0
            if weight_bytes + image_bytes + red > _SMEM_BYTES:
                splits, red = 1, 0
        parts = max(1, min(-(-4 * _sm_count() // n), -(-items // (256 // splits))))
        return n * parts, parts, splits, weight_bytes + image_bytes + red
    return min(-(-(n * items) // 256), 8 * _sm_count()), 0, 1, weight_bytes


def _direct_smem(o, k, itemsize, ob=_DIRECT_OB[-1]):
    return k * -(-o // ob) * ob * itemsize   # the weights as [K][O rounded up to ob]


def _tile(o, k, itemsize):
    """Positions per weight-gradient tile: the largest of 128, 64, 32 whose shared memory fits in one block."""
    for tq in (128, 64, 32):
        if _wgrad_smem(o, k, tq, itemsize) <= _SMEM_BYTES:
            return tq
    return None


def _wgrad_smem(o, k, tq, itemsize):
    return (o + k) * (tq + 1) * itemsize + (3 * k + 3 * tq) * 4   # g and cols tiles, then the int offset tables


def _int_args(x_shape, w_shape, out_hw, stride, pads, dilation):
    n, c, h, w = x_shape
    return i32s((n, c, h, w, w_shape[0], w_shape[2], w_shape[3], out_hw[0], out_hw[1], stride[0], stride[1], pads[0],
                 pads[2], dilation[0], dilation[1]))


def _sm_count():
    return device_attribute("MultiProcessorCount")


def _wgrad_kernel(saved, itemsize):
    """Which kernel computes dw (and db) from the input x the forward kept: 'tile' (tile_wgrad) where its plan fits,
    else 'igemm' (igemm_wgrad) where its best tile is at least IGEMM_WGRAD_MIN_USE used (O*(K+1) over the tiles'
    area) or the tiled kernel does not take the convolution, else 'tiled' (wgrad_partial, _direct_wgrad's rule);
    None for cuBLAS over the cols matrix (kept by the forward, or made from x)."""
    if saved.x is None:
        return None
    if _tile_wgrad_plan(saved, itemsize) is not None:
        return "tile"
    tiled = _direct_wgrad(saved.x_shape, saved.weight.shape, saved.out_hw, saved.groups, itemsize)
    if _igemm_wgrad(saved.x_shape, saved.weight.shape, saved.out_hw, saved.groups, saved.dilation):
        o, cg, kh, kw = saved.weight.shape
        _, use = _wgrad_tile(o, cg * kh * kw + 1)
        if use >= IGEMM_WGRAD_MIN_USE or not tiled:
            return "igemm"
    return "tiled" if tiled else None


def _wgrad_tile(o, kb):
    """igemm_wgrad's tile (BO, BK, TO, TK) for o channels x kb taps (the bias one of them), and the fraction of
    its tiles' area the outputs use: the first of _WG_TILES (the most work per thread first) whose area is at least
    half used, else the one of least area; _WG_TILE if set."""
    best = None
    for tile in _WG_TILES if _WG_TILE is None else (_WG_TILE,):
        use = o * kb / (-(-o // tile[0]) * tile[0] * -(-kb // tile[1]) * tile[1])
        if use >= 0.5:
            return tile, use
        if best is None or use > best[1]:
            best = (tile, use)
    return best


def _igemm_wgrad(x_shape, w_shape, out_hw, groups, dilation):
    """Whether igemm_wgrad takes this weight gradient: _igemm_fits and a partial row of O*(C*KH*KW + 1) within
    32-bit indices (its tap table holds only a tile's taps: no bound on C*KH*KW)."""
    o, cg, kh, kw = w_shape
    return o * (cg * kh * kw + 1) < _FITS32 and _igemm_fits(x_shape, w_shape, out_hw, groups, dilation)


def _igemm_weight_grad(x, g, saved, with_bias):
    """(dw, db or None) by igemm_wgrad (conv.cu): block tiles of BO channels x BK taps (the bias a tap,
    _wgrad_tile), the positions split over S partial rows (_wgrad_splits); then wgrad_reduce over the S rows in a
    fixed order."""
    o, cg, kh, kw = saved.weight.shape
    kb = cg * kh * kw + 1
    (bo, bk, to, tk), _ = _wgrad_tile(o, kb)
    tiles, threads = -(-o // bo) * -(-kb // bk), (bo // to) * (bk // tk)
    splits = _wgrad_splits(o, kb, g.shape[1], tiles, threads)
    partial = cupy().empty((splits, o * kb), dtype=g.dtype)
    get("conv", f"igemm_wgrad_{bo}x{bk}", g.dtype)(
        (splits * tiles,), (threads,), (x, g, partial) + _int_args(
            x.shape, saved.weight.shape, saved.out_hw, saved.stride, saved.pads, saved.dilation)
        + (i32(splits), i32(with_bias)))
    return _reduce_partials(partial, saved.weight, saved.bias if with_bias else None)


def _wgrad_splits(o, kb, positions, tiles, threads):
    """igemm_wgrad's partial rows: enough blocks (tiles x splits) for _WG_THREADS_PER_SM threads per SM, at
    least _WG_MIN_SLICES slices of positions per split, and splits x o x kb within 32-bit indices."""
    slices = -(-positions // _WGQ)
    return max(1, min(-(-slices // _WG_MIN_SLICES), -(-_WG_THREADS_PER_SM * _sm_count() // (tiles * threads)),
                      (_FITS32 - 1) // (o * kb)))


def _reduce_partials(partial, w, b):
    """dw [O, C, KH, KW] of the weight w and db [O] (None where the bias b is None: none wanted) from partial [S,
    O*(C*KH*KW + 1)]: wgrad_reduce, blocks of 32 outputs x G row groups, the S rows summed in a fixed order; G
    (1..32) gives each thread about _WR_ROWS rows, so that few outputs over many rows (LeNet-5's first layer: 156 x
    528) still spread over many threads. dw and db are grad_array's (a leaf's gradient slot where offered)."""
    o, cg, kh, kw = w.shape
    k = cg * kh * kw
    dw, db = grad_array(w), grad_array(b) if b is not None else None
    groups = max(1, min(32, -(-partial.shape[0] // _WR_ROWS)))
    get("conv", "wgrad_reduce", partial.dtype)((-(-o * (k + 1) // 32),), (32 * groups,), (
        partial, dw, ptr(db), i32(partial.shape[0]), i32(o), i32(k)))
    return dw, db


def _weight_grad(x, g, saved, with_bias):
    """(dw [O, C, KH, KW], db [O] or None) of the direct path from the input x and g [O, N*OH*OW] (the output
    gradient after the activation's derivative): wgrad_partial over S blocks of position tiles, then
    wgrad_reduce over the S partial rows in a fixed order."""
    cp = cupy()
    o, cg, kh, kw = saved.weight.shape
    k, m = cg * kh * kw, o * (cg * kh * kw + 1)
    tq = _tile(o, k, g.dtype.itemsize)
    tiles = -(-g.shape[1] // tq)
    blocks = min(tiles, 4 * _sm_count())
    threads = min(_WGRAD_THREADS, max(256, -(-m // 32) * 32))   # at least 256 to build the tiles
    r = next(v for v in _WGRAD_R if v * threads >= m)
    partial = cp.empty((blocks, m), dtype=g.dtype)
    args = (x, g, partial) + _int_args(x.shape, saved.weight.shape, saved.out_hw, saved.stride, saved.pads,
                                       saved.dilation) + (i32(tq), i32(with_bias))
    get("conv", f"wgrad_partial_r{r}", g.dtype)((blocks,), (threads,), args,
                                                shared_mem=_wgrad_smem(o, k, tq, g.dtype.itemsize))
    return _reduce_partials(partial, saved.weight, saved.bias if with_bias else None)


def conv2d_backward(dout, saved, g=None, into=None, wpartial=None, wgrad_beside=False, dpool=None, dwdb=None):
    """Gradients of conv2d_forward's output: dout [N, O, OH, OW] -> (dx, dw, db); or, with dout None, from g
    [O, N*OH*OW], the gradient after the activation's derivative, already in the kernels' layout (a fused pooling's
    backward computes it: pool.max_pool2d_backward_act).

    Each is None where saved.needs says it is not needed (db also when there was no bias). The activation's
    derivative is applied first (fused with the [N, O] -> [O, N] transpose), then db = sum over N, OH, OW, dw = g @
    cols^T (where the forward kept x, both from x by one of three kernels, _wgrad_kernel) and dx = col2im(w^T @ g),
    all over the whole batch; on the direct path dx is one gather kernel (_direct_dx). into: the Conv2dSaved of the
    convolution that made x; where tile_conv takes dx (and _into_ok), dx is returned as a ProducerGrad instead: that
    convolution's g [C, N*H*W] (its activation's derivative applied), maybe with its weight gradient's partial rows,
    for its conv2d_backward(None, into, g=..., wpartial=...); else as usual [N, C, H, W]. wpartial: this
    convolution's weight and bias gradients' partial rows, already summed over the batch by the next convolution's
    input gradient (ProducerGrad): only wgrad_reduce runs for dw and db; g may then be None where no input gradient
    is needed. dwdb: (dw, db or None), those gradients themselves, made by the next convolution's input gradient
    (ProducerGrad.wgrad), returned as they are (g None). wgrad_beside: dw and db may be made beside the rest of the
    backward pass, joined by the pass (autograd.engine.takes_plainly said so; with WGRAD_BESIDE_DEFER). dpool (dout,
    g and wpartial None): the gradient of the output pooled in the epilogue (saved.pool), [N, O, PH, PW]; g is made
    from it by the pooling's backward (pool.max_pool2d_backward_act).
    """
    op = "conv2d_backward"
    n, c, h, wd = saved.x_shape
    w = saved.weight
    o, cg, kh, kw = w.shape
    k = cg * kh * kw
    g_, p = saved.groups, saved.out_hw[0] * saved.out_hw[1]
    dtype = w.dtype
    if dpool is not None:
        if dout is not None or g is not None or wpartial is not None or dwdb is not None or saved.pool is None:
            raise RuntimeError(f"{op}: dpool comes alone (no grad_output, g, wpartial or dwdb), for a convolution "
                               f"that pooled in its epilogue")
        check_array(op, "dpool", dpool, 4)
        check_shape(op, "dpool", dpool, (n, o) + tuple(saved.pool[3][4]))
        check_dtype(op, "dpool", dpool, dtype)
        given = dpool
    elif dwdb is not None:   # the weight and bias gradients themselves (ProducerGrad.wgrad)
        if dout is not None or g is not None or wpartial is not None or saved.needs[0]:
            raise RuntimeError(f"{op}: dwdb comes alone (no grad_output, g or wpartial), where no input gradient is "
                               f"needed")
        check_shape(op, "dw", dwdb[0], tuple(w.shape))
        check_dtype(op, "dw", dwdb[0], dtype)
        return None, dwdb[0] if saved.needs[1] else None, dwdb[1] if saved.needs[2] else None
    elif dout is None and g is None:   # the weight and bias gradients' partial rows alone (ProducerGrad)
        if wpartial is None or saved.needs[0]:
            raise RuntimeError(f"{op}: expected grad_output or g (g may be None only with wpartial and no input "
                               f"gradient needed)")
        check_dtype(op, "wpartial", wpartial, dtype)
        given = wpartial
    elif dout is None:
        check_array(op, "g", g, 2)
        check_shape(op, "g", g, (o, n * p))
        check_dtype(op, "g", g, dtype)
        if not g.flags.c_contiguous:
            raise RuntimeError(f"{op}: expected a C-contiguous g, got strides {list(g.strides)}")
        given = g
    else:
        check_array(op, "grad_output", dout, 4)
        expected = (n, o) + tuple(saved.out_hw)
        if tuple(dout.shape) != expected:
            raise RuntimeError(f"{op}: expected grad_output of shape {list(expected)}, got {list(dout.shape)}")
        check_dtype(op, "grad_output", dout, dtype)
        if saved.activation is not None and saved.y is None:
            raise RuntimeError(f"{op}: the forward did not keep the output before the activation "
                               f"(keep_pre_activation=False); pass g instead of grad_output")
        given = dout
    same_device(op, given, w)
    cp = cupy()
    need_x, need_w, need_b = saved.needs
    with given.device:
        if dout is not None:
            dout = contiguous(dout)
            g = cp.empty((o, n * p), dtype=dtype)
            bias_act_backward(dout, saved.y, saved.bias, g, n, o, p, ACTIVATIONS[saved.activation])
        if dpool is not None:
            from .pool import max_pool2d_backward_act   # (pool.py imports this module)
            g = max_pool2d_backward_act(contiguous(dpool), saved.pool, saved.y, saved.bias, saved.activation)
        want_b = need_b and saved.bias is not None
        wgrad = "given" if wpartial is not None else _wgrad_kernel(saved, dtype.itemsize) if need_w else None

        def weight_grads():
            if wgrad == "given":
                return _reduce_partials(wpartial, w, saved.bias if want_b else None)
            if wgrad == "tile":   # dw and db from x in one kernel and its reduction
                return _tile_weight_grad(saved.x, g, saved, want_b, _tile_wgrad_plan(saved, dtype.itemsize))
            if wgrad == "igemm":
                return _igemm_weight_grad(saved.x, g, saved, want_b)
            if wgrad == "tiled":
                return _weight_grad(saved.x, g, saved, want_b)
            db = sum_rows(g, 1) if want_b else None
            if not need_w:
                return None, db
            # cols: kept by the forward, or made now from x where neither dw kernel takes it
            cols = saved.cols if saved.x is None else im2col(saved.x, (kh, kw), saved.stride, saved.pads,
                                                             saved.dilation, saved.out_hw)
            if g_ == 1:
                dw = gemm(g, cols.T)
            else:
                dw = gemm(g.reshape(g_, o // g_, n * p), cols.reshape(g_, k, n * p).transpose(0, 2, 1))
            return dw.reshape(o, cg, kh, kw), db

        def input_grad():
            if not need_x:
                return None
            if INTO_PRODUCER and _into_ok(saved, into, dtype):
                dx = _tile_dx(g, saved, into)
                if dx is not None:
                    return dx
            dx = _tile_dx(g, saved)
            if dx is None:
                dx = _direct_dx(g, saved)
            if dx is None:
                if g_ == 1:
                    dcols = gemm(w.reshape(o, k).T, g)
                else:
                    dcols = gemm(w.reshape(g_, o // g_, k).transpose(0, 2, 1), g.reshape(g_, o // g_, n * p))
                dx = col2im(dcols.reshape(c * kh * kw, n * p), (n, c, h, wd), (kh, kw), saved.stride, saved.pads,
                            saved.dilation, saved.out_hw)
            return dx

        # the weight gradient's kernels beside the input gradient's where there are both; our own kernels only: the
        # input gradient may run cuBLAS, and one cuBLAS handle's workspace must not serve two streams at once
        beside = need_x and wgrad in ("tile", "igemm", "tiled") and n * o * p <= WGRAD_BESIDE_MAX_OUTPUTS
        if beside and WGRAD_ON_MAIN:
            dx, (dw, db) = run_beside(input_grad, weight_grads)
        else:
            (dw, db), dx = run_beside(weight_grads, input_grad, beside, defer=wgrad_beside and WGRAD_BESIDE_DEFER)
    return dx, dw, db


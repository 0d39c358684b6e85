// conv/tile_common.cuh: what tile_conv (tile_conv.cuh) and its launchers' modules share: its constants (ST_TW, the
// epilogue codes, ST_LF, ST_UPW_SLICES), its weights' shared-memory layout (slots of TO channels rounded up to 4)
// and tile_arrange, which writes a convolution's weights in that layout beforehand. Included by tile_conv.cuh.
#include "../common.cuh"


// tile_conv: a stride-1, undilated, groups == 1 correlation with a square KS x KS kernel from a tile of the input
// staged, zero-padded, in shared memory beside all the weights:     out[n, o, r, s] = sum over (c, i, j) of wt(o, c, i,
// j) * in[n, c, r + i - pt, s + j - pl] Forward (transposed == 0): in = x [N, C, H, W], wt = w, then igemm_fwd's
// epilogue (y before bias, bias, activation). Input gradient (transposed == 1): in = g [O, N, OH, OW] (in_sn = OH*OW,
// in_sc = N*OH*OW), wt(c, o, i, j) = w[o, c, KS-1-i, KS-1-j] and pt = KS-1-ph, pl = KS-1-pw: the full correlation of g
// with the flipped kernel, which is dx; no bias, activation or y, unless into: then dx is written as the g of the
// convolution that made the input ([C, N, H, W] in this kernel's O, N, Ho, Wo), times that convolution's act'(y + b[o])
// with its y ([O, N, P], the output before the bias) and b read: its transpose-and-derivative kernel is not run. With
// into and pidx, the producer pooled its output in its own epilogue (POOL below; dx is the pooled output's gradient):
// dx goes through that pooling's backward too, to its maximum's position in each 2x2 window of the producer's g [O, N,
// 4P] (y [O, N, 4P] read there only: common.cuh pooled_act_grad, pidx [N, O, Ho, Wo] its indices) and 0 elsewhere, so
// that neither the pooled gradient nor the pooling's backward kernel is needed. vstage (conv/tile.py _tile_vec_stage):
// the input's rows are staged vstage bytes a copy, 16 or 8 where its strides, the left padding and the row width are
// multiples of that many bytes' elements, else sizeof(T) (an element a copy); wrun (conv/tile.py _tile_weight_run): the
// consecutive taps of one weight slot a thread's neighbours stage (below); the ARR instances ignore it: their w is
// already in the shared layout (tile_arrange's copy, conv/tile.py _tile_arrange), staged 16 bytes a copy. A block takes
// one image and TH output rows; its threads (cs, og, row, cg), cg fastest, each compute TO channels x ST_TW consecutive
// columns of one row over the input channels of split cs (CS splits: more, shorter chains per output where the grid
// alone leaves the SMs few warps; their sums added in split order through shared memory at the end). Per input channel
// and kernel row a thread loads 8 x values (two 4-vectors: the padded row width WP is a multiple of 4) and KS x TO/4
// weight vectors (a warp shares og: broadcasts) for KS*TO*ST_TW FMAs (igemm_fwd: 8 shared loads per 16), and no bounds
// are checked inside the loop: the padding is zeros in shared memory. The epilogue stores a thread's 4 columns as one
// vector (or two pairs) where the rows allow it. Measured on the H200 (ncu, MnistCnn's second layer at batch 64): ~50%
// of the issue slots busy, L1 64-76% busy; rows padded so that no two threads of a quarter warp share a bank removed
// 3/4 of the shared-load conflicts and changed nothing, the vector stores took the forward from 21.8 to 19.1 us.
#define ST_TW 4

// The epilogues: ST_EPI_PLAIN (tile_conv), ST_EPI_LINEAR (tile_conv_lin), ST_EPI_POOL (tile_conv_pool),
// ST_EPI_WGRAD (tile_conv_wgrad), ST_EPI_UNPOOL (tile_conv_unpool: "into" a producer that pooled, see tile_conv's
// comment; a kernel of its own so that the others' registers stay as they were), ST_EPI_UNPOOL_WGRAD
// (tile_conv_unpool_wgrad: into such a producer's weight gradient), each below.
#define ST_EPI_PLAIN 0
#define ST_EPI_LINEAR 1
#define ST_EPI_POOL 2
#define ST_EPI_WGRAD 3
#define ST_EPI_UNPOOL 4
#define ST_EPI_UNPOOL_WGRAD 5

// The forward's linear epilogue (LIN, the tile_conv_lin kernels; Conv2dActLinear: linear(flatten(act(conv(x))), lw, lb)
// with F <= ST_LF outputs): each thread adds its outputs times lw's matching columns (lw [F, O*Ho*Wo], read once per
// block, no reuse: L2), a warp sum and the block's warps in order give the tile's partial sums lpart[n, tile, f], and
// the block that finishes image n last (a ticket from lcount[n], reset to 0 after) adds the tiles' partials in order
// and the bias into lout[n, f]. A fixed order throughout: deterministic. Needs whole warps (blockDim.x a multiple of
// 32) and dynamic shared memory for [warps][ST_LF] values and the ticket (conv/fused.py checks both).
#define ST_LF 16

// linear_sums: this thread's share of the F outputs, lsum[f] = sum over its channels u < nu and columns v < cols of
// val[u][v] * lw[f, (o0 + u)*P + r*Wo + s0 + v] (wp points at u = v = 0 of f = 0). The weights of FB outputs for all
// TO channels are loaded before any is used (predicated, not behind a branch), so that a thread waits on F / FB L2
// round trips rather than F * TO: the epilogue is latency-bound, each weight read once per block.
template <typename T, int TO>
__device__ __forceinline__ void linear_sums(const T (&val)[TO][ST_TW], const T* __restrict__ wp, int K, int P, int nu,
                                            int cols, int F, bool vec, T* lsum) {
    constexpr int FB = TO == 4 ? 2 : 1;   // 32 registers of weights in flight
#pragma unroll
    for (int f0 = 0; f0 < ST_LF; f0 += FB) {
        if (f0 >= F) break;
        T wv[FB][TO][ST_TW];
#pragma unroll
        for (int d = 0; d < FB; ++d)
#pragma unroll
            for (int u = 0; u < TO; ++u) {
                const T* q = wp + (f0 + d) * K + u * P;
                const bool ok = f0 + d < F && u < nu;
                if (vec) {
                    if (ok) load4(q, wv[d][u]);
                    else wv[d][u][0] = wv[d][u][1] = wv[d][u][2] = wv[d][u][3] = T(0);
                } else {
#pragma unroll
                    for (int v = 0; v < ST_TW; ++v) wv[d][u][v] = ok && v < cols ? q[v] : T(0);
                }
            }
#pragma unroll
        for (int d = 0; d < FB; ++d) {
            T s = T(0);
#pragma unroll
            for (int u = 0; u < TO; ++u)
#pragma unroll
                for (int v = 0; v < ST_TW; ++v) s += (u < nu && v < cols ? val[u][v] : T(0)) * wv[d][u][v];
            if (f0 + d < ST_LF) lsum[f0 + d] = s;
        }
    }
}

template <typename T>
__device__ void linear_finish(T (&lsum)[ST_LF], const T* __restrict__ lb, T* __restrict__ lout, T* __restrict__ lpart,
                              unsigned* lcount, int F, int n, int tile, int tiles) {
    extern __shared__ unsigned char st_smem[];
    T* red = reinterpret_cast<T*>(st_smem);   // [warps][ST_LF], then the ticket
    unsigned* ticket = reinterpret_cast<unsigned*>(red + (blockDim.x / 32) * ST_LF);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    __syncthreads();   // every thread is done with the staged tiles (and the splits' sums)
    // the ST_LF sums over the warp at once (those past F are 0)
    const T v = warp_sum_spread(lsum);
    const int f = warp_spread_slot<ST_LF>(lane);
    if (f >= 0 && f < F) red[warp * ST_LF + f] = v;
    __syncthreads();
    if (threadIdx.x < F) {
        T s = T(0);
        for (int k = 0; k < warps; ++k) s += red[k * ST_LF + threadIdx.x];
        lpart[(n * tiles + tile) * F + threadIdx.x] = s;
    }
    // the partials are visible to the block that adds them: st_last_to_arrive fences (one thread, after a barrier)
    if (!st_last_to_arrive(&lcount[n], tiles, ticket)) return;
    if (threadIdx.x < F) {
        T s = T(0);
        for (int k = 0; k < tiles; ++k) s += __ldcg(lpart + (n * tiles + k) * F + threadIdx.x);
        if (lb != nullptr) s += lb[threadIdx.x];
        lout[n * F + threadIdx.x] = s;
    }
    if (threadIdx.x == 0) lcount[n] = 0u;
}

// The forward's pooling epilogue (POOL, the tile_conv_pool kernels; Conv2dActPool: max_pool2d(act(conv(x)), 2, 2) where
// the 2x2 windows tile the output and TH is even, conv/fused.py _tile_pool_ok): the threads of odd rows pass their
// activated outputs to the row above through shared memory ([threads][TO][ST_TW]), and each thread of an even row takes
// the max of its two 2x2 windows per channel in torch's order (row-major, the first maximum, a NaN wins), writing the
// pooled value to out [N, O, Ho/2, Wo/2] and its flat index h*Wo + w to pidx (int64, as max_pool2d_forward's indices);
// the activated, unpooled output is not written (y, before the bias, still is).

// The input gradient's producer-weight-gradient epilogue (WGRAD, the tile_conv_wgrad kernels; transposed and into,
// conv/fused.py _into_wgrad): where the convolution that made this one's input has one input channel, the same KS x KS
// kernel, stride 1 and groups == 1, the g values this kernel writes for it (its activation's derivative applied)
// also give its weight and bias gradients: dw[o, 0, i, j] = sum over (n, r, s) of g[o, n, r, s] * px[n, 0, r + i -
// ppt, s + j - ppl], db[o] = sum of g[o]. Each thread's sums over its 4 columns go to shared memory
// ([TO][KS*KS + 1][threads of split 0]), then one thread per (channel, tap) adds its channel group's threads in a
// fixed order into wpart [blocks, O*(KS*KS + 1)], wgrad_reduce's partial rows (deterministic, no atomics): the
// producer's tile_wgrad, which would read the g written here again, is not run.

// The pooled producer's weight-gradient epilogue (UNPOOL_WGRAD, the tile_conv_unpool_wgrad kernels; transposed, into ==
// 2, conv/fused.py _unpool_wgrad): where the producer pooled in its epilogue, has one input channel and the same KS x
// KS kernel and needs no input gradient (a first layer), its g at the windows' maxima (the compact form, the rest of
// its g being 0) gives its weight and bias gradients as pooled_wgrad computes them (see there, the NaN taps included),
// over this block's windows: the g values and their maxima's positions go to shared memory with the producer's x under
// the block's rows, each of S slices of a channel's windows sums its KS*KS taps and bias in registers, then thread m <
// O*(KS*KS + 1) adds output (channel, tap) m's slices in order into wpart [blocks, O*(KS*KS + 1)], wgrad_reduce's
// partial rows (deterministic, no atomics). Neither the compact g nor pooled_wgrad's pass over it is needed.
// UNPOOL_WGRAD's slices of a channel's windows: threads per channel, at most ST_UPW_SLICES (the sums' shared memory,
// conv/fused.py _unpool_wgrad_smem) and at least 1
#define ST_UPW_SLICES 16
__device__ __forceinline__ int st_unpool_wgrad_slices(int threads, int O) {
    return max(1, min(threads / O, ST_UPW_SLICES));
}
// UNPOOL_WGRAD's prefetch, at the start of the shared memory (the tiles after it, 16-byte aligned): the producer's
// pooling indices of the block's rows [O][TH][Wo] (int64) and its x under them [2*TH + KS - 1][2*Wo + KS - 1]
// (conv/fused.py _unpool_wgrad_smem)
template <typename T>
__device__ __forceinline__ int st_unpool_prefetch_bytes(int O, int TH, int Wo, int KS) {
    return (O * TH * Wo * (int)sizeof(i64) + (2 * TH + KS - 1) * (2 * Wo + KS - 1) * (int)sizeof(T) + 15) / 16 * 16;
}

// tile_conv's weights in shared memory, [K][OP]: tap k's channels in groups of TO, each group in TS = TO rounded up
// to 4 slots (aligned vector loads), OP = groups * TS (st_tile_slots). The channel slot `slot` holds, or -1 for a
// zero slot (past TO in its group, or past O); TO is a compile-time constant in tile_conv.
__device__ __forceinline__ int st_tile_slots(int O, int TO) { return (O + TO - 1) / TO * ((TO + 3) / 4 * 4); }
__device__ __forceinline__ int st_tile_slot_channel(int slot, int TO, int O) {
    const int TS = (TO + 3) / 4 * 4, o = TS == TO ? slot : slot / TS * TO + slot % TS;
    return (TS == TO || slot % TS < TO) && o < O ? o : -1;
}
// w's element of tap k (of K = C*KK), channel o, in tile_conv's names: w [O][C][KS][KS], or transposed (the input
// gradient) w [C][O][KS][KS] with the taps flipped
__device__ __forceinline__ int st_tile_weight_index(int k, int o, int O, int K, int KK, bool transposed) {
    if (transposed) {
        const int c = k / KK;   // KK: a compile-time constant in tile_conv
        return (c * O + o) * KK + (KK - 1 - (k - c * KK));
    }
    return o * K + k;
}

// tile_arrange: a convolution's w [O][C][KS][KS] (KK = KS*KS) in tile_conv's shared-memory layout, so that tile_conv
// stages it by 16-byte copies (its ARR instances) rather than an element a copy (a transpose of w's order):
// fwd [C*KK][OP] for its forward (TO = fto), dx [O*KK][OP] for its input gradient (TO = dto, the taps flipped).
// Either may be null.
template <typename T>
__device__ void tile_arrange(const T* __restrict__ w, T* __restrict__ fwd, int fto, T* __restrict__ dx, int dto,
                             int O, int C, int KK) {
    const int fop = st_tile_slots(O, fto), dop = st_tile_slots(C, dto);
    const int nf = fwd != nullptr ? C * KK * fop : 0, nd = dx != nullptr ? O * KK * dop : 0;
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < max(nf, nd); e += gridDim.x * blockDim.x) {
        if (e < nf) {
            const int k = e / fop, o = st_tile_slot_channel(e - k * fop, fto, O);
            fwd[e] = o >= 0 ? w[st_tile_weight_index(k, o, O, C * KK, KK, false)] : T(0);
        }
        if (e < nd) {
            const int k = e / dop, c = st_tile_slot_channel(e - k * dop, dto, C);
            dx[e] = c >= 0 ? w[st_tile_weight_index(k, c, C, O * KK, KK, true)] : T(0);
        }
    }
}
